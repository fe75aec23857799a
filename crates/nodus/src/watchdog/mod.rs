//! The stall watchdog: one process-wide thread that reports the loop held too long *while it is
//! still held* (DESIGN.md section 3). Node, tokio and asyncio only see a slow poll after it
//! returns, so an infinite loop in a callback is never reported there.
//!
//! A stall is a *hold* longer than the threshold: the loop has not left one macrotask callback and
//! the drain after it (next-ticks, microtasks, woken tasks' polls) since the hold's first poll.
//! One long poll is a hold; so is a drain of many short polls that never empties (two tasks that
//! wake each other, a chain of closures: Node's order, which starves timers and I/O as Node does
//! on a promise ping-pong). Either is one stall, one report per backoff step, one ring entry.
//!
//! How it works:
//! - Every loop owns a `LoopSlot` and publishes in it which task it is polling and since when
//!   (`LoopSlot::begin` / `LoopSlot::end`), and the hold: the first `begin` after a drain returned
//!   opens it, `LoopSlot::end_hold` (the drain returned) closes it. The slot is a seqlock: `begin`
//!   makes the sequence odd, writes the record, then makes it even with a release store; the
//!   watchdog reads the record and keeps it only if the sequence was even and unchanged around the
//!   reads. The loop never waits and never makes a syscall: a slot update is a handful of plain
//!   stores on x86-64, and no clock read is added (the hold starts at its first poll's start and
//!   ends at the drain's last read).
//! - The watchdog thread (`nodus-watchdog`, started by the first `register`) scans all slots. While
//!   any loop is busy it sleeps until the earliest moment a hold in progress reaches its threshold
//!   (or its next backoff report), and never longer than a tick (10 ms, or half the smallest
//!   threshold), because a new hold starts without telling it. While every loop is blocked in epoll
//!   (`LoopSlot::enter_idle`) it parks; `LoopSlot::leave_idle` unparks it only if it is parked.
//! - At each look it notes the poll that began last (a sampling profile of the hold). A report
//!   names the poll in progress if it has run for at least half the hold (a single long poll, as
//!   before), else the poll seen most often, with the hold's poll count (the slot's sequence
//!   counts `begin`s) and the callback that opened it.
//! - A task's name is static (a class, `http:app`); what it is doing may not be. A task can
//!   attach a short note to itself (`nodus::task::set_note`: `nodus-http` sets `GET /path` for
//!   the request a handler serves), which the loop copies into the slot's own words (`note`,
//!   under a second seqlock) when it is set, and again when a task that kept one is polled: the
//!   report names the note with the task, while the stall lasts (`StallReport::note`).
//! - A stall is reported (one `tracing` warning, target `nodus::watchdog`) at the threshold, then at
//!   2x, 4x, 8x... the threshold while it lasts, at most about 10 reports per second across all
//!   stalls; suppressed reports are counted in the next one. The last 64 stalls stay in a ring
//!   buffer ([`recent_stalls`]); an ongoing one is updated in place at every tick and when it ends,
//!   with its exact duration and poll count: the loop leaves the end of a hold that reached the
//!   threshold in its slot (a loop dropped before the next tick leaves only the last sample, a
//!   lower bound). Every stall is also counted in its loop's slot when the watchdog sees it end,
//!   under its final class ([`StallCounts`], for the loop's life: the ring keeps only the last
//!   64).
//!
//! Why a thread and not a signal (Seastar arms a per-thread timer signal): a handler runs on the
//! stalled thread itself, so it interrupts the syscall a blocked loop is in (`EINTR` or a restart:
//! the program's behaviour changes), is not delivered at all in an uninterruptible sleep (D), and
//! must be async-signal-safe: it may not allocate, lock or log, so it could not write a report.
//! A thread perturbs nothing: it reads the slot and the loop thread's scheduler state from outside.
//!
//! How a stall is classified (on-CPU, blocked in a syscall, waiting for a CPU) from the loop
//! thread's CPU clock, `schedstat` and `status` is explained in `proc`. A stall that the whole
//! process being stopped or frozen (SIGSTOP, a debugger, a VM pause) made one, which every clock
//! reads as a long poll, is of class `stopped` instead, and names the poll only as the one under
//! way: the watchdog sees the stop as its own oversleep (`freeze`).
//!
//! Invariants:
//! - `begin`, `end`, `end_hold`, `enter_idle`, `leave_idle` and the note's `set_note`,
//!   `republish_note` and `clear_note` run on the loop thread and never allocate, lock or make a
//!   syscall, except `leave_idle` unparking a parked watchdog (once per
//!   idle period).
//! - Every drain's return closes the hold, and so does the loop stopping (`Meter::loop_running`,
//!   which also runs when a callback unwinds out of `block_on`/`run`): a hold never spans a wait
//!   in epoll.
//! - `hold_ns == 0` in a slot means the loop holds nothing, `start_ns == 0` that no poll is in
//!   progress (`begin` stores at least 1 in both).
//! - Only the watchdog thread reports stalls, reads `/proc`, writes the ring buffer and the
//!   record of stops (`freeze`), and counts stalls in the slots (under the `RING` lock); a loop
//!   reads that record only to log a slow poll. A loop's own snapshot reads its entries with
//!   what the loop knows better (`stalls_seen_by_loop`: a stall the watchdog has not yet seen
//!   end is over unless it is the hold under way), and its counts, but never writes them.
//! - `ACTIVITY` (one word: busy-loop count + parked bit) is the only state shared by all loops; it
//!   is touched once per `enter_idle`/`leave_idle`, i.e. when a loop is about to block anyway.
//! - Like any thread, the watchdog does not survive a `fork` without exec. Its two locks
//!   (`PENDING`, `RING`) are never copied held into a forked process (`crate::atfork` takes them
//!   around every `fork`): a process forked without `exec` can make a `Runtime`.
//!
//! Layout: this file holds the public API (`register`, [`recent_stalls`], [`StallReport`],
//! [`StallClass`], [`StallCounts`]), the ring buffer and the state shared by the loops and the watchdog thread
//! (`ACTIVITY`, the pending registrations); `slot` is the seqlock `LoopSlot` the loop writes;
//! `note` a task's note as the slot keeps it (cut, and escaped when shown); `freeze` the
//! process stops the watchdog has seen; `thread` is the watchdog thread (scan, observe, backoff, rate limit, report messages); `proc`
//! reads `/proc` and classifies a stall.

// With the `measure` feature off (the overhead benchmark only) this is compiled but not used.
#![cfg_attr(not(feature = "measure"), allow(dead_code))]

mod freeze;
mod note;
mod proc;
mod slot;
mod thread;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::thread::Thread;

use serde::{Deserialize, Serialize};

// Without `measure` (the overhead benchmark only) nothing outside the watchdog uses them.
#[cfg_attr(not(feature = "measure"), allow(unused_imports))]
pub(crate) use note::Note;
pub(crate) use slot::LoopSlot;
use slot::{IDLE, REGISTERED};
#[cfg_attr(not(feature = "measure"), allow(unused_imports))]
pub(crate) use thread::named;

/// Stalls kept in the ring buffer.
pub(crate) const RING_CAPACITY: usize = 64;

/// Bit 63: the watchdog is parked. Low bits: live registered slots not in `enter_idle`.
static ACTIVITY: AtomicU64 = AtomicU64::new(0);
const PARKED: u64 = 1 << 63;
/// The watchdog thread, once started (`None` if it could not be spawned).
static WATCHDOG: OnceLock<Option<Thread>> = OnceLock::new();
/// Slots registered since the watchdog's last scan.
static PENDING: Mutex<Vec<Weak<LoopSlot>>> = Mutex::new(Vec::new());
static RING: Mutex<Ring> = Mutex::new(Ring::new());

/// The watchdog's locks, held across a `fork` by the forking thread (see `crate::atfork`).
pub(crate) type PendingGuard = MutexGuard<'static, Vec<Weak<LoopSlot>>>;
pub(crate) type RingGuard = MutexGuard<'static, Ring>;

/// [`PENDING`]'s lock without the fork handlers' registration: for the handlers themselves.
pub(crate) fn lock_pending() -> PendingGuard {
    bare_lock(&PENDING)
}

/// [`RING`]'s lock without the fork handlers' registration: for the handlers themselves.
pub(crate) fn lock_ring() -> RingGuard {
    bare_lock(&RING)
}

/// One stall, as kept in the ring buffer and serialized in snapshots.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct StallReport {
    pub loop_id: u64,
    /// The task (or callback, or closure queue) that held the loop, as of the latest observation:
    /// the poll in progress if it has run for at least half the stall, else the one the watchdog
    /// saw running most often in it (it looks at every tick). For a stall of one poll, that poll.
    pub task_id: u64,
    pub task_name: String,
    /// The note that task had attached to itself when it was seen holding the loop
    /// (`nodus::task::set_note`: `GET /slow/thing` for a request of a `nodus-http` server), at
    /// most 64 bytes, control characters and backslashes escaped; empty if none.
    pub note: String,
    /// "file:line:col" of the spawn / scheduling site.
    pub location: String,
    /// How long the loop had been held at the latest observation; once ended, how long it was
    /// held (the loop records the end; only a loop that unwound out of a poll, or a later long
    /// stall of the loop before the watchdog saw this one end, leaves a lower bound). A stall is
    /// a macrotask callback and the drain after it (next-ticks, microtasks, woken tasks), timed
    /// from the first poll to the drain's end. In a loop's own snapshot, an ongoing stall is the
    /// one that took the snapshot, timed to that moment.
    pub elapsed_seconds: f64,
    /// Polls the loop ran in the stall: task polls, callbacks and next-tick/microtask closures
    /// (at the latest observation; exact once ended, unless the duration is a lower bound).
    /// 1: a single poll held the loop; many: a drain that did not empty (tasks waking each
    /// other, a chain of closures).
    pub polls: u64,
    /// The poll or callback that began the stall, `"name" (file:line:col)`: the macrotask whose
    /// drain held the loop (for a stall of one poll, the task itself).
    pub began_with: String,
    /// "on-cpu" | "blocked-in-syscall" | "waiting-for-cpu" | "stopped" | "unknown"
    /// ([`StallClass::as_str`]).
    pub class: String,
    /// How long the process was stopped or frozen during the stall (SIGSTOP, a debugger, a VM
    /// pause), as the watchdog measured it (its own oversleep, within a tick); 0 if it was not.
    /// A stall that would not have reached the threshold without it is classed "stopped".
    pub stopped_seconds: f64,
    /// Fraction of the stall window the loop thread was on a CPU.
    pub on_cpu_share: f64,
    /// Fraction of the stall window the loop thread was runnable but waiting for a CPU.
    pub waiting_for_cpu_share: f64,
    /// Wall-clock time of the first report, milliseconds since the Unix epoch.
    pub at_unix_ms: u64,
    /// The stall was still going on when this was read. From [`recent_stalls`], until the watchdog's
    /// next look (10 ms at most while the loop is busy) after it ended; in a loop's own snapshot,
    /// only for the poll that took the snapshot.
    pub ongoing: bool,
    /// How long the loop had been held when the watchdog first reported it.
    pub detected_after_seconds: f64,
    /// Warnings logged for this stall (the first one and the backoff repeats that the rate limit let
    /// through).
    pub reports: u32,
}

/// What the loop thread was doing during a stall.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StallClass {
    /// Running: CPU-bound code in the poll (maybe slowed down by other threads, see
    /// `WaitingForCpu`).
    OnCpu,
    /// Sleeping in the kernel (state S or D) after sleeping at least a tenth of the window, or
    /// woken from a sleep during the window after spending most of it off a CPU without waiting
    /// for one. Never a thread that stayed runnable (state R, no sleep) through the window.
    BlockedInSyscall,
    /// Runnable but kept off the CPU by other threads for at least 30 % of the window (for a
    /// thread runnable throughout the window, all the time it was not on a CPU, including a
    /// run-queue wait still in progress), so long that without the wait the hold would not have
    /// reached the threshold: its own CPU time (and any sleep) is under it. A task that ran for
    /// the threshold itself is `OnCpu`, however long it also waited.
    WaitingForCpu,
    /// The whole process was stopped or frozen (SIGSTOP, a debugger, a VM pause) for so much of
    /// the stall that without the stop it would not have reached the threshold: no task blocked
    /// the loop.
    Stopped,
    /// `/proc` could not be read, or the window was too short to tell on-CPU from waiting.
    Unknown,
}

impl StallClass {
    /// Every class, in the order of [`StallCounts`]' fields.
    pub const ALL: [StallClass; 5] = [
        StallClass::OnCpu,
        StallClass::BlockedInSyscall,
        StallClass::WaitingForCpu,
        StallClass::Stopped,
        StallClass::Unknown,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            StallClass::OnCpu => "on-cpu",
            StallClass::BlockedInSyscall => "blocked-in-syscall",
            StallClass::WaitingForCpu => "waiting-for-cpu",
            StallClass::Stopped => "stopped",
            StallClass::Unknown => "unknown",
        }
    }
}

impl std::fmt::Display for StallClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How many stalls of one loop the watchdog has seen end, by class (each counted once, under
/// its final class: the class its entry in the recent stalls ends with), for the loop's life.
/// Unlike the recent stalls, which keep the last 64, these only grow. A stall is counted when
/// the watchdog sees it end, at its next look (a tick, 10 ms at most, after the loop left it),
/// so a snapshot taken right after a stall may show it ended in `stalls` but not count it yet;
/// one that never ends (a loop stuck for good) is never counted. Keys are the class names.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct StallCounts {
    #[serde(rename = "on-cpu")]
    pub on_cpu: u64,
    #[serde(rename = "blocked-in-syscall")]
    pub blocked_in_syscall: u64,
    #[serde(rename = "waiting-for-cpu")]
    pub waiting_for_cpu: u64,
    pub stopped: u64,
    pub unknown: u64,
}

impl StallCounts {
    /// The count of `class`.
    pub fn get(&self, class: StallClass) -> u64 {
        match class {
            StallClass::OnCpu => self.on_cpu,
            StallClass::BlockedInSyscall => self.blocked_in_syscall,
            StallClass::WaitingForCpu => self.waiting_for_cpu,
            StallClass::Stopped => self.stopped,
            StallClass::Unknown => self.unknown,
        }
    }

    fn get_mut(&mut self, class: StallClass) -> &mut u64 {
        match class {
            StallClass::OnCpu => &mut self.on_cpu,
            StallClass::BlockedInSyscall => &mut self.blocked_in_syscall,
            StallClass::WaitingForCpu => &mut self.waiting_for_cpu,
            StallClass::Stopped => &mut self.stopped,
            StallClass::Unknown => &mut self.unknown,
        }
    }

    /// Every class's count (saturating).
    pub fn total(&self) -> u64 {
        StallClass::ALL
            .iter()
            .fold(0u64, |sum, &c| sum.saturating_add(self.get(c)))
    }
}

/// Registers a loop's slot with the watchdog thread (starting it if needed). Call it on the loop
/// thread, like `LoopSlot::new`. The watchdog holds a `Weak`: a dropped loop is pruned at its next
/// scan. An unregistered slot costs the same but is never watched and never wakes the watchdog.
pub(crate) fn register(slot: &Arc<LoopSlot>) {
    debug_assert_eq!(
        rustix::thread::gettid().as_raw_pid(),
        slot.tid,
        "register a slot on its loop thread"
    );
    let flags = slot.flags.load(Ordering::Relaxed);
    if flags & REGISTERED != 0 {
        return;
    }
    slot.flags.store(flags | REGISTERED, Ordering::Relaxed);
    if flags & IDLE == 0 {
        ACTIVITY.fetch_add(1, Ordering::AcqRel);
    }
    lock(&PENDING).push(Arc::downgrade(slot));
    let thread = WATCHDOG.get_or_init(|| {
        match std::thread::Builder::new()
            .name("nodus-watchdog".into())
            .spawn(thread::run)
        {
            Ok(handle) => Some(handle.thread().clone()),
            Err(err) => {
                tracing::error!(
                    target: "nodus::watchdog",
                    "cannot start the watchdog thread: {err}; stalls will not be reported"
                );
                None
            }
        }
    });
    if let Some(thread) = thread {
        thread.unpark();
    }
}

/// The current loop's holds mirrored to a word that another process reads (a cluster worker's
/// board: its primary sees whether the loop is in a long hold), until this is dropped.
pub(crate) struct HoldMirror {
    #[cfg(feature = "measure")]
    slot: Arc<LoopSlot>,
    /// Dropped on the loop thread, which alone stores through the mirror.
    _loop_thread: std::marker::PhantomData<*const ()>,
}

pub(crate) use slot::MIRROR_NO_HOLD;

impl HoldMirror {
    /// Mirrors the current loop's holds to `word` (see `LoopSlot::mirror_holds`); `None` outside
    /// a loop or with measurements compiled out, when nothing is written to it.
    ///
    /// # Safety
    /// `word` stays valid for atomic stores until the returned mirror is dropped.
    pub(crate) unsafe fn start(word: &AtomicU64) -> Option<HoldMirror> {
        #[cfg(feature = "measure")]
        {
            let slot = crate::rt::context::try_with_core(|core| core.meter.slot.clone())?;
            // SAFETY: the caller keeps `word` valid until the mirror is dropped, which unsets it
            // on this thread (the mirror is not `Send`).
            unsafe { slot.mirror_holds(word) };
            Some(HoldMirror {
                slot,
                _loop_thread: std::marker::PhantomData,
            })
        }
        #[cfg(not(feature = "measure"))]
        {
            let _ = word;
            None
        }
    }
}

impl Drop for HoldMirror {
    fn drop(&mut self) {
        // SAFETY: null unsets the mirror; this is the loop thread (`HoldMirror` is not `Send`).
        #[cfg(feature = "measure")]
        unsafe {
            self.slot.mirror_holds(std::ptr::null())
        };
    }
}

/// The most recent stalls (last 64, process-wide), oldest first. Ongoing ones have `ongoing: true`
/// (one that ended since the watchdog's last look still says so, with the duration seen then: a
/// loop's own snapshot knows better, see [`StallReport::ongoing`]).
pub fn recent_stalls() -> Vec<StallReport> {
    lock(&RING)
        .entries
        .iter()
        .map(|e| e.report.clone())
        .collect()
}

/// The most recent stalls of one loop, oldest first.
pub fn recent_stalls_for(loop_id: u64) -> Vec<StallReport> {
    lock(&RING)
        .entries
        .iter()
        .filter(|e| e.report.loop_id == loop_id)
        .map(|e| e.report.clone())
        .collect()
}

/// The most recent stalls of the loop that owns `slot`, oldest first, as that loop knows them at
/// `now`: called on the loop's own thread (its snapshot), which is running this code, so a stall
/// the watchdog has not yet seen end is over unless it is the hold under way (the callback and
/// drain the snapshot is taken in). An ended one is reported ended, with its exact duration and
/// poll count (the end the loop left in the slot; a lower bound only if a later long hold has
/// overwritten it); the hold under way, with its duration to `now`. With them, the loop's
/// stall counts, read under the same lock (a stall the watchdog has seen end is counted).
pub(crate) fn stalls_seen_by_loop(slot: &LoopSlot, now: u64) -> (Vec<StallReport>, StallCounts) {
    let current = slot.current_hold();
    let ring = lock(&RING);
    let stalls = ring
        .entries
        .iter()
        .filter(|e| e.report.loop_id == slot.loop_id)
        .map(|e| {
            let mut report = e.report.clone();
            if report.ongoing {
                if current == Some(e.hold_seq) {
                    report.elapsed_seconds = now.saturating_sub(e.start_ns) as f64 / 1e9;
                } else {
                    report.ongoing = false;
                    if let Some((end, polls)) = slot.long_end(e.hold_seq) {
                        report.elapsed_seconds = end.saturating_sub(e.start_ns) as f64 / 1e9;
                        report.polls = polls;
                    }
                }
            }
            report
        })
        .collect();
    (stalls, slot.stall_counts())
}

#[cold]
fn wake_parked_watchdog() {
    // Only the caller that clears the bit unparks, so a burst of loops waking costs one unpark.
    if ACTIVITY.fetch_and(!PARKED, Ordering::AcqRel) & PARKED != 0
        && let Some(Some(thread)) = WATCHDOG.get()
    {
        thread.unpark();
    }
}

fn lock<T>(mutex: &'static Mutex<T>) -> MutexGuard<'static, T> {
    crate::atfork::register();
    bare_lock(mutex)
}

fn bare_lock<T>(mutex: &'static Mutex<T>) -> MutexGuard<'static, T> {
    // These locks guard plain data updates only; a panic cannot leave the data torn.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

pub(crate) struct Ring {
    /// Ids are consecutive, so an id's index is `id - front id`.
    entries: VecDeque<RingEntry>,
    next_id: u64,
}

struct RingEntry {
    id: u64,
    /// The stalled hold: its slot sequence (`HoldView::hold_seq`) and start.
    hold_seq: u64,
    start_ns: u64,
    report: StallReport,
}

impl Ring {
    const fn new() -> Ring {
        Ring {
            entries: VecDeque::new(),
            next_id: 0,
        }
    }

    /// Adds the report of the stalled hold with slot sequence `hold_seq`, started at `start_ns`.
    fn push(&mut self, report: StallReport, hold_seq: u64, start_ns: u64) -> u64 {
        if self.entries.len() == RING_CAPACITY {
            self.entries.pop_front();
        }
        let id = self.next_id;
        self.next_id += 1;
        self.entries.push_back(RingEntry {
            id,
            hold_seq,
            start_ns,
            report,
        });
        id
    }

    /// Updates the changing fields of entry `id` in place (allocating only for a longer name), if
    /// still held.
    fn update(&mut self, id: u64, report: &StallReport) {
        let Some(front) = self.entries.front().map(|e| e.id) else {
            return;
        };
        let Some(entry) = usize::try_from(id.wrapping_sub(front))
            .ok()
            .and_then(|index| self.entries.get_mut(index))
            .map(|e| &mut e.report)
        else {
            return;
        };
        entry.elapsed_seconds = report.elapsed_seconds;
        entry.polls = report.polls;
        entry.task_id = report.task_id;
        for (to, from) in [
            (&mut entry.class, &report.class),
            (&mut entry.task_name, &report.task_name),
            (&mut entry.note, &report.note),
            (&mut entry.location, &report.location),
        ] {
            if to != from {
                from.clone_into(to);
            }
        }
        entry.on_cpu_share = report.on_cpu_share;
        entry.waiting_for_cpu_share = report.waiting_for_cpu_share;
        entry.stopped_seconds = report.stopped_seconds;
        entry.ongoing = report.ongoing;
        entry.reports = report.reports;
    }
}

#[cfg(test)]
mod tests;
