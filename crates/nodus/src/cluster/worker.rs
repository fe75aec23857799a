//! The worker role: a process started by a cluster primary (a nodus primary, or a stock Node
//! primary via `cluster.setupPrimary({ exec })`).
//!
//! A process is a worker when `NODE_UNIQUE_ID` is set (Node's rule). [`Worker::get`] opens the
//! IPC channel (`NODE_CHANNEL_FD`), says `online` (with `nodus: 1`, so a nodus primary knows it
//! answers snapshot requests; one that is only a probe, `text: "probe"`, without building a
//! snapshot), and starts one dispatch task that answers the primary.
//! [`Worker::listen`] asks the primary for a listener (`queryServer`): under round-robin the
//! primary accepts and hands connections over the channel (`newconn`, or `newconns` batches from
//! a nodus primary), under a shared or reuse-port policy it sends a listening fd; either way the
//! caller gets a [`Listener`].
//!
//! Invariants:
//! - One `Worker` per process, created on the loop thread; the environment variables naming it
//!   (`NODE_UNIQUE_ID`, `NODUS_PRIMARY`, `NODE_CHANNEL_*`) are taken out of the environment as
//!   Node takes them, before nodus starts a thread of its own (`parent_env`), and handed out
//!   once.
//! - Every `newconn` is answered `{ack, accepted}`, every `newconns` batch (a nodus primary) by a
//!   claim on the board the primary gave (`board.rs`; without one, a `took` per loop turn for
//!   every batch up to the newest) or at once by `refused` (counted on the board first): taken
//!   iff the queue of its key is open, has room (below) and (with a board) the claim wins, the
//!   primary not having taken the batch back (it does once it has waited its handoff deadline
//!   for this loop; a lost claim closes this process's copies of the fds, never with
//!   `shutdown`), and a queue is open only while something will accept from it or give it back.
//!   It is opened when
//!   [`Worker::listen`] sends `queryServer` (before any answer or `newconns` can arrive) and held
//!   by a claim, which the [`Listener`] takes over; when the last claim goes (the `Listener`
//!   closes, or the `listen` future is dropped before making one: a timeout, a select) the key is
//!   closed at once: `close`, then whatever was queued goes back (`returned`), and a late answer
//!   to the query is ignored. Refused connections go back to the primary, which gives them to
//!   another worker.
//! - A `newconns` batch that would leave more than twice the handoff window (by default
//!   [`HANDOFF_QUEUE_MAX`], 128) connections of its key queued and not yet accepted by the
//!   application is refused (an application at its connection cap stops accepting, as from a
//!   kernel listener): this process holds no fds for connections nobody serves, and the primary
//!   hands them on or parks them. (A Node primary's `newconn`, one per round trip, is taken.)
//! - The handoff window ([`Worker::set_handoff_window`], 64 by default, less for a process low on
//!   fds) goes to a nodus primary with each `queryServer`: it hands this worker at most that many
//!   connections it has not taken yet. So the worker holds at most three windows of fds for
//!   connections its application has not accepted: two queued, one on their way.
//! - The primary's `disconnect` makes [`Worker::drain_requested`] resolve (with the primary's
//!   drain deadline); what to drain is the application's business. [`Worker::disconnect`] (leaving
//!   on our own) closes every key as above while the channel is open, then says
//!   `exitedAfterDisconnect` and closes the channel: nothing taken is left queued without a way
//!   back. Whatever waits for the primary's answer ends when the channel does (a `disconnect`
//!   returns, a `listen` fails). EOF on the channel without a disconnect of our own (the primary
//!   died) exits the process with code 0, as Node's workers do; `PR_SET_PDEATHSIG` set by a
//!   nodus primary covers a worker whose loop is stuck.
//! - Open connections are counted (for the `least` policy) only when the primary asks for load
//!   reports; they go on the board, or without one in a message coalesced per loop turn, riding
//!   on that turn's `took` when there is one.
//! - From [`Worker::get`] on, SIGHUP never stops the worker: a reload is the primary's (it
//!   replaces workers one at a time), so a SIGHUP sent to a worker itself (`kill -HUP` on every
//!   nodus pid, a PM2 habit) is caught and answered by one log line naming the primary (its pid
//!   recorded at [`Worker::get`]; the line says it is gone once the worker has another parent),
//!   rather than killing the worker and spending the primary's restart budget on its
//!   replacement. The line is left out while the application catches SIGHUP too (its own
//!   `Signals`): it is the application's then. This is a handler, never `SIG_IGN`, so the
//!   worker's own children get the default action back at their `exec`.

use std::cell::{Cell, OnceCell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::future::poll_fn;
use std::io;
use std::net::SocketAddr;
use std::ops::Deref;
use std::os::fd::OwnedFd;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use serde::Serialize;
use serde_json::value::RawValue;

use super::board::Board;
use super::protocol::{
    Ack, Act, CloseKey, Incoming, NODE_CLUSTER, NODE_NODUS, NewConns, Nodus, QueryServer,
    SNAPSHOT_PROBE,
};
use super::reply::ReplySlot;
use crate::ipc::{Channel, Handle, MAX_FDS_PER_FRAME, Message};
use crate::metrics::Snapshot;
use crate::net::{TcpListener, TcpStream};
use crate::signal::{SIGHUP, Signals};
use crate::watchdog::HoldMirror;

/// How long a worker waits for the primary's answer to `queryServer` or its exit.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a worker waits for the primary's stats or metrics: half Prometheus's default scrape
/// timeout (10 s), so a scrape through a worker whose primary does not answer fails with the
/// worker's own answer, not the scraper's timeout. The primary needs 1 s at most (its workers'
/// snapshots are awaited 500 ms, and as long again after a pause of its own).
const STATS_TIMEOUT: Duration = Duration::from_secs(5);

/// Connections handed over for one key and not yet accepted by the application, at most: a
/// batch that would queue more is refused (the application is at its connection cap, or its loop
/// is behind), so the primary hands it to another worker or parks it, rather than this process
/// holding the fds of connections nobody serves. Two batches: a healthy loop takes each batch in
/// the turn it arrived, and a channel read of one turn may bring two.
pub const HANDOFF_QUEUE_MAX: usize = 2 * MAX_FDS_PER_FRAME;

/// The handoff window by default, and at most: one batch's fds.
pub const HANDOFF_WINDOW_MAX: usize = MAX_FDS_PER_FRAME;

pub(crate) use crate::parent_env::NODUS_PRIMARY as NODUS_PRIMARY_ENV;

/// The primary's answer to `queryServer`: the server key (or its error text) and, for a shared
/// or reuse-port listener, the listening fd.
/// A `queryServer`'s answer: its key (or the error), the listening fd under a shared handle, and
/// under round-robin the address the primary bound (a port-0 listen's port).
type QueryResult = (Result<String, String>, Option<Handle>, Option<SocketAddr>);

thread_local! {
    static WORKER: RefCell<Option<Worker>> = const { RefCell::new(None) };
}

/// This process's membership in a cluster. Cheap to clone.
#[derive(Clone)]
pub struct Worker {
    sh: Rc<Shared>,
}

struct Shared {
    id: u32,
    /// The parent's pid at [`Worker::get`]: the primary's, while the worker is still its child.
    primary_pid: u32,
    channel: Channel,
    seq: Cell<u64>,
    /// `queryServer` requests waiting for the primary, by their `seq`.
    queries: RefCell<HashMap<u64, ReplySlot<QueryResult>>>,
    /// The queue of every claimed server key (see [`KeyClaim`]); round-robin ones take
    /// connections.
    rr: RefCell<HashMap<String, Rc<RrQueue>>>,
    drain: RefCell<(Option<Duration>, Vec<Waker>)>,
    stopping: Cell<bool>,
    disconnecting: Cell<bool>,
    load: Load,
    stats: RefCell<HashMap<u64, ReplySlot<String>>>,
    next_request: Cell<u64>,
    snapshot: RefCell<Box<dyn Fn() -> Snapshot>>,
    exit_ack: RefCell<Option<(u64, ReplySlot<()>)>>,
    /// The newest `newconns` batch taken and not yet answered (the `took` goes out once per turn).
    took: Cell<Option<u64>>,
    /// A report (`took`, `load`) goes out at the end of this turn.
    report_queued: Cell<bool>,
    /// The primary is a nodus primary ([`NODUS_PRIMARY_ENV`], or it sent `newconns`): it answers
    /// stats requests, and connections can be given back.
    nodus_primary: Cell<bool>,
    /// The loop's holds mirrored on the board, for round-robin to see a long one
    /// (`board.rs`). Declared before `board`, so dropped first: the mirror is unset before the
    /// board is unmapped.
    hold_mirror: OnceCell<HoldMirror>,
    /// Where taken batches and load are posted, when the primary gave a board.
    board: OnceCell<Board>,
    /// Batches refused for fds that did not arrive (this worker at its fd limit): one line per
    /// burst, then counted.
    short_batches: Rc<crate::log_limit::LogLimit>,
    /// The handoff window (`Worker::set_handoff_window`).
    window: Cell<usize>,
}

/// Open-connection accounting for the `least` policy.
struct Load {
    reporting: Cell<bool>,
    open: Cell<u64>,
    accepted: Cell<u64>,
    /// Open connections changed since the last report.
    changed: Cell<bool>,
}

impl Worker {
    /// This process's worker, when a cluster primary started it (`NODE_UNIQUE_ID` set); `None`
    /// in a primary or a standalone process. The first call opens the channel, says `online` and
    /// starts catching SIGHUP (a SIGHUP to the worker is logged, not obeyed: see the module
    /// docs). `NODE_UNIQUE_ID` and `NODUS_PRIMARY` are taken out of the environment (as Node
    /// does) with the channel's variables, by the first runtime built at the latest: see
    /// [`Builder::build`](crate::rt::Builder::build) for when other threads may read it.
    ///
    /// # Errors
    /// The channel named by `NODE_CHANNEL_FD` cannot be opened.
    ///
    /// # Panics
    /// The first call, outside a running nodus loop (before anything is taken: a later call in
    /// a loop still finds the worker).
    #[track_caller]
    pub fn get() -> io::Result<Option<Worker>> {
        if let Some(w) = WORKER.with(|w| w.borrow().clone()) {
            return Ok(Some(w));
        }
        crate::rt::context::with_core("nodus::cluster::Worker::get", |_| ());
        let Some((unique, nodus_primary)) = crate::parent_env::worker() else {
            return Ok(None);
        };
        let id = std::env::var("NODUS_WORKER_ID")
            .ok()
            .and_then(|v| v.parse().ok())
            .or_else(|| unique.to_str().and_then(|v| v.parse().ok()))
            .unwrap_or(0);
        let channel = Channel::from_env()
            .map_err(|e| io::Error::other(e.to_string()))?
            .ok_or_else(|| {
                io::Error::other("NODE_UNIQUE_ID is set but there is no NODE_CHANNEL_FD")
            })?;
        let worker = Worker {
            sh: Rc::new(Shared {
                id,
                primary_pid: std::os::unix::process::parent_id(),
                channel,
                seq: Cell::new(0),
                queries: RefCell::default(),
                rr: RefCell::default(),
                drain: RefCell::new((None, Vec::new())),
                stopping: Cell::new(false),
                disconnecting: Cell::new(false),
                load: Load {
                    reporting: Cell::new(false),
                    open: Cell::new(0),
                    accepted: Cell::new(0),
                    changed: Cell::new(false),
                },
                stats: RefCell::default(),
                next_request: Cell::new(1),
                snapshot: RefCell::new(Box::new(crate::metrics::snapshot)),
                exit_ack: RefCell::new(None),
                took: Cell::new(None),
                report_queued: Cell::new(false),
                nodus_primary: Cell::new(nodus_primary),
                hold_mirror: OnceCell::new(),
                board: OnceCell::new(),
                short_batches: crate::log_limit::LogLimit::new(
                    crate::log_limit::WINDOW,
                    |n, last| {
                        tracing::warn!(
                            target: "nodus::cluster",
                            "{n} more handed-over batches refused in the last {:?} for fds that \
                             did not arrive (the last: {last})",
                            crate::log_limit::WINDOW
                        );
                    },
                ),
                window: Cell::new(HANDOFF_WINDOW_MAX),
            }),
        };
        // `nodus: 1`: a nodus primary asks this worker for snapshots (Node's ignores it).
        worker.send_cluster(|seq| Act {
            cmd: NODE_CLUSTER,
            act: "online",
            seq,
            nodus: Some(1),
        });
        let dispatch = worker.clone();
        crate::task::spawn_named("cluster:worker", async move { dispatch.dispatch().await })
            .detach();
        worker.survive_sighup();
        WORKER.with(|w| *w.borrow_mut() = Some(worker.clone()));
        Ok(Some(worker))
    }

    /// The worker id the primary gave (`NODUS_WORKER_ID`, else `NODE_UNIQUE_ID`): stable per
    /// slot across restarts under a nodus primary.
    pub fn id(&self) -> u32 {
        self.sh.id
    }

    /// The channel to the primary, for the application's own messages (`process.send` /
    /// `process.on('message')`). Those it leaves unread (it may never call `recv`, or call it
    /// once) never hold back the primary's own messages, which this worker's dispatch task
    /// reads from a queue of their own; they are kept up to the channel's bounds, then the
    /// oldest dropped (see [`Channel`]).
    pub fn channel(&self) -> &Channel {
        &self.sh.channel
    }

    /// How many connections a nodus primary may hand this worker for a listener before it took
    /// them, for the listens that follow: 1 to [`HANDOFF_WINDOW_MAX`] (64, the default; other
    /// values are clamped). It also bounds what is queued for the application and not accepted
    /// yet (twice the window; beyond, a batch is refused), so a worker holds at most three
    /// windows of fds for connections its application has not accepted: a process low on fds
    /// sets it lower (`nodus serve` does, from its open-files limit). A Node primary ignores it.
    /// A listener made before the call keeps the window the primary was told for it.
    pub fn set_handoff_window(&self, window: usize) {
        self.sh.window.set(window.clamp(1, HANDOFF_WINDOW_MAX));
    }

    /// Asks the primary for a listener on `addr` (Node's `queryServer`). Port 0 gives every
    /// worker the same port, as in Node, which the listener's `local_addr` says (under
    /// round-robin and least, from the answer's `sockname`, as Node's `server.address()`).
    ///
    /// Cancel-safe: dropping the future before it returns (a timeout, a select) closes the key at
    /// once, as dropping the [`Listener`] would (what was taken for it goes back to the primary);
    /// the answer, if it comes later, is ignored.
    ///
    /// # Errors
    /// The primary could not listen (its error text), did not answer within 10 s, or the
    /// channel closed.
    pub async fn listen(&self, addr: SocketAddr) -> io::Result<Listener> {
        let address = addr.ip().to_string();
        let address_type = if addr.is_ipv4() { 4 } else { 6 };
        let index = self.next_index(&format!("{address}:{}:{address_type}", addr.port()));
        let seq = self.next_seq();
        let query = QueryServer {
            cmd: NODE_CLUSTER,
            act: "queryServer",
            index,
            data: None,
            address: &address,
            port: addr.port(),
            address_type,
            flags: 0,
            backlog: 511,
            seq,
            nodus: Some(1),
            board: Some(1),
            window: Some(self.sh.window.get() as u64).filter(|&w| w < HANDOFF_WINDOW_MAX as u64),
        };
        // The key is claimed (its queue open) before the query goes out, so a `newconns` right
        // after the answer finds the queue. Until a `Listener` owns the claim, this future does:
        // dropped early (a timeout, a select), it closes the key as a closing `Listener` does.
        let claim = KeyClaim::new(self, query.key());
        let slot = ReplySlot::new();
        self.sh.queries.borrow_mut().insert(seq, slot.clone());
        let _pending = PendingQuery { sh: &self.sh, seq };
        self.send_raw(&query)?;
        let Some((result, handle, bound)) = slot.wait(REPLY_TIMEOUT).await else {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the cluster primary did not answer queryServer",
            ));
        };
        let key = result.map_err(|errno| {
            io::Error::other(format!(
                "the cluster primary cannot listen on {addr}: {errno}"
            ))
        })?;
        if key != claim.key {
            return Err(io::Error::other(format!(
                "the cluster primary answered queryServer for {addr} with the key {key}, not {}",
                claim.key
            )));
        }
        let kind = match handle {
            Some(h) => Kind::Shared(h.into_tcp_listener()?),
            // The address the primary bound: a port-0 listen's real port (as Node's worker takes
            // `server.address()` from the answer's `sockname`).
            None => Kind::RoundRobin(bound.unwrap_or(addr)),
        };
        let listener = Listener { claim, kind };
        let mut listening = query;
        listening.act = "listening";
        if let Ok(local) = listener.local_addr() {
            listening.port = local.port();
        }
        listening.seq = self.next_seq();
        self.send_raw(&listening)?;
        Ok(listener)
    }

    /// The `index` of a new listen on `base` (`address:port:type`): above every one this worker
    /// still holds there, 0 when it holds none. Node's worker numbers its servers on one address
    /// so, each a key of its own: a second server on an address is refused (`EADDRINUSE`), as a
    /// Node primary answers, instead of sharing the first's key (which a Node primary's
    /// round-robin handle asserts against, and dies of), and a second port 0 gets a port of its
    /// own.
    fn next_index(&self, base: &str) -> u64 {
        self.sh
            .rr
            .borrow()
            .iter()
            .filter(|(_, queue)| queue.claims.get() > 0)
            .filter_map(|(key, _)| {
                key.strip_prefix(base)?
                    .strip_prefix(":undefined:")?
                    .parse::<u64>()
                    .ok()
            })
            .max()
            .map_or(0, |i| i + 1)
    }

    /// Tells the primary this worker is ready for traffic (the primary's reload waits for it).
    pub fn ready(&self) {
        self.send_nodus(&Nodus::act("ready"));
    }

    /// Tells the primary this worker is about to exit, so it starts the replacement now.
    pub fn going_down(&self) {
        self.send_nodus(&Nodus::act("going_down"));
    }

    /// Resolves when the primary asks this worker to drain (its `disconnect`), with the drain
    /// deadline it gave (10 s when it gave none, as from a Node primary).
    pub async fn drain_requested(&self) -> Duration {
        poll_fn(|cx| {
            let mut drain = self.sh.drain.borrow_mut();
            match drain.0 {
                Some(d) => Poll::Ready(d),
                None => {
                    drain.1.push(cx.waker().clone());
                    Poll::Pending
                }
            }
        })
        .await
    }

    /// Whether the primary began a shutdown (its `stopping` notice, or a `disconnect`): a
    /// readiness probe should now fail, though requests are still served until the drain.
    pub fn is_stopping(&self) -> bool {
        self.sh.stopping.get()
    }

    /// Sets what this worker reports when the primary asks for its metrics (default:
    /// [`crate::metrics::snapshot`]; an HTTP server adds its own section).
    pub fn set_snapshot(&self, f: impl Fn() -> Snapshot + 'static) {
        *self.sh.snapshot.borrow_mut() = Box::new(f);
    }

    /// The whole cluster's `/_nodus/stats` document (JSON), from the primary.
    ///
    /// # Errors
    /// `Unsupported` at once under a stock Node primary (it keeps no stats); `TimedOut` if a
    /// nodus primary did not answer within 5 s (stopped, or its loop stalled).
    pub async fn cluster_stats(&self) -> io::Result<String> {
        self.ask_primary("stats").await
    }

    /// The whole cluster's `/_nodus/metrics` (OpenMetrics text), from the primary.
    ///
    /// # Errors
    /// As [`cluster_stats`](Self::cluster_stats).
    pub async fn cluster_metrics(&self) -> io::Result<String> {
        self.ask_primary("metrics").await
    }

    /// Leaves the cluster on the worker's own initiative (Node's `cluster.worker.disconnect()`):
    /// closes every server key as Node's worker closes its servers (`close`; connections taken
    /// and not yet accepted go back to a nodus primary, and round-robin [`Listener`]s yield their
    /// end),
    /// then tells the primary (`exitedAfterDisconnect`, so the exit is not a crash), waits for its
    /// answer (at most 10 s) and closes the channel.
    pub async fn disconnect(&self) {
        self.sh.disconnecting.set(true);
        // While the channel still carries the `close` and the connections going back.
        let open: Vec<(String, Rc<RrQueue>)> = self
            .sh
            .rr
            .borrow()
            .iter()
            .map(|(key, queue)| (key.clone(), queue.clone()))
            .collect();
        for (key, queue) in open {
            self.close_key(&key, &queue);
        }
        let seq = self.next_seq();
        let slot = ReplySlot::new();
        *self.sh.exit_ack.borrow_mut() = Some((seq, slot.clone()));
        if self
            .send_raw(&Act {
                cmd: NODE_CLUSTER,
                act: "exitedAfterDisconnect",
                seq,
                nodus: None,
            })
            .is_ok()
        {
            slot.wait(REPLY_TIMEOUT).await;
        }
        let _ = self.sh.channel.flush().await;
        self.sh.channel.disconnect();
    }

    /// Waits until everything sent to the primary has been written to the channel (connections
    /// given back included), at most `limit`: what a worker does before it exits on its own, as
    /// queued messages die with the process.
    pub async fn flush(&self, limit: Duration) {
        let _ = crate::time::timeout(limit, self.sh.channel.flush()).await;
    }

    async fn ask_primary(&self, what: &str) -> io::Result<String> {
        if !self.sh.nodus_primary.get() {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "a Node cluster primary keeps no cluster stats",
            ));
        }
        let id = self.sh.next_request.get();
        self.sh.next_request.set(id + 1);
        let slot = ReplySlot::new();
        self.sh.stats.borrow_mut().insert(id, slot.clone());
        let mut msg = Nodus::act("stats_request");
        msg.id = Some(id);
        msg.text = Some(what);
        self.send_nodus(&msg);
        let reply = slot.wait(STATS_TIMEOUT).await;
        self.sh.stats.borrow_mut().remove(&id);
        reply.ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::TimedOut,
                "the cluster primary did not answer a stats request",
            )
        })
    }

    /// Catches SIGHUP for the rest of the process's life: one line per SIGHUP says where a
    /// reload is asked for, unless the application catches SIGHUP too. Unref'd, as every
    /// [`Signals`] is: it keeps no loop alive.
    fn survive_sighup(&self) {
        let mut hup = match Signals::new(&[SIGHUP]) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(
                    target: "nodus::cluster",
                    "cannot catch SIGHUP (one sent to this worker will stop it): {e}"
                );
                return;
            }
        };
        let w = self.clone();
        crate::task::spawn_named("cluster:worker-sighup", async move {
            loop {
                hup.recv().await;
                if crate::signal::streams_catching(SIGHUP) > 1 {
                    continue; // the application's own stream has it
                }
                let (id, primary) = (w.id(), w.sh.primary_pid);
                if std::os::unix::process::parent_id() != primary {
                    // Re-parented (to init or a subreaper): the primary died.
                    tracing::warn!(
                        target: "nodus::cluster",
                        "worker {id} ignored a SIGHUP sent to it and serves on: its cluster \
                         primary is gone (the worker has another parent), there is no reload to ask"
                    );
                } else if w.sh.nodus_primary.get() {
                    tracing::warn!(
                        target: "nodus::cluster",
                        "worker {id} ignored a SIGHUP sent to it and serves on: a rolling reload \
                         is SIGHUP to the cluster primary (kill -HUP {primary})"
                    );
                } else {
                    tracing::warn!(
                        target: "nodus::cluster",
                        "worker {id} ignored a SIGHUP sent to it and serves on: reloading is the \
                         cluster primary's (pid {primary})"
                    );
                }
            }
        })
        .detach();
    }

    fn next_seq(&self) -> u64 {
        let seq = self.sh.seq.get();
        self.sh.seq.set(seq + 1);
        seq
    }

    fn send_raw<T: Serialize>(&self, msg: &T) -> io::Result<()> {
        self.sh
            .channel
            .send(msg)
            .map(drop)
            .map_err(|e| io::Error::other(e.to_string()))
    }

    fn send_cluster<T: Serialize>(&self, build: impl FnOnce(u64) -> T) {
        let msg = build(self.next_seq());
        if let Err(e) = self.send_raw(&msg) {
            tracing::debug!(target: "nodus::cluster", "cannot tell the primary: {e}");
        }
    }

    fn send_nodus(&self, msg: &Nodus<'_>) {
        if let Err(e) = self.send_raw(msg) {
            tracing::debug!(target: "nodus::cluster", "cannot tell the primary: {e}");
        }
    }

    async fn dispatch(&self) {
        while let Some(msg) = self.sh.channel.recv_internal().await {
            self.on_message(msg);
        }
        // EOF: the primary is gone or we disconnected. Nothing waits for an answer that cannot
        // come: a `disconnect` under way ends now, a `listen` fails.
        for queue in self.sh.rr.borrow().values() {
            queue.close();
        }
        if let Some((_, slot)) = self.sh.exit_ack.borrow_mut().take() {
            slot.fill(());
        }
        let queries: Vec<_> = self.sh.queries.borrow_mut().drain().collect();
        for (_, slot) in queries {
            slot.fill((
                Err("the channel to the cluster primary closed".into()),
                None,
                None,
            ));
        }
        if !self.sh.disconnecting.get() {
            tracing::warn!(target: "nodus::cluster", "the cluster primary went away; exiting");
            // The line above may be queued (`output::log_writer`); a stalled sink gets 1 s.
            crate::process::output::flush_before_exit(Duration::from_secs(1));
            std::process::exit(0);
        }
    }

    fn on_message(&self, mut msg: Message) {
        // The handles first, so the JSON can be parsed in place.
        let handles = msg.take_handles();
        let Some(m) = Incoming::parse(msg.json()) else {
            let json = msg.json();
            tracing::warn!(
                target: "nodus::cluster",
                "ignored a cluster message from the primary that does not parse: {}",
                &json[..json.floor_char_boundary(200)]
            );
            return;
        };
        if m.is_nodus() {
            match m.act {
                Some("newconns") => self.on_newconns(&m, handles),
                Some("board") => self.on_board(handles),
                _ => self.on_nodus(&m),
            }
            return;
        }
        let handle = handles.into_iter().next();
        if !m.is_cluster() {
            return;
        }
        match m.act {
            Some("newconn") => self.on_newconn(&m, handle),
            Some("disconnect") => {
                let deadline = Duration::from_millis(m.drain_ms.unwrap_or(10_000));
                self.sh.stopping.set(true);
                for queue in self.sh.rr.borrow().values() {
                    queue.close();
                }
                let wakers = {
                    let mut drain = self.sh.drain.borrow_mut();
                    drain.0 = Some(deadline);
                    std::mem::take(&mut drain.1)
                };
                wakers.into_iter().for_each(Waker::wake);
            }
            None => {
                let Some(ack) = m.ack else { return };
                if let Some(slot) = self.sh.queries.borrow_mut().remove(&ack) {
                    let result = match (&m.errno, &m.key) {
                        // A negative errno (libuv's) is said in words; anything else as it came.
                        (Some(e), _) if !e.is_null() && e != 0 => Err(match e.as_i64() {
                            Some(n) if n < 0 && i32::try_from(n.unsigned_abs()).is_ok() => {
                                io::Error::from_raw_os_error(n.unsigned_abs() as i32).to_string()
                            }
                            _ => format!("error {e}"),
                        }),
                        (_, Some(key)) => Ok(key.to_string()),
                        _ => Err("no key in the reply".to_owned()),
                    };
                    // A round-robin key's queue exists already (claimed by `listen`), before
                    // the next message, which may be a `newconn` for it.
                    let bound = m.sockname.as_ref().and_then(|s| s.addr());
                    slot.fill((result, handle, bound));
                    return;
                }
                let exit = self.sh.exit_ack.borrow_mut().take();
                if let Some((seq, slot)) = exit {
                    if seq == ack {
                        slot.fill(());
                    } else {
                        *self.sh.exit_ack.borrow_mut() = Some((seq, slot));
                    }
                }
            }
            Some(_) => {}
        }
    }

    fn on_newconn(&self, m: &Incoming<'_>, handle: Option<Handle>) {
        let queue = m
            .key
            .as_deref()
            .and_then(|k| self.sh.rr.borrow().get(k).cloned());
        let stream = handle.and_then(|h| h.into_tcp_stream().ok());
        let accepted = match (queue, stream) {
            (Some(q), Some(s)) if !q.closed.get() => {
                q.push(s);
                true
            }
            _ => false,
        };
        if let Some(seq) = m.seq {
            self.send_cluster(|own| Ack {
                cmd: NODE_CLUSTER,
                ack: seq,
                accepted: Some(accepted),
                seq: own,
            });
        }
    }

    /// A batch from a nodus primary: its fds are non-blocking TCP streams, in `peers` order.
    fn on_newconns(&self, m: &Incoming<'_>, handles: Vec<Handle>) {
        let Some(seq) = m.seq else { return };
        self.sh.nodus_primary.set(true);
        let queue = m
            .key
            .as_deref()
            .and_then(|k| self.sh.rr.borrow().get(k).cloned())
            .filter(|q| !q.closed.get());
        let peers = m.peers.as_deref().unwrap_or_default();
        // Refused whole, silently: the primary pauses this worker a moment and hands it on.
        let queue = queue.filter(|q| q.conns.borrow().len() + peers.len() <= 2 * q.window.get());
        if handles.len() < peers.len() {
            // The kernel dropped fds (this process is at its fd limit): the primary still holds
            // every connection of the batch and gives them to other workers. Once per burst.
            let what = || format!("{} of {}", handles.len(), peers.len());
            if self.sh.short_batches.first(what) {
                tracing::warn!(
                    target: "nodus::cluster",
                    "{} handed-over connections arrived (fd limit?); refusing the batch (further \
                     ones are counted: one line per {:?})",
                    what(),
                    crate::log_limit::WINDOW
                );
            }
        }
        let board = self.sh.board.get();
        // Adopted before the batch is claimed: one that cannot be (out of epoll watches, say)
        // refuses the whole batch while the primary still holds every connection of it, so
        // they go to another worker. Our copies are closed without a `shutdown`, which would
        // end the connection for the worker that serves it.
        let adopted = queue.filter(|_| handles.len() >= peers.len()).map(|queue| {
            let conns = handles
                .into_iter()
                .map(|h| TcpStream::from_nonblocking(h.into_owned_fd()))
                .collect::<io::Result<Vec<_>>>();
            (queue, conns)
        });
        let (queue, conns) = match adopted {
            Some((queue, Ok(conns))) => (queue, conns),
            refused => {
                if let Some((_, Err(e))) = refused {
                    tracing::warn!(
                        target: "nodus::cluster",
                        "cannot adopt a handed-over connection: {e}; refusing the batch"
                    );
                }
                if let Some(board) = board {
                    board.post_refusal();
                    board.post_seen(seq);
                }
                let mut refused = Nodus::act("refused");
                refused.ack = Some(seq);
                self.send_nodus(&refused);
                return;
            }
        };
        // A batch this worker was too slow to take (the primary waited its handoff deadline for
        // this loop) may have been taken back: the board says whose it is, once. Taken back, the
        // primary hands its own copies on; ours are closed.
        if let Some(board) = board
            && !board.claim(seq)
        {
            board.post_seen(seq);
            tracing::debug!(
                target: "nodus::cluster",
                "a batch of {} connection(s) came after the primary found this loop stalled: it \
                 took them back",
                conns.len()
            );
            return;
        }
        queue.conns.borrow_mut().extend(
            conns
                .into_iter()
                .enumerate()
                .map(|(i, s)| (s, peers.get(i).copied().flatten())),
        );
        queue.wake();
        if board.is_none() {
            self.sh.took.set(Some(seq));
            self.queue_report();
        }
    }

    /// The primary's board: mapped before any `newconns` (the primary sends it before answering
    /// `queryServer`). A bad one is logged and `took` messages are sent instead.
    fn on_board(&self, handles: Vec<Handle>) {
        let Some(handle) = handles.into_iter().next() else {
            return;
        };
        match Board::open(handle.into_owned_fd()) {
            Ok(board) => {
                if self.sh.board.set(board).is_err() {
                    return; // a second board: the first stays
                }
                if let Some(board) = self.sh.board.get() {
                    // SAFETY: the board is mapped until `sh` is dropped, which drops the mirror
                    // first (`hold_mirror` is declared before `board`).
                    if let Some(mirror) = unsafe { HoldMirror::start(board.hold_word()) } {
                        let _ = self.sh.hold_mirror.set(mirror);
                    }
                }
            }
            Err(e) => {
                tracing::warn!(target: "nodus::cluster", "cannot map the primary's board: {e}")
            }
        }
    }

    fn on_nodus(&self, m: &Incoming<'_>) {
        match m.act {
            Some("snapshot_request") => {
                // A probe asks only whether this loop runs: the answer is enough.
                let raw = (m.text.as_deref() != Some(SNAPSHOT_PROBE)).then(|| {
                    let snapshot = (self.sh.snapshot.borrow())();
                    let json = serde_json::to_string(&snapshot).expect("a snapshot serializes");
                    RawValue::from_string(json).expect("serde_json writes JSON")
                });
                let mut reply = Nodus::act("snapshot");
                reply.id = m.id;
                reply.snapshot = raw.as_deref();
                // Why this process cannot take work, for the primary's readyz.
                reply.text = crate::pool::start_failure();
                self.send_nodus(&reply);
            }
            Some("stats_reply") => {
                let slot = m.id.and_then(|id| self.sh.stats.borrow_mut().remove(&id));
                if let (Some(slot), Some(text)) = (slot, &m.text) {
                    slot.fill(text.clone());
                }
            }
            Some("stopping") => self.sh.stopping.set(true),
            Some("report_load") => {
                self.sh.load.reporting.set(true);
                self.queue_load_report();
            }
            _ => {}
        }
    }

    /// Closes `key` as Node's worker closes a server (`close`) and its round-robin `queue` with
    /// it: connections taken for it and never accepted go back to a nodus primary, after the
    /// `close` (so the primary no longer counts this worker in when it hands them out again).
    /// Once per queue: a queue leaves `rr` here.
    fn close_key(&self, key: &str, queue: &Rc<RrQueue>) {
        let open = {
            let mut rr = self.sh.rr.borrow_mut();
            let ours = rr.get(key).is_some_and(|q| Rc::ptr_eq(q, queue));
            ours && rr.remove(key).is_some()
        };
        if !open {
            return;
        }
        self.send_took_now();
        self.send_cluster(|seq| CloseKey {
            cmd: NODE_CLUSTER,
            act: "close",
            key,
            seq,
        });
        queue.close();
        let queued: Vec<_> = queue.conns.borrow_mut().drain(..).collect();
        if !queued.is_empty() {
            self.give_back(key, queued);
        }
    }

    /// Gives connections taken for `key` but never accepted back to a nodus primary, which hands
    /// them to other workers (a Node primary cannot take them: they close).
    fn give_back(&self, key: &str, conns: Vec<(TcpStream, Option<SocketAddr>)>) {
        if !self.sh.nodus_primary.get() {
            return;
        }
        let mut rest = conns.into_iter().peekable();
        while rest.peek().is_some() {
            let (streams, peers): (Vec<TcpStream>, Vec<Option<SocketAddr>>) =
                rest.by_ref().take(MAX_FDS_PER_FRAME).unzip();
            let msg = NewConns {
                cmd: NODE_NODUS,
                act: "returned",
                key,
                seq: self.next_seq(),
                peers: &peers,
            };
            let fds = streams
                .into_iter()
                .map(|s| Rc::new(OwnedFd::from(s.into_std())))
                .collect();
            if let Err(e) = self.sh.channel.send_fds(&msg, fds) {
                tracing::warn!(target: "nodus::cluster", "cannot give connections back: {e}");
            }
        }
    }

    fn connection_opened(&self) {
        let load = &self.sh.load;
        load.open.set(load.open.get() + 1);
        load.accepted.set(load.accepted.get() + 1);
        self.queue_load_report();
    }

    fn connection_closed(&self) {
        let load = &self.sh.load;
        load.open.set(load.open.get().saturating_sub(1));
        self.queue_load_report();
    }

    fn queue_load_report(&self) {
        let load = &self.sh.load;
        if !load.reporting.get() {
            return;
        }
        match self.sh.board.get() {
            Some(board) => board.post_load(load.open.get(), load.accepted.get()),
            None => {
                load.changed.set(true);
                self.queue_report();
            }
        }
    }

    /// Sends the pending `took` now (before a `close` and `returned`, so the primary never holds
    /// a returned connection as still pending too).
    fn send_took_now(&self) {
        if let Some(ack) = self.sh.took.take() {
            let mut msg = Nodus::act("took");
            msg.ack = Some(ack);
            self.send_nodus(&msg);
        }
    }

    /// Sends, once per loop turn, what changed in it: a `took` for the batches taken (with the
    /// load when that changed too), or a `load` report alone.
    fn queue_report(&self) {
        if self.sh.report_queued.replace(true) {
            return;
        }
        let w = self.clone();
        crate::set_immediate(move || {
            let (sh, load) = (&w.sh, &w.sh.load);
            sh.report_queued.set(false);
            let took = sh.took.take();
            let mut msg = Nodus::act(if took.is_some() { "took" } else { "load" });
            msg.ack = took;
            if load.changed.replace(false) {
                msg.conns = Some(load.open.get());
                msg.accepted_total = Some(load.accepted.get());
            } else if took.is_none() {
                return;
            }
            w.send_nodus(&msg);
        })
        .unref();
    }
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker").field("id", &self.sh.id).finish()
    }
}

/// Connections handed over by the primary for one server key, with the client's address when
/// the primary sent it.
#[derive(Default)]
struct RrQueue {
    conns: RefCell<VecDeque<(TcpStream, Option<SocketAddr>)>>,
    waker: RefCell<Option<Waker>>,
    /// No more connections: the key closed, or the primary's `disconnect` or the channel's end.
    closed: Cell<bool>,
    /// The [`KeyClaim`]s on it.
    claims: Cell<usize>,
    /// The handoff window the `queryServer` that opened it told the primary: its bound is twice
    /// that, whatever `set_handoff_window` says later.
    window: Cell<usize>,
}

impl RrQueue {
    fn push(&self, s: TcpStream) {
        self.conns.borrow_mut().push_back((s, None));
        self.wake();
    }

    fn wake(&self) {
        if let Some(w) = self.waker.borrow_mut().take() {
            w.wake();
        }
    }

    fn close(&self) {
        self.closed.set(true);
        self.wake();
    }
}

/// This worker's hold on one server key, from the `queryServer` that asks for it until the
/// [`Listener`] made from the answer closes, or until the `listen` future is dropped without
/// making one (a late answer is then ignored). The key's queue is in `Shared::rr` (open, taking
/// `newconns`) while a claim on it lives; the last one to go closes the key
/// ([`Worker::close_key`]).
struct KeyClaim {
    worker: Worker,
    key: String,
    queue: Rc<RrQueue>,
}

impl KeyClaim {
    fn new(worker: &Worker, key: String) -> KeyClaim {
        let queue = worker
            .sh
            .rr
            .borrow_mut()
            .entry(key.clone())
            .or_default()
            .clone();
        if queue.claims.get() == 0 {
            queue.window.set(worker.sh.window.get());
        }
        queue.claims.set(queue.claims.get() + 1);
        KeyClaim {
            worker: worker.clone(),
            key,
            queue,
        }
    }
}

impl Drop for KeyClaim {
    /// The last claim tells the primary this worker no longer listens on the key (Node's
    /// `act: 'close'`) and gives a nodus primary back the connections taken for it that nobody
    /// accepted.
    fn drop(&mut self) {
        let claims = self.queue.claims.get() - 1;
        self.queue.claims.set(claims);
        if claims == 0 {
            self.worker.close_key(&self.key, &self.queue);
        }
    }
}

/// Removes a `queryServer` from those waiting for an answer when `listen` ends, answered or
/// dropped: a late answer then matches nothing and is ignored.
struct PendingQuery<'a> {
    sh: &'a Shared,
    seq: u64,
}

impl Drop for PendingQuery<'_> {
    fn drop(&mut self) {
        self.sh.queries.borrow_mut().remove(&self.seq);
    }
}

enum Kind {
    RoundRobin(SocketAddr),
    Shared(TcpListener),
}

/// A listener a worker got from its primary: connections handed over the channel
/// (round-robin, least) or a listening socket of its own (shared, reuse-port). Dropping it
/// closes its key (see [`Worker::disconnect`] for a worker that leaves with listeners open).
pub struct Listener {
    claim: KeyClaim,
    kind: Kind,
}

impl Listener {
    /// The next connection. Under round-robin, after the primary's `disconnect` (or the channel's
    /// end) it yields an `UnexpectedEof` error: no more connections will come.
    pub fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<io::Result<(Stream, SocketAddr)>> {
        let (tcp, peer) = match &self.kind {
            Kind::Shared(l) => match l.poll_accept(cx) {
                Poll::Ready(Ok(pair)) => pair,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            },
            Kind::RoundRobin(_) => {
                let queue = &self.claim.queue;
                let next = queue.conns.borrow_mut().pop_front();
                match next {
                    Some((s, peer)) => {
                        let peer = peer.or_else(|| s.peer_addr().ok());
                        (
                            s,
                            peer.unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0))),
                        )
                    }
                    None if queue.closed.get() => {
                        return Poll::Ready(Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "the cluster primary stopped handing out connections",
                        )));
                    }
                    None => {
                        *queue.waker.borrow_mut() = Some(cx.waker().clone());
                        return Poll::Pending;
                    }
                }
            }
        };
        let worker = &self.claim.worker;
        let counted = worker.sh.load.reporting.get();
        if counted {
            worker.connection_opened();
        }
        Poll::Ready(Ok((
            Stream {
                tcp,
                worker: counted.then(|| worker.clone()),
            },
            peer,
        )))
    }

    /// The next connection.
    ///
    /// # Errors
    /// As [`poll_accept`](Self::poll_accept).
    pub async fn accept(&self) -> io::Result<(Stream, SocketAddr)> {
        poll_fn(|cx| self.poll_accept(cx)).await
    }

    /// The address clients connect to: the listening socket's (shared, reuse-port), or the one
    /// the primary bound and said in its answer (round-robin, least; a primary that said none:
    /// the address asked for).
    ///
    /// # Errors
    /// `getsockname` fails (shared listeners).
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        match &self.kind {
            Kind::Shared(l) => l.local_addr(),
            Kind::RoundRobin(addr) => Ok(*addr),
        }
    }

    /// The listening socket a shared or reuse-port listener accepts on (`None` under
    /// round-robin or least). A shared one is every worker's: its options are theirs too.
    pub fn socket(&self) -> Option<&TcpListener> {
        match &self.kind {
            Kind::Shared(l) => Some(l),
            Kind::RoundRobin(_) => None,
        }
    }

    /// Whether connections come over the channel (round-robin or least) rather than from a
    /// socket of this worker's own.
    pub fn is_round_robin(&self) -> bool {
        matches!(self.kind, Kind::RoundRobin(..))
    }
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("key", &self.claim.key)
            .field("round_robin", &self.is_round_robin())
            .finish()
    }
}

/// A connection from a cluster [`Listener`]: a [`TcpStream`] that counts itself open for the
/// `least` policy until dropped.
pub struct Stream {
    tcp: TcpStream,
    worker: Option<Worker>,
}

impl Deref for Stream {
    type Target = TcpStream;
    fn deref(&self) -> &TcpStream {
        &self.tcp
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if let Some(w) = &self.worker {
            w.connection_closed();
        }
    }
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.tcp.fmt(f)
    }
}
