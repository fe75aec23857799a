//! [`Command`]: a builder for child processes (program, args, env, cwd, stdio, process group,
//! group exit signal, parent-death signal, extra fds, IPC channel) over `std::process::Command`.
//!
//! Invariants:
//! - `spawn` must run on the loop thread: the child's pidfd and pipes are registered with the
//!   current loop, and the parent-death signal fires when the *thread* that forked exits.
//! - Everything that runs in the child between `fork` and `exec` (`pre_exec`) is a raw
//!   async-signal-safe syscall: `rt_sigaction`, `prctl`, `getppid`, `kill`, `close_range`,
//!   `fcntl`, `dup2`, `sched_setscheduler`, `prlimit64` (the starting open-files limit back, see
//!   `process`). No allocation, no lock: the fd lists are computed in the parent and only read in
//!   the child.
//! - The first thing the child does is put the signals this process catches back to their
//!   default action (as `exec` would), so a signal that comes before the `exec` (its
//!   parent-death signal, its own `kill` when the parent is already gone, a supervisor's
//!   `SIGTERM`) does what it does to the program, instead of running the parent's handler in the
//!   child, where signal-hook's would swallow it. (What std runs in the child before `pre_exec`,
//!   the stdio `dup2`s, `chdir`, `setpgid` and the signal-mask reset, still runs with the
//!   parent's handlers; glibc's `fork` has run nodus's fork handler before it, which gives every
//!   signal a `nodus::signal` stream catches its default action back there (`signal`'s module
//!   doc): only a real-time signal, or one that only other code catches, can be lost in those
//!   few microseconds.)
//! - The child gets stdio, the fds given to [`Command::pass_fd`] at their target numbers and,
//!   with IPC, the channel right after the highest of them (fd 3 when there are none: Node's
//!   `fork()` layout; listeners at 3..3+n then the channel: systemd's and DESIGN's layout), and
//!   nothing else. Those land with `dup2`, so without `O_CLOEXEC`; every fd nodus opens is
//!   close-on-exec; and the fds this process inherited without it (a shell's, a service
//!   manager's) are made close-on-exec in the child before the `dup2`s: all fds from 3 up with one
//!   `close_range(CLOSE_RANGE_CLOEXEC)` (Linux ≥ 5.11), or on older kernels the ones listed from
//!   `/proc/self/fd` before the fork.
//! - Sources never collide with targets: for each spawn every source is duplicated (close-on-exec)
//!   above the highest target, and `dup2` in the child moves it down. The parent's own fds stay
//!   open, so one `Command` can spawn again and again (a supervisor restarting a worker).
//! - Until the fork, every free fd number up to the highest target is held by a close-on-exec
//!   placeholder, so the fds std opens during `spawn` (its exec-error socket above all) land
//!   above the targets and are not overwritten by a `dup2`. (Another thread closing one of its
//!   low fds at that very moment could still open a hole: then a failed `exec` would show as an
//!   abnormal exit of the child instead of a `spawn` error.)
//!
//! - With [`Command::no_shell_for_elf`], an ELF program is executed with `execve` as the last
//!   step of `pre_exec`: the file `execvp` would run (the child's `PATH`, its working
//!   directory) is found and its first bytes read in the parent, and the path, argv and envp are
//!   C arrays built there too, so the child only reads them (no allocation after the fork). A
//!   failed `execve` (`ENOEXEC` above all: another architecture, with no `binfmt_misc` entry
//!   for it) is the spawn's error; std's `execvp`, which would give such a file to `/bin/sh`,
//!   never runs. Any other file (a script, a missing one) is left to `execvp`.
//!
//! - A `reaper::Spawning` ticket is taken before the fork and turned into the child's
//!   registration as nodus's own right after it (see `reaper`): between the two, no subreaper
//!   pass reaps anything, so the new child is never taken for an adopted orphan.
//!
//! Why std: it already does the fork/exec dance, stdio wiring, exec-error reporting through a
//! socket, and `posix_spawn` when it can; nodus adds the pidfd, the pre-exec steps and the pipes
//! on the reactor.

use std::collections::BTreeMap;
use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::mem::ManuallyDrop;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::child::{Child, to_signal};
use super::pipes::{ChildStderr, ChildStdin, ChildStdout};
use super::reaper::Spawning;
use crate::ipc::{Channel, ChannelOptions};

/// The fd number a forked child finds its IPC channel on when no other fd is passed (Node's
/// `fork()` layout).
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
    /// `argv[0]`, when it is not `program`.
    arg0: Option<OsString>,
    args: Vec<OsString>,
    /// In order: `Some(value)` sets, `None` removes.
    env: Vec<(OsString, Option<OsString>)>,
    env_clear: bool,
    cwd: Option<PathBuf>,
    pgid: Option<i32>,
    group_exit_signal: Option<i32>,
    stdin: Stdio,
    stdout: Stdio,
    stderr: Stdio,
    death_signal: Option<i32>,
    /// (target, source), sorted by target, one entry per target.
    fds: Vec<(RawFd, Arc<OwnedFd>)>,
    ipc: Option<ChannelOptions>,
    no_shell_for_elf: bool,
}

impl Command {
    /// A command that runs `program` (looked up in `PATH` when it has no `/`).
    pub fn new(program: impl AsRef<OsStr>) -> Command {
        Command {
            program: program.as_ref().to_owned(),
            arg0: None,
            args: Vec::new(),
            env: Vec::new(),
            env_clear: false,
            cwd: None,
            pgid: None,
            group_exit_signal: None,
            stdin: Stdio::Pipe,
            stdout: Stdio::Pipe,
            stderr: Stdio::Pipe,
            death_signal: None,
            fds: Vec::new(),
            ipc: None,
            no_shell_for_elf: false,
        }
    }

    /// The child's `argv[0]`, instead of the program (one run through `/proc/self/fd/N` keeps
    /// the name it is known by).
    pub fn arg0(&mut self, arg0: impl AsRef<OsStr>) -> &mut Command {
        self.arg0 = Some(arg0.as_ref().to_owned());
        self
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

    /// The signal sent to whatever is left of the child's process group once the child has
    /// exited (before it is reaped), or `None` (the default). With `SIGKILL` this is systemd's
    /// `KillMode=mixed` end: the child may be asked to stop alone, and its own children (those
    /// that stayed in its group) do not outlive it. The child must lead its own group
    /// ([`process_group`](Self::process_group)`(0)`): `spawn` fails with `InvalidInput` otherwise.
    pub fn group_exit_signal(&mut self, signal: Option<i32>) -> &mut Command {
        self.group_exit_signal = signal;
        self
    }

    /// The signal the child gets when the spawning thread exits (`PR_SET_PDEATHSIG`), or `None`.
    /// Off by default for `spawn`, `SIGTERM` for [`fork`](super::fork). If the parent is already
    /// gone by the time the child sets it, the child signals itself at once.
    pub fn parent_death_signal(&mut self, signal: Option<i32>) -> &mut Command {
        self.death_signal = signal;
        self
    }

    /// Gives the child `fd` as fd number `target` (for example listening sockets at 3, 4, ...
    /// for systemd-style socket activation). Each spawn duplicates `fd`, which stays open here: an
    /// `Arc` lets several commands share one source. A second call for the same `target`
    /// replaces the first.
    ///
    /// # Panics
    /// If `target` is below 3 (stdio has its own setters).
    pub fn pass_fd(&mut self, target: RawFd, fd: impl Into<Arc<OwnedFd>>) -> &mut Command {
        assert!(
            target >= 3,
            "nodus::process::Command::pass_fd: target fd {target} is below 3 (use stdin/stdout/stderr)"
        );
        let fd = fd.into();
        match self.fds.binary_search_by_key(&target, |(t, _)| *t) {
            Ok(i) => self.fds[i].1 = fd,
            Err(i) => self.fds.insert(i, (target, fd)),
        }
        self
    }

    /// The fd number the IPC channel gets in the child: right after the highest passed fd, or
    /// [`CHANNEL_FD`] when none is passed.
    pub fn channel_fd(&self) -> RawFd {
        self.fds.last().map_or(CHANNEL_FD, |(t, _)| t + 1)
    }

    /// Gives the child a Node IPC channel on [`channel_fd`](Self::channel_fd) (fd 3 unless fds
    /// are passed), named by `NODE_CHANNEL_FD` with `NODE_CHANNEL_SERIALIZATION_MODE=json`; the
    /// parent's end is [`Child::channel`].
    pub fn ipc(&mut self, options: ChannelOptions) -> &mut Command {
        self.ipc = Some(options);
        self
    }

    /// Whether an ELF program is executed with `execve` alone (default `false`: `execvp`'s
    /// way, Node's). `execvp` runs a file the kernel refuses to execute (`ENOEXEC`) with
    /// `/bin/sh`: right for a shell script with no `#!` line, but an ELF program the kernel
    /// cannot run (built for another architecture, with no `binfmt_misc` emulator for it) is then
    /// read by the shell as a script: syntax errors on stderr and a failed exit, a crash loop
    /// under a supervisor. With this set, such a program is a `spawn` error instead ("Exec
    /// format error": `ENOEXEC`, the error's source). Files that are not ELF keep `execvp`'s
    /// way. The cluster's workers are spawned with it.
    pub fn no_shell_for_elf(&mut self, on: bool) -> &mut Command {
        self.no_shell_for_elf = on;
        self
    }

    /// Starts the child.
    ///
    /// # Errors
    /// What `fork`/`exec` report (`NotFound` for a missing program or working directory,
    /// `PermissionDenied` for one that is not executable, `InvalidInput` for a NUL byte in an
    /// argument, ...), with a message naming the program (and the working directory, when one
    /// was set), as Node's `spawn nonexistent ENOENT` does; a pidfd or registration failure
    /// (Linux < 5.3 has no `pidfd_open`), and `InvalidInput` for a signal number that is not one
    /// or a group exit signal without a group of the child's own.
    ///
    /// # Panics
    /// Outside a running nodus loop (before anything is started).
    #[track_caller]
    pub fn spawn(&self) -> io::Result<Child> {
        // Checked before the fork: the child's pidfd needs the loop, and a child started first
        // would be left unreaped.
        crate::rt::context::with_core("nodus::process::Command::spawn", |_| ());
        let mut cmd = std::process::Command::new(&self.program);
        if let Some(arg0) = &self.arg0 {
            cmd.arg0(arg0);
        }
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
        let group_exit = self.group_exit_signal.map(to_signal).transpose()?;
        if group_exit.is_some() && self.pgid != Some(0) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "nodus::process: a group exit signal needs process_group(0)",
            ));
        }
        let channel = match self.ipc {
            Some(_) => {
                let (parent, child) = rustix::net::socketpair(
                    rustix::net::AddressFamily::UNIX,
                    rustix::net::SocketType::STREAM,
                    rustix::net::SocketFlags::CLOEXEC,
                    None,
                )?;
                cmd.env("NODE_CHANNEL_FD", self.channel_fd().to_string())
                    .env("NODE_CHANNEL_SERIALIZATION_MODE", "json");
                Some((parent, child))
            }
            None => None,
        };
        let mut wanted: Vec<(RawFd, BorrowedFd<'_>)> =
            self.fds.iter().map(|(t, fd)| (*t, fd.as_fd())).collect();
        if let Some((_, child_end)) = &channel {
            wanted.push((self.channel_fd(), child_end.as_fd()));
        }
        let ChildFds { pairs, held } = ChildFds::prepare(&wanted)?;
        // Built here: the child must not allocate.
        let direct = match self.no_shell_for_elf {
            true => DirectExec::prepare(&cmd, self.arg0.as_deref(), self.env_clear),
            false => None,
        };
        // With close_range the child needs no list (an empty one stands for "all from 3 up").
        let cloexec_all = close_range_cloexec_works();
        let inherited = if cloexec_all {
            Box::default()
        } else {
            inheritable_fds()
        };
        let parent_pid = rustix::process::getpid();
        #[cfg(test)]
        let parent_pid = match tests::PARENT_GONE.with(std::cell::Cell::get) {
            true => rustix::process::Pid::from_raw(i32::MAX).expect("positive"),
            false => parent_pid,
        };
        // A policy nodus chose for this thread is not the child's (any child, not only a worker).
        let normal_scheduling = super::sched::switched_this_thread();
        let fd_limit = super::child_fd_limit();
        // SAFETY: the closure runs in the forked child before exec, where only async-signal-safe
        // calls are allowed: it makes raw syscalls (rt_sigaction, prctl, getppid, getpid, kill,
        // close_range, fcntl, dup2, sched_setscheduler, prlimit64, execve) on plain integers and
        // stack values, reads the lists and C arrays computed in the parent, and allocates
        // nothing. The inherited fds may be closed by now: `fcntl` then fails, harmlessly.
        // Each target `OwnedFd` is wrapped in `ManuallyDrop`, so it is never closed here; the
        // sources stay open in the parent (`held`) until after the fork.
        unsafe {
            cmd.pre_exec(move || {
                // First: a signal from here on (the parent-death signal, our own `kill` below, a
                // supervisor's) acts as it will after `exec`, not through this process's
                // handlers.
                default_caught_signals();
                if normal_scheduling {
                    super::sched::normal_this_thread()?;
                }
                if let Some(limit) = fd_limit {
                    // Lowering a soft limit cannot fail; if it did, the child keeps ours.
                    let _ = rustix::process::setrlimit(rustix::process::Resource::Nofile, limit);
                }
                if let Some(sig) = death {
                    rustix::process::set_parent_process_death_signal(Some(sig))?;
                    // The parent may have died before the prctl: then no signal would come.
                    if rustix::process::getppid() != Some(parent_pid) {
                        rustix::process::kill_process(rustix::process::getpid(), sig)?;
                    }
                }
                if cloexec_all {
                    cloexec_from_3()?;
                }
                for &fd in inherited.iter() {
                    let _ = rustix::io::fcntl_setfd(
                        BorrowedFd::borrow_raw(fd),
                        rustix::io::FdFlags::CLOEXEC,
                    );
                }
                // Sources are all above the targets, so no dup2 overwrites a source still to
                // come; dup2 leaves the target without FD_CLOEXEC.
                for &(src, target) in pairs.iter() {
                    let mut target = ManuallyDrop::new(OwnedFd::from_raw_fd(target));
                    rustix::io::dup2(BorrowedFd::borrow_raw(src), &mut target)?;
                }
                // Last: returns only on failure, which std reports as the spawn's error.
                match &direct {
                    Some(direct) => Err(direct.exec()),
                    None => Ok(()),
                }
            });
        }
        // From before the fork until its reap, the child is known as nodus's own: no subreaper
        // pass reaps it (see `reaper`).
        let spawning = Spawning::begin();
        let spawned = cmd.spawn();
        drop(held);
        let mut std_child = spawned.map_err(|e| self.spawn_error(e))?;
        let pid = rustix::process::Pid::from_raw(std_child.id() as i32)
            .expect("a spawned child has a positive pid");
        let ours = spawning.register(pid);
        // From here on the child runs: a step that fails must not leave it running unseen (the
        // caller gets an error, no handle) nor unreaped.
        let mut child = match Child::watch(pid, ours, group_exit) {
            Ok(child) => child,
            Err((e, ours)) => {
                // Nothing watches it: kill and reap it here (the SIGKILL makes the wait short),
                // then let it go.
                let _ = std_child.kill();
                let _ = std_child.wait();
                drop(ours);
                return Err(e);
            }
        };
        let hand_over = || -> io::Result<()> {
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
            Ok(())
        };
        if let Err(e) = hand_over() {
            // Its pidfd task reaps it once the SIGKILL lands.
            let _ = child.kill(libc::SIGKILL);
            return Err(e);
        }
        // The std handle only held the pid and the pipes; the pidfd task reaps the child.
        drop(std_child);
        Ok(child)
    }
}

impl Command {
    /// `e`, a failed `fork`/`exec`, with a message that names the program (and the working
    /// directory, which a missing one makes `NotFound` too); its kind and source are `e`'s.
    fn spawn_error(&self, e: io::Error) -> io::Error {
        // Quoted and escaped as Node's util.inspect shows a string: no raw control characters.
        let program = crate::fs::quote(Path::new(&self.program));
        let message = match &self.cwd {
            Some(dir) => format!("spawn {program} in {}: {e}", crate::fs::quote(dir)),
            None => format!("spawn {program}: {e}"),
        };
        io::Error::new(e.kind(), SpawnError { message, source: e })
    }
}

/// A spawn failure naming the program; its source is the OS error.
#[derive(Debug)]
struct SpawnError {
    message: String,
    source: io::Error,
}

impl std::fmt::Display for SpawnError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for SpawnError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// An ELF program's `execve` ([`Command::no_shell_for_elf`]), prepared in the parent for the
/// child: the path `execvp` would run, and argv and envp as null-terminated C arrays.
struct DirectExec {
    path: CString,
    /// What `argv` and `envp` point into: owned here, never changed (moving a `Vec` does not
    /// move its buffer).
    _strings: Vec<CString>,
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
}

// SAFETY: the pointers point into `_strings`, which the same value owns and never changes; they
// are only read (by `execve`, in the forked child).
unsafe impl Send for DirectExec {}
// SAFETY: as for `Send`: nothing is written through `&DirectExec`.
unsafe impl Sync for DirectExec {}

impl DirectExec {
    /// The `execve` of what `cmd` runs, when `execvp` would run an ELF file: `None` for any other
    /// file, one not found (its error is `execvp`'s to give), or a NUL byte in a string (std's).
    /// `arg0` is `argv[0]` when set; `env_clear`, whether the child's environment starts empty.
    fn prepare(
        cmd: &std::process::Command,
        arg0: Option<&OsStr>,
        env_clear: bool,
    ) -> Option<DirectExec> {
        let mut env: BTreeMap<OsString, OsString> = match env_clear {
            true => BTreeMap::new(),
            false => std::env::vars_os().collect(),
        };
        for (k, v) in cmd.get_envs() {
            match v {
                Some(v) => env.insert(k.to_owned(), v.to_owned()),
                None => env.remove(k),
            };
        }
        let path = execvp_file(
            cmd.get_program(),
            env.get(OsStr::new("PATH")),
            cmd.get_current_dir(),
        )?;
        let c = |s: &[u8]| CString::new(s).ok();
        let mut strings: Vec<CString> = Vec::with_capacity(1 + cmd.get_args().len() + env.len());
        strings.push(c(arg0.unwrap_or(cmd.get_program()).as_bytes())?);
        for arg in cmd.get_args() {
            strings.push(c(arg.as_bytes())?);
        }
        let argc = strings.len();
        for (k, v) in &env {
            strings.push(c(&[k.as_bytes(), b"=", v.as_bytes()].concat())?);
        }
        let pointers = |s: &[CString]| {
            s.iter()
                .map(|s| s.as_ptr())
                .chain(std::iter::once(std::ptr::null()))
                .collect()
        };
        Some(DirectExec {
            path: c(path.as_os_str().as_bytes())?,
            argv: pointers(&strings[..argc]),
            envp: pointers(&strings[argc..]),
            _strings: strings,
        })
    }

    /// In the child: `execve`, which returns only on failure (async-signal-safe: one syscall,
    /// then `errno` read).
    fn exec(&self) -> io::Error {
        // SAFETY: `path` is a C string, `argv` and `envp` null-terminated arrays of C strings
        // that `self` owns (see the struct); execve reads them and replaces the process.
        unsafe { libc::execve(self.path.as_ptr(), self.argv.as_ptr(), self.envp.as_ptr()) };
        io::Error::last_os_error()
    }
}

/// The file `execvp` runs for `program`, when it is an ELF file: `program` itself when it has a
/// slash, else the first executable file of that name in `path`'s directories (the child's
/// `PATH`; glibc's default without one), as the child will see it. Its first bytes are read
/// from where the child looks, after its `chdir` to `cwd`.
fn execvp_file(program: &OsStr, path: Option<&OsString>, cwd: Option<&Path>) -> Option<PathBuf> {
    let seen_from = |file: &Path| match cwd {
        Some(dir) if file.is_relative() => dir.join(file),
        _ => file.to_owned(),
    };
    let executable = |file: &Path| {
        std::fs::metadata(file).is_ok_and(|m| m.is_file())
            && rustix::fs::access(file, rustix::fs::Access::EXEC_OK).is_ok()
    };
    let file = if program.as_bytes().contains(&b'/') {
        PathBuf::from(program)
    } else {
        let path = path.map_or(OsStr::new("/bin:/usr/bin"), OsString::as_os_str);
        std::env::split_paths(path)
            .map(|dir| dir.join(program))
            .find(|file| executable(&seen_from(file)))?
    };
    let mut magic = [0u8; 4];
    std::fs::File::open(seen_from(&file))
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
        .ok()?;
    (&magic == b"\x7fELF").then_some(file)
}

/// One spawn's extra fds, prepared in the parent: close-on-exec duplicates of the sources, all
/// above the highest target, and placeholders in the free numbers below it (see the module doc).
struct ChildFds {
    /// (source, target) as raw numbers, for the child.
    pairs: Box<[(RawFd, RawFd)]>,
    /// The duplicated sources and the placeholders: to be closed right after the fork.
    held: Vec<OwnedFd>,
}

impl ChildFds {
    fn prepare(wanted: &[(RawFd, BorrowedFd<'_>)]) -> io::Result<ChildFds> {
        let Some(highest) = wanted.iter().map(|(t, _)| *t).max() else {
            return Ok(ChildFds {
                pairs: Box::new([]),
                held: Vec::new(),
            });
        };
        let mut held = wanted
            .iter()
            .map(|(_, fd)| rustix::io::fcntl_dupfd_cloexec(fd, highest + 1))
            .collect::<Result<Vec<_>, _>>()?;
        let pairs = held
            .iter()
            .zip(wanted)
            .map(|(src, (target, _))| (src.as_raw_fd(), *target))
            .collect();
        // F_DUPFD takes the lowest free number: fill until that is above the highest target.
        loop {
            let placeholder = rustix::io::fcntl_dupfd_cloexec(&held[0], CHANNEL_FD)?;
            if placeholder.as_raw_fd() > highest {
                break;
            }
            held.push(placeholder);
        }
        Ok(ChildFds { pairs, held })
    }
}

/// Puts every signal this process catches back to its default action, as `exec` is about to;
/// ignored ones stay ignored (as across `exec`). For the child between `fork` and `exec`: there a
/// handler inherited from the parent (signal-hook's, behind `nodus::signal`) would take a
/// `SIGTERM` meant to end the child, note it in the child's copy of its state and return, and the
/// program would run as if none had come. Raw `sigaction` calls on stack values only:
/// async-signal-safe.
pub(super) fn default_caught_signals() {
    // Linux's signals are 1..=64 (`SIGRTMAX`); glibc refuses the two it keeps for itself.
    for sig in 1..=64 {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        // SAFETY: `sigaction` with a valid signal number (or an EINVAL return for one that is
        // not), a null or initialized new action and a writable old one; all-zero is a valid
        // `sigaction` (no flags, empty mask, `SIG_DFL`).
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut old) != 0
                || old.sa_sigaction == libc::SIG_DFL
                || old.sa_sigaction == libc::SIG_IGN
            {
                continue;
            }
            let default: libc::sigaction = std::mem::zeroed();
            libc::sigaction(sig, &default, std::ptr::null_mut());
        }
    }
}

/// Sets close-on-exec on every fd from 3 up with one `close_range` (Linux ≥ 5.11): one raw
/// syscall, async-signal-safe (for the child between fork and exec).
fn cloexec_from_3() -> io::Result<()> {
    cloexec_range(3, u32::MAX)
}

fn cloexec_range(first: u32, last: u32) -> io::Result<()> {
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only sets a flag on this process's fds in
    // [first, last]; it takes no pointers and closes nothing.
    let r = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first,
            last,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Whether this kernel has `close_range` with `CLOSE_RANGE_CLOEXEC` (asked once, on a range that
/// holds no fd: ENOSYS before 5.9, EINVAL for the flag before 5.11).
fn close_range_cloexec_works() -> bool {
    static WORKS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *WORKS.get_or_init(|| cloexec_range(u32::MAX - 1, u32::MAX).is_ok())
}

/// The fds above stdio this process holds without close-on-exec: inherited ones, which nodus did
/// not open. Best effort: none when `/proc` is not mounted. (Kernels before 5.11 only.)
fn inheritable_fds() -> Box<[RawFd]> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return Box::new([]);
    };
    dir.filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<RawFd>().ok())
        .filter(|&fd| {
            // SAFETY: only reads the flags of fd `fd`, which another thread may close at any
            // moment: the call then fails (or reads whatever the number now holds), harmlessly.
            let fd = unsafe { BorrowedFd::borrow_raw(fd) };
            fd.as_raw_fd() > 2
                && rustix::io::fcntl_getfd(fd)
                    .is_ok_and(|flags| !flags.contains(rustix::io::FdFlags::CLOEXEC))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        /// The next child takes its parent for gone (as if it died before the child's `prctl`).
        pub(super) static PARENT_GONE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    /// A child whose parent is gone before its parent-death signal is set signals itself with
    /// it. This process catches that signal (a `Signals` stream: signal-hook's handler), and the
    /// child must not run that handler before `exec` (it would swallow the signal and run the
    /// program orphaned): it dies of the signal.
    #[test]
    fn a_signal_the_child_gets_before_exec_is_not_caught_by_the_parents_handler() {
        std::thread::spawn(|| {
            let status = crate::Runtime::new().block_on(async {
                let _caught = crate::signal::Signals::new(&[libc::SIGTERM]).unwrap();
                PARENT_GONE.with(|g| g.set(true));
                let mut cmd = Command::new("true");
                cmd.stdin(Stdio::Null)
                    .stdout(Stdio::Null)
                    .stderr(Stdio::Inherit)
                    .parent_death_signal(Some(libc::SIGTERM));
                let child = cmd.spawn();
                PARENT_GONE.with(|g| g.set(false));
                crate::timeout(std::time::Duration::from_secs(20), child.unwrap().wait())
                    .await
                    .expect("the child ends")
                    .unwrap()
            });
            assert_eq!(status.signal(), Some(libc::SIGTERM), "{status}");
        })
        .join()
        .unwrap();
    }

    /// The scheduling policy in a `/proc/PID/stat` text (field 41: 0 normal, 3 batch).
    fn policy_in(stat: &str) -> u32 {
        let after_comm = &stat[stat.rfind(')').expect("(comm)") + 2..];
        after_comm.split(' ').nth(41 - 3).unwrap().parse().unwrap()
    }

    /// A cluster primary's loop thread runs `SCHED_BATCH` by nodus's choice (`sched`): any child
    /// it spawns, not only its workers, starts under the normal policy.
    #[test]
    fn a_child_of_a_thread_nodus_switched_to_batch_runs_the_normal_policy() {
        std::thread::spawn(|| {
            assert!(super::super::sched::batch_this_thread());
            let dir = std::env::temp_dir().join(format!("nodus-sched-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let out = dir.join("stat");
            let file = std::fs::File::create(&out).unwrap();
            let status = crate::Runtime::new().block_on(async {
                let mut cmd = Command::new("cat");
                cmd.arg("/proc/self/stat")
                    .stdin(Stdio::Null)
                    .stdout(Stdio::Fd(file.into()))
                    .stderr(Stdio::Inherit);
                let child = cmd.spawn().unwrap();
                crate::timeout(std::time::Duration::from_secs(20), child.wait())
                    .await
                    .expect("cat exits")
            });
            assert!(status.unwrap().success());
            let stat = std::fs::read_to_string(&out).unwrap();
            std::fs::remove_dir_all(&dir).unwrap();
            assert_eq!(policy_in(&stat), libc::SCHED_OTHER as u32, "{stat}");
        })
        .join()
        .unwrap();
    }
}
