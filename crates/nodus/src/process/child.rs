//! [`Child`]: a running child process, its exit observed through a pidfd in the reactor.
//!
//! `spawn` opens a pidfd (`pidfd_open`) for the new child and registers it with the loop; the
//! kernel makes a pidfd readable when the process exits. A small task ("process:exit") waits for
//! that readiness and reaps the child with `waitid(P_PIDFD, WEXITED | WNOHANG)`. So there is no
//! `SIGCHLD` handler to race with, no `waitpid(-1)` that could steal another library's child, and
//! no thread per child.
//!
//! Invariants:
//! - The child is reaped exactly once, whether or not anyone awaits [`Child::wait`]; dropping the
//!   `Child` does not kill it. While its loop lives, its exit task reaps it: an unref'd child
//!   whose loop is not running (`block_on` returned) is reaped at the loop's next iteration
//!   (`run_nowait` included; its pidfd stays readable). Once the loop's `Runtime` is dropped
//!   (the exit task with it) and the `Child` too, the drop of the last of them reaps it if it
//!   has exited, else hands it to the orphan reaper's thread (`orphans`), which reaps it at its
//!   exit (group exit signal and guard order kept). So no zombie outlives both the runtime and
//!   the `Child` (unless that thread cannot start: one warning line, see `orphans`). A `Child` held past its runtime is not reaped while held (its pid stays its
//!   own: [`Child::kill_group`] stays safe), nor is the child of a runtime kept and never run
//!   again.
//! - A `Child` held past its runtime, its exit not observed before, does what needs no loop
//!   (`kill`, `kill_group`, `has_exited`) but observes no exit: as every handle of a dropped
//!   runtime, it waits for nothing. [`Child::wait`] and [`Child::try_wait`] give an error then
//!   (at once, and a `wait` pending in another runtime is woken with it: the exit task's drop
//!   says so), never a status and never a wait without end. The child is reaped when the
//!   `Child` is dropped, as above. An exit observed before the drop keeps its status.
//! - [`Child::has_exited`] only looks (`waitid(WNOWAIT)`), so it may see the exit before the exit
//!   task does (a zombie not yet reaped) and never takes the reap from it.
//! - Until its exit is observed the child is an active ref'd handle (Node: a `ChildProcess`
//!   keeps the loop alive); [`Child::unref`] releases it. After the exit the pidfd is closed and
//!   nothing is ref'd.
//! - Signals go through the pidfd (`pidfd_send_signal`), so a recycled pid is never signalled;
//!   [`Child::kill_group`] signals the group only until the child is reaped (while its pid, and
//!   so the group's id, cannot be recycled).
//! - With a group exit signal ([`Command::group_exit_signal`](super::Command::group_exit_signal)),
//!   the exit task looks at the exit first (`WNOWAIT`, which leaves the child a zombie), signals
//!   what is left of the child's process group, then reaps: the group is signalled while its id
//!   is still the zombie's pid, so never a recycled one. It lists the group's other running
//!   processes (`/proc`) just before the signal ([`Child::left_in_group`]): the zombie leader
//!   keeps the group in being, so the signal's own result cannot tell an empty group. The
//!   listing runs on the loop, so in a child subreaper (a cluster primary) it walks only this
//!   process's descendants, where the group's processes all are (`own_descendants`); in
//!   another process, every process on the host.
//! - The child is registered as nodus's own (`reaper::Ours`, taken before the fork) until it
//!   has been reaped (by its exit task, the watch's drop or the orphan reaper): no subreaper pass
//!   touches it, zombie or not (`Child::watch` hands the registration back on error, for the
//!   caller to drop after its own reap).
//! - A child whose group an orphan guard remembers ([`Child::guard_group`]) is forgotten by the
//!   guard in that same window: after the group signal, before the reap (the guard never holds
//!   a pgid that could be reused; see `guard`). Handed to the orphan reaper while running, it
//!   stays remembered and is reaped only after the guard's exit (see `orphans`).

use std::cell::{Cell, RefCell};
use std::fmt;
use std::future::poll_fn;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::rc::Rc;
use std::task::{Context, Poll, Waker, ready};

use rustix::process::{Pid, Signal, WaitId, WaitIdOptions, WaitIdStatus};

use super::guard::OrphanGuard;
use super::orphans::Orphan;
use super::pipes::{ChildStderr, ChildStdin, ChildStdout};
use super::reaper::Ours;
use crate::io::AsyncFd;
use crate::ipc::Channel;

/// How a child ended: an exit code, or the signal that killed it (Node's `(code, signal)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitStatus {
    code: Option<i32>,
    signal: Option<i32>,
}

impl ExitStatus {
    /// The exit code, if the process exited by itself.
    pub fn code(&self) -> Option<i32> {
        self.code
    }

    /// The signal that terminated the process, if one did.
    pub fn signal(&self) -> Option<i32> {
        self.signal
    }

    /// Exited with code 0.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

impl fmt::Display for ExitStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.code, self.signal) {
            (Some(c), _) => write!(f, "exit code {c}"),
            (None, Some(s)) => write!(f, "killed by signal {s}"),
            (None, None) => write!(f, "unknown exit"),
        }
    }
}

/// The exit watch shared by a `Child` and its exit task.
struct Watch {
    pid: Pid,
    /// Sent to the child's process group between its exit and its reap.
    group_exit_signal: Option<Signal>,
    /// The orphan guard that remembers the child's group: told to forget it before the reap.
    guard: RefCell<Option<OrphanGuard>>,
    pidfd: RefCell<Option<AsyncFd<OwnedFd>>>,
    status: RefCell<Option<Result<ExitStatus, (io::ErrorKind, String)>>>,
    waiters: RefCell<Vec<Waker>>,
    /// The child's registration as nodus's own (no subreaper reaps it): released after the
    /// reap (see `reaper`).
    ours: RefCell<Option<Ours>>,
    /// What the group exit signal was sent to besides the child (`Child::left_in_group`).
    left_in_group: RefCell<Vec<(u32, String)>>,
    /// The exit task was dropped before the exit (with its runtime): no status will come.
    abandoned: Cell<bool>,
}

impl Watch {
    fn poll_reap(&self, cx: &mut Context<'_>) -> Poll<io::Result<ExitStatus>> {
        let guard = self.pidfd.borrow();
        let pidfd = guard.as_ref().expect("the pidfd lives until the reap");
        loop {
            ready!(pidfd.poll_read_ready(cx))?;
            match self.try_reap(pidfd.get_ref().as_fd(), true) {
                Ok(Some(st)) => {
                    return Poll::Ready(Ok(ExitStatus {
                        code: st.exit_status(),
                        signal: st.terminating_signal(),
                    }));
                }
                Ok(None) => pidfd.clear_read_ready(),
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Poll::Ready(Err(e.into())),
            }
        }
    }

    /// Reaps the child if it has exited; with a group exit signal, signals its group first,
    /// while the child is still a zombie (`look`: after listing what else the group holds, for
    /// `Child::left_in_group`), and then has its orphan guard, if any, forget the group (see
    /// the module doc).
    fn try_reap(
        &self,
        pidfd: BorrowedFd<'_>,
        look: bool,
    ) -> rustix::io::Result<Option<WaitIdStatus>> {
        let exited = WaitIdOptions::EXITED | WaitIdOptions::NOHANG;
        if self.group_exit_signal.is_some() || self.guard.borrow().is_some() {
            let peek = exited | WaitIdOptions::NOWAIT;
            if rustix::process::waitid(WaitId::PidFd(pidfd), peek)?.is_none() {
                return Ok(None);
            }
            if let Some(sig) = self.group_exit_signal {
                if look {
                    *self.left_in_group.borrow_mut() = group_members(self.pid);
                }
                // An empty group (ESRCH) is what we want. (The zombie leads it still, so the
                // call never says whether it held more: `group_members` does.)
                let _ = rustix::process::kill_process_group(self.pid, sig);
            }
            // The zombie still holds the group's id: the guard forgets it before it can be
            // another's.
            let guard = self.guard.borrow_mut().take();
            if let Some(guard) = guard {
                guard.forget(self.pid);
            }
        }
        rustix::process::waitid(WaitId::PidFd(pidfd), exited)
    }

    fn finish(&self, result: io::Result<ExitStatus>) {
        let pidfd = self.pidfd.borrow_mut().take();
        drop(pidfd);
        // Reaped (or not ours to reap any more): its number may be another's from now on.
        let ours = self.ours.borrow_mut().take();
        drop(ours);
        *self.status.borrow_mut() = Some(result.map_err(|e| (e.kind(), e.to_string())));
        let waiters = std::mem::take(&mut *self.waiters.borrow_mut());
        for w in waiters {
            w.wake();
        }
    }

    fn exited(&self) -> Option<io::Result<ExitStatus>> {
        if let Some(r) = self.status.borrow().as_ref() {
            return Some(r.clone().map_err(|(kind, msg)| io::Error::new(kind, msg)));
        }
        self.abandoned.get().then(|| {
            Err(io::Error::other(format!(
                "nodus::process: child {}: its runtime was dropped before its exit was \
                 observed, so no exit status will come (it is reaped when its Child is dropped)",
                self.pid.as_raw_nonzero()
            )))
        })
    }
}

/// Held by the exit task's future: dropped before the exit was observed (the runtime's drop
/// drops every task), it marks the watch abandoned and wakes its waiters (module doc).
struct ExitTask(Rc<Watch>);

impl Drop for ExitTask {
    fn drop(&mut self) {
        if self.0.status.borrow().is_some() {
            return;
        }
        self.0.abandoned.set(true);
        let waiters = std::mem::take(&mut *self.0.waiters.borrow_mut());
        for w in waiters {
            w.wake();
        }
    }
}

impl Drop for Watch {
    /// The exit task was dropped before the reap (its loop's `Runtime` is gone) and so is the
    /// `Child`: reaps the child now if it has exited, else hands it to the orphan reaper (see
    /// the module doc).
    fn drop(&mut self) {
        // Both are taken by `finish` (the exit task reaped the child, or gave up). `ours` is
        // dropped when this returns: after any reap here.
        let (Some(pidfd), Some(ours)) = (self.pidfd.get_mut().take(), self.ours.get_mut().take())
        else {
            return;
        };
        let pidfd = pidfd.into_inner();
        loop {
            match self.try_reap(pidfd.as_fd(), false) {
                Ok(None) => break,
                Err(rustix::io::Errno::INTR) => {}
                // Reaped, or not ours to reap (as in `finish`).
                Ok(Some(_)) | Err(_) => return,
            }
        }
        // A guard that remembers its group: the child is reaped after the guard's exit.
        let mut guard_pidfd = None;
        if let Some(guard) = self.guard.get_mut().take() {
            match guard.pidfd() {
                Some(Ok(fd)) => guard_pidfd = Some(fd),
                // Reaped: the guard has exited and remembers nothing.
                None => {}
                // Its exit cannot be waited for: forgotten now (not covered, never wrong).
                Some(Err(_)) => guard.forget(self.pid),
            }
        }
        let orphan = Orphan::new(pidfd, self.pid, self.group_exit_signal, guard_pidfd, ours);
        super::orphans::adopt(orphan);
    }
}

/// A spawned child process.
pub struct Child {
    watch: Rc<Watch>,
    /// The write end of the child's stdin, when it was [`Stdio::Pipe`](super::Stdio::Pipe).
    pub stdin: Option<ChildStdin>,
    /// The read end of the child's stdout, when it was a pipe.
    pub stdout: Option<ChildStdout>,
    /// The read end of the child's stderr, when it was a pipe.
    pub stderr: Option<ChildStderr>,
    /// The IPC channel, when the child was spawned with one ([`fork`](super::fork) or
    /// [`Command::ipc`](super::Command::ipc)).
    pub channel: Option<Channel>,
}

impl Child {
    /// Registers the child's pidfd and starts its exit task, which reaps it and then releases
    /// `ours`. On error, `ours` is handed back: the caller reaps the child itself, then drops it.
    #[track_caller]
    pub(crate) fn watch(
        pid: Pid,
        ours: Ours,
        group_exit_signal: Option<Signal>,
    ) -> Result<Child, (io::Error, Ours)> {
        let opened = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())
            .map_err(io::Error::from)
            .and_then(AsyncFd::new);
        let pidfd = match opened {
            Ok(fd) => fd,
            Err(e) => return Err((e, ours)),
        };
        let watch = Rc::new(Watch {
            pid,
            group_exit_signal,
            guard: RefCell::new(None),
            pidfd: RefCell::new(Some(pidfd)),
            status: RefCell::new(None),
            waiters: RefCell::new(Vec::new()),
            ours: RefCell::new(Some(ours)),
            left_in_group: RefCell::new(Vec::new()),
            abandoned: Cell::new(false),
        });
        let task = ExitTask(watch.clone());
        crate::task::spawn_named("process:exit", async move {
            let w = &task.0;
            let result = poll_fn(|cx| w.poll_reap(cx)).await;
            w.finish(result);
        })
        .detach();
        Ok(Child {
            watch,
            stdin: None,
            stdout: None,
            stderr: None,
            channel: None,
        })
    }

    /// The child's process id.
    pub fn id(&self) -> u32 {
        self.watch.pid.as_raw_nonzero().get() as u32
    }

    /// Waits for the child to exit (any number of tasks may wait).
    ///
    /// # Errors
    /// One the reap met (not ours to wait for), or, once the child's runtime was dropped before
    /// its exit was observed, an error saying so (`ErrorKind::Other`): no status will come
    /// (see the module docs).
    pub async fn wait(&self) -> io::Result<ExitStatus> {
        poll_fn(|cx| {
            if let Some(r) = self.watch.exited() {
                return Poll::Ready(r);
            }
            let mut waiters = self.watch.waiters.borrow_mut();
            if !waiters.iter().any(|w| w.will_wake(cx.waker())) {
                waiters.push(cx.waker().clone());
            }
            Poll::Pending
        })
        .await
    }

    /// The exit status, if the exit has been observed; `wait`'s error once it never will be
    /// (its runtime was dropped first).
    pub fn try_wait(&self) -> Option<io::Result<ExitStatus>> {
        self.watch.exited()
    }

    /// With a group exit signal, the processes it was sent to besides the child, as `/proc`
    /// listed them just before (pid and name, `comm`): what the child left running in its
    /// group (a wrapper script's program, a worker's own children), not yet exited. Known once
    /// the exit task has reaped the child ([`wait`](Self::wait) returned); empty before, with
    /// no group exit signal, and when the group held the child alone. A process forked in the
    /// group between the listing and the signal got the signal too, unlisted.
    pub fn left_in_group(&self) -> Vec<(u32, String)> {
        self.watch.left_in_group.borrow().clone()
    }

    /// Whether the child has exited, its exit observed ([`try_wait`](Self::try_wait)) or not
    /// yet: a zombie that its exit task has not reaped (the loop has not polled its pidfd since)
    /// counts. A timer due in the same loop turn as the exit runs before the poll phase that
    /// observes it, so a deadline's decision ("still running: kill it") asks this first. It only
    /// looks (`waitid(WNOWAIT)`): the exit task still reaps the child, and [`wait`](Self::wait)
    /// gives its status. An error (not ours to wait for) counts as exited, as it ends the exit
    /// task's wait.
    pub fn has_exited(&self) -> bool {
        let pidfd = self.watch.pidfd.borrow();
        // Taken at the reap.
        let Some(pidfd) = pidfd.as_ref() else {
            return true;
        };
        let peek = WaitIdOptions::EXITED | WaitIdOptions::NOHANG | WaitIdOptions::NOWAIT;
        loop {
            match rustix::process::waitid(WaitId::PidFd(pidfd.get_ref().as_fd()), peek) {
                Ok(found) => return found.is_some(),
                Err(rustix::io::Errno::INTR) => {}
                Err(_) => return true,
            }
        }
    }

    /// Sends `signal` (`nodus::signal::SIGTERM`, ...) to the child through its pidfd. `0` sends
    /// nothing and only checks that the child has not been reaped (`kill(pid, 0)`, Node's
    /// `subprocess.kill(0)`).
    ///
    /// # Errors
    /// `InvalidInput` for a number that is not a signal; `NotFound` once the child has exited.
    pub fn kill(&self, signal: i32) -> io::Result<()> {
        let sig = (signal != 0).then(|| to_signal(signal)).transpose()?;
        let guard = self.watch.pidfd.borrow();
        let Some(pidfd) = guard.as_ref() else {
            return Err(gone(self.id()));
        };
        let Some(sig) = sig else {
            return Ok(()); // the pidfd is held until the child is reaped
        };
        rustix::process::pidfd_send_signal(pidfd.get_ref(), sig).map_err(|e| match e {
            rustix::io::Errno::SRCH => gone(self.id()),
            e => e.into(),
        })
    }

    /// Sends `signal` to the child's process group: the child must lead one
    /// ([`Command::process_group`](super::Command::process_group)`(0)`). `0` sends nothing and
    /// checks that the group still has a process (`kill(-pgid, 0)`).
    ///
    /// # Errors
    /// As [`kill`](Self::kill); `NotFound` once the child's exit has been observed (it has been
    /// reaped, so its pid may name another group by now); the OS error (`ESRCH`) for a child
    /// that leads no group.
    pub fn kill_group(&self, signal: i32) -> io::Result<()> {
        let sig = (signal != 0).then(|| to_signal(signal)).transpose()?;
        if self.watch.pidfd.borrow().is_none() {
            return Err(gone(self.id()));
        }
        match sig {
            Some(sig) => rustix::process::kill_process_group(self.watch.pid, sig)?,
            None => rustix::process::test_kill_process_group(self.watch.pid)?,
        }
        Ok(())
    }

    /// Sends `signal` to the child and every process descended from it (found through
    /// `/proc/<pid>/task/*/children`, each held by a pidfd before the first signal, so a pid
    /// recycled meanwhile is never signalled). A descendant that forks or is re-parented while
    /// this runs may be missed; use a process group when that matters. `0` is
    /// [`kill`](Self::kill)`(0)`: it checks the child alone.
    pub fn kill_tree(&self, signal: i32) -> io::Result<()> {
        if signal == 0 {
            return self.kill(0);
        }
        let sig = to_signal(signal)?;
        let mut all = Vec::new();
        {
            let guard = self.watch.pidfd.borrow();
            if let Some(pidfd) = guard.as_ref() {
                descendants(self.watch.pid, pidfd.get_ref().as_fd(), &mut all);
            }
        }
        self.kill(signal)?;
        for pidfd in all {
            // Already gone is fine: that is what we wanted.
            let _ = rustix::process::pidfd_send_signal(&pidfd, sig);
        }
        Ok(())
    }

    /// Has `guard` remember the child's process group now and forget it at the child's exit,
    /// after the group exit signal and before the reap (see the module doc). The child must lead
    /// its own group ([`Command::process_group`](super::Command::process_group)`(0)`); give it a
    /// group exit signal too, or its group is forgotten at its exit without being signalled. No
    /// effect once the child has been reaped.
    pub(crate) fn guard_group(&self, guard: &OrphanGuard) {
        if self.watch.pidfd.borrow().is_none() {
            return;
        }
        guard.remember(self.watch.pid);
        *self.watch.guard.borrow_mut() = Some(guard.clone());
    }

    /// A new pidfd of the child, `None` once it has been reaped.
    pub(super) fn pidfd(&self) -> Option<io::Result<OwnedFd>> {
        let pidfd = self.watch.pidfd.borrow();
        Some(pidfd.as_ref()?.get_ref().try_clone())
    }

    /// The child no longer keeps the loop alive (Node's `child.unref()`). Its stdio pipes and
    /// IPC channel are handles of their own: unref or drop them too (Node's recipe is
    /// `stdio: 'ignore'` plus `unref()`).
    pub fn unref(&self) {
        if let Some(fd) = self.watch.pidfd.borrow().as_ref() {
            fd.unref();
        }
    }

    /// The child keeps the loop alive until it exits (the default).
    pub fn ref_(&self) {
        if let Some(fd) = self.watch.pidfd.borrow().as_ref() {
            fd.ref_();
        }
    }
}

impl fmt::Debug for Child {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Child")
            .field("pid", &self.id())
            .field("status", &self.watch.status.borrow())
            .finish()
    }
}

fn gone(pid: u32) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("nodus::process: child {pid} has exited"),
    )
}

pub(crate) fn to_signal(signal: i32) -> io::Result<Signal> {
    Signal::from_named_raw(signal).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("nodus::process: {signal} is not a signal number"),
        )
    })
}

/// Appends every descendant of `pid` (depth first) to `out`.
/// Pidfds of the descendants of `pid`, whose own pidfd is `pidfd`, appended to `out`. A child
/// listed in `/proc` is taken only if, once its pidfd is open, its parent is still `pid` and
/// that parent still alive (so `pid` was not recycled): then the pidfd is that child's.
pub(super) fn descendants(pid: Pid, pidfd: BorrowedFd<'_>, out: &mut Vec<OwnedFd>) {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{}/task", pid.as_raw_nonzero())) else {
        return;
    };
    let listed: Vec<Pid> = tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("children")).ok())
        .flat_map(|children| {
            children
                .split_whitespace()
                .filter_map(|c| c.parse().ok().and_then(Pid::from_raw))
                .collect::<Vec<_>>()
        })
        .collect();
    for child in listed {
        let Ok(child_fd) = rustix::process::pidfd_open(child, rustix::process::PidfdFlags::empty())
        else {
            continue;
        };
        if parent_of(child) != Some(pid) || has_exited(pidfd) {
            continue;
        }
        descendants(child, child_fd.as_fd(), out);
        out.push(child_fd);
    }
}

/// Whether the process of `pidfd` has exited (its pidfd is readable then); an error counts as
/// exited.
fn has_exited(pidfd: BorrowedFd<'_>) -> bool {
    let mut fds = [rustix::event::PollFd::new(
        &pidfd,
        rustix::event::PollFlags::IN,
    )];
    let zero = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    rustix::event::poll(&mut fds, Some(&zero)).map_or(true, |ready| ready > 0)
}

/// The processes of process group `pgid` other than its leader, not yet exited (no zombie),
/// from `/proc/PID/stat` (state, group and `comm`): pid and name. Run on the loop at a child's
/// exit, so it looks only at this process's descendants when that is enough
/// ([`own_descendants`]): O(this process's subtree), not O(every process on the host).
fn group_members(pgid: Pid) -> Vec<(u32, String)> {
    let leader = pgid.as_raw_nonzero().get();
    let candidates = own_descendants().unwrap_or_else(|| {
        std::fs::read_dir("/proc")
            .map(|dir| {
                dir.flatten()
                    .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
                    .collect()
            })
            .unwrap_or_default()
    });
    candidates
        .into_iter()
        .filter(|&pid| pid != leader)
        .filter_map(|pid| {
            let stat = super::stat::read(pid)?;
            (stat.group == leader && !stat.has_exited()).then_some((pid as u32, stat.name))
        })
        .collect()
}

/// Every descendant of this process (`/proc/PID/task/*/children`, from its own threads down),
/// when it is a child subreaper: it adopts what its descendants orphan (a wrapper script's
/// program, once the script has exited), so every process descended from a child of its stays
/// in its subtree, and so does every process of a group such a child leads that joined it by
/// a fork (one outside it could join by a `setpgid` of its own, within the session: not looked
/// for). `None` when it is no
/// subreaper (orphans went to init, or to another subreaper) or the kernel has no `children`
/// files (`CONFIG_PROC_CHILDREN`): the caller looks at every process. A process forked, or
/// re-parented, while the walk runs may be missed.
fn own_descendants() -> Option<Vec<i32>> {
    let subreaper = rustix::process::child_subreaper().ok().flatten().is_some();
    if !subreaper || !std::path::Path::new("/proc/thread-self/children").exists() {
        return None;
    }
    let children = |pid: &str| -> Vec<i32> {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return Vec::new();
        };
        tasks
            .flatten()
            .filter_map(|task| std::fs::read_to_string(task.path().join("children")).ok())
            .flat_map(|list| {
                list.split_whitespace()
                    .filter_map(|c| c.parse().ok())
                    .collect::<Vec<i32>>()
            })
            .collect()
    };
    let mut found = children("self");
    let mut seen: std::collections::HashSet<i32> = found.iter().copied().collect();
    let mut next = 0;
    while let Some(&pid) = found.get(next) {
        next += 1;
        for child in children(&pid.to_string()) {
            if seen.insert(child) {
                found.push(child);
            }
        }
    }
    Some(found)
}

/// The parent of `pid` (`/proc/<pid>/stat` field 4), if it still exists.
pub(super) fn parent_of(pid: Pid) -> Option<Pid> {
    Pid::from_raw(super::stat::read(pid.as_raw_nonzero().get())?.parent)
}
