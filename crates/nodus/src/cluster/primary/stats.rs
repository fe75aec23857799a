//! The whole cluster's `/_nodus/stats` (JSON) and `/_nodus/metrics` (OpenMetrics), built by
//! the primary from its own bookkeeping and its workers' snapshots.
//!
//! Invariants: worker snapshots are pulled over the channel when the newest is older than
//! [`FRESH`] (every worker that answers snapshot requests asked at once, each answer awaited at
//! most [`ASK_LIMIT`]): a nodus worker from its `online` on, until its channel ends. A Node
//! worker (it has a channel but never answers) and a plain program (no channel) are not asked.
//! A worker without a fresh answer keeps the last snapshot it sent, served with its age
//! (`snapshot_age_seconds`, `nodus_cluster_worker_snapshot_age_seconds`: since it came), so a
//! worker too busy to answer in time (back-to-back long polls) keeps its loop series, the ones an
//! alert on its utilization reads, rather than dropping out of them for exactly as long as it
//! needs watching; one that never answered has `snapshot: null`. An answer that comes after its
//! wait ran out is kept aside (`Proc::late_snapshot`, unchecked) and taken, being newer, when the
//! next request goes unanswered too. The snapshot goes with the worker: when its channel ends
//! or it exits (a dead worker is in no document). `answering` says whether the snapshot is old:
//! `null` for a worker that is not asked (or not yet), `false` for one that was asked and did
//! not answer in time (stalled, or too busy: its figures are from before, a blocked loop's from
//! before it blocked), whether or not it answered an earlier request, judged against the
//! primary's own progress: a wait that ran out counts only once the loop has read what came by
//! its deadline (`time::polled_ns`), so a pause of the primary (SIGSTOP, a stalled loop) makes
//! no worker that answered meanwhile look silent. Answers are checked (parsed) once every wait
//! is over, so the time one worker's snapshot takes to parse is no other's to answer in.
//! The same requests tell routing and readyz whether a worker's loop runs (`probe`,
//! `loop_stalled`, part of `handoff::stalled`): the oldest one a worker has not answered is kept
//! with its time, so a loop that has left it unanswered for the handoff deadline, with nothing
//! else heard from it meanwhile, is stalled; its next answer, however late, or any other message
//! says it runs again. A probe (`text: "probe"`) asks for no snapshot: a nodus worker answers it
//! without building one (an older one sends its snapshot: kept as a late answer), so the
//! requests routing sends while connections are handed (at most one per worker per second) stay
//! under a hundred bytes each way.
//! `stalled` (`nodus_cluster_worker_stalled` in the metrics) is the primary's own verdict, the
//! one readyz and routing use (`handoff::stalled`, as of `time::polled_ns`), for every worker the
//! primary can watch: one it asks (a nodus worker) or hands connections to (rr and least: a Node
//! worker too). It is `null` (no series) for one it cannot: a Node worker under shared or
//! reuseport, a plain program. `answering` is about snapshots only: a Node worker is never asked,
//! so it is `null` there even while `stalled` is true.
//! The JSON shape is the one `nodus top` and the admin page read (`workers[]` with `worker`,
//! `pid`, `snapshot`, `answering`, `stalled`, `restarts`, `rss_bytes`, plus cluster fields).
//! The primary's own loop (under rr and least every connection passes through it) is measured
//! as a worker's is: its snapshot (`Primary::set_snapshot`, taken on its loop for each document,
//! never old, never left out) is `primary.snapshot` in the JSON, outside `workers[]`, so nothing
//! that counts workers counts it, and in the metrics its loop series are a worker's families
//! with `worker="primary"` and its pid (a slot is a number: no worker's series collides).
//! A snapshot a worker sends is served only if a loop could have sent it: a JSON `Snapshot` of
//! at most [`wire::BYTES`] within [`Snapshot::out_of_bounds`]'s bounds. Any other (malformed,
//! huge, with two series of one name) is refused, the worker shown without a snapshot
//! (`answering` stays true: its loop answered) and said once per worker process, so one worker's
//! bad answer never makes the document or the exposition invalid for the others.
//! A document relayed to a worker (its own `/_nodus/...`, asked over the channel) fits one IPC
//! frame ([`crate::ipc::DEFAULT_MAX_FRAME`], its text JSON-escaped in the reply): past that,
//! the largest worker snapshots are left out, as few as needed ([`fit`]), each such worker
//! saying why (`snapshot_left_out`; `nodus_cluster_worker_snapshot_left_out` in the metrics)
//! and the document that it is trimmed (`trimmed`), so the worker always gets a valid answer
//! rather than none. The primary's own document has no frame and is always whole; the
//! primary's loop snapshot (one loop's, far smaller than a frame) is in either.
//! The worker may be another build than the primary (a rolling reload runs the binary on disk):
//! its snapshot is checked against the wire limits every build keeps, never this build's own
//! table sizes, its fields this build does not know are ignored (and served as sent in the JSON
//! document) and those it lacks read as zero in the metrics (`metrics/snapshot.rs`).
//!
//! The metrics carry every figure of the JSON but a few it keeps for people: the policy, the
//! pids (labels in the metrics), a worker's state by name (`nodus_cluster_worker_up` says
//! ready or not), its handoffs counted per process (the metrics count them per slot, every
//! generation) and the texts of the last reload failure and exit (a 0/1 gauge, an info series).
//!
//! In the metrics every worker series carries `worker` (the slot) and `pid` labels: during a
//! rolling reload or a replacement a slot has two live processes, and with `worker` alone their
//! series would collide (an exposition with duplicate series is rejected by Prometheus).

use std::cell::Ref;
use std::rc::Rc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};
use serde::Serialize;
use serde_json::value::RawValue;

use super::proc::{Proc, ProcState, SnapshotAnswer};
use super::{LastExit, Policy, State};
use crate::cluster::protocol::{Nodus, SNAPSHOT_PROBE};
use crate::cluster::reply::ReplySlot;
use crate::metrics::Snapshot;
use crate::metrics::prometheus::{SnapshotCollector, render_labeled};
use crate::metrics::wire;

/// Snapshots younger than this are served as they are.
pub(super) const FRESH: Duration = Duration::from_secs(1);
/// How long one refresh waits for a worker's answer.
pub(super) const ASK_LIMIT: Duration = Duration::from_millis(500);
/// The `worker` label of the primary's own loop series.
const PRIMARY: &str = "primary";

#[derive(Default)]
pub(super) struct Cache {
    refreshed: Option<Instant>,
    next_id: u64,
}

/// Every live worker process, by slot then age.
fn live_procs(st: &State) -> Vec<Rc<Proc>> {
    let mut procs: Vec<Rc<Proc>> = st
        .procs
        .borrow()
        .values()
        .filter(|p| p.is_alive())
        .cloned()
        .collect();
    procs.sort_by_key(|p| (p.slot, p.unique));
    procs
}

/// Pulls fresh snapshots from every worker that answers them, unless the last pull is recent.
async fn refresh(st: &Rc<State>) {
    let fresh = st
        .stats_cache
        .borrow()
        .refreshed
        .is_some_and(|t| t.elapsed() < FRESH);
    if !fresh {
        ask_all(st, ASK_LIMIT).await;
    }
}

/// Asks every live worker that answers snapshot requests for one at once and waits at most
/// `limit`; returns whether every one answered (a stalled loop cannot).
pub(super) async fn ask_all(st: &Rc<State>, limit: Duration) -> bool {
    let asks: Vec<(Rc<Proc>, u64, ReplySlot<SnapshotAnswer>)> = live_procs(st)
        .into_iter()
        .filter(|p| p.asked_for_snapshots.get())
        .map(|p| {
            let slot = ReplySlot::new();
            let id = ask(st, &p, true);
            p.snapshot_waiters.borrow_mut().insert(id, slot.clone());
            (p, id, slot)
        })
        .collect();
    let deadline = Instant::now() + limit;
    // The deadline on the loop's clock: a wait that ran out is a verdict only once the loop has
    // read everything that came by then (`polled_ns` past it). A pause of the primary itself
    // (stopped, or its loop stalled) runs the timer out with the answers unread in the channel:
    // they are waited for a little longer (at most `limit` more, should the loop never complete
    // a read), and a worker that answered in time is not found silent.
    let due_ns = crate::clock::now_ns() + limit.as_nanos() as u64;
    let mut answers = Vec::with_capacity(asks.len());
    let mut grace = None;
    for (p, id, slot) in asks {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut answer = slot.wait(left.max(Duration::from_millis(1))).await;
        while answer.is_none()
            && crate::time::polled_ns() < due_ns
            && Instant::now() < *grace.get_or_insert_with(|| Instant::now() + limit)
        {
            answer = slot.wait(Duration::from_millis(1)).await;
        }
        p.snapshot_waiters.borrow_mut().remove(&id);
        if answer.is_none()
            && let Some(late) = slot.take()
        {
            // Filled as the last wait ran out, before this task ran again: it came late.
            *p.late_snapshot.borrow_mut() = Some(late);
        }
        answers.push((p, answer));
    }
    // Checked once every wait is over: the time parsing one worker's snapshot takes (4 MiB at
    // most) is no other worker's to answer in.
    let mut all = true;
    for (p, answer) in answers {
        let late = p.late_snapshot.borrow_mut().take();
        if answer.is_none() {
            all = false;
        }
        // Its channel ended meanwhile: no longer asked, it shows neither figures nor silence.
        if !p.asked_for_snapshots.get() {
            continue;
        }
        // Asked and silent, it is not answering, even before its first answer; answering, its
        // loop runs (whatever it sent).
        p.answered_last.set(Some(answer.is_some()));
        // Its newest snapshot: this answer, else one that came after an earlier wait had run
        // out; with neither, the one it has is kept, served with its age.
        let Some((at, json)) = answer.into_iter().chain(late).max_by_key(|(at, _)| *at) else {
            continue;
        };
        // Served only if a loop could have sent it.
        match checked(&json) {
            Ok(parsed) => *p.snapshot.borrow_mut() = Some((at, json, parsed)),
            Err(why) => {
                *p.snapshot.borrow_mut() = None;
                if !p.bad_snapshot_said.replace(true) {
                    tracing::warn!(
                        target: "nodus::cluster",
                        "worker {} (pid {}) sent a snapshot no loop takes ({why}): it is \
                         shown without one (further ones are refused without a line)",
                        p.slot, p.pid
                    );
                }
            }
        }
    }
    st.stats_cache.borrow_mut().refreshed = Some(Instant::now());
    all
}

/// Sends `p` a snapshot request (a probe unless `snapshot`: answered without one) and returns its
/// id; the oldest one it has not answered is remembered (`Proc::unanswered`, cleared when the
/// answer comes, however late), and the stall watch is armed to see it go unanswered.
fn ask(st: &Rc<State>, p: &Proc, snapshot: bool) -> u64 {
    let id = {
        let mut cache = st.stats_cache.borrow_mut();
        cache.next_id += 1;
        cache.next_id
    };
    let mut msg = Nodus::act("snapshot_request");
    msg.id = Some(id);
    if snapshot {
        p.snapshot_asked.set(id);
    } else {
        msg.text = Some(SNAPSHOT_PROBE);
    }
    p.send(&msg);
    let now = crate::time::loop_now_ns();
    p.asked_ns.set(Some(now));
    if p.unanswered.get().is_none() {
        p.unanswered.set(Some((id, now)));
        super::handoff::arm_deadline(st);
    }
    id
}

/// For routing ([`dispatch`](super::handoff::dispatch), while connections are handed) and
/// readyz: asks `p` whether its loop runs, without waiting for the answer, when it answers
/// snapshot requests, has none left unanswered and was last asked [`FRESH`] ago or more (at
/// most one small message each way per worker per second, whoever asks). Its answer, whenever
/// it comes, only clears `Proc::unanswered`.
pub(super) fn probe(st: &Rc<State>, p: &Proc) {
    if !p.asked_for_snapshots.get() || !p.is_alive() || p.unanswered.get().is_some() {
        return;
    }
    // The loop's clock: this paces requests and judges no silence (`polled_ns`, which does, is
    // as old as the loop's last wait for events while it handles them).
    let now = crate::time::loop_now_ns();
    let due = p
        .asked_ns
        .get()
        .is_none_or(|t| now.saturating_sub(t) >= FRESH.as_nanos() as u64);
    if due {
        ask(st, p, false);
    }
}

/// Since when `p`'s loop has been silent while a request waited for it: the oldest request it
/// has not answered, or the last message heard from it if that came later. `None` while no
/// request waits (a worker not asked, a Node worker or a plain program, never waits one).
pub(super) fn silent_from(p: &Proc) -> Option<u64> {
    p.unanswered
        .get()
        .map(|(_, sent)| sent.max(p.heard_ns.get()))
}

/// Whether `p`'s loop has been silent for the handoff deadline (1 s, the bound a handoff gets)
/// while a snapshot request waited for it ([`silent_from`]): it is blocked or stopped. `now` is
/// `crate::time::polled_ns` (see `handoff::stalled`).
pub(super) fn loop_stalled(p: &Proc, now: u64) -> bool {
    silent_from(p).is_some_and(|since| {
        now.saturating_sub(since) >= super::handoff::HANDOFF_DEADLINE.as_nanos() as u64
    })
}

/// The primary's stall verdict on `p` as of `now` (`crate::time::polled_ns`): what readyz and
/// routing go by ([`handoff::stalled`](super::handoff::stalled)). `None` for a worker it cannot
/// watch: one it neither asks for snapshots (a Node worker, a plain program) nor hands
/// connections to (the shared and reuseport policies; a plain program has no channel).
fn stall_verdict(st: &State, p: &Proc, now: u64) -> Option<bool> {
    let handed =
        matches!(st.config.policy, Policy::RoundRobin | Policy::Least) && p.channel.is_some();
    (p.asked_for_snapshots.get() || handed).then(|| super::handoff::stalled(p, now))
}

/// `json` as a snapshot, or why it is none a loop of any build could have sent.
fn checked(json: &str) -> Result<Snapshot, String> {
    if json.len() > wire::BYTES {
        return Err(format!("{} bytes, over {}", json.len(), wire::BYTES));
    }
    let parsed: Snapshot = serde_json::from_str(json).map_err(|e| e.to_string())?;
    match parsed.out_of_bounds() {
        Some(why) => Err(why),
        None => Ok(parsed),
    }
}

/// How long ago `p`'s snapshot came, in seconds; `None` without one.
fn snapshot_age(p: &Proc) -> Option<f64> {
    p.snapshot
        .borrow()
        .as_ref()
        .map(|(at, _, _)| at.elapsed().as_secs_f64())
}

fn rss_bytes(pid: u32) -> Option<u64> {
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * rustix::param::page_size() as u64)
}

fn state_name(s: ProcState) -> &'static str {
    match s {
        ProcState::Starting => "starting",
        ProcState::Online => "online",
        ProcState::Listening => "listening",
        ProcState::Ready => "ready",
        ProcState::Draining => "draining",
        ProcState::Dead => "dead",
    }
}

#[derive(Serialize)]
struct WorkerDoc<'a> {
    worker: u32,
    pid: u32,
    generation: u64,
    state: &'static str,
    restarts: u64,
    rss_bytes: Option<u64>,
    connections_handed: u64,
    /// Connections handed to it and taken back once its loop was found stalled.
    connections_taken_back: u64,
    uptime_seconds: f64,
    /// `None`: it is not asked for snapshots (a plain program, a Node worker) or not yet;
    /// `Some(false)`: it missed the last request (its snapshot, if any, is an older one).
    answering: Option<bool>,
    /// How long ago its snapshot came, in seconds (`None` with no snapshot in this document).
    snapshot_age_seconds: Option<f64>,
    /// The primary found it stalled (routing hands it nothing, readyz counts it): see
    /// [`stall_verdict`]; `None` when the primary cannot tell.
    stalled: Option<bool>,
    snapshot: Option<&'a RawValue>,
    /// Why its snapshot is left out of a document relayed to a worker (`null`: it is not).
    snapshot_left_out: Option<String>,
}

#[derive(Serialize)]
struct ClusterDoc<'a> {
    cluster: bool,
    policy: &'static str,
    workers_up: usize,
    workers_wanted: usize,
    restarts: u64,
    budget_left: u32,
    generation: u64,
    reloading: bool,
    /// Rolling reloads done and failed since the primary started.
    reloads: ReloadsDoc,
    /// Why the last reload to end failed; `null` when it was done (or before any).
    last_reload_failure: Option<String>,
    last_exit: Option<String>,
    /// Fds workers gave back that were not connections of the listener (closed, not handed on).
    returned_rejected: u64,
    /// Connections accepted (rr, least) that waited in the primary for a worker to take them.
    connections_waited: u64,
    /// Datagrams the workers' notify sockets ignored: sent from outside the worker's process
    /// group (any local user can reach an abstract socket).
    notify_ignored: u64,
    /// Orphaned descendants this process adopted as a subreaper, and those it reaped (`null`
    /// without [`Config::subreaper`](super::Config::subreaper)).
    orphans_adopted: Option<u64>,
    orphans_reaped: Option<u64>,
    /// What a document relayed to a worker left out to fit its IPC frame, and why (`null`: it
    /// is whole, as the primary's own always is).
    trimmed: Option<String>,
    primary: PrimaryDoc<'a>,
    workers: Vec<WorkerDoc<'a>>,
}

#[derive(Serialize)]
struct ReloadsDoc {
    done: u64,
    failed: u64,
}

#[derive(Serialize)]
struct PrimaryDoc<'a> {
    pid: u32,
    rss_bytes: Option<u64>,
    uptime_seconds: f64,
    /// The primary's own loop, taken for this document: never left out, never old.
    snapshot: &'a Snapshot,
}

fn slot_restarts(st: &State, slot: u32) -> u64 {
    st.slots
        .borrow()
        .get(slot as usize - 1)
        .map_or(0, |s| s.restarts)
}

/// The subreaper's counts (adopted, reaped), after a pass (an orphan adopted alive is counted
/// at the next pass); `None` without one.
async fn orphans(st: &State) -> Option<(u64, u64)> {
    let reaper = st.reaper.as_ref()?;
    reaper.reap().await;
    Some(reaper.counts())
}

/// What every document starts from: the workers' snapshots refreshed, the adopted orphans
/// reaped and counted, the live workers, and the primary's own loop's snapshot, taken now.
async fn fresh(st: &Rc<State>) -> (Option<(u64, u64)>, Vec<Rc<Proc>>, Snapshot) {
    refresh(st).await;
    let orphans = orphans(st).await;
    let own = (st.own_snapshot.borrow())();
    (orphans, live_procs(st), own)
}

/// The cluster's stats document, every worker's snapshot in it (the primary's own answer).
pub(super) async fn stats_json(st: &Rc<State>) -> String {
    let (orphans, procs, own) = fresh(st).await;
    json_doc(st, orphans, &procs, &own, &Relay::whole(procs.len()))
}

/// The stats document as relayed to a worker in one IPC frame: its JSON-escaped text (the
/// `text` of the reply) at most `budget` bytes, worker snapshots left out, largest first, as
/// that needs ([`fit`]), each such worker saying so (`snapshot_left_out`) and the document too
/// (`trimmed`).
pub(super) async fn stats_json_relayed(st: &Rc<State>, budget: usize) -> String {
    let (orphans, procs, own) = fresh(st).await;
    let sizes = || {
        procs
            .iter()
            .map(|p| {
                p.snapshot
                    .borrow()
                    .as_ref()
                    .map_or(0, |(_, j, _)| escaped_len(j))
            })
            .collect()
    };
    fit(procs.len(), budget, sizes, |relay| {
        json_doc(st, orphans, &procs, &own, relay)
    })
}

/// Which workers' snapshots a document leaves out (by index in its `procs`).
struct Relay {
    left_out: Vec<bool>,
}

impl Relay {
    fn whole(n: usize) -> Relay {
        Relay {
            left_out: vec![false; n],
        }
    }

    fn count(&self) -> usize {
        self.left_out.iter().filter(|&&out| out).count()
    }

    /// The document's word on what it left out; `None` when it is whole.
    fn trimmed(&self) -> Option<String> {
        let n = self.count();
        (n > 0).then(|| {
            format!(
                "{n} of {} worker snapshots left out (largest first, see each worker's \
                 snapshot_left_out): this document was relayed to a worker in one IPC frame, at \
                 most {} bytes; the primary's own /_nodus/stats (--admin) has them all",
                self.left_out.len(),
                crate::ipc::DEFAULT_MAX_FRAME
            )
        })
    }
}

/// The escaped length of `text` as a JSON string's contents (serde_json's escapes): what it
/// takes of an IPC frame as a message's `text`.
fn escaped_len(text: &str) -> usize {
    text.bytes()
        .map(|b| match b {
            b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 2,
            0..0x20 => 6,
            _ => 1,
        })
        .sum()
}

/// Room kept for what leaving snapshots out adds (the notes saying so) when choosing them.
const NOTE_ROOM: usize = 4096;

/// `render`'s text with every worker's part in it if its [`escaped_len`] is at most `budget`;
/// else with the largest parts left out (`sizes`: each worker's part's escaped length, 0 for
/// none), as few as the excess needs, rendered again until it fits or nothing is left to leave
/// out (the rest of a document is far smaller than a frame).
fn fit(
    n: usize,
    budget: usize,
    sizes: impl FnOnce() -> Vec<usize>,
    render: impl Fn(&Relay) -> String,
) -> String {
    let mut relay = Relay::whole(n);
    let mut text = render(&relay);
    let mut len = escaped_len(&text);
    if len <= budget {
        return text;
    }
    let sizes = sizes();
    let mut order: Vec<usize> = (0..n).filter(|&i| sizes[i] > 0).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(sizes[i]));
    let mut order = order.into_iter();
    while len > budget {
        let mut excess = (len - budget + NOTE_ROOM) as isize;
        let mut any = false;
        for i in order.by_ref() {
            relay.left_out[i] = true;
            any = true;
            excess -= sizes[i] as isize;
            if excess <= 0 {
                break;
            }
        }
        if !any {
            break;
        }
        text = render(&relay);
        len = escaped_len(&text);
    }
    text
}

fn json_doc(
    st: &Rc<State>,
    orphans: Option<(u64, u64)>,
    procs: &[Rc<Proc>],
    own: &Snapshot,
    relay: &Relay,
) -> String {
    let snapshots: Vec<Option<Box<RawValue>>> = procs
        .iter()
        .zip(&relay.left_out)
        .map(|(p, &out)| {
            p.snapshot
                .borrow()
                .as_ref()
                .filter(|_| !out)
                .and_then(|(_, j, _)| RawValue::from_string(j.clone()).ok())
        })
        .collect();
    let now = crate::time::polled_ns();
    let workers = procs
        .iter()
        .zip(&snapshots)
        .zip(&relay.left_out)
        .map(|((p, snap), &out)| WorkerDoc {
            worker: p.slot,
            pid: p.pid,
            generation: p.generation,
            state: state_name(p.state.get()),
            restarts: slot_restarts(st, p.slot),
            rss_bytes: rss_bytes(p.pid),
            connections_handed: p.handed.get(),
            connections_taken_back: p.taken_back.get(),
            uptime_seconds: p.started.elapsed().as_secs_f64(),
            answering: p.answered_last.get(),
            snapshot_age_seconds: snap.as_ref().and_then(|_| snapshot_age(p)),
            stalled: stall_verdict(st, p, now),
            snapshot: snap.as_deref(),
            snapshot_left_out: out.then(|| {
                let bytes = p.snapshot.borrow().as_ref().map_or(0, |(_, j, _)| j.len());
                format!("its {bytes}-byte snapshot did not fit the IPC frame this document came in")
            }),
        })
        .collect();
    let doc = ClusterDoc {
        cluster: true,
        policy: st.config.policy.name(),
        workers_up: procs.iter().filter(|p| p.is_ready()).count(),
        workers_wanted: st.config.workers,
        restarts: st.restarts.get(),
        budget_left: st.budget.borrow_mut().left(Instant::now()),
        generation: st.generation.get(),
        reloading: st.reloading.get(),
        reloads: ReloadsDoc {
            done: st.reloads_done.get(),
            failed: st.reloads_failed.get(),
        },
        last_reload_failure: st.last_reload_failure.borrow().clone(),
        last_exit: st.last_exit.borrow().as_ref().map(LastExit::text),
        returned_rejected: st.returned_rejected.get(),
        connections_waited: st.connections_waited.get(),
        notify_ignored: st.notify_ignored.get(),
        orphans_adopted: orphans.map(|(adopted, _)| adopted),
        orphans_reaped: orphans.map(|(_, reaped)| reaped),
        trimmed: relay.trimmed(),
        primary: PrimaryDoc {
            pid: std::process::id(),
            rss_bytes: rss_bytes(std::process::id()),
            uptime_seconds: st.started.elapsed().as_secs_f64(),
            snapshot: own,
        },
        workers,
    };
    serde_json::to_string(&doc).expect("the stats document serializes")
}

/// A series' labels, (name, value).
type Labels = Vec<(String, String)>;

/// A worker process's labels: its slot and its pid (two processes share a slot in a reload).
fn worker_labels(p: &Proc) -> Labels {
    vec![
        ("worker".to_owned(), p.slot.to_string()),
        ("pid".to_owned(), p.pid.to_string()),
    ]
}

/// The primary's own loop's labels: `worker="primary"` (a slot is a number, so no worker's
/// series has it) and its pid.
fn primary_labels() -> Labels {
    vec![
        ("worker".to_owned(), PRIMARY.to_owned()),
        ("pid".to_owned(), std::process::id().to_string()),
    ]
}

/// The cluster's metrics: every worker's series with `worker` and `pid` labels, the primary's
/// loop's with `worker="primary"`, then the cluster's own (the primary's own answer).
pub(super) async fn metrics_text(st: &Rc<State>) -> String {
    let (orphans, procs, own) = fresh(st).await;
    metrics_doc(st, orphans, &procs, &own, &Relay::whole(procs.len()))
}

/// The metrics as relayed to a worker in one IPC frame: their JSON-escaped text at most
/// `budget` bytes, the loop series of workers left out, largest first, as that needs ([`fit`]),
/// each such worker in `nodus_cluster_worker_snapshot_left_out`.
pub(super) async fn metrics_text_relayed(st: &Rc<State>, budget: usize) -> String {
    let (orphans, procs, own) = fresh(st).await;
    let sizes = || {
        procs
            .iter()
            .map(|p| {
                p.snapshot.borrow().as_ref().map_or(0, |(_, _, s)| {
                    escaped_len(&render_labeled(&[(worker_labels(p), s)]))
                })
            })
            .collect()
    };
    fit(procs.len(), budget, sizes, |relay| {
        metrics_doc(st, orphans, &procs, &own, relay)
    })
}

fn metrics_doc(
    st: &Rc<State>,
    orphans: Option<(u64, u64)>,
    procs: &[Rc<Proc>],
    own: &Snapshot,
    relay: &Relay,
) -> String {
    let snapshots: Vec<(Labels, Ref<'_, Snapshot>)> = procs
        .iter()
        .zip(&relay.left_out)
        .filter(|(_, out)| !**out)
        .filter_map(|(p, _)| {
            let snap = Ref::filter_map(p.snapshot.borrow(), |s| s.as_ref().map(|(_, _, s)| s));
            Some((worker_labels(p), snap.ok()?))
        })
        .collect();
    // The workers' loops, then the primary's own (`worker="primary"`, no slot's number).
    let refs: Vec<(Labels, &Snapshot)> = snapshots
        .iter()
        .map(|(l, s)| (l.clone(), &**s))
        .chain([(primary_labels(), own)])
        .collect();
    let mut registry = Registry::default();
    registry.register_collector(Box::new(SnapshotCollector::new(&refs)));
    let up = Gauge::<i64>::default();
    up.set(procs.iter().filter(|p| p.is_ready()).count() as i64);
    registry.register(
        "nodus_cluster_workers_up",
        "Worker processes ready for traffic",
        up,
    );
    let wanted = Gauge::<i64>::default();
    wanted.set(st.config.workers as i64);
    registry.register(
        "nodus_cluster_workers_wanted",
        "Worker slots configured",
        wanted,
    );
    let restarts = Counter::<u64>::default();
    restarts.inc_by(st.restarts.get());
    registry.register(
        "nodus_cluster_restarts",
        "Worker restarts since the primary started",
        restarts,
    );
    let budget = Gauge::<i64>::default();
    budget.set(i64::from(st.budget.borrow_mut().left(Instant::now())));
    registry.register(
        "nodus_cluster_restart_budget_left",
        "Restarts left in the current budget window before the primary gives up",
        budget,
    );
    let generation = Gauge::<i64>::default();
    generation.set(st.generation.get() as i64);
    registry.register(
        "nodus_cluster_generation",
        "Reload generation serving: the number of the last successful rolling reload (failed ones use up a number too)",
        generation,
    );
    let reloads = Family::<Vec<(String, String)>, Counter<u64>>::default();
    for (result, n) in [
        ("done", st.reloads_done.get()),
        ("failed", st.reloads_failed.get()),
    ] {
        reloads
            .get_or_create(&vec![("result".to_owned(), result.to_owned())])
            .inc_by(n);
    }
    registry.register(
        "nodus_cluster_reloads",
        "Rolling reloads that ended, by result: done (every worker replaced) or failed (the new workers never became ready; the old ones keep serving)",
        reloads,
    );
    let reloading = Gauge::<i64>::default();
    reloading.set(i64::from(st.reloading.get()));
    registry.register(
        "nodus_cluster_reloading",
        "Whether a rolling reload is under way (1 from its start until every slot has switched)",
        reloading,
    );
    let reload_failed = Gauge::<i64>::default();
    reload_failed.set(i64::from(st.last_reload_failure.borrow().is_some()));
    registry.register(
        "nodus_cluster_last_reload_failed",
        "Whether the last rolling reload to end failed (1: the program on disk is not what serves, and a crash restart runs it)",
        reload_failed,
    );
    let rejected = Counter::<u64>::default();
    rejected.inc_by(st.returned_rejected.get());
    registry.register(
        "nodus_cluster_returned_fds_rejected",
        "Fds workers gave back as connections that were not connections of the listener (closed, never handed to another worker)",
        rejected,
    );
    let waited = Counter::<u64>::default();
    waited.inc_by(st.connections_waited.get());
    registry.register(
        "nodus_cluster_connections_waited",
        "Connections the primary accepted (rr, least) that waited in it for a worker to take them: no worker was free, or keeping up with what it had been handed",
        waited,
    );
    let notify_ignored = Counter::<u64>::default();
    notify_ignored.inc_by(st.notify_ignored.get());
    registry.register(
        "nodus_cluster_notify_ignored",
        "Datagrams the workers' notify sockets ignored, sent from outside the worker's process group",
        notify_ignored,
    );
    if let Some((adopted, reaped)) = orphans {
        let (adopted_total, reaped_total) = (Counter::<u64>::default(), Counter::<u64>::default());
        adopted_total.inc_by(adopted);
        reaped_total.inc_by(reaped);
        registry.register(
            "nodus_cluster_orphans_adopted",
            "Orphaned descendants of the workers that the primary adopted as their subreaper",
            adopted_total,
        );
        registry.register(
            "nodus_cluster_orphans_reaped",
            "Adopted orphans the primary reaped after their exit",
            reaped_total,
        );
    }
    let me = std::process::id();
    if let Some(bytes) = rss_bytes(me) {
        let rss = Gauge::<i64>::default();
        rss.set(bytes as i64);
        registry.register_with_unit(
            "nodus_cluster_primary_rss",
            "Resident memory of the primary process",
            Unit::Bytes,
            rss,
        );
    }
    let uptime = Gauge::<f64, AtomicU64>::default();
    uptime.set(st.started.elapsed().as_secs_f64());
    registry.register_with_unit(
        "nodus_cluster_primary_uptime",
        "Time since the primary started",
        Unit::Seconds,
        uptime,
    );
    let handed = Family::<Vec<(String, String)>, Counter<u64>>::default();
    for slot in st.slots.borrow().iter() {
        handed
            .get_or_create(&vec![("worker".to_owned(), slot.id.to_string())])
            .inc_by(slot.taken.get());
    }
    registry.register(
        "nodus_cluster_connections_handed",
        "Connections the primary handed to each worker slot, every generation of it (round-robin and least policies), so a reload does not restart the count (per process: connections_handed in /_nodus/stats)",
        handed,
    );
    // Per worker process (DESIGN section 3): ready or not, its generation, uptime and memory,
    // its handoffs not yet taken and those taken back; per slot: restarts.
    let (ready, worker_generation, rss, in_flight) = (
        Family::<Vec<(String, String)>, Gauge<i64>>::default(),
        Family::<Vec<(String, String)>, Gauge<i64>>::default(),
        Family::<Vec<(String, String)>, Gauge<i64>>::default(),
        Family::<Vec<(String, String)>, Gauge<i64>>::default(),
    );
    let worker_uptime = Family::<Vec<(String, String)>, Gauge<f64, AtomicU64>>::default();
    let taken_back = Family::<Vec<(String, String)>, Counter<u64>>::default();
    for p in procs {
        let labels = worker_labels(p);
        ready.get_or_create(&labels).set(i64::from(p.is_ready()));
        worker_generation
            .get_or_create(&labels)
            .set(p.generation as i64);
        worker_uptime
            .get_or_create(&labels)
            .set(p.started.elapsed().as_secs_f64());
        in_flight
            .get_or_create(&labels)
            .set(p.pending.conns() as i64);
        taken_back.get_or_create(&labels).inc_by(p.taken_back.get());
        if let Some(bytes) = rss_bytes(p.pid) {
            rss.get_or_create(&labels).set(bytes as i64);
        }
    }
    registry.register(
        "nodus_cluster_worker_up",
        "Whether the worker process is ready for traffic (0: starting or draining; its state by name is in /_nodus/stats)",
        ready,
    );
    registry.register(
        "nodus_cluster_worker_generation",
        "The reload generation the worker process was started in (during a reload, the old workers have the previous one)",
        worker_generation,
    );
    registry.register_with_unit(
        "nodus_cluster_worker_uptime",
        "Time since the worker process was started",
        Unit::Seconds,
        worker_uptime,
    );
    registry.register_with_unit(
        "nodus_cluster_worker_rss",
        "Resident memory of the worker process",
        Unit::Bytes,
        rss,
    );
    registry.register(
        "nodus_cluster_worker_handoffs_in_flight",
        "Connections handed to the worker process that it has not taken yet",
        in_flight,
    );
    registry.register(
        "nodus_cluster_worker_handoffs_taken_back",
        "Connections handed to the worker process that it had not taken when the primary found its loop stalled (1 s without it taking a connection or answering a request: blocked or stopped), taken back by the primary and handed to another worker",
        taken_back,
    );
    let slot_restarts = Family::<Vec<(String, String)>, Counter<u64>>::default();
    for slot in st.slots.borrow().iter() {
        slot_restarts
            .get_or_create(&vec![("worker".to_owned(), slot.id.to_string())])
            .inc_by(slot.restarts);
    }
    registry.register(
        "nodus_cluster_worker_restarts",
        "Restarts of each worker slot since the primary started",
        slot_restarts,
    );
    let answering = Family::<Vec<(String, String)>, Gauge<i64>>::default();
    for p in procs {
        if let Some(answered) = p.answered_last.get() {
            answering
                .get_or_create(&worker_labels(p))
                .set(i64::from(answered));
        }
    }
    registry.register(
        "nodus_cluster_worker_answering",
        "Whether the worker's loop answered the primary's last snapshot request in time, 0.5 s (0: blocked or too busy; its loop series are those of the last snapshot it sent, nodus_cluster_worker_snapshot_age_seconds old)",
        answering,
    );
    let age = Family::<Vec<(String, String)>, Gauge<f64, AtomicU64>>::default();
    for (p, _) in procs.iter().zip(&relay.left_out).filter(|(_, out)| !**out) {
        if let Some(secs) = snapshot_age(p) {
            age.get_or_create(&worker_labels(p)).set(secs);
        }
    }
    registry.register_with_unit(
        "nodus_cluster_worker_snapshot_age",
        "Time since the primary got the snapshot the worker's loop series here come from: up to about 1 s while its loop answers (the primary asks again when its newest is 1 s old), growing while it does not (nodus_cluster_worker_answering 0: blocked, or too busy to answer in 0.5 s; its series are then from before); no series for a worker without them",
        Unit::Seconds,
        age,
    );
    let stalled = Family::<Vec<(String, String)>, Gauge<i64>>::default();
    let now = crate::time::polled_ns();
    for p in procs {
        if let Some(verdict) = stall_verdict(st, p, now) {
            stalled
                .get_or_create(&worker_labels(p))
                .set(i64::from(verdict));
        }
    }
    registry.register(
        "nodus_cluster_worker_stalled",
        "Whether the primary found the worker process stalled (1: a connection handed to it or a request to its loop waited 1 s, its loop blocked or stopped; it is handed no connection, and readyz fails once every ready worker is; no series for a worker the primary cannot watch: a Node worker under shared or reuseport, a plain program)",
        stalled,
    );
    if relay.count() > 0 {
        let left_out = Family::<Vec<(String, String)>, Gauge<i64>>::default();
        for (p, _) in procs.iter().zip(&relay.left_out).filter(|(_, out)| **out) {
            left_out.get_or_create(&worker_labels(p)).set(1);
        }
        registry.register(
            "nodus_cluster_worker_snapshot_left_out",
            "Workers whose loop series this exposition leaves out (value always 1): it was relayed to a worker in one IPC frame, at most 16 MiB, and their series, largest first, did not fit (the primary's own /_nodus/metrics, --admin, has them all)",
            left_out,
        );
    }
    if let Some(last) = st.last_exit.borrow().as_ref() {
        let info = Family::<Vec<(String, String)>, Gauge<i64>>::default();
        info.get_or_create(&vec![
            ("worker".to_owned(), last.worker.to_string()),
            ("reason".to_owned(), last.reason.clone()),
        ])
        .set(1);
        registry.register(
            "nodus_cluster_last_exit",
            "The last worker exit: its slot and why, as labels (value always 1)",
            info,
        );
    }
    let mut out = String::with_capacity(32 * 1024);
    prometheus_client::encoding::text::encode(&mut out, &registry)
        .expect("encoding into a String cannot fail");
    out
}

#[cfg(test)]
mod tests {
    use super::{NOTE_ROOM, Relay, escaped_len, fit};

    #[test]
    fn escaped_len_is_what_serde_json_makes_of_a_string() {
        let text = "plain \"quoted\" back\\slash\n\r\t\u{8}\u{c}\u{1}\u{1f} é ✓ \u{2028}";
        let escaped = serde_json::to_string(text).unwrap();
        assert_eq!(escaped_len(text), escaped.len() - 2);
    }

    /// Parts of 100, 300, 200 and 0 bytes (escaped) and 10 of the rest: the largest left out,
    /// as few as the budget needs, and rendered again until it fits.
    #[test]
    fn fit_leaves_out_the_largest_parts_as_few_as_needed() {
        let sizes = [100, 300, 200, 0].map(|n| n * NOTE_ROOM);
        let render = |relay: &Relay| {
            let kept: usize = (0..4)
                .filter(|&i| !relay.left_out[i])
                .map(|i| sizes[i])
                .sum();
            "x".repeat(10 + kept)
        };
        let whole = 10 + 600 * NOTE_ROOM;
        assert_eq!(fit(4, whole, || unreachable!(), render).len(), whole);
        // Past the budget by one byte: the largest (300) alone.
        assert_eq!(
            fit(4, whole - 1, || sizes.to_vec(), render).len(),
            whole - 300 * NOTE_ROOM
        );
        // Room for 250: largest first, the 300 then the 200.
        let got = fit(4, 10 + 250 * NOTE_ROOM, || sizes.to_vec(), render);
        assert_eq!(got.len(), 10 + 100 * NOTE_ROOM);
        // Room for none: all left out, what is left served however long.
        assert_eq!(fit(4, 5, || sizes.to_vec(), render).len(), 10);
    }

    /// A render that grows as parts are left out (their notes), past what the sizes said: one
    /// more is left out.
    #[test]
    fn fit_renders_again_until_the_notes_fit_too() {
        let sizes = [10 * NOTE_ROOM; 3];
        let render = |relay: &Relay| {
            let kept: usize = (0..3)
                .filter(|&i| !relay.left_out[i])
                .map(|i| sizes[i])
                .sum();
            "x".repeat(kept + relay.count() * 2 * NOTE_ROOM)
        };
        // One left out would do but for its note (20 + 2 > 21): two.
        let got = fit(3, 21 * NOTE_ROOM, || sizes.to_vec(), render);
        assert_eq!(got.len(), 14 * NOTE_ROOM);
    }
}
