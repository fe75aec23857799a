//! The watchdog thread (`nodus-watchdog`): scans every registered loop's slot, samples the loop
//! thread's scheduler state once a hold passes its threshold, reports the stall, and sleeps until
//! the next moment something can be due.
//!
//! - While any loop is busy it sleeps until the earliest moment a hold in progress reaches its
//!   threshold (or its next backoff report), and never longer than a tick (10 ms, or half the
//!   smallest threshold), because a new hold starts without telling it. While every loop is idle
//!   in epoll it parks, after a CAS on `ACTIVITY` that a loop's `leave_idle` cannot miss.
//! - At every look at a hold it counts the poll that began last by name and location (`Seen`, at
//!   most 8 distinct ones). A stalled hold is named after the poll in progress if that has run for
//!   half of it at least and was already running at the last look (`Shape::Poll`,
//!   `Shape::LongPoll`; a closure's published start is its batch's), else after the poll seen
//!   most often (`Shape::Drain`: many short polls, the drain does not empty); the name may change
//!   while the stall lasts and is updated in place. So may the note that names with it what the
//!   task is doing (`nodus::task::set_note`; for a drain, the latest seen with that poll): the
//!   latest note seen with the stall's holder, kept when a later look finds it cleared (a
//!   handler that returned before the hold ended), so the end line and the ring buffer name it.
//! - A stall is reported (one `tracing` warning, target `nodus::watchdog`) at the threshold, then
//!   at 2x, 4x, 8x... the threshold while it lasts. A token bucket over all stalls lets out at
//!   most about 10 reports per second; suppressed reports are counted in the next one.
//! - The stall's ring-buffer entry is published complete at its first observation past the
//!   threshold and updated in place at every tick and when the hold ends; at the end the stall
//!   is counted in its loop's slot under its final class (`finish`).
//! - After every wake, before it scans, it checks whether it overslept because the process was
//!   stopped (`freeze::Detector::woke`). A stall that would not have reached its threshold
//!   without the stops in it is of class `stopped` (`by_stop`): its report and end line say the
//!   process was stopped or frozen for so long and name the poll only as the one under way. A
//!   longer one keeps its class, with the stop left out of its scheduler window and told apart.
//!
//! Invariants:
//! - This thread alone reports stalls, reads `/proc` and writes the ring buffer and the record
//!   of stops.
//! - It holds only `Weak` references to slots: a dropped loop is pruned (and its stall closed) at
//!   the next scan.

use std::fmt::Write as _;
use std::panic::Location;
use std::sync::Weak;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::freeze::{Detector, stopped_between};
use super::note::Note;
use super::proc::{Sample, ThreadProc, WAITING_FOR_CPU_SHARE, classify};
use super::slot::{HoldView, LoopSlot, SlotRead};
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
    /// The hold seen in progress at the last scan.
    hold: Option<Observed>,
}

struct Observed {
    /// The latest read of the hold.
    view: HoldView,
    /// The loop thread's scheduler state when the watchdog first saw this hold: the start of the
    /// share window.
    baseline: Sample,
    seen: Seen,
    stall: Option<Stall>,
}

struct Stall {
    /// Its ring-buffer entry, once published.
    ring_id: Option<u64>,
    /// Next report is due at `start + threshold * multiplier`.
    multiplier: u64,
    /// The name and location `report` names (compared by address: both are `'static`), and the
    /// note it names with them: the latest one seen with that holder, kept when a later look
    /// finds none (the handler that set it returned, its task cleared it, before the hold ended).
    holder: (*const u8, *const Location<'static>),
    note: Note,
    /// The class `report` names.
    class: StallClass,
    report: StallReport,
}

/// Distinct polls `Seen` keeps count of; later ones count only in the total.
const SEEN_CAP: usize = 8;

/// What the watchdog saw running at each look at one hold (the poll that began last: it is
/// running, or the loop is in the drain right after it), by name and location: a sampling
/// profile of the hold that costs the loop nothing.
#[derive(Default)]
struct Seen {
    polls: Vec<SeenPoll>,
    looks: u32,
}

#[derive(Clone, Copy)]
struct SeenPoll {
    task_id: u64,
    name: &'static str,
    location: &'static Location<'static>,
    /// The latest note seen with it (a look after its task cleared the note, or at a poll of
    /// it that set none, keeps the one seen before).
    note: Note,
    looks: u32,
}

impl Seen {
    fn add(&mut self, view: &HoldView) {
        self.looks += 1;
        let same = |p: &&mut SeenPoll| {
            std::ptr::eq(p.name, view.name) && std::ptr::eq(p.location, view.location)
        };
        if let Some(p) = self.polls.iter_mut().find(same) {
            p.looks += 1;
            p.task_id = view.task_id;
            if !view.note.is_empty() {
                p.note = view.note;
            }
        } else if self.polls.len() < SEEN_CAP {
            self.polls.push(SeenPoll {
                task_id: view.task_id,
                name: view.name,
                location: view.location,
                note: view.note,
                looks: 1,
            });
        }
    }

    /// The two polls seen most often, most first.
    fn top(&self) -> (Option<SeenPoll>, Option<SeenPoll>) {
        let mut first: Option<SeenPoll> = None;
        let mut second: Option<SeenPoll> = None;
        for &p in &self.polls {
            if first.is_none_or(|f| p.looks > f.looks) {
                second = first;
                first = Some(p);
            } else if second.is_none_or(|s| p.looks > s.looks) {
                second = Some(p);
            }
        }
        (first, second)
    }
}

/// What holds the loop, at one observation of a stall.
enum Shape {
    /// One poll, the hold's only one so far.
    Poll,
    /// A poll that has been running for `running_ns`, at least half the hold, after others.
    LongPoll { running_ns: u64 },
    /// Many polls, none of them long: a drain that does not empty.
    Drain,
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

/// Log lines this thread began writing (only it counts them): a scan that wrote none did not
/// wait on a writer.
static WROTE: AtomicU64 = AtomicU64::new(0);

pub(super) fn run() {
    raise_priority();
    let mut watched: Vec<Watched> = Vec::new();
    let mut limiter = RateLimit {
        budget_ns: REPORT_BURST * REPORT_COST_NS,
        last_ns: now_ns(),
        suppressed: 0,
    };
    let mut freezes = Detector::new();
    // When this thread last looked at the clock after a sleep or a scan: a stop that comes
    // while it scans (not while it sleeps) shows as a scan that took that long.
    let mut looked = now_ns();
    loop {
        #[cfg(test)]
        WAKES.fetch_add(1, Ordering::Relaxed);
        adopt_pending(&mut watched);
        let wrote = WROTE.load(Ordering::Relaxed);
        let scan = scan(&mut watched, &mut limiter);
        let scanned = now_ns();
        // A scan that wrote a line may have waited on its writer (a full stderr pipe): that is
        // no stop.
        if WROTE.load(Ordering::Relaxed) == wrote {
            freezes.woke(looked, looked, scanned);
        }
        let busy = ACTIVITY.load(Ordering::Acquire) & !PARKED;
        if !scan.active && busy == 0 {
            // Everyone is idle in epoll: park until `leave_idle` (or `register`) unparks us. The CAS
            // fails if a loop became busy since the load; then just scan again.
            if ACTIVITY
                .compare_exchange(0, PARKED, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                let from = now_ns();
                std::thread::park_timeout(IDLE_PARK);
                looked = now_ns();
                freezes.woke(from, from + IDLE_PARK.as_nanos() as u64, looked);
                let _unparked = ACTIVITY.fetch_and(!PARKED, Ordering::AcqRel) & PARKED == 0;
                #[cfg(test)]
                if !_unparked {
                    IDLE_WAKES.fetch_add(1, Ordering::Relaxed);
                }
            }
            continue;
        }
        let now = scanned;
        let wake_at = scan
            .next_due_ns
            .map_or(now + scan.tick_ns, |due| due.min(now + scan.tick_ns));
        if wake_at > now {
            std::thread::park_timeout(Duration::from_nanos(wake_at - now));
        }
        // Before the next scan: a hold that spans a stop is classed by it.
        looked = now_ns();
        freezes.woke(now, wake_at.max(now), looked);
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
                hold: None,
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
            if let Some(hold) = w.hold.take() {
                finish(hold, None, w.threshold_ns, None);
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
                if let Some(hold) = w.hold.take() {
                    let end = slot.long_end(hold.view.hold_seq);
                    finish(hold, end, w.threshold_ns, Some(&slot));
                }
                return true;
            }
            SlotRead::Held(view) => view,
        };
        out.active = true;
        if w.hold
            .as_ref()
            .is_some_and(|h| h.view.hold_seq != view.hold_seq)
        {
            let hold = w.hold.take().expect("checked above");
            let end = slot.long_end(hold.view.hold_seq);
            finish(hold, end, w.threshold_ns, Some(&slot));
        }
        let hold = w.hold.get_or_insert_with(|| Observed {
            view,
            baseline: w.proc.sample(),
            seen: Seen::default(),
            stall: None,
        });
        // The same poll as at the last look: nothing began since.
        let steady = hold.seen.looks > 0 && hold.view.seq == view.seq;
        hold.view = view;
        hold.seen.add(&view);
        let due = observe(w.loop_id, w.threshold_ns, &w.proc, hold, steady, limiter);
        out.next_due_ns = Some(out.next_due_ns.map_or(due, |d| d.min(due)));
        true
    });
    out
}

/// Checks one hold in progress: opens, updates or reports its stall. `steady`: the poll in
/// progress is the one seen at the last look. Returns when the next report is due (the
/// threshold, for a hold not yet stalled).
fn observe(
    loop_id: u64,
    threshold_ns: u64,
    proc: &ThreadProc,
    hold: &mut Observed,
    steady: bool,
    limiter: &mut RateLimit,
) -> u64 {
    let start = hold.view.hold_ns;
    let due = |multiplier: u64| start.saturating_add(threshold_ns.saturating_mul(multiplier));
    if now_ns() < due(1) {
        return due(1);
    }
    let sample = proc.sample();
    let held_ns = sample.wall_ns.saturating_sub(start);
    let stopped_ns = stopped_between(start, sample.wall_ns);
    let in_window = stopped_between(hold.baseline.wall_ns, sample.wall_ns);
    let (mut class, on_cpu, waiting) = classify(
        Some(&hold.baseline),
        &sample,
        in_window,
        held_ns.saturating_sub(stopped_ns),
        threshold_ns,
    );
    if by_stop(held_ns, stopped_ns, threshold_ns) {
        class = StallClass::Stopped;
    }
    let view = &hold.view;
    let polls = view.polls();
    // A closure's published start is its batch's, so only a poll seen at two looks in a row
    // (nothing began in between) is known to have run that long itself.
    let running_ns =
        (view.start_ns != 0 && steady).then(|| sample.wall_ns.saturating_sub(view.start_ns));
    // Who holds the loop: the poll under way if it is (nearly) all of the hold, else the poll
    // seen running most often.
    let shape = match running_ns {
        _ if polls == 1 => Shape::Poll,
        Some(running_ns) if running_ns.saturating_mul(2) >= held_ns => {
            Shape::LongPoll { running_ns }
        }
        _ => Shape::Drain,
    };
    let (task_id, name, location, note) = match (&shape, hold.seen.top().0) {
        (Shape::Drain, Some(p)) => (p.task_id, p.name, p.location, p.note),
        _ => (view.task_id, view.name, view.location, view.note),
    };
    let stall = hold.stall.get_or_insert_with(|| {
        let report = StallReport {
            loop_id,
            began_with: format!("{:?} ({})", view.opener, location_str(view.opener_location)),
            class: class.as_str().to_owned(),
            at_unix_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            ongoing: true,
            detected_after_seconds: held_ns as f64 / 1e9,
            ..StallReport::default()
        };
        Stall {
            ring_id: None,
            multiplier: 1,
            holder: (std::ptr::null(), std::ptr::null()),
            note: Note::default(),
            class,
            report,
        }
    });
    let report = &mut stall.report;
    let holder = (name.as_ptr(), std::ptr::from_ref(location));
    let new_holder = stall.holder != holder;
    if new_holder {
        stall.holder = holder;
        name.clone_into(&mut report.task_name);
        report.location = location_str(location);
    }
    // A holder's note is kept once seen: a look after its handler returned finds none.
    if stall.note != note && (new_holder || !note.is_empty()) {
        stall.note = note;
        report.note = note.render();
    }
    report.task_id = task_id;
    report.polls = polls;
    report.elapsed_seconds = held_ns as f64 / 1e9;
    if stall.class != class {
        stall.class = class;
        class.as_str().clone_into(&mut report.class);
    }
    report.on_cpu_share = on_cpu;
    report.waiting_for_cpu_share = waiting;
    report.stopped_seconds = stopped_ns as f64 / 1e9;
    if sample.wall_ns >= due(stall.multiplier) {
        if let Some(suppressed) = limiter.allow(sample.wall_ns) {
            report.reports += 1;
            let message = stall_message(report, &shape, &hold.seen, class, suppressed);
            WROTE.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                target: "nodus::watchdog",
                loop_id,
                task_id = report.task_id,
                polls,
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
            let id = ring.push(stall.report.clone(), hold.view.hold_seq, start);
            stall.ring_id = Some(id);
        }
    }
    drop(ring);
    due(stall.multiplier)
}

fn location_str(location: &Location<'_>) -> String {
    format!(
        "{}:{}:{}",
        location.file(),
        location.line(),
        location.column()
    )
}

/// Whether a hold of `held_ns`, `stopped_ns` of it with the process stopped, is a stall only
/// because of the stop: without it, it would not have reached `threshold_ns`.
fn by_stop(held_ns: u64, stopped_ns: u64, threshold_ns: u64) -> bool {
    stopped_ns > 0 && held_ns.saturating_sub(stopped_ns) < threshold_ns
}

/// A hold that was being observed has ended at `end` (time and poll count, as its loop recorded
/// them), or at an unknown time after the last sample (its loop is gone, or a later long hold
/// overwrote the end). Its stall is counted in `slot` (`None`: the loop is gone) under its final
/// class.
fn finish(hold: Observed, end: Option<(u64, u64)>, threshold_ns: u64, slot: Option<&LoopSlot>) {
    let Some(mut stall) = hold.stall else {
        return;
    };
    let report = &mut stall.report;
    report.ongoing = false;
    let at_least = match end {
        Some((end_ns, polls)) => {
            report.elapsed_seconds = end_ns.saturating_sub(hold.view.hold_ns) as f64 / 1e9;
            report.polls = polls;
            ""
        }
        None => "at least ",
    };
    let held_ns = (report.elapsed_seconds * 1e9) as u64;
    let stopped_ns = stopped_between(hold.view.hold_ns, hold.view.hold_ns + held_ns);
    report.stopped_seconds = stopped_ns as f64 / 1e9;
    if by_stop(held_ns, stopped_ns, threshold_ns) {
        stall.class = StallClass::Stopped;
        StallClass::Stopped.as_str().clone_into(&mut report.class);
    }
    {
        let mut ring = lock(&RING);
        if let Some(slot) = slot {
            slot.count_stall(stall.class);
        }
        if let Some(id) = stall.ring_id {
            ring.update(id, report);
        }
    }
    let ms = report.elapsed_seconds * 1e3;
    let stopped_ms = report.stopped_seconds * 1e3;
    let task = named(&report.task_name, &report.note, &report.location);
    let what = if report.class == StallClass::Stopped.as_str() {
        format!(
            "the process was stopped or frozen (SIGSTOP, a debugger, a VM pause) for \
             ~{stopped_ms:.0} ms of the {at_least}{ms:.0} ms the loop was held; no task blocked \
             it (task {task} was being polled)"
        )
    } else if stopped_ns > 0 {
        format!(
            "task {task} ran for {at_least}{ms:.0} ms, ~{stopped_ms:.0} ms of it with the \
             process stopped or frozen"
        )
    } else if report.polls <= 1 {
        format!("task {task} ran for {at_least}{ms:.0} ms")
    } else {
        format!(
            "the microtask drain after {} held the loop for {at_least}{ms:.0} ms: {} polls, \
             mostly {task}",
            report.began_with, report.polls
        )
    };
    WROTE.fetch_add(1, Ordering::Relaxed);
    if report.reports > 0 {
        tracing::info!(
            target: "nodus::watchdog",
            loop_id = report.loop_id,
            task_id = report.task_id,
            "stall ended: {what}"
        );
    } else {
        tracing::debug!(
            target: "nodus::watchdog",
            loop_id = report.loop_id,
            task_id = report.task_id,
            "stall ended (not reported: rate limit): {what}"
        );
    }
}

/// A task as reports name it: `"http:app" (src/main.rs:9:5)`, with its note if it has one:
/// `"http:app" [GET /slow/thing] (src/main.rs:9:5)`.
pub(crate) fn named(name: &str, note: &str, location: &str) -> String {
    if note.is_empty() {
        format!("{name:?} ({location})")
    } else {
        format!("{name:?} [{note}] ({location})")
    }
}

/// The one-line warning. One poll: `loop stalled: task "hog" (examples/stall.rs:21:5) has been
/// running for 101 ms, on-cpu (cpu 99%, waiting for cpu 0%)`; a task with a note names it:
/// `task "http:app" [GET /slow/thing] (src/main.rs:9:5)`. A long poll after others: the same,
/// then `, 103 ms in the microtask drain after "timer" (src/app.rs:9:5) (3 polls)`. A drain of
/// short polls: `loop stalled: held for 101 ms in the microtask drain after "main"
/// (src/main.rs:4:5): 20345 polls, mostly "ping" (src/main.rs:12:9) in 6 of 10 looks, then
/// "pong" (src/main.rs:12:9) in 4, on-cpu (...)`. A task on a CPU that also waited for one 30 %
/// of the window or more: `on-cpu (cpu 20%, waiting for cpu 80%: slowed by CPU contention, a
/// stall on an idle machine too)`.
fn stall_message(
    report: &StallReport,
    shape: &Shape,
    seen: &Seen,
    class: StallClass,
    suppressed: u64,
) -> String {
    let held_ms = report.elapsed_seconds * 1e3;
    let stopped_ms = report.stopped_seconds * 1e3;
    let task = named(&report.task_name, &report.note, &report.location);
    if class == StallClass::Stopped {
        let mut message = format!(
            "loop stalled: the process was stopped or frozen (SIGSTOP, a debugger, a VM pause) \
             for ~{stopped_ms:.0} ms of the {held_ms:.0} ms the loop has been held; no task \
             blocked it (task {task} was being polled)"
        );
        suppressed_note(&mut message, suppressed);
        return message;
    }
    let mut message = match *shape {
        Shape::Poll => format!("loop stalled: task {task} has been running for {held_ms:.0} ms"),
        Shape::LongPoll { running_ns } => format!(
            "loop stalled: task {task} has been running for {:.0} ms, {held_ms:.0} ms in the \
             microtask drain after {} ({} polls)",
            running_ns as f64 / 1e6,
            report.began_with,
            report.polls,
        ),
        Shape::Drain => {
            let mut m = format!(
                "loop stalled: held for {held_ms:.0} ms in the microtask drain after {}: {} polls",
                report.began_with, report.polls,
            );
            let (first, second) = seen.top();
            let poll = |p: &SeenPoll| named(p.name, &p.note.render(), &location_str(p.location));
            if let Some(p) = first {
                let _ = write!(
                    m,
                    ", mostly {} in {} of {} looks",
                    poll(&p),
                    p.looks,
                    seen.looks
                );
            }
            if let Some(p) = second {
                let _ = write!(m, ", then {} in {}", poll(&p), p.looks);
            }
            m
        }
    };
    let _ = write!(message, ", {class}");
    if class == StallClass::Unknown {
        message.push_str(" (no scheduler data)");
    } else {
        let _ = write!(
            message,
            " (cpu {:.0}%, waiting for cpu {:.0}%",
            report.on_cpu_share * 100.0,
            report.waiting_for_cpu_share * 100.0
        );
        // On a CPU long enough to stall the loop by itself, slowed down by other threads.
        if class == StallClass::OnCpu && report.waiting_for_cpu_share >= WAITING_FOR_CPU_SHARE {
            message.push_str(": slowed by CPU contention, a stall on an idle machine too");
        }
        message.push(')');
    }
    if stopped_ms > 0.0 {
        let _ = write!(
            message,
            "; the process was stopped or frozen for ~{stopped_ms:.0} ms of it"
        );
    }
    suppressed_note(&mut message, suppressed);
    message
}

fn suppressed_note(message: &mut String, suppressed: u64) {
    if suppressed > 0 {
        let _ = write!(
            message,
            "; {suppressed} earlier stall reports suppressed by the rate limit"
        );
    }
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
        let none = Seen::default();
        assert_eq!(
            stall_message(&report, &Shape::Poll, &none, StallClass::OnCpu, 0),
            "loop stalled: task \"hog\" (examples/stall.rs:21:5) has been running for 101 ms, on-cpu (cpu 99%, waiting for cpu 0%)"
        );
        let crowded = StallReport {
            on_cpu_share: 0.2,
            waiting_for_cpu_share: 0.8,
            ..report.clone()
        };
        assert!(
            stall_message(&crowded, &Shape::Poll, &none, StallClass::OnCpu, 0).ends_with(
                "on-cpu (cpu 20%, waiting for cpu 80%: slowed by CPU contention, a stall on an \
                 idle machine too)"
            )
        );
        assert!(
            stall_message(&crowded, &Shape::Poll, &none, StallClass::WaitingForCpu, 0)
                .ends_with("waiting-for-cpu (cpu 20%, waiting for cpu 80%)")
        );
        let message = stall_message(&report, &Shape::Poll, &none, StallClass::Unknown, 3);
        assert!(
            message.ends_with(
                "unknown (no scheduler data); 3 earlier stall reports suppressed by the rate limit"
            ),
            "{message}"
        );
        assert!(!message.contains('\n'));
        let noted = StallReport {
            note: "GET /slow/thing".into(),
            ..report
        };
        let message = stall_message(&noted, &Shape::Poll, &none, StallClass::OnCpu, 0);
        assert!(
            message.starts_with(
                "loop stalled: task \"hog\" [GET /slow/thing] (examples/stall.rs:21:5) has been \
                 running for 101 ms"
            ),
            "{message}"
        );
    }

    #[test]
    fn a_drain_of_short_polls_names_the_ones_seen_most() {
        static PING: &str = "ping";
        static PONG: &str = "pong";
        let (main_at, ping_at, pong_at) =
            (Location::caller(), Location::caller(), Location::caller());
        let view = |name, location| HoldView {
            seq: 0,
            task_id: 1,
            name,
            location,
            start_ns: 0,
            hold_seq: 0,
            hold_ns: 1,
            opener: "main",
            opener_location: main_at,
            note: Note::default(),
        };
        let mut seen = Seen::default();
        for (name, location, looks) in [(PONG, pong_at, 4), (PING, ping_at, 6)] {
            for _ in 0..looks {
                seen.add(&view(name, location));
            }
        }
        let at = |l: &Location<'_>| location_str(l);
        let report = StallReport {
            elapsed_seconds: 0.1012,
            polls: 20345,
            began_with: format!("\"main\" ({})", at(main_at)),
            on_cpu_share: 0.994,
            ..StallReport::default()
        };
        assert_eq!(
            stall_message(&report, &Shape::Drain, &seen, StallClass::OnCpu, 0),
            format!(
                "loop stalled: held for 101 ms in the microtask drain after \"main\" ({}): 20345 \
                 polls, mostly \"ping\" ({}) in 6 of 10 looks, then \"pong\" ({}) in 4, on-cpu \
                 (cpu 99%, waiting for cpu 0%)",
                at(main_at),
                at(ping_at),
                at(pong_at)
            )
        );
        let report = StallReport {
            task_name: "hog".into(),
            location: "examples/stall.rs:21:5".into(),
            polls: 3,
            ..report
        };
        let message = stall_message(
            &report,
            &Shape::LongPoll {
                running_ns: 95_000_000,
            },
            &seen,
            StallClass::OnCpu,
            0,
        );
        assert!(
            message.starts_with(&format!(
                "loop stalled: task \"hog\" (examples/stall.rs:21:5) has been running for 95 ms, \
                 101 ms in the microtask drain after \"main\" ({}) (3 polls), on-cpu",
                at(main_at)
            )),
            "{message}"
        );
    }

    /// The reviewer's case: a handler noted `GET /spin/2500` holds the loop, the watchdog
    /// reports it named so, then looks again after the handler returned and its task cleared the
    /// note, the poll still running (writing the response). The stall keeps the note, in the
    /// report, the ring buffer and the end line; before, that last look emptied it. A note seen
    /// with a poll in a drain is kept the same way, and a new holder never shows an old one.
    #[test]
    fn a_stall_keeps_its_note_after_the_handler_that_set_it_returned() {
        let _serial = crate::watchdog::tests::serial();
        static HANDLER: &str = "http:spin";
        static OTHER: &str = "other";
        let (at, other_at) = (Location::caller(), Location::caller());
        let loop_id = crate::watchdog::tests::ID_BASE + 0x4e07;
        let threshold_ns = 10_000_000;
        let start = now_ns() - 3 * threshold_ns;
        let view = |seq, name, location, note| HoldView {
            seq,
            task_id: 7,
            name,
            location,
            start_ns: start,
            hold_seq: 0,
            hold_ns: start,
            opener: HANDLER,
            opener_location: at,
            note,
        };
        let noted = Note::prefixed("GET ", "/spin/2500");
        let proc = ThreadProc::open(rustix::thread::gettid().as_raw_pid());
        let mut limiter = RateLimit {
            budget_ns: REPORT_BURST * REPORT_COST_NS,
            last_ns: now_ns(),
            suppressed: 0,
        };
        let mut hold = Observed {
            view: view(0, HANDLER, at, noted),
            baseline: proc.sample(),
            seen: Seen::default(),
            stall: None,
        };
        let mut look = |hold: &mut Observed, view: HoldView, steady| {
            hold.view = view;
            hold.seen.add(&view);
            observe(loop_id, threshold_ns, &proc, hold, steady, &mut limiter);
            hold.stall.as_ref().expect("stalled").report.note.clone()
        };
        assert_eq!(
            look(&mut hold, view(0, HANDLER, at, noted), false),
            "GET /spin/2500"
        );
        let cleared = Note::default();
        assert_eq!(
            look(&mut hold, view(0, HANDLER, at, cleared), true),
            "GET /spin/2500",
            "the note is kept once the handler returned"
        );
        finish(hold, Some((now_ns(), 1)), threshold_ns, None);
        let stalls = crate::watchdog::recent_stalls_for(loop_id);
        assert_eq!(stalls.len(), 1);
        assert_eq!(stalls[0].note, "GET /spin/2500", "in the ring buffer");
        assert!(!stalls[0].ongoing);

        // Another holder takes its own note, none here: the old one does not stick to it.
        let mut hold = Observed {
            view: view(0, HANDLER, at, noted),
            baseline: proc.sample(),
            seen: Seen::default(),
            stall: None,
        };
        look(&mut hold, view(0, HANDLER, at, noted), false);
        assert_eq!(look(&mut hold, view(0, OTHER, other_at, cleared), true), "");
        finish(hold, Some((now_ns(), 1)), threshold_ns, None);

        // In a drain, the note seen with a poll is kept by `Seen` when a later look at the same
        // poll finds none.
        let mut seen = Seen::default();
        seen.add(&view(2, HANDLER, at, noted));
        seen.add(&view(4, HANDLER, at, cleared));
        seen.add(&view(6, HANDLER, at, cleared));
        let top = seen.top().0.expect("a poll seen");
        assert_eq!(
            (top.looks, top.note.render().as_str()),
            (3, "GET /spin/2500")
        );
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
