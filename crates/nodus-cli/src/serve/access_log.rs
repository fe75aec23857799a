//! `--access-log`: one line per request on stderr (target `nodus::access`),
//! `PEER "METHOD PATH VERSION" STATUS BYTES TIME`, each unknown field `-`, and ` incomplete`
//! after it for an answer whose body did not all go out.
//!
//! - BYTES is the response body's bytes sent (nginx's `$body_bytes_sent`): what the socket took
//!   of the body (`nodus_http::Answered::body_bytes`), so a download cut short shows how far it
//!   got (with the status it was sent with, as nginx logs it; a write that failed, or output
//!   still unwritten when the connection ended, is not counted), and a `HEAD` or 304 shows 0.
//!   An answer of the handler cut short (`nodus_http::Answered::complete` false: the drain
//!   deadline, a write stall, a file read that failed, a client gone) says ` incomplete` at the
//!   end of its line, so a body cut to nothing (`200 0`) cannot pass for an empty one.
//! - TIME runs from the request's start to the end of its response: the line of an answer the
//!   handler made is written when it is done with (its last body byte written, or its
//!   connection ended), through the server's `on_response` hook ([`log_answered`]); one the
//!   server made in the handler's stead comes through its `on_refused` hook ([`log_refused`]).
//! - Every request has one line: a refusal (400 for `Host`, 413, 414, 431, a malformed head's
//!   400, with `"- - -"` and no time for a head that could not be parsed), the 500 of a handler
//!   that panicked, and the 499 of a request whose connection ended before its handler answered
//!   (nginx's "client closed request"; nothing was sent, so BYTES is 0).
//! - A `"` or `\` in the path is written `\x22` or `\x5C`, as nginx does: a client cannot close
//!   the quoted field and forge the ones after it.

use std::net::SocketAddr;

use http::StatusCode;
use nodus_http::server::{Answered, Refused, RequestLine};

/// The line of an answer of the handler, once done with (the server's `on_response` hook).
pub(super) fn log_answered(answered: &Answered<'_>) {
    log_access(
        answered.peer,
        Some(answered.request),
        answered.status,
        answered.body_bytes,
        Some(answered.elapsed_ns),
        !answered.complete,
    );
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
        false,
    );
}

/// One access-log line.
fn log_access(
    peer: Option<SocketAddr>,
    request: Option<RequestLine<'_>>,
    status: StatusCode,
    bytes: u64,
    ns: Option<u64>,
    incomplete: bool,
) {
    let peer = peer.map_or_else(|| "-".to_owned(), |p| p.to_string());
    let (status, time) = (status.as_u16(), LogTime(ns));
    let cut = if incomplete { " incomplete" } else { "" };
    match request {
        Some(RequestLine {
            method,
            path,
            version,
        }) => {
            let path = log_escape(path);
            tracing::info!(target: "nodus::access", "{peer} \"{method} {path} {version:?}\" {status} {bytes} {time}{cut}");
        }
        None => {
            tracing::info!(target: "nodus::access", "{peer} \"- - -\" {status} {bytes} {time}{cut}")
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
