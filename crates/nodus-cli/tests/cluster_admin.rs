//! A cluster primary's `/_nodus/` endpoints at their edges: readyz stays 200 while one worker of
//! two is replaced, says `no worker ready` (not `shutting down`) while none is ready, at the start
//! and in a crash loop, `no worker takes connections (N stalled)` while every ready worker is
//! stopped (SIGSTOP), under rr and shared, without waiting for them, and `shutting down` once a
//! shutdown began; a worker stopped (SIGSTOP)
//! before the primary ever asked it for a snapshot is a stall in the stats, the metrics and
//! `nodus top`; Node workers, which never answer snapshot requests, are not asked (`answering`
//! unknown), and are shown stalled (`stalled`, `nodus_cluster_worker_stalled`, `nodus top`) once
//! stopped with connections handed to them, as readyz finds them. A worker whose primary is
//! stopped answers its stats and metrics 503 within 5 s, never its own figures in the cluster's
//! place.
//!
//! Every process is started in its own process group and the whole group is killed by PID when
//! the test ends; a stopped worker gets SIGCONT, then SIGKILL, by PID whatever happens. Node is
//! needed for one test: under `CI` a missing one fails it, elsewhere it is skipped.

mod common;

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use common::cluster::{
    assert_exit, count, events, run_node_app, run_sh, spawn, wait_events, wait_ready_pids,
    worker_entry,
};
use common::http::{get, try_request};
use common::{NODUS, have};
use nodus_testkit::net::free_addr;
use nodus_testkit::tmp::TempDir;
use nodus_testkit::tree::KillOnDrop;
use rustix::process::{Pid, Signal};
use serde_json::Value;

/// The status and body of `GET /_nodus/readyz`, once the admin listener answers (20 s at most).
fn readyz(admin: SocketAddr) -> (u16, String) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match try_request(admin, "GET", "/_nodus/readyz", &[]) {
            Ok(r) => return (r.status, String::from_utf8(r.body).unwrap()),
            Err(e) => assert!(Instant::now() < deadline, "readyz: {e}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Polls readyz until its status is `status` (20 s at most); its body then.
fn readyz_until(admin: SocketAddr, status: u16) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (s, body) = readyz(admin);
        if s == status {
            return body;
        }
        assert!(Instant::now() < deadline, "readyz stayed {s} {body:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn stats(admin: SocketAddr) -> Value {
    let r = get(admin, "/_nodus/stats");
    assert_eq!(r.status, 200);
    serde_json::from_slice(&r.body).unwrap()
}

fn worker_pids(stats: &Value) -> Vec<i32> {
    stats["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["pid"].as_i64().unwrap() as i32)
        .collect()
}

fn signal(pid: i32, sig: Signal) {
    let _ = rustix::process::kill_process(Pid::from_raw(pid).unwrap(), sig);
}

#[test]
fn readyz_stays_200_while_one_worker_of_two_is_replaced() {
    let dir = TempDir::new("readyz-replace");
    let log = dir.path().join("events.jsonl");
    let admin = free_addr();
    // A replacement is ready 1.5 s after its start: the window readyz is polled in.
    let admin_arg = admin.to_string();
    let options = [
        "-w",
        "2",
        "--admin",
        &admin_arg,
        "--ready-after",
        "1.5",
        "--events",
    ];
    let options = options.map(std::ffi::OsStr::new).into_iter();
    let mut primary =
        spawn(run_sh(options.chain([log.as_os_str()]), "exec sleep 60").env("RUST_LOG", "info"));
    primary.wait_line("2 workers ready");
    assert_eq!(readyz(admin), (200, "ready\n".to_owned()));
    let doc = stats(admin);
    for w in doc["workers"].as_array().unwrap() {
        assert!(
            w["answering"].is_null(),
            "a plain program is not asked: {w}"
        );
    }
    let victim = worker_pids(&doc)[0];
    signal(victim, Signal::KILL);
    // The replacement has started and is not ready yet: one worker of two serves.
    wait_events(&log, |e| count(e, "fork") == 3);
    let mut in_window = 0;
    loop {
        let answer = readyz(admin);
        let ready_events = count(&events(&log), "ready");
        assert_eq!(
            answer,
            (200, "ready\n".to_owned()),
            "one worker of two is down ({ready_events} ready events)"
        );
        if ready_events == 3 {
            break;
        }
        in_window += 1;
        assert!(in_window < 2000, "the replacement never got ready");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        in_window > 0,
        "no readyz answer fell in the replacement's window"
    );
    let up = stats(admin)["workers_up"].clone();
    assert_eq!(up, 2);
    primary.signal(Signal::TERM);
    assert_exit(&mut primary, Duration::from_secs(30), 0);
}

#[test]
fn readyz_says_no_worker_ready_while_none_is_and_shutting_down_only_in_a_shutdown() {
    let dir = TempDir::new("readyz-why");
    let crash = dir.path().join("crash");
    std::fs::write(&crash, b"").unwrap();
    let admin = free_addr();
    // While `crash` exists the workers exit at once (a crash loop with a short backoff); else
    // they ignore SIGTERM, so a shutdown's drain lasts until the kill timeout.
    let script = "test -e \"$CRASH\" && exit 3; trap '' TERM; exec sleep 60";
    // A worker counts as ready after 1 s up: far longer than one that crashes takes to exit.
    let options = [
        "--ready-after",
        "1",
        "--backoff",
        "0.05,2,0.4",
        "--max-restarts",
        "10000",
        "--kill-timeout",
        "3",
    ];
    let mut cmd = run_sh(
        ["-w", "2", "--admin", &admin.to_string()]
            .into_iter()
            .chain(options),
        script,
    );
    let mut primary = spawn(cmd.env("CRASH", &crash).env("RUST_LOG", "info"));

    // At the start, no worker is ready yet (nor ever, while they crash): not a shutdown.
    for _ in 0..10 {
        assert_eq!(readyz(admin), (503, "no worker ready\n".to_owned()));
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(stats(admin)["workers_up"], 0);
    std::fs::remove_file(&crash).unwrap();
    assert_eq!(readyz_until(admin, 200), "ready\n");

    // Both workers killed, their replacements crashing in backoff: not ready, not stopping.
    std::fs::write(&crash, b"").unwrap();
    for pid in worker_pids(&stats(admin)) {
        signal(pid, Signal::KILL);
    }
    assert_eq!(readyz_until(admin, 503), "no worker ready\n");
    std::fs::remove_file(&crash).unwrap();
    assert_eq!(readyz_until(admin, 200), "ready\n");

    // A shutdown: the workers are sent SIGTERM (they ignore it until the kill timeout).
    primary.signal(Signal::TERM);
    primary.wait_line("SIGTERM to 2 workers");
    assert_eq!(readyz(admin), (503, "shutting down\n".to_owned()));
    assert_exit(&mut primary, Duration::from_secs(30), 124);
}

/// The public listener's readyz is the worker's own: 200 while it serves, 503 `shutting down`
/// from the primary's `stopping` notice on (`--shutdown-delay`); the admin listener's is the
/// primary's, `shutting down` too.
#[test]
fn readyz_says_shutting_down_through_the_shutdown_delay() {
    let dir = TempDir::new("readyz-delay");
    std::fs::write(dir.path().join("a.txt"), "a\n").unwrap();
    let (public, admin) = (free_addr(), free_addr());
    let serve = |admin: Option<SocketAddr>| {
        let mut cmd = Command::new(NODUS);
        cmd.arg("serve")
            .arg(dir.path())
            .args(["--workers", "2", "--listen"])
            .arg(admin.map_or(public, |_| free_addr()).to_string())
            .args(["--shutdown-delay", "5"])
            .env("RUST_LOG", "info");
        if let Some(a) = admin {
            cmd.args(["--admin", &a.to_string()]);
        }
        let mut primary = spawn(&mut cmd);
        primary.wait_line("2 workers ready");
        primary
    };
    let mut on_public = serve(None);
    let mut with_admin = serve(Some(admin));
    assert_eq!(readyz(public), (200, "ready\n".to_owned()));
    assert_eq!(readyz(admin), (200, "ready\n".to_owned()));
    on_public.signal(Signal::TERM);
    with_admin.signal(Signal::TERM);
    // Each worker reads its `stopping` notice in its own time: polled.
    assert_eq!(readyz_until(public, 503), "shutting down\n");
    assert_eq!(readyz_until(admin, 503), "shutting down\n");
    assert_eq!(get(public, "/a.txt").status, 200, "still serving");
    assert_exit(&mut on_public, Duration::from_secs(30), 0);
    assert_exit(&mut with_admin, Duration::from_secs(30), 0);
}

/// SIGCONT to a stopped process when dropped (before its `KillOnDrop`, declared first).
struct ContOnDrop(i32);

impl Drop for ContOnDrop {
    fn drop(&mut self) {
        signal(self.0, Signal::CONT);
    }
}

/// `GET /_nodus/readyz` while a worker is stopped: answered from what the primary knows, within
/// 1 s (it never waits for a worker); its status and body.
fn quick_readyz(admin: SocketAddr) -> (u16, String) {
    let t = Instant::now();
    let answer = readyz(admin);
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "readyz took {:?}",
        t.elapsed()
    );
    answer
}

/// [`quick_readyz`] until its status is `status` (20 s at most); its body then.
fn quick_readyz_until(admin: SocketAddr, status: u16) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (s, body) = quick_readyz(admin);
        if s == status {
            return body;
        }
        assert!(Instant::now() < deadline, "readyz stayed {s} {body:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A cluster of one nodus worker (`nodus serve` under `nodus run --node -w 1`, rr), idle: stopped
/// (SIGSTOP; a blocked loop is the same to the primary), the worker takes no connection, and
/// readyz says so within a few seconds with no traffic to show it (the primary's own snapshot
/// request goes unanswered), never waiting for it; 200 again once it runs.
#[test]
fn readyz_says_no_worker_takes_connections_while_the_only_worker_is_stopped() {
    let dir = TempDir::new("readyz-stall-one");
    let admin = free_addr();
    let mut primary = spawn(
        Command::new(NODUS)
            .args(["run", "--node", "-w", "1", "--admin", &admin.to_string()])
            .args(["--", NODUS, "serve"])
            .arg(dir.path())
            .args(["--listen", &free_addr().to_string()])
            .env("RUST_LOG", "info"),
    );
    primary.wait_line("1 worker ready");
    assert_eq!(quick_readyz(admin), (200, "ready\n".to_owned()));
    let pid = worker_pids(&stats(admin))[0];
    let _kill = KillOnDrop(vec![pid]);
    let cont = ContOnDrop(pid);
    signal(pid, Signal::STOP);
    assert_eq!(
        quick_readyz_until(admin, 503),
        "no worker takes connections (1 stalled)\n"
    );
    drop(cont);
    assert_eq!(quick_readyz_until(admin, 200), "ready\n");
    primary.signal(Signal::TERM);
    assert_exit(&mut primary, Duration::from_secs(30), 0);
}

/// Under `shared` (the kernel hands connections to whichever worker accepts) one stopped worker
/// of two leaves the other taking them all: readyz stays 200; both stopped, 503 naming them; one
/// of them running again, 200.
#[test]
fn readyz_says_503_under_shared_only_once_every_worker_is_stopped() {
    let dir = TempDir::new("readyz-stall-shared");
    let log = dir.path().join("events.jsonl");
    let admin = free_addr();
    let mut primary = spawn(
        Command::new(NODUS)
            .arg("serve")
            .arg(dir.path())
            .args(["--workers", "2", "--policy", "shared", "--listen"])
            .arg(free_addr().to_string())
            .args(["--admin", &admin.to_string(), "--events"])
            .arg(&log)
            .env("RUST_LOG", "info"),
    );
    primary.wait_line("2 workers ready");
    let pids = wait_ready_pids(&log, 2);
    let _kill = KillOnDrop(pids.to_vec());
    let conts: Vec<ContOnDrop> = pids.iter().map(|&p| ContOnDrop(p)).collect();
    signal(pids[0], Signal::STOP);
    // Long past the 1 s a stalled loop takes to show: the other worker takes connections.
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        assert_eq!(quick_readyz(admin), (200, "ready\n".to_owned()));
        std::thread::sleep(Duration::from_millis(50));
    }
    signal(pids[1], Signal::STOP);
    assert_eq!(
        quick_readyz_until(admin, 503),
        "no worker takes connections (2 stalled)\n"
    );
    drop(conts);
    assert_eq!(quick_readyz_until(admin, 200), "ready\n");
    primary.signal(Signal::TERM);
    assert_exit(&mut primary, Duration::from_secs(30), 0);
}

#[test]
fn a_worker_stopped_before_the_first_stats_pull_is_a_stall() {
    let dir = TempDir::new("stall-first");
    let log = dir.path().join("events.jsonl");
    let admin = free_addr();
    let mut primary = spawn(
        Command::new(NODUS)
            .arg("serve")
            .arg(dir.path())
            .args(["--workers", "2", "--listen", "127.0.0.1:0"])
            .args(["--admin", &admin.to_string(), "--events"])
            .arg(&log)
            .env("RUST_LOG", "info"),
    );
    primary.wait_line("2 workers ready");
    // The pids from the event log: no stats request before the stop.
    let pids = wait_ready_pids(&log, 2);
    let (stopped, running) = (pids[0], pids[1]);
    let _kill = KillOnDrop(vec![stopped]);
    let cont = ContOnDrop(stopped);
    signal(stopped, Signal::STOP);

    let doc = stats(admin);
    let (w, other) = (worker_entry(&doc, stopped), worker_entry(&doc, running));
    assert_eq!(w["answering"], false, "{w}");
    assert!(w["snapshot"].is_null(), "{w}");
    assert_eq!(other["answering"], true, "{other}");
    assert!(other["snapshot"].is_object(), "{other}");
    let metrics = String::from_utf8(get(admin, "/_nodus/metrics").body).unwrap();
    let gauge = format!(
        "nodus_cluster_worker_answering{{worker=\"{}\",pid=\"{stopped}\"}} 0",
        w["worker"]
    );
    assert!(metrics.contains(&gauge), "no {gauge:?} in\n{metrics}");
    let out = Command::new(NODUS)
        .args(["top", "--once", "--interval", "0.2", &admin.to_string()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let row = text
        .lines()
        .find(|l| l.split_whitespace().next() == Some(&stopped.to_string()))
        .unwrap_or_else(|| panic!("no row for pid {stopped}:\n{text}"));
    assert_eq!(row.split_whitespace().nth(3), Some("stall"), "{text}");
    // Its request unanswered for 1 s, the primary's own verdict (readyz's and routing's) too.
    let w = stalled_until(admin, stopped, true);
    assert_eq!(worker_entry(&stats(admin), running)["stalled"], false);
    let metrics = String::from_utf8(get(admin, "/_nodus/metrics").body).unwrap();
    for (pid, worker, v) in [(stopped, &w["worker"], 1), (running, &other["worker"], 0)] {
        let gauge =
            format!("nodus_cluster_worker_stalled{{worker=\"{worker}\",pid=\"{pid}\"}} {v}");
        assert!(metrics.contains(&gauge), "no {gauge:?} in\n{metrics}");
    }

    drop(cont);
    primary.signal(Signal::TERM);
    assert_exit(&mut primary, Duration::from_secs(30), 0);
}

/// Node workers have a channel but never answer snapshot requests: they are not asked, and show
/// as unknown (`answering: null`, no `_answering` series), never as stalled.
#[test]
fn node_workers_are_not_asked_for_snapshots_nor_shown_stalled() {
    if !have("node") {
        return;
    }
    let admin = free_addr();
    let app = "require('http').createServer((q, s) => s.end('ok')).listen(+process.env.PORT, '127.0.0.1');";
    let (_dir, _addr, mut primary) =
        run_node_app("node-answering", app, 2, &["--admin", &admin.to_string()]);
    for _ in 0..2 {
        let doc = stats(admin);
        for w in doc["workers"].as_array().unwrap() {
            assert!(w["answering"].is_null(), "{w}");
            assert_eq!(w["stalled"], false, "{w}");
        }
        let metrics = String::from_utf8(get(admin, "/_nodus/metrics").body).unwrap();
        assert!(
            !metrics.contains("nodus_cluster_worker_answering{"),
            "{metrics}"
        );
        std::thread::sleep(Duration::from_millis(1100));
    }
    primary.signal(Signal::TERM);
    assert_exit(&mut primary, Duration::from_secs(30), 0);
}

/// Polls the stats until worker process `pid`'s `stalled` is `stalled` (20 s at most); its entry
/// then.
fn stalled_until(admin: SocketAddr, pid: i32, stalled: bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let w = worker_entry(&stats(admin), pid);
        if w["stalled"] == stalled {
            return w;
        }
        assert!(Instant::now() < deadline, "stalled never {stalled}: {w}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Stock Node workers under rr, both stopped (SIGSTOP) with clients handed to them: readyz says
/// none takes connections, and the stats, the metrics and `nodus top` say which are stalled,
/// though the primary never asks a Node worker for a snapshot (`answering` stays `null`).
/// Continued, they take their clients and are no longer stalled.
#[test]
fn stopped_node_workers_are_shown_stalled_as_readyz_finds_them() {
    if !have("node") {
        return;
    }
    let admin = free_addr();
    let events = TempDir::new("node-stalled-events");
    let log = events.path().join("events.jsonl");
    let app = "require('http').createServer((q, s) => s.end('ok')).listen(+process.env.PORT, '127.0.0.1');";
    let (_dir, addr, mut primary) = run_node_app(
        "node-stalled",
        app,
        2,
        &[
            "--admin",
            &admin.to_string(),
            "--events",
            log.to_str().unwrap(),
        ],
    );
    let pids = wait_ready_pids(&log, 2);
    let _kill = KillOnDrop(pids.clone());
    let conts: Vec<ContOnDrop> = pids.iter().map(|&p| ContOnDrop(p)).collect();
    for &p in &pids {
        signal(p, Signal::STOP);
    }
    // Four clients: rr hands two to each stopped worker (one written to its channel).
    let clients: Vec<_> = (0..4)
        .map(|i| {
            let mut s = nodus_testkit::http::connect(addr, TIMEOUTS).unwrap();
            nodus_testkit::http::write_request(&mut s, "GET", "/", &["Connection: close"])
                .unwrap_or_else(|e| panic!("client {i}: {e}"));
            s
        })
        .collect();
    assert_eq!(
        quick_readyz_until(admin, 503),
        "no worker takes connections (2 stalled)\n"
    );
    let doc = stats(admin);
    assert_eq!(doc["workers_up"], 2, "{doc}");
    let metrics = String::from_utf8(get(admin, "/_nodus/metrics").body).unwrap();
    for &p in &pids {
        let w = worker_entry(&doc, p);
        assert_eq!(w["stalled"], true, "{w}");
        assert!(w["answering"].is_null(), "{w}");
        let gauge = format!(
            "nodus_cluster_worker_stalled{{worker=\"{}\",pid=\"{p}\"}} 1",
            w["worker"]
        );
        assert!(metrics.contains(&gauge), "no {gauge:?} in\n{metrics}");
    }
    assert!(
        !metrics.contains("nodus_cluster_worker_answering{"),
        "{metrics}"
    );
    let out = Command::new(NODUS)
        .args(["top", "--once", "--interval", "0.2", &admin.to_string()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("2 stalled"), "{text}");
    for p in &pids {
        let row = text
            .lines()
            .find(|l| l.split_whitespace().next() == Some(&p.to_string()))
            .unwrap_or_else(|| panic!("no row for pid {p}:\n{text}"));
        assert_eq!(row.split_whitespace().nth(3), Some("stall"), "{text}");
    }

    drop(conts);
    for (i, s) in clients.into_iter().enumerate() {
        let reply = nodus_testkit::http::read_reply(&mut std::io::BufReader::new(s), false)
            .unwrap_or_else(|e| panic!("client {i}: {e}"));
        assert_eq!(reply.body, b"ok", "client {i}");
    }
    assert_eq!(quick_readyz_until(admin, 200), "ready\n");
    for &p in &pids {
        stalled_until(admin, p, false);
    }
    primary.signal(Signal::TERM);
    assert_exit(&mut primary, Duration::from_secs(30), 0);
}

/// A client's bounds for requests a stopped process holds: past every wait the test expects.
const TIMEOUTS: nodus_testkit::http::Timeouts = nodus_testkit::http::Timeouts {
    connect: Duration::from_secs(5),
    io: Duration::from_secs(20),
};

/// The cluster primary stopped (SIGSTOP), a worker answers its stats and metrics (the public
/// listener's, for a loopback client) 503 `cluster primary not answering` once it has waited
/// 5 s for the primary: never its own single-process document, whose metrics would lack the
/// `worker` and `pid` labels. Its healthz answers meanwhile; the primary continued, the cluster
/// document is back.
#[test]
fn a_worker_whose_primary_does_not_answer_fails_stats_and_metrics() {
    let dir = TempDir::new("primary-silent");
    let log = dir.path().join("events.jsonl");
    let addr = free_addr();
    let mut primary = spawn(
        Command::new(NODUS)
            .arg("serve")
            .arg(dir.path())
            .args(["--workers", "2", "--policy", "shared", "--listen"])
            .arg(addr.to_string())
            .arg("--events")
            .arg(&log)
            .env("RUST_LOG", "info"),
    );
    primary.wait_line("2 workers ready");
    let _kill = KillOnDrop(wait_ready_pids(&log, 2));
    assert!(stats(addr)["cluster"] == true);
    let cont = ContOnDrop(primary.id() as i32);
    signal(primary.id() as i32, Signal::STOP);
    assert_eq!(get(addr, "/_nodus/healthz").status, 200);
    for path in ["/_nodus/stats", "/_nodus/metrics"] {
        let t = Instant::now();
        let r = get(addr, path);
        let took = t.elapsed();
        assert_eq!(
            (r.status, String::from_utf8_lossy(&r.body).into_owned()),
            (503, "cluster primary not answering\n".to_owned()),
            "{path}"
        );
        assert!(
            (Duration::from_secs(4)..Duration::from_secs(9)).contains(&took),
            "{path} after {took:?}"
        );
    }
    drop(cont);
    assert!(stats(addr)["cluster"] == true);
    let metrics = String::from_utf8(get(addr, "/_nodus/metrics").body).unwrap();
    assert!(metrics.contains("nodus_cluster_workers_up 2"), "{metrics}");
    primary.signal(Signal::TERM);
    assert_exit(&mut primary, Duration::from_secs(30), 0);
}

/// The next datagram on a service manager's end of `NOTIFY_SOCKET` (the test fails after its
/// read timeout).
fn next_notice(manager: &std::os::unix::net::UnixDatagram) -> String {
    let mut buf = [0u8; 4096];
    let n = common::recv_datagram(manager, &mut buf).expect("a notification in time");
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// The value of the sample `series` (name and labels, as printed) in a metrics text.
fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// A broken build deployed in place: the reload fails, and says so beyond the log (`READY=1`
/// with `STATUS=reload failed: ...` to the service manager, the reload counters and the
/// last-reload-failed gauge in the metrics, the stats); a worker that crashes afterwards comes
/// back running the serving generation's binary, not the broken one on disk, so the service
/// stays up. Fixed, the next reload is done, and says so too.
#[test]
fn a_failed_reload_is_told_and_a_crash_after_it_runs_the_serving_binary() {
    let dir = TempDir::new("reload-failed");
    let program = dir.path().join("nodus");
    common::cluster::copy_nodus(&program);
    let good = dir.path().join("nodus.good");
    let sock = dir.path().join("notify.sock");
    let manager = std::os::unix::net::UnixDatagram::bind(&sock).unwrap();
    manager
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let log = dir.path().join("events.jsonl");
    let (addr, admin) = (free_addr(), free_addr());
    let mut primary = spawn(
        Command::new(&program)
            .arg("serve")
            .arg(dir.path())
            .args(["--workers", "2", "--listen", &addr.to_string()])
            .args(["--admin", &admin.to_string(), "--events"])
            .arg(&log)
            .env("NOTIFY_SOCKET", &sock)
            .env("RUST_LOG", "info"),
    );
    while !next_notice(&manager).contains("READY=1") {}

    std::fs::rename(&program, &good).unwrap();
    std::fs::write(&program, "#!/bin/sh\necho broken build >&2\nexit 1\n").unwrap();
    std::fs::set_permissions(
        &program,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    primary.signal(Signal::HUP);
    while !next_notice(&manager).contains("RELOADING=1") {}
    let over = next_notice(&manager);
    assert!(
        over.lines().any(|l| l == "READY=1")
            && over.lines().any(|l| l.starts_with("STATUS=reload failed: ")
                && l.ends_with("; generation 0 still serving")),
        "{over:?}"
    );
    let metrics = String::from_utf8(get(admin, "/_nodus/metrics").body).unwrap();
    for (series, value) in [
        (r#"nodus_cluster_reloads_total{result="done"}"#, 0.0),
        (r#"nodus_cluster_reloads_total{result="failed"}"#, 1.0),
        ("nodus_cluster_last_reload_failed", 1.0),
    ] {
        assert_eq!(sample(&metrics, series), Some(value), "{series}: {metrics}");
    }
    let s = stats(admin);
    assert_eq!(
        s["reloads"],
        serde_json::json!({"done": 0, "failed": 1}),
        "{s}"
    );
    assert!(s["last_reload_failure"].is_string(), "{s}");

    // A crash now: the replacement is generation 0's binary (the broken one would crash-loop
    // the slot to the give-up, taking the other worker down with it).
    let victim = worker_pids(&s)[0];
    rustix::process::kill_process(Pid::from_raw(victim).unwrap(), Signal::KILL).unwrap();
    let evs = wait_events(&log, |e| count(e, "ready") == 3);
    let replacement = evs.iter().rev().find(|e| e["event"] == "ready").unwrap()["pid"]
        .as_u64()
        .unwrap();
    let exe = std::fs::read_link(format!("/proc/{replacement}/exe")).unwrap();
    assert_eq!(exe, good, "the replacement runs the serving binary");
    assert_eq!(get(addr, "/").status, 200);
    assert!(primary.exited_within(Duration::from_millis(500)).is_none());

    // The build fixed: the reload is done.
    std::fs::rename(&good, &program).unwrap();
    primary.signal(Signal::HUP);
    while !next_notice(&manager).contains("RELOADING=1") {}
    let over = next_notice(&manager);
    assert!(over.ends_with("READY=1\nSTATUS=serving"), "{over:?}");
    let metrics = String::from_utf8(get(admin, "/_nodus/metrics").body).unwrap();
    assert_eq!(
        sample(&metrics, r#"nodus_cluster_reloads_total{result="done"}"#),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(
        sample(&metrics, "nodus_cluster_last_reload_failed"),
        Some(0.0),
        "{metrics}"
    );
    assert!(stats(admin)["last_reload_failure"].is_null());
    primary.signal(Signal::TERM);
    assert_exit(&mut primary, Duration::from_secs(30), 0);
}
