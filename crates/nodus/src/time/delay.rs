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

    /// The delay in nanoseconds, clamped to at least 1 ms but with no upper limit (saturating at
    /// `u64::MAX`, about 584 years): what the timer futures take, which wait past
    /// [`MAX_DELAY`] in steps. The default is [`into_delay_ns`](IntoDelay::into_delay_ns).
    #[track_caller]
    fn into_unlimited_delay_ns(self) -> u64
    where
        Self: Sized,
    {
        self.into_delay_ns()
    }
}

impl IntoDelay for Duration {
    #[track_caller]
    fn into_delay_ns(self) -> u64 {
        if self > MAX_DELAY {
            too_long(format_args!("{self:?}"));
        }
        self.into_unlimited_delay_ns()
    }

    fn into_unlimited_delay_ns(self) -> u64 {
        u64::try_from(self.as_nanos())
            .unwrap_or(u64::MAX)
            .max(MIN_DELAY_NS)
    }
}

impl IntoDelay for f64 {
    #[track_caller]
    fn into_delay_ns(self) -> u64 {
        if self > MAX_DELAY.as_millis() as f64 {
            too_long(format_args!("{self} ms"));
        }
        self.into_unlimited_delay_ns()
    }

    fn into_unlimited_delay_ns(self) -> u64 {
        if self.is_nan() || self < 1.0 {
            return MIN_DELAY_NS;
        }
        // `as` saturates: infinity and anything past u64::MAX ns become u64::MAX.
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

            fn into_unlimited_delay_ns(self) -> u64 {
                if self < 1 as $t {
                    return MIN_DELAY_NS;
                }
                Duration::from_millis(self as u64).into_unlimited_delay_ns()
            }
        }
    )*};
}
int_delay!(i32, u32, i64, u64, usize);

#[cold]
#[track_caller]
fn too_long(delay: std::fmt::Arguments<'_>) -> ! {
    panic!(
        "nodus: timer delay {delay} is longer than the maximum {MAX_DELAY:?} (2^31 - 1 ms, Node's limit); \
         use a shorter delay and re-arm"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_infinite_or_huge_float_delay_gets_the_clear_panic() {
        for delay in [f64::INFINITY, 1e30, MAX_DELAY.as_millis() as f64 + 1.0] {
            let panic = std::panic::catch_unwind(|| delay.into_delay_ns()).unwrap_err();
            let message = panic.downcast_ref::<String>().expect("a formatted message");
            assert!(
                message.contains("is longer than the maximum"),
                "{delay}: {message}"
            );
        }
    }

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
    fn unlimited_delays_clamp_below_and_saturate_above() {
        assert_eq!(0.into_unlimited_delay_ns(), 1_000_000);
        assert_eq!(f64::NAN.into_unlimited_delay_ns(), 1_000_000);
        assert_eq!(Duration::ZERO.into_unlimited_delay_ns(), 1_000_000);
        let forty_days = Duration::from_secs(40 * 86_400);
        assert_eq!(
            forty_days.into_unlimited_delay_ns(),
            forty_days.as_nanos() as u64
        );
        assert_eq!(
            (40u64 * 86_400_000).into_unlimited_delay_ns(),
            forty_days.as_nanos() as u64
        );
        assert_eq!(Duration::MAX.into_unlimited_delay_ns(), u64::MAX);
        assert_eq!(u64::MAX.into_unlimited_delay_ns(), u64::MAX);
        assert_eq!(f64::INFINITY.into_unlimited_delay_ns(), u64::MAX);
    }

    #[test]
    #[should_panic(expected = "longer than the maximum")]
    fn duration_max_panics_clearly() {
        Duration::MAX.into_delay_ns();
    }
}
