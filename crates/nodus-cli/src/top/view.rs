//! Drawing: the worker columns (shared with `--once`) and the ratatui frame.
//!
//! The frame fits 80×24: a status line; the worker table (one row per worker); two sparklines
//! (utilization and timer lateness p99, for the cluster or, in detail, for the selected worker);
//! in detail a line of that worker's figures; the pools; the recent stalls; a key line. Each
//! sparkline column is one sample, or the mean (utilization) / worst (lateness) of several once
//! the history is wider than the chart, so the charts cover up to 10 minutes.
//!
//! A cluster document with the primary's own loop (`primary.snapshot`) adds its row right under
//! the worker rows whatever the sort, in their columns ([`primary_cells`]: `primary` as its PID,
//! its pid in the table's title, `–` for RST), never selected, and in none of the counts, charts,
//! pools or stalls, which are the workers'. Its line comes after the recent stalls' first lines
//! ([`heights`]), so it never takes the room of a worker row or of what alerts; without a
//! snapshot (an older primary) there is no such row.
//!
//! Smaller terminals: the worker table has the room first ([`heights`]: as many rows as fit, and
//! `+N more` under them when not all do), the other panels shrink or go. Nothing shows a cut
//! figure: a table too narrow for its columns drops whole ones ([`fit_columns`]; for workers
//! [`DROP_ORDER`], never PID, the sorted column last), and the status, title and detail lines drop
//! whole parts ([`fit_spans`]). Below [`MIN_WIDTH`]×[`MIN_HEIGHT`] the frame is one line saying
//! so.
//!
//! Pools are one worker's (one process, or the selected worker) or the totals of every worker's
//! (no worker selected in a cluster). A total is never shown as if it were one pool's size: the
//! section's title says `total of N workers` and THREADS reads `workers×each` (`2×4`: two
//! workers with 4 threads each; `3×3–4` when their sizes differ), as `top` shows each process's
//! own threads and PM2 one line per process; BUSY, QUEUE and DONE/S are sums, WAIT99 the worst
//! worker's ([`threads_cell`], [`pools_scope`], shared with `--once`).
//!
//! Within that layout: a worker the primary found stalled, or whose loop did not answer it, reads
//! `stall` as its UTIL% (the status line counts the stalled ones, its detail line says why); a
//! worker whose snapshot a relayed document left out reads `trim` as its UTIL% (the status line
//! counts them, its detail line says why); task panics are in the detail
//! line (the total, then the task names that panicked), only for a snapshot that has them; a stall
//! that was a drain of many short polls takes two lines, the second saying `held in drain: N
//! polls, mostly T` ([`drain_note`], shared with `--once`); a stall whose task had a note (the
//! request an HTTP handler served) shows it on that second line, `[GET /slow/thing]`, and
//! `--once` names the task with it, `http:app [GET /slow/thing]` ([`task_text`]); a stall
//! during which the process was stopped or frozen (SIGSTOP, a debugger, a VM pause) says for how
//! long first on that second line, `process stopped 1.10s of it`, and `--once` after its class
//! ([`stopped_note`]; the class is `stopped` when the stop alone made it a stall).

use std::time::{SystemTime, UNIX_EPOCH};

use nodus::metrics::StallReport;
use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{
    Block, Borders, Cell, HighlightSpacing, Paragraph, Row as TableRow, Sparkline, Table,
    TableState, Wrap,
};

use super::App;
use super::model::{Model, PoolRow, Row, SortKey, StallRow};

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
/// utilization of a worker the primary found stalled or whose loop did not answer it, `trim` as
/// that of one whose snapshot the relayed document left out).
pub fn cells(r: &Row) -> [String; 12] {
    [
        r.pid.to_string(),
        opt(r.uptime_s, fmt_uptime),
        r.restarts.to_string(),
        if r.not_answering || r.stalled {
            "stall".to_string()
        } else if r.left_out.is_some() {
            "trim".to_string()
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

/// The primary's cells, in [`COLUMNS`] order: its loop's as a worker's ([`cells`]), but `primary`
/// for the PID (its pid is in the table's title, and in `--once` on a line of its own) and `–`
/// for the restarts (none are counted of a primary).
pub fn primary_cells(r: &Row) -> [String; 12] {
    let mut c = cells(r);
    c[0] = "primary".to_string();
    c[2] = "–".to_string();
    c
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

/// A stall's task: its name, with its note if it had one (`http:app [GET /slow/thing]`).
pub fn task_text(st: &StallReport) -> String {
    if st.note.is_empty() {
        st.task_name.clone()
    } else {
        format!("{} [{}]", st.task_name, st.note)
    }
}

/// What a stall during which the process was stopped or frozen (SIGSTOP, a debugger, a VM
/// pause) says (`None` when it was not, or for an older build's report):
/// `process stopped 1.10s of it`.
pub fn stopped_note(st: &StallReport) -> Option<String> {
    (st.stopped_seconds > 0.0).then(|| {
        format!(
            "process stopped {} of it",
            fmt_ns((st.stopped_seconds * 1e9) as u64)
        )
    })
}

/// What a stall that was a drain of many short polls says (`None` for one poll, or a snapshot
/// of a build that does not count them): `held in drain: 20345 polls, mostly ping`.
pub fn drain_note(st: &StallReport) -> Option<String> {
    (st.polls > 1).then(|| {
        format!(
            "held in drain: {} polls, mostly {}",
            st.polls,
            task_text(st)
        )
    })
}

/// A worker's task panics (when its snapshot has them): `panics 3 (job 2, handler 1)`.
pub fn panics_text(r: &Row) -> Option<String> {
    let (total, by_task) = r.panics.as_ref()?;
    let mut text = format!("panics {total}");
    if !by_task.is_empty() {
        let names: Vec<String> = by_task.iter().map(|(t, n)| format!("{t} {n}")).collect();
        text.push_str(&format!(" ({})", names.join(", ")));
    }
    Some(text)
}

/// The title of the document: what is watched and its cluster figures.
pub fn describe(m: &Model) -> String {
    describe_parts(m).join(" · ")
}

/// [`describe`]'s parts, what alerts first (a narrow status line keeps those from the left):
/// `2 workers` (`1 of 2 workers` while slots wait out a restart's backoff), `1 stalled` (the
/// primary's verdict), `1 snapshot left out` (a relayed document's), `gen 3`, `restarts 1`,
/// `budget 4` (as known).
fn describe_parts(m: &Model) -> Vec<String> {
    let n = m.rows.len();
    let mut parts = vec![match (m.cluster, m.workers_wanted) {
        (false, _) => "single process".to_string(),
        (true, Some(wanted)) if wanted != n as u64 => format!("{n} of {wanted} workers"),
        (true, _) => format!("{n} worker{}", if n == 1 { "" } else { "s" }),
    }];
    let stalled = m.rows.iter().filter(|r| r.stalled).count();
    if stalled > 0 {
        parts.push(format!("{stalled} stalled"));
    }
    let left_out = m.rows.iter().filter(|r| r.left_out.is_some()).count();
    if left_out > 0 || m.trimmed.is_some() {
        parts.push(format!(
            "{left_out} snapshot{} left out",
            if left_out == 1 { "" } else { "s" }
        ));
    }
    if let Some(g) = m.generation {
        parts.push(format!("gen {g}"));
    }
    if m.cluster {
        parts.push(format!("restarts {}", m.restarts));
    }
    if let Some(b) = m.budget_left {
        parts.push(format!("budget {b}"));
    }
    parts
}

const DIM: Style = Style::new().fg(Color::DarkGray);
const HEAD: Style = Style::new().add_modifier(Modifier::BOLD);

/// The smallest terminal the dashboard draws in (columns): the selection mark and the PID column.
pub const MIN_WIDTH: u16 = 1 + COLUMNS[0].1;
/// The smallest terminal the dashboard draws in (lines): the status line, the worker table's
/// title and header, one worker row, and the line under it (`+N more`, or the keys).
pub const MIN_HEIGHT: u16 = 5;

/// Worker columns in the order a narrow terminal drops them; never PID, and the column the rows
/// are sorted by only after all of these.
const DROP_ORDER: [&str; 11] = [
    "RQAVG", "RQMAX", "SCHD50", "SCHD99", "RST", "UPTIME", "RSS", "CONN", "LATE99", "REQ/S",
    "UTIL%",
];

/// The columns of `widths` (indices, in display order) that fit in `width` cells with one space
/// between columns: whole columns, those of `drop` left out in turn until the rest fits.
fn fit_columns(widths: &[u16], drop: &[usize], width: u16) -> Vec<usize> {
    let mut kept: Vec<usize> = (0..widths.len()).collect();
    let need = |k: &[usize]| {
        k.iter()
            .map(|&i| widths[i] + 1)
            .sum::<u16>()
            .saturating_sub(1)
    };
    for d in drop {
        if need(&kept) <= width {
            break;
        }
        kept.retain(|i| i != d);
    }
    kept
}

/// The worker columns (indices into [`COLUMNS`]) shown in `width` cells (the selection mark's
/// left out): all of them from 78 on.
fn worker_columns(width: u16, sort: SortKey) -> Vec<usize> {
    let index = |h: &str| COLUMNS.iter().position(|c| c.0 == h).unwrap_or(0);
    let sorted = sort_column(sort);
    let mut drop: Vec<usize> = DROP_ORDER
        .iter()
        .filter(|&&h| Some(h) != sorted)
        .map(|h| index(h))
        .collect();
    drop.extend(sorted.map(index));
    fit_columns(&COLUMNS.map(|(_, w)| w), &drop, width)
}

/// The whole spans of `spans` that fit in `width` cells, from the left: what does not fit is
/// left out rather than cut.
fn fit_spans(spans: Vec<Span<'static>>, width: u16) -> Vec<Span<'static>> {
    let mut left = width as usize;
    spans
        .into_iter()
        .take_while(|s| {
            let fits = s.width() <= left;
            left = left.saturating_sub(s.width());
            fits
        })
        .collect()
}

/// A section title (`Pools · pid 7 · ...`) in `width` cells: whole ` · `-separated parts from
/// the left, so a title never shows a cut number.
fn fit_title(title: &str, width: u16) -> String {
    let parts = title
        .split(" · ")
        .enumerate()
        .map(|(i, p)| {
            Span::raw(if i == 0 {
                format!(" {p} ")
            } else {
                format!("· {p} ")
            })
        })
        .collect();
    fit_spans(parts, width)
        .into_iter()
        .map(|s| s.content)
        .collect()
}

/// Heights of the frame's parts, top to bottom: status line, workers, the primary's row, charts,
/// detail line, pools, stalls, keys. In a `height` of [`MIN_HEIGHT`] or more, the worker table
/// comes first (its title, header and a line per worker, or as many as fit with a `+N more`
/// line), then the key line; then the charts (2 lines), the detail line, the pools (all of them
/// or none) and the recent stalls (3 lines) when there are any; then the primary's row (when
/// `primary`: it alerts less than those); then the charts' other 3 lines, an empty pools panel,
/// and the rest to the stalls (drawn from 3 lines on). What does not fit is left out; at 80×24
/// with a few workers every part gets its full height.
fn heights(
    height: u16,
    workers: usize,
    primary: bool,
    detail: bool,
    pools: usize,
    stalls: usize,
) -> [u16; 8] {
    let mut left = height.saturating_sub(1);
    let mut take = |want: u16, least: u16| {
        let got = if left >= least { want.min(left) } else { 0 };
        left -= got;
        got
    };
    let table = take(2 + workers.max(1) as u16, 0);
    let keys = take(1, 1);
    let mut charts = take(2, 2);
    let detail = take(u16::from(detail), 1);
    let mut pool_lines = if pools > 0 {
        take(2 + pools as u16, 2 + pools as u16)
    } else {
        0
    };
    let stall_lines = if stalls > 0 { take(3, 3) } else { 0 };
    let primary = take(u16::from(primary), 1);
    if charts > 0 {
        charts += take(3, 0);
    }
    if pools == 0 {
        pool_lines = take(3, 3);
    }
    let stall_lines = stall_lines + take(u16::MAX, 0);
    [
        1,
        table,
        primary,
        charts,
        detail,
        pool_lines,
        stall_lines,
        keys,
    ]
}

/// The one line drawn instead of the dashboard in a terminal smaller than the minimum.
fn too_small(area: Rect) -> String {
    format!(
        "terminal too small ({}×{}, need at least {MIN_WIDTH}×{MIN_HEIGHT})",
        area.width, area.height
    )
}

/// Draws the whole frame.
pub fn draw(frame: &mut Frame, app: &App) {
    let area = frame.area();
    if area.width < MIN_WIDTH || area.height < MIN_HEIGHT {
        let line = Paragraph::new(too_small(area)).wrap(Wrap { trim: true });
        frame.render_widget(line, area);
        return;
    }
    let rows = app.model.sorted(app.sort);
    let focus = app.focus(&rows);
    let pools = app.model.pools(focus);
    let stalls = app.model.stalls(focus);
    let [
        title,
        workers,
        primary_area,
        charts,
        detail,
        pools_area,
        stalls_area,
        keys,
    ] = Layout::vertical(
        heights(
            area.height,
            rows.len(),
            app.model.primary.is_some(),
            focus.is_some(),
            pools.len(),
            stalls.len(),
        )
        .map(Constraint::Length),
    )
    .areas(area);

    draw_title(frame, title, app);
    let primary = app
        .model
        .primary
        .as_ref()
        .filter(|_| primary_area.height > 0);
    draw_workers(frame, workers, app, &rows, primary.map(|p| p.pid));
    if let Some(p) = primary {
        draw_primary(frame, primary_area, app, p);
    }
    if charts.height > 0 {
        draw_charts(frame, charts, app, focus);
    }
    if let Some(r) = focus.and_then(|pid| rows.iter().find(|r| r.pid == pid)) {
        frame.render_widget(Paragraph::new(detail_line(r, detail.width)), detail);
    }
    if pools_area.height > 0 {
        draw_pools(frame, pools_area, app, &pools, focus);
    }
    if stalls_area.height >= 3 {
        draw_stalls(frame, stalls_area, app, &stalls, focus);
    }
    if keys.height > 0 {
        draw_keys(frame, keys, app, focus);
    }
}

fn draw_pools(frame: &mut Frame, area: Rect, app: &App, pools: &[PoolRow], focus: Option<u32>) {
    const WIDTHS: [u16; 6] = [6, 8, 5, 6, 8, 7];
    let kept = fit_columns(&WIDTHS, &[5, 4, 3, 2, 1], area.width);
    let pick = |cells: [String; 6]| {
        let mut cells = cells.map(Some);
        kept.iter()
            .map(move |&i| cells[i].take().unwrap_or_default())
    };
    let pool_rows: Vec<TableRow> = pools
        .iter()
        .map(|p| {
            TableRow::new(pick([
                p.pool.clone(),
                threads_cell(p),
                p.busy.to_string(),
                p.queue_depth.to_string(),
                opt(p.wait_p99, fmt_ns),
                opt(p.completed_per_s, fmt_rate),
            ]))
            .style(if p.queue_depth > 0 {
                Style::new().fg(Color::Yellow)
            } else {
                Style::new()
            })
        })
        .collect();
    let header = ["POOL", "THREADS", "BUSY", "QUEUE", "WAIT99", "DONE/S"].map(String::from);
    let pool_table = Table::new(pool_rows, kept.iter().map(|&i| WIDTHS[i]))
        .header(TableRow::new(pick(header)).style(HEAD))
        .block(section(
            &format!("Pools · {}", pools_scope(pools, focus, app.model.cluster)),
            area.width,
        ));
    frame.render_widget(pool_table, area);
}

fn draw_stalls(frame: &mut Frame, area: Rect, app: &App, stalls: &[StallRow], focus: Option<u32>) {
    // SPAWNED AT (3) takes what the others leave, 10 cells at least.
    const WIDTHS: [u16; 6] = [4, 7, 12, 10, 6, 18];
    const SPAWNED_AT: usize = 3;
    let kept = fit_columns(&WIDTHS, &[5, SPAWNED_AT, 2, 0, 4], area.width);
    let others: u16 = kept
        .iter()
        .filter(|&&i| i != SPAWNED_AT)
        .map(|&i| WIDTHS[i] + 1)
        .sum();
    let loc_width = area.width.saturating_sub(others) as usize;
    let pick = |cells: [String; 6]| {
        let mut cells = cells.map(Some);
        kept.iter()
            .map(move |&i| cells[i].take().unwrap_or_default())
    };
    let stall_rows: Vec<TableRow> = stalls
        .iter()
        .map(|s| {
            let st = &s.stall;
            // A second line in the location's column (cut at its end if need be; the task's
            // column is too narrow): the process's stop, then a drain's (with the task's note)
            // or else the note.
            let parts: Vec<String> = [
                stopped_note(st),
                drain_note(st).or_else(|| (!st.note.is_empty()).then(|| format!("[{}]", st.note))),
            ]
            .into_iter()
            .flatten()
            .collect();
            let drain = (!parts.is_empty()).then(|| keep_head(&parts.join(" · "), loc_width));
            let location = keep_tail(&st.location, loc_width);
            TableRow::new(pick([
                if st.ongoing {
                    "now".to_string()
                } else {
                    fmt_ago(st.at_unix_ms)
                },
                s.pid.to_string(),
                st.task_name.clone(),
                match &drain {
                    Some(note) => format!("{location}\n{note}"),
                    None => location,
                },
                fmt_ns((st.elapsed_seconds * 1e9) as u64),
                st.class.clone(),
            ]))
            .height(if drain.is_some() { 2 } else { 1 })
            .style(if st.ongoing {
                Style::new().fg(Color::Red).add_modifier(Modifier::BOLD)
            } else {
                Style::new()
            })
        })
        .collect();
    let scope = match focus {
        Some(pid) => format!("pid {pid}"),
        None if app.model.cluster => "all workers".into(),
        None => "process".into(),
    };
    let empty = stall_rows.is_empty();
    let widths = kept.iter().map(|&i| {
        if i == SPAWNED_AT {
            Constraint::Fill(1)
        } else {
            Constraint::Length(WIDTHS[i])
        }
    });
    let header = ["AGO", "PID", "TASK", "SPAWNED AT", "TOOK", "CLASS"].map(String::from);
    let stall_table = Table::new(stall_rows, widths)
        .header(TableRow::new(pick(header)).style(HEAD))
        .block(section(
            &format!(
                "Recent stalls · {scope}{}",
                if empty { " · none" } else { "" }
            ),
            area.width,
        ));
    frame.render_widget(stall_table, area);
}

/// The key line: whole key hints from the left, the interval on the right.
fn draw_keys(frame: &mut Frame, area: Rect, app: &App, focus: Option<u32>) {
    let last = if focus.is_some() {
        "esc all workers"
    } else {
        "enter detail"
    };
    let every = format!("every {}s ", app.interval.as_secs_f64());
    let every = fit_spans(vec![Span::styled(every, DIM)], area.width);
    let every_width = every.iter().map(Span::width).sum::<usize>() as u16;
    let help = ["q quit", "p pause", "s sort", "↑↓ select", last]
        .iter()
        .enumerate()
        .map(|(i, k)| {
            Span::styled(
                if i == 0 {
                    k.to_string()
                } else {
                    format!("  {k}")
                },
                DIM,
            )
        })
        .collect();
    let [left, right] =
        Layout::horizontal([Constraint::Fill(1), Constraint::Length(every_width)]).areas(area);
    frame.render_widget(
        Paragraph::new(Line::from(fit_spans(help, left.width))),
        left,
    );
    frame.render_widget(Paragraph::new(Line::from(every)), right);
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

/// The start of `s` in at most `width` characters (`…` marks a cut).
fn keep_head(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        return s.to_string();
    }
    let head: String = s.chars().take(width.saturating_sub(1)).collect();
    format!("{head}…")
}

/// A section's block: `title` (` · `-separated parts) fitted to `width`, over a dim rule.
fn section(title: &str, width: u16) -> Block<'static> {
    Block::new()
        .borders(Borders::TOP)
        .border_style(DIM)
        .title(Span::styled(fit_title(title, width), HEAD))
}

fn draw_title(frame: &mut Frame, area: Rect, app: &App) {
    let (badge, style) = if app.paused {
        (" PAUSED ", Style::new().black().on_yellow())
    } else if app.error.is_some() {
        (" STALE ", Style::new().white().on_red())
    } else {
        (" LIVE ", Style::new().black().on_green())
    };
    let authority = app.target.authority.clone();
    let mut spans = vec![
        Span::styled(" nodus top ", Style::new().bold().reversed()),
        Span::styled(badge, style),
    ];
    match &app.error {
        Some(e) => {
            // The error in what room is left, cut rather than dropped: it is what the line says.
            let red = Style::new().fg(Color::Red);
            spans.push(Span::styled(format!(" {authority}:"), red));
            let room = (area.width as usize).saturating_sub(spans.iter().map(Span::width).sum());
            spans.push(Span::styled(
                keep_head(&format!(" {e}; retrying"), room),
                red,
            ));
        }
        None => {
            spans.push(Span::raw(format!(" {authority}")));
            spans.extend(
                describe_parts(&app.model)
                    .into_iter()
                    .map(|p| Span::raw(format!(" · {p}"))),
            );
        }
    }
    // Short of room for the badge and the address, the name goes first.
    if spans[..3].iter().map(Span::width).sum::<usize>() > area.width as usize {
        spans.remove(0);
    }
    frame.render_widget(
        Paragraph::new(Line::from(fit_spans(spans, area.width))),
        area,
    );
}

/// A worker's (or the primary's) line style: dim without a snapshot, red when its loop is
/// saturated or late by 100 ms.
fn row_style(r: &Row) -> Style {
    if r.snapshot.is_none() {
        DIM
    } else if r.util.unwrap_or(0.0) >= 0.9
        || r.lateness_p99.unwrap_or(0) >= 100_000_000
        || r.sched_p99.unwrap_or(0) >= 100_000_000
    {
        Style::new().fg(Color::Red)
    } else {
        Style::new()
    }
}

/// The `kept` columns of `cells` (indices into [`COLUMNS`]): the first left-aligned, the
/// figures right-aligned.
fn table_cells(cells: [String; 12], kept: &[usize]) -> Vec<Cell<'static>> {
    let mut cells = cells.map(Some);
    kept.iter()
        .map(|&i| {
            let c = cells[i].take().unwrap_or_default();
            if i == 0 {
                Cell::from(c)
            } else {
                Cell::from(Line::from(c).right_aligned())
            }
        })
        .collect()
}

/// The worker table: whole columns that fit the width ([`worker_columns`]), and a line per
/// worker, or as many as fit and `+N more` under them (the table scrolls to the selected one);
/// its title names the primary's pid when `primary` (its row is drawn under the table).
fn draw_workers(frame: &mut Frame, area: Rect, app: &App, rows: &[&Row], primary: Option<u32>) {
    let kept = worker_columns(area.width.saturating_sub(1), app.sort);
    let body: Vec<TableRow> = rows
        .iter()
        .map(|r| TableRow::new(table_cells(cells(r), &kept)).style(row_style(r)))
        .collect();
    let sorted = sort_column(app.sort);
    let header = TableRow::new(kept.iter().map(|&i| {
        let h = COLUMNS[i].0;
        let style = if Some(h) == sorted {
            HEAD.fg(Color::Cyan).add_modifier(Modifier::UNDERLINED)
        } else {
            HEAD
        };
        let line = Line::styled(h, style);
        Cell::from(if i == 0 { line } else { line.right_aligned() })
    }));
    let mut title = if app.model.cluster {
        format!("Workers ({}) · sort {}", rows.len(), app.sort.label())
    } else {
        format!("Process · sort {}", app.sort.label())
    };
    if let Some(pid) = primary {
        title.push_str(&format!(" · primary pid {pid}"));
    }
    let fit = area.height.saturating_sub(2) as usize;
    let (area, more) = if rows.len() > fit && fit >= 2 {
        let [table, more] =
            Layout::vertical([Constraint::Fill(1), Constraint::Length(1)]).areas(area);
        (table, Some((more, rows.len() - (fit - 1))))
    } else {
        (area, None)
    };
    let table = Table::new(body, kept.iter().map(|&i| Constraint::Length(COLUMNS[i].1)))
        .header(header)
        .block(section(&title, area.width))
        .row_highlight_style(Style::new().add_modifier(Modifier::REVERSED))
        .highlight_symbol("▶");
    let mut state = TableState::default().with_selected(Some(app.selected_index(rows)));
    frame.render_stateful_widget(table, area, &mut state);
    if let Some((line, hidden)) = more {
        let text = Span::styled(format!(" +{hidden} more"), DIM);
        frame.render_widget(
            Paragraph::new(Line::from(fit_spans(vec![text], line.width))),
            line,
        );
    }
}

/// The primary's row, right under the worker rows and in their columns (the selection mark's
/// left blank: it is never selected).
fn draw_primary(frame: &mut Frame, area: Rect, app: &App, r: &Row) {
    let kept = worker_columns(area.width.saturating_sub(1), app.sort);
    let mut cells = table_cells(primary_cells(r), &kept);
    if let Some(label) = cells.first_mut() {
        *label = Cell::from(Span::styled("primary", HEAD));
    }
    let table = Table::new(
        [TableRow::new(cells).style(row_style(r))],
        kept.iter().map(|&i| Constraint::Length(COLUMNS[i].1)),
    )
    .highlight_symbol("▶")
    .highlight_spacing(HighlightSpacing::Always);
    frame.render_widget(table, area);
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
            .block(section(
                &format!("Util {now_util} · {who} · {span}"),
                left.width,
            )),
        left,
    );
    let worst = late.iter().copied().max().unwrap_or(0);
    let late_title = if worst == 0 {
        format!("Late p99 · no timer fired · {span}")
    } else {
        let now = latest.map_or(0, |p| p.lateness_us * 1000);
        format!(
            "Late p99 {} · max {} · {span}",
            fmt_ns(now),
            fmt_ns(worst * 1000)
        )
    };
    frame.render_widget(
        Sparkline::default()
            .data(&late)
            .max(worst.max(1))
            .style(Style::new().fg(Color::Magenta))
            .block(section(&late_title, right.width)),
        right,
    );
}

/// The selected worker's figures in `width` cells (whole parts from the left).
fn detail_line(r: &Row, width: u16) -> Line<'static> {
    let Some(s) = &r.snapshot else {
        let why = if r.not_answering {
            "its loop did not answer the primary (blocked or too busy; see its log)".to_string()
        } else if r.stalled {
            "stalled: it has not taken connections handed to it for 1 s (blocked or stopped; \
             the primary hands it none until it runs again)"
                .to_string()
        } else if let Some(reason) = &r.left_out {
            format!("snapshot left out: {reason}")
        } else {
            "no snapshot (starting or not reporting)".to_string()
        };
        // The pid whole or not at all; the words after it may be cut.
        let mut spans = fit_spans(vec![Span::styled(format!(" pid {}:", r.pid), DIM)], width);
        if !spans.is_empty() {
            spans.push(Span::styled(format!(" {why}"), DIM));
        }
        return Line::from(spans);
    };
    let errors = s.http.responses_by_class[4];
    let red = Style::new().fg(Color::Red);
    let mut spans = vec![Span::styled(
        match r.worker {
            Some(w) => format!(" #{w} pid {} ", r.pid),
            None => format!(" pid {} ", r.pid),
        },
        Style::new().bold().reversed(),
    )];
    // What is wrong first, each part ending in its separator; then the figures.
    if r.not_answering {
        spans.push(Span::styled(
            format!(" not answering: {} ·", old_figures(r)),
            red,
        ));
    }
    if r.stalled {
        spans.push(Span::styled(" stalled: handed no connection ·", red));
    }
    spans.push(Span::raw(format!(
        " tasks {}/{}",
        s.tasks.alive, s.tasks.spawned_total
    )));
    // Panics (when the snapshot has them) right after the tasks, before what a narrow line drops.
    if let Some(text) = panics_text(r) {
        let style = match r.panics {
            Some((total, _)) if total > 0 => red,
            _ => Style::new(),
        };
        spans.push(Span::styled(format!(" · {text}"), style));
    }
    spans.extend([
        Span::raw(format!(" · yields {}", s.tasks.forced_yields_total)),
        Span::raw(format!(" · slow polls {}", s.loop_stats.slow_polls_total)),
        Span::raw(format!(" · in flight {}", s.http.requests_in_flight)),
        Span::raw(format!(" · 5xx {errors}")),
    ]);
    Line::from(fit_spans(spans, width))
}

/// What the figures of a worker whose loop did not answer the primary are: its last snapshot's,
/// and how old (an older primary does not say).
pub fn old_figures(r: &Row) -> String {
    match r.snapshot_age {
        Some(age) => format!("figures {age:.1} s old"),
        None => "old figures".to_string(),
    }
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

    /// An app that has fetched `doc` once (a stats document).
    fn app_showing(doc: &serde_json::Value) -> App {
        use super::super::fetch::Target;
        use super::super::model::ClusterStats;
        let mut app = App::new(
            Target::parse("127.0.0.1:8080").unwrap(),
            std::time::Duration::from_secs(1),
        );
        let stats = ClusterStats::parse(doc.to_string().as_bytes()).unwrap();
        app.model.update(stats, std::time::Instant::now());
        app
    }

    /// A cluster document of workers 1 and 2 (pids 7 and 8), the second stalled and not
    /// answering (its figures 3 s old), of `wanted` slots.
    fn incident_doc(wanted: u64) -> serde_json::Value {
        let s = serde_json::to_value(nodus::metrics::Snapshot::default()).unwrap();
        serde_json::json!({
            "workers": [
                {"worker": 1, "pid": 7, "snapshot": s},
                {"worker": 2, "pid": 8, "snapshot": s, "stalled": true, "answering": false,
                 "snapshot_age_seconds": 3.0},
            ],
            "restarts": 12, "budget_left": 0, "generation": 4, "workers_wanted": wanted,
        })
    }

    #[test]
    fn an_80_column_status_line_keeps_what_alerts_and_cuts_a_fetch_error_rather_than_drop_it() {
        let app = app_showing(&incident_doc(3));
        let status = &frame_text(&app)[0];
        assert!(
            status.contains("127.0.0.1:8080 · 2 of 3 workers · 1 stalled · gen 4"),
            "{status}"
        );
        let app = app_showing(&incident_doc(2));
        let status = &frame_text(&app)[0];
        assert!(status.contains(" · 2 workers · 1 stalled · "), "{status}");
        // A fetch error too long for the line is cut, with its start kept.
        let mut app = app_showing(&incident_doc(2));
        app.error = Some("cannot connect: Connection refused (os error 111)".into());
        let status = &frame_text(&app)[0];
        assert!(
            status.contains("STALE  127.0.0.1:8080: cannot connect: Connection refused")
                && status.trim_end().ends_with('…'),
            "{status}"
        );
        let status = &frame_text_at(&app, 120, 24)[0];
        assert!(status.contains("(os error 111); retrying"), "{status}");
    }

    #[test]
    fn a_stalled_workers_detail_line_says_what_is_wrong_then_its_figures_in_order() {
        let app = app_showing(&incident_doc(2));
        let row = app.model.rows.iter().find(|r| r.pid == 8).unwrap();
        let text: String = detail_line(row, 400)
            .spans
            .iter()
            .map(|s| s.content.as_ref())
            .collect();
        assert_eq!(
            text,
            " #2 pid 8  not answering: figures 3.0 s old · stalled: handed no connection · \
             tasks 0/0 · panics 0 · yields 0 · slow polls 0 · in flight 0 · 5xx 0"
        );
    }

    /// A cluster of two workers: 4 `io` threads each, and 2 and 3 `cpu` threads.
    fn two_worker_app() -> App {
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
        app_showing(&doc)
    }

    /// A cluster of `n` workers with 5-digit pids (13577, 14688, ...), `io` pools, and an
    /// ongoing stall in the first.
    fn cluster_app(n: u32) -> App {
        cluster_app_with(n, None)
    }

    /// [`cluster_app`]'s document with `primary` as its `primary` object.
    fn cluster_app_with(n: u32, primary: Option<serde_json::Value>) -> App {
        use nodus::metrics::{PoolSnapshot, Snapshot, StallReport};
        let worker = |i: u32| {
            let pid = 13_577 + i * 1_111;
            let s = Snapshot {
                pid,
                uptime_seconds: 3_725.0,
                rss_bytes: 50 << 20,
                pools: vec![PoolSnapshot {
                    pool: "io".into(),
                    threads: 4,
                    ..PoolSnapshot::default()
                }],
                stalls: if i == 0 {
                    vec![StallReport {
                        task_name: "handler".into(),
                        location: "src/app/server.rs:10:5".into(),
                        elapsed_seconds: 0.25,
                        class: "cpu-bound".into(),
                        ongoing: true,
                        ..StallReport::default()
                    }]
                } else {
                    Vec::new()
                },
                ..Snapshot::default()
            };
            serde_json::json!({"worker": i + 1, "pid": pid, "snapshot": s, "rss_bytes": 50 << 20})
        };
        let workers: Vec<_> = (0..n).map(worker).collect();
        let mut doc = serde_json::json!({"workers": workers, "restarts": 0});
        if let Some(p) = primary {
            doc["primary"] = p;
        }
        app_showing(&doc)
    }

    /// A primary's `primary` object (pid 4242, up 1h02m, 20 MiB), with its loop's snapshot (half
    /// busy, with a stall and a pool of its own) or, `old`, without one, as an older primary
    /// sends it.
    fn primary_doc(old: bool) -> serde_json::Value {
        use nodus::metrics::{PoolSnapshot, Snapshot, StallReport};
        let mut p =
            serde_json::json!({"pid": 4242, "rss_bytes": 20 << 20, "uptime_seconds": 3_725.0});
        if !old {
            let mut s = Snapshot {
                pid: 4242,
                uptime_seconds: 3_725.0,
                pools: vec![PoolSnapshot {
                    pool: "reaper".into(),
                    threads: 1,
                    ..PoolSnapshot::default()
                }],
                stalls: vec![StallReport {
                    task_name: "accept".into(),
                    ..StallReport::default()
                }],
                ..Snapshot::default()
            };
            s.loop_stats.utilization = 0.5;
            p["snapshot"] = serde_json::to_value(&s).unwrap();
        }
        p
    }

    #[test]
    fn the_80x24_frame_has_the_primarys_row_under_the_workers_counted_as_none() {
        let want = [
            " nodus top  LIVE  127.0.0.1:8080 · 2 workers · restarts 0",
            " Workers (2) · sort worker · primary pid 4242 ──────────────────────────────────",
            " PID     UPTIME RST UTIL% LATE99 SCHD50 SCHD99 RQAVG RQMAX  CONN  REQ/S    RSS",
            "▶13577    1h02m   0   0.0      –      –      –  0.00     0     0      –    50M",
            " 14688    1h02m   0   0.0      –      –      –  0.00     0     0      –    50M",
            " primary  1h02m   –  50.0      –      –      –  0.00     0     0      –    20M",
            " Util 0% · cluster mean · 1s ─────────── Late p99 · no timer fired · 1s ────────",
            "",
            "",
            "",
            "",
            " Pools · total of 2 workers · THREADS = workers × threads each ─────────────────",
            "POOL   THREADS  BUSY  QUEUE  WAIT99   DONE/S",
            "io     2×4      0     0      –        –",
            " Recent stalls · all workers ───────────────────────────────────────────────────",
            "AGO  PID     TASK         SPAWNED AT                   TOOK   CLASS",
            "now  13577   handler      src/app/server.rs:10:5       250ms  cpu-bound",
            "",
            "",
            "",
            "",
            "",
            "",
            "q quit  p pause  s sort  ↑↓ select  enter detail                       every 1s",
        ];
        let app = cluster_app_with(2, Some(primary_doc(false)));
        let got = frame_text(&app);
        let got: Vec<&str> = got.iter().map(|l| l.trim_end()).collect();
        assert_eq!(got, want, "\n{}", got.join("\n"));
        // Sorted worst first, it stays under the workers.
        let mut app = app;
        app.sort = SortKey::Util;
        let lines = frame_text(&app);
        assert!(lines[5].starts_with(" primary "), "{}", lines.join("\n"));
        // An older primary's document (no `primary.snapshot`): the frame as without it.
        let old = frame_text(&cluster_app_with(2, Some(primary_doc(true))));
        assert_eq!(old, frame_text(&cluster_app(2)));
        assert!(!old.join("\n").contains("primary"), "{}", old.join("\n"));
    }

    /// In any terminal, the primary's row takes no line from the worker rows, the status line or
    /// the first recent stalls: the frame shows as much of those as it does without a primary.
    #[test]
    fn the_primarys_row_never_pushes_out_what_alerts() {
        for (workers, w) in [(2, 80), (2, 40), (4, 80), (10, 80)] {
            let with = cluster_app_with(workers, Some(primary_doc(false)));
            let without = cluster_app(workers);
            for h in MIN_HEIGHT..=30 {
                let a = frame_text_at(&with, w, h);
                let b = frame_text_at(&without, w, h);
                let all = a.join("\n");
                let rows = |lines: &[String], app: &App| worker_table(lines, app).1;
                assert_eq!(rows(&a, &with), rows(&b, &without), "{w}×{h}\n{all}");
                assert_eq!(a[0], b[0], "{w}×{h}\n{all}");
                let stall = |lines: &[String]| lines.iter().any(|l| l.contains("handler"));
                assert_eq!(stall(&a), stall(&b), "{w}×{h}\n{all}");
                let more = |lines: &[String]| lines.iter().find(|l| l.contains(" more")).cloned();
                assert_eq!(more(&a), more(&b), "{w}×{h}\n{all}");
                // The primary's row only with every worker row above it.
                if a.iter().any(|l| l.starts_with(" primary")) {
                    assert!(more(&a).is_none(), "{w}×{h}\n{all}");
                }
            }
        }
    }

    /// The 80×24 frame as lines of text.
    fn frame_text(app: &App) -> Vec<String> {
        frame_text_at(app, 80, 24)
    }

    /// The `w`×`h` frame as lines of text.
    fn frame_text_at(app: &App, w: u16, h: u16) -> Vec<String> {
        let mut terminal =
            ratatui::Terminal::new(ratatui::backend::TestBackend::new(w, h)).unwrap();
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
            detail_line(&m.rows[0], 80)
                .to_string()
                .contains("did not answer")
        );
        // A worker that never sends a snapshot (a plain program) is not stalled: unknown.
        assert_eq!(cells(&m.rows[1])[util], "–");
    }

    /// A worker the primary found stalled shows it whether or not it is asked for snapshots (a
    /// Node worker never is: `answering` null), and the status line counts it.
    #[test]
    fn a_worker_the_primary_found_stalled_shows_stall() {
        use super::super::model::ClusterStats;
        let doc = br#"{"workers":[
            {"worker":1,"pid":7,"snapshot":null,"answering":null,"stalled":true},
            {"worker":2,"pid":8,"snapshot":null,"answering":null,"stalled":false},
            {"worker":3,"pid":9,"snapshot":null,"answering":null,"stalled":null}],"restarts":0}"#;
        let mut m = Model::default();
        m.update(ClusterStats::parse(doc).unwrap(), std::time::Instant::now());
        let util = COLUMNS.iter().position(|c| c.0 == "UTIL%").unwrap();
        assert_eq!(cells(&m.rows[0])[util], "stall");
        let detail = detail_line(&m.rows[0], 200).to_string();
        assert!(
            detail.contains("stalled: it has not taken connections"),
            "{detail}"
        );
        assert_eq!(cells(&m.rows[1])[util], "–");
        assert_eq!(cells(&m.rows[2])[util], "–");
        assert!(
            describe(&m).contains("3 workers · 1 stalled · restarts 0"),
            "{}",
            describe(&m)
        );
    }

    #[test]
    fn a_worker_whose_snapshot_was_left_out_says_so_and_why() {
        use super::super::model::ClusterStats;
        let doc = br#"{"workers":[
            {"worker":1,"pid":7,"snapshot":null,"answering":true,"uptime_seconds":3.0,
             "snapshot_left_out":"its 9000000-byte snapshot did not fit the IPC frame this document came in"},
            {"worker":2,"pid":8,"snapshot":null}],
            "restarts":0,"trimmed":"1 of 2 worker snapshots left out"}"#;
        let mut m = Model::default();
        m.update(ClusterStats::parse(doc).unwrap(), std::time::Instant::now());
        let util = COLUMNS.iter().position(|c| c.0 == "UTIL%").unwrap();
        assert_eq!(cells(&m.rows[0])[util], "trim");
        let detail = detail_line(&m.rows[0], 200).to_string();
        assert!(
            detail.contains("snapshot left out: its 9000000-byte snapshot did not fit"),
            "{detail}"
        );
        assert!(
            describe(&m).contains("1 snapshot left out"),
            "{}",
            describe(&m)
        );
        // A worker with no snapshot and no reason is still only unknown.
        assert_eq!(cells(&m.rows[1])[util], "–");
        assert!(
            detail_line(&m.rows[1], 200)
                .to_string()
                .contains("no snapshot (starting")
        );
    }

    /// A one-worker cluster document whose snapshot has 3 task panics (`job` 2, `handler` 1),
    /// or, `old`, the same snapshot without the panic fields (an older build's).
    fn panics_doc(old: bool) -> serde_json::Value {
        use nodus::metrics::{Snapshot, TaskClassSnapshot};
        let mut s = Snapshot {
            pid: 7,
            task_classes: vec![
                TaskClassSnapshot {
                    name: "handler".into(),
                    panics: 1,
                    ..TaskClassSnapshot::default()
                },
                TaskClassSnapshot {
                    name: "job".into(),
                    panics: 2,
                    ..TaskClassSnapshot::default()
                },
                TaskClassSnapshot {
                    name: "quiet".into(),
                    ..TaskClassSnapshot::default()
                },
            ],
            ..Snapshot::default()
        };
        s.tasks.panics_total = 3;
        let mut s = serde_json::to_value(&s).unwrap();
        if old {
            s["tasks"].as_object_mut().unwrap().remove("panics_total");
            for c in s["task_classes"].as_array_mut().unwrap() {
                c.as_object_mut().unwrap().remove("panics");
            }
        }
        serde_json::json!({"workers": [{"worker": 1, "pid": 7, "snapshot": s}], "restarts": 0})
    }

    #[test]
    fn task_panics_show_per_task_and_in_total_only_when_the_snapshot_has_them() {
        let mut app = app_showing(&panics_doc(false));
        let detail = detail_line(&app.model.rows[0], 200).to_string();
        assert!(detail.contains("panics 3 (job 2, handler 1)"), "{detail}");
        // In the 80×24 dashboard's detail line, before what a narrow line drops.
        app.selected_pid = Some(7);
        app.detail = true;
        let all = frame_text(&app).join("\n");
        assert!(all.contains("panics 3 (job 2, handler 1)"), "{all}");
        // An older build's snapshot has no panic count: nothing shown, not 0.
        let old = app_showing(&panics_doc(true));
        assert_eq!(old.model.rows[0].panics, None);
        let detail = detail_line(&old.model.rows[0], 200).to_string();
        assert!(!detail.contains("panics"), "{detail}");
    }

    #[test]
    fn a_stall_that_was_a_drain_says_how_many_polls_and_whose() {
        use nodus::metrics::{Snapshot, StallReport};
        let stall = |polls: u64| StallReport {
            task_name: "ping".into(),
            location: "src/main.rs:12:9".into(),
            elapsed_seconds: 0.101,
            class: "on-cpu".into(),
            polls,
            began_with: "\"main\" (src/main.rs:4:5)".into(),
            ..StallReport::default()
        };
        let s = Snapshot {
            pid: 7,
            stalls: vec![stall(20_345)],
            ..Snapshot::default()
        };
        let doc =
            serde_json::json!({"workers": [{"worker": 1, "pid": 7, "snapshot": s}], "restarts": 0});
        let app = app_showing(&doc);
        let wide = frame_text_at(&app, 120, 24).join("\n");
        assert!(
            wide.contains("held in drain: 20345 polls, mostly ping"),
            "{wide}"
        );
        // At 80 columns the note is cut at its end, never its start; the location stays.
        let lines = frame_text(&app);
        let all = lines.join("\n");
        let at = lines
            .iter()
            .position(|l| l.contains("src/main.rs:12:9"))
            .unwrap_or_else(|| panic!("{all}"));
        assert!(
            lines[at + 1].contains("held in drain: 20345 polls"),
            "{all}"
        );
        // One poll, or an older build's report (no polls): one line, no drain.
        for polls in [0, 1] {
            assert_eq!(drain_note(&stall(polls)), None);
        }
        assert_eq!(
            drain_note(&stall(3)).as_deref(),
            Some("held in drain: 3 polls, mostly ping")
        );
        // A task with a note (the request an HTTP handler served) is named with it.
        let noted = StallReport {
            note: "GET /slow/thing".into(),
            ..stall(1)
        };
        assert_eq!(task_text(&noted), "ping [GET /slow/thing]");
        assert_eq!(task_text(&stall(1)), "ping");
        let s = Snapshot {
            pid: 7,
            stalls: vec![noted],
            ..Snapshot::default()
        };
        let doc =
            serde_json::json!({"workers": [{"worker": 1, "pid": 7, "snapshot": s}], "restarts": 0});
        // In the dashboard, on the second line, in the location's column.
        let lines = frame_text_at(&app_showing(&doc), 120, 24);
        let at = lines
            .iter()
            .position(|l| l.contains("src/main.rs:12:9"))
            .unwrap_or_else(|| panic!("{}", lines.join("\n")));
        assert!(
            lines[at + 1].contains("[GET /slow/thing]"),
            "{}",
            lines.join("\n")
        );
    }

    /// A stall during which the process was stopped says for how long on its second line, at 80
    /// columns; one that was not says nothing of it.
    #[test]
    fn a_stall_through_a_process_stop_says_how_long_it_was_stopped() {
        use nodus::metrics::{Snapshot, StallReport};
        let stall = |task: &str, class: &str, stopped: f64| StallReport {
            task_name: task.into(),
            location: "src/main.rs:12:9".into(),
            elapsed_seconds: 1.25,
            class: class.into(),
            stopped_seconds: stopped,
            ..StallReport::default()
        };
        let worker = |i: u32, st: StallReport| {
            let s = Snapshot {
                pid: 7 + i,
                stalls: vec![st],
                ..Snapshot::default()
            };
            serde_json::json!({"worker": i + 1, "pid": 7 + i, "snapshot": s})
        };
        let doc = serde_json::json!({"workers": [
            worker(0, stall("frozen", "stopped", 1.1)),
            worker(1, stall("busy", "on-cpu", 0.0)),
        ], "restarts": 0});
        let lines = frame_text(&app_showing(&doc));
        let all = lines.join("\n");
        let at = |task: &str| {
            let at = lines.iter().position(|l| l.contains(task));
            at.unwrap_or_else(|| panic!("no {task} stall in\n{all}"))
        };
        let frozen = at("frozen");
        assert!(lines[frozen].contains("src/main.rs:12:9"), "{all}");
        assert!(
            lines[frozen + 1].contains("process stopped 1.10s of it"),
            "{all}"
        );
        assert_eq!(all.matches("process stopped").count(), 1, "{all}");
        assert_eq!(stopped_note(&stall("busy", "on-cpu", 0.0)), None);
        assert!(lines[at("busy")].contains("on-cpu"), "{all}");
    }

    #[test]
    fn the_80x24_frame_is_the_full_dashboard() {
        let want = [
            " nodus top  LIVE  127.0.0.1:8080 · 2 workers · restarts 0",
            " Workers (2) · sort worker ─────────────────────────────────────────────────────",
            " PID     UPTIME RST UTIL% LATE99 SCHD50 SCHD99 RQAVG RQMAX  CONN  REQ/S    RSS",
            "▶13577    1h02m   0   0.0      –      –      –  0.00     0     0      –    50M",
            " 14688    1h02m   0   0.0      –      –      –  0.00     0     0      –    50M",
            " Util 0% · cluster mean · 1s ─────────── Late p99 · no timer fired · 1s ────────",
            "",
            "",
            "",
            "",
            " Pools · total of 2 workers · THREADS = workers × threads each ─────────────────",
            "POOL   THREADS  BUSY  QUEUE  WAIT99   DONE/S",
            "io     2×4      0     0      –        –",
            " Recent stalls · all workers ───────────────────────────────────────────────────",
            "AGO  PID     TASK         SPAWNED AT                   TOOK   CLASS",
            "now  13577   handler      src/app/server.rs:10:5       250ms  cpu-bound",
            "",
            "",
            "",
            "",
            "",
            "",
            "",
            "q quit  p pause  s sort  ↑↓ select  enter detail                       every 1s",
        ];
        let got = frame_text(&cluster_app(2));
        let got: Vec<&str> = got.iter().map(|l| l.trim_end()).collect();
        assert_eq!(got, want, "\n{}", got.join("\n"));
    }

    /// The header cells and the worker lines (cells, selection mark left out) of a frame.
    fn worker_table(lines: &[String], app: &App) -> (Vec<String>, Vec<Vec<String>>) {
        let pids: Vec<String> = app.model.rows.iter().map(|r| r.pid.to_string()).collect();
        let cells = |l: &String| -> Vec<String> {
            l.trim_start_matches('▶')
                .split_whitespace()
                .map(str::to_owned)
                .collect()
        };
        let all = lines.join("\n");
        let header = lines
            .iter()
            .map(cells)
            .find(|c| c.first().map(String::as_str) == Some("PID"))
            .unwrap_or_else(|| panic!("no worker header in\n{all}"));
        let rows = lines
            .iter()
            .map(cells)
            .filter(|c| c.first().is_some_and(|p| pids.contains(p)))
            .collect();
        (header, rows)
    }

    #[test]
    fn small_terminals_keep_whole_worker_rows_and_columns() {
        for (workers, w, h, shown) in [
            (2, 80, 15, 2),
            (2, 120, 12, 2),
            (2, 60, 20, 2),
            (2, 40, 10, 2),
            (10, 80, 10, 6),
            (3, 30, 5, 1),
            (2, MIN_WIDTH, MIN_HEIGHT, 2),
        ] {
            let app = cluster_app(workers);
            let lines = frame_text_at(&app, w, h);
            let all = lines.join("\n");
            let (header, rows) = worker_table(&lines, &app);
            // Whole column names, in their order; PID first.
            let names: Vec<&str> = COLUMNS.iter().map(|c| c.0).collect();
            let mut at = names.iter();
            for c in &header {
                assert!(at.any(|n| n == c), "{w}×{h}: header cell {c} in\n{all}");
            }
            // Every row: a whole pid, then one whole cell per header cell.
            assert_eq!(rows.len(), shown, "{w}×{h}: worker rows in\n{all}");
            for r in &rows {
                assert_eq!(
                    r.len(),
                    header.len(),
                    "{w}×{h}: {r:?} under {header:?}\n{all}"
                );
            }
            let more = format!("+{} more", workers as usize - shown);
            assert_eq!(
                all.contains(&more),
                shown < workers as usize,
                "{w}×{h}: {more}\n{all}"
            );
            if w >= 78 {
                assert_eq!(header.len(), COLUMNS.len(), "{w}×{h}\n{all}");
            }
        }
    }

    #[test]
    fn a_narrow_terminal_keeps_the_sorted_column() {
        let mut app = cluster_app(2);
        app.sort = SortKey::Rss;
        let (header, rows) = worker_table(&frame_text_at(&app, 24, 10), &app);
        assert_eq!(header, ["PID", "UTIL%", "RSS"]);
        assert_eq!(rows[0], ["13577", "0.0", "50M"]);
    }

    #[test]
    fn a_terminal_below_the_minimum_says_so_in_one_line() {
        let app = cluster_app(2);
        for (w, h) in [(MIN_WIDTH - 1, 24), (80, MIN_HEIGHT - 1), (40, 4)] {
            let lines = frame_text_at(&app, w, h);
            let text: String = lines.concat().split_whitespace().collect();
            let want = format!("terminal too small ({w}×{h}, need at least 8×5)");
            assert!(
                text.contains(&want.replace(' ', "")),
                "{w}×{h}:\n{}",
                lines.join("\n")
            );
            assert!(!text.contains("13577"), "{}", lines.join("\n"));
        }
    }
}
