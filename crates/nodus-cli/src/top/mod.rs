//! `nodus top [ADDR]`: a live terminal dashboard of a nodus server or cluster, fed by its
//! `/_nodus/stats`.
//!
//! - `fetch`: ADDR parsing and a minimal blocking HTTP/1.1 GET;
//! - `model`: the stats document (one snapshot or the cluster shape), per-worker rows derived from
//!   two successive fetches, and the sparkline history;
//! - `view`: the worker columns and the ratatui frame (80×24 and up);
//! - `once`: `--once`, one plain-text frame.
//!
//! The first fetch is made before anything else: an address that cannot be read is one line on
//! stderr and exit code 1 (2 for an ADDR that does not parse). After that the dashboard keeps the
//! last figures on screen and shows fetch errors in its status line while it retries.
//!
//! The terminal (raw mode, alternate screen) is restored when the dashboard ends for any reason:
//! `q`, Ctrl-C (a key in raw mode), SIGINT/SIGTERM/SIGHUP, an I/O error, or a panic (ratatui's
//! panic hook).

mod fetch;
mod model;
mod once;
mod view;

use std::io::{self, IsTerminal};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crossterm::event::{self, Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

use fetch::Target;
use model::{ClusterStats, Model, Row, SortKey};

/// How long one fetch may take (connect, send, read).
const FETCH_TIMEOUT: Duration = Duration::from_secs(3);

#[derive(clap::Args)]
pub struct TopArgs {
    /// The admin endpoint to watch: HOST:PORT (e.g. 127.0.0.1:8080) or an http:// URL. Its
    /// /_nodus/stats is read; a URL whose path is something else is read as given.
    #[arg(value_name = "ADDR", default_value = "127.0.0.1:8080")]
    addr: String,
    /// Print one plain-text frame and exit: a header line, a column line, then one line per
    /// worker starting with its pid, then pools and recent stalls. Fetches twice, --interval
    /// apart, so rates and utilization cover that interval.
    #[arg(long)]
    once: bool,
    /// Seconds between fetches (0.1 to 3600).
    #[arg(long, value_name = "SECS", default_value_t = 1.0, value_parser = interval)]
    interval: f64,
}

fn interval(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && (0.1..=3600.0).contains(&v) => Ok(v),
        _ => Err(format!(
            "`{s}` is not a number of seconds between 0.1 and 3600"
        )),
    }
}

/// Runs `nodus top`; returns the exit code.
pub fn run(args: TopArgs) -> i32 {
    let target = match Target::parse(&args.addr) {
        Ok(t) => t,
        Err(e) => {
            say!("nodus top: {e}");
            return 2;
        }
    };
    let interval = Duration::from_secs_f64(args.interval);
    let first = match fetch_stats(&target) {
        Ok(s) => s,
        Err(e) => {
            say!("nodus top: cannot read {}: {e}", target.url());
            return 1;
        }
    };
    let mut app = App {
        target,
        interval,
        model: Model::default(),
        sort: SortKey::default(),
        selected_pid: None,
        detail: false,
        paused: false,
        error: None,
    };
    app.model.update(first, Instant::now());
    if args.once {
        return once::run(app);
    }
    if !io::stdout().is_terminal() {
        say!("nodus top: stdout is not a terminal; use --once for one plain-text frame");
        return 2;
    }
    match dashboard(app) {
        Ok(()) => 0,
        Err(e) => {
            say!("nodus top: terminal error: {e}");
            1
        }
    }
}

/// One fetch, parsed.
fn fetch_stats(target: &Target) -> Result<ClusterStats, String> {
    ClusterStats::parse(&target.get(FETCH_TIMEOUT)?)
}

/// What the dashboard shows and how.
pub struct App {
    target: Target,
    interval: Duration,
    model: Model,
    sort: SortKey,
    /// The highlighted worker (the first row when unset or gone).
    selected_pid: Option<u32>,
    /// Whether the panels below the table show the highlighted worker rather than all of them.
    detail: bool,
    paused: bool,
    /// The last fetch error, shown until a fetch succeeds.
    error: Option<String>,
}

impl App {
    /// Index of the highlighted worker in `rows` (display order).
    fn selected_index(&self, rows: &[&Row]) -> usize {
        self.selected_pid
            .and_then(|pid| rows.iter().position(|r| r.pid == pid))
            .unwrap_or(0)
    }

    /// The worker the lower panels show, in detail mode.
    fn focus(&self, rows: &[&Row]) -> Option<u32> {
        if self.detail {
            rows.get(self.selected_index(rows)).map(|r| r.pid)
        } else {
            None
        }
    }

    /// Moves the highlight by `delta` rows.
    fn step(&mut self, delta: isize) {
        let rows = self.model.sorted(self.sort);
        if rows.is_empty() {
            return;
        }
        let i = self.selected_index(&rows) as isize + delta;
        let i = i.clamp(0, rows.len() as isize - 1) as usize;
        self.selected_pid = Some(rows[i].pid);
    }

    /// Handles one key press; true to quit.
    fn key(&mut self, k: KeyEvent) -> bool {
        match k.code {
            KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => return true,
            KeyCode::Char('q' | 'Q') => return true,
            KeyCode::Esc if !self.detail => return true,
            KeyCode::Esc => self.detail = false,
            KeyCode::Enter => {
                self.step(0);
                self.detail = !self.detail;
            }
            KeyCode::Char('p' | ' ') => self.paused = !self.paused,
            KeyCode::Char('s') => self.sort = self.sort.next(),
            KeyCode::Up | KeyCode::Char('k') => self.step(-1),
            KeyCode::Down | KeyCode::Char('j') => self.step(1),
            _ => {}
        }
        false
    }
}

/// Restores the terminal when dropped (normal exit, error, or unwinding).
struct Restore;

impl Drop for Restore {
    fn drop(&mut self) {
        ratatui::restore();
    }
}

fn dashboard(mut app: App) -> io::Result<()> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
    ] {
        signal_hook::flag::register(sig, Arc::clone(&stop))?;
    }
    // Fetches run on their own thread so a slow server never freezes the keys.
    let (tx, rx) = mpsc::channel();
    let target = app.target.clone();
    let interval = app.interval;
    std::thread::Builder::new()
        .name("top-fetch".into())
        .spawn(move || {
            loop {
                std::thread::sleep(interval);
                if tx.send((fetch_stats(&target), Instant::now())).is_err() {
                    break;
                }
            }
        })?;

    let mut terminal = ratatui::try_init()?;
    let _restore = Restore;
    while !stop.load(Ordering::Relaxed) {
        terminal.draw(|frame| view::draw(frame, &app))?;
        if event::poll(Duration::from_millis(100))?
            && let Event::Key(k) = event::read()?
            && k.kind == KeyEventKind::Press
            && app.key(k)
        {
            break;
        }
        while let Ok((result, at)) = rx.try_recv() {
            if app.paused {
                continue;
            }
            match result {
                Ok(stats) => {
                    app.model.update(stats, at);
                    app.error = None;
                }
                Err(e) => app.error = Some(e),
            }
        }
    }
    Ok(())
}
