//! Helpers for the cluster tests: the example binary run as a primary (killed with all its
//! workers on drop), its JSON-lines event log, the example's replies (`nodus_testkit::http`) and
//! a load generator.
//!
//! Invariants:
//! - A [`Cluster`] kills every process it started on drop, by PID: the workers (and the
//!   primary's orphan guard, which [`Cluster::worker_pids`] leaves out) found through
//!   `/proc/<primary>/task/*/children` and every worker pid it has seen (only while
//!   `/proc/<pid>/exe` is still the cluster binary, so a recycled pid is never touched), then the
//!   primary, which it reaps.
//! - Every wait has a deadline that only catches hangs; every socket has read/write timeouts.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufReader};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nodus_testkit::http::{self, Reply, Timeouts};
use nodus_testkit::net::free_addr;
use nodus_testkit::proc::Proc;
use nodus_testkit::tmp::TempDir;
use rustix::process::{Pid, Signal, kill_process};
use serde_json::Value;

/// Limits on every blocking socket operation of the client: long enough for a loaded machine,
/// short enough to turn a hang into a failure.
const TIMEOUTS: Timeouts = Timeouts {
    connect: Duration::from_secs(10),
    io: Duration::from_secs(10),
};

/// Held by each test: clusters of different tests never compete for the 2 cores, so the
/// timing-dependent rules (restart windows, min uptime) see realistic start-up times.
pub fn exclusive() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// The example binary, next to this test executable (`target/<profile>/examples/cluster`).
///
/// `cargo test --test cluster` builds no example, so under cargo (`CARGO` set) the example is
/// built (or found fresh) first, once per run: a stale binary would test old code.
pub fn example_binary() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let exe = std::env::current_exe().expect("the test executable has a path");
            let profile_dir = exe
                .parent()
                .and_then(Path::parent)
                .expect("target/<profile>/deps/<test>");
            if let Ok(cargo) = std::env::var("CARGO") {
                build_example(&cargo, profile_dir);
            }
            let bin = profile_dir.join("examples").join("cluster");
            assert!(bin.is_file(), "{} is missing", bin.display());
            bin
        })
        .clone()
}

fn build_example(cargo: &str, profile_dir: &Path) {
    let target_dir = profile_dir.parent().expect("target/<profile>");
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => "dev",
        Some(name) => name,
        None => panic!("no profile in {}", profile_dir.display()),
    };
    let out = Command::new(cargo)
        .args([
            "build",
            "--quiet",
            "-p",
            "nodus-http",
            "--example",
            "cluster",
        ])
        .args(["--profile", profile])
        .arg("--target-dir")
        .arg(target_dir)
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo build --example cluster failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A running cluster primary (the example binary) and its workers.
pub struct Cluster {
    primary: Proc,
    program: PathBuf,
    pub port: u16,
    events: PathBuf,
    stderr: PathBuf,
    /// Worker pids seen so far (killed on drop if still ours).
    seen: Mutex<Vec<u32>>,
    _dir: TempDir,
}

impl Cluster {
    /// Starts the example as a primary on a free port with `--workers N --policy P` and `extra`
    /// flags, and waits until `workers` workers are ready.
    pub fn start(workers: usize, policy: &str, extra: &[&str]) -> Cluster {
        let c = Cluster::spawn(
            &example_binary(),
            TempDir::new(policy),
            workers,
            policy,
            extra,
        );
        c.wait_ready(workers);
        c
    }

    /// Starts `program` as a primary without waiting; `dir` holds its logs.
    pub fn spawn(
        program: &Path,
        dir: TempDir,
        workers: usize,
        policy: &str,
        extra: &[&str],
    ) -> Cluster {
        let port = free_addr().port();
        let events = dir.path().join("events.jsonl");
        let stderr = dir.path().join("stderr.log");
        let primary = Proc::spawn(
            Command::new(program)
                .args(["--workers", &workers.to_string(), "--policy", policy])
                .args(["--listen", &format!("127.0.0.1:{port}")])
                .arg("--events")
                .arg(&events)
                .args(extra)
                .env("RUST_LOG", "info")
                .env_remove("NODE_UNIQUE_ID")
                .env_remove("NOTIFY_SOCKET")
                .env_remove("LISTEN_FDS")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(File::create(&stderr).unwrap()),
        );
        Cluster {
            primary,
            program: program.to_owned(),
            port,
            events,
            stderr,
            seen: Mutex::default(),
            _dir: dir,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    pub fn pid(&self) -> u32 {
        self.primary.id()
    }

    pub fn signal(&self, sig: Signal) {
        self.primary.signal(sig);
    }

    /// The primary's stderr so far (its log lines and its workers').
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Every event logged so far (complete lines only).
    pub fn events(&self) -> Vec<Event> {
        let text = std::fs::read_to_string(&self.events).unwrap_or_default();
        let events: Vec<Event> = text
            .split_inclusive('\n')
            .filter(|l| l.ends_with('\n'))
            .map(|l| Event(serde_json::from_str(l).expect("an event is a JSON object")))
            .collect();
        let mut seen = self.seen.lock().unwrap();
        for e in &events {
            if e.kind() == "fork"
                && let Some(p) = e.pid()
                && !seen.contains(&p)
            {
                seen.push(p);
            }
        }
        events
    }

    /// Waits until `done` holds for the events (at most 30 s: a hang), and returns them.
    pub fn wait_events(&self, what: &str, done: impl Fn(&[Event]) -> bool) -> Vec<Event> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let events = self.events();
            if done(&events) {
                return events;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; events:\n{}\nstderr:\n{}",
                dump(&events),
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until `n` workers have said `ready`.
    pub fn wait_ready(&self, n: usize) -> Vec<Event> {
        self.wait_events(&format!("{n} ready workers"), |ev| {
            ev.iter().filter(|e| e.kind() == "ready").count() >= n
        })
    }

    /// The primary's live children but its orphan guard (its workers), from
    /// `/proc/<pid>/task/*/children`.
    pub fn worker_pids(&self) -> Vec<u32> {
        let pids: Vec<u32> = children(self.pid())
            .into_iter()
            .filter(|&p| !is_guard(p))
            .collect();
        let mut seen = self.seen.lock().unwrap();
        for p in &pids {
            if !seen.contains(p) {
                seen.push(*p);
            }
        }
        pids
    }

    /// Entries in the primary's `/proc/<pid>/fd`.
    pub fn fd_count(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .expect("the primary is running")
            .count()
    }

    /// Waits for the primary to exit (`None` if it is still running after `limit`).
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        self.primary.exited_within(limit)
    }

    /// Whether the primary is still running.
    pub fn is_running(&mut self) -> bool {
        self.primary.child.try_wait().unwrap().is_none()
    }

    fn is_ours(&self, p: u32) -> bool {
        std::fs::read_link(format!("/proc/{p}/exe")).is_ok_and(|exe| exe == self.program)
    }
}

impl Drop for Cluster {
    /// Kills the primary first (so it starts no replacement), then every worker it had; the
    /// primary's `Proc` reaps it.
    fn drop(&mut self) {
        let mut victims = children(self.pid());
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
        victims.extend(seen.into_iter().filter(|p| self.is_ours(*p)));
        let _ = self.primary.child.kill();
        for p in victims {
            if is_alive(p) {
                let _ = kill_process(pid(p), Signal::KILL);
            }
        }
    }
}

fn pid(p: u32) -> Pid {
    Pid::from_raw(p as i32).expect("a pid is positive")
}

/// The children of every thread of `p`.
pub fn children(p: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) else {
        return Vec::new();
    };
    let mut pids = Vec::new();
    for task in tasks.flatten() {
        if let Ok(text) = std::fs::read_to_string(task.path().join("children")) {
            pids.extend(
                text.split_whitespace()
                    .filter_map(|s| s.parse::<u32>().ok()),
            );
        }
    }
    pids
}

/// Whether `p` is a primary's orphan guard (a fork of the primary, named by `/proc/PID/comm`).
pub fn is_guard(p: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{p}/comm"))
        .is_ok_and(|comm| comm.trim_end().as_bytes() == nodus::process::GUARD_NAME.to_bytes())
}

/// Whether `p` exists and is not a zombie.
pub fn is_alive(p: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
        return false;
    };
    // The state follows the parenthesised command name, which may itself hold parentheses.
    let state = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next());
    state.is_some_and(|s| s != "Z" && s != "X")
}

/// Sends SIGKILL to `p`.
pub fn kill9(p: u32) {
    kill_process(pid(p), Signal::KILL).expect("the worker is running");
}

/// Sends SIGTERM to `p`.
pub fn terminate(p: u32) {
    kill_process(pid(p), Signal::TERM).expect("the worker is running");
}

/// Freezes a worker (SIGSTOP): its loop reads nothing until it is killed or continued.
pub fn freeze(p: u32) {
    kill_process(pid(p), Signal::STOP).expect("the worker is running");
}

/// One line of the event log.
#[derive(Clone)]
pub struct Event(pub Value);

impl Event {
    pub fn kind(&self) -> &str {
        self.0["event"].as_str().unwrap_or("")
    }

    pub fn worker(&self) -> Option<u32> {
        self.0["worker"].as_u64().map(|v| v as u32)
    }

    pub fn pid(&self) -> Option<u32> {
        self.0["pid"].as_u64().map(|v| v as u32)
    }

    pub fn t_ns(&self) -> u64 {
        self.0["t_ns"].as_u64().unwrap_or(0)
    }
}

/// The events, one per line, for assertion messages.
pub fn dump(events: &[Event]) -> String {
    events
        .iter()
        .map(|e| e.0.to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

/// How many events of `kind` there are.
pub fn count(events: &[Event], kind: &str) -> usize {
    events.iter().filter(|e| e.kind() == kind).count()
}

/// The pids of the workers that are current after the events: forked, and not exited since.
pub fn current_pids(events: &[Event]) -> Vec<u32> {
    let mut live: Vec<(u32, u32)> = Vec::new();
    for e in events {
        match (e.kind(), e.worker(), e.pid()) {
            ("ready", Some(w), Some(p)) => {
                live.retain(|(lw, _)| *lw != w);
                live.push((w, p));
            }
            ("exit", _, Some(p)) => live.retain(|(_, lp)| *lp != p),
            _ => {}
        }
    }
    live.sort();
    live.into_iter().map(|(_, p)| p).collect()
}

/// What the example answers.
pub trait ExampleReply {
    /// The worker id in `X-Worker`.
    fn worker(&self) -> Option<u32>;
    /// 200 with the example's body.
    fn is_hello(&self) -> bool;
}

impl ExampleReply for Reply {
    fn worker(&self) -> Option<u32> {
        self.header("x-worker")?.parse().ok()
    }

    fn is_hello(&self) -> bool {
        self.status == 200 && self.body == b"Hello, World!"
    }
}

/// `GET /` on a new connection with `Connection: close`.
pub fn get(addr: SocketAddr) -> io::Result<Reply> {
    http::request(addr, TIMEOUTS, "GET", "/", &[])
}

/// A client that keeps its connection open and reconnects only after a `Connection: close`
/// answer (correct HTTP: not a failure) or an error.
#[derive(Default)]
pub struct KeepAlive {
    conn: Option<BufReader<TcpStream>>,
}

impl KeepAlive {
    pub fn get(&mut self, addr: SocketAddr) -> io::Result<Reply> {
        let reply = self.try_get(addr);
        if reply.as_ref().map_or(true, Reply::closes) {
            self.conn = None;
        }
        reply
    }

    fn try_get(&mut self, addr: SocketAddr) -> io::Result<Reply> {
        if self.conn.is_none() {
            self.conn = Some(BufReader::new(http::connect(addr, TIMEOUTS)?));
        }
        let r = self.conn.as_mut().expect("connected");
        http::write_request(r.get_mut(), "GET", "/", &["Connection: keep-alive"])?;
        http::read_reply(r, false)
    }
}

/// What the clients of a [`Load`] saw.
#[derive(Debug, Default)]
pub struct Tally {
    pub ok: u64,
    /// Each failed request: when (since the load started) and why.
    pub failures: Vec<(Duration, String)>,
    /// Successful responses per `X-Worker`.
    pub by_worker: HashMap<u32, u64>,
    /// When each successful response came (since the load started).
    success_times: Vec<Duration>,
    /// When the load was told to stop (since it started).
    stopped: Duration,
}

impl Tally {
    fn merge(&mut self, other: Tally) {
        self.ok += other.ok;
        self.failures.extend(other.failures);
        for (w, n) in other.by_worker {
            *self.by_worker.entry(w).or_default() += n;
        }
        self.success_times.extend(other.success_times);
        self.stopped = self.stopped.max(other.stopped);
    }

    /// The longest stretch of the load (from its start to its stop) in which no client got a
    /// successful response.
    pub fn max_gap(&self) -> Duration {
        let mut times = self.success_times.clone();
        times.push(Duration::ZERO);
        times.push(self.stopped);
        times.sort();
        times
            .windows(2)
            .map(|w| w[1] - w[0])
            .max()
            .unwrap_or_default()
    }
}

/// Client threads sending `GET /` in a loop until stopped: `keep_alive` of them on kept-alive
/// connections, `close` of them on a new connection per request.
pub struct Load {
    started: Instant,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<Tally>>,
}

impl Load {
    pub fn start(addr: SocketAddr, keep_alive: usize, close: usize) -> Load {
        let started = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..keep_alive + close)
            .map(|i| {
                let stop = stop.clone();
                let mut client = (i < keep_alive).then(KeepAlive::default);
                std::thread::spawn(move || {
                    let mut tally = Tally::default();
                    while !stop.load(Ordering::Relaxed) {
                        let reply = match &mut client {
                            Some(c) => c.get(addr),
                            None => get(addr),
                        };
                        let at = started.elapsed();
                        match reply {
                            Ok(r) if r.is_hello() => {
                                tally.ok += 1;
                                tally.success_times.push(at);
                                if let Some(w) = r.worker() {
                                    *tally.by_worker.entry(w).or_default() += 1;
                                }
                            }
                            Ok(r) => tally.failures.push((at, format!("status {}", r.status))),
                            Err(e) => tally.failures.push((at, e.to_string())),
                        }
                        // Leaves some CPU to the cluster on a 2-core machine.
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    tally
                })
            })
            .collect();
        Load {
            started,
            stop,
            threads,
        }
    }

    /// Stops the clients and sums what they saw.
    pub fn finish(mut self) -> Tally {
        self.stop.store(true, Ordering::Relaxed);
        let mut total = Tally {
            stopped: self.started.elapsed(),
            ..Tally::default()
        };
        for t in self.threads.drain(..) {
            total.merge(t.join().expect("a client thread panicked"));
        }
        total
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
