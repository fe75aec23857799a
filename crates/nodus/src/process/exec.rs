//! [`exec`] (a command line through `/bin/sh -c`) and [`exec_file`] (a program and its
//! arguments, no shell): run a child to completion and collect its stdout and stderr.
//!
//! Invariants, as Node's `exec`/`execFile`:
//! - Output is buffered up to `max_buffer` bytes per stream (default 1 MiB). One more byte and
//!   the child is killed with `kill_signal` and the result is [`ExecErrorKind::MaxBuffer`], with
//!   the output up to the limit.
//! - With a `timeout`, a child still running when it expires is killed with `kill_signal` and
//!   the result is [`ExecErrorKind::Timeout`]. One that has exited by then is not, reaped or
//!   not (its exit and the timer can come in one loop turn, whose timers run before the poll
//!   phase that observes the exit: [`Child::has_exited`](super::Child::has_exited) is asked):
//!   the result is its own exit, ready once that is observed and what its pipes hold has been
//!   read, without waiting for a process it left holding them (the timeout still bounds the
//!   wait).
//! - A non-zero exit (or a death by signal) is an error that still carries the output.
//! - The result is ready once the child exited and both pipes reached end of file, except after
//!   a kill: then it is ready at the exit, without waiting for grandchildren that may still hold
//!   the pipes open.
//! - Dropping the future before it is ready (a `timeout` around it, an aborted task) kills the
//!   child with `kill_signal`, as Node kills it when an `exec`'s `signal` is aborted; its exit
//!   task still reaps it. (Left running, it would lose its output pipes: one that wrote again
//!   would die of `SIGPIPE`, a silent one would run on unobserved.)

use std::ffi::OsStr;
use std::fmt;
use std::future::poll_fn;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::PathBuf;
use std::pin::pin;
use std::task::Poll;
use std::time::Duration;

use super::child::ExitStatus;
use super::command::{Command, Stdio};
use crate::signal::SIGTERM;

/// Options for [`exec`] and [`exec_file`].
#[derive(Debug, Clone)]
pub struct ExecOptions {
    /// Kill the child after this long, if it is still running then (default: no limit; see the
    /// module doc for one that has exited by then). Unlike Node's `timeout: 0`, which
    /// means no limit, `Some(Duration::ZERO)` is a limit (1 ms, the shortest timer): `None` is
    /// "no limit".
    pub timeout: Option<Duration>,
    /// Most bytes kept per stream before the child is killed (default 1 MiB, Node's).
    pub max_buffer: usize,
    /// The signal for a timeout, an overflow or a dropped future (default `SIGTERM`). One that is
    /// not a signal (0, 999) fails the call before the child starts (`ExecErrorKind::Io`,
    /// `InvalidInput`), as Node throws `ERR_UNKNOWN_SIGNAL`.
    pub kill_signal: i32,
    /// Working directory (default: the parent's).
    pub cwd: Option<PathBuf>,
    /// Variables added to (or overriding) the parent's environment.
    pub env: Vec<(String, String)>,
}

impl Default for ExecOptions {
    fn default() -> Self {
        ExecOptions {
            timeout: None,
            max_buffer: 1024 * 1024,
            kill_signal: SIGTERM,
            cwd: None,
            env: Vec::new(),
        }
    }
}

/// A child that ran to completion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    pub status: ExitStatus,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// Why an `exec` failed.
#[derive(Debug)]
pub enum ExecErrorKind {
    /// The child could not be started (or waited for).
    Io(io::Error),
    /// It exited with a non-zero code or was killed by a signal.
    Failed,
    /// It ran past the timeout and was killed.
    Timeout,
    /// Its stdout (`"stdout"`) or stderr wrote more than `max_buffer` bytes; it was killed.
    MaxBuffer(&'static str),
}

/// An `exec` failure, with whatever output was collected.
#[derive(Debug)]
pub struct ExecError {
    pub kind: ExecErrorKind,
    /// The exit status, when the child was started and reaped.
    pub status: Option<ExitStatus>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

impl fmt::Display for ExecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            ExecErrorKind::Io(e) => write!(f, "nodus::process::exec: {e}"),
            ExecErrorKind::Failed => write!(
                f,
                "nodus::process::exec: command failed ({})",
                self.status.map(|s| s.to_string()).unwrap_or_default()
            ),
            ExecErrorKind::Timeout => write!(f, "nodus::process::exec: timed out, child killed"),
            ExecErrorKind::MaxBuffer(which) => {
                write!(
                    f,
                    "nodus::process::exec: {which} exceeded max_buffer, child killed"
                )
            }
        }
    }
}

impl std::error::Error for ExecError {}

impl From<io::Error> for ExecError {
    fn from(e: io::Error) -> Self {
        ExecError {
            kind: ExecErrorKind::Io(e),
            status: None,
            stdout: Vec::new(),
            stderr: Vec::new(),
        }
    }
}

/// Runs `command` through `/bin/sh -c` and collects its output.
pub async fn exec(command: &str, options: &ExecOptions) -> Result<Output, ExecError> {
    let mut cmd = Command::new("/bin/sh");
    cmd.arg("-c").arg(command);
    run(cmd, options).await
}

/// Runs `file` with `args` (no shell: arguments are passed as they are) and collects its output.
pub async fn exec_file<I, S>(
    file: impl AsRef<OsStr>,
    args: I,
    options: &ExecOptions,
) -> Result<Output, ExecError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut cmd = Command::new(file);
    cmd.args(args);
    run(cmd, options).await
}

/// One output stream being collected.
struct Collect {
    name: &'static str,
    open: bool,
    buf: Vec<u8>,
}

impl Collect {
    /// Takes one read's result; `true` if something happened.
    fn take(
        &mut self,
        polled: Poll<io::Result<usize>>,
        chunk: &[u8],
        max: usize,
        overflow: &mut Option<&'static str>,
    ) -> bool {
        match polled {
            Poll::Pending => false,
            Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => {
                self.open = false;
                true
            }
            Poll::Ready(Ok(n)) => {
                let room = max.saturating_sub(self.buf.len());
                self.buf.extend_from_slice(&chunk[..n.min(room)]);
                if n > room && overflow.is_none() {
                    *overflow = Some(self.name);
                }
                true
            }
        }
    }

    /// Reads what the pipe `fd` holds now, to its end of file or until it is empty (non-blocking
    /// reads straight from the fd, not through its readiness).
    fn drain(
        &mut self,
        fd: BorrowedFd<'_>,
        chunk: &mut [u8],
        max: usize,
        overflow: &mut Option<&'static str>,
    ) {
        while self.open && overflow.is_none() {
            let read = match rustix::io::read(fd, &mut *chunk) {
                Err(rustix::io::Errno::INTR) => continue,
                Err(rustix::io::Errno::AGAIN) => return,
                read => read.map_err(io::Error::from),
            };
            self.take(Poll::Ready(read), chunk, max, overflow);
        }
    }
}

/// Kills the child if `run`'s future is dropped before the child's exit was observed.
struct KillOnDrop<'a> {
    child: &'a super::child::Child,
    signal: i32,
    armed: bool,
}

impl Drop for KillOnDrop<'_> {
    fn drop(&mut self) {
        if self.armed && self.child.try_wait().is_none() {
            // Already gone (NotFound) is what we wanted.
            let _ = self.child.kill(self.signal);
        }
    }
}

async fn run(mut cmd: Command, options: &ExecOptions) -> Result<Output, ExecError> {
    cmd.stdin(Stdio::Null);
    if let Some(dir) = &options.cwd {
        cmd.current_dir(dir);
    }
    cmd.envs(options.env.iter().map(|(k, v)| (k, v)));
    // A kill signal that is none would leave the timeout, the buffer limit and a drop unable to
    // end the child: refused before it starts, as Node refuses it (`ERR_UNKNOWN_SIGNAL`).
    super::child::to_signal(options.kill_signal)?;
    let child = cmd.spawn()?;
    let (stdout, stderr) = (child.stdout.as_ref(), child.stderr.as_ref());
    let mut out = Collect {
        name: "stdout",
        open: stdout.is_some(),
        buf: Vec::new(),
    };
    let mut err = Collect {
        name: "stderr",
        open: stderr.is_some(),
        buf: Vec::new(),
    };
    let mut failure: Option<ExecErrorKind> = None;
    let mut chunk = vec![0u8; 64 * 1024];
    let mut deadline = options.timeout.map(|t| Box::pin(crate::sleep(t)));
    // The timeout passed after the child had exited: the pipes are read no longer than what
    // they hold at its exit.
    let mut past_deadline = false;
    let mut exit = pin!(child.wait());
    let mut status = None;
    let mut kill_on_drop = KillOnDrop {
        child: &child,
        signal: options.kill_signal,
        armed: true,
    };
    let result = poll_fn(|cx| {
        loop {
            let mut progressed = false;
            let mut overflow = None;
            if let (true, Some(p)) = (out.open, stdout) {
                let polled = p.poll_read(cx, &mut chunk);
                progressed |= out.take(polled, &chunk, options.max_buffer, &mut overflow);
            }
            if let (true, Some(p)) = (err.open, stderr) {
                let polled = p.poll_read(cx, &mut chunk);
                progressed |= err.take(polled, &chunk, options.max_buffer, &mut overflow);
            }
            if let Some(name) = overflow
                && failure.is_none()
            {
                failure = Some(ExecErrorKind::MaxBuffer(name));
                let _ = child.kill(options.kill_signal);
            }
            if let Some(d) = deadline.as_mut()
                && d.as_mut().poll(cx).is_ready()
            {
                deadline = None;
                if child.has_exited() {
                    past_deadline = true;
                } else if failure.is_none() {
                    failure = Some(ExecErrorKind::Timeout);
                    let _ = child.kill(options.kill_signal);
                }
            }
            if status.is_none()
                && let Poll::Ready(r) = exit.as_mut().poll(cx)
            {
                match r {
                    Ok(s) => status = Some(s),
                    Err(e) => return Poll::Ready(Err(e)),
                }
            }
            if status.is_some() && past_deadline && failure.is_none() {
                // What the child wrote is all in the pipes by now: read it, not what a process
                // it left holding them may write later.
                for (collect, pipe) in [
                    (&mut out, stdout.map(AsFd::as_fd)),
                    (&mut err, stderr.map(AsFd::as_fd)),
                ] {
                    if let Some(fd) = pipe {
                        collect.drain(fd, &mut chunk, options.max_buffer, &mut overflow);
                    }
                }
                if let Some(name) = overflow {
                    failure = Some(ExecErrorKind::MaxBuffer(name));
                }
                return Poll::Ready(Ok(()));
            }
            let pipes_done = !out.open && !err.open;
            if status.is_some() && (pipes_done || failure.is_some()) {
                return Poll::Ready(Ok(()));
            }
            if !progressed {
                return Poll::Pending;
            }
        }
    })
    .await;
    kill_on_drop.armed = false;
    let kind = match (result, failure, status) {
        (Err(e), _, _) => ExecErrorKind::Io(e),
        (Ok(()), Some(kind), _) => kind,
        (Ok(()), None, Some(s)) if s.success() => {
            return Ok(Output {
                status: s,
                stdout: out.buf,
                stderr: err.buf,
            });
        }
        (Ok(()), None, _) => ExecErrorKind::Failed,
    };
    Err(ExecError {
        kind,
        status,
        stdout: out.buf,
        stderr: err.buf,
    })
}
