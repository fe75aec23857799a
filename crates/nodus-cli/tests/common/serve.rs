//! A running `nodus serve` on 127.0.0.1 port 0, its address read from its startup line.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};

use nodus_testkit::proc::Proc;

use super::NODUS;

pub struct Serve {
    /// Stopped by PID on drop; its stderr lines (`RUST_LOG=info`) are `proc.lines`.
    pub proc: Proc,
    pub addr: SocketAddr,
}

impl Serve {
    /// `nodus serve DIR --listen 127.0.0.1:0 --workers WORKERS EXTRA...`, once it listens.
    pub fn start(dir: &Path, workers: u32, extra: &[&str]) -> Serve {
        Serve::start_with(dir, workers, extra, |_| {})
    }

    /// [`Serve::start`], with `adjust` applied to the command first (a user to run as, say).
    pub fn start_with(
        dir: &Path,
        workers: u32,
        extra: &[&str],
        adjust: impl FnOnce(&mut Command),
    ) -> Serve {
        let mut cmd = Command::new(NODUS);
        cmd.arg("serve")
            .arg(dir)
            .args(["--listen", "127.0.0.1:0", "--workers", &workers.to_string()])
            .args(extra)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        adjust(&mut cmd);
        let mut proc = Proc::spawn(&mut cmd);
        let line = proc.wait_line("on http://");
        let addr = line
            .split("on http://")
            .nth(1)
            .and_then(|rest| rest.split('/').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no address in the startup line {line:?}"));
        Serve { proc, addr }
    }
}
