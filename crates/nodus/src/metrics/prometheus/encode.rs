//! The collected data and how it is written: owned families of series (`Family`, `Series`,
//! `Value`), the conversion of the snapshots' sparse histograms to fixed `le` buckets, and the
//! `prometheus_client` `Collector` implementation that encodes them.
//!
//! Invariants:
//! - A family's `kind` and each of its values' variant always match (`encode_value` relies on it).
//! - Histogram bucket counts are non-cumulative (the encoder accumulates them), `+Inf` last;
//!   every count is exact: an `le` is a bucket edge of the snapshots' histograms, so each
//!   sparse bucket lies wholly at or below it or wholly above it. Their running total never
//!   passes `u64::MAX` (it is capped there: a snapshot from another process may carry any
//!   counts, and the encoder's sum must not overflow).
//! - A family with no series is not written at all.

use std::sync::LazyLock;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Unit;

use super::SnapshotCollector;
use super::families::Kind;
use crate::metrics::histogram::nearest_upper_bound;
use crate::metrics::snapshot::HistogramSnapshot;

#[derive(Debug)]
pub(super) struct Family {
    pub(super) name: &'static str,
    pub(super) help: &'static str,
    /// The name's suffix the encoder appends, with its `# UNIT` line.
    pub(super) unit: Option<&'static Unit>,
    pub(super) kind: Kind,
    pub(super) series: Vec<Series>,
}

#[derive(Debug)]
pub(super) struct Series {
    pub(super) labels: Vec<(String, String)>,
    pub(super) value: Value,
}

#[derive(Debug)]
pub(super) enum Value {
    Int(u64),
    Float(f64),
    /// Non-cumulative counts per `le` (the encoder accumulates them), `+Inf` last.
    Histogram {
        sum: f64,
        count: u64,
        buckets: Vec<(f64, u64)>,
    },
}

/// The bounds `_seconds` histograms are wanted at, in ns: 1 µs … 10 s.
const SECONDS_WANTED: [u64; 20] = [
    1_000,
    5_000,
    10_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
];

/// The bounds unitless histograms are wanted at: 0, then powers of two up to 4096.
const UNITLESS_WANTED: [u64; 14] = {
    let mut le = [0; 14];
    let mut i = 1;
    while i < le.len() {
        le[i] = 1 << (i - 1);
        i += 1;
    }
    le
};

/// `le` bounds of `_seconds` histograms, (seconds, nanoseconds): the bucket edges nearest the
/// wanted ones (`nearest_upper_bound`), 0.000000991 … 10.200547327 s.
static SECONDS_LE: LazyLock<[(f64, u64); 20]> =
    LazyLock::new(|| SECONDS_WANTED.map(|v| edge(v, 1e9)));

/// `le` bounds of unitless histograms: the bucket edges nearest the wanted ones, 0, 1, 2, 4, 8,
/// 16, 31, 63 … 4095 (below 32 every value has a bucket of its own).
static UNITLESS_LE: LazyLock<[(f64, u64); 14]> =
    LazyLock::new(|| UNITLESS_WANTED.map(|v| edge(v, 1.0)));

/// The bucket edge nearest `wanted`, as (value in the exposition's unit, value recorded).
fn edge(wanted: u64, per_unit: f64) -> (f64, u64) {
    let bound = nearest_upper_bound(wanted);
    (bound as f64 / per_unit, bound)
}

/// Converts sparse buckets to per-`le` counts (non-cumulative; `+Inf` last).
fn histogram(h: &HistogramSnapshot, les: &[(f64, u64)], seconds: bool) -> Value {
    let mut counts = vec![0u64; les.len() + 1];
    for &(upper, c) in &h.buckets {
        // First `le` at or above the bucket's upper bound; past the end means `+Inf`.
        let i = les.partition_point(|&(_, le)| le < upper);
        counts[i] = counts[i].saturating_add(c);
    }
    // The encoder adds the counts up with `+`: the running total is capped at `u64::MAX` here
    // (the last counts shrink), so it cannot overflow, whatever a snapshot from a worker says.
    let mut count = 0u64;
    for c in &mut counts {
        let total = count.saturating_add(*c);
        *c = total - count;
        count = total;
    }
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

pub(super) fn seconds_histogram(h: &HistogramSnapshot) -> Value {
    histogram(h, &*SECONDS_LE, true)
}

pub(super) fn unitless_histogram(h: &HistogramSnapshot) -> Value {
    histogram(h, &*UNITLESS_LE, false)
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
            let mut metric = encoder.encode_descriptor(f.name, f.help, f.unit, metric_type)?;
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
