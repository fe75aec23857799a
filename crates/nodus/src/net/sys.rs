//! What the socket types share: the edge-triggered attempt loops, `MSG_NOSIGNAL` writes, the
//! non-blocking connect protocol, checks on adopted fds, and macros for the methods every type
//! has (ref/unref, fd conversions, stream I/O).
//!
//! The attempt loops are the one place readiness is cleared: an operation is tried while the
//! source is (believed) ready, `WouldBlock` forgets the readiness and the next check registers the
//! task's waker, `EINTR` tries again. Each check costs one unit of the cooperative budget. The
//! one other place is [`poll_accept`]'s back-off: an accept out of file descriptors or memory
//! forgets the listener's readiness too, and [`AcceptBackoff`] has the loop give it back
//! [`ACCEPT_BACKOFF`] later (see the [module docs](super) for why). A stream's `recv`, `send`
//! and `sendmsg` (rustix's, made inline: no wrapper returns first) are followed by
//! [`crate::io::after_syscall`] (the return-stack refill, where it pays).

use std::cell::Cell;
use std::future::poll_fn;
use std::io::{self, IoSlice, IoSliceMut, Read};
use std::net::Shutdown;
use std::os::fd::{AsFd, AsRawFd};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use rustix::io::Errno;
use rustix::net::{RecvFlags, SendAncillaryBuffer, SendFlags};
use socket2::{Domain, SockAddr, SockRef, Socket, Type};

use crate::io::AsyncFd;

/// Tries `op` while the fd may be readable.
pub(super) fn poll_read_op<T: AsFd, R>(
    io: &AsyncFd<T>,
    cx: &mut Context<'_>,
    mut op: impl FnMut(&T) -> io::Result<R>,
) -> Poll<io::Result<R>> {
    loop {
        ready!(io.poll_read_ready(cx))?;
        match op(io.get_ref()) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => io.clear_read_ready(),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            other => return Poll::Ready(other),
        }
    }
}

/// How long a listener's next accept waits after one failed for want of file descriptors or
/// memory, unless a new connection arrives first (the pause nodus-http's accept loop made).
pub(super) const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// A listener's back-off after an accept out of resources: when the loop's retry it armed is due
/// (`clock::now_ns`), so that failures meanwhile (one per new connection) arm no more.
#[derive(Default)]
pub(super) struct AcceptBackoff {
    retry_at: Cell<u64>,
}

impl AcceptBackoff {
    /// The accept failed with `e`: if it is a shortage that an accept at once would meet again
    /// (the connection stays queued), waits [`ACCEPT_BACKOFF`] or for the next connection.
    fn failed<L: AsFd>(&self, io: &AsyncFd<L>, e: &io::Error) {
        let shortage = [Errno::MFILE, Errno::NFILE, Errno::NOBUFS, Errno::NOMEM]
            .iter()
            .any(|errno| e.raw_os_error() == Some(errno.raw_os_error()));
        if !shortage {
            return;
        }
        let now = crate::clock::now_ns();
        if now < self.retry_at.get() {
            // A retry is armed already: forget the readiness, as it would.
            io.clear_read_ready();
            return;
        }
        let delay = ACCEPT_BACKOFF.as_nanos() as u64;
        self.retry_at.set(now + delay);
        io.retry_read_after(delay);
    }
}

/// Accepts a connection if one is queued (skipping `ECONNABORTED`, as libuv does) and adopts it
/// with `adopt`; otherwise registers the task to be woken. An error is returned as it is; one
/// out of file descriptors or memory starts `backoff` first.
pub(super) fn poll_accept<L: AsFd, S, A, T>(
    io: &AsyncFd<L>,
    backoff: &AcceptBackoff,
    cx: &mut Context<'_>,
    mut accept: impl FnMut(&L) -> io::Result<(S, A)>,
    adopt: impl Fn(S) -> io::Result<T>,
) -> Poll<io::Result<(T, A)>> {
    loop {
        match ready!(poll_read_op(io, cx, &mut accept)) {
            Ok((stream, peer)) => return Poll::Ready(adopt(stream).map(|s| (s, peer))),
            Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => {}
            Err(e) => {
                backoff.failed(io, &e);
                return Poll::Ready(Err(e));
            }
        }
    }
}

/// Tries `op` while the fd may be writable.
pub(super) fn poll_write_op<T: AsFd, R>(
    io: &AsyncFd<T>,
    cx: &mut Context<'_>,
    mut op: impl FnMut(&T) -> io::Result<R>,
) -> Poll<io::Result<R>> {
    loop {
        ready!(io.poll_write_ready(cx))?;
        match op(io.get_ref()) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => io.clear_write_ready(),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            other => return Poll::Ready(other),
        }
    }
}

/// `recv`: a stream socket's read without the file layer `read` goes through.
pub(super) fn poll_read<T: AsFd>(
    io: &AsyncFd<T>,
    cx: &mut Context<'_>,
    buf: &mut [u8],
) -> Poll<io::Result<usize>> {
    poll_read_op(io, cx, |s| {
        let received = rustix::net::recv(s, &mut *buf, RecvFlags::empty());
        crate::io::after_syscall();
        Ok(received?.0)
    })
}

pub(super) fn poll_read_vectored<T: AsFd>(
    io: &AsyncFd<T>,
    cx: &mut Context<'_>,
    bufs: &mut [IoSliceMut<'_>],
) -> Poll<io::Result<usize>>
where
    for<'a> &'a T: Read,
{
    poll_read_op(io, cx, |mut s| s.read_vectored(bufs))
}

/// `send(MSG_NOSIGNAL)`: a reset peer is an `EPIPE` error, never a `SIGPIPE`.
pub(super) fn poll_write<T: AsFd>(
    io: &AsyncFd<T>,
    cx: &mut Context<'_>,
    buf: &[u8],
) -> Poll<io::Result<usize>> {
    poll_write_op(io, cx, |s| {
        let sent = rustix::net::send(s, buf, SendFlags::NOSIGNAL);
        crate::io::after_syscall();
        Ok(sent?)
    })
}

/// `sendmsg(MSG_NOSIGNAL)` with no ancillary data.
pub(super) fn poll_write_vectored<T: AsFd>(
    io: &AsyncFd<T>,
    cx: &mut Context<'_>,
    bufs: &[IoSlice<'_>],
) -> Poll<io::Result<usize>> {
    poll_write_op(io, cx, |s| {
        let mut control = SendAncillaryBuffer::default();
        let sent = rustix::net::sendmsg(s, bufs, &mut control, SendFlags::NOSIGNAL);
        crate::io::after_syscall();
        Ok(sent?)
    })
}

/// `shutdown(2)`; a socket the peer already reset counts as shut down.
pub(super) fn shutdown<T: AsFd>(s: &T, how: Shutdown) -> io::Result<()> {
    match SockRef::from(s).shutdown(how) {
        Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(()),
        other => other,
    }
}

/// Connects the new stream socket `socket` to `addr` without blocking the loop: non-blocking,
/// the connect started, registered with the current loop (as `from_std` registers a std stream),
/// then ready once [`poll_connected`] says how it went.
pub(super) async fn connect<S: AsFd + From<Socket>>(
    socket: Socket,
    addr: &SockAddr,
) -> io::Result<AsyncFd<S>> {
    socket.set_nonblocking(true)?;
    start_connect(&socket, addr)?;
    let io = AsyncFd::new(S::from(socket))?;
    poll_fn(|cx| poll_connected(&io, cx)).await?;
    Ok(io)
}

/// Starts a non-blocking connect: success or "in progress" are both fine.
fn start_connect(socket: &Socket, addr: &SockAddr) -> io::Result<()> {
    match socket.connect(addr) {
        Ok(()) => Ok(()),
        Err(e)
            if e.raw_os_error() == Some(Errno::INPROGRESS.raw_os_error())
                || e.kind() == io::ErrorKind::Interrupted =>
        {
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// Ready once a non-blocking connect finished: the fd became writable and `SO_ERROR` says how it
/// went. A writable-looking fd that has no peer yet (the registration starts out ready) is still
/// connecting.
fn poll_connected<T: AsFd>(io: &AsyncFd<T>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
    loop {
        ready!(io.poll_write_ready(cx))?;
        let socket = SockRef::from(io.get_ref());
        if let Some(e) = socket.take_error()? {
            return Poll::Ready(Err(e));
        }
        match socket.peer_addr() {
            Ok(_) => return Poll::Ready(Ok(())),
            Err(e) if e.kind() == io::ErrorKind::NotConnected => io.clear_write_ready(),
            Err(e) => return Poll::Ready(Err(e)),
        }
    }
}

/// What an adopted fd must be.
pub(super) struct Kind {
    pub(super) api: &'static str,
    pub(super) expected: &'static str,
    pub(super) domains: &'static [Domain],
    pub(super) ty: Type,
    pub(super) listening: bool,
}

/// Checks that `fd` is a socket of `kind` and makes it close-on-exec.
pub(super) fn adopt_check(fd: &impl AsFd, kind: &Kind) -> io::Result<()> {
    let socket = SockRef::from(fd);
    let raw = fd.as_fd().as_raw_fd();
    let describe = |e: io::Error| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: fd {raw} is not {} ({e})", kind.api, kind.expected),
        )
    };
    let domain = socket.domain().map_err(describe)?;
    let ty = socket.r#type().map_err(describe)?;
    let listening = socket.is_listener().map_err(describe)?;
    if !kind.domains.contains(&domain) || ty != kind.ty || listening != kind.listening {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{}: fd {raw} is not {} (domain {domain:?}, type {ty:?}, listening: {listening})",
                kind.api, kind.expected
            ),
        ));
    }
    socket.set_cloexec(true)
}

/// `unref`/`ref_`/`has_ref`, `AsFd`/`AsRawFd`, and the fd conversions of a socket type whose
/// `io` field is an `AsyncFd<$std>` and which has `from_std`, `from_owned_fd` and `into_std`.
macro_rules! socket_common {
    ($ty:ident, $std:ty) => {
        impl $ty {
            /// Stops this socket from keeping the loop alive (Node's `unref()`): `run` may return
            /// while it is open.
            pub fn unref(&self) {
                self.io.unref()
            }

            /// Makes this socket keep the loop alive again (the default).
            pub fn ref_(&self) {
                self.io.ref_()
            }

            /// Whether this socket keeps the loop alive.
            pub fn has_ref(&self) -> bool {
                self.io.has_ref()
            }
        }

        impl std::os::fd::AsFd for $ty {
            fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
                std::os::fd::AsFd::as_fd(self.io.get_ref())
            }
        }

        impl std::os::fd::AsRawFd for $ty {
            fn as_raw_fd(&self) -> std::os::fd::RawFd {
                std::os::fd::AsRawFd::as_raw_fd(&std::os::fd::AsFd::as_fd(self))
            }
        }

        impl std::os::fd::IntoRawFd for $ty {
            fn into_raw_fd(self) -> std::os::fd::RawFd {
                std::os::fd::IntoRawFd::into_raw_fd(self.into_std())
            }
        }

        impl From<$ty> for std::os::fd::OwnedFd {
            fn from(socket: $ty) -> std::os::fd::OwnedFd {
                socket.into_std().into()
            }
        }

        impl TryFrom<$std> for $ty {
            type Error = std::io::Error;
            fn try_from(socket: $std) -> std::io::Result<$ty> {
                $ty::from_std(socket)
            }
        }

        impl TryFrom<std::os::fd::OwnedFd> for $ty {
            type Error = std::io::Error;
            fn try_from(fd: std::os::fd::OwnedFd) -> std::io::Result<$ty> {
                $ty::from_owned_fd(fd)
            }
        }
    };
}
pub(super) use socket_common;

/// Byte-stream methods and `futures_io` impls (for `$ty` and `&$ty`) of a stream type whose `io`
/// field is an `AsyncFd<$std>`.
macro_rules! stream_io {
    ($ty:ident, $std:ty) => {
        impl $ty {
            /// Reads into `buf`; `Ok(0)` is end of stream (the peer shut down its write side).
            /// Tasks reading one stream at once each get some of its bytes, in no set order
            /// (the [module docs](super) say how waiters are woken).
            pub async fn read(&self, buf: &mut [u8]) -> std::io::Result<usize> {
                std::future::poll_fn(|cx| super::sys::poll_read(&self.io, cx, buf)).await
            }

            /// Writes some of `buf`; returns how much the kernel took.
            pub async fn write(&self, buf: &[u8]) -> std::io::Result<usize> {
                std::future::poll_fn(|cx| super::sys::poll_write(&self.io, cx, buf)).await
            }

            /// Writes all of `buf`, waiting while the peer's window and the send buffer are full.
            pub async fn write_all(&self, mut buf: &[u8]) -> std::io::Result<()> {
                while !buf.is_empty() {
                    match self.write(buf).await? {
                        0 => return Err(std::io::ErrorKind::WriteZero.into()),
                        n => buf = &buf[n..],
                    }
                }
                Ok(())
            }

            /// Shuts down one or both directions. `Shutdown::Write` is a half-close: the peer
            /// reads EOF, and this side can still read its reply.
            pub fn shutdown(&self, how: std::net::Shutdown) -> std::io::Result<()> {
                super::sys::shutdown(self.io.get_ref(), how)
            }

            /// Ready when the socket may be readable (readiness, not data: the next read may
            /// still be `WouldBlock`).
            pub fn poll_read_ready(
                &self,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                self.io.poll_read_ready(cx)
            }

            /// Ready when the socket may be writable.
            pub fn poll_write_ready(
                &self,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                self.io.poll_write_ready(cx)
            }

            /// Forgets read readiness: call it after a custom operation on the fd (not through
            /// [`read_with`](Self::read_with)) returned `WouldBlock`, so that the next
            /// `poll_read_ready` waits for a new edge.
            pub fn clear_read_ready(&self) {
                self.io.clear_read_ready()
            }

            /// Forgets write readiness (after a custom write returned `WouldBlock`).
            pub fn clear_write_ready(&self) {
                self.io.clear_write_ready()
            }

            /// Runs a custom non-blocking read-side operation (`recvmsg`, `MSG_PEEK`, ...) until
            /// it does not return `WouldBlock`.
            pub async fn read_with<R>(
                &self,
                op: impl FnMut(&$std) -> std::io::Result<R>,
            ) -> std::io::Result<R> {
                let mut op = op;
                std::future::poll_fn(|cx| super::sys::poll_read_op(&self.io, cx, &mut op)).await
            }

            /// Runs a custom non-blocking write-side operation (`sendmsg` with fds, ...) until it
            /// does not return `WouldBlock`.
            pub async fn write_with<R>(
                &self,
                op: impl FnMut(&$std) -> std::io::Result<R>,
            ) -> std::io::Result<R> {
                let mut op = op;
                std::future::poll_fn(|cx| super::sys::poll_write_op(&self.io, cx, &mut op)).await
            }
        }

        impl futures_io::AsyncRead for &$ty {
            fn poll_read(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                buf: &mut [u8],
            ) -> std::task::Poll<std::io::Result<usize>> {
                super::sys::poll_read(&self.io, cx, buf)
            }

            fn poll_read_vectored(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                bufs: &mut [std::io::IoSliceMut<'_>],
            ) -> std::task::Poll<std::io::Result<usize>> {
                super::sys::poll_read_vectored(&self.io, cx, bufs)
            }
        }

        impl futures_io::AsyncWrite for &$ty {
            fn poll_write(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                buf: &[u8],
            ) -> std::task::Poll<std::io::Result<usize>> {
                super::sys::poll_write(&self.io, cx, buf)
            }

            fn poll_write_vectored(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                bufs: &[std::io::IoSlice<'_>],
            ) -> std::task::Poll<std::io::Result<usize>> {
                super::sys::poll_write_vectored(&self.io, cx, bufs)
            }

            /// Writes are not buffered: nothing to flush.
            fn poll_flush(
                self: std::pin::Pin<&mut Self>,
                _cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                std::task::Poll::Ready(Ok(()))
            }

            /// Shuts down the write side (half-close); the fd stays open for reading.
            fn poll_close(
                self: std::pin::Pin<&mut Self>,
                _cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                std::task::Poll::Ready(self.shutdown(std::net::Shutdown::Write))
            }
        }

        impl futures_io::AsyncRead for $ty {
            fn poll_read(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                buf: &mut [u8],
            ) -> std::task::Poll<std::io::Result<usize>> {
                futures_io::AsyncRead::poll_read(std::pin::Pin::new(&mut &*self), cx, buf)
            }

            fn poll_read_vectored(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                bufs: &mut [std::io::IoSliceMut<'_>],
            ) -> std::task::Poll<std::io::Result<usize>> {
                futures_io::AsyncRead::poll_read_vectored(std::pin::Pin::new(&mut &*self), cx, bufs)
            }
        }

        impl futures_io::AsyncWrite for $ty {
            fn poll_write(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                buf: &[u8],
            ) -> std::task::Poll<std::io::Result<usize>> {
                futures_io::AsyncWrite::poll_write(std::pin::Pin::new(&mut &*self), cx, buf)
            }

            fn poll_write_vectored(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                bufs: &[std::io::IoSlice<'_>],
            ) -> std::task::Poll<std::io::Result<usize>> {
                futures_io::AsyncWrite::poll_write_vectored(
                    std::pin::Pin::new(&mut &*self),
                    cx,
                    bufs,
                )
            }

            fn poll_flush(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                futures_io::AsyncWrite::poll_flush(std::pin::Pin::new(&mut &*self), cx)
            }

            fn poll_close(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                futures_io::AsyncWrite::poll_close(std::pin::Pin::new(&mut &*self), cx)
            }
        }
    };
}
pub(super) use stream_io;
