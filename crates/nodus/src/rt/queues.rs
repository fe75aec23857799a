//! The loop's queues of ready work: the microtask FIFO and the check (immediate) queue.
//!
//! Every runnable entry (a woken task or main future, an immediate, a yielded task) carries the
//! time it became runnable, for the schedule-delay measurement: `Meter::wake_time`, read when it
//! is queued (a clock read in user code, the loop's known time when the loop itself wakes tasks:
//! I/O readiness, a `Sleep`'s timer). A task that woke itself (a yield) is still running: it is
//! runnable once its poll returns, and is stamped then (`stamp_yield`, with the poll's end). A
//! `queue_microtask` closure carries no time: closures are timed per batch, not one by one.
//!
//! Invariants:
//! - A poll queues at most one yield (a task, or the main future, is queued once however often
//!   it is woken), which carries [`UNSTAMPED`] until the poll returns: `unstamped` is its index,
//!   valid until then since nothing pops the check queue during a poll. One popped unstamped (its
//!   poll unwound before the stamp) counts no delay, and a stale index stamps nothing.
//! - A cancelled immediate leaves a tombstone in the order queue: the slab entry is gone, so the
//!   check phase skips it. Cancellation therefore takes effect at once, even mid-phase.
//! - Nothing here runs user code or drops a task while a queue is borrowed: callers pop first.

use std::collections::VecDeque;
use std::panic::Location;

use async_task::Runnable;
use slab::Slab;

use crate::task::TaskMeta;

/// The time of a yield queued by the poll under way, until that poll returns.
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
    /// A woken task, and when it was woken: polling it is a microtask.
    Run(RunItem, u64),
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
    /// The entries in order, each with when it became runnable.
    pub(crate) order: VecDeque<(CheckEntry, u64)>,
    pub(crate) immediates: Slab<ImmediateEntry>,
    next_id: u64,
    /// Yielded tasks in `order` (they keep the loop alive).
    pub(crate) yields: usize,
    /// The index in `order` of the yield the poll under way queued, if any.
    unstamped: usize,
}

impl CheckQueue {
    pub(crate) fn new() -> Self {
        CheckQueue {
            order: VecDeque::new(),
            immediates: Slab::new(),
            next_id: 1,
            yields: 0,
            unstamped: usize::MAX,
        }
    }

    /// Queues an immediate set at `at`.
    pub(crate) fn push_immediate(
        &mut self,
        callback: Box<dyn FnOnce()>,
        location: &'static Location<'static>,
        at: u64,
    ) -> (usize, u64) {
        let id = self.next_id;
        self.next_id += 1;
        let key = self.immediates.insert(ImmediateEntry {
            id,
            callback,
            refd: true,
            location,
        });
        self.order
            .push_back((CheckEntry::Immediate { key, id }, at));
        (key, id)
    }

    /// Queues a task (or the main future) that woke itself in its poll: [`UNSTAMPED`] until the
    /// poll returns (`stamp_yield`).
    pub(crate) fn push_yield(&mut self, item: RunItem) {
        self.yields += 1;
        self.unstamped = self.order.len();
        self.order.push_back((CheckEntry::Yield(item), UNSTAMPED));
    }

    /// Stamps with `t` the yield queued by the poll that just returned.
    #[cfg_attr(not(feature = "measure"), allow(dead_code))]
    #[inline]
    pub(crate) fn stamp_yield(&mut self, t: u64) {
        let i = std::mem::replace(&mut self.unstamped, usize::MAX);
        if let Some((CheckEntry::Yield(_), at @ UNSTAMPED)) = self.order.get_mut(i) {
            *at = t;
        }
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
        let (entry, at) = self.order.pop_front()?;
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
    fn cleared_immediates_leave_tombstones() {
        let mut c = CheckQueue::new();
        let here = Location::caller();
        let (k1, i1) = c.push_immediate(Box::new(|| {}), here, 10);
        let (k2, i2) = c.push_immediate(Box::new(|| {}), here, 20);
        assert!(c.remove_immediate(k1, i1).is_some());
        assert!(c.remove_immediate(k1, i1).is_none());
        assert!(matches!(c.pop(), Some((None, 10))));
        assert!(matches!(c.pop(), Some((Some(Popped::Immediate(e)), 20)) if e.id == i2));
        assert!(c.remove_immediate(k2, i2).is_none());
        assert!(c.pop().is_none());
    }

    #[test]
    fn a_yield_is_stamped_when_its_poll_returns_among_stamped_entries() {
        let mut c = CheckQueue::new();
        let here = Location::caller();
        c.push_immediate(Box::new(|| {}), here, 10);
        c.push_yield(RunItem::Main);
        c.push_immediate(Box::new(|| {}), here, 30);
        c.stamp_yield(40);
        c.stamp_yield(45); // no yield queued since: nothing to stamp
        c.push_yield(RunItem::Main);
        c.stamp_yield(50);
        let stamps: Vec<u64> = std::iter::from_fn(|| c.pop().map(|(_, at)| at)).collect();
        assert_eq!(stamps, [10, 40, 30, 50]);
    }
}
