//! The timers' slab: entries by key in one vector, a vacant slot holding the key of the next
//! vacant one (the `slab` crate's design), so that a slot's address is known without reading it
//! and the entry of the timer likely to fire next can be prefetched ([`Slots::prefetch`]).
//!
//! Invariants:
//! - `next_free` is the most recently vacated slot, each vacant slot names the one vacated before
//!   it, and the chain ends at `slots.len()`: a key is reused last-in first-out, and no slot is
//!   in the chain twice (only `remove` of an occupied slot adds one).
//! - `len` counts the occupied slots.
//! - A vacant slot costs nothing over an occupied one (it fits in a spare value of `T`'s layout
//!   for the timer entry; `queue.rs` checks that size).

/// One slot: an entry, or the key of the next vacant slot.
enum Slot<T> {
    Occupied(T),
    Vacant { next: usize },
}

pub(crate) struct Slots<T> {
    slots: Vec<Slot<T>>,
    next_free: usize,
    len: usize,
}

impl<T> Slots<T> {
    pub(crate) fn new() -> Self {
        Slots {
            slots: Vec::new(),
            next_free: 0,
            len: 0,
        }
    }

    /// Occupied slots.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Stores `value` in a vacant slot (the one vacated last) or a new one; returns its key.
    pub(crate) fn insert(&mut self, value: T) -> usize {
        let key = self.next_free;
        if key == self.slots.len() {
            self.slots.push(Slot::Occupied(value));
            self.next_free = self.slots.len();
        } else {
            match std::mem::replace(&mut self.slots[key], Slot::Occupied(value)) {
                Slot::Vacant { next } => self.next_free = next,
                Slot::Occupied(_) => unreachable!("the vacant chain holds only vacant slots"),
            }
        }
        self.len += 1;
        key
    }

    pub(crate) fn get(&self, key: usize) -> Option<&T> {
        match self.slots.get(key)? {
            Slot::Occupied(value) => Some(value),
            Slot::Vacant { .. } => None,
        }
    }

    pub(crate) fn get_mut(&mut self, key: usize) -> Option<&mut T> {
        match self.slots.get_mut(key)? {
            Slot::Occupied(value) => Some(value),
            Slot::Vacant { .. } => None,
        }
    }

    /// Takes the value out of slot `key`, which must be occupied.
    ///
    /// # Panics
    /// If it is not (a caller's bug, as with `slab::Slab::remove`).
    pub(crate) fn remove(&mut self, key: usize) -> T {
        let vacant = Slot::Vacant {
            next: self.next_free,
        };
        match std::mem::replace(&mut self.slots[key], vacant) {
            Slot::Occupied(value) => {
                self.next_free = key;
                self.len -= 1;
                value
            }
            Slot::Vacant { next } => {
                self.slots[key] = Slot::Vacant { next };
                panic!("nodus: timer slot {key} removed while vacant")
            }
        }
    }

    /// Takes every value out, leaving no slot.
    pub(crate) fn take_all(&mut self) -> Vec<T> {
        self.next_free = 0;
        self.len = 0;
        std::mem::take(&mut self.slots)
            .into_iter()
            .filter_map(|slot| match slot {
                Slot::Occupied(value) => Some(value),
                Slot::Vacant { .. } => None,
            })
            .collect()
    }

    /// Starts loading slot `key`'s cache line without reading it (a hint: it changes no memory
    /// and never faults, whether the slot is occupied or not).
    #[inline(always)]
    pub(crate) fn prefetch(&self, key: usize) {
        if key >= self.slots.len() {
            return;
        }
        let slot = self.slots.as_ptr().wrapping_add(key);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `prefetcht0` (SSE, in every x86-64 CPU) never faults and changes no memory;
        // the address is inside the vector's buffer anyway.
        unsafe {
            use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
            _mm_prefetch::<_MM_HINT_T0>(slot.cast());
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = slot;
    }
}

impl<T> std::ops::Index<usize> for Slots<T> {
    type Output = T;

    fn index(&self, key: usize) -> &T {
        self.get(key).expect("an occupied timer slot")
    }
}

impl<T> std::ops::IndexMut<usize> for Slots<T> {
    fn index_mut(&mut self, key: usize) -> &mut T {
        self.get_mut(key).expect("an occupied timer slot")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_reused_last_vacated_first_and_len_counts_the_occupied() {
        let mut s = Slots::new();
        let keys: Vec<usize> = (0..5).map(|i| s.insert(i * 10)).collect();
        assert_eq!(keys, [0, 1, 2, 3, 4]);
        assert_eq!(s.remove(1), 10);
        assert_eq!(s.remove(3), 30);
        assert_eq!(
            (s.len(), s.get(1), s.get(3), s.get(9)),
            (3, None, None, None)
        );
        assert_eq!(s.insert(7), 3);
        assert_eq!(s.insert(8), 1);
        assert_eq!(s.insert(9), 5);
        assert_eq!((s[3], s[1], s[5], s.len()), (7, 8, 9, 6));
        s[3] += 1;
        assert_eq!(s.get_mut(3).copied(), Some(8));
        s.prefetch(2);
        s.prefetch(100);
        let mut all = s.take_all();
        all.sort_unstable();
        assert_eq!(all, [0, 8, 8, 9, 20, 40]);
        assert_eq!((s.len(), s.insert(1)), (0, 0));
    }

    #[test]
    #[should_panic(expected = "removed while vacant")]
    fn removing_a_vacant_slot_is_a_bug_said_at_once() {
        let mut s = Slots::new();
        let k = s.insert(());
        s.remove(k);
        s.remove(k);
    }
}
