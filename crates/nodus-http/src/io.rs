//! hyper's `Read`/`Write` over nodus streams (HTTP/2, and a hyper client in tests).
//!
//! Reads go straight from the socket into hyper's uninitialized read buffer with `rustix::net::recv`
//! (which only hands back bytes the kernel wrote), so no buffer is zeroed or copied. Sockets are
//! read with `recv` and written with `send`/`sendmsg` (`MSG_NOSIGNAL`), which skip the file layer
//! `read`/`writev` go through; a stream that turns out not to be a socket (`ENOTSOCK`, once) is
//! read and written with `read`/`write`/`writev` from then on. Readiness comes from the nodus
//! reactor (edge-triggered: `EAGAIN` clears it) and every readiness check draws on the task's
//! cooperative budget. Each transfer updates the connection's last-activity time (for the
//! keep-alive idle timeout) and the loop's HTTP byte counters; a write that finds the socket full
//! marks the connection write-blocked, since when (for the write-stall timeout); a read of the
//! peer's EOF is noted. An HTTP/2 connection's first bytes, read by the HTTP/1 engine that told
//! them from an HTTP/1 head (`h1::conn`), are handed to hyper first (`HyperIo::with_prefix`).
//! Every read and write syscall here, the HTTP/1 engine's too, is followed by
//! `nodus::io::after_syscall` (the return-stack refill, where it pays).

use std::cell::Cell;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes};
use hyper::rt::{Read, ReadBufCursor, Write};
use rustix::io::Errno;
use rustix::net::{RecvFlags, SendFlags};

use crate::stats;

/// The time (`nodus::clock` ns) connections count their timeouts from: the loop's, which costs
/// no clock read (seconds-long timeouts need no better than the start of the current poll). The
/// public timers count from a fresh read instead (`nodus::time`); doing so here costs ~45
/// instructions per keep-alive request (BENCHMARKS.md, session 17) and gains nothing.
pub(crate) fn now_ns() -> u64 {
    nodus::time::loop_now_ns()
}

/// A nodus stream hyper can drive: its fd and the loop's readiness for it.
pub trait FdStream {
    fn fd(&self) -> BorrowedFd<'_>;
    fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>>;
    fn clear_read_ready(&self);
    fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>>;
    fn clear_write_ready(&self);
}

impl<T: AsFd> FdStream for nodus::io::AsyncFd<T> {
    fn fd(&self) -> BorrowedFd<'_> {
        self.get_ref().as_fd()
    }
    fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        nodus::io::AsyncFd::poll_read_ready(self, cx)
    }
    fn clear_read_ready(&self) {
        nodus::io::AsyncFd::clear_read_ready(self)
    }
    fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        nodus::io::AsyncFd::poll_write_ready(self, cx)
    }
    fn clear_write_ready(&self) {
        nodus::io::AsyncFd::clear_write_ready(self)
    }
}

/// The nodus stream types forward to their own readiness methods.
macro_rules! fd_stream {
    ($($t:ty),*) => {$(
        impl FdStream for $t {
            fn fd(&self) -> BorrowedFd<'_> {
                self.as_fd()
            }
            fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                <$t>::poll_read_ready(self, cx)
            }
            fn clear_read_ready(&self) {
                <$t>::clear_read_ready(self)
            }
            fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                <$t>::poll_write_ready(self, cx)
            }
            fn clear_write_ready(&self) {
                <$t>::clear_write_ready(self)
            }
        }
    )*};
}
fd_stream!(nodus::net::TcpStream, nodus::net::UnixStream);

/// A cluster worker's connection is a `TcpStream` that counts itself for the `least` policy.
impl FdStream for nodus::cluster::Stream {
    fn fd(&self) -> BorrowedFd<'_> {
        (**self).fd()
    }
    fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        (**self).poll_read_ready(cx)
    }
    fn clear_read_ready(&self) {
        (**self).clear_read_ready()
    }
    fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        (**self).poll_write_ready(cx)
    }
    fn clear_write_ready(&self) {
        (**self).clear_write_ready()
    }
}

/// A stream adapted for hyper.
pub struct HyperIo<S> {
    stream: S,
    activity: Rc<Activity>,
    /// The fd refused a socket call (`ENOTSOCK`): use file calls.
    not_socket: Cell<bool>,
    /// Bytes read before hyper took the stream, read first.
    prefix: Option<Bytes>,
}

/// What a connection's task sees of its transfers.
pub struct Activity {
    /// Loop time (ns) of the last successful read or write.
    pub last_io: Cell<u64>,
    /// The last write waits for the socket to drain: hyper holds output the peer has not taken.
    pub write_blocked: Cell<bool>,
    /// Loop time (ns) the current `write_blocked` began: set when a write first finds the socket
    /// full after one that made progress, so a write that succeeds costs nothing more.
    pub blocked_since: Cell<u64>,
    /// A read found the peer's EOF: it sends nothing more.
    pub eof: Cell<bool>,
    /// The connection began with the HTTP/2 preface (only looked for with `Config::http2`).
    pub h2: Cell<bool>,
    /// While its first bytes may still be the HTTP/2 preface (with `Config::http2`): the loop
    /// time (ns) they must be decided by; `u64::MAX` once they are, or without h2c.
    pub sniff_by: Cell<u64>,
    /// The write side was shut down (hyper does so when it ends a connection itself).
    pub write_shut: Cell<bool>,
}

impl Activity {
    /// A new connection's: last I/O now, nothing else seen.
    pub(crate) fn new() -> Activity {
        Activity {
            last_io: Cell::new(now_ns()),
            write_blocked: Cell::new(false),
            blocked_since: Cell::new(0),
            eof: Cell::new(false),
            h2: Cell::new(false),
            sniff_by: Cell::new(u64::MAX),
            write_shut: Cell::new(false),
        }
    }
}

impl<S: FdStream> HyperIo<S> {
    pub fn new(stream: S) -> HyperIo<S> {
        HyperIo::with_prefix(stream, Rc::new(Activity::new()), Bytes::new())
    }

    /// The stream, whose transfers so far `activity` saw, with `prefix` read from it already.
    pub(crate) fn with_prefix(stream: S, activity: Rc<Activity>, prefix: Bytes) -> HyperIo<S> {
        HyperIo {
            stream,
            activity,
            not_socket: Cell::new(false),
            prefix: (!prefix.is_empty()).then_some(prefix),
        }
    }

    /// Shared view of the connection's transfers.
    pub fn activity(&self) -> Rc<Activity> {
        self.activity.clone()
    }

    pub fn get_ref(&self) -> &S {
        &self.stream
    }
}

impl<S: FdStream + Unpin> Read for HyperIo<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        if let Some(prefix) = self.prefix.as_mut() {
            let n = prefix.len().min(buf.remaining());
            buf.put_slice(&prefix[..n]);
            prefix.advance(n);
            if prefix.is_empty() {
                self.prefix = None;
            }
            return Poll::Ready(Ok(()));
        }
        // SAFETY: `poll_read_into` only writes into the slice and returns how many bytes of its
        // start it initialized; we advance the cursor by exactly that many.
        let unfilled = unsafe { buf.as_mut() };
        let n = ready!(poll_read_into(
            &self.stream,
            &self.activity,
            &self.not_socket,
            cx,
            unfilled
        ))?;
        // SAFETY: the first `n` bytes of the cursor were just initialized.
        unsafe { buf.advance(n) };
        Poll::Ready(Ok(()))
    }
}

impl<S: FdStream + Unpin> Write for HyperIo<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.write_with(cx, |fd, socket| {
            if socket {
                rustix::net::send(fd, buf, SendFlags::NOSIGNAL)
            } else {
                rustix::io::write(fd, buf)
            }
        })
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.write_with(cx, |fd, socket| {
            if socket {
                rustix::net::sendmsg(fd, bufs, &mut Default::default(), SendFlags::NOSIGNAL)
            } else {
                rustix::io::writev(fd, bufs)
            }
        })
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match rustix::net::shutdown(self.stream.fd(), rustix::net::Shutdown::Write) {
            Ok(()) | Err(Errno::NOTCONN) => {
                self.activity.write_shut.set(true);
                Poll::Ready(Ok(()))
            }
            Err(e) => Poll::Ready(Err(e.into())),
        }
    }
}

impl<S: FdStream> HyperIo<S> {
    fn write_with(
        &self,
        cx: &mut Context<'_>,
        op: impl FnMut(BorrowedFd<'_>, bool) -> rustix::io::Result<usize>,
    ) -> Poll<io::Result<usize>> {
        poll_write_with(&self.stream, &self.activity, &self.not_socket, cx, op)
    }
}

/// One read of `stream` into `spare`, waiting for read readiness: `recv` (or `read`, once the
/// fd refused a socket call: `not_socket`); the bytes read, 0 at the peer's EOF. The EOF, the
/// time and the byte count go to `activity` and the loop's counters; a short read forgets the
/// read readiness (the socket buffer is drained: later data raises a new edge, and an EOF
/// already seen stays visible), so no read that returns `EAGAIN` is paid for.
pub(crate) fn poll_read_into<S: FdStream>(
    stream: &S,
    activity: &Activity,
    not_socket: &Cell<bool>,
    cx: &mut Context<'_>,
    spare: &mut [MaybeUninit<u8>],
) -> Poll<io::Result<usize>> {
    loop {
        ready!(stream.poll_read_ready(cx))?;
        let capacity = spare.len();
        let fd = stream.fd();
        let result = if not_socket.get() {
            rustix::io::read(fd, &mut *spare).map(|(filled, _)| filled.len())
        } else {
            rustix::net::recv(fd, &mut *spare, RecvFlags::empty())
                .map(|((filled, _), _)| filled.len())
        };
        nodus::io::after_syscall();
        match result {
            Ok(n) => {
                if n == 0 {
                    activity.eof.set(true);
                } else if n < capacity {
                    stream.clear_read_ready();
                }
                activity.last_io.set(now_ns());
                stats::received(n);
                return Poll::Ready(Ok(n));
            }
            Err(Errno::NOTSOCK) => not_socket.set(true),
            Err(Errno::AGAIN) => stream.clear_read_ready(),
            Err(Errno::INTR) => {}
            Err(e) => return Poll::Ready(Err(e.into())),
        }
    }
}

/// One write to `stream` by `op` (given the fd and whether it is a socket), waiting for write
/// readiness: the bytes written. A write that finds the socket full marks `activity` write
/// blocked, since when (the first such write after one that made progress); one that writes
/// clears it and counts the bytes.
pub(crate) fn poll_write_with<S: FdStream>(
    stream: &S,
    activity: &Activity,
    not_socket: &Cell<bool>,
    cx: &mut Context<'_>,
    mut op: impl FnMut(BorrowedFd<'_>, bool) -> rustix::io::Result<usize>,
) -> Poll<io::Result<usize>> {
    loop {
        let Poll::Ready(ready) = stream.poll_write_ready(cx) else {
            if !activity.write_blocked.replace(true) {
                activity.blocked_since.set(now_ns());
            }
            return Poll::Pending;
        };
        ready?;
        let result = op(stream.fd(), !not_socket.get());
        nodus::io::after_syscall();
        match result {
            Ok(n) => {
                activity.last_io.set(now_ns());
                activity.write_blocked.set(false);
                stats::sent(n);
                return Poll::Ready(Ok(n));
            }
            Err(Errno::AGAIN) => stream.clear_write_ready(),
            Err(Errno::NOTSOCK) => not_socket.set(true),
            Err(Errno::INTR) => {}
            Err(e) => return Poll::Ready(Err(e.into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::future::poll_fn;
    use std::mem::MaybeUninit;

    use nodus::io::AsyncFd;

    use super::*;

    #[test]
    fn a_stream_that_is_not_a_socket_is_read_and_written_with_file_calls() {
        nodus::Runtime::new().block_on(async {
            let (reader, writer) = std::io::pipe().unwrap();
            let mut writer = HyperIo::new(AsyncFd::new(writer).unwrap());
            let mut reader = HyperIo::new(AsyncFd::new(reader).unwrap());
            let bufs = [io::IoSlice::new(b"hello, "), io::IoSlice::new(b"pipe")];
            let n = poll_fn(|cx| Pin::new(&mut writer).poll_write_vectored(cx, &bufs)).await;
            assert_eq!(n.unwrap(), 11);
            let n = poll_fn(|cx| Pin::new(&mut writer).poll_write(cx, b"!")).await;
            assert_eq!(n.unwrap(), 1);
            assert!(writer.not_socket.get());
            let mut storage = [MaybeUninit::<u8>::uninit(); 64];
            let mut buf = hyper::rt::ReadBuf::uninit(&mut storage);
            poll_fn(|cx| Pin::new(&mut reader).poll_read(cx, buf.unfilled()))
                .await
                .unwrap();
            assert_eq!(buf.filled(), b"hello, pipe!");
            assert!(reader.not_socket.get());
        });
    }
}
