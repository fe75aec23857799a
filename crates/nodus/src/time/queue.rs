//! The timer queue: Node's design, one FIFO list per distinct delay and a small min-heap over
//! the lists' heads, with the timers themselves in a slab.
//!
//! Timers of one delay are armed in deadline order (deadlines count from a clock that does not go
//! backwards), so appending keeps each list sorted, and the heap holds one entry per distinct
//! delay (about a thousand for a million timers of 0–999 ms) instead of one per timer: arming
//! is O(1), firing touches memory sequentially.
//!
//! Invariants:
//! - Firing order is `(deadline, seq)`; `seq` increases with every (re)arm, so equal deadlines
//!   fire in insertion order and a re-armed interval goes behind timers already queued. A list
//!   stays sorted by `(deadline, seq)`: the rare out-of-order arm (a deadline based on an older
//!   clock read: a `Sleep` first polled after others of its delay were armed, an interval
//!   re-armed from its callback's start behind timers its callback armed) is inserted in place
//!   from the back.
//! - Each non-empty list is in the heap exactly once (`List::heap_pos`), keyed by its front item;
//!   an emptied list leaves the heap and the table.
//! - The slab entry is the truth; a list item whose slab entry is gone or has another `seq` is a
//!   tombstone, skipped when it reaches the front. Cancelling is O(1) and takes effect at once.
//!   Past twice as many tombstones as live timers, every list is compacted.
//! - A firing interval's callback is taken out of its slab entry while it runs (so a callback
//!   can clear its own interval) and put back only if the entry was not cleared meanwhile, also
//!   when it panics (`rt/phases.rs` finishes it from a drop guard): no entry stays `Running`.
//! - Nothing here runs user code or drops callbacks on its own: removed entries are returned.

use std::collections::{HashMap, VecDeque};
use std::panic::Location;
use std::task::Waker;

use slab::Slab;

/// Identifies a timer (across interval re-arms); stale after it fires or is cleared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TimerKey {
    pub(crate) key: u32,
    pub(crate) id: u64,
}

/// What a timer does when it fires.
pub(crate) enum TimerAction {
    /// `set_timeout` (a zero-sized closure is not allocated).
    Once(Box<dyn FnOnce()>),
    /// `set_interval`.
    Callback(Box<dyn FnMut()>),
    /// A `sleep` future: wake its task.
    Wake(Option<Waker>),
    /// An interval callback that is running right now.
    Running,
}

pub(crate) struct TimerEntry {
    /// Stable for the timer's life (what handles hold).
    pub(crate) id: u64,
    /// Position among equal deadlines; new on every (re)arm (what heap entries hold).
    pub(crate) seq: u64,
    pub(crate) deadline: u64,
    /// Interval period in ns; 0 for a one-shot timer.
    pub(crate) repeat: u64,
    pub(crate) action: TimerAction,
    pub(crate) refd: bool,
    pub(crate) location: &'static Location<'static>,
}

/// One armed timer in a list (a tombstone once its entry is gone or re-armed).
#[derive(Clone, Copy)]
struct Item {
    deadline: u64,
    seq: u64,
    key: u32,
}

impl Item {
    #[inline]
    fn before(&self, other: &Item) -> bool {
        (self.deadline, self.seq) < (other.deadline, other.seq)
    }
}

/// The timers of one delay, in firing order.
struct List {
    delay: u64,
    items: VecDeque<Item>,
    heap_pos: usize,
}

pub(crate) struct TimerQueue {
    entries: Slab<TimerEntry>,
    lists: Slab<List>,
    by_delay: HashMap<u64, usize>,
    /// List keys, a min-heap by each list's front item.
    heap: Vec<usize>,
    next_seq: u64,
    tombstones: usize,
}

impl TimerQueue {
    pub(crate) fn new() -> Self {
        TimerQueue {
            entries: Slab::new(),
            lists: Slab::new(),
            by_delay: HashMap::new(),
            heap: Vec::new(),
            next_seq: 0,
            tombstones: 0,
        }
    }

    /// Live timers.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Arms a timer for `base + delay`.
    pub(crate) fn insert(
        &mut self,
        base: u64,
        delay: u64,
        repeat: u64,
        action: TimerAction,
        refd: bool,
        location: &'static Location<'static>,
    ) -> TimerKey {
        let seq = self.bump_seq();
        let deadline = base.saturating_add(delay);
        let key = self.entries.insert(TimerEntry {
            id: seq,
            seq,
            deadline,
            repeat,
            action,
            refd,
            location,
        });
        let key = u32::try_from(key).expect("nodus: more than 4 billion live timers");
        self.push_item(delay, Item { deadline, seq, key });
        TimerKey { key, id: seq }
    }

    pub(crate) fn get(&self, k: TimerKey) -> Option<&TimerEntry> {
        self.entries.get(k.key as usize).filter(|e| e.id == k.id)
    }

    pub(crate) fn get_mut(&mut self, k: TimerKey) -> Option<&mut TimerEntry> {
        self.entries
            .get_mut(k.key as usize)
            .filter(|e| e.id == k.id)
    }

    /// Cancels the timer; returns its entry for the caller to drop outside any borrow.
    pub(crate) fn remove(&mut self, k: TimerKey) -> Option<TimerEntry> {
        self.get(k)?;
        let e = self.entries.remove(k.key as usize);
        if !matches!(e.action, TimerAction::Running) {
            // A running interval's item already left its list.
            self.tombstones += 1;
            self.maybe_compact();
        }
        Some(e)
    }

    /// The earliest live deadline.
    pub(crate) fn next_deadline(&mut self) -> Option<u64> {
        self.skip_tombstones();
        let list = *self.heap.first()?;
        self.lists[list].items.front().map(|i| i.deadline)
    }

    /// Takes the next timer due at `now`: a one-shot timer leaves the queue; an interval stays
    /// (its action becomes `Running`) and must be finished with `finish_interval`.
    pub(crate) fn pop_due(&mut self, now: u64) -> Option<(TimerKey, Fired)> {
        self.skip_tombstones();
        let list = *self.heap.first()?;
        let front = *self.lists[list].items.front()?;
        if front.deadline > now {
            return None;
        }
        self.pop_front_of_top();
        let e = &mut self.entries[front.key as usize];
        let k = TimerKey {
            key: front.key,
            id: e.id,
        };
        if e.repeat > 0 {
            let action = std::mem::replace(&mut e.action, TimerAction::Running);
            let fired = Fired {
                deadline: e.deadline,
                action,
                location: e.location,
                refd: e.refd,
                stays: true,
            };
            Some((k, fired))
        } else {
            let e = self.entries.remove(front.key as usize);
            Some((
                k,
                Fired {
                    deadline: e.deadline,
                    action: e.action,
                    location: e.location,
                    refd: e.refd,
                    stays: false,
                },
            ))
        }
    }

    /// Puts a fired interval's callback back and re-arms it from `base`; returns the callback if
    /// the interval was cleared while it ran (for the caller to drop).
    pub(crate) fn finish_interval(
        &mut self,
        k: TimerKey,
        callback: Box<dyn FnMut()>,
        base: u64,
    ) -> Option<Box<dyn FnMut()>> {
        let seq = self.bump_seq();
        let Some(e) = self.get_mut(k) else {
            return Some(callback);
        };
        e.action = TimerAction::Callback(callback);
        e.seq = seq;
        e.deadline = base.saturating_add(e.repeat);
        let (delay, deadline) = (e.repeat, e.deadline);
        self.push_item(
            delay,
            Item {
                deadline,
                seq,
                key: k.key,
            },
        );
        None
    }

    /// Removes every timer (shutdown).
    pub(crate) fn take_all(&mut self) -> Vec<TimerEntry> {
        self.heap.clear();
        self.lists.clear();
        self.by_delay.clear();
        self.tombstones = 0;
        self.entries.drain().collect()
    }

    fn bump_seq(&mut self) -> u64 {
        self.next_seq += 1;
        self.next_seq
    }

    fn is_live(&self, i: &Item) -> bool {
        self.entries
            .get(i.key as usize)
            .is_some_and(|e| e.seq == i.seq && !matches!(e.action, TimerAction::Running))
    }

    /// Appends `item` to its delay's list (in place if it is out of order).
    fn push_item(&mut self, delay: u64, item: Item) {
        let list = match self.by_delay.get(&delay) {
            Some(&l) => l,
            None => {
                let l = self.lists.insert(List {
                    delay,
                    items: VecDeque::new(),
                    heap_pos: usize::MAX,
                });
                self.by_delay.insert(delay, l);
                l
            }
        };
        let items = &mut self.lists[list].items;
        let at = items
            .iter()
            .rposition(|i| !item.before(i))
            .map_or(0, |p| p + 1);
        items.insert(at, item);
        let pos = self.lists[list].heap_pos;
        if pos == usize::MAX {
            self.heap.push(list);
            let last = self.heap.len() - 1;
            self.lists[list].heap_pos = last;
            self.sift_up(last);
        } else if at == 0 {
            self.sift_up(pos);
        }
    }

    /// Drops dead items at the fronts of the earliest lists.
    fn skip_tombstones(&mut self) {
        while let Some(&list) = self.heap.first() {
            let front = *self.lists[list]
                .items
                .front()
                .expect("lists in the heap are not empty");
            if self.is_live(&front) {
                return;
            }
            self.tombstones -= 1;
            self.pop_front_of_top();
        }
    }

    /// Removes the front item of the heap's top list and restores the heap.
    fn pop_front_of_top(&mut self) {
        let list = self.heap[0];
        self.lists[list].items.pop_front();
        if self.lists[list].items.is_empty() {
            let l = self.lists.remove(list);
            self.by_delay.remove(&l.delay);
            let last = self.heap.pop().expect("the top list is in the heap");
            if !self.heap.is_empty() {
                self.heap[0] = last;
                self.lists[last].heap_pos = 0;
                self.sift_down(0);
            }
        } else {
            self.sift_down(0);
        }
    }

    fn front(&self, list: usize) -> Item {
        *self.lists[list]
            .items
            .front()
            .expect("lists in the heap are not empty")
    }

    fn sift_up(&mut self, mut i: usize) {
        let list = self.heap[i];
        let key = self.front(list);
        while i > 0 {
            let parent = (i - 1) / 2;
            if !key.before(&self.front(self.heap[parent])) {
                break;
            }
            self.heap[i] = self.heap[parent];
            self.lists[self.heap[i]].heap_pos = i;
            i = parent;
        }
        self.heap[i] = list;
        self.lists[list].heap_pos = i;
    }

    fn sift_down(&mut self, mut i: usize) {
        let n = self.heap.len();
        let list = self.heap[i];
        let key = self.front(list);
        loop {
            let l = 2 * i + 1;
            if l >= n {
                break;
            }
            let r = l + 1;
            let child = if r < n && self.front(self.heap[r]).before(&self.front(self.heap[l])) {
                r
            } else {
                l
            };
            if !self.front(self.heap[child]).before(&key) {
                break;
            }
            self.heap[i] = self.heap[child];
            self.lists[self.heap[i]].heap_pos = i;
            i = child;
        }
        self.heap[i] = list;
        self.lists[list].heap_pos = i;
    }

    /// Drops every tombstone once they outnumber live timers twice over.
    fn maybe_compact(&mut self) {
        if self.tombstones <= 64 || self.tombstones <= 2 * self.entries.len() {
            return;
        }
        let keys: Vec<usize> = self.lists.iter().map(|(k, _)| k).collect();
        for list in keys {
            let mut items = std::mem::take(&mut self.lists[list].items);
            items.retain(|i| self.is_live(i));
            self.lists[list].items = items;
        }
        let empty: Vec<usize> = self
            .lists
            .iter()
            .filter(|(_, l)| l.items.is_empty())
            .map(|(k, _)| k)
            .collect();
        for list in empty {
            let l = self.lists.remove(list);
            self.by_delay.remove(&l.delay);
        }
        self.heap = self.lists.iter().map(|(k, _)| k).collect();
        for (pos, &list) in self.heap.iter().enumerate() {
            self.lists[list].heap_pos = pos;
        }
        for i in (0..self.heap.len() / 2).rev() {
            self.sift_down(i);
        }
        self.tombstones = 0;
    }
}

/// A timer taken out of the queue because it is due.
pub(crate) struct Fired {
    pub(crate) deadline: u64,
    pub(crate) action: TimerAction,
    pub(crate) location: &'static Location<'static>,
    pub(crate) refd: bool,
    /// An interval: its entry stays in the queue while the callback runs.
    pub(crate) stays: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cb() -> TimerAction {
        TimerAction::Callback(Box::new(|| {}))
    }

    fn drain(q: &mut TimerQueue, now: u64) -> Vec<TimerKey> {
        std::iter::from_fn(|| q.pop_due(now).map(|(k, _)| k)).collect()
    }

    #[test]
    fn fires_in_deadline_then_insertion_order() {
        let mut q = TimerQueue::new();
        let here = Location::caller();
        let a = q.insert(0, 30, 0, cb(), true, here);
        let b = q.insert(0, 10, 0, cb(), true, here);
        let c = q.insert(0, 10, 0, cb(), true, here);
        let d = q.insert(0, 5, 0, cb(), true, here);
        assert_eq!(q.next_deadline(), Some(5));
        assert_eq!(drain(&mut q, 10), vec![d, b, c]);
        assert_eq!(drain(&mut q, 29), vec![]);
        assert_eq!(drain(&mut q, 30), vec![a]);
        assert_eq!(q.len(), 0);
    }

    #[test]
    fn cancelled_timers_never_fire_and_the_heap_stays_bounded() {
        let mut q = TimerQueue::new();
        let here = Location::caller();
        let keep = q.insert(0, 1_000_000, 0, cb(), true, here);
        for i in 0..10_000 {
            let k = q.insert(0, 500 + i, 0, cb(), true, here);
            assert!(q.remove(k).is_some());
            assert!(q.remove(k).is_none());
        }
        assert!(
            q.lists.len() <= 130 && q.heap.len() <= 130,
            "{} lists",
            q.lists.len()
        );
        assert_eq!(drain(&mut q, u64::MAX), vec![keep]);
    }

    #[test]
    fn interval_rearms_behind_equal_deadlines() {
        let mut q = TimerQueue::new();
        let here = Location::caller();
        let iv = q.insert(0, 10, 10, cb(), true, here);
        let t = q.insert(0, 10, 0, cb(), true, here);
        let (k, fired) = q.pop_due(10).unwrap();
        assert_eq!(k, iv);
        let TimerAction::Callback(f) = fired.action else {
            panic!("not a callback")
        };
        let other = q.insert(0, 20, 0, cb(), true, here);
        assert!(q.finish_interval(k, f, 10).is_none());
        let order = drain(&mut q, 20);
        assert_eq!(order[0], t);
        assert_eq!(order[1], other);
        assert_eq!(order[2], iv);
    }

    #[test]
    fn interval_cleared_while_running_is_not_rearmed() {
        let mut q = TimerQueue::new();
        let iv = q.insert(0, 10, 10, cb(), true, Location::caller());
        let (k, fired) = q.pop_due(10).unwrap();
        assert!(q.remove(k).is_some());
        let TimerAction::Callback(f) = fired.action else {
            panic!("not a callback")
        };
        assert!(q.finish_interval(iv, f, 10).is_some());
        assert_eq!(q.len(), 0);
        assert_eq!(q.next_deadline(), None);
    }
}

#[cfg(test)]
mod list_tests {
    use super::*;

    fn cb() -> TimerAction {
        TimerAction::Once(Box::new(|| {}))
    }

    #[test]
    fn order_across_lists_and_out_of_order_arms_within_a_list() {
        let mut q = TimerQueue::new();
        let here = Location::caller();
        // Same delay, the second armed from an older clock read: it must still fire first.
        let late = q.insert(100, 10, 0, cb(), true, here);
        let early = q.insert(95, 10, 0, cb(), true, here);
        let other = q.insert(0, 104, 0, cb(), true, here);
        let tie = q.insert(100, 10, 0, cb(), true, here);
        let order: Vec<TimerKey> =
            std::iter::from_fn(|| q.pop_due(u64::MAX).map(|(k, _)| k)).collect();
        assert_eq!(order, [other, early, late, tie]);
        assert!(q.lists.is_empty() && q.heap.is_empty() && q.by_delay.is_empty());
    }

    #[test]
    fn random_delays_and_cancellations_fire_in_order() {
        let mut q = TimerQueue::new();
        let here = Location::caller();
        let mut x: u64 = 0x9e3779b97f4a7c15;
        let mut keys = Vec::new();
        for base in 0..200_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let k = q.insert(base, (x % 1000) * 1_000_000, 0, cb(), true, here);
            if x.is_multiple_of(7) {
                keys.push(k);
            }
        }
        for k in &keys {
            assert!(q.remove(*k).is_some());
        }
        let mut last = (0, 0);
        let mut n = 0;
        while let Some((k, fired)) = q.pop_due(u64::MAX) {
            assert!((fired.deadline, k.id) >= last, "out of order");
            last = (fired.deadline, k.id);
            n += 1;
        }
        assert_eq!(n + keys.len(), 200_000);
    }
}
