//! The serde-serializable picture of one loop's measurements (`nodus::metrics::snapshot()`).
//!
//! Everything here is plain data: built on the loop thread from `LoopStats` (`meter/stats.rs`),
//! then serialized to JSON (`/_nodus/stats`) or rendered as Prometheus text (`prometheus.rs`).
//! Durations are nanoseconds in histograms (`HistogramSnapshot` values) and seconds in scalar
//! fields whose names end in `_seconds`.

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
