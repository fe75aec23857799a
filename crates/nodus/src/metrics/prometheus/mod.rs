//! Prometheus exposition of [`Snapshot`]s, through the `prometheus-client` crate's encoder.
//!
//! The text is never written by hand: [`SnapshotCollector`] turns snapshots into owned families
//! of series at render time, implements `prometheus_client`'s `Collector`, and is encoded by
//! `prometheus_client::encoding::text::encode` from a `Registry` built for the one render.
//! The crate writes the OpenMetrics text format (`# HELP`/`# TYPE`/`# UNIT`, `_total` on
//! counter samples, a closing `# EOF`, label values escaped); serve it with [`CONTENT_TYPE`].
//! (Read as text format 0.0.4 it still parses, but a counter's `# TYPE` names `x` while its
//! sample is `x_total`, so the type is lost: for a client that does not ask for OpenMetrics,
//! [`to_classic`] rewrites the metadata into that format, served with [`CLASSIC_CONTENT_TYPE`].)
//!
//! Names carry the `nodus_` prefix and base units: durations are `_seconds` (histogram values
//! are nanoseconds, divided by 1e9), sizes `_bytes`, each with its `# UNIT` line; counters end
//! in `_total`. One `# HELP`/`# TYPE` is written
//! per family, followed by all of its series, so [`render_labeled`] can put several snapshots
//! (a cluster's workers, each with a `worker` label) in one exposition.
//!
//! What a snapshot holds that no family carries (the lifetime utilization, which the busy and
//! idle counters give; the loop's task totals, sums of the per-task series; histograms' lifetime
//! min, max and quantiles; each stall's task, location and class; the pid, loop id and time of
//! the snapshot) is said in the HELP of the family nearest to it and in the README.
//!
//! Histogram buckets are fixed and derived from the snapshot's sparse log-linear buckets: each
//! `le` is the edge of those buckets nearest a round bound (1 µs, 5 µs, 10 µs … 10 s for
//! `_seconds`, 0, 1, 2, 4, … 4096 for unitless ones; `histogram::nearest_upper_bound`), so
//! no sparse bucket straddles an `le` and every count is exact: a sample is counted in an `le`
//! exactly when its value is `<=` it. The price is bounds that are not round: `le="0.100663295"`
//! rather than `0.1` (within 3.1 %, most within 2.4 %; 0.000000991, 0.000005119 … 10.200547327
//! s, and 0, 1, 2, 4, 8, 16, 31, 63 … 4095). Rounder bounds would need the recording hot path
//! to split the buckets that straddle them (a compare and a counter per sample): the always-on
//! cost stays the same this way. `_count`, the `+Inf` bucket and `_sum` are exact too.
//!
//! Layout: this file holds the entry points and `SnapshotCollector`, which maps each snapshot
//! field to a family; `families` names and describes every family (one constant each); `encode`
//! holds the owned series, the histogram bucket conversion and the `Collector` encoding;
//! `classic` the rewrite into text format 0.0.4 and the `Accept` check.

mod classic;
mod encode;
mod families;
#[cfg(test)]
mod tests;

use prometheus_client::registry::Registry;

use super::snapshot::Snapshot;
use crate::watchdog::StallClass;
use encode::{Family, Series, Value, seconds_histogram, unitless_histogram};
use families::*;

pub use classic::{CLASSIC_CONTENT_TYPE, prefers_openmetrics, to_classic};

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
                    unit: d.unit,
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
        self.push(&RUN_QUEUE_MEAN, base(), Value::Float(rq.interval_mean));
        self.push(&RUN_QUEUE_MAX, base(), Value::Int(rq.interval_max));
        self.push(&RUN_QUEUE_LIFETIME_MAX, base(), Value::Int(rq.max));
        self.push(&RUN_QUEUE_SAMPLES, base(), unitless_histogram(&rq.samples));
        self.push(&RUN_QUEUE_ARRIVALS, base(), Value::Int(rq.arrivals_total));
        self.push(&RUN_QUEUE_WAIT, base(), Value::Float(rq.wait_seconds));
        self.push(&BUSY, base(), Value::Float(ls.busy_seconds));
        self.push(&IDLE, base(), Value::Float(ls.idle_seconds));
        self.push(&UTILIZATION, base(), Value::Float(ls.interval_utilization));
        self.push(&INTERVAL, base(), Value::Float(ls.interval_seconds));
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
            self.push(&TASK_PANICS, with("task", &t.name), Value::Int(t.panics));
            self.push(&TASKS_SPAWNED, with("task", &t.name), Value::Int(t.spawned));
        }
        self.push(&TASKS_ALIVE, base(), Value::Int(s.tasks.alive));
        self.push(&SLOW_POLLS, base(), Value::Int(ls.slow_polls_total));
        let threshold = Value::Float(ls.slow_poll_threshold_seconds);
        self.push(&SLOW_POLL_THRESHOLD, base(), threshold);
        self.push(&TICK_DRAIN, base(), Value::Float(ls.tick_drain_seconds));
        self.push(&TICKS, base(), Value::Int(ls.ticks_total));
        self.push(&MICROTASKS, base(), Value::Int(ls.microtasks_total));
        for class in StallClass::ALL {
            let v = Value::Int(s.stalls_total.get(class));
            self.push(&STALLS, with("class", class.as_str()), v);
        }
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
        self.push(&HTTP_CONNECTIONS_MAX, base(), Value::Int(h.connections_max));
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
            self.push(&POOL_CANCELLED, pool(), Value::Int(p.cancelled_total));
            self.push(&POOL_REJECTED, pool(), Value::Int(p.rejected_total));
            self.push(&POOL_PANICKED, pool(), Value::Int(p.panicked_total));
        }
    }
}
