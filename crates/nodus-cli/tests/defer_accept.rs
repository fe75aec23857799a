//! Deferred accept (`TCP_DEFER_ACCEPT`): with `--defer-accept`, `nodus serve`'s public listener
//! defers its accepts, in one process and in a cluster, so a client that connected and said
//! nothing yet is not taken (its connection stays half-open in the kernel) until it speaks, and
//! is then served; without it such a client is accepted at once. In one process and under
//! reuseport, a stop (under reuseport a reload too) serves such a client too, and is not slowed
//! when there is none. `nodus run --defer-accept`
//! defers on the sockets it passes, under every policy that passes one.
//! 127.0.0.1 only; every process is stopped by its PID.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use common::cluster::{assert_exit, spawn};
use common::http::get_ok;
use common::{NODUS, have};
use nodus_testkit::net::free_addr;
use nodus_testkit::proc::Proc;
use nodus_testkit::tmp::TempDir;
use rustix::process::Signal;

/// The kernel's state of the server side of the TCP connection from `client` to `server`
/// (`/proc/net/tcp`: 1 established, 3 SYN received, as a deferred accept keeps a connection whose
/// client said nothing yet), if it is listed.
fn server_side_state(server: SocketAddr, client: SocketAddr) -> Option<u8> {
    let hex = |a: SocketAddr| match a {
        SocketAddr::V4(v4) => format!(
            "{:08X}:{:04X}",
            u32::from_le_bytes(v4.ip().octets()),
            v4.port()
        ),
        SocketAddr::V6(_) => unreachable!("127.0.0.1 only"),
    };
    let (local, remote) = (hex(server), hex(client));
    std::fs::read_to_string("/proc/net/tcp")
        .unwrap()
        .lines()
        .skip(1)
        .find_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            (f[1] == local && f[2] == remote).then(|| u8::from_str_radix(f[3], 16).unwrap())
        })
}

/// A client that connects and says nothing is accepted at once, or with `deferred` not (its
/// connection stays half-open in the kernel, 300 ms on); it is served once it sends its request.
fn silent_client_is_served(addr: SocketAddr, deferred: bool) {
    // Looked at well within the kernel's deferral (about 1 s): a look slowed past it (a loaded
    // host) is made again, with a new client.
    let (mut silent, state) = (0..10)
        .map(|_| {
            let started = Instant::now();
            let silent = TcpStream::connect(addr).unwrap();
            std::thread::sleep(Duration::from_millis(300));
            let state = server_side_state(addr, silent.local_addr().unwrap());
            (silent, state, started.elapsed())
        })
        .find(|(.., took)| *took < Duration::from_millis(800))
        .map(|(silent, state, _)| (silent, state))
        .expect("a look within 800 ms of its connect");
    assert_eq!(
        state,
        Some(if deferred { 3 } else { 1 }),
        "the server side of a client that said nothing: SYN received only if deferred ({deferred})"
    );
    silent
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    silent
        .write_all(b"GET /a.txt HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut reply = String::new();
    silent.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.ends_with("hello\n"), "{reply}");
}

#[test]
fn serve_defers_its_accepts_with_defer_accept_in_one_process_and_in_a_cluster() {
    for (workers, flag) in [
        ("1", None),
        ("1", Some("--defer-accept")),
        ("2", None),
        ("2", Some("--defer-accept")),
    ] {
        let dir = TempDir::new("defer-serve");
        std::fs::write(dir.path().join("a.txt"), "hello\n").unwrap();
        let addr = free_addr();
        let mut server = spawn(
            Command::new(NODUS)
                .arg("serve")
                .arg(dir.path())
                .args(["--workers", workers, "--listen", &addr.to_string()])
                .args(flag)
                .env("RUST_LOG", "info"),
        );
        assert_eq!(get_ok(addr, "/a.txt"), "hello\n");
        silent_client_is_served(addr, flag.is_some());
        server.signal(Signal::TERM);
        assert_exit(&mut server, Duration::from_secs(30), 0);
    }
}

/// `nodus serve --defer-accept` with `cluster` (`--workers 1`, or a policy and more workers) on a
/// fresh directory with `a.txt`, serving.
fn serve_deferred(dir: &TempDir, addr: SocketAddr, cluster: &[&str]) -> Proc {
    std::fs::write(dir.path().join("a.txt"), "hello\n").unwrap();
    let server = spawn(
        Command::new(NODUS)
            .arg("serve")
            .arg(dir.path())
            .args(cluster)
            .args(["--defer-accept", "--listen", &addr.to_string()])
            .env("RUST_LOG", "info"),
    );
    assert_eq!(get_ok(addr, "/a.txt"), "hello\n");
    server
}

/// Sends `GET /a.txt` on `client`, connected a while ago and silent until now, and asserts that
/// the whole answer comes (`what` names the case).
fn assert_served_late(client: &mut TcpStream, what: &str) {
    client
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut reply = String::new();
    let sent = client
        .write_all(b"GET /a.txt HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .and_then(|()| client.read_to_string(&mut reply));
    assert!(
        sent.is_ok() && reply.starts_with("HTTP/1.1 200") && reply.ends_with("hello\n"),
        "{what}: {sent:?}: {reply:?}"
    );
}

/// In one process and under reuseport (each worker's socket its own), a stop loses no client
/// that connected before it: one that has said nothing yet when SIGTERM comes (held half-open by
/// the deferral) and sends its request 300 ms after connecting is served, as without deferral,
/// and nodus exits 0.
#[test]
fn serve_with_defer_accept_serves_a_client_that_connected_before_the_stop() {
    for cluster in [
        &["--workers", "1"][..],
        &["--workers", "2", "--policy", "reuseport"],
    ] {
        let dir = TempDir::new("defer-stop");
        let addr = free_addr();
        let mut server = serve_deferred(&dir, addr, cluster);
        let started = Instant::now();
        let mut client = TcpStream::connect(addr).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        server.signal(Signal::TERM);
        std::thread::sleep(Duration::from_millis(300).saturating_sub(started.elapsed()));
        assert_served_late(&mut client, &format!("{cluster:?}"));
        assert_exit(&mut server, Duration::from_secs(30), 0);
    }
}

/// Under reuseport a reload (SIGHUP) loses no client that connected before it either: each
/// worker's socket is its own, and its drain takes what the kernel holds for it.
#[test]
fn serve_with_defer_accept_under_reuseport_serves_clients_that_connected_before_a_reload() {
    let dir = TempDir::new("defer-reload");
    let addr = free_addr();
    let mut server = serve_deferred(&dir, addr, &["--workers", "2", "--policy", "reuseport"]);
    let started = Instant::now();
    // Several, so that each worker's socket likely holds one.
    let mut clients: Vec<TcpStream> = (0..6).map(|_| TcpStream::connect(addr).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(100));
    server.signal(Signal::HUP);
    std::thread::sleep(Duration::from_millis(300).saturating_sub(started.elapsed()));
    for (i, client) in clients.iter_mut().enumerate() {
        assert_served_late(client, &format!("client {i}"));
    }
    server.signal(Signal::TERM);
    assert_exit(&mut server, Duration::from_secs(30), 0);
}

/// A stop with no client held half-open is not held up by the deferral.
#[test]
fn serve_with_defer_accept_stops_promptly_with_no_client_waiting() {
    for cluster in [
        &["--workers", "1"][..],
        &["--workers", "2", "--policy", "reuseport"],
    ] {
        let dir = TempDir::new("defer-stop-idle");
        let addr = free_addr();
        let mut server = serve_deferred(&dir, addr, cluster);
        server.signal(Signal::TERM);
        assert_exit(&mut server, Duration::from_secs(5), 0);
    }
}

/// A plain program that prints the `TCP_DEFER_ACCEPT` of the socket it was passed (fd 3).
const PY_DEFER: &str = r#"
import socket, time
s = socket.socket(fileno=3)
print("defer", s.getsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT), flush=True)
time.sleep(60)
"#;

#[test]
fn run_defers_the_accepts_of_the_sockets_it_passes_only_with_defer_accept() {
    if !have("python3") {
        return;
    }
    let dir = TempDir::new("defer-run");
    let script = dir.path().join("defer.py");
    std::fs::write(&script, PY_DEFER).unwrap();
    for policy in ["shared", "reuseport"] {
        for (flag, deferred) in [(None, false), (Some("--defer-accept"), true)] {
            let addr = free_addr();
            let mut primary = spawn(
                Command::new(NODUS)
                    .args([
                        "run",
                        "-w",
                        "1",
                        "--policy",
                        policy,
                        "-l",
                        &addr.to_string(),
                    ])
                    .args(flag)
                    .args(["--", "python3"])
                    .arg(&script)
                    .env("RUST_LOG", "info"),
            );
            let line = primary.wait_line("] defer ");
            let secs: u32 = line.rsplit(' ').next().unwrap().parse().unwrap();
            assert_eq!(secs > 0, deferred, "{policy} {flag:?}: {line}");
            primary.signal(Signal::TERM);
            assert_exit(&mut primary, Duration::from_secs(30), 0);
        }
    }
}
