//! The serde-serializable picture of one loop's measurements (`nodus::metrics::snapshot()`).
//!
//! Everything here is plain data: built on the loop thread from `LoopStats` (`meter/stats.rs`),
//! then serialized to JSON (`/_nodus/stats`) or rendered as Prometheus text (`prometheus.rs`).
//! Durations are nanoseconds in histograms (`HistogramSnapshot` values) and seconds in scalar
//! fields whose names end in `_seconds`.
//!
//! A loop's tables are bounded, so is what it puts here: [`Snapshot::out_of_bounds`] says why
//! a snapshot is not one a loop could have taken (a cluster primary refuses such a snapshot from
//! a worker rather than render it: duplicate names would make duplicate series, and unbounded
//! lists a huge exposition).

use serde::{Deserialize, Serialize};

pub use super::histogram::HistogramSnapshot;
pub use crate::watchdog::StallReport;

/// Everything one loop knows about itself, at one moment.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Snapshot {
    /// Process id of the process that took the snapshot.
    pub pid: u32,
    /// Loop id, unique within the process.
    pub loop_id: u64,
    /// Seconds since the loop was created.
    pub uptime_seconds: f64,
    /// Wall-clock time the snapshot was taken, milliseconds since the Unix epoch.
    pub taken_at_unix_ms: u64,
    /// Resident memory of the whole process (`/proc/self/statm`), 0 if unknown.
    #[serde(default)]
    pub rss_bytes: u64,
    pub loop_stats: LoopSnapshot,
    pub run_queue: RunQueueSnapshot,
    pub tasks: TasksSnapshot,
    /// Per phase, in loop order.
    pub phases: Vec<PhaseSnapshot>,
    /// Per task name (bounded: about 64 names, then `other`).
    pub task_classes: Vec<TaskClassSnapshot>,
    /// The most recent stalls the watchdog reported for this loop, oldest first.
    pub stalls: Vec<StallReport>,
    /// HTTP servers running on this loop (filled by `nodus-http`; zeros when there are none).
    pub http: HttpSnapshot,
    /// The process-wide worker pools that exist (`io`, `cpu`), at snapshot time.
    #[serde(default)]
    pub pools: Vec<PoolSnapshot>,
}

/// The longest name (task class, phase, pool) [`Snapshot::out_of_bounds`] accepts, in bytes:
/// each is a label value repeated on every line of its series.
pub(crate) const MAX_NAME: usize = 256;

/// Pools a snapshot may list (a process has `io` and `cpu`).
pub(crate) const MAX_POOLS: usize = 16;

impl Snapshot {
    /// Why this is not a snapshot a nodus loop could have taken, if it is not: more task
    /// classes, phases, pools or stalls than a loop has, two of one name in a list, a name
    /// longer than [`MAX_NAME`] bytes, or a histogram with more buckets than a histogram has.
    pub(crate) fn out_of_bounds(&self) -> Option<String> {
        let classes = self.task_classes.iter().map(|c| c.name.as_str());
        let phases = self.phases.iter().map(|p| p.phase.as_str());
        let pools = self.pools.iter().map(|p| p.pool.as_str());
        names(
            "task classes",
            classes,
            crate::metrics::classes::MAX_CLASSES,
        )
        .or_else(|| names("phases", phases, crate::metrics::phase::Phase::COUNT))
        .or_else(|| names("pools", pools, MAX_POOLS))
        .or_else(|| {
            let max = crate::watchdog::RING_CAPACITY;
            (self.stalls.len() > max)
                .then(|| format!("{} stalls (a loop keeps {max})", self.stalls.len()))
        })
        .or_else(|| {
            let ls = &self.loop_stats;
            let mut histograms = vec![
                &ls.events_per_poll,
                &ls.schedule_delay,
                &ls.timer_lateness,
                &ls.poll_duration,
                &self.run_queue.samples,
                &self.http.request_duration,
            ];
            histograms.extend(self.task_classes.iter().map(|c| &c.poll_duration));
            for p in &self.pools {
                histograms.extend([&p.queue_wait, &p.run]);
            }
            let max = super::histogram::BUCKETS;
            histograms
                .iter()
                .map(|h| h.buckets.len())
                .find(|&n| n > max)
                .map(|n| format!("a histogram of {n} buckets (a histogram has {max})"))
        })
    }
}

/// Why the names of a list (`what`) are out of bounds, if they are: more than `max`, one longer
/// than [`MAX_NAME`], or one twice.
fn names<'a>(
    what: &str,
    names: impl ExactSizeIterator<Item = &'a str>,
    max: usize,
) -> Option<String> {
    if names.len() > max {
        return Some(format!("{} {what} (a loop has at most {max})", names.len()));
    }
    let mut seen = std::collections::HashSet::new();
    for name in names {
        if name.len() > MAX_NAME {
            return Some(format!(
                "{what}: a name of {} bytes (at most {MAX_NAME})",
                name.len()
            ));
        }
        if !seen.insert(name) {
            return Some(format!("{what}: {name:?} twice"));
        }
    }
    None
}

/// HTTP server figures of one loop.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct HttpSnapshot {
    /// Responses by status class: `[1xx, 2xx, 3xx, 4xx, 5xx]`.
    pub responses_by_class: [u64; 5],
    /// From request head parsed to response head written, in ns.
    pub request_duration: HistogramSnapshot,
    pub requests_in_flight: u64,
    pub connections_open: u64,
    pub connections_total: u64,
    pub bytes_received_total: u64,
    pub bytes_sent_total: u64,
}

/// Busy/idle time, iterations, events, and the loop-level histograms.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LoopSnapshot {
    pub iterations: u64,
    /// Time blocked in the poll phase with a non-zero timeout.
    pub idle_seconds: f64,
    /// Everything else since the loop started.
    pub busy_seconds: f64,
    /// busy / (busy + idle) over the loop's lifetime.
    pub utilization: f64,
    /// busy / (busy + idle) over the last closed interval (`interval_seconds` long). An interval
    /// is at least `Builder::metrics_interval` long (1 s by default) and closes once due at the
    /// next loop iteration, snapshot or poll-phase wait (a long wait is an interval of its own),
    /// so it ends at most about one length before the snapshot; before the first one closes, it
    /// is the time since the loop started.
    pub interval_utilization: f64,
    pub interval_seconds: f64,
    /// I/O events and completions dispatched in the poll phase.
    pub events_total: u64,
    /// Events per poll phase (unitless values).
    pub events_per_poll: HistogramSnapshot,
    /// Time from a task being woken (or a callback queued) to it starting to run, in ns. A task
    /// woken by I/O counts from the return of the `epoll_wait` that saw the event (not from the
    /// event's arrival, which the loop cannot see); remote work (a pool completion, a
    /// `LoopHandle::post`, a wake from another thread) from its post.
    pub schedule_delay: HistogramSnapshot,
    /// Fire time minus deadline for every timer that fired, in ns (none without timers).
    pub timer_lateness: HistogramSnapshot,
    /// Run time of every task poll and macrotask callback, in ns (the next-tick and microtask
    /// closures it queued run after it, in batches of their own: see `slow_polls_total`).
    pub poll_duration: HistogramSnapshot,
    /// Polls, callbacks and next-tick/microtask batches at least the slow-poll threshold long.
    pub slow_polls_total: u64,
    pub slow_poll_threshold_seconds: f64,
    /// Time spent draining next-tick and microtask closures (timed per drain, not one by one).
    pub tick_drain_seconds: f64,
    pub ticks_total: u64,
    pub microtasks_total: u64,
}

/// Run-queue length: runnable tasks, queued immediates and remote work (pool completions,
/// posts, wakes from other threads) waiting for the loop.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RunQueueSnapshot {
    /// Length at the moment of the snapshot.
    pub current: u64,
    /// Time-weighted mean over the loop's lifetime (`wait_seconds` / `uptime_seconds`).
    pub mean: f64,
    /// The length integrated over the loop's lifetime (length × seconds): the time every entry
    /// spent in the queue, summed. Over a window, its increase divided by the window's length is
    /// the mean length, and divided by the arrivals' increase the mean wait (Little's law).
    #[serde(default)]
    pub wait_seconds: f64,
    /// High-water mark over the loop's lifetime.
    pub max: u64,
    /// High-water mark over the last closed interval (the one of `interval_utilization`).
    pub interval_max: u64,
    /// Time-weighted mean over the last closed interval.
    pub interval_mean: f64,
    /// Lengths sampled at the start of every drain (unitless values).
    pub samples: HistogramSnapshot,
    /// Entries that have entered the run queue (the arrival count for Little's law).
    pub arrivals_total: u64,
}

/// Task counts.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TasksSnapshot {
    pub spawned_total: u64,
    pub alive: u64,
    pub polls_total: u64,
    /// Polls cut short because the task ran out of its cooperative budget.
    pub forced_yields_total: u64,
}

/// Time and callbacks of one loop phase.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PhaseSnapshot {
    pub phase: String,
    pub seconds: f64,
    pub callbacks: u64,
}

/// Measurements of one task name (a class such as `http:static`, never a per-connection value).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TaskClassSnapshot {
    pub name: String,
    pub spawned: u64,
    pub polls: u64,
    pub forced_yields: u64,
    pub poll_duration: HistogramSnapshot,
}

/// Measurements of one worker pool (process-wide: every loop's snapshot shows the same pools).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PoolSnapshot {
    /// `io` or `cpu` (or the name of a pool built with `PoolBuilder`).
    pub pool: String,
    pub threads: u64,
    /// Jobs waiting for a thread.
    pub queue_depth: u64,
    /// Threads running a job.
    pub busy_threads: u64,
    /// Jobs run to the end (including those that panicked).
    pub completed_total: u64,
    /// Jobs whose future was dropped before they started (never run).
    pub cancelled_total: u64,
    /// Submissions refused because the queue was at its bound.
    pub rejected_total: u64,
    /// Jobs that panicked.
    pub panicked_total: u64,
    /// Time from submit to a thread starting the job, in ns.
    pub queue_wait: HistogramSnapshot,
    /// Run time of each job, in ns.
    pub run: HistogramSnapshot,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(name: &str) -> TaskClassSnapshot {
        TaskClassSnapshot {
            name: name.to_owned(),
            ..Default::default()
        }
    }

    #[test]
    fn a_loops_own_snapshot_is_within_bounds() {
        let rt = crate::Runtime::new();
        let s = rt.block_on(async {
            // More task names than the class table holds.
            for i in 0..100u32 {
                let name: &'static str = format!("t{i}").leak();
                crate::task::spawn_named(name, async move { i }).detach();
            }
            crate::metrics::snapshot()
        });
        assert_eq!(s.out_of_bounds(), None);
        let json = serde_json::to_string(&s).unwrap();
        let back: Snapshot = serde_json::from_str(&json).unwrap();
        assert_eq!(back.out_of_bounds(), None);
    }

    #[test]
    fn what_no_loop_takes_is_out_of_bounds_and_says_why() {
        let why = |f: &dyn Fn(&mut Snapshot)| {
            let mut s = Snapshot::default();
            f(&mut s);
            s.out_of_bounds().expect("out of bounds")
        };
        assert_eq!(
            why(&|s| s.task_classes = vec![class("a"), class("b"), class("a")]),
            r#"task classes: "a" twice"#
        );
        assert_eq!(
            why(&|s| s.task_classes = (0..65).map(|i| class(&i.to_string())).collect()),
            "65 task classes (a loop has at most 64)"
        );
        assert_eq!(
            why(&|s| s.task_classes = vec![class(&"x".repeat(MAX_NAME + 1))]),
            "task classes: a name of 257 bytes (at most 256)"
        );
        assert_eq!(
            why(&|s| {
                s.phases = vec![PhaseSnapshot::default(), PhaseSnapshot::default()];
            }),
            r#"phases: "" twice"#
        );
        assert_eq!(
            why(&|s| s.pools = vec![PoolSnapshot::default(); MAX_POOLS + 1]),
            "17 pools (a loop has at most 16)"
        );
        assert_eq!(
            why(&|s| s.stalls = vec![StallReport::default(); 65]),
            "65 stalls (a loop keeps 64)"
        );
        let too_many = vec![(1, 1); crate::metrics::histogram::BUCKETS + 1];
        assert_eq!(
            why(&|s| s.http.request_duration.buckets = too_many.clone()),
            "a histogram of 626 buckets (a histogram has 625)"
        );
        let mut fine = Snapshot {
            task_classes: vec![class("quote\" newline\n"), class("b")],
            ..Default::default()
        };
        fine.loop_stats.poll_duration.buckets = vec![(1, u64::MAX)];
        assert_eq!(fine.out_of_bounds(), None);
    }
}
