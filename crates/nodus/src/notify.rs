//! systemd's notify protocol (`sd_notify(3)`), both ways: [`notify`] tells our service manager
//! that we are ready, reloading or stopping; [`NotifySocket`] is the manager's side, for a
//! supervisor that gives each child a `NOTIFY_SOCKET` of its own.
//!
//! When `NOTIFY_SOCKET` names a Unix datagram socket (a path, or an abstract name starting with
//! `@`), each state is one datagram of `KEY=VALUE` lines. Without it, notifying does nothing, so a
//! program can notify unconditionally.
//!
//! Invariants: a send never blocks (the socket is non-blocking; a full manager queue is an error,
//! not a stall); nothing here reads or changes the environment except [`notify`] reading
//! `NOTIFY_SOCKET` and [`watchdog_period`] reading `WATCHDOG_USEC` and `WATCHDOG_PID`. A received datagram is at most [`MAX_DATAGRAM`] bytes of UTF-8 (systemd's
//! limit), or it is an `InvalidData` error and the socket goes on; fds sent along are closed.
//! Abstract sockets are reachable by any process in the network namespace, so each message
//! carries the sender's pid as the kernel saw it (`SO_PASSCRED`) for the supervisor to check.

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rustix::net::RecvFlags;
use socket2::{MaybeUninitSlice, MsgHdrMut, SockRef};

use crate::io::AsyncFd;

/// The largest datagram [`NotifySocket::recv`] accepts (systemd's `NOTIFY_BUFFER_MAX`).
pub const MAX_DATAGRAM: usize = 4096;

/// Sends `state` (for example `"READY=1"`, or `"STOPPING=1\nSTATUS=draining"`) to the service
/// manager. Returns `Ok(false)` when there is none (`NOTIFY_SOCKET` unset).
pub fn notify(state: &str) -> io::Result<bool> {
    let Some(target) = std::env::var_os("NOTIFY_SOCKET") else {
        return Ok(false);
    };
    let target = target.to_string_lossy().into_owned();
    let addr = match target.strip_prefix('@') {
        Some(name) => SocketAddr::from_abstract_name(name.as_bytes())?,
        None => SocketAddr::from_pathname(&target)?,
    };
    let socket = UnixDatagram::unbound()?;
    socket.set_nonblocking(true)?;
    socket.send_to_addr(state.as_bytes(), &addr)?;
    Ok(true)
}

/// systemd's watchdog period for this process (`sd_watchdog_enabled(3)`): `WATCHDOG_USEC` above
/// 0, and `WATCHDOG_PID` unset or this process's pid (a child that inherited the variables is
/// not the one watched). The service is killed unless `WATCHDOG=1` comes within each period:
/// send it every half period.
pub fn watchdog_period() -> Option<Duration> {
    let usec = std::env::var("WATCHDOG_USEC").ok()?.parse::<u64>().ok()?;
    let for_us = std::env::var("WATCHDOG_PID")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        .is_none_or(|pid| pid == std::process::id());
    (usec > 0 && for_us).then(|| Duration::from_micros(usec))
}

/// A datagram socket receiving one child's notifications, bound to a unique abstract name. It is
/// a ref'd handle on the loop, like any socket.
pub struct NotifySocket {
    io: AsyncFd<UnixDatagram>,
    env_value: String,
}

static NEXT_NAME: AtomicU64 = AtomicU64::new(0);

impl NotifySocket {
    /// Binds a new socket named `@nodus/<pid>/<n>` and registers it with the current loop.
    ///
    /// # Panics
    /// Outside a running nodus loop.
    #[track_caller]
    pub fn bind_unique() -> io::Result<NotifySocket> {
        let pid = std::process::id();
        loop {
            let n = NEXT_NAME.fetch_add(1, Ordering::Relaxed);
            let name = format!("nodus/{pid}/{n}");
            // The name can be taken only by a process with our pid in another pid namespace.
            let socket = match UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(&name)?) {
                Err(e) if e.kind() == io::ErrorKind::AddrInUse => continue,
                other => other?,
            };
            rustix::net::sockopt::set_socket_passcred(&socket, true)?;
            return Ok(NotifySocket {
                io: AsyncFd::new(socket)?,
                env_value: format!("@{name}"),
            });
        }
    }

    /// What to put in the child's `NOTIFY_SOCKET`.
    pub fn env_value(&self) -> &str {
        &self.env_value
    }

    /// Receives the next datagram. A datagram over [`MAX_DATAGRAM`] bytes or not UTF-8 is an
    /// `InvalidData` error; the next call receives the next datagram.
    pub async fn recv(&self) -> io::Result<NotifyMessage> {
        self.io
            .read_with(|socket| {
                loop {
                    match receive(socket) {
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        other => return other,
                    }
                }
            })
            .await
    }

    /// Receives the next datagram if one is queued, without waiting: `Ok(None)` when none is
    /// (for a last look once the sender is gone). Errors as [`recv`](Self::recv)'s.
    pub fn try_recv(&self) -> io::Result<Option<NotifyMessage>> {
        loop {
            match receive(self.io.get_ref()) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                other => return other.map(Some),
            }
        }
    }

    /// Stops this socket from keeping the loop alive.
    pub fn unref(&self) {
        self.io.unref()
    }

    /// Makes this socket keep the loop alive again (the default).
    pub fn ref_(&self) {
        self.io.ref_()
    }
}

/// One non-blocking `recvmsg`: the datagram and the sender's pid; fds sent along are closed.
fn receive(socket: &UnixDatagram) -> io::Result<NotifyMessage> {
    let mut data = [MaybeUninit::<u8>::uninit(); MAX_DATAGRAM];
    // Room for the credentials and a few fds (the kernel drops those that do not fit).
    let mut control = [MaybeUninit::<u8>::uninit(); 128];
    let mut bufs = [MaybeUninitSlice::new(&mut data)];
    let mut msg = MsgHdrMut::new()
        .with_buffers(&mut bufs)
        .with_control(&mut control);
    let flags = (RecvFlags::TRUNC | RecvFlags::CMSG_CLOEXEC).bits() as i32;
    let len = SockRef::from(socket).recvmsg(&mut msg, flags)?;
    let control_len = msg.control_len();
    // SAFETY: `recvmsg` wrote the first `control_len` bytes of `control` and the first
    // `min(len, MAX_DATAGRAM)` bytes of `data` (`len` is the whole datagram's size with
    // MSG_TRUNC), so those bytes are initialized.
    let (control, data) = unsafe {
        (
            std::slice::from_raw_parts(control.as_ptr().cast::<u8>(), control_len),
            std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), len.min(MAX_DATAGRAM)),
        )
    };
    let sender_pid = read_control(control);
    if len > MAX_DATAGRAM {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("notify datagram of {len} bytes (the limit is {MAX_DATAGRAM})"),
        ));
    }
    let text = std::str::from_utf8(data).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("notify datagram is not UTF-8: {e}"),
        )
    })?;
    let mut message = NotifyMessage::parse(text);
    message.sender_pid = sender_pid;
    Ok(message)
}

#[cfg(any(
    target_arch = "mips",
    target_arch = "mips64",
    target_arch = "sparc",
    target_arch = "sparc64"
))]
const SOL_SOCKET: i32 = 0xffff;
#[cfg(not(any(
    target_arch = "mips",
    target_arch = "mips64",
    target_arch = "sparc",
    target_arch = "sparc64"
)))]
const SOL_SOCKET: i32 = 1;
const SCM_RIGHTS: i32 = 1;
const SCM_CREDENTIALS: i32 = 2;

/// Walks the control messages as the kernel lays them out (`struct cmsghdr { size_t len; int
/// level; int type; }`, then the payload, each message aligned to `size_t`): returns the pid of
/// `SCM_CREDENTIALS` (`None` if it is 0: a sender outside our pid namespace) and closes the fds
/// of `SCM_RIGHTS`. (rustix's parser would build its non-zero `Pid` from that 0.)
fn read_control(mut control: &[u8]) -> Option<u32> {
    const WORD: usize = std::mem::size_of::<usize>();
    const HEADER: usize = WORD + 8;
    let int_at = |bytes: &[u8], at: usize| {
        i32::from_ne_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
    };
    let mut pid = None;
    while control.len() >= HEADER {
        let len = usize::from_ne_bytes(control[..WORD].try_into().expect("a word"));
        if len < HEADER || len > control.len() {
            break;
        }
        let payload = &control[HEADER..len];
        match (int_at(control, WORD), int_at(control, WORD + 4)) {
            (SOL_SOCKET, SCM_CREDENTIALS) if payload.len() >= 4 => {
                pid = u32::try_from(int_at(payload, 0)).ok().filter(|&p| p > 0);
            }
            (SOL_SOCKET, SCM_RIGHTS) => {
                for fd in payload.chunks_exact(4) {
                    // SAFETY: the kernel just installed this fd for this call; nothing else in
                    // the process knows its number, so this is its only owner.
                    drop(unsafe { OwnedFd::from_raw_fd(int_at(fd, 0)) });
                }
            }
            _ => {}
        }
        control = control.get(len.next_multiple_of(WORD)..).unwrap_or(&[]);
    }
    pid
}

/// One notification: the `KEY=VALUE` lines of a datagram.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NotifyMessage {
    /// `READY=1`
    pub ready: bool,
    /// `STOPPING=1`
    pub stopping: bool,
    /// `RELOADING=1`
    pub reloading: bool,
    /// `WATCHDOG=1`
    pub watchdog: bool,
    /// `STATUS=...` (the last one)
    pub status: Option<String>,
    /// `MAINPID=...` (the last valid one)
    pub main_pid: Option<u32>,
    /// Every other line, in order, and known keys with values not understood (`READY=0`,
    /// `WATCHDOG=trigger`, `MAINPID=x`).
    pub other: Vec<(String, String)>,
    /// The sending process, as the kernel reports it (`None` for a message built by `parse`).
    pub sender_pid: Option<u32>,
}

impl NotifyMessage {
    /// Parses `KEY=VALUE` lines; empty lines and lines without `=` are ignored, as systemd does.
    pub fn parse(text: &str) -> NotifyMessage {
        let mut m = NotifyMessage::default();
        for (key, value) in text.split('\n').filter_map(|l| l.split_once('=')) {
            if !m.set(key, value) {
                m.other.push((key.to_owned(), value.to_owned()));
            }
        }
        m
    }

    /// Records a known key with a value it understands; `false` otherwise.
    fn set(&mut self, key: &str, value: &str) -> bool {
        let flag = match key {
            "READY" => &mut self.ready,
            "STOPPING" => &mut self.stopping,
            "RELOADING" => &mut self.reloading,
            "WATCHDOG" => &mut self.watchdog,
            "STATUS" => {
                self.status = Some(value.to_owned());
                return true;
            }
            "MAINPID" => {
                return match value.parse() {
                    Ok(pid) if pid > 0 => {
                        self.main_pid = Some(pid);
                        true
                    }
                    _ => false,
                };
            }
            _ => return false,
        };
        *flag |= value == "1";
        value == "1"
    }
}
