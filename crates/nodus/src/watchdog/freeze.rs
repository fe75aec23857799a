//! Process stops: the times the whole process was stopped or frozen (SIGSTOP, a debugger, a VM
//! or cgroup freeze), which would otherwise read as a task holding the loop.
//!
//! `CLOCK_MONOTONIC` keeps running while a process is stopped, so a poll that spans a stop reads
//! as long as the stop. The watchdog thread is stopped with the rest of the process and sees it
//! as an oversleep: it asked to wake at `expected` (at most a tick, 10 ms, after it went to sleep
//! while a loop is busy; the 1 s idle park otherwise) and woke at `to`, much later; a stop that
//! comes while it scans the loops (not while it sleeps: on a loaded host, preempted in its scan,
//! it can be there for a good share of each tick) shows as a scan that took that long, checked
//! as a sleep expected to end where the scan began (`thread.rs`). An oversleep
//! of at least [`FREEZE_MIN_NS`] is recorded as a stop of `to - expected` ns somewhere in
//! `[from, to]` (within a tick of both ends while a loop is busy), unless the watchdog's own
//! run-queue wait (`schedstat`) accounts for half of it: a thread kept off a busy CPU oversleeps
//! too, and that is the loop waiting for a CPU, not a stop. Without `schedstat` only an
//! oversleep of at least [`UNVERIFIED_FREEZE_MIN_NS`] counts.
//!
//! [`stopped_between`] says how much of an interval the process was stopped: for each recorded
//! stop, the smaller of its length and its window's overlap with the interval. The watchdog
//! uses it for a stall (a hold that would not have reached its threshold without the stop is
//! classed `stopped`, not blamed on its task); the loop for a slow poll's log line
//! (`LoopSlot::stopped_during`), which may be written before the watchdog, resumed at the same
//! moment, has recorded the stop: a loop whose watchdog has not looked for
//! [`STALE_LOOK_NS`] waits up to [`CATCH_UP`] for it to look past the poll's end.
//!
//! Thresholds: [`FREEZE_MIN_NS`] (100 ms, ten ticks) is far above the wake latency of a thread
//! that is not waiting for a CPU (microseconds), and equal to the default stall and slow-poll
//! thresholds: a stop long enough to make a default stall on its own is recognised.
//!
//! Invariants:
//! - Only the watchdog thread writes the record (`Detector::woke`), under a seqlock; it writes a
//!   stop before `LAST_LOOK`, so a reader that sees `LAST_LOOK >= t` sees every stop that ended
//!   before `t`.
//! - The loop reads it only when it logs a slow poll (cold): no clock read or atomic is added to
//!   a poll. The watchdog reads its own `schedstat` at most ten times a second and after an
//!   oversleep: a baseline at most 100 ms old, since a thread that wakes every tick on a loaded
//!   host gathers run-queue wait fast (hundreds of ms a second), and wait gathered before the
//!   sleep, counted against a stop, would make it read as a wait for a CPU.

use std::sync::atomic::{AtomicU64, Ordering, fence};
use std::time::Duration;

use super::proc::ThreadProc;
use crate::clock::now_ns;

/// Shortest oversleep recorded as a stop (see the module doc).
pub(super) const FREEZE_MIN_NS: u64 = 100_000_000;
/// Shortest oversleep recorded as a stop when the watchdog's run-queue wait cannot be read.
const UNVERIFIED_FREEZE_MIN_NS: u64 = 1_000_000_000;
/// The watchdog's run-queue wait baseline is refreshed at most this often (see the module doc).
const BASELINE_AGE_NS: u64 = 100_000_000;
/// A busy loop's watchdog looks every tick (10 ms); one that has not looked for this long was
/// stopped with the process (or is starved), and may not yet have recorded the stop.
pub(super) const STALE_LOOK_NS: u64 = FREEZE_MIN_NS / 2;
/// How long a slow poll's log waits for a stale watchdog to look again.
const CATCH_UP: Duration = Duration::from_millis(50);
/// Stops kept (the most recent).
const KEPT: usize = 8;

/// Seqlock sequence: odd while a stop is written.
static SEQ: AtomicU64 = AtomicU64::new(0);
/// Stops recorded so far; stop `n` is at index `n % KEPT`.
static COUNT: AtomicU64 = AtomicU64::new(0);
static FROM: [AtomicU64; KEPT] = [const { AtomicU64::new(0) }; KEPT];
static TO: [AtomicU64; KEPT] = [const { AtomicU64::new(0) }; KEPT];
static STOPPED: [AtomicU64; KEPT] = [const { AtomicU64::new(0) }; KEPT];
/// When the watchdog last woke (`now_ns`), after recording any stop it slept through.
static LAST_LOOK: AtomicU64 = AtomicU64::new(0);

/// The watchdog thread's side: its own `schedstat`, to tell a stop from a wait for a CPU.
pub(super) struct Detector {
    own: ThreadProc,
    /// Run-queue wait (ns) at `baseline_at`, if readable.
    baseline: Option<u64>,
    baseline_at: u64,
}

impl Detector {
    pub(super) fn new() -> Detector {
        let own = ThreadProc::open(rustix::thread::gettid().as_raw_pid());
        let baseline = own.run_delay_ns();
        let now = now_ns();
        LAST_LOOK.store(now, Ordering::Release);
        Detector {
            own,
            baseline,
            baseline_at: now,
        }
    }

    /// The watchdog went to sleep at `from`, to wake by `expected`, and woke at `to`: records a
    /// stop if it overslept, then publishes `to` as its last look.
    pub(super) fn woke(&mut self, from: u64, expected: u64, to: u64) {
        let overslept = to.saturating_sub(expected);
        if overslept >= FREEZE_MIN_NS {
            let now = self.own.run_delay_ns();
            let stopped = match (self.baseline, now) {
                // Its run-queue wait since the baseline (at most 100 ms before it slept) bounds
                // the wait in the sleep from above.
                (Some(base), Some(now)) => now.saturating_sub(base) < overslept / 2,
                _ => overslept >= UNVERIFIED_FREEZE_MIN_NS,
            };
            if stopped {
                record(from, to, overslept);
            }
            (self.baseline, self.baseline_at) = (now, to);
        } else if to.saturating_sub(self.baseline_at) >= BASELINE_AGE_NS {
            (self.baseline, self.baseline_at) = (self.own.run_delay_ns(), to);
        }
        LAST_LOOK.store(to, Ordering::Release);
    }
}

fn record(from: u64, to: u64, stopped: u64) {
    let n = COUNT.load(Ordering::Relaxed);
    let i = (n % KEPT as u64) as usize;
    SEQ.fetch_add(1, Ordering::Relaxed);
    fence(Ordering::Release);
    FROM[i].store(from, Ordering::Relaxed);
    TO[i].store(to, Ordering::Relaxed);
    STOPPED[i].store(stopped, Ordering::Relaxed);
    COUNT.store(n + 1, Ordering::Relaxed);
    SEQ.fetch_add(1, Ordering::Release);
}

/// How long the process was stopped between `a` and `b` (ns), as far as the recorded stops
/// tell: for each, the smaller of its length and its window's overlap with `[a, b]`.
pub(crate) fn stopped_between(a: u64, b: u64) -> u64 {
    loop {
        let seq = SEQ.load(Ordering::Acquire);
        if seq & 1 == 0 {
            let n = COUNT.load(Ordering::Relaxed).min(KEPT as u64) as usize;
            let total = (0..n)
                .map(|i| {
                    let from = FROM[i].load(Ordering::Relaxed).max(a);
                    let to = TO[i].load(Ordering::Relaxed).min(b);
                    STOPPED[i]
                        .load(Ordering::Relaxed)
                        .min(to.saturating_sub(from))
                })
                .sum();
            fence(Ordering::Acquire);
            if SEQ.load(Ordering::Relaxed) == seq {
                return total;
            }
        }
        std::hint::spin_loop();
    }
}

/// [`stopped_between`] for a poll that ran from `start` to `end`, on the loop thread of a slot
/// the running watchdog watches (`watched`). If the watchdog has not looked for
/// [`STALE_LOOK_NS`] before `end`, it was stopped with the process and may not have recorded
/// the stop yet: waits up to [`CATCH_UP`] for it to look at or after `end`.
#[cold]
pub(crate) fn stopped_during(start: u64, end: u64, watched: bool) -> u64 {
    if end.saturating_sub(start) < FREEZE_MIN_NS {
        return 0;
    }
    if watched && end.saturating_sub(LAST_LOOK.load(Ordering::Acquire)) > STALE_LOOK_NS {
        let give_up = now_ns() + CATCH_UP.as_nanos() as u64;
        while LAST_LOOK.load(Ordering::Acquire) < end && now_ns() < give_up {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    stopped_between(start, end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_interval_is_stopped_for_its_overlap_with_each_stop_at_most_the_stop() {
        // Times no real poll has (the clock counts from boot): other tests never overlap them.
        record(1_000, 3_000, 1_500);
        assert_eq!(stopped_between(0, 10_000), 1_500, "the whole stop");
        assert_eq!(stopped_between(2_000, 10_000), 1_000, "the overlap");
        assert_eq!(stopped_between(3_000, 10_000), 0);
        assert_eq!(stopped_between(0, 900), 0);
    }
}
