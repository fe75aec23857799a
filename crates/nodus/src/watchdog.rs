//! The stall watchdog: one process-wide thread that reports a task poll or callback that has been
//! running too long *while it is still running* (DESIGN.md section 3). Node, tokio and asyncio only
//! see a slow poll after it returns, so an infinite loop in a callback is never reported there.
//!
//! How it works:
//! - Every loop owns a `LoopSlot` and publishes in it which task it is polling and since when
//!   (`LoopSlot::begin` / `LoopSlot::end`). The slot is a seqlock: `begin` makes the sequence odd,
//!   writes the record, then makes it even with a release store; the watchdog reads the record and
//!   keeps it only if the sequence was even and unchanged around the reads. The loop never waits
//!   and never makes a syscall: a slot update is a handful of plain stores on x86-64.
//! - The watchdog thread (`nodus-watchdog`, started by the first `register`) scans all slots. While
//!   any loop is busy it sleeps until the earliest moment an in-progress poll reaches its threshold
//!   (or its next backoff report), and never longer than a tick (10 ms, or half the smallest
//!   threshold), because a new poll starts without telling it. While every loop is blocked in epoll
//!   (`LoopSlot::enter_idle`) it parks; `LoopSlot::leave_idle` unparks it only if it is parked.
//! - A stall is reported (one `tracing` warning, target `nodus::watchdog`) at the threshold, then at
//!   2x, 4x, 8x... the threshold while it lasts, at most about 10 reports per second across all
//!   stalls; suppressed reports are counted in the next one. The last 64 stalls stay in a ring
//!   buffer ([`recent_stalls`]); an ongoing one is updated in place at every tick and when it ends.
//!
//! Why a thread and not a signal (Seastar arms a per-thread timer signal): a handler runs on the
//! stalled thread itself, so it interrupts the syscall a blocked loop is in (`EINTR` or a restart:
//! the program's behaviour changes), is not delivered at all in an uninterruptible sleep (D), and
//! must be async-signal-safe: it may not allocate, lock or log, so it could not write a report.
//! A thread perturbs nothing: it reads the slot and the loop thread's scheduler state from outside.
//!
//! Why `schedstat`: `/proc/self/task/<tid>/schedstat` gives the thread's cumulative on-CPU time and
//! run-queue wait (`run_delay`) in nanoseconds, straight from the scheduler, without perf or eBPF
//! privileges. The deltas over the stall window tell a CPU-bound poll from one starved of a CPU
//! by other threads; the `stat` state (R vs S/D) tells a poll blocked in a syscall. `utime`/`stime`
//! in `stat` have a 10 ms resolution and no run-queue wait, so they cannot. The window starts when
//! the watchdog first sees the poll (at most a tick after it started). The shares are exact to about
//! one scheduling slice at each end of the window: the kernel adds a slice or a run-queue wait to
//! the counters only when it ends.
//!
//! Invariants:
//! - `begin`, `end`, `enter_idle` and `leave_idle` run on the loop thread and never allocate, lock
//!   or make a syscall, except `leave_idle` unparking a parked watchdog (once per idle period).
//! - `start_ns == 0` in a slot means no poll is in progress (`begin` stores at least 1).
//! - Only the watchdog thread reports stalls, reads `/proc`, and writes the ring buffer.
//! - `ACTIVITY` (one word: busy-loop count + parked bit) is the only state shared by all loops; it
//!   is touched once per `enter_idle`/`leave_idle`, i.e. when a loop is about to block anyway.
//! - Like any thread, the watchdog does not survive a `fork` without exec.

// With the `measure` feature off (the overhead benchmark only) this is compiled but not used.
#![cfg_attr(not(feature = "measure"), allow(dead_code))]

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::os::fd::OwnedFd;
use std::panic::Location;
use std::sync::atomic::{AtomicPtr, AtomicU8, AtomicU64, AtomicUsize, Ordering, fence};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::thread::Thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::clock::now_ns;

/// Longest sleep while any loop is busy: a new poll is seen at most this long after it starts.
const MAX_TICK_NS: u64 = 10_000_000;
/// Thresholds below this are raised to it: shorter polls are the slow-poll log's business.
const MIN_THRESHOLD_NS: u64 = 10_000_000;
/// Safety timeout of the park while every loop is idle (only prunes dropped loops).
const IDLE_PARK: Duration = Duration::from_secs(1);
/// Stalls kept in the ring buffer.
const RING_CAPACITY: usize = 64;
/// Rate limit across all stalls: one report per `REPORT_COST_NS`, bursts of up to `REPORT_BURST`.
const REPORT_COST_NS: u64 = 100_000_000;
const REPORT_BURST: u64 = 10;
/// A share window shorter than this is noise: the class then comes from the thread state alone.
const MIN_WINDOW_NS: u64 = 1_000_000;
/// Class thresholds on the shares of the stall window.
const WAITING_FOR_CPU_SHARE: f64 = 0.3;
const BLOCKED_MAX_CPU_SHARE: f64 = 0.2;
/// Attempts at a consistent slot read before giving up until the next tick.
const READ_RETRIES: u32 = 64;

/// Bit 63: the watchdog is parked. Low bits: live registered slots not in `enter_idle`.
static ACTIVITY: AtomicU64 = AtomicU64::new(0);
const PARKED: u64 = 1 << 63;
/// The watchdog thread, once started (`None` if it could not be spawned).
static WATCHDOG: OnceLock<Option<Thread>> = OnceLock::new();
/// Slots registered since the watchdog's last scan.
static PENDING: Mutex<Vec<Weak<LoopSlot>>> = Mutex::new(Vec::new());
static RING: Mutex<Ring> = Mutex::new(Ring::new());

#[cfg(test)]
static WAKES: AtomicU64 = AtomicU64::new(0);
/// Wakes by a timeout (not an unpark) from a wait begun while no loop was busy.
#[cfg(test)]
static IDLE_WAKES: AtomicU64 = AtomicU64::new(0);

/// One stall, as kept in the ring buffer and serialized in snapshots.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct StallReport {
    pub loop_id: u64,
    pub task_id: u64,
    pub task_name: String,
    /// "file:line:col" of the spawn / scheduling site.
    pub location: String,
    /// How long the poll had been running at the latest observation (a lower bound once ended).
    pub elapsed_seconds: f64,
    /// "on-cpu" | "blocked-in-syscall" | "waiting-for-cpu" | "unknown" ([`StallClass::as_str`]).
    pub class: String,
    /// Fraction of the stall window the loop thread was on a CPU.
    pub on_cpu_share: f64,
    /// Fraction of the stall window the loop thread was runnable but waiting for a CPU.
    pub waiting_for_cpu_share: f64,
    /// Wall-clock time of the first report, milliseconds since the Unix epoch.
    pub at_unix_ms: u64,
    pub ongoing: bool,
    /// How long the poll had been running when the watchdog first reported it.
    pub detected_after_seconds: f64,
    /// Warnings logged for this stall (the first one and the backoff repeats that the rate limit let
    /// through).
    pub reports: u32,
}

/// What the loop thread was doing during a stall.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StallClass {
    /// Running: CPU-bound code in the poll.
    OnCpu,
    /// Sleeping in the kernel (state S or D), or off-CPU most of the window without waiting for one.
    BlockedInSyscall,
    /// Runnable but kept off the CPU by other threads for at least 30 % of the window.
    WaitingForCpu,
    /// `/proc` could not be read, or the window was too short to tell on-CPU from waiting.
    Unknown,
}

impl StallClass {
    pub fn as_str(self) -> &'static str {
        match self {
            StallClass::OnCpu => "on-cpu",
            StallClass::BlockedInSyscall => "blocked-in-syscall",
            StallClass::WaitingForCpu => "waiting-for-cpu",
            StallClass::Unknown => "unknown",
        }
    }
}

impl std::fmt::Display for StallClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A loop's published "what am I running since when" record, read by the watchdog thread.
#[repr(align(64))]
pub(crate) struct LoopSlot {
    loop_id: u64,
    tid: i32,
    threshold_ns: u64,
    /// Seqlock sequence: odd while `begin` writes the fields below.
    seq: AtomicU64,
    task_id: AtomicU64,
    name_ptr: AtomicPtr<u8>,
    name_len: AtomicUsize,
    location: AtomicPtr<Location<'static>>,
    /// Poll start (`now_ns`), 0 when no poll is in progress.
    start_ns: AtomicU64,
    /// `IDLE` | `REGISTERED`, written by the loop thread only (plain loads and stores). The slot
    /// counts in `ACTIVITY` while registered and not idle.
    flags: AtomicU8,
}

const IDLE: u8 = 1;
const REGISTERED: u8 = 2;

/// A consistent read of a slot.
enum SlotRead {
    Idle,
    Poll(PollView),
    /// The loop was writing the slot at every attempt (it was preempted mid-`begin`).
    Torn,
}

#[derive(Clone, Copy)]
struct PollView {
    /// The (even) sequence `begin` left: identifies this poll.
    seq: u64,
    task_id: u64,
    name: &'static str,
    location: &'static Location<'static>,
    start_ns: u64,
}

impl LoopSlot {
    /// Called on the loop thread at loop creation; records the loop thread's tid. A threshold below
    /// 10 ms is raised to 10 ms (shorter slow polls are the slow-poll log's business).
    pub(crate) fn new(loop_id: u64, threshold: Duration) -> Arc<LoopSlot> {
        let threshold_ns = u64::try_from(threshold.as_nanos()).unwrap_or(u64::MAX);
        Arc::new(LoopSlot {
            loop_id,
            tid: rustix::thread::gettid().as_raw_pid(),
            threshold_ns: threshold_ns.max(MIN_THRESHOLD_NS),
            seq: AtomicU64::new(0),
            task_id: AtomicU64::new(0),
            name_ptr: AtomicPtr::new("".as_ptr().cast_mut()),
            name_len: AtomicUsize::new(0),
            location: AtomicPtr::new(std::ptr::from_ref(Location::caller()).cast_mut()),
            start_ns: AtomicU64::new(0),
            flags: AtomicU8::new(0),
        })
    }

    /// Loop thread, at the start of every task poll or macrotask callback.
    #[inline]
    pub(crate) fn begin(
        &self,
        task_id: u64,
        name: &'static str,
        location: &'static Location<'static>,
        start_ns: u64,
    ) {
        // Single writer: the loop thread, so a relaxed load of our own last store is exact.
        let seq = self.seq.load(Ordering::Relaxed);
        self.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        // Orders the odd sequence before the field stores (pairs with the reader's acquire fence).
        fence(Ordering::Release);
        self.task_id.store(task_id, Ordering::Relaxed);
        self.name_ptr
            .store(name.as_ptr().cast_mut(), Ordering::Relaxed);
        self.name_len.store(name.len(), Ordering::Relaxed);
        self.location
            .store(std::ptr::from_ref(location).cast_mut(), Ordering::Relaxed);
        self.start_ns.store(start_ns.max(1), Ordering::Relaxed);
        self.seq.store(seq.wrapping_add(2), Ordering::Release);
    }

    /// Loop thread, when that poll/callback returns.
    #[inline]
    pub(crate) fn end(&self) {
        // One field, so no seqlock round: a reader sees either the poll or "none in progress".
        self.start_ns.store(0, Ordering::Release);
    }

    /// Loop thread, just before blocking in epoll with a non-zero timeout. (A registered loop that
    /// is neither idle nor running keeps the watchdog ticking every 10 ms.)
    #[inline]
    pub(crate) fn enter_idle(&self) {
        let flags = self.flags.load(Ordering::Relaxed);
        if flags & IDLE == 0 {
            self.flags.store(flags | IDLE, Ordering::Relaxed);
            if flags & REGISTERED != 0 {
                ACTIVITY.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }

    /// Loop thread, just after that epoll returns. One atomic RMW unless the watchdog is parked.
    #[inline]
    pub(crate) fn leave_idle(&self) {
        let flags = self.flags.load(Ordering::Relaxed);
        if flags & IDLE != 0 {
            self.flags.store(flags & !IDLE, Ordering::Relaxed);
            // The count and the parked bit share a word, so the watchdog's "park if nobody is
            // busy" CAS and this increment are totally ordered: one of the two sees the other.
            if flags & REGISTERED != 0 && ACTIVITY.fetch_add(1, Ordering::AcqRel) & PARKED != 0 {
                wake_parked_watchdog();
            }
        }
    }

    fn read(&self) -> SlotRead {
        for _ in 0..READ_RETRIES {
            let seq = self.seq.load(Ordering::Acquire);
            if seq & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let task_id = self.task_id.load(Ordering::Relaxed);
            let name_ptr = self.name_ptr.load(Ordering::Relaxed);
            let name_len = self.name_len.load(Ordering::Relaxed);
            let location = self.location.load(Ordering::Relaxed);
            let start_ns = self.start_ns.load(Ordering::Relaxed);
            // Orders the field loads before the re-check (pairs with `begin`'s release fence).
            fence(Ordering::Acquire);
            if self.seq.load(Ordering::Relaxed) != seq {
                continue;
            }
            if start_ns == 0 {
                return SlotRead::Idle;
            }
            // SAFETY: the sequence was even and unchanged around the loads, so no `begin` overlapped
            // them and the pointer/length pair and the location come from one `begin` call (or from
            // `new`). There they were a `&'static str` and a `&'static Location<'static>`: valid
            // UTF-8, never freed, and published by the release store of `seq` we acquired above.
            let (name, location) = unsafe {
                (
                    std::str::from_utf8_unchecked(std::slice::from_raw_parts(name_ptr, name_len)),
                    &*location,
                )
            };
            return SlotRead::Poll(PollView {
                seq,
                task_id,
                name,
                location,
                start_ns,
            });
        }
        SlotRead::Torn
    }
}

impl Drop for LoopSlot {
    fn drop(&mut self) {
        if *self.flags.get_mut() == REGISTERED {
            ACTIVITY.fetch_sub(1, Ordering::AcqRel);
        }
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
            .spawn(run)
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

/// The most recent stalls (last 64, process-wide), oldest first. Ongoing ones have `ongoing: true`.
pub fn recent_stalls() -> Vec<StallReport> {
    lock(&RING).entries.iter().map(|(_, r)| r.clone()).collect()
}

/// The most recent stalls of one loop, oldest first.
pub fn recent_stalls_for(loop_id: u64) -> Vec<StallReport> {
    lock(&RING)
        .entries
        .iter()
        .filter(|(_, r)| r.loop_id == loop_id)
        .map(|(_, r)| r.clone())
        .collect()
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

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // These locks guard plain data updates only; a panic cannot leave the data torn.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

struct Ring {
    /// (id, report); ids are consecutive, so an id's index is `id - front id`.
    entries: VecDeque<(u64, StallReport)>,
    next_id: u64,
}

impl Ring {
    const fn new() -> Ring {
        Ring {
            entries: VecDeque::new(),
            next_id: 0,
        }
    }

    fn push(&mut self, report: StallReport) -> u64 {
        if self.entries.len() == RING_CAPACITY {
            self.entries.pop_front();
        }
        let id = self.next_id;
        self.next_id += 1;
        self.entries.push_back((id, report));
        id
    }

    /// Updates the changing fields of entry `id` in place (without allocating), if still held.
    fn update(&mut self, id: u64, report: &StallReport) {
        let Some(&(front, _)) = self.entries.front() else {
            return;
        };
        let Some((_, entry)) = usize::try_from(id.wrapping_sub(front))
            .ok()
            .and_then(|index| self.entries.get_mut(index))
        else {
            return;
        };
        entry.elapsed_seconds = report.elapsed_seconds;
        if entry.class != report.class {
            entry.class.clear();
            entry.class.push_str(&report.class);
        }
        entry.on_cpu_share = report.on_cpu_share;
        entry.waiting_for_cpu_share = report.waiting_for_cpu_share;
        entry.ongoing = report.ongoing;
        entry.reports = report.reports;
    }
}

// ---------------------------------------------------------------------------------------------
// /proc/self/task/<tid>/{stat,schedstat}

/// Cumulative scheduler counters of one thread (`schedstat`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SchedStat {
    cpu_ns: u64,
    run_delay_ns: u64,
}

/// One reading of a thread's scheduler state.
#[derive(Debug, Clone, Copy)]
struct Sample {
    /// `now_ns()` right after the reads.
    wall_ns: u64,
    /// `stat` field 3 (R, S, D, ...), if read.
    state: Option<u8>,
    sched: Option<SchedStat>,
}

/// The loop thread's `stat` and `schedstat`, kept open and re-read with `pread` at offset 0 (which
/// regenerates a seq_file), so a reading is one syscall per file.
struct ThreadProc {
    stat: Option<OwnedFd>,
    schedstat: Option<OwnedFd>,
}

impl ThreadProc {
    fn open(tid: i32) -> ThreadProc {
        let open = |file: &str| {
            let path = format!("/proc/self/task/{tid}/{file}");
            rustix::fs::open(
                path.as_str(),
                rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
            .ok()
        };
        ThreadProc {
            stat: open("stat"),
            schedstat: open("schedstat"),
        }
    }

    fn read_schedstat(&self) -> Option<SchedStat> {
        let mut buf = [0u8; 128];
        parse_schedstat(read_at_zero(self.schedstat.as_ref()?, &mut buf)?)
    }

    fn read_state(&self) -> Option<u8> {
        let mut buf = [0u8; 1024];
        parse_stat_state(read_at_zero(self.stat.as_ref()?, &mut buf)?)
    }

    fn sample(&self, with_state: bool) -> Sample {
        let sched = self.read_schedstat();
        let wall_ns = now_ns();
        let state = if with_state { self.read_state() } else { None };
        Sample {
            wall_ns,
            state,
            sched,
        }
    }
}

fn read_at_zero<'b>(fd: &OwnedFd, buf: &'b mut [u8]) -> Option<&'b [u8]> {
    // One pread: both files are far shorter than the buffer, and a seq_file fills what it can.
    let n = rustix::io::pread(fd, &mut *buf, 0).ok()?;
    Some(&buf[..n])
}

/// Field 3 of `stat`. The command name (field 2) is in parentheses and may itself contain spaces
/// and parentheses, so the state is the first word after the *last* `)`.
fn parse_stat_state(text: &[u8]) -> Option<u8> {
    let close = text.iter().rposition(|&b| b == b')')?;
    text[close + 1..]
        .iter()
        .copied()
        .find(|b| !b.is_ascii_whitespace())
}

/// `schedstat`: `<on-cpu ns> <run-queue wait ns> <timeslices>`.
fn parse_schedstat(text: &[u8]) -> Option<SchedStat> {
    let mut fields = std::str::from_utf8(text).ok()?.split_ascii_whitespace();
    let cpu_ns = fields.next()?.parse().ok()?;
    let run_delay_ns = fields.next()?.parse().ok()?;
    Some(SchedStat {
        cpu_ns,
        run_delay_ns,
    })
}

/// Shares of [baseline, now] and the class. Shares are 0 when they cannot be computed.
fn classify(baseline: Option<&Sample>, now: &Sample) -> (StallClass, f64, f64) {
    let shares = match (
        baseline.and_then(|b| b.sched.map(|s| (b.wall_ns, s))),
        now.sched,
    ) {
        (Some((base_wall, base)), Some(cur)) if now.wall_ns >= base_wall + MIN_WINDOW_NS => {
            let window = (now.wall_ns - base_wall) as f64;
            let on_cpu = cur.cpu_ns.saturating_sub(base.cpu_ns) as f64;
            let waiting = cur.run_delay_ns.saturating_sub(base.run_delay_ns) as f64;
            // A run-queue wait is added when it ends, whole, so one that began before the window
            // can push the sum past the window: scale back so the shares stay fractions of it.
            let scale = window.max(on_cpu + waiting);
            Some((on_cpu / scale, waiting / scale))
        }
        _ => None,
    };
    let class = match (now.state, shares) {
        (Some(b'S' | b'D'), _) => StallClass::BlockedInSyscall,
        (_, Some((_, waiting))) if waiting >= WAITING_FOR_CPU_SHARE => StallClass::WaitingForCpu,
        (_, Some((on_cpu, _))) if on_cpu < BLOCKED_MAX_CPU_SHARE => StallClass::BlockedInSyscall,
        (_, Some(_)) => StallClass::OnCpu,
        // Runnable (or unreadable) with no usable window: on-CPU and waiting look the same.
        (_, None) => StallClass::Unknown,
    };
    let (on_cpu, waiting) = shares.unwrap_or((0.0, 0.0));
    (class, on_cpu, waiting)
}

// ---------------------------------------------------------------------------------------------
// The watchdog thread

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
    /// `schedstat` when the watchdog first saw this poll: the start of the share window.
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

fn run() {
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
                finish(poll);
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
                    finish(poll);
                }
                return true;
            }
            SlotRead::Poll(view) => view,
        };
        out.active = true;
        if w.poll.as_ref().is_some_and(|p| p.view.seq != view.seq) {
            finish(w.poll.take().expect("checked above"));
        }
        let poll = w.poll.get_or_insert_with(|| Observed {
            view,
            baseline: w.proc.sample(false),
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
    let sample = proc.sample(true);
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
        None => stall.ring_id = Some(ring.push(stall.report.clone())),
    }
    drop(ring);
    due(stall.multiplier)
}

/// A poll that was being observed has ended (or its loop is gone).
fn finish(poll: Observed) {
    let Some(mut stall) = poll.stall else {
        return;
    };
    let report = &mut stall.report;
    report.ongoing = false;
    if let Some(id) = stall.ring_id {
        lock(&RING).update(id, report);
    }
    let ms = report.elapsed_seconds * 1e3;
    if report.reports > 0 {
        tracing::info!(
            target: "nodus::watchdog",
            loop_id = report.loop_id,
            task_id = report.task_id,
            "stall ended: task {:?} ({}) ran for at least {ms:.0} ms",
            report.task_name,
            report.location,
        );
    } else {
        tracing::debug!(
            target: "nodus::watchdog",
            loop_id = report.loop_id,
            task_id = report.task_id,
            "stall ended (not reported: rate limit): task {:?} ({}) ran for at least {ms:.0} ms",
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::thread;

    const MS: u64 = 1_000_000;

    /// The stall tests share the process-wide watchdog and are timing-sensitive on a 2-core
    /// machine: they, and the tests that spin, run one at a time.
    fn serial() -> MutexGuard<'static, ()> {
        static SERIAL: Mutex<()> = Mutex::new(());
        lock(&SERIAL)
    }

    /// Loop ids far from the ones real loops get.
    const ID_BASE: u64 = 0x5741_7463_0000_0000;

    fn spin_until(deadline: u64) {
        while now_ns() < deadline {
            std::hint::spin_loop();
        }
    }

    fn location_string(loc: &Location<'_>) -> String {
        format!("{}:{}:{}", loc.file(), loc.line(), loc.column())
    }

    /// Runs `body` as a poll of task "hog" on a thread playing the loop; returns the poll's
    /// (start, end) in `now_ns`.
    fn spawn_loop(
        loop_id: u64,
        threshold: Duration,
        location: &'static Location<'static>,
        setup: impl FnOnce() + Send + 'static,
        body: impl FnOnce() + Send + 'static,
    ) -> thread::JoinHandle<(u64, u64)> {
        thread::spawn(move || {
            setup();
            let slot = LoopSlot::new(loop_id, threshold);
            register(&slot);
            let start = now_ns();
            slot.begin(7, "hog", location, start);
            body();
            let end = now_ns();
            slot.end();
            (start, end)
        })
    }

    /// Polls loop `loop_id`'s stalls until `pick` finds something; returns it and when it was seen.
    fn wait_for(
        loop_id: u64,
        timeout: Duration,
        pick: fn(&[StallReport]) -> Option<&StallReport>,
    ) -> Option<(StallReport, u64)> {
        let deadline = now_ns() + timeout.as_nanos() as u64;
        while now_ns() < deadline {
            if let Some(found) = pick(&recent_stalls_for(loop_id)) {
                return Some((found.clone(), now_ns()));
            }
            thread::sleep(Duration::from_millis(1));
        }
        None
    }

    fn ongoing(stalls: &[StallReport]) -> Option<&StallReport> {
        stalls.iter().find(|r| r.ongoing)
    }

    fn ended(stalls: &[StallReport]) -> Option<&StallReport> {
        stalls.last().filter(|r| !r.ongoing)
    }

    /// A spinning poll is runnable all the time: on-CPU, unless other threads kept it off the CPU
    /// (the machine is saturated, e.g. by tests running alongside), when the right answer is
    /// waiting-for-cpu. Either way it is never "blocked". (The shares are exact to a slice at each
    /// end of the window, a few ms under heavy load, so their sum is checked loosely.)
    fn assert_runnable_class(report: &StallReport) {
        assert!(
            report.on_cpu_share + report.waiting_for_cpu_share > 0.5,
            "{report:?}"
        );
        if report.waiting_for_cpu_share < WAITING_FOR_CPU_SHARE {
            assert_eq!(report.class, "on-cpu", "{report:?}");
            assert!(report.on_cpu_share > 0.5, "{report:?}");
        } else {
            assert_eq!(report.class, "waiting-for-cpu", "{report:?}");
            eprintln!("saturated machine: a spinning poll waited for a CPU: {report:?}");
        }
    }

    #[test]
    fn reports_a_busy_poll_while_it_runs() {
        let _serial = serial();
        let id = ID_BASE + 1;
        let location = Location::caller();
        let handle = spawn_loop(
            id,
            Duration::from_millis(50),
            location,
            || {},
            || spin_until(now_ns() + 400 * MS),
        );
        let (first, seen_at) = wait_for(id, Duration::from_secs(2), ongoing).expect("no report");
        let (start, end) = handle.join().unwrap();
        assert!(
            seen_at < end,
            "seen {} ms after the poll ended",
            (seen_at - end) / MS
        );
        assert_eq!(first.task_name, "hog");
        assert_eq!(first.task_id, 7);
        assert_eq!(first.location, location_string(location));
        assert_runnable_class(&first);
        assert!(
            first.detected_after_seconds >= 0.050 && first.detected_after_seconds < 0.060,
            "first report after {} s",
            first.detected_after_seconds
        );
        assert!(first.at_unix_ms > 0);

        let (last, _) = wait_for(id, Duration::from_secs(1), ended).expect("never ended");
        assert_eq!(recent_stalls_for(id).len(), 1, "one poll, one stall");
        assert!(!last.ongoing);
        assert_runnable_class(&last);
        let ran = (end - start) as f64 / 1e9;
        assert!(
            last.elapsed_seconds > ran - 0.05 && last.elapsed_seconds <= ran + 0.001,
            "last observed {} s of a {ran} s poll",
            last.elapsed_seconds
        );
        assert!(last.reports >= 3, "{last:?}");
    }

    #[test]
    fn classifies_a_sleeping_poll_as_blocked() {
        let _serial = serial();
        let id = ID_BASE + 2;
        let location = Location::caller();
        let handle = spawn_loop(
            id,
            Duration::from_millis(50),
            location,
            || {},
            || thread::sleep(Duration::from_millis(400)),
        );
        let (first, seen_at) = wait_for(id, Duration::from_secs(2), ongoing).expect("no report");
        let (_, end) = handle.join().unwrap();
        assert!(seen_at < end);
        assert_eq!(first.class, "blocked-in-syscall", "{first:?}");
        assert!(first.on_cpu_share < 0.2, "{first:?}");
        assert!(first.detected_after_seconds < 0.060, "{first:?}");
        let (last, _) = wait_for(id, Duration::from_secs(1), ended).expect("never ended");
        assert_eq!(last.class, "blocked-in-syscall", "{last:?}");
    }

    #[test]
    fn classifies_a_starved_poll_as_waiting_for_cpu() {
        let _serial = serial();
        let id = ID_BASE + 3;
        let allowed = rustix::thread::sched_getaffinity(None).unwrap();
        let cpu = (0..rustix::thread::CpuSet::MAX_CPU)
            .rev()
            .find(|&c| allowed.is_set(c))
            .unwrap();
        let mut one_cpu = rustix::thread::CpuSet::new();
        one_cpu.set(cpu);

        let stop = Arc::new(AtomicBool::new(false));
        let pinned = Arc::new(std::sync::Barrier::new(2));
        let spinner = {
            let (stop, pinned) = (stop.clone(), pinned.clone());
            thread::spawn(move || {
                rustix::thread::sched_setaffinity(None, &one_cpu).unwrap();
                pinned.wait();
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        };
        let location = Location::caller();
        let handle = spawn_loop(
            id,
            Duration::from_millis(50),
            location,
            move || {
                rustix::thread::sched_setaffinity(None, &one_cpu).unwrap();
                pinned.wait();
            },
            || spin_until(now_ns() + 400 * MS),
        );
        let ongoing = wait_for(id, Duration::from_secs(2), ongoing);
        handle.join().unwrap();
        stop.store(true, Ordering::Relaxed);
        spinner.join().unwrap();
        assert!(ongoing.is_some(), "not reported while running");
        let (last, _) = wait_for(id, Duration::from_secs(1), ended).expect("never ended");
        assert!(last.waiting_for_cpu_share > 0.3, "{last:?}");
        assert_eq!(last.class, "waiting-for-cpu", "{last:?}");
    }

    #[test]
    fn backs_off_exponentially() {
        let _serial = serial();
        let id = ID_BASE + 4;
        let handle = spawn_loop(
            id,
            Duration::from_millis(100),
            Location::caller(),
            || {},
            || thread::sleep(Duration::from_secs(1)),
        );
        handle.join().unwrap();
        let (last, _) = wait_for(id, Duration::from_secs(1), ended).expect("never ended");
        // Reports at 100, 200, 400 and 800 ms.
        assert!((3..=5).contains(&last.reports), "{last:?}");
        assert!(last.elapsed_seconds > 0.9, "{last:?}");
    }

    #[test]
    fn parks_while_every_loop_is_idle() {
        let _serial = serial();
        let id = ID_BASE + 5;
        let ready = Arc::new(std::sync::Barrier::new(2));
        let go = Arc::new(std::sync::Barrier::new(2));
        let location = Location::caller();
        let handle = {
            let (ready, go) = (ready.clone(), go.clone());
            thread::spawn(move || {
                let slot = LoopSlot::new(id, Duration::from_millis(50));
                register(&slot);
                slot.enter_idle();
                ready.wait();
                go.wait();
                slot.leave_idle();
                let start = now_ns();
                slot.begin(9, "wakes-the-watchdog", location, start);
                thread::sleep(Duration::from_millis(150));
                slot.end();
                slot.enter_idle();
                // Drop while idle: the count must stay balanced.
            })
        };
        // A busy slot that was never registered must not keep the watchdog awake.
        let _unregistered = LoopSlot::new(ID_BASE + 7, Duration::from_millis(50));
        ready.wait();
        thread::sleep(Duration::from_millis(50));
        let (wakes, idle_wakes) = (
            WAKES.load(Ordering::Relaxed),
            IDLE_WAKES.load(Ordering::Relaxed),
        );
        thread::sleep(Duration::from_millis(500));
        let idle_woken = IDLE_WAKES.load(Ordering::Relaxed) - idle_wakes;
        let woken = WAKES.load(Ordering::Relaxed) - wakes;
        assert!(
            idle_woken <= 2,
            "woke {idle_woken} times while idle ({woken} wakes in all)"
        );

        // `leave_idle` must unpark it in time to catch a stall at its threshold.
        go.wait();
        let (first, _) = wait_for(id, Duration::from_secs(2), ongoing).expect("no report");
        assert!(first.detected_after_seconds < 0.060, "{first:?}");
        handle.join().unwrap();
        wait_for(id, Duration::from_secs(1), ended).expect("never ended");
    }

    #[test]
    fn only_registered_busy_slots_count() {
        let _serial = serial();
        let busy = || ACTIVITY.load(Ordering::Acquire) & !PARKED;
        // Loops of other tests may come and go meanwhile: one clean attempt out of a few is enough.
        let clean = (0..20).any(|_| {
            let before = busy();
            let unregistered = LoopSlot::new(ID_BASE + 8, Duration::from_millis(50));
            unregistered.enter_idle();
            unregistered.leave_idle();
            let after_new = busy();
            let registered = LoopSlot::new(ID_BASE + 8, Duration::from_millis(50));
            register(&registered);
            let after_register = busy();
            registered.enter_idle();
            let after_idle = busy();
            drop((unregistered, registered));
            let after_drop = busy();
            [after_new, after_register, after_idle, after_drop]
                == [before, before + 1, before, before]
        });
        assert!(clean, "ACTIVITY miscounted");
    }

    #[test]
    fn seqlock_reads_are_consistent() {
        let _serial = serial();
        // A writer flips between two records as fast as it can; every read must be one of them.
        static A: &str = "alpha";
        static B: &str = "a-much-longer-name";
        let la: &'static Location<'static> = Location::caller();
        let lb: &'static Location<'static> = Location::caller();
        let slot = LoopSlot::new(ID_BASE + 6, Duration::from_millis(100));
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (slot, stop) = (slot.clone(), stop.clone());
            thread::spawn(move || {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    if i.is_multiple_of(2) {
                        slot.begin(2, A, la, i);
                    } else {
                        slot.begin(3, B, lb, i);
                    }
                    if i.is_multiple_of(7) {
                        slot.end();
                    }
                }
            })
        };
        let (mut polls, mut idles) = (0, 0);
        let deadline = now_ns() + 200 * MS;
        while now_ns() < deadline {
            match slot.read() {
                SlotRead::Poll(v) => {
                    polls += 1;
                    let ok = (v.task_id == 2
                        && v.name == A
                        && std::ptr::eq(v.location, la)
                        && v.start_ns % 2 == 0)
                        || (v.task_id == 3
                            && v.name == B
                            && std::ptr::eq(v.location, lb)
                            && v.start_ns % 2 == 1);
                    assert!(ok, "torn read: {} {} {}", v.task_id, v.name, v.start_ns);
                }
                SlotRead::Idle => idles += 1,
                SlotRead::Torn => {}
            }
        }
        stop.store(true, Ordering::Relaxed);
        writer.join().unwrap();
        assert!(polls > 0, "{polls} polls, {idles} idle reads");
    }

    #[test]
    fn parses_proc_files() {
        let _serial = serial();
        assert_eq!(
            parse_stat_state(b"1234 (a) b (c) S 1 2 3 4"),
            Some(b'S'),
            "comm with spaces and parentheses"
        );
        assert_eq!(parse_stat_state(b"1 (x)) R 0"), Some(b'R'));
        assert_eq!(parse_stat_state(b"no parenthesis"), None);
        assert_eq!(
            parse_schedstat(b"31048037 7213013 87\n"),
            Some(SchedStat {
                cpu_ns: 31048037,
                run_delay_ns: 7213013
            })
        );
        assert_eq!(parse_schedstat(b"12\n"), None);

        let proc = ThreadProc::open(rustix::thread::gettid().as_raw_pid());
        let first = proc.sample(true);
        assert_eq!(first.state, Some(b'R'), "the reading thread is running");
        let a = first.sched.expect("schedstat readable");
        spin_until(now_ns() + 20 * MS);
        let b = proc.read_schedstat().expect("re-read at offset 0");
        assert!(
            b.cpu_ns > a.cpu_ns,
            "{a:?} then {b:?}: pread at 0 must re-read"
        );
    }

    #[test]
    fn classifies_from_samples() {
        let sample = |wall_ns, state, cpu_ns, run_delay_ns| Sample {
            wall_ns,
            state,
            sched: Some(SchedStat {
                cpu_ns,
                run_delay_ns,
            }),
        };
        let base = sample(0, Some(b'R'), 0, 0);
        let (class, on, wait) =
            classify(Some(&base), &sample(100 * MS, Some(b'R'), 95 * MS, 2 * MS));
        assert_eq!(class, StallClass::OnCpu);
        assert!((on - 0.95).abs() < 1e-9 && (wait - 0.02).abs() < 1e-9);
        let (class, ..) = classify(Some(&base), &sample(100 * MS, Some(b'R'), 50 * MS, 50 * MS));
        assert_eq!(class, StallClass::WaitingForCpu);
        let (class, ..) = classify(Some(&base), &sample(100 * MS, Some(b'D'), 90 * MS, 0));
        assert_eq!(class, StallClass::BlockedInSyscall);
        let (class, ..) = classify(Some(&base), &sample(100 * MS, Some(b'R'), 5 * MS, MS));
        assert_eq!(
            class,
            StallClass::BlockedInSyscall,
            "just woke from a long sleep"
        );
        let (class, on, wait) =
            classify(Some(&base), &sample(100 * MS, Some(b'R'), 44 * MS, 63 * MS));
        assert_eq!(class, StallClass::WaitingForCpu);
        assert!(
            (on + wait - 1.0).abs() < 1e-9,
            "scaled to the window: {on} + {wait}"
        );
        let (class, ..) = classify(Some(&base), &sample(MS / 2, Some(b'R'), 0, 0));
        assert_eq!(class, StallClass::Unknown, "window too short");
        let unreadable = Sample {
            wall_ns: 100 * MS,
            state: None,
            sched: None,
        };
        assert_eq!(classify(Some(&base), &unreadable).0, StallClass::Unknown);
    }

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
