//! hyper's `Read`/`Write` over nodus streams.
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
//! peer's EOF is noted (a connection that saw it has no input to linger for). While hyper
//! waits for a request head, a read that makes its request line reach the line limit (set by
//! the server: its head limit) hands hyper one byte of its bytes and every later read fails with
//! `UriTooLong`, so that the server answers 414 where hyper would answer 431 (see `head_wait`):
//! hyper takes a read error with an empty buffer for the peer's close, and would answer nothing.
//! With h2c on (`sniff_h2`), the connection's first bytes are compared with the HTTP/2 preface as
//! they are read (the comparison hyper-util's own sniff makes): a connection whose first 24 bytes
//! are the preface is marked HTTP/2 (`Activity::h2`) by the read that completes it, before any
//! request, so that a drain can send it GOAWAY; the first byte that differs, or the peer's EOF,
//! ends the comparison. Until it ends, `Activity::sniff_by` says when the connection must have
//! decided (the header-read timeout from its start: a preface trickled a byte at a time is cut
//! then, as an HTTP/1 head is), and the first head wait after an HTTP/1 decision is cut at that
//! time too (`head_wait::carry`), not a whole timeout after it began.
//! Their scan (`head_scan`: the request line, and the framing facts) is carried into hyper's
//! first head wait (`head_wait::carry`): they were read before it began, and the 414 and the
//! framing refusals count them. A chunked request body is followed from the read that ends its
//! head to its last line (`chunked_scan`): a read that brings a line feed without its CR in its
//! framing hands hyper only the bytes before it, and every later read fails with
//! `BareLineFeed`, as a read past the line limit does with `UriTooLong`.

use std::cell::Cell;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, ready};

use hyper::rt::{Read, ReadBufCursor, Write};
use rustix::io::Errno;
use rustix::net::{RecvFlags, SendFlags};

use crate::chunked_scan::{Chunked, Step};
use crate::head_scan::Scan;
use crate::head_wait::{self, LineRead};
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
    /// A request line this long (line feed excluded) ends the read with [`UriTooLong`].
    line_limit: usize,
    /// A read found what the connection refuses to read on from: every read from then on fails
    /// with it.
    refused: Cell<Option<ReadRefused>>,
    /// The chunked request body being read, followed for what hyper's decoder lets through
    /// (`chunked_scan`); `None` between bodies.
    chunked: Cell<Option<Chunked>>,
    /// Bytes of the HTTP/2 preface the connection's first bytes matched so far; `NOT_SNIFFING`
    /// once one differed, all matched, or without h2c.
    preface: Cell<usize>,
    /// The scan of the bytes read while sniffing (an HTTP/1 head's first bytes), read before
    /// hyper's head wait began: carried into it (`head_wait::carry`) by the first read in it, or
    /// forgotten at the first write (a head the sniffed bytes held whole was answered).
    ahead: Cell<Option<Scan>>,
    /// When the first HTTP/1 head of an h2c connection must be complete (`sniff_h2`): the
    /// deadline `carry` caps its wait's with.
    head_by: u64,
}

/// The HTTP/2 client connection preface (RFC 9113 section 3.4).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const NOT_SNIFFING: usize = usize::MAX;

/// What a connection's reads refuse to read on from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReadRefused {
    /// A request line reached the line limit.
    LineTooLong,
    /// A chunked body's size line or trailer section has a line feed without its CR.
    BareLineFeed,
}

impl ReadRefused {
    fn error(self) -> io::Error {
        match self {
            ReadRefused::LineTooLong => io::Error::other(UriTooLong),
            ReadRefused::BareLineFeed => io::Error::new(io::ErrorKind::InvalidData, BareLineFeed),
        }
    }
}

/// The error of a read that made a request line too long: the server answers it with 414.
#[derive(Debug)]
pub(crate) struct UriTooLong;

/// The error of a read that found a line feed without its CR in a chunked body's framing, where
/// hyper would read on (`chunked_scan`): the body's read fails, and the connection closes.
#[derive(Debug)]
pub(crate) struct BareLineFeed;

impl std::fmt::Display for BareLineFeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a line feed without its CR in a chunked body's framing")
    }
}

impl std::error::Error for BareLineFeed {}

impl std::fmt::Display for UriTooLong {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("request line over the head limit")
    }
}

impl std::error::Error for UriTooLong {}

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
    /// The connection began with the HTTP/2 preface (only looked for with `sniff_h2`).
    pub h2: Cell<bool>,
    /// While its first bytes may still be the HTTP/2 preface (`sniff_h2`): the loop time (ns)
    /// they must be decided by; `u64::MAX` once they are, or without h2c.
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
        HyperIo {
            stream,
            activity: Rc::new(Activity::new()),
            not_socket: Cell::new(false),
            line_limit: usize::MAX,
            refused: Cell::new(None),
            chunked: Cell::new(None),
            preface: Cell::new(NOT_SNIFFING),
            ahead: Cell::new(None),
            head_by: u64::MAX,
        }
    }

    /// Marks the connection HTTP/2 (`Activity::h2`) if its first bytes are the HTTP/2 preface;
    /// they must be decided, and an HTTP/1 head they begin complete, by `by` (loop time, ns).
    pub(crate) fn sniff_h2(&mut self, by: u64) {
        self.preface.set(0);
        self.activity.sniff_by.set(by);
        self.head_by = by;
    }

    /// What a read while sniffing, or the first read after it, does with its bytes (only h2c
    /// connections' first reads: kept out of the common read path). Those reads hold 24 bytes
    /// at most (hyper-util's sniff), never the whole of a head with `Transfer-Encoding`: a
    /// chunked body's scan begins in a head wait's read (`head_wait::line_read`).
    #[cold]
    fn sniffed(&self, filled: &[u8]) {
        if self.preface.get() != NOT_SNIFFING {
            self.sniff(filled);
            self.read_ahead(filled);
        } else if let Some(ahead) = self.ahead.get()
            && head_wait::carry(ahead, self.head_by)
        {
            self.ahead.set(None);
        }
    }

    /// Follows the head through bytes read while sniffing (before any head wait).
    #[cold]
    fn read_ahead(&self, read: &[u8]) {
        let mut scan = self.ahead.get().unwrap_or_default();
        scan.read(read);
        self.ahead.set(Some(scan));
    }

    /// Follows the chunked body being read through `filled`, just read (from `body_at`, where a
    /// head that ended in them left off, if one did); how many of them hyper may have: all, or
    /// those before a line feed without its CR in the body's framing (the connection's reads
    /// fail from then on).
    #[cold]
    fn follow_chunked(&self, filled: &[u8], body_at: Option<usize>) -> usize {
        let (mut scan, from) = match (body_at, self.chunked.take()) {
            (Some(at), _) => (Chunked::new(), at),
            (None, Some(scan)) => (scan, 0),
            (None, None) => return filled.len(),
        };
        match scan.follow(&filled[from..]) {
            Step::More => self.chunked.set(Some(scan)),
            // The next request's head, if read with the body, is read on as hyper reads it.
            Step::Ended(_) | Step::HyperRefuses => {}
            Step::BareLineFeed(at) => {
                self.refused.set(Some(ReadRefused::BareLineFeed));
                return from + at;
            }
        }
        filled.len()
    }

    /// Compares the bytes just read with the rest of the preface, while they may still be it
    /// (an EOF, as to hyper-util, decides for HTTP/1).
    fn sniff(&self, read: &[u8]) {
        let matched = self.preface.get();
        let Some(rest) = H2_PREFACE.get(matched..) else {
            return;
        };
        let n = read.len().min(rest.len());
        if read.is_empty() || read[..n] != rest[..n] {
            self.preface.set(NOT_SNIFFING);
            self.activity.sniff_by.set(u64::MAX);
        } else if matched + n == H2_PREFACE.len() {
            self.preface.set(NOT_SNIFFING);
            self.activity.sniff_by.set(u64::MAX);
            self.activity.h2.set(true);
        } else {
            self.preface.set(matched + n);
        }
    }

    /// Ends a read that makes a request line `limit` bytes long or more with [`UriTooLong`].
    pub(crate) fn limit_request_line(&mut self, limit: usize) {
        self.line_limit = limit;
    }

    /// Shared view of the connection's transfers.
    pub fn activity(&self) -> Rc<Activity> {
        self.activity.clone()
    }

    pub fn get_ref(&self) -> &S {
        &self.stream
    }

    fn touched(&self) {
        self.activity.last_io.set(now_ns());
    }
}

impl<S: FdStream + Unpin> Read for HyperIo<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        if let Some(refused) = self.refused.get() {
            return Poll::Ready(Err(refused.error()));
        }
        loop {
            ready!(self.stream.poll_read_ready(cx))?;
            let capacity = buf.remaining();
            // SAFETY: `recv` and `read` only write into the slice and return the prefix they
            // initialized; we advance the cursor by exactly that many bytes.
            let unfilled = unsafe { buf.as_mut() };
            let fd = self.stream.fd();
            // Each read's bytes are shown to the head's and the chunked body's scans while they
            // are at hand; what they let hyper have of them: all, or those before a bare line
            // feed in a chunked body's framing.
            let limit = self.line_limit;
            let seen = |filled: &[u8]| {
                if self.preface.get() != NOT_SNIFFING || self.ahead.get().is_some() {
                    self.sniffed(filled);
                }
                let LineRead {
                    too_long,
                    chunked_body_at,
                } = head_wait::line_read(filled, limit);
                let passed = if chunked_body_at.is_some() || self.chunked.get().is_some() {
                    self.follow_chunked(filled, chunked_body_at)
                } else {
                    filled.len()
                };
                (filled.len(), too_long, passed)
            };
            let result = if self.not_socket.get() {
                rustix::io::read(fd, unfilled).map(|(filled, _)| seen(filled))
            } else {
                rustix::net::recv(fd, unfilled, RecvFlags::empty())
                    .map(|((filled, _), _)| seen(filled))
            };
            match result {
                Ok((n, too_long, passed)) => {
                    // The peer's EOF is noted. A short read of a stream drained the socket
                    // buffer: forget readiness now instead of paying a read that returns EAGAIN
                    // (later data raises a new edge; an EOF already seen stays visible).
                    if n == 0 {
                        self.activity.eof.set(true);
                    } else if n < capacity {
                        self.stream.clear_read_ready();
                    }
                    self.touched();
                    stats::received(n);
                    if too_long && n > 0 {
                        // hyper takes a read error with nothing in its buffer for the peer's
                        // close (no answer at all), so it gets one byte of this read, an
                        // incomplete head, and the error at its next read.
                        self.refused.set(Some(ReadRefused::LineTooLong));
                        // SAFETY: the read initialized the first `n` ≥ 1 bytes of the cursor.
                        unsafe { buf.advance(1) };
                        return Poll::Ready(Ok(()));
                    }
                    if passed < n {
                        // A bare line feed in a chunked body's framing (`follow_chunked` noted
                        // it): hyper gets the bytes before it (the head, if it ended in this
                        // read), and the error at its next read; none: the error now.
                        if passed == 0 {
                            return Poll::Ready(Err(ReadRefused::BareLineFeed.error()));
                        }
                        // SAFETY: the read initialized the first `n` > `passed` bytes.
                        unsafe { buf.advance(passed) };
                        return Poll::Ready(Ok(()));
                    }
                    // SAFETY: the first `n` bytes of the cursor were just initialized.
                    unsafe { buf.advance(n) };
                    return Poll::Ready(Ok(()));
                }
                Err(Errno::NOTSOCK) => self.not_socket.set(true),
                Err(Errno::AGAIN) => self.stream.clear_read_ready(),
                Err(Errno::INTR) => {}
                Err(e) => return Poll::Ready(Err(e.into())),
            }
        }
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
        mut op: impl FnMut(BorrowedFd<'_>, bool) -> rustix::io::Result<usize>,
    ) -> Poll<io::Result<usize>> {
        loop {
            let Poll::Ready(ready) = self.stream.poll_write_ready(cx) else {
                if !self.activity.write_blocked.replace(true) {
                    self.activity.blocked_since.set(now_ns());
                }
                return Poll::Pending;
            };
            ready?;
            match op(self.stream.fd(), !self.not_socket.get()) {
                Ok(n) => {
                    self.touched();
                    self.activity.write_blocked.set(false);
                    // A response: the head the sniffed bytes began was read from them alone.
                    self.ahead.set(None);
                    stats::sent(n);
                    return Poll::Ready(Ok(n));
                }
                Err(Errno::AGAIN) => self.stream.clear_write_ready(),
                Err(Errno::NOTSOCK) => self.not_socket.set(true),
                Err(Errno::INTR) => {}
                Err(e) => return Poll::Ready(Err(e.into())),
            }
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
