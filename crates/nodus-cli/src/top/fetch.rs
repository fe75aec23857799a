//! Reading `/_nodus/stats`: the ADDR argument and a minimal blocking HTTP/1.1 GET.
//!
//! ADDR is `HOST:PORT` (`127.0.0.1:8080`, `[::1]:8080`, `localhost:8080`) or an `http://` URL.
//! A URL without a path, or whose path is `/` or ends in `/_nodus` or `/_nodus/`, means that
//! server's `/_nodus/stats`; any other path is used as given (the stats endpoint behind a proxy).
//!
//! The client sends one `GET` with `Connection: close` over a std `TcpStream` (connect, read and
//! write timeouts), reads to the end, and understands `Content-Length`, chunked bodies and bodies
//! closed by EOF. Errors are one line each, meant to be shown as they are.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};

use nodus::net::IntoSocketAddr;
use std::time::{Duration, Instant};

/// Largest stats document accepted (a snapshot is a few tens of KB per worker).
const MAX_BODY: usize = 64 << 20;

/// Where the stats come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// `host:port` as given (for the `Host` header and messages).
    pub authority: String,
    /// Request path, starting with `/`.
    pub path: String,
}

impl Target {
    /// Parses ADDR: `HOST:PORT` or `http://HOST[:PORT][/PATH]`.
    pub fn parse(addr: &str) -> Result<Target, String> {
        let addr = addr.trim();
        let rest = match addr.split_once("://") {
            Some((scheme, rest)) if scheme.eq_ignore_ascii_case("http") => rest,
            Some((scheme, _)) => {
                return Err(format!(
                    "`{addr}`: only http:// is supported (not {scheme}://); give HOST:PORT or an http:// URL"
                ));
            }
            None => addr,
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        if authority.is_empty() || authority.starts_with(':') || authority.contains('@') {
            return Err(format!("`{addr}` is not HOST:PORT or an http:// URL"));
        }
        let has_port = match authority.rfind(']') {
            Some(end) => authority[end + 1..].starts_with(':'),
            None => authority.contains(':'),
        };
        let authority = if has_port {
            let port = &authority[authority.rfind(':').unwrap_or(0) + 1..];
            if port.parse::<u16>().is_err() {
                let why = crate::port_out_of_range(port)
                    .unwrap_or_else(|| format!("`{port}` is not a port number"));
                return Err(format!("`{addr}`: {why}"));
            }
            authority.to_string()
        } else if addr.contains("://") {
            format!("{authority}:80")
        } else {
            return Err(format!(
                "`{addr}` has no port: give HOST:PORT (e.g. 127.0.0.1:8080) or an http:// URL"
            ));
        };
        let path = path.split('#').next().unwrap_or("");
        let path = if path.is_empty() || path == "/" {
            "/_nodus/stats".to_string()
        } else if let Some(base) = path
            .strip_suffix('/')
            .unwrap_or(path)
            .strip_suffix("/_nodus")
        {
            format!("{base}/_nodus/stats")
        } else {
            path.to_string()
        };
        Ok(Target { authority, path })
    }

    /// `http://authority/path`, for messages.
    pub fn url(&self) -> String {
        format!("http://{}{}", self.authority, self.path)
    }

    /// GETs the target; returns the body of a 200 response, or a one-line reason (without the URL).
    pub fn get(&self, timeout: Duration) -> Result<Vec<u8>, String> {
        let deadline = Instant::now() + timeout;
        // An IP literal, also with a zone that names its interface (`[fe80::1%eth0]:80`, which
        // `to_socket_addrs` does not read), needs no resolver.
        let addrs: Vec<SocketAddr> = match self.authority.as_str().into_socket_addr() {
            Ok(addr) => vec![addr],
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(e.to_string()),
            Err(_) => self
                .authority
                .to_socket_addrs()
                .map_err(|e| format!("cannot resolve the host: {e}"))?
                .collect(),
        };
        let mut last = "the host resolves to no address".to_string();
        let mut stream = None;
        for a in addrs {
            let left = deadline.saturating_duration_since(Instant::now());
            match TcpStream::connect_timeout(&a, left.max(Duration::from_millis(1))) {
                Ok(s) => {
                    stream = Some(s);
                    break;
                }
                Err(e) => last = format!("cannot connect: {e}"),
            }
        }
        let mut stream = stream.ok_or(last)?;
        let io = |e: std::io::Error| e.to_string();
        let left = deadline.saturating_duration_since(Instant::now());
        let left = left.max(Duration::from_millis(1));
        stream.set_write_timeout(Some(left)).map_err(io)?;
        stream.set_read_timeout(Some(left)).map_err(io)?;
        let request = format!(
            "GET {} HTTP/1.1\r\nHost: {}\r\nAccept: application/json\r\nUser-Agent: nodus-top\r\n\
             Connection: close\r\n\r\n",
            self.path, self.authority
        );
        stream.write_all(request.as_bytes()).map_err(io)?;
        let mut raw = Vec::new();
        let mut buf = [0u8; 16 << 10];
        loop {
            if Instant::now() >= deadline {
                return Err("timed out".into());
            }
            match stream.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    raw.extend_from_slice(&buf[..n]);
                    if raw.len() > MAX_BODY {
                        return Err("response larger than 64 MiB".into());
                    }
                    if response_complete(&raw) {
                        break;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err("timed out".into());
                }
                Err(e) => return Err(io(e)),
            }
        }
        parse_response(&raw)
    }
}

/// Header names (lowercase) and values.
type Headers = Vec<(String, String)>;

/// Splits a response into (status, headers, body bytes so far); `None` until the head is complete.
fn split_head(raw: &[u8]) -> Option<(u16, Headers, &[u8])> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&raw[..end]);
    let mut lines = head.split("\r\n");
    let status = lines
        .next()?
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Some((status, headers, &raw[end + 4..]))
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

fn is_chunked(headers: &[(String, String)]) -> bool {
    header(headers, "transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked"))
}

/// Whether the whole response is in `raw` (so a server that keeps the connection open is fine).
fn response_complete(raw: &[u8]) -> bool {
    let Some((_, headers, body)) = split_head(raw) else {
        return false;
    };
    if is_chunked(&headers) {
        return dechunk(body).is_ok();
    }
    match header(&headers, "content-length").and_then(|v| v.parse::<usize>().ok()) {
        Some(len) => body.len() >= len,
        None => false,
    }
}

/// Decodes a chunked body; `Err` if it is incomplete or malformed.
fn dechunk(mut body: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let eol = body
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("truncated chunked body")?;
        let size_text = String::from_utf8_lossy(&body[..eol]);
        let size_text = size_text.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_text, 16)
            .map_err(|_| format!("bad chunk size `{size_text}`"))?;
        body = &body[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        if body.len() < size + 2 {
            return Err("truncated chunked body".into());
        }
        out.extend_from_slice(&body[..size]);
        body = &body[size + 2..];
    }
}

/// The body of a complete 200 response.
fn parse_response(raw: &[u8]) -> Result<Vec<u8>, String> {
    if raw.is_empty() {
        return Err("the server closed the connection without answering".into());
    }
    let (status, headers, body) = split_head(raw).ok_or("not an HTTP response")?;
    if status != 200 {
        return Err(format!("HTTP {status} (is this a nodus admin endpoint?)"));
    }
    if is_chunked(&headers) {
        return dechunk(body);
    }
    match header(&headers, "content-length").and_then(|v| v.parse::<usize>().ok()) {
        Some(len) if body.len() < len => Err("truncated response body".into()),
        Some(len) => Ok(body[..len].to_vec()),
        None => Ok(body.to_vec()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(a: &str, p: &str) -> Target {
        Target {
            authority: a.into(),
            path: p.into(),
        }
    }

    #[test]
    fn addr_forms() {
        let ok = |s: &str| Target::parse(s).unwrap();
        assert_eq!(ok("127.0.0.1:8080"), t("127.0.0.1:8080", "/_nodus/stats"));
        assert_eq!(ok("[::1]:9"), t("[::1]:9", "/_nodus/stats"));
        assert_eq!(ok("http://h:1"), t("h:1", "/_nodus/stats"));
        assert_eq!(ok("http://h:1/"), t("h:1", "/_nodus/stats"));
        assert_eq!(ok("http://h:1/_nodus/"), t("h:1", "/_nodus/stats"));
        assert_eq!(ok("HTTP://h/x/_nodus"), t("h:80", "/x/_nodus/stats"));
        assert_eq!(ok("http://h:1/_nodus/stats"), t("h:1", "/_nodus/stats"));
        assert_eq!(ok("http://h:1/api/stats?a=1"), t("h:1", "/api/stats?a=1"));
        for bad in [
            "",
            "localhost",
            "https://h:1",
            "h:99999",
            "http://:1",
            "u@h:1",
        ] {
            assert!(Target::parse(bad).is_err(), "{bad}");
        }
        let err = |s: &str| Target::parse(s).unwrap_err();
        assert_eq!(
            err("127.0.0.1:99999"),
            "`127.0.0.1:99999`: port 99999 is out of range (0-65535)"
        );
        assert_eq!(err("h:8o"), "`h:8o`: `8o` is not a port number");
    }

    #[test]
    fn responses() {
        let r = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}";
        assert!(response_complete(r));
        assert_eq!(parse_response(r).unwrap(), b"{}");
        let c = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n1;x\r\n \r\n0\r\n\r\n";
        assert!(response_complete(c));
        assert_eq!(parse_response(c).unwrap(), b"{} ");
        assert!(!response_complete(&c[..c.len() - 7]));
        let e = parse_response(b"HTTP/1.1 404 Not Found\r\n\r\n").unwrap_err();
        assert!(e.contains("404"), "{e}");
        assert!(parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n{}").is_err());
        assert!(parse_response(b"").is_err());
    }
}
