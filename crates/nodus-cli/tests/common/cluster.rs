//! A started cluster primary (`nodus run`, with `run_sh` workers that run a shell script;
//! `nodus serve --workers`), its exit code and its event log; a copy of the nodus binary (to
//! deploy over).

use std::ffi::OsStr;
use std::io::PipeReader;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nodus_testkit::net::free_addr;
use nodus_testkit::proc::Proc;
use nodus_testkit::tmp::TempDir;
use serde_json::Value;

use super::NODUS;

/// `cmd` in its own process group, its stdout and stderr lines captured.
pub fn spawn(cmd: &mut Command) -> Proc {
    Proc::spawn_group(cmd.stdout(Stdio::piped()).stderr(Stdio::piped()))
}

/// `nodus run OPTIONS... -- sh -c SCRIPT`: workers that run the shell script `SCRIPT`, the
/// command to give its environment and start with [`spawn`].
pub fn run_sh<S: AsRef<OsStr>>(options: impl IntoIterator<Item = S>, script: &str) -> Command {
    let mut cmd = Command::new(NODUS);
    cmd.arg("run")
        .args(options)
        .args(["--", "sh", "-c", script]);
    cmd
}

/// Waits for `primary`'s exit (failing the test after `limit`) and asserts its exit code, with
/// its output in the message.
#[track_caller]
pub fn assert_exit(primary: &mut Proc, limit: Duration, code: i32) {
    assert_eq!(
        primary.wait_exit(limit),
        Some(code),
        "{:#?}",
        primary.output()
    );
}

/// `nodus run --node OPTIONS... -- node app.js` with `RUST_LOG=info`, `app` (JavaScript) written
/// to `app.js` in `dir` and `PORT` a free loopback port: the address and the command, to give
/// more of its environment and start with [`spawn`].
pub fn node_app(dir: &Path, app: &str, options: &[&str]) -> (SocketAddr, Command) {
    std::fs::write(dir.join("app.js"), app).unwrap();
    let addr = free_addr();
    let mut cmd = Command::new(NODUS);
    cmd.args(["run", "--node"])
        .args(options)
        .args(["--", "node"])
        .arg(dir.join("app.js"))
        .env("PORT", addr.port().to_string())
        .env("RUST_LOG", "info");
    (addr, cmd)
}

/// [`node_app`] `-w WORKERS EXTRA...` in a new directory named after `name`, once every worker
/// is ready: the directory, the address, the primary.
pub fn run_node_app(
    name: &str,
    app: &str,
    workers: u32,
    extra: &[&str],
) -> (TempDir, SocketAddr, Proc) {
    let dir = TempDir::new(name);
    let workers_arg = workers.to_string();
    let options: Vec<&str> = ["-w", workers_arg.as_str()]
        .into_iter()
        .chain(extra.iter().copied())
        .collect();
    let (addr, mut cmd) = node_app(dir.path(), app, &options);
    let mut primary = spawn(&mut cmd);
    let s = if workers == 1 { "" } else { "s" };
    primary.wait_line(&format!("{workers} worker{s} ready"));
    (dir, addr, primary)
}

/// `cmd` in its own process group, its stdout and stderr both into one new pipe (as `2>&1 |`
/// does, so the order of its lines across the two is kept): the process and the pipe's read end.
pub fn spawn_into_pipe(mut cmd: Command) -> (Proc, PipeReader) {
    let (reader, writer) = std::io::pipe().unwrap();
    cmd.stdin(Stdio::null())
        .stdout(writer.try_clone().unwrap())
        .stderr(writer);
    let proc = Proc::spawn_group(&mut cmd);
    drop(cmd); // our copies of the write end
    (proc, reader)
}

/// The events written so far to the log at `path` (`--events`), one JSON object each.
pub fn events(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Waits (20 s at most) until the event log satisfies `what`; returns the events.
pub fn wait_events(path: &Path, what: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let evs = events(path);
        if what(&evs) {
            return evs;
        }
        assert!(
            Instant::now() < deadline,
            "events never got there: {evs:#?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits (20 s at most) for `n` `ready` events in the log at `path`; the pids they name, in
/// their order.
pub fn wait_ready_pids(path: &Path, n: usize) -> Vec<i32> {
    wait_events(path, |e| count(e, "ready") == n)
        .iter()
        .filter(|e| e["event"] == "ready")
        .map(|e| e["pid"].as_i64().unwrap() as i32)
        .collect()
}

/// The entry of worker process `pid` in the cluster's stats `doc` (`/_nodus/stats`).
pub fn worker_entry(doc: &Value, pid: i32) -> Value {
    doc["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["pid"] == pid)
        .unwrap_or_else(|| panic!("no worker {pid} in {doc}"))
        .clone()
}

/// How many of `evs` are `event`.
pub fn count(evs: &[Value], event: &str) -> usize {
    evs.iter().filter(|e| e["event"] == event).count()
}

/// Copies the nodus binary to `to` and waits until the copy can be run: a fork in another test
/// of this process may hold the copy's write fd for a moment (`ETXTBSY` until it execs).
pub fn copy_nodus(to: &Path) {
    std::fs::copy(NODUS, to).unwrap();
    for _ in 0..250 {
        match Command::new(to).arg("--version").output() {
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::TXTBSY.raw_os_error()) => {
                std::thread::sleep(Duration::from_millis(20));
            }
            run => {
                assert!(run.unwrap().status.success());
                return;
            }
        }
    }
    panic!("{} stayed busy (ETXTBSY) for 5 s", to.display());
}
