//! Helpers the `nodus` command's integration tests share beyond `nodus_testkit`: the binary,
//! external tools (a missing one fails under `CI`), the testkit's HTTP/1.1 client with this
//! crate's bounds (`http`), a started `nodus serve` (`serve`), a cluster primary's process, exit
//! code and event log (`cluster`), and a terminal's hangup (`hang_up`).
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

/// Runs `nodus ARGS` on a new pseudo-terminal (its controlling terminal: python3's `pty.fork`),
/// waits for a line of its output containing `marker`, then hangs the terminal up (closes the
/// master: the kernel sends the session leader, nodus, SIGHUP with `SI_KERNEL`, as when an SSH
/// session drops) and waits 30 s at most for nodus to exit. Returns what it did: `exit N`, or
/// `still running` (nodus is SIGKILLed then). Needs python3.
pub fn hang_up(marker: &str, args: &[&str]) -> String {
    const SCRIPT: &str = r#"
import os, pty, select, sys, time
pid, fd = pty.fork()
if pid == 0:
    os.execv(sys.argv[2], sys.argv[2:])
print("nodus", pid, flush=True)
seen, deadline = b"", time.time() + 30
while sys.argv[1].encode() not in seen and time.time() < deadline:
    if select.select([fd], [], [], 0.1)[0]:
        try:
            seen += os.read(fd, 65536)
        except OSError:
            break
os.close(fd)
deadline = time.time() + 30
while time.time() < deadline:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        print("exit", os.waitstatus_to_exitcode(status), flush=True)
        sys.exit(0)
    time.sleep(0.05)
print("still running", flush=True)
"#;
    let mut helper = cluster::spawn(
        Command::new("python3")
            .args(["-c", SCRIPT, marker, NODUS])
            .args(args),
    );
    let line = helper.wait_line("nodus ");
    let pid: i32 = line.trim_start_matches("nodus ").trim().parse().unwrap();
    // In a session of its own: the helper's group kill does not reach it.
    let _nodus = nodus_testkit::tree::KillOnDrop(vec![pid]);
    helper.wait_exit(std::time::Duration::from_secs(70));
    let outcome = helper
        .output()
        .iter()
        .find(|l| l.starts_with("exit ") || l.starts_with("still running"))
        .cloned();
    outcome.unwrap_or_else(|| panic!("no outcome: {:#?}", helper.output()))
}
