//! One loop iteration: pending, idle, prepare, poll, check, close, timers, libuv 1.45+'s order
//! (DESIGN.md section 2: the same cycle, since `run` and `block_on` run a timers pass first).
//!
//! Invariants:
//! - The timers pass fires timers due at `pass_now`, read once when the pass starts, in Node's
//!   order (`time/queue.rs`: list by list, each list's due timers front to back); timers
//!   added during the pass count from a later clock read (the timer functions read it when they
//!   arm), so they have later deadlines and wait for the next pass; an interval re-arms from its
//!   callback's start, also after `pass_now`. Each timer is popped only when it is about to run,
//!   so a timer cleared by an earlier callback never fires.
//! - A callback that panics unwinds out of the phase, and leaves the loop as if it had returned:
//!   an interval is re-armed (`RunningInterval`, a drop guard: Node re-arms in a `finally`), its
//!   ref unchanged; a one-shot timer or an immediate already left its queue with its ref given
//!   back; the remote items not yet run go back on the remote queue (`Unrun`); what is left of
//!   the phase runs at the next `run`. The hooks, pending and close phases do the same
//!   (`rt/hooks.rs`).
//! - The check phase runs exactly the entries queued when it started (immediates and yielded
//!   tasks); entries added during it run on the next turn.
//! - The poll phase never blocks while anything is ready to run: immediates, yielded tasks,
//!   pending or closing callbacks, active idle hooks, a stop request (not under `block_on`,
//!   which ignores it), remote work, events left over from a batch cut short.
//! - The loop's time advances every iteration: the poll phase marks the cached clock stale
//!   whether or not it polled (it skips `epoll_wait` when nothing is registered and it must not
//!   block), so the next timers pass reads the clock.
//! - `Core::polled` (`crate::time::polled_ns`) is the loop's latest clock read before a poll
//!   phase that reported every source ready at its call (not cut short by a signal, its batch
//!   not full), set once that phase has dispatched every event it took: by then each of those
//!   sources' tasks has run. It never runs ahead of what the loop has read: after the process
//!   was stopped, the timers phase sees the clock jump, `polled` only once a poll phase has
//!   dispatched what arrived meanwhile. While every batch is full (1,024 events per
//!   `epoll_wait`, more sources ready), it still advances: to the clock read before the oldest
//!   full batch not yet covered, once a later dispatched batch reports again a source reported
//!   since that one (`after_batch`): epoll puts what a full batch left unreported back at the
//!   head of its ready list and a source ready again at its tail, so by then every source that
//!   batch left has been reported and dispatched.
//! - No event taken from epoll is lost (it is edge-triggered: never reported again). A batch
//!   that `block_on`'s future completed in the middle of is dispatched, from the first event
//!   left, at the start of the next poll phase, before any new event; so is the remote queue's
//!   rest (ahead of work posted since).
//! - Every phase returns early once the `block_on` future has completed.

use std::collections::HashSet;
use std::time::Duration;

use super::core::{Core, Posted, Remote};
use super::hooks::HookKind;
use super::queues::Popped;
use crate::metrics::classes;
use crate::metrics::phase::Phase;
use crate::time::queue::{TimerAction, TimerKey};

/// How one iteration may block in the poll phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// `run`: block until the next timer or event, unless nothing ref'd is alive.
    Default,
    /// `block_on`: block until the next timer or event, whatever is ref'd.
    BlockOn,
    /// `run_once`: like `Default`.
    Once,
    /// `run_nowait`: never block.
    NoWait,
}

impl Core {
    /// One pass of the loop as libuv 1.45+ (Node 20's) makes it: pending, idle, prepare, poll,
    /// check, closing, and timers last, so that a pass that waited in the poll phase for a timer
    /// runs it (`run_once`), and `run` sees every timer due when its last ref'd work ended before
    /// it looks at what is alive. `run` and `block_on` run one timers pass before their first
    /// (`run_timers`, libuv's pass before its loop), so the cycle starts at timers.
    pub(crate) fn iterate(&self, mode: Mode) {
        self.meter.iteration();
        self.run_pending();
        self.run_hooks(HookKind::Idle);
        self.run_hooks(HookKind::Prepare);
        if self.main_done.get() {
            return;
        }
        self.run_poll(mode);
        if self.main_done.get() {
            return;
        }
        self.run_check();
        if self.main_done.get() {
            return;
        }
        self.run_closing();
        if self.main_done.get() {
            return;
        }
        self.run_timers();
    }

    /// The timers phase: every timer due at the pass's `now`.
    pub(crate) fn run_timers(&self) {
        self.meter.phase(Phase::Timers);
        if self.timers.borrow().len() == 0 {
            return;
        }
        let pass_now = self.meter.current_time();
        loop {
            let popped = self.timers.borrow_mut().pop_due(pass_now);
            let Some((key, fired)) = popped else { return };
            if fired.refd && !fired.stays {
                self.unref_handle();
            }
            let target = Core::callback_target("timer", fired.location, classes::TIMER);
            match fired.action {
                TimerAction::Once(callback) => {
                    let t = self.boundary();
                    self.meter.timer_fired(fired.deadline, t);
                    self.meter.begin_poll(&target, t);
                    callback();
                    self.meter.end_poll(&target, t);
                    self.drain();
                }
                TimerAction::Callback(callback) => {
                    let t = self.boundary();
                    // An interval re-arms from its callback's start (Node's `listOnTimeout`), not
                    // the pass's: with measurements on, `t` itself (no second read).
                    let start = self.meter.current_time();
                    self.meter.timer_fired(fired.deadline, t);
                    self.meter.begin_poll(&target, t);
                    let mut running = RunningInterval {
                        core: self,
                        key,
                        callback,
                        start,
                    };
                    (running.callback)();
                    self.meter.end_poll(&target, t);
                    drop(running);
                    self.drain();
                }
                TimerAction::Wake(waker) => {
                    let t = self.boundary();
                    self.meter.timer_fired(fired.deadline, t);
                    if let Some(waker) = waker {
                        // The loop's own wake, at `t`: no clock read of its own.
                        self.meter.wakes_at(t, || waker.wake());
                    }
                    self.drain();
                }
                TimerAction::Running { .. } => {
                    unreachable!("a running interval is never in the heap")
                }
            }
            if self.main_done.get() {
                return;
            }
        }
    }

    /// How long the poll phase may block.
    fn poll_timeout(&self, mode: Mode) -> Option<Duration> {
        if mode == Mode::NoWait
            || (self.stop.get() && mode != Mode::BlockOn)
            || self.main_done.get()
            || !self.check.borrow().order.is_empty()
            || !self.pending.borrow().is_empty()
            || !self.closing.borrow().is_empty()
            || self.hooks.borrow().idle_active()
            || (mode != Mode::BlockOn && !self.alive())
        {
            return Some(Duration::ZERO);
        }
        let deadline = self.timers.borrow_mut().next_deadline()?;
        let now = self.meter.current_time();
        Some(Duration::from_nanos(deadline.saturating_sub(now)))
    }

    fn run_poll(&self, mode: Mode) {
        self.meter.phase(Phase::Poll);
        // The loop's latest clock read, at or before the poll: what was ready then is reported.
        let polled = self.meter.now();
        let mut timeout = self.poll_timeout(mode);
        // Events of a batch that `block_on` returned in the middle of come first, and the poll
        // does not block while there are any.
        let mut events = self.reactor.take_event_buffer();
        let carried = events.len();
        if carried > 0 {
            timeout = Some(Duration::ZERO);
        }
        let blocking = timeout != Some(Duration::ZERO);
        if blocking && self.shared.going_to_sleep() {
            timeout = Some(Duration::ZERO);
        }
        let skip =
            timeout == Some(Duration::ZERO) && self.reactor.is_empty() && !self.shared.has_remote();
        // Nothing registered: nothing ready to miss.
        let mut complete = true;
        if skip {
            self.meter.poll_skipped();
        } else {
            self.meter.before_block(timeout);
            complete = match self.reactor.poll(timeout, &mut events) {
                Ok(complete) => complete,
                Err(e) => {
                    tracing::error!(target: "nodus::rt", "epoll_wait failed: {e}");
                    false
                }
            };
            self.meter.stale();
            self.meter.after_block(timeout, events.len() - carried);
        }
        if blocking {
            self.shared.awake();
        }
        // Tasks woken by these events became runnable when epoll_wait returned: their schedule
        // delay counts from then (`Meter::wakes_at`), so events waiting behind earlier ones show
        // up in it.
        let returned = if events.is_empty() {
            0
        } else {
            self.meter.current_time()
        };
        let mut dispatched = 0;
        for &(token, readiness) in &events {
            dispatched += 1;
            if token == crate::io::reactor::WAKER_TOKEN {
                continue;
            }
            let target = Core::callback_target("io", std::panic::Location::caller(), classes::IO);
            let t = self.boundary();
            self.meter.begin_poll(&target, t);
            self.meter
                .wakes_at(returned, || self.reactor.dispatch(token, readiness));
            self.meter.end_poll(&target, t);
            self.drain();
            if self.main_done.get() {
                break;
            }
        }
        if dispatched == events.len() {
            self.after_batch(polled, complete, &events[carried..]);
        }
        // epoll is edge-triggered: an event taken from it is never reported again, so the ones
        // not dispatched (`block_on` returned) are kept for the next poll phase, not dropped.
        events.drain(..dispatched);
        self.reactor.return_event_buffer(events);
        if self.shared.has_remote() {
            self.run_remote();
        }
    }

    /// Moves `Core::polled` on once a poll phase has dispatched every event it took (`new`, the
    /// ones its `epoll_wait` reported, the poll's clock read `polled`): to `polled` after a
    /// complete poll; under full batches, to the read before the oldest full batch once a token
    /// reported since it is reported again. epoll keeps its ready list in order and puts back
    /// what a full batch left unreported at its head, while a source reported and ready again
    /// is added at its tail: that source's return comes after every source the older batch left.
    fn after_batch(&self, polled: u64, complete: bool, new: &[(usize, u8)]) {
        let mut full = self.full_batch.borrow_mut();
        if complete {
            self.polled.set(polled);
            *full = None;
            return;
        }
        if new.is_empty() {
            return; // a signal, or a failed poll: nothing reported, nothing learnt
        }
        let proved = full
            .as_ref()
            .filter(|(_, seen)| new.iter().any(|(token, _)| seen.contains(token)))
            .map(|&(since, _)| since);
        if let Some(since) = proved {
            self.polled.set(since);
            *full = None;
        }
        let (_, seen) = full.get_or_insert_with(|| (polled, HashSet::new()));
        seen.extend(new.iter().map(|&(token, _)| token));
    }

    /// Work posted by other threads: woken tasks and completion callbacks, each a macrotask.
    /// Each item is runnable from its post: it joins the run queue when taken, counted from its
    /// post, and its schedule delay counts from the post.
    fn run_remote(&self) {
        let items = self.shared.take_remote();
        self.meter.extra_events(items.len());
        self.boundary();
        for &(_, posted) in &items {
            self.meter.arrive_at(posted);
        }
        let mut rest = Unrun {
            core: self,
            items: items.into_iter(),
        };
        for (item, posted) in rest.items.by_ref() {
            match item {
                Remote::Run(item) => {
                    let t = self.boundary();
                    self.run_item(item, posted, t);
                    self.drain();
                }
                Remote::Callback(callback, location) => {
                    let target = Core::callback_target("remote", location, classes::REMOTE);
                    self.run_callback(target, Some(posted), callback);
                }
            }
            if self.main_done.get() {
                break;
            }
        }
    }

    fn run_check(&self) {
        self.meter.phase(Phase::Check);
        let queued = self.check.borrow().order.len();
        for _ in 0..queued {
            let popped = self.check.borrow_mut().pop();
            let Some((entry, at)) = popped else { return };
            match entry {
                None => {} // cleared before it ran
                Some(Popped::Immediate(e)) => {
                    if e.refd {
                        self.unref_handle();
                    }
                    let target = Core::callback_target("immediate", e.location, classes::IMMEDIATE);
                    self.run_callback(target, Some(at), e.callback);
                }
                Some(Popped::Yield(item)) => {
                    let t = self.boundary();
                    self.run_item(item, at, t);
                    self.drain();
                }
            }
            if self.main_done.get() {
                return;
            }
        }
    }
}

/// An interval whose callback is running (its entry `Running`, off the heap): re-armed when its
/// callback returns or unwinds (Node's `listOnTimeout` re-arms in a `finally`), so a panic leaves
/// it armed, its ref unchanged; its callback is dropped instead if it was cleared meanwhile.
struct RunningInterval<'a> {
    core: &'a Core,
    key: TimerKey,
    callback: Box<dyn FnMut()>,
    start: u64,
}

impl Drop for RunningInterval<'_> {
    fn drop(&mut self) {
        // A zero-sized closure takes its place: no allocation.
        let callback = std::mem::replace(&mut self.callback, Box::new(|| {}));
        let cleared = self
            .core
            .timers
            .borrow_mut()
            .finish_interval(self.key, callback, self.start);
        // Dropped after the borrow: its captures may touch the timers.
        drop(cleared);
    }
}

/// The remote items of a poll phase not yet run, when it ends early (`block_on` returned
/// mid-phase) or unwinds (a posted callback panicked): out of the run queue, and back on the
/// remote queue ahead of later posts, for the next turn, so that a panic loses none of them and
/// leaves no count behind.
struct Unrun<'a> {
    core: &'a Core,
    items: std::vec::IntoIter<Posted>,
}

impl Drop for Unrun<'_> {
    fn drop(&mut self) {
        let rest: Vec<Posted> = self.items.by_ref().collect();
        if rest.is_empty() {
            return;
        }
        let t = self.core.boundary();
        for &(_, posted) in &rest {
            self.core.meter.unarrive_posted(posted, t);
        }
        self.core.shared.requeue(rest);
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::rc::Rc;
    use std::time::{Duration, Instant};

    use super::Mode;
    use crate::rt::context::Entered;
    use crate::time::polled_ns;
    use crate::{Runtime, set_immediate, set_timeout};

    /// The loop blocked for 100 ms (as a stopped process is) while a peer wrote to it: the next
    /// timers pass sees the clock jump, but `polled_ns` passes the write only once a poll phase
    /// has dispatched it (the reading task has run).
    #[test]
    fn polled_ns_passes_a_pause_only_once_a_poll_has_read_what_came_during_it() {
        let rt = Runtime::new();
        let read = Rc::new(Cell::new(false));
        let written = Rc::new(Cell::new(0));
        let checked = Rc::new(Cell::new(false));
        let (r, w1, w2, c) = (
            read.clone(),
            written.clone(),
            written.clone(),
            checked.clone(),
        );
        rt.enter(move || {
            let (a, b) = crate::net::UnixStream::pair().unwrap();
            let mut b = b.into_std();
            crate::task::spawn(async move {
                let mut buf = [0u8; 8];
                assert_eq!(a.read(&mut buf).await.unwrap(), 1);
                r.set(true);
            })
            .detach();
            set_immediate(move || {
                w1.set(crate::clock::now_ns());
                std::io::Write::write_all(&mut b, b"x").unwrap();
                std::thread::sleep(Duration::from_millis(100));
            });
            set_timeout(Duration::from_millis(20), move || {
                // Due after the pause: its timers pass comes before the poll that reads.
                assert!(!read.get(), "read before the timers pass");
                assert!(polled_ns() <= w2.get(), "polled_ns passed an unread write");
                set_immediate(move || {
                    assert!(read.get(), "not read in the poll phase after the pause");
                    assert!(polled_ns() > w2.get(), "polled_ns stood still");
                    c.set(true);
                });
            });
        });
        rt.run();
        assert!(checked.get());
    }

    /// More sources ready than one `epoll_wait` reports (1,024) at every poll, written to again
    /// each turn: every batch is full, and `polled_ns` still moves on, behind the loop's clock
    /// by a few batches (before, it stood at the last poll that was not full).
    #[test]
    fn polled_ns_advances_while_every_poll_batch_is_full() {
        use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
        const SOURCES: usize = 1100;
        const TURNS: u32 = 20;
        let limit = getrlimit(Resource::Nofile);
        if limit.current.is_some_and(|n| n < 4096) {
            let wanted = Rlimit {
                current: limit.maximum.map(|max| max.min(4096)),
                maximum: limit.maximum,
            };
            setrlimit(Resource::Nofile, wanted).unwrap();
        }
        let rt = Runtime::new();
        let seen = Rc::new(Cell::new(None));
        let s = seen.clone();
        rt.enter(move || {
            let mut writers = Vec::with_capacity(SOURCES);
            for _ in 0..SOURCES {
                let (a, b) = crate::net::UnixStream::pair().unwrap();
                writers.push(b.into_std());
                crate::task::spawn(async move {
                    let mut buf = [0u8; 64];
                    while a.read(&mut buf).await.is_ok_and(|n| n > 0) {}
                })
                .detach();
            }
            crate::task::spawn(async move {
                let mut since = 0;
                for turn in 0..TURNS {
                    for mut w in &writers {
                        std::io::Write::write_all(&mut w, b"x").unwrap();
                    }
                    if turn == 1 {
                        // Every poll from here on finds more than a batch ready.
                        since = crate::clock::now_ns();
                    }
                    crate::task::yield_now().await;
                }
                s.set(Some((since, polled_ns())));
                drop(writers);
            })
            .detach();
        });
        rt.run();
        let (since, polled) = seen.get().expect("the writer ran");
        assert!(polled > since, "polled_ns stood still under full batches");
    }

    /// Under a chain of immediates the poll phase never polls, and the loop's time advances by
    /// the callbacks' own end reads alone (`Meter::poll_skipped` keeps them): a timer comes due.
    #[test]
    fn a_timer_comes_due_under_a_chain_of_immediates() {
        thread_local! {
            static FIRED_AT: Cell<Option<Instant>> = const { Cell::new(None) };
            static TURNS: Cell<u64> = const { Cell::new(0) };
        }
        fn step() {
            TURNS.with(|t| t.set(t.get() + 1));
            if FIRED_AT.with(Cell::get).is_none() {
                set_immediate(step);
            }
        }
        let rt = Runtime::new();
        let armed = Instant::now();
        rt.enter(|| {
            set_timeout(Duration::from_millis(5), || {
                FIRED_AT.with(|f| f.set(Some(Instant::now())))
            });
            set_immediate(step);
        });
        let bound = Instant::now() + Duration::from_secs(10);
        let _entered = Entered::new(&rt.core);
        while FIRED_AT.with(Cell::get).is_none() {
            assert!(
                Instant::now() < bound,
                "a 5 ms timer did not fire under 10 s of immediates"
            );
            rt.core.iterate(Mode::NoWait);
        }
        let fired = FIRED_AT.with(Cell::get).unwrap();
        assert!(fired - armed >= Duration::from_millis(5), "fired early");
        assert!(
            TURNS.with(Cell::get) > 1,
            "the chain did not run before the timer"
        );
    }

    /// Iterations that never poll (nothing registered, nothing may block) still advance the
    /// loop's time: a timer comes due. Nothing runs in them to read the clock otherwise.
    #[test]
    fn the_clock_advances_in_iterations_that_skip_the_poll() {
        let rt = Runtime::new();
        let fired = Rc::new(Cell::new(false));
        let f = fired.clone();
        rt.enter(|| set_timeout(Duration::from_millis(5), move || f.set(true)));
        let _entered = Entered::new(&rt.core);
        let bound = Instant::now() + Duration::from_secs(10);
        while !fired.get() {
            assert!(
                Instant::now() < bound,
                "a 5 ms timer did not fire in 10 s: the loop's clock stood still"
            );
            rt.core.iterate(Mode::NoWait);
        }
    }
}
