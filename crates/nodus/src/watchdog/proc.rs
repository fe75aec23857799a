//! Reading the loop thread's scheduler state from `/proc/self/task/<tid>/{schedstat,status}` and
//! its CPU clock, and classifying a stall from it.
//!
//! What is read: the thread's on-CPU time from its CPU clock (`clock_gettime` on the thread's
//! clock id: exact, the current slice included, where `schedstat`'s first field lags by up to a
//! scheduler tick); its run-queue wait (`run_delay`) from `schedstat`; its state (R, S, D, ...) and
//! `voluntary_ctxt_switches` (how many times it went to sleep) from `status`. All in nanoseconds or
//! counts straight from the scheduler, without perf or eBPF privileges. `stat`'s `utime`/`stime`
//! have a 10 ms resolution and no run-queue wait, so they cannot tell these apart.
//!
//! How a stall is classified: the state says what the thread does now, the window's deltas (from
//! when the watchdog first saw the poll, at most a tick after it started) say how it spent it:
//! on a CPU, waiting for one, or neither (asleep).
//! - Runnable (R) at both ends of the window without going to sleep in between ("runnable
//!   throughout"): never asleep. All of the window it was not on a CPU it was waiting for one,
//!   whether or not `run_delay` shows it yet (a wait is added when it *ends*, so one still in
//!   progress, which on a saturated machine can be most of the window, is not in it): the waiting
//!   share is at least `1 - on-CPU share`.
//! - S or D now, asleep at least [`BLOCKED_MIN_ASLEEP_SHARE`] of the window (or no usable
//!   window): blocked in a syscall. A window that the on-CPU and waiting shares cover nearly all
//!   was spent running, whatever the state at its end (a thread that just went to sleep, or one
//!   continued after a SIGSTOP): its shares decide.
//! - Waiting for a CPU at least [`WAITING_FOR_CPU_SHARE`] of the window, and the hold would not
//!   have reached the threshold without the wait: waiting for a CPU. As for a stop (`freeze`), a
//!   wait is blamed only for a stall it made one: the hold's length (stops left out) times the
//!   share of the window the thread was not waiting (its own on-CPU time, plus any sleep) is
//!   under the threshold (the part of the hold before the window, at most a tick, is taken at
//!   the window's shares). A CPU hog on a busy machine that has run for the threshold itself
//!   would have stalled the loop on an idle one: it is on a CPU, however long it also waited.
//! - Otherwise blocked when on a CPU under 20 % of the window and asleep longer than on a CPU,
//!   else on a CPU. With no usable window, not asleep: unknown.
//!
//! A wait that began before the window is added whole when it ends and can push the shares past
//! the window: they are scaled back to fractions of it.
//!
//! Invariants:
//! - Only the watchdog thread reads these files and the clock; the loop thread is never touched.
//! - A reading is one `pread` at offset 0 per file on descriptors opened once per loop (a
//!   seq_file regenerates on it) and one `clock_gettime`, so sampling allocates nothing.
//! - Anything unreadable yields `None` fields and the `Unknown` class, never an error.

use std::os::fd::OwnedFd;

use super::StallClass;
use crate::clock::now_ns;

/// A share window shorter than this is noise: the class then comes from the thread state alone.
const MIN_WINDOW_NS: u64 = 1_000_000;
/// Class thresholds on the shares of the stall window.
pub(super) const WAITING_FOR_CPU_SHARE: f64 = 0.3;
const BLOCKED_MAX_CPU_SHARE: f64 = 0.2;
/// A thread in S or D is blocked only if it was asleep (neither on a CPU nor waiting for one)
/// at least this share of the window.
const BLOCKED_MIN_ASLEEP_SHARE: f64 = 0.1;

/// Cumulative scheduler counters of one thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SchedStat {
    cpu_ns: u64,
    run_delay_ns: u64,
}

/// One reading of a thread's scheduler state.
#[derive(Debug, Clone, Copy)]
pub(super) struct Sample {
    /// `now_ns()` right after the counters were read.
    pub(super) wall_ns: u64,
    /// `status`'s `State:` (R, S, D, ...), if read.
    state: Option<u8>,
    /// `status`'s `voluntary_ctxt_switches`, if read.
    sleeps: Option<u64>,
    sched: Option<SchedStat>,
}

/// The loop thread's `schedstat` and `status`, kept open and re-read with `pread` at offset 0
/// (which regenerates a seq_file), and its CPU clock.
pub(super) struct ThreadProc {
    schedstat: Option<OwnedFd>,
    status: Option<OwnedFd>,
    clock: libc::clockid_t,
}

impl ThreadProc {
    pub(super) fn open(tid: i32) -> ThreadProc {
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
            schedstat: open("schedstat"),
            status: open("status"),
            // The thread's CPU clock id, as glibc's `pthread_getcpuclockid` makes it:
            // `MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED)`, `CPUCLOCK_PERTHREAD_MASK | SCHED` = 6.
            clock: (!tid << 3) | 6,
        }
    }

    /// Nanoseconds the thread has run, from its CPU clock (a thread of this process only).
    pub(super) fn read_cpu_ns(&self) -> Option<u64> {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec; an unknown clock id (the thread is gone) is
        // an EINVAL return, not undefined behaviour.
        if unsafe { libc::clock_gettime(self.clock, &mut ts) } != 0 {
            return None;
        }
        Some(u64::try_from(ts.tv_sec).ok()? * 1_000_000_000 + u64::try_from(ts.tv_nsec).ok()?)
    }

    /// Nanoseconds the thread has waited on a run queue (`schedstat`), if readable.
    pub(super) fn run_delay_ns(&self) -> Option<u64> {
        self.read_schedstat().map(|s| s.run_delay_ns)
    }

    fn read_schedstat(&self) -> Option<SchedStat> {
        let mut buf = [0u8; 128];
        parse_schedstat(read_at_zero(self.schedstat.as_ref()?, &mut buf)?)
    }

    /// (state, voluntary context switches) from `status`.
    fn read_status(&self) -> (Option<u8>, Option<u64>) {
        // About 1.5 KiB; more with very long CPU and memory-node masks. Fields cut off by the
        // buffer (the switches come last) read as `None`.
        let mut buf = [0u8; 8192];
        self.status
            .as_ref()
            .and_then(|fd| read_at_zero(fd, &mut buf))
            .map_or((None, None), parse_status)
    }

    pub(super) fn sample(&self) -> Sample {
        let sched = self.read_schedstat().map(|s| SchedStat {
            cpu_ns: self.read_cpu_ns().unwrap_or(s.cpu_ns),
            ..s
        });
        let wall_ns = now_ns();
        let (state, sleeps) = self.read_status();
        Sample {
            wall_ns,
            state,
            sleeps,
            sched,
        }
    }
}

fn read_at_zero<'b>(fd: &OwnedFd, buf: &'b mut [u8]) -> Option<&'b [u8]> {
    // One pread: a seq_file fills what it can, and both files fit the buffers.
    let n = rustix::io::pread(fd, &mut *buf, 0).ok()?;
    Some(&buf[..n])
}

/// `State:` and `voluntary_ctxt_switches:` of `status`. Fields are matched at the start of a
/// line: the command name (`Name:`, the first line) has its newlines escaped.
fn parse_status(text: &[u8]) -> (Option<u8>, Option<u64>) {
    let (mut state, mut sleeps) = (None, None);
    for line in text.split(|&b| b == b'\n') {
        if let Some(value) = line.strip_prefix(b"State:") {
            state = value.iter().copied().find(|b| !b.is_ascii_whitespace());
        } else if let Some(value) = line.strip_prefix(b"voluntary_ctxt_switches:") {
            sleeps = std::str::from_utf8(value)
                .ok()
                .and_then(|v| v.trim().parse().ok());
        }
    }
    (state, sleeps)
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

/// Shares of [baseline, now] and the class (see the module doc). `stopped_ns` of that window the
/// process was stopped (`freeze`): not part of it, the thread could neither run nor wait.
/// `held_ns`: how long the loop has been held at `now`, stops left out; `threshold_ns` the
/// loop's stall threshold. Shares are 0 when they cannot be computed.
pub(super) fn classify(
    baseline: Option<&Sample>,
    now: &Sample,
    stopped_ns: u64,
    held_ns: u64,
    threshold_ns: u64,
) -> (StallClass, f64, f64) {
    let shares = match (
        baseline.and_then(|b| b.sched.map(|s| (b.wall_ns + stopped_ns, s))),
        now.sched,
    ) {
        (Some((base_wall, base)), Some(cur)) if now.wall_ns >= base_wall + MIN_WINDOW_NS => {
            let window = (now.wall_ns - base_wall) as f64;
            let on_cpu = cur.cpu_ns.saturating_sub(base.cpu_ns) as f64;
            let waiting = cur.run_delay_ns.saturating_sub(base.run_delay_ns) as f64;
            let scale = window.max(on_cpu + waiting);
            Some((on_cpu / scale, waiting / scale))
        }
        _ => None,
    };
    let runnable_throughout = baseline.is_some_and(|b| {
        b.state == Some(b'R')
            && now.state == Some(b'R')
            && b.sleeps.is_some()
            && b.sleeps == now.sleeps
    });
    let shares = shares.map(|(on_cpu, waiting)| {
        if runnable_throughout {
            (on_cpu, waiting.max(1.0 - on_cpu))
        } else {
            (on_cpu, waiting)
        }
    });
    let sleeping = matches!(now.state, Some(b'S' | b'D'));
    let class = match shares {
        None if sleeping => StallClass::BlockedInSyscall,
        // Runnable (or unreadable) with no usable window: on-CPU and waiting look the same.
        None => StallClass::Unknown,
        Some((on_cpu, waiting)) => {
            let asleep = (1.0 - on_cpu - waiting).max(0.0);
            // How long the hold would have lasted without the wait.
            let unwaited_ns = held_ns as f64 * (1.0 - waiting);
            if sleeping && asleep >= BLOCKED_MIN_ASLEEP_SHARE {
                StallClass::BlockedInSyscall
            } else if waiting >= WAITING_FOR_CPU_SHARE && unwaited_ns < threshold_ns as f64 {
                StallClass::WaitingForCpu
            } else if on_cpu < BLOCKED_MAX_CPU_SHARE && asleep > on_cpu {
                StallClass::BlockedInSyscall
            } else {
                StallClass::OnCpu
            }
        }
    };
    let (on_cpu, waiting) = shares.unwrap_or((0.0, 0.0));
    (class, on_cpu, waiting)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watchdog::tests::{MS, serial, spin_until};

    #[test]
    fn parses_proc_files() {
        let _serial = serial();
        let status = b"Name:\tState: S\nUmask:\t0022\nState:\tR (running)\nTgid:\t9\n\
                       voluntary_ctxt_switches:\t150\nnonvoluntary_ctxt_switches:\t545\n";
        assert_eq!(
            parse_status(status),
            (Some(b'R'), Some(150)),
            "fields at the start of a line only"
        );
        assert_eq!(parse_status(b"Name:\tx\nState:\tS (sl"), (Some(b'S'), None));
        assert_eq!(
            parse_schedstat(b"31048037 7213013 87\n"),
            Some(SchedStat {
                cpu_ns: 31048037,
                run_delay_ns: 7213013
            })
        );
        assert_eq!(parse_schedstat(b"12\n"), None);

        let proc = ThreadProc::open(rustix::thread::gettid().as_raw_pid());
        let first = proc.sample();
        assert_eq!(first.state, Some(b'R'), "the reading thread is running");
        assert!(first.sleeps.is_some(), "{first:?}");
        let a = first.sched.expect("schedstat readable");
        spin_until(now_ns() + 20 * MS);
        let b = proc.read_schedstat().expect("re-read at offset 0");
        assert!(
            b.run_delay_ns >= a.run_delay_ns && b.cpu_ns > a.cpu_ns,
            "{a:?} then {b:?}: pread at 0 must re-read"
        );
        let (before, after) = (proc.read_cpu_ns().unwrap(), proc.read_cpu_ns().unwrap());
        assert!(
            after > before && before > a.cpu_ns,
            "the CPU clock counts the slice in progress"
        );
    }

    fn sample(wall_ns: u64, state: u8, sleeps: u64, cpu_ns: u64, run_delay_ns: u64) -> Sample {
        Sample {
            wall_ns,
            state: Some(state),
            sleeps: Some(sleeps),
            sched: Some(SchedStat {
                cpu_ns,
                run_delay_ns,
            }),
        }
    }

    /// The stall threshold of the synthetic loop below.
    const THRESHOLD_NS: u64 = 100 * MS;

    /// `classify` for a hold that began with the window (`base`) and a threshold of 100 ms.
    fn class_of(base: &Sample, now: &Sample, stopped_ns: u64) -> (StallClass, f64, f64) {
        let held_ns = now.wall_ns - base.wall_ns - stopped_ns;
        classify(Some(base), now, stopped_ns, held_ns, THRESHOLD_NS)
    }

    #[test]
    fn classifies_from_samples() {
        let base = sample(0, b'R', 10, 0, 0);
        let (class, on, wait) = class_of(&base, &sample(100 * MS, b'R', 10, 95 * MS, 2 * MS), 0);
        assert_eq!(class, StallClass::OnCpu);
        assert!(
            (on - 0.95).abs() < 1e-9 && (wait - 0.05).abs() < 1e-9,
            "runnable throughout: off a CPU is waiting ({on}, {wait})"
        );
        let (class, ..) = class_of(&base, &sample(100 * MS, b'R', 10, 50 * MS, 50 * MS), 0);
        assert_eq!(class, StallClass::WaitingForCpu);
        let (class, ..) = class_of(&base, &sample(100 * MS, b'D', 11, 50 * MS, 0), 0);
        assert_eq!(class, StallClass::BlockedInSyscall);
        let (class, on, wait) = class_of(&base, &sample(100 * MS, b'R', 11, 5 * MS, MS), 0);
        assert_eq!(
            (class, on, wait),
            (StallClass::BlockedInSyscall, 0.05, 0.01),
            "went to sleep in the window, just woke"
        );
        let asleep = sample(0, b'S', 10, 0, 0);
        let (class, ..) = class_of(&asleep, &sample(100 * MS, b'R', 10, 5 * MS, MS), 0);
        assert_eq!(
            class,
            StallClass::BlockedInSyscall,
            "asleep when the window began, just woke"
        );
        let (class, on, wait) = class_of(&base, &sample(100 * MS, b'R', 10, 44 * MS, 63 * MS), 0);
        assert_eq!(class, StallClass::WaitingForCpu);
        assert!(
            (on + wait - 1.0).abs() < 1e-9,
            "scaled to the window: {on} + {wait}"
        );
        let (class, ..) = class_of(&base, &sample(MS / 2, b'R', 10, 0, 0), 0);
        assert_eq!(class, StallClass::Unknown, "window too short");
        let unreadable = Sample {
            wall_ns: 100 * MS,
            state: None,
            sleeps: None,
            sched: None,
        };
        assert_eq!(class_of(&base, &unreadable, 0).0, StallClass::Unknown);
        let sleeping = Sample {
            state: Some(b'S'),
            ..unreadable
        };
        assert_eq!(
            class_of(&base, &sleeping, 0).0,
            StallClass::BlockedInSyscall,
            "no window: the state alone"
        );
        // A spinner stopped 1 s of an 1.1 s window: the stop is not part of the window.
        let stopped = sample(1100 * MS, b'R', 11, 95 * MS, MS);
        assert_eq!(class_of(&base, &stopped, 0).0, StallClass::BlockedInSyscall);
        let (class, on, _) = class_of(&base, &stopped, 1000 * MS);
        assert_eq!(class, StallClass::OnCpu);
        assert!((on - 0.95).abs() < 1e-9, "{on}");
    }

    /// A spinning poll on a saturated machine: 8 ms on a CPU out of a 50 ms window, its
    /// run-queue wait still in progress (so not in `run_delay` yet), never asleep. It is waiting
    /// for a CPU, not blocked in a syscall (as the classifier once said, from the shares alone).
    #[test]
    fn a_thread_runnable_throughout_the_window_is_never_blocked() {
        let base = sample(0, b'R', 10, 0, 0);
        let (class, on, wait) = class_of(&base, &sample(50 * MS, b'R', 10, 8 * MS, 2 * MS), 0);
        assert_eq!(class, StallClass::WaitingForCpu, "{on} {wait}");
        assert!(
            (on - 0.16).abs() < 1e-9 && (wait - 0.84).abs() < 1e-9,
            "{on} {wait}"
        );
        // Nearly nothing counted yet: still waiting, never blocked.
        let (class, ..) = class_of(&base, &sample(50 * MS, b'R', 10, 0, 0), 0);
        assert_eq!(class, StallClass::WaitingForCpu);
        // Long enough on a CPU to be a stall by itself: on a CPU, however small its share.
        let (class, on, _) = class_of(&base, &sample(1000 * MS, b'R', 10, 150 * MS, 0), 0);
        assert_eq!(class, StallClass::OnCpu, "{on}");
    }

    /// The reviewer's case: a CPU hog sharing 2 cores with 4 `yes` loops runs 16 to 29 % of its
    /// hold. While its own CPU time is under the threshold the wait made the stall: waiting for a
    /// CPU. Once it has run for the threshold itself (3x here), it would have stalled the loop
    /// on an idle machine: on a CPU (it was `waiting-for-cpu` to the end).
    #[test]
    fn a_cpu_hog_on_a_busy_machine_is_on_a_cpu_once_it_ran_for_the_threshold() {
        let base = sample(0, b'R', 10, 0, 0);
        let (class, on, wait) = class_of(&base, &sample(100 * MS, b'R', 10, 20 * MS, 70 * MS), 0);
        assert_eq!(
            class,
            StallClass::WaitingForCpu,
            "at the threshold: {on} {wait}"
        );
        let (class, ..) = class_of(&base, &sample(400 * MS, b'R', 10, 90 * MS, 250 * MS), 0);
        assert_eq!(class, StallClass::WaitingForCpu, "90 ms of its own");
        let (class, on, wait) =
            class_of(&base, &sample(1500 * MS, b'R', 10, 300 * MS, 1100 * MS), 0);
        assert_eq!(class, StallClass::OnCpu, "300 ms of its own: {on} {wait}");
        assert!((on - 0.2).abs() < 1e-9 && (wait - 0.8).abs() < 1e-9);
        // The hold began a tick before the window: its length counts, at the window's shares.
        let (class, ..) = classify(
            Some(&base),
            &sample(450 * MS, b'R', 10, 90 * MS, 300 * MS),
            0,
            510 * MS,
            THRESHOLD_NS,
        );
        assert_eq!(
            class,
            StallClass::OnCpu,
            "about 102 ms of its own in the hold"
        );
        // A wait does not make a stall of a hold that slept past the threshold: blocked.
        let (class, ..) = class_of(&base, &sample(1000 * MS, b'R', 11, 50 * MS, 400 * MS), 0);
        assert_eq!(class, StallClass::BlockedInSyscall);
    }

    /// A spinning poll stopped (SIGSTOP) in the middle and continued: right after, its state
    /// reads S (it is logging its slow poll), but the window was all on a CPU or waiting for
    /// one. The state alone does not make it blocked; it slept nearly none of the window.
    #[test]
    fn a_window_spent_running_is_not_blocked_on_the_state_at_its_end() {
        let base = sample(0, b'R', 10, 0, 0);
        for state in [b'S', b'D'] {
            let (class, on, wait) =
                class_of(&base, &sample(100 * MS, state, 11, 43 * MS, 57 * MS), 0);
            assert_eq!(class, StallClass::WaitingForCpu, "{on} {wait}");
            let (class, ..) = class_of(&base, &sample(200 * MS, state, 11, 190 * MS, 4 * MS), 0);
            assert_eq!(class, StallClass::OnCpu);
            // Asleep a fifth of it: blocked, as the state says.
            let (class, ..) = class_of(&base, &sample(200 * MS, state, 11, 150 * MS, 10 * MS), 0);
            assert_eq!(class, StallClass::BlockedInSyscall);
        }
    }
}
