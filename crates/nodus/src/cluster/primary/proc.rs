//! One worker process as the primary sees it: spawning it, its channel's messages, its state.
//!
//! Invariants:
//! - A `Proc` is created by [`Proc::spawn`] and lives in `State::procs` until its exit has been
//!   handled (`supervise::on_exit`); its tasks (exit watcher, message dispatch) end with it.
//! - A worker's environment holds `LISTEN_FDS`/`LISTEN_PID`/`LISTEN_FDNAMES` only when the
//!   primary passes it its own listeners (`server::pass_listeners`): inherited ones, meant for
//!   this process or another, are removed.
//! - A worker's program, an ELF file, is executed with `execve` alone
//!   ([`Command::no_shell_for_elf`]): one the kernel refuses (`ENOEXEC`: another architecture
//!   with no `binfmt_misc` emulator) fails the spawn, where `execvp` would run `/bin/sh` on it.
//! - A worker leads its own process group (pgid = its pid), and whatever is left of that group
//!   is SIGKILLed when the worker exits, before it is reaped ([`Command::group_exit_signal`]):
//!   by the time `on_exit` runs, no process of its group is left but ones dying of SIGKILL.
//! - The primary's orphan guard, if any, remembers the worker's group from right after the spawn
//!   until that group kill (it forgets it then, before the reap: [`Child::guard_group`]), so the
//!   group is killed even if the primary is killed with SIGKILL.
//! - `state` only moves forward: Starting → Online → Listening → Ready → Draining → Dead (a
//!   step may be skipped).
//! - `pending` holds the primary's reference to every connection handed to this worker and not
//!   yet taken (posted on its `board`, a `took`, or `accepted` from a Node worker); whatever is
//!   left when the worker dies, or is taken back once it is stalled (the primary waited
//!   `handoff::HANDOFF_DEADLINE` for its loop), is handed to another.
//! - `board` is set at most once, before the answer to the worker's first `queryServer` that
//!   asked for one; `refusals_seen` counts the `refused` messages handled (a board release waits
//!   until it matches the board's count).
//! - `output` is the worker's captured stdout and stderr (`captured`): the tasks copying them,
//!   waited for after the exit ([`Proc::output_ended`]), and what their reads tell (the early
//!   kill signal of a Node worker's stop waits while it may still hold output).
//! - Every worker, plain program or not, gets a `NOTIFY_SOCKET` of its own (never the
//!   primary's: a service manager's), which heeds only the worker's process group (`READY=1`:
//!   ready, under any [`Readiness`]; `STOPPING=1`: going down); what others send (any local
//!   user can reach an abstract socket) is counted and said once a minute at most. It is read
//!   one last time when the worker has exited, before the exit is handled: whatever the worker
//!   sent before it exited (its launcher's exec failure, [`report_exec_failure`]) is heeded
//!   first.
//! - What a worker left in its process group at its exit, SIGKILLed then, is one WARN line and
//!   the exit event's `group_killed` ([`killed_what_it_left`]), unless the primary had SIGKILLed
//!   the group itself. Any signal the primary sends a worker but SIGKILL, SIGCONT and the stop
//!   signals is followed by SIGCONT ([`Proc::signal`]).
//! - `asked_for_snapshots` is set once the worker says it speaks nodus's own messages and
//!   cleared when its channel ends (its snapshot, `answered_last` and `unanswered` with it): the
//!   stats, readyz and routing ask a worker only while it can answer, so one that does not answer
//!   is stalled, never a Node worker or a plain program. `speaks_nodus` is set with it and never
//!   cleared (a nodus worker, not a Node one); `channel_ended` is set when the channel's reader
//!   ends.
//! - `heard_ns` is when a message from the worker was last handled (either stream of its
//!   channel), stamped after the message: a sign its loop ran (`handoff::heard_from`).
//! - `listeners` holds the keys of the listeners `queryServer` answers gave the worker, each
//!   until its `close` (one per key: a Node worker asks each key once, its `index` telling two
//!   `listen`s on one address apart; a nodus worker sends one `close` when its last claim on
//!   the key goes): what `server` counts a listener's holders by. A `close` that leaves a
//!   worker that does not speak nodus (a Node worker) none, the
//!   primary not having asked it to stop, the worker ready and up the restart policy's
//!   `min_uptime` (not probing a port at its start), is a "going down" notice
//!   (`supervise::closed_last_listener`): Node sends `close` for each server a worker closes,
//!   whatever the policy, and `cluster.worker.disconnect()` closes them all. A nodus worker says
//!   it is going down itself, and may close its listener to listen again.
//! - Application messages (`process.send()`) are not handled (no JavaScript runs here): each is
//!   a `message` event (whose JSON the event log keeps up to `MESSAGE_LOG_MAX`), the first of the
//!   run logged at INFO saying so, the rest at DEBUG. Its channel's errors (a frame that is not
//!   JSON or over the cap, stray fds: dropped by the channel, which logs nothing) are one WARN
//!   line, then counted: one line per `log_limit::WINDOW` while they last ([`channel_errors`]).
//! - What a worker asks for is answered only while it reads its channel ([`Proc::may_answer`]:
//!   less than [`REPLY_BACKLOG`] bytes and [`REPLY_HANDLES`] handles of the primary's wait
//!   there unread); otherwise the request is dropped, with one warning per stretch, so a worker
//!   that asks and never reads cannot grow the primary's memory or spend its fds. Its stats
//!   requests are answered by one task at a time, in batches (at most [`MAX_STATS_WAITING`]
//!   waiting): a flood of them costs one document at a time, made to fit one frame
//!   ([`stats_text_budget`]).
//! - A worker not ready after `ready_timeout` for want of what its readiness waits for is warned
//!   about once: under `Readiness::Listening` one with a channel that has not sent `listening`,
//!   under `Readiness::Message` one that has not said it is ready; never a reload's new worker
//!   (not yet its slot's current one: the reload says why it was not ready, in its own line),
//!   nor one that has exited by then, reaped or not (`Child::has_exited`).

use std::cell::{Cell, OnceCell, RefCell};
use std::collections::{HashMap, HashSet};
use std::future::{Future, poll_fn};
use std::io;
use std::os::fd::AsRawFd;
use std::pin::pin;
use std::rc::Rc;
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use super::captured::{self, Captured, OUTPUT_EOF_WAIT};
use super::handoff::{self, Pending};
use super::server;
use super::{EventKind, Readiness, State, stats, supervise};
use crate::cluster::board::Board;
use crate::cluster::protocol::{Ack, Incoming, NODE_CLUSTER, Nodus};
use crate::cluster::reply::ReplySlot;
use crate::cluster::worker;
use crate::ipc::{Channel, ChannelOptions, IpcError, Message};
use crate::log_limit::{self, LogLimit};
use crate::metrics::Snapshot;
use crate::notify::{NotifyMessage, NotifySocket};
use crate::process::{Child, Command, ExitStatus, Stdio};
use crate::signal::SIGKILL;
use rustix::process::Pid;
use serde_json::value::RawValue;

/// A worker's channel with this many bytes unwritten (it does not read) gets no more answers to
/// its requests ([`Proc::may_answer`]): a frame's worth, more than any one answer.
pub(super) const REPLY_BACKLOG: usize = crate::ipc::DEFAULT_MAX_FRAME;

/// Nor one with this many handles it has not ACKed, each holding an fd of the primary's: more
/// than a worker that reads its channel can have waiting there, a listener for every key the
/// primary keeps (a Node program's `listen` calls of one tick all answered under `shared`, where
/// Node's channel sends one handle per ACK) plus twice what its handoffs may leave there.
pub(super) const REPLY_HANDLES: usize =
    server::MAX_KEYS + 2 * super::balance::MAX_IN_FLIGHT as usize;

/// A worker's stats requests waiting for the next document at most; more are dropped (their
/// sender times out).
const MAX_STATS_WAITING: usize = 64;

/// The room a `stats_reply` frame has for its `text` (the document, JSON-escaped): the frame
/// cap less the rest of the message, with the longest id. A document that would take more
/// leaves worker snapshots out (`stats::stats_json_relayed`): a reply past the cap could not be
/// sent at all, and the worker would wait for it in vain.
fn stats_text_budget() -> usize {
    let mut reply = Nodus::act("stats_reply");
    reply.id = Some(u64::MAX);
    reply.text = Some("");
    let rest = serde_json::to_string(&reply).expect("a reply serializes");
    crate::ipc::DEFAULT_MAX_FRAME - rest.len()
}

/// The lowest fd number a pinned program is kept at: above every fd a worker gets at a fixed
/// number (stdio, listeners from 3, the channel after them), which the child's `dup2`s would
/// put in its place before the `exec`.
const PIN_FD_MIN: i32 = 100;

/// With [`Config::pin_program`](super::Config::pin_program), opens the program (`O_PATH`) for
/// the workers of `generation` (see there for what is left to its path). One open and a
/// two-byte read (is it a script?) on the loop: once per generation, beside its forks.
pub(super) fn pin_program(st: &State, generation: u64) {
    let program = &st.config.command.program;
    if !st.config.pin_program || !program.as_os_str().as_encoded_bytes().contains(&b'/') {
        return;
    }
    let flags = rustix::fs::OFlags::PATH | rustix::fs::OFlags::CLOEXEC;
    let Ok(opened) = rustix::fs::open(program, flags, rustix::fs::Mode::empty()) else {
        return;
    };
    let Ok(fd) = rustix::io::fcntl_dupfd_cloexec(&opened, PIN_FD_MIN) else {
        return;
    };
    // The same file, opened for reading through the one held (unreadable: no script either,
    // an interpreter could not read it).
    let mut head = [0u8; 2];
    let script = std::fs::File::open(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .and_then(|mut f| io::Read::read_exact(&mut f, &mut head))
        .is_ok_and(|()| head == *b"#!");
    if !script {
        st.pinned.borrow_mut().push((generation, fd));
    }
}

/// Keeps the pinned programs of the generations `keep` says, closes the others.
pub(super) fn unpin(st: &State, keep: impl Fn(u64) -> bool) {
    st.pinned.borrow_mut().retain(|(g, _)| keep(*g));
}

/// The path a worker of `generation` is executed through when its program is pinned.
fn pinned_path(st: &State, generation: u64) -> Option<std::ffi::OsString> {
    let pinned = st.pinned.borrow();
    let (_, fd) = pinned.iter().find(|(g, _)| *g == generation)?;
    // Above every fixed target of this spawn (see `PIN_FD_MIN`).
    let highest_target = 3 + st.prebound.borrow().len() as i32;
    (fd.as_raw_fd() > highest_target).then(|| format!("/proc/self/fd/{}", fd.as_raw_fd()).into())
}

/// Where a worker is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum ProcState {
    Starting,
    Online,
    Listening,
    Ready,
    Draining,
    Dead,
}

/// A worker's answer to a snapshot request: when it came, and the snapshot's JSON as sent.
pub(super) type SnapshotAnswer = (Instant, String);

/// Longest reason a worker gives for not taking work ([`Proc::unready`]) that is kept.
pub(super) const MAX_UNREADY: usize = 256;

pub(super) struct Proc {
    pub unique: u64,
    pub slot: u32,
    pub generation: u64,
    pub pid: u32,
    pub child: Child,
    pub channel: Option<Channel>,
    pub started: Instant,
    /// When it became ready ([`mark_ready`]): an orphaned listener's grace counts from it
    /// (`server::release_orphans`).
    pub ready_at: Cell<Option<Instant>>,
    pub state: Cell<ProcState>,
    changed: RefCell<Vec<Waker>>,
    pub exited_after_disconnect: Cell<bool>,
    /// The primary asked it to stop (drain, reload, shutdown).
    pub drained: Cell<bool>,
    /// It was still running `DRAIN_GRACE` after its drain deadline and got the kill signal then
    /// (`supervise::arm_kill_timer`): its exit is logged, whatever the phase.
    pub termed_past_deadline: Cell<bool>,
    /// The signals the primary sent it (bit N: signal N; [`Proc::signal`]), so an exit by a
    /// signal it did not send (a crash, the OOM killer, an operator's `kill`) is told apart.
    signals_sent: Cell<u64>,
    pub going_down: Cell<bool>,
    /// The keys of the listeners it holds: a `queryServer` answer gave it one, and it has not
    /// closed it since (see [`Proc::closed_listener`]).
    listeners: RefCell<HashSet<String>>,
    /// Handoffs not yet taken, with the primary's reference to each connection.
    pub pending: Pending,
    /// The page a nodus worker posts taken batches and its load on.
    pub board: OnceCell<Board>,
    /// `refused` messages handled.
    pub refusals_seen: Cell<u64>,
    /// When it last refused a handoff (it gets none for a moment after).
    pub refused_at: Cell<Option<Instant>>,
    /// It gave back an fd that was not a connection of the listener (logged once per process).
    pub gave_back_bad_fd: Cell<bool>,
    /// Connections this worker accepted from the primary.
    pub handed: Cell<u64>,
    /// Connections handed to it that the primary took back once it was stalled.
    pub taken_back: Cell<u64>,
    /// Batches below this `seq` were taken back from it and it has not seen them all yet (its
    /// board's `seen_below`): it gets no new connections until it has, or sends a message.
    pub behind_until: Cell<Option<u64>>,
    /// Its stall was logged (`handoff::take_back`); cleared, with a line, once it runs again.
    pub stall_said: Cell<bool>,
    /// Whether its process was stopped, and the loop clock (ns) it was looked at
    /// ([`Proc::is_stopped`]).
    stopped_seen: Cell<Option<(u64, bool)>>,
    /// The same, summed over every worker of its slot (see `Slot::taken`).
    pub slot_taken: Rc<Cell<u64>>,
    /// The worker's last load report: (open connections, accepted in total).
    pub reported: Cell<Option<(u64, u64)>>,
    /// Its last loop snapshot (JSON, and parsed) and when it came: kept while it misses
    /// requests (served with its age, `answered_last` false), cleared when it sends one that is
    /// refused (`stats::checked`) or its channel ends.
    pub snapshot: RefCell<Option<(Instant, String, Snapshot)>>,
    /// A snapshot it sent after its request's wait had run out, and when it came (unchecked):
    /// newer than `snapshot`, taken for it when the next request goes unanswered too. Only an
    /// answer to a request made: its id at most `snapshot_asked`.
    pub late_snapshot: RefCell<Option<SnapshotAnswer>>,
    /// The id of the last request that asked it for a snapshot (not a probe); 0 before one.
    pub snapshot_asked: Cell<u64>,
    /// It sent a snapshot that was refused (logged once per process).
    pub bad_snapshot_said: Cell<bool>,
    /// Its stats requests waiting for the next document (`id`, and whether it asks for the
    /// metrics), at most [`MAX_STATS_WAITING`]; `stats_running` while a task makes documents
    /// for them; `stats_dropped_said` once a request was dropped for want of room (until the
    /// next batch).
    stats_waiting: RefCell<Vec<(Option<u64>, bool)>>,
    stats_running: Cell<bool>,
    stats_dropped_said: Cell<bool>,
    /// An answer to one of its requests was dropped for its backlog ([`Proc::may_answer`]) and
    /// not one sent since.
    answers_refused: Cell<bool>,
    /// It answers snapshot requests, so the primary asks it: it said it speaks nodus's own
    /// messages (`nodus: 1` in its `online` or `queryServer`, or any `NODE_NODUS` message) and
    /// its channel has not ended. A Node worker never answers them; a plain program has no
    /// channel.
    pub asked_for_snapshots: Cell<bool>,
    /// It said it speaks nodus's own messages (as above), ever: a nodus worker, not a Node one.
    pub speaks_nodus: Cell<bool>,
    /// Whether it answered the primary's last snapshot request: `None` while it is not asked
    /// (see `asked_for_snapshots`) or before its first request, else `Some(false)` while it
    /// misses, whether or not it ever answered one.
    pub answered_last: Cell<Option<bool>>,
    /// The oldest snapshot request it has not answered: its id and when it was sent (the loop's
    /// time, ns). One left unanswered for the handoff deadline, with nothing heard from it
    /// meanwhile, means its loop is stalled (`stats::loop_stalled`, for routing and readyz);
    /// cleared by an answer to it or a later one.
    pub unanswered: Cell<Option<(u64, u64)>>,
    /// When a message from it was last handled (the loop's time, ns; 0 before the first).
    pub heard_ns: Cell<u64>,
    /// Why it cannot take work, as its last answer to a snapshot request or probe said
    /// (`pool io: no thread could be started`: `pool::start_failure`), at most
    /// [`MAX_UNREADY`] bytes; `None` when it said nothing (an older build never does). Readyz
    /// counts it as not taking connections (`Primary::ready_state`).
    pub unready: RefCell<Option<String>>,
    /// When the primary last asked it for a snapshot (the loop's time, ns).
    pub asked_ns: Cell<Option<u64>>,
    /// The snapshot requests `stats::ask_all` awaits, by id: each filled with the answer and
    /// when it came.
    pub snapshot_waiters: RefCell<HashMap<u64, ReplySlot<SnapshotAnswer>>>,
    pub exit_status: Cell<Option<ExitStatus>>,
    /// Filled when the reader of its channel has handled the last message (the channel ended).
    pub channel_done: ReplySlot<()>,
    /// Its channel ended (set as `channel_done` is filled; read by `conns::until_idle`).
    pub channel_ended: Cell<bool>,
    /// Its captured stdout and stderr (when prefixed).
    pub output: Rc<Captured>,
    /// A plain program's launcher could not execute the program ([`report_exec_failure`]):
    /// its errno and message.
    pub exec_failed: RefCell<Option<(i32, String)>>,
    /// Notify datagrams from outside its process group ignored, and the limit on the lines
    /// saying so ([`ignored_notify`]).
    notify_ignored: Cell<u64>,
    notify_ignored_said: OnceCell<Rc<LogLimit>>,
    /// How many processes were left in its process group at its exit, SIGKILLed then (not
    /// counted when the primary had SIGKILLed the group itself): [`killed_what_it_left`].
    pub group_killed: Cell<usize>,
}

impl Proc {
    /// Starts the current generation's worker for `slot`.
    pub fn spawn(st: &Rc<State>, slot: u32, generation: u64) -> io::Result<Rc<Proc>> {
        // The fds the primary keeps for this, free until the spawn is done (`fd_reserve`).
        let _room = st.fd_reserve.make_room();
        let cfg = &st.config.command;
        let unique = st.next_unique.get();
        st.next_unique.set(unique + 1);
        let pinned = pinned_path(st, generation);
        let mut cmd = Command::new(pinned.as_deref().unwrap_or(cfg.program.as_os_str()));
        if pinned.is_some() {
            cmd.arg0(&cfg.program);
        }
        // Sockets a service manager passed to this process, or variables inherited from a
        // parent they were meant for, are not the worker's: it sees `LISTEN_*` only when
        // `pass_listeners` passes it the cluster's own (sd_listen_fds's `unset_environment`).
        for var in server::LISTEN_VARS {
            cmd.env_remove(var);
        }
        cmd.args(&cfg.args)
            .envs(cfg.env.iter().map(|(k, v)| (k, v)))
            .env("NODUS_WORKER_ID", slot.to_string())
            .env("NODE_APP_INSTANCE", (slot - 1).to_string())
            .stdin(Stdio::Null)
            .stdout(Stdio::Inherit)
            .stderr(Stdio::Inherit)
            // Its own group: a terminal's Ctrl-C reaches the primary only, which drains the
            // workers; the worker's whole group can be killed at once; and once the worker has
            // exited, for any reason, what is left of its group is killed (systemd's
            // `KillMode=mixed`): no child of a worker outlives it.
            .process_group(0)
            .group_exit_signal(Some(SIGKILL))
            .parent_death_signal(Some(SIGKILL))
            // An ELF program the kernel refuses (another architecture) is a spawn error, not a
            // worker of `/bin/sh` reading machine code, crash after crash.
            .no_shell_for_elf(true);
        // `NODE_UNIQUE_ID` says "a cluster worker, with a channel to its primary" (to Node and to
        // nodus alike): only a worker that has the channel gets it. A plain program (fds from 3)
        // with it would take itself for a cluster worker: Node's `listen` then asks a primary
        // that is not there, and exits.
        if cfg.ipc {
            cmd.env("NODE_UNIQUE_ID", unique.to_string())
                .env(worker::NODUS_PRIMARY_ENV, "1")
                .ipc(ChannelOptions::default());
        } else {
            cmd.env_remove("NODE_UNIQUE_ID");
            server::pass_listeners(st, &mut cmd)?;
        }
        // Every worker gets a `NOTIFY_SOCKET` of its own, never the primary's (a service
        // manager's): a worker's `READY=1` or `STOPPING=1` (a Node app's `sd-notify`) is about
        // the worker, not the service.
        let notify_socket = NotifySocket::bind_unique()?;
        cmd.env("NOTIFY_SOCKET", notify_socket.env_value());
        if st.config.prefix_output {
            cmd.stdout(Stdio::Pipe).stderr(Stdio::Pipe);
        }
        let mut child = cmd.spawn()?;
        // The guard remembers the worker's group from now until the group is killed at the
        // worker's exit (it forgets it then, before the reap).
        if let Some(guard) = &st.guard {
            child.guard_group(guard);
        }
        let output = match st.config.prefix_output {
            true => {
                let prefix = format!("[worker {slot} {}] ", child.id());
                Captured::start(&mut child, &prefix, st.config.raw_output)
            }
            false => Captured::default(),
        };
        let channel = child.channel.take();
        let proc = Rc::new(Proc {
            unique,
            slot,
            generation,
            pid: child.id(),
            child,
            channel,
            started: Instant::now(),
            ready_at: Cell::new(None),
            state: Cell::new(ProcState::Starting),
            changed: RefCell::default(),
            exited_after_disconnect: Cell::new(false),
            drained: Cell::new(false),
            termed_past_deadline: Cell::new(false),
            signals_sent: Cell::new(0),
            going_down: Cell::new(false),
            listeners: RefCell::default(),
            pending: Pending::default(),
            board: OnceCell::new(),
            refusals_seen: Cell::new(0),
            refused_at: Cell::new(None),
            gave_back_bad_fd: Cell::new(false),
            handed: Cell::new(0),
            taken_back: Cell::new(0),
            behind_until: Cell::new(None),
            stall_said: Cell::new(false),
            stopped_seen: Cell::new(None),
            slot_taken: st.slots.borrow()[slot as usize - 1].taken.clone(),
            reported: Cell::new(None),
            snapshot: RefCell::new(None),
            late_snapshot: RefCell::new(None),
            snapshot_asked: Cell::new(0),
            bad_snapshot_said: Cell::new(false),
            stats_waiting: RefCell::default(),
            stats_running: Cell::new(false),
            stats_dropped_said: Cell::new(false),
            answers_refused: Cell::new(false),
            asked_for_snapshots: Cell::new(false),
            speaks_nodus: Cell::new(false),
            answered_last: Cell::new(None),
            unanswered: Cell::new(None),
            unready: RefCell::new(None),
            heard_ns: Cell::new(0),
            asked_ns: Cell::new(None),
            snapshot_waiters: RefCell::default(),
            exit_status: Cell::new(None),
            channel_done: ReplySlot::new(),
            channel_ended: Cell::new(false),
            output: Rc::new(output),
            exec_failed: RefCell::new(None),
            notify_ignored: Cell::new(0),
            notify_ignored_said: OnceCell::new(),
            group_killed: Cell::new(0),
        });
        if cfg.ipc {
            // `spawn` returned only once the program was executed.
            st.program_ran.set(true);
        }
        st.procs.borrow_mut().insert(unique, proc.clone());
        st.emit(
            Some(&proc),
            EventKind::Fork {
                generation: proc.generation,
            },
        );
        let notify_socket = Rc::new(notify_socket);
        let (s, p, last_look) = (st.clone(), proc.clone(), notify_socket.clone());
        crate::task::spawn_named("cluster:exit", async move {
            let status = p.child.wait().await;
            killed_what_it_left(&s, &p);
            // What the worker said before it exited is heeded before its exit (its launcher's
            // exec failure above all): the notify task may not have read it yet.
            loop {
                match last_look.try_recv() {
                    Ok(Some(m)) => on_notify(&s, &p, m),
                    Err(e) if e.kind() == io::ErrorKind::InvalidData => {}
                    Ok(None) | Err(_) => break,
                }
            }
            supervise::on_exit(&s, &p, status);
        })
        .detach();
        if proc.channel.is_some() {
            let (s, p) = (st.clone(), proc.clone());
            crate::task::spawn_named("cluster:primary", async move {
                let channel = p.channel.as_ref().expect("checked");
                while let Some(msg) = channel.recv_internal().await {
                    on_internal(&s, &p, msg);
                    handoff::heard_from(&s, &p);
                }
                // No longer asked: neither figures nor a stall to show for it.
                p.asked_for_snapshots.set(false);
                p.answered_last.set(None);
                p.unanswered.set(None);
                *p.snapshot.borrow_mut() = None;
                *p.late_snapshot.borrow_mut() = None;
                s.emit(Some(&p), EventKind::Disconnect);
                handoff::channel_ended(&s, &p);
                p.channel_ended.set(true);
                p.channel_done.fill(());
            })
            .detach();
            let (s, p) = (st.clone(), proc.clone());
            crate::task::spawn_named("cluster:messages", async move {
                let channel = p.channel.as_ref().expect("checked");
                let errors = channel_errors(&p);
                while let Some(msg) = channel.recv().await {
                    match msg {
                        Ok(msg) => on_user_message(&s, &p, &msg),
                        Err(IpcError::HandleNotReceived(sent)) => not_received(&s, &p, &sent),
                        Err(e) => {
                            if errors.first(|| e.to_string()) {
                                tracing::warn!(
                                    target: "nodus::cluster",
                                    "worker {} (pid {}): channel error: {e} (further errors are \
                                     counted: one line per {:?})",
                                    p.slot, p.pid, log_limit::WINDOW
                                );
                            }
                        }
                    }
                    handoff::heard_from(&s, &p);
                }
            })
            .detach();
        }
        let (s, p, socket) = (st.clone(), proc.clone(), notify_socket);
        socket.unref();
        crate::task::spawn_named("cluster:notify", async move {
            // Ends when the worker exits, not at a next message; the exit task takes a last
            // look at the socket, which closes then.
            let mut exited = pin!(p.child.wait());
            loop {
                let mut message = pin!(socket.recv());
                let next = poll_fn(|cx| match exited.as_mut().poll(cx) {
                    Poll::Ready(_) => Poll::Ready(None),
                    Poll::Pending => message.as_mut().poll(cx).map(Some),
                })
                .await;
                match next {
                    None => return,
                    Some(Ok(m)) => on_notify(&s, &p, m),
                    Some(Err(e)) => tracing::debug!(
                        target: "nodus::cluster",
                        "worker {} (pid {}): bad notify message: {e}", p.slot, p.pid
                    ),
                }
            }
        })
        .detach();
        warn_if_never_ready(st, &proc);
        if let Readiness::Alive(after) | Readiness::ListeningOrAlive(after) = st.config.readiness {
            let (s, p) = (st.clone(), proc.clone());
            crate::task::spawn_named("cluster:alive", async move {
                crate::time::sleep(after.max(Duration::from_millis(1))).await;
                if p.state.get() < ProcState::Ready {
                    mark_ready(&s, &p);
                }
            })
            .detach();
        }
        Ok(proc)
    }

    /// Waits until its captured stdout and stderr reached end of file and their last lines were
    /// written out, at most [`OUTPUT_EOF_WAIT`]; the copying goes on after that, and the end of
    /// the run waits for it again (`captured::drain_left`).
    pub async fn output_ended(&self, st: &State) {
        if !self.output.ended(OUTPUT_EOF_WAIT).await {
            captured::keep_if_running(st, self.output.clone());
        }
    }

    pub fn is_ready(&self) -> bool {
        self.state.get() == ProcState::Ready
    }

    pub fn is_alive(&self) -> bool {
        self.state.get() != ProcState::Dead
    }

    /// Sends `signal` to the worker (`group`: to its whole process group, until its reap) and
    /// records that the primary sent it. Any signal but SIGKILL, SIGCONT and the stop signals
    /// (a caller's SIGSTOP or SIGTSTP pauses the worker) is followed by SIGCONT to the same
    /// target, as systemd's `kill_and_sigcont` does: a stopped worker
    /// (SIGSTOP, a debugger, a frozen cgroup) could not act on it, and would wait out the kill
    /// timeout for a SIGKILL.
    pub fn signal(&self, signal: i32, group: bool) -> io::Result<()> {
        self.signals_sent
            .set(self.signals_sent.get() | 1u64.checked_shl(signal as u32).unwrap_or(0));
        let send = |signal| match group {
            true => self.child.kill_group(signal),
            false => self.child.kill(signal),
        };
        send(signal)?;
        if !matches!(
            signal,
            SIGKILL | libc::SIGCONT | libc::SIGSTOP | libc::SIGTSTP | libc::SIGTTIN | libc::SIGTTOU
        ) {
            let _ = send(libc::SIGCONT);
        }
        Ok(())
    }

    /// Whether the primary sent it `signal` ([`Proc::signal`]).
    pub fn was_sent(&self, signal: i32) -> bool {
        self.signals_sent.get() & 1u64.checked_shl(signal as u32).unwrap_or(0) != 0
    }

    /// Moves to `state` if that is forward; wakes every waiter.
    pub fn advance(&self, state: ProcState) {
        if state > self.state.get() {
            self.state.set(state);
            for w in self.changed.borrow_mut().drain(..) {
                w.wake();
            }
        }
    }

    /// Waits until `state` is reached (or passed), or `limit` elapses; returns the state then.
    pub async fn wait_for(&self, state: ProcState, limit: Duration) -> ProcState {
        let reached = poll_fn(|cx| {
            if self.state.get() >= state {
                Poll::Ready(())
            } else {
                self.changed.borrow_mut().push(cx.waker().clone());
                Poll::Pending
            }
        });
        let _ = crate::time::timeout(limit, reached).await;
        self.state.get()
    }

    /// Sends a message on the channel, logging a failure (a dying worker's channel fails).
    pub fn send<T: serde::Serialize>(&self, msg: &T) {
        if let Some(ch) = &self.channel
            && let Err(e) = ch.send(msg)
        {
            tracing::debug!(target: "nodus::cluster", "worker {} (pid {}): {e}", self.slot, self.pid);
        }
    }

    /// A `queryServer` answer gave it a listener for `key`.
    pub fn gave_listener(&self, key: &str) {
        self.listeners.borrow_mut().insert(key.to_owned());
    }

    /// It closed its listener for `key` (a `close`): whether that was the last listener it held.
    /// A key it was given no listener for changes nothing.
    pub fn closed_listener(&self, key: &str) -> bool {
        let mut held = self.listeners.borrow_mut();
        held.remove(key) && held.is_empty()
    }

    /// Whether it holds a listener for `key` (given, not closed).
    pub fn holds(&self, key: &str) -> bool {
        self.listeners.borrow().contains(key)
    }

    /// The keys of the listeners it holds.
    pub fn held_keys(&self) -> Vec<String> {
        self.listeners.borrow().iter().cloned().collect()
    }

    /// Whether an answer to one of the worker's own requests may be queued on its channel: not
    /// while [`REPLY_BACKLOG`] bytes or [`REPLY_HANDLES`] handles wait there unread (a worker that
    /// asks and never reads the answers cannot make the primary hold memory and fds without
    /// bound). The first refusal of a stretch is logged.
    pub fn may_answer(&self) -> bool {
        let Some(ch) = &self.channel else {
            return false;
        };
        let (bytes, handles) = (ch.queued_bytes(), ch.handles_waiting());
        if bytes < REPLY_BACKLOG && handles < REPLY_HANDLES {
            self.answers_refused.set(false);
            return true;
        }
        if !self.answers_refused.replace(true) {
            tracing::warn!(
                target: "nodus::cluster",
                "worker {} (pid {}) does not read its channel ({bytes} bytes and {handles} handles \
                 wait there): its requests are dropped unanswered until it does",
                self.slot, self.pid
            );
        }
        false
    }

    /// Sends an answer to one of the worker's own requests, unless [`Proc::may_answer`] says no.
    pub fn answer<T: serde::Serialize>(&self, msg: &T) {
        if self.may_answer() {
            self.send(msg);
        }
    }

    /// Whether its process is stopped (`SIGSTOP`, a debugger: its `/proc` state), looked at
    /// once per value of the loop clock `clock` (a dispatch pass that hands a burst runs on one
    /// value). A process that cannot be looked at is not stopped.
    pub fn is_stopped(&self, clock: u64) -> bool {
        if let Some((at, stopped)) = self.stopped_seen.get()
            && at == clock
        {
            return stopped;
        }
        let stopped = crate::process::stat::read(self.pid as i32).is_some_and(|s| s.is_stopped());
        self.stopped_seen.set(Some((clock, stopped)));
        stopped
    }

    /// Estimated open connections (for `least`).
    pub fn load_estimate(&self) -> u64 {
        let in_flight = self.pending.conns();
        let reported = self
            .board
            .get()
            .and_then(Board::load)
            .or(self.reported.get());
        match reported {
            Some((open, accepted_total)) => {
                // Numbers a worker reports: saturating, whatever it says.
                open.saturating_add(self.handed.get().saturating_sub(accepted_total))
                    .saturating_add(in_flight)
            }
            None => in_flight,
        }
    }
}

/// What was left of `proc`'s process group at its exit was SIGKILLed (systemd's
/// `KillMode=mixed`): when that was a process or more (the primary had not SIGKILLed the group
/// itself), one WARN line names them, and the exit event counts them (`group_killed`). The
/// usual cause is a wrapper script (`sh -c 'app; echo done'`, a `start.sh` without `exec`): the
/// kill signal reached the shell, and the program it ran got no chance to stop gracefully.
fn killed_what_it_left(st: &State, proc: &Proc) {
    let left = proc.child.left_in_group();
    if left.is_empty() || proc.was_sent(SIGKILL) {
        return;
    }
    proc.group_killed.set(left.len());
    let mut named: Vec<String> = left
        .iter()
        .take(3)
        .map(|(pid, name)| format!("pid {pid} ({name})"))
        .collect();
    if left.len() > 3 {
        named.push(format!("{} more", left.len() - 3));
    }
    let n = match left.len() {
        1 => "1 process".to_owned(),
        n => format!("{n} processes"),
    };
    tracing::warn!(
        target: "nodus::cluster",
        "worker {} (pid {}) exited and left {} in its process group {}: SIGKILLed {}; a \
         wrapper script should `exec` its program, so that the program gets {} itself",
        proc.slot,
        proc.pid,
        n,
        proc.pid,
        named.join(", "),
        crate::signal::name(st.config.kill_signal)
    );
}

/// The key of the notice a plain program's launcher sends when it cannot execute the program
/// (the errno; [`EXEC_FAILED_MESSAGE`] says it in words).
const EXEC_FAILED: &str = "NODUS_EXEC_FAILED";
const EXEC_FAILED_MESSAGE: &str = "NODUS_EXEC_FAILED_MESSAGE";

/// For the launcher a plain program's worker runs first (`nodus __exec-listen`): tells the
/// primary, through the worker's `NOTIFY_SOCKET`, that it could not execute the program
/// (`error`), with the line to log (`message`). The primary logs it (no worker line is needed),
/// and if no worker has run the program yet, an error that says the program is not there or
/// cannot be executed (`ENOENT`, `EACCES`, `ENOEXEC`, ...) ends the run with exit code 1 instead
/// of spending the restart budget. `Ok(false)` without a `NOTIFY_SOCKET`.
///
/// # Errors
/// The notice cannot be sent.
pub fn report_exec_failure(error: &io::Error, message: &str) -> io::Result<bool> {
    let message = message.replace('\n', " ");
    crate::notify::notify(&format!(
        "{EXEC_FAILED}={}\n{EXEC_FAILED_MESSAGE}={message}",
        error.raw_os_error().unwrap_or(0)
    ))
}

/// A notify datagram from `proc`'s socket: `READY=1` marks it ready (whatever the
/// [`Readiness`]: the worker says so itself), `STOPPING=1` is its "going down" notice.
fn on_notify(st: &Rc<State>, proc: &Rc<Proc>, m: NotifyMessage) {
    if !from_worker(proc, m.sender_pid) {
        ignored_notify(st, proc, m.sender_pid);
        return;
    }
    let field = |key: &str| m.other.iter().find(|(k, _)| k == key).map(|(_, v)| v);
    if let Some(errno) = field(EXEC_FAILED) {
        let message = field(EXEC_FAILED_MESSAGE).map_or("cannot run the program", |v| v);
        *proc.exec_failed.borrow_mut() = Some((errno.parse().unwrap_or(0), message.to_owned()));
    } else if m.ready {
        mark_ready(st, proc);
    } else if m.stopping {
        supervise::going_down(st, proc);
    }
}

/// A worker's channel errors (a bad frame, stray fds: what its channel drops and reports, itself
/// logging nothing) are logged once, then counted: one line per [`log_limit::WINDOW`] while they
/// last, so a worker writing junk to its channel is no flood of lines.
fn channel_errors(proc: &Proc) -> Rc<LogLimit> {
    let (slot, pid) = (proc.slot, proc.pid);
    LogLimit::new(log_limit::WINDOW, move |n, last| {
        tracing::warn!(
            target: "nodus::cluster",
            "worker {slot} (pid {pid}): {n} more channel errors in the last {:?} (the last: \
             {last})",
            log_limit::WINDOW
        );
    })
}

/// At most this often a worker's notify socket says again that it ignored datagrams from
/// outside its process group ([`ignored_notify`]).
const NOTIFY_IGNORED_EVERY: Duration = Duration::from_secs(60);

/// A notify datagram from outside `proc`'s process group (anyone who can reach the abstract
/// socket: any local user): ignored and counted (`notify_ignored` in the stats). Its first is one
/// WARN line; later ones are counted and said once a minute at most, with their count
/// (`log_limit`), so a flood of them is no flood of lines.
fn ignored_notify(st: &State, proc: &Proc, sender: Option<u32>) {
    let n = proc.notify_ignored.get() + 1;
    proc.notify_ignored.set(n);
    st.notify_ignored.set(st.notify_ignored.get() + 1);
    let from = sender.map_or_else(|| "an unknown pid".to_owned(), |pid| format!("pid {pid}"));
    let (slot, pid) = (proc.slot, proc.pid);
    let limit = proc.notify_ignored_said.get_or_init(|| {
        LogLimit::new(NOTIFY_IGNORED_EVERY, move |more, last| {
            tracing::warn!(
                target: "nodus::cluster",
                "worker {slot} (pid {pid}): ignored {more} more notify messages from outside its \
                 process group in {}s (the last from {last})",
                NOTIFY_IGNORED_EVERY.as_secs()
            );
        })
    });
    if limit.first(|| from.clone()) {
        tracing::warn!(
            target: "nodus::cluster",
            "worker {slot} (pid {pid}): ignored a notify message from {from}, outside its process \
             group (more are counted in the stats' notify_ignored, and said once a minute at most)"
        );
    }
}

/// Whether a notify datagram came from `proc` or a process of its group (a worker leads its own
/// group, so a wrapper script's child counts). The socket's name is visible to every local user
/// (`/proc/net/unix`): anyone else's `READY=1` or `STOPPING=1` is ignored.
fn from_worker(proc: &Proc, sender: Option<u32>) -> bool {
    let Some(sender) = sender.and_then(|pid| Pid::from_raw(pid as i32)) else {
        return false;
    };
    sender.as_raw_nonzero().get() as u32 == proc.pid
        || rustix::process::getpgid(Some(sender))
            .is_ok_and(|group| group.as_raw_nonzero().get() as u32 == proc.pid)
}

/// Marks `proc` ready (once) and tells the supervisor.
pub(super) fn mark_ready(st: &Rc<State>, proc: &Rc<Proc>) {
    if proc.state.get() >= ProcState::Ready {
        return;
    }
    proc.ready_at.set(Some(Instant::now()));
    proc.advance(ProcState::Ready);
    st.program_ran.set(true);
    st.emit(Some(proc), EventKind::Ready);
    supervise::on_ready(st, proc);
}

/// A connection handed to a Node worker never arrived: its channel dropped the fd after the
/// worker NACKed it 4 times (at its open-files limit, say). A refusal: another worker gets it.
fn not_received(st: &Rc<State>, proc: &Rc<Proc>, sent: &RawValue) {
    handoff::not_received(st, proc);
    if let Some(m) = Incoming::parse(sent.get())
        && m.is_cluster()
        && m.act == Some("newconn")
        && let Some(seq) = m.seq
    {
        handoff::refused(st, proc, seq);
    }
}

fn on_internal(st: &Rc<State>, proc: &Rc<Proc>, mut msg: Message) {
    let handles = msg.take_handles();
    let Some(m) = Incoming::parse(msg.json()) else {
        let json = msg.json();
        tracing::warn!(
            target: "nodus::cluster",
            "worker {} (pid {}): ignored a cluster message that does not parse: {}",
            proc.slot, proc.pid, &json[..json.floor_char_boundary(200)]
        );
        return;
    };
    if m.is_nodus() || m.nodus == Some(1) {
        proc.asked_for_snapshots.set(true);
        proc.speaks_nodus.set(true);
    }
    if m.is_nodus() {
        if let (Some("returned"), Some(key)) = (m.act, &m.key) {
            let fds = handles.into_iter().map(|h| h.into_owned_fd()).collect();
            handoff::on_returned(st, proc, key, fds);
        } else {
            on_nodus(st, proc, &m);
        }
        return;
    }
    if !m.is_cluster() {
        return;
    }
    match m.act {
        Some("online") => {
            proc.advance(ProcState::Online);
            st.emit(Some(proc), EventKind::Online);
            if st.config.policy == super::Policy::Least {
                proc.answer(&Nodus::act("report_load"));
            }
        }
        Some("queryServer") => {
            if proc.state.get() == ProcState::Starting {
                not_set_up(proc);
            }
            server::query(st, proc, &m);
        }
        Some("listening") => {
            proc.advance(ProcState::Listening);
            let address = format!(
                "{}:{}",
                m.address.as_deref().unwrap_or("*"),
                m.port.unwrap_or(0)
            );
            st.emit(Some(proc), EventKind::Listening { address });
            if matches!(
                st.config.readiness,
                Readiness::Listening | Readiness::ListeningOrAlive(_)
            ) {
                mark_ready(st, proc);
            }
        }
        Some("close") => {
            if let Some(key) = &m.key {
                // Before connections it gives back arrive: taken ones are no longer pending.
                handoff::release_taken(proc);
                server::leave(st, proc, key);
                // A Node worker has no word for going down; a nodus worker says it (`going_down`)
                // and may close a listener to listen again.
                if proc.closed_listener(key) && !proc.speaks_nodus.get() {
                    supervise::closed_last_listener(st, proc);
                }
                // After the going-down decision: a worker on its way out closes as it leaves,
                // and its replacement asks again.
                server::closed(st, proc, key);
            }
        }
        Some("exitedAfterDisconnect") => {
            proc.exited_after_disconnect.set(true);
            if let Some(seq) = m.seq {
                proc.answer(&Ack {
                    cmd: NODE_CLUSTER,
                    ack: seq,
                    accepted: None,
                    seq: st.next_seq(),
                });
            }
        }
        None => {
            if let (Some(ack), Some(accepted)) = (m.ack, m.accepted) {
                handoff::on_accepted(st, proc, ack, accepted);
            }
        }
        Some(_) => {}
    }
}

/// A `queryServer` before `online`: a Node process that has the channel but was not set up as a
/// cluster worker (Node does that only when `process.argv[1]` is set, so not for `node -e CODE`
/// alone), whose `listen` never hears the answer; once idle it exits 0. Said as such, every time.
fn not_set_up(proc: &Proc) {
    tracing::error!(
        target: "nodus::cluster",
        "worker {} (pid {}) asked to listen before it said online: Node did not set it up as a \
         cluster worker, which it does only when process.argv[1] is set (`node -e CODE` or \
         `node -p CODE` alone has none): run a file, or give the code an argument \
         (`node -e CODE -- ARG`)",
        proc.slot, proc.pid
    );
}

fn on_nodus(st: &Rc<State>, proc: &Rc<Proc>, m: &Incoming<'_>) {
    match m.act {
        Some("took") => {
            if let Some(ack) = m.ack {
                handoff::on_took(proc, ack);
            }
            // A load report may ride along.
            if let (Some(open), Some(total)) = (m.conns, m.accepted_total) {
                proc.reported.set(Some((open, total)));
            }
        }
        Some("refused") => {
            if let Some(ack) = m.ack {
                handoff::refused(st, proc, ack);
            }
        }
        Some("ready") => mark_ready(st, proc),
        Some("going_down") => supervise::going_down(st, proc),
        Some("load") => {
            if let (Some(open), Some(total)) = (m.conns, m.accepted_total) {
                proc.reported.set(Some((open, total)));
            }
        }
        Some("snapshot") => {
            // Answered in order: every request up to this one was.
            if let (Some(id), Some((oldest, _))) = (m.id, proc.unanswered.get())
                && id >= oldest
            {
                proc.unanswered.set(None);
            }
            *proc.unready.borrow_mut() = m.text.as_deref().map(|t| {
                let mut end = t.len().min(MAX_UNREADY);
                while !t.is_char_boundary(end) {
                    end -= 1;
                }
                t[..end].to_owned()
            });
            let waiter =
                m.id.and_then(|id| proc.snapshot_waiters.borrow_mut().remove(&id));
            if let Some(raw) = m.snapshot {
                let answer = (Instant::now(), raw.get().to_owned());
                match waiter {
                    Some(w) => w.fill(answer),
                    // Its wait ran out (or a probe, to an older build, which sends one anyway):
                    // still its newest figures, kept for when it misses the next request. An id
                    // never asked is no answer.
                    None if m.id.is_some_and(|id| id <= proc.snapshot_asked.get()) => {
                        *proc.late_snapshot.borrow_mut() = Some(answer);
                    }
                    None => {}
                }
            }
        }
        Some("stats_request") => {
            stats_request(st, proc, m.id, m.text.as_deref() == Some("metrics"))
        }
        _ => {}
    }
}

/// A worker asks for the cluster's stats (`metrics`: the exposition, else the JSON document).
/// One task per worker answers them in batches: every request waiting when a document is made
/// gets it, so however many a worker sends, the primary makes one document at a time for it
/// (and asks the workers for snapshots at most once a second: the stats' cache). Past
/// [`MAX_STATS_WAITING`] waiting, or while it does not read its channel, a request is dropped.
fn stats_request(st: &Rc<State>, proc: &Rc<Proc>, id: Option<u64>, metrics: bool) {
    if !proc.may_answer() {
        return;
    }
    if proc.stats_waiting.borrow().len() >= MAX_STATS_WAITING {
        if !proc.stats_dropped_said.replace(true) {
            tracing::warn!(
                target: "nodus::cluster",
                "worker {} (pid {}) has {MAX_STATS_WAITING} stats requests waiting: dropping more",
                proc.slot, proc.pid
            );
        }
        return;
    }
    proc.stats_waiting.borrow_mut().push((id, metrics));
    if proc.stats_running.replace(true) {
        return;
    }
    let (s, p) = (st.clone(), proc.clone());
    crate::task::spawn_named("cluster:stats", async move {
        loop {
            let batch = std::mem::take(&mut *p.stats_waiting.borrow_mut());
            if batch.is_empty() {
                break;
            }
            p.stats_dropped_said.set(false);
            let wants = |kind: bool| batch.iter().any(|&(_, metrics)| metrics == kind);
            let json = if wants(false) {
                stats::stats_json_relayed(&s, stats_text_budget()).await
            } else {
                String::new()
            };
            let text = if wants(true) {
                stats::metrics_text_relayed(&s, stats_text_budget()).await
            } else {
                String::new()
            };
            for (id, metrics) in batch {
                let mut reply = Nodus::act("stats_reply");
                reply.id = id;
                reply.text = Some(if metrics { &text } else { &json });
                p.answer(&reply);
            }
        }
        p.stats_running.set(false);
    })
    .detach();
}

/// An application message: logged as an event; `{act: 'suicide'}` (seed 002's notice, which a
/// Node app may send; Node itself never does) is a "going down" notice, and under [`Readiness::Message`] the string `'ready'`
/// (PM2's `process.send('ready')`) says the worker is ready.
fn on_user_message(st: &Rc<State>, proc: &Rc<Proc>, msg: &Message) {
    if st.config.readiness == Readiness::Message
        && msg.deserialize::<String>().is_ok_and(|s| s == "ready")
    {
        mark_ready(st, proc);
        return;
    }
    if let Ok(v) = msg.deserialize::<serde_json::Value>()
        && v.get("act").and_then(|a| a.as_str()) == Some("suicide")
    {
        supervise::going_down(st, proc);
        return;
    }
    log_app_message(st, proc, msg.json());
    st.emit(Some(proc), EventKind::message(msg.json()));
}

/// Logs a worker's application message (`process.send()`): the first one of the run at INFO,
/// saying what becomes of them (nodus runs no JavaScript, so no `cluster.on('message')`
/// handler sees them) with its size only, since a payload may hold what belongs in no log;
/// each one at DEBUG with its first 200 bytes.
fn log_app_message(st: &State, proc: &Proc, json: &str) {
    if !st.app_message_said.replace(true) {
        tracing::info!(
            target: "nodus::cluster",
            "worker {} (pid {}) sent a message (process.send, {} bytes of JSON); nodus runs no \
             JavaScript, so no cluster.on('message') handler receives worker messages: each is \
             a `message` event, written to the event log (--events FILE) and given to a Rust \
             primary's `on_event` subscribers, and logged at DEBUG",
            proc.slot, proc.pid, json.len()
        );
    }
    tracing::debug!(
        target: "nodus::cluster",
        "worker {} (pid {}) sent a message: {}", proc.slot, proc.pid,
        &json[..json.floor_char_boundary(200)]
    );
}

/// A worker not ready after `ready_timeout`, where nothing else would say why, is warned about
/// once: under [`Readiness::Listening`] (`nodus run --node` without `--ready-after`) one with a
/// channel that has not sent `listening`; under [`Readiness::Message`] (`--wait-ready`) any that
/// has not said it is ready. It is not ready until it does (`/_nodus/readyz` says 503). A
/// reload's new worker is left to the reload, which fails or retries it with a line of its own.
fn warn_if_never_ready(st: &Rc<State>, proc: &Rc<Proc>) {
    let waits_for = match st.config.readiness {
        Readiness::Listening if proc.channel.is_some() => ProcState::Listening,
        Readiness::Message => ProcState::Ready,
        _ => return,
    };
    let (s, p) = (st.clone(), proc.clone());
    crate::task::spawn_named("cluster:not-ready", async move {
        // Ends early once the worker is there or gone (`Dead` is past every state), so neither
        // the task nor the `Proc` it holds outlives the worker. One that exited as the timeout
        // expired (a zombie not yet reaped) is gone too, not late.
        if p.wait_for(waits_for, s.config.ready_timeout).await >= waits_for
            || p.child.has_exited()
            || p.drained.get()
            || p.going_down.get()
        {
            return;
        }
        // A reload's new worker: the reload waits for it as long and says why it was not ready.
        if s.current(p.slot).is_none_or(|c| c.unique != p.unique) {
            return;
        }
        let (slot, pid, limit) = (p.slot, p.pid, s.config.ready_timeout);
        if waits_for == ProcState::Ready {
            let how = if p.channel.is_some() {
                "READY=1 to its NOTIFY_SOCKET, or process.send('ready')"
            } else {
                "READY=1 to its NOTIFY_SOCKET"
            };
            tracing::warn!(
                target: "nodus::cluster",
                "worker {slot} (pid {pid}) has not said it is ready in {limit:?}: with --wait-ready \
                 a worker is ready only when it says so ({how}), so it is not ready yet"
            );
            return;
        }
        let online = if p.state.get() == ProcState::Starting {
            "; it has not said `online` either (is it a Node program run as `node FILE`?)"
        } else {
            ""
        };
        tracing::warn!(
            target: "nodus::cluster",
            "worker {slot} (pid {pid}) has not listened in {limit:?}: with --node a worker is ready \
             at its first listen (a server.listen() callback in the worker), so it is not ready \
             yet{online}; one that never listens (a queue consumer) is ready after --ready-after SECS \
             (a Rust primary: `Readiness::ListeningOrAlive`)"
        );
    })
    .detach();
}
