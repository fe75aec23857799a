//! The watchdog thread (`nodus-watchdog`): scans every registered loop's slot, samples the loop
//! thread's scheduler state once a poll passes its threshold, reports the stall, and sleeps until
//! the next moment something can be due.
//!
//! - While any loop is busy it sleeps until the earliest moment an in-progress poll reaches its
//!   threshold (or its next backoff report), and never longer than a tick (10 ms, or half the
//!   smallest threshold), because a new poll starts without telling it. While every loop is idle
//!   in epoll it parks, after a CAS on `ACTIVITY` that a loop's `leave_idle` cannot miss.
//! - A stall is reported (one `tracing` warning, target `nodus::watchdog`) at the threshold, then
//!   at 2x, 4x, 8x... the threshold while it lasts. A token bucket over all stalls lets out at
//!   most about 10 reports per second; suppressed reports are counted in the next one.
//! - The stall's ring-buffer entry is published complete at its first observation past the
//!   threshold and updated in place at every tick and when the poll ends.
//!
//! Invariants:
//! - This thread alone reports stalls, reads `/proc` and writes the ring buffer.
//! - It holds only `Weak` references to slots: a dropped loop is pruned (and its stall closed) at
//!   the next scan.

use std::fmt::Write as _;
use std::sync::Weak;
#[cfg(test)]
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::proc::{Sample, ThreadProc, classify};
use super::slot::{LoopSlot, PollView, SlotRead};
use super::{ACTIVITY, PARKED, PENDING, RING, StallClass, StallReport, lock};
use crate::clock::now_ns;

/// Longest sleep while any loop is busy: a new poll is seen at most this long after it starts.
const MAX_TICK_NS: u64 = 10_000_000;
/// Safety timeout of the park while every loop is idle (only prunes dropped loops).
const IDLE_PARK: Duration = Duration::from_secs(1);
/// Rate limit across all stalls: one report per `REPORT_COST_NS`, bursts of up to `REPORT_BURST`.
const REPORT_COST_NS: u64 = 100_000_000;
const REPORT_BURST: u64 = 10;

#[cfg(test)]
pub(super) static WAKES: AtomicU64 = AtomicU64::new(0);
/// Wakes by a timeout (not an unpark) from a wait begun while no loop was busy.
#[cfg(test)]
pub(super) static IDLE_WAKES: AtomicU64 = AtomicU64::new(0);

/// The watchdog's view of one registered loop.
struct Watched {
    slot: Weak<LoopSlot>,
    loop_id: u64,
    threshold_ns: u64,
    proc: ThreadProc,
    /// The poll seen in progress at the last scan.
    poll: Option<Observed>,
}

struct Observed {
    view: PollView,
    /// The loop thread's scheduler state when the watchdog first saw this poll: the start of the
    /// share window.
    baseline: Sample,
    stall: Option<Stall>,
}

struct Stall {
    /// Its ring-buffer entry, once published.
    ring_id: Option<u64>,
    /// Next report is due at `start + threshold * multiplier`.
    multiplier: u64,
    report: StallReport,
}

/// Token bucket over all stalls.
struct RateLimit {
    budget_ns: u64,
    last_ns: u64,
    suppressed: u64,
}

impl RateLimit {
    /// `Some(suppressed since the last allowed report)` if a report may go out now.
    fn allow(&mut self, now: u64) -> Option<u64> {
        let refill = now.saturating_sub(self.last_ns);
        self.last_ns = now;
        self.budget_ns = (self.budget_ns.saturating_add(refill)).min(REPORT_BURST * REPORT_COST_NS);
        if self.budget_ns >= REPORT_COST_NS {
            self.budget_ns -= REPORT_COST_NS;
            Some(std::mem::take(&mut self.suppressed))
        } else {
            self.suppressed += 1;
            None
        }
    }
}

/// What a scan found.
struct Scan {
    /// A poll is in progress (or a slot could not be read): keep ticking.
    active: bool,
    /// Earliest report due, if any poll is in progress.
    next_due_ns: Option<u64>,
    /// Tick for this round: `MAX_TICK_NS` or half the smallest threshold.
    tick_ns: u64,
}

pub(super) fn run() {
    raise_priority();
    let mut watched: Vec<Watched> = Vec::new();
    let mut limiter = RateLimit {
        budget_ns: REPORT_BURST * REPORT_COST_NS,
        last_ns: now_ns(),
        suppressed: 0,
    };
    loop {
        #[cfg(test)]
        WAKES.fetch_add(1, Ordering::Relaxed);
        adopt_pending(&mut watched);
        let scan = scan(&mut watched, &mut limiter);
        let busy = ACTIVITY.load(Ordering::Acquire) & !PARKED;
        if !scan.active && busy == 0 {
            // Everyone is idle in epoll: park until `leave_idle` (or `register`) unparks us. The CAS
            // fails if a loop became busy since the load; then just scan again.
            if ACTIVITY
                .compare_exchange(0, PARKED, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                std::thread::park_timeout(IDLE_PARK);
                let _unparked = ACTIVITY.fetch_and(!PARKED, Ordering::AcqRel) & PARKED == 0;
                #[cfg(test)]
                if !_unparked {
                    IDLE_WAKES.fetch_add(1, Ordering::Relaxed);
                }
            }
            continue;
        }
        let now = now_ns();
        let wake_at = scan
            .next_due_ns
            .map_or(now + scan.tick_ns, |due| due.min(now + scan.tick_ns));
        if wake_at > now {
            std::thread::park_timeout(Duration::from_nanos(wake_at - now));
        }
        // A tick with no loop busy (only a poll's end left to see) counts as an idle wake too.
        #[cfg(test)]
        if busy == 0 {
            IDLE_WAKES.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn adopt_pending(watched: &mut Vec<Watched>) {
    let pending = std::mem::take(&mut *lock(&PENDING));
    for weak in pending {
        if let Some(slot) = weak.upgrade() {
            watched.push(Watched {
                loop_id: slot.loop_id,
                threshold_ns: slot.threshold_ns,
                proc: ThreadProc::open(slot.tid),
                slot: weak,
                poll: None,
            });
        }
    }
}

fn scan(watched: &mut Vec<Watched>, limiter: &mut RateLimit) -> Scan {
    let mut out = Scan {
        active: false,
        next_due_ns: None,
        tick_ns: MAX_TICK_NS,
    };
    watched.retain_mut(|w| {
        let Some(slot) = w.slot.upgrade() else {
            // The loop is gone (maybe unwinding out of a stalled poll): close its stall.
            if let Some(poll) = w.poll.take() {
                finish(poll, None);
            }
            return false;
        };
        out.tick_ns = out.tick_ns.min(w.threshold_ns / 2);
        let view = match slot.read() {
            SlotRead::Torn => {
                out.active = true;
                return true;
            }
            SlotRead::Idle => {
                if let Some(poll) = w.poll.take() {
                    let end = slot.long_end(poll.view.seq);
                    finish(poll, end);
                }
                return true;
            }
            SlotRead::Poll(view) => view,
        };
        out.active = true;
        if w.poll.as_ref().is_some_and(|p| p.view.seq != view.seq) {
            let poll = w.poll.take().expect("checked above");
            let end = slot.long_end(poll.view.seq);
            finish(poll, end);
        }
        let poll = w.poll.get_or_insert_with(|| Observed {
            view,
            baseline: w.proc.sample(),
            stall: None,
        });
        let due = observe(w.loop_id, w.threshold_ns, &w.proc, poll, limiter);
        out.next_due_ns = Some(out.next_due_ns.map_or(due, |d| d.min(due)));
        true
    });
    out
}

/// Checks one in-progress poll: opens, updates or reports its stall. Returns when the next report
/// is due (the threshold, for a poll not yet stalled).
fn observe(
    loop_id: u64,
    threshold_ns: u64,
    proc: &ThreadProc,
    poll: &mut Observed,
    limiter: &mut RateLimit,
) -> u64 {
    let start = poll.view.start_ns;
    let due = |multiplier: u64| start.saturating_add(threshold_ns.saturating_mul(multiplier));
    if now_ns() < due(1) {
        return due(1);
    }
    let sample = proc.sample();
    let (class, on_cpu, waiting) = classify(Some(&poll.baseline), &sample);
    let elapsed = sample.wall_ns.saturating_sub(start) as f64 / 1e9;
    let stall = poll.stall.get_or_insert_with(|| {
        let view = &poll.view;
        let report = StallReport {
            loop_id,
            task_id: view.task_id,
            task_name: view.name.to_owned(),
            location: format!(
                "{}:{}:{}",
                view.location.file(),
                view.location.line(),
                view.location.column()
            ),
            class: class.as_str().to_owned(),
            at_unix_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            ongoing: true,
            detected_after_seconds: elapsed,
            ..StallReport::default()
        };
        Stall {
            ring_id: None,
            multiplier: 1,
            report,
        }
    });
    let report = &mut stall.report;
    report.elapsed_seconds = elapsed;
    if report.class != class.as_str() {
        class.as_str().clone_into(&mut report.class);
    }
    report.on_cpu_share = on_cpu;
    report.waiting_for_cpu_share = waiting;
    if sample.wall_ns >= due(stall.multiplier) {
        if let Some(suppressed) = limiter.allow(sample.wall_ns) {
            report.reports += 1;
            let message = stall_message(report, class, suppressed);
            tracing::warn!(
                target: "nodus::watchdog",
                loop_id,
                task_id = report.task_id,
                "{message}"
            );
        }
        // Backoff: the next report at the first of 2x, 4x, 8x... the threshold still ahead.
        while due(stall.multiplier) <= sample.wall_ns && stall.multiplier < u64::MAX / 2 {
            stall.multiplier *= 2;
        }
    }
    // Published only now, complete: a reader never sees a half-filled first report.
    let mut ring = lock(&RING);
    match stall.ring_id {
        Some(id) => ring.update(id, &stall.report),
        None => {
            let id = ring.push(stall.report.clone(), poll.view.seq, start);
            stall.ring_id = Some(id);
        }
    }
    drop(ring);
    due(stall.multiplier)
}

/// A poll that was being observed has ended at `end_ns` (as its loop recorded it), or at an
/// unknown time after the last sample (its loop is gone, or a later long poll overwrote the end).
fn finish(poll: Observed, end_ns: Option<u64>) {
    let Some(mut stall) = poll.stall else {
        return;
    };
    let report = &mut stall.report;
    report.ongoing = false;
    let at_least = match end_ns {
        Some(end) => {
            report.elapsed_seconds = end.saturating_sub(poll.view.start_ns) as f64 / 1e9;
            ""
        }
        None => "at least ",
    };
    if let Some(id) = stall.ring_id {
        lock(&RING).update(id, report);
    }
    let ms = report.elapsed_seconds * 1e3;
    if report.reports > 0 {
        tracing::info!(
            target: "nodus::watchdog",
            loop_id = report.loop_id,
            task_id = report.task_id,
            "stall ended: task {:?} ({}) ran for {at_least}{ms:.0} ms",
            report.task_name,
            report.location,
        );
    } else {
        tracing::debug!(
            target: "nodus::watchdog",
            loop_id = report.loop_id,
            task_id = report.task_id,
            "stall ended (not reported: rate limit): task {:?} ({}) ran for {at_least}{ms:.0} ms",
            report.task_name,
            report.location,
        );
    }
}

/// The one-line warning, e.g. `loop stalled: task "hog" (examples/stall.rs:21:5) has been running
/// for 101 ms, on-cpu (cpu 99%, waiting for cpu 0%)`.
fn stall_message(report: &StallReport, class: StallClass, suppressed: u64) -> String {
    let mut message = format!(
        "loop stalled: task {:?} ({}) has been running for {:.0} ms, {}",
        report.task_name,
        report.location,
        report.elapsed_seconds * 1e3,
        class,
    );
    if class == StallClass::Unknown {
        message.push_str(" (no scheduler data)");
    } else {
        let _ = write!(
            message,
            " (cpu {:.0}%, waiting for cpu {:.0}%)",
            report.on_cpu_share * 100.0,
            report.waiting_for_cpu_share * 100.0
        );
    }
    if suppressed > 0 {
        let _ = write!(
            message,
            "; {suppressed} earlier stall reports suppressed by the rate limit"
        );
    }
    message
}

/// Asks the kernel to run this thread ahead of ordinary work (nice −10), so a report is not late
/// just because the machine is busy: the loop thread it watches may be the one hogging a CPU.
/// Without the privilege (no `CAP_SYS_NICE`) it stays at the default priority.
fn raise_priority() {
    let tid = rustix::thread::gettid();
    let _ = rustix::process::setpriority_process(Some(tid), -10);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_one_line_per_report() {
        let report = StallReport {
            task_name: "hog".into(),
            location: "examples/stall.rs:21:5".into(),
            elapsed_seconds: 0.1012,
            on_cpu_share: 0.994,
            waiting_for_cpu_share: 0.001,
            ..StallReport::default()
        };
        assert_eq!(
            stall_message(&report, StallClass::OnCpu, 0),
            "loop stalled: task \"hog\" (examples/stall.rs:21:5) has been running for 101 ms, on-cpu (cpu 99%, waiting for cpu 0%)"
        );
        let message = stall_message(&report, StallClass::Unknown, 3);
        assert!(
            message.ends_with(
                "unknown (no scheduler data); 3 earlier stall reports suppressed by the rate limit"
            ),
            "{message}"
        );
        assert!(!message.contains('\n'));
    }

    #[test]
    fn rate_limit_allows_ten_per_second_and_counts_the_rest() {
        let mut limit = RateLimit {
            budget_ns: REPORT_BURST * REPORT_COST_NS,
            last_ns: 0,
            suppressed: 0,
        };
        let allowed = (0..15).filter(|_| limit.allow(1).is_some()).count();
        assert_eq!(allowed, 10);
        assert_eq!(limit.allow(1 + REPORT_COST_NS), Some(5));
    }
}
