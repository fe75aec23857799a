//! `nodus`: serve, supervise and watch Node-style event-loop processes.
//!
//! - `nodus serve [DIR]`: an HTTP server for DIR's static files, with admin endpoints under
//!   `/_nodus/` (metrics, healthz, readyz, stats, and a live page).
//!
//! - `nodus top [ADDR]`: a live terminal dashboard of a running server, fed by its
//!   `/_nodus/stats` (`--once` prints one plain-text frame).
//!
//! - `nodus __exec-listen PROGRAM ARGS...` (hidden): the step a supervisor puts before a program
//!   that takes its sockets systemd's way, to set `LISTEN_PID` (see `exec_listen.rs`).
//!
//! `run` (supervise any program as a cluster) comes with the cluster.

mod exec_listen;
mod serve;
mod top;

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

use serve::app::ServeOptions;
use serve::static_files::Dotfiles;

#[derive(Parser)]
#[command(
    name = "nodus",
    version,
    about = "Node.js's process and event-loop model, observable by design"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve DIR's files over HTTP, with admin endpoints under /_nodus/.
    Serve(ServeArgs),
    /// Live terminal dashboard of a running nodus server or cluster (reads ADDR's /_nodus/stats).
    ///
    /// One row per worker: pid, uptime, restarts, utilization, timer lateness p99, schedule
    /// delay p50/p99, run-queue mean and max, open connections, requests/s, RSS; sparklines of
    /// utilization and lateness; pool queues and waits; recent stalls. Keys: q quit, p pause,
    /// s sort, up/down select, enter detail, esc back. Figures that are rates or "recent" cover
    /// the refresh interval.
    Top(top::TopArgs),
    /// Internal (a supervisor's worker step): sets LISTEN_PID to this pid, then runs PROGRAM.
    #[command(name = "__exec-listen", hide = true, disable_help_flag = true)]
    ExecListen {
        /// PROGRAM and its arguments.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
        args: Vec<OsString>,
    },
}

#[derive(clap::Args)]
struct ServeArgs {
    /// The directory to serve.
    #[arg(default_value = ".")]
    dir: PathBuf,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Worker processes (default: the available cores). 1 serves from this process; more makes
    /// this process a cluster primary that re-executes the same command as each worker.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=1024))]
    workers: Option<u16>,
    /// How connections reach workers: rr (the primary accepts and hands them out in turn),
    /// shared (one listening socket in every worker), reuseport (a SO_REUSEPORT socket per
    /// worker), least (the worker with the fewest open connections).
    #[arg(long, value_enum, default_value_t = PolicyArg::Rr)]
    policy: PolicyArg,
    /// Append the cluster's lifecycle events (fork, ready, exit, reload...) to FILE as JSON lines.
    #[arg(long, value_name = "FILE")]
    events: Option<PathBuf>,
    /// Serve /_nodus/* on this address instead of the public listener (where they answer
    /// loopback clients only).
    #[arg(long)]
    admin: Option<SocketAddr>,
    /// Log one line per request.
    #[arg(long)]
    access_log: bool,
    /// Seconds in-flight requests get to finish after a shutdown begins.
    #[arg(long, default_value_t = 10.0, value_parser = seconds)]
    drain_timeout: f64,
    /// Seconds to keep serving after SIGTERM (readyz answers 503) before draining.
    #[arg(long, default_value_t = 0.0, value_parser = seconds)]
    shutdown_delay: f64,
    /// Gzip text, JavaScript, JSON, XML and SVG responses for clients that accept it.
    #[arg(long)]
    gzip: bool,
    /// Whether files and directories whose names start with a dot are served.
    #[arg(long, value_enum, default_value_t = DotfilesArg::Deny)]
    dotfiles: DotfilesArg,
}

#[derive(Clone, Copy, ValueEnum)]
enum PolicyArg {
    Rr,
    Shared,
    Reuseport,
    Least,
}

impl PolicyArg {
    fn policy(self) -> nodus::cluster::Policy {
        match self {
            PolicyArg::Rr => nodus::cluster::Policy::RoundRobin,
            PolicyArg::Shared => nodus::cluster::Policy::Shared,
            PolicyArg::Reuseport => nodus::cluster::Policy::ReusePort,
            PolicyArg::Least => nodus::cluster::Policy::Least,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum DotfilesArg {
    Allow,
    Deny,
}

fn seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && (0.0..=86_400.0).contains(&v) => Ok(v),
        _ => Err(format!(
            "`{s}` is not a number of seconds between 0 and 86400"
        )),
    }
}

/// The cores this process may run on (1 if unknown).
fn available_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn main() {
    let cli = Cli::parse();
    if let Command::ExecListen { args } = cli.command {
        std::process::exit(exec_listen::exec_listen(args));
    }
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let color = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(color)
        .init();
    let code = match cli.command {
        Command::Top(args) => top::run(args),
        Command::ExecListen { .. } => unreachable!("handled before logging starts"),
        Command::Serve(args) => serve::app::run(ServeOptions {
            workers: args.workers.map_or_else(available_cores, usize::from),
            policy: args.policy.policy(),
            events: args.events,
            dir: args.dir,
            listen: args.listen,
            admin: args.admin,
            access_log: args.access_log,
            gzip: args.gzip,
            drain_timeout: Duration::from_secs_f64(args.drain_timeout),
            shutdown_delay: Duration::from_secs_f64(args.shutdown_delay),
            dotfiles: match args.dotfiles {
                DotfilesArg::Allow => Dotfiles::Allow,
                DotfilesArg::Deny => Dotfiles::Deny,
            },
        }),
    };
    std::process::exit(code);
}
