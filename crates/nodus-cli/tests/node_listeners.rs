//! The listeners a `nodus run --node` primary binds for its workers are let go of as Node's own
//! primary lets go of them: one that every worker closed is closed at once (a port refused and
//! free for another process again, a UDP port free, a socket file removed), under every policy;
//! a program that listens on and closes one port after another (1100 of them) never runs the
//! primary out of keys or fds; one a worker left by its exit (a reload, a `kill -9`) stays open
//! for the replacement even when that is ready (its first `listening`, on a side port) before
//! it listens on it, so no connection is refused; a reload that moves the app to another port
//! leaves the old one open for the grace (the ready timeout), then refused; and a deploy that
//! moves the listener to another address of the same port binds once the old worker is gone
//! (the primary's own stale socket is closed, not in the way for good).
//!
//! Node is needed: under `CI` a missing one fails the tests, elsewhere they are skipped. Every
//! primary is started in its own process group, and the whole group is killed by PID when the
//! test ends. Everything listens on 127.0.0.1 (`::ffff:127.0.0.1`, its IPv4-mapped form, for the
//! deploy that changes the address).

mod common;

use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::cluster::{assert_exit, node_app, spawn};
use common::have;
use nodus_testkit::proc::Proc;
use nodus_testkit::tmp::TempDir;
use rustix::process::Signal;

/// Waits (10 s at most) until `free` says yes; false if it never does.
fn eventually(mut free: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if free() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// Whether the TCP port of `addr` is free: another process can bind it, and then (closed
/// again) a connection to it is refused.
fn tcp_free(addr: SocketAddr) -> bool {
    match TcpListener::bind(addr) {
        Ok(l) => drop(l),
        Err(_) => return false,
    }
    TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused)
}

/// Each worker serves `PORT` and, beside it, a TCP server on `PORT2`, a Unix socket on `SOCK`
/// and a UDP socket on `PORT3`, each closed half a second after it listens; then it says so.
const APP_TEMPORARY: &str = r#"
const http = require('http'), net = require('net'), dgram = require('dgram');
http.createServer((q, r) => r.end('main\n')).listen(+process.env.PORT, '127.0.0.1');
let closed = 0;
const done = () => { if (++closed === 3) console.log('temporary servers closed'); };
const tcp = net.createServer((c) => c.end('tmp\n'));
tcp.listen(+process.env.PORT2, '127.0.0.1', () => setTimeout(() => tcp.close(done), 500));
const unix = net.createServer((c) => c.end('tmp\n'));
unix.listen(process.env.SOCK, () => setTimeout(() => unix.close(done), 500));
const udp = dgram.createSocket('udp4');
udp.bind(+process.env.PORT3, '127.0.0.1', () => setTimeout(() => udp.close(done), 500));
"#;

/// A TCP server, a Unix socket and a UDP socket that both workers closed are released by the
/// primary under rr, shared and reuseport: the ports are free again (bindable, a connection
/// refused), the socket file is gone, and the main server still serves.
#[test]
fn a_listener_every_worker_closed_is_released() {
    if !have("node") {
        return;
    }
    for policy in ["rr", "shared", "reuseport"] {
        let dir = TempDir::new("node-release");
        std::fs::write(dir.path().join("app.js"), APP_TEMPORARY).unwrap();
        let [addr, tmp, udp] = nodus_testkit::net::free_addrs::<3>();
        let sock = dir.path().join("tmp.sock");
        let mut primary = spawn(
            Command::new(common::NODUS)
                .args(["run", "--node", "-w", "2", "--policy", policy])
                .args(["--", "node"])
                .arg(dir.path().join("app.js"))
                .env("PORT", addr.port().to_string())
                .env("PORT2", tmp.port().to_string())
                .env("PORT3", udp.port().to_string())
                .env("SOCK", &sock)
                .env("RUST_LOG", "info"),
        );
        primary.wait_line("2 workers ready");
        let closed = |p: &mut Proc| {
            p.output_so_far()
                .iter()
                .filter(|l| l.contains("temporary servers closed"))
                .count()
        };
        assert!(
            eventually(|| closed(&mut primary) == 2),
            "{policy}: {:#?}",
            primary.output_so_far()
        );
        assert!(
            eventually(|| tcp_free(tmp)),
            "{policy}: {tmp} is still taken: {:#?}",
            primary.output_so_far()
        );
        assert!(
            eventually(|| UdpSocket::bind(udp).is_ok()),
            "{policy}: udp {udp} is still taken: {:#?}",
            primary.output_so_far()
        );
        assert!(
            eventually(|| !sock.exists()),
            "{policy}: {} is still there: {:#?}",
            sock.display(),
            primary.output_so_far()
        );
        assert_eq!(common::http::get(addr, "/").body, b"main\n", "{policy}");
        if policy == "rr" {
            // The primary's own listener, one line when it goes.
            let line = format!("{tmp} released: worker ");
            assert!(
                primary.output_so_far().iter().any(|l| l.contains(&line)),
                "{line:?} in {:#?}",
                primary.output_so_far()
            );
        }
        primary.signal(Signal::TERM);
        assert_exit(&mut primary, Duration::from_secs(30), 0);
    }
}

/// Listens on and closes 1100 ports in turn, each found free by an `exclusive` server of its
/// own first (bound by the worker itself, not the primary); says how many it could listen on.
const APP_MANY_PORTS: &str = r#"
const http = require('http'), net = require('net');
http.createServer((q, r) => r.end('main\n')).listen(+process.env.PORT, '127.0.0.1');
let ok = 0;
function next() {
  if (ok === 1100) { console.log(`done ok=${ok}`); return; }
  const probe = net.createServer();
  probe.listen({ port: 0, host: '127.0.0.1', exclusive: true }, () => {
    const port = probe.address().port;
    probe.close(() => {
      const s = net.createServer();
      s.on('error', (e) => console.log(`done ok=${ok}: port ${port} ${e.code}`));
      s.listen(port, '127.0.0.1', () => { ok++; s.close(next); });
    });
  });
}
setTimeout(next, 200);
"#;

/// The fds `pid` has open.
fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// 1100 ports listened on and closed one after another (more than the 1024 keys the primary
/// keeps at most): every listen succeeds, and the primary holds no more fds at the end than at
/// the start, each listener closed when the worker closed it.
#[test]
fn listening_on_and_closing_1100_ports_in_turn_spends_nothing() {
    if !have("node") {
        return;
    }
    let (_dir, _addr, mut primary) =
        common::cluster::run_node_app("node-many-ports", APP_MANY_PORTS, 1, &[]);
    let before = open_fds(primary.id());
    let line = primary.wait_line("done ok=");
    assert!(
        line.ends_with("done ok=1100"),
        "{line}: {:#?}",
        primary.output_so_far()
    );
    // The last close may be handled just after the worker's line.
    assert!(
        eventually(|| open_fds(primary.id()) <= before),
        "the primary holds {} fds, {before} before",
        open_fds(primary.id())
    );
    primary.signal(Signal::TERM);
    assert_exit(&mut primary, Duration::from_secs(30), 0);
}

/// Listens on `PORT2` (a metrics port, say) at once and on `PORT` after 1.5 s of start-up (a
/// database connected, a cache warmed): ready at its first `listening`, the worker has not
/// asked for `PORT` yet. Each answer on `PORT` is `app PID`.
const APP_MAIN_PORT_LATE: &str = r#"
const http = require('http');
http.createServer((q, r) => r.end('side\n')).listen(+process.env.PORT2, '127.0.0.1');
setTimeout(() => {
  http.createServer((q, r) => {
    r.setHeader('Connection', 'close');
    r.end(`app ${process.pid}\n`);
  }).listen(+process.env.PORT, '127.0.0.1');
}, 1500);
"#;

/// `nodus run --node -w 1 --policy POLICY` of [`APP_MAIN_PORT_LATE`], once it serves on its main
/// port: the directory, the main port's address, the primary and the worker's pid.
fn run_main_port_late(policy: &str) -> (TempDir, SocketAddr, Proc, u32) {
    let dir = TempDir::new("node-late-port");
    let (addr, mut cmd) = node_app(
        dir.path(),
        APP_MAIN_PORT_LATE,
        &["-w", "1", "--policy", policy],
    );
    let side = std::iter::repeat_with(nodus_testkit::net::free_addr)
        .find(|&a| a != addr)
        .unwrap();
    let mut primary = spawn(cmd.env("PORT2", side.port().to_string()));
    primary.wait_line("1 worker ready");
    let mut pid = None;
    assert!(
        eventually(|| {
            pid = served_by(addr).ok();
            pid.is_some()
        }),
        "{policy}: never served on {addr}: {:#?}",
        primary.output_so_far()
    );
    (dir, addr, primary, pid.unwrap())
}

/// The pid in an `app PID` answer from `addr`; a failed request (refused, reset) as its error.
fn served_by(addr: SocketAddr) -> Result<u32, String> {
    let reply = common::http::try_request(addr, "GET", "/", &[]).map_err(|e| e.to_string())?;
    let body = String::from_utf8_lossy(&reply.body);
    body.trim()
        .strip_prefix("app ")
        .and_then(|pid| pid.parse().ok())
        .ok_or_else(|| format!("answered {body:?}"))
}

/// Asks `addr` one request after another until one is answered by another worker than `old`,
/// and a few more (20 s at most): the requests that failed, and whether a new worker answered.
fn probe_until_replaced(addr: SocketAddr, old: u32) -> (Vec<String>, bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let (mut failed, mut after_new) = (Vec::new(), 0);
    while after_new < 5 && Instant::now() < deadline {
        match served_by(addr) {
            Ok(pid) if pid != old || after_new > 0 => after_new += 1,
            Ok(_) => {}
            Err(e) => failed.push(e),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    (failed, after_new > 0)
}

/// A rolling reload of a worker that is ready (its side port) 1.5 s before it listens on its
/// main port: the main port's listener, which the old worker closed on its way out, waits for
/// the new worker, so no request to it is refused or reset, under rr and shared.
#[test]
fn a_reload_refuses_nothing_on_a_port_the_new_worker_listens_on_after_it_is_ready() {
    if !have("node") {
        return;
    }
    for policy in ["rr", "shared"] {
        let (_dir, addr, mut primary, old) = run_main_port_late(policy);
        primary.signal(Signal::HUP);
        let (failed, replaced) = probe_until_replaced(addr, old);
        assert!(
            replaced && failed.is_empty(),
            "{policy}: new worker serving {replaced}, failed requests {failed:#?}: {:#?}",
            primary.output_so_far()
        );
        primary.wait_line("reload to generation 1: the old workers have exited");
        primary.signal(Signal::TERM);
        assert_exit(&mut primary, Duration::from_secs(30), 0);
    }
}

/// `kill -9` of a worker that, replaced, is ready (its side port) 1.5 s before it listens on its
/// main port: the main port's listener waits for the replacement, so no request to it is
/// refused or reset (those made meanwhile are answered by the replacement), under rr and shared.
#[test]
fn a_killed_workers_port_refuses_nothing_while_its_replacement_starts_up() {
    if !have("node") {
        return;
    }
    for policy in ["rr", "shared"] {
        let (_dir, addr, mut primary, old) = run_main_port_late(policy);
        let pid = rustix::process::Pid::from_raw(old as i32).unwrap();
        rustix::process::kill_process(pid, Signal::KILL).unwrap();
        // No request is in flight to it as it dies: the first is made once it is dead.
        nodus_testkit::tree::wait_gone(&[old as i32], Duration::from_secs(10)).unwrap();
        let (failed, replaced) = probe_until_replaced(addr, old);
        assert!(
            replaced && failed.is_empty(),
            "{policy}: replacement serving {replaced}, failed requests {failed:#?}: {:#?}",
            primary.output_so_far()
        );
        primary.signal(Signal::TERM);
        assert_exit(&mut primary, Duration::from_secs(30), 0);
    }
}

/// Serves on the host and port written in the files `HOST_FILE` and `PORT_FILE` (read at its
/// start, as a deploy changes them); each response is `HOST:PORT PID`; a listen error is printed
/// and exits 1.
const APP_FROM_FILES: &str = r#"
const http = require('http'), fs = require('fs');
const host = fs.readFileSync(process.env.HOST_FILE, 'utf8').trim();
const port = +fs.readFileSync(process.env.PORT_FILE, 'utf8');
const server = http.createServer((q, r) => {
  r.setHeader('Connection', 'close');
  r.end(`${host}:${port} ${process.pid}\n`);
});
server.on('error', (e) => { console.log(`listen error ${e.code}`); process.exit(1); });
server.listen(port, host);
"#;

/// `nodus run --node -w 1 EXTRA...` of [`APP_FROM_FILES`] in `dir`, serving `host` and `port`,
/// once ready.
fn run_from_files(dir: &Path, host: &str, port: u16, extra: &[&str]) -> Proc {
    std::fs::write(dir.join("app.js"), APP_FROM_FILES).unwrap();
    std::fs::write(dir.join("host"), host).unwrap();
    std::fs::write(dir.join("port"), port.to_string()).unwrap();
    let mut primary = spawn(
        Command::new(common::NODUS)
            .args(["run", "--node", "-w", "1"])
            .args(extra)
            .args(["--", "node"])
            .arg(dir.join("app.js"))
            .env("HOST_FILE", dir.join("host"))
            .env("PORT_FILE", dir.join("port"))
            .env("RUST_LOG", "info"),
    );
    primary.wait_line("1 worker ready");
    primary
}

/// A reload whose new code listens on another port: the old port, closed by the old worker on
/// its way out, is kept while the new worker may still ask for it (the grace: the ready timeout,
/// 5 s here, from its readiness), then released (refused, free for another process), with one
/// line saying so.
#[test]
fn a_reload_onto_another_port_releases_the_old_one_after_the_grace() {
    if !have("node") {
        return;
    }
    let dir = TempDir::new("node-move-port");
    let [old, new] = nodus_testkit::net::free_addrs::<2>();
    let mut primary = run_from_files(
        dir.path(),
        "127.0.0.1",
        old.port(),
        &["--ready-timeout", "5"],
    );
    let body = common::http::get(old, "/").body;
    assert!(body.starts_with(format!("127.0.0.1:{}", old.port()).as_bytes()));
    std::fs::write(dir.path().join("port"), new.port().to_string()).unwrap();
    primary.signal(Signal::HUP);
    primary.wait_line("reload to generation 1: the old workers have exited");
    // Within the grace: still the primary's, a connection taken (to wait for a worker).
    assert!(
        TcpListener::bind(old).is_err() && TcpStream::connect(old).is_ok(),
        "{old} was released at once: {:#?}",
        primary.output_so_far()
    );
    let body = common::http::get(new, "/").body;
    assert!(body.starts_with(format!("127.0.0.1:{}", new.port()).as_bytes()));
    assert!(
        eventually(|| tcp_free(old)),
        "{old} is still taken: {:#?}",
        primary.output_so_far()
    );
    primary.wait_line(&format!(
        "{old} released: no worker holds it since worker 1 left, and none asked for it again \
         within 5s (the ready timeout) of being ready"
    ));
    primary.signal(Signal::TERM);
    assert_exit(&mut primary, Duration::from_secs(30), 0);
}

/// A deploy that moves the listener from `127.0.0.1` to `::ffff:127.0.0.1` on the same port (as
/// one that moves it to every address): the reload's new worker cannot listen while the old one
/// holds the port (as under Node's primary), but once the old worker is gone (`kill -9`), its
/// replacement, running the new code, listens: the primary's listener that nobody holds any more
/// is closed for it rather than in its way for good. One line says so.
#[test]
fn a_reload_onto_another_address_binds_once_the_old_worker_is_gone() {
    if !have("node") {
        return;
    }
    let dir = TempDir::new("node-move-host");
    let addr = nodus_testkit::net::free_addr();
    let mut primary = run_from_files(dir.path(), "127.0.0.1", addr.port(), &[]);
    let body = String::from_utf8(common::http::get(addr, "/").body).unwrap();
    let old_pid: i32 = body.trim().rsplit_once(' ').unwrap().1.parse().unwrap();
    std::fs::write(dir.path().join("host"), "::ffff:127.0.0.1").unwrap();
    primary.signal(Signal::HUP);
    // As under Node's primary: the old worker still holds 127.0.0.1 on that port.
    primary.wait_line("listen error EADDRINUSE");
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(old_pid).unwrap(),
        Signal::KILL,
    )
    .unwrap();
    let moved = eventually(|| {
        common::http::try_request(addr, "GET", "/", &[])
            .is_ok_and(|r| r.body.starts_with(b"::ffff:127.0.0.1:"))
    });
    assert!(
        moved,
        "never served on the new address: {:#?}",
        primary.output_so_far()
    );
    primary.wait_line(&format!(
        "{addr} released: no worker holds it since worker 1 left, and worker 1"
    ));
    primary.signal(Signal::TERM);
    assert_exit(&mut primary, Duration::from_secs(30), 0);
}
