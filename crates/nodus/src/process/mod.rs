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
//!   thread for the process (`orphans`, crate-private), so none is left a zombie.
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
//! - nodus's two process-wide locks (the registry's in `reaper`, the orphan queue's in
//!   `orphans`) are kept whole across a `fork`: `pthread_atfork` handlers, registered at the
//!   first use of either, have the forking thread take both before the fork and let them go
//!   after it, in the parent and in the child. So no `fork` (glibc's: std's `Command`, nodus's
//!   own, or the program's, without `exec`) copies either held by another thread, maybe
//!   mid-update: a process forked without `exec` may hand children to the orphan reaper and
//!   spawn (the lock it would take is free in its copy). A fork pays two uncontended locks, or
//!   waits while a subreaper pass or a hand-off holds one (a pass: a listing of `/proc`).
//!   Neither lock is ever held while the other is taken, and nodus never forks while it holds
//!   one (the handlers would wait for this very thread). What nodus runs in its own forked
//!   children takes neither anyway: `pre_exec` steps and the guard are raw syscalls.
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

use std::cell::RefCell;
use std::ffi::OsStr;
use std::io;
use std::sync::{Once, OnceLock};

pub use child::{Child, ExitStatus};
pub use command::{CHANNEL_FD, Command, Stdio};
pub use exec::{ExecError, ExecErrorKind, ExecOptions, Output, exec, exec_file};
pub use guard::GUARD_NAME;
pub(crate) use guard::OrphanGuard;
pub use pipes::{ChildStderr, ChildStdin, ChildStdout};
pub(crate) use reaper::Reaper;

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

thread_local! {
    /// Both process-wide locks, held by this thread across a `fork` (see the module doc).
    static HELD_ACROSS_FORK: RefCell<Option<(reaper::TableGuard, orphans::QueueGuard)>> =
        const { RefCell::new(None) };
}

/// Registers, once, the handlers that keep the registry's and the orphan queue's locks whole
/// across a `fork` (see the module doc): each lock's accessor calls this before it locks, so
/// no thread holds one before they are registered.
pub(super) fn lock_across_forks() {
    static REGISTERED: Once = Once::new();
    REGISTERED.call_once(|| {
        // SAFETY: registers plain `extern "C"` functions without arguments; they never unwind
        // (a panic in them aborts) and stay valid for the life of the process.
        let r =
            unsafe { libc::pthread_atfork(Some(before_fork), Some(after_fork), Some(after_fork)) };
        if r != 0 {
            tracing::warn!(
                target: "nodus::process",
                "cannot register fork handlers ({}): a process forked without exec may find \
                 nodus's locks held",
                io::Error::from_raw_os_error(r)
            );
        }
    });
}

/// Before a `fork`, on the forking thread: takes both locks (the registry's first; neither is
/// held anywhere while the other is taken). Not if this thread's locals are gone (it is
/// exiting): then nothing is held, as without the handlers.
extern "C" fn before_fork() {
    let _ = HELD_ACROSS_FORK.try_with(|held| {
        *held.borrow_mut() = Some((reaper::lock_table(), orphans::lock_queue()));
    });
}

/// After a `fork`, in the parent and in the child (the forking thread's copy): lets both go.
extern "C" fn after_fork() {
    let _ = HELD_ACROSS_FORK.try_with(|held| drop(held.borrow_mut().take()));
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    use super::{orphans, reaper};

    /// Has another thread take a lock through `lock` and hold it 300 ms, forks meanwhile, and
    /// has the forked process take its copy through `take` and `_exit(0)`: its wait status
    /// (SIGKILLed after 10 s, should its copy be locked).
    fn fork_while_another_thread_holds<G: 'static>(lock: fn() -> G, take: fn()) -> libc::c_int {
        let (held, is_held) = mpsc::channel();
        let holder = std::thread::spawn(move || {
            let guard = lock();
            held.send(()).unwrap();
            std::thread::sleep(Duration::from_millis(300));
            drop(guard);
        });
        is_held.recv().unwrap();
        // SAFETY: the child takes one lock (free in its copy, or the test fails by timeout)
        // and `_exit`s: no allocation, no return into the test harness.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            take();
            // SAFETY: ends the forked child without running this process's exit handlers.
            unsafe { libc::_exit(0) };
        }
        assert!(pid > 0);
        holder.join().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut status = 0;
        loop {
            // SAFETY: waits for our own child, writing its status to a valid int.
            let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            if r == pid {
                return status;
            }
            assert_eq!(r, 0, "waitpid({pid})");
            if Instant::now() > deadline {
                // SAFETY: `pid` is our unreaped child (its number cannot be another's).
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn exited_0(status: libc::c_int) -> bool {
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0
    }

    /// A fork while another thread holds the orphan queue's lock (as the orphan thread does,
    /// taking what was handed over) waits for it: the forked process's first hand-off does not
    /// block for good on a copy left locked.
    #[test]
    fn a_fork_waits_for_the_orphan_queue_lock() {
        let status = fork_while_another_thread_holds(orphans::queue, || drop(orphans::queue()));
        assert!(exited_0(status), "forked process: wait status {status:#x}");
    }

    /// The same for the registry's lock (a subreaper pass, a spawn or a reap on another
    /// thread): the forked process's first spawn does not block for good.
    #[test]
    fn a_fork_waits_for_the_registry_lock() {
        let status = fork_while_another_thread_holds(reaper::table, || drop(reaper::table()));
        assert!(exited_0(status), "forked process: wait status {status:#x}");
    }
}
