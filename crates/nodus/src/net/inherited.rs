//! Sockets inherited from a service manager: systemd socket activation, or `nodus run`, which
//! hands its listeners to every worker the same way (`sd_listen_fds(3)`).
//!
//! The manager puts the sockets at fds 3, 4, … and sets `LISTEN_FDS` (how many), `LISTEN_PID`
//! (the process they are for: a child that inherits the variables but has another pid ignores
//! them) and optionally `LISTEN_FDNAMES` (colon-separated names).
//!
//! Invariants: each inherited fd is taken at most once per process (a second call finds none), and
//! is made close-on-exec when adopted (`from_owned_fd`), so it does not leak into children. The
//! variables are left in place: unsetting them races with other threads, and `LISTEN_PID` already
//! keeps children from taking them.

use std::io;
use std::os::fd::{BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};

use socket2::{Domain, SockRef};

use super::{TcpListener, UnixListener};

/// The first inherited fd (`SD_LISTEN_FDS_START`).
const FIRST_FD: i32 = 3;

static TAKEN: AtomicBool = AtomicBool::new(false);

/// A listening socket passed by a service manager, with its name (`unknown` when none was given).
#[derive(Debug)]
pub enum Inherited {
    Tcp(String, TcpListener),
    Unix(String, UnixListener),
}

impl Inherited {
    pub fn name(&self) -> &str {
        match self {
            Inherited::Tcp(n, _) | Inherited::Unix(n, _) => n,
        }
    }
}

/// The socket as a message names it: its name and address (`'unknown' on 127.0.0.1:8080`,
/// `'app' on /run/app.sock`).
impl std::fmt::Display for Inherited {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = crate::fs::quote(std::path::Path::new(self.name()));
        match self {
            Inherited::Tcp(_, l) => match l.local_addr() {
                Ok(addr) => write!(f, "{name} on {addr}"),
                Err(_) => write!(f, "{name} (TCP)"),
            },
            Inherited::Unix(_, l) => match l.local_addr() {
                Ok(addr) => match addr.as_pathname() {
                    Some(path) => write!(f, "{name} on {}", crate::fs::quote(path)),
                    None => write!(f, "{name} (an unnamed or abstract Unix socket)"),
                },
                Err(_) => write!(f, "{name} (Unix)"),
            },
        }
    }
}

/// Takes the listening sockets this process inherited (none if `LISTEN_PID` is not this process's
/// pid, or on a second call), registered with the current loop.
///
/// # Errors
/// A malformed `LISTEN_FDS`, or an inherited fd that is not a listening TCP or Unix stream socket.
#[track_caller]
pub fn listen_fds() -> io::Result<Vec<Inherited>> {
    let Some(count) = listen_fd_count()? else {
        return Ok(Vec::new());
    };
    if TAKEN.swap(true, Ordering::AcqRel) {
        return Ok(Vec::new());
    }
    let names: Vec<String> = std::env::var("LISTEN_FDNAMES")
        .map(|v| v.split(':').map(str::to_owned).collect())
        .unwrap_or_default();
    // Nothing is owned before all are checked: a wrong LISTEN_FDS must not close an fd the
    // runtime opened (its epoll, a pidfd) on the error path.
    for i in 0..count {
        check_inherited(FIRST_FD + i as i32)?;
    }
    let mut out = Vec::with_capacity(count);
    for i in 0..count {
        let raw = FIRST_FD + i as i32;
        // SAFETY: fd `raw` is open, was inherited across exec (no close-on-exec: nothing this
        // process opened) and is a listening socket (`check_inherited`), as LISTEN_FDS says the
        // service manager passed it (LISTEN_PID is our pid); `TAKEN` makes sure it is owned once.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let name = names
            .get(i)
            .cloned()
            .unwrap_or_else(|| "unknown".to_owned());
        let domain = SockRef::from(&fd).domain()?;
        out.push(if domain == Domain::UNIX {
            Inherited::Unix(name, UnixListener::from_owned_fd(fd)?)
        } else {
            Inherited::Tcp(name, TcpListener::from_owned_fd(fd)?)
        });
    }
    Ok(out)
}

/// Whether fd `raw` looks passed by a service manager: open, without close-on-exec (every fd
/// nodus opens has it; an inherited one does not), and a listening socket.
fn check_inherited(raw: i32) -> io::Result<()> {
    let not_passed = |why: String| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("LISTEN_FDS names fd {raw}, which {why}"),
        )
    };
    // SAFETY: only borrowed for the checks below, which read flags and options of whatever fd
    // `raw` is (or fail if none is open); nothing is closed.
    let fd = unsafe { BorrowedFd::borrow_raw(raw) };
    let flags =
        rustix::io::fcntl_getfd(fd).map_err(|e| not_passed(format!("is not open ({e})")))?;
    if flags.contains(rustix::io::FdFlags::CLOEXEC) {
        return Err(not_passed("is close-on-exec (not inherited)".to_owned()));
    }
    match rustix::net::sockopt::socket_acceptconn(fd) {
        Ok(true) => Ok(()),
        Ok(false) => Err(not_passed("is a socket that does not listen".to_owned())),
        Err(e) => Err(not_passed(format!("is not a socket ({e})"))),
    }
}

/// `LISTEN_FDS` if the variables are meant for this process.
fn listen_fd_count() -> io::Result<Option<usize>> {
    let (Ok(pid), Ok(fds)) = (std::env::var("LISTEN_PID"), std::env::var("LISTEN_FDS")) else {
        return Ok(None);
    };
    if pid.trim().parse::<u32>().ok() != Some(std::process::id()) {
        return Ok(None);
    }
    let bad = || {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("LISTEN_FDS={fds:?} is not a count of file descriptors"),
        )
    };
    let count: usize = fds.trim().parse().map_err(|_| bad())?;
    if count > 4096 {
        return Err(bad());
    }
    Ok(Some(count))
}
