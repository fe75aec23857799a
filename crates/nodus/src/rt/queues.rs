//! The loop's queues of ready work: the microtask FIFO and the check (immediate) queue.
//!
//! Both store a timestamp with every runnable entry for the schedule-delay measurement. An
//! entry pushed between two poll boundaries is stamped lazily at the next boundary (`stamp`),
//! so queueing costs no clock read.
//!
//! Invariants:
//! - An entry not yet stamped carries [`UNSTAMPED`] (`u64::MAX`): whoever pops it before a
//!   boundary uses `stamp.min(boundary_time)`.
//! - Unstamped entries are always the last `unstamped` ones of a queue.
//! - A cancelled immediate leaves a tombstone in the order queue: the slab entry is gone, so the
//!   check phase skips it. Cancellation therefore takes effect at once, even mid-phase.
//! - Nothing here runs user code or drops a task while a queue is borrowed: callers pop first.

use std::collections::VecDeque;
use std::panic::Location;

use async_task::Runnable;
use slab::Slab;

use crate::task::TaskMeta;

/// The stamp of an entry queued since the last boundary.
pub(crate) const UNSTAMPED: u64 = u64::MAX;

/// Something that is polled like a task: a spawned task or the `block_on` main future.
pub(crate) enum RunItem {
    Task(Runnable<TaskMeta>),
    Main,
}

/// An entry of the microtask queue.
pub(crate) enum Micro {
    /// A `queue_microtask` closure and where it was queued (timed per drain, not one by one).
    Closure(Box<dyn FnOnce()>, &'static Location<'static>),
    /// A woken task: polling it is a microtask.
    Run(RunItem),
}

/// A FIFO whose runnable entries carry the boundary time they became runnable at.
pub(crate) struct StampedQueue<T> {
    entries: VecDeque<(T, u64)>,
    unstamped: usize,
}

impl<T> StampedQueue<T> {
    pub(crate) fn new() -> Self {
        StampedQueue {
            entries: VecDeque::new(),
            unstamped: 0,
        }
    }

    /// Pushes an entry to be stamped at the next boundary.
    #[inline]
    pub(crate) fn push(&mut self, item: T) {
        self.entries.push_back((item, UNSTAMPED));
        self.unstamped += 1;
    }

    /// Stamps every entry queued since the previous boundary with this boundary's time.
    #[cfg_attr(not(feature = "measure"), allow(dead_code))]
    #[inline]
    pub(crate) fn stamp(&mut self, t: u64) {
        if self.unstamped > 0 {
            let len = self.entries.len();
            for e in self.entries.range_mut(len - self.unstamped..) {
                e.1 = t;
            }
            self.unstamped = 0;
        }
    }

    #[inline]
    pub(crate) fn pop(&mut self) -> Option<(T, u64)> {
        let e = self.entries.pop_front()?;
        self.unstamped = self.unstamped.min(self.entries.len());
        Some(e)
    }

    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Removes everything (for shutdown; the caller drops the entries outside any borrow).
    pub(crate) fn take_all(&mut self) -> Vec<T> {
        self.unstamped = 0;
        self.entries.drain(..).map(|(item, _)| item).collect()
    }
}

/// An entry of the check queue.
pub(crate) enum CheckEntry {
    Immediate {
        key: usize,
        id: u64,
    },
    /// A task (or the main future) that yielded: it runs again in the check phase.
    Yield(RunItem),
}

/// A queued `set_immediate` callback.
pub(crate) struct ImmediateEntry {
    pub(crate) id: u64,
    pub(crate) callback: Box<dyn FnOnce()>,
    pub(crate) refd: bool,
    pub(crate) location: &'static Location<'static>,
}

/// The check queue: immediates (cancellable, in a slab) and yielded tasks, in one FIFO.
pub(crate) struct CheckQueue {
    pub(crate) order: StampedQueue<CheckEntry>,
    pub(crate) immediates: Slab<ImmediateEntry>,
    next_id: u64,
    /// Yielded tasks in `order` (they keep the loop alive).
    pub(crate) yields: usize,
}

impl CheckQueue {
    pub(crate) fn new() -> Self {
        CheckQueue {
            order: StampedQueue::new(),
            immediates: Slab::new(),
            next_id: 1,
            yields: 0,
        }
    }

    pub(crate) fn push_immediate(
        &mut self,
        callback: Box<dyn FnOnce()>,
        location: &'static Location<'static>,
    ) -> (usize, u64) {
        let id = self.next_id;
        self.next_id += 1;
        let key = self.immediates.insert(ImmediateEntry {
            id,
            callback,
            refd: true,
            location,
        });
        self.order.push(CheckEntry::Immediate { key, id });
        (key, id)
    }

    pub(crate) fn push_yield(&mut self, item: RunItem) {
        self.yields += 1;
        self.order.push(CheckEntry::Yield(item));
    }

    /// The live immediate `(key, id)`, if it has not run or been cleared.
    pub(crate) fn immediate_mut(&mut self, key: usize, id: u64) -> Option<&mut ImmediateEntry> {
        self.immediates.get_mut(key).filter(|e| e.id == id)
    }

    /// Removes immediate `(key, id)` if it is still queued.
    pub(crate) fn remove_immediate(&mut self, key: usize, id: u64) -> Option<ImmediateEntry> {
        self.immediate_mut(key, id)?;
        Some(self.immediates.remove(key))
    }

    /// Pops the next entry; a tombstone (cleared immediate) comes back as `None` inside `Some`.
    pub(crate) fn pop(&mut self) -> Option<(Option<Popped>, u64)> {
        let (entry, at) = self.order.pop()?;
        let popped = match entry {
            CheckEntry::Immediate { key, id } => {
                self.remove_immediate(key, id).map(Popped::Immediate)
            }
            CheckEntry::Yield(item) => {
                self.yields -= 1;
                Some(Popped::Yield(item))
            }
        };
        Some((popped, at))
    }
}

/// A live entry popped from the check queue.
pub(crate) enum Popped {
    Immediate(ImmediateEntry),
    Yield(RunItem),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_only_the_tail_queued_since_the_last_boundary() {
        let mut q = StampedQueue::new();
        q.push('a');
        q.push('b');
        q.stamp(10);
        q.push('c');
        q.stamp(20);
        q.push('d');
        q.push('e');
        q.stamp(30);
        let got: Vec<_> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(
            got,
            vec![('a', 10), ('b', 10), ('c', 20), ('d', 30), ('e', 30)]
        );
    }

    #[test]
    fn cleared_immediates_leave_tombstones() {
        let mut c = CheckQueue::new();
        let here = Location::caller();
        let (k1, i1) = c.push_immediate(Box::new(|| {}), here);
        let (k2, i2) = c.push_immediate(Box::new(|| {}), here);
        assert!(c.remove_immediate(k1, i1).is_some());
        assert!(c.remove_immediate(k1, i1).is_none());
        assert!(matches!(c.pop(), Some((None, _))));
        assert!(matches!(c.pop(), Some((Some(Popped::Immediate(e)), _)) if e.id == i2));
        assert!(c.remove_immediate(k2, i2).is_none());
        assert!(c.pop().is_none());
    }
}
