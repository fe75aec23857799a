//! Handing accepted connections to workers, and the primary's reference to each handed one until
//! the worker took it (pending handoffs): dispatch by policy, parking what nobody has room for,
//! refusals, give-backs, the release of what a worker posted on its board, and the settling of a
//! dead worker's handoffs.
//!
//! Invariants:
//! - Connections are handed out per worker in one message: `newconns` with up to 64 fds to a
//!   nodus worker, one `newconn` each to a Node worker (its protocol takes one handle per round
//!   trip).
//! - Round-robin hands a connection to a worker with handoffs untaken only while that worker
//!   keeps up (`balance`): by its loop's word, the hold its board mirrors (in none of
//!   [`balance::HOLD_LIMIT`] or more) and how long its oldest untaken handoff has waited
//!   ([`Pending::oldest_sent_ns`]); a worker that says nothing of its loop, only while none is
//!   free and it was seen taking some within [`balance::PIPELINE_WINDOW`]
//!   ([`Pending::quiet_ns`], by the loop's clock; when it took what its board shows is known
//!   only to within the primary's looks, and counts as the look before, never later than it
//!   was). With none free or keeping up the connection waits in the primary (parked,
//!   [`has_room`] false: the accept task accepts no more) for the first worker that takes its
//!   handoffs ([`took`] wakes the accept task; the release pass reads the boards every 1 ms
//!   while anything is parked). So a worker whose loop is busy (a long synchronous request) gets
//!   the one it was handed while free, as under Node's round-robin, which hands a connection
//!   only to a worker that answered its last one, and more only in the window after its last
//!   take, while workers that keep up are handed connections without waiting for each answer.
//!   `least` is not concerned: any worker under the cap takes.
//! - The primary keeps its reference to every handed connection until the worker took it, in
//!   `Proc::pending`; a refused batch, or whatever a dead worker had not taken, goes to another
//!   worker (a worker that refused gets nothing for [`REFUSAL_PAUSE`]: it may be at its
//!   open-files limit). A nodus worker with a board posts what it took there ([`release_taken`]
//!   reads it before every dispatch, on the worker's `close` and exit, and from a release pass
//!   that runs every 1 ms, backing off to 50 ms while nothing moves, as long as anything is
//!   pending); others answer with `took` (nodus) or `accepted` (Node).
//! - A worker is stalled ([`stalled`]: one rule for routing and for readyz's
//!   `Primary::ready_state`) once the primary has waited [`HANDOFF_DEADLINE`] for its loop, by
//!   whichever signal shows it first: a handoff to it not taken (a Node worker's `newconn`
//!   counted from the answer to the one before, when its channel writes it: [`on_accepted`]); a
//!   snapshot request not answered, with nothing else heard from it since
//!   (`stats::loop_stalled`); or batches taken back from it that it has not seen yet
//!   (`seen_below` on its board). A stalled worker gets no new connection: its share goes to
//!   the others.
//! - The wait is counted up to the primary's last complete read of what the workers sent
//!   (`crate::time::polled_ns`: the loop's time before its last poll phase, once every event
//!   that phase took was dispatched), never to the clock alone: when the primary itself was
//!   stopped (SIGSTOP, a frozen VM, a long page-in), its clock jumps in the timers phase while
//!   what the workers sent meanwhile (an answer, a `took`, an `accepted`) still waits in their
//!   sockets for the poll phase. So a pause of the primary stalls no worker that answered, or
//!   took its handoffs, during it; a real stall is seen up to a loop turn later. Handing
//!   connections costs nothing more (one cached time read, as before).
//! - What a stalled worker has not taken is taken back, however recently it was handed, where
//!   that cannot have two processes serve one connection, and handed to another worker
//!   ([`take_back`], from a watch task that runs while anything is pending, a worker is behind or
//!   a request to one is unanswered): from a nodus worker with a board, every batch it has not
//!   claimed, by compare-and-swap on the board (`board.rs`: the worker's claim and the take-back
//!   exclude each other; a worker that loses closes its copies of the fds without `shutdown`);
//!   from a Node worker, the `newconn`s its channel still holds behind the one in flight (never
//!   written, [`Channel::take_back_held_handles`](crate::ipc::Channel::take_back_held_handles));
//!   the one in flight, and whatever a nodus worker without a board was sent, stay with the
//!   worker (nothing on their side would know they were taken back). Nothing is taken back once
//!   the primary stopped accepting (no other worker would take it). Each one is counted
//!   (`Proc::taken_back`, in the stats and metrics); each stall is said once, and its end.
//!   Until the stalled worker reads its channel, its copies keep those sockets open in the
//!   kernel: the worker that serves one must end it with a `shutdown` (nodus-http's server
//!   does, at every close), not a bare close, for its client to see it end.
//! - A stall ends as soon as the worker shows its loop runs: any message from it
//!   ([`heard_from`], the answer to the request above included), its `seen_below` reaching the
//!   end of the take-back (looked at every [`CATCH_UP_POLL`]), or the late handoff taken.
//!   Connections parked meanwhile are offered to it at once. While every member is stalled,
//!   new connections wait in the primary (parked, within its bounds) for the first worker that
//!   runs again rather than being handed to a stalled one, where they would wait for that one
//!   (a Node worker's in flight, a board-less worker's batch) or come back after the deadline.
//!   Node's primary, which knows no stall, hands a stalled worker one connection (its
//!   round-robin waits for each one's ACK) and queues the rest in the primary too.
//! - While connections are handed, [`dispatch`] probes its members ([`stats::probe`]: a snapshot
//!   request that asks for no snapshot, to a worker that answers them, has none unanswered and
//!   was last asked [`FRESH`](super::stats::FRESH) ago or more): at most one small message each
//!   way per worker per second, no timer of its own and no syscall added to a handoff, so
//!   routing learns of a stall without a readyz request, often before a connection waits on it.
//!   An idle primary probes only when readyz or the stats ask.
//! - A worker that is not ready, or said it cannot take work (`Proc::unready`: a pool that
//!   cannot start a thread), gets no new connection while another member of the listener is
//!   ready and did not ([`takes_now`], [`serves_fully`]: a new generation's worker in a reload
//!   waits for its ready; with no such member, as at the start, every member takes connections).
//! - What a worker gives back (`returned`) is handed on only after [`check_returned`]: each fd
//!   must be a connected, non-listening stream socket of the listener's family and local address
//!   (an fd the worker accepted from that listener: TCP on its address and port, Unix on its
//!   path); anything else (a pipe, a UDP socket, a socket of another family, a listener, a
//!   connection of its own elsewhere, one already reset) is closed and counted
//!   (`returned_rejected`, in the stats), logged once per worker process.
//! - A Node worker's handoff sends a duplicate of the fd (its channel owns what it sends until
//!   the ACK). At the fd limit one of the primary's reserved fds (`fd_reserve`) is given up for that duplicate; when
//!   none can be made the connections stay parked (the worker stays a member) and the accept
//!   task tries again after [`RETRY_PAUSE`], within the parking bound.
//! - What repeats as fast as connections come while a process is at its open-files limit (a
//!   Node worker that could not receive one, a duplicate that could not be made, a failed
//!   accept) is logged once, then counted: one summary line per 10 s while it lasts ([`Floods`]),
//!   not one line per connection or per [`RETRY_PAUSE`].

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::rc::Rc;
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, SockRef, Type};

use super::balance::{self, Candidate};
use super::parked::{self, Conn, MAX_PARKED};
use super::proc::{Proc, ProcState};
use super::server::{self, Addr, Member, RETRY_PAUSE, Server, leave_all};
use super::{Policy, State, count, stats};
use crate::cluster::board::LoopHold;
use crate::cluster::protocol::{Incoming, NODE_CLUSTER, NODE_NODUS, NewConn, NewConns};
use crate::ipc::{MAX_FDS_PER_FRAME, SendHandle};
use crate::log_limit::{self, LogLimit};

/// Connections handed to one worker in one message, kept until it answers.
struct Handoff {
    server: Rc<Server>,
    conns: Vec<Conn>,
    /// When it was handed (the loop's time, ns).
    sent_ns: u64,
}

/// How long a handoff may wait for its worker to take it before the primary takes it back (where
/// it can) and gives the worker no more connections until it does. A worker takes a handoff in
/// the loop turn after it arrives, so a healthy one is far inside this even under load; one past
/// it has its loop blocked (a busy loop, a long synchronous call) or stopped (SIGSTOP, a
/// debugger), and its clients already wait a second. The release pass sees a taken handoff
/// within 50 ms, so nothing healthy is taken back for want of a look; and a connection taken
/// back goes to another worker once, so one taken back from a worker that was only slow costs
/// nothing but the wait. `--ready-timeout` (30 s by default) is a start-up bound, far too long
/// for a client waiting on a worker that was serving.
pub(super) const HANDOFF_DEADLINE: Duration = Duration::from_secs(1);

/// Handoffs a worker has not answered, by `seq`, with the number of connections in them.
#[derive(Default)]
pub(super) struct Pending {
    handoffs: RefCell<BTreeMap<u64, Handoff>>,
    conns: Cell<u64>,
    /// When the worker last took handoffs, as far as the primary can tell (the loop's time,
    /// ns): when it said so, or, read on its board, when the primary last looked there before.
    progress_ns: Cell<u64>,
    /// When the primary last read the worker's board with handoffs pending (the loop's time,
    /// ns).
    looked_ns: Cell<u64>,
}

impl Pending {
    /// Connections handed and not yet taken.
    pub fn conns(&self) -> u64 {
        self.conns.get()
    }

    fn insert(&self, seq: u64, handoff: Handoff) {
        self.conns
            .set(self.conns.get() + handoff.conns.len() as u64);
        self.handoffs.borrow_mut().insert(seq, handoff);
    }

    fn remove(&self, seq: u64) -> Option<Handoff> {
        let h = self.handoffs.borrow_mut().remove(&seq)?;
        self.conns.set(self.conns.get() - h.conns.len() as u64);
        Some(h)
    }

    fn is_empty(&self) -> bool {
        self.handoffs.borrow().is_empty()
    }

    fn contains(&self, seq: u64) -> bool {
        self.handoffs.borrow().contains_key(&seq)
    }

    /// The oldest handoff still pending waits for its worker from `now` on, unless it did from
    /// later already.
    fn restart_oldest(&self, now: u64) {
        if let Some(mut oldest) = self.handoffs.borrow_mut().first_entry() {
            let h = oldest.get_mut();
            h.sent_ns = h.sent_ns.max(now);
        }
    }

    /// The worker took handoffs at `at`.
    fn progressed(&self, at: u64) {
        self.progress_ns.set(self.progress_ns.get().max(at));
    }

    /// How long, at `now`, since the worker was last seen taking handoffs (as long as `now`
    /// itself if never). Round-robin hands one that says nothing of its loop, with handoffs
    /// untaken, more only under [`balance::PIPELINE_WINDOW`]. Being free shows nothing of the
    /// kind: its loop may be busy with the connection it took last (a long request), so such a
    /// worker handed one while free gets more only once it takes that one, in a burst too.
    fn quiet_ns(&self, now: u64) -> u64 {
        now.saturating_sub(self.progress_ns.get())
    }

    /// When the oldest handoff still pending was handed (the loop's time, ns).
    fn oldest_sent_ns(&self) -> Option<u64> {
        self.handoffs
            .borrow()
            .first_key_value()
            .map(|(_, h)| h.sent_ns)
    }

    fn last_seq(&self) -> Option<u64> {
        self.handoffs.borrow().last_key_value().map(|(&seq, _)| seq)
    }

    /// Removes every handoff with a `seq` from `start` on.
    fn remove_from(&self, start: u64) -> Vec<Handoff> {
        let done: Vec<Handoff> = self
            .handoffs
            .borrow_mut()
            .split_off(&start)
            .into_values()
            .collect();
        let n: usize = done.iter().map(|h| h.conns.len()).sum();
        self.conns.set(self.conns.get() - n as u64);
        done
    }

    /// Removes every handoff with a `seq` below `end`.
    fn remove_below(&self, end: u64) -> Vec<Handoff> {
        let mut map = self.handoffs.borrow_mut();
        let rest = map.split_off(&end);
        let done: Vec<Handoff> = std::mem::replace(&mut *map, rest).into_values().collect();
        let n: usize = done.iter().map(|h| h.conns.len()).sum();
        self.conns.set(self.conns.get() - n as u64);
        done
    }

    fn take_all(&self) -> Vec<Handoff> {
        self.conns.set(0);
        std::mem::take(&mut *self.handoffs.borrow_mut())
            .into_values()
            .collect()
    }
}

/// A Node-protocol answer to one `newconn`. Its channel writes the next `newconn` it held only
/// once this one was acknowledged (one handle at a time): that one waits for the worker from
/// now, however long the primary held it (a pause of the primary itself included).
pub(super) fn on_accepted(st: &Rc<State>, proc: &Rc<Proc>, ack: u64, accepted: bool) {
    if accepted {
        let done = proc.pending.remove(ack).into_iter().collect();
        let now = crate::time::loop_now_ns();
        proc.pending.restart_oldest(now);
        took(proc, done, now);
    } else {
        refused(st, proc, ack);
        proc.pending.restart_oldest(crate::time::loop_now_ns());
    }
}

/// A nodus worker took every handoff up to `ack` that it did not refuse.
pub(super) fn on_took(proc: &Rc<Proc>, ack: u64) {
    let done = proc.pending.remove_below(ack.saturating_add(1));
    took(proc, done, crate::time::loop_now_ns());
}

/// Drops the references to the handoffs `proc` posted on its board as taken, unless a refusal it
/// posted is still on its way (that batch must go to another worker from these references). The
/// board says what was taken, not when: what is found taken now was taken after the last look
/// and after its handoff, so it counts as taken at the later of the two (never later than it
/// was: a worker that took a batch and then blocked its loop is not seen taking now).
pub(super) fn release_taken(proc: &Proc) {
    let Some(board) = proc.board.get() else {
        return;
    };
    if proc.pending.is_empty() {
        return;
    }
    let before = proc.pending.looked_ns.replace(crate::time::loop_now_ns());
    if let Some(below) = board.releasable_below(proc.refusals_seen.get()) {
        let done = proc.pending.remove_below(below);
        let sent = done.iter().map(|h| h.sent_ns).max().unwrap_or(0);
        took(proc, done, sent.max(before));
    }
}

/// First and longest pause of the release pass.
const RELEASE_FIRST: Duration = Duration::from_millis(1);
const RELEASE_MAX: Duration = Duration::from_millis(50);

/// Makes sure a release pass runs while a worker with a board has handoffs pending: without new
/// connections nothing else would read its board, and the primary's reference keeps a
/// connection the worker closed from closing. It looks every [`RELEASE_FIRST`] while
/// connections wait in the primary (round-robin holds them there while no worker is free or
/// taking its handoffs: the first that takes some gets them), else backs off while nothing moves.
fn arm_release(st: &Rc<State>) {
    if st.release_armed.replace(true) {
        return;
    }
    let st = st.clone();
    crate::task::spawn_named("cluster:release", async move {
        let mut pause = RELEASE_FIRST;
        loop {
            crate::time::sleep(pause).await;
            let before = board_pending(&st);
            st.procs.borrow().values().for_each(|p| release_taken(p));
            let after = board_pending(&st);
            if after == 0 {
                break;
            }
            pause = if after < before || any_parked(&st) {
                RELEASE_FIRST
            } else {
                (pause * 2).min(RELEASE_MAX)
            };
        }
        st.release_armed.set(false);
    })
    .detach();
}

/// Connections handed to workers with a board and not yet released.
fn board_pending(st: &State) -> u64 {
    st.procs
        .borrow()
        .values()
        .filter(|p| p.board.get().is_some())
        .map(|p| p.pending.conns())
        .sum()
}

/// `proc` took `handoffs`, at `at` (the loop's time, ns) as far as the primary can tell.
fn took(proc: &Proc, handoffs: Vec<Handoff>, at: u64) {
    if handoffs.is_empty() {
        return;
    }
    proc.pending.progressed(at);
    for h in handoffs {
        let n = h.conns.len() as u64;
        proc.handed.set(proc.handed.get() + n);
        proc.slot_taken.set(proc.slot_taken.get() + n);
        // Room for more: parked connections may be waiting for it.
        if !h.server.parked.is_empty() {
            h.server.wake_accept();
        }
    }
    runs_again(proc, crate::time::polled_ns());
}

/// Whether a handoff to `proc` is past [`HANDOFF_DEADLINE`] at `now`.
fn overdue(proc: &Proc, now: u64) -> bool {
    proc.pending
        .oldest_sent_ns()
        .is_some_and(|sent| now.saturating_sub(sent) >= HANDOFF_DEADLINE.as_nanos() as u64)
}

/// Whether `proc` is stalled (see the module docs), so it gets no new connection: a handoff past
/// the deadline, its loop silent as long while a request waits for it, or batches taken back
/// from it that it has not seen yet. `now` is `crate::time::polled_ns`: the primary's last
/// complete look at what its workers sent, never a time whose messages it has not read yet.
pub(super) fn stalled(proc: &Proc, now: u64) -> bool {
    proc.behind_until.get().is_some() || overdue(proc, now) || stats::loop_stalled(proc, now)
}

/// `proc` sent a message (handled just now, an answer having cleared its request already): its
/// loop runs, so batches taken back from it no longer hold it back, and its silence starts over.
/// The end of a stall said is said; parked connections, if any, may go to it now (whether or not
/// its stall had been said: the watch may not have looked yet).
pub(super) fn heard_from(st: &State, proc: &Proc) {
    proc.heard_ns.set(crate::time::loop_now_ns());
    proc.behind_until.set(None);
    let now = crate::time::polled_ns();
    if !stalled(proc, now) {
        runs_again(proc, now);
        wake_parked(st);
    }
}

/// Says once that a worker said to be stalled takes connections again.
fn runs_again(proc: &Proc, now: u64) {
    if proc.stall_said.get() && !stalled(proc, now) {
        proc.stall_said.set(false);
        tracing::info!(
            target: "nodus::cluster",
            "worker {} (pid {}) runs again: it takes connections again",
            proc.slot, proc.pid
        );
    }
}

/// Whether `proc`, a member of a server where `ready_member` says whether any member is ready,
/// may be handed a connection now (given room under its in-flight cap): not draining, not
/// pausing after a refusal, not stalled, and ready unless no member is.
fn takes_now(proc: &Proc, ready_member: bool, now: u64) -> bool {
    proc.state.get() < ProcState::Draining
        && (serves_fully(proc) || !ready_member)
        && !pausing(proc)
        && !stalled(proc, now)
}

/// Whether `proc` is ready and did not say it cannot take work (`Proc::unready`: a pool that
/// cannot start a thread, whose requests it would answer 503): while a member of its server
/// does, it gets no new connection; while none does, every member takes them (a 503 with
/// `Retry-After` is better than a reset).
fn serves_fully(proc: &Proc) -> bool {
    proc.is_ready() && proc.unready.borrow().is_none()
}

/// How often the watch looks whether a worker that had batches taken back has seen them.
const CATCH_UP_POLL: Duration = Duration::from_millis(50);

/// Makes sure the stall watch runs while any handoff is pending, a worker is behind a take-back
/// or a request to a worker is unanswered: when a worker becomes stalled (a handoff's deadline,
/// or its loop silent as long) it takes back what that worker has not taken and says the stall
/// ([`take_back`]), and every [`CATCH_UP_POLL`] it looks whether a worker behind has caught up
/// (then parked connections may go to it). Each wakes it at its own time; what it hands on, or
/// a request sent after it went to sleep, never needs it sooner than it is armed for (deadlines
/// come in the order things were sent). It decides as of `crate::time::polled_ns`; a due time
/// the loop's clock has passed and that one has not waits for the next poll phase (a yield), so
/// woken by its timer after the primary itself was stopped, it decides only once the loop has
/// read what the workers sent meanwhile.
pub(super) fn arm_deadline(st: &Rc<State>) {
    if st.deadline_armed.replace(true) {
        return;
    }
    let st = st.clone();
    crate::task::spawn_named("cluster:handoff-deadline", async move {
        let deadline = HANDOFF_DEADLINE.as_nanos() as u64;
        loop {
            // Silence is judged as of the loop's last complete read; the catch-up look, and the
            // wait for the next decision, go by its clock.
            let (now, clock) = (crate::time::polled_ns(), crate::time::loop_now_ns());
            let procs: Vec<Rc<Proc>> = st.procs.borrow().values().cloned().collect();
            for p in &procs {
                release_taken(p);
                if overdue(p, now) || stats::loop_stalled(p, now) {
                    take_back(&st, p, now);
                }
                let caught_up = p
                    .behind_until
                    .get()
                    .is_some_and(|end| p.board.get().is_some_and(|b| b.seen_below() >= end));
                if caught_up {
                    p.behind_until.set(None);
                    runs_again(p, now);
                    wake_parked(&st);
                }
            }
            // After every take-back: what it handed on has deadlines too.
            let next = procs
                .iter()
                .filter_map(|p| {
                    let due = p
                        .pending
                        .oldest_sent_ns()
                        .map(|sent| sent + deadline)
                        .filter(|&due| due > now);
                    let silent = stats::silent_from(p)
                        .map(|since| since + deadline)
                        .filter(|&due| due > now);
                    let poll = p
                        .behind_until
                        .get()
                        .map(|_| clock + CATCH_UP_POLL.as_nanos() as u64);
                    due.into_iter().chain(silent).chain(poll).min()
                })
                .min();
            let Some(at) = next else { break };
            if at > clock {
                crate::time::sleep(Duration::from_nanos(at - clock)).await;
            } else {
                crate::task::yield_now().await;
            }
        }
        st.deadline_armed.set(false);
    })
    .detach();
}

/// Wakes the accept task of every server with parked connections (a worker became ready, or
/// runs again after a stall: it may take what waits).
pub(super) fn wake_parked(st: &State) {
    with_servers(st, |server| {
        if !server.parked.is_empty() {
            server.wake_accept();
        }
    });
}

/// Whether any server has connections parked.
fn any_parked(st: &State) -> bool {
    let mut any = false;
    with_servers(st, |server| any |= !server.parked.is_empty());
    any
}

/// Calls `f` with every server, pre-bound ones included.
fn with_servers(st: &State, mut f: impl FnMut(&Rc<Server>)) {
    let servers = st.servers.borrow();
    let prebound = st.prebound.borrow();
    for server in servers.values().chain(prebound.iter().map(|(_, s)| s)) {
        f(server);
    }
}

/// `proc` is stalled (a handoff past [`HANDOFF_DEADLINE`], or its loop silent as long): takes
/// back what can be taken back without two processes serving one connection (see the module
/// docs) and hands it on; says the stall once. It gets no new connections meanwhile
/// ([`stalled`]).
fn take_back(st: &Rc<State>, proc: &Proc, now: u64) {
    if st.accepting_stopped.get() {
        return;
    }
    let late = overdue(proc, now);
    let back = match (proc.board.get(), &proc.channel) {
        (Some(board), _) => match proc.pending.last_seq() {
            Some(last) => {
                let end = last + 1;
                // Below `mark` the worker claimed (or refused) them: released as usual.
                let mark = board.take_back_below(end);
                let back = proc.pending.remove_from(mark);
                if !back.is_empty() {
                    proc.behind_until.set(Some(end));
                }
                release_taken(proc);
                back
            }
            None => Vec::new(),
        },
        (None, Some(channel)) => {
            let mut seqs = Vec::new();
            channel.take_back_held_handles(|msg| {
                let seq = Incoming::parse(msg)
                    .filter(|m| m.is_cluster() && m.act == Some("newconn"))
                    .and_then(|m| m.seq)
                    .filter(|&seq| proc.pending.contains(seq));
                seqs.extend(seq);
                seq.is_some()
            });
            seqs.into_iter()
                .filter_map(|seq| proc.pending.remove(seq))
                .collect()
        }
        (None, None) => return,
    };
    let n: usize = back.iter().map(|h| h.conns.len()).sum();
    proc.taken_back.set(proc.taken_back.get() + n as u64);
    if !proc.stall_said.replace(true) {
        say_stalled(proc, late, n);
    }
    for h in back {
        nonblocking_again(&h.conns);
        let _ = dispatch(st, &h.server, h.conns);
        h.server.wake_accept();
    }
}

/// The stall's line: what showed it (`late`: a handoff past the deadline, else the loop's
/// silence), and what became of the connections handed to it (`n` taken back).
fn say_stalled(proc: &Proc, late: bool, n: usize) {
    let left = proc.pending.conns() as usize;
    let why = if proc.speaks_nodus.get() {
        "a nodus worker without a board could not tell"
    } else {
        "a Node worker's cannot be taken back once written to its channel"
    };
    let done = match (n, left) {
        (0, 0) => String::new(),
        (_, 0) => format!(
            ": {} taken back and handed to the other workers",
            count(n, "connection")
        ),
        (0, _) => format!(
            ": {} already sent stay with it ({why})",
            count(left, "connection")
        ),
        _ => format!(
            ": {} taken back and handed to the other workers, {left} already sent stay with it \
             ({why})",
            count(n, "connection")
        ),
    };
    let what = if late {
        format!("has not taken connections handed to it {HANDOFF_DEADLINE:?} ago")
    } else {
        format!("has not answered the primary for {HANDOFF_DEADLINE:?}")
    };
    tracing::warn!(
        target: "nodus::cluster",
        "worker {} (pid {}) {what} (its loop is blocked or stopped?){done}; it gets no new \
         connections until it runs again",
        proc.slot,
        proc.pid
    );
}

/// Connections a worker had (refused, taken back, or left behind at its exit) are handed on:
/// `O_NONBLOCK` lives in the file description the worker shared, and one that cleared it must
/// not hand the next worker, which adopts them as non-blocking without asking, a blocking
/// socket. One `F_GETFL` each, on these rare paths only.
fn nonblocking_again(conns: &[Conn]) {
    for c in conns {
        let fd = c.fd.as_fd();
        if let Ok(flags) = rustix::fs::fcntl_getfl(fd)
            && !flags.contains(rustix::fs::OFlags::NONBLOCK)
        {
            let _ = rustix::fs::fcntl_setfl(fd, flags | rustix::fs::OFlags::NONBLOCK);
        }
    }
}

/// How long a worker that refused a handoff gets no more connections.
const REFUSAL_PAUSE: Duration = Duration::from_millis(100);

/// The worker refused handoff `ack`: the connections go to someone else (or wait), and the worker
/// gets none for [`REFUSAL_PAUSE`]. A closing worker has already left the server (its `close`,
/// or the drain); one at its open-files limit takes connections again once it has room.
pub(super) fn refused(st: &Rc<State>, proc: &Rc<Proc>, ack: u64) {
    proc.refusals_seen.set(proc.refusals_seen.get() + 1);
    let Some(h) = proc.pending.remove(ack) else {
        return;
    };
    let n = h.conns.len();
    tracing::debug!(
        target: "nodus::cluster",
        "worker {} refused {}",
        proc.slot,
        count(n, "connection")
    );
    proc.refused_at.set(Some(Instant::now()));
    // Whatever could not go out is parked: the accept task retries it.
    nonblocking_again(&h.conns);
    let _ = dispatch(st, &h.server, h.conns);
    h.server.wake_accept();
    release_taken(proc);
    let server = h.server.clone();
    crate::task::spawn_named("cluster:refusal-pause", async move {
        crate::time::sleep(REFUSAL_PAUSE).await;
        server.wake_accept();
    })
    .detach();
}

/// Whether `proc` refused a handoff less than [`REFUSAL_PAUSE`] ago.
fn pausing(proc: &Proc) -> bool {
    proc.refused_at
        .get()
        .is_some_and(|at| at.elapsed() < REFUSAL_PAUSE)
}

/// Whether some member can take a connection now (as [`dispatch`] chooses, after reading the
/// boards as it does).
pub(super) fn has_room(st: &State, server: &Server) -> bool {
    let members = server.members.borrow();
    for m in members.iter() {
        release_taken(&m.proc);
    }
    let ready_member = members.iter().any(|m| serves_fully(&m.proc));
    let now = crate::time::polled_ns();
    let takes = match st.config.policy {
        Policy::Least => balance::least_takes,
        _ => balance::round_robin_takes,
    };
    members
        .iter()
        .any(|m| takes(&candidate(m, ready_member, now)))
}

/// What the balancer knows of `member` of a server where `ready_member` says whether any member
/// is ready, at `now` (`crate::time::polled_ns`, for the stall rule): one that takes nothing now
/// looks full (its cap, [`Member::window`], in flight). How long since it took handoffs goes by the loop's clock instead:
/// `polled_ns` is the time before the last poll's wait, so after a wait for the connections
/// being handed (an idle primary's) it would make a worker that took its last one long before,
/// and may be busy since, look as if it had just taken it. A pause of the primary itself only
/// makes every worker look quiet for a moment: free ones still take, and the first take ends it.
fn candidate(member: &Member, ready_member: bool, now: u64) -> Candidate {
    let proc = &member.proc;
    let in_flight = if takes_now(proc, ready_member, now) {
        proc.pending.conns()
    } else {
        member.window
    };
    let clock = crate::time::loop_now_ns();
    let hold_ns = proc.board.get().and_then(|board| match board.loop_hold() {
        LoopHold::Unknown => None,
        LoopHold::None => Some(0),
        LoopHold::Since(since) => Some(clock.saturating_sub(since)),
    });
    let waited_ns = proc
        .pending
        .oldest_sent_ns()
        .map_or(0, |sent| clock.saturating_sub(sent));
    Candidate {
        in_flight,
        quiet_ns: proc.pending.quiet_ns(clock),
        waited_ns,
        hold_ns,
        stopped: hold_ns.is_some() && waited_ns >= balance::HOLD_LIMIT_NS && proc.is_stopped(clock),
        load: proc.load_estimate(),
        cap: member.window,
    }
}

/// `proc` gave back connections it had taken but not served (its listener for `key` closed
/// with them queued): they go to the other workers, each once [`check_returned`] found it to be
/// a connection accepted on that listener. Anything else a worker sends as `returned` (a stock
/// Node program or a buggy one can send any fd) is closed, counted, and logged once per worker
/// process: never handed on, and never the primary's failure.
pub(super) fn on_returned(st: &Rc<State>, proc: &Proc, key: &str, fds: Vec<OwnedFd>) {
    let server = st.servers.borrow().get(key).cloned();
    if server.is_none() && server::was_released(st, key) {
        // Its listener was released (the worker closed it, the last to hold it): as from a
        // listening socket closed with connections in its queue, nobody will serve them.
        tracing::debug!(
            target: "nodus::cluster",
            "{} given back for {key}, whose listener was released: closed",
            count(fds.len(), "connection")
        );
        proc.handed
            .set(proc.handed.get().saturating_sub(fds.len() as u64));
        return;
    }
    let since = crate::time::loop_now_ns();
    let mut conns = Vec::with_capacity(fds.len());
    let mut rejected = 0;
    for fd in fds {
        let checked = match &server {
            Some(server) => check_returned(&fd, &server.addr),
            None => Err(format!("no listener has the key {key:?}")),
        };
        match checked {
            Ok(peer) => conns.push(Conn {
                fd: Rc::new(fd),
                peer,
                since,
            }),
            Err(why) => {
                rejected += 1;
                if !proc.gave_back_bad_fd.replace(true) {
                    tracing::warn!(
                        target: "nodus::cluster",
                        "worker {} (pid {}) gave back fd {} for {key}, which is not a connection \
                         of that listener ({why}): closed (further ones from this worker are \
                         closed and counted without a log line)",
                        proc.slot, proc.pid, fd.as_raw_fd()
                    );
                }
                drop(fd);
            }
        }
    }
    if rejected > 0 {
        st.returned_rejected
            .set(st.returned_rejected.get() + rejected);
    }
    proc.handed
        .set(proc.handed.get().saturating_sub(conns.len() as u64));
    let Some(server) = server else {
        return;
    };
    if conns.is_empty() {
        return;
    }
    tracing::debug!(
        target: "nodus::cluster",
        "{} given back for {key}",
        count(conns.len(), "connection")
    );
    let _ = dispatch(st, &server, conns);
    server.wake_accept();
}

/// Whether `fd`, given back for the listener bound to `listener`, is a connection accepted on
/// it: a connected stream socket of the listener's family, not listening, TCP whose local port
/// is the listener's (and its address too, unless the listener has every address), or Unix
/// whose local path is the listener's. Returns the TCP client's address (the kernel's, not the
/// worker's word). Makes the socket non-blocking if it is not: the worker it goes to adopts it
/// without `FIONBIO`.
fn check_returned(fd: &OwnedFd, listener: &Addr) -> Result<Option<SocketAddr>, String> {
    let sock = SockRef::from(fd);
    let err = |what: &str, e: io::Error| format!("{what}: {e}");
    let domain = sock.domain().map_err(|e| err("not a socket", e))?;
    let family = match listener {
        Addr::Tcp(a) => Domain::for_address(*a),
        Addr::Unix(_) | Addr::Abstract(_) => Domain::UNIX,
    };
    if domain != family {
        return Err(format!("socket domain {domain:?}"));
    }
    let ty = sock.r#type().map_err(|e| err("SO_TYPE", e))?;
    if ty != Type::STREAM {
        return Err(format!("socket type {ty:?}"));
    }
    if sock.is_listener().map_err(|e| err("SO_ACCEPTCONN", e))? {
        return Err("a listening socket".into());
    }
    let listener = match listener {
        Addr::Tcp(a) => *a,
        Addr::Unix(_) | Addr::Abstract(_) => {
            let local = sock.local_addr().map_err(|e| err("getsockname", e))?;
            let same = match listener {
                Addr::Unix(path) => local.as_pathname() == Some(path.as_path()),
                Addr::Abstract(name) => local.as_abstract_namespace() == Some(name.as_slice()),
                Addr::Tcp(_) => false,
            };
            if !same {
                return Err(format!("its local address is {local:?}, not {listener}"));
            }
            sock.peer_addr().map_err(|e| err("not connected", e))?;
            if !sock.nonblocking().map_err(|e| err("F_GETFL", e))? {
                sock.set_nonblocking(true).map_err(|e| err("F_SETFL", e))?;
            }
            return Ok(None);
        }
    };
    let protocol = sock.protocol().map_err(|e| err("SO_PROTOCOL", e))?;
    if protocol != Some(Protocol::TCP) {
        return Err(format!("protocol {protocol:?}"));
    }
    let local = sock
        .local_addr()
        .map_err(|e| err("getsockname", e))?
        .as_socket()
        .ok_or("no IP address")?;
    if local.port() != listener.port()
        || !(listener.ip().is_unspecified() || local.ip() == listener.ip())
    {
        return Err(format!("its local address is {local}, not {listener}'s"));
    }
    let peer = sock
        .peer_addr()
        .map_err(|e| err("not connected", e))?
        .as_socket()
        .ok_or("no IP peer")?;
    if !sock.nonblocking().map_err(|e| err("F_GETFL", e))? {
        sock.set_nonblocking(true).map_err(|e| err("F_SETFL", e))?;
    }
    Ok(Some(peer))
}

/// How long an exited worker's channel may stay open (a process it left behind holds its end)
/// before its handoffs are settled anyway: every message it sent is in the socket by then.
const CHANNEL_END_WAIT: Duration = Duration::from_secs(1);

/// `proc` exited. Its handoffs are settled once its channel has ended too (at once, normally:
/// the kernel closes its end with the process), so that every message it sent (`refused`,
/// `returned`, `took`) is handled first and nothing it gave back or took goes out twice.
pub(super) fn after_exit(st: &Rc<State>, proc: &Rc<Proc>) {
    if proc.channel.is_none() {
        return; // a plain program: no handoffs
    }
    let (st, proc) = (st.clone(), proc.clone());
    crate::task::spawn_named("cluster:after-exit", async move {
        proc.channel_done.wait(CHANNEL_END_WAIT).await;
        channel_ended(&st, &proc);
    })
    .detach();
}

/// `proc`'s channel ended (or its process is gone and the wait for that is over): every message
/// it sent has been handled. It leaves every server; what its board says it took is released
/// (without the refusal gate: a refusal it posted and never sent names a batch that cannot be
/// told apart, released with the rest rather than risk handing out a taken one twice), and the
/// rest goes to the other workers. Idempotent.
pub(super) fn channel_ended(st: &Rc<State>, proc: &Proc) {
    leave_all(st, proc);
    if let Some(board) = proc.board.get() {
        let done = proc.pending.remove_below(board.settled_below());
        took(proc, done, 0); // its end: no sign of a loop that runs
    }
    redistribute(st, proc);
}

/// Gives every connection `proc` had not taken (it died, or its channel ended) to the other
/// workers.
fn redistribute(st: &Rc<State>, proc: &Proc) {
    for h in proc.pending.take_all() {
        nonblocking_again(&h.conns);
        let _ = dispatch(st, &h.server, h.conns);
        h.server.wake_accept();
    }
}

/// Hands `conns` to the workers of `server` by its policy, one message per worker (per 64
/// connections), and parks what nobody has room for.
///
/// # Errors
/// A connection could not be duplicated for a Node worker (the primary is at its fd limit): it
/// and the rest of that worker's share are parked, for the accept task to try again.
pub(super) fn dispatch(st: &Rc<State>, server: &Rc<Server>, conns: Vec<Conn>) -> io::Result<()> {
    let (targets, parked) = {
        let members = server.members.borrow();
        let now = crate::time::polled_ns();
        for m in members.iter() {
            release_taken(&m.proc);
            stats::probe(st, &m.proc);
        }
        let ready_member = members.iter().any(|m| serves_fully(&m.proc));
        let mut cands: Vec<Candidate> = members
            .iter()
            .map(|m| candidate(m, ready_member, now))
            .collect();
        let mut chosen: Vec<Vec<Conn>> = vec![Vec::new(); members.len()];
        let mut parked = Vec::new();
        let mut cursor = server.cursor.get();
        for conn in conns {
            let pick = match st.config.policy {
                Policy::Least => balance::least(&cands, &mut cursor),
                _ => balance::round_robin(&cands, &mut cursor),
            };
            match pick {
                Some(i) => {
                    cands[i].in_flight += 1;
                    cands[i].load = cands[i].load.saturating_add(1);
                    chosen[i].push(conn);
                }
                None => parked.push(conn),
            }
        }
        server.cursor.set(cursor);
        let targets: Vec<(Member, Vec<Conn>)> = members
            .iter()
            .cloned()
            .zip(chosen)
            .filter(|(_, c)| !c.is_empty())
            .collect();
        (targets, parked)
    };
    let mut result = Ok(());
    for (member, conns) in targets {
        if let Err(e) = handoff(st, server, &member, conns) {
            result = Err(e);
        }
    }
    park(server, parked);
    result
}

/// Parks `conns` on `server`, within the bounds of [`Parked`](parked::Parked).
fn park(server: &Rc<Server>, conns: impl IntoIterator<Item = Conn>) {
    let reset = server.parked.push(conns);
    if reset > 0 {
        let (s, them) = if reset == 1 {
            ("", "it")
        } else {
            ("s", "them")
        };
        tracing::warn!(
            target: "nodus::cluster",
            "{reset} connection{s} to {} reset: no worker took {them} and the primary is stopping \
             or already holds {MAX_PARKED} waiting", server.addr
        );
    }
    parked::arm_expiry(server);
}

/// Hands `conns` to one worker.
///
/// # Errors
/// As [`dispatch`]; the worker stays a member (the shortage is the primary's).
fn handoff(
    st: &Rc<State>,
    server: &Rc<Server>,
    member: &Member,
    conns: Vec<Conn>,
) -> io::Result<()> {
    let proc = &member.proc;
    let Some(channel) = &proc.channel else {
        park(server, conns);
        return Ok(());
    };
    let mut failed = None;
    let mut rest = conns.into_iter().peekable();
    while rest.peek().is_some() {
        let take = if member.batches { MAX_FDS_PER_FRAME } else { 1 };
        let batch: Vec<Conn> = rest.by_ref().take(take).collect();
        let seq = st.next_seq();
        let sent = if member.batches {
            let peers: Vec<Option<SocketAddr>> = batch.iter().map(|c| c.peer).collect();
            let msg = NewConns {
                cmd: NODE_NODUS,
                act: "newconns",
                key: &member.key,
                seq,
                peers: &peers,
            };
            channel.send_fds(&msg, batch.iter().map(|c| c.fd.clone()).collect())
        } else {
            // Node's protocol owns the sent fd until its ACK (it may resend it): a duplicate.
            let copy = match st.fd_reserve.dup(&batch[0].fd) {
                Ok(c) => c,
                Err(e) => {
                    if st
                        .floods
                        .no_fd
                        .first(|| format!("worker {}: {e}", proc.slot))
                    {
                        tracing::warn!(
                            target: "nodus::cluster",
                            "worker {}: cannot hand connections over ({e}): they wait to be \
                             tried again in {RETRY_PAUSE:?} (further failures are counted: one \
                             line per {:?})", proc.slot, log_limit::WINDOW
                        );
                    }
                    park(server, batch.into_iter().chain(rest));
                    return Err(e);
                }
            };
            let msg = NewConn {
                cmd: NODE_CLUSTER,
                act: "newconn",
                key: &member.key,
                seq,
            };
            channel.send_handle(&msg, SendHandle::fd(copy))
        };
        match sent {
            Ok(_) => {
                proc.pending.insert(
                    seq,
                    Handoff {
                        server: server.clone(),
                        conns: batch,
                        sent_ns: crate::time::loop_now_ns(),
                    },
                );
                if proc.board.get().is_some() {
                    arm_release(st);
                }
                arm_deadline(st);
            }
            Err(e) => {
                failed = Some(e);
                park(server, batch);
                break;
            }
        }
    }
    if let Some(e) = failed {
        tracing::debug!(target: "nodus::cluster", "worker {}: handoff failed: {e}", proc.slot);
        server.remove_member(proc);
        park(server, rest);
    }
    Ok(())
}

/// The primary's lines whose cause repeats as fast as connections come (a worker, or the primary
/// itself, at its open-files limit): each is logged once, then counted, one line per
/// [`log_limit::WINDOW`] while it lasts ([`LogLimit`]), where a line each made hundreds a second.
pub(super) struct Floods {
    /// A Node worker could not receive a connection ([`not_received`]).
    pub not_received: Rc<LogLimit>,
    /// No duplicate of a connection for a Node worker's handoff ([`handoff`]).
    pub no_fd: Rc<LogLimit>,
    /// An accept failed (`server::back_off`).
    pub accept: Rc<LogLimit>,
    /// The accept task waits for the fd reserve (`server::short_of_fds`).
    pub reserve: Rc<LogLimit>,
    /// A worker could not be started for want of fds (`supervise::spawn_failed`).
    pub spawn: Rc<LogLimit>,
}

impl Floods {
    pub fn new() -> Floods {
        let window = log_limit::WINDOW;
        Floods {
            not_received: LogLimit::new(window, move |n, last| {
                tracing::warn!(
                    target: "nodus::cluster",
                    "{} could not be received by Node workers in the last {window:?} (the last \
                     by {last}): each was handed to another worker or waits in the primary",
                    count(n as usize, "more connection")
                );
            }),
            no_fd: LogLimit::new(window, move |n, last| {
                tracing::warn!(
                    target: "nodus::cluster",
                    "{} to Node workers could not be made in the last {window:?} (the last: \
                     {last}): their connections waited in the primary to be tried again",
                    count(n as usize, "more handoff")
                );
            }),
            accept: LogLimit::new(window, move |n, last| {
                tracing::error!(
                    target: "nodus::cluster",
                    "{} failed in the last {window:?} (the last on {last})",
                    count(n as usize, "more accept")
                );
            }),
            reserve: LogLimit::new(window, move |n, last| {
                tracing::warn!(
                    target: "nodus::cluster",
                    "the primary waited {n} more times in the last {window:?} for the fds it \
                     keeps for its own spawns (the last: {last}); connections waited in the \
                     kernel's backlog meanwhile"
                );
            }),
            spawn: LogLimit::new(window, move |n, last| {
                tracing::warn!(
                    target: "nodus::cluster",
                    "{} for want of fds in the last {window:?} (the last: {last}); not counted \
                     as crashes",
                    count(n as usize, "more worker start failed")
                );
            }),
        }
    }
}

/// A connection handed to Node worker `proc` never arrived (its channel dropped it after the
/// worker refused it: at its open-files limit, say): said once per burst (`Floods`).
pub(super) fn not_received(st: &State, proc: &Proc) {
    let who = || format!("worker {} (pid {})", proc.slot, proc.pid);
    if st.floods.not_received.first(who) {
        tracing::warn!(
            target: "nodus::cluster",
            "{} could not receive a connection: handing it to another worker (further ones are \
             counted: one line per {:?})",
            who(),
            log_limit::WINDOW
        );
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;
    use std::rc::Rc;

    use rustix::fs::{OFlags, fcntl_getfl, fcntl_setfl};

    use super::{Addr, Conn, check_returned, nonblocking_again};

    #[test]
    fn a_unix_connection_given_back_is_one_accepted_on_the_listeners_path() {
        use std::os::unix::net::{UnixListener, UnixStream};
        let dir = nodus_testkit::tmp::TempDir::new("handoff-unix");
        let (path, other) = (dir.path().join("a.sock"), dir.path().join("b.sock"));
        let (listener, elsewhere) = (
            UnixListener::bind(&path).unwrap(),
            UnixListener::bind(&other).unwrap(),
        );
        let addr = Addr::Unix(path.clone());
        let _client = UnixStream::connect(&path).unwrap();
        let (served, _) = listener.accept().unwrap();
        served.set_nonblocking(false).unwrap();
        let served = served.into();
        assert_eq!(check_returned(&served, &addr), Ok(None));
        assert!(
            fcntl_getfl(served.as_fd())
                .unwrap()
                .contains(OFlags::NONBLOCK)
        );
        // The client's end (no address), a connection of another path, the listener itself, and
        // a TCP connection are not.
        let client = UnixStream::connect(&other).unwrap();
        let (of_other, _) = elsewhere.accept().unwrap();
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let _tcp_client = std::net::TcpStream::connect(tcp.local_addr().unwrap()).unwrap();
        for fd in [
            client.into(),
            of_other.into(),
            listener.into(),
            tcp.accept().unwrap().0.into(),
        ] {
            assert!(check_returned(&fd, &addr).is_err(), "{fd:?}");
        }
    }

    #[test]
    fn a_connection_handed_on_is_non_blocking_whatever_its_last_worker_did() {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let conns: Vec<Conn> = [a, b]
            .into_iter()
            .map(|s| Conn {
                fd: Rc::new(s.into()),
                peer: None,
                since: 0,
            })
            .collect();
        // One was left non-blocking, the other cleared (a worker's copy shares the flag).
        fcntl_setfl(conns[0].fd.as_fd(), OFlags::NONBLOCK).unwrap();
        fcntl_setfl(conns[1].fd.as_fd(), OFlags::empty()).unwrap();
        nonblocking_again(&conns);
        for c in &conns {
            assert!(
                fcntl_getfl(c.fd.as_fd())
                    .unwrap()
                    .contains(OFlags::NONBLOCK)
            );
        }
    }
}
