//! `Range: bytes=...` request headers (RFC 9110 section 14), evaluated against a length.
//!
//! Policy, chosen to be simple and safe rather than complete:
//! - one `bytes` range (`a-b`, `a-`, `-n`) → that range (206), clamped to the length;
//! - a single range that starts at or past the end, or `-0` → unsatisfiable (416);
//! - several ranges → the whole representation (200): RFC 9110 lets a server ignore `Range`,
//!   and serving `multipart/byteranges` is an amplification vector for little benefit;
//! - anything malformed (unknown unit, `5-2`, signs, junk) → ignored (200), as RFC 9110 advises;
//! - an empty representation cannot carry a 206, so a suffix range on it is served whole (200).
//!
//! Pure arithmetic on `u64`: huge sparse files need no special casing, and numbers too large for
//! a `u64` saturate (so they mean "past the end") instead of overflowing.

use std::ops::Range;

/// What a `Range` header asks of a representation `len` bytes long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RangeOutcome {
    /// Serve everything with 200 (no header, malformed, several ranges).
    Full,
    /// Serve these bytes with 206 (non-empty, inside `0..len`).
    Partial(Range<u64>),
    /// Answer 416 with `Content-Range: bytes */len`.
    Unsatisfiable,
}

/// Evaluates one `Range` header value against a length.
pub fn evaluate(value: &str, len: u64) -> RangeOutcome {
    let Some((unit, set)) = value.trim().split_once('=') else {
        return RangeOutcome::Full;
    };
    if !unit.eq_ignore_ascii_case("bytes") {
        return RangeOutcome::Full;
    }
    // `1#range-spec`: empty list elements are allowed and ignored.
    let specs: Vec<&str> = set
        .split(',')
        .map(|s| s.trim_matches([' ', '\t']))
        .filter(|s| !s.is_empty())
        .collect();
    let mut parsed = Vec::with_capacity(specs.len());
    for spec in specs {
        match parse_spec(spec) {
            Some(s) => parsed.push(s),
            None => return RangeOutcome::Full,
        }
    }
    match parsed.as_slice() {
        [one] => resolve(*one, len),
        _ => RangeOutcome::Full,
    }
}

#[derive(Debug, Clone, Copy)]
enum Spec {
    /// `first-last` or `first-` (last = None).
    From(u64, Option<u64>),
    /// `-n`: the last n bytes.
    Suffix(u64),
}

fn parse_spec(spec: &str) -> Option<Spec> {
    let (first, last) = spec.split_once('-')?;
    if first.is_empty() {
        return Some(Spec::Suffix(number(last)?));
    }
    let first = number(first)?;
    if last.is_empty() {
        return Some(Spec::From(first, None));
    }
    let last = number(last)?;
    (last >= first).then_some(Spec::From(first, Some(last)))
}

/// Decimal digits only (no sign, no space); saturates at `u64::MAX`.
fn number(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(s.bytes().fold(0u64, |n, b| {
        n.saturating_mul(10).saturating_add(u64::from(b - b'0'))
    }))
}

fn resolve(spec: Spec, len: u64) -> RangeOutcome {
    match spec {
        Spec::From(first, _) if first >= len => RangeOutcome::Unsatisfiable,
        Spec::From(first, last) => {
            let end = last.map_or(len, |l| l.saturating_add(1).min(len));
            RangeOutcome::Partial(first..end)
        }
        Spec::Suffix(0) => RangeOutcome::Unsatisfiable,
        Spec::Suffix(_) if len == 0 => RangeOutcome::Full,
        Spec::Suffix(n) => RangeOutcome::Partial(len - n.min(len)..len),
    }
}

/// `Content-Range` of a 206: `bytes first-last/len` (inclusive last). `range` must be non-empty.
pub fn content_range(range: &Range<u64>, len: u64) -> String {
    format!("bytes {}-{}/{}", range.start, range.end - 1, len)
}

/// `Content-Range` of a 416: `bytes */len`.
pub fn unsatisfied_range(len: u64) -> String {
    format!("bytes */{len}")
}

#[cfg(test)]
mod tests {
    use super::RangeOutcome::{Full, Partial, Unsatisfiable};
    use super::*;

    #[test]
    fn single_ranges() {
        assert_eq!(evaluate("bytes=0-0", 10), Partial(0..1));
        assert_eq!(evaluate("bytes=2-5", 10), Partial(2..6));
        assert_eq!(evaluate("bytes=2-", 10), Partial(2..10));
        assert_eq!(evaluate("bytes=9-", 10), Partial(9..10));
        assert_eq!(evaluate("bytes=-3", 10), Partial(7..10));
        assert_eq!(evaluate("bytes=-30", 10), Partial(0..10));
        assert_eq!(evaluate("bytes=5-99", 10), Partial(5..10));
        assert_eq!(evaluate("bytes=0-18446744073709551615", 10), Partial(0..10));
        assert_eq!(
            evaluate("bytes=0-99999999999999999999999", 10),
            Partial(0..10)
        );
        assert_eq!(evaluate("BYTES=1-1", 10), Partial(1..2));
        assert_eq!(evaluate(" bytes= 1-2 ", 10), Partial(1..3));
        assert_eq!(evaluate("bytes=,1-2,", 10), Partial(1..3));
    }

    #[test]
    fn unsatisfiable() {
        assert_eq!(evaluate("bytes=10-", 10), Unsatisfiable);
        assert_eq!(evaluate("bytes=10-20", 10), Unsatisfiable);
        assert_eq!(
            evaluate("bytes=99999999999999999999999-", 10),
            Unsatisfiable
        );
        assert_eq!(evaluate("bytes=-0", 10), Unsatisfiable);
        assert_eq!(evaluate("bytes=0-", 0), Unsatisfiable);
        assert_eq!(evaluate("bytes=0-0", 0), Unsatisfiable);
        assert_eq!(evaluate("bytes=-0", 0), Unsatisfiable);
        assert_eq!(evaluate("bytes=-5", 0), Full);
    }

    #[test]
    fn multiple_and_malformed_are_full() {
        for v in [
            "bytes=0-1,3-4",
            "bytes=0-1, 20-30",
            "bytes=50-,60-",
            "bytes=5-2",
            "bytes=a-b",
            "bytes=+1-2",
            "bytes=1 -2",
            "bytes=-",
            "bytes=",
            "bytes=--1",
            "bytes=1-2-3",
            "items=0-1",
            "bytes 0-1",
            "0-1",
            "",
            "bytes=0x1-2",
        ] {
            assert_eq!(evaluate(v, 10), Full, "{v:?}");
        }
    }

    #[test]
    fn content_range_strings() {
        assert_eq!(content_range(&(0..1), 10), "bytes 0-0/10");
        assert_eq!(content_range(&(7..10), 10), "bytes 7-9/10");
        assert_eq!(unsatisfied_range(10), "bytes */10");
        assert_eq!(unsatisfied_range(0), "bytes */0");
        let huge = 1u64 << 40;
        let Partial(r) = evaluate("bytes=-10", huge) else {
            panic!()
        };
        assert_eq!(
            content_range(&r, huge),
            "bytes 1099511627766-1099511627775/1099511627776"
        );
    }
}
