//! UDP: [`UdpSocket`], datagrams over `AsyncFd<std::net::UdpSocket>`.
//!
//! A datagram is sent whole or not at all; one received into a buffer too small for it is
//! truncated (the rest is dropped, as `recv(2)` does). `connect` only sets the default peer and
//! filters what is received (no packet is sent), so it does not wait.

use std::fmt;
use std::future::poll_fn;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::task::{Context, Poll};

use socket2::{Domain, Type};

use super::IntoSocketAddr;
use super::sys::{self, Kind, socket_common};
use crate::io::AsyncFd;

/// A UDP socket.
pub struct UdpSocket {
    io: AsyncFd<std::net::UdpSocket>,
}

impl UdpSocket {
    /// Binds to `addr` (port 0 picks a free port).
    #[track_caller]
    pub fn bind(addr: impl IntoSocketAddr) -> io::Result<UdpSocket> {
        let addr = addr.into_socket_addr()?;
        UdpSocket::from_std(std::net::UdpSocket::bind(addr)?)
    }

    /// Sends one datagram to `target`; returns the bytes sent.
    pub async fn send_to(&self, buf: &[u8], target: impl IntoSocketAddr) -> io::Result<usize> {
        let target = target.into_socket_addr()?;
        poll_fn(|cx| self.poll_send_to(cx, buf, target)).await
    }

    /// Receives one datagram; returns its length and sender. Several tasks may receive on one
    /// socket: a datagram wakes them all, one takes it and the others wait again (see the
    /// [module docs](super)).
    pub async fn recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        poll_fn(|cx| self.poll_recv_from(cx, buf)).await
    }

    /// Sets the default peer for [`send`](Self::send) and accepts datagrams only from it.
    pub fn connect(&self, addr: impl IntoSocketAddr) -> io::Result<()> {
        self.io.get_ref().connect(addr.into_socket_addr()?)
    }

    /// Sends one datagram to the connected peer.
    pub async fn send(&self, buf: &[u8]) -> io::Result<usize> {
        poll_fn(|cx| self.poll_send(cx, buf)).await
    }

    /// Receives one datagram from the connected peer. Several tasks may receive at once, as
    /// with [`recv_from`](Self::recv_from).
    pub async fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        poll_fn(|cx| self.poll_recv(cx, buf)).await
    }

    pub fn poll_send_to(
        &self,
        cx: &mut Context<'_>,
        buf: &[u8],
        target: SocketAddr,
    ) -> Poll<io::Result<usize>> {
        sys::poll_write_op(&self.io, cx, |s| s.send_to(buf, target))
    }

    pub fn poll_recv_from(
        &self,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<(usize, SocketAddr)>> {
        sys::poll_read_op(&self.io, cx, |s| s.recv_from(buf))
    }

    pub fn poll_send(&self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        sys::poll_write_op(&self.io, cx, |s| s.send(buf))
    }

    pub fn poll_recv(&self, cx: &mut Context<'_>, buf: &mut [u8]) -> Poll<io::Result<usize>> {
        sys::poll_read_op(&self.io, cx, |s| s.recv(buf))
    }

    /// Runs a custom non-blocking receive (`recvmsg`, `MSG_PEEK`, ...) until it does not return
    /// `WouldBlock`.
    pub async fn read_with<R>(
        &self,
        mut op: impl FnMut(&std::net::UdpSocket) -> io::Result<R>,
    ) -> io::Result<R> {
        poll_fn(|cx| sys::poll_read_op(&self.io, cx, &mut op)).await
    }

    /// Runs a custom non-blocking send until it does not return `WouldBlock`.
    pub async fn write_with<R>(
        &self,
        mut op: impl FnMut(&std::net::UdpSocket) -> io::Result<R>,
    ) -> io::Result<R> {
        poll_fn(|cx| sys::poll_write_op(&self.io, cx, &mut op)).await
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.io.get_ref().local_addr()
    }

    /// The connected peer (`NotConnected` before [`connect`](Self::connect)).
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.io.get_ref().peer_addr()
    }

    /// `SO_BROADCAST`: allow sending to a broadcast address.
    pub fn set_broadcast(&self, on: bool) -> io::Result<()> {
        self.io.get_ref().set_broadcast(on)
    }

    pub fn broadcast(&self) -> io::Result<bool> {
        self.io.get_ref().broadcast()
    }

    /// Closes the socket now and runs `callback` in this iteration's close phase.
    #[track_caller]
    pub fn close(self, callback: impl FnOnce() + 'static) {
        self.io.close(callback)
    }

    /// Adopts a std socket: makes it non-blocking and registers it with the current loop.
    ///
    /// # Panics
    /// Outside a running nodus loop.
    #[track_caller]
    pub fn from_std(socket: std::net::UdpSocket) -> io::Result<UdpSocket> {
        Ok(UdpSocket {
            io: AsyncFd::new(socket)?,
        })
    }

    /// Adopts a UDP socket fd: checks that it is one (`InvalidInput` otherwise, and the fd is
    /// closed), makes it close-on-exec and non-blocking, and registers it.
    #[track_caller]
    pub fn from_owned_fd(fd: OwnedFd) -> io::Result<UdpSocket> {
        sys::adopt_check(
            &fd,
            &Kind {
                api: "nodus::net::UdpSocket::from_owned_fd",
                expected: "a UDP socket",
                domains: &[Domain::IPV4, Domain::IPV6],
                ty: Type::DGRAM,
                listening: false,
            },
        )?;
        UdpSocket::from_std(fd.into())
    }

    /// Deregisters the socket and gives it back, still non-blocking.
    pub fn into_std(self) -> std::net::UdpSocket {
        self.io.into_inner()
    }
}

socket_common!(UdpSocket, std::net::UdpSocket);

impl fmt::Debug for UdpSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UdpSocket")
            .field("addr", &self.local_addr().ok())
            .field("fd", &self.as_raw_fd())
            .finish()
    }
}
