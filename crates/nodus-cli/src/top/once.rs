//! `nodus top --once`: one plain-text frame on stdout.
//!
//! A second fetch is made `--interval` after the first so that utilization, requests/s and the
//! recent percentiles cover that interval, exactly as one refresh of the dashboard would. A
//! cluster's primary answers from worker snapshots up to 1 s old, so with a shorter interval the
//! second fetch may bring a worker's same snapshot again, which covers no interval: fetches are
//! then made again (every `--interval`, at most 0.25 s apart) until every worker whose loop
//! answers has a new one, for at most [`MORE`] after the second; the header says the time from
//! the first fetch to the last (a worker whose loop does not answer keeps its last snapshot and
//! is not waited for). Layout:
//!
//! ```text
//! nodus top · 127.0.0.1:8080 · single process · Sat, 21 Nov 2026 15:20:01 GMT · over 1s
//! PID     UPTIME RST UTIL% LATE99 SCHD50 SCHD99 RQAVG RQMAX  CONN  REQ/S    RSS
//! 4242       12s   0   0.3 1.07ms 3.81µs 61.4µs  0.00     1     1    4.0      –
//!
//!   pools: POOL    THREADS  BUSY  QUEUE  WAIT99  DONE/S
//!   ...
//!   stalls: none
//! ```
//!
//! Only worker lines start with a digit (the pid); every figure is the same as on the dashboard.
//! A document with the primary's own loop (`primary.snapshot`) has its line under the workers',
//! starting with `primary` (RST `–`), then `  primary: pid N: its own loop, not a worker`.
//! In a cluster the pools are the totals of every worker's, said on their own line first
//! (`pools: total of 2 workers · THREADS = workers × threads each`), THREADS as `2×4`.
//! After the worker lines: `not answering: pid N: figures 2.5 s old` for each worker whose loop
//! did not answer the primary in time (its figures are its last snapshot's, as old as the
//! primary says), `left out: pid N: why` for each worker whose snapshot a relayed document left
//! out, and `panics: pid N: panics 3 (job 2, handler 1)` for each worker with
//! panics (a snapshot without the field, an older build's, shows none); a stall that was a
//! drain of many short polls ends with `, held in drain: N polls, mostly T after B`, one during
//! which the process was stopped or frozen says so before that, `, process stopped 1.10s of it`.

use std::fmt::Write as _;
use std::time::{Duration, Instant, SystemTime};

use super::view::{
    COLUMNS, cells, describe, drain_note, fmt_ago, fmt_ns, fmt_rate, old_figures, panics_text,
    pools_scope, primary_cells, stopped_note, task_text, threads_cell,
};
use super::{App, fetch_stats};

/// How long after the second fetch more are made while a worker's snapshot is the same one
/// (a primary refreshes a snapshot 1 s old, awaiting each worker 0.5 s at most).
const MORE: Duration = Duration::from_secs(2);

/// Takes the second sample (and more while a worker's snapshot has not changed), prints the
/// frame; `first` is when the first was taken. Returns the exit code.
pub fn run(mut app: App, first: Instant) -> i32 {
    std::thread::sleep(app.interval);
    let second = Instant::now();
    loop {
        match fetch_stats(&app.target) {
            Ok(stats) => app.model.update(stats, Instant::now()),
            Err(e) => {
                say!("nodus top: cannot read {}: {e}", app.target.url());
                return 1;
            }
        }
        if !app.model.unwindowed() || second.elapsed() >= MORE {
            break;
        }
        std::thread::sleep(app.interval.min(Duration::from_millis(250)));
    }
    print!("{}", render(&app, first.elapsed()));
    0
}

/// The frame as text; `span` is the time from the first fetch to now.
fn render(app: &App, span: Duration) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "nodus top · {} · {} · {} · over {}s",
        app.target.authority,
        describe(&app.model),
        httpdate::fmt_http_date(SystemTime::now()),
        // Tenths: the span is the interval plus a fetch or two.
        (span.as_secs_f64() * 10.0).round() / 10.0
    );
    let line = |cols: [String; 12]| {
        let mut l = String::new();
        for (i, (c, (_, w))) in cols.iter().zip(COLUMNS).enumerate() {
            let w = w as usize;
            if i == 0 {
                let _ = write!(l, "{c:<w$}");
            } else {
                let _ = write!(l, " {c:>w$}");
            }
        }
        l.trim_end().to_string()
    };
    let _ = writeln!(out, "{}", line(COLUMNS.map(|(h, _)| h.to_string())));
    let rows = app.model.sorted(app.sort);
    for r in &rows {
        let _ = writeln!(out, "{}", line(cells(r)));
    }
    if let Some(p) = &app.model.primary {
        let _ = writeln!(out, "{}", line(primary_cells(p)));
        let _ = writeln!(out, "  primary: pid {}: its own loop, not a worker", p.pid);
    }
    for r in &rows {
        if r.not_answering && r.snapshot.is_some() {
            let _ = writeln!(out, "  not answering: pid {}: {}", r.pid, old_figures(r));
        }
    }
    for r in &rows {
        if let Some(why) = &r.left_out {
            let _ = writeln!(out, "  left out: pid {}: {why}", r.pid);
        }
    }
    for r in &rows {
        if let Some(text) = panics_text(r).filter(|_| r.panics.as_ref().is_some_and(|p| p.0 > 0)) {
            let _ = writeln!(out, "  panics: pid {}: {text}", r.pid);
        }
    }
    out.push('\n');
    let pools = app.model.pools(None);
    if pools.is_empty() {
        out.push_str("  pools: none\n");
    } else {
        if pools.iter().any(|p| p.workers > 1) {
            let _ = writeln!(out, "  pools: {}", pools_scope(&pools, None, true));
        }
        let _ = writeln!(
            out,
            "  pools: {:<6} {:>8} {:>5} {:>6} {:>7} {:>7}",
            "POOL", "THREADS", "BUSY", "QUEUE", "WAIT99", "DONE/S"
        );
        for p in &pools {
            let _ = writeln!(
                out,
                "         {:<6} {:>8} {:>5} {:>6} {:>7} {:>7}",
                p.pool,
                threads_cell(p),
                p.busy,
                p.queue_depth,
                p.wait_p99.map_or("–".into(), fmt_ns),
                p.completed_per_s.map_or("–".into(), fmt_rate)
            );
        }
    }
    let stalls = app.model.stalls(None);
    if stalls.is_empty() {
        out.push_str("  stalls: none\n");
    } else {
        out.push_str("  stalls (newest first):\n");
        for s in stalls.iter().take(10) {
            let st = &s.stall;
            let drain = drain_note(st).map_or(String::new(), |n| {
                if st.began_with.is_empty() {
                    format!(", {n}")
                } else {
                    format!(", {n} after {}", st.began_with)
                }
            });
            let stopped = stopped_note(st).map_or(String::new(), |n| format!(", {n}"));
            let _ = writeln!(
                out,
                "    {} ago pid {} {} at {} took {} {}{}{stopped}{drain}",
                fmt_ago(st.at_unix_ms),
                s.pid,
                task_text(st),
                st.location,
                fmt_ns((st.elapsed_seconds * 1e9) as u64),
                st.class,
                if st.ongoing { " (ongoing)" } else { "" }
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use nodus::metrics::Snapshot;

    use super::super::fetch::Target;
    use super::super::model::ClusterStats;
    use super::*;

    /// The frame of an app that fetched `doc` once.
    fn frame(doc: &serde_json::Value) -> String {
        let mut app = App::new(
            Target::parse("127.0.0.1:8080").unwrap(),
            Duration::from_secs(1),
        );
        let stats = ClusterStats::parse(doc.to_string().as_bytes()).unwrap();
        app.model.update(stats, Instant::now());
        render(&app, Duration::from_secs(1))
    }

    #[test]
    fn the_primarys_line_is_under_the_workers_and_starts_with_primary() {
        let snap = |pid: u32| {
            let mut s = Snapshot {
                pid,
                uptime_seconds: 65.0,
                ..Snapshot::default()
            };
            s.loop_stats.utilization = 0.25;
            serde_json::to_value(s).unwrap()
        };
        let mut doc = serde_json::json!({
            "workers": [
                {"worker": 1, "pid": 7, "snapshot": snap(7)},
                {"worker": 2, "pid": 8, "snapshot": snap(8)},
            ],
            "restarts": 0,
            "primary": {"pid": 4242, "rss_bytes": 1 << 20, "snapshot": snap(4242)},
        });
        let out = frame(&doc);
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[0].contains(" · 2 workers · "), "{out}");
        assert!(
            lines[2].starts_with("7 ") && lines[3].starts_with("8 "),
            "{out}"
        );
        assert_eq!(
            lines[4],
            "primary  1m05s   –  25.0      –      –      –  0.00     0     0      –     1M",
            "{out}"
        );
        assert_eq!(
            lines[5], "  primary: pid 4242: its own loop, not a worker",
            "{out}"
        );
        // Only worker lines start with a digit.
        let digits = lines
            .iter()
            .filter(|l| l.starts_with(|c: char| c.is_ascii_digit()));
        assert_eq!(digits.count(), 2, "{out}");
        // An older primary's document (no `primary.snapshot`): no primary line.
        doc["primary"].as_object_mut().unwrap().remove("snapshot");
        let out = frame(&doc);
        assert!(!out.contains("primary"), "{out}");
        assert!(out.lines().nth(4).is_some_and(str::is_empty), "{out}");
    }
}
