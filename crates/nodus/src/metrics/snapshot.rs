//! The serde-serializable picture of one loop's measurements (`nodus::metrics::snapshot()`).
//!
//! Everything here is plain data: built on the loop thread from `LoopStats` (`meter/stats.rs`),
//! then serialized to JSON (`/_nodus/stats`) or rendered as Prometheus text (`prometheus.rs`).
//! Durations are nanoseconds in histograms (`HistogramSnapshot` values) and seconds in scalar
//! fields whose names end in `_seconds`.
//!
//! A cluster worker sends its snapshot to its primary, which may be another build (a rolling
//! reload runs the binary on disk under the primary that started: older, newer, or the same),
//! so the JSON form is read across builds (ARCHITECTURE.md, "Version skew"):
//! - every field is optional (`#[serde(default)]`) but the four that make an object a
//!   [`Snapshot`] (`pid`, `loop_id`, `uptime_seconds`, `taken_at_unix_ms`, in every build): one a
//!   build does not send reads as zero (`0`, empty), and unknown fields are ignored. A field
//!   keeps its name, JSON type (a fixed array its length: `responses_by_class`) and meaning in
//!   every build; a new meaning is a new name.
//! - histograms carry each bucket's upper bound, not its index, so a build with another bucket
//!   layout is read right (`Histogram::from_snapshot`, the exposition's fixed `le`).
//! - [`Snapshot::out_of_bounds`] checks a snapshot against the [`wire`] limits, fixed numbers that
//!   hold for every build, never against this build's own table sizes (64 task classes, 625
//!   buckets, 8 phases, 64 stalls: a build's choice, which a newer one may raise). They protect
//!   the primary: duplicate names would make duplicate series, and unbounded lists a huge
//!   exposition. A build's own sizes stay within them (checked at compile time; that its fullest
//!   snapshot fits [`wire::BYTES`], by a test), and a limit is never lowered: an older build's
//!   snapshot stays within a newer primary's.

use serde::{Deserialize, Serialize};

pub use super::histogram::HistogramSnapshot;
pub use crate::watchdog::{StallCounts, StallReport};

/// Everything one loop knows about itself, at one moment. Its first four fields, which every
/// build sends, are what makes a JSON object a snapshot; every other is optional (module docs).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Snapshot {
    /// Process id of the process that took the snapshot.
    pub pid: u32,
    /// Loop id, unique within the process.
    pub loop_id: u64,
    /// Seconds since the loop was created.
    pub uptime_seconds: f64,
    /// Wall-clock time the snapshot was taken, milliseconds since the Unix epoch.
    pub taken_at_unix_ms: u64,
    /// Resident memory of the whole process (`/proc/self/statm`), 0 if unknown.
    #[serde(default)]
    pub rss_bytes: u64,
    #[serde(default)]
    pub loop_stats: LoopSnapshot,
    #[serde(default)]
    pub run_queue: RunQueueSnapshot,
    #[serde(default)]
    pub tasks: TasksSnapshot,
    /// Per phase, in loop order.
    #[serde(default)]
    pub phases: Vec<PhaseSnapshot>,
    /// Per task name (bounded: about 64 names, then `other`).
    #[serde(default)]
    pub task_classes: Vec<TaskClassSnapshot>,
    /// The most recent stalls the watchdog reported for this loop, oldest first.
    #[serde(default)]
    pub stalls: Vec<StallReport>,
    /// Every stall the watchdog reported for this loop since it started, by class, each counted
    /// when the watchdog saw it end ([`StallCounts`]): `stalls` keeps only the last 64.
    #[serde(default)]
    pub stalls_total: StallCounts,
    /// HTTP servers running on this loop (filled by `nodus-http`; zeros when there are none).
    #[serde(default)]
    pub http: HttpSnapshot,
    /// The worker pools at snapshot time: the process-wide ones that exist (`io`, `cpu`), then
    /// the live ones built with `PoolBuilder` (see `nodus::pool`).
    #[serde(default)]
    pub pools: Vec<PoolSnapshot>,
}

/// The wire limits: the most a snapshot from another process may hold, the same for every
/// build (see the module docs). Each is at least this build's own (checked below) and never
/// lowered.
pub(crate) mod wire {
    /// The largest snapshot, JSON bytes: this build's fullest (64 task classes, every name 256
    /// bytes, every histogram full of the largest numbers, 16 pools) is about 3.2 MiB.
    pub(crate) const BYTES: usize = 4 << 20;
    /// The longest name (task class, phase, pool), in bytes: each is a label value repeated on
    /// every line of its series.
    pub(crate) const NAME: usize = 256;
    /// Task classes (a loop has at most `classes::MAX_CLASSES`, 64).
    pub(crate) const CLASSES: usize = 256;
    /// Phases (a loop has `Phase::COUNT`, 8).
    pub(crate) const PHASES: usize = 32;
    /// Pools (a process lists `io`, `cpu` and those built with `PoolBuilder`, at most
    /// `pool::MAX_LISTED`, which is this).
    pub(crate) const POOLS: usize = 16;
    /// Stalls (a loop keeps `watchdog::RING_CAPACITY`, 64).
    pub(crate) const STALLS: usize = 256;
    /// Buckets of one histogram (a histogram has `histogram::BUCKETS`, 625).
    pub(crate) const BUCKETS: usize = 4096;
}

// This build's own sizes are within the wire limits, so a primary of any build takes its
// snapshots (a build that raises one past its limit fails to compile here).
const _: () = {
    assert!(crate::metrics::classes::MAX_CLASSES <= wire::CLASSES);
    assert!(crate::metrics::phase::Phase::COUNT <= wire::PHASES);
    assert!(crate::watchdog::RING_CAPACITY <= wire::STALLS);
    assert!(super::histogram::BUCKETS <= wire::BUCKETS);
};

impl Snapshot {
    /// Why this is not a snapshot a nodus loop of any build could send, if it is not: more task
    /// classes, phases, pools or stalls than the [`wire`] limits allow, two of one name in a
    /// list, a name longer than [`wire::NAME`] bytes, or a histogram of more than
    /// [`wire::BUCKETS`] buckets.
    pub(crate) fn out_of_bounds(&self) -> Option<String> {
        let classes = self.task_classes.iter().map(|c| c.name.as_str());
        let phases = self.phases.iter().map(|p| p.phase.as_str());
        let pools = self.pools.iter().map(|p| p.pool.as_str());
        names("task classes", classes, wire::CLASSES)
            .or_else(|| names("phases", phases, wire::PHASES))
            .or_else(|| names("pools", pools, wire::POOLS))
            .or_else(|| {
                let max = wire::STALLS;
                (self.stalls.len() > max)
                    .then(|| format!("{} stalls (at most {max})", self.stalls.len()))
            })
            .or_else(|| {
                let ls = &self.loop_stats;
                let mut histograms = vec![
                    &ls.events_per_poll,
                    &ls.schedule_delay,
                    &ls.timer_lateness,
                    &ls.poll_duration,
                    &self.run_queue.samples,
                    &self.http.request_duration,
                ];
                histograms.extend(self.task_classes.iter().map(|c| &c.poll_duration));
                for p in &self.pools {
                    histograms.extend([&p.queue_wait, &p.run]);
                }
                let max = wire::BUCKETS;
                histograms
                    .iter()
                    .map(|h| h.buckets.len())
                    .find(|&n| n > max)
                    .map(|n| format!("a histogram of {n} buckets (at most {max})"))
            })
    }
}

/// Why the names of a list (`what`) are out of bounds, if they are: more than `max`, one longer
/// than [`wire::NAME`], or one twice.
fn names<'a>(
    what: &str,
    names: impl ExactSizeIterator<Item = &'a str>,
    max: usize,
) -> Option<String> {
    if names.len() > max {
        return Some(format!("{} {what} (at most {max})", names.len()));
    }
    let mut seen = std::collections::HashSet::new();
    for name in names {
        if name.len() > wire::NAME {
            return Some(format!(
                "{what}: a name of {} bytes (at most {})",
                name.len(),
                wire::NAME
            ));
        }
        if !seen.insert(name) {
            return Some(format!("{what}: {name:?} twice"));
        }
    }
    None
}

/// HTTP server figures of one loop.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct HttpSnapshot {
    /// Responses by status class: `[1xx, 2xx, 3xx, 4xx, 5xx]`.
    pub responses_by_class: [u64; 5],
    /// From request head parsed to response head written, in ns.
    pub request_duration: HistogramSnapshot,
    pub requests_in_flight: u64,
    pub connections_open: u64,
    /// The most connections the loop's accepting servers keep open: the sum of their caps
    /// (`nodus-http`'s `Config::max_connections`); 0 from a build that does not send it.
    pub connections_max: u64,
    pub connections_total: u64,
    pub bytes_received_total: u64,
    pub bytes_sent_total: u64,
}

/// Busy/idle time, iterations, events, and the loop-level histograms.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct LoopSnapshot {
    pub iterations: u64,
    /// Time blocked in the poll phase with a non-zero timeout.
    pub idle_seconds: f64,
    /// Everything else since the loop started.
    pub busy_seconds: f64,
    /// busy / (busy + idle) over the loop's lifetime.
    pub utilization: f64,
    /// busy / (busy + idle) over the last closed interval (`interval_seconds` long). An interval
    /// is at least `Builder::metrics_interval` long (1 s by default) and closes once due at the
    /// next loop iteration, snapshot or poll-phase wait (a long wait is an interval of its own),
    /// so it ends at most about one length before the snapshot; before the first one closes, it
    /// is the time since the loop started.
    pub interval_utilization: f64,
    pub interval_seconds: f64,
    /// I/O events and completions dispatched in the poll phase.
    pub events_total: u64,
    /// Events per poll phase (unitless values).
    pub events_per_poll: HistogramSnapshot,
    /// Time from a task being woken (or a callback queued) to it starting to run, in ns: from
    /// the wake, spawn or `set_immediate` itself, so a task woken early in a long poll counts the
    /// rest of that poll. A task woken by I/O counts from the return of the `epoll_wait` that saw
    /// the event (not from the event's arrival, which the loop cannot see); remote work (a pool
    /// completion, a `LoopHandle::post`, a wake from another thread) from its post.
    pub schedule_delay: HistogramSnapshot,
    /// Fire time minus deadline for every timer that fired, in ns (none without timers).
    pub timer_lateness: HistogramSnapshot,
    /// Run time of every task poll and macrotask callback, in ns (the next-tick and microtask
    /// closures it queued run after it, in batches of their own: see `slow_polls_total`).
    pub poll_duration: HistogramSnapshot,
    /// Polls, callbacks and next-tick/microtask batches at least the slow-poll threshold long.
    pub slow_polls_total: u64,
    pub slow_poll_threshold_seconds: f64,
    /// Time spent draining next-tick and microtask closures (timed per drain, not one by one).
    pub tick_drain_seconds: f64,
    pub ticks_total: u64,
    pub microtasks_total: u64,
}

/// Run-queue length: runnable tasks, queued immediates and remote work (pool completions,
/// posts, wakes from other threads) waiting for the loop.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct RunQueueSnapshot {
    /// Length at the moment of the snapshot.
    pub current: u64,
    /// Time-weighted mean over the loop's lifetime (`wait_seconds` / `uptime_seconds`).
    pub mean: f64,
    /// The length integrated over the loop's lifetime (length × seconds): the time every entry
    /// spent in the queue, summed. Over a window, its increase divided by the window's length is
    /// the mean length, and divided by the arrivals' increase the mean wait (Little's law).
    pub wait_seconds: f64,
    /// High-water mark over the loop's lifetime.
    pub max: u64,
    /// High-water mark over the last closed interval (the one of `interval_utilization`).
    pub interval_max: u64,
    /// Time-weighted mean over the last closed interval.
    pub interval_mean: f64,
    /// Lengths sampled at the start of every drain (unitless values).
    pub samples: HistogramSnapshot,
    /// Entries that have entered the run queue (the arrival count for Little's law).
    pub arrivals_total: u64,
}

/// Task counts.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct TasksSnapshot {
    pub spawned_total: u64,
    pub alive: u64,
    pub polls_total: u64,
    /// Polls cut short because the task ran out of its cooperative budget.
    pub forced_yields_total: u64,
    /// Task polls that panicked (caught at the task boundary; counted whether or not the task's
    /// `JoinHandle` was kept, so a detached task's panic shows here too).
    pub panics_total: u64,
}

/// Time and callbacks of one loop phase.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct PhaseSnapshot {
    pub phase: String,
    pub seconds: f64,
    pub callbacks: u64,
}

/// Measurements of one task name (a class such as `http:static`, never a per-connection value).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct TaskClassSnapshot {
    pub name: String,
    pub spawned: u64,
    pub polls: u64,
    pub forced_yields: u64,
    /// Polls of tasks of this name that panicked (see [`TasksSnapshot::panics_total`]).
    pub panics: u64,
    pub poll_duration: HistogramSnapshot,
}

/// Measurements of one worker pool (pools are process-wide: every loop's snapshot shows the
/// same pools).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct PoolSnapshot {
    /// `io` or `cpu` (or the name of a pool built with `PoolBuilder`).
    pub pool: String,
    pub threads: u64,
    /// Jobs waiting for a thread (not those whose future was dropped: they are off the queue).
    pub queue_depth: u64,
    /// Threads running a job.
    pub busy_threads: u64,
    /// Jobs run to the end (including those that panicked).
    pub completed_total: u64,
    /// Jobs whose future was dropped before they started (never run).
    pub cancelled_total: u64,
    /// Submissions refused because the queue was at its bound.
    pub rejected_total: u64,
    /// Jobs that panicked.
    pub panicked_total: u64,
    /// Time from submit to a thread starting the job, in ns.
    pub queue_wait: HistogramSnapshot,
    /// Run time of each job, in ns.
    pub run: HistogramSnapshot,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(name: &str) -> TaskClassSnapshot {
        TaskClassSnapshot {
            name: name.to_owned(),
            ..Default::default()
        }
    }

    #[test]
    fn a_loops_own_snapshot_is_within_bounds() {
        let rt = crate::Runtime::new();
        let s = rt.block_on(async {
            // More task names than the class table holds.
            for i in 0..100u32 {
                let name: &'static str = format!("t{i}").leak();
                crate::task::spawn_named(name, async move { i }).detach();
            }
            crate::metrics::snapshot()
        });
        assert_eq!(s.out_of_bounds(), None);
        let json = serde_json::to_string(&s).unwrap();
        let back: Snapshot = serde_json::from_str(&json).unwrap();
        assert_eq!(back.out_of_bounds(), None);
    }

    #[test]
    fn past_the_wire_limits_is_out_of_bounds_and_says_why() {
        let why = |f: &dyn Fn(&mut Snapshot)| {
            let mut s = Snapshot::default();
            f(&mut s);
            s.out_of_bounds().expect("out of bounds")
        };
        assert_eq!(
            why(&|s| s.task_classes = vec![class("a"), class("b"), class("a")]),
            r#"task classes: "a" twice"#
        );
        assert_eq!(
            why(&|s| s.task_classes = (0..257).map(|i| class(&i.to_string())).collect()),
            "257 task classes (at most 256)"
        );
        assert_eq!(
            why(&|s| s.task_classes = vec![class(&"x".repeat(wire::NAME + 1))]),
            "task classes: a name of 257 bytes (at most 256)"
        );
        assert_eq!(
            why(&|s| {
                s.phases = vec![PhaseSnapshot::default(), PhaseSnapshot::default()];
            }),
            r#"phases: "" twice"#
        );
        assert_eq!(
            why(&|s| s.phases = (0..33).map(|i| phase(&i.to_string())).collect()),
            "33 phases (at most 32)"
        );
        assert_eq!(
            why(&|s| s.pools = vec![PoolSnapshot::default(); wire::POOLS + 1]),
            "17 pools (at most 16)"
        );
        assert_eq!(
            why(&|s| s.stalls = vec![StallReport::default(); wire::STALLS + 1]),
            "257 stalls (at most 256)"
        );
        let too_many = vec![(1, 1); wire::BUCKETS + 1];
        assert_eq!(
            why(&|s| s.http.request_duration.buckets = too_many.clone()),
            "a histogram of 4097 buckets (at most 4096)"
        );
        let mut fine = Snapshot {
            task_classes: vec![class("quote\" newline\n"), class("b")],
            ..Default::default()
        };
        fine.loop_stats.poll_duration.buckets = vec![(1, u64::MAX)];
        assert_eq!(fine.out_of_bounds(), None);
    }

    fn phase(name: &str) -> PhaseSnapshot {
        PhaseSnapshot {
            phase: name.to_owned(),
            ..Default::default()
        }
    }

    /// A newer build may keep more task classes, phases, stalls or histogram buckets than this
    /// one: up to the wire limits, its snapshot is one a loop could have sent.
    #[test]
    fn more_than_this_build_keeps_within_the_wire_limits_is_within_bounds() {
        use crate::metrics::histogram::BUCKETS;
        let classes = crate::metrics::classes::MAX_CLASSES;
        let phases = crate::metrics::phase::Phase::COUNT;
        let stalls = crate::watchdog::RING_CAPACITY;
        assert!(classes < wire::CLASSES && phases < wire::PHASES);
        assert!(stalls < wire::STALLS && BUCKETS < wire::BUCKETS);
        let mut s = Snapshot {
            task_classes: (0..wire::CLASSES)
                .map(|i| class(&format!("{i}-{}", "n".repeat(wire::NAME - 4))))
                .collect(),
            phases: (0..wire::PHASES).map(|i| phase(&i.to_string())).collect(),
            stalls: vec![StallReport::default(); wire::STALLS],
            pools: (0..wire::POOLS)
                .map(|i| PoolSnapshot {
                    pool: i.to_string(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        // Finer buckets than this build's: named by their upper bounds.
        let finer: Vec<(u64, u64)> = (1..=wire::BUCKETS as u64).map(|b| (b * 3, 1)).collect();
        s.loop_stats.poll_duration.buckets = finer.clone();
        s.task_classes[0].poll_duration.buckets = finer;
        assert_eq!(s.out_of_bounds(), None);
    }

    /// A snapshot of another build: fields this one does not know are ignored, and those it
    /// lacks (an older build's, or a newer one's that dropped them) read as zero.
    #[test]
    fn another_builds_snapshot_parses_its_unknown_fields_ignored_its_missing_ones_zero() {
        let mut s = Snapshot {
            pid: 7,
            task_classes: vec![class("a")],
            ..Default::default()
        };
        s.loop_stats.iterations = 5;
        s.loop_stats.poll_duration.buckets = vec![(3, 2)];
        s.tasks.alive = 9;
        let mut v = serde_json::to_value(&s).unwrap();
        v["from_a_newer_build"] = serde_json::json!({"nested": [1, 2, 3]});
        v["loop_stats"]["also_newer"] = 1.5.into();
        v["task_classes"][0]["newer_too"] = "x".into();
        let obj = v.as_object_mut().unwrap();
        obj.remove("tasks");
        obj.remove("http");
        obj.remove("stalls");
        v["loop_stats"]
            .as_object_mut()
            .unwrap()
            .remove("ticks_total");
        v["loop_stats"]["poll_duration"]
            .as_object_mut()
            .unwrap()
            .remove("p999");
        v["task_classes"][0]
            .as_object_mut()
            .unwrap()
            .remove("forced_yields");
        v["task_classes"][0]
            .as_object_mut()
            .unwrap()
            .remove("panics");
        let back: Snapshot = serde_json::from_value(v).expect("parses");
        assert_eq!(back.pid, 7);
        assert_eq!(back.loop_stats.iterations, 5);
        assert_eq!(back.loop_stats.poll_duration.buckets, vec![(3, 2)]);
        assert_eq!(back.task_classes[0].name, "a");
        assert_eq!(back.task_classes[0].panics, 0);
        assert_eq!(back.tasks.alive, 0);
        assert_eq!(back.http.responses_by_class, [0; 5]);
        assert_eq!(back.out_of_bounds(), None);
        // Not an object, an object without what every snapshot has, or a known field of
        // another type: no snapshot.
        assert!(serde_json::from_str::<Snapshot>("5").is_err());
        assert!(serde_json::from_str::<Snapshot>(r#"{"workers":[]}"#).is_err());
        let busy =
            r#"{"pid":1,"loop_id":1,"uptime_seconds":1,"taken_at_unix_ms":1,"loop_stats":"busy"}"#;
        assert!(serde_json::from_str::<Snapshot>(busy).is_err());
    }

    /// This build's fullest snapshot (every table full, every name the longest, its bytes all
    /// escaped, every histogram full of the largest numbers) fits the byte limit, so a primary
    /// of any build takes it.
    #[test]
    fn this_builds_fullest_snapshot_fits_the_byte_limit() {
        use crate::metrics::histogram::BUCKETS;
        let full = || HistogramSnapshot {
            count: u64::MAX,
            sum: u64::MAX,
            min: u64::MAX,
            max: u64::MAX,
            mean: f64::MIN_POSITIVE,
            p50: u64::MAX,
            p90: u64::MAX,
            p99: u64::MAX,
            p999: u64::MAX,
            buckets: vec![(u64::MAX, u64::MAX); BUCKETS],
        };
        // Distinct names of `wire::NAME` bytes, each byte written as `\u0001`.
        let name = |i: usize| format!("{i:03}{}", "\u{1}".repeat(wire::NAME - 3));
        let stall = StallReport {
            task_name: name(0),
            location: name(1),
            class: name(2),
            began_with: name(3),
            // The longest note shown: 64 control characters, each escaped.
            note: crate::watchdog::Note::of(&"\u{1}".repeat(64)).render(),
            polls: u64::MAX,
            ..Default::default()
        };
        let mut s = Snapshot {
            task_classes: (0..crate::metrics::classes::MAX_CLASSES)
                .map(|i| TaskClassSnapshot {
                    name: name(i),
                    panics: u64::MAX,
                    poll_duration: full(),
                    ..Default::default()
                })
                .collect(),
            phases: (0..crate::metrics::phase::Phase::COUNT)
                .map(|i| phase(&name(i)))
                .collect(),
            pools: (0..crate::pool::MAX_LISTED)
                .map(|i| PoolSnapshot {
                    pool: name(i),
                    queue_wait: full(),
                    run: full(),
                    ..Default::default()
                })
                .collect(),
            stalls: vec![stall; crate::watchdog::RING_CAPACITY],
            ..Default::default()
        };
        let ls = &mut s.loop_stats;
        for h in [
            &mut ls.events_per_poll,
            &mut ls.schedule_delay,
            &mut ls.timer_lateness,
            &mut ls.poll_duration,
            &mut s.run_queue.samples,
            &mut s.http.request_duration,
        ] {
            *h = full();
        }
        assert_eq!(s.out_of_bounds(), None);
        let bytes = serde_json::to_string(&s).unwrap().len();
        assert!(bytes <= wire::BYTES, "{bytes} bytes, over {}", wire::BYTES);
    }
}
