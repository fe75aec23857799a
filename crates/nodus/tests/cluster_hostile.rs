//! A cluster primary facing a worker that speaks the `NODE_CLUSTER` protocol badly or with
//! intent: garbage messages (unknown `act`, missing fields, wrong types, `listening` before
//! `online`, answers to `seq` numbers never sent), `queryServer` for absurd addresses, the same
//! `queryServer` a thousand times, a flood of listeners, requests from a worker that never reads
//! the answers, a flood of stats requests, and snapshots that are not snapshots (malformed, huge,
//! with duplicate series). Each test asserts the primary's exact answers and that an honest
//! worker beside the hostile one is still served, its metrics and stats intact (DESIGN.md
//! section 9: bad input gets a clear error and costs nothing else). Beside them, a snapshot
//! shaped like a newer build's (more task classes, phases, stalls and buckets than this build
//! keeps, fields it does not know, one it lacks), which a rolling reload brings: served.
//! And snapshots within the limits but too big together for the one IPC frame that relays the
//! cluster's stats to a worker: the worker gets them with the largest left out, said so. And a
//! stall of the primary's own loop while its workers answer: none of them looks silent.
//!
//! A worker is this test binary run again (the variable [`ROLE`] says which role, filtered to
//! the same test); slot 1 is an honest nodus worker, the other slots hostile ones, which speak
//! the protocol by hand and write what they saw to files in the test's directory. Bounded: every
//! wait has a deadline; the workers die with the test process (PDEATHSIG) and are drained by a
//! shutdown at the end. The primary is this process, so the tests that count its fds run one at
//! a time.

mod common;

use std::cell::RefCell;
use std::io::{Read, Write};
use std::os::fd::FromRawFd;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nodus::cluster::{Config, Event, EventKind, Policy, Primary, Readiness, Worker, WorkerCommand};
use nodus::ipc::Channel;
use nodus::metrics::{PhaseSnapshot, Snapshot, StallCounts, StallReport, TaskClassSnapshot};
use nodus_testkit::fds::open_fds;
use serde_json::Value;
use serde_json::value::RawValue;

/// Set in a worker this binary starts from itself: the worker role to play.
const ROLE: &str = "NODUS_TEST_WORKER_ROLE";
/// The directory a worker shares with its test (files as signals and results).
const DIR: &str = "NODUS_TEST_DIR";

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

type Events = Rc<RefCell<Vec<Event>>>;

/// A primary of `workers` copies of this test binary playing `role` (filtered to `test`), with a
/// pre-bound listener on 127.0.0.1 (its port in `PORT`) under `policy`; its events recorded and
/// its `run` spawned.
struct Cluster {
    primary: Primary,
    events: Events,
    run: nodus::JoinHandle<i32>,
    addr: std::net::SocketAddr,
}

impl Cluster {
    fn start(test: &str, role: &str, workers: usize, policy: Policy, dir: &Path) -> Cluster {
        let listener = nodus::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let command = WorkerCommand {
            program: std::env::current_exe().unwrap(),
            args: vec![test.into(), "--exact".into(), "--nocapture".into()],
            env: vec![
                (ROLE.into(), role.into()),
                (DIR.into(), dir.as_os_str().to_owned()),
                ("PORT".into(), addr.port().to_string().into()),
            ],
            ipc: true,
        };
        let mut config = Config::new(workers, command);
        config.policy = policy;
        config.listeners.push(("http".into(), listener));
        config.readiness = Readiness::Message;
        config.prefix_output = false;
        config.drain_timeout = Duration::from_secs(2);
        config.kill_timeout = Duration::from_secs(5);
        let primary = Primary::start(config).expect("the test binary runs");
        let events: Events = Rc::default();
        let sink = events.clone();
        primary.on_event(move |e| sink.borrow_mut().push(e.clone()));
        let p = primary.clone();
        let run = nodus::spawn(async move { p.run().await });
        Cluster {
            primary,
            events,
            run,
            addr,
        }
    }

    /// Waits (at most 30 s) until the events satisfy `what`.
    async fn wait_until(&self, what: impl Fn(&[Event]) -> bool) {
        for _ in 0..3000 {
            if what(&self.events.borrow()) {
                return;
            }
            nodus::sleep(Duration::from_millis(10)).await;
        }
        panic!("timed out; events: {:#?}", self.events.borrow());
    }

    /// Waits until `n` workers were ready.
    async fn ready(&self, n: usize) {
        self.wait_until(|ev| {
            ev.iter()
                .filter(|e| matches!(e.kind, EventKind::Ready))
                .count()
                == n
        })
        .await;
    }

    /// The metrics text and the stats document once the first `n` workers answer in both (again
    /// if a loaded machine made a worker miss the primary's 500 ms; at most 10 tries).
    async fn metrics_and_stats(&self, n: usize) -> (String, Value) {
        let (mut text, mut stats) = (String::new(), Value::Null);
        for _ in 0..10 {
            text = self.primary.metrics_text().await;
            stats = serde_json::from_str(&self.primary.stats_json().await).unwrap();
            if (0..n).all(|i| stats["workers"][i]["answering"] == true) {
                break;
            }
            nodus::sleep(Duration::from_millis(1100)).await;
        }
        (text, stats)
    }

    /// Waits until worker `slot` sent the application message `json`.
    async fn message_from(&self, slot: u32, json: &str) {
        self.wait_until(|ev| {
            ev.iter().any(|e| {
                e.worker == Some(slot)
                    && matches!(&e.kind, EventKind::Message { json: j, .. } if j == json)
            })
        })
        .await;
    }

    /// Shuts the primary down; it must exit 0 (within 20 s).
    async fn shut_down(self) {
        self.primary.shutdown();
        self.ended().await;
    }

    /// Waits for the shutdown under way to end (within 20 s); it must exit 0.
    async fn ended(self) {
        self.ended_with(0).await;
    }

    /// Waits for the shutdown under way to end (within 20 s) with exit code `expected`.
    async fn ended_with(self, expected: i32) {
        let code = nodus::timeout(Duration::from_secs(20), self.run)
            .await
            .expect("shutdown finishes")
            .unwrap();
        assert_eq!(code, expected);
    }
}

/// Runs the test body on a fresh loop, bounded in time.
fn bounded(f: impl AsyncFnOnce()) {
    nodus::Runtime::new().block_on(async {
        nodus::timeout(Duration::from_secs(120), f())
            .await
            .expect("test timed out")
    });
}

/// Waits (polling, at most 30 s) until `path` exists.
fn file_appears(path: &Path) -> bool {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if path.exists() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// [`file_appears`] without blocking the loop.
async fn file_appears_async(path: &Path) -> bool {
    for _ in 0..3000 {
        if path.exists() {
            return true;
        }
        nodus::sleep(Duration::from_millis(10)).await;
    }
    false
}

/// Writes `text` to `dir/name` at once (written aside, then renamed).
fn put(dir: &Path, name: &str, text: &str) {
    let tmp = dir.join(format!("{name}.tmp"));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(tmp, dir.join(name)).unwrap();
}

/// What a worker wrote to `dir/name` (waited for without blocking the primary's loop).
async fn read(dir: &Path, name: &str) -> String {
    assert!(
        file_appears_async(&dir.join(name)).await,
        "no {name} from the worker"
    );
    std::fs::read_to_string(dir.join(name)).unwrap()
}

/// The test's directory, in a worker.
fn worker_dir() -> PathBuf {
    PathBuf::from(std::env::var_os(DIR).expect("the test sets the dir"))
}

fn worker_addr() -> std::net::SocketAddr {
    let port: u16 = std::env::var("PORT").unwrap().parse().unwrap();
    ([127, 0, 0, 1], port).into()
}

fn slot() -> u32 {
    std::env::var("NODUS_WORKER_ID").unwrap().parse().unwrap()
}

/// Slot 1: a nodus worker that listens on the pre-bound address, says so with the file
/// `honest-listening`, answers `hi` on every connection and leaves at the drain.
fn honest_worker() -> ! {
    let dir = worker_dir();
    let code = nodus::Runtime::new().block_on(async move {
        let worker = Worker::get().unwrap().expect("started as a cluster worker");
        let listener = worker.listen(worker_addr()).await.unwrap();
        put(&dir, "honest-listening", "");
        worker.ready();
        let serving = nodus::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let _ = stream.write_all(b"hi\n").await;
            }
        });
        worker.drain_requested().await;
        serving.abort();
        0
    });
    std::process::exit(code);
}

/// In a worker this binary started for `role` (see [`ROLE`]), plays it and never returns: slot 1
/// the honest worker when `beside_honest`, every other slot `hostile`. Elsewhere returns at once.
fn play(role: &str, beside_honest: bool, hostile: fn() -> !) {
    if std::env::var(ROLE).as_deref() == Ok(role) {
        if beside_honest && slot() == 1 {
            honest_worker();
        }
        hostile();
    }
}

/// Sends `text` as it is (one frame).
fn send(ch: &Channel, text: &str) {
    ch.send(&RawValue::from_string(text.to_owned()).unwrap())
        .unwrap();
}

/// A nodus-speaking worker's channel, once it said `online` (a nodus worker) and `ready`.
fn online_and_ready() -> Channel {
    let ch = Channel::from_env()
        .unwrap()
        .expect("started with a channel");
    send(
        &ch,
        r#"{"cmd":"NODE_CLUSTER","act":"online","seq":0,"nodus":1}"#,
    );
    send(&ch, r#"{"cmd":"NODE_NODUS","act":"ready"}"#);
    ch
}

/// The next internal message from the primary, as JSON (at most 10 s).
async fn next(ch: &Channel) -> Value {
    let msg = nodus::timeout(Duration::from_secs(10), ch.recv_internal())
        .await
        .expect("the primary answers")
        .expect("the channel is open");
    serde_json::from_str(msg.json()).unwrap()
}

/// Waits for the primary's `disconnect`, then exits 0.
async fn until_disconnect(ch: &Channel) -> ! {
    while let Some(msg) = ch.recv_internal().await {
        if msg.json().contains("\"disconnect\"") {
            break;
        }
    }
    std::process::exit(0);
}

/// A `queryServer` as Node's worker writes it.
fn query(seq: u64, address: &str, port: i64) -> String {
    format!(
        r#"{{"cmd":"NODE_CLUSTER","act":"queryServer","index":0,"data":null,"address":{},"port":{port},"addressType":4,"flags":0,"backlog":511,"seq":{seq}}}"#,
        serde_json::to_string(address).unwrap()
    )
}

/// A client's greeting from whichever worker got its connection.
fn greeting(addr: std::net::SocketAddr) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = [0u8; 3];
    s.read_exact(&mut buf).unwrap();
    String::from_utf8(buf.to_vec()).unwrap()
}

/// A worker beside the honest one is served: a client gets its `hi`.
async fn honest_serves(addr: std::net::SocketAddr) {
    let greeted = nodus::pool::offload_io(move || greeting(addr))
        .await
        .unwrap();
    assert_eq!(greeted, "hi\n");
}

// ---------------------------------------------------------------------------------------------

/// Slot 2 of the test below: garbage, then `queryServer`s for absurd addresses; writes every
/// answer it got (`answers`, one JSON per line), then leaves the listener it was given.
fn garbage_worker() -> ! {
    let dir = worker_dir();
    nodus::Runtime::new().block_on(async move {
        let ch = Channel::from_env()
            .unwrap()
            .expect("started with a channel");
        assert!(file_appears_async(&dir.join("honest-listening")).await);
        let deep = format!("{}{}", "[".repeat(5000), "]".repeat(5000));
        let long = "x".repeat(100_000);
        let garbage = [
            // `listening` before `online`, then an `online` with a deeply nested unknown field.
            r#"{"cmd":"NODE_CLUSTER","act":"listening","address":"127.0.0.1","port":1,"seq":1}"#
                .to_owned(),
            format!(r#"{{"cmd":"NODE_CLUSTER","act":"online","seq":2,"junk":{deep}}}"#),
            // Unknown acts, no act, acts of the wrong type, no cmd.
            r#"{"cmd":"NODE_CLUSTER","act":"frobnicate","seq":3}"#.to_owned(),
            r#"{"cmd":"NODE_NODUS","act":"frobnicate","seq":4}"#.to_owned(),
            r#"{"cmd":"NODE_CLUSTER"}"#.to_owned(),
            r#"{"cmd":"NODE_CLUSTER","act":7,"seq":5}"#.to_owned(),
            r#"{"cmd":"NODE_CLUSTER","act":null,"ack":null}"#.to_owned(),
            // Fields of the wrong type: dropped whole (no answer).
            query(6, "127.0.0.1", 0).replace("\"seq\":6", "\"seq\":\"6\""),
            query(7, "127.0.0.1", 0).replace("\"flags\":0", "\"flags\":-1"),
            query(8, "127.0.0.1", 0)
                .replace("\"addressType\":4", &format!("\"addressType\":{deep}")),
            // Answers to seq numbers never sent, and handoff acks for nothing handed.
            r#"{"cmd":"NODE_CLUSTER","ack":999,"accepted":true,"seq":9}"#.to_owned(),
            r#"{"cmd":"NODE_CLUSTER","ack":998,"accepted":false,"seq":10}"#.to_owned(),
            r#"{"cmd":"NODE_NODUS","act":"took","ack":18446744073709551615}"#.to_owned(),
            r#"{"cmd":"NODE_NODUS","act":"took","ack":-1}"#.to_owned(),
            r#"{"cmd":"NODE_NODUS","act":"refused","ack":12345}"#.to_owned(),
            r#"{"cmd":"NODE_NODUS","act":"load","conns":18446744073709551615,"acceptedTotal":0}"#
                .to_owned(),
            r#"{"cmd":"NODE_NODUS","act":"snapshot","id":424242,"snapshot":{}}"#.to_owned(),
            r#"{"cmd":"NODE_NODUS","act":"returned","key":"nope","seq":11,"peers":[]}"#.to_owned(),
            r#"{"cmd":"NODE_CLUSTER","act":"close","key":"nope","seq":12}"#.to_owned(),
            r#"{"cmd":"NODE_CLUSTER","act":"close","seq":13}"#.to_owned(),
            // A queryServer without a seq: nothing to answer to.
            query(0, "127.0.0.1", 0).replace(",\"seq\":0", ""),
        ];
        for text in &garbage {
            send(&ch, text);
        }
        // Absurd addresses, each answered with an error (Node's workers read a negative errno).
        for (seq, address, port) in [
            (20, "not-an-ip", 80),
            (21, "999.1.1.1", 80),
            (22, "", 80),
            (23, long.as_str(), 80),
            (24, "/tmp/a-pipe", -1),
            (25, "127.0.0.1", 70000),
            (26, "127.0.0.1", -5),
            (27, "192.0.2.1", 0),
            (28, "fe80::1%no-such-if", 80),
        ] {
            send(&ch, &query(seq, address, port));
        }
        // Then a well-formed one, for the pre-bound listener.
        send(&ch, &query(29, "127.0.0.1", worker_addr().port() as i64));
        let mut answers = String::new();
        loop {
            let v = next(&ch).await;
            answers.push_str(&format!("{v}\n"));
            if v["ack"] == 29 {
                break;
            }
        }
        put(&dir, "answers", &answers);
        let key = format!("127.0.0.1:{}:4:undefined:0", worker_addr().port());
        send(
            &ch,
            &format!(r#"{{"cmd":"NODE_CLUSTER","act":"close","key":"{key}","seq":30}}"#),
        );
        send(&ch, r#""left""#);
        until_disconnect(&ch).await
    })
}

#[test]
fn garbage_and_absurd_addresses_get_exact_answers_and_the_honest_worker_is_served() {
    const NAME: &str =
        "garbage_and_absurd_addresses_get_exact_answers_and_the_honest_worker_is_served";
    play("garbage", true, garbage_worker);
    let _serial = serial();
    let dir = nodus_testkit::tmp::TempDir::new("hostile-garbage");
    bounded(async || {
        let c = Cluster::start(NAME, "garbage", 2, Policy::RoundRobin, dir.path());
        c.message_from(2, r#""left""#).await;
        let port = c.addr.port();
        let answers: Vec<Value> = read(dir.path(), "answers")
            .await
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let got: Vec<(u64, Value, String)> = answers
            .iter()
            .map(|v| {
                assert_eq!(v["cmd"], "NODE_CLUSTER", "{v}");
                (
                    v["ack"].as_u64().unwrap(),
                    v["errno"].clone(),
                    v["key"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        let key = |a: &str, p: i64| format!("{a}:{p}:4:undefined:0");
        let (eafnosupport, einval, eaddrnotavail) = (-97, -22, -99);
        let want: Vec<(u64, Value, String)> = vec![
            (20, eafnosupport.into(), key("not-an-ip", 80)),
            (21, eafnosupport.into(), key("999.1.1.1", 80)),
            (22, eafnosupport.into(), key("", 80)),
            (23, eafnosupport.into(), key(&"x".repeat(100_000), 80)),
            (24, eafnosupport.into(), key("/tmp/a-pipe", -1)),
            (25, einval.into(), key("127.0.0.1", 70000)),
            (26, einval.into(), key("127.0.0.1", -5)),
            (27, eaddrnotavail.into(), key("192.0.2.1", 0)),
            (28, eafnosupport.into(), key("fe80::1%no-such-if", 80)),
            (29, Value::Null, key("127.0.0.1", port.into())),
        ];
        assert_eq!(got.len(), want.len(), "answers: {answers:#?}");
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g, w);
        }
        assert_eq!(answers[9]["sockname"]["port"], port, "{}", answers[9]);

        // The garbage cost nothing: the worker was seen listening and online, and the honest
        // worker serves.
        let pid2 = c.primary.worker_pids()[1].1;
        let kinds: Vec<&'static str> = c
            .events
            .borrow()
            .iter()
            .filter(|e| e.pid == Some(pid2))
            .filter_map(|e| match e.kind {
                EventKind::Listening { .. } => Some("listening"),
                EventKind::Online => Some("online"),
                EventKind::Exit { .. } => Some("exit"),
                _ => None,
            })
            .collect();
        assert_eq!(kinds, ["listening", "online"]);
        for _ in 0..4 {
            honest_serves(c.addr).await;
        }
        let stats: Value = serde_json::from_str(&c.primary.stats_json().await).unwrap();
        assert_eq!(stats["workers"].as_array().unwrap().len(), 2);
        c.shut_down().await;
    });
}

// ---------------------------------------------------------------------------------------------

/// Slot 2 of the test below: asks for the pre-bound listener a thousand times, as a Node worker
/// (one `newconn` per connection), says it is ready (file `hostile-ready`), and answers every
/// connection it is handed with `no`.
fn repeating_worker() -> ! {
    let dir = worker_dir();
    nodus::Runtime::new().block_on(async move {
        let ch = Channel::from_env()
            .unwrap()
            .expect("started with a channel");
        assert!(file_appears_async(&dir.join("honest-listening")).await);
        send(&ch, r#"{"cmd":"NODE_CLUSTER","act":"online","seq":0}"#);
        let port = worker_addr().port() as i64;
        for seq in 1..=1000 {
            send(&ch, &query(seq, "127.0.0.1", port));
        }
        let mut answered = 0;
        while answered < 1000 {
            let v = next(&ch).await;
            assert!(v["errno"].is_null(), "{v}");
            answered += 1;
        }
        send(&ch, r#"{"cmd":"NODE_NODUS","act":"ready"}"#);
        put(&dir, "hostile-ready", "");
        let mut own = 10_000;
        while let Some(mut msg) = ch.recv_internal().await {
            let v: Value = serde_json::from_str(msg.json()).unwrap();
            match v["act"].as_str() {
                Some("newconn") => {
                    let fd = msg.take_handle().expect("a connection").into_owned_fd();
                    let mut s = std::net::TcpStream::from(fd);
                    s.set_nonblocking(false).unwrap();
                    let _ = s.write_all(b"no\n");
                    own += 1;
                    send(
                        &ch,
                        &format!(
                            r#"{{"cmd":"NODE_CLUSTER","ack":{},"accepted":true,"seq":{own}}}"#,
                            v["seq"]
                        ),
                    );
                }
                Some("disconnect") => break,
                _ => {}
            }
        }
        std::process::exit(0);
    })
}

#[test]
fn a_worker_asking_for_one_listener_a_thousand_times_gets_one_share() {
    const NAME: &str = "a_worker_asking_for_one_listener_a_thousand_times_gets_one_share";
    play("repeating", true, repeating_worker);
    let _serial = serial();
    let dir = nodus_testkit::tmp::TempDir::new("hostile-repeating");
    bounded(async || {
        let c = Cluster::start(NAME, "repeating", 2, Policy::RoundRobin, dir.path());
        assert!(file_appears_async(&dir.path().join("hostile-ready")).await);
        c.ready(2).await;
        // Round-robin between two members, one connection at a time: they alternate, but for a
        // connection that comes before the primary has read the hostile worker's answer to the
        // one before (it answers after writing `no`): the honest one, free, gets that one too.
        // A thousand memberships would give the hostile worker nearly all of them.
        let mut his = 0;
        for _ in 0..10 {
            let addr = c.addr;
            let g = nodus::pool::offload_io(move || greeting(addr))
                .await
                .unwrap();
            if g == "hi\n" {
                his += 1;
            } else {
                assert_eq!(g, "no\n");
            }
        }
        assert!(
            his >= 5,
            "the honest worker's share of 10 connections: {his}"
        );
        c.shut_down().await;
    });
}

// ---------------------------------------------------------------------------------------------

/// How many listeners the primary binds for its workers at most (`cluster::primary::server`).
const MAX_KEYS: usize = 1024;
/// The most handles a worker may leave unACKed before its requests go unanswered (the primary's
/// `REPLY_HANDLES`): a listener for every key plus twice the handoffs in flight (64).
const REPLY_HANDLES: usize = MAX_KEYS + 2 * 64;

/// Listeners the worker of the test below asks for.
const FLOOD: usize = 2000;

/// The only worker of the test below: asks for [`FLOOD`] listeners on port 0 (distinct keys:
/// each its own `index`), writes the answers' errnos (`errnos`, one per line) and leaves.
fn listener_flood_worker() -> ! {
    let dir = worker_dir();
    nodus::Runtime::new().block_on(async move {
        let ch = Channel::from_env()
            .unwrap()
            .expect("started with a channel");
        send(&ch, r#"{"cmd":"NODE_CLUSTER","act":"online","seq":0}"#);
        // In rounds of 100: a burst of thousands would overflow the primary's queue of unread
        // messages (1024), which drops the oldest.
        let mut errnos = String::new();
        for round in 0..FLOOD as u64 / 100 {
            for seq in round * 100 + 1..=round * 100 + 100 {
                let q =
                    query(seq, "127.0.0.1", 0).replace("\"index\":0", &format!("\"index\":{seq}"));
                send(&ch, &q);
            }
            for _ in 0..100 {
                let v = next(&ch).await;
                errnos.push_str(&format!("{}\n", v["errno"]));
            }
        }
        put(&dir, "errnos", &errnos);
        until_disconnect(&ch).await
    })
}

#[test]
fn a_flood_of_listeners_is_refused_past_the_cap() {
    const NAME: &str = "a_flood_of_listeners_is_refused_past_the_cap";
    play("listener-flood", false, listener_flood_worker);
    let _serial = serial();
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    if limit
        .current
        .is_some_and(|n| n < 2 * MAX_KEYS as u64 + 1000)
    {
        println!("skipped: the open-files limit is too low to tell the cap from the limit");
        return;
    }
    let dir = nodus_testkit::tmp::TempDir::new("hostile-listeners");
    bounded(async || {
        let before = open_fds();
        let c = Cluster::start(NAME, "listener-flood", 1, Policy::RoundRobin, dir.path());
        let errnos = read(dir.path(), "errnos").await;
        let errnos: Vec<&str> = errnos.lines().collect();
        let ok = errnos.iter().filter(|e| **e == "null").count();
        // The pre-bound listener is one of the keys' servers but has no key of its own.
        assert_eq!(ok, MAX_KEYS, "listeners granted");
        assert!(
            errnos[MAX_KEYS..].iter().all(|e| *e == "-24"),
            "EMFILE past the cap: {:?}",
            &errnos[MAX_KEYS..]
        );
        let grown = open_fds().saturating_sub(before);
        assert!(grown < MAX_KEYS + 100, "{grown} fds opened");
        c.shut_down().await;
    });
}

/// An honest worker that listens on 200 ports in one burst under `shared`, as a Node program
/// calling `listen` 200 times in one tick does: every answer carries a listener, and Node's
/// channel sends them one at a time, each after the ACK of the one before, so most wait in the
/// primary's queue for a while. It writes each answer's `errno` (`errnos`, one per line).
fn many_listens_worker() -> ! {
    let dir = worker_dir();
    nodus::Runtime::new().block_on(async move {
        let ch = Channel::from_env()
            .unwrap()
            .expect("started with a channel");
        send(&ch, r#"{"cmd":"NODE_CLUSTER","act":"online","seq":0}"#);
        for seq in 1..=MANY_LISTENS as u64 {
            let q = query(seq, "127.0.0.1", 0).replace("\"index\":0", &format!("\"index\":{seq}"));
            send(&ch, &q);
        }
        let mut errnos = String::new();
        for _ in 0..MANY_LISTENS {
            let v = next(&ch).await;
            errnos.push_str(&format!("{}\n", v["errno"]));
        }
        put(&dir, "errnos", &errnos);
        until_disconnect(&ch).await
    })
}

const MANY_LISTENS: usize = 200;

#[test]
fn a_worker_listening_on_many_ports_at_once_under_shared_gets_every_listener() {
    const NAME: &str = "a_worker_listening_on_many_ports_at_once_under_shared_gets_every_listener";
    play("many-listens", false, many_listens_worker);
    let _serial = serial();
    let dir = nodus_testkit::tmp::TempDir::new("hostile-many-listens");
    bounded(async || {
        let c = Cluster::start(NAME, "many-listens", 1, Policy::Shared, dir.path());
        let errnos = read(dir.path(), "errnos").await;
        assert_eq!(
            errnos.lines().filter(|e| *e == "null").count(),
            MANY_LISTENS,
            "listeners granted: {errnos}"
        );
        c.shut_down().await;
    });
}

// ---------------------------------------------------------------------------------------------

/// The channel of a worker that never reads it: the raw socket `NODE_CHANNEL_FD` names.
fn raw_channel() -> std::os::unix::net::UnixStream {
    let fd: i32 = std::env::var("NODE_CHANNEL_FD").unwrap().parse().unwrap();
    // SAFETY: the primary passed fd `fd` for this channel (`NODE_CHANNEL_FD`); no runtime was
    // built in this process, so nothing else took it.
    unsafe { std::os::unix::net::UnixStream::from_raw_fd(fd) }
}

/// Reads what the primary wrote until it has been quiet for 500 ms; returns the frames.
fn drain_frames(sock: &mut std::os::unix::net::UnixStream) -> usize {
    sock.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let (mut frames, mut buf) = (0, vec![0u8; 1 << 16]);
    loop {
        match sock.read(&mut buf) {
            Ok(0) => return frames,
            Ok(n) => frames += buf[..n].iter().filter(|&&b| b == b'\n').count(),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return frames,
            Err(e) => panic!("{e}"),
        }
    }
}

/// Slot 2 of the test below: never reads its channel while it sends 5000 `queryServer`s for a
/// 10 KB address (each answered with an error echoing it as the key); then says `"flooded"`,
/// waits for the file `read`, and counts the answers it can read (`answers`).
fn deaf_worker() -> ! {
    let dir = worker_dir();
    let mut sock = raw_channel();
    assert!(file_appears(&dir.join("honest-listening")));
    let address = "y".repeat(10_000);
    let mut out = std::io::BufWriter::new(sock.try_clone().unwrap());
    writeln!(out, r#"{{"cmd":"NODE_CLUSTER","act":"online","seq":0}}"#).unwrap();
    // Paced, 100 at a time: a burst of thousands would overflow the primary's queue of unread
    // messages (1024), which drops the oldest.
    for seq in 1..=5000 {
        writeln!(out, "{}", query(seq, &address, 80)).unwrap();
        if seq % 100 == 0 {
            out.flush().unwrap();
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    writeln!(out, r#""flooded""#).unwrap();
    out.flush().unwrap();
    drop(out);
    assert!(file_appears(&dir.join("read")));
    let answers = drain_frames(&mut sock);
    put(&dir, "answers", &answers.to_string());
    until_disconnect_raw(&mut sock)
}

/// Reads the raw channel until the primary's `disconnect` (or the end), then exits 0.
fn until_disconnect_raw(sock: &mut std::os::unix::net::UnixStream) -> ! {
    sock.set_read_timeout(None).unwrap();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match sock.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) if buf[..n].windows(12).any(|w| w == b"\"disconnect\"") => break,
            Ok(_) => {}
        }
    }
    std::process::exit(0);
}

#[test]
fn a_worker_that_never_reads_gets_no_more_answers_past_a_frames_worth() {
    const NAME: &str = "a_worker_that_never_reads_gets_no_more_answers_past_a_frames_worth";
    play("deaf", true, deaf_worker);
    let _serial = serial();
    let dir = nodus_testkit::tmp::TempDir::new("hostile-deaf");
    bounded(async || {
        let c = Cluster::start(NAME, "deaf", 2, Policy::RoundRobin, dir.path());
        c.message_from(2, r#""flooded""#).await;
        // Every request was read before the message after them; give the dispatch a moment.
        nodus::sleep(Duration::from_millis(300)).await;
        honest_serves(c.addr).await;
        put(dir.path(), "read", "");
        let answers: usize = read(dir.path(), "answers").await.parse().unwrap();
        // Each answer is about 10 KB: 16 MiB of them wait for a worker that does not read, plus
        // what the socket buffers, never all 5000.
        assert!(answers > 100, "{answers} answers");
        assert!(
            answers < 2000,
            "{answers} answers queued for a worker that never reads"
        );
        honest_serves(c.addr).await;
        c.shut_down().await;
    });
}

/// Slot 1 of the test below: never reads its channel (so never ACKs a handle) while it sends
/// twice [`REPLY_HANDLES`] `queryServer`s for the pre-bound shared listener (each answer carries
/// a duplicate of it); then says `"flooded"` and waits to be killed (the primary's `disconnect` waits behind
/// the handle it never ACKs).
fn deaf_shared_worker() -> ! {
    let sock = raw_channel();
    let mut out = std::io::BufWriter::new(sock.try_clone().unwrap());
    writeln!(out, r#"{{"cmd":"NODE_CLUSTER","act":"online","seq":0}}"#).unwrap();
    let port = worker_addr().port() as i64;
    // In rounds of 100: a burst of thousands would overflow the primary's queue of unread
    // messages (1024), which drops the oldest, and the cap would never be reached.
    for seq in 1..=2 * REPLY_HANDLES as u64 {
        writeln!(out, "{}", query(seq, "127.0.0.1", port)).unwrap();
        if seq % 100 == 0 {
            out.flush().unwrap();
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    writeln!(out, r#""flooded""#).unwrap();
    out.flush().unwrap();
    drop(out);
    std::thread::sleep(Duration::from_secs(60));
    std::process::exit(0);
}

#[test]
fn a_worker_that_never_acks_holds_a_bounded_number_of_the_primarys_fds() {
    const NAME: &str = "a_worker_that_never_acks_holds_a_bounded_number_of_the_primarys_fds";
    play("deaf-shared", false, deaf_shared_worker);
    let _serial = serial();
    // Room for the fds the cap allows and more, so that a missing cap shows as fds held.
    nodus::process::raise_fd_limit();
    let dir = nodus_testkit::tmp::TempDir::new("hostile-deaf-shared");
    bounded(async || {
        let before = open_fds();
        let c = Cluster::start(NAME, "deaf-shared", 1, Policy::Shared, dir.path());
        c.message_from(1, r#""flooded""#).await;
        nodus::sleep(Duration::from_millis(300)).await;
        let grown = open_fds().saturating_sub(before);
        assert!(
            grown < REPLY_HANDLES + 100,
            "{grown} fds held for a worker that never ACKs"
        );
        // It would never see the drain: killed once the shutdown began (no restart then). A
        // worker that dies of a signal the primary did not send while it drains may have had
        // requests cut, so the shutdown says so: 124.
        let pid = c.primary.worker_pids()[0].1;
        c.primary.shutdown();
        rustix::process::kill_process(
            rustix::process::Pid::from_raw(pid as i32).unwrap(),
            rustix::process::Signal::KILL,
        )
        .unwrap();
        c.ended_with(124).await;
    });
}

// ---------------------------------------------------------------------------------------------

/// Slot 2 of the test below: a nodus-speaking worker that never answers snapshot requests sends
/// 1000 stats requests at once, then counts, for 3 s, the answers (`answers`: their ids, one per
/// line) and the snapshot requests (`asked`) it gets.
fn stats_flood_worker() -> ! {
    let dir = worker_dir();
    nodus::Runtime::new().block_on(async move {
        let ch = Channel::from_env()
            .unwrap()
            .expect("started with a channel");
        assert!(file_appears_async(&dir.join("honest-listening")).await);
        send(
            &ch,
            r#"{"cmd":"NODE_CLUSTER","act":"online","seq":0,"nodus":1}"#,
        );
        for id in 1..=1000 {
            send(
                &ch,
                &format!(
                    r#"{{"cmd":"NODE_NODUS","act":"stats_request","id":{id},"text":"stats"}}"#
                ),
            );
        }
        let (mut answers, mut asked) = (String::new(), 0);
        let deadline = Instant::now() + Duration::from_secs(3);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Ok(Some(msg)) = nodus::timeout(left, ch.recv_internal()).await else {
                break;
            };
            let v: Value = serde_json::from_str(msg.json()).unwrap();
            match v["act"].as_str() {
                Some("stats_reply") => answers.push_str(&format!("{}\n", v["id"])),
                Some("snapshot_request") => asked += 1,
                _ => {}
            }
        }
        put(&dir, "asked", &asked.to_string());
        put(&dir, "answers", &answers);
        until_disconnect(&ch).await
    })
}

#[test]
fn a_flood_of_stats_requests_is_answered_in_bounded_batches() {
    const NAME: &str = "a_flood_of_stats_requests_is_answered_in_bounded_batches";
    play("stats-flood", true, stats_flood_worker);
    let _serial = serial();
    let dir = nodus_testkit::tmp::TempDir::new("hostile-stats");
    bounded(async || {
        let c = Cluster::start(NAME, "stats-flood", 2, Policy::RoundRobin, dir.path());
        let answers = read(dir.path(), "answers").await;
        let ids: Vec<u64> = answers.lines().map(|l| l.parse().unwrap()).collect();
        let asked: usize = read(dir.path(), "asked").await.parse().unwrap();
        let mut unique = ids.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), ids.len(), "an id answered twice");
        assert!(ids.iter().all(|id| (1..=1000).contains(id)));
        // One computation at a time for the worker, each answering at most 64 waiting requests.
        assert!(
            (64..=192).contains(&ids.len()),
            "{} of 1000 requests answered",
            ids.len()
        );
        assert!(asked <= 2, "the worker was asked for {asked} snapshots");
        honest_serves(c.addr).await;
        c.shut_down().await;
    });
}

// ---------------------------------------------------------------------------------------------

/// A snapshot with `n` task classes named `name(i)`.
fn with_classes(n: usize, name: impl Fn(usize) -> String) -> String {
    let s = Snapshot {
        task_classes: (0..n)
            .map(|i| TaskClassSnapshot {
                name: name(i),
                ..TaskClassSnapshot::default()
            })
            .collect(),
        ..Snapshot::default()
    };
    serde_json::to_string(&s).unwrap()
}

/// What the hostile worker of `slot` answers a snapshot request with (its id is `id`; slot 7
/// names a request never made).
fn bad_snapshot(slot: u32, id: &Value) -> String {
    let payload = match slot {
        // Not an object.
        2 => "5".to_owned(),
        // An object that is not a snapshot.
        3 => r#"{"pid":1,"loop_stats":"busy"}"#.to_owned(),
        // Two task classes of one name: two series of one name and labels.
        4 => with_classes(2, |_| "twin".to_owned()),
        // Far more task classes than the wire limit (256), each with a long name.
        5 => with_classes(1000, |i| format!("class-{i}-{}", "z".repeat(200))),
        // A well-formed snapshot with odd but valid values: served.
        6 => {
            let mut s: Value = serde_json::from_str(&with_classes(1, |_| {
                "quote\" newline\n backslash\\ brace}".to_owned()
            }))
            .unwrap();
            s["loop_stats"]["iterations"] = u64::MAX.into();
            s["loop_stats"]["busy_seconds"] = 1e300.into();
            s["loop_stats"]["poll_duration"]["buckets"] =
                serde_json::json!([[1, u64::MAX], [2, u64::MAX], [u64::MAX, u64::MAX]]);
            s.to_string()
        }
        // Another request's id: no answer to this one.
        _ => {
            return format!(
                r#"{{"cmd":"NODE_NODUS","act":"snapshot","id":1000000,"snapshot":{}}}"#,
                with_classes(0, |_| String::new())
            );
        }
    };
    format!(r#"{{"cmd":"NODE_NODUS","act":"snapshot","id":{id},"snapshot":{payload}}}"#)
}

/// Slots 2 to 7 of the test below: nodus-speaking workers that answer every snapshot request
/// with [`bad_snapshot`]; ready once online.
fn bad_snapshot_worker() -> ! {
    // Made once (a large one takes a while in a debug build), the id put in for each request.
    snapshot_worker(bad_snapshot(slot(), &Value::from(0)))
}

/// A nodus-speaking worker that answers every snapshot request with `template` (its `"id":0,`
/// replaced by the request's id); ready once online.
fn snapshot_worker(template: String) -> ! {
    nodus::Runtime::new().block_on(async move {
        let ch = online_and_ready();
        while let Some(msg) = ch.recv_internal().await {
            let v: Value = serde_json::from_str(msg.json()).unwrap();
            match v["act"].as_str() {
                Some("snapshot_request") => {
                    let id = format!("\"id\":{},", v["id"]);
                    send(&ch, &template.replacen("\"id\":0,", &id, 1));
                }
                Some("disconnect") => break,
                _ => {}
            }
        }
        std::process::exit(0);
    })
}

/// Sample lines of an exposition that repeat a series (name and labels).
fn duplicate_samples(text: &str) -> Vec<&str> {
    let mut seen = std::collections::HashSet::new();
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.rsplit_once(' ').map(|(series, _)| series))
        .filter(|series| !seen.insert(*series))
        .collect()
}

#[test]
fn bad_snapshots_are_refused_and_the_others_metrics_and_stats_stay_whole() {
    const NAME: &str = "bad_snapshots_are_refused_and_the_others_metrics_and_stats_stay_whole";
    play("bad-snapshot", true, bad_snapshot_worker);
    let _serial = serial();
    let dir = nodus_testkit::tmp::TempDir::new("hostile-snapshots");
    bounded(async || {
        let c = Cluster::start(NAME, "bad-snapshot", 7, Policy::RoundRobin, dir.path());
        c.ready(7).await;
        let pids: Vec<u32> = c.primary.worker_pids().iter().map(|(_, p)| *p).collect();
        let (text, stats) = c.metrics_and_stats(6).await;

        assert_eq!(duplicate_samples(&text), Vec::<&str>::new());
        assert!(text.len() < 1 << 20, "{} bytes of metrics", text.len());
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let (_, value) = line.rsplit_once(' ').unwrap();
            assert!(value.parse::<f64>().is_ok(), "a bad sample line: {line:?}");
        }
        let uptime = |slot: usize| {
            format!(
                "nodus_uptime_seconds{{worker=\"{slot}\",pid=\"{}\"}} ",
                pids[slot - 1]
            )
        };
        for slot in [1, 6] {
            assert!(text.contains(&uptime(slot)), "no series of worker {slot}");
        }
        for slot in [2, 3, 4, 5, 7] {
            assert!(!text.contains(&uptime(slot)), "series of worker {slot}");
        }
        let workers = stats["workers"].as_array().unwrap();
        assert_eq!(workers.len(), 7);
        for (i, w) in workers.iter().enumerate() {
            let slot = i + 1;
            if [1, 6].contains(&slot) {
                // What `nodus top` and the page read: a snapshot.
                serde_json::from_value::<Snapshot>(w["snapshot"].clone())
                    .unwrap_or_else(|e| panic!("worker {slot}'s snapshot: {e}"));
                assert_eq!(w["answering"], true);
            } else {
                assert!(w["snapshot"].is_null(), "worker {slot}: {}", w["snapshot"]);
            }
        }
        // Refused ones answered (their loop runs); a wrong id is no answer.
        for slot in [2, 3, 4, 5] {
            assert_eq!(workers[slot - 1]["answering"], true, "worker {slot}");
        }
        assert_eq!(workers[6]["answering"], false);
        honest_serves(c.addr).await;
        c.shut_down().await;
    });
}

/// What a worker of a newer build might answer a snapshot request with (id 0): more task classes,
/// phases, stalls and histogram buckets than this build keeps (within the wire limits), fields
/// this build does not know, and none of a field it has (`tasks`).
fn newer_snapshot() -> String {
    let mut s = Snapshot {
        pid: 4242,
        task_classes: (0..100)
            .map(|i| TaskClassSnapshot {
                name: format!("newer-{i}"),
                polls: i,
                ..TaskClassSnapshot::default()
            })
            .collect(),
        phases: (0..12)
            .map(|i| PhaseSnapshot {
                phase: format!("phase-{i}"),
                ..PhaseSnapshot::default()
            })
            .collect(),
        stalls: vec![StallReport::default(); 100],
        stalls_total: StallCounts {
            on_cpu: 150,
            ..StallCounts::default()
        },
        ..Snapshot::default()
    };
    // Finer buckets than this build's 625, named by their upper bounds.
    s.loop_stats.poll_duration.buckets = (1..=1000u64).map(|b| (b * 1000, 1)).collect();
    s.loop_stats.poll_duration.count = 1000;
    let mut v = serde_json::to_value(&s).unwrap();
    v["from_a_newer_build"] = serde_json::json!({"nested": [1, 2, 3]});
    v["loop_stats"]["also_newer"] = 1.5.into();
    v.as_object_mut().unwrap().remove("tasks");
    format!(r#"{{"cmd":"NODE_NODUS","act":"snapshot","id":0,"snapshot":{v}}}"#)
}

#[test]
fn a_newer_builds_snapshot_within_the_wire_limits_is_served_per_worker() {
    const NAME: &str = "a_newer_builds_snapshot_within_the_wire_limits_is_served_per_worker";
    play("newer-snapshot", true, || snapshot_worker(newer_snapshot()));
    let _serial = serial();
    let dir = nodus_testkit::tmp::TempDir::new("newer-snapshot");
    bounded(async || {
        let c = Cluster::start(NAME, "newer-snapshot", 2, Policy::RoundRobin, dir.path());
        c.ready(2).await;
        let pid = c.primary.worker_pids()[1].1;
        let (text, stats) = c.metrics_and_stats(2).await;
        // The JSON document: the worker's snapshot as it sent it, unknown fields included.
        let w = &stats["workers"][1];
        assert_eq!(w["worker"], 2);
        assert_eq!(w["answering"], true);
        let snap = &w["snapshot"];
        assert_eq!(snap["from_a_newer_build"]["nested"][2], 3, "{snap}");
        assert_eq!(snap["task_classes"].as_array().map(Vec::len), Some(100));
        assert_eq!(snap["stalls"].as_array().map(Vec::len), Some(100));
        assert_eq!(snap["stalls_total"]["on-cpu"], 150, "{snap}");
        // What `nodus top` and the page read: a snapshot.
        serde_json::from_value::<Snapshot>(snap.clone()).unwrap();
        // The exposition: its series, with the worker's labels, and no series twice.
        assert_eq!(duplicate_samples(&text), Vec::<&str>::new());
        let labels = format!("worker=\"2\",pid=\"{pid}\"");
        for series in [
            format!("nodus_task_polls_total{{{labels},task=\"newer-99\"}} 99"),
            format!("nodus_loop_phase_callbacks_total{{{labels},phase=\"phase-11\"}} 0"),
            format!("nodus_stalls_recent{{{labels}}} 100"),
            format!("nodus_loop_stalls_total{{{labels},class=\"on-cpu\"}} 150"),
            format!("nodus_loop_stalls_total{{{labels},class=\"unknown\"}} 0"),
            format!("nodus_loop_poll_duration_seconds_count{{{labels}}} 1000"),
        ] {
            assert!(
                text.lines().any(|l| l == series),
                "no {series:?} in the metrics"
            );
        }
        // The honest worker beside it, as ever.
        let honest = c.primary.worker_pids()[0].1;
        assert!(text.contains(&format!(
            "nodus_uptime_seconds{{worker=\"1\",pid=\"{honest}\"}} "
        )));
        honest_serves(c.addr).await;
        c.shut_down().await;
    });
}

// ---------------------------------------------------------------------------------------------

/// A snapshot within the wire limits (3 MB) that takes twice its size in a frame's `text`: a
/// field this build does not know (served as sent) of 1,500,000 quotes, each `\"` in the
/// snapshot and `\\\"` once the document holding it is a reply's `text`. Three of them do not
/// fit one 16 MiB frame.
fn big_snapshot() -> String {
    let mut v: Value = serde_json::from_str(&with_classes(1, |_| "big".to_owned())).unwrap();
    v["padding"] = "\"".repeat(PADDING).into();
    format!(r#"{{"cmd":"NODE_NODUS","act":"snapshot","id":0,"snapshot":{v}}}"#)
}

/// Slot 5 of the test below: a nodus worker that asks the primary for the cluster's stats (the
/// relay a worker's `/_nodus/stats` uses) until slots 2 to 4 have answered in it (at most 30
/// tries: parsing three such snapshots takes a debug build on a loaded machine near the
/// primary's 500 ms), then for the metrics; writes each reply's `text` (`stats`, `metrics`), or `none` when the primary sent no
/// reply within 10 s. Answers snapshot requests meanwhile.
fn stats_asker_worker() -> ! {
    let dir = worker_dir();
    nodus::Runtime::new().block_on(async move {
        let ch = online_and_ready();
        let small = with_classes(0, |_| String::new());
        // The reply's `text` to a request for `what`, or `None` after 10 s.
        let ask = async |id: u64, what: &str| {
            send(
                &ch,
                &format!(
                    r#"{{"cmd":"NODE_NODUS","act":"stats_request","id":{id},"text":"{what}"}}"#
                ),
            );
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                let Ok(Some(msg)) = nodus::timeout(left, ch.recv_internal()).await else {
                    return None;
                };
                let v: Value = serde_json::from_str(msg.json()).unwrap();
                match v["act"].as_str() {
                    Some("snapshot_request") => send(
                        &ch,
                        &format!(
                            r#"{{"cmd":"NODE_NODUS","act":"snapshot","id":{},"snapshot":{small}}}"#,
                            v["id"]
                        ),
                    ),
                    Some("stats_reply") if v["id"] == id => {
                        return Some(v["text"].as_str().unwrap().to_owned());
                    }
                    _ => {}
                }
            }
        };
        let mut stats = None;
        for id in 1..=30 {
            stats = ask(id, "stats").await;
            let Some(json) = &stats else { break };
            let doc: Value = serde_json::from_str(json).unwrap();
            if (1..4).all(|i| doc["workers"][i]["answering"] == true) {
                break;
            }
            nodus::sleep(Duration::from_millis(1100)).await;
        }
        put(&dir, "stats", stats.as_deref().unwrap_or("none"));
        let metrics = ask(100, "metrics").await;
        put(&dir, "metrics", metrics.as_deref().unwrap_or("none"));
        until_disconnect(&ch).await
    })
}

/// The quotes in a [`big_snapshot`].
const PADDING: usize = 1_500_000;

#[test]
fn stats_relayed_to_a_worker_fit_one_frame_and_say_what_they_left_out() {
    const NAME: &str = "stats_relayed_to_a_worker_fit_one_frame_and_say_what_they_left_out";
    play("big-snapshots", true, || {
        if slot() == 5 {
            stats_asker_worker()
        }
        snapshot_worker(big_snapshot())
    });
    let _serial = serial();
    let dir = nodus_testkit::tmp::TempDir::new("big-snapshots");
    bounded(async || {
        let c = Cluster::start(NAME, "big-snapshots", 5, Policy::RoundRobin, dir.path());
        let relayed = read(dir.path(), "stats").await;
        assert_ne!(relayed, "none", "the primary sent no stats reply");
        // The reply fit one frame: its `text` escaped, and the rest of the message.
        let text_len = serde_json::to_string(&relayed).unwrap().len();
        assert!(text_len < nodus::ipc::DEFAULT_MAX_FRAME, "{text_len} bytes");
        let doc: Value = serde_json::from_str(&relayed).unwrap();
        let workers = doc["workers"].as_array().unwrap();
        assert_eq!(workers.len(), 5);
        // Three 6 MB parts (escaped) cannot all fit 16 MiB: the first of the largest is left
        // out, saying so, and the document says why.
        let left_out: Vec<u64> = workers
            .iter()
            .filter(|w| !w["snapshot_left_out"].is_null())
            .map(|w| w["worker"].as_u64().unwrap())
            .collect();
        assert_eq!(left_out, [2], "{:#}", doc["trimmed"]);
        let why = workers[1]["snapshot_left_out"].as_str().unwrap();
        assert!(
            why.contains("-byte snapshot did not fit the IPC frame"),
            "{why}"
        );
        assert!(workers[1]["snapshot"].is_null());
        assert_eq!(workers[1]["answering"], true);
        let trimmed = doc["trimmed"].as_str().unwrap();
        assert!(
            trimmed.starts_with("1 of 5 worker snapshots left out") && trimmed.contains("16777216"),
            "{trimmed}"
        );
        for slot in [1, 3, 4, 5] {
            let w = &workers[slot - 1];
            assert!(w["snapshot_left_out"].is_null(), "worker {slot}");
            assert!(
                w["snapshot"].is_object(),
                "worker {slot}: {}",
                w["snapshot"]
            );
        }
        // The relayed metrics carry no padding (a field the metrics do not know): whole.
        let metrics = read(dir.path(), "metrics").await;
        assert!(
            metrics.ends_with("# EOF\n"),
            "{}",
            &metrics[..metrics.len().min(200)]
        );
        assert!(!metrics.contains("nodus_cluster_worker_snapshot_left_out"));
        // The primary's own document has no frame to fit: whole, past a frame's size, once the
        // three answered in time.
        let mut own = Value::Null;
        for _ in 0..30 {
            own = serde_json::from_str(&c.primary.stats_json().await).unwrap();
            if (1..4).all(|i| own["workers"][i]["answering"] == true) {
                break;
            }
            nodus::sleep(Duration::from_millis(1100)).await;
        }
        assert!(own["trimmed"].is_null());
        for w in own["workers"].as_array().unwrap() {
            assert!(w["snapshot_left_out"].is_null());
        }
        for i in 1..4 {
            let padding = own["workers"][i]["snapshot"]["padding"].as_str();
            assert_eq!(padding.map(str::len), Some(PADDING), "worker {}", i + 1);
        }
        honest_serves(c.addr).await;
        c.shut_down().await;
    });
}

// ---------------------------------------------------------------------------------------------

#[test]
fn a_stall_of_the_primary_itself_makes_no_worker_look_silent() {
    const NAME: &str = "a_stall_of_the_primary_itself_makes_no_worker_look_silent";
    play("primary-stall", true, || {
        snapshot_worker(format!(
            r#"{{"cmd":"NODE_NODUS","act":"snapshot","id":0,"snapshot":{}}}"#,
            with_classes(1, |_| "small".to_owned())
        ))
    });
    let _serial = serial();
    let dir = nodus_testkit::tmp::TempDir::new("primary-stall");
    bounded(async || {
        let c = Cluster::start(NAME, "primary-stall", 2, Policy::RoundRobin, dir.path());
        c.ready(2).await;
        let (_, stats) = c.metrics_and_stats(2).await;
        assert_eq!(stats["workers"][1]["answering"], true);
        for _ in 0..3 {
            // Past the cache (1 s): the next document asks both workers, and the primary's
            // loop stalls (as a stopped process does) for twice the ask's 500 ms right after
            // the requests went out, while both answer.
            nodus::sleep(Duration::from_millis(1100)).await;
            let p = c.primary.clone();
            let doc = nodus::spawn(async move { p.stats_json().await });
            nodus::set_immediate(|| std::thread::sleep(Duration::from_millis(1000)));
            let stats: Value = serde_json::from_str(&doc.await.unwrap()).unwrap();
            for w in stats["workers"].as_array().unwrap() {
                assert_eq!(
                    w["answering"], true,
                    "worker {} after the stall",
                    w["worker"]
                );
                assert!(w["snapshot"].is_object(), "worker {}", w["worker"]);
            }
        }
        honest_serves(c.addr).await;
        c.shut_down().await;
    });
}
