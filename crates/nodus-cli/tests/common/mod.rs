//! Helpers the `nodus` command's integration tests share: temporary directories, free loopback
//! ports, external tools (a missing one fails under `CI`), child processes stopped by PID
//! (`proc`), a minimal HTTP/1.1 client (`http`) and a started `nodus serve` (`serve`).
//!
//! Each test file is its own crate and uses a subset of these, hence `allow(dead_code)`.
#![allow(dead_code)]

pub mod http;
pub mod proc;
pub mod serve;

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Command;

pub const NODUS: &str = env!("CARGO_BIN_EXE_nodus");

/// A fresh directory `nodus-<test file>-<tag>-<pid>` under the system temp dir, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let name = format!(
            "nodus-{}-{tag}-{}",
            env!("CARGO_CRATE_NAME"),
            std::process::id()
        );
        let p = std::env::temp_dir().join(name);
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `N` distinct loopback addresses that were free a moment ago (bound together, then released).
pub fn free_addrs<const N: usize>() -> [SocketAddr; N] {
    let listeners: [TcpListener; N] =
        std::array::from_fn(|_| TcpListener::bind("127.0.0.1:0").unwrap());
    listeners.map(|l| l.local_addr().unwrap())
}

/// A loopback address that was free a moment ago.
pub fn free_addr() -> SocketAddr {
    let [addr] = free_addrs();
    addr
}

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
