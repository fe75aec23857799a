//! A cluster primary's `/_nodus/` endpoints at their edges: a worker stopped (SIGSTOP) before
//! the primary ever asked it for a snapshot is a stall in the stats, the metrics and `nodus top`;
//! Node workers, which never answer snapshot requests, are unknown, not stalled.
//!
//! Every process is started in its own process group and the whole group is killed by PID when
//! the test ends; a stopped worker gets SIGCONT, then SIGKILL, by PID whatever happens. Node is
//! needed for one test: under `CI` a missing one fails it, elsewhere it is skipped.

mod common;

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use common::cluster::{assert_exit, count, run_node_app, spawn, wait_events};
use common::http::get;
use common::{NODUS, have};
use nodus_testkit::net::free_addr;
use nodus_testkit::tmp::TempDir;
use nodus_testkit::tree::KillOnDrop;
use rustix::process::{Pid, Signal};
use serde_json::Value;

fn stats(admin: SocketAddr) -> Value {
    let r = get(admin, "/_nodus/stats");
    assert_eq!(r.status, 200);
    serde_json::from_slice(&r.body).unwrap()
}

fn signal(pid: i32, sig: Signal) {
    let _ = rustix::process::kill_process(Pid::from_raw(pid).unwrap(), sig);
}

/// SIGCONT to a stopped process when dropped (before its `KillOnDrop`, declared first).
struct ContOnDrop(i32);

impl Drop for ContOnDrop {
    fn drop(&mut self) {
        signal(self.0, Signal::CONT);
    }
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
    let ready = wait_events(&log, |e| count(e, "ready") == 2);
    let pids: Vec<u64> = ready
        .iter()
        .filter(|e| e["event"] == "ready")
        .map(|e| e["pid"].as_u64().unwrap())
        .collect();
    let (stopped, running) = (pids[0], pids[1]);
    let _kill = KillOnDrop(vec![stopped as i32]);
    let cont = ContOnDrop(stopped as i32);
    signal(stopped as i32, Signal::STOP);

    let doc = stats(admin);
    let worker = |pid: u64| {
        doc["workers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|w| w["pid"] == pid)
            .unwrap_or_else(|| panic!("no worker {pid} in {doc}"))
            .clone()
    };
    let (w, other) = (worker(stopped), worker(running));
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
