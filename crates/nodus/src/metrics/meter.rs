//! `Meter`: the loop's always-on measurements, updated at poll boundaries.
//!
//! The loop calls the same methods whether or not the `measure` feature is on; without it they
//! compile to nothing except the clock the timers need. With it:
//!
//! - **One clock read per poll boundary.** A poll's end time is the next poll's start time when
//!   nothing ran in between (`fresh`). Only a syscall in the poll phase, user code outside a poll
//!   (`Runtime::enter`'s closure) or the loop starting make the cached time stale: the rest of the
//!   loop's own bookkeeping between two polls takes nanoseconds, so it is not worth a read.
//! - **Schedule delay** is measured from the boundary at which an entry became runnable (the end
//!   of the callback that woke it, or the wake time for wakes from other threads) to the boundary
//!   at which it starts to run.
//! - **Run-queue length** is integrated over time at boundaries with the count of entries that
//!   were runnable since the previous boundary. Entries queued between two boundaries are counted
//!   from the second one, the same moment their schedule delay starts, so Little's law
//!   (mean length = arrival rate × mean delay) holds by construction for local wakes.
//! - **Idle** is time blocked in the poll phase with a non-zero timeout; busy is the rest.
//!
//! All state is loop-thread-only (`Cell`/`RefCell`); the watchdog reads only the `LoopSlot`.

// With the `measure` feature off (the overhead benchmark only) this is compiled but not used.
#![cfg_attr(not(feature = "measure"), allow(dead_code))]

use std::cell::{Cell, RefCell};
use std::panic::Location;
use std::sync::Arc;
use std::time::Duration;

use super::classes::{ClassId, Classes};
use super::phase::Phase;
use crate::clock;

#[cfg(feature = "measure")]
use super::histogram::Histogram;
#[cfg(feature = "measure")]
use crate::watchdog::LoopSlot;

/// Tunables of one loop's measurements.
#[derive(Debug, Clone)]
pub(crate) struct MeterConfig {
    pub(crate) slow_poll: Duration,
    pub(crate) stall: Duration,
    pub(crate) watchdog: bool,
    pub(crate) interval: Duration,
}

/// Who is being polled, for the watchdog slot and per-class statistics.
#[derive(Clone, Copy)]
pub(crate) struct PollTarget {
    pub(crate) task_id: u64,
    pub(crate) name: &'static str,
    pub(crate) location: &'static Location<'static>,
    pub(crate) class: ClassId,
}

/// Per-class counters.
#[cfg(feature = "measure")]
#[derive(Default, Clone)]
pub(crate) struct ClassStats {
    pub(crate) spawned: u64,
    pub(crate) polls: u64,
    pub(crate) forced_yields: u64,
    pub(crate) poll_duration: Histogram,
}

/// Everything measured about one loop (loop thread only).
#[cfg(feature = "measure")]
pub(crate) struct LoopStats {
    pub(crate) started_ns: u64,
    pub(crate) iterations: u64,
    pub(crate) idle_ns: u64,
    pub(crate) events_total: u64,
    pub(crate) events_per_poll: Histogram,
    pub(crate) schedule_delay: Histogram,
    pub(crate) timer_lateness: Histogram,
    pub(crate) poll_duration: Histogram,
    pub(crate) slow_polls: u64,
    pub(crate) tick_drain_ns: u64,
    pub(crate) ticks: u64,
    pub(crate) microtasks: u64,
    pub(crate) phase_ns: [u64; Phase::COUNT],
    pub(crate) phase_callbacks: [u64; Phase::COUNT],
    pub(crate) classes: Vec<ClassStats>,
    pub(crate) tasks_spawned: u64,
    pub(crate) tasks_alive: u64,
    pub(crate) polls: u64,
    pub(crate) forced_yields: u64,
    // Run queue.
    pub(crate) rq_samples: Histogram,
    pub(crate) rq_integral: u128,
    pub(crate) rq_max: u64,
    pub(crate) arrivals: u64,
    // The interval being accumulated, and the last completed one.
    pub(crate) interval: IntervalStats,
    pub(crate) last_interval: IntervalStats,
}

/// Busy/idle and run-queue figures of one fixed-length interval.
#[cfg(feature = "measure")]
#[derive(Default, Clone, Copy)]
pub(crate) struct IntervalStats {
    pub(crate) start_ns: u64,
    pub(crate) end_ns: u64,
    pub(crate) idle_ns: u64,
    pub(crate) rq_integral: u128,
    pub(crate) rq_max: u64,
}

/// The measurements of one loop.
pub(crate) struct Meter {
    /// The latest clock read (ns since the process epoch).
    now: Cell<u64>,
    /// Whether `now` is still the current time for boundary purposes.
    #[cfg(feature = "measure")]
    fresh: Cell<bool>,
    #[cfg(feature = "measure")]
    last_boundary: Cell<u64>,
    /// Entries runnable since the previous boundary (tasks, main, immediates).
    #[cfg(feature = "measure")]
    runnable_at_boundary: Cell<u64>,
    /// Entries currently runnable.
    runnable: Cell<u64>,
    #[cfg(feature = "measure")]
    phase: Cell<Phase>,
    #[cfg(feature = "measure")]
    block_start: Cell<u64>,
    #[cfg(feature = "measure")]
    tick_batch: Cell<Option<u64>>,
    pub(crate) classes: RefCell<Classes>,
    #[cfg(feature = "measure")]
    pub(crate) stats: RefCell<LoopStats>,
    #[cfg(feature = "measure")]
    pub(crate) slot: Arc<LoopSlot>,
    pub(crate) config: MeterConfig,
    #[cfg(not(feature = "measure"))]
    _slot: std::marker::PhantomData<Arc<()>>,
}

impl Meter {
    pub(crate) fn new(loop_id: u64, config: MeterConfig) -> Meter {
        let now = clock::now_ns();
        #[cfg(feature = "measure")]
        let slot = {
            let slot = LoopSlot::new(loop_id, config.stall);
            if config.watchdog {
                crate::watchdog::register(&slot);
            }
            // Not running until `run`/`block_on` says so (`loop_running`).
            slot.enter_idle();
            slot
        };
        #[cfg(not(feature = "measure"))]
        let _ = loop_id;
        Meter {
            now: Cell::new(now),
            #[cfg(feature = "measure")]
            fresh: Cell::new(false),
            #[cfg(feature = "measure")]
            last_boundary: Cell::new(now),
            #[cfg(feature = "measure")]
            runnable_at_boundary: Cell::new(0),
            runnable: Cell::new(0),
            #[cfg(feature = "measure")]
            phase: Cell::new(Phase::Main),
            #[cfg(feature = "measure")]
            block_start: Cell::new(0),
            #[cfg(feature = "measure")]
            tick_batch: Cell::new(None),
            classes: RefCell::new(Classes::new()),
            #[cfg(feature = "measure")]
            stats: RefCell::new(LoopStats::new(now)),
            #[cfg(feature = "measure")]
            slot,
            config,
            #[cfg(not(feature = "measure"))]
            _slot: std::marker::PhantomData,
        }
    }

    /// The latest clock read: the base new timers count from.
    #[inline]
    pub(crate) fn now(&self) -> u64 {
        self.now.get()
    }

    /// Reads the clock.
    #[inline]
    pub(crate) fn refresh(&self) -> u64 {
        let t = clock::now_ns();
        self.now.set(t);
        #[cfg(feature = "measure")]
        self.fresh.set(true);
        t
    }

    /// The current time: the cached read if nothing ran since (measurements on), else a new read.
    #[inline]
    pub(crate) fn current_time(&self) -> u64 {
        #[cfg(feature = "measure")]
        {
            self.boundary_time()
        }
        #[cfg(not(feature = "measure"))]
        {
            self.refresh()
        }
    }

    /// The current time at a boundary: the cached read if nothing ran since, else a new read.
    #[inline]
    fn boundary_time(&self) -> u64 {
        #[cfg(feature = "measure")]
        {
            if self.fresh.get() {
                self.now.get()
            } else {
                self.refresh()
            }
        }
        #[cfg(not(feature = "measure"))]
        {
            0
        }
    }

    /// The loop starts or stops running (`run`, `block_on`, `enter`): a loop that is not running is
    /// idle to the watchdog, which can then sleep.
    #[inline]
    pub(crate) fn loop_running(&self, running: bool) {
        #[cfg(feature = "measure")]
        if running {
            self.fresh.set(false);
            self.slot.leave_idle();
        } else {
            self.slot.enter_idle();
        }
        #[cfg(not(feature = "measure"))]
        let _ = running;
    }

    /// Enters a phase: callbacks run from now on are attributed to it.
    #[inline]
    pub(crate) fn phase(&self, phase: Phase) {
        #[cfg(feature = "measure")]
        self.phase.set(phase);
        #[cfg(not(feature = "measure"))]
        let _ = phase;
    }

    /// Time passed outside any measured poll (a syscall, user code): the next boundary reads the
    /// clock.
    #[inline]
    pub(crate) fn stale(&self) {
        #[cfg(feature = "measure")]
        self.fresh.set(false);
    }

    /// A new iteration starts.
    #[inline]
    pub(crate) fn iteration(&self) {
        #[cfg(feature = "measure")]
        {
            let mut s = self.stats.borrow_mut();
            s.iterations += 1;
            let now = self.now.get();
            if now.saturating_sub(s.interval.start_ns) >= self.config.interval.as_nanos() as u64 {
                s.roll_interval(now);
            }
        }
    }

    /// An entry (task, main future, immediate) became runnable.
    #[inline]
    pub(crate) fn arrive(&self) {
        self.runnable.set(self.runnable.get() + 1);
        #[cfg(feature = "measure")]
        {
            let n = self.runnable.get();
            let mut s = self.stats.borrow_mut();
            s.arrivals += 1;
            s.rq_max = s.rq_max.max(n);
            s.interval.rq_max = s.interval.rq_max.max(n);
        }
    }

    /// A runnable entry left the queue without running (cancelled or dropped).
    #[inline]
    pub(crate) fn cancel(&self) {
        self.runnable.set(self.runnable.get() - 1);
    }

    /// Entries currently runnable.
    #[inline]
    pub(crate) fn runnable(&self) -> u64 {
        self.runnable.get()
    }

    /// Samples the run-queue length at the start of a drain.
    #[inline]
    pub(crate) fn sample_run_queue(&self) {
        #[cfg(feature = "measure")]
        {
            self.stats
                .borrow_mut()
                .rq_samples
                .record(self.runnable.get());
        }
    }

    /// A boundary: returns its time (the stamp for entries queued since the previous one) and
    /// integrates the run-queue length up to it.
    #[inline]
    pub(crate) fn boundary(&self) -> u64 {
        let t = self.boundary_time();
        #[cfg(feature = "measure")]
        {
            let last = self.last_boundary.replace(t);
            let n = self.runnable_at_boundary.replace(self.runnable.get());
            if n > 0 && t > last {
                let mut s = self.stats.borrow_mut();
                let area = n as u128 * (t - last) as u128;
                s.rq_integral += area;
                s.interval.rq_integral += area;
            }
        }
        t
    }

    /// A runnable entry queued at `queued_at` starts to run at boundary `t`.
    #[inline]
    pub(crate) fn depart(&self, queued_at: u64, t: u64) {
        self.runnable.set(self.runnable.get() - 1);
        #[cfg(feature = "measure")]
        {
            self.runnable_at_boundary.set(self.runnable.get());
            self.stats
                .borrow_mut()
                .schedule_delay
                .record(t.saturating_sub(queued_at));
        }
        #[cfg(not(feature = "measure"))]
        let _ = (queued_at, t);
    }

    /// A poll or callback starts at `start` (a boundary time).
    #[inline]
    pub(crate) fn begin_poll(&self, target: &PollTarget, start: u64) {
        #[cfg(feature = "measure")]
        self.slot
            .begin(target.task_id, target.name, target.location, start);
        #[cfg(not(feature = "measure"))]
        let _ = (target, start);
    }

    /// The poll that began at `start` returned.
    #[inline]
    pub(crate) fn end_poll(&self, target: &PollTarget, start: u64) {
        #[cfg(feature = "measure")]
        {
            self.slot.end();
            let end = self.refresh();
            let d = end.saturating_sub(start);
            let phase = self.phase.get() as usize;
            let slow = {
                let mut s = self.stats.borrow_mut();
                s.polls += 1;
                s.poll_duration.record(d);
                s.phase_ns[phase] += d;
                s.phase_callbacks[phase] += 1;
                let c = &mut s.classes[target.class as usize];
                c.polls += 1;
                c.poll_duration.record(d);
                let slow = d >= self.config.slow_poll.as_nanos() as u64;
                if slow {
                    s.slow_polls += 1;
                }
                slow
            };
            if slow {
                self.log_slow_poll(target, d);
            }
        }
        #[cfg(not(feature = "measure"))]
        let _ = (target, start);
    }

    #[cfg(feature = "measure")]
    #[cold]
    fn log_slow_poll(&self, target: &PollTarget, d: u64) {
        tracing::warn!(
            target: "nodus::slow_poll",
            task = target.name,
            location = %target.location,
            duration_ms = d as f64 / 1e6,
            run_queue = self.runnable.get(),
            "slow poll: task {:?} ({}) ran for {:.1} ms with {} runnable waiting",
            target.name,
            target.location,
            d as f64 / 1e6,
            self.runnable.get()
        );
    }

    /// A timer with `deadline` fires at boundary `t`.
    #[inline]
    pub(crate) fn timer_fired(&self, deadline: u64, t: u64) {
        #[cfg(feature = "measure")]
        self.stats
            .borrow_mut()
            .timer_lateness
            .record(t.saturating_sub(deadline));
        #[cfg(not(feature = "measure"))]
        let _ = (deadline, t);
    }

    /// A batch of next-tick and microtask closures starts (timed per batch, not one by one);
    /// returns its start time.
    #[inline]
    pub(crate) fn closures_start(&self) -> u64 {
        #[cfg(feature = "measure")]
        {
            let t = self.boundary_time();
            self.tick_batch.set(Some(t));
            t
        }
        #[cfg(not(feature = "measure"))]
        0
    }

    /// The closure batch ended; `ticks` and `microtasks` closures ran in it.
    #[inline]
    pub(crate) fn closures_end(&self, ticks: u64, microtasks: u64) {
        #[cfg(feature = "measure")]
        if let Some(start) = self.tick_batch.take() {
            self.slot.end();
            let end = self.refresh();
            let mut s = self.stats.borrow_mut();
            s.tick_drain_ns += end.saturating_sub(start);
            s.ticks += ticks;
            s.microtasks += microtasks;
        }
        #[cfg(not(feature = "measure"))]
        let _ = (ticks, microtasks);
    }

    /// The poll phase is about to block for `timeout` (None = forever).
    #[inline]
    pub(crate) fn before_block(&self, timeout: Option<Duration>) {
        #[cfg(feature = "measure")]
        if timeout != Some(Duration::ZERO) {
            self.block_start.set(self.boundary_time());
            self.slot.enter_idle();
        }
        #[cfg(not(feature = "measure"))]
        let _ = timeout;
    }

    /// The poll phase returned from waiting with `events` events.
    #[inline]
    pub(crate) fn after_block(&self, timeout: Option<Duration>, events: usize) {
        if timeout != Some(Duration::ZERO) {
            let t = self.refresh();
            #[cfg(feature = "measure")]
            {
                self.slot.leave_idle();
                let idle = t.saturating_sub(self.block_start.get());
                let mut s = self.stats.borrow_mut();
                s.idle_ns += idle;
                s.interval.idle_ns += idle;
            }
            #[cfg(not(feature = "measure"))]
            let _ = t;
        }
        #[cfg(feature = "measure")]
        {
            let mut s = self.stats.borrow_mut();
            s.events_total += events as u64;
            s.events_per_poll.record(events as u64);
        }
        #[cfg(not(feature = "measure"))]
        let _ = events;
    }

    /// One more event or completion dispatched in this poll phase (beyond the epoll batch).
    #[inline]
    pub(crate) fn extra_events(&self, n: usize) {
        #[cfg(feature = "measure")]
        {
            self.stats.borrow_mut().events_total += n as u64;
        }
        #[cfg(not(feature = "measure"))]
        let _ = n;
    }

    /// The class of a task name.
    pub(crate) fn class_of(&self, name: &'static str) -> ClassId {
        let id = self.classes.borrow_mut().id_of(name);
        #[cfg(feature = "measure")]
        {
            let mut s = self.stats.borrow_mut();
            if s.classes.len() <= id as usize {
                s.classes.resize(id as usize + 1, ClassStats::default());
            }
        }
        id
    }

    /// A task of `class` was spawned.
    #[inline]
    pub(crate) fn spawned(&self, class: ClassId) {
        #[cfg(feature = "measure")]
        {
            let mut s = self.stats.borrow_mut();
            s.tasks_spawned += 1;
            s.tasks_alive += 1;
            s.classes[class as usize].spawned += 1;
        }
        #[cfg(not(feature = "measure"))]
        let _ = class;
    }

    /// A task's future was dropped (completed or cancelled).
    #[inline]
    pub(crate) fn task_dropped(&self) {
        #[cfg(feature = "measure")]
        {
            let mut s = self.stats.borrow_mut();
            s.tasks_alive = s.tasks_alive.saturating_sub(1);
        }
    }

    /// A task of `class` ran out of cooperative budget and was made to yield.
    #[inline]
    pub(crate) fn forced_yield(&self, class: ClassId) {
        #[cfg(feature = "measure")]
        {
            let mut s = self.stats.borrow_mut();
            s.forced_yields += 1;
            s.classes[class as usize].forced_yields += 1;
        }
        #[cfg(not(feature = "measure"))]
        let _ = class;
    }
}

#[cfg(feature = "measure")]
impl LoopStats {
    fn new(now: u64) -> LoopStats {
        let classes = vec![ClassStats::default(); Classes::new().len()];
        LoopStats {
            started_ns: now,
            iterations: 0,
            idle_ns: 0,
            events_total: 0,
            events_per_poll: Histogram::new(),
            schedule_delay: Histogram::new(),
            timer_lateness: Histogram::new(),
            poll_duration: Histogram::new(),
            slow_polls: 0,
            tick_drain_ns: 0,
            ticks: 0,
            microtasks: 0,
            phase_ns: [0; Phase::COUNT],
            phase_callbacks: [0; Phase::COUNT],
            classes,
            tasks_spawned: 0,
            tasks_alive: 0,
            polls: 0,
            forced_yields: 0,
            rq_samples: Histogram::new(),
            rq_integral: 0,
            rq_max: 0,
            arrivals: 0,
            interval: IntervalStats {
                start_ns: now,
                ..Default::default()
            },
            last_interval: IntervalStats {
                start_ns: now,
                end_ns: now,
                ..Default::default()
            },
        }
    }

    fn roll_interval(&mut self, now: u64) {
        self.last_interval = IntervalStats {
            end_ns: now,
            ..self.interval
        };
        self.interval = IntervalStats {
            start_ns: now,
            ..Default::default()
        };
    }
}
