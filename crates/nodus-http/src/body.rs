//! Request and response bodies.
//!
//! Invariant: an HTTP/1 request's [`RequestBody`] tells its connection when it is let go of
//! before its end (the handler answered without reading it all), so that the response can say
//! `Connection: close`: hyper closes such a connection rather than read a body nobody takes.

use std::convert::Infallible;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full, LengthLimitError, Limited};
use hyper::body::{Body as _, Frame, Incoming, SizeHint};

use crate::server::ConnState;

/// A response body: any stream of `Bytes` chunks, `Send` or not (bodies run on the loop).
pub type Body = Pin<Box<dyn hyper::body::Body<Data = Bytes, Error = std::io::Error>>>;

/// Boxes any body into a [`Body`].
pub fn boxed(body: impl hyper::body::Body<Data = Bytes, Error = std::io::Error> + 'static) -> Body {
    Box::pin(body)
}

/// A request body, limited to `Config::max_body_bytes`.
pub struct RequestBody {
    inner: Limited<Incoming>,
    /// An HTTP/1 request's connection, until the body ends; `None` for a body that was empty
    /// from the start, or ended.
    conn: Option<Rc<ConnState>>,
}

impl RequestBody {
    pub(crate) fn new(inner: Limited<Incoming>, conn: Option<Rc<ConnState>>) -> RequestBody {
        RequestBody { inner, conn }
    }
}

impl hyper::body::Body for RequestBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let frame = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(None) = frame {
            self.conn = None;
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for RequestBody {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take()
            && !self.inner.is_end_stream()
        {
            conn.body_left.set(true);
        }
    }
}

impl std::fmt::Debug for RequestBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestBody")
            .field("size_hint", &self.inner.size_hint())
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
    /// The client went away or sent a malformed body.
    Transport(Box<dyn std::error::Error + Send + Sync>),
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BodyError::TooLarge => f.write_str("request body too large"),
            BodyError::Transport(e) => write!(f, "reading the request body failed: {e}"),
        }
    }
}

impl std::error::Error for BodyError {}

/// Reads a whole request body (up to the server's limit).
pub async fn collect_body(body: RequestBody) -> Result<Bytes, BodyError> {
    match body.collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.is::<LengthLimitError>() => Err(BodyError::TooLarge),
        Err(e) => Err(BodyError::Transport(e)),
    }
}
