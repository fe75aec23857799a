//! `nodus serve`: serving a directory and the admin endpoints, from one process or as a cluster,
//! with a graceful shutdown on SIGTERM/SIGINT.
//!
//! Three roles, one binary: `--workers 1` serves from this process; `--workers N` makes this
//! process a cluster primary (`cluster_primary`) that re-executes the same command line as N
//! workers; a process started that way (`NODE_UNIQUE_ID` set) is a worker and gets its public
//! listener from the primary.
//!
//! The admin endpoints answer on the admin listener (`--admin`, a socket named admin; a worker's
//! is its primary's) and on the public one as `--admin-on-public` says, by default only without
//! an admin listener ([`admin_on_public`]); every role's start line says where ([`admin_note`]).
//!
//! Every request's filesystem work (open, readlink, fstat, read, a listing's readdir) runs on the
//! I/O pool; the loop only routes, writes headers and moves 64 KiB chunks (and closes the files
//! it served, and the descriptor of a directory whose listing was cached). Listings are cached and built one at a time
//! per process (`listing_cache`), so requests for them, served or abandoned, never queue more
//! than one listing ahead of a file's I/O on the pool. A request whose file system work failed
//! for the server's own reason (`static_files::Failure`: out of descriptors, say) is answered 503
//! or 500 and said in a WARN line (target `nodus::serve`) once per burst, then counted: one line
//! per 10 s while it lasts (`Site::failures`, `nodus::log_limit`).
//!
//! The public listener keeps at most as many connections open as the open-files limit holds
//! with the fds their requests need (`fd_budget`: two per connection, a reserve for the rest;
//! `--max-connections` instead), so clients that hold connections up to the limit do not starve
//! the file opens of those connections: past the cap newcomers wait in the backlog. Each process
//! computes its own at its start and says it (INFO; a worker DEBUG; WARN when low).
//!
//! Shutdown: readyz turns 503 at once, serving goes on for `--shutdown-delay` (so a load balancer
//! notices), then both listeners stop accepting (a deferring public one first takes, for up to
//! 1.2 s, the clients the kernel still holds for it: `nodus_http::serve`'s drain) and in-flight
//! requests get `--drain-timeout` to finish. The exit code says what the stop lost, as the cluster's does: 0 when every request was
//! answered, [`FORCED_STOP_EXIT_CODE`] (124) when the drain deadline cut requests, 128 + N when a
//! second signal N ended the stop at once. The whole stop, its exit's flush of queued output
//! included, is over within [`stop_bound`]: shutdown delay + drain timeout + 8 s, whatever the
//! role (a cluster's workers are SIGKILLed 5 s past the drain deadline).
//!
//! systemd's watchdog (`WATCHDOG_USEC`, `WATCHDOG_PID` unset or this pid): the single process
//! sends `WATCHDOG=1` every half period from a task on its loop, from `READY=1` until it exits,
//! so a stalled loop stops the pings; a cluster primary sends them for its workers' loops.
//!
//! SIGHUP is the cluster primary's rolling reload, unless it is the terminal hanging up (an SSH
//! session dropped, a terminal closed: `nodus::signal::sighup`, the kernel's SIGHUP or a shell's
//! forwarded one while a standard fd is the hung-up terminal), and the single process or the
//! primary stops as for SIGTERM rather than serve on detached, holding its port, its output
//! lost; under `nohup` (SIGHUP ignored at start) a hangup is one line and changes nothing. The
//! single process (`--workers 1`, the default on one core) catches it too and is never stopped
//! by a reload's SIGHUP: there is no worker to replace, so it logs one line saying nothing was
//! reloaded and serves on, losing nothing; a service manager that asked for the reload
//! (`NOTIFY_SOCKET`) hears `RELOADING=1` and `READY=1` at once, so neither `Type=notify` nor
//! `Type=notify-reload` is left waiting. A SIGHUP during the drain
//! is not a second signal: it is logged and ignored. A worker sent SIGHUP itself is not stopped
//! either: `nodus::cluster::Worker` catches it for every Rust worker (one line naming the
//! primary to send it to), so the primary spends no restart on it.
//!
//! SIGUSR1 and SIGUSR2 stop nothing, whatever the role: one WARN line each (none from a worker
//! that is draining: its stream is caught but no longer read), and serving (or a drain) goes on
//! (a cluster primary's line, `nodus::cluster::Primary`'s, names its workers' pids). Their default action would end the process with no drain (a `pkill -USR1 nodus`, a
//! logrotate `postrotate` habit); nodus serve has no use for either. SIGQUIT keeps its default
//! action (a core dump, for a process that hangs): the documented stop is SIGTERM.
//!
//! The access log (`access_log`): the server's `on_response` hook writes the line of each
//! answer of the handler once it is done with (its last body byte written, or its connection
//! ended); its `on_refused` hook writes the lines of what it answered in the handler's stead, and
//! of a request whose connection ended before its handler answered (499).

use std::cell::Cell;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Duration;

use http::{HeaderMap, Method, Request, Response, StatusCode};
use nodus::cluster::FORCED_STOP_EXIT_CODE;
use nodus::fs::quote;
use nodus::log_limit::{self, LogLimit};
use nodus::net::TcpListener;
use nodus::signal::{SIGHUP, SIGINT, SIGTERM, SIGUSR1, SIGUSR2, Sighup, Signals};
use nodus_http::server::{Answered, ConnInfo, Refused};
use nodus_http::{Body, Config, RequestBody, full, serve, text};

use super::access_log::{log_answered, log_refused};
use super::admin;
use super::fd_budget;
use super::file_body::FileBody;
use super::gzip;
use super::listing_cache::Listings;
use super::own_socket::OwnSocket;
use super::static_files::{self, Dotfiles, Plan, Planned, StaticOptions};

/// What `nodus serve` was asked to do.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub dir: PathBuf,
    pub listen: SocketAddr,
    /// `--listen` was given (not its default): with sockets passed by a service manager, which
    /// are served instead, it is warned about.
    pub listen_given: bool,
    pub admin: Option<SocketAddr>,
    /// `--admin-on-public`: whether the public listener answers `/_nodus/*` (to loopback
    /// clients no proxy relayed); `None`: only when there is no admin listener
    /// ([`admin_on_public`]).
    pub admin_on_public: Option<bool>,
    pub access_log: bool,
    pub drain_timeout: Duration,
    pub shutdown_delay: Duration,
    pub dotfiles: Dotfiles,
    /// `--listings`: a directory without `index.html` is listed (else 404).
    pub listings: bool,
    /// Gzip compressible responses for clients that accept it.
    pub gzip: bool,
    /// Worker processes: 1 serves from this process.
    pub workers: usize,
    pub policy: nodus::cluster::Policy,
    /// A cluster primary's JSON-lines event log.
    pub events: Option<PathBuf>,
    /// A cluster primary writes its workers' lines without their prefix
    /// ([`nodus::cluster::Config::raw_output`]).
    pub raw_output: bool,
    /// `--max-connections`: the public listener's cap instead of the one from the open-files
    /// limit (`fd_budget`).
    pub max_connections: Option<u64>,
    /// `--defer-accept`: the public listener defers its accepts (`TCP_DEFER_ACCEPT`).
    pub defer_accept: bool,
}

/// Shared by every request of the process.
pub(super) struct Site {
    root: PathBuf,
    static_options: StaticOptions,
    listings: Rc<Listings>,
    /// Admin endpoints on the public listener ([`admin_on_public`]).
    admin_on_public: bool,
    /// False once this process's shutdown (or, for a worker, its drain) began.
    ready: Cell<bool>,
    source: admin::Source,
    /// Static requests answered 503 or 500 for a file system call that failed
    /// (`static_files::Failure`): logged once per burst, then counted.
    failures: Rc<LogLimit>,
}

impl Site {
    fn readiness(&self) -> admin::Readyz {
        if self.ready.get() {
            self.source.readiness()
        } else {
            admin::Readyz::ShuttingDown
        }
    }
}

/// Runs `nodus serve` until a shutdown signal; returns the process exit code.
pub fn run(options: ServeOptions) -> i32 {
    let flagged = [("--listen", options.listen)].into_iter();
    let flagged: Vec<_> = flagged
        .chain(options.admin.map(|a| ("--admin", a)))
        .collect();
    if let Some(clash) = crate::listen::first_clash(&flagged) {
        // A usage error: exit code 2, as for a flag clap refuses.
        say!("nodus serve: {clash}");
        return 2;
    }
    nodus::process::raise_fd_limit();
    let root = match static_files::canonical_root(&options.dir) {
        Ok(root) if root.is_dir() => root,
        Ok(_) => {
            return fail(format!(
                "cannot serve {}: not a directory",
                quote(&options.dir)
            ));
        }
        Err(e) => return fail(format!("cannot serve {}: {e}", quote(&options.dir))),
    };
    let rt = nodus::Runtime::new();
    rt.block_on(async move {
        match nodus::cluster::Worker::get() {
            Ok(Some(worker)) => serve_worker(options, root, worker).await,
            Ok(None) if options.workers > 1 => super::cluster_primary::run(options).await,
            Ok(None) => serve_until_signal(options, root).await,
            Err(e) => fail(format!("cannot join the cluster: {e}")),
        }
    })
}

/// How long a cluster's worker gets past its drain deadline before SIGKILL: the kill timeout is
/// `--drain-timeout` + this.
pub(super) const KILL_MARGIN: Duration = Duration::from_secs(5);

/// How long a stop of `nodus serve` (SIGTERM or SIGINT) takes at most, its exit included:
/// `--shutdown-delay` + `--drain-timeout` + [`KILL_MARGIN`] (a cluster's workers are gone by
/// then) + [`EXIT_MARGIN`](crate::EXIT_MARGIN) (3 s). The same for one process, which is done
/// draining sooner: the exit's flush of queued output waits at most 10 s, and never past it.
pub(super) fn stop_bound(options: &ServeOptions) -> Duration {
    options.shutdown_delay + options.drain_timeout + KILL_MARGIN + crate::EXIT_MARGIN
}

pub(super) fn fail(message: String) -> i32 {
    say!("nodus serve: {message}");
    1
}

/// The public and admin listeners: inherited from a service manager (`LISTEN_FDS`, systemd
/// socket activation; a socket named `admin` is the admin listener; under `reuse_port`
/// refused), an address given for one of them (`--listen`, `--admin`) then warned about as
/// ignored; or bound from the options (the public one with `SO_REUSEPORT` when `reuse_port`).
/// With `--defer-accept` the public one defers its accepts (`TCP_DEFER_ACCEPT`, on a passed
/// socket too; without it a passed socket keeps what the service manager set, `DeferAcceptSec=`).
pub(super) fn listeners(
    options: &ServeOptions,
    reuse_port: bool,
) -> Result<(TcpListener, Option<TcpListener>), String> {
    let (public, admin) = bound_or_inherited(options, reuse_port)?;
    if options.defer_accept {
        public
            .set_defer_accept(true)
            .map_err(|e| format!("cannot defer the public listener's accepts: {e}"))?;
    }
    Ok((public, admin))
}

fn bound_or_inherited(
    options: &ServeOptions,
    reuse_port: bool,
) -> Result<(TcpListener, Option<TcpListener>), String> {
    let inherited =
        nodus::net::listen_fds().map_err(|e| format!("cannot use the inherited sockets: {e}"))?;
    if inherited.is_empty() {
        return Ok((
            crate::listen::bind(options.listen, reuse_port)?,
            options.admin.map(crate::listen::bind_admin).transpose()?,
        ));
    }
    let (mut public, mut admin) = (None, None);
    for socket in inherited {
        match socket {
            nodus::net::Inherited::Tcp(name, l) if name == "admin" => admin = Some(l),
            nodus::net::Inherited::Tcp(_, l) if public.is_none() => public = Some(l),
            other => {
                return Err(format!(
                    "cannot serve the inherited socket {other}: one public TCP listener (and one \
                     named admin) is supported"
                ));
            }
        }
    }
    let public = public.ok_or("the inherited sockets hold no public TCP listener")?;
    if reuse_port {
        return Err(crate::listen::reuseport_refused(&public));
    }
    let passed = |l: &TcpListener| {
        l.local_addr()
            .map_or_else(|e| format!("its address: {e}"), |a| a.to_string())
    };
    if options.listen_given {
        tracing::warn!(
            "--listen {} ignored: serving the socket the service manager passed ({}) instead",
            options.listen,
            passed(&public)
        );
    }
    if let (Some(a), Some(l)) = (options.admin, &admin) {
        tracing::warn!(
            "--admin {a} ignored: serving /_nodus/ on the socket named admin the service manager \
             passed ({}) instead",
            passed(l)
        );
    }
    Ok((
        public,
        admin
            .map(Ok)
            .or_else(|| options.admin.map(crate::listen::bind_admin))
            .transpose()?,
    ))
}

async fn serve_until_signal(options: ServeOptions, root: PathBuf) -> i32 {
    let (public, admin_listener) = match listeners(&options, false) {
        Ok(l) => l,
        Err(e) => return fail(e),
    };
    let mut signals = match Signals::new(&[SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2]) {
        Ok(s) => s,
        Err(e) => {
            return fail(format!(
                "cannot catch SIGTERM/SIGINT/SIGHUP/SIGUSR1/SIGUSR2: {e}"
            ));
        }
    };
    let site = new_site(
        &options,
        root,
        admin_on_public(&options, admin_listener.is_some()),
        admin::Source::Local,
    );
    let budget = fd_budget::measure(None, options.max_connections);
    budget.say(false, admin_listener.is_some());
    let running = start_servers(&options, &site, public, admin_listener, budget);
    tell_manager("READY=1\nSTATUS=serving");
    start_watchdog();
    let why = loop {
        match signals.recv_from().await {
            (SIGHUP, origin) => match nodus::signal::sighup(origin) {
                Sighup::Hangup => {
                    break "SIGHUP: the terminal hung up (a stop; kill -HUP reloads)";
                }
                Sighup::HangupIgnored => tracing::info!(
                    "SIGHUP: the terminal hung up; SIGHUP was ignored at start (nohup): \
                     serving on"
                ),
                Sighup::Request => reload_alone(),
            },
            (signal @ (SIGUSR1 | SIGUSR2), _) => no_use_for(signal),
            (signal, _) => break nodus::signal::name(signal),
        }
    };
    crate::stop_began(stop_bound(&options));
    site.ready.set(false);
    tell_manager("STOPPING=1\nSTATUS=draining");
    tracing::info!(
        "{why}: readyz now answers 503; draining in {} ms, then up to {} ms for in-flight \
         requests (a second signal stops at once)",
        options.shutdown_delay.as_millis(),
        options.drain_timeout.as_millis()
    );
    let stop = async {
        if !options.shutdown_delay.is_zero() {
            nodus::sleep(options.shutdown_delay).await;
        }
        running.drain(options.drain_timeout).await
    };
    let second = async {
        loop {
            match signals.recv().await {
                SIGHUP => tracing::info!("SIGHUP during the drain: ignored, nothing to reload"),
                signal @ (SIGUSR1 | SIGUSR2) => no_use_for(signal),
                signal => return signal,
            }
        }
    };
    match futures_util::future::select(std::pin::pin!(stop), std::pin::pin!(second)).await {
        futures_util::future::Either::Left((cut, _)) => drained_exit_code(cut),
        futures_util::future::Either::Right((signal, _)) => {
            tracing::warn!(
                "second {} during the drain: exiting now, open connections are reset",
                nodus::signal::name(signal)
            );
            128 + signal
        }
    }
}

/// systemd's watchdog (`WatchdogSec=`, which sets `WATCHDOG_USEC`, for this process): the single
/// process sends `WATCHDOG=1` every half period from its loop, so a loop that stalls stops the
/// pings and systemd acts (as a cluster primary does for its workers' loops), until it exits.
fn start_watchdog() {
    let Some(period) = nodus::notify::watchdog_period() else {
        return;
    };
    nodus::spawn_named("serve:watchdog", async move {
        loop {
            nodus::sleep(period / 2).await;
            tell_manager("WATCHDOG=1");
        }
    })
    .detach();
}

/// SIGHUP to the single process: a rolling reload replaces workers, and there are none. Says so,
/// and tells a service manager waiting for the reload (`Type=notify-reload`) that it began and
/// ended; serving goes on untouched.
fn reload_alone() {
    tracing::info!(
        "SIGHUP: nothing reloaded, still serving (a rolling reload needs --workers 2 or more; \
         with --workers 1 a new binary takes a restart)"
    );
    tell_manager(&format!(
        "RELOADING=1\nMONOTONIC_USEC={}\nSTATUS=nothing to reload with --workers 1",
        nodus::clock::now_ns() / 1000
    ));
    tell_manager("READY=1\nSTATUS=serving");
}

/// SIGUSR1 or SIGUSR2 to the single process or a worker: one line; serving (or the drain) goes
/// on. Their default action would end the process undrained (`pkill -USR1 nodus`, a logrotate
/// `postrotate`), and nodus serve has no use for either.
fn no_use_for(signal: i32) {
    tracing::warn!(
        "{} (pid {}): ignored, nodus serve has no use for it and serves on",
        nodus::signal::name(signal),
        std::process::id()
    );
}

/// 0 after a drain that answered every request, [`FORCED_STOP_EXIT_CODE`] when its deadline cut
/// `cut` requests.
fn drained_exit_code(cut: usize) -> i32 {
    if cut == 0 {
        tracing::info!("drained; exiting");
        0
    } else {
        let plural = if cut == 1 { "" } else { "s" };
        tracing::warn!("the drain deadline cut {cut} request{plural} in flight; exiting");
        FORCED_STOP_EXIT_CODE
    }
}

/// A worker of `nodus serve --workers N`: the public listener comes from the primary (which
/// also serves `--admin`); the primary's `disconnect` (reload, shutdown) drains it.
async fn serve_worker(options: ServeOptions, root: PathBuf, worker: nodus::cluster::Worker) -> i32 {
    let addr = std::env::var("NODUS_LISTEN")
        .ok()
        .and_then(|a| a.parse().ok())
        .unwrap_or(options.listen);
    // Fed by the primary (rr, least), it also holds what was handed over and not yet accepted:
    // at most three windows, set before the listen that tells the primary.
    let handoffs = matches!(
        options.policy,
        nodus::cluster::Policy::RoundRobin | nodus::cluster::Policy::Least
    );
    let window = handoffs.then(fd_budget::window_now);
    if let Some(window) = window {
        worker.set_handoff_window(window as usize);
    }
    let public = match worker.listen(addr).await {
        Ok(l) => l,
        Err(e) => return fail(format!("worker {}: {e}", worker.id())),
    };
    let mut signals = match Signals::new(&[SIGTERM, SIGINT, SIGUSR1, SIGUSR2]) {
        Ok(s) => s,
        Err(e) => return fail(format!("cannot catch SIGTERM/SIGINT/SIGUSR1/SIGUSR2: {e}")),
    };
    worker.set_snapshot(nodus_http::snapshot);
    let admin_elsewhere = options.admin.is_some() || std::env::var_os("NODUS_ADMIN").is_some();
    let site = new_site(
        &options,
        root,
        admin_on_public(&options, admin_elsewhere),
        admin::Source::Worker(worker.clone()),
    );
    let budget = fd_budget::measure(window, options.max_connections);
    budget.say(true, false);
    let running = if options.policy == nodus::cluster::Policy::ReusePort {
        start_servers(&options, &site, OwnSocket(public), None, budget)
    } else {
        start_servers(&options, &site, public, None, budget)
    };
    worker.ready();
    let drain = std::pin::pin!(worker.drain_requested());
    let signal = std::pin::pin!(async {
        loop {
            match signals.recv().await {
                signal @ (SIGUSR1 | SIGUSR2) => no_use_for(signal),
                signal => return signal,
            }
        }
    });
    let deadline = match futures_util::future::select(drain, signal).await {
        futures_util::future::Either::Left((deadline, _)) => deadline,
        futures_util::future::Either::Right((_, _)) => {
            // Stopped directly rather than by the primary: leave the cluster first, so the
            // primary does not count the exit as a crash. Leaving closes the public listener's
            // key while the channel is open: connections handed over and not yet accepted go
            // back to the primary (the drain below could no longer give them back).
            worker.disconnect().await;
            options.drain_timeout
        }
    };
    site.ready.set(false);
    let cut = running.drain(deadline).await;
    // Connections the drain gave back to the primary may still be queued on the channel.
    worker.flush(Duration::from_secs(1)).await;
    drained_exit_code(cut)
}

/// Whether the public listener answers `/_nodus/*`: as `--admin-on-public` says, else only when
/// there is no admin listener (`admin_listener`: `--admin`, a socket named admin, or, for a
/// worker, its primary's).
pub(super) fn admin_on_public(options: &ServeOptions, admin_listener: bool) -> bool {
    options.admin_on_public.unwrap_or(!admin_listener)
}

/// Where the admin endpoints answer, for a start line: on the admin listener at `admin`, on the
/// public one (`on_public`; with the loopback rule's limit said), both, or nowhere.
pub(super) fn admin_note(admin: Option<SocketAddr>, on_public: bool) -> String {
    const PUBLIC: &str = "at /_nodus/ for loopback clients; through a proxy on this host that \
                          adds no X-Forwarded-For, every client is one";
    match (admin, on_public) {
        (Some(a), false) => format!("admin endpoints on http://{a}/_nodus/"),
        (Some(a), true) => {
            format!("admin endpoints on http://{a}/_nodus/ and {PUBLIC}: --admin-on-public off")
        }
        (None, true) => format!("admin endpoints {PUBLIC}: give --admin or --admin-on-public off"),
        (None, false) => "no admin endpoints: --admin-on-public off and no --admin".to_owned(),
    }
}

fn new_site(
    options: &ServeOptions,
    root: PathBuf,
    admin_on_public: bool,
    source: admin::Source,
) -> Rc<Site> {
    Rc::new(Site {
        root,
        static_options: StaticOptions {
            dotfiles: options.dotfiles,
            gzip: options.gzip,
            admin_dir_hidden: admin_on_public,
            no_listings: !options.listings,
        },
        listings: Listings::new(),
        admin_on_public,
        ready: Cell::new(true),
        source,
        failures: LogLimit::new(log_limit::WINDOW, |n, last| {
            tracing::warn!(
                target: "nodus::serve",
                "{n} more static requests answered 503 or 500 in the last {:?} for a file system \
                 call that failed (the last: {last})",
                log_limit::WINDOW
            );
        }),
    })
}

/// The public server and, when there is an admin listener, the admin server.
struct Running {
    public: nodus_http::Server,
    admin: Option<nodus_http::Server>,
}

impl Running {
    /// Drains both servers; returns the requests their deadline cut.
    async fn drain(&self, timeout: Duration) -> usize {
        let admin_drain = async {
            match &self.admin {
                Some(server) => server.drain(timeout).await,
                None => 0,
            }
        };
        let (public, admin) =
            futures_util::future::join(self.public.drain(timeout), admin_drain).await;
        public + admin
    }
}

fn start_servers<L: nodus_http::server::Accept>(
    options: &ServeOptions,
    site: &Rc<Site>,
    public: L,
    admin_listener: Option<TcpListener>,
    budget: fd_budget::Budget,
) -> Running {
    let public_addr = public.local_addr().unwrap_or(options.listen);
    let s = site.clone();
    let public = serve(
        public,
        Config {
            name: "http:static",
            on_refused: options
                .access_log
                .then_some(log_refused as fn(&Refused<'_>)),
            on_response: options
                .access_log
                .then_some(log_answered as fn(&Answered<'_>)),
            max_connections: usize::try_from(budget.max).unwrap_or(usize::MAX),
            ..Config::default()
        },
        move |req| handle_public(req, s.clone()),
    );
    let admin_addr = admin_listener.as_ref().and_then(|l| l.local_addr().ok());
    let admin_max = usize::try_from(budget.admin_max).unwrap_or(usize::MAX);
    let admin = admin_listener.map(|l| serve_admin(l, site.clone(), admin_max));
    if matches!(site.source, admin::Source::Worker(_)) {
        tracing::debug!(
            "worker serving {} on http://{public_addr}/",
            quote(&site.root)
        );
    } else {
        tracing::info!(
            "serving {} on http://{public_addr}/ ({})",
            quote(&site.root),
            admin_note(admin_addr, site.admin_on_public)
        );
    }
    Running { public, admin }
}

/// The admin endpoints on a listener of their own.
fn serve_admin(listener: TcpListener, site: Rc<Site>, max: usize) -> nodus_http::Server {
    serve(
        listener,
        Config {
            name: "http:admin",
            max_connections: max,
            ..Config::default()
        },
        move |req| {
            let s = site.clone();
            async move {
                let accept = admin::accept(req.headers());
                admin::respond(
                    req.method(),
                    req.uri().path(),
                    accept,
                    || s.readiness(),
                    &s.source,
                )
                .await
            }
        },
    )
}

async fn handle_public(req: Request<RequestBody>, site: Rc<Site>) -> Response<Body> {
    let peer = req.extensions().get::<ConnInfo>().and_then(|c| c.peer);
    let (method, path) = (req.method().clone(), req.uri().path().to_owned());
    let admin_path = site
        .admin_on_public
        .then(|| admin::admin_path(&path))
        .flatten();
    if let Some(admin_path) = admin_path {
        if admin::allowed(peer, req.headers()) {
            let accept = admin::accept(req.headers());
            admin::respond(
                &method,
                &admin_path,
                accept,
                || site.readiness(),
                &site.source,
            )
            .await
        } else {
            text(
                StatusCode::FORBIDDEN,
                "admin endpoints answer loopback clients only\n",
            )
        }
    } else {
        // The query goes along: a directory's redirect to its slash form keeps it. The path is
        // `Uri::path`'s, `/` for an absolute-form target without one (`http://h?q`, RFC 9112
        // section 3.2.2), where the raw path-and-query would be `?q`.
        let target = match req.uri().query() {
            Some(query) => format!("{path}?{query}"),
            None => path.clone(),
        };
        serve_static(&site, method, target, req.headers().clone()).await
    }
}

/// Plans the request and opens the file on the I/O pool, then streams it; a listing comes from
/// the process's `Listings`.
async fn serve_static(
    site: &Site,
    method: Method,
    path: String,
    headers: HeaderMap,
) -> Response<Body> {
    let root = site.root.clone();
    let options = site.static_options.clone();
    let head = method == Method::HEAD;
    // The plan holds the file open (HEAD's too, closed unread): a file this process cannot open
    // gets the same 403 (or 404) whatever the method and the conditional headers.
    let pool = match nodus::pool::try_io() {
        Ok(pool) => pool,
        Err(error) => {
            // The pool cannot start its threads (a full `pids.max`, say): 503, as out of fds.
            let failure = static_files::Failure {
                op: "start the I/O pool",
                error,
            };
            say_failure(site, &method, &path, &failure);
            return respond(static_files::failed(failure), head);
        }
    };
    let planned = pool
        .offload(move || {
            let planned = static_files::plan_deferred(&root, &method, &path, &headers, &options);
            (planned, method, path)
        })
        .await;
    let plan = match planned {
        Ok((planned, method, path)) => {
            let plan = match planned {
                Planned::Done(p) => p,
                Planned::List(job) => match site.listings.page(*job).await {
                    // HEAD's body is dropped by the server, as for every inline body.
                    Ok(page) => {
                        let mut response = Response::new(full(page.body));
                        *response.status_mut() = page.status;
                        *response.headers_mut() = page.headers;
                        return response;
                    }
                    Err(failure) => static_files::failed(failure),
                },
            };
            if let Plan::Failed { failure, .. } = &plan {
                say_failure(site, &method, &path, failure);
            }
            plan
        }
        Err(e) => return internal_error(e),
    };
    respond(plan, head)
}

/// The response for `plan`: its status and headers, and its file's body or its inline one.
fn respond(plan: Plan, head: bool) -> Response<Body> {
    let (status, headers) = (plan.status(), plan.headers().clone());
    let body = match plan {
        Plan::File { .. } if head => nodus_http::empty(),
        Plan::File {
            file, range, gzip, ..
        } => {
            let body = nodus_http::boxed(FileBody::new(file, range));
            if !gzip {
                body
            } else {
                match gzip::gzip_body(body) {
                    Ok(gzipped) => gzipped,
                    Err(e) => {
                        tracing::error!(target: "nodus::serve", "cannot start gzip: {e}");
                        return text(StatusCode::INTERNAL_SERVER_ERROR, "internal error\n");
                    }
                }
            }
        }
        other => other.inline_body().map_or_else(nodus_http::empty, full),
    };
    let mut response = Response::new(body);
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
}

/// A static request answered 503 or 500 for a file system call that failed: one WARN line per
/// burst, then a count per [`log_limit::WINDOW`] (`Site::failures`).
fn say_failure(site: &Site, method: &Method, path: &str, failure: &static_files::Failure) {
    let status = failure.status().as_u16();
    let line = || format!("{method} {path:?}: {failure}: answered {status}");
    if site.failures.first(line) {
        tracing::warn!(
            target: "nodus::serve",
            "{} (further failures are counted: one line per {:?})",
            line(),
            log_limit::WINDOW
        );
    }
}

fn internal_error(e: impl std::fmt::Display) -> Response<Body> {
    tracing::error!(target: "nodus::serve", "static file work failed: {e}");
    text(StatusCode::INTERNAL_SERVER_ERROR, "internal error\n")
}

/// Tells a service manager (systemd `Type=notify`) the state, if there is one.
pub(super) fn tell_manager(state: &str) {
    if let Err(e) = nodus::notify::notify(state) {
        tracing::warn!("cannot notify the service manager ({state:?}): {e}");
    }
}
