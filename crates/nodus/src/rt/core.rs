//! `Core`: one loop's state, and how work gets onto its queues.
//!
//! `Core` lives in an `Rc` owned by the `Runtime` and is reached from free functions through the
//! thread-local context. `Shared` is the part other threads may touch: the remote queue and the
//! mio waker that interrupts the poll phase.
//!
//! Invariants:
//! - Every `RefCell` borrow is short and never spans user code, a waker call, or a drop of a
//!   task/callback (those may re-enter the core). Removed entries are dropped after the borrow.
//! - `refs` counts active ref'd handles (timers, immediates, hooks, I/O sources); together with
//!   in-flight `requests`, pending and closing callbacks, yielded tasks and queued remote work
//!   it decides liveness (Node's exit rule, `alive()`). Remote work is alive only once queued: a
//!   `LoopHandle` does not keep the loop alive waiting for posts.
//! - Every runnable entry (task poll, main-future poll, immediate) is stamped with the time it
//!   became runnable (`meter.wake_time()`) and counted from it by `meter.arrive_at` when queued,
//!   until `meter.depart()`/`meter.cancel()` when it leaves. Remote work is stamped when posted
//!   and counted from its post once the poll phase takes it from the remote queue, until it runs.
//! - `tasks` holds every task of this loop whose future is alive (tokio's `OwnedTasks`): an entry
//!   from spawn until the future is dropped (completion, abort, shutdown). Its waker is how
//!   shutdown reaches a task nothing else would wake; its id tells a reused key from the task's.
//!   A task's future is dropped only by its loop with that loop current (its `Runnable` runs or
//!   is dropped only there; an abort or a wake from elsewhere goes through the remote queue), so
//!   `task_dropped` is called on the right registry.
//! - A handle that counts in `refs` or `requests`, or names an entry of a queue here, gives it
//!   back to this loop wherever it is dropped or used (`context::with_loop` by loop id, or
//!   `me`, a weak reference, for `!Send` owners): never to whichever loop is current.

use std::cell::{Cell, RefCell};
use std::collections::{HashSet, VecDeque};
use std::future::Future;
use std::panic::Location;
use std::ptr::NonNull;
use std::rc::{Rc, Weak};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Waker;

use slab::Slab;

use super::hooks::Hooks;
use super::queues::{CheckQueue, Micro, RunItem};
use crate::io::reactor::Reactor;
use crate::metrics::classes::ClassId;
use crate::metrics::meter::{Meter, MeterConfig, PollTarget};
use crate::time::queue::TimerQueue;

/// Tokio's figure: resource operations a task may do in one poll before it is made to yield.
pub(crate) const COOP_BUDGET: u32 = 128;

static NEXT_LOOP_ID: AtomicU64 = AtomicU64::new(1);

/// A `next_tick` closure and where it was queued (for stall reports).
pub(crate) type Tick = (Box<dyn FnOnce()>, &'static Location<'static>);

/// Work sent to the loop from another thread.
pub(crate) enum Remote {
    /// A woken task (or the main future).
    Run(RunItem),
    /// A closure to run on the loop in the poll phase (pool completions, `LoopHandle::post`).
    Callback(Box<dyn FnOnce() + Send>, &'static Location<'static>),
}

/// Remote work and when it was posted (`clock::now_ns`; 0 with measurements compiled out): the
/// start of its schedule delay and of its time in the run queue.
pub(crate) type Posted = (Remote, u64);

/// The remote queue: what other threads sent, and whether the loop is gone.
struct RemoteQueue {
    items: Vec<Posted>,
    /// The loop is gone (its `Runtime` dropped): remote work can no longer run. Set under the
    /// lock, so no push lands in a queue that is closed.
    closed: bool,
}

/// The part of a loop other threads can reach.
pub(crate) struct Shared {
    pub(crate) loop_id: u64,
    remote: Mutex<RemoteQueue>,
    /// Set when the remote queue is non-empty.
    notified: AtomicBool,
    /// The loop is blocked (or about to block) in `epoll_wait`: only then does a push write the
    /// eventfd. With `notified`, a Dekker handshake (both SeqCst): a pusher sets `notified` then
    /// reads `sleeping`; the loop sets `sleeping` then reads `notified`; one of them sees the other.
    sleeping: AtomicBool,
    waker: mio::Waker,
}

impl Shared {
    fn queue(&self) -> std::sync::MutexGuard<'_, RemoteQueue> {
        // Every update is one statement: consistent across a panic.
        self.remote.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues work for the loop, stamped with the time (one clock read, outside the lock), and
    /// wakes its poll phase; the work back if the loop is gone.
    pub(crate) fn push_remote(&self, item: Remote) -> Result<(), Remote> {
        #[cfg(feature = "measure")]
        let posted = crate::clock::now_ns();
        #[cfg(not(feature = "measure"))]
        let posted = 0;
        {
            let mut q = self.queue();
            if q.closed {
                return Err(item);
            }
            q.items.push((item, posted));
        }
        if !self.notified.swap(true, Ordering::SeqCst) && self.sleeping.load(Ordering::SeqCst) {
            // A failed wake leaves the item queued; the next poll picks it up.
            let _ = self.waker.wake();
        }
        Ok(())
    }

    /// A task woken from another thread (or while its loop is not entered).
    pub(crate) fn schedule_remote(&self, item: RunItem) {
        #[cfg(test)]
        tests::in_flight();
        // Refused only once the loop is gone, and then `item` is the main future's: a task's
        // `Runnable` exists only while its future does, and the runtime's drop closes the queue
        // only once no task's future is left (`Core::shutdown`), so there is none to drop here.
        let _ = self.push_remote(Remote::Run(item));
    }

    pub(crate) fn has_remote(&self) -> bool {
        self.notified.load(Ordering::SeqCst)
    }

    /// The loop is about to block in `epoll_wait`; returns whether remote work arrived meanwhile
    /// (then it must not block).
    pub(crate) fn going_to_sleep(&self) -> bool {
        self.sleeping.store(true, Ordering::SeqCst);
        self.has_remote()
    }

    pub(crate) fn awake(&self) {
        self.sleeping.store(false, Ordering::Relaxed);
    }

    pub(crate) fn take_remote(&self) -> Vec<Posted> {
        self.notified.store(false, Ordering::Release);
        std::mem::take(&mut self.queue().items)
    }

    /// Puts back, ahead of anything posted since, work taken but not run (`block_on` returned in
    /// the middle of it), with its stamps. On the loop thread, which is awake: no wake needed.
    pub(crate) fn requeue(&self, rest: Vec<Posted>) {
        if rest.is_empty() {
            return;
        }
        let mut q = self.queue();
        if q.closed {
            return;
        }
        q.items.splice(0..0, rest);
        self.notified.store(true, Ordering::SeqCst);
    }

    /// Work posted and not yet taken by the loop.
    pub(crate) fn posted_len(&self) -> usize {
        self.queue().items.len()
    }

    /// Refuses every later push; returns what was queued.
    pub(crate) fn close(&self) -> Vec<Posted> {
        self.notified.store(false, Ordering::Release);
        let mut q = self.queue();
        q.closed = true;
        std::mem::take(&mut q.items)
    }
}

/// The `block_on` future, type- and lifetime-erased while `block_on` runs.
pub(crate) type MainPtr = NonNull<dyn Future<Output = ()> + 'static>;

/// One event loop.
pub(crate) struct Core {
    /// This core itself, for handles that must reach their own loop from wherever they are
    /// dropped (an I/O source's [`Registration`](crate::io::reactor::Registration)): dead once
    /// the `Runtime` is gone.
    pub(crate) me: Weak<Core>,
    pub(crate) shared: Arc<Shared>,
    pub(crate) meter: Meter,
    pub(crate) reactor: Reactor,
    pub(crate) ticks: RefCell<VecDeque<Tick>>,
    pub(crate) micro: RefCell<VecDeque<Micro>>,
    pub(crate) check: RefCell<CheckQueue>,
    pub(crate) timers: RefCell<TimerQueue>,
    pub(crate) pending: RefCell<VecDeque<Tick>>,
    pub(crate) closing: RefCell<Vec<Tick>>,
    pub(crate) hooks: RefCell<Hooks>,
    pub(crate) refs: Cell<usize>,
    pub(crate) requests: Cell<usize>,
    pub(crate) stop: Cell<bool>,
    pub(crate) shutting_down: Cell<bool>,
    pub(crate) budget: Cell<u32>,
    /// The loop's time when the last poll phase that reported every ready source began, once it
    /// has dispatched them all (`crate::time::polled_ns`); 0 before the first.
    pub(crate) polled: Cell<u64>,
    /// Under full poll batches (`rt/phases.rs`): the loop's time before the oldest full batch
    /// not yet known to have been followed by every source it left unreported, and the tokens
    /// reported since (dispatched batches only). Cleared by a complete poll.
    pub(crate) full_batch: RefCell<Option<(u64, HashSet<usize>)>>,
    /// The task or `block_on` future being polled, if any: whose cooperative budget
    /// `consume_budget` draws on (`None`: a callback's code, unbudgeted).
    pub(crate) current: Cell<Option<PollTarget>>,
    next_task: Cell<u64>,
    /// Every task whose future is alive: its id and a waker (see the module invariants).
    pub(crate) tasks: RefCell<Slab<(u64, Waker)>>,
    // The `block_on` future.
    pub(crate) main: Cell<Option<MainPtr>>,
    pub(crate) main_waker: RefCell<Option<Arc<super::main_task::MainWaker>>>,
    pub(crate) main_running: Cell<bool>,
    pub(crate) main_done: Cell<bool>,
    pub(crate) main_location: Cell<&'static Location<'static>>,
}

impl Core {
    pub(crate) fn new(config: MeterConfig) -> std::io::Result<Rc<Core>> {
        let loop_id = NEXT_LOOP_ID.fetch_add(1, Ordering::Relaxed);
        let (reactor, waker) = Reactor::new()?;
        let shared = Arc::new(Shared {
            loop_id,
            remote: Mutex::new(RemoteQueue {
                items: Vec::new(),
                closed: false,
            }),
            notified: AtomicBool::new(false),
            sleeping: AtomicBool::new(false),
            waker,
        });
        let meter = Meter::new(&shared, config);
        let core = Rc::new_cyclic(|me| Core {
            me: me.clone(),
            shared,
            meter,
            reactor,
            ticks: RefCell::new(VecDeque::new()),
            micro: RefCell::new(VecDeque::new()),
            check: RefCell::new(CheckQueue::new()),
            timers: RefCell::new(TimerQueue::new()),
            pending: RefCell::new(VecDeque::new()),
            closing: RefCell::new(Vec::new()),
            hooks: RefCell::new(Hooks::new()),
            refs: Cell::new(0),
            requests: Cell::new(0),
            stop: Cell::new(false),
            shutting_down: Cell::new(false),
            budget: Cell::new(COOP_BUDGET),
            polled: Cell::new(0),
            full_batch: RefCell::new(None),
            current: Cell::new(None),
            next_task: Cell::new(1),
            tasks: RefCell::new(Slab::new()),
            main: Cell::new(None),
            main_waker: RefCell::new(None),
            main_running: Cell::new(false),
            main_done: Cell::new(false),
            main_location: Cell::new(Location::caller()),
        });
        super::context::add_loop(loop_id, Rc::downgrade(&core), &core.shared);
        Ok(core)
    }

    pub(crate) fn loop_id(&self) -> u64 {
        self.shared.loop_id
    }

    pub(crate) fn next_task_id(&self) -> u64 {
        let id = self.next_task.get();
        self.next_task.set(id + 1);
        id
    }

    /// The key `register_task` will give the next task (the guard in its future is built first).
    pub(crate) fn next_task_key(&self) -> usize {
        self.tasks.borrow().vacant_key()
    }

    /// Registers a spawned task until its future is dropped (`task_dropped`).
    pub(crate) fn register_task(&self, key: usize, id: u64, waker: Waker) {
        let k = self.tasks.borrow_mut().insert((id, waker));
        debug_assert_eq!(
            k, key,
            "a task was registered between next_task_key and its own"
        );
    }

    /// A task's poll that had a note returned: if it changed it, the task keeps the note for
    /// its next polls if it is still set and the task's future is alive.
    #[cold]
    pub(crate) fn end_task_note(&self, key: usize, id: u64) {
        if self.meter.take_note_change() {
            let alive = matches!(self.tasks.borrow().get(key), Some(&(i, _)) if i == id);
            self.meter.end_task_note(key, id, alive);
        }
    }

    /// A task's future was dropped: it leaves the registry.
    pub(crate) fn task_dropped(&self, key: usize, id: u64) {
        self.meter.task_dropped();
        self.meter.task_note_dropped(key, id);
        let mut tasks = self.tasks.borrow_mut();
        let entry = match tasks.get(key) {
            Some(&(i, _)) if i == id => Some(tasks.remove(key)),
            _ => None,
        };
        drop(tasks);
        // The registry's waker: dropped outside the borrow.
        drop(entry);
    }

    /// An active ref'd handle appeared.
    #[inline]
    pub(crate) fn ref_handle(&self) {
        self.refs.set(self.refs.get() + 1);
    }

    /// An active ref'd handle went away (or was unref'd).
    #[inline]
    pub(crate) fn unref_handle(&self) {
        self.refs.set(self.refs.get() - 1);
    }

    /// Sets a handle's `refd` flag to `on`, counting a change (and only a change) in the refs.
    #[inline]
    pub(crate) fn set_refd(&self, refd: &mut bool, on: bool) {
        match (std::mem::replace(refd, on), on) {
            (false, true) => self.ref_handle(),
            (true, false) => self.unref_handle(),
            _ => {}
        }
    }

    /// Whether anything ref'd can still produce work: Node's exit rule. Remote work already
    /// queued (posts, wakes from other threads) is work due, like a pending immediate; it is
    /// checked last, so a loop kept alive by its handles pays no atomic load for it.
    pub(crate) fn alive(&self) -> bool {
        self.refs.get() > 0
            || self.requests.get() > 0
            || !self.pending.borrow().is_empty()
            || !self.closing.borrow().is_empty()
            || self.check.borrow().yields > 0
            || !self.micro.borrow().is_empty()
            || !self.ticks.borrow().is_empty()
            || self.shared.has_remote()
    }

    /// Queues a woken task (or the main future) on this loop's thread, runnable from now: the
    /// wake's own time (`Meter::wake_time`), so its schedule delay counts the rest of the poll
    /// that woke it. A task that woke itself is running until its poll returns, and runnable
    /// from then (`after_poll`).
    pub(crate) fn schedule_local(&self, item: RunItem, woken_while_running: bool) {
        if self.shutting_down.get() {
            // Dropping it here, on the loop thread, drops the task's future.
            drop(item);
            return;
        }
        if woken_while_running {
            self.check.borrow_mut().push_yield(item);
            self.meter.arrive_self();
        } else {
            let at = self.meter.wake_time();
            self.micro.borrow_mut().push_back(Micro::Run(item, at));
            self.meter.arrive_at(at);
        }
    }

    /// A task's (or the main future's) poll returned: a yield it queued is runnable from the
    /// poll's end.
    #[inline]
    pub(crate) fn after_poll(&self) {
        #[cfg(feature = "measure")]
        if self.meter.self_woken() {
            let t = self.meter.self_wake_runnable();
            self.check.borrow_mut().stamp_yield(t);
        }
    }

    /// Uses one unit of the cooperative budget of the task (or `block_on` future) being polled;
    /// `false` when it is spent (the caller returns `Pending` after the task was woken to run
    /// again in the check phase).
    pub(crate) fn consume_budget(&self) -> bool {
        let Some(target) = self.current.get() else {
            return true;
        };
        let left = self.budget.get();
        if left == 0 {
            self.meter.forced_yield(target.class);
            return false;
        }
        self.budget.set(left - 1);
        true
    }

    /// A loop boundary: reads (or reuses) the clock.
    #[inline]
    pub(crate) fn boundary(&self) -> u64 {
        self.meter.boundary()
    }

    /// A callback's poll target.
    pub(crate) fn callback_target(
        name: &'static str,
        location: &'static Location<'static>,
        class: ClassId,
    ) -> PollTarget {
        PollTarget {
            task_id: 0,
            name,
            location,
            class,
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::cell::RefCell;
    use std::future::poll_fn;
    use std::sync::mpsc;
    use std::sync::{Arc, Mutex};
    use std::task::{Poll, Waker};
    use std::thread::{self, ThreadId};
    use std::time::{Duration, Instant};

    use crate::Runtime;

    thread_local! {
        /// Run by `schedule_remote` on this thread before it pushes: a waking thread held up
        /// inside a wake (the task marked scheduled, its `Runnable` in hand).
        static IN_FLIGHT: RefCell<Option<Box<dyn Fn()>>> = const { RefCell::new(None) };
    }

    /// The loops whose drop is waiting for a wake in flight.
    static WAITING: Mutex<Vec<u64>> = Mutex::new(Vec::new());

    pub(crate) fn in_flight() {
        IN_FLIGHT.with(|hook| {
            if let Some(hook) = &*hook.borrow() {
                hook();
            }
        });
    }

    pub(crate) fn waiting_for_a_wake(loop_id: u64) {
        let mut waiting = WAITING.lock().unwrap();
        if !waiting.contains(&loop_id) {
            waiting.push(loop_id);
        }
    }

    /// Records on which thread it is dropped.
    struct DropSeen(Arc<Mutex<Option<ThreadId>>>);

    impl Drop for DropSeen {
        fn drop(&mut self) {
            *self.0.lock().unwrap() = Some(thread::current().id());
        }
    }

    /// A wake from another thread in flight while the runtime is dropped (the task marked
    /// scheduled before the drop's own wake of it, its `Runnable` pushed once the drop would
    /// have closed the remote queue): the drop waits for it and drops the task's future, on the
    /// loop's thread. Before, the push found the queue closed and the future was never dropped.
    #[test]
    fn a_wake_from_another_thread_racing_the_runtime_drop_drops_the_future() {
        let rt = Runtime::new();
        let dropped_on = Arc::new(Mutex::new(None));
        let seen = DropSeen(dropped_on.clone());
        let (wakers, waker) = mpsc::channel::<Waker>();
        rt.block_on(async {
            crate::spawn(async move {
                let _seen = seen;
                poll_fn(|cx| {
                    let _ = wakers.send(cx.waker().clone());
                    Poll::<()>::Pending
                })
                .await
            })
            .detach();
            crate::yield_now().await;
        });
        let waker = waker.recv().unwrap();
        let handle = rt.handle();
        let (in_flight, wait_in_flight) = mpsc::channel();
        let waking = thread::spawn(move || {
            IN_FLIGHT.with(|hook| {
                *hook.borrow_mut() = Some(Box::new(move || {
                    in_flight.send(()).unwrap();
                    // Held up until the drop closed the remote queue (before the fix) or waits
                    // for this wake (5 s at most).
                    let deadline = Instant::now() + Duration::from_secs(5);
                    while handle.post(|| {})
                        && !WAITING.lock().unwrap().contains(&handle.loop_id())
                        && Instant::now() < deadline
                    {
                        thread::sleep(Duration::from_millis(1));
                    }
                }));
            });
            waker.wake();
        });
        wait_in_flight.recv().unwrap();
        drop(rt);
        waking.join().unwrap();
        assert_eq!(
            *dropped_on.lock().unwrap(),
            Some(thread::current().id()),
            "the task's future is dropped by the runtime's drop, on the loop's thread"
        );
    }
}
