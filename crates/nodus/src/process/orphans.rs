//! The orphan reaper: the children of nodus's whose loop is gone, reaped by a background thread.
//!
//! A child's exit is reaped by its exit task (`child`), on its loop. When that loop's `Runtime`
//! is dropped before the child's exit was seen, the task is dropped with it, and once the
//! `Child` is dropped too (the last holder of its exit watch), no loop will ever reap it. The
//! watch's drop then reaps it at once if it has exited, and otherwise hands it here ([`adopt`]):
//! its pidfd, its group exit signal, its registration as nodus's own ([`Ours`]) and, if the
//! orphan guard remembers its group, a pidfd of the guard. (tokio keeps such children in an
//! orphan queue; `std` leaves them zombies.)
//!
//! The subreaper (`reaper`) hands its adopted processes over the same way when it ends (its
//! `close`, its last clone's drop, or its loop's `Runtime` dropped with its task): each one
//! still unreaped, by a pidfd opened while it was the subreaper's unreaped child, registered as
//! nodus's own at the hand-off (no other subreaper takes it meanwhile), with no group exit
//! signal and, if the orphan guard remembers its pid, a pidfd of the guard. Only those: a child
//! the program forks afterwards by other means (`std::process`) is never waited for here.
//!
//! Invariants:
//! - One thread ("nodus-orphans") per process, started by a hand-off when none runs.
//! - The queue is the process's own: it names the pid it belongs to, and at its first lock in a
//!   process forked (without `exec`) from that one it starts empty, with no thread. The forked
//!   process inherits neither the thread nor the children handed to it (not its own to reap):
//!   their pidfds (its copies) are closed then, their registrations left to the parent's table
//!   (see `reaper`), and its first hand-off starts its own thread. It blocks in `poll` on the pidfds it holds and an eventfd (written by each hand-off),
//!   with no timeout: no busy loop. If that `poll` fails (more fds than a lowered
//!   `RLIMIT_NOFILE`, no memory), it looks at each fd alone every 100 ms instead, one warning
//!   line. It ends as soon as it holds nothing (the next hand-off starts another), and it never
//!   keeps the process alive (a Rust program ends with its `main` thread).
//! - The queue's lock is held briefly (a hand-off; this thread taking what was handed over) and
//!   is never copied held into a forked process: the forking thread takes it before the fork
//!   and lets it go after it, in both processes (`crate::atfork`). So the first hand-off of a
//!   process forked without `exec` goes through.
//! - A child is reaped here exactly as its exit task would have: `waitid(P_PIDFD)`, never
//!   `waitpid(-1)` (so only a child handed over, never one the program waits for itself); with
//!   a group exit signal, its group is signalled between its exit, seen with `WNOWAIT`, and its
//!   reap (the zombie holds the group's id). Its [`Ours`] is dropped only after the reap (an
//!   error that makes it no longer ours to reap included), so no subreaper pass takes it
//!   meanwhile (see `reaper`).
//! - A child whose group (or, adopted, whose pid) the orphan guard remembers: the guard cannot
//!   be told to forget it from here (its handle lives on the loop's thread), so it stays
//!   remembered and the child is reaped only once the guard has exited (its pidfd readable).
//!   Its loop being gone, so is the primary the guard stands for: the guard's end of file comes
//!   when its last handle is dropped, and it SIGKILLs what it remembers, this child (or its
//!   group) included, while the child is still unreaped. So the guard never holds a pgid or a
//!   pid that could be reused, and the child is still covered until the guard acts. (If the
//!   guard's pidfd cannot be duplicated, the group or pid is forgotten at the hand-off instead:
//!   not covered, never wrong.)

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rustix::event::{EventfdFlags, PollFd, PollFlags};
use rustix::process::{Pid, Signal, WaitId, WaitIdOptions};

use super::reaper::Ours;

/// Children handed over and not yet taken by the thread, and the thread's eventfd.
static QUEUE: Mutex<Queue> = Mutex::new(Queue {
    owner: 0,
    new: Vec::new(),
    wake: None,
});

pub(crate) struct Queue {
    /// The process this queue is for (see the module doc): 0 before its first lock.
    owner: u32,
    new: Vec<Orphan>,
    /// The running thread's eventfd; `None` while no thread runs.
    wake: Option<Arc<OwnedFd>>,
}

/// The queue's lock, held across a `fork` by the forking thread (see `crate::atfork`).
pub(crate) type QueueGuard = MutexGuard<'static, Queue>;

/// The queue, this process's own (see the module doc).
pub(super) fn queue() -> QueueGuard {
    crate::atfork::register();
    let mut q = lock_queue();
    let me = std::process::id();
    if q.owner != me {
        // New, or forked from the process it was: that one's thread is not here, and the
        // children handed to it are not this one's.
        q.owner = me;
        q.wake = None;
        let theirs = std::mem::take(&mut q.new);
        if !theirs.is_empty() {
            // Dropped unlocked (no lock is taken under another; theirs take the registry's).
            drop(q);
            drop(theirs);
            q = lock_queue();
        }
    }
    q
}

/// The bare lock, without the fork handlers' registration nor the owner's check: for the
/// handlers themselves.
pub(crate) fn lock_queue() -> QueueGuard {
    QUEUE.lock().unwrap_or_else(|e| e.into_inner())
}

/// A child of nodus's whose exit task is gone (see the module doc).
pub(super) struct Orphan {
    pidfd: OwnedFd,
    pid: Pid,
    group_exit_signal: Option<Signal>,
    /// A pidfd of the orphan guard that remembers the child's group: reaped after its exit.
    guard: Option<OwnedFd>,
    /// Its exit seen and its group signalled: waiting for the guard's exit.
    exited: bool,
    /// Dropped with the `Orphan`, after the reap.
    _ours: Ours,
}

impl Orphan {
    pub(super) fn new(
        pidfd: OwnedFd,
        pid: Pid,
        group_exit_signal: Option<Signal>,
        guard: Option<OwnedFd>,
        ours: Ours,
    ) -> Orphan {
        Orphan {
            pidfd,
            pid,
            group_exit_signal,
            guard,
            exited: false,
            _ours: ours,
        }
    }

    /// What its next step waits for: the child's exit, then (if any) the guard's.
    fn waiting_on(&self) -> BorrowedFd<'_> {
        match &self.guard {
            Some(guard) if self.exited => guard.as_fd(),
            _ => self.pidfd.as_fd(),
        }
    }

    /// The step `poll` found ready; `true` once the child is reaped (or not ours to reap).
    fn step(&mut self) -> bool {
        let wait = |options| loop {
            match rustix::process::waitid(WaitId::PidFd(self.pidfd.as_fd()), options) {
                Err(rustix::io::Errno::INTR) => continue,
                other => break other,
            }
        };
        let exited = WaitIdOptions::EXITED | WaitIdOptions::NOHANG;
        if self.exited {
            // The guard has exited: no table holds the group's id any more.
            self.guard = None;
        } else if self.group_exit_signal.is_some() || self.guard.is_some() {
            match wait(exited | WaitIdOptions::NOWAIT) {
                Ok(None) => return false,
                Ok(Some(_)) => {}
                Err(_) => return true,
            }
            if let Some(sig) = self.group_exit_signal {
                // An empty group (ESRCH) is what we want.
                let _ = rustix::process::kill_process_group(self.pid, sig);
            }
            if self.guard.is_some() {
                self.exited = true;
                return false;
            }
        }
        !matches!(wait(exited), Ok(None))
    }
}

/// How often the thread looks at each fd when one `poll` of them all fails.
const SWEEP: Duration = Duration::from_millis(100);

/// Whether `fd` is readable now (a `poll` of it alone, which no fd limit refuses).
fn ready_now(fd: BorrowedFd<'_>) -> bool {
    let mut one = [PollFd::from_borrowed_fd(fd, PollFlags::IN)];
    let now = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    rustix::event::poll(&mut one, Some(&now)).is_ok_and(|n| n > 0)
}

/// Hands `orphan` to the thread, starting one if none runs. If none can start (no eventfd, no
/// thread), one warning line: the child stays queued, an unreaped zombie once it exits, until a
/// later hand-off starts the thread.
pub(super) fn adopt(orphan: Orphan) {
    let mut q = queue();
    q.new.push(orphan);
    if let Some(wake) = &q.wake {
        let _ = rustix::io::write(wake, &1u64.to_ne_bytes());
        return;
    }
    let started = rustix::event::eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)
        .map_err(std::io::Error::from)
        .and_then(|fd| {
            let wake = Arc::new(fd);
            let theirs = wake.clone();
            std::thread::Builder::new()
                .name("nodus-orphans".into())
                .spawn(move || run(theirs))
                .map(|_| wake)
        });
    match started {
        Ok(wake) => q.wake = Some(wake),
        Err(e) => {
            let queued = q.new.len();
            // Said without the queue's lock, which the fork handlers take (`crate::atfork`): no
            // code of the program's (a tracing subscriber) runs under it.
            drop(q);
            tracing::warn!(
                target: "nodus::process",
                "cannot start the thread that reaps children whose loop is gone ({e}): {queued} \
                 stay unreaped for now"
            );
        }
    }
}

/// The thread: takes what is handed over, waits for any of it to be ready, steps it, and ends
/// once it holds nothing (under the queue's lock, so no hand-off is missed).
fn run(wake: Arc<OwnedFd>) {
    let mut orphans: Vec<Orphan> = Vec::new();
    let mut warned = false;
    loop {
        {
            let mut q = queue();
            orphans.append(&mut q.new);
            if orphans.is_empty() {
                q.wake = None;
                return;
            }
        }
        let mut fds = vec![PollFd::new(&*wake, PollFlags::IN)];
        fds.extend(
            orphans
                .iter()
                .map(|o| PollFd::from_borrowed_fd(o.waiting_on(), PollFlags::IN)),
        );
        let ready: Vec<bool> = match rustix::event::poll(&mut fds, None) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {
                fds.iter().map(|fd| !fd.revents().is_empty()).collect()
            }
            Err(e) => {
                // More fds than `RLIMIT_NOFILE` (`EINVAL`: the limit was lowered after they were
                // opened) or no memory: look at each fd alone, every `SWEEP`.
                if !warned {
                    warned = true;
                    tracing::warn!(
                        target: "nodus::process",
                        "orphan reaper: poll of {} fds: {e}; looking at each every {SWEEP:?}",
                        fds.len()
                    );
                }
                std::thread::sleep(SWEEP);
                fds.iter().map(|fd| ready_now(fd.as_fd())).collect()
            }
        };
        drop(fds);
        if ready[0] {
            let _ = rustix::io::read(&*wake, &mut [0u8; 8]);
        }
        let mut ready = ready[1..].iter();
        orphans.retain_mut(|o| !(*ready.next().expect("one per orphan") && o.step()));
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use rustix::process::{Pid, PidfdFlags};

    use super::super::alone::{alone, exit_code, fork_child};
    use super::super::reaper::table;
    use super::*;

    /// A child handed to this process's thread and not yet taken is not a process forked from
    /// this one's to reap: at its first hand-off its queue is empty, and dropping the child's
    /// entry there releases nothing of its own table (where a child of its own may hold the
    /// same number).
    #[test]
    fn a_forked_process_drops_the_children_handed_over_in_its_parent() {
        if !alone(
            "process::orphans::tests::a_forked_process_drops_the_children_handed_over_in_its_parent",
        ) {
            return;
        }
        let parents_child = fork_child(true);
        let pid = Pid::from_raw(parents_child).unwrap();
        let pidfd = rustix::process::pidfd_open(pid, PidfdFlags::empty()).unwrap();
        let ours = table().claim(parents_child);
        // Queued as by a hand-off whose thread has not taken it yet (here: none runs).
        queue().new.push(Orphan::new(pidfd, pid, None, None, ours));
        // SAFETY: the forked process (this one has no other thread) runs the checks below and
        // `_exit`s, never returning into the harness.
        let forked = unsafe { libc::fork() };
        if forked == 0 {
            let code = std::panic::catch_unwind(|| {
                let own = table().claim(parents_child);
                if !queue().new.is_empty() {
                    return 1;
                }
                if !table().holds(parents_child) {
                    return 2;
                }
                drop(own);
                0
            });
            // SAFETY: ends the forked process without running this one's exit handlers.
            unsafe { libc::_exit(code.unwrap_or(9)) };
        }
        assert!(forked > 0);
        let code = exit_code(forked, Duration::from_secs(10));
        let left = std::mem::take(&mut queue().new);
        // SAFETY: our unreaped child: killed, then reaped below.
        unsafe { libc::kill(parents_child, libc::SIGKILL) };
        let _ = exit_code(parents_child, Duration::from_secs(5));
        assert_eq!(left.len(), 1, "this process's queue lost its child");
        drop(left);
        assert_eq!(
            code,
            Ok(0),
            "forked process: 1 = still queues the parent's child, 2 = its drop released a \
             registration of the forked process's own"
        );
    }
}
