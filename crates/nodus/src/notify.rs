//! systemd's notify protocol (`sd_notify(3)`): telling a service manager that the service is
//! ready, reloading or stopping.
//!
//! When `NOTIFY_SOCKET` names a Unix datagram socket (a path, or an abstract name starting with
//! `@`), each state is one datagram of `KEY=VALUE` lines. Without it, notifying does nothing, so a
//! program can notify unconditionally.
//!
//! Invariants: a send never blocks (the socket is non-blocking; a full manager queue is an error,
//! not a stall); nothing here reads or changes the environment except reading `NOTIFY_SOCKET`.

use std::io;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

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
