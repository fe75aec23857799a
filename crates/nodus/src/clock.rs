//! The process-wide monotonic clock every nodus measurement uses.
//!
//! Times are `u64` nanoseconds of `CLOCK_MONOTONIC` (read through the vDSO, no `Instant`
//! arithmetic), so the loop thread, pool threads and the watchdog thread compare them directly.
//!
//! Invariants: `now_ns()` never goes backwards (it is `CLOCK_MONOTONIC`, the clock `Instant` uses
//! too, so the two convert exactly); a read costs one vDSO `clock_gettime`, and callers on the
//! loop's hot path read it at most once per poll boundary (DESIGN.md section 3), and once per
//! task wake, spawn or immediate in user code (the start of its schedule delay,
//! `Meter::wake_time`).

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use rustix::time::{ClockId, clock_gettime};

/// A reading of both clocks, to convert between them.
static EPOCH: OnceLock<(Instant, u64)> = OnceLock::new();

fn epoch() -> (Instant, u64) {
    *EPOCH.get_or_init(|| (Instant::now(), now_ns()))
}

/// Nanoseconds of the monotonic clock.
#[inline]
pub fn now_ns() -> u64 {
    let t = clock_gettime(ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// Converts a nanosecond timestamp to an `Instant`.
pub(crate) fn instant_at(ns: u64) -> Instant {
    let (instant, at) = epoch();
    if ns >= at {
        instant + Duration::from_nanos(ns - at)
    } else {
        instant - Duration::from_nanos(at - ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_is_monotonic_and_converts_to_instants() {
        let a = now_ns();
        std::thread::sleep(Duration::from_millis(2));
        let b = now_ns();
        assert!(b >= a + 2_000_000, "{a} then {b}");
        let (i, n) = (Instant::now(), now_ns());
        let converted = instant_at(n);
        let skew = if converted > i {
            converted - i
        } else {
            i - converted
        };
        assert!(skew < Duration::from_millis(1), "{skew:?}");
        assert!(instant_at(n - 1_000_000) < instant_at(n));
    }
}
