//! Always-on measurements of how the loop and its tasks cooperate (DESIGN.md section 3).
//!
//! `meter` updates them at poll boundaries; `snapshot()` copies them into plain data
//! (`Snapshot`), which `prometheus::render` turns into Prometheus/OpenMetrics text.

pub(crate) mod classes;
pub mod histogram;
pub(crate) mod meter;
pub(crate) mod phase;
pub mod prometheus;
mod snapshot;

pub use histogram::{Histogram, HistogramSnapshot};
pub(crate) use snapshot::wire;
pub use snapshot::{
    HttpSnapshot, LoopSnapshot, PhaseSnapshot, PoolSnapshot, RunQueueSnapshot, Snapshot,
    StallCounts, StallReport, TaskClassSnapshot, TasksSnapshot,
};

use crate::rt::context::with_core;
use crate::rt::core::Core;

/// The current loop's measurements.
///
/// # Panics
/// On a thread with no nodus loop.
#[track_caller]
pub fn snapshot() -> Snapshot {
    with_core("nodus::metrics::snapshot", Core::snapshot)
}

impl Core {
    pub(crate) fn snapshot(&self) -> Snapshot {
        let now = crate::clock::now_ns();
        let taken_at_unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let mut snap = Snapshot {
            pid: std::process::id(),
            loop_id: self.loop_id(),
            taken_at_unix_ms,
            ..Default::default()
        };
        snap.rss_bytes = resident_bytes();
        // Remote work posted and not yet taken by the poll phase is runnable too.
        snap.run_queue.current = self.meter.runnable() + self.shared.posted_len() as u64;
        self.meter.fill_snapshot(&mut snap, now);
        snap.pools = crate::pool::snapshots();
        snap
    }
}

/// Resident memory of this process, from `/proc/self/statm` (0 if it cannot be read).
fn resident_bytes() -> u64 {
    let pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0);
    pages * rustix::param::page_size() as u64
}

#[cfg(feature = "measure")]
mod fill {
    use super::*;
    use crate::metrics::meter::Meter;
    use crate::metrics::phase::Phase;

    const NS: f64 = 1e9;

    impl Meter {
        pub(crate) fn fill_snapshot(&self, snap: &mut Snapshot, now: u64) {
            self.settle(now);
            let s = self.stats.borrow();
            let classes = self.classes.borrow();
            let elapsed = now.saturating_sub(s.started_ns).max(1);
            let idle = s.idle_ns.min(elapsed);
            snap.uptime_seconds = elapsed as f64 / NS;
            let li = &s.reported_interval(now);
            let interval_len = li.end_ns.saturating_sub(li.start_ns);
            snap.loop_stats = LoopSnapshot {
                iterations: s.iterations,
                idle_seconds: idle as f64 / NS,
                busy_seconds: (elapsed - idle) as f64 / NS,
                utilization: (elapsed - idle) as f64 / elapsed as f64,
                interval_utilization: if interval_len > 0 {
                    interval_len.saturating_sub(li.idle_ns) as f64 / interval_len as f64
                } else {
                    0.0
                },
                interval_seconds: interval_len as f64 / NS,
                events_total: s.events_total,
                events_per_poll: s.events_per_poll.snapshot(),
                schedule_delay: s.schedule_delay.snapshot(),
                timer_lateness: s.timer_lateness.snapshot(),
                poll_duration: s.poll_duration.snapshot(),
                slow_polls_total: s.slow_polls,
                slow_poll_threshold_seconds: self.config.slow_poll.as_secs_f64(),
                tick_drain_seconds: s.tick_drain_ns as f64 / NS,
                ticks_total: s.ticks,
                microtasks_total: s.microtasks,
            };
            snap.run_queue.mean = s.rq_integral as f64 / elapsed as f64;
            snap.run_queue.wait_seconds = s.rq_integral as f64 / NS;
            snap.run_queue.max = s.rq_max;
            snap.run_queue.interval_max = li.rq_max;
            snap.run_queue.interval_mean = if interval_len > 0 {
                li.rq_integral as f64 / interval_len as f64
            } else {
                0.0
            };
            snap.run_queue.samples = s.rq_samples.snapshot();
            snap.run_queue.arrivals_total = s.arrivals;
            snap.tasks = TasksSnapshot {
                spawned_total: s.tasks_spawned,
                alive: s.tasks_alive,
                polls_total: s.polls,
                forced_yields_total: s.forced_yields,
                panics_total: s.task_panics,
            };
            snap.phases = Phase::ALL
                .iter()
                .map(|p| PhaseSnapshot {
                    phase: p.name().to_string(),
                    seconds: s.phase_ns[*p as usize] as f64 / NS,
                    callbacks: s.phase_callbacks[*p as usize],
                })
                .collect();
            snap.task_classes = s
                .classes
                .iter()
                .enumerate()
                .filter(|(_, c)| c.polls > 0 || c.spawned > 0)
                .map(|(i, c)| TaskClassSnapshot {
                    name: classes.name(i as u16).to_string(),
                    spawned: c.spawned,
                    polls: c.polls,
                    forced_yields: c.forced_yields,
                    panics: c.panics,
                    poll_duration: c.poll_duration.snapshot(),
                })
                .collect();
            (snap.stalls, snap.stalls_total) =
                crate::watchdog::stalls_seen_by_loop(&self.slot, now);
        }
    }
}

#[cfg(not(feature = "measure"))]
impl crate::metrics::meter::Meter {
    pub(crate) fn fill_snapshot(&self, _snap: &mut Snapshot, _now: u64) {}
}
