//! The orphan guard: a small process, forked (no `exec`) by a cluster primary before its first
//! worker, that SIGKILLs the process group of every worker still running when the primary is
//! gone, whatever the cause (SIGKILL included). A worker's own parent-death signal only reaches
//! the worker: without the guard, its children (`sh -c 'python3 app.py; echo done'`, `npm start`)
//! would outlive a primary killed with SIGKILL, since no one is left to kill their group.
//!
//! How it works:
//! - [`OrphanGuard::start`] makes two `SOCK_SEQPACKET` socket pairs, one for each table below
//!   (close-on-exec: no worker inherits an end), and maps the guard's table pages, then forks.
//!   The primary keeps its ends; the guard keeps the others, closes every other fd it inherited (`close_range`; stdio
//!   and listening sockets included, so it holds no port, pipe or terminal open), puts every
//!   signal this process catches back to its default action, ignores SIGINT, SIGTERM, SIGHUP,
//!   SIGUSR1, SIGUSR2 and SIGPIPE (a terminal's Ctrl-C or a service manager's SIGTERM must not
//!   take it away before the primary: it leaves when the primary does; a `kill $(pgrep ...)` or
//!   a `pkill -USR1 nodus` meant for the primary leaves it in place), leads a process group of its own (a kill of the primary's group does
//!   not take it either), names itself [`GUARD_NAME`] (`/proc/PID/comm`, what `ps` shows, and
//!   how a test tells it from a worker), overwrites its copy of the primary's argv strings with
//!   `nodus-guard for PID` (`/proc/PID/cmdline`, what `ps -f` and `pgrep -f` read: not the
//!   primary's command line; `Title`, whose area is found and checked before the fork), and
//!   reads both (`poll`). Fork clears the parent-death signal: it gets none.
//! - Messages are 8 bytes, `[op: i32, id: i32]` in native byte order: remember a group, forget
//!   it, remember an adopted process (a pid, from the subreaper: `reaper`), forget it. A socket
//!   pair rather than a pipe: one message is one datagram, sent whole or not
//!   at all, and `MSG_NOSIGNAL` makes a send to a guard that died an `EPIPE` instead of a SIGPIPE
//!   (which a library user's program may not ignore); its end of file is a pipe's. The group
//!   messages have a pair of their own: a burst of pid messages that fills its socket (below)
//!   never holds one up, so a worker's spawn or exit right after a pass that adopted hundreds
//!   of processes still reaches the guard.
//! - The tables are [`CAPACITY`] pgids and, apart, [`PID_CAPACITY`] pids, in two pages mapped
//!   before the fork (the primary unmaps its copy right after; the pid page is touched only once
//!   a pid is remembered): nothing is allocated in the guard. Two tables, not one shared: however
//!   many processes the workers leave behind, a new worker's group always has room. The primary
//!   keeps its own copy of each list, so it knows when a table is full: then a new worker's
//!   group, or a newly adopted pid, is not sent, with one warning line per table (that worker's
//!   children, or that process, are not covered; a worker's own parent-death signal still is),
//!   and the guard itself ignores a remember past its capacity.
//! - At end of file on both (every copy of the primary's ends is closed: the primary exited, was
//!   killed, or closed them at the end of its run) the guard SIGKILLs every group it remembers, then, for
//!   every pid it remembers, `kill(-pid)` and `kill(pid)`, and `_exit`s. An id below 2 is never
//!   acted on (`kill(-1)` would signal every process, `kill(0)` the guard's own group).
//! - Why both kills for an adopted pid: a `setsid` daemon leads a session and a process group
//!   of its own (its pgid is its pid), and the children it starts stay in that group; they are
//!   not adopted (their parent, the daemon, runs), so `kill(pid)` alone would kill the daemon and
//!   leave its children to init. `kill(-pid)` takes the group the daemon leads, children
//!   included; `kill(pid)` then takes the process if it is in no group of its own (a double
//!   fork's grandchild stays in the group of the middle process, which is gone and not ours to
//!   name: that group is not killed, only the process). Group `pid` can only be one that process
//!   `pid` made: a group's id is the pid of the process that made it (`setsid`, `setpgid(0, 0)`),
//!   and a number still held by a group is never given to a new process, so while process `pid`
//!   is unreaped no other process can have made a group of that number; if it made none,
//!   `kill(-pid)` fails with `ESRCH`. The guard does not kill the group the process is in when it
//!   is not its own (`getpgid`): that could be the primary's, or a shell's, which a worker's
//!   descendant may join with `setpgid` within the primary's session.
//!
//! Ordering (why a remembered pgid is never another's): a worker leads its own group, so its
//! pgid is its pid, and that number stays taken as long as the worker is unreaped or any process
//! is still in the group. The primary sends "remember" right after the spawn (the worker runs,
//! so the number is its own), and "forget" from the worker's exit task after the group's
//! SIGKILL and before the reap (`Child::guard_group`): while the guard remembers a pgid, the
//! worker is at worst a zombie the primary has not reaped, so the number cannot have been
//! reused. Each socket is ordered, and the guard reads everything before the end of file, so it
//! never acts on a group the primary forgot. A worker still running when the primary's runtime
//! is dropped (its exit task with it) is not forgotten: the orphan reaper (`orphans`) reaps it
//! only after the guard's exit, which the runtime's drop brings about (end of file).
//!
//! The same for an adopted pid: the subreaper (`reaper`) sends "remember" during a pass, for a
//! child of the primary it counts as adopted and has just found running (`waitid` with
//! `WNOWAIT`, nothing reaped), and "forget" during the pass that finds it exited, after that
//! look and before the `waitid` that reaps it (still under the lock that keeps nodus's own
//! forks out of a pass). So while the guard remembers a pid, that process is the primary's
//! unreaped child (running, or a zombie the primary has not reaped) and its number cannot have
//! been reused. A pid found gone without the primary's reap (a `waitpid(-1)` elsewhere in the
//! program, which `reaper` already warns against) is forgotten at that pass. An adopted process
//! still remembered when the subreaper ends (its runtime dropped without a stop) is handed to
//! the orphan reaper (`orphans`) with a pidfd of the guard, and reaped only after the guard's
//! exit, as a worker whose group it remembers.
//! Those messages come in bursts (many adoptions in one pass), so for them a full socket
//! (`EAGAIN`) is not a failed send: nothing is sent, the pass is done again 1 ms later, and a
//! process whose "forget" could not be sent is not reaped until it is (so the ordering holds).
//! Only a socket full for [`BUSY_LIMIT`] (a guard stopped) is. A group message has its socket
//! to itself (one per worker spawn or exit): that one full is a guard not reading at all. A
//! failed send (the guard stopped reading, or died) could leave a pgid the primary forgets
//! remembered: the primary then SIGKILLs the guard at once (through its pidfd) and goes on
//! without one, with one warning line. The subreaper's messages are sent under the process-wide
//! registry lock (`reaper`), which the fork handlers take: a warning line they lead to is said
//! once the subreaper has let the lock go ([`OrphanGuard::log_deferred`]), so no code of the
//! program's (a tracing subscriber) runs under it.
//!
//! Limits:
//! - After the primary dies its zombie workers are reaped by whoever inherits them, and a
//!   worker whose group was otherwise empty frees its number then. The guard's SIGKILL follows
//!   the primary's exit by microseconds (the end of file comes before the re-parenting), so it
//!   could reach another group only if the kernel handed out every other pid in between
//!   (`pid_max`, 4 million by default) and the same number became a group's id.
//! - A worker's child that calls `setsid` or moves to another group (a daemon's double fork)
//!   leaves the group, so the group kill does not reach it. A primary that is a subreaper
//!   (`reaper`, on in the CLI) adopts it once its parent is gone and tells the guard, which
//!   SIGKILLs it (and the group it leads) if the primary is killed; without a subreaper, it goes
//!   to init. The adoption is noticed at the subreaper's next pass (a `SIGCHLD`, a stats request,
//!   the stop, or its periodic pass, 500 ms at most): a process adopted (its parent gone) less
//!   than that before the primary is killed is not covered, nor is a descendant of an adopted
//!   process that left its group in turn while its parent still runs (not adopted, not in the
//!   group). Only a cgroup (systemd's final
//!   SIGKILL to the unit, `deploy/systemd`) or the end of a container's PID 1 catches those.
//! - A worker's child started between the worker's `exec` and the primary's "remember" (a few
//!   microseconds) is not covered if the primary is SIGKILLed in that window.
//! - The guard can be killed (SIGKILL, SIGSTOP for long enough that its socket fills, the OOM
//!   killer): the primary logs one warning line and goes on without it, not restarting it (a
//!   restart would fork the primary's grown address space mid-run, and a guard that keeps dying
//!   would make it a loop); workers keep their parent-death signal and their group kills.
//!
//! Memory: the guard shares the primary's pages copy-on-write; what it adds is its own stack
//! pages, its table pages (the pid one once a pid is remembered), its page tables and, over time, its copies of the pages the primary
//! writes after the fork (the guard keeps the old contents). BENCHMARKS.md has the measure.
//!
//! Everything the guard runs after the fork is async-signal-safe (the primary may have other
//! threads, whose locks the child may find held): raw syscalls through libc (`sigaction`,
//! `sigprocmask`, `setpgid`, `prctl`, `close_range`/`close`, `poll`, `recv`, `kill`, `_exit`) on
//! integers, stack buffers and the page mapped before the fork, and plain stores to the argv
//! area found before the fork. No allocation, no lock, no panic path, no return: the child
//! never runs the primary's code again.

use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::rc::{Rc, Weak};
use std::time::{Duration, Instant};

use rustix::process::Pid;

use super::child::Child;
use super::reaper::Spawning;

/// How many process groups the guard remembers at once (one 4 KiB page of pgids): far above
/// the workers a primary runs, old generations draining during a reload included.
pub(crate) const CAPACITY: usize = 1024;

/// How many adopted processes (pids) the guard remembers at once: a table of its own (a second
/// page), so adopted processes never crowd the workers' groups out.
pub(crate) const PID_CAPACITY: usize = 1024;

/// The guard's name (`/proc/PID/comm`; `ps` shows it).
pub const GUARD_NAME: &CStr = c"nodus-guard";

/// The highest fd number the guard closes one by one when the kernel has no `close_range`.
const MAX_FD: RawFd = 1 << 20;

const REMEMBER: i32 = 1;
const FORGET: i32 = 2;
const REMEMBER_PID: i32 = 3;
const FORGET_PID: i32 = 4;

/// How long [`OrphanGuard::close`] waits for the guard's exit (it exits at once).
const CLOSE_WAIT: Duration = Duration::from_secs(1);

/// How long the guard's socket may stay full for the subreaper's messages before that counts
/// as a failed send (the guard is killed): it reads as fast as it is scheduled.
const BUSY_LIMIT: Duration = Duration::from_secs(1);

/// The primary's handle on its guard. Cheap to clone; the guard's end of file comes when
/// [`close`](Self::close) is called or the last clone is dropped.
#[derive(Clone)]
pub(crate) struct OrphanGuard(Rc<Inner>);

/// The primary's ends of the two socket pairs.
struct Ends {
    /// For the group messages (`REMEMBER`, `FORGET`).
    groups: OwnedFd,
    /// For the pid messages (`REMEMBER_PID`, `FORGET_PID`).
    pids: OwnedFd,
}

struct Inner {
    /// The primary's ends; `None` once closed, or once the guard is gone.
    end: RefCell<Option<Ends>>,
    child: Rc<Child>,
    /// The groups sent to the guard and not yet forgotten (the primary's copy of its table).
    groups: RefCell<Vec<i32>>,
    /// The adopted pids sent to the guard and not yet forgotten (the primary's copy of its
    /// second table).
    pids: RefCell<HashSet<i32>>,
    /// The full table was reported (once).
    full_warned: Cell<bool>,
    /// The full pid table was reported (once).
    pids_full_warned: Cell<bool>,
    /// Since when the pid socket has been full (see `send_or_busy`).
    busy_since: Cell<Option<Instant>>,
    /// Warning lines made while the subreaper holds the registry lock, not said yet
    /// ([`OrphanGuard::log_deferred`]).
    unsaid: RefCell<Vec<String>>,
}

/// What became of one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sent {
    /// The guard will read it.
    Yes,
    /// The socket is full for now; nothing was sent and the guard runs on.
    Busy,
    /// The guard is gone (or was killed here: a failed send).
    No,
}

impl std::fmt::Debug for OrphanGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OrphanGuard")
            .field("pid", &self.0.child.id())
            .field("groups", &self.0.groups.borrow().len())
            .field("pids", &self.0.pids.borrow().len())
            .finish()
    }
}

impl OrphanGuard {
    /// Forks the guard. Its pidfd is watched on the current loop, unref'd (the guard never keeps
    /// the loop alive); an unexpected exit is one warning line.
    ///
    /// # Errors
    /// The socket pair, the page or the fork failed, or the guard's pidfd could not be opened
    /// (the guard is then killed and reaped here).
    ///
    /// # Panics
    /// Outside a running nodus loop (before anything is forked).
    #[track_caller]
    pub(crate) fn start() -> io::Result<OrphanGuard> {
        crate::rt::context::with_core("nodus::process::OrphanGuard::start", |_| ());
        let pair = || {
            rustix::net::socketpair(
                rustix::net::AddressFamily::UNIX,
                rustix::net::SocketType::SEQPACKET,
                rustix::net::SocketFlags::CLOEXEC,
                None,
            )
        };
        let (groups, groups_theirs) = pair()?;
        let (pids, pids_theirs) = pair()?;
        let ours = Ends { groups, pids };
        let table = Table::map()?;
        // For a kernel without close_range (before 5.9): the child closes every number below
        // the open-files limit, one by one (the kernel's own ceiling, `nr_open`, is 2^20 by
        // default).
        let last_fd = rustix::process::getrlimit(rustix::process::Resource::Nofile)
            .current
            .map_or(MAX_FD, |n| RawFd::try_from(n).unwrap_or(MAX_FD).min(MAX_FD));
        let theirs_raw = [groups_theirs.as_raw_fd(), pids_theirs.as_raw_fd()];
        let table_ptr = table.ptr;
        let title = Title::new();
        // Known as nodus's own from before the fork (see `reaper`); the child never drops it.
        let spawning = Spawning::begin();
        // SAFETY: `fork` in a process that may have other threads. In the child the
        // `pthread_atfork` child handlers run first: nodus's (`crate::atfork`: atomic stores and
        // unlocks, async-signal-safe) and any other library's, which every `fork` of a threaded
        // process runs and which are that library's to make safe. Then the child runs only
        // `guard_main`, which is async-signal-safe (see there) and never returns. The parent
        // goes on as usual.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: this is the child of the fork; both fds of `theirs_raw` are open in it,
            // `table_ptr` is a mapping of `Table::LEN` i32s that the child owns a copy of, and
            // `title` was made (its area checked) just before the fork.
            unsafe { guard_main(theirs_raw, table_ptr, last_fd, &title) }
        }
        let fork_error = io::Error::last_os_error();
        drop((groups_theirs, pids_theirs));
        drop(table);
        if pid < 0 {
            return Err(fork_error);
        }
        let pid = Pid::from_raw(pid).expect("a forked child has a positive pid");
        let child = match Child::watch(pid, spawning.register(pid), None) {
            Ok(child) => Rc::new(child),
            Err((e, registered)) => {
                // Nothing watches it: close its input (it exits), kill it anyway and reap it.
                drop(ours);
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                let _ = rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty());
                drop(registered);
                return Err(e);
            }
        };
        child.unref();
        let inner = Rc::new(Inner {
            end: RefCell::new(Some(ours)),
            child: child.clone(),
            groups: RefCell::new(Vec::new()),
            pids: RefCell::new(HashSet::new()),
            full_warned: Cell::new(false),
            pids_full_warned: Cell::new(false),
            busy_since: Cell::new(None),
            unsaid: RefCell::new(Vec::new()),
        });
        // The task holds the guard weakly: it must not keep the primary's end open.
        let weak: Weak<Inner> = Rc::downgrade(&inner);
        crate::task::spawn_named("process:guard", async move {
            let status = child.wait().await;
            let Some(inner) = weak.upgrade() else {
                return;
            };
            if inner.end.borrow_mut().take().is_some() {
                let status = status.map_or_else(|e| e.to_string(), |s| s.to_string());
                tracing::warn!(
                    target: "nodus::process",
                    "the orphan guard (pid {}) exited unexpectedly ({status}): the workers' own \
                     children now outlive this process if it is killed with SIGKILL; going on \
                     without it",
                    child.id()
                );
            }
        })
        .detach();
        tracing::debug!(target: "nodus::process", "orphan guard started (pid {pid:?})");
        Ok(OrphanGuard(inner))
    }

    /// Has the guard remember process group `pgid` (a worker that leads its own group, just
    /// spawned: `pgid` is its pid, which cannot be reused before it is reaped).
    pub(crate) fn remember(&self, pgid: Pid) {
        let pgid = pgid.as_raw_nonzero().get();
        if self.0.end.borrow().is_none() {
            return;
        }
        if self.0.groups.borrow().len() >= CAPACITY {
            if !self.0.full_warned.replace(true) {
                tracing::warn!(
                    target: "nodus::process",
                    "the orphan guard's table is full ({CAPACITY} process groups): the children \
                     of worker pid {pgid} (and of later ones while it stays full) are not killed \
                     if this process is killed with SIGKILL"
                );
            }
            return;
        }
        if self.send(REMEMBER, pgid) {
            self.0.groups.borrow_mut().push(pgid);
        }
    }

    /// Has the guard forget process group `pgid`: called once the group has been signalled at
    /// the worker's exit and before the worker is reaped (see the module doc).
    pub(crate) fn forget(&self, pgid: Pid) {
        let pgid = pgid.as_raw_nonzero().get();
        let mut groups = self.0.groups.borrow_mut();
        let Some(i) = groups.iter().position(|&g| g == pgid) else {
            return; // never sent (the table was full), or the guard is gone
        };
        groups.swap_remove(i);
        drop(groups);
        self.send(FORGET, pgid);
    }

    /// Has the guard remember adopted process `pid` (SIGKILLed, with the process group it leads
    /// if it leads one, at the guard's end of file). A warning line it leads to waits for
    /// [`log_deferred`](Self::log_deferred), as one of [`forget_pid`](Self::forget_pid) does.
    /// Called by the subreaper for a running child
    /// of this process that it counts as adopted: unreaped, so its number cannot be reused until
    /// [`forget_pid`](Self::forget_pid), which the subreaper calls before it reaps it. Nothing is
    /// sent for a pid already remembered. `false` if the guard's socket is full for now (nothing
    /// sent): the subreaper tries again shortly.
    pub(crate) fn remember_pid(&self, pid: i32) -> bool {
        if pid < 2 || self.0.end.borrow().is_none() || self.0.pids.borrow().contains(&pid) {
            return true;
        }
        if self.0.pids.borrow().len() >= PID_CAPACITY {
            if !self.0.pids_full_warned.replace(true) {
                self.0.unsaid.borrow_mut().push(format!(
                    "the orphan guard's table of adopted processes is full ({PID_CAPACITY}): \
                     adopted process {pid} (and later ones while it stays full) is not killed if \
                     this process is killed with SIGKILL"
                ));
            }
            return true;
        }
        match self.send_or_busy(REMEMBER_PID, pid, true) {
            Sent::Yes => {
                self.0.pids.borrow_mut().insert(pid);
                true
            }
            Sent::Busy => false,
            Sent::No => true,
        }
    }

    /// Has the guard forget adopted process `pid`: called before the subreaper reaps it (or
    /// once it is found gone without that reap). Nothing is sent for a pid never remembered.
    /// `false` if the guard still holds it (its socket is full for now): the subreaper must not
    /// reap the process yet, and tries again shortly.
    pub(crate) fn forget_pid(&self, pid: i32) -> bool {
        if !self.0.pids.borrow().contains(&pid) {
            return true; // never sent (the table was full), or the guard is gone
        }
        match self.send_or_busy(FORGET_PID, pid, true) {
            Sent::Yes => {
                self.0.pids.borrow_mut().remove(&pid);
                true
            }
            Sent::Busy => false,
            Sent::No => true, // the guard is gone (its copy cleared)
        }
    }

    /// Whether adopted process `pid` was sent to the guard and not forgotten since (the guard
    /// SIGKILLs it at its end of file, if it has not exited by then).
    pub(crate) fn remembers_pid(&self, pid: i32) -> bool {
        self.0.pids.borrow().contains(&pid)
    }

    /// Says the warning lines the subreaper's calls led to ([`remember_pid`](Self::remember_pid),
    /// [`forget_pid`](Self::forget_pid)): called once it has let the registry lock go.
    pub(crate) fn log_deferred(&self) {
        let unsaid = std::mem::take(&mut *self.0.unsaid.borrow_mut());
        for line in unsaid {
            tracing::warn!(target: "nodus::process", "{line}");
        }
    }

    /// Sends one group message (on the group socket); `false` if the guard did not get it. A
    /// send that fails while the guard runs leaves its table unknown: the guard is killed at
    /// once and the primary goes on without one (one warning line).
    fn send(&self, op: i32, pgid: i32) -> bool {
        let sent = self.send_or_busy(op, pgid, false) == Sent::Yes;
        self.log_deferred();
        sent
    }

    /// [`send`](Self::send), except that with `busy_ok` (the pid messages, on their socket) a
    /// full socket (`EAGAIN`: a burst of adoptions in one pass, about 280 messages with the
    /// guard not yet scheduled to read them) is [`Sent::Busy`], the guard left running, for the
    /// caller to try again shortly, as long as the socket has not stayed full for
    /// [`BUSY_LIMIT`] (a guard stopped, not reading): then it is a failed send. The warning line
    /// of a failed send waits for [`log_deferred`](Self::log_deferred).
    fn send_or_busy(&self, op: i32, pgid: i32, busy_ok: bool) -> Sent {
        let mut message = [0u8; 8];
        message[..4].copy_from_slice(&op.to_ne_bytes());
        message[4..].copy_from_slice(&pgid.to_ne_bytes());
        let mut end = self.0.end.borrow_mut();
        let Some(ends) = end.as_ref() else {
            return Sent::No;
        };
        let fd = if busy_ok { &ends.pids } else { &ends.groups };
        let flags = rustix::net::SendFlags::NOSIGNAL | rustix::net::SendFlags::DONTWAIT;
        let result = loop {
            match rustix::net::send(fd, &message, flags) {
                Err(rustix::io::Errno::INTR) => continue,
                other => break other,
            }
        };
        match result {
            Ok(n) if n == message.len() => {
                self.0.busy_since.set(None);
                Sent::Yes
            }
            Err(rustix::io::Errno::AGAIN) if busy_ok && self.busy_within_limit() => Sent::Busy,
            result => {
                *end = None;
                self.0.groups.borrow_mut().clear();
                self.0.pids.borrow_mut().clear();
                // Its exit task then sees the end already gone: this line is the only one.
                let _ = self.0.child.kill(libc::SIGKILL);
                let why = match result {
                    Ok(n) => format!("a short send of {n} bytes"),
                    Err(e) => io::Error::from(e).to_string(),
                };
                self.0.unsaid.borrow_mut().push(format!(
                    "the orphan guard (pid {}) cannot be told of a process group or an adopted \
                     process ({why}): killed it; the workers' own children now outlive this \
                     process if it is killed with SIGKILL; going on without it",
                    self.0.child.id()
                ));
                Sent::No
            }
        }
    }

    /// The socket is full: `true` while it has not been so for [`BUSY_LIMIT`] (since the first
    /// full send after the last one that went through).
    fn busy_within_limit(&self) -> bool {
        let since = self.0.busy_since.get().unwrap_or_else(Instant::now);
        self.0.busy_since.set(Some(since));
        since.elapsed() < BUSY_LIMIT
    }

    /// A pidfd of the guard process, `None` once it has been reaped (it has exited: it holds
    /// nothing). See `orphans`: a child whose group it remembers is reaped after its exit.
    pub(crate) fn pidfd(&self) -> Option<io::Result<OwnedFd>> {
        self.0.child.pidfd()
    }

    /// Closes the primary's ends, once every worker has been reaped (so the guard kills
    /// nothing), and waits for the guard's exit (1 s at most; it exits at once), which its exit
    /// task reaps. Later calls do nothing.
    pub(crate) async fn close(&self) {
        let Some(end) = self.0.end.borrow_mut().take() else {
            return;
        };
        drop(end);
        let _ = crate::time::timeout(CLOSE_WAIT, self.0.child.wait()).await;
    }
}

/// The guard's tables: `CAPACITY` pgids then `PID_CAPACITY` pids (`Table::LEN` i32s) in an
/// anonymous mapping of its own, made before the fork (the child inherits it) and unmapped in
/// the parent afterwards (the child keeps its copy). The pid half is touched (a page of its
/// own) only once a pid is remembered.
struct Table {
    ptr: *mut i32,
}

impl Table {
    const LEN: usize = CAPACITY + PID_CAPACITY;
    const BYTES: usize = Self::LEN * std::mem::size_of::<i32>();

    fn map() -> io::Result<Table> {
        // SAFETY: a new private anonymous mapping at an address the kernel chooses: it aliases
        // nothing.
        let ptr = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                Self::BYTES,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::PRIVATE,
            )?
        };
        Ok(Table { ptr: ptr.cast() })
    }
}

impl Drop for Table {
    fn drop(&mut self) {
        // SAFETY: `ptr` is the mapping of `BYTES` bytes `map` made; nothing in this process
        // refers to it any more (only the forked child uses its own copy).
        let _ = unsafe { rustix::mm::munmap(self.ptr.cast(), Self::BYTES) };
    }
}

/// The longest command line the guard gives itself: `nodus-guard for ` and a pid (at most 7
/// digits, `PID_MAX_LIMIT` being 2^22).
const TITLE_MAX: usize = 32;

/// The guard's command line (`/proc/PID/cmdline`, which `ps -f`, `ps -o cmd` and `pgrep -f`
/// read), `nodus-guard for PID` (the primary's pid) in place of the primary's own: a
/// `pgrep -f 'nodus run'` finds the primary alone. Made in the parent before the fork (reading
/// `/proc` allocates); the child only writes bytes ([`set`](Self::set)).
///
/// As `setproctitle` does: the kernel reads a process's command line from its argv strings'
/// area (`arg_start`..`arg_end`, fields 48 and 49 of `/proc/self/stat`, as procps reads them),
/// which the guard's copy of the address space holds; the guard overwrites its copy with the
/// title and zeroes the rest (a NUL last byte: the kernel then reads the area as it is, and
/// `ps`/`pgrep` drop the trailing NULs). Moving the area instead (`prctl(PR_SET_MM,
/// PR_SET_MM_ARG_START)`) takes `CAP_SYS_RESOURCE`.
#[derive(Clone, Copy)]
struct Title {
    /// The area's address and length, checked to lie within one private writable mapping (a
    /// write there is the guard's alone, and cannot fault); `None` when it cannot be found or
    /// checked (no `/proc`): the guard keeps the primary's command line.
    area: Option<(usize, usize)>,
    text: [u8; TITLE_MAX],
    len: usize,
}

impl Title {
    fn new() -> Title {
        let title = format!(
            "{} for {}",
            GUARD_NAME.to_string_lossy(),
            std::process::id()
        );
        let mut text = [0u8; TITLE_MAX];
        let len = title.len().min(TITLE_MAX);
        text[..len].copy_from_slice(&title.as_bytes()[..len]);
        Title {
            area: argv_area(),
            text,
            len,
        }
    }

    /// Writes the title over the argv area and zeroes the rest of it (the last byte always).
    /// Plain stores: async-signal-safe.
    ///
    /// # Safety
    /// Only in the child of a fork made right after [`Title::new`] (the area lies within a
    /// private writable mapping of the child's own copy of the address space), by the child's
    /// only thread.
    unsafe fn set(&self) {
        let Some((start, len)) = self.area else {
            return;
        };
        let text = self.len.min(len - 1);
        let area = start as *mut u8;
        // SAFETY: `[start, start + len)` is within a private writable mapping (checked before
        // the fork), the child's own copy; nothing else in the child reads or writes it (the
        // argv strings are read only by code the child never runs again). `text < len`.
        unsafe {
            std::ptr::copy_nonoverlapping(self.text.as_ptr(), area, text);
            std::ptr::write_bytes(area.add(text), 0, len - text);
        }
    }
}

/// This process's argv strings' area, `(address, length)`: `arg_start` and `arg_end` from
/// `/proc/self/stat` (fields 48 and 49, Linux ≥ 3.5), if the whole area lies within one private
/// writable mapping of `/proc/self/maps` (the main thread's stack).
fn argv_area() -> Option<(usize, usize)> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // After the command name (which may hold spaces and parentheses) come fields 3, 4, ...
    let mut fields = stat.get(stat.rfind(')')? + 2..)?.split_ascii_whitespace();
    let start: usize = fields.nth(48 - 3)?.parse().ok()?;
    let end: usize = fields.next()?.parse().ok()?;
    if start == 0 || end <= start {
        return None;
    }
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let writable = maps.lines().any(|line| {
        let mut parts = line.split_ascii_whitespace();
        let (Some(range), Some(perms)) = (parts.next(), parts.next()) else {
            return false;
        };
        let Some((lo, hi)) = range.split_once('-') else {
            return false;
        };
        let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
        else {
            return false;
        };
        let perms = perms.as_bytes();
        lo <= start && end <= hi && perms.get(1) == Some(&b'w') && perms.get(3) == Some(&b'p')
    });
    writable.then_some((start, end - start))
}

/// The guard's life, in the child of the fork: set up (signals, group, name, fds), then
/// remember and forget groups and pids until end of file on both sockets, then SIGKILL what it
/// remembers and `_exit`.
///
/// Async-signal-safe throughout: raw syscalls through libc on integers, on stack buffers and on
/// `table`; no allocation, no lock, no unwinding (no indexing that can panic), no return.
///
/// # Safety
/// Only in the child of a `fork`, with `ends` two open sockets of the child (the groups' and
/// the pids'), `table` a writable mapping of `Table::LEN` i32s owned by the child (groups in
/// `[0, CAPACITY)`, pids in `[CAPACITY, CAPACITY + PID_CAPACITY)`) and `title` made right
/// before the fork.
unsafe fn guard_main(ends: [RawFd; 2], table: *mut i32, last_fd: RawFd, title: &Title) -> ! {
    // SAFETY (the whole body): plain syscalls with valid arguments (signal numbers, the
    // child's own pid 0, a NUL-terminated static name, fd numbers, a stack buffer of the length
    // given, a stack array of the two `pollfd`s counted); `table.add(i)` stays below `CAPACITY` and `pids.add(i)` below `PID_CAPACITY`
    // (checked before each access), so both stay within the `Table::LEN` i32s of `table`;
    // `title.set()` runs in the child of the fork made right after `Title::new` (the caller's
    // guarantee), on its only thread.
    unsafe {
        // Signals: the ones a terminal or a service manager sends the primary are ignored
        // first (until `setpgid` the guard is still in the primary's group, where a Ctrl-C or a
        // group's SIGTERM reaches it: with their default action back before the ignore, one in
        // between would kill it); then what this process caught runs its default action (no
        // parent handler in the child; an ignored signal is left ignored); none is blocked.
        let mut ignore: libc::sigaction = std::mem::zeroed();
        ignore.sa_sigaction = libc::SIG_IGN;
        for sig in [
            libc::SIGINT,
            libc::SIGTERM,
            libc::SIGHUP,
            libc::SIGUSR1,
            libc::SIGUSR2,
            libc::SIGPIPE,
        ] {
            libc::sigaction(sig, &ignore, std::ptr::null_mut());
        }
        super::command::default_caught_signals();
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
        libc::setpgid(0, 0);
        libc::prctl(libc::PR_SET_NAME, GUARD_NAME.as_ptr(), 0, 0, 0);
        title.set();
        close_all_but(ends, last_fd);

        let mut count = 0usize;
        let pids = table.add(CAPACITY);
        let mut pid_count = 0usize;
        let mut message = [0u8; 8];
        let mut fds = ends.map(|fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        });
        // Until end of file on both (the primary is gone): a socket at its end is set to -1,
        // which `poll` skips.
        while fds[0].fd >= 0 || fds[1].fd >= 0 {
            if libc::poll(fds.as_mut_ptr(), 2, -1) < 0 {
                if *libc::__errno_location() == libc::EINTR {
                    continue;
                }
                // Cannot happen with two valid entries; leave without killing anything.
                libc::_exit(1);
            }
            for p in &mut fds {
                if p.fd < 0 || p.revents == 0 {
                    continue;
                }
                // Everything queued on this one, then back to `poll`.
                loop {
                    let n = libc::recv(
                        p.fd,
                        message.as_mut_ptr().cast(),
                        message.len(),
                        libc::MSG_DONTWAIT,
                    );
                    if n == 0 {
                        p.fd = -1; // end of file
                        break;
                    }
                    if n < 0 {
                        match *libc::__errno_location() {
                            libc::EINTR => continue,
                            libc::EAGAIN => break,
                            // Cannot happen on a connected socket pair; leave without killing
                            // anything.
                            _ => libc::_exit(1),
                        }
                    }
                    if n != message.len() as isize {
                        continue; // not one of ours
                    }
                    let op = i32::from_ne_bytes([message[0], message[1], message[2], message[3]]);
                    let id = i32::from_ne_bytes([message[4], message[5], message[6], message[7]]);
                    if id < 2 {
                        continue; // never kill(-1) (everyone) or kill(0) (our own group)
                    }
                    if op == REMEMBER && count < CAPACITY {
                        *table.add(count) = id;
                        count += 1;
                    } else if op == FORGET {
                        forget(table, &mut count, id);
                    } else if op == REMEMBER_PID && pid_count < PID_CAPACITY {
                        *pids.add(pid_count) = id;
                        pid_count += 1;
                    } else if op == FORGET_PID {
                        forget(pids, &mut pid_count, id);
                    }
                }
            }
        }
        let mut i = 0;
        while i < count {
            libc::kill(-*table.add(i), libc::SIGKILL);
            i += 1;
        }
        // An adopted process: the group it leads, if it leads one (a `setsid` daemon and the
        // children it started, which stay in its group), then the process itself (in case it
        // moved to another group). Group `pid` can only be one the process `pid` made (see the
        // module doc); with none, `kill(-pid)` is ESRCH.
        let mut i = 0;
        while i < pid_count {
            let pid = *pids.add(i);
            libc::kill(-pid, libc::SIGKILL);
            libc::kill(pid, libc::SIGKILL);
            i += 1;
        }
        libc::_exit(0)
    }
}

/// Removes `value` from the `*count` entries at `list` (the last entry takes its place).
/// Async-signal-safe: plain loads and stores.
///
/// # Safety
/// `list` points to at least `*count` initialized i32s the caller owns.
unsafe fn forget(list: *mut i32, count: &mut usize, value: i32) {
    let mut i = 0;
    while i < *count {
        // SAFETY: `i` and `*count - 1` are below `*count` (the caller's guarantee).
        unsafe {
            if *list.add(i) == value {
                *count -= 1;
                *list.add(i) = *list.add(*count);
                return;
            }
        }
        i += 1;
    }
}

/// Closes every fd but the two of `keep` (distinct, open): `close_range` around them (Linux ≥
/// 5.9), else each number up to `last` one by one. Raw syscalls only: async-signal-safe.
///
/// # Safety
/// Only in the child of a `fork` (it closes fds other code may think it owns).
unsafe fn close_all_but(keep: [RawFd; 2], last: RawFd) {
    let close_range = |first: u32, last: u32| -> bool {
        // SAFETY: close_range takes no pointers; it closes this (child) process's fds in the
        // range (none when it is empty).
        first > last || unsafe { libc::syscall(libc::SYS_close_range, first, last, 0u32) == 0 }
    };
    let (lo, hi) = (keep[0].min(keep[1]) as u32, keep[0].max(keep[1]) as u32);
    let below = lo == 0 || close_range(0, lo - 1);
    if below && close_range(lo + 1, hi - 1) && close_range(hi + 1, u32::MAX) {
        return;
    }
    let mut fd = 0;
    while fd < last {
        if fd != keep[0] && fd != keep[1] {
            // SAFETY: closing an fd number in the child; a number not open gives EBADF.
            unsafe { libc::close(fd) };
        }
        fd += 1;
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;

    use nodus_testkit::proc::Proc;

    use super::*;

    /// Above `PID_MAX_LIMIT` (2^22): no process can have these numbers, so the guard's kills
    /// of them, should it ever act, reach no one.
    const NOBODY: i32 = (1 << 22) + 1;

    fn state(pid: i32) -> Option<char> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        stat[stat.rfind(')')? + 2..].chars().next()
    }

    /// Retries `op` on each of `ids` until every one returns `true` (5 s at most).
    async fn until_all(ids: &[i32], op: impl Fn(i32) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut left: Vec<i32> = ids.to_vec();
        while !left.is_empty() {
            left.retain(|&id| !op(id));
            assert!(Instant::now() < deadline, "{} still busy", left.len());
            crate::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Waits until `done` (5 s at most, else panics with `what`).
    fn until(what: &str, done: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !done() {
            assert!(Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// A worker-like child (its own group, SIGKILL to the group at its exit, the group
    /// remembered by the guard) still running when its runtime is dropped: handed to the orphan
    /// reaper, it is not reaped while the guard may still kill its group (here: a clone of the
    /// guard's handle kept past the runtime), and is once the guard has exited, as the guard is.
    #[test]
    fn a_guarded_child_whose_runtime_is_gone_is_reaped_after_the_guard_exits() {
        std::thread::spawn(|| {
            let rt = crate::Runtime::new();
            let (guard, child) = rt.block_on(async {
                let guard = OrphanGuard::start().unwrap();
                let child = crate::process::Command::new("sleep")
                    .arg("30")
                    .process_group(0)
                    .group_exit_signal(Some(libc::SIGKILL))
                    .spawn()
                    .unwrap();
                child.guard_group(&guard);
                (guard, child.id() as i32)
            });
            let guard_pid = guard.0.child.id() as i32;
            drop(rt);
            // SAFETY: a plain syscall on our unreaped child (its number cannot be another's).
            assert_eq!(unsafe { libc::kill(child, libc::SIGKILL) }, 0);
            until("the child dies", || state(child) == Some('Z'));
            std::thread::sleep(Duration::from_millis(200));
            assert_eq!(
                state(child),
                Some('Z'),
                "not reaped while the guard remembers its group"
            );
            drop(guard);
            until("the child and the guard are reaped", || {
                state(child).is_none() && state(guard_pid).is_none()
            });
        })
        .join()
        .unwrap();
    }

    /// A worker's group told to the guard right after a burst of adopted pids that filled
    /// their socket (the guard not scheduled yet to read it) goes through, the guard running on;
    /// once it reads, it takes everything, and at end of file kills the group and the pids it
    /// remembers. Before, one socket carried both: the group message found it full, a failed
    /// send, and the guard was killed.
    #[test]
    fn a_group_message_after_a_pid_burst_that_filled_their_socket_goes_through() {
        std::thread::spawn(|| {
            crate::Runtime::new().block_on(async {
                let guard = OrphanGuard::start().unwrap();
                let pid = guard.0.child.id() as i32;
                guard.0.child.kill(libc::SIGSTOP).unwrap();
                while state(pid) != Some('T') {
                    crate::time::sleep(Duration::from_millis(1)).await;
                }
                let ids: Vec<i32> = (0..600).map(|i| NOBODY + i).collect();
                let sent = ids.iter().filter(|&&id| guard.remember_pid(id)).count();
                assert!(sent < ids.len(), "the pid socket fills: {sent} taken");

                // A worker spawned in the same loop turn: its group is told to the guard.
                let mut worker = Proc::spawn_group(std::process::Command::new("sleep").arg("30"));
                let group = worker.id() as i32;
                guard.remember(Pid::from_raw(group).unwrap());
                assert!(guard.0.end.borrow().is_some(), "the guard is not killed");
                assert_eq!(*guard.0.groups.borrow(), [group]);

                // An adopted process, told once the guard reads again.
                let mut adopted = Proc::spawn(std::process::Command::new("sleep").arg("30"));
                guard.0.child.kill(libc::SIGCONT).unwrap();
                let mut all = ids.clone();
                all.push(adopted.id() as i32);
                until_all(&all, |id| guard.remember_pid(id)).await;

                // End of file on both sockets: the group and the adopted process are killed.
                guard.close().await;
                for (what, proc) in [
                    ("the worker's group", &mut worker),
                    ("adopted", &mut adopted),
                ] {
                    let status = proc.exited_within(Duration::from_secs(5));
                    assert_eq!(
                        status.and_then(|s| s.signal()),
                        Some(libc::SIGKILL),
                        "{what}: {status:?}"
                    );
                }
            });
        })
        .join()
        .unwrap();
    }

    /// A burst of adopted pids that fills the guard's socket is "busy", not a failed send:
    /// the guard runs on and takes every one once it reads again; a socket full for
    /// `BUSY_LIMIT` is a failed send (the guard is killed).
    #[test]
    fn a_full_socket_is_busy_for_pids_then_a_failure_after_the_limit() {
        std::thread::spawn(|| {
            crate::Runtime::new().block_on(async {
                let guard = OrphanGuard::start().unwrap();
                let pid = guard.0.child.id() as i32;
                let ids: Vec<i32> = (0..600).map(|i| NOBODY + i).collect();

                guard.0.child.kill(libc::SIGSTOP).unwrap();
                while state(pid) != Some('T') {
                    crate::time::sleep(Duration::from_millis(1)).await;
                }
                let sent = ids.iter().filter(|&&id| guard.remember_pid(id)).count();
                assert!(
                    sent < ids.len(),
                    "the socket fills: {sent} taken (sent, or given up)"
                );
                assert!(guard.0.end.borrow().is_some(), "the guard is not killed");
                assert_eq!(guard.0.pids.borrow().len(), sent);

                guard.0.child.kill(libc::SIGCONT).unwrap();
                until_all(&ids, |id| guard.remember_pid(id)).await;
                assert_eq!(guard.0.pids.borrow().len(), ids.len());
                until_all(&ids, |id| guard.forget_pid(id)).await;
                assert!(guard.0.pids.borrow().is_empty());

                // Full for longer than the limit: the guard is killed, the copy cleared.
                guard.0.child.kill(libc::SIGSTOP).unwrap();
                while state(pid) != Some('T') {
                    crate::time::sleep(Duration::from_millis(1)).await;
                }
                let mut busy_from = None;
                for &id in &ids {
                    if !guard.remember_pid(id) {
                        busy_from.get_or_insert(id);
                    }
                }
                assert!(busy_from.is_some() && guard.0.end.borrow().is_some());
                crate::time::sleep(BUSY_LIMIT + Duration::from_millis(100)).await;
                assert!(
                    guard.remember_pid(busy_from.unwrap()),
                    "a failed send: given up"
                );
                assert!(guard.0.end.borrow().is_none(), "the guard is killed");
                assert!(guard.0.pids.borrow().is_empty());
                let status = crate::time::timeout(Duration::from_secs(5), guard.0.child.wait())
                    .await
                    .expect("the guard dies")
                    .unwrap();
                assert_eq!(status.signal(), Some(libc::SIGKILL), "{status}");
            });
        })
        .join()
        .unwrap();
    }
}
