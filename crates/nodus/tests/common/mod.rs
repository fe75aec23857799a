//! Helpers the runtime's integration tests share: a loop bounded in time, external tools (a
//! missing one fails under `CI`), close-on-exec checks, stream helpers (`net`), a raw IPC peer
//! (`ipc`), pipes to pass as fds (`pipes`) and a seeded PRNG for the attack tests (`rng`).
//!
//! Each test file is its own crate and uses a subset of these, hence `allow(dead_code)`.
#![allow(dead_code)]

pub mod ipc;
pub mod net;
pub mod pipes;
pub mod rng;

use std::future::Future;
use std::os::fd::AsFd;
use std::time::Duration;

use nodus::Runtime;

/// Runs `f` on a fresh loop, failing the test if it takes more than `limit` (a hang fails
/// instead of stalling the run).
pub fn bounded_for<F: Future>(limit: Duration, f: F) -> F::Output {
    let rt = Runtime::new();
    rt.block_on(async { nodus::timeout(limit, f).await.expect("test timed out") })
}

/// [`bounded_for`] 30 s.
pub fn bounded<F: Future>(f: F) -> F::Output {
    bounded_for(Duration::from_secs(30), f)
}

/// Whether `tool` runs (`TOOL --version`). Without it a test skips (after saying so), unless
/// `CI` is set: then it fails.
pub fn have(tool: &str) -> bool {
    let ok = std::process::Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(std::env::var_os("CI").is_none(), "CI needs {tool}");
        println!("skipped: {tool} is not installed");
    }
    ok
}

/// Whether `fd` is close-on-exec.
pub fn cloexec(fd: impl AsFd) -> bool {
    rustix::io::fcntl_getfd(fd)
        .unwrap()
        .contains(rustix::io::FdFlags::CLOEXEC)
}
