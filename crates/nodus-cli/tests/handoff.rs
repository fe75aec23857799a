//! The primary's round-robin handoff at its edges, through the `nodus` command: connections no
//! worker takes are closed after a bounded wait instead of hanging, a shutdown stops accepting
//! when its drain begins (not during `--shutdown-delay`; under rr and under shared), and a
//! primary out of file descriptors keeps the connections it hands to Node workers instead of
//! dropping them.
//!
//! Every process is started in its own process group and the whole group is killed by PID when
//! the test ends. Node is needed for two of them: under `CI` a missing one fails the test,
//! elsewhere it is skipped.

mod common;

use std::io::{self, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::Duration;

use common::cluster::{count, run_node_app, spawn, wait_events};
use common::http::get;
use common::{NODUS, have};
use nodus_testkit::http::{Timeouts, connect, read_reply, write_request};
use nodus_testkit::net::free_addr;
use nodus_testkit::tmp::TempDir;
use rustix::process::{Pid, Resource, Rlimit, Signal};

/// Generous bounds: a hang becomes an error, nothing is timed.
const TIMEOUTS: Timeouts = Timeouts {
    connect: Duration::from_secs(5),
    io: Duration::from_secs(20),
};

/// `n` connections, each with a complete `GET /` (`Connection: close`) written.
fn open_requests(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    (0..n)
        .map(|i| {
            let mut s = connect(addr, TIMEOUTS).unwrap_or_else(|e| panic!("connect {i}: {e}"));
            write_request(&mut s, "GET", "/", &["Connection: close"]).unwrap();
            s
        })
        .collect()
}

/// A Node worker that listens elsewhere (port 0): the listener pre-bound with `-l` has no worker
/// taking its connections (one a worker closed would be closed with it, as under Node's primary).
const NODE_APP_ELSEWHERE: &str = r#"
const http = require('http');
http.createServer((req, res) => res.end('other'))
  .listen(0, '127.0.0.1', () => console.log('listening elsewhere'));
// Listening for it keeps the channel, and so the worker, up until the primary's disconnect.
process.on('disconnect', () => process.exit(0));
"#;

#[test]
fn connections_no_worker_takes_are_closed_after_the_ready_timeout() {
    if !have("node") {
        return;
    }
    let dir = TempDir::new("parked-deadline");
    std::fs::write(dir.path().join("app.js"), NODE_APP_ELSEWHERE).unwrap();
    let addr = free_addr();
    let mut primary = spawn(
        Command::new(NODUS)
            .args(["run", "--node", "-w", "1", "--ready-timeout", "1"])
            .args(["-l", &addr.to_string(), "--", "node"])
            .arg(dir.path().join("app.js"))
            .env("RUST_LOG", "info"),
    );
    primary.wait_line("listening elsewhere");
    // More than one accept batch: those left in the backlog meanwhile get their turn too.
    let clients = open_requests(addr, 100);
    for (i, mut s) in clients.into_iter().enumerate() {
        let mut got = Vec::new();
        let end = s.read_to_end(&mut got);
        assert!(
            !matches!(&end, Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut)),
            "client {i} still waits after {:?}: {:#?}",
            TIMEOUTS.io,
            primary.output()
        );
        assert!(got.is_empty(), "client {i} got an answer: {got:?}");
    }
    assert!(
        primary.exited_within(Duration::ZERO).is_none(),
        "the primary still runs"
    );
    primary.signal(Signal::TERM);
    assert_eq!(primary.wait_exit(Duration::from_secs(30)), Some(0));
}

/// `nodus serve --workers 2 --policy POLICY`, SIGTERM with a shutdown delay: connections are
/// accepted and served through the delay; once the drain begins new ones are refused (after the
/// workers closed their copies, under `shared`), and one a worker took before is served to the end.
fn a_shutdown_stops_accepting_when_the_drain_begins(policy: &str) {
    let dir = TempDir::new(&format!("drain-refuses-{policy}"));
    std::fs::write(dir.path().join("a.txt"), "a\n").unwrap();
    let log = dir.path().join("events.jsonl");
    let addr = free_addr();
    let mut primary = spawn(
        Command::new(NODUS)
            .arg("serve")
            .arg(dir.path())
            .args([
                "--workers",
                "2",
                "--policy",
                policy,
                "--listen",
                &addr.to_string(),
            ])
            .args(["--shutdown-delay", "3", "--drain-timeout", "20", "--events"])
            .arg(&log)
            .env("RUST_LOG", "info"),
    );
    primary.wait_line("2 workers ready");
    primary.signal(Signal::TERM);
    wait_events(&log, |e| count(e, "shutdown") == 1);
    // The shutdown delay: readyz says 503, connections are still accepted and served.
    assert_eq!(get(addr, "/a.txt").status, 200);
    let mut held = connect(addr, TIMEOUTS).unwrap();
    held.write_all(b"GET /a.txt HTTP/1.1\r\nHost: t\r\n")
        .unwrap();

    // The drain: every copy of the listener closes, so the kernel refuses newcomers (a shared
    // socket once both workers have read their disconnect; bounded by the loop below).
    wait_events(&log, |e| count(e, "drain") == 2);
    let mut late = TcpStream::connect_timeout(&addr, TIMEOUTS.connect);
    for _ in 0..100 {
        if late.is_err() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
        late = TcpStream::connect_timeout(&addr, TIMEOUTS.connect);
    }
    assert_eq!(
        late.as_ref().err().map(io::Error::kind),
        Some(io::ErrorKind::ConnectionRefused),
        "a connection 5 s after the drain began: {late:?}"
    );
    // A connection handed to a worker before the drain is served to the end.
    held.write_all(b"\r\n").unwrap();
    let reply = read_reply(&mut BufReader::new(&held), false).unwrap();
    assert_eq!((reply.status, reply.body.as_slice()), (200, &b"a\n"[..]));
    assert_eq!(primary.wait_exit(Duration::from_secs(30)), Some(0));
}

#[test]
fn a_round_robin_shutdown_stops_accepting_when_the_drain_begins() {
    a_shutdown_stops_accepting_when_the_drain_begins("rr");
}

#[test]
fn a_shared_socket_shutdown_stops_accepting_when_the_drain_begins() {
    a_shutdown_stops_accepting_when_the_drain_begins("shared");
}

/// The primary's open fd numbers.
fn open_fds(pid: u32) -> Vec<u64> {
    let mut fds: Vec<u64> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    fds.sort_unstable();
    fds
}

/// Lowers `pid`'s soft open-files limit so that only `free` more fds can be opened; returns the
/// limit it had.
fn leave_free_fds(pid: u32, free: u64) -> Rlimit {
    let open = open_fds(pid);
    let mut limit = 0;
    let mut left = free;
    while left > 0 {
        if open.binary_search(&limit).is_err() {
            left -= 1;
        }
        limit += 1;
    }
    // The hard limit is the one this process has (the primary inherited it).
    let hard = rustix::process::getrlimit(Resource::Nofile).maximum;
    let soft = Rlimit {
        current: Some(limit),
        maximum: hard,
    };
    rustix::process::prlimit(Pid::from_raw(pid as i32), Resource::Nofile, soft).unwrap()
}

const NODE_APP: &str = r#"
const http = require('http');
http.createServer((req, res) => res.end(`worker ${process.env.NODUS_WORKER_ID}`))
  .listen(+process.env.PORT, '127.0.0.1');
"#;

#[test]
fn a_primary_out_of_fds_keeps_the_connections_it_hands_to_node_workers() {
    if !have("node") {
        return;
    }
    let (_dir, addr, mut primary) = run_node_app("handoff-emfile", NODE_APP, 1, &[]);
    assert_eq!(get(addr, "/").status, 200);
    // Only the primary's limit: its worker already runs with its own.
    let before = leave_free_fds(primary.id(), 2);
    let clients = open_requests(addr, 40);
    for (i, s) in clients.into_iter().enumerate() {
        let reply = read_reply(&mut BufReader::new(s), false)
            .unwrap_or_else(|e| panic!("client {i}: {e}: {:#?}", primary.output()));
        assert_eq!(
            (reply.status, reply.body.as_slice()),
            (200, &b"worker 1"[..])
        );
    }
    rustix::process::prlimit(Pid::from_raw(primary.id() as i32), Resource::Nofile, before).unwrap();
    primary.signal(Signal::TERM);
    assert_eq!(primary.wait_exit(Duration::from_secs(30)), Some(0));
}
