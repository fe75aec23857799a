//! What `nodus top` knows: the stats document, the per-worker rows derived from two successive
//! fetches, and the history behind the sparklines.
//!
//! `/_nodus/stats` answers either one [`Snapshot`] (a single process) or the cluster shape
//! `{"workers": [{"worker": id, "pid": pid, "snapshot": Snapshot|null, ...}, ...], "restarts",
//! "budget_left", "workers_wanted", "generation"}` (the shape the admin page reads too). Both deserialize into
//! [`ClusterStats`]; a single snapshot becomes one worker.
//!
//! A cluster document may carry the primary's own loop (`primary.snapshot`, the same shape as a
//! worker's; under rr and least every connection passes through it): it is a row of its own
//! ([`Model::primary`], its window kept as a worker's), outside `rows`, so no count, sum, chart
//! or stall list of the workers has it. A document without it (an older primary, or one process)
//! has no primary row.
//!
//! Rows: the previous snapshot of every worker pid is kept, and utilization (busy ÷ busy + idle),
//! requests/s, pool completions/s and the "recent" percentiles (schedule delay, timer lateness,
//! pool queue wait) come from the difference between it and the current one, so they cover the
//! refresh interval. Where that difference is empty (first fetch, no new samples) the snapshot's
//! own figures are used: the last runtime interval for utilization, the lifetime for percentiles.
//! A snapshot served again unchanged (a primary answers from snapshots up to 1 s old, so a
//! refresh faster than that gets the same one twice; a worker that does not answer keeps its
//! last one) is no new window: its figures stay those of the window that ended with it (the
//! snapshot before it to it), never a difference of a snapshot with itself, which would read as
//! no traffic. A row says whether its figures cover such a window ([`Row::windowed`]).
//! Run-queue mean and max are the runtime's last completed interval (lifetime before one exists).
//!
//! Version skew: a worker may be an older build whose snapshot lacks a field this one reads as a
//! default. A figure whose zero would read as a fact is shown only if the snapshot has it: task
//! panics (`tasks.panics_total`) are `None` in a [`Row`] when absent ([`ClusterStats::parse`]
//! looks for the field itself); a stall's `polls` of 0 (absent) says nothing about a drain.
//! A worker whose snapshot a relayed document left out (`snapshot_left_out`, the document's
//! `trimmed`: it did not fit the IPC frame that document came in) keeps the reason, so it is
//! shown as left out, not as one that does not report.

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use nodus::metrics::{Histogram, HistogramSnapshot, Snapshot, StallReport};
use serde::Deserialize;

/// Samples kept per worker and for the cluster: 10 minutes at the default 1 s interval.
pub const HISTORY: usize = 600;

/// The document served at `/_nodus/stats`, in either shape.
#[derive(Debug, Deserialize)]
#[serde(from = "StatsDoc")]
pub struct ClusterStats {
    pub workers: Vec<WorkerStats>,
    /// Restarts across all workers since the primary started.
    pub restarts: u64,
    /// Restarts the primary may still make within its budget window.
    pub budget_left: Option<u64>,
    /// Worker slots configured (`workers_wanted`): more than `workers` lists while slots wait
    /// out a restart's backoff.
    pub workers_wanted: Option<u64>,
    /// Reload generation (incremented by every rolling reload).
    pub generation: Option<u64>,
    /// Whether the document had the cluster shape (false: one process's own snapshot).
    pub cluster: bool,
    /// What a document relayed to a worker left out to fit its IPC frame (`None`: it is whole).
    pub trimmed: Option<String>,
    /// The primary's own loop (`primary` with its `pid`, `rss_bytes`, `uptime_seconds` and
    /// `snapshot`, read as a worker's fields are): `None` without a snapshot (an older primary
    /// sends none, and one process's document has no primary).
    pub primary: Option<Box<WorkerStats>>,
}

/// One worker of the cluster shape (or the primary, whose fields are a subset of these).
#[derive(Debug, Deserialize)]
pub struct WorkerStats {
    /// Worker id (slot number) given by the primary.
    #[serde(default)]
    pub worker: Option<u64>,
    #[serde(default)]
    pub pid: Option<u32>,
    /// `null` while the worker starts or does not report.
    #[serde(default)]
    pub snapshot: Option<Snapshot>,
    /// Restarts of this worker slot.
    #[serde(default)]
    pub restarts: u64,
    /// Resident set size, as the primary reads it (else the snapshot's own `rss_bytes`).
    #[serde(default)]
    pub rss_bytes: Option<u64>,
    /// How long the process has been up, as the primary counts it (else the snapshot's own).
    #[serde(default)]
    pub uptime_seconds: Option<f64>,
    /// `false`: its loop did not answer the primary's last request in time (blocked or too
    /// busy; its first one included), so its snapshot, if any, is the last one it sent (older
    /// primaries gave none); absent or `null` for a worker the primary does not ask (a plain
    /// program, a Node worker), whose figures are unknown.
    #[serde(default)]
    pub answering: Option<bool>,
    /// How long ago the primary got its snapshot, in seconds (`None`: no snapshot, or an older
    /// primary, which does not say).
    #[serde(default)]
    pub snapshot_age_seconds: Option<f64>,
    /// `true`: the primary found it stalled (a connection handed to it, or a request to its
    /// loop, waited 1 s), so it is handed no connection; absent or `null` where the primary
    /// cannot tell (a Node worker under shared or reuseport, a plain program, an older primary).
    #[serde(default)]
    pub stalled: Option<bool>,
    /// Why a document relayed to a worker left this worker's snapshot out (`None`: it did not).
    #[serde(default)]
    pub snapshot_left_out: Option<String>,
    /// Whether its snapshot has `tasks.panics_total` (an older build's lacks it); set by
    /// [`ClusterStats::parse`].
    #[serde(skip)]
    pub panics_known: bool,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum StatsDoc {
    Cluster(RawCluster),
    Single(Box<Snapshot>),
}

#[derive(Deserialize)]
struct RawCluster {
    workers: Vec<WorkerStats>,
    #[serde(default)]
    restarts: u64,
    #[serde(default)]
    budget_left: Option<u64>,
    #[serde(default)]
    workers_wanted: Option<u64>,
    #[serde(default)]
    generation: Option<u64>,
    #[serde(default)]
    trimmed: Option<String>,
    #[serde(default)]
    primary: Option<Box<WorkerStats>>,
}

/// Which snapshots of a document have `tasks.panics_total` (read apart from [`Snapshot`], whose
/// missing fields read as 0).
#[derive(Deserialize)]
#[serde(untagged)]
enum PanicsProbe {
    Cluster {
        workers: Vec<ProbeWorker>,
        #[serde(default)]
        primary: Option<ProbeWorker>,
    },
    Single(ProbeSnapshot),
}

#[derive(Deserialize)]
struct ProbeWorker {
    #[serde(default)]
    snapshot: Option<ProbeSnapshot>,
}

#[derive(Default, Deserialize)]
struct ProbeSnapshot {
    #[serde(default)]
    tasks: ProbeTasks,
}

#[derive(Default, Deserialize)]
struct ProbeTasks {
    #[serde(default)]
    panics_total: Option<u64>,
}

impl ProbeSnapshot {
    fn panics_known(&self) -> bool {
        self.tasks.panics_total.is_some()
    }
}

impl From<StatsDoc> for ClusterStats {
    fn from(doc: StatsDoc) -> ClusterStats {
        match doc {
            StatsDoc::Cluster(c) => ClusterStats {
                workers: c.workers,
                restarts: c.restarts,
                budget_left: c.budget_left,
                workers_wanted: c.workers_wanted,
                generation: c.generation,
                cluster: true,
                trimmed: c.trimmed,
                primary: c.primary.filter(|p| p.snapshot.is_some()),
            },
            StatsDoc::Single(s) => ClusterStats {
                workers: vec![WorkerStats {
                    worker: None,
                    pid: Some(s.pid),
                    snapshot: Some(*s),
                    restarts: 0,
                    rss_bytes: None,
                    uptime_seconds: None,
                    answering: None,
                    snapshot_age_seconds: None,
                    stalled: None,
                    snapshot_left_out: None,
                    panics_known: false,
                }],
                restarts: 0,
                budget_left: None,
                workers_wanted: None,
                generation: None,
                cluster: false,
                trimmed: None,
                primary: None,
            },
        }
    }
}

impl ClusterStats {
    /// Parses a stats document, with a precise message when it is neither shape.
    pub fn parse(body: &[u8]) -> Result<ClusterStats, String> {
        let mut stats = ClusterStats::parse_shape(body)?;
        match serde_json::from_slice::<PanicsProbe>(body) {
            Ok(PanicsProbe::Cluster { workers, primary }) => {
                for (w, p) in stats.workers.iter_mut().zip(workers) {
                    w.panics_known = p.snapshot.is_some_and(|s| s.panics_known());
                }
                if let (Some(w), Some(p)) = (&mut stats.primary, primary) {
                    w.panics_known = p.snapshot.is_some_and(|s| s.panics_known());
                }
            }
            Ok(PanicsProbe::Single(s)) => {
                for w in &mut stats.workers {
                    w.panics_known = s.panics_known();
                }
            }
            Err(_) => {}
        }
        Ok(stats)
    }

    fn parse_shape(body: &[u8]) -> Result<ClusterStats, String> {
        serde_json::from_slice(body).map_err(|_| {
            match serde_json::from_slice::<serde_json::Value>(body) {
                Err(e) => format!("invalid JSON: {e}"),
                Ok(v) if v.get("workers").is_some() => {
                    match serde_json::from_value::<RawCluster>(v) {
                        Err(e) => format!("bad cluster stats: {e}"),
                        Ok(_) => "unexpected JSON shape".into(),
                    }
                }
                Ok(v) => match serde_json::from_value::<Snapshot>(v) {
                    Err(e) => format!("not a nodus stats document: {e}"),
                    Ok(_) => "unexpected JSON shape".into(),
                },
            }
        })
    }
}

/// One pool of one worker (or of the whole cluster: summed, wait = worst worker).
#[derive(Debug, Clone, PartialEq)]
pub struct PoolRow {
    pub pool: String,
    /// Threads (summed over `workers`: not the size of any one pool).
    pub threads: u64,
    /// How many workers' pools this row sums (1 for one worker's own).
    pub workers: u64,
    /// The smallest and largest pool among them (the same for one worker, and in a cluster
    /// whose workers all have the same size).
    pub threads_min: u64,
    pub threads_max: u64,
    pub busy: u64,
    pub queue_depth: u64,
    /// Queue wait p99 in ns (recent, or lifetime when nothing new was queued).
    pub wait_p99: Option<u64>,
    pub completed_per_s: Option<f64>,
}

/// One stall, with the worker it happened in.
#[derive(Debug, Clone)]
pub struct StallRow {
    pub pid: u32,
    pub stall: StallReport,
}

/// One worker's line, derived from its current and previous snapshots.
#[derive(Debug, Clone, Default)]
pub struct Row {
    pub worker: Option<u64>,
    pub pid: u32,
    pub uptime_s: Option<f64>,
    pub restarts: u64,
    /// Fraction 0..=1.
    pub util: Option<f64>,
    /// ns.
    pub lateness_p99: Option<u64>,
    pub sched_p50: Option<u64>,
    pub sched_p99: Option<u64>,
    pub rq_mean: Option<f64>,
    pub rq_max: Option<u64>,
    /// Open HTTP connections.
    pub conns: Option<u64>,
    pub req_per_s: Option<f64>,
    pub rss_bytes: Option<u64>,
    pub pools: Vec<PoolRow>,
    /// The current snapshot (details, stalls); `None` while the worker does not report.
    pub snapshot: Option<Snapshot>,
    /// The worker's loop did not answer the primary's last request (see [`WorkerStats`]).
    pub not_answering: bool,
    /// The primary found the worker stalled (see [`WorkerStats`]).
    pub stalled: bool,
    /// Why a relayed document left its snapshot out (see [`WorkerStats`]).
    pub left_out: Option<String>,
    /// Task panics, lifetime, and per task name (those with any, most first); `None` when its
    /// snapshot does not have them (none, or an older build's).
    pub panics: Option<(u64, Vec<(String, u64)>)>,
    /// Its figures cover a window between two snapshots (false: the first one seen of it, so
    /// utilization and the percentiles are the snapshot's own, and there are no rates).
    pub windowed: bool,
    /// How old the primary said its snapshot was (`snapshot_age_seconds`; see [`WorkerStats`]).
    pub snapshot_age: Option<f64>,
}

/// One history sample.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Point {
    /// Utilization in percent (0..=100).
    pub util_pct: u64,
    /// Timer lateness p99 over the sample's interval, µs (0 when no timer fired).
    pub lateness_us: u64,
}

/// A bounded ring of samples.
#[derive(Debug, Default)]
pub struct History {
    points: VecDeque<Point>,
}

impl History {
    fn push(&mut self, p: Point) {
        if self.points.len() == HISTORY {
            self.points.pop_front();
        }
        self.points.push_back(p);
    }

    /// The newest sample.
    pub fn latest(&self) -> Option<Point> {
        self.points.back().copied()
    }

    /// The last samples folded to at most `width` columns (each column: mean utilization, worst
    /// lateness of the samples it covers), oldest first; and how many samples one column covers.
    pub fn columns(&self, width: usize) -> (Vec<u64>, Vec<u64>, usize) {
        let n = self.points.len();
        if width == 0 || n == 0 {
            return (Vec::new(), Vec::new(), 1);
        }
        let per = n.div_ceil(width);
        let pts: Vec<Point> = self.points.iter().copied().collect();
        // Align on the newest sample so the last column is always complete.
        let first = n % per;
        let mut util = Vec::new();
        let mut late = Vec::new();
        if first > 0 {
            util.push(pts[..first].iter().map(|p| p.util_pct).sum::<u64>() / first as u64);
            late.push(
                pts[..first]
                    .iter()
                    .map(|p| p.lateness_us)
                    .max()
                    .unwrap_or(0),
            );
        }
        for chunk in pts[first..].chunks(per) {
            util.push(chunk.iter().map(|p| p.util_pct).sum::<u64>() / chunk.len() as u64);
            late.push(chunk.iter().map(|p| p.lateness_us).max().unwrap_or(0));
        }
        (util, late, per)
    }
}

/// Column to sort the workers by (`s` cycles; metrics sort worst first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SortKey {
    #[default]
    Worker,
    Util,
    Lateness,
    Sched,
    Requests,
    Rss,
}

impl SortKey {
    pub fn next(self) -> SortKey {
        match self {
            SortKey::Worker => SortKey::Util,
            SortKey::Util => SortKey::Lateness,
            SortKey::Lateness => SortKey::Sched,
            SortKey::Sched => SortKey::Requests,
            SortKey::Requests => SortKey::Rss,
            SortKey::Rss => SortKey::Worker,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            SortKey::Worker => "worker",
            SortKey::Util => "util",
            SortKey::Lateness => "lateness",
            SortKey::Sched => "sched p99",
            SortKey::Requests => "req/s",
            SortKey::Rss => "rss",
        }
    }
}

/// Everything shown, updated by each fetch.
#[derive(Debug, Default)]
pub struct Model {
    pub cluster: bool,
    pub restarts: u64,
    pub budget_left: Option<u64>,
    pub workers_wanted: Option<u64>,
    pub generation: Option<u64>,
    /// The document's `trimmed` (see [`ClusterStats`]).
    pub trimmed: Option<String>,
    /// In the order of the document (see [`Model::sorted`]).
    pub rows: Vec<Row>,
    /// The primary's own loop (see [`ClusterStats::primary`]): a row of its own, in none of the
    /// counts, sums, charts or stalls, which are the workers'.
    pub primary: Option<Row>,
    /// Per worker pid.
    pub history: HashMap<u32, History>,
    /// Mean utilization and worst lateness over all workers.
    pub cluster_history: History,
    /// The last snapshot seen of every worker pid (see [`Seen`]).
    prev: HashMap<u32, Seen>,
    /// The last snapshot seen of the primary.
    primary_prev: Option<Seen>,
}

/// The last snapshot seen of a worker, when it was first fetched, and the one before it (the
/// start of the window its figures cover).
#[derive(Debug)]
struct Seen {
    snapshot: Snapshot,
    at: Instant,
    base: Option<(Snapshot, Instant)>,
}

/// Whether `a` and `b` are one snapshot served twice (a primary answers from snapshots up to 1 s
/// old, so a refresh faster than that gets the same one again): the same loop, taken at the
/// same time by the worker's own clocks.
fn same_snapshot(a: &Snapshot, b: &Snapshot) -> bool {
    a.pid == b.pid
        && a.loop_id == b.loop_id
        && a.taken_at_unix_ms == b.taken_at_unix_ms
        && a.uptime_seconds == b.uptime_seconds
}

impl Model {
    /// Takes in one fetch made at `now`.
    pub fn update(&mut self, stats: ClusterStats, now: Instant) {
        self.cluster = stats.cluster;
        self.restarts = stats.restarts;
        self.budget_left = stats.budget_left;
        self.workers_wanted = stats.workers_wanted;
        self.generation = stats.generation;
        self.trimmed = stats.trimmed;
        let mut rows = Vec::with_capacity(stats.workers.len());
        let mut prev = HashMap::new();
        for w in stats.workers {
            let pid = pid_of(&w);
            let (row, seen) = windowed_row(w, pid, self.prev.remove(&pid), now);
            if let Some(seen) = seen {
                let h = self.history.entry(pid).or_default();
                h.push(Point {
                    util_pct: row.util.map_or(0, |u| (u * 100.0).round() as u64),
                    lateness_us: recent_lateness_us(
                        &seen.snapshot,
                        seen.base.as_ref().map(|b| &b.0),
                    ),
                });
                prev.insert(pid, seen);
            }
            rows.push(row);
        }
        // The primary's row: windowed as a worker's, in no history (the charts are the
        // workers').
        let primary = stats.primary.map(|p| {
            let pid = pid_of(&p);
            let seen = self.primary_prev.take().filter(|s| s.snapshot.pid == pid);
            windowed_row(*p, pid, seen, now)
        });
        (self.primary, self.primary_prev) = match primary {
            Some((row, seen)) => (Some(row), seen),
            None => (None, None),
        };
        let reporting: Vec<&Row> = rows.iter().filter(|r| r.snapshot.is_some()).collect();
        if !reporting.is_empty() {
            let pts: Vec<Point> = reporting
                .iter()
                .filter_map(|r| self.history.get(&r.pid)?.latest())
                .collect();
            self.cluster_history.push(Point {
                util_pct: pts.iter().map(|p| p.util_pct).sum::<u64>() / pts.len().max(1) as u64,
                lateness_us: pts.iter().map(|p| p.lateness_us).max().unwrap_or(0),
            });
        }
        self.history.retain(|pid, _| prev.contains_key(pid));
        self.prev = prev;
        self.rows = rows;
    }

    /// Whether a worker whose loop answers has figures over no window yet: its snapshot is
    /// the first seen of it, or the same one again (see [`Row::windowed`]).
    pub fn unwindowed(&self) -> bool {
        self.rows
            .iter()
            .any(|r| r.snapshot.is_some() && !r.windowed && !r.not_answering)
    }

    /// Rows in display order.
    pub fn sorted(&self, key: SortKey) -> Vec<&Row> {
        let mut rows: Vec<&Row> = self.rows.iter().collect();
        let desc = |a: f64, b: f64| b.total_cmp(&a);
        let f = |v: Option<f64>| v.unwrap_or(-1.0);
        let u = |v: Option<u64>| v.map_or(-1.0, |x| x as f64);
        rows.sort_by(|a, b| match key {
            SortKey::Worker => (a.worker, a.pid).cmp(&(b.worker, b.pid)),
            SortKey::Util => desc(f(a.util), f(b.util)),
            SortKey::Lateness => desc(u(a.lateness_p99), u(b.lateness_p99)),
            SortKey::Sched => desc(u(a.sched_p99), u(b.sched_p99)),
            SortKey::Requests => desc(f(a.req_per_s), f(b.req_per_s)),
            SortKey::Rss => desc(u(a.rss_bytes), u(b.rss_bytes)),
        });
        rows
    }

    /// Pools of one worker, or summed over all workers (wait: the worst worker's; `workers` and
    /// the smallest and largest size say what the thread total is made of).
    pub fn pools(&self, pid: Option<u32>) -> Vec<PoolRow> {
        let mut out: Vec<PoolRow> = Vec::new();
        for r in self.rows.iter().filter(|r| pid.is_none_or(|p| p == r.pid)) {
            for p in &r.pools {
                match out.iter_mut().find(|o| o.pool == p.pool) {
                    Some(o) => {
                        o.threads += p.threads;
                        o.workers += p.workers;
                        o.threads_min = o.threads_min.min(p.threads_min);
                        o.threads_max = o.threads_max.max(p.threads_max);
                        o.busy += p.busy;
                        o.queue_depth += p.queue_depth;
                        o.wait_p99 = o.wait_p99.max(p.wait_p99);
                        o.completed_per_s = match (o.completed_per_s, p.completed_per_s) {
                            (Some(a), Some(b)) => Some(a + b),
                            (a, b) => a.or(b),
                        };
                    }
                    None => out.push(p.clone()),
                }
            }
        }
        out
    }

    /// Stalls of one worker or of all, newest first.
    pub fn stalls(&self, pid: Option<u32>) -> Vec<StallRow> {
        let mut out: Vec<StallRow> = self
            .rows
            .iter()
            .filter(|r| pid.is_none_or(|p| p == r.pid))
            .filter_map(|r| Some((r.pid, r.snapshot.as_ref()?)))
            .flat_map(|(pid, s)| {
                s.stalls.iter().map(move |st| StallRow {
                    pid,
                    stall: st.clone(),
                })
            })
            .collect();
        out.sort_by_key(|s| std::cmp::Reverse(s.stall.at_unix_ms));
        out
    }
}

/// The pid of `w`: the document's, else its snapshot's.
fn pid_of(w: &WorkerStats) -> u32 {
    w.pid
        .or(w.snapshot.as_ref().map(|s| s.pid))
        .unwrap_or_default()
}

/// `w`'s row as fetched at `now`, `seen` the last snapshot seen of it; and what to keep of it for
/// the next fetch (`None` without a snapshot).
fn windowed_row(
    mut w: WorkerStats,
    pid: u32,
    seen: Option<Seen>,
    now: Instant,
) -> (Row, Option<Seen>) {
    // The window the figures cover: from the snapshot before this one. The same snapshot
    // served again keeps the window (and so the figures) it had: a rate between a snapshot and
    // itself is no traffic only in appearance.
    let (base, at) = match (&w.snapshot, seen) {
        (Some(s), Some(seen)) if same_snapshot(s, &seen.snapshot) => (seen.base, seen.at),
        (_, seen) => (seen.map(|seen| (seen.snapshot, seen.at)), now),
    };
    let row = derive_row(&w, pid, base.as_ref(), at);
    let snapshot = w.snapshot.take();
    let seen = snapshot.clone().map(|snapshot| Seen { snapshot, at, base });
    (Row { snapshot, ..row }, seen)
}

/// `w`'s row: its figures over the window from `before` (a snapshot of it and when it was
/// fetched) to its current snapshot, first fetched at `now`.
fn derive_row(
    w: &WorkerStats,
    pid: u32,
    before: Option<&(Snapshot, Instant)>,
    now: Instant,
) -> Row {
    let mut row = Row {
        worker: w.worker,
        pid,
        restarts: w.restarts,
        // The primary's figure if it gives one, else the worker's own (0 = unknown).
        rss_bytes: w
            .rss_bytes
            .or_else(|| w.snapshot.as_ref().map(|s| s.rss_bytes).filter(|&b| b > 0)),
        // The primary's figure covers a worker that sends no snapshot (a plain program).
        uptime_s: w
            .uptime_seconds
            .or_else(|| w.snapshot.as_ref().map(|s| s.uptime_seconds)),
        not_answering: w.answering == Some(false),
        stalled: w.stalled == Some(true),
        left_out: w.snapshot_left_out.clone(),
        snapshot_age: w.snapshot.as_ref().and(w.snapshot_age_seconds),
        ..Row::default()
    };
    let Some(s) = &w.snapshot else {
        return row;
    };
    if w.panics_known {
        let mut by_task: Vec<(String, u64)> = s
            .task_classes
            .iter()
            .filter(|c| c.panics > 0)
            .map(|c| (c.name.clone(), c.panics))
            .collect();
        by_task.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        row.panics = Some((s.tasks.panics_total, by_task));
    }
    row.windowed = before.is_some();
    let prev = before.map(|b| &b.0);
    let ls = &s.loop_stats;
    row.util = Some(
        prev.and_then(|p| {
            let busy = ls.busy_seconds - p.loop_stats.busy_seconds;
            let idle = ls.idle_seconds - p.loop_stats.idle_seconds;
            (busy >= 0.0 && idle >= 0.0 && busy + idle > 0.0).then(|| busy / (busy + idle))
        })
        .unwrap_or(if ls.interval_seconds > 0.0 {
            ls.interval_utilization
        } else {
            ls.utilization
        }),
    );
    let recent = |cur: &HistogramSnapshot, old: Option<&HistogramSnapshot>, q: f64| {
        recent_quantile(cur, old, q)
    };
    row.lateness_p99 = recent(
        &ls.timer_lateness,
        prev.map(|p| &p.loop_stats.timer_lateness),
        0.99,
    );
    row.sched_p50 = recent(
        &ls.schedule_delay,
        prev.map(|p| &p.loop_stats.schedule_delay),
        0.5,
    );
    row.sched_p99 = recent(
        &ls.schedule_delay,
        prev.map(|p| &p.loop_stats.schedule_delay),
        0.99,
    );
    let rq = &s.run_queue;
    if ls.interval_seconds > 0.0 {
        row.rq_mean = Some(rq.interval_mean);
        row.rq_max = Some(rq.interval_max);
    } else {
        row.rq_mean = Some(rq.mean);
        row.rq_max = Some(rq.max);
    }
    row.conns = Some(s.http.connections_open);
    let dt = before.and_then(|(p, at)| {
        let ms = s.taken_at_unix_ms.checked_sub(p.taken_at_unix_ms)?;
        if ms > 0 {
            Some(ms as f64 / 1000.0)
        } else {
            let d = now.duration_since(*at).as_secs_f64();
            (d > 0.0).then_some(d)
        }
    });
    let rate = |cur: u64, old: u64| Some(cur.checked_sub(old)? as f64 / dt?);
    let responses = |s: &Snapshot| s.http.responses_by_class.iter().sum::<u64>();
    row.req_per_s = prev.and_then(|p| rate(responses(s), responses(p)));
    row.pools = s
        .pools
        .iter()
        .map(|pool| {
            let old = prev.and_then(|p| p.pools.iter().find(|o| o.pool == pool.pool));
            PoolRow {
                pool: pool.pool.clone(),
                threads: pool.threads,
                workers: 1,
                threads_min: pool.threads,
                threads_max: pool.threads,
                busy: pool.busy_threads,
                queue_depth: pool.queue_depth,
                wait_p99: recent_quantile(&pool.queue_wait, old.map(|o| &o.queue_wait), 0.99),
                completed_per_s: old.and_then(|o| rate(pool.completed_total, o.completed_total)),
            }
        })
        .collect();
    row
}

/// Quantile `q` of the values added between `old` and `cur` (the same histogram, later), or of
/// `cur` as a whole when nothing was added or there is no `old`; `None` when empty.
fn recent_quantile(
    cur: &HistogramSnapshot,
    old: Option<&HistogramSnapshot>,
    q: f64,
) -> Option<u64> {
    if let Some(old) = old.filter(|o| o.count < cur.count) {
        let before: HashMap<u64, u64> = old.buckets.iter().copied().collect();
        let buckets: Vec<(u64, u64)> = cur
            .buckets
            .iter()
            .filter_map(|&(ub, c)| {
                let d = c.saturating_sub(before.get(&ub).copied().unwrap_or(0));
                (d > 0).then_some((ub, d))
            })
            .collect();
        if !buckets.is_empty() {
            let delta = HistogramSnapshot {
                buckets,
                sum: cur.sum.saturating_sub(old.sum),
                min: cur.min,
                max: cur.max,
                ..HistogramSnapshot::default()
            };
            return Some(Histogram::from_snapshot(&delta).value_at_quantile(q));
        }
    }
    (cur.count > 0).then(|| Histogram::from_snapshot(cur).value_at_quantile(q))
}

/// Timer lateness p99 of the timers fired since `prev` (µs; 0 when none fired or there is no
/// `prev` to tell which are new).
fn recent_lateness_us(cur: &Snapshot, prev: Option<&Snapshot>) -> u64 {
    let cur_h = &cur.loop_stats.timer_lateness;
    match prev {
        Some(p) if p.loop_stats.timer_lateness.count < cur_h.count => {
            recent_quantile(cur_h, Some(&p.loop_stats.timer_lateness), 0.99)
                .map_or(0, |ns| ns.div_ceil(1000))
        }
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn hist(values: &[u64]) -> HistogramSnapshot {
        let mut h = Histogram::new();
        for &v in values {
            h.record(v);
        }
        h.snapshot()
    }

    #[test]
    fn both_shapes_parse() {
        let snap = serde_json::to_string(&Snapshot {
            pid: 42,
            ..Snapshot::default()
        })
        .unwrap();
        let one = ClusterStats::parse(snap.as_bytes()).unwrap();
        assert!(!one.cluster);
        assert_eq!(one.workers.len(), 1);
        assert_eq!(one.workers[0].pid, Some(42));
        let doc = format!(
            r#"{{"workers":[{{"worker":0,"pid":42,"snapshot":{snap}}},{{"worker":1,"pid":43,"snapshot":null,"restarts":2,"uptime_seconds":7.5}}],"restarts":2,"budget_left":3,"generation":1}}"#
        );
        let c = ClusterStats::parse(doc.as_bytes()).unwrap();
        assert!(c.cluster);
        assert_eq!(
            (c.restarts, c.budget_left, c.generation),
            (2, Some(3), Some(1))
        );
        assert_eq!(c.workers[1].restarts, 2);
        assert!(c.workers[1].snapshot.is_none());
        assert_eq!(c.workers[1].uptime_seconds, Some(7.5));
        let e = ClusterStats::parse(b"{\"pid\": 1}").unwrap_err();
        assert!(e.contains("missing field"), "{e}");
        assert!(
            ClusterStats::parse(b"nope")
                .unwrap_err()
                .contains("invalid JSON")
        );
    }

    #[test]
    fn deltas_between_fetches() {
        let mut s = Snapshot {
            pid: 7,
            taken_at_unix_ms: 10_000,
            ..Snapshot::default()
        };
        s.loop_stats.busy_seconds = 1.0;
        s.loop_stats.idle_seconds = 9.0;
        s.loop_stats.utilization = 0.1;
        s.loop_stats.timer_lateness = hist(&[1_000; 100]);
        s.http.responses_by_class = [0, 100, 0, 0, 0];
        let mut m = Model::default();
        let t0 = Instant::now();
        let one = |s: &Snapshot| ClusterStats::from(StatsDoc::Single(Box::new(s.clone())));
        m.update(one(&s), t0);
        assert_eq!(m.rows[0].util, Some(0.1));
        assert_eq!(m.rows[0].req_per_s, None);
        let lifetime = m.rows[0].lateness_p99.unwrap();
        assert!((900..=1_100).contains(&lifetime), "{lifetime}");

        s.taken_at_unix_ms = 12_000;
        s.loop_stats.busy_seconds = 2.5;
        s.loop_stats.idle_seconds = 9.5;
        s.http.responses_by_class = [0, 300, 0, 0, 100];
        let mut late: Vec<u64> = vec![1_000; 100];
        late.extend([1_000_000; 10]);
        s.loop_stats.timer_lateness = hist(&late);
        m.update(one(&s), t0);
        let r = &m.rows[0];
        assert!((r.util.unwrap() - 0.75).abs() < 1e-9);
        assert_eq!(r.req_per_s, Some(150.0));
        let recent = r.lateness_p99.unwrap();
        assert!((950_000..=1_050_000).contains(&recent), "{recent}");
        let h = &m.history[&7];
        assert_eq!(h.points.len(), 2);
        assert_eq!(h.points[1].util_pct, 75);
        assert_eq!(h.points[0].lateness_us, 0);
        let late = h.points[1].lateness_us;
        assert!((950..=1_050).contains(&late), "{late}");
        assert_eq!(m.cluster_history.points.len(), 2);
    }

    /// A primary answers from snapshots up to 1 s old: fetched faster, the same snapshot comes
    /// twice. It keeps the figures of the window that ended with it, not a difference of a
    /// snapshot with itself (no requests, the runtime's own last interval's utilization).
    #[test]
    fn the_same_snapshot_again_keeps_its_window() {
        let mut s = Snapshot {
            pid: 7,
            loop_id: 1,
            taken_at_unix_ms: 10_000,
            uptime_seconds: 10.0,
            ..Snapshot::default()
        };
        s.loop_stats.busy_seconds = 1.0;
        s.loop_stats.idle_seconds = 9.0;
        s.loop_stats.interval_seconds = 1.0;
        s.loop_stats.interval_utilization = 0.9;
        s.loop_stats.timer_lateness = hist(&[1_000; 100]);
        s.http.responses_by_class = [0, 100, 0, 0, 0];
        let cluster = |s: &Snapshot| {
            let doc = serde_json::json!({"workers": [{"worker": 1, "pid": 7, "snapshot": s}]});
            ClusterStats::parse(doc.to_string().as_bytes()).unwrap()
        };
        let mut m = Model::default();
        let t0 = Instant::now();
        m.update(cluster(&s), t0);
        assert!(!m.rows[0].windowed && m.unwindowed());
        // Served again: still no window.
        m.update(cluster(&s), t0 + Duration::from_millis(500));
        assert!(!m.rows[0].windowed && m.unwindowed());
        assert_eq!(m.rows[0].req_per_s, None);

        s.taken_at_unix_ms = 11_000;
        s.uptime_seconds = 11.0;
        s.loop_stats.busy_seconds = 1.5;
        s.loop_stats.idle_seconds = 9.5;
        s.http.responses_by_class = [0, 300, 0, 0, 0];
        let mut late: Vec<u64> = vec![1_000; 100];
        late.extend([1_000_000; 10]);
        s.loop_stats.timer_lateness = hist(&late);
        m.update(cluster(&s), t0 + Duration::from_secs(1));
        let measured = m.rows[0].clone();
        assert!(measured.windowed && !m.unwindowed());
        assert_eq!(measured.req_per_s, Some(200.0));
        assert_eq!(measured.util, Some(0.5));
        let point = m.history[&7].latest().unwrap();
        assert_eq!(point.util_pct, 50);
        assert!(point.lateness_us > 900, "{point:?}");

        m.update(cluster(&s), t0 + Duration::from_millis(1500));
        let again = &m.rows[0];
        assert!(again.windowed);
        assert_eq!(again.req_per_s, measured.req_per_s);
        assert_eq!(again.util, measured.util);
        assert_eq!(again.lateness_p99, measured.lateness_p99);
        assert_eq!(m.history[&7].latest(), Some(point));
    }

    #[test]
    fn history_folds_to_width() {
        let mut h = History::default();
        for i in 0..10 {
            h.push(Point {
                util_pct: i * 10,
                lateness_us: i,
            });
        }
        let (u, l, per) = h.columns(4);
        assert_eq!(per, 3);
        assert_eq!(u, vec![0, 20, 50, 80]);
        assert_eq!(l, vec![0, 3, 6, 9]);
        for _ in 0..HISTORY {
            h.push(Point::default());
        }
        assert_eq!(h.points.len(), HISTORY);
    }
}
