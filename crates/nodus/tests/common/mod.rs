//! Helpers the runtime's integration tests share: a loop bounded in time, external tools (a
//! missing one fails under `CI`), close-on-exec checks, stream helpers (`net`), a raw IPC peer
//! (`ipc`), pipes to pass as fds (`pipes`), a seeded PRNG for the attack tests (`rng`), the
//! capture of a thread's warnings (`Warnings`) and a cluster worker the test plays the primary of
//! (`spawn_test_worker`).
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

/// This test binary run again as a nodus cluster worker whose primary the test plays: test
/// `test` alone, with `role_var=worker`, `NODE_UNIQUE_ID=1` and `PORT=port` in its environment
/// and an IPC channel (`child.channel`); SIGKILLed if the test's thread ends first.
pub fn spawn_test_worker(test: &str, role_var: &str, port: u16) -> nodus::process::Child {
    nodus::process::Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture"])
        .env(role_var, "worker")
        .env("NODE_UNIQUE_ID", "1")
        .env("PORT", port.to_string())
        .parent_death_signal(Some(nodus::signal::SIGKILL))
        .ipc(nodus::ipc::ChannelOptions::default())
        .spawn()
        .unwrap()
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

/// Warnings logged on this thread while the guard is held.
#[derive(Clone, Default)]
pub struct Warnings(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl Warnings {
    pub fn capture() -> (Warnings, tracing::subscriber::DefaultGuard) {
        let warnings = Warnings::default();
        let writer = warnings.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(tracing_subscriber::filter::LevelFilter::WARN)
            .finish();
        (warnings, tracing::subscriber::set_default(subscriber))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl std::io::Write for Warnings {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
