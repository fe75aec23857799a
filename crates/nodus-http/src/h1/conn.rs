//! One HTTP/1 connection served by nodus's own engine: heads parsed from the connection's
//! buffer (`head`), one request at a time handed to the server's service, its response head
//! written (`encode`) with its body (`chunked` framing when its length is not known), then the
//! next request.
//!
//! Invariants:
//! - One request at a time, and the connection is not read while a request is in flight but by
//!   its handler's reads of its body (HTTP/1 half-close: a client that shuts its write side down
//!   after its request still gets the whole response; an EOF between requests ends the
//!   connection).
//! - The next head is parsed only once the request's body is over: read by the handler, or
//!   discarded by the connection's task (`ConnState::discard`). A body let go of and not
//!   discarded, or whose discard was given up, ends the connection after the response.
//! - A CONNECT's response ends the connection (its head does not keep it, `head`): no byte after
//!   a CONNECT's head is parsed, as a body or a request (nodus opens no tunnel).
//! - A head is waited for with the header-read deadline set in the connection's `HeadWait` from
//!   the moment the wait begins (the connection's start, or the end of the last response), as
//!   hyper's server does; the connection's timer marks it expired, and the wait then ends the
//!   connection with no answer.
//! - The response's body is pulled while less than `max_buf` bytes of output wait on the socket
//!   (a client that stops reading pins a chunk or two of it, not the whole body); its chunks are
//!   written as they are (`Wire`'s queue), never copied.
//! - A head that cannot be parsed is answered (400, 414, 431; Node's bare 400 to an HTTP/2
//!   preface) and the connection ends with it: counted and reported once (`head_refused`).

use std::future::Future;
use std::pin::Pin;
use std::rc::{Rc, Weak};
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes};
use http::header::{self, HeaderName};
use http::{Method, Request, Response, Version};
use hyper::body::Body as _;

use super::encode::{self, Framing};
use super::head::{self, BodyFraming, HeadError, Limits};
use super::wire::{BodyRead, BodyReadError, MAX_IOVECS, Wire, WireBody};
use crate::body::{Body, RequestBody};
use crate::io::{FdStream, now_ns};
use crate::server::{HeadFacts, Parsed, Respond, SentBody, Service};

/// Where a connection is in waiting for a request head: its header-read deadline, shared with
/// the connection's timer (`server::ConnTimer`), which marks it expired.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum HeadWait {
    /// No head is waited for.
    #[default]
    Idle,
    /// A head must be complete by this time (`nodus::clock` ns).
    Until(u64),
    /// The deadline passed: the wait ends the connection.
    Expired,
}

/// How a connection served by the engine ended.
pub(crate) enum H1End {
    /// After a response the connection was not to outlive (`Connection: close`, HTTP/1.0, a
    /// CONNECT, a body left unread), or at the client's EOF between requests.
    Done,
    /// A head that could not be parsed was answered.
    Refused,
    /// Without an answer owed: the header-read timeout, an incomplete head at the client's EOF,
    /// a failed write or read, a response body that failed or did not match its length.
    Failed,
    /// (h2c) The connection's first bytes are the HTTP/2 preface: it is HTTP/2's
    /// (`H1Conn::into_http2`).
    Http2,
}

/// A request body read from its connection's `Wire`. It does not keep the connection: one held
/// past its connection's end (by a handler's own task) fails its reads as cut short.
pub(crate) struct H1Body {
    wire: Weak<dyn WireBody>,
    /// The number of its request on the connection (`Wire::request`).
    request: u64,
}

impl hyper::body::Body for H1Body {
    type Data = Bytes;
    type Error = BodyReadError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, BodyReadError>>> {
        let Some(wire) = self.wire.upgrade() else {
            return Poll::Ready(Some(Err(BodyReadError::Eof)));
        };
        wire.poll_body(cx, self.request)
            .map(|piece| piece.map(|r| r.map(hyper::body::Frame::data)))
    }

    fn is_end_stream(&self) -> bool {
        self.wire
            .upgrade()
            .is_some_and(|wire| wire.body_over(self.request))
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        match self.wire.upgrade().and_then(|w| w.body_left(self.request)) {
            Some(n) => hyper::body::SizeHint::with_exact(n),
            None => hyper::body::SizeHint::default(),
        }
    }
}

impl Drop for H1Body {
    fn drop(&mut self) {
        // Let go of before its end: nothing reads the rest, so no next head follows it.
        if let Some(wire) = self.wire.upgrade() {
            wire.abandon_body(self.request);
        }
    }
}

/// Where a connection is.
enum Phase {
    /// Waiting for a request head (or for the last request's body to be over).
    Head,
    /// The handler is at work on the request (`H1Conn::respond`).
    Respond,
    /// Writing the response: its body, if one is sent, and how.
    Write {
        body: Option<SentBody>,
        framing: Framing,
        /// Body bytes still owed for `Framing::Length`.
        left: u64,
        keep_alive: bool,
        /// The trailer fields a chunked body may end with: those its `Trailer` header names,
        /// when the request said `TE: trailers` (hyper's rule); empty: none are sent.
        trailers: Vec<HeaderName>,
        /// The last chunk (with its trailers) is queued.
        ended: bool,
    },
    /// Writing a refusal of a head, then ending.
    Refuse,
}

/// One HTTP/1 connection.
pub(crate) struct H1Conn<S, H, F> {
    wire: Rc<Wire<S>>,
    service: Service<H, F>,
    /// Structurally pinned: polled in place, dropped in place.
    respond: Option<Respond<F>>,
    phase: Phase,
    limits: Limits,
    /// The header-read timeout (ns).
    header_read_timeout: u64,
    /// A head wait was armed for the head being waited for.
    head_armed: bool,
    /// The response body is pulled while less than this waits on the socket.
    max_buf: usize,
    /// The request in flight: its version, whether it is `HEAD` or `CONNECT`, whether it asked
    /// to keep the connection.
    version: Version,
    head_request: bool,
    connect_request: bool,
    keep_alive: bool,
    /// The request in flight said `TE: trailers`.
    te_trailers: bool,
    /// The last response's header map, cleared: the next request's headers fill it.
    cached_headers: Option<http::HeaderMap>,
    /// (h2c) The connection's first bytes may still be the HTTP/2 preface.
    sniffing: bool,
}

impl<S, H, F> H1Conn<S, H, F>
where
    S: FdStream + Unpin + 'static,
    H: Fn(Request<RequestBody>) -> F + 'static,
    F: Future<Output = Response<Body>> + 'static,
{
    pub(crate) fn new(
        wire: Rc<Wire<S>>,
        service: Service<H, F>,
        limits: Limits,
        header_read_timeout: u64,
        max_buf: usize,
        sniff_h2: bool,
    ) -> Self {
        H1Conn {
            wire,
            service,
            respond: None,
            phase: Phase::Head,
            limits,
            header_read_timeout,
            head_armed: false,
            max_buf,
            version: Version::HTTP_11,
            head_request: false,
            connect_request: false,
            keep_alive: true,
            te_trailers: false,
            cached_headers: None,
            sniffing: sniff_h2,
        }
    }

    /// An HTTP/2 connection's parts, once `poll` ended with `H1End::Http2`: its stream, what
    /// was seen of it, the bytes read of it (the preface and what followed), and the service.
    pub(crate) fn into_http2(self) -> (S, Rc<crate::io::Activity>, Bytes, Service<H, F>) {
        let wire = Rc::into_inner(self.wire).expect("no request holds the connection's wire");
        let (stream, activity, read) = wire.into_parts();
        (stream, activity, read.freeze(), self.service)
    }

    /// Serves the connection until it ends; `head` is its header-read wait, shared with its
    /// timer.
    pub(crate) fn poll(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        head: &mut HeadWait,
    ) -> Poll<H1End> {
        // SAFETY: only `respond` is structurally pinned; it is polled in place and dropped in
        // place (assigned `None`), never moved out. Every other field is moved freely.
        let this = unsafe { self.get_unchecked_mut() };
        loop {
            match &mut this.phase {
                Phase::Head => {
                    if let Some(end) = ready!(this.poll_head(cx, head)) {
                        return Poll::Ready(end);
                    }
                }
                Phase::Respond => {
                    let respond = this.respond.as_mut().expect("a request in flight");
                    // SAFETY: see above.
                    let respond = unsafe { Pin::new_unchecked(respond) };
                    let Ok(resp) = ready!(respond.poll(cx));
                    this.respond = None;
                    if let Some(end) = this.start_response(resp) {
                        return Poll::Ready(end);
                    }
                }
                Phase::Write { .. } => {
                    if let Some(end) = ready!(this.poll_write(cx)) {
                        return Poll::Ready(end);
                    }
                }
                Phase::Refuse => {
                    return Poll::Ready(match ready!(this.wire.poll_flush(cx)) {
                        Ok(()) => H1End::Refused,
                        Err(_) => H1End::Failed,
                    });
                }
            }
        }
    }

    /// Waits for the next head and hands its request to the service (`Ready(None)`: the phase
    /// moved on), or ends the connection (`Ready(Some(end))`).
    fn poll_head(&mut self, cx: &mut Context<'_>, wait: &mut HeadWait) -> Poll<Option<H1End>> {
        loop {
            if !self.wire.body_over() {
                // The last request's body: let go of with nothing to read it: no next head;
                // being discarded (the connection's task reads it and comes back here), or
                // read by a task the handler gave it to, which wakes this one once it is over
                // (the keep-alive timeout bounds a reader that stalls: the connection is idle).
                if self.wire.body_abandoned() {
                    return Poll::Ready(Some(H1End::Done));
                }
                if !self.service.conn.is_discarding() {
                    self.wire.wait_for_body(cx.waker());
                }
                return Poll::Pending;
            }
            if !self.head_armed {
                self.head_armed = true;
                let deadline = now_ns().saturating_add(self.header_read_timeout);
                *wait = HeadWait::Until(deadline);
            }
            if *wait == HeadWait::Expired {
                tracing::debug!(target: "nodus::http", "connection cut: header-read timeout");
                return Poll::Ready(Some(H1End::Failed));
            }
            if self.sniffing && !self.sniffed() {
                if self.wire.buf.borrow().len() >= head::H2_PREFACE.len() {
                    return Poll::Ready(Some(H1End::Http2));
                }
                // Still the preface's first bytes: read on (an EOF decides for HTTP/1).
                if !self.wire.activity.eof.get() {
                    if let Err(e) = ready!(self.wire.poll_fill(cx)) {
                        tracing::debug!(target: "nodus::http", "connection ended: {e}");
                        return Poll::Ready(Some(H1End::Failed));
                    }
                    continue;
                }
                self.decided();
            }
            // An empty buffer holds no head (`head::parse` would leave it as it is): read.
            let parsed = if self.wire.buf.borrow().is_empty() {
                Ok(None)
            } else {
                head::parse(
                    &mut self.wire.buf.borrow_mut(),
                    &self.limits,
                    &mut self.cached_headers,
                )
            };
            match parsed {
                Ok(Some(request)) => {
                    *wait = HeadWait::Idle;
                    self.head_armed = false;
                    self.start_request(request);
                    return Poll::Ready(None);
                }
                Ok(None) => {}
                Err(e) => {
                    *wait = HeadWait::Idle;
                    self.refuse_head(e);
                    return Poll::Ready(None);
                }
            }
            if self.wire.activity.eof.get() {
                // Between requests a clean end; in the middle of a head, an incomplete one.
                let clean = self.wire.buf.borrow().is_empty();
                return Poll::Ready(Some(if clean { H1End::Done } else { H1End::Failed }));
            }
            if let Err(e) = ready!(self.wire.poll_fill(cx)) {
                tracing::debug!(target: "nodus::http", "connection ended: {e}");
                return Poll::Ready(Some(H1End::Failed));
            }
        }
    }

    /// (h2c) Whether the first bytes read decide for HTTP/1: one of them is not the preface's.
    fn sniffed(&mut self) -> bool {
        let buf = self.wire.buf.borrow();
        let n = buf.len().min(head::H2_PREFACE.len());
        let http1 = buf[..n] != head::H2_PREFACE[..n];
        drop(buf);
        if http1 {
            self.decided();
        }
        http1
    }

    /// (h2c) The connection is HTTP/1: it no longer has to decide by `Activity::sniff_by`.
    fn decided(&mut self) {
        self.sniffing = false;
        self.wire.activity.sniff_by.set(u64::MAX);
    }

    fn start_request(&mut self, request: head::RequestHead) {
        let head::RequestHead {
            method,
            uri,
            version,
            headers,
            body,
            keep_alive,
            expect_continue,
            expectation_failed,
            te_trailers,
            framing_refused,
            hosts,
        } = request;
        let body_empty = matches!(body, BodyFraming::Empty);
        *self.wire.body.borrow_mut() = match body {
            BodyFraming::Empty => BodyRead::Over,
            BodyFraming::Length(n) => BodyRead::Length(n),
            BodyFraming::Chunked => BodyRead::Chunked(super::chunked::ChunkedDecoder::new()),
        };
        let continue_owed = expect_continue && !body_empty;
        self.wire.continue_owed.set(continue_owed);
        self.version = version;
        self.head_request = method == Method::HEAD;
        self.connect_request = method == Method::CONNECT;
        self.keep_alive = keep_alive;
        self.te_trailers = te_trailers;
        let request = self.wire.request.get() + 1;
        self.wire.request.set(request);
        let wire: Weak<dyn WireBody> = Rc::downgrade(&self.wire) as Weak<dyn WireBody>;
        let mut req = Request::new(H1Body { wire, request });
        *req.method_mut() = method;
        *req.uri_mut() = uri;
        *req.version_mut() = version;
        // `Request::new`'s own map holds no allocation (`HeaderMap::default`): forgotten, it
        // leaks nothing and costs no drop.
        let fresh = std::mem::replace(req.headers_mut(), headers);
        debug_assert_eq!(fresh.capacity(), 0);
        std::mem::forget(fresh);
        let facts = HeadFacts {
            framing_refused,
            expectation_failed,
            continue_owed,
            parsed: Some(Parsed { hosts, body }),
        };
        self.respond = Some(self.service.call_h1(req, facts));
        self.phase = Phase::Respond;
    }

    /// Queues the response's head and moves to writing its body; `Some(Failed)` for a head
    /// hyper too would refuse to write (`encode::HeadError`): the connection ends unanswered.
    fn start_response(&mut self, resp: Response<SentBody>) -> Option<H1End> {
        // A `100 Continue` the handler never asked for is owed no more.
        self.wire.continue_owed.set(false);
        let (parts, body) = resp.into_parts();
        let hint = body.size_hint();
        let head = encode::Head {
            status: parts.status,
            headers: &parts.headers,
            version: parts.version,
            request_version: self.version,
            request_is_head: self.head_request,
            request_is_connect: self.connect_request,
            body_len: hint.exact(),
            body_empty: body.is_end_stream(),
            keep_alive: self.keep_alive,
        };
        let date = encode::date_now();
        let mut encoded = Err(encode::HeadError::Header);
        self.wire
            .push_own(|out| encoded = encode::encode_head(&head, &date, out));
        let (framing, keep_alive) = match encoded {
            Ok(encoded) => encoded,
            Err(e) => {
                tracing::debug!(target: "nodus::http", "response head not written ({e:?}): connection ended");
                return Some(self.fail());
            }
        };
        let trailers = if self.te_trailers && matches!(framing, Framing::Chunked) {
            trailer_names(&parts.headers)
        } else {
            Vec::new()
        };
        let mut headers = parts.headers;
        headers.clear();
        self.cached_headers = Some(headers);
        let left = match framing {
            Framing::Length(n) => n,
            _ => 0,
        };
        // No body is sent: the handler's is dropped now.
        let body = (!matches!(framing, Framing::NoBody)).then_some(body);
        self.phase = Phase::Write {
            body,
            framing,
            left,
            keep_alive,
            trailers,
            ended: false,
        };
        None
    }

    /// Writes the response; `Ready(Some(end))` when the connection ends with it, `Ready(None)`
    /// when it was written and the next request is waited for.
    fn poll_write(&mut self, cx: &mut Context<'_>) -> Poll<Option<H1End>> {
        let Phase::Write {
            body,
            framing,
            left,
            keep_alive,
            trailers,
            ended,
        } = &mut self.phase
        else {
            unreachable!("poll_write outside Phase::Write");
        };
        loop {
            // Pull the body while little waits on the socket.
            let mut body_pending = false;
            while let Some(b) = body.as_mut() {
                if self.wire.queued() >= self.max_buf || self.wire.segments() >= MAX_IOVECS {
                    break;
                }
                // A body at its end is not asked again (hyper's dispatcher does not either).
                let frame = if b.is_end_stream() {
                    Poll::Ready(None)
                } else {
                    Pin::new(&mut *b).poll_frame(cx)
                };
                match frame {
                    Poll::Pending => {
                        body_pending = true;
                        break;
                    }
                    Poll::Ready(Some(Ok(frame))) => {
                        let chunk = match frame.into_data() {
                            Ok(chunk) => chunk,
                            Err(frame) => {
                                // Trailers end a chunked body (those allowed), or are dropped.
                                if let (Ok(fields), Framing::Chunked, false) =
                                    (frame.into_trailers(), &framing, *ended)
                                {
                                    self.wire.push_own(|out| end_chunks(&fields, trailers, out));
                                    *ended = true;
                                }
                                continue;
                            }
                        };
                        let len = chunk.remaining();
                        if len == 0 {
                            continue;
                        }
                        match framing {
                            Framing::Chunked => {
                                self.wire.push_own(|out| encode::chunk_head(len, out));
                                self.wire.push_chunk(chunk);
                                self.wire
                                    .push_own(|out| out.extend_from_slice(encode::CHUNK_END));
                            }
                            Framing::Length(_) => {
                                if len as u64 > *left {
                                    tracing::debug!(
                                        target: "nodus::http",
                                        "response body longer than its Content-Length: connection ended"
                                    );
                                    return Poll::Ready(Some(self.fail()));
                                }
                                *left -= len as u64;
                                self.wire.push_chunk(chunk);
                            }
                            Framing::CloseDelimited => self.wire.push_chunk(chunk),
                            Framing::NoBody => {}
                        }
                    }
                    Poll::Ready(None) => {
                        if matches!(framing, Framing::Chunked) && !*ended {
                            self.wire
                                .push_own(|out| out.extend_from_slice(encode::LAST_CHUNK));
                        }
                        if matches!(framing, Framing::Length(_)) && *left > 0 {
                            tracing::debug!(
                                target: "nodus::http",
                                "response body shorter than its Content-Length: connection ended"
                            );
                            *body = None;
                            return Poll::Ready(Some(self.fail()));
                        }
                        *body = None;
                    }
                    Poll::Ready(Some(Err(e))) => {
                        tracing::debug!(target: "nodus::http", "response body failed: {e}");
                        *body = None;
                        return Poll::Ready(Some(self.fail()));
                    }
                }
            }
            match self.wire.poll_flush(cx) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(e)) => {
                    tracing::debug!(target: "nodus::http", "connection ended: {e}");
                    return Poll::Ready(Some(self.fail()));
                }
                Poll::Pending => return Poll::Pending,
            }
            if body.is_some() {
                // Flushed: the body wakes the task when it has more, or (stopped at `max_buf`)
                // has more now.
                if body_pending {
                    return Poll::Pending;
                }
                continue;
            }
            let keep = *keep_alive && !matches!(framing, Framing::CloseDelimited);
            self.phase = Phase::Head;
            if keep {
                return Poll::Ready(None);
            }
            // Input read ahead (a request pipelined behind this one) is not the kernel's to
            // see at the close: the connection lingers for it.
            if !self.wire.buf.borrow().is_empty() {
                self.service.conn.linger_on_close();
            }
            return Poll::Ready(Some(H1End::Done));
        }
    }

    /// Ends the connection after a failure, dropping what is queued.
    fn fail(&mut self) -> H1End {
        self.wire.clear_output();
        self.phase = Phase::Head;
        H1End::Failed
    }

    /// Queues the answer to a head that could not be parsed, counts and reports it.
    fn refuse_head(&mut self, e: HeadError) {
        const PREFACE_REFUSED: &[u8] = b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n";
        const URI_TOO_LONG: &[u8] =
            b"HTTP/1.1 414 URI Too Long\r\nConnection: close\r\nContent-Length: 0\r\n\r\n";
        match e {
            HeadError::Http2Preface => self
                .wire
                .push_own(|out| out.extend_from_slice(PREFACE_REFUSED)),
            HeadError::UriTooLong => self
                .wire
                .push_own(|out| out.extend_from_slice(URI_TOO_LONG)),
            HeadError::Malformed | HeadError::TooLarge => {
                let headers = http::HeaderMap::new();
                let head = encode::Head {
                    status: e.status(),
                    headers: &headers,
                    version: Version::HTTP_11,
                    request_version: Version::HTTP_11,
                    request_is_head: false,
                    request_is_connect: false,
                    body_len: Some(0),
                    body_empty: true,
                    keep_alive: false,
                };
                let date = encode::date_now();
                self.wire.push_own(|out| {
                    // An empty head of a 4xx status: nothing to refuse.
                    let _ = encode::encode_head(&head, &date, out);
                });
            }
        }
        self.service.head_refused(e.status());
        self.phase = Phase::Refuse;
    }
}

/// The field names a response's `Trailer` headers announce.
fn trailer_names(headers: &http::HeaderMap) -> Vec<HeaderName> {
    headers
        .get_all(header::TRAILER)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect()
}

/// The last chunk of a chunked body, with the trailer `fields` that are `allowed` and may be
/// trailers (hyper's `is_valid_trailer_field`: no framing, routing, authentication or content
/// metadata fields).
fn end_chunks(fields: &http::HeaderMap, allowed: &[HeaderName], out: &mut Vec<u8>) {
    out.extend_from_slice(b"0\r\n");
    for (name, value) in fields {
        let forbidden = matches!(
            *name,
            header::AUTHORIZATION
                | header::CACHE_CONTROL
                | header::CONTENT_ENCODING
                | header::CONTENT_LENGTH
                | header::CONTENT_RANGE
                | header::CONTENT_TYPE
                | header::HOST
                | header::MAX_FORWARDS
                | header::SET_COOKIE
                | header::TRAILER
                | header::TRANSFER_ENCODING
                | header::TE
        );
        if allowed.contains(name) && !forbidden {
            out.extend_from_slice(name.as_str().as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
    }
    out.extend_from_slice(b"\r\n");
}
