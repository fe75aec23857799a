//! `--access-log`: one line per request on stderr (target `nodus::access`),
//! `PEER "METHOD PATH VERSION" STATUS BYTES TIME`, each unknown field `-`.
//!
//! - BYTES is the response body's bytes sent (nginx's `$body_bytes_sent`): what the body handed
//!   to the connection, so a download cut short shows how far it got (with the status it was
//!   sent with, as nginx logs it), and a `HEAD` or 304 shows 0.
//! - TIME runs from the request's start to the end of its response: the line of an answer the
//!   handler made is written when its body is done with (sent whole, or dropped with its
//!   connection), by [`logged`]'s body; one the server made in the handler's stead comes through
//!   its `on_refused` hook ([`log_refused`]).
//! - Every request has one line: a refusal (400 for `Host`, 413, 414, 431, a malformed head's
//!   400, with `"- - -"` and no time for a head that could not be parsed), the 500 of a handler
//!   that panicked, and the 499 of a request whose connection ended before its handler answered
//!   (nginx's "client closed request"; nothing was sent, so BYTES is 0).
//! - A `"` or `\` in the path is written `\x22` or `\x5C`, as nginx does: a client cannot close
//!   the quoted field and forge the ones after it.

use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Method, Response, StatusCode, Version};
use hyper::body::{Frame, SizeHint};
use nodus_http::Body;
use nodus_http::server::{Refused, RequestLine};

/// A request, as its access-log line shows it.
pub(super) struct Request {
    pub peer: Option<SocketAddr>,
    pub method: Method,
    pub path: String,
    pub version: Version,
    /// `nodus::clock` ns when the handler took the request.
    pub start: u64,
}

/// `response` with a body that writes `request`'s access-log line once it is done with.
pub(super) fn logged(request: Request, response: Response<Body>) -> Response<Body> {
    let status = response.status();
    response.map(|inner| {
        nodus_http::boxed(LoggedBody {
            inner,
            request,
            status,
            bytes: 0,
        })
    })
}

/// A response body that counts its bytes and logs its request when dropped: after its last
/// frame, or unfinished when the connection ended (hyper drops an empty body, and a `HEAD`
/// answer's, without polling it).
struct LoggedBody {
    inner: Body,
    request: Request,
    status: StatusCode,
    bytes: u64,
}

impl hyper::body::Body for LoggedBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let frame = self.inner.as_mut().poll_frame(cx);
        if let Poll::Ready(Some(Ok(f))) = &frame {
            self.bytes += f.data_ref().map_or(0, |d| d.len() as u64);
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

impl Drop for LoggedBody {
    fn drop(&mut self) {
        let r = &self.request;
        let line = RequestLine {
            method: &r.method,
            path: &r.path,
            version: r.version,
        };
        let ns = nodus::clock::now_ns().saturating_sub(r.start);
        log_access(r.peer, Some(line), self.status, self.bytes, Some(ns));
    }
}

/// The line of a request the server answered in the handler's stead, or that nobody answered
/// (the server's `on_refused` hook).
pub(super) fn log_refused(refused: &Refused<'_>) {
    log_access(
        refused.peer,
        refused.request,
        refused.status,
        refused.body_bytes,
        refused.elapsed_ns,
    );
}

/// One access-log line.
fn log_access(
    peer: Option<SocketAddr>,
    request: Option<RequestLine<'_>>,
    status: StatusCode,
    bytes: u64,
    ns: Option<u64>,
) {
    let peer = peer.map_or_else(|| "-".to_owned(), |p| p.to_string());
    let (status, time) = (status.as_u16(), LogTime(ns));
    match request {
        Some(RequestLine {
            method,
            path,
            version,
        }) => {
            let path = log_escape(path);
            tracing::info!(target: "nodus::access", "{peer} \"{method} {path} {version:?}\" {status} {bytes} {time}");
        }
        None => {
            tracing::info!(target: "nodus::access", "{peer} \"- - -\" {status} {bytes} {time}")
        }
    }
}

/// An access-log line's time: `1.234ms`, or `-` when unknown.
struct LogTime(Option<u64>);

impl std::fmt::Display for LogTime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(ns) => write!(f, "{:.3}ms", ns as f64 / 1e6),
            None => f.write_str("-"),
        }
    }
}

/// A request path as the access log quotes it (see the module docs).
fn log_escape(path: &str) -> std::borrow::Cow<'_, str> {
    if !path.contains(['"', '\\']) {
        return path.into();
    }
    path.replace('\\', "\\x5C").replace('"', "\\x22").into()
}

#[cfg(test)]
mod tests {
    #[test]
    fn log_escape_closes_no_quoted_field() {
        assert_eq!(super::log_escape("/a/b.txt"), "/a/b.txt");
        assert_eq!(
            super::log_escape(r#"/a" 200 0.1ms "x\y"#),
            r"/a\x22 200 0.1ms \x22x\x5Cy"
        );
    }
}
