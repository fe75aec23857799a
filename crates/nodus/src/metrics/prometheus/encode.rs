//! The collected data and how it is written: owned families of series (`Family`, `Series`,
//! `Value`), the conversion of the snapshots' sparse histograms to fixed `le` buckets, and the
//! `prometheus_client` `Collector` implementation that encodes them.
//!
//! Invariants:
//! - A family's `kind` and each of its values' variant always match (`encode_value` relies on it).
//! - Histogram bucket counts are non-cumulative (the encoder accumulates them), `+Inf` last;
//!   `_count`, `+Inf` and `_sum` are exact, an `le` bucket is approximate as described in the
//!   parent module. Their running total never passes `u64::MAX` (it is capped there: a snapshot
//!   from another process may carry any counts, and the encoder's sum must not overflow).
//! - A family with no series is not written at all.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Unit;

use super::SnapshotCollector;
use super::families::Kind;
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
    histogram(h, &SECONDS_LE, true)
}

pub(super) fn unitless_histogram(h: &HistogramSnapshot) -> Value {
    histogram(h, &UNITLESS_LE, false)
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
