//! A minimal blocking HTTP/1.1 client: requests written by hand, one response read at a time by
//! its `Content-Length`, chunked, or to EOF (none for `HEAD`, 1xx, 204 and 304).
//!
//! Invariants: every socket it opens has connect, read and write timeouts (the caller's
//! [`Timeouts`]), so a hang becomes an error; header names are kept in lower case.

use std::io::{self, BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// One response.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    /// Names in lower case, in the order received.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Reply {
    /// The first value of header `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Whether the server said `Connection: close`.
    pub fn closes(&self) -> bool {
        self.header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"))
    }
}

/// Limits on a connection: connecting, and each read or write.
#[derive(Clone, Copy)]
pub struct Timeouts {
    pub connect: Duration,
    pub io: Duration,
}

/// A connection to `addr` with `t` applied and Nagle off (small writes go out at once).
pub fn connect(addr: SocketAddr, t: Timeouts) -> io::Result<TcpStream> {
    let s = TcpStream::connect_timeout(&addr, t.connect)?;
    s.set_read_timeout(Some(t.io))?;
    s.set_write_timeout(Some(t.io))?;
    s.set_nodelay(true)?;
    Ok(s)
}

/// Writes `METHOD path HTTP/1.1`, `Host: t`, the `extra` raw header lines and the blank line.
pub fn write_request(
    w: &mut impl Write,
    method: &str,
    path: &str,
    extra: &[&str],
) -> io::Result<()> {
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: t\r\n");
    for h in extra {
        head.push_str(h);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    w.write_all(head.as_bytes())
}

/// One request on a new connection (`Connection: close` added to `extra`), and its response.
pub fn request(
    addr: SocketAddr,
    t: Timeouts,
    method: &str,
    path: &str,
    extra: &[&str],
) -> io::Result<Reply> {
    let mut s = connect(addr, t)?;
    let extra = [&["Connection: close"], extra].concat();
    write_request(&mut s, method, path, &extra)?;
    read_reply(&mut BufReader::new(s), method == "HEAD")
}

fn invalid(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

fn closed(when: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        format!("connection closed {when}"),
    )
}

/// `n` connections opened at once, a `GET /` with `Connection: close` written on each, their
/// answers read on a thread of its own (the caller goes on meanwhile); panics on a failure.
pub fn burst(addr: SocketAddr, n: usize, t: Timeouts) -> std::thread::JoinHandle<Vec<Reply>> {
    let conns: Vec<TcpStream> = (0..n)
        .map(|i| {
            let mut s = connect(addr, t).unwrap_or_else(|e| panic!("burst {i}: {e}"));
            write_request(&mut s, "GET", "/", &["Connection: close"])
                .unwrap_or_else(|e| panic!("burst {i}: {e}"));
            s
        })
        .collect();
    std::thread::spawn(move || {
        conns
            .into_iter()
            .enumerate()
            .map(|(i, s)| {
                read_reply(&mut BufReader::new(s), false)
                    .unwrap_or_else(|e| panic!("burst {i}: {e}"))
            })
            .collect()
    })
}

/// Reads one response (`head_only`: the answer to a `HEAD`, no body).
pub fn read_reply(r: &mut impl BufRead, head_only: bool) -> io::Result<Reply> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Err(closed("before a response"));
    }
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| invalid(format!("status line {line:?}")))?;
    let mut headers = Vec::new();
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            return Err(closed("inside a response head"));
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        let (k, v) = l
            .split_once(':')
            .ok_or_else(|| invalid(format!("header line {l:?}")))?;
        headers.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
    }
    let mut reply = Reply {
        status,
        headers,
        body: Vec::new(),
    };
    if head_only || matches!(status, 100..=199 | 204 | 304) {
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
