//! `nodus serve --workers N`: this process is the cluster primary. It binds (or inherits) the
//! public listener, re-executes its own command line as N workers (each generation's from the
//! binary as it was when the generation began: `Config::pin_program`, through `/proc/self/fd/FD`,
//! so each worker names itself after the binary at its start: `main`), serves `--admin` itself with
//! the whole cluster's stats, and supervises (restart budget, SIGHUP rolling reload,
//! SIGTERM/SIGINT drain).
//!
//! Workers find the public address in `NODUS_LISTEN` (the inherited or bound socket's address),
//! so their `queryServer` names the socket the primary holds; `NODUS_ADMIN`, when the primary
//! has an admin listener, tells them not to answer `/_nodus/` on the public one (unless
//! `--admin-on-public on`, which they read from the same command line). Under `--policy
//! reuseport` the primary binds the public address up front too (with `SO_REUSEPORT`: a busy
//! address fails here, before any worker starts, and port 0 becomes the one port all workers
//! share); the cluster then holds that port without listening, and each worker gets a socket of
//! its own.

use std::time::Duration;

use nodus::cluster::{Config, EventKind, Policy, Primary, Readiness, WorkerCommand};

use super::admin;
use super::app::{
    KILL_MARGIN, ServeOptions, admin_note, admin_on_public, fail, listeners, stop_bound,
};

/// Runs the primary until shutdown; returns the exit code.
pub async fn run(options: ServeOptions) -> i32 {
    let (public, admin_listener) = match listeners(&options, options.policy == Policy::ReusePort) {
        Ok(l) => l,
        Err(e) => return fail(e),
    };
    let public_addr = public.local_addr().unwrap_or(options.listen);
    let program = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            return fail(format!(
                "cannot find the nodus executable to start workers: {e}"
            ));
        }
    };
    let admin_addr = admin_listener.as_ref().and_then(|l| l.local_addr().ok());
    let mut config = Config::new(
        options.workers,
        WorkerCommand {
            program,
            args: std::env::args_os().skip(1).collect(),
            env: vec![("NODUS_LISTEN".into(), public_addr.to_string().into())],
            ipc: true,
        },
    );
    if let Some(a) = admin_addr {
        // The primary serves the admin endpoints: the workers' public listeners do not.
        config
            .command
            .env
            .push(("NODUS_ADMIN".into(), a.to_string().into()));
    }
    config.policy = options.policy;
    config.readiness = Readiness::Message;
    config.drain_timeout = options.drain_timeout;
    config.shutdown_delay = options.shutdown_delay;
    config.kill_timeout = options.drain_timeout + KILL_MARGIN;
    config.event_log = options.events.clone();
    config.raw_output = options.raw_output;
    // The primary is the init of what its workers leave behind (every child of this process is
    // a nodus::process one): adopted orphans are reaped, and stopped with the cluster.
    config.subreaper = true;
    // A crash restart runs its generation's own binary: after a failed reload (a broken build
    // deployed in place), not the broken one.
    config.pin_program = true;
    config.listeners.push(("http".to_owned(), public));
    config.defer_accept = options.defer_accept;
    // Config::new's restart budget: 5, or twice the workers when that is more.
    let budget = format!(
        "at most {} restarts within {:?}",
        config.max_restarts, config.restart_window
    );
    let primary = match Primary::start(config) {
        Ok(p) => p,
        Err(e) => return fail(e.to_string()),
    };
    // Its exit's flush of queued output takes what is left of the stop's bound.
    let bound = stop_bound(&options);
    primary.on_event(move |e| {
        if let EventKind::Shutdown { .. } = e.kind {
            crate::stop_began(bound);
        }
    });
    let admin_server = admin_listener.map(|l| admin::serve_primary(l, primary.clone()));
    // The workers decide the same way (`NODUS_ADMIN`, the same `--admin-on-public`).
    let on_public = admin_on_public(&options, admin_addr.is_some());
    tracing::info!(
        "cluster of {} workers (policy {}; {budget}) serving on http://{public_addr}/ ({})",
        options.workers,
        options.policy.name(),
        admin_note(admin_addr, on_public)
    );
    let code = primary.run().await;
    if let Some(server) = admin_server {
        server.drain(Duration::from_secs(1)).await;
    }
    code
}
