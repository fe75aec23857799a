//! The process-wide monotonic clock every nodus measurement uses.
//!
//! Times are `u64` nanoseconds since a process-wide epoch (the first call), so the loop thread,
//! pool threads and the watchdog thread can compare them without sharing an `Instant`.
//!
//! Invariants: `now_ns()` never goes backwards within a process (it is `CLOCK_MONOTONIC`), and a
//! read costs one vDSO `clock_gettime` (about 18 ns here): callers on the loop's hot path read it
//! at most once per poll boundary (DESIGN.md section 3).

use std::sync::OnceLock;
use std::time::{Duration, Instant};

static EPOCH: OnceLock<Instant> = OnceLock::new();

/// The epoch all nanosecond timestamps count from.
#[inline]
pub(crate) fn epoch() -> Instant {
    *EPOCH.get_or_init(Instant::now)
}

/// Nanoseconds since the process-wide epoch.
#[inline]
pub fn now_ns() -> u64 {
    let epoch = epoch();
    Instant::now().saturating_duration_since(epoch).as_nanos() as u64
}

/// Converts a nanosecond timestamp back to an `Instant`.
#[inline]
pub(crate) fn instant_at(ns: u64) -> Instant {
    epoch() + Duration::from_nanos(ns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_is_monotonic_and_round_trips() {
        let a = now_ns();
        std::thread::sleep(Duration::from_millis(2));
        let b = now_ns();
        assert!(b >= a + 2_000_000, "{a} then {b}");
        let i = instant_at(b);
        assert_eq!(i.duration_since(epoch()).as_nanos() as u64, b);
    }
}
