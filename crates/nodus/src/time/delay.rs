//! Delays as Node takes them: a `Duration` or a number of milliseconds, clamped like Node.

use std::time::Duration;

/// Node's largest timer delay: 2^31 − 1 ms (about 24.8 days).
pub const MAX_DELAY: Duration = Duration::from_millis((1 << 31) - 1);
const MIN_DELAY_NS: u64 = 1_000_000;

/// A timer delay: `Duration`, or milliseconds as an integer or float.
pub trait IntoDelay {
    /// The delay in nanoseconds, clamped to at least 1 ms.
    ///
    /// # Panics
    /// Above [`MAX_DELAY`].
    #[track_caller]
    fn into_delay_ns(self) -> u64;
}

impl IntoDelay for Duration {
    #[track_caller]
    fn into_delay_ns(self) -> u64 {
        if self > MAX_DELAY {
            too_long(self);
        }
        (self.as_nanos() as u64).max(MIN_DELAY_NS)
    }
}

impl IntoDelay for f64 {
    #[track_caller]
    fn into_delay_ns(self) -> u64 {
        if self.is_nan() || self < 1.0 {
            return MIN_DELAY_NS;
        }
        if self > MAX_DELAY.as_millis() as f64 {
            too_long(Duration::from_secs_f64(
                (self / 1000.0).min(u64::MAX as f64),
            ));
        }
        (self * 1e6) as u64
    }
}

macro_rules! int_delay {
    ($($t:ty),*) => {$(
        impl IntoDelay for $t {
            #[track_caller]
            fn into_delay_ns(self) -> u64 {
                if self < 1 as $t {
                    return MIN_DELAY_NS;
                }
                Duration::from_millis(self as u64).into_delay_ns()
            }
        }
    )*};
}
int_delay!(i32, u32, i64, u64, usize);

#[cold]
#[track_caller]
fn too_long(d: Duration) -> ! {
    panic!(
        "nodus: timer delay {d:?} is longer than the maximum {MAX_DELAY:?} (2^31 - 1 ms, Node's limit); \
         use a shorter delay and re-arm"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_clamping() {
        assert_eq!(0.into_delay_ns(), 1_000_000);
        assert_eq!((-5).into_delay_ns(), 1_000_000);
        assert_eq!(f64::NAN.into_delay_ns(), 1_000_000);
        assert_eq!(0.5f64.into_delay_ns(), 1_000_000);
        assert_eq!(2.5f64.into_delay_ns(), 2_500_000);
        assert_eq!(Duration::ZERO.into_delay_ns(), 1_000_000);
        assert_eq!(10u64.into_delay_ns(), 10_000_000);
        assert_eq!(MAX_DELAY.into_delay_ns(), MAX_DELAY.as_nanos() as u64);
    }

    #[test]
    #[should_panic(expected = "longer than the maximum")]
    fn duration_max_panics_clearly() {
        Duration::MAX.into_delay_ns();
    }
}
