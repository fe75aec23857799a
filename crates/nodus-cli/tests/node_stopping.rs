//! What a `nodus run --node` worker that is asked to stop still has to do gets done, as under
//! Node's own primary (which never signals a disconnected worker): the output its stdout stream
//! still queues (Node writes to a pipe without blocking, so what the pipe has not taken waits in
//! the worker's memory) reaches the primary's stdout whole, at a reload and at a stop, the
//! worker exiting by itself; and a `disconnect` handler's flush to a collector finishes. A
//! worker's `process.send()` payload is kept in the event log only up to 64 KiB: past that, its
//! size alone.
//!
//! Node is needed: under `CI` a missing one fails the tests, elsewhere they are skipped. Every
//! primary is started in its own process group, and the whole group is killed by PID when the
//! test ends; the collector is a thread of the test, on 127.0.0.1.

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::Stdio;
use std::time::Duration;

use common::cluster::{assert_exit, count, events, node_app, spawn, wait_events};
use common::have;
use nodus_testkit::proc::Proc;
use nodus_testkit::tmp::TempDir;
use rustix::process::Signal;

/// A Node app that, once it listens, writes `LINES` lines of up to 100 KB to its stdout as fast
/// as its loop goes (each `PID:N xxx...x end`), then says `written` on stderr and sits idle (its
/// server keeps it alive). Its stdout stream queues what the pipe does not take.
const APP_WRITING: &str = r#"
const LINES = 300;
let i = 0;
function more() {
  for (let k = 0; k < 20 && i < LINES; k++, i++) {
    process.stdout.write(`${process.pid}:${i} ${'x'.repeat((i * 7919) % 100000)} end\n`);
  }
  if (i < LINES) setImmediate(more); else console.error('written');
}
require('http').createServer((q, r) => r.end('ok\n')).listen(+process.env.PORT, '127.0.0.1', more);
"#;

/// The lines `APP_WRITING` wrote to `out` (the primary's stdout), by pid: each line whole
/// (`[worker 1 PID] PID:N xxx...x end`, the right length), the numbers of each pid in order.
fn lines_by_pid(out: &str) -> BTreeMap<u32, Vec<usize>> {
    let mut by_pid: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
    for line in out.lines() {
        let short = &line[..line.len().min(80)];
        let (_, rest) = line
            .split_once("] ")
            .unwrap_or_else(|| panic!("not a worker's line: {short:?}"));
        let (tag, body) = rest.split_once(' ').unwrap();
        let (pid, n) = tag.split_once(':').unwrap();
        let (pid, n): (u32, usize) = (pid.parse().unwrap(), n.parse().unwrap());
        assert!(
            body.len() == (n * 7919) % 100000 + 4 && body.ends_with(" end"),
            "line {n} of {pid} cut: {short:?}... ({} bytes)",
            body.len()
        );
        by_pid.entry(pid).or_default().push(n);
    }
    by_pid
}

/// A worker's output still queued in its stdout stream when it is asked to stop reaches the
/// primary's stdout, all of it, whole: at a rolling reload (the old worker) and at the stop (the
/// new one). Each exits by itself once its stream is written (exit code 0), not killed by the
/// early SIGTERM of a worker that holds no inbound connection.
#[test]
fn with_node_the_output_a_stopped_worker_still_queues_reaches_stdout_whole() {
    if !have("node") {
        return;
    }
    let dir = TempDir::new("node-queued-output");
    let log = dir.path().join("events.jsonl");
    let out_path = dir.path().join("stdout.txt");
    let out = std::fs::File::create(&out_path).unwrap();
    let (_, mut cmd) = node_app(
        dir.path(),
        APP_WRITING,
        &["-w", "1", "--events", log.to_str().unwrap()],
    );
    let mut primary =
        Proc::spawn_group(cmd.stdin(Stdio::null()).stdout(out).stderr(Stdio::piped()));
    primary.wait_line("] written");
    primary.signal(Signal::HUP);
    let switched = primary.wait_line("reload to generation 1: worker 1 pid");
    let new_pid = switched
        .split("→ pid ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .unwrap_or_else(|| panic!("{switched}"));
    primary.wait_line("the old workers have exited");
    primary.wait_line(&format!("[worker 1 {new_pid}] written"));
    primary.signal(Signal::TERM);
    assert_exit(&mut primary, Duration::from_secs(30), 0);
    let by_pid = lines_by_pid(&std::fs::read_to_string(&out_path).unwrap());
    assert_eq!(by_pid.len(), 2, "{:?}", by_pid.keys());
    for (pid, numbers) in &by_pid {
        assert_eq!(
            numbers,
            &(0..300).collect::<Vec<_>>(),
            "worker {pid}: {} of 300 lines",
            numbers.len()
        );
    }
    let exits: Vec<_> = events(&log)
        .into_iter()
        .filter(|e| e["event"] == "exit")
        .collect();
    assert_eq!(exits.len(), 2, "{exits:#?}");
    for exit in &exits {
        assert_eq!(exit["code"], 0, "{exit}");
    }
}

/// A Node app that flushes to the collector at `COLLECTOR` in its `disconnect` handler (the
/// graceful exit Node's cluster offers) and says `flushed ok` once the collector answered.
const APP_FLUSHING: &str = r#"
const cluster = require('cluster'), http = require('http');
http.createServer((q, r) => r.end('ok\n')).listen(+process.env.PORT, '127.0.0.1');
cluster.worker.on('disconnect', () => {
  const req = http.request({ host: '127.0.0.1', port: +process.env.COLLECTOR, method: 'POST', path: '/flush' },
    res => { res.resume(); res.on('end', () => console.log('flushed ok')); });
  req.on('error', e => console.log('flush error', e.message));
  req.end('buffered events');
});
"#;

/// A stopped worker's `disconnect` handler that posts what it buffered to a collector (which
/// answers 200 ms later) gets its answer: it is not SIGTERMed in the middle of it (it holds no
/// inbound connection, only its outbound one), and exits by itself.
#[test]
fn with_node_a_flush_in_a_disconnect_handler_finishes() {
    if !have("node") {
        return;
    }
    let collector = TcpListener::bind("127.0.0.1:0").unwrap();
    let collector_port = collector.local_addr().unwrap().port();
    let collecting = std::thread::spawn(move || {
        let (mut conn, _) = collector.accept().unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while !got.ends_with(b"buffered events") {
            let n = conn.read(&mut buf).unwrap();
            assert!(n > 0, "{}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&buf[..n]);
        }
        std::thread::sleep(Duration::from_millis(200));
        conn.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n")
            .unwrap();
    });
    let dir = TempDir::new("node-flush");
    let log = dir.path().join("events.jsonl");
    let (_, mut cmd) = node_app(
        dir.path(),
        APP_FLUSHING,
        &["-w", "1", "--events", log.to_str().unwrap()],
    );
    let mut primary = spawn(cmd.env("COLLECTOR", collector_port.to_string()));
    primary.wait_line("1 worker ready");
    primary.signal(Signal::TERM);
    assert_exit(&mut primary, Duration::from_secs(30), 0);
    collecting.join().unwrap();
    assert!(
        primary.output().iter().any(|l| l.ends_with("] flushed ok")),
        "{:#?}",
        primary.output()
    );
    let exit = events(&log)
        .into_iter()
        .find(|e| e["event"] == "exit")
        .unwrap();
    assert_eq!(exit["code"], 0, "{exit}");
}

/// A Node app that sends a message of `BIG` bytes of JSON and a small one once it listens.
const APP_SENDING: &str = r#"
require('http').createServer((q, r) => r.end('ok\n')).listen(+process.env.PORT, '127.0.0.1', () => {
  process.send({ big: 'x'.repeat(+process.env.BIG - 10) });
  process.send({ small: 1 });
});
"#;

/// The event log keeps a worker's `process.send()` payload up to 64 KiB of JSON: a larger one is
/// its size and `"truncated": true`, without the JSON; a small one has both.
#[test]
fn with_node_the_event_log_keeps_a_message_payload_up_to_64_kib() {
    if !have("node") {
        return;
    }
    for (big, kept) in [(64 * 1024, true), (64 * 1024 + 1, false), (5 << 20, false)] {
        let dir = TempDir::new("node-messages");
        let log = dir.path().join("events.jsonl");
        let (_, mut cmd) = node_app(
            dir.path(),
            APP_SENDING,
            &["-w", "1", "--events", log.to_str().unwrap()],
        );
        let mut primary = spawn(cmd.env("BIG", big.to_string()));
        let evs = wait_events(&log, |e| count(e, "message") == 2);
        let messages: Vec<_> = evs.iter().filter(|e| e["event"] == "message").collect();
        let (large, small) = (messages[0], messages[1]);
        assert_eq!(large["bytes"], big, "{big}");
        if kept {
            assert_eq!(large["json"].as_str().map(str::len), Some(big), "{big}");
            assert!(large.get("truncated").is_none(), "{big}");
        } else {
            assert!(large.get("json").is_none(), "{big}");
            assert_eq!(large["truncated"], true, "{big}");
        }
        assert_eq!(small["json"], r#"{"small":1}"#);
        assert_eq!(small["bytes"], 11);
        assert!(small.get("truncated").is_none());
        let longest = std::fs::read_to_string(&log)
            .unwrap()
            .lines()
            .map(str::len)
            .max()
            .unwrap();
        assert!(longest < 64 * 1024 + 512, "a line of {longest} bytes");
        primary.signal(Signal::TERM);
        assert_exit(&mut primary, Duration::from_secs(30), 0);
    }
}
