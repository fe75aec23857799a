//! Every family the exposition can contain, as one `Desc` constant each: its name, help text,
//! unit and type. The full exposed name (after the encoder's suffixes) is in each doc comment.
//!
//! Invariants:
//! - `name` excludes the unit (`_seconds`, `_bytes`) and the `_total` counter suffix: the encoder
//!   appends them, the unit with its `# UNIT` line. A name that ends in a unit has that unit, so
//!   every such family has its `# UNIT` line (OpenMetrics: a unit is the name's suffix).
//! - Names are unique and carry the `nodus_` prefix; a family's kind never changes between
//!   snapshots (`SnapshotCollector::push` checks it in debug builds).

use prometheus_client::registry::Unit;

#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// What one family is. `name` excludes the unit and the `_total` counter suffix: the encoder
/// appends them.
pub(super) struct Desc {
    pub(super) name: &'static str,
    pub(super) help: &'static str,
    pub(super) unit: Option<&'static Unit>,
    pub(super) kind: Kind,
}

static SECONDS: Unit = Unit::Seconds;
static BYTES: Unit = Unit::Bytes;

/// The end of every histogram's help: what the stats JSON has of it that the buckets do not.
macro_rules! summary_in_json {
    () => {
        " Lifetime min, max and quantiles: /_nodus/stats; over a window, histogram_quantile() of the buckets. Each le is the edge of nodus's internal buckets nearest a round bound (1us, 5us ... 10s: 0.100663295 for 0.1; counts 0, 1, 2, 4 ... 4096: 63 for 64), so a sample is counted in every le at or above its value."
    };
}

macro_rules! desc {
    ($name:literal, $kind:ident, $unit:ident, $help:expr) => {
        Desc {
            name: $name,
            help: $help,
            unit: unit!($unit),
            kind: Kind::$kind,
        }
    };
}

/// A `Desc`'s unit: `none`, `seconds` or `bytes`.
macro_rules! unit {
    (none) => {
        None
    };
    (seconds) => {
        Some(&SECONDS)
    };
    (bytes) => {
        Some(&BYTES)
    };
}

// Full exposed names in the comments.
/// nodus_process_resident_memory_bytes
pub(super) const RSS: Desc = desc!(
    "nodus_process_resident_memory",
    Gauge,
    bytes,
    "Resident memory of the process."
);
/// nodus_http_requests_total
pub(super) const HTTP_REQUESTS: Desc = desc!(
    "nodus_http_requests",
    Counter,
    none,
    "HTTP responses sent, by status class."
);
/// nodus_http_request_duration_seconds
pub(super) const HTTP_DURATION: Desc = desc!(
    "nodus_http_request_duration",
    Histogram,
    seconds,
    concat!(
        "Time from an HTTP request head being parsed to its response head being ready.",
        summary_in_json!()
    )
);
/// nodus_http_requests_in_flight
pub(super) const HTTP_IN_FLIGHT: Desc = desc!(
    "nodus_http_requests_in_flight",
    Gauge,
    none,
    "HTTP requests being handled."
);
/// nodus_http_connections
pub(super) const HTTP_CONNECTIONS: Desc = desc!(
    "nodus_http_connections",
    Gauge,
    none,
    "Open HTTP connections."
);
/// nodus_http_connections_max
pub(super) const HTTP_CONNECTIONS_MAX: Desc = desc!(
    "nodus_http_connections_max",
    Gauge,
    none,
    "Most HTTP connections the accepting servers keep open (the sum of their caps); past it they \
     stop accepting."
);
/// nodus_http_connections_accepted_total
pub(super) const HTTP_CONNECTIONS_TOTAL: Desc = desc!(
    "nodus_http_connections_accepted",
    Counter,
    none,
    "HTTP connections accepted."
);
/// nodus_http_received_bytes_total
pub(super) const HTTP_BYTES_IN: Desc = desc!(
    "nodus_http_received",
    Counter,
    bytes,
    "Bytes read from HTTP connections."
);
/// nodus_http_sent_bytes_total
pub(super) const HTTP_BYTES_OUT: Desc = desc!(
    "nodus_http_sent",
    Counter,
    bytes,
    "Bytes written to HTTP connections."
);
/// nodus_task_schedule_delay_seconds
pub(super) const SCHEDULE_DELAY: Desc = desc!(
    "nodus_task_schedule_delay",
    Histogram,
    seconds,
    concat!(
        "Time from a task being woken (or a callback queued) to it starting to run: from the wake, spawn or set_immediate itself (a task woken early in a long poll counts the rest of it), from the return of the epoll_wait that saw the event for a task woken by I/O, from the post for remote work (pool completions, wakes from other threads).",
        summary_in_json!()
    )
);
/// nodus_run_queue_length
pub(super) const RUN_QUEUE: Desc = desc!(
    "nodus_run_queue_length",
    Gauge,
    none,
    "Run-queue length (runnable tasks, queued immediates, remote work such as pool completions) at the snapshot."
);
/// nodus_run_queue_length_mean
pub(super) const RUN_QUEUE_MEAN: Desc = desc!(
    "nodus_run_queue_length_mean",
    Gauge,
    none,
    "Time-weighted mean run-queue length over the last closed interval (as for nodus_loop_utilization); over any window, rate(nodus_run_queue_wait_seconds_total)."
);
/// nodus_run_queue_length_max
pub(super) const RUN_QUEUE_MAX: Desc = desc!(
    "nodus_run_queue_length_max",
    Gauge,
    none,
    "Run-queue high-water mark over the last closed interval (as for nodus_loop_utilization)."
);
/// nodus_run_queue_length_lifetime_max
pub(super) const RUN_QUEUE_LIFETIME_MAX: Desc = desc!(
    "nodus_run_queue_length_lifetime_max",
    Gauge,
    none,
    "Run-queue high-water mark over the loop's lifetime."
);
/// nodus_run_queue_wait_seconds_total
pub(super) const RUN_QUEUE_WAIT: Desc = desc!(
    "nodus_run_queue_wait",
    Counter,
    seconds,
    "Time entries spent in the run queue, summed (its length integrated over time): rate() is the mean length over the window, rate() / rate(nodus_run_queue_arrivals_total) the mean wait, and the total / nodus_uptime_seconds the lifetime mean length."
);
/// nodus_run_queue_length_samples
pub(super) const RUN_QUEUE_SAMPLES: Desc = desc!(
    "nodus_run_queue_length_samples",
    Histogram,
    none,
    concat!(
        "Run-queue length sampled at the start of every drain (work queued and run within one drain, tasks a task spawns, is not in it: nodus_run_queue_length_max and _mean count it).",
        summary_in_json!()
    )
);
/// nodus_run_queue_arrivals_total
pub(super) const RUN_QUEUE_ARRIVALS: Desc = desc!(
    "nodus_run_queue_arrivals",
    Counter,
    none,
    "Entries that have entered the run queue."
);
/// nodus_loop_busy_seconds_total
pub(super) const BUSY: Desc = desc!(
    "nodus_loop_busy",
    Counter,
    seconds,
    "Loop time not spent blocked in the poll phase."
);
/// nodus_loop_idle_seconds_total
pub(super) const IDLE: Desc = desc!(
    "nodus_loop_idle",
    Counter,
    seconds,
    "Loop time blocked in the poll phase with a non-zero timeout."
);
/// nodus_loop_utilization
pub(super) const UTILIZATION: Desc = desc!(
    "nodus_loop_utilization",
    Gauge,
    none,
    "Busy / (busy + idle) over the last closed interval (nodus_loop_interval_seconds long): at least the configured length (1 s by default), closed by the snapshot once due; before the first closes, the time since the loop started. Over a window or the lifetime it follows from the counters, rate() or not: busy_seconds_total / (busy_seconds_total + idle_seconds_total)."
);
/// nodus_loop_interval_seconds
pub(super) const INTERVAL: Desc = desc!(
    "nodus_loop_interval",
    Gauge,
    seconds,
    "Length of the last closed interval, the one nodus_loop_utilization, nodus_run_queue_length_mean and nodus_run_queue_length_max cover (a long idle wait is an interval of its own)."
);
/// nodus_timer_lateness_seconds
pub(super) const TIMER_LATENESS: Desc = desc!(
    "nodus_timer_lateness",
    Histogram,
    seconds,
    concat!(
        "Fire time minus deadline of every timer.",
        summary_in_json!()
    )
);
/// nodus_task_poll_duration_seconds{task}
pub(super) const TASK_POLL_DURATION: Desc = desc!(
    "nodus_task_poll_duration",
    Histogram,
    seconds,
    concat!(
        "Run time of each task poll or callback, by task name.",
        summary_in_json!()
    )
);
/// nodus_loop_poll_duration_seconds
pub(super) const POLL_DURATION: Desc = desc!(
    "nodus_loop_poll_duration",
    Histogram,
    seconds,
    concat!(
        "Run time of every task poll and macrotask callback.",
        summary_in_json!()
    )
);
/// nodus_loop_iterations_total
pub(super) const ITERATIONS: Desc =
    desc!("nodus_loop_iterations", Counter, none, "Loop iterations.");
/// nodus_loop_events_total
pub(super) const EVENTS: Desc = desc!(
    "nodus_loop_events",
    Counter,
    none,
    "I/O events and completions dispatched in the poll phase."
);
/// nodus_loop_events_per_poll
pub(super) const EVENTS_PER_POLL: Desc = desc!(
    "nodus_loop_events_per_poll",
    Histogram,
    none,
    concat!("Events dispatched per poll phase.", summary_in_json!())
);
/// nodus_loop_phase_seconds_total{phase}
pub(super) const PHASE_SECONDS: Desc = desc!(
    "nodus_loop_phase",
    Counter,
    seconds,
    "Time spent in each loop phase."
);
/// nodus_loop_phase_callbacks_total{phase}
pub(super) const PHASE_CALLBACKS: Desc = desc!(
    "nodus_loop_phase_callbacks",
    Counter,
    none,
    "Callbacks run in each loop phase."
);
/// nodus_task_polls_total{task}
pub(super) const TASK_POLLS: Desc = desc!(
    "nodus_task_polls",
    Counter,
    none,
    "Task polls, by task name (their sum is the loop's total, tasks.polls_total in /_nodus/stats)."
);
/// nodus_task_forced_yields_total{task}
pub(super) const TASK_FORCED_YIELDS: Desc = desc!(
    "nodus_task_forced_yields",
    Counter,
    none,
    "Polls cut short by the cooperative budget, by task name (their sum is the loop's total, tasks.forced_yields_total in /_nodus/stats)."
);
/// nodus_task_panics_total{task}
pub(super) const TASK_PANICS: Desc = desc!(
    "nodus_task_panics",
    Counter,
    none,
    "Task polls that panicked, by task name, whether or not the task's JoinHandle was kept (their sum is the loop's total, tasks.panics_total in /_nodus/stats)."
);
/// nodus_tasks_spawned_total{task}
pub(super) const TASKS_SPAWNED: Desc = desc!(
    "nodus_tasks_spawned",
    Counter,
    none,
    "Tasks spawned, by task name (their sum is the loop's total, tasks.spawned_total in /_nodus/stats)."
);
/// nodus_tasks_alive
pub(super) const TASKS_ALIVE: Desc = desc!("nodus_tasks_alive", Gauge, none, "Tasks alive.");
/// nodus_loop_slow_polls_total
pub(super) const SLOW_POLLS: Desc = desc!(
    "nodus_loop_slow_polls",
    Counter,
    none,
    "Polls, callbacks and next-tick/microtask batches at least the slow-poll threshold long."
);
/// nodus_loop_slow_poll_threshold_seconds
pub(super) const SLOW_POLL_THRESHOLD: Desc = desc!(
    "nodus_loop_slow_poll_threshold",
    Gauge,
    seconds,
    "The duration from which a poll, callback or batch counts in nodus_loop_slow_polls_total (and is logged)."
);
/// nodus_loop_tick_drain_seconds_total
pub(super) const TICK_DRAIN: Desc = desc!(
    "nodus_loop_tick_drain",
    Counter,
    seconds,
    "Time spent draining next-tick and microtask queues."
);
/// nodus_ticks_total
pub(super) const TICKS: Desc = desc!("nodus_ticks", Counter, none, "Next-tick closures run.");
/// nodus_microtasks_total
pub(super) const MICROTASKS: Desc = desc!("nodus_microtasks", Counter, none, "Microtasks run.");
/// nodus_loop_stalls_total{class}
pub(super) const STALLS: Desc = desc!(
    "nodus_loop_stalls",
    Counter,
    none,
    "Stalls the watchdog reported for this loop (the loop held past the stall threshold by one callback and the drain after it), by class: on-cpu, blocked-in-syscall, waiting-for-cpu, stopped, unknown. Each is counted once, when the watchdog sees it end (within 10 ms), under its final class; for the loop's life, unlike nodus_stalls_recent."
);
/// nodus_stalls_recent
pub(super) const STALLS_RECENT: Desc = desc!(
    "nodus_stalls_recent",
    Gauge,
    none,
    "Stalls of this loop in the watchdog's ring buffer, which keeps the process's last 64: at most 64, where it stays once 64 stalls happened (to count stalls, use nodus_loop_stalls_total). Each one's task, spawn location, polls and class are in /_nodus/stats only: free text, no label values."
);
/// nodus_stall_last_seconds
pub(super) const STALL_LAST: Desc = desc!(
    "nodus_stall_last",
    Gauge,
    seconds,
    "Duration of the most recent stall (0 if none): how long the loop was held by one callback and the drain after it, however many polls ran in it, from the end the loop recorded; in a snapshot taken inside a stall, how long it has held the loop so far."
);
/// nodus_uptime_seconds
pub(super) const UPTIME: Desc = desc!(
    "nodus_uptime",
    Gauge,
    seconds,
    "Seconds since the loop was created."
);

/// nodus_pool_threads{pool}
pub(super) const POOL_THREADS: Desc = desc!(
    "nodus_pool_threads",
    Gauge,
    none,
    "Worker threads of each pool."
);
/// nodus_pool_queue_depth{pool}
pub(super) const POOL_QUEUE_DEPTH: Desc = desc!(
    "nodus_pool_queue_depth",
    Gauge,
    none,
    "Jobs waiting for a pool thread."
);
/// nodus_pool_queue_wait_seconds{pool}
pub(super) const POOL_QUEUE_WAIT: Desc = desc!(
    "nodus_pool_queue_wait",
    Histogram,
    seconds,
    concat!(
        "Time from submitting a job to a pool thread starting it.",
        summary_in_json!()
    )
);
/// nodus_pool_run_seconds{pool}
pub(super) const POOL_RUN: Desc = desc!(
    "nodus_pool_run",
    Histogram,
    seconds,
    concat!("Run time of each pool job.", summary_in_json!())
);
/// nodus_pool_busy_threads{pool}
pub(super) const POOL_BUSY: Desc = desc!(
    "nodus_pool_busy_threads",
    Gauge,
    none,
    "Pool threads running a job."
);
/// nodus_pool_completed_total{pool}
pub(super) const POOL_COMPLETED: Desc = desc!(
    "nodus_pool_completed",
    Counter,
    none,
    "Pool jobs run to the end."
);
/// nodus_pool_cancelled_total{pool}
pub(super) const POOL_CANCELLED: Desc = desc!(
    "nodus_pool_cancelled",
    Counter,
    none,
    "Pool jobs whose future was dropped before a thread started them (never run)."
);
/// nodus_pool_rejected_total{pool}
pub(super) const POOL_REJECTED: Desc = desc!(
    "nodus_pool_rejected",
    Counter,
    none,
    "Pool submissions refused because the pool's queue was at its bound."
);
/// nodus_pool_panicked_total{pool}
pub(super) const POOL_PANICKED: Desc = desc!(
    "nodus_pool_panicked",
    Counter,
    none,
    "Pool jobs that panicked (counted among the completed too)."
);
