//! The primary role: forks workers, owns the listening sockets, balances connections, and
//! supervises (restart budget, backoff, rolling reload, graceful shutdown).
//!
//! - [`Config`] says what to run and how; [`Primary::start`] forks the workers;
//!   [`Primary::run`] serves until SIGTERM/SIGINT (drain, exit code 0), handles SIGHUP as a
//!   rolling reload (one the kernel sent, a terminal's hangup, as SIGTERM), catches SIGUSR1
//!   and SIGUSR2 (one line each, serving goes on: their default action would end the primary
//!   undrained), and returns the process exit code
//!   ([`GIVE_UP_EXIT_CODE`](crate::cluster::GIVE_UP_EXIT_CODE) when the restart budget ran out,
//!   [`FORCED_STOP_EXIT_CODE`](crate::cluster::FORCED_STOP_EXIT_CODE) or 128 + a second signal's
//!   number when the stop had to kill workers or a worker cut requests).
//! - [`Primary::ready_state`] is what readyz says: ready while a ready worker is not stalled, by
//!   the rule routing uses (`handoff::stalled`): the handoff deadline passed on a connection
//!   handed to it, or on its loop's answer to a snapshot request (one the call itself sends,
//!   without waiting for it, or one routing sent while handing connections) with nothing else
//!   heard from it meanwhile (counted up to the loop's last complete read of what the workers
//!   sent, so a pause of the primary itself stalls no worker), and whose last answer to one
//!   did not say it cannot take work (`Proc::unready`: a process-wide pool that cannot start a
//!   thread, `pool::start_failure`).
//! - Files: `proc` (one worker process and its channel), `server` (listeners per server key,
//!   `queryServer` answers and the accept loop), `handoff` (connections handed to workers and
//!   pending until taken), `parked` (accepted connections waiting for a worker, and their
//!   bounds), `balance` (rr / least choice), `supervise` (exits, restarts,
//!   reload, shutdown), `captured` (a worker's captured output, read to its end before the
//!   run returns), `conns` (whether a draining Node worker still holds an inbound connection
//!   or output it could not write), `stats` (the cluster's `/_nodus/stats` and
//!   `/_nodus/metrics`), `events` (lifecycle events and the JSON-lines event log).
//!
//! Invariants:
//! - Everything runs on the primary's loop thread (`Rc` state, no locks).
//! - A slot (worker id 1..=N, `NODUS_WORKER_ID`) has at most one *current* process; during a
//!   reload or after a "going down" notice an old process may still drain beside it. Only the
//!   exit of a slot's current process can restart the slot.
//! - The primary keeps a listener it created while a worker holds it, and across a worker's exit
//!   (a reload, a crash): its slot's next worker asks again, so a restart never refuses a
//!   connection (Node's primary closes a handle at its last worker's exit). The last holder's
//!   `close` closes it at once, as Node's primary does; one whose holders all left is closed once
//!   their slots have a ready worker that did not ask for it, or when a worker's bind finds it in
//!   the way (`server`). The operator's pre-bound listeners stay. When a shutdown's drain begins
//!   the primary stops accepting: new connections are refused by the kernel.
//!   A connection handed to a worker stays owned by the primary too until the worker answers
//!   `accepted`, so one lost with its worker is handed to another, and so is one a stalled worker
//!   (the primary has waited the handoff deadline, 1 s, for its loop) has not taken, wherever it
//!   can be taken back without two processes serving it (`handoff`); one no worker takes (every
//!   one stalled, say) waits a bounded time (`ready_timeout`), then it is reset.
//! - Workers get `PR_SET_PDEATHSIG(SIGKILL)`: none outlives a primary killed with SIGKILL. Their
//!   own children are the orphan guard's (`crate::process::OrphanGuard`, `State::guard`),
//!   forked by [`Primary::start`] before the first worker: it remembers each worker's process
//!   group from the spawn until the group is killed at the worker's exit (forgotten then, before
//!   the reap), and SIGKILLs every group it still remembers once this process is gone, whatever
//!   the cause. `run` closes it once every worker has been reaped (it kills nothing then) and
//!   reaps it. A guard that cannot start or dies is one warning line; the cluster goes on without
//!   it (it is not restarted). It is no worker: not in `procs`, the stats, the events or the
//!   restart budget. A worker's child that left the group (`setsid`) escapes it.
//! - With [`Config::subreaper`] (the `nodus` command line's primaries), the primary is the init
//!   of what its workers leave: marked `PR_SET_CHILD_SUBREAPER` before the guard and the first
//!   worker, it adopts every descendant orphaned below it (a `setsid` daemon whose parent
//!   exited included), reaps each when it exits (`crate::process::Reaper`, `State::reaper`:
//!   only children that `crate::process` did not spawn, so never a worker or the guard), and,
//!   once a stop has no worker left, sends the adopted processes still running the workers'
//!   kill signal ([`Config::kill_signal`], SIGTERM by default: they belong to the app),
//!   SIGKILLs them after the kill timeout, and logs how many. The counts are in the stats and
//!   metrics.
//!   A runtime dropped without a stop ends the reaper too: the adopted processes still there
//!   are reaped by the orphan reaper's thread (`crate::process`), none left a zombie.
//!   Off for a library user by default: the primary would reap any child of the program that
//!   `crate::process` did not start.
//! - With [`Config::pin_program`], `State::pinned` holds the program file (`O_PATH`, fd 100 or
//!   above) of the serving generation and, during a reload, of the reload's; a worker of a
//!   generation that has one is executed through it, any other from the program's path. The
//!   reload's is dropped when it fails, the old one when it is done.
//! - Round-robin and least hand connections over the channel, so they need workers with one
//!   (`WorkerCommand::ipc`): `Primary::start` refuses them for a plain program, as `nodus run`
//!   refuses `--policy rr` without `--node`, and `Config::new` defaults a plain program to
//!   `Shared` (a blocking listening socket every worker accepts on, as systemd passes one).

mod balance;
mod captured;
mod conns;
mod events;
mod fd_reserve;
mod handoff;
mod parked;
mod proc;
mod server;
mod stats;
mod supervise;

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::ffi::OsString;
use std::io;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

pub use events::{Event, EventKind, MESSAGE_LOG_MAX};
pub use proc::report_exec_failure;

use super::supervision::{RestartBudget, RestartPolicy, SlotHistory, default_max_restarts};
use crate::net::TcpListener;
use crate::process::{OrphanGuard, Reaper};
use crate::signal::{SIGHUP, SIGINT, SIGTERM, SIGUSR1, SIGUSR2, Signals};
use proc::Proc;
use server::Server;

/// How long [`Primary::run`] waits, at its end, for the event log's writer to write the lines
/// still queued (0.5 s): what a file that takes no more (a stalled pipe) holds is lost past it.
pub const EVENT_LOG_FLUSH: Duration = Duration::from_millis(500);

/// How new connections reach workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// The primary accepts and hands each connection to the next worker (Node's default, and
    /// [`Config::new`]'s for workers with a channel). Needs workers that speak the cluster
    /// protocol ([`WorkerCommand::ipc`]).
    RoundRobin,
    /// Every worker accepts on one shared listening socket (fast; the kernel's wake-up order
    /// skews the spread). [`Config::new`]'s default for a plain program.
    Shared,
    /// Every worker gets a socket of its own bound with `SO_REUSEPORT`; the kernel hashes
    /// connections over them. When a worker's socket closes (a reload, a crash), connections
    /// still in its accept queue are reset.
    ReusePort,
    /// The primary accepts and hands each connection to the worker with the fewest open
    /// connections (workers report them). Needs workers that speak the cluster protocol.
    Least,
}

impl Policy {
    /// The name used on the command line and in stats (`rr`, `shared`, `reuseport`, `least`).
    pub fn name(self) -> &'static str {
        match self {
            Policy::RoundRobin => "rr",
            Policy::Shared => "shared",
            Policy::ReusePort => "reuseport",
            Policy::Least => "least",
        }
    }
}

/// What counts as a worker being ready for traffic (a reload waits for it before draining the
/// old worker; `/_nodus/readyz` needs one that is not stalled: [`Primary::ready_state`]). A nodus `ready` message, or `READY=1` to the worker's
/// own `NOTIFY_SOCKET` (every worker gets one), always counts. Under [`Policy::RoundRobin`] and
/// [`Policy::Least`] it also routes: a worker that is not ready is handed no connection while a
/// ready one takes connections from that listener (with none ready, as at the start, every one
/// is). Under [`Policy::Shared`] and [`Policy::ReusePort`] the kernel hands connections to
/// whoever accepts, ready or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readiness {
    /// Only a worker saying it is ready (`nodus run --wait-ready`, PM2's `wait_ready`): a nodus
    /// `ready` message (nodus workers send it once they listen), `READY=1` to the worker's
    /// `NOTIFY_SOCKET` (a plain program's, or a Node worker's `sd-notify`), or the string
    /// `'ready'` sent over the channel (PM2's `process.send('ready')` in a Node worker). A Node
    /// worker's `listening` does not count; one that never says it is never ready (warned about
    /// once, after `ready_timeout`).
    Message,
    /// The worker's first `listening` (a Node worker's `server.listen` callback).
    Listening,
    /// The worker's first `listening`, or having stayed alive this long without one: a Node
    /// worker that never tells its primary it listens (a queue consumer, or one whose only
    /// servers are `exclusive` ones, which Node's workers never report) is ready all the same.
    ListeningOrAlive(Duration),
    /// Having stayed alive this long (plain programs that never send `READY=1`).
    Alive(Duration),
}

/// What a readiness probe says of a cluster ([`Primary::ready_state`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadyState {
    /// A ready worker takes connections.
    Ready,
    /// No worker process is ready: they start, or every one crashed or waits in backoff.
    NoWorkerReady,
    /// Every ready worker is stalled (`workers` of them): its loop is blocked or stopped, so
    /// no worker takes a new connection now.
    Stalled { workers: usize },
    /// Every ready worker is stalled (`stalled` of them) or said it cannot take work
    /// (`unready` of them, at least one): `reason` is the first one's (`pool io: no thread
    /// could be started`).
    Unready {
        stalled: usize,
        unready: usize,
        reason: String,
    },
    /// A shutdown began (a signal, [`Primary::shutdown`], or the give-up).
    ShuttingDown,
}

/// The program run as each worker, and how it talks to the primary.
#[derive(Debug, Clone)]
pub struct WorkerCommand {
    pub program: PathBuf,
    pub args: Vec<OsString>,
    pub env: Vec<(OsString, OsString)>,
    /// Speaks Node's cluster protocol over an IPC channel (a nodus or Node worker). Otherwise a
    /// plain program: it gets the primary's listeners as `LISTEN_FDS` (from fd 3). Either way it
    /// gets a `NOTIFY_SOCKET` of its own (never the primary's). `LISTEN_PID` cannot be known before the fork: a program that checks it
    /// (`sd_listen_fds`) must be started through a launcher that sets it to its own pid and
    /// then executes the program (`nodus __exec-listen -- PROGRAM ARGS`, as `nodus run` does).
    pub ipc: bool,
}

/// A cluster's settings. Defaults follow DESIGN.md section 7.
#[derive(Debug)]
pub struct Config {
    pub workers: usize,
    pub command: WorkerCommand,
    /// How connections reach workers; round-robin and least need `command.ipc` (see
    /// [`Primary::start`]).
    pub policy: Policy,
    /// Listeners bound before the workers start (`nodus run -l`, systemd's `LISTEN_FDS`, the
    /// address of `nodus serve`), with their names; a worker's `queryServer` for the same
    /// address (or port) gets one of these instead of a new socket, and a plain program gets
    /// them all as `LISTEN_FDS`. Under `ReusePort` only their addresses are used (bind them with
    /// `reuse_port`): the primary closes them, holding each port with a socket bound but not
    /// listening, and each worker gets sockets of its own.
    pub listeners: Vec<(String, TcpListener)>,
    /// Deferred accept (`TCP_DEFER_ACCEPT`, [`crate::net::ListenOptions::defer_accept`]) on
    /// every TCP listener the cluster serves: set at [`Primary::start`] on the pre-bound ones
    /// (a socket a service manager passed included) and on each one bound for a worker, under
    /// every policy. A connection then reaches a worker with its first request already in it: a
    /// round-robin worker reads it at once rather than waiting for it (a wake-up and an empty
    /// read per connection saved). Off by default: a protocol whose server speaks first would
    /// wait about a second per connection, and a client that has not spoken yet when the
    /// cluster stops (or, under reuseport, when its worker is reloaded) is reset as its listener
    /// closes, where it would have been served (`--defer-accept` of `nodus serve` and `nodus
    /// run`).
    pub defer_accept: bool,
    pub restart: RestartPolicy,
    /// Restart intensity: more than `max_restarts` within `restart_window` gives up. Below
    /// `workers`, one event that restarts every worker once gives up.
    pub max_restarts: u32,
    pub restart_window: Duration,
    /// Drain deadline sent to a worker with its `disconnect`.
    pub drain_timeout: Duration,
    /// After SIGTERM/SIGINT, how long workers keep serving (told `stopping`, so their readiness
    /// probes fail) before the drain begins.
    pub shutdown_delay: Duration,
    /// After a worker was asked to stop (disconnect, or the kill signal for a plain program), the
    /// time it gets before SIGKILL.
    pub kill_timeout: Duration,
    /// The signal that stops a worker (`nodus run --kill-signal`, PM2's `kill_signal`; SIGTERM by
    /// default): a plain program's at once, a worker with a channel's if it is still running
    /// just past its drain deadline (a Node worker's sooner, once it holds no inbound
    /// connection). Sent to the worker alone; SIGKILL to its group still follows at
    /// [`kill_timeout`](Self::kill_timeout). A worker that dies of it stopped as asked. With
    /// [`subreaper`](Self::subreaper), the adopted processes still running once a stop has no
    /// worker left get it too (they belong to the app). Not SIGKILL nor SIGSTOP (the command
    /// line refuses them).
    pub kill_signal: i32,
    /// How long a reload waits for a new worker to be ready. Under round-robin and least, also
    /// how long a connection the primary accepted waits for a worker to take it (none listens,
    /// or every one is full) before it is reset. And how long a listener whose holders left (an
    /// exit, a reload) stays open once their slots have ready workers, for one to ask for it
    /// again (`server::release_orphans`).
    pub ready_timeout: Duration,
    pub readiness: Readiness,
    /// Capture each worker's stdout/stderr with a `[worker id pid]` prefix (else inherited).
    pub prefix_output: bool,
    /// With [`prefix_output`](Self::prefix_output), write the captured lines without the prefix
    /// (off by default; `--raw-output` on the command line): a JSON log line stays a JSON line
    /// for a shipper reading the primary's stdout. Lines are kept whole as prefixed ones are,
    /// and a drop notice still names its worker ([`crate::process::output::raw_lines`]).
    pub raw_output: bool,
    /// Append every lifecycle event as a JSON line to this file.
    pub event_log: Option<PathBuf>,
    /// Act as the init of the processes below the primary (off by default; the `nodus` command
    /// line turns it on): mark this process a child subreaper (`PR_SET_CHILD_SUBREAPER`), so a
    /// worker's descendant that is orphaned (its parent exited, or it daemonized with `setsid`
    /// and a double fork) is re-parented to it rather than to init; reap every such adopted
    /// process when it exits (on `SIGCHLD`); and at the end of a graceful stop, once every
    /// worker is gone, send the adopted processes still running
    /// [`kill_signal`](Self::kill_signal) (SIGTERM by default), then SIGKILL them after
    /// `kill_timeout` (or at once after a second stop request). Counted in the stats
    /// (`orphans_adopted`, `orphans_reaped`) and the metrics
    /// (`nodus_cluster_orphans_adopted_total`, `_reaped_total`). The children this process
    /// already had at [`Primary::start`] (a wrapper's background jobs from before it `exec`ed
    /// this program) are reaped when they exit but neither counted nor stopped.
    ///
    /// Only for a program whose children all come from [`crate::process`] (its own children
    /// are never reaped by this, whichever thread spawned them): any other child of this process
    /// (one started with `std::process` or another library) has its exit status taken by the
    /// primary, so its own `wait` fails (`ECHILD`), and one started after [`Primary::start`]
    /// counts as adopted (and is stopped with the others). The subreaper mark and
    /// the reaping end when [`Primary::run`] returns, or when the primary's runtime is dropped
    /// without a stop: the adopted processes still there are then reaped at their exit by a
    /// background thread (each by its pidfd; a child started afterwards keeps its exit status).
    pub subreaper: bool,
    /// Run each generation's workers from the program file as it was when the generation began
    /// (off by default; `nodus serve --workers N` turns it on): the program is opened
    /// (`O_PATH`) at [`Primary::start`] and at each rolling reload, and every worker of that
    /// generation, a crash restart's included, is executed through that open file
    /// (`/proc/self/fd/N`, `argv[0]` still the program's path). So after a reload that failed
    /// (a broken build deployed in place), a crash restart runs the serving generation's program,
    /// not the broken one on disk, which would crash-loop the slot into the give-up. Left to its
    /// path: a program named without a `/` (found in `PATH`), one that cannot be opened, and a
    /// script (`#!`: its interpreter would have to reopen it by that name, closed by then).
    pub pin_program: bool,
}

impl Config {
    /// `workers` copies of `command`, ready at `listening`, at most [`default_max_restarts`]
    /// restarts (5, or twice the workers when that is more) within 60 s, the default
    /// [`RestartPolicy`] (permanent, backoff 100 ms ×2 up to 10 s, 1 s min uptime), 10 s drain, 10 s kill timeout (SIGTERM first), 30 s ready timeout, output prefixed. The policy is
    /// round-robin (Node's default) for workers that speak the cluster protocol
    /// ([`WorkerCommand::ipc`]), `Shared` for a plain program (`nodus run`'s defaults: a plain
    /// program cannot take handed-over connections, see [`Primary::start`]).
    pub fn new(workers: usize, command: WorkerCommand) -> Config {
        let policy = if command.ipc {
            Policy::RoundRobin
        } else {
            Policy::Shared
        };
        Config {
            workers,
            command,
            policy,
            listeners: Vec::new(),
            defer_accept: false,
            restart: RestartPolicy::default(),
            max_restarts: default_max_restarts(workers),
            restart_window: Duration::from_secs(60),
            drain_timeout: Duration::from_secs(10),
            shutdown_delay: Duration::ZERO,
            kill_timeout: Duration::from_secs(10),
            kill_signal: SIGTERM,
            ready_timeout: Duration::from_secs(30),
            readiness: Readiness::Listening,
            prefix_output: true,
            raw_output: false,
            event_log: None,
            subreaper: false,
            pin_program: false,
        }
    }
}

/// The primary's lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Running,
    Stopping,
}

/// One worker slot.
struct Slot {
    id: u32,
    history: SlotHistory,
    current: Option<Rc<Proc>>,
    restarts: u64,
    /// Connections its workers (every generation) have taken, for a counter that never goes
    /// down while the primary lives; shared with each of its `Proc`s.
    taken: Rc<Cell<u64>>,
    /// A restart is scheduled (backoff) or a replacement is starting.
    pending_restart: bool,
    /// Exits of its workers whose log line waits for their output to end.
    exit_lines_pending: usize,
    /// A replacement that could not be started while an exit line was pending: reported (and
    /// decided on) after that line, in the order things happened.
    failed_spawn: Option<io::Error>,
    /// The line of a replacement started after a backoff while an exit line was pending: said
    /// after that line (and the backoff's own), in the order things happened.
    restarted_line: Option<String>,
}

/// The last worker exit, or failed start: its slot, its pid (none for a start that failed) and
/// why, without the pid (the metric's label, bounded by slots and causes).
pub(crate) struct LastExit {
    pub(crate) worker: u32,
    pub(crate) pid: Option<u32>,
    pub(crate) reason: String,
}

impl LastExit {
    /// One line, as the stats show it: "worker 1 (pid 4242) killed by signal 9".
    pub(crate) fn text(&self) -> String {
        match self.pid {
            Some(pid) => format!("worker {} (pid {pid}) {}", self.worker, self.reason),
            None => format!("worker {} {}", self.worker, self.reason),
        }
    }
}

pub(crate) struct State {
    config: Config,
    seq: Cell<u64>,
    next_unique: Cell<u64>,
    slots: RefCell<Vec<Slot>>,
    procs: RefCell<HashMap<u64, Rc<Proc>>>,
    servers: RefCell<HashMap<String, Rc<Server>>>,
    prebound: RefCell<Vec<(String, Rc<Server>)>>,
    /// The port chosen for a reuse-port key that asked for port 0.
    reuseport_ports: RefCell<HashMap<String, u16>>,
    /// The UDP sockets Node workers' `dgram` binds share, by server key (Node's shared handle,
    /// whatever the policy); emptied when the primary stops accepting.
    datagrams: RefCell<HashMap<String, std::net::UdpSocket>>,
    /// Keys whose last holder left without closing them as a choice of its own (it exited, or
    /// closed them on its way out), with the slots those holders were of: released once each
    /// of those slots has had a ready worker for the grace without asking again, or has no
    /// worker to come (`server::release_orphans`).
    orphans: RefCell<HashMap<String, Vec<u32>>>,
    /// When the task that looks at `orphans` again once a grace is over wakes (none pending:
    /// `None`).
    orphans_wake: Cell<Option<Instant>>,
    /// The keys and addresses of the listeners released lately, oldest first
    /// (`server::release`: at most `MAX_KEYS`).
    released: RefCell<VecDeque<(String, server::Addr)>>,
    budget: RefCell<RestartBudget>,
    restarts: Cell<u64>,
    /// The generation serving: the last successful reload's (0 before any).
    generation: Cell<u64>,
    /// The newest generation a reload started (failed ones included): numbers are never reused.
    newest_generation: Cell<u64>,
    last_exit: RefCell<Option<LastExit>>,
    phase: Cell<Phase>,
    /// A reload is switching slots: from its start until every slot has switched, or it failed
    /// (the stats' `reloading`).
    reloading: Cell<bool>,
    /// A reload is under way, the exits of the old workers it stopped included (past
    /// `reloading`): a SIGHUP meanwhile queues one more.
    reload_running: Cell<bool>,
    /// Reloads that ended with every slot switched, and those that failed (a shutdown's
    /// abandoning one is neither).
    reloads_done: Cell<u64>,
    reloads_failed: Cell<u64>,
    /// Why the last reload to end failed; `None` after one that was done (or before any).
    last_reload_failure: RefCell<Option<String>>,
    /// With [`Config::pin_program`], the program file of each generation that may start
    /// workers (the serving one, a reload's), open (`proc::pin_program`).
    pinned: RefCell<Vec<(u64, OwnedFd)>>,
    /// A SIGHUP came during a reload: one more reload follows it.
    reload_again: Cell<bool>,
    /// A slot was left empty after a crash (its restart type said no): the exit code is then 1.
    left_after_crash: Cell<bool>,
    /// Set when the run is over: the process exit code.
    exit_code: Cell<Option<i32>>,
    /// The exit code once every worker is gone (0, the give-up code, a forced stop's code).
    final_code: Cell<i32>,
    /// Exits whose log line waits for the worker's output to end (`supervise::on_exit`); the run
    /// ends only after them.
    exits_settling: Cell<usize>,
    /// The captured output of exited workers still being copied after their exit line
    /// (`captured::drain_left` waits for it before `run` returns).
    output_left: RefCell<Vec<Rc<captured::Captured>>>,
    /// When the shutdown began (`supervise::start_shutdown`): the stop's bound counts from it.
    stop_began: Cell<Option<Instant>>,
    announced_ready: Cell<bool>,
    /// A worker has run the program: a worker with a channel was spawned (its `exec` is part of
    /// the spawn), or a plain program's worker was ready or exited without its launcher saying
    /// it could not execute the program. Until then such an exec failure ends the run.
    program_ran: Cell<bool>,
    done: RefCell<Option<std::task::Waker>>,
    /// SIGTERM, SIGINT, SIGHUP, SIGUSR1 and SIGUSR2, caught from before the first worker's
    /// spawn (a stop sent the moment the start is logged is drained, not the primary killed by
    /// the default action with its workers half started); `run` takes it.
    signals: RefCell<Option<Signals>>,
    events: events::Events,
    started: Instant,
    /// A release pass (`handoff::arm_release`) is scheduled.
    release_armed: Cell<bool>,
    /// The handoff deadline's watch (`handoff::arm_deadline`) is scheduled.
    deadline_armed: Cell<bool>,
    /// A shutdown's drain began: no listener accepts or is bound any more.
    accepting_stopped: Cell<bool>,
    /// Fds held for the primary's own spawns and handoffs (`fd_reserve`).
    fd_reserve: fd_reserve::FdReserve,
    /// Lines that would repeat as fast as connections come, limited (`handoff::Floods`).
    floods: handoff::Floods,
    /// Fds workers gave back (`returned`) that were not connections of the listener: closed.
    returned_rejected: Cell<u64>,
    /// Connections accepted (rr, least) that waited in the primary for a worker to take them,
    /// each counted once (`server::accept_loop`).
    connections_waited: Cell<u64>,
    /// Datagrams the workers' notify sockets ignored, sent from outside the worker's process
    /// group (`proc::ignored_notify`).
    notify_ignored: Cell<u64>,
    /// A worker's application message (`process.send()`) was logged at INFO (`proc`): the
    /// next ones are logged at DEBUG.
    app_message_said: Cell<bool>,
    stats_cache: RefCell<stats::Cache>,
    /// What the primary's own loop reports in the stats and metrics (`worker="primary"`), taken
    /// on this loop for each document ([`Primary::set_snapshot`]).
    own_snapshot: RefCell<Box<dyn Fn() -> crate::metrics::Snapshot>>,
    /// The orphan guard (`crate::process::OrphanGuard`): remembers every worker's process group
    /// and SIGKILLs those left when this process is gone. `None` if it could not be started.
    guard: Option<OrphanGuard>,
    /// The subreaper (`crate::process::Reaper`), with [`Config::subreaper`]: reaps the orphans
    /// this process adopts and stops those left at the end of a graceful stop.
    reaper: Option<Reaper>,
}

/// A running cluster primary. Cheap to clone.
#[derive(Clone)]
pub struct Primary {
    st: Rc<State>,
}

impl Primary {
    /// Forks the workers and starts serving the pre-bound listeners. Raises the process's soft
    /// open-files limit to the hard limit first ([`crate::process::raise_fd_limit`]) and, when
    /// the calling (loop) thread runs the normal scheduling policy, switches it to `SCHED_BATCH`
    /// (connections gather while the cores are busy; the workers run normal). SIGTERM, SIGINT,
    /// SIGHUP, SIGUSR1 and SIGUSR2 are caught from before the first worker is forked, and acted
    /// on by [`run`](Self::run): a stop sent during the start drains the workers started. So a
    /// started primary must be run (after [`shutdown`](Self::shutdown), to stop at once): one
    /// dropped without it leaves its workers running unsupervised until this process exits, and
    /// those signals caught, with nobody to act on them.
    ///
    /// # Errors
    /// `InvalidInput` for a cluster of no workers, or for a plain program (no
    /// [`ipc`](WorkerCommand::ipc)) under [`Policy::RoundRobin`] or [`Policy::Least`] (the
    /// message names the policy, as `nodus run` refuses `--policy rr` without `--node`): only a
    /// worker that speaks the cluster protocol can take connections the primary accepted, and a
    /// plain program would get the primary's own non-blocking accept socket, the primary
    /// accepting on it too (the connections it took would wait for a worker that never asks,
    /// then be reset). The event log cannot be opened, or no worker could be spawned (the
    /// program does not exist, ...): the message names the program.
    ///
    /// # Panics
    /// Outside a running nodus loop.
    pub fn start(mut config: Config) -> io::Result<Primary> {
        if config.workers == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a cluster needs at least one worker",
            ));
        }
        if !config.command.ipc && matches!(config.policy, Policy::RoundRobin | Policy::Least) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "policy {} needs workers that speak the cluster protocol (WorkerCommand::ipc): \
                     a plain program cannot take connections handed over by the primary (use \
                     shared or reuseport)",
                    config.policy.name()
                ),
            ));
        }
        // Before anything is forked: orphans from the first worker on come here, and are reaped.
        let reaper = if config.subreaper {
            match Reaper::start() {
                Ok(reaper) => Some(reaper),
                Err(e) => {
                    tracing::warn!(
                        target: "nodus::cluster",
                        "cannot reap adopted orphans ({e}): they stay zombies until this process \
                         exits"
                    );
                    None
                }
            }
        } else {
            None
        };
        // First, before the first worker (and before this thread switches to SCHED_BATCH, which
        // a fork inherits): the guard that kills the workers' groups if this process is killed.
        let guard = match OrphanGuard::start() {
            Ok(guard) => Some(guard),
            Err(e) => {
                tracing::warn!(
                    target: "nodus::cluster",
                    "cannot start the orphan guard ({e}): the workers' own children would \
                     outlive this process if it is killed with SIGKILL"
                );
                None
            }
        };
        // The reaper tells the guard of every process it adopts (SIGKILLed by the guard too if
        // this process is killed).
        if let (Some(reaper), Some(guard)) = (&reaper, &guard) {
            reaper.set_guard(guard.clone());
        }
        // Fds handed to workers and not yet read count against the sender's limit (the kernel
        // refuses more with ETOOMANYREFS).
        crate::process::raise_fd_limit();
        // Its workers start under the normal policy (`Command::spawn` sees to it).
        crate::process::sched::batch_this_thread();
        let events = events::Events::open(config.event_log.as_deref())?;
        let budget = RestartBudget::new(config.max_restarts, config.restart_window);
        let listeners = std::mem::take(&mut config.listeners);
        let slots = (1..=config.workers as u32)
            .map(|id| Slot {
                id,
                history: SlotHistory::default(),
                current: None,
                restarts: 0,
                taken: Rc::default(),
                pending_restart: false,
                exit_lines_pending: 0,
                failed_spawn: None,
                restarted_line: None,
            })
            .collect();
        let signals = match Signals::new(&[SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2]) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::error!(target: "nodus::cluster", "cannot catch signals: {e}");
                None
            }
        };
        let st = Rc::new(State {
            config,
            seq: Cell::new(0),
            next_unique: Cell::new(1),
            slots: RefCell::new(slots),
            procs: RefCell::default(),
            servers: RefCell::default(),
            prebound: RefCell::default(),
            reuseport_ports: RefCell::default(),
            datagrams: RefCell::default(),
            orphans: RefCell::default(),
            orphans_wake: Cell::new(None),
            released: RefCell::default(),
            budget: RefCell::new(budget),
            restarts: Cell::new(0),
            generation: Cell::new(0),
            newest_generation: Cell::new(0),
            last_exit: RefCell::new(None),
            phase: Cell::new(Phase::Running),
            reloading: Cell::new(false),
            reload_running: Cell::new(false),
            reloads_done: Cell::new(0),
            reloads_failed: Cell::new(0),
            last_reload_failure: RefCell::new(None),
            pinned: RefCell::default(),
            reload_again: Cell::new(false),
            left_after_crash: Cell::new(false),
            exit_code: Cell::new(None),
            final_code: Cell::new(0),
            exits_settling: Cell::new(0),
            output_left: RefCell::default(),
            stop_began: Cell::new(None),
            announced_ready: Cell::new(false),
            program_ran: Cell::new(false),
            done: RefCell::new(None),
            signals: RefCell::new(signals),
            events,
            started: Instant::now(),
            release_armed: Cell::new(false),
            deadline_armed: Cell::new(false),
            accepting_stopped: Cell::new(false),
            fd_reserve: fd_reserve::FdReserve::new(),
            floods: handoff::Floods::new(),
            returned_rejected: Cell::new(0),
            connections_waited: Cell::new(0),
            notify_ignored: Cell::new(0),
            app_message_said: Cell::new(false),
            stats_cache: RefCell::default(),
            own_snapshot: RefCell::new(Box::new(crate::metrics::snapshot)),
            guard,
            reaper,
        });
        for (name, listener) in listeners {
            let server = Server::prebound(&st, listener)?;
            st.prebound.borrow_mut().push((name, server));
        }
        proc::pin_program(&st, 0);
        let primary = Primary { st };
        let ids: Vec<u32> = primary.st.slots.borrow().iter().map(|s| s.id).collect();
        for id in ids {
            let proc = Proc::spawn(&primary.st, id, 0).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!(
                        "cannot start worker {id} ({}): {e}",
                        crate::fs::quote(&primary.st.config.command.program)
                    ),
                )
            })?;
            primary.st.slots.borrow_mut()[id as usize - 1].current = Some(proc);
        }
        Ok(primary)
    }

    /// Serves until a shutdown: SIGTERM or SIGINT drain every worker and return 0; SIGHUP starts
    /// a rolling reload, unless it is the primary's terminal hanging up
    /// ([`sighup`](crate::signal::sighup)), which drains as SIGTERM does (under `nohup`, one
    /// line and nothing else); SIGUSR1 and SIGUSR2 are
    /// one WARN line each naming the workers' pids (not passed on: a worker that does not catch one would die of it), and change nothing,
    /// so a `pkill -USR2 -f 'node app.js'` meant for Node workers, which matches the primary's
    /// command line too, does not end the service; a spent restart budget stops everything and returns
    /// [`GIVE_UP_EXIT_CODE`](crate::cluster::GIVE_UP_EXIT_CODE). A stop that had to kill
    /// workers returns [`FORCED_STOP_EXIT_CODE`](crate::cluster::FORCED_STOP_EXIT_CODE) (the
    /// kill timeout expired; so does one in which a draining worker died of a signal the primary
    /// did not send) or 128 + N (a second signal N: 143 for SIGTERM, 130 for SIGINT).
    /// Tells systemd `READY=1` once every worker is ready (and after each reload),
    /// `RELOADING=1`, `STOPPING=1`.
    /// The event log's queued lines are then waited for, [`EVENT_LOG_FLUSH`] at most.
    pub async fn run(&self) -> i32 {
        self.st.events.started();
        let code = supervise::run(&self.st).await;
        self.st.events.flush(EVENT_LOG_FLUSH).await;
        code
    }

    /// Starts a rolling reload (what SIGHUP does); during a reload (until the old workers it
    /// stopped have exited) it queues one more, at most one; ignored during shutdown.
    pub fn reload(&self) {
        supervise::start_reload(&self.st);
    }

    /// Starts a graceful shutdown (what SIGTERM does); [`run`](Self::run) then returns 0. A
    /// second call during it kills what is left, and `run` returns
    /// [`FORCED_STOP_EXIT_CODE`](crate::cluster::FORCED_STOP_EXIT_CODE).
    pub fn shutdown(&self) {
        supervise::request_shutdown(
            &self.st,
            "shutdown requested",
            super::supervision::FORCED_STOP_EXIT_CODE,
        );
    }

    /// Calls `f` for every lifecycle event (fork, online, listening, ready, exit, ...). Called
    /// before [`Primary::run`], it is first called with the events so far (the first workers'
    /// `fork`, emitted in [`Primary::start`]), so a subscriber misses none.
    pub fn on_event(&self, f: impl Fn(&Event) + 'static) {
        self.st.events.subscribe(Box::new(f));
    }

    /// Sends an application message to the current process of worker `id`: `Ok(true)`, or
    /// `Ok(false)` once 128 KiB or more waits for that worker (slow down, as Node's
    /// `worker.send()` returns `false`: nothing is dropped, but what a worker does not read
    /// stays in the primary's memory). No process for `id`: nothing is sent, `Ok(true)`.
    ///
    /// # Errors
    /// The worker's channel is closed, the message does not serialize (`InvalidData`), or it is
    /// larger than the 16 MiB frame cap (`InvalidInput`).
    pub fn send<T: serde::Serialize + ?Sized>(&self, id: u32, msg: &T) -> io::Result<bool> {
        let Some(proc) = self.st.current(id) else {
            return Ok(true);
        };
        match &proc.channel {
            Some(ch) => ch.send(msg).map_err(|e| match e {
                crate::ipc::IpcError::Serialize(e) => io::Error::new(io::ErrorKind::InvalidData, e),
                e @ crate::ipc::IpcError::TooLarge { .. } => {
                    io::Error::new(io::ErrorKind::InvalidInput, e.to_string())
                }
                e => io::Error::other(e.to_string()),
            }),
            None => Ok(true),
        }
    }

    /// Sends an application message to every worker that has a channel (a closed one is
    /// skipped): `Ok(false)` when it waits, 128 KiB or more, for at least one of them (see
    /// [`Primary::send`]).
    ///
    /// # Errors
    /// The message does not serialize, or is larger than the frame cap: no worker gets it.
    pub fn broadcast<T: serde::Serialize + ?Sized>(&self, msg: &T) -> io::Result<bool> {
        let ids: Vec<u32> = self.st.slots.borrow().iter().map(|s| s.id).collect();
        let mut keep_sending = true;
        for id in ids {
            match self.send(id, msg) {
                Ok(more) => keep_sending &= more,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::InvalidData | io::ErrorKind::InvalidInput
                    ) =>
                {
                    return Err(e);
                }
                Err(_) => {}
            }
        }
        Ok(keep_sending)
    }

    /// Asks worker `id`'s current process to drain and exit (Node's `worker.disconnect()` plus a
    /// kill timer). An exit the primary asked for is not restarted, and its exit event says
    /// `exited_after_disconnect: true`.
    pub fn stop_worker(&self, id: u32) {
        if let Some(p) = self.st.current(id) {
            supervise::drain(&self.st, &p);
        }
    }

    /// Sends `signal` to worker `id`'s current process (Node's `worker.kill(signal)`). Unlike
    /// Node, the primary records that it asked: the exit event says
    /// `exited_after_disconnect: true` and the exit is not counted as a crash.
    ///
    /// # Errors
    /// No such worker, or the signal cannot be sent.
    pub fn kill_worker(&self, id: u32, signal: i32) -> io::Result<()> {
        let p = self
            .st
            .current(id)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no worker {id}")))?;
        p.drained.set(true);
        p.signal(signal, false)
    }

    /// The pids of the current workers, by worker id (0 for an empty slot, or one whose worker
    /// has exited, during a shutdown too).
    pub fn worker_pids(&self) -> Vec<(u32, u32)> {
        let pid = |p: &Rc<Proc>| if p.is_alive() { p.pid } else { 0 };
        self.st
            .slots
            .borrow()
            .iter()
            .map(|s| (s.id, s.current.as_ref().map_or(0, pid)))
            .collect()
    }

    /// Sets what the primary's own loop reports in the stats (`primary.snapshot`) and metrics
    /// (`worker="primary"`), called on its loop for each document (default:
    /// [`crate::metrics::snapshot`]; an HTTP server on this loop adds its own section).
    pub fn set_snapshot(&self, f: impl Fn() -> crate::metrics::Snapshot + 'static) {
        *self.st.own_snapshot.borrow_mut() = Box::new(f);
    }

    /// The cluster's `/_nodus/stats` document (fresh worker snapshots, at most 1 s old, and the
    /// primary's own loop's, taken now).
    pub async fn stats_json(&self) -> String {
        stats::stats_json(&self.st).await
    }

    /// The cluster's `/_nodus/metrics` (OpenMetrics text), every series labelled by `worker`:
    /// a worker's slot number, `primary` for the primary's own loop.
    pub async fn metrics_text(&self) -> String {
        stats::metrics_text(&self.st).await
    }

    /// Whether the cluster takes traffic, for a readiness probe (`/_nodus/readyz`), and why not:
    /// [`ReadyState::Ready`] while no shutdown began and a ready worker process is not stalled.
    /// One worker down (crashed, being replaced, its slot in backoff) or stalled leaves the
    /// others serving, so the cluster stays ready; none ready (still starting, or every one
    /// down) is [`ReadyState::NoWorkerReady`], every ready one stalled
    /// [`ReadyState::Stalled`], every ready one stalled or unable to take work (its last answer
    /// to a snapshot request or probe said why: a process-wide pool that cannot start a thread,
    /// `pool::start_failure`) [`ReadyState::Unready`]; that worker is ready again once an
    /// answer says nothing (its pool started).
    ///
    /// A worker is stalled when the primary has waited for its loop for the handoff deadline
    /// (1 s): a connection handed to it under round-robin or least not taken (or taken back from
    /// it and not yet seen), or, for a worker that answers snapshot requests (a nodus worker), a
    /// request not answered, with no other message from it meanwhile. Round-robin and least
    /// route by the same rule: a worker this calls stalled is handed no connection until it
    /// answers (any message from it). So that an idle cluster's stall is seen too, this sends
    /// each ready nodus worker with no request unanswered a probe (a snapshot request answered
    /// without a snapshot) when it was last asked 1 s ago or more, and does not wait for it: the
    /// answer is cheap and never waits for a worker (a stall begun since shows at a later call,
    /// once that request is 1 s old). A Node worker or a plain program is asked nothing:
    /// stalled only by its handoffs, never otherwise. The wait counts up to the primary's last
    /// complete read of what its workers sent, not to the clock: right after the primary itself
    /// was stopped (SIGSTOP, a frozen VM), a worker that answered meanwhile is not stalled,
    /// whether or not its answer has been read yet.
    ///
    /// Under [`Policy::Shared`] and [`Policy::ReusePort`] no connection is handed over: the
    /// kernel queues them on the workers' sockets. A stalled worker accepts none meanwhile; under
    /// `Shared` the others take them all from the one queue, but under `ReusePort` the kernel
    /// still hashes new connections to a stalled worker's own socket, where its share waits
    /// until it runs again (or is reset when its socket closes): the cluster is ready while
    /// another worker serves, so most connections are served.
    pub fn ready_state(&self) -> ReadyState {
        if self.is_stopping() {
            return ReadyState::ShuttingDown;
        }
        let now = crate::time::polled_ns();
        let (mut ready, mut stalled, mut unready) = (0, 0, 0);
        let mut reason = None;
        for p in self.st.procs.borrow().values().filter(|p| p.is_ready()) {
            stats::probe(&self.st, p);
            ready += 1;
            if handoff::stalled(p, now) {
                stalled += 1;
            } else if let Some(why) = &*p.unready.borrow() {
                unready += 1;
                reason.get_or_insert_with(|| why.clone());
            }
        }
        match (ready, reason) {
            (0, _) => ReadyState::NoWorkerReady,
            (n, None) if n == stalled => ReadyState::Stalled { workers: n },
            (n, Some(reason)) if n == stalled + unready => ReadyState::Unready {
                stalled,
                unready,
                reason,
            },
            _ => ReadyState::Ready,
        }
    }

    /// Whether [`ready_state`](Self::ready_state) is [`ReadyState::Ready`].
    pub fn is_ready(&self) -> bool {
        self.ready_state() == ReadyState::Ready
    }

    /// Whether a shutdown began: SIGTERM or SIGINT, [`shutdown`](Self::shutdown), or the give-up
    /// when the restart budget is spent. It does not end.
    pub fn is_stopping(&self) -> bool {
        self.st.phase.get() == Phase::Stopping
    }
}

impl std::fmt::Debug for Primary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Primary")
            .field("workers", &self.st.config.workers)
            .field("policy", &self.st.config.policy)
            .finish()
    }
}

impl State {
    fn next_seq(&self) -> u64 {
        let s = self.seq.get();
        self.seq.set(s + 1);
        s
    }

    fn current(&self, id: u32) -> Option<Rc<Proc>> {
        self.slots
            .borrow()
            .get((id as usize).wrapping_sub(1)) // id 0 names no slot
            .and_then(|s| s.current.clone())
    }

    fn all_ready(&self) -> bool {
        self.slots
            .borrow()
            .iter()
            .all(|s| s.current.as_ref().is_some_and(|p| p.is_ready()))
    }

    fn emit(&self, worker: Option<&Proc>, kind: EventKind) {
        self.emit_for(worker.map(|p| p.slot), worker.map(|p| p.pid), kind);
    }

    /// An event of slot `worker` (none: cluster-wide) whose process may not exist (`pid`).
    fn emit_for(&self, worker: Option<u32>, pid: Option<u32>, kind: EventKind) {
        self.events.emit(Event {
            t_ns: crate::clock::now_ns(),
            worker,
            pid,
            kind,
        });
    }

    /// No worker runs, none is about to start and no reload is under way.
    fn nothing_left(&self) -> bool {
        !self.reload_running.get()
            && self
                .slots
                .borrow()
                .iter()
                .all(|s| s.current.is_none() && !s.pending_restart)
    }
}

/// `n` and `noun`, plural unless `n` is 1, for log lines ("1 worker", "2 connections").
fn count(n: usize, noun: &str) -> String {
    format!("{n} {noun}{}", if n == 1 { "" } else { "s" })
}
