//! Request and response bodies.
//!
//! Invariant: an HTTP/1 request's [`RequestBody`] let go of before its end (the handler answered
//! without reading it all) is either handed to its connection to be read and discarded (a
//! chunked rest, or one of known length up to `DISCARD_MAX`, with no `Expect: 100-continue`
//! pending: the connection stays, as Node's and nginx's do after an early answer, if the rest
//! ends within the discard's bounds, `server`'s module docs), or makes the response say
//! `Connection: close` (hyper closes a connection rather than read a body nobody takes).
//!
//! A body still being read when its request's `Config::request_timeout` passes (counted from the
//! loop time its head was parsed) fails the read with [`RequestTimedOut`] (`collect_body`:
//! [`BodyError::TimedOut`]) and is never read again: an HTTP/1 one is not discarded (its
//! response says `Connection: close`, and the connection closes after it), an HTTP/2 one's
//! stream is reset when it is dropped. The deadline is checked only while the body is read and
//! its data is not there: a handler that does not read it is not cut by it.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full, LengthLimitError, Limited};
use hyper::body::{Body as _, Frame, Incoming, SizeHint};

use crate::h1::conn::H1Body;
use crate::io::now_ns;
use crate::server::ConnState;

/// A response body: any stream of `Bytes` chunks, `Send` or not (bodies run on the loop).
pub type Body = Pin<Box<dyn hyper::body::Body<Data = Bytes, Error = std::io::Error>>>;

/// Boxes any body into a [`Body`].
pub fn boxed(body: impl hyper::body::Body<Data = Bytes, Error = std::io::Error> + 'static) -> Body {
    Box::pin(body)
}

/// The most body data its connection reads of an unread request body to discard it: a rest of
/// known length over this is not read at all, a chunked one is given up past it.
pub(crate) const DISCARD_MAX: u64 = 64 * 1024;

/// Where a request body comes from: hyper's HTTP/2 stream (or an h2c connection's HTTP/1
/// request), or nodus's own HTTP/1 engine.
pub(crate) enum Source {
    Hyper(Incoming),
    Wire(H1Body),
}

impl hyper::body::Body for Source {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.get_mut() {
            Source::Hyper(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
            Source::Wire(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Source::Hyper(b) => b.is_end_stream(),
            Source::Wire(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Source::Hyper(b) => b.size_hint(),
            Source::Wire(b) => b.size_hint(),
        }
    }
}

/// A request body, limited to `Config::max_body_bytes`.
pub struct RequestBody {
    /// `None` once handed to the connection to be discarded (only in `drop`).
    inner: Option<Limited<Source>>,
    /// An HTTP/1 request's connection, until the body ends; `None` for a body that was empty
    /// from the start, or ended.
    conn: Option<Rc<ConnState>>,
    /// Whether the rest may be read once the handler let go of it: no `Expect: 100-continue`
    /// (reading would send a `100 Continue` after the final response).
    discardable: bool,
    /// When the whole body must have come (`nodus::clock` ns; `u64::MAX`: never).
    deadline: u64,
    /// The deadline's sleep, made when a read first waits for data (boxed: most bodies never
    /// wait, and the body is moved with its request).
    sleep: Option<Pin<Box<nodus::Sleep>>>,
    /// The deadline passed while the body was read: every read fails.
    timed_out: bool,
}

/// The error of a request body read past `Config::request_timeout`: answer 408 (Node's
/// `server.requestTimeout`).
#[derive(Debug)]
pub struct RequestTimedOut;

impl std::fmt::Display for RequestTimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the request body did not come within the request timeout")
    }
}

impl std::error::Error for RequestTimedOut {}

impl RequestBody {
    pub(crate) fn new(
        inner: Limited<Source>,
        conn: Option<Rc<ConnState>>,
        discardable: bool,
        deadline: u64,
    ) -> RequestBody {
        RequestBody {
            inner: Some(inner),
            conn,
            discardable,
            deadline,
            sleep: None,
            timed_out: false,
        }
    }

    /// Whether the request timeout passed, for a read that waits for data.
    #[cold]
    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        if self.deadline == u64::MAX {
            return false;
        }
        let deadline = self.deadline;
        let sleep = self.sleep.get_or_insert_with(|| {
            let left = deadline.saturating_sub(now_ns());
            Box::pin(nodus::sleep(std::time::Duration::from_nanos(left)))
        });
        self.timed_out = sleep.as_mut().poll(cx).is_ready();
        self.timed_out
    }

    fn inner(self: Pin<&mut Self>) -> Pin<&mut Limited<Source>> {
        Pin::new(
            self.get_mut()
                .inner
                .as_mut()
                .expect("RequestBody: polled after drop"),
        )
    }
}

impl hyper::body::Body for RequestBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.timed_out {
            return Poll::Ready(Some(Err(Box::new(RequestTimedOut))));
        }
        let frame = self.as_mut().inner().poll_frame(cx);
        match frame {
            Poll::Ready(None) => self.conn = None,
            Poll::Pending if self.expired(cx) => {
                return Poll::Ready(Some(Err(Box::new(RequestTimedOut))));
            }
            _ => {}
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(|b| b.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), |b| b.size_hint())
    }
}

impl Drop for RequestBody {
    fn drop(&mut self) {
        let (Some(conn), Some(inner)) = (self.conn.take(), self.inner.take()) else {
            return;
        };
        if inner.is_end_stream() {
            return;
        }
        if self.timed_out {
            conn.body_left.set(true);
            return;
        }
        // A rest of known length over the bound is not worth reading; a chunked body's rest
        // (no exact length: `Limited`'s limit is an upper bound) is found out by its discard.
        let rest = inner.size_hint().exact();
        if self.discardable && rest.is_none_or(|n| n <= DISCARD_MAX) {
            conn.discard(inner);
        } else {
            conn.body_left.set(true);
        }
    }
}

impl std::fmt::Debug for RequestBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestBody")
            .field("size_hint", &hyper::body::Body::size_hint(self))
            .finish_non_exhaustive()
    }
}

/// A body holding `bytes`.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    boxed(Full::new(bytes.into()).map_err(|e: Infallible| match e {}))
}

/// An empty body.
pub fn empty() -> Body {
    boxed(Empty::new().map_err(|e: Infallible| match e {}))
}

/// A plain-text response.
pub fn text(status: http::StatusCode, body: impl Into<Bytes>) -> http::Response<Body> {
    let mut r = http::Response::new(full(body));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// Why a request body could not be read.
#[derive(Debug)]
pub enum BodyError {
    /// Over `Config::max_body_bytes`: answer 413.
    TooLarge,
    /// Not all there within `Config::request_timeout` of the request's head: answer 408.
    TimedOut,
    /// The client went away or sent a malformed body (its `Display` says why, with its sources).
    Transport(Box<dyn std::error::Error + Send + Sync>),
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BodyError::TooLarge => f.write_str("request body too large"),
            BodyError::TimedOut => f.write_str("request body not received in time"),
            BodyError::Transport(e) => {
                // hyper's error says where it failed, its source why (a reset, a malformed chunk).
                write!(f, "reading the request body failed: {e}")?;
                let mut source = e.source();
                while let Some(e) = source {
                    write!(f, ": {e}")?;
                    source = e.source();
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for BodyError {}

/// Reads a whole request body (up to the server's limit).
pub async fn collect_body(body: RequestBody) -> Result<Bytes, BodyError> {
    match body.collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.is::<LengthLimitError>() => Err(BodyError::TooLarge),
        Err(e) if e.is::<RequestTimedOut>() => Err(BodyError::TimedOut),
        Err(e) => Err(BodyError::Transport(e)),
    }
}
