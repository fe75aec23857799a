//! The loop's phases, as the measurements name them.

// With the `measure` feature off (the overhead benchmark only) this is compiled but not used.
#![cfg_attr(not(feature = "measure"), allow(dead_code))]

/// One phase of a loop iteration (DESIGN.md section 2), plus `Main`: work run outside any
/// iteration (the main future's first poll and the queue drain after `Runtime::enter`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    Timers = 0,
    Pending = 1,
    Idle = 2,
    Prepare = 3,
    Poll = 4,
    Check = 5,
    Close = 6,
    Main = 7,
}

impl Phase {
    pub(crate) const COUNT: usize = 8;
    pub(crate) const ALL: [Phase; Phase::COUNT] = [
        Phase::Timers,
        Phase::Pending,
        Phase::Idle,
        Phase::Prepare,
        Phase::Poll,
        Phase::Check,
        Phase::Close,
        Phase::Main,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Phase::Timers => "timers",
            Phase::Pending => "pending",
            Phase::Idle => "idle",
            Phase::Prepare => "prepare",
            Phase::Poll => "poll",
            Phase::Check => "check",
            Phase::Close => "close",
            Phase::Main => "main",
        }
    }
}
