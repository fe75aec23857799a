//! What a Node user's habits do to nodus, through the `nodus` command: SIGUSR1 and SIGUSR2 (a
//! `pkill -USR2 -f 'node app.js'` matches the primary's command line too) sent to a cluster
//! primary (`nodus run`, `nodus serve --workers 2`), to a `nodus serve` worker or to the single
//! `nodus serve` process stop nothing, restart nothing and are one line each; `nodus run --node`
//! refuses a launcher that is a Node program itself (`npm start`: a fake `npm` on `PATH`; by
//! name, by path and through a symlink to its `-cli.js`; or given as `node`'s script: `node
//! .../npm-cli.js start`) with exit code 2 before any worker starts, quoting package.json's
//! script, while a plain `nodus run` runs it; `--raw-output`
//! writes the workers' lines without their prefix (`nodus run`, `nodus serve --workers 2`).
//!
//! Every process is started in its own process group, whose whole group is killed by PID when
//! the test ends; the single `nodus serve` is stopped by PID.

mod common;

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::NODUS;
use common::cluster::{assert_exit, count, events, spawn, wait_ready_pids};
use common::http::get_ok;
use common::serve::Serve;
use nodus_testkit::net::free_addr;
use nodus_testkit::proc::Proc;
use nodus_testkit::tmp::TempDir;
use rustix::process::{Pid, Signal};

/// Sends SIGUSR1, then SIGUSR2, to `pid`, waiting for the line each gives: the signal's name
/// followed by `then` (a process that dies of one never writes it).
fn usr1_then_usr2(proc: &mut Proc, pid: u32, then: &str) {
    for (sig, name) in [(Signal::USR1, "SIGUSR1"), (Signal::USR2, "SIGUSR2")] {
        rustix::process::kill_process(Pid::from_raw(pid as i32).unwrap(), sig).unwrap();
        proc.wait_line(&format!("{name}{then}"));
    }
}

/// Asserts that each signal's line (its name followed by `then`) was written once.
#[track_caller]
fn one_line_each(lines: &[String], then: &str) {
    for name in ["SIGUSR1", "SIGUSR2"] {
        let needle = format!("{name}{then}");
        let n = lines.iter().filter(|l| l.contains(&needle)).count();
        assert_eq!(n, 1, "{needle:?}: {lines:#?}");
    }
}

/// The worker pids a cluster's `/_nodus/stats` lists, sorted.
fn worker_pids(addr: SocketAddr) -> Vec<u64> {
    let stats: serde_json::Value = serde_json::from_str(&get_ok(addr, "/_nodus/stats")).unwrap();
    let mut pids: Vec<u64> = stats["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["pid"].as_u64().unwrap())
        .collect();
    pids.sort_unstable();
    pids
}

/// `nodus serve DIR --workers 2 EXTRA...` on a free loopback port, DIR holding `a.txt`; returned
/// once both workers are ready.
fn two_worker_serve(tag: &str, extra: &[&str]) -> (TempDir, SocketAddr, Proc) {
    let dir = TempDir::new(tag);
    std::fs::write(dir.path().join("a.txt"), "hello\n").unwrap();
    let addr = free_addr();
    let mut primary = spawn(
        Command::new(NODUS)
            .arg("serve")
            .arg(dir.path())
            .args(["--workers", "2", "--listen", &addr.to_string()])
            .args(extra)
            .env("RUST_LOG", "info"),
    );
    primary.wait_line("2 workers ready");
    (dir, addr, primary)
}

#[test]
fn sigusr1_and_sigusr2_to_a_run_primary_stop_nothing() {
    let dir = TempDir::new("usr-run");
    let log = dir.path().join("events.jsonl");
    let mut primary = spawn(
        Command::new(NODUS)
            .args(["run", "-w", "2", "--ready-after", "0.2", "--events"])
            .arg(&log)
            .args(["--", "sleep", "60"])
            .env("RUST_LOG", "info"),
    );
    let pids = wait_ready_pids(&log, 2);
    let id = primary.id();
    usr1_then_usr2(&mut primary, id, " to the cluster primary");
    // Killed by either, the primary (and its workers) would be gone well within this.
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        primary.exited_within(Duration::ZERO).is_none(),
        "{:#?}",
        primary.output()
    );
    let evs = events(&log);
    assert_eq!(count(&evs, "exit"), 0, "no worker exited: {evs:#?}");
    // The line names the workers' pids, where such a signal is meant to go.
    let line = primary.wait_line("SIGUSR2 to the cluster primary");
    for pid in &pids {
        assert!(line.contains(&format!(" pid {pid}")), "{line}");
    }
    // The stop paths are intact: SIGTERM drains and exits 0.
    primary.signal(Signal::TERM);
    assert_exit(&mut primary, Duration::from_secs(20), 0);
    one_line_each(primary.output(), " to the cluster primary");
}

#[test]
fn sigusr1_and_sigusr2_to_a_serve_primary_or_worker_stop_nothing() {
    let (_dir, addr, mut primary) = two_worker_serve("usr-serve", &[]);
    let before = worker_pids(addr);
    let id = primary.id();
    usr1_then_usr2(&mut primary, id, " to the cluster primary");
    // A `pkill -USR1 -f 'nodus serve'` reaches the workers too.
    let worker = before[0] as u32;
    let worker_line = format!(" (pid {worker}): ignored");
    usr1_then_usr2(&mut primary, worker, &worker_line);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(get_ok(addr, "/a.txt"), "hello\n");
    assert_eq!(worker_pids(addr), before, "the same workers serve");
    primary.signal(Signal::TERM);
    assert_exit(&mut primary, Duration::from_secs(20), 0);
    let lines = primary.output();
    one_line_each(lines, " to the cluster primary");
    one_line_each(lines, &worker_line);
}

#[test]
fn sigusr1_and_sigusr2_to_a_single_serve_process_stop_nothing() {
    let dir = TempDir::new("usr-serve-one");
    std::fs::write(dir.path().join("a.txt"), "hello\n").unwrap();
    let mut serve = Serve::start(dir.path(), 1, &[]);
    let pid = serve.proc.id();
    let then = format!(" (pid {pid}): ignored");
    usr1_then_usr2(&mut serve.proc, pid, &then);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(get_ok(serve.addr, "/a.txt"), "hello\n");
    serve.proc.signal(Signal::TERM);
    assert_eq!(
        serve.proc.wait_exit(Duration::from_secs(20)),
        Some(0),
        "{:#?}",
        serve.proc.output()
    );
    one_line_each(serve.proc.output(), &then);
}

/// An executable `sh` script `name` in `dir` running `body`.
fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

#[test]
fn run_node_refuses_a_launcher_that_is_a_node_program_before_any_worker_starts() {
    let dir = TempDir::new("launcher");
    let bin = dir.path().join("bin");
    let npm_bin = dir.path().join("node_modules/npm/bin");
    let app = dir.path().join("app");
    for d in [&bin, &npm_bin, &app] {
        std::fs::create_dir_all(d).unwrap();
    }
    // Each fake launcher leaves a mark when it runs, and exits.
    let marker = dir.path().join("ran");
    let body = format!("echo \"$0 $*\" >> {}", marker.display());
    let npm = script(&bin, "npm", &body);
    script(&bin, "yarn", &body);
    // npx as npm installs it: a symlink to its `-cli.js`; and another name for it.
    let npx_cli = script(&npm_bin, "npx-cli.js", &body);
    std::os::unix::fs::symlink(&npx_cli, bin.join("npx")).unwrap();
    std::os::unix::fs::symlink(&npx_cli, bin.join("launch")).unwrap();
    std::fs::write(
        app.join("package.json"),
        r#"{"scripts": {"start": "node server.js --port 3000", "dev": "next dev"}}"#,
    )
    .unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let quoted = "nodus run --node [OPTIONS] -- node server.js --port 3000 (package.json's \
                  scripts.start)";
    let npm = npm.to_str().unwrap();
    for (command, said) in [
        (
            &["npm", "start"][..],
            &["npm is a Node program", quoted][..],
        ),
        (
            &[npm, "run", "start"][..],
            &["npm is a Node program", quoted][..],
        ),
        (
            &["npx", "serve"][..],
            &["npx is a Node program", "-- node FILE"][..],
        ),
        (
            &["launch"][..],
            &["npx is a Node program", "-- node FILE"][..],
        ),
        (
            &["yarn", "dev"][..],
            &["yarn is a Node program", "scripts.dev is `next dev`"][..],
        ),
    ] {
        let mut primary = spawn(
            Command::new(NODUS)
                .args(["run", "--node", "-w", "2", "--"])
                .args(command)
                .current_dir(&app)
                .env("PATH", &path),
        );
        assert_exit(&mut primary, Duration::from_secs(10), 2);
        let out = primary.output().join("\n");
        for s in said {
            assert!(out.contains(s), "{command:?}: {s:?} in {out}");
        }
        assert!(!marker.exists(), "{command:?}: no worker started");
    }
    // Without --node a launcher is a program like any other.
    let mut primary = spawn(
        Command::new(NODUS)
            .args([
                "run",
                "-w",
                "1",
                "--restart",
                "temporary",
                "--",
                "npm",
                "start",
            ])
            .current_dir(&app)
            .env("PATH", &path),
    );
    assert_exit(&mut primary, Duration::from_secs(20), 0);
    let ran = std::fs::read_to_string(&marker).unwrap();
    assert!(ran.ends_with("npm start\n"), "{ran}");
}

/// A launcher given as `node`'s script (`node /usr/lib/node_modules/npm/bin/npm-cli.js start`,
/// behind node's own options too) is refused as the launcher itself is; an `-e` code's argument
/// is no script. `node` is a fake on `PATH` that leaves a mark if a worker runs it.
#[test]
fn run_node_refuses_a_launcher_given_as_nodes_script() {
    let dir = TempDir::new("node-launcher");
    let (bin, app) = (dir.path().join("bin"), dir.path().join("app"));
    let npm_bin = dir.path().join("node_modules/npm/bin");
    for d in [&bin, &npm_bin, &app] {
        std::fs::create_dir_all(d).unwrap();
    }
    let marker = dir.path().join("ran");
    let body = format!("echo \"$0 $*\" >> {}; exec sleep 600", marker.display());
    script(&bin, "node", &body);
    let npm_cli = script(&npm_bin, "npm-cli.js", "exit 0");
    let npx_cli = script(&npm_bin, "npx-cli.js", "exit 0");
    std::os::unix::fs::symlink(&npx_cli, app.join("launch")).unwrap();
    std::fs::write(
        app.join("package.json"),
        r#"{"scripts": {"start": "node server.js --port 3000"}}"#,
    )
    .unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let quoted = "nodus run --node [OPTIONS] -- node server.js --port 3000 (package.json's \
                  scripts.start)";
    let (npm_cli, npx_cli) = (npm_cli.to_str().unwrap(), npx_cli.to_str().unwrap());
    for (command, said) in [
        (
            &["node", npm_cli, "start"][..],
            &["npm is a Node program", quoted][..],
        ),
        (
            &["node", "--inspect", "-r", "mod", npm_cli, "run", "start"][..],
            &["npm is a Node program", quoted][..],
        ),
        (
            &["node", "--", npx_cli, "serve"][..],
            &["npx is a Node program", "-- node FILE"][..],
        ),
        // A symlink to it, found from the working directory as Node finds its script.
        (
            &["node", "launch"][..],
            &["npx is a Node program", "-- node FILE"][..],
        ),
    ] {
        let mut primary = spawn(
            Command::new(NODUS)
                .args(["run", "--node", "-w", "2", "--"])
                .args(command)
                .current_dir(&app)
                .env("PATH", &path),
        );
        assert_exit(&mut primary, Duration::from_secs(10), 2);
        let out = primary.output().join("\n");
        for s in said {
            assert!(out.contains(s), "{command:?}: {s:?} in {out}");
        }
        assert!(!marker.exists(), "{command:?}: no worker started");
    }
    // `npm-cli.js` as an `-e` code's argument is no script: the workers start.
    let mut primary = spawn(
        Command::new(NODUS)
            .args(["run", "--node", "-w", "1", "--kill-timeout", "1", "--"])
            .args(["node", "-e", "X", npm_cli])
            .current_dir(&app)
            .env("PATH", &path),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while !marker.exists() {
        assert!(
            Instant::now() < deadline,
            "node -e X npm-cli.js: no worker ran: {:#?}",
            primary.output()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    primary.signal(Signal::TERM);
    primary.wait_exit(Duration::from_secs(30));
}

#[test]
fn raw_output_writes_the_workers_lines_without_their_prefix() {
    // pino's lines on stdout, one on stderr, a last one without a newline.
    let worker = r#"echo '{"level":30,"msg":"hi"}'; echo '{"level":50}' >&2; printf '{"last":1}'"#;
    let expected = [
        r#"{"level":30,"msg":"hi"}"#,
        r#"{"level":50}"#,
        r#"{"last":1}"#,
    ];
    for raw in [false, true] {
        let mut primary = spawn(
            Command::new(NODUS)
                .args(["run", "-w", "1", "--restart", "temporary"])
                .args(raw.then_some("--raw-output"))
                .args(["--", "sh", "-c", worker]),
        );
        assert_exit(&mut primary, Duration::from_secs(20), 0);
        let out = primary.output();
        for line in expected {
            let found = out.iter().find(|l| l.ends_with(line));
            let found = found.unwrap_or_else(|| panic!("{line}: {out:#?}"));
            if raw {
                assert_eq!(found, line, "as the worker wrote it");
            } else {
                assert!(found.starts_with("[worker 1 "), "{found}");
            }
        }
    }
    // `nodus serve --workers 2`: a worker's access-log line.
    let (_dir, addr, mut primary) =
        two_worker_serve("raw-serve", &["--raw-output", "--access-log"]);
    assert_eq!(get_ok(addr, "/a.txt"), "hello\n");
    let line = primary.wait_line("GET /a.txt");
    assert!(!line.contains("[worker "), "{line}");
    primary.signal(Signal::TERM);
    assert_exit(&mut primary, Duration::from_secs(20), 0);
}
