//! `nodus top [ADDR]`: a live terminal dashboard of a nodus server or cluster, fed by its
//! `/_nodus/stats`.
//!
//! - `fetch`: ADDR parsing and a minimal blocking HTTP/1.1 GET;
//! - `model`: the stats document (one snapshot or the cluster shape), per-worker rows (and the
//!   primary's own loop's, apart) derived from two successive fetches, and the sparkline history;
//! - `view`: the worker columns and the ratatui frame (all of it from 80×24; the worker table
//!   first, whole columns only, in a smaller terminal; a too-small line below 8×5);
//! - `once`: `--once`, one plain-text frame.
//!
//! Usage errors come first, with exit code 2: an ADDR that does not parse, or, without `--once`, a
//! stdout that is not a terminal. Then the first fetch: an address that cannot be read is one line
//! on stderr and exit code 1. After that the dashboard keeps the
//! last figures on screen and shows fetch errors in its status line while it retries.
//!
//! The terminal (raw mode, alternate screen) is restored when the dashboard ends for any reason:
//! `q`, Ctrl-C (a key in raw mode), SIGINT/SIGTERM/SIGHUP, an I/O error, or a panic (ratatui's
//! panic hook). The end of the terminal's input (a closed window, a dropped ssh session: the
//! terminal hangs up) ends the dashboard too, with exit code 0. Keys and fetches are each read
//! on their own thread, so the dashboard's loop notices a signal or a hangup within 100 ms
//! whatever they are doing.

mod fetch;
mod model;
mod once;
mod view;

use std::io::{self, IsTerminal};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crossterm::event::{self, Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use ratatui::DefaultTerminal;
use rustix::event::{PollFd, PollFlags, Timespec};

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
    /// worker starting with its pid (and one for a cluster primary's own loop, starting with
    /// `primary`), then pools and recent stalls. Fetches twice, --interval
    /// apart, so rates and utilization cover that interval (and again, at most 2 s more, while
    /// a cluster's primary serves a worker's same snapshot, which it keeps up to 1 s).
    #[arg(long)]
    once: bool,
    /// Seconds between fetches (0.1 to 3600).
    #[arg(
        long,
        value_name = "SECS",
        default_value_t = 1.0,
        allow_negative_numbers = true,
        value_parser = interval
    )]
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
    if !args.once && !io::stdout().is_terminal() {
        say!("nodus top: stdout is not a terminal; use --once for one plain-text frame");
        return 2;
    }
    let interval = Duration::from_secs_f64(args.interval);
    let started = Instant::now();
    let first = match fetch_stats(&target) {
        Ok(s) => s,
        Err(e) => {
            say!("nodus top: cannot read {}: {e}", target.url());
            return 1;
        }
    };
    let mut app = App::new(target, interval);
    app.model.update(first, Instant::now());
    if args.once {
        return once::run(app, started);
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
    /// A view of `target` refreshed every `interval`, with nothing fetched yet.
    fn new(target: Target, interval: Duration) -> App {
        App {
            target,
            interval,
            model: Model::default(),
            sort: SortKey::default(),
            selected_pid: None,
            detail: false,
            paused: false,
            error: None,
        }
    }

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

/// Restores the terminal `.0` when dropped (normal exit, error, or unwinding), unless it hung up:
/// there is nothing left to restore then. A failure is a line in the log queue (ratatui's
/// `restore` would `eprintln!` it, which panics on a broken stderr).
struct Restore<'a>(&'a OwnedFd);

impl Drop for Restore<'_> {
    fn drop(&mut self) {
        if hung_up(self.0) {
            return;
        }
        if let Err(e) = ratatui::try_restore() {
            say!("nodus top: cannot restore the terminal: {e}");
        }
    }
}

/// How often the dashboard looks at the stop flag and the terminal when nothing else happens.
const TICK: Duration = Duration::from_millis(100);

/// What wakes the dashboard up: a key press (or the keys' failure), or a fetch done.
enum Wake {
    Key(KeyEvent),
    KeysFailed(io::Error),
    Fetched(Result<ClusterStats, String>, Instant),
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
    let tty = key_terminal()?;
    let (tx, rx) = mpsc::channel();
    // Fetches run on their own thread so a slow server never freezes the keys.
    let fetch_tx = tx.clone();
    let target = app.target.clone();
    let interval = app.interval;
    std::thread::Builder::new()
        .name("top-fetch".into())
        .spawn(move || {
            loop {
                std::thread::sleep(interval);
                let fetched = Wake::Fetched(fetch_stats(&target), Instant::now());
                if fetch_tx.send(fetched).is_err() {
                    break;
                }
            }
        })?;

    let mut terminal = ratatui::try_init()?;
    let _restore = Restore(&tty);
    // Keys are read on their own thread too: once the terminal's input ends (read returning 0,
    // or EIO), crossterm's reader retries at once, forever, never returning. So the loop that
    // looks at the stop flag never waits on it, and watches for the hangup itself.
    std::thread::Builder::new()
        .name("top-keys".into())
        .spawn(move || {
            loop {
                match event::read() {
                    Ok(Event::Key(k)) if k.kind == KeyEventKind::Press => {
                        if tx.send(Wake::Key(k)).is_err() {
                            break;
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        let _ = tx.send(Wake::KeysFailed(e));
                        break;
                    }
                }
            }
        })?;
    let end = event_loop(&mut terminal, &mut app, &rx, &stop, &tty);
    if hung_up(&tty) {
        // The terminal went away (which also fails a draw: EIO): the end, not an error. It has
        // no cursor left to show: ratatui's Drop would `eprintln!` that failure, which panics on
        // a dead stderr.
        std::mem::forget(terminal);
        return Ok(());
    }
    end
}

/// Draws, and handles keys and fetches, until a quit key, a signal or the terminal's hangup;
/// waits TICK at most at a time.
fn event_loop(
    terminal: &mut DefaultTerminal,
    app: &mut App,
    rx: &mpsc::Receiver<Wake>,
    stop: &AtomicBool,
    tty: &OwnedFd,
) -> io::Result<()> {
    while !stop.load(Ordering::Relaxed) && !hung_up(tty) {
        terminal.draw(|frame| view::draw(frame, app))?;
        match rx.recv_timeout(TICK) {
            Ok(Wake::Key(k)) => {
                if app.key(k) {
                    break;
                }
            }
            Ok(Wake::KeysFailed(e)) => return Err(e),
            Ok(Wake::Fetched(_, _)) if app.paused => {}
            Ok(Wake::Fetched(Ok(stats), at)) => {
                app.model.update(stats, at);
                app.error = None;
            }
            Ok(Wake::Fetched(Err(e), _)) => app.error = Some(e),
            Err(_) => {}
        }
    }
    Ok(())
}

/// The terminal the keys come from, as crossterm picks it: stdin when it is one, else /dev/tty.
fn key_terminal() -> io::Result<OwnedFd> {
    let stdin = io::stdin();
    if stdin.is_terminal() {
        stdin.as_fd().try_clone_to_owned()
    } else {
        Ok(std::fs::File::open("/dev/tty")?.into())
    }
}

/// Whether `tty` hung up (its other side closed: a terminal window, an ssh session), after which
/// reading it returns 0 or EIO forever.
fn hung_up(tty: &OwnedFd) -> bool {
    let mut fds = [PollFd::new(tty, PollFlags::IN)];
    rustix::event::poll(&mut fds, Some(&Timespec::default())).is_ok()
        && fds[0]
            .revents()
            .intersects(PollFlags::HUP | PollFlags::ERR | PollFlags::NVAL)
}
