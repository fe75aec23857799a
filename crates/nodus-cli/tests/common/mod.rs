//! Helpers the `nodus` command's integration tests share beyond `nodus_testkit`: the binary,
//! external tools (a missing one fails under `CI`), the testkit's HTTP/1.1 client with this
//! crate's bounds (`http`), a started `nodus serve` (`serve`), a cluster primary's process, exit
//! code and event log (`cluster`), and a terminal's hangup (`hang_up`, `hang_up_as`: nodus the
//! session leader, an interactive shell's job, or under `nohup`).
//!
//! Each test file is its own crate and uses a subset of these, hence `allow(dead_code)`.
#![allow(dead_code)]

pub mod cluster;
pub mod http;
pub mod serve;

use std::process::Command;

pub const NODUS: &str = env!("CARGO_BIN_EXE_nodus");

/// The first of `tools` that runs (`TOOL --version`). When none does, the test fails under `CI`
/// and is skipped (after saying so) elsewhere.
pub fn installed<'a>(tools: &[&'a str]) -> Option<&'a str> {
    let found = tools.iter().copied().find(|tool| {
        Command::new(tool)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    });
    if found.is_none() {
        let names = tools.join(" or ");
        assert!(std::env::var_os("CI").is_none(), "CI needs {names}");
        println!("skipped: {names} is not installed");
    }
    found
}

/// Whether `tool` runs; see [`installed`].
pub fn have(tool: &str) -> bool {
    installed(&[tool]).is_some()
}

/// The next datagram on `socket` (a service manager's notify socket, with a receive timeout), its
/// wait retried when a signal cuts it short: with a receive timeout set the kernel never restarts
/// `recv` (signal(7)), so a handler's signal or a stop and continue of the test process (a
/// freezer's thaw too) fails it with `EINTR`.
pub fn recv_datagram(
    socket: &std::os::unix::net::UnixDatagram,
    buf: &mut [u8],
) -> std::io::Result<usize> {
    loop {
        match socket.recv(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            received => return received,
        }
    }
}

/// How nodus runs on the pseudo-terminal [`hang_up_as`] hangs up.
#[derive(Clone, Copy)]
pub enum Tty<'a> {
    /// nodus is the session leader (`ssh -t host nodus ...`, `exec nodus`): the kernel sends it
    /// the hangup's SIGHUP (`SI_KERNEL`).
    Leader,
    /// An interactive shell is the session leader, nodus its foreground job (its own process
    /// group, the terminal's foreground one): at the hangup the shell gets the kernel's SIGHUP
    /// and forwards it to the job with `killpg` (`SI_USER`), as bash does, and outlives nodus,
    /// so nodus gets no SIGHUP from the kernel.
    Shell,
    /// nodus is the session leader started as `nohup` starts it: SIGHUP ignored, stdout and
    /// stderr appended to this file (where the marker is looked for), stdin from /dev/null
    /// (`false`: left on the terminal, as after `trap '' HUP` in a shell).
    Nohup(&'a std::path::Path, bool),
}

/// What [`hang_up_as`] saw: `exit N` or `still running` (nodus is SIGKILLed when this is
/// dropped), and nodus's pid.
pub struct HungUp {
    pub outcome: String,
    pub pid: i32,
    _kill: nodus_testkit::tree::KillOnDrop,
}

/// [`hang_up_as`] with nodus the session leader and a 30 s wait: its outcome.
pub fn hang_up(marker: &str, args: &[&str]) -> String {
    hang_up_as(Tty::Leader, marker, args, 30).outcome.clone()
}

/// Runs `nodus ARGS` on a new pseudo-terminal (python3's `pty.fork`: the session's
/// controlling terminal), as `tty` says, waits for a line of its output containing `marker`,
/// then hangs the terminal up (closes the master, as when an SSH session drops) and waits
/// `wait_s` seconds at most for nodus to exit. Needs python3.
pub fn hang_up_as(tty: Tty, marker: &str, args: &[&str], wait_s: u32) -> HungUp {
    const SCRIPT: &str = r#"
import os, pty, select, signal, sys, time
marker, mode, wait, log = sys.argv[1].encode(), sys.argv[2], float(sys.argv[3]), sys.argv[4]
argv = sys.argv[5:]
report_r, report_w = os.pipe()  # the shell's reports; not inherited by nodus (close-on-exec)
def start():
    # A terminal's SIGHUP, whatever the test runs under (`nohup`, a CI runner that ignores
    # it): nodus takes an ignored SIGHUP at its start for nohup's.
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    if mode.startswith("nohup"):
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        if mode == "nohup":
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
    os.execv(argv[0], argv)
pid, fd = pty.fork()
if pid == 0:
    if mode != "shell":
        start()
    job = os.fork()
    if job == 0:
        os.setpgid(0, 0)
        signal.signal(signal.SIGTTOU, signal.SIG_IGN)
        os.tcsetpgrp(0, os.getpid())
        signal.signal(signal.SIGTTOU, signal.SIG_DFL)
        start()
    signal.signal(signal.SIGHUP, lambda *_: os.killpg(job, signal.SIGHUP))
    os.write(report_w, b"nodus %d\n" % job)
    _, status = os.waitpid(job, 0)
    os.write(report_w, b"exit %d\n" % os.waitstatus_to_exitcode(status))
    os._exit(0)
os.close(report_w)
reports = b""
def report(timeout):
    global reports
    if select.select([report_r], [], [], timeout)[0]:
        reports += os.read(report_r, 4096)
nodus = pid
if mode == "shell":
    deadline = time.time() + 30
    while b"\n" not in reports and time.time() < deadline:
        report(0.1)
    nodus = int(reports.split(b"\n")[0].split()[1])
print("nodus", nodus, pid, flush=True)
seen, deadline = b"", time.time() + 30
while marker not in seen and time.time() < deadline:
    if mode.startswith("nohup"):
        time.sleep(0.1)
        seen = open(log, "rb").read() if os.path.exists(log) else b""
    elif select.select([fd], [], [], 0.1)[0]:
        try:
            seen += os.read(fd, 65536)
        except OSError:
            break
os.close(fd)
deadline = time.time() + wait
while time.time() < deadline:
    if mode == "shell":
        report(0.05)
        for line in reports.split(b"\n"):
            if line.startswith(b"exit "):
                print(line.decode(), flush=True)
                sys.exit(0)
    else:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            print("exit", os.waitstatus_to_exitcode(status), flush=True)
            sys.exit(0)
        time.sleep(0.05)
print("still running", flush=True)
"#;
    let (mode, log) = match tty {
        Tty::Leader => ("leader", "-".to_string()),
        Tty::Shell => ("shell", "-".to_string()),
        Tty::Nohup(log, stdin_null) => (
            if stdin_null { "nohup" } else { "nohup-stdin" },
            log.to_str().unwrap().to_string(),
        ),
    };
    let mut helper = cluster::spawn(
        Command::new("python3")
            .args(["-c", SCRIPT, marker, mode, &wait_s.to_string(), &log, NODUS])
            .args(args),
    );
    let line = helper.wait_line("nodus ");
    let pids: Vec<i32> = line
        .split_whitespace()
        .skip(1)
        .map(|p| p.parse().unwrap())
        .collect();
    // In a session of its own: the helper's group kill does not reach it (nor the shell).
    let kill = nodus_testkit::tree::KillOnDrop(pids.clone());
    helper.wait_exit(std::time::Duration::from_secs(u64::from(wait_s) + 40));
    let outcome = helper
        .output()
        .iter()
        .find(|l| l.starts_with("exit ") || l.starts_with("still running"))
        .cloned();
    HungUp {
        outcome: outcome.unwrap_or_else(|| panic!("no outcome: {:#?}", helper.output())),
        pid: pids[0],
        _kill: kill,
    }
}
