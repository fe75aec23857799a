//! An HTTP/1 connection's socket: its read buffer, the request body being read from it, and its
//! queue of output.
//!
//! Invariants:
//! - One `Wire` per connection, shared (`Rc`) by the connection's engine (`h1::conn`) and the
//!   request body its handler reads ([`WireBody`]): both run in the connection's task, one at a
//!   time, so the `RefCell`s are never borrowed across an await.
//! - Reads go straight from the socket into the buffer's spare capacity (`recv`, no zeroing);
//!   a short read forgets the socket's read readiness (epoll is edge-triggered: later data
//!   raises a new edge), so a keep-alive request costs one `recv`, not a second one that ends
//!   in `EAGAIN`. The peer's EOF is noted in `Activity::eof`.
//! - The buffer holds the bytes of one request at a time: a head, then its body (`body`), then
//!   the next head. Nothing reads a next head while `body` is not over.
//! - Output is a queue of segments: bytes the engine wrote (heads, chunk framing) and the
//!   response's body chunks as the handler made them, advanced by what each write took, so a
//!   body chunk's `Meter` counts the bytes the socket took. Segments are written together with
//!   `sendmsg` (no copy of a body chunk), except that output of at most `FLATTEN_MAX` bytes is
//!   copied into one buffer and written with `send` (a typical small response: its head and
//!   body in one `send`, which costs the kernel less than `sendmsg`). A write that finds the
//!   socket full marks the connection write blocked, since when (`Activity`), for the
//!   write-stall timeout.
//! - A stream that turns out not to be a socket (`ENOTSOCK`, once) is read and written with
//!   `read`/`writev` from then on.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::os::fd::BorrowedFd;
use std::rc::Rc;
use std::task::{Context, Poll, Waker, ready};

use bytes::{Buf, Bytes, BytesMut};
use rustix::net::SendFlags;

use super::chunked::{ChunkedDecoder, ChunkedError, Decoded};
use crate::io::{Activity, FdStream, poll_read_into, poll_write_with};
use crate::server::SentChunk;

/// A read is made with at least this much room in the buffer.
const MIN_READ: usize = 2048;
/// The buffer grows by this much when it has less room than `MIN_READ`.
const READ_CHUNK: usize = 8192;
/// At most this many segments go to one `sendmsg`, and are queued at once (hyper's
/// `MAX_BUF_LIST_BUFFERS`): a body of many small chunks is written 16 segments at a time, and
/// what is queued is never walked past them.
pub(crate) const MAX_IOVECS: usize = 16;
/// Output of several segments and at most this many bytes is copied into one buffer and written
/// with `send`: cheaper in the kernel than `sendmsg`'s copy of the message header and iovecs.
const FLATTEN_MAX: usize = 1024;

thread_local! {
    /// Where output of at most `FLATTEN_MAX` bytes is copied for its `send` (one per loop).
    static FLAT: RefCell<Vec<u8>> = RefCell::new(Vec::with_capacity(FLATTEN_MAX));
}

/// Where the request body being read is.
pub(crate) enum BodyRead {
    /// No body, or it was read to its end.
    Over,
    /// Bytes of a `Content-Length` body still to come.
    Length(u64),
    Chunked(ChunkedDecoder),
    /// Let go of before its end (not discarded, or the discard was given up), or failed: the
    /// connection reads no further request.
    Abandoned,
}

/// One piece of output.
enum Segment {
    /// Bytes of `Wire::out` from `start` to `end`.
    Own { start: usize, end: usize },
    /// A response body chunk.
    Data(SentChunk),
}

impl Segment {
    /// Its bytes; `out`: the `Wire`'s own bytes.
    fn bytes<'a>(&'a self, out: &'a [u8]) -> &'a [u8] {
        match self {
            Segment::Own { start, end } => &out[*start..*end],
            Segment::Data(c) => c.chunk(),
        }
    }
}

/// An HTTP/1 connection's socket and buffers.
pub(crate) struct Wire<S> {
    stream: S,
    pub(crate) activity: Rc<Activity>,
    not_socket: Cell<bool>,
    pub(crate) buf: RefCell<BytesMut>,
    pub(crate) body: RefCell<BodyRead>,
    /// `100 Continue` is owed before the body's first read (`Expect: 100-continue`).
    pub(crate) continue_owed: Cell<bool>,
    /// The number of the request whose body `body` is: a body kept past its request (a
    /// handler's task holding it) reads as ended, never the next request's.
    pub(crate) request: Cell<u64>,
    /// Bytes the engine wrote, referred to by `Segment::Own`; cleared when the queue empties.
    out: RefCell<Vec<u8>>,
    queue: RefCell<VecDeque<Segment>>,
    /// The bytes `queue` holds, kept as it changes.
    queued: Cell<usize>,
    /// The connection's task, waiting for a request body read elsewhere (a handler's own task)
    /// to be over or given up: woken when it is.
    body_waiter: Cell<Option<Waker>>,
}

impl<S: FdStream> Wire<S> {
    pub(crate) fn new(stream: S) -> Wire<S> {
        Wire {
            stream,
            activity: Rc::new(Activity::new()),
            not_socket: Cell::new(false),
            buf: RefCell::new(BytesMut::with_capacity(READ_CHUNK)),
            body: RefCell::new(BodyRead::Over),
            continue_owed: Cell::new(false),
            request: Cell::new(0),
            out: RefCell::new(Vec::with_capacity(256)),
            queue: RefCell::new(VecDeque::with_capacity(4)),
            queued: Cell::new(0),
            body_waiter: Cell::new(None),
        }
    }

    /// The stream, what the connection saw of it, and what was read of it and not taken.
    pub(crate) fn into_parts(self) -> (S, Rc<Activity>, BytesMut) {
        (self.stream, self.activity, self.buf.into_inner())
    }

    /// Reads what the socket holds into the buffer: `Ok(0)` at the peer's EOF.
    pub(crate) fn poll_fill(&self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        let mut buf = self.buf.borrow_mut();
        if buf.capacity() - buf.len() < MIN_READ {
            buf.reserve(READ_CHUNK);
        }
        let filled = buf.len();
        let spare = buf.spare_capacity_mut();
        let n = ready!(poll_read_into(
            &self.stream,
            &self.activity,
            &self.not_socket,
            cx,
            spare
        ))?;
        // SAFETY: the read initialized the first `n` bytes of the spare capacity.
        unsafe { buf.set_len(filled + n) };
        Poll::Ready(Ok(n))
    }

    /// Appends bytes to the output queue.
    pub(crate) fn push_own(&self, write: impl FnOnce(&mut Vec<u8>)) {
        let mut out = self.out.borrow_mut();
        let start = out.len();
        write(&mut out);
        let end = out.len();
        self.queued.set(self.queued.get() + (end - start));
        if end > start {
            let mut queue = self.queue.borrow_mut();
            // Own bytes right after own bytes extend the same segment.
            if let Some(Segment::Own { end: last, .. }) = queue.back_mut()
                && *last == start
            {
                *last = end;
            } else {
                queue.push_back(Segment::Own { start, end });
            }
        }
    }

    pub(crate) fn push_chunk(&self, chunk: SentChunk) {
        if chunk.remaining() > 0 {
            self.queued.set(self.queued.get() + chunk.remaining());
            self.queue.borrow_mut().push_back(Segment::Data(chunk));
        }
    }

    /// Bytes queued and not yet written.
    pub(crate) fn queued(&self) -> usize {
        self.queued.get()
    }

    /// Segments queued and not yet written.
    pub(crate) fn segments(&self) -> usize {
        self.queue.borrow().len()
    }

    /// Writes the queue until it is empty (`Ready(Ok)`), the socket is full (`Pending`, write
    /// blocked), or a write fails.
    pub(crate) fn poll_flush(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            let n = {
                let queue = self.queue.borrow();
                if queue.is_empty() {
                    self.out.borrow_mut().clear();
                    return Poll::Ready(Ok(()));
                }
                let out = self.out.borrow();
                let segments = queue.iter().take(MAX_IOVECS);
                let written = if queue.len() > 1 && self.queued.get() <= FLATTEN_MAX {
                    FLAT.with_borrow_mut(|flat| {
                        flat.clear();
                        for segment in segments {
                            flat.extend_from_slice(segment.bytes(&out));
                        }
                        self.poll_write(cx, &[IoSlice::new(flat)])
                    })
                } else {
                    let mut slices: [IoSlice<'_>; MAX_IOVECS] = [IoSlice::new(&[]); MAX_IOVECS];
                    let mut count = 0;
                    for segment in segments {
                        slices[count] = IoSlice::new(segment.bytes(&out));
                        count += 1;
                    }
                    self.poll_write(cx, &slices[..count])
                };
                ready!(written)?
            };
            self.advance(n);
        }
    }

    /// Advances the queue by `n` bytes the socket took.
    fn advance(&self, mut n: usize) {
        self.queued.set(self.queued.get() - n);
        let mut queue = self.queue.borrow_mut();
        while n > 0 {
            let Some(front) = queue.front_mut() else {
                return;
            };
            let (left, taken) = match front {
                Segment::Own { start, end } => {
                    let k = n.min(*end - *start);
                    *start += k;
                    (*end - *start, k)
                }
                Segment::Data(c) => {
                    let k = n.min(c.remaining());
                    c.advance(k);
                    (c.remaining(), k)
                }
            };
            n -= taken;
            if left == 0 {
                queue.pop_front();
            }
        }
    }

    fn poll_write(&self, cx: &mut Context<'_>, slices: &[IoSlice<'_>]) -> Poll<io::Result<usize>> {
        let op = |fd: BorrowedFd<'_>, socket: bool| {
            if socket && slices.len() == 1 {
                rustix::net::send(fd, &slices[0], SendFlags::NOSIGNAL)
            } else if socket {
                rustix::net::sendmsg(fd, slices, &mut Default::default(), SendFlags::NOSIGNAL)
            } else {
                rustix::io::writev(fd, slices)
            }
        };
        poll_write_with(&self.stream, &self.activity, &self.not_socket, cx, op)
    }

    /// Drops whatever output is queued (a connection cut).
    pub(crate) fn clear_output(&self) {
        self.queue.borrow_mut().clear();
        self.out.borrow_mut().clear();
        self.queued.set(0);
    }

    /// Wakes the connection's task when the request body, read elsewhere, is over or given up.
    pub(crate) fn wait_for_body(&self, waker: &Waker) {
        self.body_waiter.set(Some(waker.clone()));
    }

    /// The request body is over or given up: the connection's task may read the next head.
    fn body_settled(&self) {
        if let Some(waker) = self.body_waiter.take() {
            waker.wake();
        }
    }

    /// Whether the request body was let go of before its end, or failed.
    pub(crate) fn body_abandoned(&self) -> bool {
        matches!(*self.body.borrow(), BodyRead::Abandoned)
    }

    /// The next piece of the request body: `None` at its end.
    pub(crate) fn poll_body(
        &self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, BodyReadError>>> {
        let piece = self.read_body(cx);
        if piece.is_ready()
            && !matches!(
                *self.body.borrow(),
                BodyRead::Length(_) | BodyRead::Chunked(_)
            )
        {
            self.body_settled();
        }
        piece
    }

    fn read_body(&self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, BodyReadError>>> {
        if self.continue_owed.take() {
            self.push_own(|out| out.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n"));
        }
        loop {
            // A `100 Continue` (or a response head the handler's drop left queued) goes out
            // before the body is waited for.
            if let Poll::Ready(Err(e)) = self.poll_flush(cx) {
                *self.body.borrow_mut() = BodyRead::Abandoned;
                return Poll::Ready(Some(Err(BodyReadError::Io(e))));
            }
            let piece = {
                let mut body = self.body.borrow_mut();
                let mut buf = self.buf.borrow_mut();
                match &mut *body {
                    BodyRead::Over => return Poll::Ready(None),
                    BodyRead::Abandoned => {
                        return Poll::Ready(Some(Err(BodyReadError::Abandoned)));
                    }
                    BodyRead::Length(left) => {
                        if buf.is_empty() {
                            None
                        } else {
                            let n = (*left).min(buf.len() as u64) as usize;
                            *left -= n as u64;
                            if *left == 0 {
                                *body = BodyRead::Over;
                            }
                            Some(Ok(buf.split_to(n).freeze()))
                        }
                    }
                    BodyRead::Chunked(decoder) => match decoder.decode(&mut buf, usize::MAX) {
                        Ok(Decoded::Data(data)) => {
                            // The framing after it was read too: its end may be known now.
                            if decoder.is_done() {
                                *body = BodyRead::Over;
                            }
                            Some(Ok(data))
                        }
                        Ok(Decoded::End) => {
                            *body = BodyRead::Over;
                            return Poll::Ready(None);
                        }
                        Ok(Decoded::NeedMore) => None,
                        Err(e) => {
                            *body = BodyRead::Abandoned;
                            Some(Err(BodyReadError::Chunked(e)))
                        }
                    },
                }
            };
            if let Some(piece) = piece {
                return Poll::Ready(Some(piece));
            }
            match ready!(self.poll_fill(cx)) {
                Ok(0) => {
                    *self.body.borrow_mut() = BodyRead::Abandoned;
                    return Poll::Ready(Some(Err(BodyReadError::Eof)));
                }
                Ok(_) => {}
                Err(e) => {
                    *self.body.borrow_mut() = BodyRead::Abandoned;
                    return Poll::Ready(Some(Err(BodyReadError::Io(e))));
                }
            }
        }
    }

    /// Whether the request body is over (read to its end, or there was none).
    pub(crate) fn body_over(&self) -> bool {
        matches!(*self.body.borrow(), BodyRead::Over)
    }
}

/// Why a request body could not be read.
#[derive(Debug)]
pub(crate) enum BodyReadError {
    /// The client closed the connection before the body's end.
    Eof,
    Io(io::Error),
    Chunked(ChunkedError),
    /// Read after it was let go of (or after an earlier error).
    Abandoned,
}

impl std::fmt::Display for BodyReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BodyReadError::Eof => f.write_str("the connection closed before the body's end"),
            BodyReadError::Io(e) => write!(f, "reading the body failed: {e}"),
            BodyReadError::Chunked(ChunkedError::BareLineFeed) => {
                f.write_str("a line feed without its CR in a chunked body's framing")
            }
            BodyReadError::Chunked(ChunkedError::Malformed) => {
                f.write_str("a malformed chunked body")
            }
            BodyReadError::Chunked(ChunkedError::FramingTrailer) => f.write_str(
                "a Content-Length or Transfer-Encoding field in a chunked body's trailer section",
            ),
            BodyReadError::Abandoned => f.write_str("the body was given up"),
        }
    }
}

impl std::error::Error for BodyReadError {}

/// A request body's view of its connection's [`Wire`], whatever the stream; `request`: the
/// number of the request the body is of (`Wire::request`): a body of an earlier one is over.
pub(crate) trait WireBody {
    fn poll_body(
        &self,
        cx: &mut Context<'_>,
        request: u64,
    ) -> Poll<Option<Result<Bytes, BodyReadError>>>;
    fn body_over(&self, request: u64) -> bool;
    /// The bytes of a `Content-Length` body still to come (0 once over), if that is what is
    /// being read.
    fn body_left(&self, request: u64) -> Option<u64>;
    /// The body was let go of before its end: the connection reads no further request.
    fn abandon_body(&self, request: u64);
}

impl<S: FdStream> WireBody for Wire<S> {
    fn poll_body(
        &self,
        cx: &mut Context<'_>,
        request: u64,
    ) -> Poll<Option<Result<Bytes, BodyReadError>>> {
        if request != self.request.get() {
            return Poll::Ready(None);
        }
        Wire::poll_body(self, cx)
    }
    fn body_over(&self, request: u64) -> bool {
        request != self.request.get() || Wire::body_over(self)
    }
    fn body_left(&self, request: u64) -> Option<u64> {
        if request != self.request.get() {
            return Some(0);
        }
        match *self.body.borrow() {
            BodyRead::Over => Some(0),
            BodyRead::Length(n) => Some(n),
            _ => None,
        }
    }
    fn abandon_body(&self, request: u64) {
        if request != self.request.get() {
            return;
        }
        let mut body = self.body.borrow_mut();
        if !matches!(*body, BodyRead::Over) {
            *body = BodyRead::Abandoned;
        }
        drop(body);
        self.body_settled();
    }
}
