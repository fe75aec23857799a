//! One test run alone, in a fresh process of its own test binary: for tests that fork without
//! `exec`, mark the process a subreaper or drop what the process keeps for its life, which must
//! not meet another test's threads or leave their state behind.
//!
//! A test calls [`is_inner`] first: `true` in the fresh process (it runs its scenario there);
//! otherwise it calls [`run`], which starts the binary with only this test selected and the
//! [`INNER`] variable naming it. The fresh process leads a process group of its own, SIGKILLed
//! as a whole after 30 s, so a process it forked (and which holds its output open) cannot hang
//! the outer test.

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal};

/// The variable that names the test a fresh process is to run as its scenario.
pub const INNER: &str = "NODUS_TEST_ALONE";

/// Whether this process is the fresh one started for test `name`.
pub fn is_inner(name: &str) -> bool {
    std::env::var(INNER).is_ok_and(|n| n == name)
}

/// Runs test `name` (its path within the binary) alone in a fresh process of this binary, one
/// thread; returns its exit code and its stdout and stderr, in this order.
pub fn run(name: &str) -> (Option<i32>, String) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--test-threads=1", "--nocapture"])
        .env(INNER, name)
        .process_group(0)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let group = Pid::from_raw(child.id() as i32).expect("a child's pid is positive");
            let _ = rustix::process::kill_process_group(group, Signal::KILL);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

/// In the fresh process for test `name`, `true`: the caller runs its scenario. Anywhere else,
/// runs the test there ([`run`]), asserts that it passed, and returns `false`.
pub fn scenario(name: &str) -> bool {
    if is_inner(name) {
        return true;
    }
    let (code, out) = run(name);
    assert!(
        code == Some(0) && out.contains("1 passed"),
        "{name} alone: exit code {code:?}\n{out}"
    );
    false
}
