//! The timer queue: Node's design (`lib/internal/timers.js`), one FIFO list per distinct delay
//! and a min-heap of the lists, with the timers themselves in a slab.
//!
//! Node's rule, which this keeps exactly: a timer is appended to its delay's list; each list
//! carries an expiry (its first timer's deadline when the list was made, or when a timers pass
//! last found its first timer not yet due) and an order number (Node's `list.id`: when it was
//! made or last given that expiry); the heap orders lists by `(expiry, order)`. A timers pass at
//! `now` takes the top list while its expiry is at or before `now` and runs that list's timers
//! from its front, one at a time, while the front one is due (its own deadline at or before
//! `now`); at the first that is not, the list takes that timer's deadline as its expiry and a new
//! order number and sinks into the heap, and the pass goes on with the new top list. So every
//! due timer of one list runs before the next list's, whatever their deadlines: a 10 ms timer
//! armed 2 ms after another runs right after it, before a 9 ms timer armed with it (scenario 16).
//! The heap holds one entry per distinct delay (about a thousand for a million timers of
//! 0–999 ms): arming is O(1) plus a heap insert for a new delay, firing touches memory
//! sequentially.
//!
//! Invariants:
//! - A list is FIFO: `set_timeout` and `set_interval` append, and so does an interval's re-arm
//!   when its callback returns, though it counts from its callback's start: behind timers of its
//!   delay that callback armed, whose deadlines are later, so it waits for them (Node's order,
//!   scenario 17; its lateness shows that). Only a `Sleep` (a waker entry, no Node twin) is
//!   inserted by deadline from the back, since its deadline may come from an old clock read (it
//!   is fixed when the sleep is made, armed at its first poll); placed first, it lowers its
//!   list's expiry to its deadline.
//! - Each list is in the heap exactly once (`List::heap_pos`) and in `by_delay`, until it holds
//!   no live timer: then a clear removes it at once (Node's `unenroll`), and a pass removes the
//!   list it runs when that list is found empty. A list being run stays while its last timer
//!   runs, so an interval re-armed, or a timer of its delay armed, by that callback joins it.
//! - The slab entry is the truth; a list item whose slab entry is gone (or holds another timer:
//!   ids are never reused) is a tombstone, skipped when it reaches the front. A timer has at
//!   most one item, in the list its entry names, except while an interval runs (none: its
//!   entry's action is `Running` with its delay, since that list may go meanwhile). Cancelling is O(1) and takes effect at once.
//!   A list's expiry is not moved by a cancel (as in Node); `next_deadline` drops the tombstones
//!   at the top list's front and raises its expiry to its first live timer's deadline, so the
//!   poll phase does not wake for a cleared timer. Past twice as many tombstones as live timers,
//!   every list is compacted (the heap's keys do not depend on the items, so it is untouched).
//! - A firing interval's callback is taken out of its slab entry while it runs (so a callback
//!   can clear its own interval) and put back only if the entry was not cleared meanwhile, also
//!   when it panics (`rt/phases.rs` finishes it from a drop guard): no entry stays `Running`.
//! - Nothing here runs user code or drops callbacks on its own: removed entries are returned.
//!
//! Times are the process clock's nanoseconds, not Node's whole milliseconds (libuv's `uv_now`),
//! so a timer never fires before its deadline; where Node would see two deadlines in the same
//! millisecond, nodus may not (a list's expiry can then be a fraction of a millisecond later than
//! another's in nodus and equal in Node, where the order number decides).

use std::collections::VecDeque;
use std::panic::Location;
use std::task::Waker;

use slab::Slab;

use super::slots::Slots;

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
    /// An interval callback that is running right now, and its delay (its list may go while it
    /// runs: the callback can clear every other timer of that delay).
    Running { delay: u64 },
}

/// A timer: 48 bytes (its deadline is its list item's). `set_interval` makes the only timers
/// that re-arm (their action is `Callback`, `Running` while it runs).
pub(crate) struct TimerEntry {
    /// Unique for the process's life and stable for the timer's (what handles and its list item
    /// hold): a timer re-arms only after its item left its list (an interval's, popped to run),
    /// and a `Sleep` that resets takes a new entry, so no tombstone ever names a live entry.
    pub(crate) id: u64,
    pub(crate) action: TimerAction,
    pub(crate) location: &'static Location<'static>,
    /// The list (a key of `TimerQueue::lists`) holding its item, unless it is `Running`.
    list: u32,
    pub(crate) refd: bool,
}

/// One armed timer in a list (a tombstone once its entry is gone): 20 bytes, 4-aligned (a
/// million timers sit in these lists; it is only ever copied, never borrowed in place).
#[derive(Clone, Copy)]
#[repr(C, packed(4))]
struct Item {
    deadline: u64,
    id: u64,
    key: u32,
}

/// The timers of one delay, in firing order.
struct List {
    delay: u64,
    items: VecDeque<Item>,
    /// Items whose timer is armed (not tombstones).
    live: usize,
    /// Heap key: Node's `list.expiry` and `list.id`.
    expiry: u64,
    order: u64,
    heap_pos: usize,
}

pub(crate) struct TimerQueue {
    entries: Slots<TimerEntry>,
    lists: Slab<List>,
    /// foldhash (seeded per process), not SipHash: one lookup per arm, and SipHash's was ~3 % of
    /// a timer's CPU.
    by_delay: foldhash::HashMap<u64, usize>,
    /// List keys, a min-heap by `(expiry, order)`.
    heap: Vec<usize>,
    /// The last id or list order number given (one counter).
    next_seq: u64,
    tombstones: usize,
}

impl TimerQueue {
    pub(crate) fn new() -> Self {
        TimerQueue {
            entries: Slots::new(),
            lists: Slab::new(),
            by_delay: foldhash::HashMap::default(),
            heap: Vec::new(),
            next_seq: 0,
            tombstones: 0,
        }
    }

    /// Live timers.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Arms a timer for `base + delay` (an interval's period is `delay`).
    pub(crate) fn insert(
        &mut self,
        base: u64,
        delay: u64,
        action: TimerAction,
        refd: bool,
        location: &'static Location<'static>,
    ) -> TimerKey {
        let id = self.bump_seq();
        let deadline = base.saturating_add(delay);
        let by_deadline = matches!(action, TimerAction::Wake(_));
        let key = self.entries.insert(TimerEntry {
            id,
            action,
            location,
            list: 0,
            refd,
        });
        let key = u32::try_from(key).expect("nodus: more than 4 billion live timers");
        let list = self.push_item(delay, Item { deadline, id, key }, by_deadline);
        self.entries[key as usize].list = list;
        TimerKey { key, id }
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
        let list = match e.action {
            // A running interval's item already left its list, which may be gone.
            TimerAction::Running { delay } => self.by_delay.get(&delay).copied(),
            _ => {
                self.tombstones += 1;
                let list = e.list as usize;
                self.lists[list].live -= 1;
                Some(list)
            }
        };
        if let Some(list) = list
            && self.lists[list].live == 0
        {
            self.remove_list(list);
        }
        self.maybe_compact();
        Some(e)
    }

    /// When the poll phase must wake: the top list's expiry (its first live timer's deadline,
    /// or earlier, for a timer placed behind its list's first).
    pub(crate) fn next_deadline(&mut self) -> Option<u64> {
        loop {
            let list = *self.heap.first()?;
            match self.live_front(list) {
                None => self.remove_list(list),
                Some(front) if { front.deadline } > self.lists[list].expiry => {
                    self.rekey(list, front.deadline)
                }
                Some(_) => return Some(self.lists[list].expiry),
            }
        }
    }

    /// Takes the next timer due at `now`, in Node's order (module docs): a one-shot timer leaves
    /// the queue; an interval stays (its action becomes `Running`) and must be finished with
    /// `finish_interval`.
    pub(crate) fn pop_due(&mut self, now: u64) -> Option<(TimerKey, Fired)> {
        let (front, delay) = loop {
            let list = *self.heap.first()?;
            if self.lists[list].expiry > now {
                return None;
            }
            match self.live_front(list) {
                None => self.remove_list(list),
                Some(front) if { front.deadline } > now => self.rekey(list, front.deadline),
                Some(front) => {
                    let l = &mut self.lists[list];
                    l.items.pop_front();
                    l.live -= 1;
                    let (next, delay) = (l.items.front().copied(), l.delay);
                    // The next timer's entry, likely the next to fire: a list's entries lie far
                    // apart in the slab (armed among timers of every other delay), so each is a
                    // cache miss, which this overlaps with the callback about to run.
                    if let Some(next) = next {
                        self.entries.prefetch(next.key as usize);
                    }
                    break (front, delay);
                }
            }
        };
        let k = TimerKey {
            key: front.key,
            id: front.id,
        };
        let e = &mut self.entries[front.key as usize];
        if matches!(e.action, TimerAction::Callback(_)) {
            let action = std::mem::replace(&mut e.action, TimerAction::Running { delay });
            let fired = Fired {
                deadline: front.deadline,
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
                    deadline: front.deadline,
                    action: e.action,
                    location: e.location,
                    refd: e.refd,
                    stays: false,
                },
            ))
        }
    }

    /// Puts a fired interval's callback back and re-arms it from `base`, appended to its list;
    /// returns the callback if the interval was cleared while it ran (for the caller to drop).
    pub(crate) fn finish_interval(
        &mut self,
        k: TimerKey,
        callback: Box<dyn FnMut()>,
        base: u64,
    ) -> Option<Box<dyn FnMut()>> {
        let Some(e) = self.get_mut(k) else {
            return Some(callback);
        };
        let TimerAction::Running { delay } = e.action else {
            unreachable!("only a running interval is finished")
        };
        e.action = TimerAction::Callback(callback);
        let item = Item {
            deadline: base.saturating_add(delay),
            id: k.id,
            key: k.key,
        };
        let list = self.push_item(delay, item, false);
        self.entries[k.key as usize].list = list;
        None
    }

    /// Removes every timer (shutdown).
    pub(crate) fn take_all(&mut self) -> Vec<TimerEntry> {
        self.heap.clear();
        self.lists.clear();
        self.by_delay.clear();
        self.tombstones = 0;
        self.entries.take_all()
    }

    fn bump_seq(&mut self) -> u64 {
        self.next_seq += 1;
        self.next_seq
    }

    fn is_live(&self, i: &Item) -> bool {
        self.entries
            .get(i.key as usize)
            .is_some_and(|e| e.id == i.id && !matches!(e.action, TimerAction::Running { .. }))
    }

    /// Appends `item` to its delay's list (a new list's key is its deadline), and returns that
    /// list; `by_deadline` places it after the last item due no later instead (a `Sleep`).
    fn push_item(&mut self, delay: u64, item: Item, by_deadline: bool) -> u32 {
        let list = match self.by_delay.get(&delay) {
            Some(&l) => l,
            None => {
                let order = self.bump_seq();
                let l = self.lists.insert(List {
                    delay,
                    items: VecDeque::new(),
                    live: 0,
                    expiry: item.deadline,
                    order,
                    heap_pos: self.heap.len(),
                });
                self.by_delay.insert(delay, l);
                self.heap.push(l);
                self.sift_up(self.heap.len() - 1);
                l
            }
        };
        let l = &mut self.lists[list];
        l.live += 1;
        let at = if by_deadline {
            l.items
                .iter()
                .rposition(|i| { i.deadline } <= item.deadline)
                .map_or(0, |p| p + 1)
        } else {
            l.items.len()
        };
        l.items.insert(at, item);
        if at == 0 && item.deadline < l.expiry {
            l.expiry = item.deadline;
            let pos = l.heap_pos;
            self.sift_up(pos);
        }
        u32::try_from(list).expect("fewer lists than timers")
    }

    /// The first live item of `list`, its tombstones in front dropped.
    fn live_front(&mut self, list: usize) -> Option<Item> {
        loop {
            let front = *self.lists[list].items.front()?;
            if self.is_live(&front) {
                return Some(front);
            }
            self.lists[list].items.pop_front();
            self.tombstones -= 1;
        }
    }

    /// Gives the top list its first timer's deadline as expiry and a new order number (Node's
    /// "list wait"); it sinks into the heap.
    fn rekey(&mut self, list: usize, expiry: u64) {
        let order = self.bump_seq();
        let l = &mut self.lists[list];
        l.expiry = expiry;
        l.order = order;
        let pos = l.heap_pos;
        self.sift_down(pos);
    }

    /// Takes a list with no live timer out of the heap and the table.
    fn remove_list(&mut self, list: usize) {
        let l = self.lists.remove(list);
        self.tombstones -= l.items.len();
        self.by_delay.remove(&l.delay);
        let last = self.heap.pop().expect("a list is in the heap");
        if last != list {
            self.heap[l.heap_pos] = last;
            self.lists[last].heap_pos = l.heap_pos;
            self.sift_down(l.heap_pos);
            self.sift_up(self.lists[last].heap_pos);
        }
    }

    fn key(&self, list: usize) -> (u64, u64) {
        let l = &self.lists[list];
        (l.expiry, l.order)
    }

    fn sift_up(&mut self, mut i: usize) {
        let list = self.heap[i];
        let key = self.key(list);
        while i > 0 {
            let parent = (i - 1) / 2;
            if key >= self.key(self.heap[parent]) {
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
        let key = self.key(list);
        loop {
            let l = 2 * i + 1;
            if l >= n {
                break;
            }
            let r = l + 1;
            let child = if r < n && self.key(self.heap[r]) < self.key(self.heap[l]) {
                r
            } else {
                l
            };
            if self.key(self.heap[child]) >= key {
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
        TimerAction::Once(Box::new(|| {}))
    }

    fn interval() -> TimerAction {
        TimerAction::Callback(Box::new(|| {}))
    }

    fn drain(q: &mut TimerQueue, now: u64) -> Vec<TimerKey> {
        std::iter::from_fn(|| q.pop_due(now).map(|(k, _)| k)).collect()
    }

    #[test]
    fn fires_in_deadline_then_insertion_order() {
        let mut q = TimerQueue::new();
        let here = Location::caller();
        let a = q.insert(0, 30, cb(), true, here);
        let b = q.insert(0, 10, cb(), true, here);
        let c = q.insert(0, 10, cb(), true, here);
        let d = q.insert(0, 5, cb(), true, here);
        assert_eq!(q.next_deadline(), Some(5));
        assert_eq!(drain(&mut q, 10), vec![d, b, c]);
        assert_eq!(drain(&mut q, 29), vec![]);
        assert_eq!(drain(&mut q, 30), vec![a]);
        assert_eq!(q.len(), 0);
    }

    #[test]
    fn cancelled_timers_never_fire_and_their_lists_go() {
        let mut q = TimerQueue::new();
        let here = Location::caller();
        let keep = q.insert(0, 1_000_000, cb(), true, here);
        for i in 0..10_000 {
            let k = q.insert(0, 500 + i, cb(), true, here);
            assert!(q.remove(k).is_some());
            assert!(q.remove(k).is_none());
        }
        assert!(q.lists.len() == 1 && q.heap.len() == 1 && q.tombstones == 0);
        assert_eq!(drain(&mut q, u64::MAX), vec![keep]);
    }

    #[test]
    fn a_list_runs_all_its_due_timers_before_the_next_list() {
        let mut q = TimerQueue::new();
        let here = Location::caller();
        // Node's scenario 16: A (10) at 0, then C (10) and B (9) at 2.
        let a = q.insert(0, 10, cb(), true, here);
        let c = q.insert(2, 10, cb(), true, here);
        let b = q.insert(2, 9, cb(), true, here);
        assert_eq!(drain(&mut q, 22), vec![a, c, b]);
        // Only what is due runs: the list then waits for its next timer's deadline.
        let a = q.insert(0, 10, cb(), true, here);
        let c = q.insert(2, 10, cb(), true, here);
        let b = q.insert(2, 9, cb(), true, here);
        assert_eq!(drain(&mut q, 11), vec![a, b]);
        assert_eq!(q.next_deadline(), Some(12));
        assert_eq!(drain(&mut q, 12), vec![c]);
    }

    #[test]
    fn interval_rearms_at_the_back_of_its_list() {
        let mut q = TimerQueue::new();
        let here = Location::caller();
        let iv = q.insert(0, 10, interval(), true, here);
        let (k, fired) = q.pop_due(10).unwrap();
        assert_eq!(k, iv);
        let TimerAction::Callback(f) = fired.action else {
            panic!("not a callback")
        };
        // Its callback arms a timeout of its delay, then a later timer of another.
        let t = q.insert(11, 10, cb(), true, here);
        let other = q.insert(0, 20, cb(), true, here);
        assert!(q.finish_interval(k, f, 10).is_none());
        // The interval (due at 20) waits behind the timeout (due at 21); the other list does
        // not wait for theirs.
        assert_eq!(drain(&mut q, 20), vec![other]);
        assert_eq!(drain(&mut q, 21), vec![t, iv]);
    }

    #[test]
    fn interval_cleared_while_running_is_not_rearmed() {
        let mut q = TimerQueue::new();
        let iv = q.insert(0, 10, interval(), true, Location::caller());
        let (k, fired) = q.pop_due(10).unwrap();
        assert!(q.remove(k).is_some());
        let TimerAction::Callback(f) = fired.action else {
            panic!("not a callback")
        };
        assert!(q.finish_interval(iv, f, 10).is_some());
        assert_eq!(q.len(), 0);
        assert_eq!(q.next_deadline(), None);
    }

    /// While an interval runs, its list may go (its callback cleared the last other timer of its
    /// delay, or a pass found it empty) and the list's slot be taken by a list of another delay:
    /// finishing the interval re-arms it in a list of its own delay, and clearing it leaves the
    /// other list alone.
    #[test]
    fn a_running_intervals_list_may_go_and_its_slot_be_reused() {
        let mut q = TimerQueue::new();
        let here = Location::caller();
        let take = |fired: Fired| match fired.action {
            TimerAction::Callback(f) => f,
            _ => panic!("not an interval"),
        };
        let iv = q.insert(0, 10, interval(), true, here);
        let other = q.insert(5, 10, cb(), true, here);
        let (k, fired) = q.pop_due(10).unwrap();
        assert_eq!(k, iv);
        assert!(q.remove(other).is_some());
        assert!(
            q.lists.is_empty(),
            "the list of 10 went with its last armed timer"
        );
        let seven = q.insert(10, 7, cb(), true, here);
        assert!(q.finish_interval(iv, take(fired), 10).is_none());
        assert_eq!(q.pop_due(20).map(|(k, _)| k), Some(seven));
        let (k, fired) = q.pop_due(20).unwrap();
        assert_eq!(k, iv);
        // The next pass finds the list of 10 empty and removes it; a list of 3 takes its slot.
        assert!(q.pop_due(20).is_none());
        assert!(q.lists.is_empty());
        let three = q.insert(20, 3, cb(), true, here);
        assert!(q.remove(iv).is_some());
        assert!(q.finish_interval(iv, take(fired), 20).is_some());
        assert_eq!(q.len(), 1);
        assert_eq!(drain(&mut q, 23), vec![three]);
        assert!(q.lists.is_empty() && q.heap.is_empty() && q.by_delay.is_empty());
    }

    #[test]
    fn a_timer_takes_48_bytes_and_its_list_item_20() {
        assert_eq!(std::mem::size_of::<TimerEntry>(), 48);
        // The slab's vacant slot fits in a spare value of the action's tag.
        assert_eq!(std::mem::size_of::<Option<TimerEntry>>(), 48);
        assert_eq!(std::mem::size_of::<Item>(), 20);
    }

    #[test]
    fn a_cleared_front_does_not_wake_the_loop() {
        let mut q = TimerQueue::new();
        let here = Location::caller();
        let a = q.insert(0, 10, cb(), true, here);
        let b = q.insert(5, 10, cb(), true, here);
        assert!(q.remove(a).is_some());
        assert_eq!(q.next_deadline(), Some(15));
        assert_eq!(drain(&mut q, 15), vec![b]);
        assert_eq!(q.tombstones, 0);
    }
}

#[cfg(test)]
mod list_tests {
    use super::*;

    fn cb() -> TimerAction {
        TimerAction::Once(Box::new(|| {}))
    }

    #[test]
    fn timeouts_append_and_sleeps_go_in_place() {
        let mut q = TimerQueue::new();
        let here = Location::caller();
        // A timeout armed from an older clock read still goes behind its list (Node's `insert`
        // appends): it runs when the list's first timer does.
        let late = q.insert(100, 10, cb(), true, here);
        let early = q.insert(95, 10, cb(), true, here);
        let other = q.insert(0, 104, cb(), true, here);
        assert_eq!(q.pop_due(109).map(|(k, _)| k), Some(other));
        assert!(q.pop_due(109).is_none());
        let order: Vec<TimerKey> = std::iter::from_fn(|| q.pop_due(110).map(|(k, _)| k)).collect();
        assert_eq!(order, [late, early]);
        assert!(q.lists.is_empty() && q.heap.is_empty() && q.by_delay.is_empty());
        // A sleep's deadline is fixed when it is made: it is placed by deadline, and placed
        // first it brings its list's expiry forward.
        let late = q.insert(100, 10, TimerAction::Wake(None), true, here);
        let early = q.insert(95, 10, TimerAction::Wake(None), true, here);
        let tie = q.insert(95, 10, TimerAction::Wake(None), true, here);
        assert_eq!(q.next_deadline(), Some(105));
        let order: Vec<TimerKey> = std::iter::from_fn(|| q.pop_due(110).map(|(k, _)| k)).collect();
        assert_eq!(order, [early, tie, late]);
    }

    /// One of Node's `TimersList`s: timers as (deadline, id, repeat).
    struct ModelList {
        delay: u64,
        items: VecDeque<(u64, u64, u64)>,
        expiry: u64,
        order: u64,
    }

    /// Node's `processTimers`/`listOnTimeout`/`insert`/`unenroll`, written plainly: lists in a
    /// vector, the top found by a scan.
    #[derive(Default)]
    struct Model {
        lists: Vec<ModelList>,
        order: u64,
    }

    impl Model {
        fn insert(&mut self, delay: u64, item: (u64, u64, u64)) {
            if let Some(l) = self.lists.iter_mut().find(|l| l.delay == delay) {
                l.items.push_back(item);
            } else {
                self.order += 1;
                self.lists.push(ModelList {
                    delay,
                    items: VecDeque::from([item]),
                    expiry: item.0,
                    order: self.order,
                });
            }
        }

        fn remove(&mut self, id: u64, delay: u64) {
            for l in &mut self.lists {
                l.items.retain(|i| i.1 != id);
            }
            self.lists
                .retain(|l| l.delay != delay || !l.items.is_empty());
        }

        fn top(&self) -> Option<usize> {
            (0..self.lists.len()).min_by_key(|&i| (self.lists[i].expiry, self.lists[i].order))
        }

        fn rekey(&mut self, t: usize, expiry: u64) {
            self.order += 1;
            self.lists[t].expiry = expiry;
            self.lists[t].order = self.order;
        }

        fn pop_due(&mut self, now: u64) -> Option<(u64, u64, u64)> {
            loop {
                let t = self.top()?;
                if self.lists[t].expiry > now {
                    return None;
                }
                match self.lists[t].items.front().copied() {
                    None => {
                        self.lists.remove(t);
                    }
                    Some(f) if f.0 > now => self.rekey(t, f.0),
                    Some(f) => {
                        self.lists[t].items.pop_front();
                        return Some(f);
                    }
                }
            }
        }

        fn next_deadline(&mut self) -> Option<u64> {
            loop {
                let t = self.top()?;
                match self.lists[t].items.front().copied() {
                    None => {
                        self.lists.remove(t);
                    }
                    Some(f) if f.0 > self.lists[t].expiry => self.rekey(t, f.0),
                    Some(_) => return Some(self.lists[t].expiry),
                }
            }
        }
    }

    #[test]
    fn random_arms_clears_and_intervals_fire_in_nodes_order() {
        let mut q = TimerQueue::new();
        let mut m = Model::default();
        let here = Location::caller();
        let mut x: u64 = 0x9e3779b97f4a7c15;
        let mut rand = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let mut armed: Vec<(TimerKey, u64)> = Vec::new();
        let (mut now, mut fired) = (0u64, 0);
        for _ in 0..30_000 {
            match rand(10) {
                0..=4 => {
                    let delay = (1 + rand(20)) * 1000;
                    let repeat = if rand(32) == 0 { delay } else { 0 };
                    let action = if repeat > 0 {
                        TimerAction::Callback(Box::new(|| {}))
                    } else {
                        cb()
                    };
                    // Arms count from a clock read at or after the pass's `now`.
                    let base = now + rand(3000);
                    let k = q.insert(base, delay, action, true, here);
                    m.insert(delay, (base + delay, k.id, repeat));
                    armed.push((k, delay));
                }
                5 if !armed.is_empty() => {
                    let (k, delay) = armed.swap_remove(rand(armed.len() as u64) as usize);
                    if q.remove(k).is_some() {
                        m.remove(k.id, delay);
                    }
                }
                6 => assert_eq!(q.next_deadline(), m.next_deadline()),
                _ => {
                    now += rand(5000);
                    while let Some((k, f)) = q.pop_due(now) {
                        let (deadline, id, repeat) = m.pop_due(now).expect("the model is done");
                        assert_eq!((k.id, f.deadline), (id, deadline), "out of Node's order");
                        assert!(f.deadline <= now, "fired early");
                        fired += 1;
                        if let TimerAction::Callback(f) = f.action {
                            assert!(q.finish_interval(k, f, now).is_none());
                            m.insert(repeat, (now + repeat, id, repeat));
                        }
                    }
                    assert!(m.pop_due(now).is_none(), "the queue missed a due timer");
                }
            }
        }
        assert!(fired > 10_000, "{fired} fired");
    }
}
