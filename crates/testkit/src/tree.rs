//! The process tree as `/proc` shows it, for tests of supervision (orphans, guards, reaping):
//! a process's children and parent, whether it is gone, a pid a test's child wrote to a file,
//! and [`KillOnDrop`], which SIGKILLs the pids a test collected so a failed assertion leaks none.
//!
//! Everything here reads `/proc` and never waits longer than the limit it is given.

use std::path::Path;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal};

/// The children of every thread of `pid` (`/proc/PID/task/*/children`); empty once it is gone.
pub fn children(pid: u32) -> Vec<i32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|text| {
            text.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<i32>>()
        })
        .collect()
}

/// The fields of `/proc/PID/stat` after the command name (state first), if `pid` exists.
fn stat_fields(pid: i32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.get(stat.rfind(')')? + 1..)?;
    Some(rest.split_whitespace().map(str::to_owned).collect())
}

/// The parent of `pid`, if it exists.
pub fn parent_of(pid: i32) -> Option<u32> {
    stat_fields(pid)?.get(1)?.parse().ok()
}

/// Waits until `pid`'s parent is `parent` (within `limit`; panics after, naming the parent).
pub fn wait_parent(pid: i32, parent: u32, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let now = parent_of(pid);
        if now == Some(parent) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "process {pid}'s parent is {now:?}, not {parent}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether `pid` is a zombie (dead, waiting for its reaper).
pub fn is_zombie(pid: i32) -> bool {
    stat_fields(pid).is_some_and(|f| f.first().is_some_and(|s| s == "Z"))
}

/// Whether `pid` is stopped (by SIGSTOP or SIGTSTP; `T` in its stat).
pub fn is_stopped(pid: i32) -> bool {
    stat_fields(pid).is_some_and(|f| f.first().is_some_and(|s| s == "T"))
}

/// Whether `pid` is gone or a zombie.
pub fn gone(pid: i32) -> bool {
    stat_fields(pid).is_none() || is_zombie(pid)
}

/// Waits until every one of `pids` is gone (or a zombie) within `limit`; `Err` with those still
/// running after it.
pub fn wait_gone(pids: &[i32], limit: Duration) -> Result<(), Vec<i32>> {
    let deadline = Instant::now() + limit;
    loop {
        let left: Vec<i32> = pids.iter().copied().filter(|&p| !gone(p)).collect();
        if left.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(left);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether `pid`'s name (`/proc/PID/comm`) is `name`.
pub fn is_named(pid: i32, name: &[u8]) -> bool {
    std::fs::read(format!("/proc/{pid}/comm")).is_ok_and(|comm| comm.trim_ascii_end() == name)
}

/// The pid written to `file`, once it is (within `limit`; panics after).
pub fn pid_in(file: &Path, limit: Duration) -> i32 {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(pid) = std::fs::read_to_string(file)
            .ok()
            .and_then(|t| t.trim().parse::<i32>().ok())
        {
            return pid;
        }
        assert!(Instant::now() < deadline, "no pid in {}", file.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Pids SIGKILLed on drop if still running (a test's grandchildren, escaped descendants,
/// guards), so a failed assertion leaks none.
#[derive(Default)]
pub struct KillOnDrop(pub Vec<i32>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        for &pid in &self.0 {
            if !gone(pid)
                && let Some(pid) = Pid::from_raw(pid)
            {
                let _ = rustix::process::kill_process(pid, Signal::KILL);
            }
        }
    }
}
