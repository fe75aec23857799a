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
//! - `nodus run [OPTIONS] [--] PROGRAM [ARGS]`: supervise any program (or, with `--node`, a stock
//!   Node app) as a cluster of workers.

/// `eprintln!` through the log lines' queue ([`nodus::process::output::log_writer`]): in order
/// with them, one whole line, never blocking nor panicking on a broken stderr; `main` flushes the
/// queue before the process exits.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let line = format!("{}\n", format_args!($($arg)*));
        let _ = nodus::process::output::log_writer().write_all(line.as_bytes());
    }};
}

mod exec_listen;
mod listen;
mod run;
mod rust_log;
mod serve;
mod top;

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use nodus::process::output::EXIT_DROP_GRACE;

use serve::app::ServeOptions;
use serve::static_files::Dotfiles;

#[derive(Parser)]
#[command(
    name = "nodus",
    version,
    about = "Node.js's process and event-loop model, observable by design",
    after_help = "Logs go to stderr; RUST_LOG sets which are written (default: info; RUST_LOG=warn, \
                  RUST_LOG=info,nodus::cluster=debug). A RUST_LOG that does not parse is info \
                  too, said in one WARN line at the start with the parse error. One that parses \
                  but is likely a mistake is kept and said the same way: a bare word near a level \
                  (RUST_LOG=infoo is the target infoo), or no directive for nodus's own targets \
                  (RUST_LOG=hyper=debug: not even nodus's errors are written)."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve DIR's files over HTTP, with admin endpoints under /_nodus/.
    ///
    /// Signals: SIGTERM/SIGINT drain and exit (see --shutdown-delay, --drain-timeout). SIGHUP is a
    /// rolling reload with --workers 2 or more (new workers re-executed from the binary's path,
    /// then the old ones drain); with --workers 1 (the default on one core) there is no worker
    /// to replace: one line says nothing was reloaded, and it serves on, losing nothing. A
    /// terminal's hangup (an SSH session dropped: the kernel's SIGHUP, or the shell's forwarded
    /// one while stdin, stdout or stderr is the hung-up terminal) drains and exits as SIGTERM
    /// does; under nohup (SIGHUP ignored at start) it is one line and changes nothing.
    /// SIGUSR1 and SIGUSR2 (to the primary, a worker or the single process) are one line each
    /// and change nothing. SIGQUIT keeps its default action (a core dump).
    Serve(ServeArgs),
    /// Live terminal dashboard of a running nodus server or cluster (reads ADDR's /_nodus/stats).
    ///
    /// One row per worker: pid, uptime, restarts, utilization, timer lateness p99, schedule
    /// delay p50/p99, run-queue mean and max, open connections, requests/s, RSS; sparklines of
    /// utilization and lateness; pool queues and waits; recent stalls. Keys: q quit, p pause,
    /// s sort, up/down select, enter detail, esc back. Figures that are rates or "recent" cover
    /// the refresh interval.
    ///
    /// Exit codes: 0 after q/Ctrl-C, SIGINT/SIGTERM/SIGHUP or the terminal's hangup (and after
    /// --once); 1 ADDR cannot be read at the start, or a terminal error; 2 a usage error (an ADDR
    /// that does not parse, or, without --once, a stdout that is not a terminal).
    Top(top::TopArgs),
    /// Internal (a supervisor's worker step): sets LISTEN_PID to this pid, then runs PROGRAM.
    #[command(name = "__exec-listen", hide = true, disable_help_flag = true)]
    ExecListen {
        /// PROGRAM and its arguments.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
        args: Vec<OsString>,
    },
    /// Supervise PROGRAM as a cluster of workers: restart budget, backoff, SIGHUP rolling
    /// reload, SIGTERM/SIGINT drain, no orphans (but a descendant that calls setsid while its
    /// worker runs outlives a SIGKILL of the primary: only a cgroup, systemd's, catches it).
    ///
    /// A plain program gets the -l listeners the systemd way (fds 3.., LISTEN_FDS, LISTEN_PID,
    /// LISTEN_FDNAMES) and a NOTIFY_SOCKET (READY=1: ready, waited for with --wait-ready;
    /// STOPPING=1: going down, see --restart). With
    /// --node, the workers are stock Node programs and nodus is their cluster primary:
    /// `http.createServer(...).listen(8080)` runs clustered with no code change (-l then only
    /// binds ADDR first, for the workers' listen on its port and an address it covers); each
    /// Node worker gets a NOTIFY_SOCKET of its own too (READY=1, STOPPING=1), never nodus's; one that
    /// closes its last server unasked (cluster.worker.disconnect()), once ready and up
    /// --min-uptime, is going down too. The start
    /// line names every address bound (port 0 resolved).
    /// Workers get NODUS_WORKER_ID (1..N) and NODE_APP_INSTANCE (0..N-1); their output is
    /// prefixed with "[worker ID PID] " (not with --raw-output).
    ///
    /// Signals to the primary: SIGTERM/SIGINT drain and exit; SIGHUP is a rolling reload (but a
    /// terminal's hangup, an SSH session dropped: the kernel's SIGHUP, or the shell's forwarded
    /// one while stdin, stdout or stderr is the hung-up terminal, drains and exits as SIGTERM
    /// does; under nohup, SIGHUP ignored at start, it is one line and changes nothing);
    /// SIGUSR1 and SIGUSR2 are one line each naming the workers' pids, and change nothing (not
    /// passed to the workers: send them to a worker's pid, Node's inspector or heap snapshot);
    /// SIGQUIT keeps its default action (a core dump; the workers are SIGKILLed with it).
    ///
    /// Each worker leads its own process group, stopped as systemd's KillMode=mixed does: a stop
    /// sends --kill-signal (SIGTERM by default; or a disconnect first) to the worker alone, then
    /// SIGCONT (a stopped worker handles it), SIGKILL to its group after --kill-timeout; once a
    /// worker has exited, for any reason, whatever is left of its process group is SIGKILLed at
    /// once (one WARN line names it: a wrapper script should `exec` its program).
    ///
    /// Exit codes: 0 after a drain in which every worker stopped in time (or once no worker is
    /// left after clean exits); 1 a start failure (the --events FILE cannot be opened; the
    /// program, or its #! interpreter, cannot be run, checked before any worker starts (an ELF
    /// file for a machine the kernel does not run, no binfmt_misc entry taking it, or a corrupt
    /// one too: "Exec format error"; a script with no #! line runs with /bin/sh); the workers' exec of it fails before any worker ran it (an
    /// ELF program is executed without /bin/sh: one for another machine, binfmt_misc not
    /// mounted and no emulator taking it, is "Exec format error" then, one line); a
    /// listener cannot be bound) or a worker left after a crash; 2 a usage error (an empty
    /// PROGRAM too); 75 the restart budget is spent;
    /// 124 a worker was SIGKILLed at --kill-timeout during the stop, or exited 124 (a nodus
    /// worker whose drain deadline cut requests); 128+N a second signal N during the drain (130
    /// SIGINT, 143 SIGTERM).
    Run(RunArgs),
}

#[derive(clap::Args)]
struct RunArgs {
    /// Worker processes (default: the available cores).
    #[arg(short = 'w', long, allow_negative_numbers = true, value_parser = worker_count)]
    workers: Option<u16>,
    /// Listen on ADDR (IP:PORT, [IPv6]:PORT or HOST:PORT, a host name resolved to its first
    /// address) before any worker starts and pass the socket to every worker: fds 3.. in order,
    /// with LISTEN_FDS (repeatable, each address once). With --node nothing is passed: a
    /// worker's listen on ADDR's port gets this socket instead of a new one when ADDR covers the
    /// host it names (none, ADDR's address, or any of ADDR's family when ADDR is 0.0.0.0 or [::],
    /// [::] covering IPv4 too unless v6-only: -l 0.0.0.0:8080 serves listen(8080, '127.0.0.1'));
    /// a named wildcard is an address like the others (listen(8080, '0.0.0.0') needs 0.0.0.0 or
    /// a dual-stack [::]); another address on that port gets a socket of its own and a warning.
    /// Under reuseport a worker's socket is bound to ADDR, v6-only if ADDR's socket is. Port 0 is
    /// refused, and a socket no worker listens on once all are ready is a warning.
    #[arg(short = 'l', long = "listen", value_name = "ADDR", value_parser = socket_addr)]
    listen: Vec<SocketAddr>,
    /// shared (one socket in every worker; the default for plain programs), reuseport (a
    /// SO_REUSEPORT socket per worker), or with --node also rr (the default there) and least.
    #[arg(long, value_enum)]
    policy: Option<PolicyArg>,
    /// Serve the cluster's /_nodus/ endpoints (metrics, stats, healthz, readyz, the live page)
    /// on this address (as -l's); `nodus top ADDR` watches it. readyz is 200 while a ready
    /// worker is not stalled (its loop answered the primary within 1 s) and can start its pool
    /// threads, 503 with why not.
    #[arg(long, value_name = "ADDR", value_parser = socket_addr)]
    admin: Option<SocketAddr>,
    /// Restart intensity: more than R restarts within --restart-window gives up (exit 75).
    /// Every restart counts, as in Erlang/OTP (PM2 counts only unstable ones): a crash's, a
    /// clean exit's under permanent, and the replacement of a worker going down (STOPPING=1, a
    /// Node worker's own disconnect), which is no crash for the backoff but is a restart.
    /// Default: 5 or twice the workers, whichever is more, so that one event that restarts every
    /// worker once (a database restart) does not give up; an R below the workers is warned of.
    #[arg(long, value_name = "R", allow_negative_numbers = true, value_parser = restart_count)]
    max_restarts: Option<u32>,
    /// The window of --max-restarts, in seconds.
    #[arg(
        long,
        value_name = "SECS",
        default_value_t = 60.0,
        allow_negative_numbers = true,
        value_parser = positive_seconds
    )]
    restart_window: f64,
    /// A worker up this long resets its slot's backoff; one that exits sooner, with any status
    /// (exit code 0 too: a program that daemonizes by mistake), is paced by --backoff as a
    /// crash is. A "going down" notice (STOPPING=1) replaces a worker early only once it is
    /// ready and up this long.
    #[arg(
        long,
        value_name = "SECS",
        default_value_t = 1.0,
        allow_negative_numbers = true,
        value_parser = seconds
    )]
    min_uptime: f64,
    /// Backoff for consecutive bad exits of a slot (crashes, and exits of any status before
    /// --min-uptime): initial seconds, factor, cap seconds (the first restart is immediate).
    #[arg(
        long,
        value_name = "I,F,C",
        default_value = "0.1,2,10",
        allow_hyphen_values = true,
        value_parser = backoff
    )]
    backoff: nodus::cluster::Backoff,
    /// After a worker is asked to stop (--kill-signal, or a disconnect for --node), seconds
    /// before SIGKILL to its process group (during a shutdown, the exit code is then 124). A
    /// worker sent a disconnect gets a drain deadline a tenth earlier (at most 1 s), and
    /// --kill-signal if it still runs 0.2 s after that deadline (at most halfway to the SIGKILL);
    /// a --node worker sooner, 1 s after its channel closed, once it holds no inbound connection
    /// and no output its stdout or stderr stream still queues. A worker that goes down by itself
    /// (STOPPING=1, a --node worker closing its last listener) and stays gets the same. Above 0. A stop is over within twice this + 3 s: the workers, what they left behind, then
    /// the exit (the flush of queued output to a stalled stderr included).
    #[arg(
        long,
        value_name = "SECS",
        default_value_t = 10.0,
        allow_negative_numbers = true,
        value_parser = positive_seconds
    )]
    kill_timeout: f64,
    /// The signal that stops a worker (PM2's --kill-signal): a plain program gets it at once, a
    /// --node worker after its disconnect, past its drain deadline (or sooner: see
    /// --kill-timeout); SIGKILL still follows at --kill-timeout. The processes the workers left
    /// behind that the primary adopted get it too at the stop. A name (SIGINT or INT, any case;
    /// SIGHUP to SIGSYS, SIGSTKFLT and SIGPWR included) or a number from 1 to 31; not SIGKILL
    /// nor SIGSTOP. SIGINT runs the process.on('SIGINT') cleanup of an app written for PM2
    /// (whose default it is). A worker that dies of it stopped as asked (exit code 0, as with
    /// SIGTERM). SIGCONT follows it (a stopped process handles it). In a wrapper script, `exec`
    /// the program (`sh -c 'exec node app.js'`): the signal reaches the worker alone, the shell,
    /// and what it leaves in its process group when it exits is SIGKILLed.
    #[arg(
        long,
        value_name = "SIGNAL",
        default_value = "SIGTERM",
        value_parser = kill_signal
    )]
    kill_signal: i32,
    /// During a reload, seconds a new worker gets to become ready; under rr and least, also how
    /// long an accepted connection waits for a worker to take it before it is reset; how long a
    /// listener whose workers left (a reload, a crash) stays open for their replacements, once
    /// ready, to listen on it again; with --node and no --ready-after, how long a worker may go
    /// without listening before a warning says so.
    #[arg(
        long,
        value_name = "SECS",
        default_value_t = 30.0,
        allow_negative_numbers = true,
        value_parser = positive_seconds
    )]
    ready_timeout: f64,
    /// A plain program is ready once up this long (default 1), whatever it sends, or at its
    /// READY=1 if that comes sooner. With --node a worker is ready at its first `listening`, or,
    /// given this, after being up this long without one (a worker that never listens: a queue
    /// consumer, an `exclusive` server). Not with --wait-ready. At or above --ready-timeout, a
    /// reload fails unless each new worker says READY=1 (or listens) sooner: warned of at the
    /// start.
    #[arg(
        long,
        value_name = "SECS",
        allow_negative_numbers = true,
        value_parser = seconds,
        conflicts_with = "wait_ready"
    )]
    ready_after: Option<f64>,
    /// A worker is ready only when it says so (PM2's --wait-ready): it sends READY=1 to its
    /// NOTIFY_SOCKET, or a --node worker calls process.send('ready') (its `listening` does not
    /// count). One that has not within --ready-timeout is warned about, once. A reload waits
    /// for it up to --ready-timeout, or fails and the running workers keep serving. Stricter
    /// than PM2 (whose --listen-timeout counts a silent worker as online): one that never says
    /// it stays not ready.
    #[arg(long)]
    wait_ready: bool,
    /// permanent (always restarted), transient (only after a crash), temporary (never). A
    /// "going down" notice (STOPPING=1) is no crash: under permanent a worker that serves is
    /// replaced at once and gets --kill-timeout to exit (--kill-signal past its drain deadline,
    /// then SIGKILL); under transient and temporary it restarts and stops nothing, the worker's
    /// real exit decides.
    #[arg(long, value_enum, default_value_t = RestartArg::Permanent)]
    restart: RestartArg,
    /// The workers are Node programs; nodus is their cluster primary (NODE_CLUSTER). Node makes a
    /// process a cluster worker only with a process.argv[1] (a script, or an argument after -e
    /// code), so `node -e CODE` alone is refused (give it one: `node -e CODE -- worker`). So is
    /// a launcher that is a Node program itself (npm, npx, yarn, pnpm, corepack: `npm start`, or
    /// as node's script: `node .../npm-cli.js start`), which would take the cluster channel,
    /// its app then binding the port itself: run `node FILE` (what package.json's
    /// scripts.start runs) instead. A listen with no host binds [::] dual-stack (0.0.0.0
    /// without IPv6), as Node does. A
    /// worker's process.send() messages reach no handler (nodus runs no JavaScript): each is a
    /// `message` event (--events; its JSON kept up to 64 KiB), the first one logged.
    #[arg(long)]
    node: bool,
    /// Append lifecycle events (fork, ready, exit, reload...) to FILE as JSON lines. Their t_ns
    /// is CLOCK_MONOTONIC nanoseconds (not wall time); a primary's first line also has unix_ns,
    /// the wall clock at that t_ns. A --node worker's process.send() message is a `message`
    /// event with its size (bytes) and its JSON up to 64 KiB (past that, "truncated": true
    /// instead of the JSON). Written by a thread of its own, so a FILE that takes no more (a
    /// stalled pipe, a full disk) never stalls the primary: lines it did not take are counted
    /// and said in a "log_gap" line. FILE is opened once (O_APPEND) and never reopened: rotate
    /// it with logrotate's copytruncate, not by renaming it.
    #[arg(long, value_name = "FILE")]
    events: Option<PathBuf>,
    /// Write the workers' stdout and stderr lines as they are, without the "[worker ID PID] "
    /// prefix (pm2-runtime's --raw), so a JSON log line (pino, bunyan) stays one for a log
    /// shipper reading nodus's stdout. Default: off (prefixed). Lines are still whole (up to
    /// 1 MiB) and never mixed; what a slow reader lost is still one prefixed
    /// "[worker ID PID] [N bytes of output dropped]" line.
    #[arg(long, visible_alias = "raw")]
    raw_output: bool,
    /// Deferred accept (TCP_DEFER_ACCEPT, nginx's `listen ... deferred`, a .socket unit's
    /// DeferAcceptSec=) on every TCP listener of the cluster (-l's, a socket the service manager
    /// passed, a --node worker's): a connection is accepted once its client sent its first bytes,
    /// which saves the workers a wake-up per connection. Only for protocols whose client speaks
    /// first (HTTP, TLS): a client that waits for the server is accepted about a second late, and
    /// one that has not spoken yet when the cluster stops (or, under reuseport, when its worker is
    /// reloaded) is reset instead of served. Default: off.
    #[arg(long)]
    defer_accept: bool,
    /// The program and its arguments: everything from the first argument that is not an option
    /// of nodus on (as for `timeout` or `nice`), or everything after `--`.
    #[arg(trailing_var_arg = true, required = true, value_name = "PROGRAM")]
    command: Vec<std::ffi::OsString>,
}

#[derive(Clone, Copy, ValueEnum)]
enum RestartArg {
    Permanent,
    Transient,
    Temporary,
}

fn backoff(s: &str) -> Result<nodus::cluster::Backoff, String> {
    let parts: Vec<&str> = s.split(',').collect();
    let bad = || format!("`{s}` is not INITIAL,FACTOR,CAP (seconds, factor >= 1, seconds)");
    let [i, f, c] = parts[..] else {
        return Err(bad());
    };
    let (i, f, c) = (
        seconds(i)?,
        f.parse::<f64>().map_err(|_| bad())?,
        seconds(c)?,
    );
    if !(1.0..=100.0).contains(&f) || c < i {
        return Err(bad());
    }
    Ok(nodus::cluster::Backoff {
        initial: Duration::from_secs_f64(i),
        factor: f,
        cap: Duration::from_secs_f64(c),
    })
}

#[derive(clap::Args)]
struct ServeArgs {
    /// The directory to serve.
    #[arg(default_value = ".")]
    dir: PathBuf,
    /// Address to listen on: IP:PORT, [IPv6]:PORT or HOST:PORT (a host name is resolved at
    /// the start, its first address taken, as Node's listen(port, host) does). Ignored, with a
    /// warning, when a service manager passes the listener (socket activation).
    #[arg(long, default_value = "127.0.0.1:8080", value_parser = socket_addr)]
    listen: SocketAddr,
    /// Worker processes (default: the available cores). 1 serves from this process (SIGHUP then
    /// reloads nothing); more makes this process a cluster primary that re-executes the same
    /// command as each worker.
    #[arg(long, allow_negative_numbers = true, value_parser = worker_count)]
    workers: Option<u16>,
    /// How connections reach workers: rr (the primary accepts and hands them out in turn;
    /// the default), shared (one listening socket in every worker), reuseport (a SO_REUSEPORT
    /// socket per worker), least (the worker with the fewest open connections).
    #[arg(long, value_enum)]
    policy: Option<PolicyArg>,
    /// Append the cluster's lifecycle events (fork, ready, exit, reload...) to FILE as JSON lines
    /// (t_ns: CLOCK_MONOTONIC nanoseconds; a primary's first line also has unix_ns, the wall
    /// clock at that t_ns), as nodus run --events does.
    #[arg(long, value_name = "FILE")]
    events: Option<PathBuf>,
    /// Serve /_nodus/* on this address (not --listen's) instead of the public listener (where
    /// they answer loopback clients only; with --admin, none, unless --admin-on-public on).
    /// Ignored, with a warning, when a service manager passes a socket named admin. With
    /// --workers 2 or more, its readyz is the cluster's: 200 while a ready worker is not stalled
    /// (its loop answered the primary within 1 s) and can start its pool threads, 503 with why
    /// not.
    #[arg(long, value_parser = socket_addr)]
    admin: Option<SocketAddr>,
    /// Whether the public listener answers /_nodus/* (to loopback clients whose request carries
    /// no Forwarded, X-Forwarded-For nor X-Real-IP). Default: on, off with an admin listener
    /// (--admin, or a socket named admin). Behind a proxy on this host that adds none of those
    /// headers (nginx without proxy_set_header, or a TCP proxy or TLS terminator, which cannot)
    /// every client is a loopback one: give --admin, or off.
    #[arg(long, value_enum, value_name = "on|off", hide_possible_values = true)]
    admin_on_public: Option<OnOff>,
    /// Log one line per request on stderr (PEER "METHOD PATH VERSION" STATUS BYTES TIME, TIME in
    /// ms: 0.058ms), those refused before the handler included (400 for a missing, repeated or
    /// invalid Host or for framing Node refuses, 413, 417; a head that could not be parsed, 400,
    /// 414 or 431, is logged as "- - -").
    /// Written whatever level RUST_LOG sets, unless it names the target nodus::access itself.
    #[arg(long)]
    access_log: bool,
    /// Seconds in-flight requests get to finish after a shutdown begins. Exit code 0 when every
    /// request was answered, 124 when this deadline cut some, 128+N when a second signal N
    /// stopped the drain at once. The whole stop, its exit included (the flush of queued output
    /// to a stalled stderr), is over within --shutdown-delay + this + 8 s.
    #[arg(
        long,
        default_value_t = 10.0,
        allow_negative_numbers = true,
        value_parser = seconds
    )]
    drain_timeout: f64,
    /// Seconds to keep serving after SIGTERM (readyz answers 503) before draining.
    #[arg(
        long,
        default_value_t = 0.0,
        allow_negative_numbers = true,
        value_parser = seconds
    )]
    shutdown_delay: f64,
    /// Gzip text, JavaScript, JSON, XML and SVG files of 1 KiB or more for clients that accept
    /// it and ask for no range.
    #[arg(long)]
    gzip: bool,
    /// Whether files and directories whose names start with a dot are served.
    #[arg(
        long,
        value_enum,
        default_value_t = DotfilesArg::Deny,
        value_name = "allow|deny",
        hide_possible_values = true
    )]
    dotfiles: DotfilesArg,
    /// Whether a directory without index.html is answered with an HTML listing of its entries
    /// (at most 10,000; cached, one built at a time) or, with off, 404 as a missing name.
    #[arg(
        long,
        value_enum,
        default_value_t = OnOff::On,
        value_name = "on|off",
        hide_possible_values = true
    )]
    listings: OnOff,
    /// With --workers 2 or more, write the workers' stdout and stderr lines (their logs, the
    /// access log) without the "[worker ID PID] " prefix, as `nodus run --raw-output` does.
    /// Default: off (prefixed).
    #[arg(long, visible_alias = "raw")]
    raw_output: bool,
    /// Most connections each process keeps open on the public listener; past it, newcomers wait
    /// in the backlog until one closes. Default: from the open-files limit, so the fds never run
    /// out for the files of the connections held: (limit - fds open at the start - a reserve of
    /// an eighth of the limit, at least 64 but no more than half of the free fds) / 2, at most
    /// 10,000 (said at the start). More than the limit holds is warned about.
    #[arg(long, value_name = "N", value_parser = connection_count)]
    max_connections: Option<u64>,
    /// Defer the public listener's accepts (TCP_DEFER_ACCEPT, nginx's `listen ... deferred`): a
    /// connection is taken once its client sent its request, which saves a wake-up per
    /// connection (under rr, the worker's). The price: a client that connected and has not
    /// spoken yet (a browser's preconnect) waits in the kernel. With --workers 1, and under
    /// --policy reuseport, a stop (SIGTERM) or a reload still serves it: the drain turns deferral
    /// off and accepts on for up to 1.2 s while the kernel holds any. Under shared, rr and least
    /// a stop resets it instead of serving it. Default: off.
    #[arg(long)]
    defer_accept: bool,
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

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum OnOff {
    On,
    Off,
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

/// Like [`seconds`], but 0 is refused: a restart window or a ready timeout of 0 would turn the
/// restart budget or every reload into nothing, and a kill timeout of 0 would make every stop a
/// race between the worker's own exit and the SIGKILL.
fn positive_seconds(s: &str) -> Result<f64, String> {
    match seconds(s) {
        Ok(v) if v > 0.0 => Ok(v),
        _ => Err(format!(
            "`{s}` is not a number of seconds above 0 and at most 86400"
        )),
    }
}

/// `-w`, `--workers`: a whole number from 1 to 1024. The numeric flags take a value that starts
/// with `-` (`allow_negative_numbers`), so `-1` gets this message rather than clap's hint to
/// write `-- -1`, which would make `-1` `nodus run`'s PROGRAM.
fn worker_count(s: &str) -> Result<u16, String> {
    match s.parse::<u16>() {
        Ok(n) if (1..=1024).contains(&n) => Ok(n),
        _ => Err("must be a whole number from 1 to 1024".to_owned()),
    }
}

/// `--max-connections`: a whole number of connections, 1 or more.
fn connection_count(s: &str) -> Result<u64, String> {
    match s.parse::<u64>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err("must be a whole number of connections, 1 or more".to_owned()),
    }
}

/// `--kill-signal`: a signal's name (`SIGINT`, `INT`, any case; every standard one, as
/// [`nodus::signal::by_name`] reads it) or number, 1 to 31 (Linux's standard signals), but not
/// SIGKILL nor SIGSTOP, which no handler can catch: a stop must let the worker clean up, and
/// SIGKILL comes at the kill timeout anyway.
fn kill_signal(s: &str) -> Result<i32, String> {
    let found = if s.bytes().all(|b| b.is_ascii_digit()) {
        s.parse::<i32>().ok().filter(|n| (1..=31).contains(n))
    } else {
        nodus::signal::by_name(s)
    };
    match found {
        Some(n @ (libc::SIGKILL | libc::SIGSTOP)) => Err(format!(
            "{} cannot be caught, so no worker could clean up: SIGKILL comes at --kill-timeout",
            nodus::signal::name(n)
        )),
        Some(n) => Ok(n),
        None => Err(
            "not a signal: a name (SIGINT, INT) or a number from 1 to 31 (not SIGKILL nor SIGSTOP)"
                .to_owned(),
        ),
    }
}

/// `--max-restarts`: a whole number, 0 or more (0: the first crash gives up).
fn restart_count(s: &str) -> Result<u32, String> {
    s.parse()
        .map_err(|_| "must be a whole number, 0 or more".to_owned())
}

/// An address and port (`--listen`, `-l`, `--admin`): `IP:PORT`, `[IPv6]:PORT` (its zone may
/// name an interface: `[fe80::1%eth0]:80`, which std does not read) or `HOST:PORT`, a host name
/// resolved here, before any loop runs, to its first address, as Node's `listen(port, host)`
/// takes it. A port out of range is said to be (std's message is only "invalid socket address
/// syntax"), and so is a host name that does not resolve.
fn socket_addr(s: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = s.parse() {
        return Ok(addr);
    }
    let syntax = || "invalid socket address syntax (IP:PORT, [IPv6]:PORT or HOST:PORT)".to_owned();
    let (host, port) = s.rsplit_once(':').ok_or_else(syntax)?;
    // All digits, as std reads a port (`u16::from_str` alone would take `+80`).
    let port: u16 = match port.parse() {
        Ok(p) if port.bytes().all(|b| b.is_ascii_digit()) => p,
        _ => return Err(port_out_of_range(port).unwrap_or_else(syntax)),
    };
    if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        use nodus::net::IntoSocketAddr;
        // Without a zone std read it above, or it is no address; std reads only a numeric zone,
        // an interface name is looked up.
        if !v6.contains('%') {
            return Err(syntax());
        }
        return (v6, port)
            .into_socket_addr()
            .map_err(|e| match (e.kind(), v6.split_once('%')) {
                (std::io::ErrorKind::NotFound, Some((_, zone))) => {
                    format!("no network interface is named '{zone}'")
                }
                _ => syntax(),
            });
    }
    // An IPv6 address goes in brackets.
    if host.is_empty() || host.contains([':', '[', ']']) {
        return Err(syntax());
    }
    resolve(host, port)
}

/// `host`'s first address (`getaddrinfo`'s order, as Node's `dns.lookup` gives it), with `port`.
fn resolve(host: &str, port: u16) -> Result<SocketAddr, String> {
    use std::net::ToSocketAddrs;
    let cannot = |why: String| {
        format!(
            "cannot resolve {}: {why}",
            nodus::fs::quote(std::path::Path::new(host))
        )
    };
    let mut addrs = (host, port).to_socket_addrs().map_err(|e| {
        let why = e.to_string();
        // std's "failed to lookup address information: Name or service not known".
        let why = why
            .strip_prefix("failed to lookup address information: ")
            .unwrap_or(&why);
        cannot(why.to_owned())
    })?;
    addrs
        .next()
        .ok_or_else(|| cannot("it has no address".to_owned()))
}

/// For a port that did not parse as a `u16`: the message, if it is a number too big for one.
fn port_out_of_range(port: &str) -> Option<String> {
    (!port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()))
        .then(|| format!("port {port} is out of range (0-65535)"))
}

/// `nodus serve`'s worker count; with one (a single process), the cluster's own flags are
/// ignored, which a warning says.
fn cluster_size(args: &ServeArgs) -> usize {
    let workers = args.workers.map_or_else(available_cores, usize::from);
    if workers == 1 {
        let given = [
            ("--policy", args.policy.is_some()),
            ("--events", args.events.is_some()),
        ];
        for (flag, _) in given.into_iter().filter(|&(_, given)| given) {
            tracing::warn!(
                "{flag} applies to a cluster (--workers 2 or more): ignored with one worker"
            );
        }
    }
    workers
}

/// The cores this process may run on (1 if unknown).
fn available_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Names this process after its binary, as `exec` by path would have (`/proc/PID/comm`: what
/// `ps`, `top`, `pgrep -x` and `pidof` read). A worker of `nodus serve --workers N` is executed
/// through its generation's pinned binary, `/proc/self/fd/FD` (`Config::pin_program`), which the
/// kernel names `FD`. Called before any thread starts: a thread takes its creator's name.
fn name_after_argv0() {
    let Some(argv0) = std::env::args_os().next() else {
        return;
    };
    let Some(name) = std::path::Path::new(&argv0).file_name() else {
        return;
    };
    if let Ok(name) = std::ffi::CString::new(name.as_encoded_bytes()) {
        // The kernel keeps the first 15 bytes.
        let _ = rustix::thread::set_name(&name);
    }
}

fn main() {
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    // Whether `serve --listen` was given, not defaulted (socket activation then ignores it).
    let listen_given = matches
        .subcommand_matches("serve")
        .is_some_and(|m| m.value_source("listen") == Some(clap::parser::ValueSource::CommandLine));
    if let Command::ExecListen { args } = cli.command {
        // Returns only when the program could not be run, after saying why.
        let code = exec_listen::exec_listen(args);
        nodus::process::output::flush_before_exit(exit_flush_timeout());
        std::process::exit(code);
    }
    // A worker of `nodus serve --workers N` (it finds `NODUS_LISTEN`), run from its generation's
    // pinned binary: its name first, before any thread starts.
    let serve_worker = matches!(cli.command, Command::Serve(_))
        && nodus::cluster::is_worker()
        && std::env::var_os("NODUS_LISTEN").is_some();
    if serve_worker {
        name_after_argv0();
    }
    let access_log = matches!(&cli.command, Command::Serve(args) if args.access_log);
    let (filter, warning) =
        rust_log::log_filter(std::env::var_os("RUST_LOG").as_deref(), access_log);
    let color = std::io::IsTerminal::is_terminal(&std::io::stderr());
    // Log lines are queued to stderr's writer thread: logging never blocks (a full pipe) nor
    // panics (a closed one; tracing-subscriber would report the failed write with `eprintln!`).
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(nodus::process::output::log_writer)
        .log_internal_errors(false)
        .with_ansi(color)
        .init();
    // A serve worker runs the primary's command line in its environment: the primary said it.
    if let Some(why) = warning.filter(|_| !serve_worker) {
        tracing::warn!(target: rust_log::TARGET, "{why}");
    }
    let code = match cli.command {
        Command::Top(args) => top::run(args),
        Command::ExecListen { .. } => unreachable!("handled before logging starts"),
        Command::Run(args) => run::run(run::RunOptions {
            workers: args.workers.map_or_else(available_cores, usize::from),
            listen: args.listen,
            admin: args.admin,
            policy: args.policy.map(PolicyArg::policy),
            max_restarts: args.max_restarts,
            restart_window: Duration::from_secs_f64(args.restart_window),
            min_uptime: Duration::from_secs_f64(args.min_uptime),
            backoff: args.backoff,
            kill_timeout: Duration::from_secs_f64(args.kill_timeout),
            kill_signal: args.kill_signal,
            ready_timeout: Duration::from_secs_f64(args.ready_timeout),
            ready_after: args.ready_after.map(Duration::from_secs_f64),
            wait_ready: args.wait_ready,
            restart: match args.restart {
                RestartArg::Permanent => nodus::cluster::RestartType::Permanent,
                RestartArg::Transient => nodus::cluster::RestartType::Transient,
                RestartArg::Temporary => nodus::cluster::RestartType::Temporary,
            },
            node: args.node,
            events: args.events,
            raw_output: args.raw_output,
            defer_accept: args.defer_accept,
            command: args.command,
        }),
        Command::Serve(args) => serve::app::run(ServeOptions {
            workers: cluster_size(&args),
            policy: args.policy.unwrap_or(PolicyArg::Rr).policy(),
            events: args.events,
            dir: args.dir,
            listen: args.listen,
            listen_given,
            admin: args.admin,
            admin_on_public: args.admin_on_public.map(|v| matches!(v, OnOff::On)),
            access_log: args.access_log,
            gzip: args.gzip,
            drain_timeout: Duration::from_secs_f64(args.drain_timeout),
            shutdown_delay: Duration::from_secs_f64(args.shutdown_delay),
            dotfiles: match args.dotfiles {
                DotfilesArg::Allow => Dotfiles::Allow,
                DotfilesArg::Deny => Dotfiles::Deny,
            },
            listings: args.listings == OnOff::On,
            raw_output: args.raw_output,
            max_connections: args.max_connections,
            defer_accept: args.defer_accept,
        }),
    };
    // What is still queued for stdout and stderr (the workers' last lines, ours).
    nodus::process::output::flush_before_exit(exit_flush_timeout());
    std::process::exit(code);
}

/// How long the exit waits for queued output (the workers' last lines, our last log lines) to
/// be written to a slow reader, at most; past it, what is left is dropped with a notice per
/// worker, given at most [`EXIT_DROP_GRACE`] (1 s) more. After a stop, less: what is left of
/// the stop's bound ([`stop_began`]).
const EXIT_FLUSH_TIMEOUT: Duration = Duration::from_secs(10);

/// What a stop takes past its workers' end, at most, counted in its bound: their last output
/// (0.2 s), the event log's lines still queued ([`nodus::cluster::EVENT_LOG_FLUSH`], 0.5 s), the
/// admin listener's drain (1 s), and the drop notices of output a stalled reader did not take
/// ([`EXIT_DROP_GRACE`], 1 s), rounded up. The exit's flush of queued output gets
/// what is left of the bound, so it never makes a stop outlast it: with a journal that stalls, a
/// service manager's stop timeout above the bound still sees nodus exit on its own, with its
/// exit code.
const EXIT_MARGIN: Duration = Duration::from_secs(3);

/// When the stop under way must be over (set once, when it began).
static STOP_DEADLINE: OnceLock<Instant> = OnceLock::new();

/// A stop began (SIGTERM or SIGINT, or a cluster's shutdown for any cause) that must be over
/// within `bound`, its exit included: the exit's flush waits for queued output only until
/// `bound` less [`EXIT_DROP_GRACE`] from now. The first call counts.
fn stop_began(bound: Duration) {
    let _ = STOP_DEADLINE.set(Instant::now() + bound);
}

/// The exit's wait for queued output: [`EXIT_FLUSH_TIMEOUT`], or what is left of the stop's
/// bound less the drop notices' grace, if that is less (nothing, once it is spent).
fn exit_flush_timeout() -> Duration {
    STOP_DEADLINE.get().map_or(EXIT_FLUSH_TIMEOUT, |deadline| {
        deadline
            .saturating_duration_since(Instant::now() + EXIT_DROP_GRACE)
            .min(EXIT_FLUSH_TIMEOUT)
    })
}

#[cfg(test)]
mod tests {
    use super::kill_signal;

    #[test]
    fn kill_signal_takes_every_catchable_standard_signal_by_name_or_number() {
        for n in (1..=31).filter(|&n| n != libc::SIGKILL && n != libc::SIGSTOP) {
            let name = nodus::signal::name(n);
            assert_eq!(kill_signal(name), Ok(n), "{name}");
            assert_eq!(
                kill_signal(&name[3..].to_ascii_lowercase()),
                Ok(n),
                "{name}"
            );
            assert_eq!(kill_signal(&n.to_string()), Ok(n), "{n}");
        }
        assert_eq!(kill_signal("SIGSTKFLT"), Ok(libc::SIGSTKFLT));
        assert_eq!(kill_signal("pwr"), Ok(libc::SIGPWR));
        for bad in ["KILL", "9", "SIGSTOP", "0", "32", "SIGRTMIN", "SIGFOO", ""] {
            assert!(kill_signal(bad).is_err(), "{bad}");
        }
    }
}
