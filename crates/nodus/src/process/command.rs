//! [`Command`]: a builder for child processes (program, args, env, cwd, stdio, process group,
//! parent-death signal, IPC channel) over `std::process::Command`.
//!
//! Invariants:
//! - `spawn` must run on the loop thread: the child's pidfd and pipes are registered with the
//!   current loop, and the parent-death signal fires when the *thread* that forked exits.
//! - Everything that runs in the child between `fork` and `exec` (`pre_exec`) is a raw
//!   async-signal-safe syscall: `prctl`, `getppid`, `kill`, `fcntl`, `dup2`. No allocation, no
//!   lock.
//! - The IPC channel's child end lands on fd 3 (Node's `fork()` layout) without `O_CLOEXEC`;
//!   every other fd nodus opens is close-on-exec, so the child inherits only stdio and fd 3.
//!
//! Why std: it already does the fork/exec dance, stdio wiring, exec-error reporting through a
//! pipe, and `posix_spawn` when it can; nodus adds the pidfd, the pre-exec steps and the pipes
//! on the reactor.

use std::ffi::{OsStr, OsString};
use std::io;
use std::mem::ManuallyDrop;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

use super::child::{Child, to_signal};
use super::pipes::{ChildStderr, ChildStdin, ChildStdout};
use crate::ipc::{Channel, ChannelOptions};

/// The fd number a forked child finds its IPC channel on (Node's `fork()` layout).
pub const CHANNEL_FD: i32 = 3;

/// What a child's stdin, stdout or stderr is connected to.
#[derive(Debug)]
pub enum Stdio {
    /// A pipe whose other end the parent gets as [`Child::stdin`] / `stdout` / `stderr`.
    Pipe,
    /// The parent's own fd.
    Inherit,
    /// `/dev/null`.
    Null,
    /// A given fd (a file, a socket, one end of another pipe); it is duplicated for each spawn.
    Fd(OwnedFd),
}

impl Stdio {
    fn to_std(&self) -> io::Result<std::process::Stdio> {
        Ok(match self {
            Stdio::Pipe => std::process::Stdio::piped(),
            Stdio::Inherit => std::process::Stdio::inherit(),
            Stdio::Null => std::process::Stdio::null(),
            Stdio::Fd(fd) => std::process::Stdio::from(fd.try_clone()?),
        })
    }
}

/// A builder for a child process. Defaults follow Node's `spawn`: stdio all pipes, no shell, no
/// parent-death signal, the parent's environment and working directory.
#[derive(Debug)]
pub struct Command {
    program: OsString,
    args: Vec<OsString>,
    /// In order: `Some(value)` sets, `None` removes.
    env: Vec<(OsString, Option<OsString>)>,
    env_clear: bool,
    cwd: Option<PathBuf>,
    pgid: Option<i32>,
    stdin: Stdio,
    stdout: Stdio,
    stderr: Stdio,
    death_signal: Option<i32>,
    ipc: Option<ChannelOptions>,
}

impl Command {
    /// A command that runs `program` (looked up in `PATH` when it has no `/`).
    pub fn new(program: impl AsRef<OsStr>) -> Command {
        Command {
            program: program.as_ref().to_owned(),
            args: Vec::new(),
            env: Vec::new(),
            env_clear: false,
            cwd: None,
            pgid: None,
            stdin: Stdio::Pipe,
            stdout: Stdio::Pipe,
            stderr: Stdio::Pipe,
            death_signal: None,
            ipc: None,
        }
    }

    pub fn arg(&mut self, arg: impl AsRef<OsStr>) -> &mut Command {
        self.args.push(arg.as_ref().to_owned());
        self
    }

    pub fn args<I, S>(&mut self, args: I) -> &mut Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    pub fn env(&mut self, key: impl AsRef<OsStr>, val: impl AsRef<OsStr>) -> &mut Command {
        self.env
            .push((key.as_ref().to_owned(), Some(val.as_ref().to_owned())));
        self
    }

    pub fn envs<I, K, V>(&mut self, vars: I) -> &mut Command
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<OsStr>,
        V: AsRef<OsStr>,
    {
        for (k, v) in vars {
            self.env(k, v);
        }
        self
    }

    pub fn env_remove(&mut self, key: impl AsRef<OsStr>) -> &mut Command {
        self.env.push((key.as_ref().to_owned(), None));
        self
    }

    /// Starts the child with an empty environment (plus what `env` adds afterwards).
    pub fn env_clear(&mut self) -> &mut Command {
        self.env_clear = true;
        self.env.clear();
        self
    }

    pub fn current_dir(&mut self, dir: impl AsRef<Path>) -> &mut Command {
        self.cwd = Some(dir.as_ref().to_owned());
        self
    }

    pub fn stdin(&mut self, stdio: Stdio) -> &mut Command {
        self.stdin = stdio;
        self
    }

    pub fn stdout(&mut self, stdio: Stdio) -> &mut Command {
        self.stdout = stdio;
        self
    }

    pub fn stderr(&mut self, stdio: Stdio) -> &mut Command {
        self.stderr = stdio;
        self
    }

    /// Puts the child in process group `pgid` (0: a new group led by the child, which
    /// [`Child::kill_group`] can then signal as a whole; Node's `detached` does this too).
    pub fn process_group(&mut self, pgid: i32) -> &mut Command {
        self.pgid = Some(pgid);
        self
    }

    /// The signal the child gets when the spawning thread exits (`PR_SET_PDEATHSIG`), or `None`.
    /// Off by default for `spawn`, `SIGTERM` for [`fork`](super::fork). If the parent is already
    /// gone by the time the child sets it, the child signals itself at once.
    pub fn parent_death_signal(&mut self, signal: Option<i32>) -> &mut Command {
        self.death_signal = signal;
        self
    }

    /// Gives the child a Node IPC channel on fd 3 (`NODE_CHANNEL_FD=3`,
    /// `NODE_CHANNEL_SERIALIZATION_MODE=json`); the parent's end is [`Child::channel`].
    pub fn ipc(&mut self, options: ChannelOptions) -> &mut Command {
        self.ipc = Some(options);
        self
    }

    /// Starts the child.
    ///
    /// # Errors
    /// What `fork`/`exec` report (`NotFound` for a missing program, ...), and a pidfd or
    /// registration failure (Linux < 5.3 has no `pidfd_open`).
    ///
    /// # Panics
    /// Outside a running nodus loop.
    #[track_caller]
    pub fn spawn(&self) -> io::Result<Child> {
        let mut cmd = std::process::Command::new(&self.program);
        cmd.args(&self.args);
        if self.env_clear {
            cmd.env_clear();
        }
        for (k, v) in &self.env {
            match v {
                Some(v) => cmd.env(k, v),
                None => cmd.env_remove(k),
            };
        }
        if let Some(dir) = &self.cwd {
            cmd.current_dir(dir);
        }
        if let Some(pgid) = self.pgid {
            cmd.process_group(pgid);
        }
        cmd.stdin(self.stdin.to_std()?)
            .stdout(self.stdout.to_std()?)
            .stderr(self.stderr.to_std()?);
        let death = self.death_signal.map(to_signal).transpose()?;
        let channel = match self.ipc {
            Some(_) => {
                let (parent, child) = rustix::net::socketpair(
                    rustix::net::AddressFamily::UNIX,
                    rustix::net::SocketType::STREAM,
                    rustix::net::SocketFlags::CLOEXEC,
                    None,
                )?;
                // Keep the child's end clear of 0..=2, which std rewires before `pre_exec` runs.
                let child = rustix::io::fcntl_dupfd_cloexec(&child, CHANNEL_FD)?;
                cmd.env("NODE_CHANNEL_FD", CHANNEL_FD.to_string())
                    .env("NODE_CHANNEL_SERIALIZATION_MODE", "json");
                Some((parent, child))
            }
            None => None,
        };
        let child_fd = channel.as_ref().map(|(_, c)| c.as_raw_fd());
        let parent_pid = rustix::process::getpid();
        // SAFETY: the closure runs in the forked child before exec, where only async-signal-safe
        // calls are allowed: it makes raw syscalls through rustix (prctl, getppid, getpid, kill,
        // fcntl, dup2) on plain integers captured by copy, and allocates nothing. The `OwnedFd`
        // for fd 3 is wrapped in `ManuallyDrop`, so it is never closed here.
        unsafe {
            cmd.pre_exec(move || {
                if let Some(sig) = death {
                    rustix::process::set_parent_process_death_signal(Some(sig))?;
                    // The parent may have died before the prctl: then no signal would come.
                    if rustix::process::getppid() != Some(parent_pid) {
                        rustix::process::kill_process(rustix::process::getpid(), sig)?;
                    }
                }
                if let Some(fd) = child_fd {
                    let mut target = ManuallyDrop::new(OwnedFd::from_raw_fd(CHANNEL_FD));
                    if fd == CHANNEL_FD {
                        rustix::io::fcntl_setfd(&*target, rustix::io::FdFlags::empty())?;
                    } else {
                        let src = std::os::fd::BorrowedFd::borrow_raw(fd);
                        rustix::io::dup2(src, &mut target)?;
                    }
                }
                Ok(())
            });
        }
        let mut std_child = cmd.spawn()?;
        let pid = rustix::process::Pid::from_raw(std_child.id() as i32)
            .expect("a spawned child has a positive pid");
        let mut child = Child::watch(pid)?;
        if let Some(s) = std_child.stdin.take() {
            child.stdin = Some(ChildStdin::new(OwnedFd::from(s))?);
        }
        if let Some(s) = std_child.stdout.take() {
            child.stdout = Some(ChildStdout::new(OwnedFd::from(s))?);
        }
        if let Some(s) = std_child.stderr.take() {
            child.stderr = Some(ChildStderr::new(OwnedFd::from(s))?);
        }
        if let (Some((parent, child_end)), Some(options)) = (channel, self.ipc.clone()) {
            drop(child_end);
            child.channel = Some(Channel::from_fd(parent, options)?);
        }
        // The std handle only held the pid and the pipes; the pidfd task reaps the child.
        drop(std_child);
        Ok(child)
    }
}
