//! `nodus top` end to end: `--once` against a real `nodus serve` and against a fake 2-worker
//! cluster stats server, the dashboard under a pseudo-terminal at 80×24 (keys, `q`, Ctrl-C and
//! SIGTERM all leave the terminal restored; closing the terminal ends it; a stdout that is not a
//! terminal is a usage error), and the `/_nodus/` page in headless Chromium (against a real
//! cluster, and against a crafted relayed document: panics, a drain stall, a snapshot left out,
//! an older build's snapshot).
//!
//! The fake cluster is a std `TcpListener` thread answering every request with the cluster shape
//! (`{"workers": [...], "restarts", "budget_left", "generation"}`); each answer advances its
//! counters by a known amount, so the rates `top` derives from two fetches are known exactly.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::serve::Serve;
use common::{NODUS, http, installed};
use nodus::metrics::{Histogram, HistogramSnapshot, PoolSnapshot, Snapshot, StallReport};
use nodus_testkit::net::free_addr;
use nodus_testkit::proc::Proc;
use nodus_testkit::tmp::TempDir;
use serde_json::Value;

/// A temporary directory holding `index.html`, for `nodus serve`.
fn site(tag: &str) -> TempDir {
    let dir = TempDir::new(tag);
    std::fs::write(dir.path().join("index.html"), "hello\n").unwrap();
    dir
}

/// A real cluster: `nodus serve --workers 2` of `dir`, waited for until both workers report;
/// their pids.
fn cluster(dir: &TempDir) -> (Serve, Vec<u64>) {
    let server = Serve::start(dir.path(), 2, &[]);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let stats: Value =
            serde_json::from_slice(&get(server.addr, "/_nodus/stats")).unwrap_or_default();
        let pids: Vec<u64> = stats["workers"]
            .as_array()
            .map(|ws| {
                ws.iter()
                    .filter(|w| w["state"] == "ready" && !w["snapshot"].is_null())
                    .filter_map(|w| w["pid"].as_u64())
                    .collect()
            })
            .unwrap_or_default();
        if pids.len() == 2 {
            return (server, pids);
        }
        assert!(
            Instant::now() < deadline,
            "the cluster never reported 2 workers: {stats}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// GET `path`: the body of a 200 response, sent whole (not chunked).
fn get(addr: SocketAddr, path: &str) -> Vec<u8> {
    let reply = http::get(addr, path);
    assert_eq!(reply.status, 200, "GET {path}");
    assert_ne!(
        reply.header("transfer-encoding"),
        Some("chunked"),
        "GET {path}"
    );
    reply.body
}

fn top_once(addr: &str, interval: &str) -> Output {
    Command::new(NODUS)
        .args(["top", "--once", "--interval", interval, addr])
        .output()
        .unwrap()
}

/// The worker lines of a `--once` frame (the lines starting with a digit), split in columns.
fn worker_lines(stdout: &str) -> Vec<Vec<String>> {
    stdout
        .lines()
        .filter(|l| l.starts_with(|c: char| c.is_ascii_digit()))
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect()
}

/// Index of a column in the `--once` column line.
fn col(stdout: &str, name: &str) -> usize {
    let header = stdout.lines().find(|l| l.starts_with("PID")).unwrap();
    header.split_whitespace().position(|c| c == name).unwrap()
}

/// A duration cell (`850ns`, `9.99µs`, `1.50ms`, `1.23s`) in ns.
fn parse_ns(cell: &str) -> f64 {
    for (unit, scale) in [("ns", 1.0), ("µs", 1e3), ("ms", 1e6), ("s", 1e9)] {
        if let Some(v) = cell.strip_suffix(unit) {
            return v.parse::<f64>().unwrap() * scale;
        }
    }
    panic!("not a duration: {cell}");
}

/// An uptime cell (`45s`, `1m05s`) in seconds.
fn parse_uptime(cell: &str) -> f64 {
    match cell.split_once('m') {
        Some((m, s)) => {
            m.parse::<f64>().unwrap() * 60.0 + s.trim_end_matches('s').parse::<f64>().unwrap()
        }
        None => cell.trim_end_matches('s').parse().unwrap(),
    }
}

fn within(got: f64, want: f64, what: &str) {
    let tol = (want.abs() * 0.10).max(1e-9);
    assert!(
        (got - want).abs() <= tol,
        "{what}: top shows {got}, stats say {want}"
    );
}

#[test]
fn once_against_a_real_serve_shows_its_pid_and_its_figures() {
    let dir = site("once");
    let server = Serve::start(dir.path(), 1, &[]);
    // Some traffic and a few seconds of uptime, so the figures are not all zero.
    for _ in 0..20 {
        get(server.addr, "/");
    }
    std::thread::sleep(Duration::from_secs(2));
    let url = format!("http://{}/_nodus/", server.addr);
    let out = top_once(&url, "0.2");
    let stats: Value = serde_json::from_slice(&get(server.addr, "/_nodus/stats")).unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.starts_with("nodus top"), "{stdout}");
    let rows = worker_lines(&stdout);
    assert_eq!(rows.len(), 1, "{stdout}");
    let row = &rows[0];
    assert_eq!(row[0], server.proc.id().to_string(), "{stdout}");
    assert_eq!(stats["pid"].as_u64(), Some(server.proc.id() as u64));
    let uptime = parse_uptime(&row[col(&stdout, "UPTIME")]);
    within(
        uptime,
        stats["uptime_seconds"].as_f64().unwrap().floor(),
        "uptime",
    );
    let util: f64 = row[col(&stdout, "UTIL%")].parse().unwrap();
    assert!((0.0..=100.0).contains(&util), "{stdout}");
    // Its own connection is the only one open, at both moments.
    assert_eq!(
        row[col(&stdout, "CONN")],
        stats["http"]["connections_open"].to_string()
    );
    // RSS from the snapshot (`123M`; KiB below 1 MiB).
    let rss = &row[col(&stdout, "RSS")];
    let rss_mib: f64 = match rss.strip_suffix('M') {
        Some(m) => m.parse().unwrap(),
        None => rss.strip_suffix('K').unwrap().parse::<f64>().unwrap() / 1024.0,
    };
    let want = stats["rss_bytes"].as_f64().unwrap() / 1048576.0;
    assert!(
        (rss_mib - want).abs() <= (want * 0.10).max(1.0),
        "RSS {rss} vs {want} MiB"
    );
}

#[test]
fn once_against_a_real_two_worker_serve_shows_both_pids_and_their_figures() {
    let dir = site("once-cluster");
    let (server, pids) = cluster(&dir);
    for _ in 0..20 {
        get(server.addr, "/");
    }
    std::thread::sleep(Duration::from_secs(2));
    let out = top_once(&server.addr.to_string(), "0.2");
    let stats: Value = serde_json::from_slice(&get(server.addr, "/_nodus/stats")).unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success(), "{stdout}");
    let rows = worker_lines(&stdout);
    assert_eq!(rows.len(), 2, "{stdout}");
    for pid in pids {
        let row = rows
            .iter()
            .find(|r| r[0] == pid.to_string())
            .unwrap_or_else(|| panic!("no line for worker {pid}:\n{stdout}"));
        let worker = stats["workers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|w| w["pid"].as_u64() == Some(pid))
            .unwrap();
        let uptime = parse_uptime(&row[col(&stdout, "UPTIME")]);
        within(
            uptime,
            worker["snapshot"]["uptime_seconds"]
                .as_f64()
                .unwrap()
                .floor(),
            "uptime",
        );
        let rss = &row[col(&stdout, "RSS")];
        let rss_mib: f64 = match rss.strip_suffix('M') {
            Some(m) => m.parse().unwrap(),
            None => rss.strip_suffix('K').unwrap().parse::<f64>().unwrap() / 1024.0,
        };
        let want = worker["rss_bytes"].as_f64().unwrap() / 1048576.0;
        assert!(
            (rss_mib - want).abs() <= (want * 0.10).max(1.0),
            "worker {pid}: RSS {rss} vs {want} MiB"
        );
        let util: f64 = row[col(&stdout, "UTIL%")].parse().unwrap();
        assert!((0.0..=100.0).contains(&util), "{stdout}");
    }
}

/// Serves the fake cluster; returns its address and the number of answers given so far.
fn fake_cluster() -> (SocketAddr, Arc<AtomicU64>) {
    let served = Arc::new(AtomicU64::new(0));
    let count = Arc::clone(&served);
    let addr = serve_fake(move |_| {
        let n = count.fetch_add(1, Ordering::SeqCst);
        ("application/json", cluster_doc(n).to_string())
    });
    (addr, served)
}

/// A one-answer-per-connection HTTP server on 127.0.0.1: `answer(head)` gives each request's
/// content type and body. Returns its address.
fn serve_fake(answer: impl Fn(&str) -> (&'static str, String) + Send + 'static) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && conn.read(&mut byte).unwrap_or(0) == 1 {
                head.push(byte[0]);
            }
            let (kind, body) = answer(&String::from_utf8_lossy(&head));
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Type: {kind}\r\nContent-Length: {}\r\n\
                 Connection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    addr
}

const PIDS: [u32; 2] = [31_001, 31_002];

fn hist(values: &[(u64, u64)]) -> HistogramSnapshot {
    let mut h = Histogram::new();
    for &(v, n) in values {
        h.record_n(v, n);
    }
    h.snapshot()
}

/// The document of the fake cluster's `n`-th answer: each answer is 1 s later, worker `i` has
/// served 100·(i+1) more requests and been busy a quarter (worker 0) or half (worker 1) of it.
fn cluster_doc(n: u64) -> Value {
    let workers: Vec<Value> = PIDS
        .iter()
        .enumerate()
        .map(|(i, &pid)| {
            let i = i as u64;
            let mut s = Snapshot {
                pid,
                loop_id: 1,
                uptime_seconds: 125.0 + n as f64,
                taken_at_unix_ms: 1_800_000_000_000 + n * 1000,
                ..Snapshot::default()
            };
            let busy_share = [0.25, 0.5][i as usize];
            s.loop_stats.busy_seconds = 10.0 + n as f64 * busy_share;
            s.loop_stats.idle_seconds = 90.0 + n as f64 * (1.0 - busy_share);
            s.loop_stats.interval_seconds = 1.0;
            s.loop_stats.interval_utilization = busy_share;
            s.loop_stats.timer_lateness = hist(&[(1_000_000 * (i + 1), 980), (20_000_000, 20)]);
            s.loop_stats.schedule_delay =
                hist(&[(5_000, 500), (40_000 * (i + 1), 490), (900_000, 10)]);
            s.run_queue.interval_mean = 1.5 + i as f64;
            s.run_queue.interval_max = 7 + i;
            s.http.connections_open = 11 + i;
            s.http.responses_by_class = [0, 5_000 + n * 100 * (i + 1), 0, 0, 0];
            s.pools = vec![PoolSnapshot {
                pool: "io".into(),
                threads: 4,
                queue_depth: 3,
                busy_threads: 4,
                completed_total: 1_000 + n * 50,
                queue_wait: hist(&[(2_000_000, 100)]),
                ..PoolSnapshot::default()
            }];
            // Worker 0's stall was the process stopped for 200 ms of its 250; worker 1's a
            // drain of short polls, and its tasks panicked 3 times.
            s.stalls = vec![StallReport {
                task_name: "http:static".into(),
                location: "crates/app/src/slow.rs:12:5".into(),
                elapsed_seconds: 0.25,
                class: ["stopped", "on-cpu"][i as usize].into(),
                stopped_seconds: [0.2, 0.0][i as usize],
                at_unix_ms: 1_800_000_000_000,
                polls: [1, 20_345][i as usize],
                began_with: "\"main\" (src/main.rs:4:5)".into(),
                ..StallReport::default()
            }];
            s.tasks.panics_total = 3 * i;
            s.task_classes = vec![nodus::metrics::TaskClassSnapshot {
                name: "job".into(),
                panics: 3 * i,
                ..Default::default()
            }];
            serde_json::json!({
                "worker": i,
                "pid": pid,
                "restarts": 2 * i,
                "rss_bytes": (50 + 10 * i) << 20,
                "snapshot": s,
            })
        })
        .collect();
    serde_json::json!({ "workers": workers, "restarts": 2, "budget_left": 3, "generation": 4 })
}

#[test]
fn once_against_a_two_worker_cluster_shows_both_pids_and_matching_figures() {
    let (addr, served) = fake_cluster();
    let out = top_once(&addr.to_string(), "0.2");
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let header = stdout.lines().next().unwrap();
    assert!(
        header.contains("2 workers") && header.contains("gen 4"),
        "{header}"
    );
    assert!(header.contains("budget 3"), "{header}");
    // The document as it was at top's second fetch.
    let doc = cluster_doc(served.load(Ordering::SeqCst) - 1);
    let rows = worker_lines(&stdout);
    assert_eq!(rows.len(), 2, "{stdout}");
    for (i, w) in doc["workers"].as_array().unwrap().iter().enumerate() {
        let row = rows
            .iter()
            .find(|r| r[0].parse::<u64>().ok() == w["pid"].as_u64())
            .unwrap_or_else(|| {
                panic!("pid {} not shown:\n{stdout}", w["pid"]);
            });
        let s = &w["snapshot"];
        let ls = &s["loop_stats"];
        let cell = |name: &str| row[col(&stdout, name)].as_str();
        let num = |name: &str| cell(name).parse::<f64>().unwrap();
        within(
            parse_uptime(cell("UPTIME")),
            s["uptime_seconds"].as_f64().unwrap(),
            "uptime",
        );
        assert_eq!(cell("RST"), w["restarts"].to_string());
        within(num("UTIL%"), [25.0, 50.0][i], "utilization");
        within(
            parse_ns(cell("LATE99")),
            ls["timer_lateness"]["p99"].as_f64().unwrap(),
            "lateness p99",
        );
        within(
            parse_ns(cell("SCHD50")),
            ls["schedule_delay"]["p50"].as_f64().unwrap(),
            "sched p50",
        );
        within(
            parse_ns(cell("SCHD99")),
            ls["schedule_delay"]["p99"].as_f64().unwrap(),
            "sched p99",
        );
        within(
            num("RQAVG"),
            s["run_queue"]["interval_mean"].as_f64().unwrap(),
            "run queue mean",
        );
        within(
            num("RQMAX"),
            s["run_queue"]["interval_max"].as_f64().unwrap(),
            "run queue max",
        );
        within(
            num("CONN"),
            s["http"]["connections_open"].as_f64().unwrap(),
            "connections",
        );
        within(num("REQ/S"), 100.0 * (i + 1) as f64, "requests/s");
        assert_eq!(cell("RSS"), format!("{}M", 50 + 10 * i));
    }
    // Pools summed over the workers, and said to be: THREADS is 2 workers × 4 threads each,
    // not one pool of 8; the stalls of both.
    assert!(
        stdout.contains("pools: total of 2 workers · THREADS = workers × threads each"),
        "{stdout}"
    );
    assert!(stdout.contains("io          2×4     8      6"), "{stdout}");
    assert_eq!(
        stdout
            .matches("http:static at crates/app/src/slow.rs:12:5")
            .count(),
        2,
        "{stdout}"
    );
    // Worker 0's stop, said once: worker 1's stall had none.
    assert_eq!(
        stdout
            .matches("took 250ms stopped, process stopped 200ms of it\n")
            .count(),
        1,
        "{stdout}"
    );
    assert_eq!(stdout.matches("process stopped").count(), 1, "{stdout}");
    // Worker 1's drain and panics; worker 0's single poll and no panics add nothing.
    assert_eq!(
        stdout
            .matches(
                ", held in drain: 20345 polls, mostly http:static after \"main\" (src/main.rs:4:5)"
            )
            .count(),
        1,
        "{stdout}"
    );
    assert!(
        stdout.contains("  panics: pid 31002: panics 3 (job 3)\n"),
        "{stdout}"
    );
    assert!(!stdout.contains("panics: pid 31001"), "{stdout}");
}

/// A primary answers from worker snapshots up to 1 s old, so `top` refreshing faster gets the
/// same one twice: here each document is served twice. `--once` fetches again until the
/// snapshots change, and shows the rates of that window, never the no traffic a snapshot
/// compared with itself would show.
#[test]
fn once_with_the_same_snapshots_twice_shows_the_rates_of_the_next_ones() {
    let served = Arc::new(AtomicU64::new(0));
    let count = Arc::clone(&served);
    let addr = serve_fake(move |_| {
        let n = count.fetch_add(1, Ordering::SeqCst) / 2;
        ("application/json", cluster_doc(n).to_string())
    });
    let out = top_once(&addr.to_string(), "0.1");
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows = worker_lines(&stdout);
    assert_eq!(rows.len(), 2, "{stdout}");
    for (i, pid) in PIDS.iter().enumerate() {
        let row = rows
            .iter()
            .find(|r| r[0] == pid.to_string())
            .unwrap_or_else(|| panic!("pid {pid} not shown:\n{stdout}"));
        let num = |name: &str| row[col(&stdout, name)].parse::<f64>().unwrap();
        within(num("REQ/S"), 100.0 * (i + 1) as f64, "requests/s");
        within(num("UTIL%"), [25.0, 50.0][i], "utilization");
    }
    // The first document, the same again, and the next.
    assert_eq!(served.load(Ordering::SeqCst), 3, "{stdout}");
}

#[test]
fn once_against_an_unreachable_address_is_one_line_and_fails() {
    let addr = free_addr();
    let out = top_once(&addr.to_string(), "0.2");
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("cannot read") && stderr.contains(&addr.port().to_string()),
        "{stderr}"
    );
    let out = top_once("https://127.0.0.1:1", "1");
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn a_negative_interval_is_an_invalid_value_not_a_hint_to_use_double_dash() {
    let out = top_once(&free_addr().to_string(), "-1");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("`-1` is not a number of seconds between 0.1 and 3600")
            && !stderr.contains("-- -1"),
        "{stderr}"
    );
}

#[test]
fn dashboard_on_a_stdout_that_is_not_a_terminal_is_a_usage_error() {
    // Said before any fetch: the address need not answer.
    let out = Command::new(NODUS)
        .args(["top", &free_addr().to_string()])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("not a terminal") && stderr.contains("--once"),
        "{stderr}"
    );
}

/// A pseudo-terminal: the master side, and the slave's path.
struct Pty {
    master: std::fs::File,
    slave: PathBuf,
}

fn open_pty(cols: u16, rows: u16) -> Pty {
    // SAFETY: plain libc calls on a descriptor this function owns.
    unsafe {
        // Close-on-exec: a child another test starts meanwhile must not keep the master open.
        let fd = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
        assert!(fd >= 0, "posix_openpt: {}", std::io::Error::last_os_error());
        let master = OwnedFd::from_raw_fd(fd);
        assert_eq!(libc::grantpt(fd), 0);
        assert_eq!(libc::unlockpt(fd), 0);
        let mut name = [0 as libc::c_char; 128];
        assert_eq!(libc::ptsname_r(fd, name.as_mut_ptr(), name.len()), 0);
        let slave = std::ffi::CStr::from_ptr(name.as_ptr())
            .to_str()
            .unwrap()
            .into();
        let ws = libc::winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        assert_eq!(libc::ioctl(fd, libc::TIOCSWINSZ, &ws), 0);
        Pty {
            master: master.into(),
            slave,
        }
    }
}

fn open_slave(pty: &Pty) -> std::fs::File {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&pty.slave)
        .unwrap()
}

/// Starts `nodus top --interval 0.2 ADDR` with `slave` as stdin, stdout and stderr; in a new
/// session whose controlling terminal it is when `controlling` (as a terminal window's shell
/// would), else in ours, where the pty is just its stdio.
fn spawn_top(addr: &str, slave: &std::fs::File, controlling: bool) -> Proc {
    let mut cmd = Command::new(NODUS);
    cmd.args(["top", "--interval", "0.2", addr])
        .env("TERM", "xterm-256color")
        .stdin(slave.try_clone().unwrap())
        .stdout(slave.try_clone().unwrap())
        .stderr(slave.try_clone().unwrap());
    if controlling {
        // SAFETY: setsid and ioctl are async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    Proc::spawn(&mut cmd)
}

/// Runs `nodus top ADDR` on a fresh 80×24 pty; returns the child, the slave (kept open to read
/// its modes afterwards) and everything the child writes.
fn top_on_pty(addr: &str) -> (Proc, std::fs::File, Arc<Mutex<Vec<u8>>>, std::fs::File) {
    let pty = open_pty(80, 24);
    let slave = open_slave(&pty);
    let child = spawn_top(addr, &slave, true);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&seen);
    let mut reader = pty.master.try_clone().unwrap();
    std::thread::spawn(move || {
        let mut buf = [0u8; 8192];
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock().unwrap().extend_from_slice(&buf[..n]);
        }
    });
    (child, pty.master, seen, slave)
}

/// The screen an 80×24 terminal shows after `bytes`: enough of a VT100 for what crossterm
/// writes (cursor moves, erase, alternate screen; styles are ignored).
fn screen(bytes: &[u8]) -> Vec<String> {
    let blank = || vec![vec![' '; 80]; 24];
    let mut grid = blank();
    let (mut row, mut col) = (0usize, 0usize);
    let text = String::from_utf8_lossy(bytes);
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\x1b' => {
                if chars.peek() != Some(&'[') {
                    chars.next();
                    continue;
                }
                chars.next();
                let mut params = String::new();
                let mut fin = ' ';
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() || c == '@' || c == '~' {
                        fin = c;
                        break;
                    }
                    params.push(c);
                }
                let nums: Vec<usize> = params
                    .trim_start_matches('?')
                    .split(';')
                    .map(|n| n.parse().unwrap_or(1))
                    .collect();
                match fin {
                    'H' => {
                        row = nums[0].saturating_sub(1).min(23);
                        col = nums.get(1).copied().unwrap_or(1).saturating_sub(1).min(79);
                    }
                    'J' if params == "2" => grid = blank(),
                    'h' | 'l' if params == "?1049" => grid = blank(),
                    _ => {}
                }
            }
            '\r' => col = 0,
            '\n' => row = (row + 1).min(23),
            c if !c.is_control() => {
                if col < 80 {
                    grid[row][col] = c;
                }
                col += 1;
            }
            _ => {}
        }
    }
    grid.into_iter().map(|l| l.into_iter().collect()).collect()
}

/// Waits until every string in `what` is on the screen; returns the screen.
fn wait_for(seen: &Mutex<Vec<u8>>, what: &[&str]) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let lines = screen(&seen.lock().unwrap());
        let text = lines.join("\n");
        if what.iter().all(|w| text.contains(w)) {
            return lines;
        }
        assert!(
            Instant::now() < deadline,
            "{what:?} never appeared on the screen:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The alternate screen was entered and then left, and the line discipline is cooked again.
fn assert_restored(seen: &Mutex<Vec<u8>>, slave: &std::fs::File) {
    std::thread::sleep(Duration::from_millis(200));
    let text = String::from_utf8_lossy(&seen.lock().unwrap()).into_owned();
    let entered = text
        .rfind("\x1b[?1049h")
        .expect("the alternate screen was never entered");
    let left = text
        .rfind("\x1b[?1049l")
        .expect("the alternate screen was not left");
    assert!(
        left > entered,
        "the alternate screen was re-entered after leaving it"
    );
    // SAFETY: tcgetattr on a descriptor we own, into a zeroed struct.
    let modes = unsafe {
        let mut t: libc::termios = std::mem::zeroed();
        assert_eq!(libc::tcgetattr(slave.as_raw_fd(), &mut t), 0);
        t
    };
    assert_ne!(
        modes.c_lflag & libc::ICANON,
        0,
        "still in raw mode (no ICANON)"
    );
    assert_ne!(modes.c_lflag & libc::ECHO, 0, "still in raw mode (no ECHO)");
}

#[test]
fn dashboard_on_an_80x24_terminal_shows_every_worker_and_q_restores_the_terminal() {
    let dir = site("pty-cluster");
    let (server, pids) = cluster(&dir);
    let (mut child, mut master, seen, slave) = top_on_pty(&server.addr.to_string());
    let (a, b) = (pids[0].to_string(), pids[1].to_string());
    wait_for(&seen, &[&a, &b, "Pools", "Recent stalls", "q quit"]);
    // Select the second worker for detail, sort, pause: still alive.
    master.write_all(b"\x1b[B\rsp").unwrap();
    wait_for(&seen, &["PAUSED", "esc all workers"]);
    master.write_all(b"q").unwrap();
    assert_eq!(child.wait_exit(Duration::from_secs(10)), Some(0));
    assert_restored(&seen, &slave);
}

#[test]
fn dashboard_ctrl_c_exits_0_and_restores_the_terminal() {
    let dir = site("pty");
    let server = Serve::start(dir.path(), 1, &[]);
    let (mut child, mut master, seen, slave) = top_on_pty(&server.addr.to_string());
    wait_for(&seen, &[&server.proc.id().to_string(), "Process"]);
    master.write_all(b"\x03").unwrap();
    assert_eq!(child.wait_exit(Duration::from_secs(10)), Some(0));
    assert_restored(&seen, &slave);
}

#[test]
fn admin_page_in_headless_chromium_fills_the_worker_rows() {
    let Some(chromium) = installed(&["chromium", "chromium-browser"]) else {
        return;
    };
    let dir = site("chromium");
    let (server, pids) = cluster(&dir);
    let dom = chromium_dom(chromium, &format!("http://{}/_nodus/", server.addr));
    // One row per worker of the cluster, each with its utilization.
    for pid in pids {
        let row = dom
            .split("<tr ")
            .find(|tag| tag.contains("worker-row") && tag.contains(&format!("data-pid=\"{pid}\"")))
            .unwrap_or_else(|| panic!("no worker row for pid {pid} in the page:\n{dom}"));
        assert!(row.contains('%'), "the row has no utilization: {row}");
    }
    assert!(dom.contains("data-state=\"ok\""), "{dom}");
}

/// Serves the `/_nodus/` page (this build's) and `doc` as `/_nodus/stats`, as a relayed
/// cluster document would come; returns the address.
fn fake_admin(doc: Value) -> SocketAddr {
    const PAGE: &str = include_str!("../src/serve/admin_page.html");
    serve_fake(move |head| {
        if head.starts_with("GET /_nodus/stats ") {
            ("application/json", doc.to_string())
        } else {
            ("text/html; charset=utf-8", PAGE.to_string())
        }
    })
}

/// The DOM of `url` after headless Chromium ran its script for a few (virtual) seconds.
fn chromium_dom(chromium: &str, url: &str) -> String {
    let profile = TempDir::new("chromium-profile");
    let out = Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--virtual-time-budget=3000",
            "--dump-dom",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(url)
        .stderr(Stdio::null())
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The row (`<tr ...>` to `</tr>`) of `dom` whose opening tag has `class` and `attr`.
fn dom_row<'a>(dom: &'a str, class: &str, attr: &str) -> &'a str {
    dom.split("<tr ")
        .find(|tag| {
            let open = tag.split('>').next().unwrap_or("");
            open.contains(class) && open.contains(attr)
        })
        .and_then(|tag| tag.split("</tr>").next())
        .unwrap_or_else(|| panic!("no {class} row with {attr} in the page:\n{dom}"))
}

/// A relayed 3-worker document: worker 1's snapshot has task panics and a drain stall through a
/// process stop, worker 2's was left out, worker 3 is an older build (no panic fields, a stall
/// without `polls` or `stopped_seconds`).
fn relayed_doc() -> Value {
    use nodus::metrics::TaskClassSnapshot;
    let snapshot = |pid: u32, old: bool| {
        let mut s = Snapshot {
            pid,
            loop_id: 1,
            uptime_seconds: 60.0,
            taken_at_unix_ms: 1_800_000_000_000,
            task_classes: ["handler", "job", "quiet"]
                .iter()
                .zip([1, 2, 0])
                .map(|(name, panics)| TaskClassSnapshot {
                    name: (*name).into(),
                    spawned: 5,
                    polls: 50,
                    panics,
                    ..TaskClassSnapshot::default()
                })
                .collect(),
            stalls: vec![StallReport {
                task_name: "ping".into(),
                location: "src/main.rs:12:9".into(),
                elapsed_seconds: 0.101,
                stopped_seconds: 1.5,
                class: "stopped".into(),
                polls: 20_345,
                began_with: "\"main\" (src/main.rs:4:5)".into(),
                note: "GET /slow/thing".into(),
                at_unix_ms: 1_800_000_000_000,
                ..StallReport::default()
            }],
            ..Snapshot::default()
        };
        s.tasks.panics_total = 3;
        let mut s = serde_json::to_value(&s).unwrap();
        if old {
            s["tasks"].as_object_mut().unwrap().remove("panics_total");
            for c in s["task_classes"].as_array_mut().unwrap() {
                c.as_object_mut().unwrap().remove("panics");
            }
            let stall = s["stalls"][0].as_object_mut().unwrap();
            stall.remove("polls");
            stall.remove("began_with");
            stall.remove("note");
            stall.remove("stopped_seconds");
        }
        s
    };
    serde_json::json!({
        "workers": [
            {"worker": 1, "pid": 41_001, "answering": true, "snapshot": snapshot(41_001, false)},
            {"worker": 2, "pid": 41_002, "answering": true, "snapshot": null,
             "snapshot_left_out": "its 9000000-byte snapshot did not fit the IPC frame this document came in"},
            {"worker": 3, "pid": 41_003, "answering": true, "snapshot": snapshot(41_003, true)},
        ],
        "restarts": 0,
        "trimmed": "1 of 3 worker snapshots left out (largest first, see each worker's snapshot_left_out)",
    })
}

#[test]
fn admin_page_in_headless_chromium_shows_panics_drains_stops_and_left_out_snapshots() {
    let Some(chromium) = installed(&["chromium", "chromium-browser"]) else {
        return;
    };
    let addr = fake_admin(relayed_doc());
    let dom = chromium_dom(chromium, &format!("http://{addr}/_nodus/"));
    assert!(dom.contains("data-state=\"ok\""), "{dom}");
    // The left-out worker: said so, with the reason, in its row and in the header.
    let row = dom_row(&dom, "worker-row", "data-pid=\"41002\"");
    assert!(row.contains("left-out"), "{row}");
    assert!(
        row.contains("snapshot left out: its 9000000-byte snapshot did not fit the IPC frame"),
        "{row}"
    );
    assert!(dom.contains("1 snapshot left out"), "{dom}");
    // Worker 1 (selected first): its panics in total and per task name.
    assert!(
        dom.contains(r#"<span id="task-panics" class="bad">3</span>"#),
        "{dom}"
    );
    let job = dom_row(&dom, "task-row", "data-name=\"job\"");
    assert!(job.contains(r#"<td class="n panics bad">2</td>"#), "{job}");
    let quiet = dom_row(&dom, "task-row", "data-name=\"quiet\"");
    assert!(quiet.contains(r#"<td class="n panics">0</td>"#), "{quiet}");
    // Its stall, a drain of short polls: how many, whose, after what.
    let stall = dom_row(&dom, "stall-row", "data-task=\"ping\"");
    assert!(
        stall
            .contains("held in drain: 20,345 polls, mostly ping, after \"main\" (src/main.rs:4:5)"),
        "{stall}"
    );
    // The task's note (the request its handler served), under its name.
    assert!(
        stall.contains(r#"<div class="task-note">[GET /slow/thing]</div>"#),
        "{stall}"
    );
    // How long the process was stopped during it.
    assert!(
        stall.contains(r#"<td class="n stopped warn">1.50 s</td>"#),
        "{stall}"
    );

    // Worker 3, an older build: no panic figures (not 0), no drain line.
    let dom = chromium_dom(chromium, &format!("http://{addr}/_nodus/#worker=3"));
    assert!(dom.contains("Worker #3 · pid 41003"), "{dom}");
    assert!(
        dom.contains(r#"<span id="task-panics" class="">–</span>"#),
        "{dom}"
    );
    let job = dom_row(&dom, "task-row", "data-name=\"job\"");
    assert!(job.contains(r#"<td class="n panics">–</td>"#), "{job}");
    let stall = dom_row(&dom, "stall-row", "data-task=\"ping\"");
    assert!(!stall.contains("held in drain"), "{stall}");
    assert!(!stall.contains("task-note"), "{stall}");
    assert!(stall.contains(r#"<td class="n stopped">–</td>"#), "{stall}");
}

/// Workers the primary found stalled: a Node worker (no snapshot, `answering` null) and a nodus
/// worker whose snapshot came (a take-back it has not seen yet): each row says so, and the
/// header counts them; a worker not stalled does not. A worker whose loop did not answer in
/// time, shown with its last snapshot: its figures are marked old, with their age.
#[test]
fn admin_page_in_headless_chromium_shows_stalled_workers() {
    let Some(chromium) = installed(&["chromium", "chromium-browser"]) else {
        return;
    };
    let snapshot = |pid: u32| {
        serde_json::to_value(Snapshot {
            pid,
            loop_id: 1,
            uptime_seconds: 60.0,
            ..Snapshot::default()
        })
        .unwrap()
    };
    let addr = fake_admin(serde_json::json!({
        "workers": [
            {"worker": 1, "pid": 42_001, "answering": null, "stalled": true, "snapshot": null},
            {"worker": 2, "pid": 42_002, "answering": true, "stalled": true,
             "snapshot": snapshot(42_002), "snapshot_age_seconds": 0.3},
            {"worker": 3, "pid": 42_003, "answering": null, "stalled": false, "snapshot": null},
            {"worker": 4, "pid": 42_004, "answering": false, "stalled": false,
             "snapshot": snapshot(42_004), "snapshot_age_seconds": 2.5},
        ],
        "restarts": 0,
        "workers_wanted": 5,
    }));
    let dom = chromium_dom(chromium, &format!("http://{addr}/_nodus/"));
    assert!(dom.contains("data-state=\"ok\""), "{dom}");
    // Whether the row's classes (its opening tag's first attribute) have `stalled`.
    let stalled_class = |row: &str| {
        row.split('"')
            .nth(1)
            .unwrap()
            .split(' ')
            .any(|c| c == "stalled")
    };
    let node = dom_row(&dom, "worker-row", "data-pid=\"42001\"");
    assert!(stalled_class(node), "{node}");
    assert!(
        node.contains("stalled: it has not taken connections handed to it for 1 s"),
        "{node}"
    );
    let nodus = dom_row(&dom, "worker-row", "data-pid=\"42002\"");
    assert!(stalled_class(nodus), "{nodus}");
    assert!(
        nodus.contains(r#"<span class="bad"> stalled</span>"#),
        "{nodus}"
    );
    let running = dom_row(&dom, "worker-row", "data-pid=\"42003\"");
    assert!(
        !stalled_class(running) && !running.contains("stalled"),
        "{running}"
    );
    assert!(!nodus.contains("not answering"), "{nodus}");
    let old = dom_row(&dom, "worker-row not-answering", "data-pid=\"42004\"");
    assert!(
        old.contains(r#"<span class="warn"> not answering · figures 2.5 s old</span>"#),
        "{old}"
    );
    // What alerts first; a slot in a restart's backoff has no row, and the count says so.
    assert!(
        dom.contains("cluster · 4 of 5 workers · 2 stalled · 0 restarts"),
        "{dom}"
    );
    // Every slot in backoff (a crash loop): no row, and the empty table says how many are wanted.
    let addr = fake_admin(serde_json::json!({
        "workers": [], "restarts": 6, "budget_left": 2, "workers_wanted": 2,
    }));
    let dom = chromium_dom(chromium, &format!("http://{addr}/_nodus/"));
    assert!(
        dom.contains("cluster · 0 of 2 workers · 6 restarts · restart budget left 2"),
        "{dom}"
    );
    assert!(
        dom.contains("No workers are running (2 wanted: restarting"),
        "{dom}"
    );
}

#[test]
fn dashboard_sigterm_exits_0_and_restores_the_terminal() {
    let (addr, _) = fake_cluster();
    let (mut child, _master, seen, slave) = top_on_pty(&addr.to_string());
    wait_for(&seen, &["Workers (2)"]);
    child.signal(rustix::process::Signal::TERM);
    assert_eq!(child.wait_exit(Duration::from_secs(10)), Some(0));
    assert_restored(&seen, &slave);
}

/// Closing the terminal (its pty master: a closed window, a dropped ssh session) ends the
/// dashboard with exit code 0 within a few seconds, whether the pty is its controlling terminal
/// (a hangup and SIGHUP) or only its stdio (its input just ends: reads return 0, no signal).
#[test]
fn dashboard_exits_0_when_its_terminal_is_closed() {
    let (addr, _) = fake_cluster();
    for controlling in [true, false] {
        let pty = open_pty(80, 24);
        let slave = open_slave(&pty);
        let mut child = spawn_top(&addr.to_string(), &slave, controlling);
        drop(slave);
        // Read what it draws (the master never blocks) until the dashboard is up.
        let mut master = pty.master;
        rustix::fs::fcntl_setfl(&master, rustix::fs::OFlags::NONBLOCK).unwrap();
        let mut seen = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(15);
        while !screen(&seen).join("\n").contains("Workers (2)") {
            assert!(
                Instant::now() < deadline,
                "the dashboard never came up (controlling: {controlling}):\n{}",
                String::from_utf8_lossy(&seen)
            );
            let mut buf = [0u8; 8192];
            match master.read(&mut buf) {
                Ok(n) => seen.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => panic!("reading the pty: {e}"),
            }
        }
        drop(master);
        let status = child.exited_within(Duration::from_secs(5));
        assert_eq!(
            status.map(|s| s.code()),
            Some(Some(0)),
            "controlling: {controlling}: {status:?}"
        );
    }
}

/// The primary's own loop (`primary.snapshot`): a row of its own under the workers', labelled
/// `primary`, with its figures, in no count of workers; selectable for its details. A document
/// without it (an older primary) has no such row.
#[test]
fn admin_page_in_headless_chromium_shows_the_primarys_loop_apart_from_the_workers() {
    let Some(chromium) = installed(&["chromium", "chromium-browser"]) else {
        return;
    };
    let snapshot = |pid: u32, utilization: f64| {
        let mut s = Snapshot {
            pid,
            loop_id: 1,
            uptime_seconds: 60.0,
            ..Snapshot::default()
        };
        s.loop_stats.utilization = utilization;
        serde_json::to_value(s).unwrap()
    };
    let mut doc = serde_json::json!({
        "workers": [
            {"worker": 1, "pid": 43_001, "answering": true, "snapshot": snapshot(43_001, 0.1)},
            {"worker": 2, "pid": 43_002, "answering": true, "snapshot": snapshot(43_002, 0.1)},
        ],
        "restarts": 0,
        "workers_wanted": 2,
        "primary": {"pid": 43_000, "rss_bytes": 20 << 20, "uptime_seconds": 60.0,
                    "snapshot": snapshot(43_000, 0.375)},
    });
    let dom = chromium_dom(
        chromium,
        &format!("http://{}/_nodus/", fake_admin(doc.clone())),
    );
    assert!(dom.contains("data-state=\"ok\""), "{dom}");
    let row = dom_row(&dom, "primary-row", "data-pid=\"43000\"");
    assert!(row.contains("<td>primary</td>"), "{row}");
    assert!(row.contains("37.5 %"), "{row}");
    assert!(row.contains("20 MiB"), "{row}");
    // Under the workers' rows, never one of them, and in no count.
    let at = |what: &str| {
        dom.find(what)
            .unwrap_or_else(|| panic!("no {what} in\n{dom}"))
    };
    assert!(
        at("data-pid=\"43002\"") < at("<tr class=\"primary-row"),
        "{dom}"
    );
    assert_eq!(dom.matches("<tr class=\"worker-row").count(), 2, "{dom}");
    assert!(dom.contains("Workers (2)"), "{dom}");
    assert!(dom.contains("cluster · 2 workers · 0 restarts"), "{dom}");
    // Selected, its loop's details.
    let url = format!("http://{}/_nodus/#worker=primary", fake_admin(doc.clone()));
    let dom = chromium_dom(chromium, &url);
    assert!(dom.contains("Primary · pid 43000 · its own loop"), "{dom}");
    assert!(
        dom.contains(r#"<div class="big " id="utilization">37.5 %</div>"#),
        "{dom}"
    );
    // An older primary's document: no primary row, the page as before.
    doc["primary"].as_object_mut().unwrap().remove("snapshot");
    let dom = chromium_dom(chromium, &format!("http://{}/_nodus/", fake_admin(doc)));
    assert!(dom.contains("data-state=\"ok\""), "{dom}");
    assert!(!dom.contains("<tr class=\"primary-row"), "{dom}");
    assert_eq!(dom.matches("<tr class=\"worker-row").count(), 2, "{dom}");
}
