//! How `nodus run --node` workers leave: a rolling reload under busy keep-alive clients loses no
//! request and the old workers exit on their own (well before the kill timeout) when the app
//! closes each connection once its server no longer listens (the README's one line); a worker
//! that leaves on its own (`cluster.worker.disconnect()` under rr, `server.close()` under shared)
//! is replaced at once, while it still drains, not once it has exited, and is stopped as a stop
//! escalates (the kill signal past its drain deadline, so its SIGTERM handler runs, before the
//! SIGKILL at the kill timeout); one that closes one of its two listeners is not replaced.
//!
//! Node is needed: under `CI` a missing one fails the tests, elsewhere they are skipped. Every
//! primary is started in its own process group, and the whole group is killed by PID when the
//! test ends. The clients are threads of the test, on 127.0.0.1.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::cluster::{assert_exit, count, events, node_app, run_node_app, wait_events};
use common::have;
use nodus_testkit::proc::Proc;
use rustix::process::Signal;

/// A stock Node app with the README's line: once the server no longer listens (the primary's
/// `disconnect` closed it), each response closes its connection. Each response's first part goes
/// out at once and the rest 50 ms later, so a worker killed while it serves cuts a response
/// (not only a request no byte of which was answered).
const APP_CLOSING_WHEN_CLOSED: &str = r#"
const http = require('http');
const server = http.createServer((req, res) => {
  if (!server.listening) res.setHeader('Connection', 'close');
  res.write('ok,');
  setTimeout(() => res.end(` ${process.pid}\n`), 50);
});
server.listen(+process.env.PORT, '127.0.0.1');
"#;

/// What one keep-alive client saw.
#[derive(Debug, Default)]
struct Seen {
    /// Responses read whole.
    done: u64,
    /// Of those, ones that said `Connection: close`.
    closing: u64,
    /// Requests sent on a kept-alive connection that closed before a byte of the response came,
    /// sent again on a new one (as HTTP clients retry an idempotent request: RFC 9110 9.2.2). A
    /// request written as the worker's `server.close()` closes the connections idle then.
    resent: u64,
    /// What failed: a connection refused, a response cut, a request on a new connection
    /// unanswered.
    failed: Vec<String>,
}

/// One client: a keep-alive connection busy with one `GET /` after another until `stop`, a new
/// connection whenever the server closes one (after a `Connection: close` response, or before a
/// byte of a response: then the request is sent again, once).
fn busy_client(addr: SocketAddr, stop: &AtomicBool) -> Seen {
    let mut seen = Seen::default();
    let mut conn: Option<(TcpStream, bool)> = None; // (the connection, kept alive from before)
    let mut resend = false;
    while !stop.load(Ordering::Relaxed) || resend {
        let (stream, reused) = match conn.take() {
            Some(c) => c,
            None => match TcpStream::connect(addr) {
                Ok(s) => {
                    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                    (s, false)
                }
                Err(e) => {
                    seen.failed.push(format!("connect: {e}"));
                    resend = false;
                    continue;
                }
            },
        };
        let mut stream = stream;
        let mut read = Vec::new();
        let outcome = stream
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .and_then(|()| {
                let mut buf = [0u8; 1024];
                while !read.ends_with(b"0\r\n\r\n") {
                    let n = stream.read(&mut buf)?;
                    if n == 0 {
                        return Err(std::io::ErrorKind::UnexpectedEof.into());
                    }
                    read.extend_from_slice(&buf[..n]);
                }
                Ok(())
            });
        match outcome {
            Ok(()) => {
                resend = false;
                seen.done += 1;
                let text = String::from_utf8_lossy(&read).to_ascii_lowercase();
                if text.contains("\r\nconnection: close\r\n") {
                    seen.closing += 1;
                } else {
                    conn = Some((stream, true));
                }
            }
            Err(_) if read.is_empty() && reused && !resend => {
                seen.resent += 1;
                resend = true;
            }
            Err(e) => {
                resend = false;
                seen.failed.push(format!(
                    "{e} (reused {reused}) after {:?}",
                    String::from_utf8_lossy(&read)
                ));
            }
        }
    }
    seen
}

/// A rolling reload of Node workers serving 8 busy keep-alive clients, the app closing each
/// connection once its server no longer listens: no request fails, and every old worker exits
/// on its own once its connections have closed, before its drain deadline (9 s at the default
/// kill timeout; without the line Node keeps answering `Connection: keep-alive` on a busy
/// connection after `server.close()`, and the old worker is SIGTERMed there, cutting what it
/// serves). A primary-initiated stop is no "going down": no `going_down` event.
#[test]
fn a_reload_under_busy_keep_alive_clients_loses_nothing_when_the_app_closes_them() {
    if !have("node") {
        return;
    }
    let events_dir = nodus_testkit::tmp::TempDir::new("node-ka-reload-events");
    let log = events_dir.path().join("events.jsonl");
    let (_dir, addr, mut primary) = run_node_app(
        "node-ka-reload",
        APP_CLOSING_WHEN_CLOSED,
        2,
        &["--events", log.to_str().unwrap()],
    );
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..8)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || busy_client(addr, &stop))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    primary.signal(Signal::HUP);
    primary.wait_line("reload to generation 1: the old workers have exited");
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let seen: Vec<Seen> = clients.into_iter().map(|c| c.join().unwrap()).collect();
    primary.signal(Signal::TERM);
    assert_exit(&mut primary, Duration::from_secs(30), 0);
    let lines = primary.output().to_vec();
    assert!(
        seen.iter().all(|s| s.failed.is_empty() && s.done > 0),
        "{seen:#?}\n{lines:#?}"
    );
    // The old workers' busy connections were closed by their own `Connection: close`.
    assert!(seen.iter().any(|s| s.closing > 0), "{seen:#?}");
    assert!(
        !lines
            .iter()
            .any(|l| l.contains("past its deadline") || l.ends_with(": SIGKILL")),
        "an old worker had to be stopped: {lines:#?}"
    );
    let evs = events(&log);
    assert_eq!(count(&evs, "going_down"), 0, "{evs:#?}");
    assert_eq!(count(&evs, "fork"), 4, "{evs:#?}");
}

/// A Node app on `PORT` whose `/long` is answered 8 s later, `/leave` makes the worker leave on
/// its own (`LEAVE=disconnect`: `cluster.worker.disconnect()`; `LEAVE=close`: `server.close()`, and
/// an exit once it has closed: the channel would keep the worker alive),
/// and anything else at once with the worker's pid. With `PORT2`, a second server there, which
/// `/close2` closes.
const APP_LEAVING: &str = r#"
const cluster = require('cluster');
const http = require('http');
let second;
const server = http.createServer((q, r) => {
  if (q.url === '/long') { console.log('long request in'); setTimeout(() => r.end('long done\n'), 8000); return; }
  if (q.url === '/leave') {
    r.setHeader('Connection', 'close');
    r.end('leaving\n');
    if (process.env.LEAVE === 'close') server.close(() => process.exit(0)); else cluster.worker.disconnect();
    return;
  }
  if (q.url === '/close2') { second.close(() => console.log('second closed')); r.setHeader('Connection', 'close'); return r.end('closing\n'); }
  r.end(`ok ${process.pid}\n`);
});
server.listen(+process.env.PORT, '127.0.0.1');
if (process.env.PORT2) {
  second = http.createServer((q, r) => r.end('second\n'));
  second.listen(+process.env.PORT2, '127.0.0.1');
}
"#;

/// The pid in an `ok PID` answer from `addr`.
fn pid_serving(addr: SocketAddr) -> u32 {
    let reply = common::http::get(addr, "/");
    let body = String::from_utf8_lossy(&reply.body).into_owned();
    body.trim()
        .strip_prefix("ok ")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("{body:?}"))
}

/// `nodus run --node -w 1` of `app` in `dir` under `policy`, with `LEAVE=leave` (how `/leave`
/// makes the worker leave), a kill timeout of `kill_timeout` seconds, a min uptime of 0.2 s and
/// its events in `log`, once its worker is ready: the address, the primary, the worker's pid.
fn start_leaving(
    dir: &Path,
    app: &str,
    policy: &str,
    leave: &str,
    kill_timeout: &str,
    log: &Path,
) -> (SocketAddr, Proc, u32) {
    let log = log.to_str().unwrap();
    let timing = ["--kill-timeout", kill_timeout, "--min-uptime", "0.2"];
    let options = [
        &["-w", "1", "--policy", policy, "--events", log][..],
        &timing,
    ]
    .concat();
    let (addr, mut cmd) = node_app(dir, app, &options);
    let mut primary = common::cluster::spawn(cmd.env("LEAVE", leave));
    primary.wait_line("1 worker ready");
    let pid = pid_serving(addr);
    (addr, primary, pid)
}

/// Sends `GET path`, a request the app of `primary` holds (saying `held` once it has it), on a
/// new connection, and once it is held and the worker is up its min uptime (no longer a start
/// that probes a port), makes the worker leave with `/leave`: the held connection.
fn hold_then_leave(primary: &mut Proc, addr: SocketAddr, path: &str, held: &str) -> TcpStream {
    let mut conn = TcpStream::connect(addr).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    write!(
        conn,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    primary.wait_line(held);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(common::http::get(addr, "/leave").body, b"leaving\n");
    conn
}

/// A Node worker that leaves on its own while a long request keeps it draining (`-w 1`) is
/// replaced at once: a new connection is served by the replacement within 5 s (not once the old
/// worker has finished its 8 s request and exited), and the old one finishes its request. Under
/// rr its `cluster.worker.disconnect()`, under shared a `server.close()`.
#[test]
fn a_node_worker_that_leaves_on_its_own_is_replaced_at_once() {
    if !have("node") {
        return;
    }
    for (policy, leave) in [("rr", "disconnect"), ("shared", "close")] {
        let events_dir = nodus_testkit::tmp::TempDir::new("node-leave-events");
        let log = events_dir.path().join("events.jsonl");
        let dir = nodus_testkit::tmp::TempDir::new("node-leave");
        let (addr, mut primary, old) =
            start_leaving(dir.path(), APP_LEAVING, policy, leave, "30", &log);
        let mut long = hold_then_leave(&mut primary, addr, "/long", "long request in");
        let left = Instant::now();
        let new = pid_serving(addr);
        let took = left.elapsed();
        assert_ne!(new, old, "{policy}");
        assert!(
            took < Duration::from_secs(5),
            "{policy}: the replacement served after {took:?}: {:#?}",
            primary.output()
        );
        let line = primary.wait_line("closed its last listener");
        assert!(line.contains(&format!("(pid {old})")), "{line}");
        // The old worker still finishes its request, then exits.
        let mut reply = Vec::new();
        let _ = long.read_to_end(&mut reply);
        assert!(
            String::from_utf8_lossy(&reply).contains("long done\n"),
            "{policy}: {}",
            String::from_utf8_lossy(&reply)
        );
        let evs = wait_events(&log, |e| {
            e.iter()
                .any(|e| e["event"] == "exit" && e["pid"] == u64::from(old))
        });
        assert_eq!(count(&evs, "going_down"), 1, "{policy}: {evs:#?}");
        assert_eq!(count(&evs, "fork"), 2, "{policy}: {evs:#?}");
        primary.signal(Signal::TERM);
        assert_exit(&mut primary, Duration::from_secs(30), 0);
    }
}

/// A Node app on `PORT` whose `/hold` is never answered until the worker's SIGTERM handler
/// answers it (`going away`) and exits 0, and whose `/leave` makes the worker leave on its own
/// (`LEAVE=disconnect`: `cluster.worker.disconnect()`; `LEAVE=close`: `server.close()`).
const APP_LEAVING_HANDLING_SIGTERM: &str = r#"
const cluster = require('cluster');
const http = require('http');
const held = [];
const server = http.createServer((q, r) => {
  if (q.url === '/hold') { console.log('held request in'); held.push(r); return; }
  if (q.url === '/leave') {
    r.setHeader('Connection', 'close');
    r.end('leaving\n');
    if (process.env.LEAVE === 'close') server.close(); else cluster.worker.disconnect();
    return;
  }
  r.end(`ok ${process.pid}\n`);
});
server.listen(+process.env.PORT, '127.0.0.1');
process.on('SIGTERM', () => {
  console.log('SIGTERM handler ran');
  for (const r of held) r.end('going away\n');
  setTimeout(() => process.exit(0), 50);
});
"#;

/// A Node worker that leaves on its own while a connection keeps it draining is stopped as a
/// stop escalates: the kill signal (SIGTERM) past its drain deadline, which its handler answers
/// (the held request gets its answer, and the worker exits 0), not a bare SIGKILL at the kill
/// timeout. Under rr by `cluster.worker.disconnect()`, under shared by `server.close()`.
#[test]
fn a_node_worker_that_leaves_on_its_own_gets_the_kill_signal_before_the_sigkill() {
    if !have("node") {
        return;
    }
    for (policy, leave) in [("rr", "disconnect"), ("shared", "close")] {
        let dir = nodus_testkit::tmp::TempDir::new("node-leave-term");
        let log = dir.path().join("events.jsonl");
        let (addr, mut primary, old) = start_leaving(
            dir.path(),
            APP_LEAVING_HANDLING_SIGTERM,
            policy,
            leave,
            "3",
            &log,
        );
        let mut held = hold_then_leave(&mut primary, addr, "/hold", "held request in");
        let mut reply = Vec::new();
        let _ = held.read_to_end(&mut reply);
        assert!(
            String::from_utf8_lossy(&reply).contains("going away\n"),
            "{policy}: {}\n{:#?}",
            String::from_utf8_lossy(&reply),
            primary.output()
        );
        let evs = wait_events(&log, |e| {
            e.iter()
                .any(|e| e["event"] == "exit" && e["pid"] == u64::from(old))
        });
        let exit = evs
            .iter()
            .find(|e| e["event"] == "exit" && e["pid"] == u64::from(old))
            .unwrap();
        assert_eq!(exit["code"], 0, "{policy}: {exit}");
        let line = primary.wait_line("after closing its last listener (past its deadline)");
        assert!(line.ends_with(": SIGTERM"), "{line}");
        primary.wait_line("SIGTERM handler ran");
        primary.signal(Signal::TERM);
        assert_exit(&mut primary, Duration::from_secs(30), 0);
        assert!(
            !primary.output().iter().any(|l| l.ends_with(": SIGKILL")),
            "{policy}: {:#?}",
            primary.output()
        );
    }
}

/// A Node worker that closes one of its two servers still has a listener: it is not going down,
/// nor replaced, and serves on.
#[test]
fn a_node_worker_closing_one_of_two_listeners_is_not_replaced() {
    if !have("node") {
        return;
    }
    let [addr, second] = nodus_testkit::net::free_addrs::<2>();
    let events_dir = nodus_testkit::tmp::TempDir::new("node-close-one-events");
    let log = events_dir.path().join("events.jsonl");
    let dir = nodus_testkit::tmp::TempDir::new("node-close-one");
    std::fs::write(dir.path().join("app.js"), APP_LEAVING).unwrap();
    let mut primary = common::cluster::spawn(
        std::process::Command::new(common::NODUS)
            .args(["run", "--node", "-w", "1"])
            .args(["--events", log.to_str().unwrap()])
            .args(["--", "node"])
            .arg(dir.path().join("app.js"))
            .env("PORT", addr.port().to_string())
            .env("PORT2", second.port().to_string())
            .env("RUST_LOG", "info"),
    );
    wait_events(&log, |e| count(e, "listening") == 2);
    assert_eq!(common::http::get(second, "/").body, b"second\n");
    let pid = pid_serving(addr);
    assert_eq!(common::http::get(addr, "/close2").body, b"closing\n");
    primary.wait_line("second closed");
    // Time for a going-down to be handled, had it been taken as one.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(pid_serving(addr), pid);
    primary.signal(Signal::TERM);
    assert_exit(&mut primary, Duration::from_secs(30), 0);
    let evs = events(&log);
    assert_eq!(count(&evs, "going_down"), 0, "{evs:#?}");
    assert_eq!(count(&evs, "fork"), 1, "{evs:#?}");
    assert!(
        !primary
            .output()
            .iter()
            .any(|l| l.contains("closed its last listener")),
        "{:#?}",
        primary.output()
    );
}

/// A Node program that probes a port at its start (listens, closes, then makes its real `listen`,
/// as `get-port` does) is starting, not leaving: under rr and shared it is not taken as going
/// down, so it is not replaced (each replacement would probe again, until the budget ran out).
#[test]
fn a_node_worker_probing_a_port_at_its_start_is_not_taken_as_leaving() {
    if !have("node") {
        return;
    }
    const APP_PROBING: &str = r#"
const http = require('http');
const net = require('net');
const probe = net.createServer();
probe.listen(0, '127.0.0.1', () => probe.close(() => {
  http.createServer((q, r) => r.end(`ok ${process.pid}\n`))
    .listen(+process.env.PORT, '127.0.0.1', () => console.log('real server listening'));
}));
"#;
    for policy in ["rr", "shared"] {
        let events_dir = nodus_testkit::tmp::TempDir::new("node-probe-events");
        let log = events_dir.path().join("events.jsonl");
        let dir = nodus_testkit::tmp::TempDir::new("node-probe");
        let (addr, mut cmd) = node_app(
            dir.path(),
            APP_PROBING,
            &[
                "-w",
                "1",
                "--policy",
                policy,
                "--events",
                log.to_str().unwrap(),
            ],
        );
        let mut primary = common::cluster::spawn(&mut cmd);
        primary.wait_line("real server listening");
        let pid = pid_serving(addr);
        // Time for a going-down to be handled, had the probe's close been taken as one.
        std::thread::sleep(Duration::from_millis(500));
        assert_eq!(pid_serving(addr), pid, "{policy}");
        primary.signal(Signal::TERM);
        assert_exit(&mut primary, Duration::from_secs(30), 0);
        let evs = events(&log);
        assert_eq!(count(&evs, "going_down"), 0, "{policy}: {evs:#?}");
        assert_eq!(count(&evs, "fork"), 1, "{policy}: {evs:#?}");
    }
}
