//! The subreaper: what an init (tini, s6, systemd) does for the processes below it, for a
//! cluster primary. With [`Reaper::start`] this process marks itself a child subreaper
//! (`PR_SET_CHILD_SUBREAPER`), so a descendant orphaned below it (its parent exited, or it
//! daemonized with `setsid` and a double fork) is re-parented to this process instead of to init;
//! as PID 1 of a container that happens anyway. The reaper then reaps every child that is not one
//! of nodus's own ("foreign": adopted orphans), on `SIGCHLD` and every [`PASS_PERIOD`], so none is
//! left a zombie, and at the end of a graceful stop [`Reaper::stop_adopted`] stops those still
//! running (the workers' kill signal, SIGTERM by default, then SIGKILL after the kill timeout:
//! systemd's `KillMode=` for a unit's leftovers). At its end (below) it hands those still
//! unreaped to the orphan reaper's thread.
//!
//! Which children are nodus's own: every process nodus forks ([`Command::spawn`](super::Command::spawn), the orphan
//! guard) is registered in [`OURS`], a process-wide table, from before the fork until after its
//! reap by its own exit task (`waitid(P_PIDFD)`, see `child`; once its loop is gone, by the
//! orphan reaper, `orphans`). The registration is always on, reaper or not (a mutex and a map
//! entry per spawn), so a child spawned before a reaper starts, or on another loop's thread, is
//! known too. Its lock is never copied held into a forked process (`crate::atfork` takes it
//! around every `fork`): a process forked without `exec` can spawn.
//!
//! The table is the process's own: it names the pid it belongs to, and at its first lock in a
//! process forked (without `exec`) from that one it starts empty. The forked process has none of
//! its parent's children, and none of the parent's forks in progress: the thread between its
//! [`Spawning`] ticket and its registration is not there, so a count kept from the parent would
//! never come down (every pass deferred, the end handing nothing over, `signal_child` refusing),
//! and a pid kept from it, reused by a child forked by other means, would be taken for nodus's
//! own and never reaped. An [`Ours`] made in the parent and dropped in the forked process (a
//! `Child` on the forking thread's stack) releases nothing there. (Reset at the first lock, not
//! in the fork handler: freeing the map is no async-signal-safe step.)
//!
//! Why the reaper never steals the exit status of one of nodus's own children:
//! - It never calls `waitpid(-1)`/`waitid(P_ALL)`. It lists this process's children
//!   (`/proc/self/task/*/children`: re-parented orphans may hang below any thread) and calls
//!   `waitid(P_PID, pid, WEXITED | WNOHANG)` only for a listed pid that [`OURS`] does not hold.
//! - A spawn takes a [`Spawning`] ticket (under [`OURS`]'s lock: `spawning += 1`) *before* the
//!   fork and turns it into an [`Ours`] registration (pid inserted, `spawning -= 1`, same lock)
//!   right after it. A reaper pass holds that lock from its check that `spawning` is 0, through
//!   the listing, to its last `waitid`. So during a pass no fork of nodus's can start or be in
//!   progress, and every child of nodus's that exists at the listing is in the table: one the
//!   table lacks is foreign. (A pass that finds a spawn in progress, which only a spawn on
//!   another thread can make, does nothing and is tried again 1 ms later.) A pid the pass
//!   `waitid`s is its unreaped child at the listing, so its number cannot have been reused in
//!   between, and no new child of nodus's can take it while the lock is held.
//! - An entry is removed only after its child's reap (`Watch::finish`; the watch's drop or the
//!   orphan reaper's thread once its loop is gone), so a zombie of nodus's waiting for its exit
//!   task, or one in the group-signal window (`WNOWAIT`), is still in the table. Entries count:
//!   a number reused by a new child of nodus's before the old entry is removed is held twice and
//!   stays held after the removal. A foreign child that gets a number still held (reused between
//!   a reap and its entry's removal) is merely left for the next pass.
//! - A spawn's failure paths keep the registration until they have reaped the child themselves
//!   (`Child::watch` hands it back on error).
//!
//! What this does not protect: a child this process forks some other way (`std::process`,
//! another library) is foreign to the table, so with a reaper running its exit status is taken
//! (its own `wait` gets `ECHILD`). That is why the reaper is opt-in for a library user
//! ([`Config::subreaper`](crate::cluster::Config::subreaper)); the `nodus` command line, whose
//! processes all come from `nodus::process`, turns it on.
//!
//! What is not adopted: the children this process already had when the reaper started, other
//! than nodus's own (a wrapper's background job before it `exec`ed this program: `sh -c
//! 'crond & exec nodus serve ...'`). The workers did not leave them: they are reaped when they
//! exit (no one else can), but neither counted nor stopped by [`Reaper::stop_adopted`].
//!
//! Signals: `SIGCHLD` comes through a [`Signals`] stream (unref'd). Signals coalesce, so each one
//! is a full pass. An orphan re-parented while alive sends nothing then, but its exit does (the
//! kernel gives a re-parented child `SIGCHLD` as its exit signal), and one re-parented as a
//! zombie signals its new parent at once. So an adoption is seen at the next pass: a `SIGCHLD`, a
//! stats request, the stop, or at the latest the periodic pass, every [`PASS_PERIOD`] (500 ms)
//! while the reaper runs (an unref'd interval in its task: it never keeps the loop alive, and
//! ends with the task at [`Reaper::close`]). Why 500 ms: the period bounds how long an orphan
//! adopted alive goes unremembered by the orphan guard (below); a pass costs one listing of
//! `/proc/self/task/*/children` (a read per thread of this process: some 100 µs for a primary's
//! dozen threads, under [`OURS`]'s lock, which holds back a spawn on another thread that long)
//! and one `waitid` per foreign child, so two passes a second are a few hundredths of a percent
//! of a core and two wake-ups of an idle primary, while the window is short next to anything
//! that SIGKILLs a primary (an operator, the OOM killer).
//!
//! The orphan guard (`guard`; [`Reaper::set_guard`], which the cluster primary calls once both
//! run): an adopted process survives a primary killed with SIGKILL (it left the worker groups
//! the guard kills), so each pass has the guard remember every adopted process it finds running,
//! and forget one before reaping it:
//! - A pass first looks at an adopted child with `waitid(WEXITED | WNOHANG | WNOWAIT)`, which
//!   reaps nothing. Running: the guard is told to remember its pid (once; the primary's copy
//!   of the guard's table drops repeats). Exited: the guard is told to forget it, then the
//!   child is reaped. Gone without our reap (someone else's `waitpid(-1)`): forgotten at once.
//!   All of it under [`OURS`]'s lock, in the pass. So a pid the guard remembers is always an
//!   unreaped child of this process, whose number cannot have been reused: at the guard's end of
//!   file it SIGKILLs that process and the process group it leads, if any (`guard` says why
//!   both, and why that group can only be the process's own).
//! - Only processes counted as adopted: never nodus's own children (the registry) nor the ones
//!   this process already had when the reaper started (`inherited`).
//! - A burst of adoptions can fill the guard's socket for pids (about 280 messages before it
//!   reads; the workers' groups have a socket of their own, which the burst leaves free): a
//!   message that finds it full is not sent and the pass is done again 1 ms later, a process
//!   whose "forget" could not be sent staying unreaped (so still safe to remember) until it is.
//!   A socket full for a whole second (the guard stopped) is a failed send: the guard is killed.
//! - The pass logs (adoptions, reaps, the guard's warnings) once it has let the lock go: no
//!   tracing subscriber, the program's code, runs under a lock the fork handlers take.
//! - Its limit is the pass's lag: an orphan re-parented here while running sends no `SIGCHLD`,
//!   so it is remembered only at the next pass (a `SIGCHLD` from any foreign child, a stats
//!   request, the stop, or the periodic one: [`PASS_PERIOD`] at most); one adopted less than
//!   that before the primary is killed goes to init.
//! - If a graceful stop gives up on some adopted processes ([`Reaper::stop_adopted`] after its
//!   SIGKILLs), they are still remembered: the guard's end of file, when the primary closes it,
//!   SIGKILLs them once more.
//!
//! The end, once, at whichever comes first: [`Reaper::close`] (the cluster primary's, at the end
//! of `run`), the drop of the last clone, or the drop of the loop's `Runtime` (the reaper's task
//! with it; a clone still held can pass no more without its loop). After it, no pass runs.
//! - The subreaper mark [`Reaper::start`] set is taken off first, so no orphan is re-parented
//!   here after the listing below. (A process that was a subreaper before the start, PID 1 say,
//!   stays one: an orphan re-parented to it from then on is not reaped, as before the start.)
//! - Then, under [`OURS`]'s lock with no fork in progress (as in a pass), every child that is
//!   neither nodus's own nor `inherited` (every adopted process still unreaped, running or a
//!   zombie, one re-parented since the last pass included) is handed to the orphan reaper's
//!   thread (`orphans`): a pidfd opened and then checked to be this process's child (so the
//!   pidfd is that child's), registered as nodus's own at the hand-off (no other subreaper,
//!   another primary's, takes it meanwhile), reaped by that thread at its exit with
//!   `waitid(P_PIDFD)`. One the orphan guard remembers is reaped only after the guard's exit,
//!   as a worker whose group it remembers: a pid the guard holds stays an unreaped child. So
//!   none is left a zombie however the primary ends (a runtime dropped without a stop
//!   included), and a child the program forks afterwards by other means keeps its exit status:
//!   only the pids handed over are waited for. (If a spawn on another thread keeps the table
//!   busy for 100 ms, nothing is handed over: one warning line, those stay unreaped.)
//! - The `inherited` children are left as they were before the start.
//!
//! Requires `/proc` (with `CONFIG_PROC_CHILDREN`, else every `/proc/PID/stat` is read for its
//! parent).

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::future::poll_fn;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::rc::{Rc, Weak};
use std::sync::Mutex;
use std::task::Poll;
use std::time::{Duration, Instant};

use rustix::process::{Pid, PidfdFlags, Signal, WaitId, WaitIdOptions};

use super::guard::OrphanGuard;
use super::orphans::Orphan;
use crate::JoinHandle;
use crate::signal::Signals;

/// The children nodus forked and has not reaped yet, and the forks in progress.
static OURS: Mutex<Table> = Mutex::new(Table {
    owner: 0,
    spawning: 0,
    pids: None,
});

pub(crate) struct Table {
    /// The process this table is for (see the module doc): 0 before its first lock.
    owner: u32,
    /// [`Spawning`] tickets alive: forks that may have happened and are not registered yet.
    spawning: usize,
    /// pid → how many registrations hold it (see the module doc).
    pids: Option<HashMap<i32, u32>>,
}

impl Table {
    pub(super) fn holds(&self, pid: i32) -> bool {
        self.pids.as_ref().is_some_and(|p| p.contains_key(&pid))
    }

    /// Registers `pid` as nodus's own (one more count). The returned `Ours` takes the lock when
    /// dropped: not while this one is held.
    pub(super) fn claim(&mut self, pid: i32) -> Ours {
        *self
            .pids
            .get_or_insert_with(HashMap::new)
            .entry(pid)
            .or_insert(0) += 1;
        Ours {
            pid,
            owner: self.owner,
        }
    }
}

/// The table's lock, held across a `fork` by the forking thread (see `crate::atfork`).
pub(crate) type TableGuard = std::sync::MutexGuard<'static, Table>;

/// The table, this process's own (see the module doc).
pub(super) fn table() -> TableGuard {
    crate::atfork::register();
    let mut t = lock_table();
    let me = std::process::id();
    if t.owner != me {
        // New, or forked from the process it was: none of that one's children or forks in
        // progress is this one's.
        t.owner = me;
        t.spawning = 0;
        t.pids = None;
    }
    t
}

/// The bare lock, without the fork handlers' registration nor the owner's check: for the
/// handlers themselves.
pub(crate) fn lock_table() -> TableGuard {
    // The table stays consistent across a panic (every update is one statement).
    OURS.lock().unwrap_or_else(|e| e.into_inner())
}

/// The table's lock, taken with no fork of nodus's in progress (a spawn on another thread is
/// waited out, 100 ms at most; `None` after that): every child of nodus's is in it then.
fn quiet_table() -> Option<TableGuard> {
    for _ in 0..1000 {
        let t = table();
        if t.spawning == 0 {
            return Some(t);
        }
        drop(t);
        std::thread::sleep(Duration::from_micros(100));
    }
    None
}

/// A fork about to happen (see the module doc): take it before the fork, then
/// [`register`](Self::register) the child's pid, or drop it if the fork failed.
pub(crate) struct Spawning(());

impl Spawning {
    pub(crate) fn begin() -> Spawning {
        table().spawning += 1;
        Spawning(())
    }

    /// The fork made `pid`: it is nodus's own until the returned registration is dropped.
    pub(crate) fn register(self, pid: Pid) -> Ours {
        let mut t = table();
        let ours = t.claim(pid.as_raw_nonzero().get());
        t.spawning -= 1;
        drop(t);
        std::mem::forget(self);
        ours
    }
}

impl Drop for Spawning {
    fn drop(&mut self) {
        table().spawning -= 1;
    }
}

/// A child of nodus's: no reaper touches it while this lives. Dropped after the child's reap.
#[derive(Debug)]
pub(crate) struct Ours {
    pid: i32,
    /// The process whose table holds it: dropped in a process forked from that one, it releases
    /// nothing (see the module doc).
    owner: u32,
}

impl Drop for Ours {
    fn drop(&mut self) {
        let mut t = table();
        if t.owner != self.owner {
            return;
        }
        if let Some(pids) = t.pids.as_mut()
            && let Some(n) = pids.get_mut(&self.pid)
        {
            *n -= 1;
            if *n == 0 {
                pids.remove(&self.pid);
            }
        }
    }
}

/// How often a pass runs without a `SIGCHLD` (see the module doc: the adoption lag).
const PASS_PERIOD: Duration = Duration::from_millis(500);

/// How often the stop looks at what is left of the adopted processes.
const STOP_POLL: Duration = Duration::from_millis(10);
/// How long the stop goes on SIGKILLing what appears (a killed process's own children are
/// re-parented here in turn) before it gives up on the rest.
const KILL_LIMIT: Duration = Duration::from_secs(2);

/// A primary's reaper (see the module doc). Cheap to clone; [`close`](Self::close) ends it.
#[derive(Clone)]
pub(crate) struct Reaper(Rc<Inner>);

struct Inner {
    /// Foreign children seen and not yet reaped by us (each counted once as adopted).
    known: RefCell<HashSet<i32>>,
    /// The children this process already had when the reaper started, not one of nodus's (a
    /// wrapper's background job before it `exec`ed this program: `sh -c 'crond & exec nodus
    /// ...'`). Nothing the workers left: reaped when they exit (no one else can), but neither
    /// counted as adopted nor stopped by [`Reaper::stop_adopted`].
    inherited: RefCell<HashSet<i32>>,
    adopted: Cell<u64>,
    reaped: Cell<u64>,
    /// This process was not a subreaper before `start`: the end puts that back.
    set_here: bool,
    task: RefCell<Option<JoinHandle<()>>>,
    /// The reaper has ended (see the module doc): no more passes.
    ended: Cell<bool>,
    /// A second signal during the stop: SIGKILL what is left now.
    hurry: Cell<bool>,
    /// The primary's orphan guard, told of each adopted process while it runs (see the module
    /// doc).
    guard: RefCell<Option<OrphanGuard>>,
}

/// One pass's outcome.
enum Pass {
    /// The foreign children still running.
    Alive(Vec<i32>),
    /// A fork was in progress on another thread (nothing was done), or the orphan guard's
    /// socket was full (what could not be told to it is to be done again): another pass, 1 ms
    /// later.
    Deferred,
}

impl Reaper {
    /// Marks this process a child subreaper (a failure is one warning line: as PID 1 it adopts
    /// orphans anyway), catches `SIGCHLD` and reaps what is already there, then passes again at
    /// every `SIGCHLD` and every [`PASS_PERIOD`].
    ///
    /// # Errors
    /// `SIGCHLD` cannot be caught.
    ///
    /// # Panics
    /// Outside a running nodus loop.
    #[track_caller]
    pub(crate) fn start() -> io::Result<Reaper> {
        let mut signals = Signals::new(&[libc::SIGCHLD])?;
        // Before the mark: what is a child now was not re-parented here as a subreaper.
        let inherited = inherited_children();
        let was = rustix::process::child_subreaper().ok().flatten().is_some();
        let mut set_here = false;
        if !was {
            match rustix::process::set_child_subreaper(Some(rustix::process::getpid())) {
                Ok(()) => set_here = true,
                Err(e) => tracing::warn!(
                    target: "nodus::process",
                    "cannot become a child subreaper ({}): orphaned descendants go to init, not \
                     to this process",
                    io::Error::from(e)
                ),
            }
        }
        let inner = Rc::new(Inner {
            known: RefCell::default(),
            inherited: RefCell::new(inherited),
            adopted: Cell::new(0),
            reaped: Cell::new(0),
            set_here,
            task: RefCell::new(None),
            ended: Cell::new(false),
            hurry: Cell::new(false),
            guard: RefCell::new(None),
        });
        let weak = Rc::downgrade(&inner);
        let task = crate::task::spawn_named("process:reaper", async move {
            // Dropped with the task: by `close` (the reaper has ended then), or with the loop's
            // `Runtime`, which ends the reaper even while a clone of it is still held.
            let _end = EndWithTask(weak.clone());
            // Unref'd, as the signal stream: neither keeps the loop alive.
            let mut period = crate::time::interval(PASS_PERIOD);
            period.unref();
            loop {
                let Some(inner) = weak.upgrade() else { return };
                Reaper(inner).reap().await;
                // A `SIGCHLD`, or the period: an orphan re-parented here alive sends nothing.
                poll_fn(|cx| {
                    if signals.poll_recv(cx).is_ready() || period.poll_tick(cx).is_ready() {
                        return Poll::Ready(());
                    }
                    Poll::Pending
                })
                .await;
            }
        });
        *inner.task.borrow_mut() = Some(task);
        Ok(Reaper(inner))
    }

    /// From the next pass on, every adopted process seen running is remembered by `guard`
    /// (SIGKILLed by it if this process dies) and forgotten before its reap (see the module doc).
    pub(crate) fn set_guard(&self, guard: OrphanGuard) {
        *self.0.guard.borrow_mut() = Some(guard);
    }

    /// Orphans adopted (foreign children seen) and reaped, since the start.
    pub(crate) fn counts(&self) -> (u64, u64) {
        (self.0.adopted.get(), self.0.reaped.get())
    }

    /// Reaps every foreign child that has exited; returns those still running. Waits out a
    /// fork in progress on another thread, or a full orphan guard socket (1 ms at a time; the
    /// guard reads as fast as it is scheduled, and one full for a second is killed).
    pub(crate) async fn reap(&self) -> Vec<i32> {
        loop {
            match self.pass() {
                Pass::Alive(alive) => return alive,
                Pass::Deferred => crate::time::sleep(Duration::from_millis(1)).await,
            }
        }
    }

    /// One pass, under [`OURS`]'s lock throughout (see the module doc).
    fn pass(&self) -> Pass {
        if self.0.ended.get() {
            return Pass::Alive(Vec::new());
        }
        let t = table();
        if t.spawning > 0 {
            return Pass::Deferred;
        }
        let listed = children();
        let mut known = self.0.known.borrow_mut();
        let mut inherited = self.0.inherited.borrow_mut();
        let guard = self.0.guard.borrow();
        // The guard's socket was full for one of its messages: the pass is done again shortly.
        let mut busy = false;
        let mut alive = Vec::new();
        // Logged once the lock is released (no code of the program's, a tracing subscriber,
        // runs under it: see `crate::atfork`).
        let mut adopted_now = Vec::new();
        let mut reaped_now = Vec::new();
        for &pid in &listed {
            if t.holds(pid) {
                continue;
            }
            let Some(id) = Pid::from_raw(pid) else {
                continue;
            };
            let was_inherited = inherited.contains(&pid);
            if !was_inherited && known.insert(pid) {
                self.0.adopted.set(self.0.adopted.get() + 1);
                adopted_now.push(pid);
            }
            let options = WaitIdOptions::EXITED
                | WaitIdOptions::NOHANG
                | WaitIdOptions::from_bits_retain(libc::__WALL as _);
            let wait = |options| loop {
                match rustix::process::waitid(WaitId::Pid(id), options) {
                    Err(rustix::io::Errno::INTR) => continue,
                    other => break other,
                }
            };
            if !was_inherited && let Some(guard) = guard.as_ref() {
                // An adopted process the guard may remember: look first (`WNOWAIT`), so that
                // the guard forgets it before the reap, never after (see the module doc).
                match wait(options | WaitIdOptions::NOWAIT) {
                    Ok(None) => {
                        busy |= !guard.remember_pid(pid);
                        alive.push(pid);
                        continue;
                    }
                    _ => {
                        if !guard.forget_pid(pid) {
                            // Still remembered: not reaped (its number stays taken) until the
                            // guard has read that it is forgotten.
                            busy = true;
                            continue;
                        }
                    }
                }
            }
            let result = wait(options);
            if was_inherited {
                // Reaped if it has exited; not counted, never stopped.
                if !matches!(result, Ok(None)) {
                    inherited.remove(&pid);
                }
                continue;
            }
            match result {
                Ok(Some(status)) => {
                    known.remove(&pid);
                    self.0.reaped.set(self.0.reaped.get() + 1);
                    reaped_now.push((pid, status.exit_status(), status.terminating_signal()));
                }
                // Only without a guard: with one, a running child was found by the look above.
                Ok(None) => alive.push(pid),
                // Reaped by someone else (a `waitpid(-1)` elsewhere in the process).
                Err(_) => {
                    known.remove(&pid);
                }
            }
        }
        drop(t);
        for pid in adopted_now {
            tracing::debug!(target: "nodus::process", "adopted process {pid}");
        }
        for (pid, exit, signal) in reaped_now {
            tracing::debug!(
                target: "nodus::process",
                "reaped adopted process {pid} (exit {exit:?}, signal {signal:?})"
            );
        }
        // Gone without our reap: no longer ours to count, nor the guard's to remember.
        known.retain(|p| {
            if listed.contains(p) {
                return true;
            }
            // Kept (and forgotten again next pass) while the guard's socket is full.
            let forgotten = guard.as_ref().is_none_or(|guard| guard.forget_pid(*p));
            busy |= !forgotten;
            !forgotten
        });
        inherited.retain(|p| listed.contains(p));
        if let Some(guard) = guard.as_ref() {
            guard.log_deferred();
        }
        if busy {
            return Pass::Deferred;
        }
        Pass::Alive(alive)
    }

    /// At the end of a graceful stop, once every worker is gone: `term` (the workers' kill
    /// signal, SIGTERM by default: they belong to the app), then SIGCONT (a stopped process
    /// acts on it once continued), to every adopted process still running (and to each one
    /// re-parented here meanwhile), SIGKILL to what is left (and its
    /// descendants) after `kill_timeout` or after [`hurry`](Self::hurry). Returns how many got
    /// `term` and how many SIGKILL; logs one line, naming `term`, when there were any.
    pub(crate) async fn stop_adopted(&self, term: i32, kill_timeout: Duration) -> (usize, usize) {
        let deadline = Instant::now() + kill_timeout;
        // A number that is no signal (a library user's `Config::kill_signal`) sends nothing, as
        // it does to the workers: SIGKILL at the kill timeout.
        let term_signal = super::child::to_signal(term).ok();
        let mut termed = HashSet::new();
        loop {
            let alive = self.reap().await;
            if alive.is_empty() {
                break;
            }
            if self.0.hurry.get() || Instant::now() >= deadline {
                break;
            }
            for pid in alive {
                if let Some(signal) = term_signal
                    && !termed.contains(&pid)
                    && signal_child(pid, signal, false)
                {
                    termed.insert(pid);
                }
            }
            crate::time::sleep(STOP_POLL).await;
        }
        let mut killed = HashSet::new();
        let limit = Instant::now() + KILL_LIMIT;
        loop {
            let alive = self.reap().await;
            if alive.is_empty() {
                break;
            }
            if Instant::now() >= limit {
                tracing::warn!(
                    target: "nodus::process",
                    "{} adopted process(es) still there {KILL_LIMIT:?} after SIGKILL: {alive:?}",
                    alive.len()
                );
                break;
            }
            for pid in alive {
                if signal_child(pid, Signal::KILL, true) {
                    killed.insert(pid);
                }
            }
            crate::time::sleep(STOP_POLL).await;
        }
        let stopped = termed.union(&killed).count();
        if stopped > 0 {
            let s = if stopped == 1 { "" } else { "es" };
            tracing::info!(
                target: "nodus::process",
                "stopped {stopped} adopted process{s} the workers left behind ({} got {}, {} \
                 SIGKILL)",
                termed.len(),
                crate::signal::name(term),
                killed.len()
            );
        }
        (termed.len(), killed.len())
    }

    /// A second signal during [`stop_adopted`](Self::stop_adopted), or before it (during the
    /// workers' drain): SIGKILL what is left now, without the kill signal first.
    pub(crate) fn hurry(&self) {
        self.0.hurry.set(true);
    }

    /// Ends the reaper (see the module doc): no more passes (a child forked afterwards by other
    /// means keeps its exit status); if [`start`](Self::start) made this process a subreaper,
    /// it is none again (orphans go to init again); the adopted processes still unreaped are
    /// handed to the orphan reaper's thread. Also done when the last clone is dropped, or when
    /// the loop's `Runtime` is (the reaper's task with it).
    pub(crate) fn close(&self) {
        self.0.close();
    }
}

impl Inner {
    fn close(&self) {
        self.end();
        let task = self.task.borrow_mut().take();
        if let Some(task) = task {
            task.abort();
        }
    }

    /// The reaper's end, once (see the module doc): the subreaper mark it set taken off, then
    /// every adopted child still unreaped (running, or a zombie) handed to the orphan reaper's
    /// thread, which reaps it at its exit by its pidfd.
    fn end(&self) {
        if self.ended.replace(true) {
            return;
        }
        // First: no orphan is re-parented here after the listing below.
        if self.set_here {
            let _ = rustix::process::set_child_subreaper(None);
        }
        let guard = self.guard.borrow_mut().take();
        let inherited = std::mem::take(&mut *self.inherited.borrow_mut());
        self.known.borrow_mut().clear();
        let Some(mut t) = quiet_table() else {
            tracing::warn!(
                target: "nodus::process",
                "the subreaper ends while another thread spawns: the processes it adopted are \
                 not reaped when they exit"
            );
            return;
        };
        let me = rustix::process::getpid();
        let mut handed = Vec::new();
        for pid in children() {
            // Not nodus's own (no fork of nodus's is in progress: each one is in the table),
            // nor a child this process had before the start.
            if t.holds(pid) || inherited.contains(&pid) {
                continue;
            }
            let Some(id) = Pid::from_raw(pid) else {
                continue;
            };
            // Our child once its pidfd is open: the pidfd is that child's, whatever becomes of
            // the number.
            let Ok(pidfd) = rustix::process::pidfd_open(id, PidfdFlags::empty()) else {
                continue;
            };
            if super::child::parent_of(id) != Some(me) {
                continue;
            }
            // Remembered by the orphan guard: reaped only after the guard's exit, as a worker
            // whose group it remembers (see `orphans`).
            let guard_pidfd = match guard.as_ref().filter(|g| g.remembers_pid(pid)) {
                None => None,
                Some(guard) => match guard.pidfd() {
                    Some(Ok(fd)) => Some(fd),
                    // Reaped: the guard has exited and remembers nothing.
                    None => None,
                    // Its exit cannot be waited for: forgotten now (not covered, never wrong),
                    // or, with its socket full, left unreaped (its number stays taken).
                    Some(Err(_)) if guard.forget_pid(pid) => None,
                    Some(Err(_)) => continue,
                },
            };
            // Nodus's own from now until the orphan reaper's reap: no other subreaper (another
            // primary's, on another thread) takes it meanwhile.
            handed.push(Orphan::new(pidfd, id, None, guard_pidfd, t.claim(pid)));
        }
        drop(t);
        if let Some(guard) = guard.as_ref() {
            guard.log_deferred();
        }
        for orphan in handed {
            super::orphans::adopt(orphan);
        }
    }
}

/// Held by the reaper's task: its drop (with the task) ends the reaper, unless it has ended.
struct EndWithTask(Weak<Inner>);

impl Drop for EndWithTask {
    fn drop(&mut self) {
        if let Some(inner) = self.0.upgrade() {
            inner.end();
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.close();
    }
}

impl std::fmt::Debug for Reaper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reaper")
            .field("adopted", &self.0.adopted.get())
            .field("reaped", &self.0.reaped.get())
            .finish()
    }
}

/// Sends `sig` to `pid`, a foreign child of this process seen by the last pass (with `tree`, to
/// its descendants too); `false` if it did not. Under [`OURS`]'s lock, with no fork in progress,
/// a pidfd is opened for `pid`, and the process is signalled only if it is this process's child
/// (checked after the open, so the pidfd is that child's) and not one of nodus's: even if
/// someone else had reaped the adopted process and its number had been reused, no child of
/// nodus's is signalled.
fn signal_child(pid: i32, sig: Signal, tree: bool) -> bool {
    let Some(id) = Pid::from_raw(pid) else {
        return false;
    };
    let t = table();
    if t.spawning > 0 || t.holds(pid) {
        return false;
    }
    let Ok(pidfd) = rustix::process::pidfd_open(id, PidfdFlags::empty()) else {
        return false;
    };
    if super::child::parent_of(id) != Some(rustix::process::getpid()) {
        return false;
    }
    drop(t);
    let mut all: Vec<OwnedFd> = Vec::new();
    if tree {
        super::child::descendants(id, pidfd.as_fd(), &mut all);
    }
    let sent = rustix::process::pidfd_send_signal(&pidfd, sig).is_ok();
    for fd in all {
        let _ = rustix::process::pidfd_send_signal(&fd, sig);
    }
    // As systemd's `kill_and_sigcont`: a stopped process acts on the signal once continued.
    if sent && sig != Signal::KILL && sig != Signal::CONT {
        let _ = rustix::process::pidfd_send_signal(&pidfd, Signal::CONT);
    }
    sent
}

/// The children this process has now that are not nodus's own (see `Inner::inherited`), taken
/// with no fork of nodus's in progress (one on another thread is waited out, 100 ms at most):
/// a child being forked would not be registered yet.
fn inherited_children() -> HashSet<i32> {
    let Some(t) = quiet_table() else {
        return HashSet::new();
    };
    children()
        .into_iter()
        .filter(|&pid| !t.holds(pid))
        .collect()
}

/// This process's children: every thread's `/proc/self/task/TID/children` (a re-parented orphan
/// hangs below whichever thread adopted it), or, without that file, every process whose parent
/// (`/proc/PID/stat`) is this one.
fn children() -> Vec<i32> {
    let me = rustix::process::getpid().as_raw_nonzero().get();
    if std::path::Path::new(&format!("/proc/self/task/{me}/children")).exists() {
        let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
            return Vec::new();
        };
        return tasks
            .flatten()
            .filter_map(|task| std::fs::read_to_string(task.path().join("children")).ok())
            .flat_map(|text| {
                text.split_whitespace()
                    .filter_map(|c| c.parse().ok())
                    .collect::<Vec<i32>>()
            })
            .collect();
    }
    let me_pid = rustix::process::getpid();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| {
            Pid::from_raw(pid).is_some_and(|p| super::child::parent_of(p) == Some(me_pid))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    use rustix::process::Signal;

    use super::super::alone::{alone, exit_code, fork_child};
    use super::*;

    /// Waits (5 s at most) until this process's child `pid` is a zombie.
    fn wait_zombie(pid: i32) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !nodus_testkit::tree::is_zombie(pid) {
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        true
    }

    /// What the process forked below checks: a code for each failure.
    fn forked_process_checks(parents_child: i32) -> i32 {
        if table().holds(parents_child) {
            return 1;
        }
        if quiet_table().is_none() {
            return 2;
        }
        let rt = crate::Runtime::new();
        rt.block_on(async {
            let reaper = Reaper::start().unwrap();
            // A child forked by other means that has exited: a pass reaps it.
            let done = fork_child(false);
            if !wait_zombie(done) {
                return 3;
            }
            if crate::time::timeout(Duration::from_secs(5), reaper.reap())
                .await
                .is_err()
            {
                return 4;
            }
            if nodus_testkit::tree::parent_of(done).is_some() {
                return 5;
            }
            // One that runs: the subreaper may signal it.
            let running = fork_child(true);
            if !signal_child(running, Signal::KILL, false) {
                // SAFETY: our unreaped child: killed and reaped here.
                unsafe { libc::kill(running, libc::SIGKILL) };
                let _ = exit_code(running, Duration::from_secs(5));
                return 6;
            }
            if !wait_zombie(running) {
                return 7;
            }
            let _ = crate::time::timeout(Duration::from_secs(5), reaper.reap()).await;
            if nodus_testkit::tree::parent_of(running).is_some() {
                return 8;
            }
            reaper.close();
            0
        })
    }

    /// The subreaper's log lines are said once the registry lock is let go: a tracing
    /// subscriber (the program's code, which may fork or spawn, and so take that lock on this
    /// very thread) never runs under it.
    #[test]
    fn the_subreaper_logs_without_the_registry_lock() {
        use std::sync::Arc;

        use tracing_subscriber::layer::SubscriberExt;

        if !alone("process::reaper::tests::the_subreaper_logs_without_the_registry_lock") {
            return;
        }
        /// Whether the lock was held (by this thread: the test runs alone) at each of the
        /// process module's events.
        struct Held(Arc<Mutex<Vec<bool>>>);
        impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Held {
            fn on_event(
                &self,
                event: &tracing::Event<'_>,
                _: tracing_subscriber::layer::Context<'_, S>,
            ) {
                if event.metadata().target() == "nodus::process" {
                    self.0.lock().unwrap().push(OURS.try_lock().is_err());
                }
            }
        }
        let held = Arc::new(Mutex::new(Vec::new()));
        let subscriber = tracing_subscriber::registry().with(Held(held.clone()));
        tracing::subscriber::with_default(subscriber, || {
            crate::Runtime::new().block_on(async {
                let reaper = Reaper::start().unwrap();
                // A child forked by other means, exited: adopted, then reaped, by a pass.
                let done = fork_child(false);
                assert!(wait_zombie(done));
                crate::time::timeout(Duration::from_secs(5), reaper.reap())
                    .await
                    .unwrap();
                reaper.close();
            });
        });
        let held = held.lock().unwrap();
        assert!(held.len() >= 2, "the adopted and reaped lines: {held:?}");
        assert!(
            !held.contains(&true),
            "a line said under the lock: {held:?}"
        );
    }

    /// A process forked without `exec` while another thread is between its `Spawning` ticket
    /// and its registration (a spawn), and while a child of the parent is registered, has a
    /// table of its own: no fork in progress, none of the parent's children. So its subreaper
    /// reaps and signals the children it forks by other means (with the parent's count, every
    /// pass would be deferred and every signal refused, for good).
    #[test]
    fn a_process_forked_during_a_spawn_on_another_thread_has_a_table_of_its_own() {
        if !alone(
            "process::reaper::tests::\
             a_process_forked_during_a_spawn_on_another_thread_has_a_table_of_its_own",
        ) {
            return;
        }
        let parents_child = fork_child(true);
        let registered = table().claim(parents_child);
        let (began, has_begun) = mpsc::channel();
        let (end, ends) = mpsc::channel::<()>();
        let spawner = std::thread::spawn(move || {
            let ticket = Spawning::begin();
            began.send(()).unwrap();
            let _ = ends.recv();
            drop(ticket);
        });
        has_begun.recv().unwrap();
        // SAFETY: the forked process runs this test's checks (the other thread holds no lock:
        // its ticket is a count) and `_exit`s, never returning into the harness.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let code = std::panic::catch_unwind(|| forked_process_checks(parents_child));
            // SAFETY: ends the forked process without running this one's exit handlers.
            unsafe { libc::_exit(code.unwrap_or(9)) };
        }
        assert!(pid > 0);
        let code = exit_code(pid, Duration::from_secs(20));
        end.send(()).unwrap();
        spawner.join().unwrap();
        // SAFETY: our unreaped child: killed, then reaped below.
        unsafe { libc::kill(parents_child, libc::SIGKILL) };
        let _ = exit_code(parents_child, Duration::from_secs(5));
        drop(registered);
        assert_eq!(
            code,
            Ok(0),
            "forked process: 1 = holds the parent's child, 2 = a fork in progress for good, \
             3/7 = its child is no zombie, 4 = a pass deferred for good, 5/8 = its child left \
             unreaped, 6 = signal refused"
        );
    }
}
