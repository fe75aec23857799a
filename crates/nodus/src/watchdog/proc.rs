//! Reading the loop thread's scheduler state from `/proc/self/task/<tid>/{stat,schedstat}`, and
//! classifying a stall from it.
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
//! - Only the watchdog thread reads these files; the loop thread is never touched.
//! - A reading is one `pread` at offset 0 per file on descriptors opened once per loop (a
//!   seq_file regenerates on it), so sampling allocates nothing.
//! - Anything unreadable yields `None` fields and the `Unknown` class, never an error.

use std::os::fd::OwnedFd;

use super::StallClass;
use crate::clock::now_ns;

/// A share window shorter than this is noise: the class then comes from the thread state alone.
const MIN_WINDOW_NS: u64 = 1_000_000;
/// Class thresholds on the shares of the stall window.
pub(super) const WAITING_FOR_CPU_SHARE: f64 = 0.3;
const BLOCKED_MAX_CPU_SHARE: f64 = 0.2;

/// Cumulative scheduler counters of one thread (`schedstat`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SchedStat {
    cpu_ns: u64,
    run_delay_ns: u64,
}

/// One reading of a thread's scheduler state.
#[derive(Debug, Clone, Copy)]
pub(super) struct Sample {
    /// `now_ns()` right after the reads.
    pub(super) wall_ns: u64,
    /// `stat` field 3 (R, S, D, ...), if read.
    state: Option<u8>,
    sched: Option<SchedStat>,
}

/// The loop thread's `stat` and `schedstat`, kept open and re-read with `pread` at offset 0 (which
/// regenerates a seq_file), so a reading is one syscall per file.
pub(super) struct ThreadProc {
    stat: Option<OwnedFd>,
    schedstat: Option<OwnedFd>,
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

    pub(super) fn sample(&self, with_state: bool) -> Sample {
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
pub(super) fn classify(baseline: Option<&Sample>, now: &Sample) -> (StallClass, f64, f64) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watchdog::tests::{MS, serial, spin_until};

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
}
