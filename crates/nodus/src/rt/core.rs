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
//! - Every runnable entry (task poll, main-future poll, immediate) is counted by
//!   `meter.arrive()` when queued and `meter.depart()`/`meter.cancel()` when it leaves. Remote
//!   work is stamped when posted and counted when the poll phase takes it from the remote queue
//!   (`meter.arrive_posted`, with its wait since the post), until it runs.
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
use std::collections::VecDeque;
use std::future::Future;
use std::panic::Location;
use std::ptr::NonNull;
use std::rc::{Rc, Weak};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Waker;

use slab::Slab;

use super::hooks::Hooks;
use super::queues::{CheckQueue, Micro, RunItem, StampedQueue};
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

/// The part of a loop other threads can reach.
pub(crate) struct Shared {
    pub(crate) loop_id: u64,
    remote: Mutex<Vec<Posted>>,
    /// Set when the remote queue is non-empty.
    notified: AtomicBool,
    /// The loop is blocked (or about to block) in `epoll_wait`: only then does a push write the
    /// eventfd. With `notified`, a Dekker handshake (both SeqCst): a pusher sets `notified` then
    /// reads `sleeping`; the loop sets `sleeping` then reads `notified`; one of them sees the other.
    sleeping: AtomicBool,
    waker: mio::Waker,
    /// The loop is gone: remote work can no longer run.
    closed: AtomicBool,
}

impl Shared {
    /// Queues work for the loop, stamped with the time (one clock read), and wakes its poll
    /// phase.
    pub(crate) fn push_remote(&self, item: Remote) -> Result<(), Remote> {
        if self.closed.load(Ordering::Acquire) {
            return Err(item);
        }
        #[cfg(feature = "measure")]
        let posted = crate::clock::now_ns();
        #[cfg(not(feature = "measure"))]
        let posted = 0;
        self.remote
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((item, posted));
        if !self.notified.swap(true, Ordering::SeqCst) && self.sleeping.load(Ordering::SeqCst) {
            // A failed wake leaves the item queued; the next poll picks it up.
            let _ = self.waker.wake();
        }
        Ok(())
    }

    /// A task woken from another thread (or while its loop is not entered).
    pub(crate) fn schedule_remote(&self, item: RunItem) {
        if let Err(Remote::Run(item)) = self.push_remote(Remote::Run(item)) {
            // The loop is gone. Its drop dropped every task's future, so a later wake or abort
            // schedules nothing; this is a wake from another thread that raced the drop (the
            // task marked scheduled before the registry's wake, pushed after the close). The
            // future can be dropped only on its own thread, which may not be this one: leak it.
            std::mem::forget(item);
        }
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
        std::mem::take(&mut *self.remote.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Puts back, ahead of anything posted since, work taken but not run (`block_on` returned in
    /// the middle of it), with its stamps. On the loop thread, which is awake: no wake needed.
    pub(crate) fn requeue(&self, rest: Vec<Posted>) {
        if rest.is_empty() || self.closed.load(Ordering::Acquire) {
            return;
        }
        let mut queue = self.remote.lock().unwrap_or_else(|e| e.into_inner());
        queue.splice(0..0, rest);
        self.notified.store(true, Ordering::SeqCst);
    }

    /// Work posted and not yet taken by the loop.
    pub(crate) fn posted_len(&self) -> usize {
        self.remote.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub(crate) fn close(&self) -> Vec<Posted> {
        self.closed.store(true, Ordering::Release);
        self.take_remote()
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
    pub(crate) micro: RefCell<StampedQueue<Micro>>,
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
    /// The task being polled, if any (budget accounting, stall attribution).
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
            remote: Mutex::new(Vec::new()),
            notified: AtomicBool::new(false),
            sleeping: AtomicBool::new(false),
            waker,
            closed: AtomicBool::new(false),
        });
        let core = Rc::new_cyclic(|me| Core {
            me: me.clone(),
            shared,
            meter: Meter::new(loop_id, config),
            reactor,
            ticks: RefCell::new(VecDeque::new()),
            micro: RefCell::new(StampedQueue::new()),
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

    /// A task's future was dropped: it leaves the registry (unless shutdown took it already).
    pub(crate) fn task_dropped(&self, key: usize, id: u64) {
        self.meter.task_dropped();
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

    /// Queues a woken task (or the main future) on this loop's thread.
    pub(crate) fn schedule_local(&self, item: RunItem, woken_while_running: bool) {
        if self.shutting_down.get() {
            // Dropping it here, on the loop thread, drops the task's future.
            drop(item);
            return;
        }
        if woken_while_running {
            self.check.borrow_mut().push_yield(item);
        } else {
            self.micro.borrow_mut().push(Micro::Run(item));
        }
        self.meter.arrive();
    }

    /// Uses one unit of the current task's cooperative budget; `false` when it is spent (the
    /// caller returns `Pending` after the task was woken to run again in the check phase).
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

    /// A loop boundary: reads (or reuses) the clock and stamps what was queued since the last.
    #[inline]
    pub(crate) fn boundary(&self) -> u64 {
        let t = self.meter.boundary();
        #[cfg(feature = "measure")]
        {
            self.micro.borrow_mut().stamp(t);
            self.check.borrow_mut().order.stamp(t);
        }
        t
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
