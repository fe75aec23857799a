//! `Proc`: a child process stopped by PID when dropped, so a failed assertion leaks nothing, with
//! its piped output as lines.
//!
//! Dropped while running, a process gets SIGTERM and, 5 s later, SIGKILL; one spawned in its own
//! process group (`spawn_group`) has the whole group killed (SIGKILL), its children included.
//! Piped stdout and stderr are read to the end by a thread each (a closed pipe would kill a
//! writer with SIGPIPE) and their lines merged into one channel.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal};

pub struct Proc {
    pub child: Child,
    /// Output lines not yet taken by `wait_line` or `output`.
    pub lines: Receiver<String>,
    seen: Vec<String>,
    group: bool,
}

impl Proc {
    /// Spawns `cmd` with the stdio it sets.
    pub fn spawn(cmd: &mut Command) -> Proc {
        Proc::start(cmd, false)
    }

    /// Spawns `cmd` as the leader of a new process group, all of which is killed on drop.
    pub fn spawn_group(cmd: &mut Command) -> Proc {
        Proc::start(cmd.process_group(0), true)
    }

    fn start(cmd: &mut Command, group: bool) -> Proc {
        let mut child = cmd.spawn().expect("spawn");
        let (tx, lines) = mpsc::channel();
        let stdout = child
            .stdout
            .take()
            .map(|o| Box::new(o) as Box<dyn Read + Send>);
        let stderr = child
            .stderr
            .take()
            .map(|e| Box::new(e) as Box<dyn Read + Send>);
        for out in [stdout, stderr].into_iter().flatten() {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    let _ = tx.send(line);
                }
            });
        }
        Proc {
            child,
            lines,
            seen: Vec::new(),
            group,
        }
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id() as i32).unwrap()
    }

    pub fn signal(&self, sig: Signal) {
        rustix::process::kill_process(self.pid(), sig)
            .unwrap_or_else(|e| panic!("kill({}, {sig:?}): {e}", self.id()));
    }

    /// Waits up to `limit` for the exit; the status, `None` if it is still running.
    pub fn exited_within(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits for the exit (failing the test after `limit`); the exit code, `None` after a signal.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<i32> {
        match self.exited_within(limit) {
            Some(status) => status.code(),
            None => panic!("process {} did not exit within {limit:?}", self.id()),
        }
    }

    /// The first output line containing `needle`, among the lines seen so far or those to come
    /// within 30 s (the test fails otherwise).
    pub fn wait_line(&mut self, needle: &str) -> String {
        if let Some(line) = self.seen.iter().find(|l| l.contains(needle)) {
            return line.clone();
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match self
                .lines
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(e) => panic!(
                    "no line with {needle:?} ({e}); output so far: {:#?}",
                    self.seen
                ),
            }
        }
    }

    /// The output lines taken so far (by `wait_line`, `output`), without waiting for more.
    pub fn seen(&self) -> &[String] {
        &self.seen
    }

    /// Every output line written so far: those taken, and those already waiting, without
    /// waiting for more (of a process that still runs, too).
    pub fn output_so_far(&mut self) -> &[String] {
        while let Ok(line) = self.lines.try_recv() {
            self.seen.push(line);
        }
        &self.seen
    }

    /// Every output line: for a process that has exited, all it wrote (waiting, at most 10 s,
    /// for the pipes to close).
    pub fn output(&mut self) -> &[String] {
        let deadline = Instant::now() + Duration::from_secs(10);
        while let Ok(line) = self
            .lines
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            self.seen.push(line);
        }
        &self.seen
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.group {
            let _ = rustix::process::kill_process_group(self.pid(), Signal::KILL);
        } else if self.child.try_wait().is_ok_and(|s| s.is_none()) {
            let _ = rustix::process::kill_process(self.pid(), Signal::TERM);
            if self.exited_within(Duration::from_secs(5)).is_none() {
                let _ = self.child.kill();
            }
        }
        let _ = self.child.wait();
    }
}

/// Reaps child `pid` of this process (one forked without `exec`, say), SIGKILLed once `limit`
/// has passed; returns its raw wait status (`libc::WIFEXITED` and the rest read it).
pub fn reap_within(pid: i32, limit: Duration) -> i32 {
    let child = Pid::from_raw(pid).expect("a child's pid is positive");
    let deadline = Instant::now() + limit;
    loop {
        let waited = rustix::process::waitpid(Some(child), rustix::process::WaitOptions::NOHANG);
        if let Some((_, status)) = waited.unwrap_or_else(|e| panic!("waitpid({pid}): {e}")) {
            return status.as_raw();
        }
        if Instant::now() > deadline {
            // Our unreaped child: its number cannot be another process's.
            let _ = rustix::process::kill_process(child, Signal::KILL);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
