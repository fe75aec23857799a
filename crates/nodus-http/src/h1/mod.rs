//! nodus's own HTTP/1 engine: what `server` serves an HTTP/1 connection with.
//!
//! hyper's HTTP/1 server cost about 8,800 user-space instructions per keep-alive request on the
//! nodus loop (`bench/http/instructions.sh`), most of them in its dispatcher, buffers and body
//! channel; the same request served here costs about 6,650. The handler's API is unchanged:
//! `http::Request<RequestBody>` in, `http::Response<Body>` out, hyper's `Body` trait for bodies.
//!
//! - `head`: a request head parsed out of the connection's read buffer (httparse, zero copy), with
//!   hyper's framing rules and the refusals Node (llhttp, strict) adds.
//! - `chunked`: a chunked request body decoded from the same buffer, every line end a CR LF.
//! - `encode`: a response head as hyper's server writes it, and the `Date` cache.
//! - `wire`: the connection's socket, read buffer, request body state and output queue.
//! - `conn`: the connection: one request at a time from head to response, then the next.
//!
//! Invariants:
//! - Everything runs in the connection's task; the request body a handler reads shares the
//!   connection's `Wire` and reads the socket itself, so a body is never copied through a
//!   channel.
//! - The server's semantics (limits, refusals and their reports, timeouts, discards, lingering,
//!   drains, measurements) live in `server`, shared with HTTP/2: the engine is the HTTP/1
//!   framing and nothing else.

pub(crate) mod chunked;
pub(crate) mod conn;
pub(crate) mod encode;
pub(crate) mod head;
pub(crate) mod wire;

/// A `content-length` value: one or more ASCII digits, no sign, no overflow (hyper's
/// `from_digits`).
fn digits(bytes: &[u8]) -> Option<u64> {
    if bytes.is_empty() {
        return None;
    }
    bytes.iter().try_fold(0u64, |n, &b| {
        if b.is_ascii_digit() {
            n.checked_mul(10)?.checked_add(u64::from(b - b'0'))
        } else {
            None
        }
    })
}
