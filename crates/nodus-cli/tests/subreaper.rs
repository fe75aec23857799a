//! The primary as its workers' init (`nodus::process::reaper`): a worker's descendant that
//! escapes (`setsid` in a subshell that exits) or is orphaned by a double fork is re-parented to
//! the primary (`nodus run`, `nodus run --node`), reaped by it when it exits (no zombie left,
//! counted in the stats and the metrics), and stopped with the cluster on SIGTERM (exit code 0,
//! one line saying how many; one that is stopped is continued after its SIGTERM); the workers' own exits are still the supervisor's, with their
//! real exit codes.
//!
//! Every primary is started in its own process group and killed by PID at the end of its test;
//! the workers' descendants (their pids written to a file) are SIGKILLed by PID at the end if
//! they are still there (they left the group). Waits are bounded.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::cluster::{assert_exit, events, run_sh, spawn};
use common::{NODUS, have};
use nodus_testkit::net::free_addr;
use nodus_testkit::proc::Proc;
use nodus_testkit::tmp::TempDir;
use nodus_testkit::tree::{self, KillOnDrop, gone};
use rustix::process::Signal;
use serde_json::Value;

/// How long the primary has to adopt, reap or stop a process.
const LIMIT: Duration = Duration::from_secs(5);

/// The pid a worker wrote to `file`, once written (20 s at most), killed on `cleanup`'s drop.
fn pid_in(file: &Path, cleanup: &mut KillOnDrop) -> i32 {
    let pid = tree::pid_in(file, Duration::from_secs(20));
    cleanup.0.push(pid);
    pid
}

/// Waits until `pid`'s parent is `primary` ([`LIMIT`] at most).
fn assert_adopted_by(pid: i32, primary: u32) {
    tree::wait_parent(pid, primary, LIMIT);
}

/// Waits until `pid` has left the process table, zombie included ([`LIMIT`] at most).
fn assert_reaped(pid: i32, what: &str) {
    let deadline = Instant::now() + LIMIT;
    while Path::new(&format!("/proc/{pid}")).exists() {
        assert!(
            Instant::now() < deadline,
            "{what} {pid} still in the process table ({:?}) {LIMIT:?} on",
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The zombies among `pid`'s children.
fn zombie_children(pid: u32) -> Vec<i32> {
    tree::children(pid)
        .into_iter()
        .filter(|&child| tree::is_zombie(child))
        .collect()
}

/// SIGTERM to `primary`; its exit code (within 30 s) and its output.
fn stop(primary: &mut Proc) -> (Option<i32>, Vec<String>) {
    primary.signal(Signal::TERM);
    let code = primary.wait_exit(Duration::from_secs(30));
    (code, primary.output().to_vec())
}

/// The JSON of `path` on the admin listener `admin`.
fn admin_json(admin: std::net::SocketAddr, path: &str) -> Value {
    let reply = common::http::get(admin, path);
    assert_eq!(reply.status, 200, "{path}");
    serde_json::from_slice(&reply.body).unwrap()
}

#[test]
fn an_escaped_descendant_is_adopted_and_stopped_with_the_cluster() {
    let dir = TempDir::new("reap-escaped");
    let file = dir.path().join("pid");
    let addr = free_addr();
    let mut cleanup = KillOnDrop::default();
    // The subshell starts `sleep` in a session of its own (out of the worker's process group,
    // which the worker's exit kills) and exits: `sleep` is orphaned.
    let worker = format!(
        "(setsid sleep 300 & echo $! > {}) ; exec sleep 300",
        file.display()
    );
    let mut primary =
        spawn(run_sh(["-w", "1", "-l", &addr.to_string()], &worker).env("RUST_LOG", "info"));
    let escaped = pid_in(&file, &mut cleanup);
    assert_adopted_by(escaped, primary.id());
    primary.wait_line("1 worker ready");
    let (code, output) = stop(&mut primary);
    assert_eq!(code, Some(0), "{output:#?}");
    assert_reaped(escaped, "the escaped sleep");
    assert!(
        output
            .iter()
            .any(|l| l.contains("stopped 1 adopted process the workers left behind")),
        "{output:#?}"
    );
}

/// An adopted process that is stopped (SIGSTOP) gets SIGCONT right after the kill signal at
/// the cluster's stop, as systemd sends it: it handles the signal and exits, with no SIGKILL
/// after the kill timeout.
#[test]
fn a_stopped_adopted_process_is_continued_after_its_kill_signal() {
    let dir = TempDir::new("reap-stopped");
    let file = dir.path().join("pid");
    let got = dir.path().join("got-term");
    let mut cleanup = KillOnDrop::default();
    let worker = format!(
        "(setsid sh -c 'trap \"touch {got}; exit 0\" TERM; echo $$ > {file}; \
         while :; do sleep 0.1; done' &) ; exec sleep 300",
        got = got.display(),
        file = file.display()
    );
    let mut primary =
        spawn(run_sh(["-w", "1", "--kill-timeout", "30"], &worker).env("RUST_LOG", "info"));
    let escaped = pid_in(&file, &mut cleanup);
    assert_adopted_by(escaped, primary.id());
    primary.wait_line("1 worker ready");
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(escaped).unwrap(),
        Signal::STOP,
    )
    .unwrap();
    let started = Instant::now();
    let (code, output) = stop(&mut primary);
    assert_eq!(code, Some(0), "{output:#?}");
    // Well inside the 30 s kill timeout a regression waits out before its SIGKILL.
    assert!(started.elapsed() < Duration::from_secs(20), "{output:#?}");
    assert!(got.exists(), "the trap did not run: {output:#?}");
    assert!(
        output.iter().any(|l| l.contains(
            "stopped 1 adopted process the workers left behind (1 got SIGTERM, 0 SIGKILL)"
        )),
        "{output:#?}"
    );
}

#[test]
fn a_node_workers_escaped_descendant_is_adopted_and_stopped_with_the_cluster() {
    if !have("node") {
        return;
    }
    let dir = TempDir::new("reap-node");
    let file = dir.path().join("pid");
    let app = dir.path().join("app.js");
    std::fs::write(
        &app,
        format!(
            "require('child_process').spawn('sh', ['-c', '(setsid sleep 300 & echo $! > {})'], \
             {{ stdio: 'ignore' }});\n\
             require('http').createServer((q, s) => s.end('ok')).listen(0);\n",
            file.display()
        ),
    )
    .unwrap();
    let mut cleanup = KillOnDrop::default();
    let mut primary = spawn(
        Command::new(NODUS)
            .args(["run", "--node", "-w", "1", "--", "node"])
            .arg(&app)
            .env("RUST_LOG", "info"),
    );
    let escaped = pid_in(&file, &mut cleanup);
    assert_adopted_by(escaped, primary.id());
    primary.wait_line("1 worker ready");
    let (code, output) = stop(&mut primary);
    assert_eq!(code, Some(0), "{output:#?}");
    assert_reaped(escaped, "the Node worker's escaped sleep");
    assert!(
        output
            .iter()
            .any(|l| l.contains("stopped 1 adopted process")),
        "{output:#?}"
    );
}

#[test]
fn an_orphan_of_a_double_fork_is_reaped_and_counted_and_no_zombie_is_left() {
    let dir = TempDir::new("reap-double-fork");
    let file = dir.path().join("pid");
    let admin = free_addr();
    let mut cleanup = KillOnDrop::default();
    // A double fork: the middle process (the subshell) exits at once, its child a moment later.
    let worker = format!(
        "(sleep 0.5 & echo $! > {}) ; exec sleep 300",
        file.display()
    );
    let mut primary =
        spawn(run_sh(["-w", "1", "--admin", &admin.to_string()], &worker).env("RUST_LOG", "info"));
    let orphan = pid_in(&file, &mut cleanup);
    assert_adopted_by(orphan, primary.id());
    assert_reaped(orphan, "the orphan");
    assert_eq!(zombie_children(primary.id()), Vec::<i32>::new());
    primary.wait_line("1 worker ready");
    let stats = admin_json(admin, "/_nodus/stats");
    assert_eq!(stats["orphans_adopted"], 1, "{stats}");
    assert_eq!(stats["orphans_reaped"], 1, "{stats}");
    let metrics = common::http::get(admin, "/_nodus/metrics");
    let text = String::from_utf8_lossy(&metrics.body);
    for line in [
        "nodus_cluster_orphans_adopted_total 1",
        "nodus_cluster_orphans_reaped_total 1",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in {text}");
    }
    let (code, output) = stop(&mut primary);
    assert_eq!(code, Some(0), "{output:#?}");
    assert!(
        !output.iter().any(|l| l.contains("adopted process")),
        "nothing was left to stop: {output:#?}"
    );
}

#[test]
fn workers_exits_keep_their_codes_while_orphans_are_reaped_beside_them() {
    let dir = TempDir::new("reap-own");
    let log = dir.path().join("events.jsonl");
    // Each worker orphans a process that exits about when the worker does, then exits 3: the
    // reaper runs on every SIGCHLD next to the workers' exits and must take none of them.
    let mut primary = spawn(&mut run_sh(
        [
            "-w",
            "2",
            "--max-restarts",
            "8",
            "--backoff",
            "0.01,1,0.01",
            "--events",
            log.to_str().unwrap(),
        ],
        "(sleep 0.05 &) ; sleep 0.05; exit 3",
    ));
    assert_exit(&mut primary, Duration::from_secs(60), 75);
    let exits: Vec<Value> = events(&log)
        .into_iter()
        .filter(|e| e["event"] == "exit")
        .collect();
    assert!(exits.len() >= 9, "{exits:#?}");
    for exit in &exits {
        // A stolen status would be an error: no code, no signal.
        assert!(
            exit["code"] == 3 || exit["signal"] == 9 || exit["signal"] == 15,
            "{exit}"
        );
    }
    assert!(
        exits.iter().filter(|e| e["code"] == 3).count() >= 9,
        "{exits:#?}"
    );
}

#[test]
fn a_child_the_program_had_before_it_started_is_reaped_but_neither_adopted_nor_stopped() {
    let dir = TempDir::new("reap-inherited");
    let file = dir.path().join("pid");
    let admin = free_addr();
    let mut cleanup = KillOnDrop::default();
    // A wrapper's background jobs become the primary's children when it `exec`s nodus: a
    // sidecar that runs on, and one that exits a moment later. Neither is something the workers
    // left behind.
    let script = format!(
        "sleep 300 >/dev/null 2>&1 & echo $! > {file}; sleep 0.5 >/dev/null 2>&1 & echo $! > \
         {file}.short; exec {NODUS} run -w 1 --admin {admin} -- sleep 300",
        file = file.display()
    );
    let mut primary = spawn(
        Command::new("sh")
            .args(["-c", &script])
            .env("RUST_LOG", "info"),
    );
    let sidecar = pid_in(&file, &mut cleanup);
    let short = pid_in(&dir.path().join("pid.short"), &mut cleanup);
    primary.wait_line("1 worker ready");
    assert_eq!(tree::parent_of(sidecar), Some(primary.id()));
    // The short one is reaped at its exit all the same: no zombie.
    assert_reaped(short, "the wrapper's short job");
    assert_eq!(zombie_children(primary.id()), Vec::<i32>::new());
    let stats = admin_json(admin, "/_nodus/stats");
    assert_eq!(stats["orphans_adopted"], 0, "{stats}");
    assert_eq!(stats["orphans_reaped"], 0, "{stats}");
    let (code, output) = stop(&mut primary);
    assert_eq!(code, Some(0), "{output:#?}");
    assert!(
        !gone(sidecar),
        "the wrapper's sidecar was stopped with the cluster: {output:#?}"
    );
    assert!(
        !output.iter().any(|l| l.contains("adopted process")),
        "nothing adopted to stop: {output:#?}"
    );
}

#[test]
fn a_second_signal_during_the_drain_kills_the_adopted_processes_at_once() {
    let dir = TempDir::new("reap-hurry");
    let file = dir.path().join("pid");
    let addr = free_addr();
    let mut cleanup = KillOnDrop::default();
    // The worker and the descendant it lets escape (`setsid`) both ignore SIGTERM.
    let worker = format!(
        "trap '' TERM; setsid sh -c 'trap \"\" TERM; echo $$ > {}; while :; do sleep 0.1; \
         done' & while :; do sleep 0.1; done",
        file.display()
    );
    let kill_timeout = Duration::from_secs(8);
    let options = [
        "-w",
        "1",
        "-l",
        &addr.to_string(),
        "--kill-timeout",
        &kill_timeout.as_secs().to_string(),
    ];
    let mut primary = spawn(run_sh(options, &worker).env("RUST_LOG", "info"));
    let escaped = pid_in(&file, &mut cleanup);
    primary.wait_line("1 worker ready");
    primary.signal(Signal::TERM);
    primary.wait_line("SIGTERM to 1 worker");
    let second = Instant::now();
    primary.signal(Signal::TERM);
    let code = primary.wait_exit(Duration::from_secs(30));
    let took = second.elapsed();
    let output = primary.output().to_vec();
    assert_eq!(code, Some(143), "{output:#?}");
    assert!(
        took < kill_timeout / 2,
        "a second signal means now: the stop took {took:?} after it, the kill timeout is \
         {kill_timeout:?}: {output:#?}"
    );
    assert_reaped(escaped, "the escaped shell");
    assert!(
        output.iter().any(|l| l.contains(
            "stopped 1 adopted process the workers left behind (0 got SIGTERM, 1 SIGKILL)"
        )),
        "{output:#?}"
    );
}

/// The processes the workers left belong to the app: at the stop they get `--kill-signal`, not
/// SIGTERM. The worker starts a shell that leaves its group (`setsid -f`, which forks, so the
/// shell's parent exits at once and it is orphaned) and writes which of SIGINT and SIGTERM it got.
#[test]
fn the_adopted_processes_get_the_kill_signal_at_the_stop() {
    let dir = TempDir::new("reap-kill-signal");
    let (file, mark) = (dir.path().join("pid"), dir.path().join("mark"));
    let addr = free_addr();
    let mut cleanup = KillOnDrop::default();
    // Not started with `&`: a non-interactive shell's background job ignores SIGINT for good.
    let worker = format!(
        "setsid -f sh -c 'trap \"echo int > {mark}; exit 0\" INT; \
         trap \"echo term > {mark}; exit 0\" TERM; echo $$ > {file}; \
         while :; do sleep 0.1; done'; exec sleep 300",
        mark = mark.display(),
        file = file.display()
    );
    let options = ["-w", "1", "-l", &addr.to_string(), "--kill-signal", "INT"];
    let mut primary = spawn(run_sh(options, &worker).env("RUST_LOG", "info"));
    let escaped = pid_in(&file, &mut cleanup);
    assert_adopted_by(escaped, primary.id());
    primary.wait_line("1 worker ready");
    let (code, output) = stop(&mut primary);
    assert_eq!(code, Some(0), "{output:#?}");
    assert_reaped(escaped, "the escaped shell");
    assert_eq!(
        std::fs::read_to_string(&mark).ok().as_deref(),
        Some("int\n"),
        "what the adopted shell got: {output:#?}"
    );
    assert!(
        output
            .iter()
            .any(|l| l.contains("adopted process") && l.contains("got SIGINT, 0 SIGKILL)")),
        "{output:#?}"
    );
}
