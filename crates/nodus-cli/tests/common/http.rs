//! The testkit's HTTP/1.1 client with this crate's bounds: one request per connection, 5 s to
//! connect, 20 s per read or write.

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

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

/// `GET path`, retried until it answers 200 (20 s at most): the body.
pub fn get_ok(addr: SocketAddr, path: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match try_request(addr, "GET", path, &[]) {
            Ok(r) if r.status == 200 => return String::from_utf8(r.body).unwrap(),
            other if Instant::now() > deadline => {
                panic!("GET {path}: {:?}", other.map(|r| r.status))
            }
            _ => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}
