//! A public-facing HTTP/1.1 and HTTP/2 server on the nodus event loop: HTTP/1 by nodus's own
//! engine (`h1`: httparse heads, `http` types), HTTP/2 by hyper 1.x.
//!
//! - `h1`: nodus's HTTP/1 engine: a request head parsed out of the connection's buffer with
//!   Node's refusals (`h1::head`), chunked request bodies (`h1::chunked`), response heads as
//!   hyper writes them (`h1::encode`), the connection's socket and output queue (`h1::wire`),
//!   and the connection itself (`h1::conn`).
//! - `io`: hyper's `Read`/`Write` over nodus streams (HTTP/2), reading straight into hyper's
//!   uninitialized buffer (no zeroing, no copy) and counting bytes.
//! - `timer`, `exec`: hyper's timer on nodus timers, and a local executor for HTTP/2 streams.
//! - `server`: `serve(listener, config, handler)` with the limits a public server needs (header
//!   bytes and count → 431, a request line alone over the header bytes → 414, body size → 413,
//!   header-read timeout against slowloris, keep-alive idle timeout, write-stall timeout against
//!   a client that stops reading, max connections) and a graceful drain with a deadline. A
//!   handler learns its peer from the request's extensions
//!   (`req.extensions().get::<ConnInfo>()`, unless `Config::conn_info` is off); any [`Accept`]
//!   listener can be served (nodus's `TcpListener`, `UnixListener`, a cluster worker's
//!   `Listener`). A request the server refuses
//!   before the handler (400, 413, 414, 431), or answers with a 500 because the handler panicked,
//!   is counted and reported to `Config::on_refused` ([`Refused`]), and so is one whose
//!   connection ended before its handler answered (499, nginx's "client closed request"; not
//!   counted: nothing was sent); every answer of the handler is
//!   reported to `Config::on_response` ([`Answered`]) once done with, with the body bytes the
//!   socket took and whether its whole body went out. A request body the handler left unread is
//!   discarded (a chunked one, or up to 64 KiB of known length; within 64 KiB and the keep-alive
//!   timeout) so the connection serves on. An HTTP/1 response after which the connection will close says `Connection: close`.
//! - `linger`: the lingering close of an HTTP/1 connection the server closes while its client may
//!   still be sending (a body left unread, a refusal, a drain): the write side shut down after
//!   the response, input read and dropped until the client closes, within
//!   `Config::lingering_timeout` between reads and `Config::lingering_time` in all, so that the
//!   client reads the response instead of a reset.
//! - `stats`: HTTP measurements, folded into the loop's `nodus::metrics::Snapshot`.
//!
//! Connections run as tasks named by handler class (`Config::name`, e.g. `http:static`), never by
//! peer, so per-name measurements stay bounded; the request a handler serves (`GET /path`, no
//! query) is its task's note while it runs (`nodus::task::set_note`), so a handler that blocks
//! the loop is reported by its route.

pub mod body;
mod exec;
mod h1;
pub mod io;
mod linger;
pub mod server;
pub mod stats;
mod timer;

pub use body::{
    Body, BodyError, RequestBody, RequestTimedOut, boxed, collect_body, empty, full, text,
};
pub use exec::LocalExec;
pub use io::{FdStream, HyperIo};
pub use server::{Accept, Answered, Config, ConnInfo, Refused, RequestLine, Server, serve};
pub use stats::{fill_snapshot, snapshot};
pub use timer::NodusTimer;
