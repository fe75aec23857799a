//! The runtime: one event loop on the current thread, and the ways to run it.
//!
//! - `block_on(future)` runs the loop until the future completes (the future need not be
//!   `'static`); whatever else is queued stays queued for the next `run`/`block_on`.
//! - `run()` runs until nothing ref'd is alive (Node's exit rule): a timers pass, then passes of
//!   pending, idle, prepare, poll, check, close and timers (libuv 1.45+, Node 20), what is alive
//!   looked at after each; `run_once()` and `run_nowait()` run one such pass, blocking or not in
//!   the poll phase (so a pass that waited for a timer runs it, as `UV_RUN_ONCE` does).
//! - `stop()` ends `run` after the current iteration (libuv's `uv_stop`). Every run mode consumes
//!   the request when it returns, as `uv_run` does; `block_on` does not honour it.
//! - `enter(f)` runs `f` as the "main script": with this loop current, then drains next-ticks and
//!   microtasks, as Node does after the main module returns.
//!
//! Invariants: a loop is run by the thread that created it (`Runtime` is `!Send`), and never
//! inside another running loop on the same thread. Dropping the runtime drops every task,
//! callback and timer it still holds, on this thread, with the loop current (a drop may cancel a
//! timer, close an fd, spawn: all of it is dropped too): every task through the loop's task
//! registry, so also one nothing could wake, whose `JoinHandle` then resolves `Cancelled`, and
//! one whose wake from another thread races the drop (the drop waits for that wake's push). No
//! task's future outlives the drop, whatever other threads do.

pub(crate) mod context;
pub(crate) mod core;
mod drain;
pub(crate) mod entry;
pub(crate) mod hooks;
mod immediate;
mod main_task;
mod phases;
pub(crate) mod queues;
mod ticks;

use std::any::Any;
use std::future::Future;
use std::panic::{AssertUnwindSafe, Location, catch_unwind, resume_unwind};
use std::pin::pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::Waker;
use std::time::Duration;

pub use hooks::{HookHandle, defer, idle, prepare};
pub use immediate::{Immediate, clear_immediate, set_immediate};
pub use ticks::{next_tick, queue_microtask};

use self::context::{Entered, Running, with_core};
use self::core::{Core, Remote, Shared};
use self::phases::Mode;
use crate::metrics::meter::MeterConfig;
use crate::metrics::phase::Phase;

/// Configures a [`Runtime`].
#[derive(Debug, Clone)]
pub struct Builder {
    config: MeterConfig,
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            config: MeterConfig {
                slow_poll: Duration::from_millis(100),
                stall: Duration::from_millis(100),
                watchdog: true,
                interval: Duration::from_secs(1),
            },
        }
    }
}

impl Builder {
    pub fn new() -> Builder {
        Builder::default()
    }

    /// A task poll, callback or next-tick/microtask closure at least this long is counted and
    /// logged (target `nodus::slow_poll`) as a slow poll when it returns (default 100 ms).
    /// Closures are timed per batch (those run between two task polls or callbacks): a batch this
    /// long is one slow poll, named after its last closure's queue (`next_tick` or `microtask`).
    pub fn slow_poll_threshold(mut self, d: Duration) -> Builder {
        self.config.slow_poll = d;
        self
    }

    /// The watchdog reports a poll still running after this long (default 100 ms).
    pub fn stall_threshold(mut self, d: Duration) -> Builder {
        self.config.stall = d;
        self
    }

    /// Whether the stall watchdog watches this loop (default on).
    pub fn watchdog(mut self, on: bool) -> Builder {
        self.config.watchdog = on;
        self
    }

    /// Shortest length of the interval behind "last interval" figures such as utilization
    /// (default 1 s). An interval closes once it is this long, at the next loop iteration,
    /// snapshot or end of a poll-phase wait, so it may be longer (a long wait is an interval of
    /// its own, all idle); before the first one closes, the figures cover the time since start.
    pub fn metrics_interval(mut self, d: Duration) -> Builder {
        self.config.interval = d.max(Duration::from_millis(1));
        self
    }

    /// Creates the loop on the current thread.
    ///
    /// The first runtime of the process (unless a pool or `Channel::from_env` came first) takes
    /// the variables a parent set for this process alone out of the environment, as Node does
    /// at its startup: `NODE_CHANNEL_FD` and `NODE_CHANNEL_SERIALIZATION_MODE` (for
    /// [`Channel::from_env`](crate::ipc::Channel::from_env)), `NODE_UNIQUE_ID` and
    /// `NODUS_PRIMARY` (for [`Worker::get`](crate::cluster::Worker::get)), so no grandchild
    /// inherits them. Where one is set, that is `std::env::remove_var`: build it before starting
    /// threads that read the environment through libc (`getenv`, `getaddrinfo`, `localtime`),
    /// as for any `remove_var`. nodus's own threads all start afterwards.
    ///
    /// It also decides, once per process, whether the loop refills the CPU's return stack after
    /// its hot syscalls ([`crate::io::after_syscall`]; `NODUS_RSB_REFILL`).
    pub fn build(self) -> std::io::Result<Runtime> {
        crate::parent_env::take();
        crate::io::refills_return_stack();
        Ok(Runtime {
            core: Core::new(self.config)?,
        })
    }
}

/// One event loop on the current thread.
pub struct Runtime {
    core: Rc<Core>,
}

impl Runtime {
    /// A loop with the default configuration.
    ///
    /// # Panics
    /// If the epoll instance cannot be created (out of file descriptors); use
    /// `Builder::build` to get the error instead.
    pub fn new() -> Runtime {
        Builder::new()
            .build()
            .unwrap_or_else(|e| panic!("nodus: cannot create the event loop: {e}"))
    }

    pub fn builder() -> Builder {
        Builder::new()
    }

    /// Runs the loop until `future` completes and returns its output.
    ///
    /// [`stop`] does not end it, nor keep its poll phase from blocking; a stop requested during
    /// (or before) it is discarded when it returns.
    ///
    /// # Panics
    /// When called from inside a running nodus loop (a thread runs one loop at a time).
    ///
    /// A panic in `future` itself, or in a callback the loop runs (a timer, immediate, hook,
    /// pending, next-tick, microtask, `LoopHandle::post` or close callback: Node's uncaught
    /// exception), unwinds out of `block_on`, dropping `future`. The runtime stays usable: what
    /// was queued behind the callback is still queued, and the next `block_on` or `run` runs it;
    /// a panicking interval stays armed and a panicking idle or prepare hook registered. A panic
    /// in a spawned task does not unwind: its `JoinHandle` returns it.
    #[track_caller]
    pub fn block_on<F: Future>(&self, future: F) -> F::Output {
        let location = Location::caller();
        let _running = Running::new("Runtime::block_on");
        let _entered = Entered::new(&self.core);
        let _active = Active::new(&self.core);
        let _stop = ConsumeStop(&self.core);
        let core = &*self.core;
        let mut output = None;
        {
            let mut main = pin!(async {
                output = Some(future.await);
            });
            let _guard = core.install_main(main.as_mut(), location);
            core.meter.phase(Phase::Main);
            let t = core.boundary();
            core.poll_main(t);
            core.drain();
            if !core.main_done.get() {
                core.run_timers(); // as `run`'s pass before its loop
            }
            while !core.main_done.get() {
                core.iterate(Mode::BlockOn);
            }
        }
        output.expect("the main future completed")
    }

    /// Runs the loop until nothing ref'd is alive: no ref'd timer, immediate, hook or I/O
    /// handle, no in-flight pool request, no pending or closing callback, no work posted from
    /// another thread (a [`LoopHandle::post`], a wake) still queued (Node's exit rule).
    /// Returns early after [`stop`].
    ///
    /// # Panics
    /// When called from inside a running nodus loop. A panic in a callback the loop runs (a
    /// timer, immediate, hook, pending, next-tick, microtask, `LoopHandle::post` or close
    /// callback) unwinds out of `run`, and the runtime stays usable: what was queued behind it is
    /// still queued, and the next `run` (or `block_on`) runs it; a panicking interval stays armed
    /// (re-armed as if its callback had returned, as in Node) and a panicking idle or prepare
    /// hook registered. A panic in a spawned task does not unwind: its `JoinHandle` returns it.
    #[track_caller]
    pub fn run(&self) {
        let _running = Running::new("Runtime::run");
        let _entered = Entered::new(&self.core);
        let _active = Active::new(&self.core);
        let _stop = ConsumeStop(&self.core);
        self.core.drain();
        // libuv's timers pass before its loop (`UV_RUN_DEFAULT`): the cycle starts at timers.
        if self.core.alive() && !self.core.stop.get() {
            self.core.run_timers();
        }
        while self.core.alive() && !self.core.stop.get() {
            self.core.iterate(Mode::Default);
        }
    }

    /// One pass (pending, idle, prepare, poll, check, closing, timers: libuv's `UV_RUN_ONCE`),
    /// blocking in the poll phase if nothing is ready: a pass that waited for a timer runs it.
    /// Returns whether the loop is still alive.
    #[track_caller]
    pub fn run_once(&self) -> bool {
        self.one_pass(Mode::Once)
    }

    /// One pass as [`run_once`](Self::run_once)'s, without blocking (`UV_RUN_NOWAIT`). Returns
    /// whether the loop is still alive.
    #[track_caller]
    pub fn run_nowait(&self) -> bool {
        self.one_pass(Mode::NoWait)
    }

    #[track_caller]
    fn one_pass(&self, mode: Mode) -> bool {
        let _running = Running::new("Runtime::run_once/run_nowait");
        let _entered = Entered::new(&self.core);
        let _active = Active::new(&self.core);
        let _stop = ConsumeStop(&self.core);
        self.core.drain();
        self.core.iterate(mode);
        self.core.alive()
    }

    /// Runs `f` with this loop current (so it can schedule work), then drains next-ticks and
    /// microtasks: Node's main script.
    #[track_caller]
    pub fn enter<R>(&self, f: impl FnOnce() -> R) -> R {
        let _running = Running::new("Runtime::enter");
        let _entered = Entered::new(&self.core);
        let _active = Active::new(&self.core);
        self.core.meter.phase(Phase::Main);
        let out = f();
        self.core.meter.stale();
        self.core.drain();
        out
    }

    /// A `Send` handle for posting work to this loop from other threads.
    pub fn handle(&self) -> LoopHandle {
        LoopHandle {
            shared: self.core.shared.clone(),
        }
    }

    /// This loop's id (unique in the process; used in stall reports and metrics).
    pub fn id(&self) -> u64 {
        self.core.loop_id()
    }
}

impl Default for Runtime {
    fn default() -> Self {
        Runtime::new()
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        let _entered = Entered::new(&self.core);
        // Still listed during the shutdown: a handle of this loop dropped then, with another
        // loop current (a nested `Runtime`'s drop), reaches it.
        let _unlisted = Unlist(self.core.loop_id());
        self.core.shutdown();
    }
}

/// Takes a loop off its thread's list when dropped (also while unwinding).
struct Unlist(u64);

impl Drop for Unlist {
    fn drop(&mut self) {
        context::remove_loop(self.0);
    }
}

impl Core {
    /// Drops everything the loop still holds, on the loop thread, until nothing is left (dropping
    /// a task's future may cancel timers, spawn or wake other tasks). Each item is dropped under
    /// its own `catch_unwind`, so a panicking drop neither stops the rest nor, with a second one,
    /// aborts the process: the first panic is resumed once all is dropped (unless the thread is
    /// unwinding already).
    ///
    /// A task whose future outlives a round (nothing holds its `Runnable`, and the round's wake
    /// of it did nothing) was marked scheduled by a wake on another thread that has yet to push
    /// its `Runnable` (a pool completion, an abort there): the runnable exists only in that
    /// wake, which needs nothing but the remote queue's lock to finish. So the rounds go on,
    /// yielding the CPU, until it arrives and is dropped here; only then is the remote queue
    /// closed, so no task's `Runnable` is ever pushed to a closed queue, which could only leak
    /// it (dropped off its thread, the future would abort the process).
    fn shutdown(&self) {
        self.shutting_down.set(true);
        let mut panic = None;
        while !self.drop_held(&mut panic) {
            if !self.tasks.borrow().is_empty() {
                #[cfg(test)]
                self::core::tests::waiting_for_a_wake(self.loop_id());
                std::thread::yield_now();
            }
        }
        drop(self.shared.close());
        if let Some(p) = panic
            && !std::thread::panicking()
        {
            resume_unwind(p);
        }
    }

    /// Drops one round of what the loop holds: queued work, timers, hooks, callbacks and stored
    /// wakers, then wakes every task still registered. Returns whether there was nothing left;
    /// keeps the first panic of a drop in `panic`.
    fn drop_held(&self, panic: &mut Option<Box<dyn Any + Send>>) -> bool {
        let micro: Vec<_> = self.micro.borrow_mut().drain(..).collect();
        let check: Vec<_> = self.check.borrow_mut().order.drain(..).collect();
        let immediates: Vec<_> = self.check.borrow_mut().immediates.drain().collect();
        let ticks: Vec<_> = self.ticks.borrow_mut().drain(..).collect();
        let timers = self.timers.borrow_mut().take_all();
        let hooks = self.hooks.borrow_mut().take_all();
        let pending: Vec<_> = self.pending.borrow_mut().drain(..).collect();
        let closing = std::mem::take(&mut *self.closing.borrow_mut());
        let remote = self.shared.take_remote();
        let wakers = self.reactor.take_wakers();
        let empty = micro.is_empty()
            && check.is_empty()
            && immediates.is_empty()
            && ticks.is_empty()
            && timers.is_empty()
            && hooks.is_empty()
            && pending.is_empty()
            && closing.is_empty()
            && remote.is_empty()
            && wakers.is_empty();
        for_each_caught(micro, drop, panic);
        for_each_caught(check, drop, panic);
        for_each_caught(immediates, drop, panic);
        for_each_caught(ticks, drop, panic);
        for_each_caught(timers, drop, panic);
        for_each_caught(hooks, drop, panic);
        for_each_caught(pending, drop, panic);
        for_each_caught(closing, drop, panic);
        for_each_caught(remote, drop, panic);
        for_each_caught(wakers, drop, panic);
        // The tasks left (parked where no waker is stored, or whose `JoinHandle` is held), in key
        // order, now that no queue holds a `Runnable`: the wake hands each one's `Runnable` to
        // `schedule_local`, which drops it, and with it the future, whose guard takes the task
        // out of the registry (a task spawned meanwhile goes the same way at once). A task
        // another thread marked scheduled stays: its wake is in flight (see `shutdown`).
        let tasks: Vec<_> = self
            .tasks
            .borrow()
            .iter()
            .map(|(_, (_, waker))| waker.clone())
            .collect();
        let empty = empty && tasks.is_empty();
        for_each_caught(tasks, Waker::wake, panic);
        empty
    }
}

/// Calls `f` on each of `items` (`drop`, say) under its own `catch_unwind`; keeps the first panic.
fn for_each_caught<T>(
    items: impl IntoIterator<Item = T>,
    f: impl Fn(T),
    panic: &mut Option<Box<dyn Any + Send>>,
) {
    for item in items {
        if let Err(p) = catch_unwind(AssertUnwindSafe(|| f(item))) {
            panic.get_or_insert(p);
        }
    }
}

/// Clears the stop request when a run returns (also while unwinding), as libuv's `uv_run` does.
struct ConsumeStop<'a>(&'a Core);

impl Drop for ConsumeStop<'_> {
    fn drop(&mut self) {
        self.0.stop.set(false);
    }
}

/// Tells the watchdog the loop is running for as long as it lives (also while unwinding).
struct Active<'a>(&'a Core);

impl<'a> Active<'a> {
    fn new(core: &'a Core) -> Active<'a> {
        core.meter.loop_running(true);
        Active(core)
    }
}

impl Drop for Active<'_> {
    fn drop(&mut self) {
        self.0.meter.loop_running(false);
    }
}

/// A `Send + Sync` handle to a loop, for other threads: take it on the loop
/// ([`LoopHandle::current`], [`Runtime::handle`]) and [`post`](LoopHandle::post) to it what must
/// run there.
#[derive(Clone)]
pub struct LoopHandle {
    shared: Arc<Shared>,
}

impl LoopHandle {
    /// Runs `f` on the loop, in its poll phase (a macrotask, followed by a queue drain). Returns
    /// `false` if the loop is gone.
    ///
    /// Posting does not keep the loop alive by itself: a `run` with nothing else alive returns
    /// without waiting for a post that may come. A post already queued is work due, though (like
    /// a pending immediate): it counts as alive until it has run, so the `run` under way (its
    /// poll phase woken) or else the next `run`, `run_once` or `run_nowait` runs it.
    #[track_caller]
    pub fn post(&self, f: impl FnOnce() + Send + 'static) -> bool {
        self.shared
            .push_remote(Remote::Callback(Box::new(f), Location::caller()))
            .is_ok()
    }

    /// The loop's id.
    pub fn loop_id(&self) -> u64 {
        self.shared.loop_id
    }

    /// The current loop's handle: take it on the loop, move it to another thread (a job in
    /// [`offload_cpu`](crate::offload_cpu), a `std::thread`), and [`post`](LoopHandle::post) from
    /// there what must run on the loop (`spawn`, `set_timeout`, ...: they panic on a thread with
    /// no loop). The same as [`handle`].
    ///
    /// ```
    /// let rt = nodus::Runtime::new();
    /// rt.block_on(async {
    ///     let handle = nodus::LoopHandle::current();
    ///     let (tx, rx) = std::sync::mpsc::channel();
    ///     nodus::offload_cpu(move || {
    ///         let sum: u64 = (1..=100).sum();
    ///         // On a pool thread: no `nodus::spawn` here; post it to the loop.
    ///         handle.post(move || {
    ///             nodus::spawn(async move { tx.send(sum).unwrap() }).detach();
    ///         });
    ///     })
    ///     .await
    ///     .unwrap();
    ///     nodus::sleep(5).await;
    ///     assert_eq!(rx.try_recv(), Ok(5050));
    /// });
    /// ```
    ///
    /// # Panics
    /// On a thread with no nodus loop.
    #[track_caller]
    pub fn current() -> LoopHandle {
        with_core("nodus::LoopHandle::current", |core| LoopHandle {
            shared: core.shared.clone(),
        })
    }
}

/// The current loop's handle (also [`LoopHandle::current`]).
#[track_caller]
pub fn handle() -> LoopHandle {
    with_core("nodus::rt::handle", |core| LoopHandle {
        shared: core.shared.clone(),
    })
}

/// Makes `run` return after the current iteration, and keeps that iteration's poll phase (or
/// `run_once`'s) from blocking (libuv's `uv_stop`). The request is consumed when the run under
/// way returns, as in libuv's `uv_run`: every run mode clears it on return. Called while no run
/// is under way (in [`Runtime::enter`]'s closure), it stops the next `run` before its first
/// iteration. [`Runtime::block_on`] does not honour it: it runs, blocking as usual, until its
/// future completes, then discards the request.
#[track_caller]
pub fn stop() {
    with_core("nodus::rt::stop", |core| core.stop.set(true));
}
