//! A fixed-memory log-linear histogram of `u64` values (nanosecond durations, queue lengths).
//!
//! `record` runs on the event loop's hot path several times per loop turn, so it is a handful
//! of integer instructions: an `or`, a `leading_zeros`, two shifts, an add and a clamp to find
//! the bucket, then one increment and the count/sum/min/max updates: under 30 x86-64
//! instructions, no allocation, no floating point, no branch at all (the clamps are conditional
//! moves and the clamp proves the index in bounds). This is the layout HdrHistogram and
//! tokio's H2 histogram use.
//!
//! Bucket layout (`SUB_BITS = 4`, so 16 linear sub-buckets per power of two):
//! - values `0..32` get one bucket each (exact);
//! - a value `v` in `[2^k, 2^(k+1))`, `k >= 5`, goes in one of 16 equal buckets of width
//!   `2^(k-4)`, so a bucket is never wider than 1/16 of its lower bound. The representative
//!   value reported for a bucket is its midpoint, within 1/32 (3.1 %) of every value in it;
//! - values `>= 2^42` (about 73 minutes in ns) share one overflow bucket, reported with the
//!   exact `max` as its representative and `u64::MAX` as its upper bound.
//!
//! That is [`BUCKETS`] = 625 counters, 5,000 bytes inline, plus count/sum/min/max: about 5 KB,
//! allocated once, never growing with uptime.
//!
//! Invariants: `count` is the sum of the bucket counters; `min`/`max` are the exact extremes of
//! the recorded values (`min` is `u64::MAX` while empty); `sum` saturates at `u64::MAX`.
//!
//! [`HistogramSnapshot`] is the sparse, serde form (non-empty buckets as `(inclusive upper
//! bound, count)`), sent from cluster workers to the primary; `Histogram::from_snapshot` maps
//! each upper bound back to its bucket, so a snapshot round-trips to the same counters.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Linear sub-buckets per power of two, as a bit count.
const SUB_BITS: u32 = 4;
/// Linear sub-buckets per power of two.
const SUB: usize = 1 << SUB_BITS;
/// Values below this each have their own bucket.
const EXACT_BELOW: u64 = 2 * SUB as u64;
/// Bits of magnitude tracked with full precision: values `>= 2^MAX_BITS` overflow.
const MAX_BITS: u32 = 42;
/// The smallest value that goes in the overflow bucket.
pub const OVERFLOW_AT: u64 = 1 << MAX_BITS;
/// Number of buckets: 16 per power of two from `2^4` to `2^41`, plus 16 exact ones below 16
/// and the overflow bucket.
pub const BUCKETS: usize = (MAX_BITS - SUB_BITS + 1) as usize * SUB + 1;
/// Index of the overflow bucket.
const OVERFLOW: usize = BUCKETS - 1;

/// Bucket index of `value`: always `< BUCKETS`.
#[inline(always)]
fn bucket_index(value: u64) -> usize {
    // `shift` is 0 for values < 32 (so those buckets are exact), else log2(value) - 4;
    // `value >> shift` is then in 16..32: the leading 1 and the 4 sub-bucket bits.
    let shift = (63 - (value | (EXACT_BELOW - 1)).leading_zeros()) - SUB_BITS;
    let index = ((shift as usize) << SUB_BITS) + (value >> shift) as usize;
    // The index grows with the value, so clamping it (rather than the value) sends everything
    // from 2^42 up to the overflow bucket, and lets the compiler drop the bounds check.
    index.min(OVERFLOW)
}

/// Smallest value that lands in bucket `i`.
fn bucket_lower(i: usize) -> u64 {
    if i < EXACT_BELOW as usize {
        i as u64
    } else {
        let shift = (i >> SUB_BITS) - 1;
        (((i & (SUB - 1)) + SUB) as u64) << shift
    }
}

/// Largest value that lands in bucket `i` (inclusive).
fn bucket_upper(i: usize) -> u64 {
    if i == OVERFLOW {
        u64::MAX
    } else if i < EXACT_BELOW as usize {
        i as u64
    } else {
        bucket_lower(i) + (1u64 << ((i >> SUB_BITS) - 1)) - 1
    }
}

/// The inclusive upper bound of a bucket nearest `v` (the lower one of a tie): the `le` an
/// exposition gives for a wanted bound `v`. No bucket straddles it, so the values counted at or
/// below it from the buckets are exactly the values `<=` it. Within 1/32 (3.1 %) of `v`, as
/// buckets are at most 1/16 of their lower bound wide; `v` itself below 32 (exact buckets).
pub(crate) fn nearest_upper_bound(v: u64) -> u64 {
    let i = bucket_index(v);
    let upper = bucket_upper(i);
    if v == upper || i == 0 {
        return upper;
    }
    // The previous bucket's upper bound.
    let below = bucket_lower(i) - 1;
    if v - below <= upper - v { below } else { upper }
}

/// A fixed-memory log-linear histogram; see the module docs for the layout.
#[derive(Clone)]
pub struct Histogram {
    counts: [u64; BUCKETS],
    count: u64,
    sum: u64,
    /// `u64::MAX` while empty.
    min: u64,
    max: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for Histogram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Histogram")
            .field("count", &self.count)
            .field("sum", &self.sum)
            .field("min", &self.min())
            .field("max", &self.max)
            .field("p50", &self.value_at_quantile(0.5))
            .field("p99", &self.value_at_quantile(0.99))
            .finish_non_exhaustive()
    }
}

impl Histogram {
    /// An empty histogram (about 5 KB, inline: box or embed it, it never allocates).
    pub fn new() -> Self {
        Self {
            counts: [0; BUCKETS],
            count: 0,
            sum: 0,
            min: u64::MAX,
            max: 0,
        }
    }

    /// Records one value. Hot path: no allocation, no floating point, no branches.
    #[inline]
    pub fn record(&mut self, value: u64) {
        // Wrapping: never reached in practice, and keeps debug builds free of overflow checks.
        let slot = &mut self.counts[bucket_index(value)];
        *slot = slot.wrapping_add(1);
        self.count = self.count.wrapping_add(1);
        self.sum = self.sum.saturating_add(value);
        self.min = self.min.min(value);
        self.max = self.max.max(value);
    }

    /// Records `value` `n` times (`n == 0` is a no-op).
    pub fn record_n(&mut self, value: u64, n: u64) {
        if n == 0 {
            return;
        }
        let slot = &mut self.counts[bucket_index(value)];
        *slot = slot.saturating_add(n);
        self.count = self.count.saturating_add(n);
        self.sum = self.sum.saturating_add(value.saturating_mul(n));
        self.min = self.min.min(value);
        self.max = self.max.max(value);
    }

    /// Number of recorded values.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Sum of the recorded values, saturating at `u64::MAX`.
    pub fn sum(&self) -> u64 {
        self.sum
    }

    /// Exact smallest recorded value; 0 when empty.
    pub fn min(&self) -> u64 {
        if self.count == 0 { 0 } else { self.min }
    }

    /// Exact largest recorded value; 0 when empty.
    pub fn max(&self) -> u64 {
        self.max
    }

    /// Arithmetic mean (from the exact sum unless it saturated); 0.0 when empty.
    pub fn mean(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum as f64 / self.count as f64
        }
    }

    /// The value at quantile `q` (clamped to `[0, 1]`): the representative value of the bucket
    /// holding the `ceil(q * count)`-th smallest value, clamped to `[min, max]`. `q == 0` gives
    /// the exact min, `q == 1` the exact max; 0 when empty.
    pub fn value_at_quantile(&self, q: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        if q <= 0.0 || q.is_nan() {
            return self.min;
        }
        if q >= 1.0 {
            return self.max;
        }
        let rank = ((q * self.count as f64).ceil() as u64).clamp(1, self.count);
        let mut seen = 0u64;
        for (i, &c) in self.counts.iter().enumerate() {
            seen = seen.saturating_add(c);
            if seen >= rank {
                // Not `clamp`, which panics if a corrupt snapshot gave min > max.
                return self.representative(i).max(self.min).min(self.max);
            }
        }
        // Only reachable if the counters disagree with `count` (a corrupt snapshot).
        self.max
    }

    /// The value reported for bucket `i`: its midpoint, or the exact max for the overflow bucket.
    fn representative(&self, i: usize) -> u64 {
        if i == OVERFLOW {
            self.max
        } else {
            let lo = bucket_lower(i);
            lo + (bucket_upper(i) - lo) / 2
        }
    }

    /// Adds `other`'s values to `self` (saturating).
    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a = a.saturating_add(*b);
        }
        self.count = self.count.saturating_add(other.count);
        self.sum = self.sum.saturating_add(other.sum);
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
    }

    /// Back to empty, keeping the memory.
    pub fn reset(&mut self) {
        self.counts.fill(0);
        self.count = 0;
        self.sum = 0;
        self.min = u64::MAX;
        self.max = 0;
    }

    /// The sparse, serializable form, with p50/p90/p99/p999 precomputed.
    pub fn snapshot(&self) -> HistogramSnapshot {
        let buckets = self
            .counts
            .iter()
            .enumerate()
            .filter(|&(_, &c)| c != 0)
            .map(|(i, &c)| (bucket_upper(i), c))
            .collect();
        HistogramSnapshot {
            count: self.count,
            sum: self.sum,
            min: self.min(),
            max: self.max,
            mean: self.mean(),
            p50: self.value_at_quantile(0.5),
            p90: self.value_at_quantile(0.9),
            p99: self.value_at_quantile(0.99),
            p999: self.value_at_quantile(0.999),
            buckets,
        }
    }

    /// Rebuilds a histogram from its snapshot: each `(upper bound, count)` goes back to the bucket
    /// holding that bound (any value is accepted, so foreign bounds land in the bucket that
    /// contains them). `count` is recomputed from the buckets so the invariant holds even for
    /// an inconsistent snapshot; `sum`, `min` and `max` are taken as given.
    pub fn from_snapshot(s: &HistogramSnapshot) -> Histogram {
        let mut h = Histogram::new();
        for &(upper, c) in &s.buckets {
            let slot = &mut h.counts[bucket_index(upper)];
            *slot = slot.saturating_add(c);
            h.count = h.count.saturating_add(c);
        }
        if h.count != 0 {
            h.sum = s.sum;
            h.min = s.min;
            h.max = s.max;
        }
        h
    }
}

/// Serializable, sparse form. Also what the cluster primary receives from workers, so it must
/// round-trip: `Histogram::from_snapshot(&h.snapshot())` gives back the same counts. Read
/// across builds: a field absent is zero, and buckets are named by their upper bound, so a
/// build with another bucket layout is read right (`snapshot.rs`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct HistogramSnapshot {
    pub count: u64,
    pub sum: u64,
    pub min: u64,
    pub max: u64,
    pub mean: f64,
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
    pub p999: u64,
    /// Non-empty buckets only, ascending: (inclusive upper bound of the bucket, count in it).
    pub buckets: Vec<(u64, u64)>,
}

impl HistogramSnapshot {
    /// Adds `other`'s values to `self` (via `Histogram`, so quantiles are recomputed).
    pub fn merge(&mut self, other: &HistogramSnapshot) {
        let mut h = Histogram::from_snapshot(self);
        h.merge(&Histogram::from_snapshot(other));
        *self = h.snapshot();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every bound `nearest_upper_bound` gives is a bucket edge: the bucket holding it ends
    /// there, so no bucket holds values on both sides. It is the nearest edge to the wanted
    /// value, within 1/32 of it.
    #[test]
    fn nearest_upper_bounds_are_bucket_edges_near_the_wanted_value() {
        let wanted = (0..64u64)
            .chain((5..41).flat_map(|k| [1u64 << k, 3 << (k - 1), 1000 << k, 2500 << k]))
            .chain([1_000, 5_000, 100_000_000, 10_000_000_000])
            .filter(|&v| v < OVERFLOW_AT / 2);
        for v in wanted {
            let b = nearest_upper_bound(v);
            assert_eq!(
                bucket_upper(bucket_index(b)),
                b,
                "{b} (for {v}) ends its bucket"
            );
            assert!(
                bucket_index(b + 1) == bucket_index(b) + 1,
                "{b} + 1 starts the next bucket"
            );
            assert!(b.abs_diff(v) * 32 <= v, "{b} is within 1/32 of {v}");
            let i = bucket_index(v);
            let edges = [bucket_upper(i), bucket_lower(i).saturating_sub(1)];
            assert!(
                edges.iter().all(|e| b.abs_diff(v) <= e.abs_diff(v)),
                "{b} is the nearest edge to {v} ({edges:?})"
            );
        }
        assert_eq!(nearest_upper_bound(100_000_000), 100_663_295);
        assert_eq!(nearest_upper_bound(1_000), 991);
        assert_eq!(nearest_upper_bound(16), 16);
        assert_eq!(nearest_upper_bound(64), 63);
    }

    /// Tiny deterministic xorshift64* generator (no extra dependencies).
    struct XorShift(u64);
    impl XorShift {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        /// Values spread over all magnitudes: a random word shifted right by 0..64 bits.
        fn any_magnitude(&mut self) -> u64 {
            let x = self.next();
            x >> (self.next() % 64)
        }
    }

    /// The exact `ceil(q * n)`-th smallest value, matching `value_at_quantile`'s rank.
    fn exact_quantile(sorted: &[u64], q: f64) -> u64 {
        let n = sorted.len() as u64;
        let rank = ((q * n as f64).ceil() as u64).clamp(1, n);
        sorted[(rank - 1) as usize]
    }

    fn assert_close(got: u64, want: u64, what: &str) {
        // Midpoint representative: within 1/32 of any value in the bucket.
        let err = got.abs_diff(want) as f64;
        assert!(
            err <= want as f64 / 32.0,
            "{what}: got {got}, want {want} (rel err {})",
            err / want as f64
        );
    }

    fn assert_same(a: &Histogram, b: &Histogram) {
        assert_eq!(a.counts[..], b.counts[..]);
        assert_eq!(
            (a.count(), a.sum(), a.min(), a.max()),
            (b.count(), b.sum(), b.min(), b.max())
        );
    }

    #[test]
    fn layout_and_memory() {
        assert_eq!(BUCKETS, 625);
        assert_eq!(bucket_index(0), 0);
        assert_eq!(bucket_index(31), 31);
        assert_eq!(bucket_index(OVERFLOW_AT - 1), OVERFLOW - 1);
        assert_eq!(bucket_index(OVERFLOW_AT), OVERFLOW);
        assert_eq!(bucket_index(u64::MAX), OVERFLOW);
        assert!(std::mem::size_of::<Histogram>() <= 5_100);
        // Buckets tile the u64 range with no gaps or overlaps, and each maps to itself.
        assert_eq!(bucket_lower(0), 0);
        for i in 0..BUCKETS {
            assert!(bucket_lower(i) <= bucket_upper(i));
            assert_eq!(bucket_index(bucket_lower(i)), i, "lower of {i}");
            assert_eq!(bucket_index(bucket_upper(i)), i, "upper of {i}");
            if i + 1 < BUCKETS {
                assert_eq!(bucket_upper(i) + 1, bucket_lower(i + 1), "gap after {i}");
            }
            if i < OVERFLOW {
                // Width at most 1/16 of the lower bound (exact buckets have width 1).
                let width = bucket_upper(i) - bucket_lower(i) + 1;
                assert!(width == 1 || width * 16 <= bucket_lower(i), "width of {i}");
            }
        }
        assert_eq!(bucket_upper(OVERFLOW), u64::MAX);
    }

    #[test]
    fn empty() {
        let h = Histogram::new();
        assert_eq!((h.count(), h.sum(), h.min(), h.max()), (0, 0, 0, 0));
        assert_eq!(h.mean(), 0.0);
        assert_eq!(h.value_at_quantile(0.5), 0);
        assert_eq!(h.snapshot(), HistogramSnapshot::default());
        assert_same(&Histogram::from_snapshot(&h.snapshot()), &h);
    }

    #[test]
    fn exact_count_sum_min_max() {
        let mut h = Histogram::default();
        for v in [17, 3, 1_000_003, 999, 42] {
            h.record(v);
        }
        assert_eq!(h.count(), 5);
        assert_eq!(h.sum(), 17 + 3 + 1_000_003 + 999 + 42);
        assert_eq!(h.min(), 3);
        assert_eq!(h.max(), 1_000_003);
        assert_eq!(h.mean(), h.sum() as f64 / 5.0);
        assert_eq!(h.value_at_quantile(0.0), 3);
        assert_eq!(h.value_at_quantile(1.0), 1_000_003);
        assert_eq!(h.value_at_quantile(f64::NAN), 3);
        assert_eq!(h.value_at_quantile(7.0), 1_000_003);
    }

    #[test]
    fn quantiles_uniform() {
        let mut h = Histogram::new();
        let values: Vec<u64> = (1..=1_000_000).collect();
        for &v in &values {
            h.record(v);
        }
        for q in [
            0.0, 0.001, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999, 0.9999, 1.0,
        ] {
            assert_close(
                h.value_at_quantile(q),
                exact_quantile(&values, q),
                &format!("q={q}"),
            );
        }
        assert_eq!(h.value_at_quantile(0.0), 1);
        assert_eq!(h.value_at_quantile(1.0), 1_000_000);
        let s = h.snapshot();
        assert_close(s.p50, 500_000, "p50");
        assert_close(s.p90, 900_000, "p90");
        assert_close(s.p99, 990_000, "p99");
        assert_close(s.p999, 999_000, "p999");
        assert_eq!(s.mean, 500_000.5);
    }

    #[test]
    fn quantiles_constant() {
        let mut h = Histogram::new();
        h.record_n(123_456_789, 1000);
        for q in [0.0, 0.5, 0.9, 0.99, 0.999, 1.0] {
            // Clamping to [min, max] makes a constant exact.
            assert_eq!(h.value_at_quantile(q), 123_456_789);
        }
        assert_eq!(h.sum(), 123_456_789_000);
    }

    #[test]
    fn quantiles_powers_of_two() {
        let mut h = Histogram::new();
        let values: Vec<u64> = (0..MAX_BITS).map(|k| 1u64 << k).collect();
        for &v in &values {
            h.record(v);
        }
        assert_eq!(h.snapshot().buckets.len(), values.len());
        for (i, &v) in values.iter().enumerate() {
            // Mid-rank q, so float rounding in `q * count` cannot move the rank.
            let q = (i as f64 + 0.5) / values.len() as f64;
            assert_close(h.value_at_quantile(q), v, &format!("2^{i}"));
        }
        assert_eq!(h.max(), 1 << (MAX_BITS - 1));
    }

    #[test]
    fn zeros_and_small_values_are_exact() {
        let mut h = Histogram::new();
        h.record_n(0, 10);
        assert_eq!(h.value_at_quantile(0.5), 0);
        assert_eq!((h.min(), h.max(), h.sum(), h.count()), (0, 0, 0, 10));
        assert_eq!(h.snapshot().buckets, vec![(0, 10)]);

        let mut h = Histogram::new();
        for v in 0..32 {
            h.record(v);
        }
        for v in 0..32u64 {
            assert_eq!(h.value_at_quantile((v as f64 + 0.5) / 32.0), v);
        }
    }

    #[test]
    fn huge_values() {
        let mut h = Histogram::new();
        h.record(OVERFLOW_AT - 1);
        h.record(OVERFLOW_AT);
        h.record(1 << 50);
        h.record(u64::MAX);
        assert_eq!(h.count(), 4);
        assert_eq!(h.sum(), u64::MAX, "sum saturates");
        assert_eq!(h.max(), u64::MAX);
        assert_eq!(h.min(), OVERFLOW_AT - 1);
        assert_eq!(h.counts[OVERFLOW], 3);
        assert_eq!(h.value_at_quantile(1.0), u64::MAX);
        // The overflow bucket reports the exact max.
        assert_eq!(h.value_at_quantile(0.5), u64::MAX);
        assert_close(
            h.value_at_quantile(0.25),
            OVERFLOW_AT - 1,
            "top regular bucket",
        );
        let s = h.snapshot();
        assert_eq!(s.buckets.last(), Some(&(u64::MAX, 3)));
        assert_same(&Histogram::from_snapshot(&s), &h);

        let mut h = Histogram::new();
        h.record_n(1 << 50, 3);
        assert_eq!(h.value_at_quantile(0.5), 1 << 50, "clamped to min = max");
        h.record_n(u64::MAX, u64::MAX);
        assert_eq!(h.count(), u64::MAX, "count saturates in record_n");
    }

    #[test]
    fn record_n_matches_record() {
        let mut a = Histogram::new();
        let mut b = Histogram::new();
        for v in [5, 5_000, 5_000_000] {
            a.record_n(v, 7);
            for _ in 0..7 {
                b.record(v);
            }
        }
        a.record_n(1, 0);
        assert_same(&a, &b);
    }

    #[test]
    fn merge_and_reset() {
        let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
        let mut all = Histogram::new();
        let mut a = Histogram::new();
        let mut b = Histogram::new();
        for i in 0..10_000 {
            let v = rng.any_magnitude();
            all.record(v);
            let part = if i % 3 == 0 { &mut a } else { &mut b };
            part.record(v);
        }
        let mut merged = a.clone();
        merged.merge(&b);
        assert_same(&merged, &all);

        // Merging with an empty histogram, either way round, changes nothing.
        let mut e = Histogram::new();
        e.merge(&all);
        assert_same(&e, &all);
        e.merge(&Histogram::new());
        assert_same(&e, &all);

        e.reset();
        assert_same(&e, &Histogram::new());
        assert_eq!(e.value_at_quantile(0.5), 0);
    }

    #[test]
    fn snapshot_round_trip() {
        let mut rng = XorShift(12345);
        let mut h = Histogram::new();
        for _ in 0..50_000 {
            h.record(rng.any_magnitude());
        }
        h.record(0);
        let s = h.snapshot();
        assert!(s.buckets.windows(2).all(|w| w[0].0 < w[1].0), "ascending");
        assert!(s.buckets.iter().all(|&(_, c)| c != 0), "sparse");
        assert_eq!(s.buckets.iter().map(|b| b.1).sum::<u64>(), s.count);

        let back = Histogram::from_snapshot(&s);
        assert_same(&back, &h);
        assert_eq!(back.snapshot(), s);

        let json = serde_json::to_string(&s).unwrap();
        let de: HistogramSnapshot = serde_json::from_str(&json).unwrap();
        assert_eq!(de, s);
    }

    #[test]
    fn snapshot_merge() {
        let mut a = Histogram::new();
        let mut b = Histogram::new();
        for v in 0..1000u64 {
            a.record(v * v);
            b.record(v * 1_000_003);
        }
        let mut s = a.snapshot();
        s.merge(&b.snapshot());
        a.merge(&b);
        assert_eq!(s, a.snapshot());

        let mut empty = HistogramSnapshot::default();
        empty.merge(&HistogramSnapshot::default());
        assert_eq!(empty, HistogramSnapshot::default());
    }

    #[test]
    fn from_inconsistent_snapshot() {
        // A foreign bound lands in the bucket containing it; count follows the buckets.
        let s = HistogramSnapshot {
            count: 99,
            sum: 1000,
            min: 100,
            max: 900,
            buckets: vec![(100, 1), (900, 1)],
            ..Default::default()
        };
        let h = Histogram::from_snapshot(&s);
        assert_eq!(h.count(), 2);
        assert_eq!(h.counts[bucket_index(100)], 1);
        assert_eq!(h.counts[bucket_index(900)], 1);
        assert_eq!((h.sum(), h.min(), h.max()), (1000, 100, 900));

        // min > max from a bad peer must not panic.
        let s = HistogramSnapshot {
            min: 900,
            max: 100,
            ..s
        };
        let h = Histogram::from_snapshot(&s);
        assert_eq!(h.value_at_quantile(0.5), 100);
        let _ = h.snapshot();
    }

    #[test]
    fn random_values_land_in_their_bucket() {
        let mut rng = XorShift(0xDEAD_BEEF_CAFE_F00D);
        let mut h = Histogram::new();
        let mut values = Vec::with_capacity(200_000);
        for _ in 0..200_000 {
            let v = rng.any_magnitude();
            let i = bucket_index(v);
            assert!(i < BUCKETS);
            assert!(
                bucket_lower(i) <= v && v <= bucket_upper(i),
                "{v} outside bucket {i} [{}, {}]",
                bucket_lower(i),
                bucket_upper(i)
            );
            h.record(v);
            values.push(v);
        }
        values.sort_unstable();
        assert_eq!(h.min(), values[0]);
        assert_eq!(h.max(), *values.last().unwrap());
        for q in [0.01, 0.1, 0.5, 0.9, 0.99] {
            let want = exact_quantile(&values, q);
            if want < OVERFLOW_AT {
                assert_close(h.value_at_quantile(q), want, &format!("q={q}"));
            }
        }
    }
}
