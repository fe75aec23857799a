//! Sockets on the loop: [`TcpListener`], [`TcpStream`], [`UdpSocket`], [`UnixListener`] and
//! [`UnixStream`], each a thin layer over [`AsyncFd`](crate::io::AsyncFd) and the std type it
//! wraps.
//!
//! Invariants, shared by every type here:
//! - **Edge-triggered readiness.** Every operation is attempted first; only `WouldBlock` (and an
//!   accept's back-off, below) clears the remembered readiness, after which the task waits for
//!   the next edge from epoll. A short
//!   read or write leaves readiness set (the next attempt finds out). `EINTR` is retried. Every
//!   readiness check draws one unit of the task's cooperative budget, so a socket that is always
//!   ready cannot starve timers or other tasks.
//! - **Any number of waiters per direction.** Any number of tasks may wait to read (accept,
//!   receive) and to write on one socket: N acceptors on one `Rc<TcpListener>`, receivers
//!   sharing a `UdpSocket`, a reader task and a writer task sharing a stream (`&TcpStream`
//!   implements `AsyncRead` and `AsyncWrite`). Readiness of a direction wakes every task waiting
//!   on it; each tries again, and those that find `WouldBlock` wait for the next edge (no busy
//!   loop). One waiter, the usual case, is stored inline and costs no allocation; a task polled
//!   again is not stored twice. A waiter that gave up (its future dropped by a timeout, say) is
//!   woken once, spuriously, at the next readiness and then forgotten (`io/reactor.rs`).
//! - **What keeps the loop alive.** A socket is an active handle from the moment it is created
//!   or adopted until it is closed, dropped or converted back (`into_std`): while ref'd it keeps
//!   `Runtime::run` from returning, like a libuv handle. `unref()` lets the loop exit while the
//!   socket is still open (Node's `server.unref()`); `ref_()` undoes it.
//! - **Closing.** `close(cb)` closes the fd at once (a peer sees the close, a port is free again)
//!   and runs `cb` in the close phase of this iteration, after the check phase. Dropping closes
//!   too, without a callback. A [`UnixListener`] created by `bind` unlinks its path when closed
//!   or dropped (libuv does the same); one adopted from an fd never does.
//! - **Half-close.** `shutdown(Shutdown::Write)` (or `AsyncWrite::poll_close`) sends FIN: the peer
//!   reads EOF but can still write, and this side can still read. Writes complete before they
//!   return (there is no user-space write queue), so there is nothing to flush first. Reading EOF
//!   does not close the socket: the reading side decides when to write its reply and close.
//! - **Accepting out of file descriptors.** An accept that fails for want of file descriptors or
//!   kernel memory (`EMFILE`, `ENFILE`, `ENOBUFS`, `ENOMEM`) leaves the connection queued, so
//!   an accept at once would fail again, forever: a plain accept loop would spin. The error is
//!   returned to the caller each time, the listener stays usable, and its next accept waits
//!   100 ms, or until a new connection arrives, whichever comes first (the loop gives the
//!   listener its readiness back then: an unref'd timer, at most one armed per listener), so a
//!   queued connection is accepted at most 100 ms after an fd is freed. libuv instead keeps a
//!   spare fd open (`uv__emfile_trick`): on `EMFILE` it closes it, accepts and closes every
//!   queued connection, and opens it again, so those clients are dropped (they read a close)
//!   and Node's server sees no error. nodus keeps them waiting in the kernel's backlog, as
//!   nginx does (it stops accepting for `accept_mutex_delay`, 500 ms, after `EMFILE`): a
//!   connection that can be served once fds are freed is served, not dropped; no fd is held in
//!   reserve (another thread's open, an I/O pool's, could take the freed number before it is
//!   reopened); the backlog bounds what waits; and the caller sees the error and decides (log
//!   it, close idle connections). nodus-http's accept loop needs no pause of its own.
//! - **No `SIGPIPE`.** Stream writes use `send(MSG_NOSIGNAL)`: writing to a reset connection is an
//!   `EPIPE` error, never a signal, whatever the process's signal disposition.
//! - **Close-on-exec.** Every fd created here is `O_CLOEXEC` (std and socket2 create sockets
//!   with `SOCK_CLOEXEC`, and accept with `accept4(SOCK_CLOEXEC)`); `from_owned_fd` sets it on fds
//!   it adopts (inherited `LISTEN_FDS`, say), as `sd_listen_fds` does.
//! - **Conversions.** `from_std` makes the fd non-blocking and registers it; `into_std`
//!   deregisters it and gives it back still non-blocking. `from_owned_fd` first checks that the fd
//!   is the right kind of socket (`InvalidInput` otherwise).
//!
//! Addresses are IP literals ([`IntoSocketAddr`]): resolving a name is a DNS lookup, which does
//! not belong on the loop. Socket options not offered here are one `socket2::SockRef::from(&s)`
//! away (every type is `AsFd`).

mod half_open;
mod inherited;
mod sys;
pub(crate) mod tcp;
mod udp;
mod unix;

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

pub use half_open::unaccepted;
pub use inherited::{Inherited, listen_fds};
pub use tcp::{DEFER_ACCEPT_SECS, ListenOptions, TcpListener, TcpStream};
pub use udp::UdpSocket;
pub use unix::{UnixListener, UnixStream};

pub use std::net::Shutdown;

/// An address that needs no DNS lookup: a `SocketAddr`, an `(ip, port)` pair (the ip may be a
/// [`dns::Address`](crate::dns::Address), whose IPv6 scope id is kept), or a string such as
/// `"127.0.0.1:8080"` or `"[::1]:0"`. An IPv6 zone may name its interface, as in Node:
/// `"[fe80::1%eth0]:80"` or `("fe80::1%eth0", 80)` (one `if_nametoindex`, no network; `NotFound`
/// when no interface has that name). A host name is an `InvalidInput` error.
pub trait IntoSocketAddr {
    fn into_socket_addr(self) -> io::Result<SocketAddr>;
}

impl IntoSocketAddr for SocketAddr {
    fn into_socket_addr(self) -> io::Result<SocketAddr> {
        Ok(self)
    }
}

impl IntoSocketAddr for &SocketAddr {
    fn into_socket_addr(self) -> io::Result<SocketAddr> {
        Ok(*self)
    }
}

impl IntoSocketAddr for SocketAddrV4 {
    fn into_socket_addr(self) -> io::Result<SocketAddr> {
        Ok(self.into())
    }
}

impl IntoSocketAddr for SocketAddrV6 {
    fn into_socket_addr(self) -> io::Result<SocketAddr> {
        Ok(self.into())
    }
}

macro_rules! ip_port {
    ($($ip:ty),*) => {$(
        impl IntoSocketAddr for ($ip, u16) {
            fn into_socket_addr(self) -> io::Result<SocketAddr> {
                Ok(SocketAddr::new(self.0.into(), self.1))
            }
        }
    )*};
}
ip_port!(IpAddr, Ipv4Addr, Ipv6Addr);

/// A looked-up address and a port: an IPv6 address keeps its scope id ([`crate::dns::Address`]).
impl IntoSocketAddr for (&crate::dns::Address, u16) {
    fn into_socket_addr(self) -> io::Result<SocketAddr> {
        Ok(self.0.socket_addr(self.1))
    }
}

impl IntoSocketAddr for (crate::dns::Address, u16) {
    fn into_socket_addr(self) -> io::Result<SocketAddr> {
        Ok(self.0.socket_addr(self.1))
    }
}

impl IntoSocketAddr for (&str, u16) {
    fn into_socket_addr(self) -> io::Result<SocketAddr> {
        let (host, port) = self;
        if let Ok(ip) = host.parse::<IpAddr>() {
            return Ok(SocketAddr::new(ip, port));
        }
        match crate::dns::zoned_ip(host) {
            Some(zoned) => zoned_addr(zoned, port, &format!("[{host}]:{port}")),
            None => Err(not_an_ip(&format!("{host}:{port}"))),
        }
    }
}

impl IntoSocketAddr for &str {
    fn into_socket_addr(self) -> io::Result<SocketAddr> {
        if let Ok(addr) = self.parse() {
            return Ok(addr);
        }
        // std reads a numeric zone only (`[fe80::1%2]:80`); an interface name is looked up.
        let bracketed = self
            .strip_prefix('[')
            .and_then(|rest| rest.rsplit_once("]:"));
        let Some((host, port)) = bracketed else {
            return Err(not_an_ip(self));
        };
        // All digits, as std reads a port (`u16::from_str` alone would take `+80`).
        let digits = !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit());
        match (
            crate::dns::zoned_ip(host),
            port.parse::<u16>().ok().filter(|_| digits),
        ) {
            (Some(zoned), Some(port)) => zoned_addr(zoned, port, self),
            _ => Err(not_an_ip(self)),
        }
    }
}

impl IntoSocketAddr for String {
    fn into_socket_addr(self) -> io::Result<SocketAddr> {
        self.as_str().into_socket_addr()
    }
}

impl IntoSocketAddr for &String {
    fn into_socket_addr(self) -> io::Result<SocketAddr> {
        self.as_str().into_socket_addr()
    }
}

/// An IPv6 address with its zone's scope id, or why the zone named no interface.
fn zoned_addr(zoned: io::Result<(Ipv6Addr, u32)>, port: u16, s: &str) -> io::Result<SocketAddr> {
    let (ip, scope_id) =
        zoned.map_err(|e| io::Error::new(e.kind(), format!("nodus::net: {s:?}: {e}")))?;
    Ok(SocketAddrV6::new(ip, port, 0, scope_id).into())
}

fn not_an_ip(s: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!(
            "nodus::net: {s:?} is not an IP address and port (such as \"127.0.0.1:8080\" or \
             \"[::1]:8080\"); resolve host names first, off the loop"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodus_testkit::net::loopback_index;

    #[test]
    fn a_zone_may_name_its_interface() {
        let ll: Ipv6Addr = "fe80::1".parse().unwrap();
        let on_lo = SocketAddr::from(SocketAddrV6::new(ll, 80, 0, loopback_index()));
        assert_eq!("[fe80::1%lo]:80".into_socket_addr().unwrap(), on_lo);
        assert_eq!(("fe80::1%lo", 80).into_socket_addr().unwrap(), on_lo);
        let numeric = format!("[fe80::1%{}]:80", loopback_index());
        assert_eq!(numeric.into_socket_addr().unwrap(), on_lo);
    }

    #[test]
    fn a_zone_that_names_no_interface_says_so() {
        let err = "[fe80::1%nodus-no-if]:80".into_socket_addr().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound, "{err}");
        let text = err.to_string();
        assert!(
            text.contains("[fe80::1%nodus-no-if]:80") && text.contains("nodus-no-if'"),
            "{text}"
        );
        for bad in [
            "[fe80::1%lo]:99999",
            "[fe80::1%lo]:+80",
            "[fe80::1%lo]",
            "fe80::1%lo:80",
            "[host%lo]:80",
        ] {
            let err = bad.into_socket_addr().unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{bad}: {err}");
        }
        let err = ("fe80::1%nodus-no-if", 80).into_socket_addr().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound, "{err}");
    }
}
