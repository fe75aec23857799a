//! Child processes: [`Command`] / [`spawn`](Command::spawn), [`exec()`], [`exec_file`],
//! [`fork`] (a child with a Node-compatible IPC channel, see [`crate::ipc`]) and [`output`]
//! (a child's output copied line by line, with a prefix, to our own stdout or stderr; our own
//! log lines to stderr without ever blocking).
//!
//! Invariants that hold for every child (details in each file):
//! - Exits are observed through a pidfd registered with the reactor (readable at exit) and reaped
//!   with `waitid(P_PIDFD)`: no `SIGCHLD` handler, no `waitpid(-1)`, no thread per child. A child
//!   is a ref'd handle until its exit is observed (Node's rule); `Child::unref` releases it.
//!   A child whose `Runtime` is dropped before its exit (its exit task with it) is reaped once
//!   its `Child` is dropped too: then if it has exited, else at its exit by one background
//!   thread for the process (`orphans`, crate-private), so none is left a zombie. Until then
//!   its `Child` observes no exit (a handle of a dropped runtime does nothing): `wait` and
//!   `try_wait` give an error saying so, at once, never a wait without end.
//!   A group exit signal (`Command::group_exit_signal`) reaches what is left of the child's
//!   process group after its exit and before its reap, while the zombie still holds the group's
//!   id.
//! - Spawning happens on the loop thread. A parent-death signal (`PR_SET_PDEATHSIG`) is opt-in
//!   for `spawn` and on (`SIGTERM`) for `fork`; it fires when the forking *thread* exits.
//! - Every fd the parent holds is close-on-exec; a child inherits its stdio, the fds passed with
//!   [`Command::pass_fd`] (at their target numbers) and, with IPC, the channel: fd 3, or right
//!   after the highest passed fd (listeners at 3..3+n, then the channel).
//! - A child starts with the soft open-files limit this process started with, even after
//!   [`raise_fd_limit`] raised ours (systemd's rule: a program using `select()` must not get fds
//!   over `FD_SETSIZE` that a raised limit would let it open; Node and nodus raise their own).
//! - An orphan guard (`guard`, crate-private: a cluster primary's) is a fork of this process
//!   without `exec`, running async-signal-safe code only; it SIGKILLs the process groups it was
//!   told of, and the processes the subreaper adopted (with the groups they lead), once this
//!   process is gone. Its remember/forget order is tied to the reap (`Child::guard_group` for a
//!   worker's group, the subreaper's pass for an adopted pid), so it never holds a pgid or a pid
//!   that could be another's. Its name,
//!   [`GUARD_NAME`], tells it from a worker among this process's children.
//! - Every child nodus forks (`Command::spawn`, the orphan guard) is registered as nodus's own
//!   (`reaper`, crate-private) from before the fork until after its reap by its exit task (or,
//!   its runtime gone, by `orphans`). A
//!   subreaper (`Reaper`, a cluster primary's with
//!   [`Config::subreaper`](crate::cluster::Config::subreaper)) reaps only the children that
//!   table does not hold, one `waitid(P_PID)` each, under the table's lock with no fork in
//!   progress: never one of nodus's own, so no exit status a `Child` waits for is ever taken.
//!   (A child forked by other means, `std::process`, is not in the table: that is why the
//!   subreaper is opt-in.) At its end (`close`, or its runtime dropped) the subreaper hands the
//!   adopted children still unreaped to `orphans`, each registered as nodus's own then and
//!   reaped by its pidfd: none is left a zombie, and no child forked later is waited for.
//! - The registry's lock (`reaper`) and the orphan queue's (`orphans`) are never copied held
//!   into a forked process: the forking thread takes them, with nodus's other process-wide
//!   locks, around every `fork` (`crate::atfork`). Both are keyed on the pid that owns them: at
//!   its first use in a process forked without `exec`, the registry forgets the parent's children
//!   and forks in progress (a fork on another thread of the parent never registers here), and the
//!   orphan queue the children handed to the parent's thread. So such a process can spawn, reap
//!   through a subreaper and hand children over as any other.
//! - Requires Linux ≥ 5.3 (pidfd).

mod child;
mod command;
mod exec;
mod guard;
mod orphans;
pub mod output;
mod pipes;
mod reaper;
pub(crate) mod sched;
pub(crate) mod stat;

use std::ffi::OsStr;
use std::io;
use std::sync::OnceLock;

pub use child::{Child, ExitStatus};
pub use command::{CHANNEL_FD, Command, Stdio};
pub use exec::{ExecError, ExecErrorKind, ExecOptions, Output, exec, exec_file};
pub use guard::GUARD_NAME;
pub(crate) use guard::OrphanGuard;
pub(crate) use orphans::{QueueGuard, lock_queue};
pub use pipes::{ChildStderr, ChildStdin, ChildStdout};
pub(crate) use reaper::{Reaper, TableGuard, lock_table};

use crate::ipc::{Channel, ChannelOptions};
use crate::signal::SIGTERM;

/// Node's `child_process.fork()`: runs `program` with `args`, stdio inherited, an IPC channel on
/// fd 3 (`NODE_CHANNEL_FD=3`, `NODE_CHANNEL_SERIALIZATION_MODE=json`) and `SIGTERM` as its
/// parent-death signal. Works for a Node script (`fork("node", ["child.js"])`) and for a nodus
/// program that opens [`Channel::from_env`]. For other settings, use [`Command::ipc`].
///
/// # Panics
/// Outside a running nodus loop.
#[track_caller]
pub fn fork<I, S>(program: impl AsRef<OsStr>, args: I) -> io::Result<(Child, Channel)>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut cmd = Command::new(program);
    cmd.args(args)
        .stdin(Stdio::Inherit)
        .stdout(Stdio::Inherit)
        .stderr(Stdio::Inherit)
        .parent_death_signal(Some(SIGTERM))
        .ipc(ChannelOptions::default());
    let mut child = cmd.spawn()?;
    let channel = child.channel.take().expect("spawned with ipc");
    Ok((child, channel))
}

/// The soft open-files limit this process started with, once [`raise_fd_limit`] has raised it:
/// what children get back.
static STARTING_FD_LIMIT: OnceLock<u64> = OnceLock::new();

/// Raises this process's soft open-files limit to its hard limit (a server holds one fd per
/// connection; a cluster primary also counts the fds it has in flight to its workers against it).
/// Children spawned afterwards still start with the old soft limit (see the module doc).
/// A failure is logged, not returned: the process runs on with the old limit.
pub fn raise_fd_limit() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    if let (Some(soft), true) = (limit.current, limit.current < limit.maximum) {
        let _ = STARTING_FD_LIMIT.set(soft);
        limit.current = limit.maximum;
        if let Err(e) = setrlimit(Resource::Nofile, limit) {
            tracing::warn!("cannot raise the open-files limit: {e}");
        }
    }
}

/// The open-files limit a child is to start with, if [`raise_fd_limit`] changed ours: the
/// starting soft limit under the current hard one.
fn child_fd_limit() -> Option<rustix::process::Rlimit> {
    let soft = *STARTING_FD_LIMIT.get()?;
    let mut limit = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    limit.current = Some(soft);
    Some(limit)
}

/// For the tests that fork without `exec` or mark the process a subreaper: each one runs alone,
/// in a fresh process of the test binary (one test, one thread).
#[cfg(test)]
pub(super) mod alone {
    use std::time::Duration;

    /// In the fresh process, `true`: the caller runs its scenario. Here, runs test `name` (its
    /// path, `crate::` omitted) alone in a fresh process of this binary ([`nodus_testkit::alone`]),
    /// asserts that it passed, and returns `false`.
    pub(crate) fn alone(name: &str) -> bool {
        nodus_testkit::alone::scenario(name)
    }

    /// Forks a child that `_exit(0)`s at once (`pause_first`: after a signal ends its pause).
    pub(crate) fn fork_child(pause_first: bool) -> i32 {
        // SAFETY: the child makes async-signal-safe calls only, and `_exit`s.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            if pause_first {
                // SAFETY: plain syscalls.
                unsafe { libc::pause() };
            }
            // SAFETY: ends the child without running this process's exit handlers.
            unsafe { libc::_exit(0) };
        }
        assert!(pid > 0, "fork: {}", std::io::Error::last_os_error());
        pid
    }

    /// Waits for the forked process `pid` (SIGKILLed after `limit`): its exit code, or its wait
    /// status when it did not exit.
    pub(crate) fn exit_code(pid: i32, limit: Duration) -> Result<i32, libc::c_int> {
        let status = nodus_testkit::proc::reap_within(pid, limit);
        if libc::WIFEXITED(status) {
            Ok(libc::WEXITSTATUS(status))
        } else {
            Err(status)
        }
    }
}
