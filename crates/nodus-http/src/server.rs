//! `serve`: an HTTP server on a nodus listener, with the limits a public server needs and a
//! graceful drain.
//!
//! Invariants:
//! - One task accepts; each connection is its own task, named `Config::name` (a handler class).
//!   A connection is on the server's books (open, for the limit and for a drain) from its accept
//!   on, before its task first runs: a drain that begins before then (in the same loop turn, say:
//!   a cluster worker's listener that yields its last connections and then its end) waits for it
//!   and it is served, instead of the drain finding nothing open and the process exiting with the
//!   connection unanswered.
//! - While a handler runs, the task that polls it has the request as its note
//!   (`nodus::task::set_note`): `METHOD PATH`, the path without the query, cut to 64 bytes on a
//!   char boundary (`request_note`: a static prefix for a common method, `"GET "`, and the path,
//!   the only part copied; control characters are escaped when shown). So the
//!   watchdog's report of a handler that blocks the loop, the end-of-stall and slow-poll lines,
//!   the recent stalls and what shows them name the route, not only the connection task: paths
//!   appear in logs. It is set before the handler is called and cleared once its response is
//!   ready (or it panicked, or the request was dropped unanswered), in the connection's task for
//!   HTTP/1 (one request at a time) and, for HTTP/2, in the call's (the connection's) around the
//!   handler's call and in the stream's own task around its polls. A refusal has none. It costs
//!   about 155 instructions a keep-alive request (`bench/http/instructions.sh`: 8,530 against
//!   8,374 without): the path copied into the loop's slot a word at a time, the method a static
//!   prefix, and the clear.
//! - At most `max_connections` are open: at the limit the accept task stops accepting (the
//!   kernel's backlog holds newcomers; for a cluster worker's listener fed by the primary, the
//!   primary, once the worker's queue of handed-over connections is full) until one closes. The
//!   limit knows nothing of the open-files limit nor of what a request opens: the application
//!   sets it below what its fds hold (`nodus serve` does, from `RLIMIT_NOFILE`), or connections
//!   held up to the fd limit leave their own requests without an fd. An accept that fails for
//!   want of a file descriptor (`EMFILE`, `ENFILE`) is logged once per burst, then counted: one
//!   line per 10 s (`nodus::log_limit`); the listener itself backs off (`nodus::net`: its next
//!   accept waits 100 ms, or for a new connection), so the accept task does not spin.
//! - Limits: request heads over `max_header_bytes` or with more than `max_headers` headers get
//!   431, except one whose request line alone is `max_header_bytes` long or more: 414, as from
//!   nginx (`h1::head`: the answer depends on the head's bytes only, not on how they were split
//!   into reads); over HTTP/2 the service refuses them (431, `h2_head_refusal`: more
//!   than `max_headers` fields, or a header list, RFC 9113 section 6.5.2, over
//!   `max_header_bytes`), and h2 itself one whose header list is over twice that (its own 431 on
//!   the stream, neither counted nor reported); a `Content-Length` over `max_body_bytes` gets 413 without reaching the
//!   handler, and a longer chunked body fails `collect_body` with `BodyError::TooLarge`; a body
//!   read past `request_timeout` from its head fails the read (`BodyError::TimedOut`, `body`'s
//!   docs), never waits longer, and ends its HTTP/1 connection after the answer; an HTTP/1 head not complete within `header_read_timeout` (slowloris) closes the connection;
//!   with h2c, so does a connection whose first bytes may still be the HTTP/2 preface (trickled)
//!   `header_read_timeout` after its start, and the first HTTP/1 head they began must be
//!   complete by then too (`h1::conn` compares them with the preface as they are read);
//!   an HTTP/2 connection's idleness is counted by its requests, not its bytes: with no request
//!   in flight and no response unfinished, it is closed `keep_alive_timeout` after its start,
//!   its last request's head or its last response's end, whatever it sends meanwhile (PINGs,
//!   SETTINGS, a request's head not yet complete: a head trickled over HTTP/2 is cut then, and
//!   `header_read_timeout` is HTTP/1's; a stream the client reset is no longer in flight), after
//!   a GOAWAY (RFC 9113 section 6.8: hyper's graceful one, which ends the connection once the
//!   client acks its PING; one that does not ack is closed `IDLE_GOAWAY_GRACE` later); a
//!   connection with no request in flight, no response body still being produced or written (however
//!   small: its head may be out while its data waits on the server's own work, a file chunk on
//!   a swamped I/O pool, or a server-sent-events body is silent for long), no write waiting on
//!   the peer and no I/O (HTTP/2: as above) for `keep_alive_timeout` is closed; one whose write has waited on the
//!   peer for `write_stall_timeout` (it stopped reading; over HTTP/2 also a response body held
//!   back by the peer's flow-control window, no body progress meanwhile: `SentBody`) is cut with
//!   a reset (`SO_LINGER` 0: no
//!   orphaned socket keeps probing a peer that never reads with the unsent output), and so is
//!   one the drain deadline cuts with a response unfinished (a write waiting, or a body still
//!   being produced: the reset tells its client it is incomplete, even a body that would end
//!   with the connection).
//! - An HTTP/1.1 request without `Host` gets 400 and `Connection: close` without reaching the
//!   handler, as from Node (HTTP/1.0 ones are served); so does any HTTP/1 request with more than
//!   one `Host` or one that is no `host[:port]` (RFC 9112 section 3.2). It counts as a request,
//!   as a 413 does.
//!   Without `http2`, an HTTP/2 preface gets Node's bare 400 head, and the connection closes.
//! - HTTP/1 framing Node (llhttp, strict) refuses gets 400 and `Connection: close` without
//!   reaching the handler, its body unread (`RequestHead::framing_refused`, `h1::head`): a bare
//!   line feed ending a line of the head, `Content-Length` twice (even equal) or with
//!   `Transfer-Encoding`, `chunked` twice among the transfer codings; the rest of the family
//!   (a `Transfer-Encoding` whose last coding is not `chunked`, or on HTTP/1.0, differing or
//!   malformed lengths) is a head that could not be parsed (400). Chunked body framing Node
//!   refuses fails the body's read (`h1::chunked`): a bare line feed anywhere in it, its trailer
//!   section included, a space or tab after a chunk size, a chunk extension outside llhttp's
//!   strict grammar (whitespace in it, a byte no token holds, a control byte, a quoted string not
//!   closed on its line), a `Content-Length` or `Transfer-Encoding` trailer field. The
//!   connection closes after the answer, nothing after the refused byte read. Pipelined heads
//!   are parsed as the first is: the same bytes get the same answer however they arrive.
//! - HTTP/1 request lines Node refuses are heads that could not be parsed (400, `h1::head`): a
//!   method of anything but uppercase letters, `-` and `_` (`get`; an unknown uppercase method
//!   is the handler's), a target not in origin-form, absolute-form or `*`, or for CONNECT not in authority-form, a target byte over 0x7F. A CONNECT reaches the
//!   handler; its response says `Connection: close` and ends the connection, no byte after its
//!   head read (there are no tunnels; Node without a `connect` listener closes it unanswered).
//! - An HTTP/1.1 request with an `Expect` Node does not read as `100-continue`
//!   (`RequestHead::expectation_failed`) gets 417 and `Connection: close` without reaching the
//!   handler, its body unread, as Node answers with no `checkExpectation` listener (Node keeps the
//!   connection). HTTP/1.0's `Expect` is ignored, as by Node. An HTTP/2 request whose `expect`
//!   is not exactly `100-continue` gets 417 on its stream (`h2_head_refusal`, as Node's HTTP/2
//!   compatibility layer answers).
//! - HTTP/1 half-close: a client that shuts down its write side after its request (`nc -N`,
//!   socat, health checkers) still gets the whole response, as from nginx's static files
//!   (Node answers it only when its handler answers at once, and aborts a request still at
//!   work); an EOF between requests ends the connection. So the connection is
//!   not read while a request is in flight, and a client that closes meanwhile (its FIN is a
//!   half-close's) cannot be told from one that half-closed: its request is answered and
//!   reported to `Config::on_response` with its status and the body bytes the socket took, not as
//!   499 (nginx's proxy and Node would call it one). One that resets the connection meanwhile
//!   is noticed only when the response is written: reported the same, with 0 bytes. Over HTTP/2
//!   a client's close or reset of the connection, or of the request's stream, drops the request
//!   (499, below).
//! - A request body the handler lets go of unread (an early 405, say) is read and discarded by
//!   its connection, which then serves the next request (as from Node and nginx), when no
//!   `Expect: 100-continue` waits for an answer (a `100 Continue` after the final answer would
//!   be wrong) and what is left of it is a chunked body or has a known length up to 64 KiB. The
//!   discard has bounds: at most 64 KiB of body data (Node's reads any amount) and
//!   `max_body_bytes` in all, within the keep-alive timeout from the moment the handler let go
//!   of it. A body past a bound, a malformed chunk, or a peer that stalls or trickles is given
//!   up: the connection stops reading (none of the rest is ever parsed, as a request or
//!   anything else) and closes after the response. Any other body (`Expect: 100-continue`, a
//!   known length over 64 KiB) is not read, and the connection closes after the response.
//! - An HTTP/1 response after which the connection closes says `Connection: close`: every one
//!   during a drain, a refusal's, a CONNECT's, one that leaves its request's body unread and not discarded
//!   (above: nothing reads a body nobody takes, so the connection closes), one to a request
//!   that asked for the close (`Connection: close`, an HTTP/1.0 request without keep-alive),
//!   and an HTTP/1.0 one whose body has no known length (HTTP/1.0 has no chunked
//!   coding: the close ends the body; as nginx, no keep-alive for it). The head is written
//!   before a chunked body's discard is over, so it cannot know the body's size: one whose
//!   discard was given up by then says `Connection: close`; one still being discarded promises
//!   nothing, and if it is given up later the connection still closes cleanly, after the whole
//!   response (RFC 9112 section 9.5: a server may close a connection at any time).
//! - Lingering close (RFC 9112 section 9.6, nginx's `lingering_close`; `linger`): an HTTP/1
//!   connection the server closes while the client may still be sending is not closed with its
//!   input unread (the kernel would reset it, and the client lose the response). That is one
//!   that ends after an answer the server said `Connection: close` to (above: during a drain, a
//!   body left unread, an HTTP/1.0 body of no known length), or after a refusal (400 for `Host`,
//!   413, 417, a panicked handler's 500), after a discard given up, or after an answer to a head that
//!   could not be parsed (431, 414, 400). So does one closed after a response because the
//!   request or the handler's response asked for it (`Connection: close`, an HTTP/1.0 request
//!   without keep-alive, a CONNECT) when the client's input waits unread then (a request pipelined behind
//!   it, read already or not: one peek at the connection's end, none after the client's EOF was
//!   read): input still on its way then is not waited for, as with nginx's default
//!   `lingering_close on`. Once the response is written (its last byte; the linger shuts the
//!   write side down), the task reads and drops input until the client closes,
//!   `lingering_timeout` passes without input, `lingering_time` in all, or the drain's deadline.
//!   It holds no request state; it is still open on the server's books (it counts toward
//!   `max_connections`, the drain waits for it, and loses nothing when it cuts it). A connection
//!   cut (write stall, drain deadline), idle, cut for a slow head or ended by the client does not
//!   linger, nor does an HTTP/2 one (GOAWAY and hyper's HTTP/2 close).
//! - Responses: HTTP/1 heads are written as hyper's server writes them (`h1::encode`: its header
//!   order, `content-length` from a body of known length, else `transfer-encoding: chunked`, or
//!   on HTTP/1.0 a body that ends with the connection, and `date`), but for `connection`: an
//!   HTTP/1 response after which the connection closes says `connection: close` (to an HTTP/1.0
//!   client too, which hyper does not tell), and `connection: keep-alive` goes to an HTTP/1.0
//!   client only when the connection stays open. A response head hyper would refuse to write (a
//!   `content-length` that is malformed, disagrees with the body's known length or comes with
//!   `transfer-encoding`; a 1xx status other than 101) ends the connection unanswered, and a body
//!   longer or shorter than its `content-length` cuts it.
//! - An HTTP/2 client may have at most 128 streams open on a connection at once
//!   (`SETTINGS_MAX_CONCURRENT_STREAMS`, nginx's default; hyper's is 200).
//! - HTTP versions: httparse knows HTTP/1.0 and 1.1 only, so a higher HTTP/1 minor version
//!   (`HTTP/1.2`, which RFC 9110 section 6.2 would have answered as 1.1, as nginx does) gets 400,
//!   as from Node.
//! - Every request the server answers itself instead of the handler (400 for `Host`, 413, an
//!   HTTP/2 head's 431, and
//!   an HTTP/1 head that could not be parsed: 431 too large, 414 a request line too long, 400
//!   malformed or an HTTP/2 preface) counts once in `responses_by_class` and is reported once to
//!   `Config::on_refused`. A head that could not be parsed has no start time: it is not in the
//!   duration histogram, and it is never in flight. The engine answers it and ends the
//!   connection (`h1::conn`), off the normal path: a good request pays nothing for any of this.
//! - A request whose handler had not answered when its connection ended (the drain deadline or
//!   the write-stall timeout cut it, an HTTP/2 client closed or reset the connection or the
//!   request's stream, a connection error) is reported to
//!   `Config::on_refused` as 499 (nginx's "client closed request"), with its start line, once;
//!   it is not in `responses_by_class` (nothing was sent).
//! - A handler that panics (making its future, or in a poll of it) gets its request a 500 and
//!   `Connection: close`, one error log line, and one report to `Config::on_refused` (its start
//!   line with it: an access log misses no answered request); other requests and connections go
//!   on. For that report (and a 499's, and `on_response`'s) each request keeps its method and
//!   path until its response is done with, only while `on_refused` or `on_response` is set:
//!   clones that share the parsed head's buffer, no allocation.
//! - Each response of the handler is reported once to `Config::on_response` ([`Answered`]),
//!   when it is done with: its body's last byte written, or its connection ended first. Its
//!   body bytes are those the socket took: every data chunk the engine gets carries the
//!   response's `Meter`, which counts what each write advances it by (HTTP/1 queues chunks as
//!   they are, for vectored writes, and advances them only by what a write took: `h1::wire`;
//!   over HTTP/2, h2 copies a payload under 256 bytes into its frame buffer, and it counts then);
//!   the report is the meter's drop, when the body and the last chunk held are gone. It says too whether the
//!   whole body went out (its end reached, every byte taken), so a response cut after its head
//!   is not reported as a complete one. Without the hook the
//!   chunks carry no meter: nothing is allocated.
//! - A `Server` dropped without a drain is not stopped: its tasks serve on while the loop runs
//!   (a Node server nobody references still listens). `drain` is how it stops.
//! - Drain: the listener is dropped at once (new connections are refused), unless it deferred
//!   its accepts (`Accept::stop_deferring`: `TCP_DEFER_ACCEPT`, which holds a client that has
//!   not spoken yet half-open in the kernel, reset when the listener closes): then deferral is
//!   turned off and the drain accepts on, and serves what it takes as below, while the kernel
//!   lists connections to its address not accepted yet (`nodus::net::unaccepted`, looked at
//!   every 30 ms), for at most 1.2 s (a silent client is handed over once it answers the SYN-ACK
//!   retransmitted after about a second) and never past the drain's deadline. None held at the
//!   drain's start: the listener is dropped at once, as without deferral. Every later HTTP/1
//!   response carries `Connection: close` (so a keep-alive client whose next request is already
//!   on the wire gets its answer, then the connection closes); every HTTP/2 connection gets
//!   GOAWAY when the drain begins, one that has sent no request yet too (it is known by its
//!   preface, `HyperIo::sniff_h2`; one whose preface comes later gets it then): its streams in
//!   flight finish, new ones are refused, and it closes once they are done; idle
//!   connections close at their keep-alive timeout, lingering ones when their client closes or
//!   their linger ends; whatever is still open at the deadline is cut.
//!   `Server::drain` returns what the cut lost: the requests whose handler had not answered,
//!   plus one per connection still writing a response (a body still being produced,
//!   or output the peer has not taken). An idle connection cut at the deadline loses nothing.

use std::cell::{Cell, RefCell};
use std::convert::Infallible;
use std::future::{Future, poll_fn};
use std::io;
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::{Pin, pin};
use std::rc::Rc;
use std::task::{Context, Poll, Waker, ready};
use std::time::Duration;

use bytes::Buf;
use http::uri::PathAndQuery;
use http::{HeaderValue, Method, Request, Response, StatusCode, Version};
use hyper::body::Incoming;
use nodus::JoinHandle;
use slab::Slab;

use crate::body::{Body, DISCARD_MAX, RequestBody, Source, text};
use crate::exec::LocalExec;
use crate::h1::conn::{H1Body, H1Conn, H1End, HeadWait};
use crate::h1::head::BodyFraming;
use crate::h1::wire::Wire;
use crate::io::{Activity, FdStream, HyperIo, now_ns};
use crate::linger;
use crate::stats;
use crate::timer::NodusTimer;

/// Server limits and names.
#[derive(Debug, Clone)]
pub struct Config {
    /// Task name of the accept and connection tasks: a handler class such as `http:static`.
    pub name: &'static str,
    /// Largest request head (start line + headers) in bytes; larger gets 431, or 414 when the
    /// request line alone is this long. Over HTTP/2, the largest header list (RFC 9113 section
    /// 6.5.2: each field's name and value plus 32 bytes, pseudo-header fields included); one
    /// over twice this is refused by h2 itself (431, neither counted nor reported). Default
    /// 16 KiB.
    pub max_header_bytes: usize,
    /// Most headers in a request (over HTTP/2, header fields besides the pseudo-header ones);
    /// more gets 431. Default 100.
    pub max_headers: usize,
    /// Largest request body; larger gets 413. Default 1 MiB.
    pub max_body_bytes: usize,
    /// Time allowed for a complete HTTP/1 request head once the connection waits for one. With
    /// `http2`, also for a connection's first bytes to be told from the HTTP/2 preface, counted
    /// from its start, as is its first HTTP/1 head's. (An HTTP/2 head not complete is cut with
    /// its idle connection: `keep_alive_timeout`.) Default 10 s.
    pub header_read_timeout: Duration,
    /// An idle connection (no request in flight, no response body still being produced or written,
    /// no response write waiting on the peer, no I/O; over HTTP/2 no request started or response
    /// ended, whatever else it sends: PINGs, SETTINGS, a request head not yet complete) is closed
    /// after this (an HTTP/2 one after a GOAWAY); the discard of a
    /// request body the handler left unread is given up after this. Default 5 s.
    pub keep_alive_timeout: Duration,
    /// A connection whose response write has made no progress for this long (the peer stopped
    /// reading) is cut, with a reset, requests in flight or not: nginx's `send_timeout`. Over
    /// HTTP/2 a response body waiting on the connection (data h2 holds for the peer's
    /// flow-control window, or a body not yet asked for) with no response body progress for
    /// this long is a stall too, the socket empty or not; a body silent on its own work is not.
    /// Default 60 s.
    pub write_stall_timeout: Duration,
    /// Most open connections. Default 10,000. Set it below what the open-files limit holds,
    /// with room for what a request opens (a file, a backend's socket): at the fd limit a
    /// request that needs one fails (nginx's `worker_connections`, which it warns about when
    /// above the limit).
    pub max_connections: usize,
    /// The longest lingering close: an HTTP/1 connection the server closes while its client may
    /// still be sending (a request body left unread, a refusal, a response during a drain, a
    /// request pipelined behind a `Connection: close`) shuts
    /// down its write side after the response and reads and drops input until the client closes,
    /// for at most this long (and never past a drain's deadline), so that the client reads the
    /// response instead of a reset (nginx's `lingering_time`, 30 s there). Zero: no lingering.
    /// Default 10 s, as long as the header-read timeout and the CLI's drain timeout.
    pub lingering_time: Duration,
    /// A lingering connection that gets no input for this long is closed (nginx's
    /// `lingering_timeout`). Default 5 s, the keep-alive timeout's default, as nginx's.
    pub lingering_timeout: Duration,
    /// The longest a request's body may take to come, from its head (Node's
    /// `server.requestTimeout`; nginx's `client_body_timeout` counts between reads instead):
    /// past it, a handler's read of the body that waits for data fails
    /// ([`BodyError::TimedOut`](crate::BodyError::TimedOut): answer 408) and the body is never
    /// read again; an HTTP/1 response then says `Connection: close` and the connection closes
    /// after it, an HTTP/2 request's stream is reset. A handler that does not read its body is
    /// not cut by it. `None`: no limit. Default 300 s, as Node's.
    pub request_timeout: Option<Duration>,
    /// Also accept HTTP/2 with prior knowledge (h2c): a connection whose first bytes are the
    /// HTTP/2 preface is served by hyper's HTTP/2 server, any other by the HTTP/1 engine as
    /// without it. Default off.
    pub http2: bool,
    /// Called on the loop, once per request the server answers itself instead of the handler
    /// (see [`Refused`]), a handler's panic included, and once per request nobody answered
    /// (499): where an access log writes the lines its handler cannot. Default none.
    pub on_refused: Option<fn(&Refused<'_>)>,
    /// Called on the loop, once per response of the handler, when it is done with: its last
    /// body byte written to the socket, or its connection ended first (see [`Answered`]):
    /// where an access log writes the lines of the requests its handler answered. Default none.
    pub on_response: Option<fn(&Answered<'_>)>,
    /// Put a [`ConnInfo`] in every request's extensions. Default on; a handler that never reads
    /// it can turn it off: the extension costs three allocations per request (about 6 % of the
    /// server's user-space work per keep-alive request, BENCHMARKS.md).
    pub conn_info: bool,
}

impl Config {
    /// Whether each request keeps its start line for a hook's report.
    fn keeps_lines(&self) -> bool {
        self.on_refused.is_some() || self.on_response.is_some()
    }
}

impl Default for Config {
    fn default() -> Config {
        Config {
            name: "http",
            max_header_bytes: 16 * 1024,
            max_headers: 100,
            max_body_bytes: 1024 * 1024,
            header_read_timeout: Duration::from_secs(10),
            keep_alive_timeout: Duration::from_secs(5),
            write_stall_timeout: Duration::from_secs(60),
            max_connections: 10_000,
            lingering_time: Duration::from_secs(10),
            lingering_timeout: Duration::from_secs(5),
            request_timeout: Some(Duration::from_secs(300)),
            http2: false,
            on_refused: None,
            on_response: None,
            conn_info: true,
        }
    }
}

/// What the handler can learn about the connection (in the request's extensions, unless
/// `Config::conn_info` is off).
#[derive(Debug, Clone, Copy)]
pub struct ConnInfo {
    pub peer: Option<SocketAddr>,
}

/// A request the server answered itself, without the handler: an HTTP/1.1 request without
/// `Host`, or an HTTP/1 one with two or an invalid one (400), a `Content-Length` over
/// `max_body_bytes` (413), an HTTP/2 head over the head limits (431), an HTTP/1 head that could
/// not be parsed (431 too large or with too many headers, 414 a request line longer than
/// `max_header_bytes`, 400 malformed, an HTTP version other than 1.0 and 1.1, or an HTTP/2
/// preface to a server without `http2`), or a
/// request whose handler panicked (500). Or one nobody answered: its connection ended while its
/// handler was still at work (cut by the drain deadline or the write-stall timeout, an HTTP/2
/// client's close or reset of the connection or the stream, a connection error), reported with
/// nginx's 499 ("client closed request"), nothing sent. (An HTTP/1 client that closes while its
/// handler works cannot be told from one that half-closed: it is answered.)
#[derive(Debug, Clone, Copy)]
pub struct Refused<'a> {
    pub status: StatusCode,
    pub peer: Option<SocketAddr>,
    /// The request's start line; `None` for a head that could not be parsed.
    pub request: Option<RequestLine<'a>>,
    /// From the loop time of the poll that parsed the head to the refusal, as a request's
    /// duration is counted; `None` for a head that could not be parsed.
    pub elapsed_ns: Option<u64>,
    /// The answer's body bytes: 0 for a head that could not be parsed, a `HEAD` request or a 499.
    pub body_bytes: u64,
}

/// A response of the handler, done with: reported to `Config::on_response` when its last body
/// byte was written to the socket, or when its connection ended first (a client that went away
/// mid-body, a cut), with the status it was sent with, as nginx logs it.
#[derive(Debug, Clone, Copy)]
pub struct Answered<'a> {
    pub status: StatusCode,
    pub peer: Option<SocketAddr>,
    pub request: RequestLine<'a>,
    /// From the loop time of the poll that parsed the head to the response's end: its last body
    /// byte written, or its connection's end (for a response without a body (`HEAD`, 304),
    /// when its head was taken).
    pub elapsed_ns: u64,
    /// The body bytes the socket took (nginx's `$body_bytes_sent`): a write that failed, and
    /// whatever was still held unwritten when the connection ended, count for nothing. Exact
    /// for HTTP/1 (each body chunk is queued and advanced by what each write took); over
    /// HTTP/2 a DATA frame's payload under 256 bytes counts when h2 copies it into its frame
    /// buffer, before it is written.
    pub body_bytes: u64,
    /// Whether the whole body went out: its end was reached and the socket took every byte of
    /// it (always, for an answer without a body: `HEAD`, 204, 304). False for one cut short
    /// (the drain deadline, a write stall, a body that failed, a client that went away), whose
    /// `status` is still the one it was sent with.
    pub complete: bool,
}

/// nginx's status for a request whose client went away before it was answered (none was sent).
fn client_closed_request() -> StatusCode {
    StatusCode::from_u16(499).expect("499 is a valid status code")
}

/// A request's start line.
#[derive(Debug, Clone, Copy)]
pub struct RequestLine<'a> {
    pub method: &'a Method,
    /// The target's path, without the query.
    pub path: &'a str,
    pub version: Version,
}

/// A listener the server can accept connections from.
pub trait Accept: 'static {
    type Stream: FdStream + Unpin + 'static;
    fn poll_accept(
        &self,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<(Self::Stream, Option<SocketAddr>)>>;
    fn local_addr(&self) -> Option<SocketAddr>;
    /// At a drain's start: turns deferred accept (`TCP_DEFER_ACCEPT`) off if it was on, and then
    /// gives the address whose connections the kernel still holds the drain accepts on for (see
    /// the module docs). `None` (the default): the listener did not defer.
    fn stop_deferring(&self) -> Option<SocketAddr> {
        None
    }
}

impl Accept for nodus::net::TcpListener {
    type Stream = nodus::net::TcpStream;

    fn poll_accept(
        &self,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<(Self::Stream, Option<SocketAddr>)>> {
        nodus::net::TcpListener::poll_accept(self, cx).map_ok(|(s, peer)| {
            // Responses are written whole; waiting for ACKs (Nagle) only adds latency.
            let _ = s.set_nodelay(true);
            (s, Some(peer))
        })
    }

    fn local_addr(&self) -> Option<SocketAddr> {
        nodus::net::TcpListener::local_addr(self).ok()
    }

    fn stop_deferring(&self) -> Option<SocketAddr> {
        if !self.defer_accept().ok()? {
            return None;
        }
        self.set_defer_accept(false).ok()?;
        self.local_addr().ok()
    }
}

impl Accept for nodus::net::UnixListener {
    type Stream = nodus::net::UnixStream;

    fn poll_accept(
        &self,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<(Self::Stream, Option<SocketAddr>)>> {
        nodus::net::UnixListener::poll_accept(self, cx).map_ok(|(s, _)| (s, None))
    }

    fn local_addr(&self) -> Option<SocketAddr> {
        None
    }
}

impl Accept for nodus::cluster::Listener {
    type Stream = nodus::cluster::Stream;

    fn poll_accept(
        &self,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<(Self::Stream, Option<SocketAddr>)>> {
        nodus::cluster::Listener::poll_accept(self, cx).map_ok(|(s, peer)| {
            let _ = s.set_nodelay(true);
            (s, Some(peer))
        })
    }

    fn local_addr(&self) -> Option<SocketAddr> {
        nodus::cluster::Listener::local_addr(self).ok()
    }
}

struct State {
    config: Config,
    builders: Builders,
    draining: Cell<bool>,
    deadline: Cell<u64>,
    /// Requests in flight on the connections the drain deadline cut.
    cut_requests: Cell<usize>,
    /// Wakers of connection tasks, to tell them a drain started.
    conns: RefCell<Slab<Option<Waker>>>,
    accept_waker: Cell<Option<Waker>>,
    /// Every `drain` waiting for the last connection to close.
    drained_wakers: RefCell<Vec<Waker>>,
}

impl State {
    /// Counts and reports the answer `status` to a head that could not be parsed.
    #[cold]
    fn head_refused(&self, status: StatusCode, peer: Option<SocketAddr>) {
        stats::request_refused(status);
        if let Some(report) = self.config.on_refused {
            report(&Refused {
                status,
                peer,
                request: None,
                elapsed_ns: None,
                body_bytes: 0,
            });
        }
    }

    /// When a request whose head was parsed at `start` must have its whole body
    /// (`Config::request_timeout`; `u64::MAX`: never).
    fn request_deadline(&self, start: u64) -> u64 {
        self.config.request_timeout.map_or(u64::MAX, |t| {
            start.saturating_add(u64::try_from(t.as_nanos()).unwrap_or(u64::MAX))
        })
    }

    fn wake_accept(&self) {
        if let Some(w) = self.accept_waker.take() {
            w.wake();
        }
    }

    /// The drain's deadline once a drain began; until then, keeps the waker of connection
    /// `key`'s task, which the drain wakes when it begins.
    fn drain_deadline(&self, key: usize, cx: &mut Context<'_>) -> Option<u64> {
        if self.draining.get() {
            return Some(self.deadline.get());
        }
        if let Some(slot) = self.conns.borrow_mut().get_mut(key)
            && !slot.as_ref().is_some_and(|w| w.will_wake(cx.waker()))
        {
            *slot = Some(cx.waker().clone());
        }
        None
    }
}

/// A running server.
///
/// Dropping it does not stop serving: the accept loop and every connection run on (and keep
/// `Runtime::run` alive), as a Node `net.Server` serves until its `close()` whatever becomes of
/// the variable that held it. This is unlike a hyper or axum serve future, which stops when
/// dropped. [`Server::drain`] is the only way to stop it, and a dropped `Server` can no longer
/// be drained: keep it for as long as you may want to stop the server.
pub struct Server {
    state: Rc<State>,
    local_addr: Option<SocketAddr>,
    accept: RefCell<Option<JoinHandle<()>>>,
}

/// Serves `listener` on the current loop: each request goes to `handler`. Its tasks (the accept
/// loop, one per connection, where `handler` runs) carry `config.name` and the location of this
/// call, so a handler that blocks the loop is reported there.
///
/// It serves until [`Server::drain`]: dropping the returned [`Server`] does not stop it (keep
/// the `Server` to be able to drain it).
#[track_caller]
pub fn serve<L, H, F>(listener: L, config: Config, handler: H) -> Server
where
    L: Accept,
    H: Fn(Request<RequestBody>) -> F + 'static,
    F: Future<Output = Response<Body>> + 'static,
{
    let builders = Builders::new(&config);
    let local_addr = listener.local_addr();
    let state = Rc::new(State {
        config,
        builders,
        draining: Cell::new(false),
        deadline: Cell::new(u64::MAX),
        cut_requests: Cell::new(0),
        conns: RefCell::new(Slab::new()),
        accept_waker: Cell::new(None),
        drained_wakers: RefCell::new(Vec::new()),
    });
    let handler = Rc::new(handler);
    let (name, at) = (state.config.name, std::panic::Location::caller());
    let accept = nodus::spawn_named_at(name, at, accept_loop(listener, state.clone(), handler, at));
    Server {
        state,
        local_addr,
        accept: RefCell::new(Some(accept)),
    }
}

impl Server {
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local_addr
    }

    /// Open connections, lingering ones included.
    pub fn connections(&self) -> usize {
        self.state.conns.borrow().len()
    }

    pub fn is_draining(&self) -> bool {
        self.state.draining.get()
    }

    /// Stops accepting and waits until every connection has closed, cutting those still open
    /// after `timeout` (see the module docs for what happens to each kind of connection).
    /// Returns how many requests were in flight on the connections it cut: 0 is a drain that
    /// lost nothing (an idle keep-alive connection cut at the deadline loses no request).
    /// Several drains may wait at once (a signal handler and a cluster's drain request, say):
    /// the first one's deadline stands, and every one returns when the last connection closes.
    pub async fn drain(&self, timeout: Duration) -> usize {
        let state = &self.state;
        if !state.draining.replace(true) {
            // A timeout past what a u64 of nanoseconds holds is no deadline (not one wrapped).
            let timeout = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
            state.deadline.set(now_ns().saturating_add(timeout));
            state.wake_accept();
            let wakers: Vec<Waker> = state
                .conns
                .borrow_mut()
                .iter_mut()
                .filter_map(|(_, w)| w.take())
                .collect();
            wakers.into_iter().for_each(Waker::wake);
        }
        let accept = self.accept.borrow_mut().take();
        if let Some(accept) = accept {
            let _ = accept.await;
        }
        poll_fn(|cx| {
            if state.conns.borrow().is_empty() {
                Poll::Ready(())
            } else {
                let mut wakers = state.drained_wakers.borrow_mut();
                if !wakers.iter().any(|w| w.will_wake(cx.waker())) {
                    wakers.push(cx.waker().clone());
                }
                Poll::Pending
            }
        })
        .await;
        state.cut_requests.get()
    }
}

/// Accepts until a drain; each connection's task is placed at `at` (the `serve` call).
async fn accept_loop<L, H, F>(
    listener: L,
    state: Rc<State>,
    handler: Rc<H>,
    at: &'static std::panic::Location<'static>,
) where
    L: Accept,
    H: Fn(Request<RequestBody>) -> F + 'static,
    F: Future<Output = Response<Body>> + 'static,
{
    // This server's cap is in the loop's stats while it accepts.
    let _cap = stats::Cap::new(state.config.max_connections);
    // At the open-files limit an accept fails every 100 ms (the listener's back-off) and at each
    // new connection: one line, then a count per 10 s.
    let window = nodus::log_limit::WINDOW;
    let emfile = nodus::log_limit::LogLimit::new(window, move |n, last| {
        tracing::warn!(
            target: "nodus::http",
            "{n} more accepts failed in the last {window:?} (the last: {last})"
        );
    });
    let take = |next: Accepted<L>| -> bool {
        match next {
            Ok((stream, peer)) => {
                // On the books now, not when its task first runs: a drain may come first.
                let guard = ConnGuard::open(&state);
                let conn = connection(stream, peer, guard, handler.clone());
                nodus::spawn_named_at(state.config.name, at, conn).detach();
            }
            Err(e) if matches!(e.raw_os_error(), Some(libc_emfile) if libc_emfile == 24 || libc_emfile == 23) =>
            {
                // Out of file descriptors: the listener retries in 100 ms, or at a new connection.
                if emfile.first(|| e.to_string()) {
                    tracing::warn!(
                        target: "nodus::http",
                        "accept failed: {e}; retrying in 100 ms (further failures are counted: \
                         one line per {window:?})"
                    );
                }
            }
            // A listener that can give no more connections (a cluster worker's, after the
            // primary's disconnect): the accept task is done.
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return false,
            Err(e) => tracing::debug!(target: "nodus::http", "accept failed: {e}"),
        }
        true
    };
    while let Some(next) = poll_fn(|cx| poll_next(&listener, &state, false, cx)).await {
        if !take(next) {
            return;
        }
    }
    // Draining. A listener that deferred its accepts holds clients that have not spoken yet:
    // accept on while it does, for as long as the kernel takes to hand over a silent one.
    let Some(addr) = listener.stop_deferring() else {
        return; // dropping the listener refuses new connections
    };
    let end = now_ns()
        .saturating_add(HALF_OPEN_WAIT.as_nanos() as u64)
        .min(state.deadline.get());
    while nodus::net::unaccepted(addr).await.is_ok_and(|n| n > 0) {
        let left = end.saturating_sub(now_ns());
        if left == 0 {
            return;
        }
        let accepting = async {
            while let Some(next) = poll_fn(|cx| poll_next(&listener, &state, true, cx)).await {
                if !take(next) {
                    return;
                }
            }
        };
        let wait = HALF_OPEN_PROBE.min(Duration::from_nanos(left));
        if nodus::timeout(wait, accepting).await.is_ok() {
            return; // the listener gives no more
        }
    }
}

/// The most streams an HTTP/2 client may have open on a connection at once
/// (`SETTINGS_MAX_CONCURRENT_STREAMS`): nginx's default.
const MAX_CONCURRENT_STREAMS: u32 = 128;

/// How long an idle HTTP/2 connection's GOAWAY may take to end it (hyper's graceful shutdown
/// waits for the client's PING ack, which a client may never send) before it is closed.
const IDLE_GOAWAY_GRACE: Duration = Duration::from_secs(1);

/// How long a drain accepts on for the connections a deferring listener holds: the kernel hands
/// over a client that has not spoken once its SYN-ACK, retransmitted after about a second, is
/// answered (deferral being off by then).
const HALF_OPEN_WAIT: Duration = Duration::from_millis(1200);
/// How often it looks whether the kernel still holds any.
const HALF_OPEN_PROBE: Duration = Duration::from_millis(30);

/// What an accept gives: a connection and its peer's address, or the error.
type Accepted<L> = io::Result<(<L as Accept>::Stream, Option<SocketAddr>)>;

/// The listener's next connection; `None` once a drain began, unless `draining_too`.
fn poll_next<L: Accept>(
    listener: &L,
    state: &State,
    draining_too: bool,
    cx: &mut Context<'_>,
) -> Poll<Option<Accepted<L>>> {
    if state.draining.get() && !draining_too {
        return Poll::Ready(None);
    }
    if state.conns.borrow().len() >= state.config.max_connections {
        state.accept_waker.set(Some(cx.waker().clone()));
        return Poll::Pending;
    }
    match listener.poll_accept(cx) {
        Poll::Ready(r) => Poll::Ready(Some(r)),
        Poll::Pending => {
            state.accept_waker.set(Some(cx.waker().clone()));
            Poll::Pending
        }
    }
}

/// A connection on the server's books, from its accept until its task ends (or is dropped
/// without ever running).
struct ConnGuard {
    state: Rc<State>,
    key: usize,
}

impl ConnGuard {
    fn open(state: &Rc<State>) -> ConnGuard {
        stats::connection_opened();
        let key = state.conns.borrow_mut().insert(None);
        ConnGuard {
            state: state.clone(),
            key,
        }
    }
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        self.state.conns.borrow_mut().try_remove(self.key);
        stats::connection_closed();
        self.state.wake_accept();
        if self.state.conns.borrow().is_empty() {
            let wakers = std::mem::take(&mut *self.state.drained_wakers.borrow_mut());
            wakers.into_iter().for_each(Waker::wake);
        }
    }
}

async fn connection<S, H, F>(stream: S, peer: Option<SocketAddr>, guard: ConnGuard, handler: Rc<H>)
where
    S: FdStream + Unpin + 'static,
    H: Fn(Request<RequestBody>) -> F + 'static,
    F: Future<Output = Response<Body>> + 'static,
{
    let (state, key) = (guard.state.clone(), guard.key);
    // Served in a block (not a function of its own, whose future's poll would cost every request
    // a few instructions): the connection and the stream it owns are dropped at its end. It
    // gives a duplicate of the socket's fd when the connection is to linger.
    let lingering = {
        let fd = stream.fd().as_raw_fd();
        let conn_state = Rc::new(ConnState {
            in_flight: Cell::new(0),
            body_left: Cell::new(false),
            linger: Cell::new(false),
            discarding: RefCell::new(None),
            discard_timeout: state.config.keep_alive_timeout,
            streaming: Cell::new(0),
            held: Cell::new(0),
            request_at: Cell::new(now_ns()),
            progress_at: Cell::new(0),
            http2: Cell::new(false),
            peer,
        });
        let service = Service {
            state: state.clone(),
            handler,
            conn: conn_state.clone(),
            _response: PhantomData,
        };
        let (conn, activity) = state.builders.serve(stream, service);
        let mut conn = pin!(conn);
        let mut timer = ConnTimer::new(
            state.config.keep_alive_timeout,
            state.config.write_stall_timeout,
            activity.sniff_by.get(),
        );
        let mut head = HeadWait::Idle;
        let mut drain: Option<nodus::Sleep> = None;
        // Whether GOAWAY was asked of hyper (an HTTP/2 connection, once a drain began or it was
        // found idle).
        let mut goaway = false;
        // An idle HTTP/2 connection's grace for its GOAWAY (`IDLE_GOAWAY_GRACE`).
        let mut idle_grace: Option<nodus::Sleep> = None;
        let end = poll_fn(|cx| {
            loop {
                let http2 = state.builders.http2.as_deref();
                if let Poll::Ready(end) = conn.as_mut().poll(cx, &mut head, http2) {
                    let (ended, answered) = match end {
                        Ended::H1(H1End::Done) => (true, false),
                        Ended::H1(H1End::Refused) => (false, true),
                        Ended::H1(H1End::Failed | H1End::Http2) => (false, false),
                        Ended::H2(Ok(())) => (true, false),
                        Ended::H2(Err(e)) => {
                            tracing::debug!(target: "nodus::http", "connection ended: {e}");
                            (false, false)
                        }
                    };
                    let closing = conn_state.linger.get() || conn_state.body_left.get();
                    // Closed after a response, as the request or the response asked
                    // (`Connection: close`, HTTP/1.0): the client may have sent more behind it.
                    // SAFETY: `conn` owns the stream, open until this block ends.
                    let asked = || input_waiting(unsafe { BorrowedFd::borrow_raw(fd) });
                    let lingers = !activity.h2.get()
                        && (closing || answered || (ended && !activity.eof.get() && asked()));
                    return Poll::Ready(if lingers { End::Linger } else { End::Close });
                }
                if conn_state.poll_discard(cx) {
                    continue; // the connection reads on past the body it was waiting for
                }
                if let Some(deadline_at) = state.drain_deadline(key, cx) {
                    // Known HTTP/2 by its preface, a request or not: GOAWAY at the drain's start
                    // (or at the preface, for one that sends it later), written now.
                    if !goaway && activity.h2.get() {
                        goaway = true;
                        conn.as_mut().shut_down();
                        continue;
                    }
                    let deadline = drain.get_or_insert_with(|| {
                        let now = now_ns();
                        nodus::sleep(Duration::from_nanos(deadline_at.saturating_sub(now)))
                    });
                    if Pin::new(deadline).poll(cx).is_ready() {
                        // The drain deadline cuts it, with what it was answering: a response
                        // it cuts ends with a reset, never a close that could pass for its end
                        // (an HTTP/1.0 body that ends with the connection).
                        let blocked = activity.write_blocked.get();
                        let answering = conn_state.streaming.get() > 0 || blocked;
                        let cut = &state.cut_requests;
                        cut.set(cut.get() + conn_state.in_flight.get() + usize::from(answering));
                        if answering {
                            // SAFETY: `conn` owns the stream, open until this block ends.
                            reset_on_close(unsafe { BorrowedFd::borrow_raw(fd) });
                            return Poll::Ready(End::Reset);
                        }
                        return Poll::Ready(End::Close);
                    }
                }
                match timer.poll(cx, &mut head, &activity, &conn_state) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Fired::HeadExpired) => continue, // the head wait sees it
                    Poll::Ready(Fired::Idle) if !activity.h2.get() => {
                        return Poll::Ready(End::Close);
                    }
                    Poll::Ready(Fired::Idle) => {
                        // HTTP/2: GOAWAY before the close (RFC 9113 section 6.8). hyper's
                        // graceful one closes once the client acks its PING: a grace bounds it.
                        if !goaway {
                            goaway = true;
                            conn.as_mut().shut_down();
                        }
                        let grace =
                            idle_grace.get_or_insert_with(|| nodus::sleep(IDLE_GOAWAY_GRACE));
                        if Pin::new(grace).poll(cx).is_ready() {
                            return Poll::Ready(End::Close);
                        }
                        // The timer fires again at the next poll: hyper's or the grace's wake.
                        return Poll::Pending;
                    }
                    Poll::Ready(Fired::WriteStalled) => {
                        tracing::debug!(
                            target: "nodus::http",
                            "connection cut: no write progress for {:?}",
                            state.config.write_stall_timeout
                        );
                        // SAFETY: `conn` owns the stream, open until this block ends.
                        reset_on_close(unsafe { BorrowedFd::borrow_raw(fd) });
                        return Poll::Ready(End::Reset);
                    }
                }
            }
        })
        .await;
        // SAFETY: `conn` owns the stream, open until this block ends.
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        match end {
            // A duplicate keeps the socket open when the stream is dropped with the
            // connection, at the end of this block.
            End::Linger if !state.config.lingering_time.is_zero() => {
                rustix::io::fcntl_dupfd_cloexec(fd, 0).ok()
            }
            End::Linger | End::Close => {
                // The client reads its EOF now, even when our close is not the socket's last
                // (`End`).
                if !activity.write_shut.get() {
                    let _ = rustix::net::shutdown(fd, rustix::net::Shutdown::Write);
                }
                None
            }
            End::Reset => None,
        }
    };
    if let Some(fd) = lingering {
        let config = &state.config;
        let drain = |cx: &mut Context<'_>| state.drain_deadline(key, cx);
        linger::linger(fd, config.lingering_time, config.lingering_timeout, drain).await;
    }
    // Off the server's books only now: a lingering connection counts, and a drain waits for it.
    drop(guard);
}

/// Whether the client's input waits unread on `fd` (one peek, at the end of a connection closed
/// after a response without an EOF from the client): closed now, it would be a reset.
#[cold]
fn input_waiting(fd: BorrowedFd<'_>) -> bool {
    let flags = rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::DONTWAIT;
    matches!(rustix::net::recv(fd, &mut [0u8; 1], flags), Ok((n, _)) if n > 0)
}

/// Makes the close of `fd` a reset (`SO_LINGER` 0) that discards the output the peer has not
/// taken, instead of leaving the kernel an orphaned socket that holds it as long as the peer acks
/// its window probes. Not a socket (a pipe): a plain close.
#[cold]
fn reset_on_close(fd: BorrowedFd<'_>) {
    let _ = rustix::net::sockopt::set_socket_linger(fd, Some(Duration::ZERO));
}

/// How a connection's task ends it once its engine is done with it.
///
/// Our close of the stream may not be the socket's last: a copy of the fd can live elsewhere (a
/// connection the cluster's primary took back from a stalled worker, whose unread copy waits in
/// that worker's channel; a child that inherited it), and the kernel sends the client its FIN or
/// reset only at the last close. So a close shuts the write side down first, unless hyper did
/// (its own end of a connection: `Activity::write_shut`). A reset cannot be sent that way
/// (`shutdown` sends a FIN, which a cut response could pass for its end): with a copy elsewhere
/// the client gets it when that copy closes.
enum End {
    /// The last response was written while the client may still be sending: it lingers (`linger`).
    Linger,
    /// Closed: hyper ended it, or a timeout or the drain did with nothing unanswered.
    Close,
    /// Cut while answering (the drain deadline, a write stall): a reset (`reset_on_close`).
    Reset,
}

/// What a connection's timer found when it fired.
enum Fired {
    /// The header-read deadline passed: the head wait is now expired.
    HeadExpired,
    /// No request in flight, no response body unfinished, no write waiting and no I/O (over
    /// HTTP/2: no request started or response ended) for the whole keep-alive timeout; or, with
    /// h2c, the connection's first bytes still undecided (they may be the HTTP/2 preface) at the
    /// header-read timeout from its start (`Activity::sniff_by`).
    Idle,
    /// A write has waited on the peer for the whole write-stall timeout.
    WriteStalled,
}

/// How late a connection's timer may fire (1 ms, its granularity).
const SLACK: u64 = 1_000_000;

/// A connection's one timer, for the keep-alive idle timeout, the header-read deadline and the
/// write-stall timeout.
///
/// None is re-armed per request: when it fires it checks them against the activity times and
/// the current `HeadWait` and re-arms for the earliest of what remains (at most a keep-alive
/// timeout away, so that a connection whose write unblocked is checked for idleness again). It
/// is moved earlier only when a new header-read deadline, or the stall deadline of a write that
/// found the socket full, comes more than `SLACK` before it: at most once per firing or per
/// blocked write, since later waits have later deadlines. A write that never blocks costs it
/// nothing.
struct ConnTimer {
    sleep: nodus::Sleep,
    /// When `sleep` is due (`nodus::clock` ns), at or after the time it was armed for.
    at: u64,
    keep_alive: u64,
    write_stall: u64,
}

impl ConnTimer {
    /// A new connection's timer; `sniff_by`: when an h2c connection's first bytes must be
    /// decided (`Activity::sniff_by`).
    fn new(keep_alive: Duration, write_stall: Duration, sniff_by: u64) -> ConnTimer {
        let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let mut timer = ConnTimer {
            sleep: nodus::sleep(1),
            at: 0,
            keep_alive: ns(keep_alive),
            write_stall: ns(write_stall),
        };
        let now = now_ns();
        timer.arm(now.saturating_add(timer.keep_alive).min(sniff_by), now);
        timer
    }

    fn poll(
        &mut self,
        cx: &mut Context<'_>,
        head: &mut HeadWait,
        activity: &Activity,
        conn: &ConnState,
    ) -> Poll<Fired> {
        if let HeadWait::Until(deadline) = *head
            && deadline.saturating_add(SLACK) < self.at
        {
            self.arm(deadline, now_ns());
        }
        if let Some(stall_at) = self.stall_at(activity, conn)
            && stall_at.saturating_add(SLACK) < self.at
        {
            self.arm(stall_at, now_ns());
        }
        while Pin::new(&mut self.sleep).poll(cx).is_ready() {
            let now = now_ns();
            if let HeadWait::Until(deadline) = *head
                && now >= deadline
            {
                *head = HeadWait::Expired;
                self.arm(now.saturating_add(self.keep_alive), now);
                return Poll::Ready(Fired::HeadExpired);
            }
            let recheck = now.saturating_add(self.keep_alive);
            let idle_at = if let Some(stall_at) = self.stall_at(activity, conn) {
                if now >= stall_at {
                    return Poll::Ready(Fired::WriteStalled);
                }
                stall_at.min(recheck)
            } else if conn.in_flight.get() == 0 && conn.streaming.get() == 0 {
                // HTTP/2 is idle by its requests, whatever else it sends (PING, SETTINGS, a
                // request's head not yet complete).
                let since = if activity.h2.get() {
                    conn.request_at.get()
                } else {
                    activity.last_io.get()
                };
                // Bytes that may still be the HTTP/2 preface, trickled, do not keep it either.
                let idle_at = since
                    .saturating_add(self.keep_alive)
                    .min(activity.sniff_by.get());
                if now >= idle_at {
                    return Poll::Ready(Fired::Idle);
                }
                idle_at
            } else {
                recheck
            };
            let next = match *head {
                HeadWait::Until(deadline) => idle_at.min(deadline),
                _ => idle_at,
            };
            self.arm(next, now);
        }
        Poll::Pending
    }

    /// When a write waiting on the peer will have stalled for the write-stall timeout: a socket
    /// write, or an HTTP/2 body held (see [`SentBody`]) with no progress.
    fn stall_at(&self, activity: &Activity, conn: &ConnState) -> Option<u64> {
        let socket = activity
            .write_blocked
            .get()
            .then(|| activity.blocked_since.get());
        let held = (conn.held.get() > 0).then(|| conn.progress_at.get());
        let since = socket.into_iter().chain(held).min()?;
        Some(since.saturating_add(self.write_stall))
    }

    /// Re-arms the sleep for `at`, rounded up to whole milliseconds (the timer queue keeps one
    /// list per distinct delay); a time beyond nodus's longest delay is checked again then.
    fn arm(&mut self, at: u64, now: u64) {
        let longest = nodus::time::MAX_DELAY.as_millis() as u64;
        let delay_ms = at.saturating_sub(now).div_ceil(SLACK).clamp(1, longest);
        self.sleep.reset(Duration::from_millis(delay_ms));
        self.at = now.saturating_add(delay_ms * SLACK);
    }
}

/// How connections are served: HTTP/1 by nodus's own engine (`h1`); with h2c, a connection that
/// begins with the HTTP/2 preface by hyper's HTTP/2 server.
struct Builders {
    limits: crate::h1::head::Limits,
    /// The header-read timeout (ns).
    header_read_timeout: u64,
    /// The most response output an HTTP/1 connection pulls ahead of its socket.
    max_buf: usize,
    http2: Option<Box<hyper::server::conn::http2::Builder<LocalExec>>>,
}

impl Builders {
    fn new(config: &Config) -> Builders {
        // The response body is pulled while less than the head limit (8 KiB at least) waits on
        // the socket, not hyper's default ~400 KiB: a client that stops reading a file pins a
        // chunk or two, not seven 64 KiB ones.
        let max_buf = config.max_header_bytes.max(8192);
        let http2 = config.http2.then(|| {
            let mut b = hyper::server::conn::http2::Builder::new(LocalExec::new(config.name));
            // Heads over the limits are refused in the service (`h2_head_refusal`), counted and
            // reported; h2 refuses those over twice the limit itself (its 431, neither).
            let list_size = config.max_header_bytes.saturating_mul(2);
            // nginx's `http2_max_concurrent_streams` (hyper's default is 200).
            b.timer(NodusTimer)
                .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
                .max_header_list_size(u32::try_from(list_size).unwrap_or(u32::MAX));
            Box::new(b)
        });
        Builders {
            limits: crate::h1::head::Limits {
                max_head_bytes: config.max_header_bytes,
                max_headers: config.max_headers,
            },
            header_read_timeout: u64::try_from(config.header_read_timeout.as_nanos())
                .unwrap_or(u64::MAX),
            max_buf,
            http2,
        }
    }

    /// The connection on `stream`, served by `service`, and what its task sees of its
    /// transfers. With h2c its first bytes are compared with the HTTP/2 preface, and must be
    /// decided (and an HTTP/1 head they begin complete) within the header-read timeout.
    fn serve<S, H, F>(&self, stream: S, service: Service<H, F>) -> (Conn<S, H, F>, Rc<Activity>)
    where
        S: FdStream + Unpin + 'static,
        H: Fn(Request<RequestBody>) -> F + 'static,
        F: Future<Output = Response<Body>> + 'static,
    {
        let wire = Rc::new(Wire::new(stream));
        let activity = wire.activity.clone();
        if self.http2.is_some() {
            activity
                .sniff_by
                .set(now_ns().saturating_add(self.header_read_timeout));
        }
        let conn = H1Conn::new(
            wire,
            service,
            self.limits,
            self.header_read_timeout,
            self.max_buf,
            self.http2.is_some(),
        );
        (Conn::H1(conn), activity)
    }
}

/// hyper's HTTP/2 connection.
type H2Conn<S, H, F> =
    Pin<Box<hyper::server::conn::http2::Connection<HyperIo<S>, Service<H, F>, LocalExec>>>;

/// One connection: HTTP/1, or (h2c) HTTP/2 once its first bytes were the preface.
// The large variant is the common one, and there is one `Conn` per connection task: boxing it
// would add an allocation per connection and save nothing.
#[allow(clippy::large_enum_variant)]
enum Conn<S, H, F>
where
    S: FdStream + Unpin + 'static,
    H: Fn(Request<RequestBody>) -> F + 'static,
    F: Future<Output = Response<Body>> + 'static,
{
    H1(H1Conn<S, H, F>),
    H2(H2Conn<S, H, F>),
    /// Only while an HTTP/1 connection becomes an HTTP/2 one.
    Switching,
}

/// How a connection's engine ended it.
enum Ended {
    H1(H1End),
    H2(Result<(), hyper::Error>),
}

impl<S, H, F> Conn<S, H, F>
where
    S: FdStream + Unpin + 'static,
    H: Fn(Request<RequestBody>) -> F + 'static,
    F: Future<Output = Response<Body>> + 'static,
{
    /// hyper's graceful shutdown of an HTTP/2 connection (GOAWAY). HTTP/1 needs none: during a
    /// drain every response says `Connection: close`.
    fn shut_down(self: Pin<&mut Self>) {
        // SAFETY: a pin projection to the variant's field, which is never moved out.
        if let Conn::H2(c) = unsafe { self.get_unchecked_mut() } {
            c.as_mut().graceful_shutdown();
        }
    }

    /// Serves the connection until it ends; `head` is its HTTP/1 header-read wait. An h2c
    /// connection whose first bytes are the HTTP/2 preface is handed to `http2` with them.
    fn poll(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        head: &mut HeadWait,
        http2: Option<&hyper::server::conn::http2::Builder<LocalExec>>,
    ) -> Poll<Ended> {
        loop {
            // SAFETY: a pin projection to the variant's field, which is never moved out but
            // below, where nothing in it is pinned.
            let poll = match unsafe { self.as_mut().get_unchecked_mut() } {
                Conn::H1(c) => unsafe { Pin::new_unchecked(c) }.poll(cx, head),
                Conn::H2(c) => return c.as_mut().poll(cx).map(Ended::H2),
                Conn::Switching => unreachable!("a connection switching to HTTP/2 is not polled"),
            };
            match ready!(poll) {
                H1End::Http2 => {
                    let http2 = http2.expect("the preface is looked for only with h2c");
                    // SAFETY: an HTTP/1 connection that found the preface has had no request:
                    // its only pinned field (`H1Conn::respond`) is empty, so moving it out of
                    // its place moves nothing pinned.
                    let this = unsafe { self.as_mut().get_unchecked_mut() };
                    let Conn::H1(h1) = std::mem::replace(this, Conn::Switching) else {
                        unreachable!("switched from HTTP/1");
                    };
                    let (stream, activity, read, service) = h1.into_http2();
                    activity.h2.set(true);
                    let io = HyperIo::with_prefix(stream, activity, read);
                    *this = Conn::H2(Box::pin(http2.serve_connection(io, service)));
                }
                end => return Poll::Ready(Ended::H1(end)),
            }
        }
    }
}

pub(crate) struct ConnState {
    /// Requests whose handler has not answered yet.
    in_flight: Cell<usize>,
    /// The current HTTP/1 request's body was let go of before its end and is not discarded
    /// (see [`RequestBody`]), or its discard was given up: the connection closes after the
    /// response, which says `Connection: close` if its head is not written yet.
    pub(crate) body_left: Cell<bool>,
    /// An HTTP/1 response after which the server closes the connection while the client may
    /// still be sending was answered (one the server said `Connection: close` to, or a refusal):
    /// the connection lingers once its last byte is written (`linger`), as it does when it ends
    /// with `body_left`.
    linger: Cell<bool>,
    /// An HTTP/1 request body its handler let go of, read to its end and dropped by the
    /// connection's task so that the connection can serve the next request.
    discarding: RefCell<Option<Discard>>,
    /// How long a discard may take: the keep-alive timeout.
    discard_timeout: Duration,
    /// Answered requests whose body is still being produced or written (see [`SentBody`]),
    /// however small: the connection is not idle while one is (a server-sent-events body may
    /// be silent for long); a client that stops reading it meets the write-stall timeout.
    streaming: Cell<usize>,
    /// HTTP/2 response bodies waiting on the connection, not on their own work: not yet asked
    /// for a frame, or whose last frame was data hyper has not asked past (h2 holds it until the
    /// peer's flow-control window takes it). See [`SentBody`].
    held: Cell<usize>,
    /// Loop time (ns) of the connection's start, its last request's head, or its last response's
    /// end (head and body; set on an HTTP/2 connection only): how its idleness is counted.
    request_at: Cell<u64>,
    /// Loop time (ns) of the last progress of an HTTP/2 response body: a frame asked for, or a
    /// data chunk's bytes taken for a frame.
    progress_at: Cell<u64>,
    http2: Cell<bool>,
    peer: Option<SocketAddr>,
}

/// An unread request body being read and dropped, within its bounds: `DISCARD_MAX` body bytes
/// (`Config::max_body_bytes` too, through `Limited`) and the keep-alive timeout from the moment
/// its handler let go of it.
struct Discard {
    body: http_body_util::Limited<Source>,
    /// Body bytes it may still read.
    left: u64,
    deadline: nodus::Sleep,
}

impl ConnState {
    /// One more (`true`) or one fewer HTTP/2 body held; a first one counts its wait from now.
    fn held_now(&self, held: bool) {
        let n = self.held.get();
        if held {
            if n == 0 {
                self.progress_at.set(now_ns());
            }
            self.held.set(n + 1);
        } else {
            self.held.set(n - 1);
        }
    }

    /// The connection closes while the client's input waits unread (a request pipelined behind
    /// a `Connection: close`): it lingers (`linger`).
    pub(crate) fn linger_on_close(&self) {
        self.linger.set(true);
    }

    /// Whether an unread request body is being read to its end and dropped.
    pub(crate) fn is_discarding(&self) -> bool {
        self.discarding.borrow().is_some()
    }

    /// Takes an unread request body to be read to its end and dropped.
    pub(crate) fn discard(&self, body: http_body_util::Limited<Source>) {
        *self.discarding.borrow_mut() = Some(Discard {
            body,
            left: DISCARD_MAX,
            deadline: nodus::sleep(self.discard_timeout),
        });
    }

    /// Reads what has come of a discarded body; true once it has ended or was given up, false
    /// while more is to come or there is none. A body that goes past its bounds, fails (a
    /// malformed chunk), or is not over by the deadline is given up: dropping it stops the
    /// connection's reads (it never parses the rest as a request), and it closes after the
    /// response, which says `Connection: close` if its head is not written yet.
    fn poll_discard(&self, cx: &mut Context<'_>) -> bool {
        let mut slot = self.discarding.borrow_mut();
        let Some(d) = slot.as_mut() else {
            return false;
        };
        let ended = loop {
            match hyper::body::Body::poll_frame(Pin::new(&mut d.body), cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    let n = frame.data_ref().map_or(0, |b| b.len() as u64);
                    match d.left.checked_sub(n) {
                        Some(left) => d.left = left,
                        None => break false,
                    }
                }
                Poll::Ready(Some(Err(_))) => break false,
                Poll::Ready(None) => break true,
                Poll::Pending if Pin::new(&mut d.deadline).poll(cx).is_ready() => break false,
                Poll::Pending => return false,
            }
        };
        *slot = None;
        if !ended {
            self.body_left.set(true);
        }
        true
    }
}

pub(crate) struct Service<H, F> {
    state: Rc<State>,
    handler: Rc<H>,
    pub(crate) conn: Rc<ConnState>,
    _response: PhantomData<fn() -> F>,
}

impl<H, F> hyper::service::Service<Request<Incoming>> for Service<H, F>
where
    H: Fn(Request<RequestBody>) -> F + 'static,
    F: Future<Output = Response<Body>> + 'static,
{
    type Response = Response<SentBody>;
    type Error = Infallible;
    type Future = Respond<F>;

    fn call(&self, req: Request<Incoming>) -> Respond<F> {
        self.respond(req, HeadFacts::default(), Source::Hyper)
    }
}

impl<H, F> Service<H, F>
where
    H: Fn(Request<RequestBody>) -> F + 'static,
    F: Future<Output = Response<Body>> + 'static,
{
    /// A request parsed by nodus's own HTTP/1 engine, with what its parser found (`h1::head`).
    pub(crate) fn call_h1(&self, req: Request<H1Body>, facts: HeadFacts) -> Respond<F> {
        self.respond(req, facts, Source::Wire)
    }

    /// `facts`: what the head's parser found (refusals answered after a `Host` refusal).
    fn respond<B: hyper::body::Body>(
        &self,
        mut req: Request<B>,
        facts: HeadFacts,
        source: fn(B) -> Source,
    ) -> Respond<F> {
        let start = now_ns();
        stats::request_started();
        self.conn.in_flight.set(self.conn.in_flight.get() + 1);
        self.conn.request_at.set(start);
        let version = req.version();
        if version == Version::HTTP_2 {
            self.conn.http2.set(true);
        }
        let limit = self.state.config.max_body_bytes;
        let (hosts, length) = match facts.parsed {
            Some(parsed) => (Some(parsed.hosts), parsed.content_length()),
            None => (None, content_length(&req)),
        };
        let too_large = length.is_some_and(|len| len > limit as u64);
        let mut line = None;
        let mut note = Note::None;
        let handler = if let Some(refusal) = host_refusal(&req, version, &self.state.config, hosts)
        {
            Err(self.refuse(&req, refusal, start))
        } else if let Some(refusal) = facts.refusal() {
            Err(self.refuse(&req, refusal, start))
        } else if too_large {
            Err(self.refuse(&req, Refusal::TooLarge, start))
        } else {
            if self.state.config.conn_info {
                req.extensions_mut().insert(ConnInfo {
                    peer: self.conn.peer,
                });
            }
            if self.state.config.keeps_lines() {
                line = Some(KeptLine::of(&req));
            }
            // HTTP/1 runs one request at a time per connection: its body reports to it.
            self.conn.body_left.set(false);
            let body_empty = match facts.parsed {
                Some(parsed) => parsed.body == BodyFraming::Empty,
                None => req.body().is_end_stream(),
            };
            let watch = (version < Version::HTTP_2 && !body_empty).then(|| self.conn.clone());
            // A body a `100 Continue` is owed for is never discarded: its client sends it only
            // once asked, so the next request may come instead.
            let discardable = watch.is_some() && !facts.continue_owed;
            let later = set_request_note(&req, version);
            let req = req.map(|b| {
                RequestBody::new(
                    http_body_util::Limited::new(source(b), limit),
                    watch,
                    discardable,
                    self.state.request_deadline(start),
                )
            });
            let handler =
                catch_unwind(AssertUnwindSafe(|| (self.handler)(req))).map_err(|payload| {
                    let refusal = Refusal::handler_panicked(&*payload);
                    self.state
                        .report_unanswered(&self.conn, line.as_ref(), version, start, true);
                    refusal
                });
            // HTTP/1 polls the handler in this task (the connection's), which keeps the note
            // until the response.
            note = match (&handler, later) {
                (Ok(_), None) => Note::Set,
                (Ok(_), Some(later)) => {
                    nodus::task::clear_note();
                    Note::Later(later)
                }
                (Err(_), _) => {
                    nodus::task::clear_note();
                    Note::None
                }
            };
            handler
        };
        Respond {
            handler,
            state: self.state.clone(),
            conn: Some(self.conn.clone()),
            line,
            version,
            start,
            note,
        }
    }

    /// Counts and reports the answer `status` to a head nodus's HTTP/1 engine could not parse.
    #[cold]
    pub(crate) fn head_refused(&self, status: StatusCode) {
        self.state.head_refused(status, self.conn.peer);
    }
}

impl<H, F> Service<H, F> {
    /// Reports `refusal` of `req` (whose head was parsed at `start`) to `Config::on_refused`.
    #[cold]
    fn refuse<B>(&self, req: &Request<B>, refusal: Refusal, start: u64) -> Refusal {
        if let Some(report) = self.state.config.on_refused {
            report(&Refused {
                status: refusal.status(),
                peer: self.conn.peer,
                request: Some(RequestLine {
                    method: req.method(),
                    path: req.uri().path(),
                    version: req.version(),
                }),
                elapsed_ns: Some(nodus::clock::now_ns().saturating_sub(start)),
                body_bytes: refusal.body_bytes(req.method() == Method::HEAD),
            });
        }
        refusal
    }
}

/// The body length a request's `Content-Length` gives; a CONNECT has no body, whatever its head
/// says (`h1::head`).
fn content_length<B>(req: &Request<B>) -> Option<u64> {
    if req.method() == Method::CONNECT {
        return None;
    }
    let value = req.headers().get(http::header::CONTENT_LENGTH)?;
    value.to_str().ok()?.parse::<u64>().ok()
}

/// What an HTTP/1 request's `Host` headers get (RFC 9112 section 3.2): 400 when an HTTP/1.1 one
/// has none, or any has more than one or one that is no `host[:port]`. HTTP/2 has `:authority`;
/// an HTTP/2 head gets what is over the head limits (`h2_head_refusal`).
/// `hosts`: what the HTTP/1 engine's parser found of them (`None`: read from the headers).
fn host_refusal<B>(
    req: &Request<B>,
    version: Version,
    config: &Config,
    hosts: Option<Hosts>,
) -> Option<Refusal> {
    if version == Version::HTTP_2 {
        return h2_head_refusal(req, config);
    }
    match hosts.unwrap_or_else(|| Hosts::of(req.headers())) {
        Hosts::Missing if version == Version::HTTP_11 => Some(Refusal::NoHost),
        Hosts::Missing | Hosts::Valid => None,
        Hosts::Invalid => Some(Refusal::BadHost),
    }
}

/// What an HTTP/1 request's `Host` lines are, as `host_refusal` judges them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Hosts {
    /// None.
    #[default]
    Missing,
    /// One, a valid `host[:port]` (`valid_host`).
    Valid,
    /// One that is not, or more than one.
    Invalid,
}

impl Hosts {
    fn of(headers: &http::HeaderMap) -> Hosts {
        headers
            .get_all(http::header::HOST)
            .iter()
            .fold(Hosts::Missing, |hosts, host| hosts.and(host.as_bytes()))
    }

    /// The lines so far and one more, whose value is `host`.
    pub(crate) fn and(self, host: &[u8]) -> Hosts {
        match self {
            Hosts::Missing if valid_host(host) => Hosts::Valid,
            _ => Hosts::Invalid,
        }
    }
}

/// What an HTTP/2 request's head gets past the head limits: 431 with more than `max_headers`
/// header fields, or a header list (RFC 9113 section 6.5.2: each field's name and value plus 32
/// bytes, the pseudo-header fields too) over `max_header_bytes` (h2 itself refuses one over
/// twice that, `Builders::new`); then 417 for an `expect` other than `100-continue`.
fn h2_head_refusal<B>(req: &Request<B>, config: &Config) -> Option<Refusal> {
    let headers = req.headers();
    if headers.len() > config.max_headers {
        return Some(Refusal::HeadTooLarge);
    }
    let field = |name: &str, value: Option<&str>| value.map_or(0, |v| name.len() + v.len() + 32);
    let uri = req.uri();
    let pseudo = field(":method", Some(req.method().as_str()))
        + field(":scheme", uri.scheme_str())
        + field(":authority", uri.authority().map(|a| a.as_str()))
        + field(":path", uri.path_and_query().map(|pq| pq.as_str()));
    let size = headers.iter().fold(pseudo, |size, (name, value)| {
        size + name.as_str().len() + value.len() + 32
    });
    if size > config.max_header_bytes {
        return Some(Refusal::HeadTooLarge);
    }
    // Node's HTTP/2 compatibility layer with no `checkExpectation` listener: an `expect` that
    // is not exactly `100-continue` (several lines, joined, are not) gets 417.
    let mut expect = headers.get_all(http::header::EXPECT).iter();
    match (expect.next(), expect.next()) {
        (None, _) => None,
        (Some(v), None) if v == "100-continue" => None,
        _ => Some(Refusal::ExpectationFailed),
    }
}

/// Whether `v` is RFC 9110's `Host` value: `uri-host [ ":" port ]`, where `uri-host` is an IP
/// literal in brackets or a reg-name (unreserved, sub-delims, percent escapes; an IPv4 address is
/// one), possibly empty, and `port` is digits, possibly none.
fn valid_host(v: &[u8]) -> bool {
    if v.first() == Some(&b'[') {
        return valid_ip_literal_host(v);
    }
    // A reg-name up to the first colon, then the port.
    let mut i = 0;
    while let Some(&b) = v.get(i) {
        if HOST_CHAR[b as usize] {
            i += 1;
            continue;
        }
        match b {
            b'%' if is_escape(&v[i..]) => i += 3,
            b':' => return v[i + 1..].iter().all(u8::is_ascii_digit),
            _ => return false,
        }
    }
    true
}

/// `valid_host` of a value that begins with `[`: an IP literal in brackets, then the port.
#[cold]
fn valid_ip_literal_host(v: &[u8]) -> bool {
    let Some((host, port)) = v[1..]
        .iter()
        .position(|&b| b == b']')
        .map(|end| v[1..].split_at(end))
    else {
        return false;
    };
    let port = &port[1..];
    let mut i = 0;
    while let Some(&b) = host.get(i) {
        match b {
            b'%' if is_escape(&host[i..]) => i += 3,
            b':' => i += 1,
            _ if HOST_CHAR[b as usize] => i += 1,
            _ => return false,
        }
    }
    !host.is_empty()
        && port
            .strip_prefix(b":")
            .map_or(port.is_empty(), |p| p.iter().all(u8::is_ascii_digit))
}

/// Whether `s` begins with a percent escape: `%` and two hex digits.
fn is_escape(s: &[u8]) -> bool {
    s.get(1..3)
        .is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit))
}

/// RFC 3986's unreserved and sub-delims characters, by byte: one load per byte of a `Host`
/// checked on every request.
static HOST_CHAR: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        table[b] = c.is_ascii_alphanumeric();
        b += 1;
    }
    let extra = b"-._~!$&'()*+,;=";
    let mut i = 0;
    while i < extra.len() {
        table[extra[i] as usize] = true;
        i += 1;
    }
    table
};

/// A request's start line, kept (while `Config::on_refused` or `Config::on_response` is set)
/// for the report of its handler's panic, or of its response once done with: the handler owns
/// the request by then. Cloned from the parsed request, whose buffer the path shares (no
/// allocation; a method is inline up to 15 bytes).
struct KeptLine {
    method: Method,
    /// `None` for a target without a path (authority form), whose path is `""` as in `Uri::path`.
    path: Option<PathAndQuery>,
}

impl KeptLine {
    fn of<B>(req: &Request<B>) -> KeptLine {
        KeptLine {
            method: req.method().clone(),
            path: req.uri().path_and_query().cloned(),
        }
    }

    fn line(&self, version: Version) -> RequestLine<'_> {
        RequestLine {
            method: &self.method,
            path: self.path.as_ref().map_or("", PathAndQuery::path),
            version,
        }
    }
}

impl State {
    /// Reports to `Config::on_refused` the request whose handler did not answer: the 500 that
    /// stands in for a panicked handler's response (`panicked`), or the 499 of one whose
    /// connection ended first. With the request's start line (`line`, kept whenever
    /// `on_refused` is set).
    #[cold]
    fn report_unanswered(
        &self,
        conn: &ConnState,
        line: Option<&KeptLine>,
        version: Version,
        start: u64,
        panicked: bool,
    ) {
        if let Some(report) = self.config.on_refused {
            let (status, body_bytes) = if panicked {
                let head = line.is_some_and(|l| l.method == Method::HEAD);
                let refusal = Refusal::HandlerPanicked;
                (refusal.status(), refusal.body_bytes(head))
            } else {
                (client_closed_request(), 0)
            };
            report(&Refused {
                status,
                peer: conn.peer,
                request: line.map(|l| l.line(version)),
                elapsed_ns: Some(nodus::clock::now_ns().saturating_sub(start)),
                body_bytes,
            });
        }
    }
}

/// What nodus's HTTP/1 engine found in a request's head that the server acts on (all false for
/// hyper's HTTP/2 requests).
#[derive(Clone, Copy, Default)]
pub(crate) struct HeadFacts {
    /// Framing Node refuses (`RequestHead::framing_refused`): 400.
    pub(crate) framing_refused: bool,
    /// An `Expect` Node answers 417 (`RequestHead::expectation_failed`).
    pub(crate) expectation_failed: bool,
    /// The request's body waits for a `100 Continue` (`RequestHead::expect_continue`, a body
    /// there): it is never discarded.
    pub(crate) continue_owed: bool,
    /// What the HTTP/1 engine's parser found of the head; `None` (hyper's requests): read
    /// from the request's headers.
    pub(crate) parsed: Option<Parsed>,
}

/// What nodus's HTTP/1 parser found that the server would otherwise read from a request's
/// headers.
#[derive(Clone, Copy)]
pub(crate) struct Parsed {
    /// The `Host` lines (`RequestHead::hosts`).
    pub(crate) hosts: Hosts,
    /// How the body is framed (`RequestHead::body`).
    pub(crate) body: BodyFraming,
}

impl Parsed {
    /// The body's `Content-Length`, unless 0 (a CONNECT's is none). The head's framing is
    /// refused before it is looked at when its lengths differ or come with
    /// `Transfer-Encoding`.
    fn content_length(self) -> Option<u64> {
        match self.body {
            BodyFraming::Length(n) => Some(n),
            BodyFraming::Empty | BodyFraming::Chunked => None,
        }
    }
}

impl HeadFacts {
    /// The refusal the head calls for, if any.
    fn refusal(self) -> Option<Refusal> {
        if self.framing_refused {
            Some(Refusal::BadFraming)
        } else if self.expectation_failed {
            Some(Refusal::ExpectationFailed)
        } else {
            None
        }
    }
}

/// A request answered without a response from the handler. Either way an HTTP/1 connection
/// closes after the answer, as Node's does (over HTTP/2 the stream ends with it).
#[derive(Clone, Copy)]
enum Refusal {
    /// An HTTP/1.1 request with no `Host` header (RFC 9112 section 3.2; Node's
    /// `requireHostHeader`): 400.
    NoHost,
    /// More than one `Host` header, or one whose value is no `host[:port]` (RFC 9112 section
    /// 3.2): 400.
    BadHost,
    /// Framing Node refuses (`framing_refused`): a bare line feed in the head, `Content-Length`
    /// twice or with `Transfer-Encoding`, `chunked` twice: 400. Its body is never read.
    BadFraming,
    /// An HTTP/1.1 `Expect` that names no `100-continue` (`expectation_failed`), or an HTTP/2
    /// `expect` other than exactly `100-continue` (`h2_head_refusal`; Node's answer with
    /// no `checkExpectation` listener): 417. Its body is never read.
    ExpectationFailed,
    /// A `Content-Length` over `max_body_bytes`: 413, and the unread body is still on the wire.
    TooLarge,
    /// An HTTP/2 head over the head limits (`h2_head_refusal`): 431. (HTTP/1's are hyper's.)
    HeadTooLarge,
    /// The handler panicked (logged): 500. The rest of the server runs on.
    HandlerPanicked,
}

impl Refusal {
    /// Logs a handler's panic (`payload`) once, as an error; the refusal to answer with.
    #[cold]
    fn handler_panicked(payload: &(dyn std::any::Any + Send)) -> Refusal {
        let message = payload
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
            .unwrap_or("<non-string payload>");
        tracing::error!(
            target: "nodus::http",
            "a request handler panicked: {message}; answered 500 and closed the connection"
        );
        Refusal::HandlerPanicked
    }

    fn status(self) -> StatusCode {
        match self {
            Refusal::NoHost | Refusal::BadHost | Refusal::BadFraming => StatusCode::BAD_REQUEST,
            Refusal::ExpectationFailed => StatusCode::EXPECTATION_FAILED,
            Refusal::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Refusal::HeadTooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            Refusal::HandlerPanicked => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn message(self) -> &'static str {
        match self {
            Refusal::NoHost => "an HTTP/1.1 request needs a Host header\n",
            Refusal::BadHost => "a request may have one Host header, a valid host[:port]\n",
            Refusal::BadFraming => "bad request framing\n",
            Refusal::ExpectationFailed => "expectation failed\n",
            Refusal::TooLarge => "request body too large\n",
            Refusal::HeadTooLarge => "request header fields too large\n",
            Refusal::HandlerPanicked => "internal server error\n",
        }
    }

    /// The body bytes of the answer (none to a `HEAD` request).
    fn body_bytes(self, head: bool) -> u64 {
        if head { 0 } else { self.message().len() as u64 }
    }

    fn response(self) -> Response<Body> {
        let mut r = text(self.status(), self.message());
        r.headers_mut()
            .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
        r
    }
}

/// The note (`nodus::task::set_note_prefixed`) that names a request to the watchdog and the
/// slow-poll log while its handler runs: `METHOD PATH`, the path without the query (which may
/// hold secrets); nodus cuts it to 64 bytes on a char boundary and escapes control characters
/// when it shows it. For a common method, a static prefix (`"GET "`) and the path, so that only
/// the path is copied (into the loop's watchdog slot); `None` for another method.
fn request_note<B>(req: &Request<B>) -> Option<(&'static str, &str)> {
    let path = req.uri().path();
    let prefix = match *req.method() {
        Method::GET => "GET ",
        Method::POST => "POST ",
        Method::HEAD => "HEAD ",
        Method::PUT => "PUT ",
        Method::DELETE => "DELETE ",
        Method::PATCH => "PATCH ",
        Method::OPTIONS => "OPTIONS ",
        Method::CONNECT => "CONNECT ",
        Method::TRACE => "TRACE ",
        _ => return None,
    };
    // An authority-form target (`CONNECT host:port`) has no path.
    Some((
        if path.is_empty() {
            prefix.trim_end()
        } else {
            prefix
        },
        path,
    ))
}

/// Sets `req`'s note on the current task (`request_note`; a method of its own is copied with
/// the path). For HTTP/2, whose handler runs in the stream's own task, returns it for that task.
#[inline]
fn set_request_note<B>(req: &Request<B>, version: Version) -> Option<Box<str>> {
    match request_note(req) {
        Some((prefix, path)) => {
            nodus::task::set_note_prefixed(prefix, path);
            (version >= Version::HTTP_2).then(|| format!("{prefix}{path}").into())
        }
        None => other_method_note(req, version),
    }
}

#[cold]
fn other_method_note<B>(req: &Request<B>, version: Version) -> Option<Box<str>> {
    let note = format!("{} {}", req.method(), req.uri().path());
    nodus::task::set_note(&note);
    (version >= Version::HTTP_2).then(|| note.into())
}

/// Where a request's note is (see [`request_note`]).
enum Note {
    /// None: a refusal, or the handler is done.
    None,
    /// Set on the task polling the handler (an HTTP/1 connection's), to clear when it is done.
    Set,
    /// To set on the first poll, in an HTTP/2 stream's task.
    Later(Box<str>),
}

/// One request's response: the handler's future (or the refusal that stands in for it), then
/// what the server adds to the head, and the request's accounting.
///
/// A request counts from the loop time of the poll that parsed its head to its response head
/// (or to its abandonment: dropped unanswered when the connection was cut).
pub(crate) struct Respond<F> {
    /// Structurally pinned: polled in place, never moved out.
    handler: Result<F, Refusal>,
    state: Rc<State>,
    /// Taken when the response is ready.
    conn: Option<Rc<ConnState>>,
    /// The start line, for `Config::on_refused` should the handler panic, and for
    /// `Config::on_response` (set only with one of them).
    line: Option<KeptLine>,
    version: Version,
    start: u64,
    /// The request's note, set while the handler runs.
    note: Note,
}

impl<F: Future<Output = Response<Body>>> Future for Respond<F> {
    type Output = Result<Response<SentBody>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // SAFETY: only `handler` is pinned, and it is polled in place and never moved out;
        // every other field is plain data, moved or replaced freely.
        let this = unsafe { self.get_unchecked_mut() };
        assert!(
            this.conn.is_some(),
            "nodus-http: Respond polled after completion"
        );
        if let Note::Later(note) = &this.note {
            nodus::task::set_note(note);
            this.note = Note::Set;
        }
        // Whether the handler made the response (not a refusal standing in for it).
        let (mut resp, by_handler) = match &mut this.handler {
            Ok(f) => {
                // SAFETY: see above.
                let f = unsafe { Pin::new_unchecked(f) };
                let poll = catch_unwind(AssertUnwindSafe(|| f.poll(cx)));
                if poll.as_ref().is_ok_and(Poll::is_pending) {
                    return Poll::Pending;
                }
                // The handler is done (answered or panicked): the request no longer holds the loop.
                if let Note::Set = std::mem::replace(&mut this.note, Note::None) {
                    nodus::task::clear_note();
                }
                match poll {
                    Ok(poll) => (ready!(poll), true),
                    // Never polled again: this future completes now.
                    Err(payload) => {
                        let refusal = Refusal::handler_panicked(&*payload);
                        if let Some(conn) = &this.conn {
                            let line = this.line.as_ref();
                            this.state.report_unanswered(
                                conn,
                                line,
                                this.version,
                                this.start,
                                true,
                            );
                        }
                        (refusal.response(), false)
                    }
                }
            }
            Err(refusal) => (refusal.response(), false),
        };
        if this.version < Version::HTTP_2 {
            let body_left = this.conn.as_ref().is_some_and(|c| c.body_left.take());
            let close = this.state.draining.get()
                || body_left
                || (this.version == Version::HTTP_10 && close_delimited(&resp));
            if close {
                resp.headers_mut()
                    .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
                if this.version == Version::HTTP_10 {
                    // An HTTP/1.0 client is answered in its version when the connection
                    // closes.
                    *resp.version_mut() = Version::HTTP_10;
                }
            }
            // The server closes the connection after this answer (a refusal's says so too):
            // the client may still be sending the request's body, or a next request.
            if (close || !by_handler)
                && let Some(conn) = &this.conn
            {
                conn.linger.set(true);
            }
        }
        let (mut meter, mut streaming, mut held) = (None, None, false);
        if let Some(conn) = this.conn.take() {
            conn.in_flight.set(conn.in_flight.get() - 1);
            // Only an HTTP/2 connection's idleness counts from its requests (HTTP/1: its bytes).
            if conn.http2.get() {
                conn.request_at.set(now_ns());
            }
            if let (Some(report), Some(line), true) =
                (this.state.config.on_response, this.line.take(), by_handler)
            {
                meter = Some(Rc::new(Meter {
                    report,
                    status: resp.status(),
                    peer: conn.peer,
                    line,
                    version: this.version,
                    start: this.start,
                    written: Cell::new(0),
                    handed: Cell::new(0),
                    ended: Cell::new(false),
                }));
            }
            if !resp.body().is_end_stream() {
                conn.streaming.set(conn.streaming.get() + 1);
                if conn.http2.get() {
                    // Waiting on the connection until hyper first asks for a frame.
                    conn.held_now(true);
                    held = true;
                }
                streaming = Some(conn);
            }
        }
        let ns = nodus::clock::now_ns().saturating_sub(this.start);
        stats::request_finished(resp.status(), ns);
        Poll::Ready(Ok(resp.map(|inner| SentBody {
            inner,
            meter,
            streaming,
            held,
        })))
    }
}

/// A response body as hyper takes it: each data chunk carries its response's [`Meter`], if any,
/// which counts what each write takes of it.
///
/// Every body not empty from the start counts in its connection's `streaming` until it is
/// dropped (written out, or abandoned with the connection): the connection is not idle while
/// the body waits on the server's own work (a file chunk read on a swamped I/O pool, a
/// server-sent-events body silent for long), and a drain deadline cutting it knows it cut a
/// response. Small bodies of an exact length count too: one that needs a later loop turn for
/// its data (a 6-byte file read on the pool) leaves its head written and its connection quiet.
///
/// An HTTP/2 body also counts in its connection's `held` while it waits on the connection
/// rather than on its own work: until hyper first asks for a frame, and from each data frame it
/// gives until hyper asks for the next (hyper asks only once h2's flow-control window has room).
/// A connection with a body held and no progress (a frame asked for, a chunk's bytes taken) for
/// the write-stall timeout is cut, as one whose socket write waits that long: a peer that
/// never opens its window (`SETTINGS_INITIAL_WINDOW_SIZE` 0, no `WINDOW_UPDATE`) stalls the
/// write with the socket empty. A body silent on its own work (server-sent events) is not held.
/// (HTTP/1 needs none of this: its engine pulls the next chunk once the socket took enough.)
pub(crate) struct SentBody {
    inner: Body,
    meter: Option<Rc<Meter>>,
    /// The connection whose `streaming` counts this body.
    streaming: Option<Rc<ConnState>>,
    /// It counts in its (HTTP/2) connection's `held`.
    held: bool,
}

impl Drop for SentBody {
    fn drop(&mut self) {
        // A body is dropped without being asked for its end once it says it is at it.
        if let Some(meter) = &self.meter
            && self.inner.is_end_stream()
        {
            meter.ended.set(true);
        }
        if let Some(conn) = &self.streaming {
            conn.streaming.set(conn.streaming.get() - 1);
            if conn.http2.get() {
                conn.request_at.set(now_ns());
            }
            if self.held {
                conn.held_now(false);
            }
        }
    }
}

impl hyper::body::Body for SentBody {
    type Data = SentChunk;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<SentChunk>, io::Error>>> {
        let this = self.get_mut();
        let poll = this.inner.as_mut().poll_frame(cx);
        if let Some(conn) = &this.streaming
            && conn.http2.get()
        {
            // Held from a data frame until hyper asks past it; not while the body works.
            let held = matches!(&poll, Poll::Ready(Some(Ok(f))) if f.is_data());
            if held != this.held {
                this.held = held;
                conn.held_now(held);
            }
            conn.progress_at.set(now_ns());
        }
        let frame = ready!(poll);
        if let Some(meter) = &this.meter {
            match &frame {
                None => meter.ended.set(true),
                Some(Ok(f)) => {
                    let len = f.data_ref().map_or(0, |d| d.len() as u64);
                    meter.handed.set(meter.handed.get() + len);
                }
                Some(Err(_)) => {}
            }
        }
        Poll::Ready(frame.map(|f| {
            f.map(|f| {
                f.map_data(|bytes| SentChunk {
                    bytes,
                    meter: this.meter.clone(),
                    progress: this.streaming.as_ref().filter(|c| c.http2.get()).cloned(),
                })
            })
        }))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// A response body chunk on its way to the socket. HTTP/1 writes queue it as it is (`h1::wire`:
/// vectored, never copied) and advance it by what each write took: what it counts is what the
/// socket took.
pub(crate) struct SentChunk {
    bytes: bytes::Bytes,
    meter: Option<Rc<Meter>>,
    /// An HTTP/2 connection, whose `progress_at` each advance moves.
    progress: Option<Rc<ConnState>>,
}

impl Buf for SentChunk {
    fn remaining(&self) -> usize {
        self.bytes.len()
    }

    fn chunk(&self) -> &[u8] {
        &self.bytes
    }

    fn advance(&mut self, n: usize) {
        self.bytes.advance(n);
        if let Some(meter) = &self.meter {
            meter.written.set(meter.written.get() + n as u64);
        }
        if let Some(conn) = &self.progress {
            conn.progress_at.set(now_ns());
        }
    }
}

/// One response's account for `Config::on_response`, shared by its body and the chunks still
/// queued: reported when the last of them is dropped (the body done with and every chunk written,
/// or dropped unwritten with the connection).
pub(crate) struct Meter {
    report: fn(&Answered<'_>),
    status: StatusCode,
    peer: Option<SocketAddr>,
    line: KeptLine,
    version: Version,
    start: u64,
    /// Body bytes the socket took.
    written: Cell<u64>,
    /// Body bytes handed to the connection.
    handed: Cell<u64>,
    /// The body reached its end (not cut short, not failed).
    ended: Cell<bool>,
}

impl Meter {
    /// An answer sent with no body.
    fn bodiless(&self) -> bool {
        *self.line.line(self.version).method == Method::HEAD
            || matches!(
                self.status,
                StatusCode::NO_CONTENT | StatusCode::NOT_MODIFIED
            )
    }
}

impl Drop for Meter {
    fn drop(&mut self) {
        (self.report)(&Answered {
            status: self.status,
            peer: self.peer,
            request: self.line.line(self.version),
            elapsed_ns: nodus::clock::now_ns().saturating_sub(self.start),
            body_bytes: self.written.get(),
            complete: self.bodiless()
                || (self.ended.get() && self.written.get() == self.handed.get()),
        });
    }
}

/// Whether an HTTP/1.0 client could tell where `resp`'s body ends only by the connection's close:
/// no `Content-Length`, and a body neither empty nor of a known length (that one is given its
/// length). HTTP/1.0 has no chunked coding, so such a response must end its connection
/// (nginx: no keep-alive for it), and says so rather than answer a keep-alive request with
/// `Connection: keep-alive`.
fn close_delimited(resp: &Response<Body>) -> bool {
    let body = resp.body();
    !resp.headers().contains_key(http::header::CONTENT_LENGTH)
        && !body.is_end_stream()
        && body.size_hint().exact().is_none()
}

impl<F> Drop for Respond<F> {
    fn drop(&mut self) {
        if let Note::Set = self.note {
            nodus::task::clear_note();
        }
        if let Some(conn) = &self.conn {
            stats::request_abandoned();
            // Its HTTP/2 connection may live on (a stream reset): no longer in flight there.
            conn.in_flight.set(conn.in_flight.get() - 1);
            conn.request_at.set(now_ns());
            // A refusal was reported when it was made.
            if self.handler.is_ok() {
                let line = self.line.as_ref();
                self.state
                    .report_unanswered(conn, line, self.version, self.start, false);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_is_a_reg_name_or_an_ip_literal_with_an_optional_port() {
        for good in [
            "",
            "example.com",
            "127.0.0.1:8080",
            "a%2Fb",
            "x:",
            "[::1]",
            "[::1]:443",
            "[v1.x]:",
        ] {
            assert!(valid_host(good.as_bytes()), "{good}");
        }
        for bad in [
            "a b", "a/b", "%2", "%zz", "x:8a", "x:1:2", "[]", "[::1", "[::1]x", "[::1]:a", "[%]",
        ] {
            assert!(!valid_host(bad.as_bytes()), "{bad}");
        }
    }

    #[test]
    fn a_request_note_is_method_and_path_without_the_query() {
        let note = |method: &str, target: &str| {
            let req = Request::builder()
                .method(method)
                .uri(target)
                .body(())
                .unwrap();
            match request_note(&req) {
                Some((prefix, path)) => format!("{prefix}{path}"),
                None => "(other)".to_owned(),
            }
        };
        assert_eq!(note("GET", "/slow/thing?secret=1"), "GET /slow/thing");
        assert_eq!(note("POST", "http://example.com/a?b"), "POST /a");
        assert_eq!(note("OPTIONS", "*"), "OPTIONS *");
        assert_eq!(note("CONNECT", "example.com:443"), "CONNECT");
        assert_eq!(
            note("PURGE", "/x"),
            "(other)",
            "copied whole by other_method_note"
        );
    }
}
