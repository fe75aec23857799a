//! The plain counters one loop's `Meter` updates (compiled only with the `measure` feature):
//! `LoopStats` for the loop, `ClassStats` per task class, `IntervalStats` per fixed-length
//! interval (the window utilization and the interval run-queue maximum are computed over).
//!
//! Invariants: loop-thread only (inside the meter's `RefCell`); nothing here reads the clock or
//! logs, callers pass the time; `classes` has one entry per class the class table has handed out.

use crate::metrics::classes::Classes;
use crate::metrics::histogram::Histogram;
use crate::metrics::phase::Phase;

/// Per-class counters.
#[derive(Default, Clone)]
pub(crate) struct ClassStats {
    pub(crate) spawned: u64,
    pub(crate) polls: u64,
    pub(crate) forced_yields: u64,
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

    pub(super) fn roll_interval(&mut self, now: u64) {
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
