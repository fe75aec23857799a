//! The orphan guard (`nodus::process::guard`): a primary killed with SIGKILL leaves none of its
//! workers' children running (`nodus run` with a plain program and with `--node`) nor any
//! listening port open, nor any process the primary adopted as its subreaper (a `setsid`
//! escapee, counted in the stats first; a `setsid` daemon with the children in its group; a
//! daemon adopted with nothing else happening, seen by the periodic reaping pass); the
//! guard of `nodus serve --workers` goes with its primary too; the
//! guard shrugs off SIGINT/SIGTERM/SIGHUP/SIGUSR1/SIGUSR2, holds no fd but its socket, shows a command line of
//! its own (`nodus-guard for PID`, not the primary's: `pgrep -f` finds the primary alone), and
//! is reaped by its primary after a SIGTERM stop; a guard that dies is one warning line and the cluster goes on.
//!
//! Every primary is started in its own process group, killed by PID at the end of its test; the
//! workers' background children (their pids written to a file) and the guard are SIGKILLed by
//! PID at the end if they are still there. Waits are bounded (2 s for what the guard does).

mod common;

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::cluster::{assert_exit, run_sh, spawn};
use common::serve::Serve;
use common::{NODUS, have};
use nodus_testkit::net::free_addr;
use nodus_testkit::proc::Proc;
use nodus_testkit::tmp::TempDir;
use nodus_testkit::tree::{self, KillOnDrop, gone};
use rustix::process::{Pid, Signal};

/// How long the guard has to do its work once the primary is gone.
const GUARD_LIMIT: Duration = Duration::from_secs(2);

fn is_guard(pid: i32) -> bool {
    tree::is_named(pid, nodus::process::GUARD_NAME.to_bytes())
}

/// The guard among `primary`'s children: exactly one, checked to hold one fd, a socket.
fn the_guard(primary: u32, cleanup: &mut KillOnDrop) -> i32 {
    let guards: Vec<i32> = tree::children(primary)
        .into_iter()
        .filter(|&p| is_guard(p))
        .collect();
    cleanup.0.extend(&guards);
    assert_eq!(
        guards.len(),
        1,
        "one guard among {:?}",
        tree::children(primary)
    );
    let guard = guards[0];
    let fds: Vec<PathBuf> = std::fs::read_dir(format!("/proc/{guard}/fd"))
        .unwrap()
        .flatten()
        .map(|e| std::fs::read_link(e.path()).unwrap())
        .collect();
    // Its two sockets (groups, and pids from the subreaper), nothing else.
    assert_eq!(fds.len(), 2, "the guard holds two fds: {fds:?}");
    assert!(
        fds.iter()
            .all(|fd| fd.to_string_lossy().starts_with("socket:")),
        "the guard's fds are its sockets: {fds:?}"
    );
    // Its command line (`ps -f`, `pgrep -f`) is its own, not the primary's.
    let cmdline = std::fs::read(format!("/proc/{guard}/cmdline")).unwrap();
    let title = &cmdline[..cmdline.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1)];
    assert_eq!(
        String::from_utf8_lossy(title),
        format!("nodus-guard for {primary}"),
        "the guard's /proc/{guard}/cmdline"
    );
    guard
}

/// The pid a worker wrote to `file`, once written (20 s at most), checked running.
fn pid_in(file: &Path, cleanup: &mut KillOnDrop) -> i32 {
    let pid = tree::pid_in(file, Duration::from_secs(20));
    cleanup.0.push(pid);
    assert!(!gone(pid), "the worker's child {pid} runs");
    pid
}

/// Asserts that every one of `pids` is gone (or a zombie) within [`GUARD_LIMIT`].
fn assert_gone_soon(pids: &[i32], what: &str) {
    if let Err(left) = tree::wait_gone(pids, GUARD_LIMIT) {
        panic!("{what} {left:?} still running {GUARD_LIMIT:?} after the primary was killed");
    }
}

/// Asserts that nothing listens on `addr` any more: it can be bound within [`GUARD_LIMIT`].
fn assert_port_free_soon(addr: SocketAddr) {
    let deadline = Instant::now() + GUARD_LIMIT;
    loop {
        match TcpListener::bind(addr) {
            Ok(_) => return,
            Err(e) => assert!(
                Instant::now() < deadline,
                "{addr} still taken {GUARD_LIMIT:?} after the primary was killed: {e}"
            ),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Kills `primary` with SIGKILL and waits for its exit.
fn kill_primary(primary: &mut Proc) {
    primary.signal(Signal::KILL);
    assert!(
        primary.exited_within(Duration::from_secs(10)).is_some(),
        "the primary dies of SIGKILL"
    );
}

#[test]
fn a_workers_children_and_its_listener_die_with_a_primary_killed_with_sigkill() {
    let dir = TempDir::new("guard-kill");
    let file = dir.path().join("pid");
    let addr = free_addr();
    let mut cleanup = KillOnDrop::default();
    // `sh` forks `sleep`, which inherits the listening socket (fd 3, LISTEN_FDS): it would hold
    // the port open for 300 s.
    let worker = format!("sleep 300 & echo $! > {}; wait", file.display());
    let mut primary = spawn(&mut run_sh(["-w", "1", "-l", &addr.to_string()], &worker));
    let grandchild = pid_in(&file, &mut cleanup);
    let guard = the_guard(primary.id(), &mut cleanup);

    // `pgrep -f` on the primary's arguments finds the primary alone.
    if have("pgrep") {
        let out = Command::new("pgrep")
            .args(["-f", "--", &addr.to_string()])
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            primary.id().to_string(),
            "pgrep -f finds the primary alone"
        );
    }
    // A terminal's Ctrl-C, a service manager's SIGTERM (a `kill $(pgrep ...)` that reached it),
    // a hang-up, a `pkill -USR1 nodus` (the name `nodus-guard` matches): none takes the guard
    // away.
    for sig in [
        Signal::INT,
        Signal::TERM,
        Signal::HUP,
        Signal::USR1,
        Signal::USR2,
    ] {
        rustix::process::kill_process(Pid::from_raw(guard).unwrap(), sig).unwrap();
    }
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !gone(guard),
        "the guard ignores SIGINT, SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2"
    );

    kill_primary(&mut primary);
    assert_gone_soon(&[grandchild], "the worker's child");
    assert_gone_soon(&[guard], "the guard");
    assert_port_free_soon(addr);
}

/// Waits until the primary's stats (`--admin` on `admin`) count `n` adopted processes (5 s at
/// most): a stats request is a reaping pass, which has the guard remember each one running.
fn wait_adopted(admin: SocketAddr, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let reply = common::http::get(admin, "/_nodus/stats");
        assert_eq!(reply.status, 200);
        let stats: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
        if stats["orphans_adopted"] == n {
            return;
        }
        assert!(Instant::now() < deadline, "not {n} adopted: {stats}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `nodus run -w 1 -l ADDR --admin ADMIN -- sh -c WORKER`, both addresses free loopback ones:
/// the primary and its admin address.
fn run_with_admin(worker: &str) -> (Proc, SocketAddr) {
    let (addr, admin) = (free_addr(), free_addr());
    let options = [
        "-w",
        "1",
        "-l",
        &addr.to_string(),
        "--admin",
        &admin.to_string(),
    ];
    (spawn(&mut run_sh(options, worker)), admin)
}

#[test]
fn an_adopted_setsid_process_dies_with_a_primary_killed_with_sigkill() {
    let dir = TempDir::new("guard-adopted");
    let file = dir.path().join("pid");
    let mut cleanup = KillOnDrop::default();
    // The subshell starts `sleep` in a session of its own (out of the worker's group, which the
    // guard knows) and exits: the primary, a subreaper, adopts `sleep`.
    let worker = format!(
        "(setsid sleep 300 & echo $! > {}); exec sleep 300",
        file.display()
    );
    let (mut primary, admin) = run_with_admin(&worker);
    let escaped = pid_in(&file, &mut cleanup);
    tree::wait_parent(escaped, primary.id(), Duration::from_secs(5));
    wait_adopted(admin, 1);
    let guard = the_guard(primary.id(), &mut cleanup);
    kill_primary(&mut primary);
    assert_gone_soon(&[escaped], "the adopted setsid sleep");
    assert_gone_soon(&[guard], "the guard");
}

#[test]
fn a_daemon_adopted_while_nothing_else_happens_dies_with_a_primary_killed_with_sigkill() {
    let dir = TempDir::new("guard-adopted-quiet");
    let file = dir.path().join("pid");
    let addr = free_addr();
    let mut cleanup = KillOnDrop::default();
    // A daemon (`setsid` in a subshell that exits: a double fork). Its re-parenting sends the
    // primary no SIGCHLD, and nothing else makes a reaping pass: the worker runs on, no other
    // child exits, no stats are asked for. Only the subreaper's periodic pass sees it.
    let worker = format!(
        "(setsid sh -c 'echo $$ > {}; exec sleep 300' &); exec sleep 300",
        file.display()
    );
    let mut primary = spawn(
        Command::new(NODUS)
            .args(["run", "-w", "1", "-l", &addr.to_string()])
            .args(["--", "sh", "-c", &worker]),
    );
    let daemon = pid_in(&file, &mut cleanup);
    tree::wait_parent(daemon, primary.id(), Duration::from_secs(5));
    // Three times the period (500 ms), for a loaded machine.
    std::thread::sleep(Duration::from_millis(1500));
    kill_primary(&mut primary);
    assert_gone_soon(&[daemon], "the daemon adopted while nothing else happened");
}

#[test]
fn an_adopted_daemons_own_children_die_with_a_primary_killed_with_sigkill() {
    let dir = TempDir::new("guard-adopted-group");
    let file = dir.path().join("pid");
    let child_file = dir.path().join("child");
    let mut cleanup = KillOnDrop::default();
    // A daemon (`setsid`: it leads a session and a process group) with a child of its own, in
    // its group: the daemon is adopted, its child is not (its parent runs); the guard's kill
    // of the group the daemon leads takes the child too.
    let worker = format!(
        "(setsid sh -c 'sleep 300 & echo $! > {}; exec sleep 300' & echo $! > {}); \
         exec sleep 300",
        child_file.display(),
        file.display()
    );
    let (mut primary, admin) = run_with_admin(&worker);
    let daemon = pid_in(&file, &mut cleanup);
    let child = pid_in(&child_file, &mut cleanup);
    tree::wait_parent(daemon, primary.id(), Duration::from_secs(5));
    tree::wait_parent(child, daemon as u32, Duration::from_secs(5));
    wait_adopted(admin, 1);
    kill_primary(&mut primary);
    assert_gone_soon(&[daemon, child], "the adopted daemon and its child");
}

#[test]
fn a_node_workers_children_die_with_a_primary_killed_with_sigkill() {
    if !have("node") {
        return;
    }
    let dir = TempDir::new("guard-node");
    let file = dir.path().join("pid");
    let app = dir.path().join("app.js");
    std::fs::write(
        &app,
        format!(
            "const c = require('child_process').spawn('sleep', ['300'], {{ stdio: 'ignore' }});\n\
             require('fs').writeFileSync({:?}, String(c.pid));\n\
             setInterval(() => {{}}, 1000);\n",
            file.display().to_string()
        ),
    )
    .unwrap();
    let mut cleanup = KillOnDrop::default();
    let mut primary = spawn(
        Command::new(NODUS)
            .args(["run", "--node", "-w", "1", "--", "node"])
            .arg(&app),
    );
    let grandchild = pid_in(&file, &mut cleanup);
    let guard = the_guard(primary.id(), &mut cleanup);
    kill_primary(&mut primary);
    assert_gone_soon(&[grandchild, guard], "the Node worker's child, the guard");
}

#[test]
fn the_guard_of_nodus_serve_goes_with_its_primary_and_holds_no_port() {
    let dir = TempDir::new("guard-serve");
    std::fs::write(dir.path().join("index.html"), "hello").unwrap();
    let mut cleanup = KillOnDrop::default();
    let mut serve = Serve::start(dir.path(), 2, &[]);
    let guard = the_guard(serve.proc.id(), &mut cleanup);
    let workers: Vec<i32> = tree::children(serve.proc.id())
        .into_iter()
        .filter(|&p| p != guard)
        .collect();
    assert_eq!(workers.len(), 2, "{workers:?}");
    cleanup.0.extend(&workers);
    kill_primary(&mut serve.proc);
    let mut all = workers;
    all.push(guard);
    assert_gone_soon(&all, "the workers, the guard");
    assert_port_free_soon(serve.addr);
}

#[test]
fn a_sigterm_stop_leaves_no_guard_behind() {
    let mut cleanup = KillOnDrop::default();
    let mut primary = spawn(Command::new(NODUS).args(["run", "-w", "2", "--", "sleep", "300"]));
    primary.wait_line("2 workers ready");
    let guard = the_guard(primary.id(), &mut cleanup);
    primary.signal(Signal::TERM);
    assert_exit(&mut primary, Duration::from_secs(20), 0);
    // Reaped by the primary itself before its exit: not even a zombie is left.
    assert!(
        !Path::new(&format!("/proc/{guard}")).exists() || gone(guard),
        "the guard {guard} is gone"
    );
}

#[test]
fn a_guard_that_dies_is_one_warning_line_and_the_cluster_goes_on() {
    let mut cleanup = KillOnDrop::default();
    let mut primary = spawn(
        Command::new(NODUS)
            .args(["run", "-w", "1", "--", "sleep", "300"])
            .env("RUST_LOG", "info"),
    );
    primary.wait_line("1 worker ready");
    let guard = the_guard(primary.id(), &mut cleanup);
    rustix::process::kill_process(Pid::from_raw(guard).unwrap(), Signal::KILL).unwrap();
    primary.wait_line("the orphan guard");
    assert!(primary.exited_within(Duration::from_millis(200)).is_none());
    primary.signal(Signal::TERM);
    assert_eq!(primary.wait_exit(Duration::from_secs(20)), Some(0));
    let warnings = primary
        .output()
        .iter()
        .filter(|l| l.contains("orphan guard"))
        .count();
    assert_eq!(warnings, 1, "{:#?}", primary.output());
}
