//! A minimal HTTP/1.1 client: one request per connection (`Connection: close`), the response
//! read by its `Content-Length`, chunked, or to EOF. Bounded: 5 s to connect, 20 s per read.

use std::io::{self, BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

pub struct Reply {
    pub status: u16,
    /// Names in lower case, in the order received.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

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
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(20)))?;
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n");
    for h in extra {
        head.push_str(h);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes())?;
    read_reply(&mut BufReader::new(s), method == "HEAD")
}

fn invalid(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// Reads one response (`head_only`: no body expected).
fn read_reply(r: &mut impl BufRead, head_only: bool) -> io::Result<Reply> {
    let mut line = String::new();
    r.read_line(&mut line)?;
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| invalid(format!("status line {line:?}")))?;
    let mut headers = Vec::new();
    loop {
        line.clear();
        r.read_line(&mut line)?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        let (k, v) = l
            .split_once(':')
            .ok_or_else(|| invalid(format!("header line {l:?}")))?;
        headers.push((k.to_ascii_lowercase(), v.trim().to_owned()));
    }
    let mut reply = Reply {
        status,
        headers,
        body: Vec::new(),
    };
    if head_only || status == 304 {
        return Ok(reply);
    }
    let len = reply.header("content-length").map(str::parse::<usize>);
    if let Some(len) = len {
        let len = len.map_err(|e| invalid(format!("content-length: {e}")))?;
        reply.body.resize(len, 0);
        r.read_exact(&mut reply.body)?;
    } else if reply.header("transfer-encoding") == Some("chunked") {
        reply.body = read_chunked(r)?;
    } else {
        r.read_to_end(&mut reply.body)?;
    }
    Ok(reply)
}

/// Decodes a chunked body.
fn read_chunked(r: &mut impl BufRead) -> io::Result<Vec<u8>> {
    let mut body = Vec::new();
    let mut line = String::new();
    loop {
        line.clear();
        r.read_line(&mut line)?;
        let size = line.trim().split(';').next().unwrap_or_default();
        let size = usize::from_str_radix(size, 16)
            .map_err(|_| invalid(format!("chunk size line {line:?}")))?;
        let mut chunk = vec![0; size + 2];
        r.read_exact(&mut chunk)?;
        if size == 0 {
            return Ok(body);
        }
        body.extend_from_slice(&chunk[..size]);
    }
}
