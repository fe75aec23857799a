//! A cluster of "Hello, World!" HTTP workers: one binary that is the primary when started by
//! hand and a worker when its primary re-executes it (Node's `if (cluster.isPrimary)` pattern).
//!
//! ```text
//! cargo run --release -p nodus-http --example cluster -- \
//!     --workers 2 --policy rr --listen 127.0.0.1:8080 [--events FILE] \
//!     [--slow-worker ID --slow-ms MS] [--block-ms MS] [--crash-after-ms MS]
//!     [--max-restarts R --restart-window SECS]
//!     [--hold-worker ID --hold-ms MS [--leave-on-sigterm] [--hold-once FILE]]
//!     [--abandon-listen-worker ID --abandon-at query|answer --hold-ms MS]
//! ```
//!
//! Every listener defers its accepts ([`Config::defer_accept`]), as `nodus serve`'s does.
//! Worker side: [`Worker::listen`] gets the listener from the primary, the server reports its
//! HTTP counters with each snapshot, `ready()` tells the primary it can take traffic, and the
//! primary's `disconnect` (a reload or shutdown) drains the server within the deadline it gave.
//! `--slow-worker ID --slow-ms MS` makes worker ID answer after MS milliseconds (to see `least`
//! steer connections away from it). `--block-ms MS` makes a request for `/block` hold its
//! worker's loop MS milliseconds (a long synchronous call in the handler, as a CPU-bound Node
//! handler does; the worker says so on stderr first) before it answers: the primary must route
//! new connections around that worker meanwhile. `--crash-after-ms MS` makes every worker exit with code 1
//! MS milliseconds after it started (0: at once, before listening), to watch the restart budget.
//! `--hold-worker ID --hold-ms MS` makes worker ID take connections but serve none: it holds
//! them for MS milliseconds, then closes its listener and stays up; a nodus primary gets what it
//! held back and gives it to the other workers. With `--leave-on-sigterm` a SIGTERM to that
//! worker during the hold makes it leave the cluster on its own as `nodus serve` does
//! ([`Worker::disconnect`], then its listener closes) and exit 0 (its replacement holds too,
//! unless `--hold-once FILE`: only the worker that creates FILE holds, and a replacement finding
//! it serves).
//! `--abandon-listen-worker ID --abandon-at query|answer` makes worker ID drop a `listen` future
//! right after its `queryServer` went out, or once its answer has arrived (unpolled), say ready
//! without a listener, wait `--hold-ms`, then listen again and serve.
//! SIGTERM/SIGINT to the primary drain everything; SIGHUP is a
//! rolling reload (one sent to a worker itself is caught by [`Worker`]: a line naming the
//! primary, and the worker serves on). Every response names its worker in `X-Worker`; logs go to stderr
//! (`RUST_LOG`, default `info`; a value that does not parse is `info` too, with one WARN line).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::pin;
use std::time::Duration;

use futures_util::future::{Either, select};

use http::header::{CONTENT_TYPE, HeaderValue};
use nodus::cluster::{Config, Policy, Primary, Readiness, Worker, WorkerCommand};
use nodus::net::TcpListener;
use nodus::signal::{SIGTERM, Signals};
use nodus_http::{Config as HttpConfig, full, serve};

struct Args {
    workers: usize,
    policy: Policy,
    listen: SocketAddr,
    events: Option<PathBuf>,
    slow_worker: Option<u32>,
    slow: Duration,
    /// How long a request for `/block` holds its worker's loop (none: `/block` is any path).
    block: Option<Duration>,
    crash_after: Option<Duration>,
    max_restarts: Option<u32>,
    restart_window: Option<Duration>,
    hold_worker: Option<u32>,
    hold: Duration,
    leave_on_sigterm: bool,
    /// Only the worker that creates this file holds (`--hold-once`).
    hold_once: Option<PathBuf>,
    abandon_listen_worker: Option<u32>,
    /// Drop the abandoned `listen` after its answer arrived, not right after its query.
    abandon_after_answer: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        workers: 2,
        policy: Policy::RoundRobin,
        listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
        events: None,
        slow_worker: None,
        slow: Duration::from_millis(100),
        block: None,
        crash_after: None,
        max_restarts: None,
        restart_window: None,
        hold_worker: None,
        hold: Duration::from_millis(1000),
        leave_on_sigterm: false,
        hold_once: None,
        abandon_listen_worker: None,
        abandon_after_answer: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--workers" => {
                args.workers = value()?.parse().map_err(|e| format!("--workers: {e}"))?
            }
            "--policy" => {
                args.policy = match value()?.as_str() {
                    "rr" => Policy::RoundRobin,
                    "shared" => Policy::Shared,
                    "reuseport" => Policy::ReusePort,
                    "least" => Policy::Least,
                    other => return Err(format!("unknown policy {other}")),
                }
            }
            "--listen" => args.listen = value()?.parse().map_err(|e| format!("--listen: {e}"))?,
            "--events" => args.events = Some(value()?.into()),
            "--slow-worker" => {
                args.slow_worker = Some(value()?.parse().map_err(|e| format!("{e}"))?)
            }
            "--slow-ms" => {
                args.slow = Duration::from_millis(value()?.parse().map_err(|e| format!("{e}"))?)
            }
            "--block-ms" => {
                args.block = Some(Duration::from_millis(
                    value()?.parse().map_err(|e| format!("--block-ms: {e}"))?,
                ))
            }
            "--crash-after-ms" => {
                args.crash_after = Some(Duration::from_millis(
                    value()?.parse().map_err(|e| format!("{e}"))?,
                ))
            }
            "--max-restarts" => {
                args.max_restarts = Some(value()?.parse().map_err(|e| format!("{e}"))?)
            }
            "--restart-window" => {
                args.restart_window = Some(Duration::from_secs_f64(
                    value()?.parse().map_err(|e| format!("{e}"))?,
                ))
            }
            "--hold-worker" => {
                args.hold_worker = Some(value()?.parse().map_err(|e| format!("{e}"))?)
            }
            "--hold-ms" => {
                args.hold = Duration::from_millis(value()?.parse().map_err(|e| format!("{e}"))?)
            }
            "--leave-on-sigterm" => args.leave_on_sigterm = true,
            "--hold-once" => args.hold_once = Some(PathBuf::from(value()?)),
            "--abandon-listen-worker" => {
                args.abandon_listen_worker = Some(value()?.parse().map_err(|e| format!("{e}"))?)
            }
            "--abandon-at" => {
                args.abandon_after_answer = match value()?.as_str() {
                    "query" => false,
                    "answer" => true,
                    other => return Err(format!("--abandon-at: query or answer, not {other}")),
                }
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(args)
}

fn main() {
    let args = parse_args().unwrap_or_else(|e| {
        eprintln!("cluster: {e}");
        std::process::exit(2);
    });
    // `RUST_LOG`, or `info` (unset or empty); a value that does not parse is `info` too, said
    // once at WARN (by the primary: its workers run with its environment).
    let rust_log = std::env::var_os("RUST_LOG");
    let set = rust_log
        .as_deref()
        .filter(|v| !v.as_encoded_bytes().trim_ascii().is_empty());
    let parsed = set.map(|v| {
        let v = v.to_str().ok_or_else(|| "not UTF-8".to_owned())?;
        tracing_subscriber::EnvFilter::try_new(v).map_err(|e| e.to_string())
    });
    let (filter, unparsed) = match parsed {
        None => (tracing_subscriber::EnvFilter::new("info"), None),
        Some(Ok(filter)) => (filter, None),
        Some(Err(why)) => (tracing_subscriber::EnvFilter::new("info"), Some(why)),
    };
    // Queued to stderr's writer thread: logging never blocks nor panics, whatever stderr is.
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(nodus::process::output::log_writer)
        .log_internal_errors(false)
        .init();
    if let Some(why) = unparsed
        && !nodus::cluster::is_worker()
    {
        let value = rust_log.unwrap_or_default();
        tracing::warn!("RUST_LOG={value:?} does not parse ({why}): logging at info instead");
    }
    let rt = nodus::Runtime::new();
    let code = rt.block_on(async move {
        match Worker::get() {
            Ok(Some(worker)) => run_worker(worker, args).await,
            Ok(None) => run_primary(args).await,
            Err(e) => {
                eprintln!("cluster: {e}");
                1
            }
        }
    });
    nodus::process::output::flush_before_exit(Duration::from_secs(2));
    std::process::exit(code);
}

async fn run_primary(args: Args) -> i32 {
    let program = std::env::current_exe().expect("the running program has a path");
    let mut config = Config::new(
        args.workers,
        WorkerCommand {
            program,
            args: std::env::args_os().skip(1).collect(),
            env: Vec::new(),
            ipc: true,
        },
    );
    config.policy = args.policy;
    config.readiness = Readiness::Message;
    config.event_log = args.events;
    // HTTP: every listener defers its accepts, as `nodus serve`'s.
    config.defer_accept = true;
    config.prefix_output = false;
    if let Some(r) = args.max_restarts {
        config.max_restarts = r;
    }
    if let Some(w) = args.restart_window {
        config.restart_window = w;
    }
    if args.policy != Policy::ReusePort {
        match TcpListener::bind(args.listen) {
            Ok(l) => config.listeners.push(("http".to_owned(), l)),
            Err(e) => {
                eprintln!("cluster: cannot listen on {}: {e}", args.listen);
                return 1;
            }
        }
    }
    match Primary::start(config) {
        Ok(primary) => primary.run().await,
        Err(e) => {
            eprintln!("cluster: {e}");
            1
        }
    }
}

async fn run_worker(worker: Worker, args: Args) -> i32 {
    match args.crash_after {
        Some(d) if d.is_zero() => std::process::exit(1),
        Some(d) => {
            nodus::set_timeout(d, move || std::process::exit(1));
        }
        None => {}
    }
    if args.abandon_listen_worker == Some(worker.id()) {
        abandon_a_listen(&worker, args.listen, args.abandon_after_answer).await;
        // Ready without a listener: the primary must hand it nothing until it listens again.
        worker.ready();
        nodus::sleep(args.hold).await;
    }
    let listener = match worker.listen(args.listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("cluster worker {}: {e}", worker.id());
            return 1;
        }
    };
    let first_to_hold = |file: &PathBuf| {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(file)
            .is_ok()
    };
    if args.hold_worker == Some(worker.id()) && args.hold_once.as_ref().is_none_or(first_to_hold) {
        let mut term = match args.leave_on_sigterm {
            true => match Signals::new(&[SIGTERM]) {
                Ok(s) => Some(s),
                Err(e) => {
                    eprintln!("cluster worker {}: cannot catch SIGTERM: {e}", worker.id());
                    return 1;
                }
            },
            false => None,
        };
        worker.ready();
        let hold = pin!(nodus::sleep(args.hold));
        if let Some(term) = &mut term {
            if let Either::Right(_) = select(hold, pin!(term.recv())).await {
                // As `nodus serve` stopped directly: leave first, then the listener closes.
                worker.disconnect().await;
                drop(listener);
                return 0;
            }
        } else {
            hold.await;
        }
        drop(listener);
        worker.drain_requested().await;
        return 0;
    }
    worker.set_snapshot(nodus_http::snapshot);
    let delay = (args.slow_worker == Some(worker.id())).then_some(args.slow);
    let id = HeaderValue::from(worker.id());
    let (worker_id, block) = (worker.id(), args.block);
    let server = serve(
        listener,
        HttpConfig {
            name: "http:hello",
            // The handler never asks for its peer.
            conn_info: false,
            ..HttpConfig::default()
        },
        move |req| {
            let id = id.clone();
            if let Some(block) = block.filter(|_| req.uri().path() == "/block") {
                eprintln!("cluster worker {worker_id}: /block holds its loop for {block:?}");
                // On purpose: the loop is held as a synchronous handler holds it.
                std::thread::sleep(block);
            }
            async move {
                if let Some(d) = delay {
                    nodus::sleep(d).await;
                }
                let mut resp = http::Response::new(full("Hello, World!"));
                let headers = resp.headers_mut();
                headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
                headers.insert("x-worker", id);
                resp
            }
        },
    );
    worker.ready();
    let deadline = worker.drain_requested().await;
    server.drain(deadline).await;
    0
}

/// Starts a `listen` and drops it: right after its `queryServer` went out (the first poll sends
/// it; the answer cannot have been read before this task yields), or once the answer has
/// arrived and been read while nobody polled the future.
async fn abandon_a_listen(worker: &Worker, addr: SocketAddr, after_answer: bool) {
    let listen = Box::pin(worker.listen(addr));
    let Either::Right(((), listen)) = select(listen, std::future::ready(())).await else {
        eprintln!(
            "cluster worker {}: listen finished in its first poll",
            worker.id()
        );
        return;
    };
    if after_answer {
        nodus::sleep(Duration::from_millis(300)).await;
    }
    drop(listen);
}
