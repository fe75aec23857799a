//! The timer queue: a binary min-heap of `(deadline, seq)` over slab-stored timers.
//!
//! Invariants:
//! - Firing order is `(deadline, seq)`; `seq` increases with every (re)arm, so equal deadlines
//!   fire in insertion order and a re-armed interval goes behind timers already queued.
//! - The slab entry is the truth; a heap entry whose slab entry is gone or has another `seq` is
//!   a tombstone, skipped when it reaches the top. Cancelling is O(1) and takes effect at once.
//! - Tombstones never outnumber live entries by much: past half the heap, it is rebuilt, so the
//!   heap stays bounded by the live timer count even when keep-alive timeouts are reset at a high
//!   rate.
//! - A firing interval's callback is taken out of its slab entry while it runs (so a callback
//!   can clear its own interval) and put back only if the entry was not cleared meanwhile.
//! - Nothing here runs user code or drops callbacks on its own: removed entries are returned.

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

#[derive(Clone, Copy)]
struct HeapEntry {
    deadline: u64,
    seq: u64,
    key: u32,
}

impl HeapEntry {
    #[inline]
    fn before(&self, other: &HeapEntry) -> bool {
        (self.deadline, self.seq) < (other.deadline, other.seq)
    }
}

pub(crate) struct TimerQueue {
    heap: Vec<HeapEntry>,
    entries: Slab<TimerEntry>,
    next_seq: u64,
}

impl TimerQueue {
    pub(crate) fn new() -> Self {
        TimerQueue {
            heap: Vec::new(),
            entries: Slab::new(),
            next_seq: 0,
        }
    }

    /// Live timers.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn insert(
        &mut self,
        deadline: u64,
        repeat: u64,
        action: TimerAction,
        refd: bool,
        location: &'static Location<'static>,
    ) -> TimerKey {
        let seq = self.bump_seq();
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
        self.push_heap(HeapEntry { deadline, seq, key });
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
        self.maybe_compact();
        Some(e)
    }

    /// Re-arms a live timer for `deadline` with a new position in the order.
    pub(crate) fn rearm(&mut self, k: TimerKey, deadline: u64) -> bool {
        let seq = self.bump_seq();
        let Some(e) = self.get_mut(k) else {
            return false;
        };
        e.seq = seq;
        e.deadline = deadline;
        self.push_heap(HeapEntry {
            deadline,
            seq,
            key: k.key,
        });
        self.maybe_compact();
        true
    }

    /// The earliest live deadline.
    pub(crate) fn next_deadline(&mut self) -> Option<u64> {
        self.skip_tombstones();
        self.heap.first().map(|h| h.deadline)
    }

    /// Takes the next timer due at `now`: a one-shot timer leaves the queue; an interval stays
    /// (its action becomes `Running`) and must be finished with `finish_interval`.
    pub(crate) fn pop_due(&mut self, now: u64) -> Option<(TimerKey, Fired)> {
        self.skip_tombstones();
        let top = *self.heap.first()?;
        if top.deadline > now {
            return None;
        }
        self.pop_heap();
        let e = &mut self.entries[top.key as usize];
        let k = TimerKey {
            key: top.key,
            id: e.id,
        };
        if e.repeat > 0 {
            let action = std::mem::replace(&mut e.action, TimerAction::Running);
            Some((
                k,
                Fired {
                    deadline: e.deadline,
                    action,
                    location: e.location,
                    refd: e.refd,
                    stays: true,
                },
            ))
        } else {
            let e = self.entries.remove(top.key as usize);
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
        let Some(e) = self.get_mut(k) else {
            return Some(callback);
        };
        e.action = TimerAction::Callback(callback);
        let deadline = base.saturating_add(e.repeat);
        // The heap entry was popped when the interval fired: a rearm pushes a fresh one.
        self.rearm(k, deadline);
        None
    }

    /// Removes every timer (shutdown).
    pub(crate) fn take_all(&mut self) -> Vec<TimerEntry> {
        self.heap.clear();
        self.entries.drain().collect()
    }

    fn bump_seq(&mut self) -> u64 {
        self.next_seq += 1;
        self.next_seq
    }

    fn is_live(&self, h: &HeapEntry) -> bool {
        self.entries
            .get(h.key as usize)
            .is_some_and(|e| e.seq == h.seq)
    }

    fn skip_tombstones(&mut self) {
        while let Some(top) = self.heap.first() {
            if self.is_live(top) {
                return;
            }
            self.pop_heap();
        }
    }

    fn maybe_compact(&mut self) {
        if self.heap.len() > 64 && self.heap.len() > 2 * self.entries.len() {
            let live: Vec<HeapEntry> = self
                .heap
                .iter()
                .copied()
                .filter(|h| self.is_live(h))
                .collect();
            self.heap = live;
            for i in (0..self.heap.len() / 2).rev() {
                self.sift_down(i);
            }
        }
    }

    /// Sift-up with a hole: one write per level instead of a swap.
    fn push_heap(&mut self, h: HeapEntry) {
        let mut i = self.heap.len();
        self.heap.push(h);
        while i > 0 {
            let parent = (i - 1) / 2;
            if !h.before(&self.heap[parent]) {
                break;
            }
            self.heap[i] = self.heap[parent];
            i = parent;
        }
        self.heap[i] = h;
    }

    fn pop_heap(&mut self) {
        let last = self.heap.pop().expect("pop_heap on an empty heap");
        if !self.heap.is_empty() {
            self.heap[0] = last;
            self.sift_down(0);
        }
    }

    /// Sift-down with a hole: one write per level instead of a swap.
    fn sift_down(&mut self, mut i: usize) {
        let n = self.heap.len();
        let h = self.heap[i];
        loop {
            let l = 2 * i + 1;
            if l >= n {
                break;
            }
            let r = l + 1;
            let child = if r < n && self.heap[r].before(&self.heap[l]) {
                r
            } else {
                l
            };
            if !self.heap[child].before(&h) {
                break;
            }
            self.heap[i] = self.heap[child];
            i = child;
        }
        self.heap[i] = h;
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
        let a = q.insert(30, 0, cb(), true, here);
        let b = q.insert(10, 0, cb(), true, here);
        let c = q.insert(10, 0, cb(), true, here);
        let d = q.insert(5, 0, cb(), true, here);
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
        let keep = q.insert(1_000_000, 0, cb(), true, here);
        for i in 0..10_000 {
            let k = q.insert(500 + i, 0, cb(), true, here);
            assert!(q.remove(k).is_some());
            assert!(q.remove(k).is_none());
        }
        assert!(q.heap.len() <= 130, "heap grew to {}", q.heap.len());
        assert_eq!(drain(&mut q, u64::MAX), vec![keep]);
    }

    #[test]
    fn interval_rearms_behind_equal_deadlines() {
        let mut q = TimerQueue::new();
        let here = Location::caller();
        let iv = q.insert(10, 10, cb(), true, here);
        let t = q.insert(10, 0, cb(), true, here);
        let (k, fired) = q.pop_due(10).unwrap();
        assert_eq!(k, iv);
        let TimerAction::Callback(f) = fired.action else {
            panic!("not a callback")
        };
        let other = q.insert(20, 0, cb(), true, here);
        assert!(q.finish_interval(k, f, 10).is_none());
        let order = drain(&mut q, 20);
        assert_eq!(order[0], t);
        assert_eq!(order[1], other);
        assert_eq!(order[2], iv);
    }

    #[test]
    fn interval_cleared_while_running_is_not_rearmed() {
        let mut q = TimerQueue::new();
        let iv = q.insert(10, 10, cb(), true, Location::caller());
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
