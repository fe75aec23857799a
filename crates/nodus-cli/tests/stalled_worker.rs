//! A worker that stops taking the connections handed to it under rr (SIGSTOP here; a busy loop
//! is the same to the primary): after the handoff deadline (1 s) the primary takes them back and
//! hands them to another worker, so every client is answered, and no two processes ever serve
//! one connection, however close to the deadline the worker wakes up. A worker whose loop is
//! already known stalled (a readyz request, or the primary's own probe while it hands
//! connections, unanswered for 1 s) is handed nothing at all, so no client waits for it, and
//! takes connections again once it runs. A stock Node worker keeps only the one connection
//! already written to its channel. Under `--wait-ready`, a reload's new worker that has not said
//! it is ready gets no connection while a ready worker listens. A pause of the primary itself
//! (SIGSTOP here; a frozen VM is the same) stalls no worker that ran meanwhile.
//!
//! Every process is started in its own process group and the whole group is killed by PID when
//! the test ends; a stopped worker gets SIGCONT, then SIGKILL, by PID whatever happens, and a
//! stopped primary SIGCONT. Node is needed for three tests: under `CI` a missing one fails
//! them, elsewhere they are skipped.

mod common;

use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use common::cluster::{
    assert_exit, count, run_node_app, spawn, wait_events, wait_ready_pids, worker_entry,
};
use common::http::get;
use common::{NODUS, have};
use nodus_testkit::http::{Timeouts, connect, read_reply, write_request};
use nodus_testkit::net::free_addr;
use nodus_testkit::proc::Proc;
use nodus_testkit::tmp::TempDir;
use nodus_testkit::tree::KillOnDrop;
use rustix::process::{Pid, Signal};
use serde_json::Value;

/// A client's bounds: well past the handoff deadline, so a client left waiting is an error.
const TIMEOUTS: Timeouts = Timeouts {
    connect: Duration::from_secs(5),
    io: Duration::from_secs(8),
};

/// What `serve_two` serves at `/a.txt`.
const BODY: &str = "hello cluster\n";

fn signal(pid: i32, sig: Signal) {
    let _ = rustix::process::kill_process(Pid::from_raw(pid).unwrap(), sig);
}

/// Sends SIGCONT to a stopped worker when dropped (before its `KillOnDrop`, declared first).
struct ContOnDrop(i32);

impl Drop for ContOnDrop {
    fn drop(&mut self) {
        signal(self.0, Signal::CONT);
    }
}

/// `nodus serve --workers 2` (rr) with `--admin`, once both workers are ready: the directory, the
/// public and admin addresses, the primary and the workers' pids.
fn serve_two(tag: &str) -> (TempDir, SocketAddr, SocketAddr, Proc, [i32; 2]) {
    let dir = TempDir::new(tag);
    std::fs::write(dir.path().join("a.txt"), BODY).unwrap();
    let log = dir.path().join("events.jsonl");
    let (addr, admin) = (free_addr(), free_addr());
    let mut primary = spawn(
        Command::new(NODUS)
            .arg("serve")
            .arg(dir.path())
            .args(["--workers", "2", "--listen", &addr.to_string()])
            .args(["--admin", &admin.to_string(), "--events"])
            .arg(&log)
            .env("RUST_LOG", "info"),
    );
    primary.wait_line("2 workers ready");
    let pids = wait_ready_pids(&log, 2);
    (dir, addr, admin, primary, [pids[0], pids[1]])
}

/// The cluster's stats, and the entry of worker process `pid` in them.
fn worker_stats(admin: SocketAddr, pid: i32) -> Value {
    let doc: Value = serde_json::from_slice(&get(admin, "/_nodus/stats").body).unwrap();
    worker_entry(&doc, pid)
}

/// `GET /a.txt` on a new connection: answered in full within [`TIMEOUTS`], and how long it took.
fn get_a(addr: SocketAddr, i: usize) -> Duration {
    let t = Instant::now();
    let reply = nodus_testkit::http::request(addr, TIMEOUTS, "GET", "/a.txt", &[])
        .unwrap_or_else(|e| panic!("request {i}: {e} after {:?}", t.elapsed()));
    assert_eq!(reply.status, 200, "request {i}");
    assert_eq!(reply.body, BODY.as_bytes(), "request {i}");
    t.elapsed()
}

#[test]
fn a_stopped_workers_clients_are_answered_by_the_other_worker() {
    let (_dir, addr, admin, mut primary, [stopped, _running]) = serve_two("stall-rr");
    let _kill = KillOnDrop(vec![stopped]);
    let cont = ContOnDrop(stopped);
    signal(stopped, Signal::STOP);
    // The stopped worker, which took all it had (free to rr), is handed one of these (more
    // would wait behind it), which would wait for it for good: each is answered within the
    // deadline and a margin, and the others at once.
    for i in 0..20 {
        let took = get_a(addr, i);
        assert!(took < Duration::from_secs(4), "request {i} took {took:?}");
    }
    primary.wait_line("it gets no new connections until it runs again");
    let w = worker_stats(admin, stopped);
    let back = w["connections_taken_back"].as_u64().unwrap();
    assert!(back >= 1, "{w}");
    let metrics = String::from_utf8(get(admin, "/_nodus/metrics").body).unwrap();
    let series = format!(
        "nodus_cluster_worker_handoffs_taken_back_total{{worker=\"{}\",pid=\"{stopped}\"}} {back}",
        w["worker"]
    );
    assert!(metrics.contains(&series), "no {series:?} in\n{metrics}");

    // Woken, it has seen what was taken back and takes connections again.
    drop(cont);
    primary.wait_line("takes connections again");
    let handed = w["connections_handed"].as_u64().unwrap();
    for i in 0..10 {
        get_a(addr, i);
    }
    let w = worker_stats(admin, stopped);
    assert!(w["connections_handed"].as_u64().unwrap() > handed, "{w}");
    primary.signal(Signal::TERM);
    assert_exit(&mut primary, Duration::from_secs(30), 0);
}

/// Well past the handoff deadline (1 s) that a snapshot request must go unanswered for the
/// worker to be known stalled.
const KNOWN_STALLED_AFTER: Duration = Duration::from_secs(2);

/// `n` requests in a row, each answered in full (by whichever worker); how long each took.
fn get_many(addr: SocketAddr, n: usize) -> Vec<Duration> {
    (0..n).map(|i| get_a(addr, i)).collect()
}

/// Worker `stopped` is stopped and readyz, which asks each worker whether its loop runs (never
/// waiting for the answer), has made it known stalled: rr hands it nothing, so no client waits
/// for it (it would wait for the 1 s deadline, and be taken back: nothing is). Continued, it
/// answers, and takes connections again.
#[test]
fn a_worker_readyz_found_stalled_is_handed_nothing_until_it_runs_again() {
    let (_dir, addr, admin, mut primary, [stopped, _running]) = serve_two("stall-known");
    let _kill = KillOnDrop(vec![stopped]);
    let cont = ContOnDrop(stopped);
    signal(stopped, Signal::STOP);
    let readyz = get(admin, "/_nodus/readyz");
    assert_eq!(readyz.status, 200, "one worker of two runs");
    // Without the stall known, rr would hand the stopped worker, which took all it had, one.
    assert_kept_off(addr, admin, stopped, 0, &mut primary);

    drop(cont);
    primary.wait_line("takes connections again");
    get_many(addr, 10);
    let w = worker_stats(admin, stopped);
    assert!(w["connections_handed"].as_u64().unwrap() > 0, "{w}");
    primary.signal(Signal::TERM);
    assert_exit(&mut primary, Duration::from_secs(30), 0);
}

/// With no readyz request nor stats scrape, the primary learns of a stall from the probe it sends
/// its workers while it hands connections: after one request handed to worker X (rr then hands
/// the next to the other), X is stopped; the next request probes it, and once that probe has
/// gone unanswered for 1 s, X is handed nothing, however many come.
#[test]
fn a_stall_the_primary_probed_while_handing_keeps_connections_off_the_worker() {
    let (_dir, addr, admin, mut primary, pids) = serve_two("stall-probed");
    get_a(addr, 0);
    // Which worker took it (the stats ask both, which answer: no request stays unanswered).
    let deadline = Instant::now() + Duration::from_secs(10);
    let stopped = loop {
        let handed: Vec<(i32, u64)> = pids
            .iter()
            .map(|&p| {
                (
                    p,
                    worker_stats(admin, p)["connections_handed"]
                        .as_u64()
                        .unwrap(),
                )
            })
            .collect();
        if let Some(&(p, _)) = handed.iter().find(|(_, n)| *n == 1) {
            break p;
        }
        assert!(
            Instant::now() < deadline,
            "no worker took the request: {handed:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let _kill = KillOnDrop(vec![stopped]);
    let cont = ContOnDrop(stopped);
    // Past the 1 s since the stats asked, so the next handoff probes both workers.
    std::thread::sleep(Duration::from_millis(1200));
    signal(stopped, Signal::STOP);
    get_a(addr, 1);
    assert_kept_off(addr, admin, stopped, 1, &mut primary);
    drop(cont);
    primary.signal(Signal::TERM);
    assert_exit(&mut primary, Duration::from_secs(30), 0);
}

/// Reads one whole exchange on `s` (its request sent, `Connection: close`): exactly one `200`
/// response with [`BODY`], then end of file, within [`TIMEOUTS`].
fn exactly_one_response(mut s: TcpStream, what: &str) {
    let mut got = Vec::new();
    if let Err(e) = s.read_to_end(&mut got) {
        panic!("{what}: {e} after {:?}", String::from_utf8_lossy(&got));
    }
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 200 "), "{what}: {text:?}");
    assert!(text.ends_with(BODY), "{what}: {text:?}");
    assert_eq!(text.matches("HTTP/1.1 ").count(), 1, "{what}: {text:?}");
}

/// The worker wakes up (SIGCONT) from just before to just after the primary's deadline for the
/// connections handed to it, round after round: at the deadline both may be at it, the worker
/// adopting the batch and the primary taking it back. Each client sends the first line of its
/// request at once and the rest once both are done: had both processes taken the connection,
/// each would read from it, and a part read by the other one (a head starting with `Host:`)
/// would be answered 400, or the request never completed. Every client must get exactly one
/// 200 and the end of the connection.
#[test]
fn a_worker_waking_at_the_deadline_and_the_primary_never_both_serve_a_connection() {
    let (_dir, addr, admin, mut primary, [stopped, _running]) = serve_two("stall-race");
    let _kill = KillOnDrop(vec![stopped]);
    let _cont = ContOnDrop(stopped);
    let offsets_ms = [900, 950, 980, 995, 1000, 1003, 1006, 1010, 1020, 1050, 1100];
    for (round, offset) in offsets_ms.into_iter().enumerate() {
        signal(stopped, Signal::STOP);
        let t0 = Instant::now();
        // The stopped worker took all it had: rr hands it one (at least) of them.
        let conns: Vec<TcpStream> = (0..6)
            .map(|i| {
                let mut s = connect(addr, TIMEOUTS)
                    .unwrap_or_else(|e| panic!("round {round}, client {i}: {e}"));
                s.write_all(b"GET /a.txt HTTP/1.1\r\n").unwrap();
                s
            })
            .collect();
        std::thread::sleep(Duration::from_millis(offset).saturating_sub(t0.elapsed()));
        signal(stopped, Signal::CONT);
        std::thread::sleep(Duration::from_millis(1600).saturating_sub(t0.elapsed()));
        let conns: Vec<TcpStream> = conns
            .into_iter()
            .map(|mut s| {
                s.write_all(b"Host: t\r\nConnection: close\r\n\r\n")
                    .unwrap();
                s
            })
            .collect();
        for (i, s) in conns.into_iter().enumerate() {
            exactly_one_response(
                s,
                &format!("round {round} (SIGCONT at {offset} ms), client {i}"),
            );
        }
        // Long enough for the worker to be seen caught up before the next round.
        std::thread::sleep(Duration::from_millis(200));
    }
    let w = worker_stats(admin, stopped);
    assert!(
        w["connections_taken_back"].as_u64().unwrap() >= 1,
        "the worker always woke in time: nothing raced; {w}"
    );
    primary.signal(Signal::TERM);
    assert_exit(&mut primary, Duration::from_secs(30), 0);
}

/// An HTTP server that answers with its pid.
const NODE_PID_APP: &str = r#"
require('http')
  .createServer((req, res) => res.end(`pid ${process.pid}`))
  .listen(+process.env.PORT, '127.0.0.1');
"#;

/// A stopped Node worker under rr: its channel holds every `newconn` behind the one it has not
/// ACKed (Node's protocol, one handle in flight); the primary takes those back at the deadline,
/// and the other worker answers them. Only the one written to the stopped worker waits for it.
#[test]
fn a_stopped_node_worker_keeps_only_the_connection_written_to_its_channel() {
    if !have("node") {
        return;
    }
    let events = TempDir::new("stall-node-events");
    let log = events.path().join("events.jsonl");
    let log_arg = log.to_str().unwrap();
    let (_dir, addr, mut primary) =
        run_node_app("stall-node", NODE_PID_APP, 2, &["--events", log_arg]);
    let pids = wait_ready_pids(&log, 2);
    let (stopped, running) = (pids[0], pids[1]);
    let _kill = KillOnDrop(vec![stopped]);
    let cont = ContOnDrop(stopped);
    signal(stopped, Signal::STOP);
    let t0 = Instant::now();
    let clients: Vec<_> = (0..10)
        .map(|i| {
            let mut s = connect(addr, TIMEOUTS).unwrap();
            write_request(&mut s, "GET", "/", &["Connection: close"]).unwrap();
            std::thread::spawn(move || {
                // Bounded: the one left with the stopped worker is answered after its SIGCONT.
                s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                let reply = read_reply(&mut std::io::BufReader::new(s), false)
                    .unwrap_or_else(|e| panic!("client {i}: {e}"));
                (String::from_utf8(reply.body).unwrap(), t0.elapsed())
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(3));
    let answered_while_stopped = clients.iter().filter(|c| c.is_finished()).count();
    drop(cont);
    let replies: Vec<(String, Duration)> = clients.into_iter().map(|c| c.join().unwrap()).collect();
    assert!(
        answered_while_stopped >= replies.len() - 1,
        "{answered_while_stopped} of {} answered while a worker was stopped: {replies:?}",
        replies.len()
    );
    let from_running = replies
        .iter()
        .filter(|(body, _)| *body == format!("pid {running}"))
        .count();
    assert!(from_running >= replies.len() - 1, "{replies:?}");
    primary.wait_line("already sent stay with it");
    primary.signal(Signal::TERM);
    assert_exit(&mut primary, Duration::from_secs(30), 0);
}

/// An HTTP server that answers with its pid, and holds its loop for 800 ms (a CPU-bound
/// request: under the handoff deadline, so the primary never finds it stalled) before it answers
/// a request for `/block`, saying so first.
const NODE_BLOCK_APP: &str = r#"
require('http')
  .createServer((req, res) => {
    if (req.url === '/block') {
      console.log(`blocking pid ${process.pid}`);
      const end = Date.now() + 800;
      while (Date.now() < end);
    }
    res.end(`pid ${process.pid}`);
  })
  .listen(+process.env.PORT, '127.0.0.1');
"#;

/// `threads` clients, each sending `GET /` on a new connection, one after the other, for `run`:
/// every answer's body.
fn new_connections_for(addr: SocketAddr, threads: usize, run: Duration) -> Vec<String> {
    let end = Instant::now() + run;
    let clients: Vec<_> = (0..threads)
        .map(|t| {
            std::thread::spawn(move || {
                let mut bodies = Vec::new();
                while Instant::now() < end {
                    let reply = nodus_testkit::http::request(addr, TIMEOUTS, "GET", "/", &[])
                        .unwrap_or_else(|e| panic!("client {t}: {e}"));
                    bodies.push(String::from_utf8(reply.body).unwrap());
                    // Leaves some CPU to the cluster on a 2-core machine.
                    std::thread::sleep(Duration::from_millis(1));
                }
                bodies
            })
        })
        .collect();
    clients
        .into_iter()
        .flat_map(|c| c.join().unwrap())
        .collect()
}

/// While a Node worker's loop is held by a CPU-bound request, new connections go to the other
/// worker, as under Node's own round-robin (which hands a connection only to a worker that
/// answered its last `newconn`): the busy worker, which took its last connection (the one it is
/// busy with), gets one more, not every other one. From the moment the worker says it blocks
/// (and 50 ms more, well past any sign of it taking connections): a burst of eight connections
/// opened at once, of which it gets one at most (Node's primary hands it exactly one), then four
/// clients making a new connection per request for 400 ms, at least 80 % of them answered by
/// the other worker; every one is answered.
#[test]
fn a_node_worker_whose_loop_is_busy_is_handed_no_new_connection_while_the_other_is_free() {
    if !have("node") {
        return;
    }
    let (_dir, addr, mut primary) = run_node_app("busy-node", NODE_BLOCK_APP, 2, &[]);
    let blocker = std::thread::spawn(move || {
        nodus_testkit::http::request(addr, TIMEOUTS, "GET", "/block", &[])
            .map(|r| String::from_utf8(r.body).unwrap())
    });
    let line = primary.wait_line("blocking pid ");
    let blocked = format!("pid {}", line.rsplit(' ').next().unwrap());
    std::thread::sleep(Duration::from_millis(50));
    let burst = nodus_testkit::http::burst(addr, 8, TIMEOUTS);
    let bodies = new_connections_for(addr, 4, Duration::from_millis(400));
    let burst: Vec<String> = (burst.join().unwrap().into_iter())
        .map(|reply| String::from_utf8(reply.body).unwrap())
        .collect();
    assert_eq!(
        blocker.join().unwrap().expect("/block is answered"),
        blocked
    );
    let burst_held = burst.iter().filter(|b| **b == blocked).count();
    assert!(burst_held <= 1, "{blocked} is busy: {burst:?}");
    let held = bodies.iter().filter(|b| **b == blocked).count();
    assert!(
        (bodies.len() - held) * 5 >= bodies.len() * 4,
        "at least 80% of new connections go to the free worker while {blocked} is busy: {held} \
         of {} went to it",
        bodies.len()
    );
    primary.signal(Signal::TERM);
    assert_exit(&mut primary, Duration::from_secs(30), 0);
}

/// A Node app that says it is ready (`process.send('ready')`) only while the file `MODE_DIR/mode`
/// says `v1` when it starts, and answers with that mode.
const NODE_READY_APP: &str = r#"
const mode = require('fs').readFileSync(`MODE_DIR/mode`, 'utf8').trim();
require('http')
  .createServer((req, res) => res.end(mode))
  .listen(+process.env.PORT, '127.0.0.1', () => { if (mode === 'v1') process.send('ready'); });
"#;

/// During a reload under `--wait-ready`, the new worker listens but never says it is ready: the
/// ready old workers get every connection (a broken build that accepts but never says it is
/// ready serves no client).
#[test]
fn a_reloads_worker_that_has_not_said_it_is_ready_gets_no_connection() {
    if !have("node") {
        return;
    }
    let events = TempDir::new("not-ready-events");
    let log = events.path().join("events.jsonl");
    let log_arg = log.to_str().unwrap();
    let dir = TempDir::new("not-ready-mode");
    let app = NODE_READY_APP.replace("MODE_DIR", dir.path().to_str().unwrap());
    std::fs::write(dir.path().join("mode"), "v1").unwrap();
    let (_app_dir, addr, mut primary) = run_node_app(
        "not-ready",
        &app,
        2,
        &["--wait-ready", "--ready-timeout", "5", "--events", log_arg],
    );
    std::fs::write(dir.path().join("mode"), "v2").unwrap();
    primary.signal(Signal::HUP);
    // The new worker listens (a member of the listener) but never says it is ready.
    wait_events(&log, |e| count(e, "listening") >= 3);
    let mut seen = Vec::new();
    for _ in 0..12 {
        let reply = nodus_testkit::http::request(addr, TIMEOUTS, "GET", "/", &[]).unwrap();
        seen.push(String::from_utf8(reply.body).unwrap());
    }
    assert!(seen.iter().all(|m| m == "v1"), "{seen:?}");
    primary.signal(Signal::TERM);
    assert_exit(&mut primary, Duration::from_secs(30), 0);
}

/// Once the primary has had time to know `stopped` is stalled, ten requests are answered without
/// any going to it: none taken back (none waited out a handoff's deadline) and still `handed`
/// handed to it; the primary said the stall.
fn assert_kept_off(
    addr: SocketAddr,
    admin: SocketAddr,
    stopped: i32,
    handed: u64,
    primary: &mut Proc,
) {
    std::thread::sleep(KNOWN_STALLED_AFTER);
    let took = get_many(addr, 10);
    let w = worker_stats(admin, stopped);
    assert_eq!(
        w["connections_taken_back"], 0,
        "{w}; requests took {took:?}"
    );
    assert_eq!(w["connections_handed"], handed, "{w}");
    primary.wait_line("has not answered the primary for 1s");
}

/// How long the tests below stop the primary: past the handoff deadline (1 s) that everything
/// it sent just before waits for.
const PRIMARY_PAUSE: Duration = Duration::from_millis(1500);

/// What the primary says when it finds a worker stalled, and when that one runs again.
const STALL_LINES: [&str; 2] = ["its loop is blocked or stopped", "takes connections again"];

/// Stops `primary` (SIGTERM, exit code 0) and asserts it never said a worker stalled.
fn assert_no_stall_said(primary: &mut Proc) {
    primary.signal(Signal::TERM);
    assert_exit(primary, Duration::from_secs(30), 0);
    let said: Vec<&String> = primary
        .output()
        .iter()
        .filter(|l| STALL_LINES.iter().any(|s| l.contains(s)))
        .collect();
    assert!(said.is_empty(), "a worker said stalled: {said:#?}");
}

/// The primary itself is stopped for [`PRIMARY_PAUSE`] while its workers run: when it resumes,
/// its clock has jumped, and what the workers sent meanwhile (the answers to its probes) waits
/// in its sockets for its poll phase, which may come after its timers (whether it does depends
/// on where the stop caught the primary: three rounds). No worker is said stalled nor has
/// anything taken back, and readyz, asked during the pause, answers 200 at once. So that probes
/// and handoffs are in flight when the primary stops, the workers are stopped for a moment
/// first (far under the deadline): the handoffs and readyz probe them, and two clients are
/// handed to them, one each (a third would wait in the primary, round-robin handing nothing
/// more to workers that have not taken what they have, and be served only once it runs). They
/// run again once the primary is stopped, and serve those clients while it still is.
#[test]
fn a_pause_of_the_primary_itself_stalls_no_worker_that_answered_during_it() {
    let (_dir, addr, admin, mut primary, workers) = serve_two("stall-primary-paused");
    let _kill = KillOnDrop(workers.to_vec());
    let _cont = workers.map(ContOnDrop);
    for round in 0..3 {
        // Past 1 s since the workers were last asked: the handoffs and readyz probe them.
        std::thread::sleep(Duration::from_millis(1100));
        let primary_cont = ContOnDrop(primary.id() as i32);
        for w in workers {
            signal(w, Signal::STOP);
        }
        let clients: Vec<TcpStream> = (0..2)
            .map(|i| {
                let mut s = connect(addr, TIMEOUTS)
                    .unwrap_or_else(|e| panic!("round {round}, client {i}: {e}"));
                write_request(&mut s, "GET", "/a.txt", &["Connection: close"]).unwrap();
                s
            })
            .collect();
        assert_eq!(get(admin, "/_nodus/readyz").status, 200, "round {round}");
        // The primary hands the clients over in the loop turn that accepts them, readyz's at
        // the latest: a wide margin.
        std::thread::sleep(Duration::from_millis(50));
        signal(primary.id() as i32, Signal::STOP);
        let paused = Instant::now();
        for w in workers {
            signal(w, Signal::CONT);
        }
        for (i, s) in clients.into_iter().enumerate() {
            let what = format!("round {round}, client {i}, while the primary is stopped");
            exactly_one_response(s, &what);
        }
        let mut readyz = connect(admin, TIMEOUTS).unwrap();
        write_request(&mut readyz, "GET", "/_nodus/readyz", &["Connection: close"]).unwrap();
        std::thread::sleep(PRIMARY_PAUSE.saturating_sub(paused.elapsed()));
        drop(primary_cont);
        let reply = read_reply(&mut BufReader::new(readyz), false).unwrap();
        let body = String::from_utf8_lossy(&reply.body);
        assert_eq!(reply.status, 200, "round {round}, readyz on resume: {body}");
    }
    // A stall found late would be found by now: what the primary waits for is 1 s old at most.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(get(admin, "/_nodus/readyz").status, 200);
    for w in workers {
        let stats = worker_stats(admin, w);
        assert_eq!(stats["connections_taken_back"], 0, "{stats}");
    }
    assert_no_stall_said(&mut primary);
}

/// The same pause with stock Node workers, whose answers are `accepted` messages, one `newconn`
/// at a time (their channel holds any more until the one written is acknowledged): six clients
/// come while the workers are stopped for a moment, each worker is handed one (the rest wait in
/// the primary, round-robin handing nothing more to workers that have not taken what they have),
/// the primary is stopped, and the workers take the one written to each meanwhile. Once the
/// primary runs again, the ones it held go out as the workers answer: none counts the pause
/// against the worker, none is taken back, no worker is said stalled, and every client is
/// answered.
#[test]
fn a_pause_of_the_primary_itself_stalls_no_node_worker_that_took_its_connection_during_it() {
    if !have("node") {
        return;
    }
    let events = TempDir::new("pause-node-events");
    let log = events.path().join("events.jsonl");
    let log_arg = log.to_str().unwrap();
    let (_dir, addr, mut primary) =
        run_node_app("pause-node", NODE_PID_APP, 2, &["--events", log_arg]);
    let workers = wait_ready_pids(&log, 2);
    let _kill = KillOnDrop(workers.clone());
    let _cont: Vec<ContOnDrop> = workers.iter().map(|&w| ContOnDrop(w)).collect();
    let primary_cont = ContOnDrop(primary.id() as i32);
    for &w in &workers {
        signal(w, Signal::STOP);
    }
    let clients: Vec<_> = (0..6)
        .map(|i| {
            let mut s = connect(addr, TIMEOUTS).unwrap_or_else(|e| panic!("client {i}: {e}"));
            write_request(&mut s, "GET", "/", &["Connection: close"]).unwrap();
            std::thread::spawn(move || {
                s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                let reply = read_reply(&mut BufReader::new(s), false)
                    .unwrap_or_else(|e| panic!("client {i}: {e}"));
                String::from_utf8(reply.body).unwrap()
            })
        })
        .collect();
    // The primary accepts and hands them over within a loop turn: a wide margin.
    std::thread::sleep(Duration::from_millis(100));
    signal(primary.id() as i32, Signal::STOP);
    let paused = Instant::now();
    for &w in &workers {
        signal(w, Signal::CONT);
    }
    std::thread::sleep(PRIMARY_PAUSE.saturating_sub(paused.elapsed()));
    drop(primary_cont);
    let replies: Vec<String> = clients.into_iter().map(|c| c.join().unwrap()).collect();
    assert!(replies.iter().all(|r| r.starts_with("pid ")), "{replies:?}");
    // A stall found late would be found by now: what the primary waits for is 1 s old at most.
    std::thread::sleep(Duration::from_millis(1500));
    assert_no_stall_said(&mut primary);
}
