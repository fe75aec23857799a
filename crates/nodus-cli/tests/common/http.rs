//! The testkit's HTTP/1.1 client with this crate's bounds: one request per connection, 5 s to
//! connect, 20 s per read or write.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use nodus_testkit::http::{self, Reply, Timeouts};

const TIMEOUTS: Timeouts = Timeouts {
    connect: Duration::from_secs(5),
    io: Duration::from_secs(20),
};

/// `GET path`; see [`request`].
pub fn get(addr: SocketAddr, path: &str) -> Reply {
    request(addr, "GET", path, &[])
}

/// Sends one request (`extra`: raw header lines) and reads the response (none for `HEAD`); an
/// I/O error fails the test.
pub fn request(addr: SocketAddr, method: &str, path: &str, extra: &[&str]) -> Reply {
    try_request(addr, method, path, extra)
        .unwrap_or_else(|e| panic!("{method} {path} to {addr}: {e}"))
}

/// [`request`], with I/O errors (a server not listening yet) returned.
pub fn try_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    extra: &[&str],
) -> io::Result<Reply> {
    http::request(addr, TIMEOUTS, method, path, extra)
}
