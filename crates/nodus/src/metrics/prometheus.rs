//! Prometheus exposition of [`Snapshot`]s, through the `prometheus-client` crate's encoder.
//!
//! The text is never written by hand: [`SnapshotCollector`] turns snapshots into owned families
//! of series at render time, implements `prometheus_client`'s `Collector`, and is encoded by
//! `prometheus_client::encoding::text::encode` from a `Registry` built for the one render.
//! The crate writes the OpenMetrics text format (`# HELP`/`# TYPE`/`# UNIT`, `_total` on
//! counter samples, a closing `# EOF`, label values escaped); serve it with [`CONTENT_TYPE`].
//! (Read as text format 0.0.4 it still parses, but a counter's `# TYPE` names `x` while its
//! sample is `x_total`, so the type is lost.)
//!
//! Names carry the `nodus_` prefix and base units: durations are `_seconds` (histogram values
//! are nanoseconds, divided by 1e9), counters end in `_total`. One `# HELP`/`# TYPE` is written
//! per family, followed by all of its series, so [`render_labeled`] can put several snapshots
//! (a cluster's workers, each with a `worker` label) in one exposition.
//!
//! Histogram buckets are fixed (`le` = 1 µs … 10 s for `_seconds`, 0, 1, 2, 4, … 4096 for
//! unitless ones) and derived from the snapshot's sparse log-linear buckets. Approximation: a
//! sparse bucket counts toward an `le` only when its inclusive upper bound is `<= le`, so the
//! samples at or below an `le` that share the sparse bucket straddling it are counted only
//! under the next `le`. Sparse buckets are at most 1/16 of their lower bound wide, so only
//! samples within 6.25 % below an `le` can be affected (values below 32 are exact; for the
//! unitless powers of two from 32 up only a sample exactly equal to `le` is). `_count`, the
//! `+Inf` bucket and `_sum` are exact.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

use super::snapshot::{HistogramSnapshot, Snapshot};

/// The HTTP `Content-Type` of the text [`render`] returns.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Prometheus text of one snapshot.
pub fn render(snapshot: &Snapshot) -> String {
    render_labeled(&[(Vec::new(), snapshot)])
}

/// Several snapshots in one exposition, each series carrying the given extra labels
/// (the cluster primary uses `[("worker", "1")]` per worker). One HELP/TYPE per family.
///
/// Label names are written as given, so they must be valid Prometheus label names; values are
/// escaped.
pub fn render_labeled(snapshots: &[(Vec<(String, String)>, &Snapshot)]) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(SnapshotCollector::new(snapshots)));
    let mut out = String::with_capacity(16 * 1024);
    prometheus_client::encoding::text::encode(&mut out, &registry)
        .expect("encoding into a String cannot fail");
    out
}

/// The snapshots' metrics as a `prometheus_client` collector, for callers that expose them
/// from a larger `Registry` (next to pool or HTTP metrics) instead of through [`render`].
#[derive(Debug, Default)]
pub struct SnapshotCollector {
    families: Vec<Family>,
}

/// The unit suffix the encoder appends (`# UNIT` line included).
static SECONDS: Unit = Unit::Seconds;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// What one family is. `name` excludes the `_seconds` unit and the `_total` counter suffix:
/// the encoder appends them.
struct Desc {
    name: &'static str,
    help: &'static str,
    seconds: bool,
    kind: Kind,
}

#[derive(Debug)]
struct Family {
    name: &'static str,
    help: &'static str,
    seconds: bool,
    kind: Kind,
    series: Vec<Series>,
}

#[derive(Debug)]
struct Series {
    labels: Vec<(String, String)>,
    value: Value,
}

#[derive(Debug)]
enum Value {
    Int(u64),
    Float(f64),
    /// Non-cumulative counts per `le` (the encoder accumulates them), `+Inf` last.
    Histogram {
        sum: f64,
        count: u64,
        buckets: Vec<(f64, u64)>,
    },
}

macro_rules! desc {
    ($name:literal, $kind:ident, $seconds:literal, $help:literal) => {
        Desc {
            name: $name,
            help: $help,
            seconds: $seconds,
            kind: Kind::$kind,
        }
    };
}

// Full exposed names in the comments.
/// nodus_process_resident_memory_bytes
const RSS: Desc = desc!(
    "nodus_process_resident_memory_bytes",
    Gauge,
    false,
    "Resident memory of the process."
);
/// nodus_http_requests_total
const HTTP_REQUESTS: Desc = desc!(
    "nodus_http_requests",
    Counter,
    false,
    "HTTP responses sent, by status class."
);
/// nodus_http_request_duration_seconds
const HTTP_DURATION: Desc = desc!(
    "nodus_http_request_duration",
    Histogram,
    true,
    "Time from an HTTP request head being parsed to its response head being ready."
);
/// nodus_http_requests_in_flight
const HTTP_IN_FLIGHT: Desc = desc!(
    "nodus_http_requests_in_flight",
    Gauge,
    false,
    "HTTP requests being handled."
);
/// nodus_http_connections
const HTTP_CONNECTIONS: Desc = desc!(
    "nodus_http_connections",
    Gauge,
    false,
    "Open HTTP connections."
);
/// nodus_http_connections_accepted_total
const HTTP_CONNECTIONS_TOTAL: Desc = desc!(
    "nodus_http_connections_accepted",
    Counter,
    false,
    "HTTP connections accepted."
);
/// nodus_http_received_bytes_total
const HTTP_BYTES_IN: Desc = desc!(
    "nodus_http_received_bytes",
    Counter,
    false,
    "Bytes read from HTTP connections."
);
/// nodus_http_sent_bytes_total
const HTTP_BYTES_OUT: Desc = desc!(
    "nodus_http_sent_bytes",
    Counter,
    false,
    "Bytes written to HTTP connections."
);
/// nodus_task_schedule_delay_seconds
const SCHEDULE_DELAY: Desc = desc!(
    "nodus_task_schedule_delay",
    Histogram,
    true,
    "Time from a task being woken (or a callback queued) to it starting to run."
);
/// nodus_run_queue_length
const RUN_QUEUE: Desc = desc!(
    "nodus_run_queue_length",
    Gauge,
    false,
    "Run-queue length (runnable tasks and queued immediates) at the snapshot."
);
/// nodus_run_queue_length_mean
const RUN_QUEUE_MEAN: Desc = desc!(
    "nodus_run_queue_length_mean",
    Gauge,
    false,
    "Time-weighted mean run-queue length over the loop's lifetime."
);
/// nodus_run_queue_length_max
const RUN_QUEUE_MAX: Desc = desc!(
    "nodus_run_queue_length_max",
    Gauge,
    false,
    "Run-queue high-water mark over the last completed interval."
);
/// nodus_run_queue_length_samples
const RUN_QUEUE_SAMPLES: Desc = desc!(
    "nodus_run_queue_length_samples",
    Histogram,
    false,
    "Run-queue length sampled at the start of every drain."
);
/// nodus_run_queue_arrivals_total
const RUN_QUEUE_ARRIVALS: Desc = desc!(
    "nodus_run_queue_arrivals",
    Counter,
    false,
    "Entries that have entered the run queue."
);
/// nodus_loop_busy_seconds_total
const BUSY: Desc = desc!(
    "nodus_loop_busy",
    Counter,
    true,
    "Loop time not spent blocked in the poll phase."
);
/// nodus_loop_idle_seconds_total
const IDLE: Desc = desc!(
    "nodus_loop_idle",
    Counter,
    true,
    "Loop time blocked in the poll phase with a non-zero timeout."
);
/// nodus_loop_utilization
const UTILIZATION: Desc = desc!(
    "nodus_loop_utilization",
    Gauge,
    false,
    "Busy / (busy + idle) over the last completed interval."
);
/// nodus_timer_lateness_seconds
const TIMER_LATENESS: Desc = desc!(
    "nodus_timer_lateness",
    Histogram,
    true,
    "Fire time minus deadline of every timer."
);
/// nodus_task_poll_duration_seconds{task}
const TASK_POLL_DURATION: Desc = desc!(
    "nodus_task_poll_duration",
    Histogram,
    true,
    "Run time of each task poll or callback, by task name."
);
/// nodus_loop_poll_duration_seconds
const POLL_DURATION: Desc = desc!(
    "nodus_loop_poll_duration",
    Histogram,
    true,
    "Run time of every task poll and macrotask callback."
);
/// nodus_loop_iterations_total
const ITERATIONS: Desc = desc!("nodus_loop_iterations", Counter, false, "Loop iterations.");
/// nodus_loop_events_total
const EVENTS: Desc = desc!(
    "nodus_loop_events",
    Counter,
    false,
    "I/O events and completions dispatched in the poll phase."
);
/// nodus_loop_events_per_poll
const EVENTS_PER_POLL: Desc = desc!(
    "nodus_loop_events_per_poll",
    Histogram,
    false,
    "Events dispatched per poll phase."
);
/// nodus_loop_phase_seconds_total{phase}
const PHASE_SECONDS: Desc = desc!(
    "nodus_loop_phase",
    Counter,
    true,
    "Time spent in each loop phase."
);
/// nodus_loop_phase_callbacks_total{phase}
const PHASE_CALLBACKS: Desc = desc!(
    "nodus_loop_phase_callbacks",
    Counter,
    false,
    "Callbacks run in each loop phase."
);
/// nodus_task_polls_total{task}
const TASK_POLLS: Desc = desc!(
    "nodus_task_polls",
    Counter,
    false,
    "Task polls, by task name."
);
/// nodus_task_forced_yields_total{task}
const TASK_FORCED_YIELDS: Desc = desc!(
    "nodus_task_forced_yields",
    Counter,
    false,
    "Polls cut short by the cooperative budget, by task name."
);
/// nodus_tasks_spawned_total{task}
const TASKS_SPAWNED: Desc = desc!(
    "nodus_tasks_spawned",
    Counter,
    false,
    "Tasks spawned, by task name."
);
/// nodus_tasks_alive
const TASKS_ALIVE: Desc = desc!("nodus_tasks_alive", Gauge, false, "Tasks alive.");
/// nodus_loop_slow_polls_total
const SLOW_POLLS: Desc = desc!(
    "nodus_loop_slow_polls",
    Counter,
    false,
    "Polls or callbacks longer than the slow-poll threshold."
);
/// nodus_loop_tick_drain_seconds_total
const TICK_DRAIN: Desc = desc!(
    "nodus_loop_tick_drain",
    Counter,
    true,
    "Time spent draining next-tick and microtask queues."
);
/// nodus_ticks_total
const TICKS: Desc = desc!("nodus_ticks", Counter, false, "Next-tick closures run.");
/// nodus_microtasks_total
const MICROTASKS: Desc = desc!("nodus_microtasks", Counter, false, "Microtasks run.");
/// nodus_stalls_recent
const STALLS_RECENT: Desc = desc!(
    "nodus_stalls_recent",
    Gauge,
    false,
    "Stalls kept in the watchdog's ring buffer for this loop."
);
/// nodus_stall_last_seconds
const STALL_LAST: Desc = desc!(
    "nodus_stall_last",
    Gauge,
    true,
    "Duration of the most recent stall (0 if none)."
);
/// nodus_uptime_seconds
const UPTIME: Desc = desc!(
    "nodus_uptime",
    Gauge,
    true,
    "Seconds since the loop was created."
);

/// nodus_pool_threads{pool}
const POOL_THREADS: Desc = desc!(
    "nodus_pool_threads",
    Gauge,
    false,
    "Worker threads of each pool."
);
/// nodus_pool_queue_depth{pool}
const POOL_QUEUE_DEPTH: Desc = desc!(
    "nodus_pool_queue_depth",
    Gauge,
    false,
    "Jobs waiting for a pool thread."
);
/// nodus_pool_queue_wait_seconds{pool}
const POOL_QUEUE_WAIT: Desc = desc!(
    "nodus_pool_queue_wait",
    Histogram,
    true,
    "Time from submitting a job to a pool thread starting it."
);
/// nodus_pool_run_seconds{pool}
const POOL_RUN: Desc = desc!(
    "nodus_pool_run",
    Histogram,
    true,
    "Run time of each pool job."
);
/// nodus_pool_busy_threads{pool}
const POOL_BUSY: Desc = desc!(
    "nodus_pool_busy_threads",
    Gauge,
    false,
    "Pool threads running a job."
);
/// nodus_pool_completed_total{pool}
const POOL_COMPLETED: Desc = desc!(
    "nodus_pool_completed",
    Counter,
    false,
    "Pool jobs run to the end."
);

/// `le` bounds of `_seconds` histograms: (seconds, nanoseconds).
const SECONDS_LE: [(f64, u64); 20] = [
    (1e-6, 1_000),
    (5e-6, 5_000),
    (1e-5, 10_000),
    (5e-5, 50_000),
    (1e-4, 100_000),
    (2.5e-4, 250_000),
    (5e-4, 500_000),
    (1e-3, 1_000_000),
    (2.5e-3, 2_500_000),
    (5e-3, 5_000_000),
    (1e-2, 10_000_000),
    (2.5e-2, 25_000_000),
    (5e-2, 50_000_000),
    (0.1, 100_000_000),
    (0.25, 250_000_000),
    (0.5, 500_000_000),
    (1.0, 1_000_000_000),
    (2.5, 2_500_000_000),
    (5.0, 5_000_000_000),
    (10.0, 10_000_000_000),
];

/// `le` bounds of unitless histograms: 0, then powers of two up to 4096.
const UNITLESS_LE: [(f64, u64); 14] = {
    let mut le = [(0.0, 0); 14];
    let mut i = 1;
    while i < le.len() {
        let v = 1u64 << (i - 1);
        le[i] = (v as f64, v);
        i += 1;
    }
    le
};

/// Converts sparse buckets to per-`le` counts (non-cumulative; `+Inf` last).
fn histogram(h: &HistogramSnapshot, les: &[(f64, u64)], seconds: bool) -> Value {
    let mut counts = vec![0u64; les.len() + 1];
    for &(upper, c) in &h.buckets {
        // First `le` at or above the bucket's upper bound; past the end means `+Inf`.
        let i = les.partition_point(|&(_, le)| le < upper);
        counts[i] = counts[i].saturating_add(c);
    }
    let count = counts.iter().fold(0u64, |a, &c| a.saturating_add(c));
    let buckets = les
        .iter()
        .map(|&(le, _)| le)
        .chain([f64::INFINITY])
        .zip(counts)
        .collect();
    let sum = if seconds {
        h.sum as f64 / 1e9
    } else {
        h.sum as f64
    };
    Value::Histogram {
        sum,
        count,
        buckets,
    }
}

fn seconds_histogram(h: &HistogramSnapshot) -> Value {
    histogram(h, &SECONDS_LE, true)
}

fn unitless_histogram(h: &HistogramSnapshot) -> Value {
    histogram(h, &UNITLESS_LE, false)
}

impl SnapshotCollector {
    /// Collects `snapshots`, each series labelled with its snapshot's extra labels (first),
    /// then its own (`task`, `phase`).
    pub fn new(snapshots: &[(Vec<(String, String)>, &Snapshot)]) -> Self {
        let mut c = SnapshotCollector::default();
        for (labels, s) in snapshots {
            c.add(labels, s);
        }
        c
    }

    /// Appends one series to the family `d`, creating the family on first use (so families
    /// keep first-use order and each appears once).
    fn push(&mut self, d: &Desc, labels: Vec<(String, String)>, value: Value) {
        let family = match self.families.iter().position(|f| f.name == d.name) {
            Some(i) => &mut self.families[i],
            None => {
                self.families.push(Family {
                    name: d.name,
                    help: d.help,
                    seconds: d.seconds,
                    kind: d.kind,
                    series: Vec::new(),
                });
                self.families.last_mut().expect("just pushed")
            }
        };
        debug_assert_eq!(family.kind, d.kind);
        family.series.push(Series { labels, value });
    }

    fn add(&mut self, extra: &[(String, String)], s: &Snapshot) {
        let base = || extra.to_vec();
        let with = |key: &str, value: &str| {
            let mut l = extra.to_vec();
            l.push((key.to_owned(), value.to_owned()));
            l
        };
        let ls = &s.loop_stats;
        let rq = &s.run_queue;

        self.push(
            &SCHEDULE_DELAY,
            base(),
            seconds_histogram(&ls.schedule_delay),
        );
        self.push(&RUN_QUEUE, base(), Value::Int(rq.current));
        self.push(&RUN_QUEUE_MEAN, base(), Value::Float(rq.mean));
        self.push(&RUN_QUEUE_MAX, base(), Value::Int(rq.interval_max));
        self.push(&RUN_QUEUE_SAMPLES, base(), unitless_histogram(&rq.samples));
        self.push(&RUN_QUEUE_ARRIVALS, base(), Value::Int(rq.arrivals_total));
        self.push(&BUSY, base(), Value::Float(ls.busy_seconds));
        self.push(&IDLE, base(), Value::Float(ls.idle_seconds));
        self.push(&UTILIZATION, base(), Value::Float(ls.interval_utilization));
        self.push(
            &TIMER_LATENESS,
            base(),
            seconds_histogram(&ls.timer_lateness),
        );
        for t in &s.task_classes {
            let v = seconds_histogram(&t.poll_duration);
            self.push(&TASK_POLL_DURATION, with("task", &t.name), v);
        }
        self.push(&POLL_DURATION, base(), seconds_histogram(&ls.poll_duration));
        self.push(&ITERATIONS, base(), Value::Int(ls.iterations));
        self.push(&EVENTS, base(), Value::Int(ls.events_total));
        self.push(
            &EVENTS_PER_POLL,
            base(),
            unitless_histogram(&ls.events_per_poll),
        );
        for p in &s.phases {
            self.push(
                &PHASE_SECONDS,
                with("phase", &p.phase),
                Value::Float(p.seconds),
            );
            let v = Value::Int(p.callbacks);
            self.push(&PHASE_CALLBACKS, with("phase", &p.phase), v);
        }
        for t in &s.task_classes {
            self.push(&TASK_POLLS, with("task", &t.name), Value::Int(t.polls));
            let v = Value::Int(t.forced_yields);
            self.push(&TASK_FORCED_YIELDS, with("task", &t.name), v);
            self.push(&TASKS_SPAWNED, with("task", &t.name), Value::Int(t.spawned));
        }
        self.push(&TASKS_ALIVE, base(), Value::Int(s.tasks.alive));
        self.push(&SLOW_POLLS, base(), Value::Int(ls.slow_polls_total));
        self.push(&TICK_DRAIN, base(), Value::Float(ls.tick_drain_seconds));
        self.push(&TICKS, base(), Value::Int(ls.ticks_total));
        self.push(&MICROTASKS, base(), Value::Int(ls.microtasks_total));
        self.push(&STALLS_RECENT, base(), Value::Int(s.stalls.len() as u64));
        let last = s.stalls.last().map_or(0.0, |r| r.elapsed_seconds);
        self.push(&STALL_LAST, base(), Value::Float(last));
        self.push(&UPTIME, base(), Value::Float(s.uptime_seconds));
        self.push(&RSS, base(), Value::Int(s.rss_bytes));
        let h = &s.http;
        for (i, n) in h.responses_by_class.iter().enumerate() {
            self.push(
                &HTTP_REQUESTS,
                with("status", &format!("{}xx", i + 1)),
                Value::Int(*n),
            );
        }
        self.push(
            &HTTP_DURATION,
            base(),
            seconds_histogram(&h.request_duration),
        );
        self.push(&HTTP_IN_FLIGHT, base(), Value::Int(h.requests_in_flight));
        self.push(&HTTP_CONNECTIONS, base(), Value::Int(h.connections_open));
        self.push(
            &HTTP_CONNECTIONS_TOTAL,
            base(),
            Value::Int(h.connections_total),
        );
        self.push(&HTTP_BYTES_IN, base(), Value::Int(h.bytes_received_total));
        self.push(&HTTP_BYTES_OUT, base(), Value::Int(h.bytes_sent_total));
        for p in &s.pools {
            let pool = || with("pool", &p.pool);
            self.push(&POOL_THREADS, pool(), Value::Int(p.threads));
            self.push(&POOL_QUEUE_DEPTH, pool(), Value::Int(p.queue_depth));
            self.push(&POOL_QUEUE_WAIT, pool(), seconds_histogram(&p.queue_wait));
            self.push(&POOL_RUN, pool(), seconds_histogram(&p.run));
            self.push(&POOL_BUSY, pool(), Value::Int(p.busy_threads));
            self.push(&POOL_COMPLETED, pool(), Value::Int(p.completed_total));
        }
    }
}

/// Writes one sample (or, for a histogram, its `_sum`, `_count` and `_bucket` lines).
fn encode_value(e: &mut MetricEncoder, kind: Kind, value: &Value) -> Result<(), std::fmt::Error> {
    match (kind, value) {
        (Kind::Counter, Value::Int(v)) => e.encode_counter::<NoLabelSet, _, f64>(v, None),
        (Kind::Counter, Value::Float(v)) => e.encode_counter::<NoLabelSet, _, f64>(v, None),
        (Kind::Gauge, Value::Int(v)) => e.encode_gauge(v),
        (Kind::Gauge, Value::Float(v)) => e.encode_gauge(v),
        (
            Kind::Histogram,
            Value::Histogram {
                sum,
                count,
                buckets,
            },
        ) => e.encode_histogram::<NoLabelSet>(*sum, *count, buckets, None),
        _ => unreachable!("family kind and value kind always match"),
    }
}

impl Collector for SnapshotCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for f in self.families.iter().filter(|f| !f.series.is_empty()) {
            let metric_type = match f.kind {
                Kind::Counter => MetricType::Counter,
                Kind::Gauge => MetricType::Gauge,
                Kind::Histogram => MetricType::Histogram,
            };
            let unit = f.seconds.then_some(&SECONDS);
            let mut metric = encoder.encode_descriptor(f.name, f.help, unit, metric_type)?;
            for s in &f.series {
                if s.labels.is_empty() {
                    // `encode_family` with no labels would write an empty `{}`.
                    encode_value(&mut metric, f.kind, &s.value)?;
                } else {
                    encode_value(&mut metric.encode_family(&s.labels)?, f.kind, &s.value)?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::histogram::Histogram;
    use crate::metrics::snapshot::{PhaseSnapshot, PoolSnapshot, StallReport, TaskClassSnapshot};

    fn hist(values: &[(u64, u64)]) -> HistogramSnapshot {
        let mut h = Histogram::new();
        for &(v, n) in values {
            h.record_n(v, n);
        }
        h.snapshot()
    }

    fn sample() -> Snapshot {
        let mut s = Snapshot {
            pid: 7,
            loop_id: 1,
            uptime_seconds: 12.5,
            ..Default::default()
        };
        let ls = &mut s.loop_stats;
        ls.iterations = 42;
        ls.busy_seconds = 1.5;
        ls.idle_seconds = 10.25;
        ls.interval_utilization = 0.125;
        ls.events_total = 100;
        // 500 ns x3 (bucket 496..=511), 800 us x2 (786432..=819199), 2 ms x1 (1966080..=2031615).
        ls.schedule_delay = hist(&[(500, 3), (800_000, 2), (2_000_000, 1)]);
        ls.poll_duration = hist(&[(1_500, 4)]);
        ls.events_per_poll = hist(&[(0, 5), (3, 2), (40, 1)]);
        ls.slow_polls_total = 2;
        ls.tick_drain_seconds = 0.5;
        ls.ticks_total = 9;
        ls.microtasks_total = 11;
        s.run_queue.current = 3;
        s.run_queue.mean = 0.75;
        s.run_queue.interval_max = 17;
        s.run_queue.arrivals_total = 1000;
        s.run_queue.samples = hist(&[(0, 10), (1, 4), (2, 3), (3, 2), (5000, 1)]);
        s.tasks.alive = 4;
        s.phases = vec![
            PhaseSnapshot {
                phase: "timers".into(),
                seconds: 0.25,
                callbacks: 6,
            },
            PhaseSnapshot {
                phase: "poll".into(),
                seconds: 1.0,
                callbacks: 8,
            },
        ];
        s.task_classes = vec![TaskClassSnapshot {
            name: "http:static".into(),
            spawned: 5,
            polls: 50,
            forced_yields: 1,
            poll_duration: hist(&[(2_000, 50)]),
        }];
        s.stalls = vec![
            StallReport {
                elapsed_seconds: 0.2,
                ..Default::default()
            },
            StallReport {
                elapsed_seconds: 0.75,
                ..Default::default()
            },
        ];
        s
    }

    fn has_line(text: &str, line: &str) -> bool {
        text.lines().any(|l| l == line)
    }

    #[track_caller]
    fn assert_lines(text: &str, lines: &[&str]) {
        for line in lines {
            assert!(has_line(text, line), "missing line {line:?} in:\n{text}");
        }
    }

    #[test]
    fn renders_one_snapshot() {
        let text = render(&sample());
        assert_lines(
            &text,
            &[
                "# HELP nodus_loop_iterations Loop iterations.",
                "# TYPE nodus_loop_iterations counter",
                "nodus_loop_iterations_total 42",
                "# TYPE nodus_loop_busy_seconds counter",
                "# UNIT nodus_loop_busy_seconds seconds",
                "nodus_loop_busy_seconds_total 1.5",
                "nodus_loop_idle_seconds_total 10.25",
                "nodus_loop_utilization 0.125",
                "nodus_loop_events_total 100",
                "nodus_run_queue_length 3",
                "nodus_run_queue_length_mean 0.75",
                "nodus_run_queue_length_max 17",
                "nodus_run_queue_arrivals_total 1000",
                "nodus_tasks_alive 4",
                "nodus_loop_slow_polls_total 2",
                "nodus_loop_tick_drain_seconds_total 0.5",
                "nodus_ticks_total 9",
                "nodus_microtasks_total 11",
                "nodus_stalls_recent 2",
                "nodus_stall_last_seconds 0.75",
                "nodus_uptime_seconds 12.5",
                r#"nodus_loop_phase_seconds_total{phase="timers"} 0.25"#,
                r#"nodus_loop_phase_callbacks_total{phase="poll"} 8"#,
                r#"nodus_task_polls_total{task="http:static"} 50"#,
                r#"nodus_task_forced_yields_total{task="http:static"} 1"#,
                r#"nodus_tasks_spawned_total{task="http:static"} 5"#,
                "# EOF",
            ],
        );
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn renders_histograms() {
        let text = render(&sample());
        // Schedule delay: 3 samples <= 1 us, 2 more <= 1 ms, 1 more <= 2.5 ms.
        assert_lines(
            &text,
            &[
                "# TYPE nodus_task_schedule_delay_seconds histogram",
                "# UNIT nodus_task_schedule_delay_seconds seconds",
                "nodus_task_schedule_delay_seconds_count 6",
                "nodus_task_schedule_delay_seconds_sum 0.0036015",
                r#"nodus_task_schedule_delay_seconds_bucket{le="0.000001"} 3"#,
                r#"nodus_task_schedule_delay_seconds_bucket{le="0.0005"} 3"#,
                r#"nodus_task_schedule_delay_seconds_bucket{le="0.001"} 5"#,
                r#"nodus_task_schedule_delay_seconds_bucket{le="0.0025"} 6"#,
                r#"nodus_task_schedule_delay_seconds_bucket{le="10.0"} 6"#,
                r#"nodus_task_schedule_delay_seconds_bucket{le="+Inf"} 6"#,
                // 2 us lands in 1984..=2047 ns: above 1 us, within 5 us.
                r#"nodus_task_poll_duration_seconds_bucket{le="0.000001",task="http:static"} 0"#,
                r#"nodus_task_poll_duration_seconds_bucket{le="0.000005",task="http:static"} 50"#,
                r#"nodus_task_poll_duration_seconds_count{task="http:static"} 50"#,
                "nodus_loop_poll_duration_seconds_count 4",
                // Unitless: exact below 32; 40 is in 40..=41, within le=64; 5000 only in +Inf.
                r#"nodus_run_queue_length_samples_bucket{le="0.0"} 10"#,
                r#"nodus_run_queue_length_samples_bucket{le="1.0"} 14"#,
                r#"nodus_run_queue_length_samples_bucket{le="2.0"} 17"#,
                r#"nodus_run_queue_length_samples_bucket{le="4.0"} 19"#,
                r#"nodus_run_queue_length_samples_bucket{le="4096.0"} 19"#,
                r#"nodus_run_queue_length_samples_bucket{le="+Inf"} 20"#,
                "nodus_run_queue_length_samples_sum 5016.0",
                r#"nodus_loop_events_per_poll_bucket{le="4.0"} 7"#,
                r#"nodus_loop_events_per_poll_bucket{le="32.0"} 7"#,
                r#"nodus_loop_events_per_poll_bucket{le="64.0"} 8"#,
            ],
        );
        // 21 bucket lines per `_seconds` histogram, 15 per unitless one.
        let count = |prefix: &str| text.lines().filter(|l| l.starts_with(prefix)).count();
        assert_eq!(count("nodus_task_schedule_delay_seconds_bucket{"), 21);
        assert_eq!(count("nodus_run_queue_length_samples_bucket{"), 15);
    }

    #[test]
    fn empty_snapshot_renders_zeros() {
        let text = render(&Snapshot::default());
        assert_lines(
            &text,
            &[
                "nodus_loop_iterations_total 0",
                "nodus_stall_last_seconds 0.0",
                "nodus_task_schedule_delay_seconds_count 0",
                r#"nodus_task_schedule_delay_seconds_bucket{le="+Inf"} 0"#,
            ],
        );
        // No task classes and no phases: those families are left out entirely.
        assert!(!text.contains("nodus_task_poll_duration_seconds"));
        assert!(!text.contains("nodus_loop_phase_seconds"));
    }

    #[test]
    fn one_type_line_per_family_across_workers() {
        let a = sample();
        let mut b = sample();
        b.loop_stats.iterations = 7;
        let w = |n: &str| vec![("worker".to_owned(), n.to_owned())];
        let text = render_labeled(&[(w("1"), &a), (w("2"), &b)]);

        let mut types: Vec<&str> = text.lines().filter(|l| l.starts_with("# TYPE ")).collect();
        let n = types.len();
        types.sort_unstable();
        types.dedup();
        assert_eq!(types.len(), n, "a family's TYPE line appears twice");
        assert_eq!(
            n,
            render(&a)
                .lines()
                .filter(|l| l.starts_with("# TYPE "))
                .count()
        );

        assert_lines(
            &text,
            &[
                r#"nodus_loop_iterations_total{worker="1"} 42"#,
                r#"nodus_loop_iterations_total{worker="2"} 7"#,
                r#"nodus_task_polls_total{worker="1",task="http:static"} 50"#,
                r#"nodus_task_polls_total{worker="2",task="http:static"} 50"#,
                r#"nodus_task_schedule_delay_seconds_bucket{le="0.001",worker="2"} 5"#,
                r#"nodus_task_poll_duration_seconds_count{worker="1",task="http:static"} 50"#,
            ],
        );
        // Each family's series are contiguous: worker 2's iterations follow worker 1's.
        let lines: Vec<&str> = text.lines().collect();
        let i = lines
            .iter()
            .position(|l| l.starts_with("nodus_loop_iterations_total{worker=\"1\"}"))
            .unwrap();
        assert!(lines[i + 1].starts_with("nodus_loop_iterations_total{worker=\"2\"}"));
        assert_eq!(text.matches("# EOF").count(), 1);
    }

    #[test]
    fn escapes_label_values() {
        let mut s = Snapshot::default();
        s.task_classes.push(TaskClassSnapshot {
            name: "a\"b\\c\nd".into(),
            polls: 3,
            ..Default::default()
        });
        let text = render_labeled(&[(vec![("worker".into(), "w\"1".into())], &s)]);
        assert_lines(
            &text,
            &[r#"nodus_task_polls_total{worker="w\"1",task="a\"b\\c\nd"} 3"#],
        );
    }

    #[test]
    fn renders_pools_with_a_pool_label() {
        let mut s = sample();
        for (name, completed) in [("io", 1600), ("cpu", 3)] {
            s.pools.push(PoolSnapshot {
                pool: name.into(),
                threads: 4,
                queue_depth: 2,
                busy_threads: 1,
                completed_total: completed,
                queue_wait: hist(&[(500, 2)]),
                run: hist(&[(800_000, 1)]),
                ..Default::default()
            });
        }
        let text = render(&s);
        assert_lines(
            &text,
            &[
                "# TYPE nodus_pool_queue_depth gauge",
                r#"nodus_pool_queue_depth{pool="io"} 2"#,
                r#"nodus_pool_busy_threads{pool="cpu"} 1"#,
                r#"nodus_pool_threads{pool="io"} 4"#,
                "# TYPE nodus_pool_completed counter",
                r#"nodus_pool_completed_total{pool="io"} 1600"#,
                r#"nodus_pool_completed_total{pool="cpu"} 3"#,
                "# TYPE nodus_pool_queue_wait_seconds histogram",
                r#"nodus_pool_queue_wait_seconds_bucket{le="0.000001",pool="io"} 2"#,
                r#"nodus_pool_queue_wait_seconds_count{pool="cpu"} 2"#,
                r#"nodus_pool_run_seconds_bucket{le="0.001",pool="io"} 1"#,
                r#"nodus_pool_run_seconds_count{pool="io"} 1"#,
            ],
        );
        // Without pools, no pool family is written.
        assert!(!render(&sample()).contains("nodus_pool_"));
    }

    #[test]
    fn collector_registers_in_a_larger_registry() {
        let s = sample();
        let mut registry = Registry::default();
        registry.register_collector(Box::new(SnapshotCollector::new(&[(vec![], &s)])));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert_eq!(text, render(&s));
    }
}
