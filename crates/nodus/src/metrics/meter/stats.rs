//! The plain counters one loop's `Meter` updates (compiled only with the `measure` feature):
//! `LoopStats` for the loop, `ClassStats` per task class, `IntervalStats` per interval (the
//! window the interval utilization and run-queue mean and maximum are computed over).
//!
//! Intervals: the loop's time is cut into consecutive intervals, each at least the configured
//! length (`Builder::metrics_interval`, 1 s by default). One that has come due (reached that
//! length) closes at the first of: the start of a loop iteration, a snapshot, or the end of a
//! wait in the poll phase. A wait is split at the moment the interval came due (the part before
//! it is the interval's, the rest starts the next one), and the part of a wait that is itself
//! at least the length is an interval of its own, all idle: so an interval holds at most one
//! length of work before the wait that closes it, and after a long quiet period the last
//! interval says idle. Before the first one closes, a snapshot reports the time since the loop
//! started (`closed == 0`).
//!
//! Invariants: loop-thread only (inside the meter's `RefCell`); nothing here reads the clock or
//! logs, callers pass the time; `classes` has one entry per class the class table has handed out;
//! every closed interval is at least the configured length.

use crate::metrics::classes::Classes;
use crate::metrics::histogram::Histogram;
use crate::metrics::phase::Phase;

/// Per-class counters.
#[derive(Default, Clone)]
pub(crate) struct ClassStats {
    pub(crate) spawned: u64,
    pub(crate) polls: u64,
    pub(crate) forced_yields: u64,
    pub(crate) panics: u64,
    pub(crate) poll_duration: Histogram,
}

/// Everything measured about one loop (loop thread only).
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
    pub(crate) task_panics: u64,
    // Run queue.
    pub(crate) rq_samples: Histogram,
    pub(crate) rq_integral: u128,
    pub(crate) rq_max: u64,
    pub(crate) arrivals: u64,
    // The interval being accumulated, the last closed one, and how many have closed.
    pub(crate) interval: IntervalStats,
    pub(crate) last_interval: IntervalStats,
    pub(crate) closed: u64,
}

/// Busy/idle and run-queue figures of one interval (see the module comment for its length).
#[derive(Default, Clone, Copy)]
pub(crate) struct IntervalStats {
    pub(crate) start_ns: u64,
    pub(crate) end_ns: u64,
    pub(crate) idle_ns: u64,
    pub(crate) rq_integral: u128,
    pub(crate) rq_max: u64,
}

impl LoopStats {
    pub(super) fn new(now: u64) -> LoopStats {
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
            task_panics: 0,
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
            closed: 0,
        }
    }

    /// Closes the interval at `now` and starts the next.
    fn roll_interval(&mut self, now: u64) {
        self.last_interval = IntervalStats {
            end_ns: now,
            ..self.interval
        };
        self.interval = IntervalStats {
            start_ns: now,
            ..Default::default()
        };
        self.closed += 1;
    }

    /// Closes the interval at `now` if it is at least `len` long by then.
    pub(super) fn roll_interval_if_due(&mut self, now: u64, len: u64) {
        if now.saturating_sub(self.interval.start_ns) >= len {
            self.roll_interval(now);
        }
    }

    /// The loop was blocked in the poll phase from `from` to `to`: idle time. An interval that
    /// came due before or during the wait is closed at that moment (with the part of the wait
    /// before it), and the rest of the wait, if at least `len`, is an interval of its own.
    pub(super) fn add_idle(&mut self, from: u64, to: u64, len: u64) {
        let from = from.min(to);
        self.idle_ns += to - from;
        let due = self.interval.start_ns.saturating_add(len);
        if to >= due {
            let end = due.max(from);
            self.interval.idle_ns += end - from;
            self.roll_interval(end);
            self.interval.idle_ns += to - end;
            self.roll_interval_if_due(to, len);
        } else {
            self.interval.idle_ns += to - from;
        }
    }

    /// The interval a snapshot at `now` reports: the last closed one, or before any has closed
    /// the one under way (the time since the loop started).
    pub(crate) fn reported_interval(&self, now: u64) -> IntervalStats {
        if self.closed > 0 {
            self.last_interval
        } else {
            IntervalStats {
                end_ns: now.max(self.interval.start_ns),
                ..self.interval
            }
        }
    }
}
