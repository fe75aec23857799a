//! Drawing: the worker columns (shared with `--once`) and the ratatui frame.
//!
//! The frame fits 80×24: a status line; the worker table (one row per worker); two sparklines
//! (utilization and timer lateness p99, for the cluster or, in detail, for the selected worker);
//! in detail a line of that worker's figures; the pools; the recent stalls; a key line. Each
//! sparkline column is one sample, or the mean (utilization) / worst (lateness) of several once
//! the history is wider than the chart, so the charts cover up to 10 minutes.
//!
//! Pools are one worker's (one process, or the selected worker) or the totals of every worker's
//! (no worker selected in a cluster). A total is never shown as if it were one pool's size: the
//! section's title says `total of N workers` and THREADS reads `workers×each` (`2×4`: two
//! workers with 4 threads each; `3×3–4` when their sizes differ), as `top` shows each process's
//! own threads and PM2 one line per process; BUSY, QUEUE and DONE/S are sums, WAIT99 the worst
//! worker's ([`threads_cell`], [`pools_scope`], shared with `--once`).

use std::time::{SystemTime, UNIX_EPOCH};

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{
    Block, Borders, Cell, Paragraph, Row as TableRow, Sparkline, Table, TableState,
};

use super::App;
use super::model::{Model, PoolRow, Row, SortKey};

/// Worker columns: header and width.
pub const COLUMNS: [(&str, u16); 12] = [
    ("PID", 7),
    ("UPTIME", 6),
    ("RST", 3),
    ("UTIL%", 5),
    ("LATE99", 6),
    ("SCHD50", 6),
    ("SCHD99", 6),
    ("RQAVG", 5),
    ("RQMAX", 5),
    ("CONN", 5),
    ("REQ/S", 6),
    ("RSS", 6),
];

/// The worker's cells, in [`COLUMNS`] order ("–" where a figure is unknown; `stall` as the
/// utilization of a worker whose loop did not answer the primary).
pub fn cells(r: &Row) -> [String; 12] {
    [
        r.pid.to_string(),
        opt(r.uptime_s, fmt_uptime),
        r.restarts.to_string(),
        if r.not_answering {
            "stall".to_string()
        } else {
            opt(r.util, |u| format!("{:.1}", u * 100.0))
        },
        opt(r.lateness_p99, fmt_ns),
        opt(r.sched_p50, fmt_ns),
        opt(r.sched_p99, fmt_ns),
        opt(r.rq_mean, |m| {
            if m < 10.0 {
                format!("{m:.2}")
            } else {
                format!("{m:.1}")
            }
        }),
        opt(r.rq_max, |m| m.to_string()),
        opt(r.conns, |c| c.to_string()),
        opt(r.req_per_s, fmt_rate),
        opt(r.rss_bytes, fmt_bytes),
    ]
}

fn opt<T>(v: Option<T>, f: impl FnOnce(T) -> String) -> String {
    v.map_or_else(|| "–".to_string(), f)
}

/// A duration in ns, in at most 6 characters up to 100 days: `850ns`, `9.99µs`, `99.9ms`,
/// `1.23s`, `1666m`, `2400h`.
pub fn fmt_ns(ns: u64) -> String {
    let three = |v: f64, unit: &str| {
        if v < 10.0 {
            format!("{v:.2}{unit}")
        } else if v < 100.0 {
            format!("{v:.1}{unit}")
        } else {
            format!("{v:.0}{unit}")
        }
    };
    let v = ns as f64;
    if ns < 1_000 {
        format!("{ns}ns")
    } else if ns < 1_000_000 {
        three(v / 1e3, "µs")
    } else if ns < 1_000_000_000 {
        three(v / 1e6, "ms")
    } else if ns < 1_000_000_000_000 {
        three(v / 1e9, "s")
    } else if ns < 100_000_000_000_000 {
        format!("{}m", ns / 60_000_000_000)
    } else {
        format!("{}h", ns / 3_600_000_000_000)
    }
}

/// A rate per second: `0`, `12.5`, `1234`, `12.3k`.
pub fn fmt_rate(r: f64) -> String {
    if r < 10.0 {
        format!("{r:.1}")
    } else if r < 10_000.0 {
        format!("{r:.0}")
    } else if r < 1e6 {
        format!("{:.1}k", r / 1e3)
    } else {
        format!("{:.1}M", r / 1e6)
    }
}

/// Bytes: `512K`, `123M`, `1.2G`.
pub fn fmt_bytes(b: u64) -> String {
    let v = b as f64;
    if v < 1024.0 * 1024.0 {
        format!("{:.0}K", v / 1024.0)
    } else if v < 1024.0 * 1024.0 * 1024.0 {
        format!("{:.0}M", v / 1024.0 / 1024.0)
    } else {
        format!("{:.1}G", v / 1024.0 / 1024.0 / 1024.0)
    }
}

/// Seconds as `45s`, `12m05s`, `3h07m`, `2d04h`.
pub fn fmt_uptime(s: f64) -> String {
    let s = s.max(0.0) as u64;
    let (d, h, m) = (s / 86_400, s % 86_400 / 3_600, s % 3_600 / 60);
    if d > 0 {
        format!("{d}d{h:02}h")
    } else if h > 0 {
        format!("{h}h{m:02}m")
    } else if m > 0 {
        format!("{m}m{:02}s", s % 60)
    } else {
        format!("{s}s")
    }
}

/// How long ago a Unix-ms instant was: `5s`, `3m`, `2h`.
pub fn fmt_ago(at_unix_ms: u64) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let s = now.saturating_sub(at_unix_ms) / 1000;
    if s < 60 {
        format!("{s}s")
    } else if s < 3_600 {
        format!("{}m", s / 60)
    } else {
        format!("{}h", s / 3_600)
    }
}

/// A pool's THREADS cell: one worker's pool size, or for a total over several workers
/// `workers×each` (`2×4`; `3×3–4` when their sizes differ), which no one reads as one pool.
pub fn threads_cell(p: &PoolRow) -> String {
    match p.workers {
        0 | 1 => p.threads.to_string(),
        n if p.threads_min == p.threads_max => format!("{n}×{}", p.threads_min),
        n => format!("{n}×{}–{}", p.threads_min, p.threads_max),
    }
}

/// Whose pools `pools` are: `pid N` (the selected worker), `total of N workers` (summed; with
/// how THREADS reads), `all workers` (a cluster where at most one worker reports pools), or
/// `process`.
pub fn pools_scope(pools: &[PoolRow], focus: Option<u32>, cluster: bool) -> String {
    let summed = pools.iter().map(|p| p.workers).max().unwrap_or(0);
    match focus {
        Some(pid) => format!("pid {pid}"),
        None if summed > 1 => {
            format!("total of {summed} workers · THREADS = workers × threads each")
        }
        None if cluster => "all workers".into(),
        None => "process".into(),
    }
}

/// The title of the document: what is watched and its cluster figures.
pub fn describe(m: &Model) -> String {
    let n = m.rows.len();
    let mut s = if m.cluster {
        format!("{n} worker{}", if n == 1 { "" } else { "s" })
    } else {
        "single process".to_string()
    };
    if let Some(g) = m.generation {
        s.push_str(&format!(" · gen {g}"));
    }
    if m.cluster {
        s.push_str(&format!(" · restarts {}", m.restarts));
    }
    if let Some(b) = m.budget_left {
        s.push_str(&format!(" · budget {b}"));
    }
    s
}

const DIM: Style = Style::new().fg(Color::DarkGray);
const HEAD: Style = Style::new().add_modifier(Modifier::BOLD);

/// Draws the whole frame.
pub fn draw(frame: &mut Frame, app: &App) {
    let rows = app.model.sorted(app.sort);
    let focus = app.focus(&rows);
    let pools = app.model.pools(focus);
    let stalls = app.model.stalls(focus);
    let table_h = 2 + rows.len().max(1) as u16;
    let [
        title,
        workers,
        charts,
        detail,
        pools_area,
        stalls_area,
        keys,
    ] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Max(table_h),
        Constraint::Length(5),
        Constraint::Length(u16::from(focus.is_some())),
        Constraint::Length(2 + pools.len().max(1) as u16),
        Constraint::Min(3),
        Constraint::Length(1),
    ])
    .areas(frame.area());

    draw_title(frame, title, app);
    draw_workers(frame, workers, app, &rows);
    draw_charts(frame, charts, app, focus);
    if let Some(r) = focus.and_then(|pid| rows.iter().find(|r| r.pid == pid)) {
        frame.render_widget(Paragraph::new(detail_line(r)), detail);
    }
    let scope = match focus {
        Some(pid) => format!("pid {pid}"),
        None if app.model.cluster => "all workers".into(),
        None => "process".into(),
    };
    let pool_rows: Vec<TableRow> = pools
        .iter()
        .map(|p| {
            TableRow::new([
                p.pool.clone(),
                threads_cell(p),
                p.busy.to_string(),
                p.queue_depth.to_string(),
                opt(p.wait_p99, fmt_ns),
                opt(p.completed_per_s, fmt_rate),
            ])
            .style(if p.queue_depth > 0 {
                Style::new().fg(Color::Yellow)
            } else {
                Style::new()
            })
        })
        .collect();
    let pool_table = Table::new(pool_rows, [6, 8, 5, 6, 8, 7].map(Constraint::Length))
        .header(TableRow::new(["POOL", "THREADS", "BUSY", "QUEUE", "WAIT99", "DONE/S"]).style(HEAD))
        .block(section(format!(
            " Pools · {} ",
            pools_scope(&pools, focus, app.model.cluster)
        )));
    frame.render_widget(pool_table, pools_area);

    let loc_width = (stalls_area.width as usize).saturating_sub(4 + 7 + 12 + 6 + 18 + 5);
    let stall_rows: Vec<TableRow> = stalls
        .iter()
        .map(|s| {
            let st = &s.stall;
            TableRow::new([
                if st.ongoing {
                    "now".to_string()
                } else {
                    fmt_ago(st.at_unix_ms)
                },
                s.pid.to_string(),
                st.task_name.clone(),
                keep_tail(&st.location, loc_width),
                fmt_ns((st.elapsed_seconds * 1e9) as u64),
                st.class.clone(),
            ])
            .style(if st.ongoing {
                Style::new().fg(Color::Red).add_modifier(Modifier::BOLD)
            } else {
                Style::new()
            })
        })
        .collect();
    let empty = stall_rows.is_empty();
    let stall_table = Table::new(
        stall_rows,
        [
            Constraint::Length(4),
            Constraint::Length(7),
            Constraint::Length(12),
            Constraint::Fill(1),
            Constraint::Length(6),
            Constraint::Length(18),
        ],
    )
    .header(TableRow::new(["AGO", "PID", "TASK", "SPAWNED AT", "TOOK", "CLASS"]).style(HEAD))
    .block(section(format!(
        " Recent stalls · {scope}{} ",
        if empty { " · none" } else { "" }
    )));
    frame.render_widget(stall_table, stalls_area);

    let help = if focus.is_some() {
        "q quit  p pause  s sort  ↑↓ select  esc all workers"
    } else {
        "q quit  p pause  s sort  ↑↓ select  enter detail"
    };
    let every = format!("every {}s ", app.interval.as_secs_f64());
    let [left, right] = Layout::horizontal([
        Constraint::Fill(1),
        Constraint::Length(every.chars().count() as u16),
    ])
    .areas(keys);
    frame.render_widget(Paragraph::new(Span::styled(help, DIM)), left);
    frame.render_widget(Paragraph::new(Span::styled(every, DIM)), right);
}

/// The end of `s` in at most `width` characters (`…` marks a cut): a spawn location keeps its
/// file name and line.
fn keep_tail(s: &str, width: usize) -> String {
    let n = s.chars().count();
    if n <= width {
        return s.to_string();
    }
    let tail: String = s.chars().skip(n + 1 - width.max(1)).collect();
    format!("…{tail}")
}

fn section(title: String) -> Block<'static> {
    Block::new()
        .borders(Borders::TOP)
        .border_style(DIM)
        .title(Span::styled(title, HEAD))
}

fn draw_title(frame: &mut Frame, area: Rect, app: &App) {
    let (badge, style) = if app.paused {
        (" PAUSED ", Style::new().black().on_yellow())
    } else if app.error.is_some() {
        (" STALE ", Style::new().white().on_red())
    } else {
        (" LIVE ", Style::new().black().on_green())
    };
    let text = match &app.error {
        Some(e) => Span::styled(
            format!(" {}: {e}; retrying", app.target.authority),
            Style::new().fg(Color::Red),
        ),
        None => Span::raw(format!(
            " {} · {}",
            app.target.authority,
            describe(&app.model)
        )),
    };
    let line = Line::from(vec![
        Span::styled(" nodus top ", Style::new().bold().reversed()),
        Span::styled(badge, style),
        text,
    ]);
    frame.render_widget(Paragraph::new(line), area);
}

fn draw_workers(frame: &mut Frame, area: Rect, app: &App, rows: &[&Row]) {
    let body: Vec<TableRow> = rows
        .iter()
        .map(|r| {
            let style = if r.snapshot.is_none() {
                DIM
            } else if r.util.unwrap_or(0.0) >= 0.9
                || r.lateness_p99.unwrap_or(0) >= 100_000_000
                || r.sched_p99.unwrap_or(0) >= 100_000_000
            {
                Style::new().fg(Color::Red)
            } else {
                Style::new()
            };
            let cells = cells(r).into_iter().enumerate().map(|(i, c)| {
                if i == 0 {
                    Cell::from(c)
                } else {
                    Cell::from(Line::from(c).right_aligned())
                }
            });
            TableRow::new(cells).style(style)
        })
        .collect();
    let sorted = sort_column(app.sort);
    let header = TableRow::new(COLUMNS.map(|(h, _)| {
        let style = if Some(h) == sorted {
            HEAD.fg(Color::Cyan).add_modifier(Modifier::UNDERLINED)
        } else {
            HEAD
        };
        let line = Line::styled(h, style);
        Cell::from(if h == "PID" {
            line
        } else {
            line.right_aligned()
        })
    }));
    let title = if app.model.cluster {
        format!(" Workers ({}) · sort {} ", rows.len(), app.sort.label())
    } else {
        format!(" Process · sort {} ", app.sort.label())
    };
    let table = Table::new(body, COLUMNS.map(|(_, w)| Constraint::Length(w)))
        .header(header)
        .block(section(title))
        .row_highlight_style(Style::new().add_modifier(Modifier::REVERSED))
        .highlight_symbol("▶");
    let mut state = TableState::default().with_selected(Some(app.selected_index(rows)));
    frame.render_stateful_widget(table, area, &mut state);
}

fn draw_charts(frame: &mut Frame, area: Rect, app: &App, focus: Option<u32>) {
    let [left, right] =
        Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)]).areas(area);
    let history = match focus {
        Some(pid) => app.model.history.get(&pid),
        None => Some(&app.model.cluster_history),
    };
    let width = left.width.saturating_sub(1) as usize;
    let (util, late, per) = history.map_or((Vec::new(), Vec::new(), 1), |h| h.columns(width));
    let span = fmt_uptime(util.len() as f64 * per as f64 * app.interval.as_secs_f64());
    let who = match focus {
        Some(pid) => format!("pid {pid}"),
        None if app.model.cluster => "cluster mean".into(),
        None => "process".into(),
    };
    let latest = history.and_then(|h| h.latest());
    let now_util = latest.map_or("–".into(), |p| format!("{}%", p.util_pct));
    frame.render_widget(
        Sparkline::default()
            .data(&util)
            .max(100)
            .style(Style::new().fg(Color::Cyan))
            .block(section(format!(" Util {now_util} · {who} · {span} "))),
        left,
    );
    let worst = late.iter().copied().max().unwrap_or(0);
    let late_title = if worst == 0 {
        format!(" Late p99 · no timer fired · {span} ")
    } else {
        let now = latest.map_or(0, |p| p.lateness_us * 1000);
        format!(
            " Late p99 {} · max {} · {span} ",
            fmt_ns(now),
            fmt_ns(worst * 1000)
        )
    };
    frame.render_widget(
        Sparkline::default()
            .data(&late)
            .max(worst.max(1))
            .style(Style::new().fg(Color::Magenta))
            .block(section(late_title)),
        right,
    );
}

fn detail_line(r: &Row) -> Line<'static> {
    let Some(s) = &r.snapshot else {
        let why = if r.not_answering {
            "its loop did not answer the primary (blocked or too busy; see its log)"
        } else {
            "no snapshot (starting or not reporting)"
        };
        return Line::from(Span::styled(format!(" pid {}: {why}", r.pid), DIM));
    };
    let errors = s.http.responses_by_class[4];
    Line::from(vec![
        Span::styled(
            match r.worker {
                Some(w) => format!(" #{w} pid {} ", r.pid),
                None => format!(" pid {} ", r.pid),
            },
            Style::new().bold().reversed(),
        ),
        Span::raw(format!(
            " tasks {}/{} · yields {} · slow polls {} · in flight {} · 5xx {}",
            s.tasks.alive,
            s.tasks.spawned_total,
            s.tasks.forced_yields_total,
            s.loop_stats.slow_polls_total,
            s.http.requests_in_flight,
            errors,
        )),
    ])
}

/// The header of the column the rows are sorted by (none for the worker order).
fn sort_column(key: SortKey) -> Option<&'static str> {
    match key {
        SortKey::Worker => None,
        SortKey::Util => Some("UTIL%"),
        SortKey::Lateness => Some("LATE99"),
        SortKey::Sched => Some("SCHD99"),
        SortKey::Requests => Some("REQ/S"),
        SortKey::Rss => Some("RSS"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_fit_their_columns() {
        for ns in [
            0,
            999,
            1_000,
            9_994,
            99_949,
            999_499,
            12_345_678,
            1_234_567_890,
            999_999_999_999,
            99_999_999_999_999,
            8_640_000_000_000_000,
        ] {
            assert!(fmt_ns(ns).chars().count() <= 6, "{}", fmt_ns(ns));
        }
        assert_eq!(fmt_ns(850), "850ns");
        assert_eq!(fmt_ns(1_500_000), "1.50ms");
        assert_eq!(fmt_uptime(3_725.0), "1h02m");
        assert_eq!(fmt_uptime(65.0), "1m05s");
        assert_eq!(fmt_rate(12_345.0), "12.3k");
        assert_eq!(fmt_bytes(50 << 20), "50M");
        assert_eq!(keep_tail("src/a/server.rs:1:2", 14), "…server.rs:1:2");
        assert_eq!(keep_tail("a.rs:1:2", 14), "a.rs:1:2");
    }

    /// A cluster of two workers: 4 `io` threads each, and 2 and 3 `cpu` threads.
    fn two_worker_app() -> App {
        use super::super::fetch::Target;
        use super::super::model::ClusterStats;
        use nodus::metrics::{PoolSnapshot, Snapshot};
        let worker = |i: u64, cpu: u64| {
            let s = Snapshot {
                pid: 7 + i as u32,
                pools: vec![
                    PoolSnapshot {
                        pool: "io".into(),
                        threads: 4,
                        busy_threads: 3,
                        queue_depth: 1 + i,
                        ..PoolSnapshot::default()
                    },
                    PoolSnapshot {
                        pool: "cpu".into(),
                        threads: cpu,
                        ..PoolSnapshot::default()
                    },
                ],
                ..Snapshot::default()
            };
            serde_json::json!({"worker": i + 1, "pid": 7 + i, "snapshot": s})
        };
        let doc = serde_json::json!({"workers": [worker(0, 2), worker(1, 3)], "restarts": 0});
        let mut app = App::new(
            Target::parse("127.0.0.1:8080").unwrap(),
            std::time::Duration::from_secs(1),
        );
        let stats = ClusterStats::parse(doc.to_string().as_bytes()).unwrap();
        app.model.update(stats, std::time::Instant::now());
        app
    }

    /// The 80×24 frame as lines of text.
    fn frame_text(app: &App) -> Vec<String> {
        let mut terminal =
            ratatui::Terminal::new(ratatui::backend::TestBackend::new(80, 24)).unwrap();
        terminal.draw(|f| draw(f, app)).unwrap();
        let buf = terminal.backend().buffer();
        (0..buf.area.height)
            .map(|y| {
                (0..buf.area.width)
                    .map(|x| buf[(x, y)].symbol())
                    .collect::<String>()
            })
            .collect()
    }

    /// The cells of the pool line that starts with `pool`.
    fn pool_line(lines: &[String], pool: &str) -> Vec<String> {
        lines
            .iter()
            .map(|l| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
            .find(|cells| cells.first().map(String::as_str) == Some(pool))
            .unwrap_or_else(|| panic!("no {pool} line in\n{}", lines.join("\n")))
    }

    #[test]
    fn pool_threads_summed_over_workers_are_not_shown_as_one_pools_size() {
        let mut app = two_worker_app();
        let lines = frame_text(&app);
        let all = lines.join("\n");
        // All workers: totals, and said to be; THREADS as workers × threads each.
        assert!(
            all.contains("Pools · total of 2 workers · THREADS = workers × threads each"),
            "{all}"
        );
        assert_eq!(
            pool_line(&lines, "io")[..4],
            ["io", "2×4", "6", "3"],
            "{all}"
        );
        assert_eq!(pool_line(&lines, "cpu")[1], "2×2–3", "{all}");

        // One worker selected: its own pool, its own size.
        app.selected_pid = Some(8);
        app.detail = true;
        let lines = frame_text(&app);
        let all = lines.join("\n");
        assert!(all.contains("Pools · pid 8 "), "{all}");
        assert_eq!(pool_line(&lines, "io")[..4], ["io", "4", "3", "2"], "{all}");
        assert_eq!(pool_line(&lines, "cpu")[1], "3", "{all}");
    }

    #[test]
    fn threads_cell_and_scope() {
        let row = |workers, threads, min, max| PoolRow {
            pool: "io".into(),
            threads,
            workers,
            threads_min: min,
            threads_max: max,
            busy: 0,
            queue_depth: 0,
            wait_p99: None,
            completed_per_s: None,
        };
        assert_eq!(threads_cell(&row(1, 4, 4, 4)), "4");
        assert_eq!(threads_cell(&row(16, 64, 4, 4)), "16×4");
        assert_eq!(threads_cell(&row(3, 11, 3, 4)), "3×3–4");
        let one = [row(1, 4, 4, 4)];
        assert_eq!(pools_scope(&one, None, false), "process");
        assert_eq!(pools_scope(&one, None, true), "all workers");
        assert_eq!(pools_scope(&one, Some(9), true), "pid 9");
        assert_eq!(
            pools_scope(&[row(2, 8, 4, 4)], None, true),
            "total of 2 workers · THREADS = workers × threads each"
        );
    }

    #[test]
    fn a_worker_whose_loop_does_not_answer_shows_stall() {
        use super::super::model::ClusterStats;
        let doc = br#"{"workers":[
            {"worker":1,"pid":7,"snapshot":null,"answering":false,"uptime_seconds":3.0},
            {"worker":2,"pid":8,"snapshot":null,"answering":null}],"restarts":0}"#;
        let mut m = Model::default();
        m.update(ClusterStats::parse(doc).unwrap(), std::time::Instant::now());
        let util = COLUMNS.iter().position(|c| c.0 == "UTIL%").unwrap();
        assert_eq!(cells(&m.rows[0])[util], "stall");
        assert!(
            detail_line(&m.rows[0])
                .to_string()
                .contains("did not answer")
        );
        // A worker that never sends a snapshot (a plain program) is not stalled: unknown.
        assert_eq!(cells(&m.rows[1])[util], "–");
    }
}
