//! Helpers the `nodus` command's integration tests share beyond `nodus_testkit`: the binary,
//! external tools (a missing one fails under `CI`), the testkit's HTTP/1.1 client with this
//! crate's bounds (`http`), a started `nodus serve` (`serve`) and a cluster primary's process, exit
//! code and event log (`cluster`).
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
