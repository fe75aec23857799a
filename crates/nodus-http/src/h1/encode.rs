//! HTTP/1 response heads and body framing, as hyper 1.12's server writes them (its
//! `src/proto/h1/role.rs` `Server::encode`, `conn.rs` `enforce_version`, `encode.rs`), plus the
//! `Date` cache (`src/common/date.rs`).
//!
//! `encode_head` appends the status line and header section to `out` and says how the body must
//! be framed and whether the connection may stay open after it. It allocates nothing but `out`'s
//! growth. Invariants, as hyper:
//! - The status line is `HTTP/1.1 200 OK` for 200; otherwise the code and its canonical reason,
//!   `<none>` for a code with none. The version is `HTTP/1.0` to an HTTP/1.0 request or when the
//!   handler set HTTP/1.0, `HTTP/1.1` otherwise.
//! - Headers are written in the map's order, `name: value`, names as stored (lower case); the
//!   values of one `content-length`, `transfer-encoding`, `connection` or `trailer` field are
//!   joined on one line with `, `.
//! - A valid `content-length` frames the body. With a body of known length it must equal that
//!   length (or the request was `HEAD` and the body is empty); hyper trusts it in release builds
//!   and asserts in debug ones, here it is refused. With a body of unknown length every value
//!   must be digits and all equal. With an empty body it is dropped (the automatic
//!   `content-length: 0` below is written instead), except to `HEAD`, where it is kept as
//!   written.
//! - `transfer-encoding` frames the body as chunked, with `chunked` appended when it is not the
//!   last coding; it and `trailer` are dropped on HTTP/1.0 and where no body may be sent. A
//!   `transfer-encoding` after a written `content-length`, or the reverse, is refused
//!   (`HeadError::Header`), and then nothing is appended.
//! - Without either header: a body of known length gets `content-length: N`, an empty one
//!   `content-length: 0` (not to `HEAD`), one of unknown length `transfer-encoding: chunked`, or
//!   on HTTP/1.0 no header and the connection's close ends it. No length header is added to a
//!   1xx, 204 or 304, and no body follows them or a `HEAD` answer (`Framing::NoBody`).
//! - A 2xx answer to `CONNECT` has no body and no `content-length` nor `transfer-encoding`, the
//!   handler's dropped (RFC 9110 section 9.3.6; hyper's `can_have_body` and
//!   `can_have_content_length`): its client takes what follows as the tunnel's.
//! - `date` is appended last unless the map has one.
//!
//! Where this differs from hyper (nodus's server makes the second, and the first during a drain
//! and for an HTTP/1.0 close-delimited body, on top of hyper today):
//! - A response after which the connection closes (the caller's `keep_alive` is false, or the
//!   body is close-delimited) says `connection: close` (appended to the map's `connection` field
//!   when it has no `close`). hyper writes none to an HTTP/1.0 client, nor for a close-delimited
//!   body.
//! - To an HTTP/1.0 request the connection stays open only with `connection: keep-alive`, which
//!   is added when it stays open and the map says neither `keep-alive` nor `close` (hyper adds it
//!   even to a close-delimited body or after `close`, and closes without it when the handler set
//!   HTTP/1.0).
//! - hyper appends `, chunked` to every `content-length`, `connection` or `trailer` line after a
//!   `transfer-encoding` not ending in `chunked` (its `must_write_chunked` is never reset); here
//!   only to the `transfer-encoding` line.
//! - A 1xx other than 101 is refused (`HeadError::Informational`): hyper writes an empty 500 head
//!   in its place and ends the connection with an error.
//! - A 2xx answer to `CONNECT` whose body has no known length, or whose map has a
//!   `content-length`, is written without them; hyper writes no head for it.
//! - hyper's extensions (`ReasonPhrase`, header case), its `date_header(false)`, and upgrades
//!   other than a 101's head are not supported; nor are tunnels (the server closes a
//!   connection after its `CONNECT`'s answer).

use super::digits;
use std::cell::Cell;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderValue, StatusCode, Version, header};

/// How the body after a head is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    /// Exactly n body bytes follow (`Content-Length`).
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// The body ends with the connection (HTTP/1.0 or a 1.1 client that cannot take chunked).
    CloseDelimited,
    /// No body is sent (`HEAD`, 1xx, 204, 304), whatever the handler's body holds.
    NoBody,
}

/// A response head to encode, with what the caller knows about its request and body.
#[derive(Debug)]
pub(crate) struct Head<'a> {
    pub status: StatusCode,
    pub headers: &'a http::HeaderMap,
    /// The response's version as the handler set it (`HTTP/1.0` is written when it is
    /// `HTTP_10`, or when the request was HTTP/1.0).
    pub version: Version,
    /// The request's version.
    pub request_version: Version,
    /// The request's method is `HEAD`.
    pub request_is_head: bool,
    /// The request's method is `CONNECT`: a 2xx answer to it has no body nor length headers
    /// (RFC 9110 section 9.3.6).
    pub request_is_connect: bool,
    /// The body's exact length if known (`http_body::SizeHint::exact()`).
    pub body_len: Option<u64>,
    /// The body is empty from the start (`is_end_stream`).
    pub body_empty: bool,
    /// The connection stays open after this response (the caller decided: request keep-alive,
    /// no drain...). false: `connection: close` is written unless the headers already hold a
    /// `Connection` header with `close`.
    pub keep_alive: bool,
}

/// Why a head was not encoded (hyper's user errors); nothing was appended to `out`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HeadError {
    /// The length headers contradict each other or the body: `content-length` with
    /// `transfer-encoding`, an invalid `content-length`, or one that is not the body's length
    /// (hyper: `User(UnexpectedHeader)`, or a debug assertion).
    Header,
    /// A 1xx status other than 101 (hyper: `User(UnsupportedStatusCode)`).
    Informational,
}

/// Terminates each chunk's data.
pub(crate) const CHUNK_END: &[u8] = b"\r\n";
/// The last chunk of a chunked body, with no trailers.
pub(crate) const LAST_CHUNK: &[u8] = b"0\r\n\r\n";
/// The length of an IMF-fixdate, `Sun, 06 Nov 1994 08:49:37 GMT`.
pub(crate) const DATE_LEN: usize = 29;

/// What the handler's body is, as hyper's `Option<BodyLength>`.
#[derive(Clone, Copy, PartialEq)]
enum Body {
    Empty,
    Known(u64),
    Unknown,
}

/// A header field whose values are joined on one line.
#[derive(Clone, Copy, PartialEq)]
enum Line {
    ContentLength,
    TransferEncoding,
    Connection,
    Trailer,
}

/// Appends the status line and header section to `out`; returns the framing the body must be
/// written with, and whether the connection may stay open after it (false for `CloseDelimited`,
/// when `keep_alive` was false, when the headers say `Connection: close`, or for a 101). On an
/// error `out` is left as it was.
pub(crate) fn encode_head(
    head: &Head<'_>,
    date: &[u8],
    out: &mut Vec<u8>,
) -> Result<(Framing, bool), HeadError> {
    let start = out.len();
    let encoded = encode(head, date, out);
    if encoded.is_err() {
        out.truncate(start);
    }
    encoded
}

fn encode(head: &Head<'_>, date: &[u8], out: &mut Vec<u8>) -> Result<(Framing, bool), HeadError> {
    let status = head.status;
    let upgrade = status == StatusCode::SWITCHING_PROTOCOLS;
    if status.is_informational() && !upgrade {
        return Err(HeadError::Informational);
    }
    let is_head = head.request_is_head;
    let request_10 = head.request_version == Version::HTTP_10;
    let wire_10 = request_10 || head.version == Version::HTTP_10;
    let body = match (head.body_empty, head.body_len) {
        (true, _) => Body::Empty,
        (false, Some(n)) => Body::Known(n),
        (false, None) => Body::Unknown,
    };
    // hyper's `can_have_body` and `can_chunked`, and its `can_have_content_length`.
    let connect_established = head.request_is_connect && status.is_success();
    let can_body = !is_head
        && !connect_established
        && !status.is_informational()
        && status != StatusCode::NO_CONTENT
        && status != StatusCode::NOT_MODIFIED;
    let can_length = !connect_established && can_have_length(status);
    let close_delimited = wire_10
        && body == Body::Unknown
        && can_body
        && !head.headers.contains_key(header::CONTENT_LENGTH);
    let open = head.keep_alive && !close_delimited;

    out.reserve(64 + head.headers.len() * 32 + DATE_LEN);
    if !wire_10 && status == StatusCode::OK {
        out.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
    } else {
        out.extend_from_slice(if wire_10 { b"HTTP/1.0 " } else { b"HTTP/1.1 " });
        out.extend_from_slice(status.as_str().as_bytes());
        out.push(b' ');
        let reason = status.canonical_reason().unwrap_or("<none>");
        out.extend_from_slice(reason.as_bytes());
        out.extend_from_slice(b"\r\n");
    }

    let mut framing = Framing::Length(0);
    let mut wrote_len = false;
    let mut wrote_date = false;
    let mut line: Option<Line> = None;
    let mut te_not_chunked = false;
    let mut prev_len = None;
    let mut connection = Connection::default();
    for (name, value) in head.headers {
        if let Some(l) = line
            && *name != l.name()
        {
            end_line(l, te_not_chunked, &connection, open, request_10, out);
            line = None;
        }
        match *name {
            header::CONTENT_LENGTH if connect_established => continue,
            header::CONTENT_LENGTH => {
                let written = line == Some(Line::ContentLength);
                if wrote_len && !written {
                    return Err(HeadError::Header);
                }
                match body {
                    Body::Known(len) => {
                        if !written {
                            let parsed = digits(value.as_bytes());
                            if parsed != Some(len) && !(is_head && len == 0) {
                                return Err(HeadError::Header);
                            }
                            framing = Framing::Length(len);
                            start_line(Line::ContentLength, value, out);
                            wrote_len = true;
                            line = Some(Line::ContentLength);
                        }
                        continue;
                    }
                    Body::Unknown => {
                        let len = digits(value.as_bytes()).ok_or(HeadError::Header)?;
                        match prev_len {
                            Some(prev) if prev != len => return Err(HeadError::Header),
                            Some(_) => {}
                            None => {
                                framing = Framing::Length(len);
                                start_line(Line::ContentLength, value, out);
                                wrote_len = true;
                                line = Some(Line::ContentLength);
                                prev_len = Some(len);
                            }
                        }
                        continue;
                    }
                    // Written as any header, to `HEAD` only.
                    Body::Empty if is_head => wrote_len = true,
                    Body::Empty => continue,
                }
            }
            header::TRANSFER_ENCODING => {
                let written = line == Some(Line::TransferEncoding);
                if wrote_len && !written {
                    return Err(HeadError::Header);
                }
                if wire_10 || !can_body {
                    continue;
                }
                wrote_len = true;
                te_not_chunked = !last_coding_is_chunked(value);
                if written {
                    out.extend_from_slice(b", ");
                    out.extend_from_slice(value.as_bytes());
                } else {
                    framing = Framing::Chunked;
                    start_line(Line::TransferEncoding, value, out);
                    line = Some(Line::TransferEncoding);
                }
                continue;
            }
            header::CONNECTION => {
                connection.seen = true;
                connection.close |= has_token(value, b"close");
                connection.keep_alive |= has_token(value, b"keep-alive");
                if line == Some(Line::Connection) {
                    out.extend_from_slice(b", ");
                    out.extend_from_slice(value.as_bytes());
                } else {
                    start_line(Line::Connection, value, out);
                    line = Some(Line::Connection);
                }
                continue;
            }
            header::TRAILER => {
                if wire_10 || !can_body {
                    continue;
                }
                if line == Some(Line::Trailer) {
                    out.extend_from_slice(b", ");
                    out.extend_from_slice(value.as_bytes());
                } else {
                    start_line(Line::Trailer, value, out);
                    line = Some(Line::Trailer);
                }
                continue;
            }
            header::DATE => wrote_date = true,
            _ => {}
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if let Some(l) = line {
        end_line(l, te_not_chunked, &connection, open, request_10, out);
    }
    if !connection.seen {
        if !open {
            out.extend_from_slice(b"connection: close\r\n");
        } else if request_10 {
            out.extend_from_slice(b"connection: keep-alive\r\n");
        }
    }

    if !wrote_len {
        framing = match body {
            Body::Unknown if wire_10 || !can_body => Framing::CloseDelimited,
            Body::Unknown => {
                out.extend_from_slice(b"transfer-encoding: chunked\r\n");
                Framing::Chunked
            }
            Body::Empty | Body::Known(0) => {
                // hyper's `can_have_implicit_zero_content_length`.
                if !is_head && can_length {
                    out.extend_from_slice(b"content-length: 0\r\n");
                }
                Framing::Length(0)
            }
            Body::Known(len) => {
                if can_length {
                    out.extend_from_slice(b"content-length: ");
                    push_decimal(len, out);
                    out.extend_from_slice(b"\r\n");
                }
                Framing::Length(len)
            }
        };
    }
    if !can_body {
        framing = Framing::NoBody;
    }

    if !wrote_date {
        out.extend_from_slice(b"date: ");
        out.extend_from_slice(date);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    Ok((framing, open && !connection.close && !upgrade))
}

/// What the map's `connection` field said.
#[derive(Default)]
struct Connection {
    seen: bool,
    close: bool,
    keep_alive: bool,
}

impl Line {
    fn name(self) -> header::HeaderName {
        match self {
            Line::ContentLength => header::CONTENT_LENGTH,
            Line::TransferEncoding => header::TRANSFER_ENCODING,
            Line::Connection => header::CONNECTION,
            Line::Trailer => header::TRAILER,
        }
    }

    fn prefix(self) -> &'static [u8] {
        match self {
            Line::ContentLength => b"content-length: ",
            Line::TransferEncoding => b"transfer-encoding: ",
            Line::Connection => b"connection: ",
            Line::Trailer => b"trailer: ",
        }
    }
}

fn start_line(line: Line, value: &HeaderValue, out: &mut Vec<u8>) {
    out.extend_from_slice(line.prefix());
    out.extend_from_slice(value.as_bytes());
}

/// Ends a joined line: `, chunked` after a `transfer-encoding` not ending in it; `, close` or
/// `, keep-alive` after a `connection` that does not say what the connection does.
fn end_line(
    line: Line,
    te_not_chunked: bool,
    connection: &Connection,
    open: bool,
    request_10: bool,
    out: &mut Vec<u8>,
) {
    match line {
        Line::TransferEncoding if te_not_chunked => out.extend_from_slice(b", chunked"),
        Line::Connection if !connection.close => {
            if !open {
                out.extend_from_slice(b", close");
            } else if request_10 && !connection.keep_alive {
                out.extend_from_slice(b", keep-alive");
            }
        }
        _ => {}
    }
    out.extend_from_slice(b"\r\n");
}

/// Not 1xx, 204 or 304 (hyper's `can_have_content_length`, without CONNECT's 2xx).
fn can_have_length(status: StatusCode) -> bool {
    !status.is_informational()
        && status != StatusCode::NO_CONTENT
        && status != StatusCode::NOT_MODIFIED
}

/// Whether a header value's comma-separated list holds `token` (ASCII case-insensitive); a value
/// that is not visible ASCII holds none (hyper's `connection_has`, which needs `to_str`).
fn has_token(value: &HeaderValue, token: &[u8]) -> bool {
    value.to_str().is_ok_and(|s| {
        s.as_bytes()
            .split(|&b| b == b',')
            .any(|t| trim(t).eq_ignore_ascii_case(token))
    })
}

/// Whether the last coding of a `transfer-encoding` value is `chunked` (hyper's `is_chunked_`).
fn last_coding_is_chunked(value: &HeaderValue) -> bool {
    value.to_str().is_ok_and(|s| {
        s.as_bytes()
            .rsplit(|&b| b == b',')
            .next()
            .is_some_and(|t| trim(t).eq_ignore_ascii_case(b"chunked"))
    })
}

/// `str::trim` for a visible-ASCII value: spaces and tabs.
fn trim(t: &[u8]) -> &[u8] {
    t.trim_ascii()
}

/// Appends `n` in decimal.
fn push_decimal(n: u64, out: &mut Vec<u8>) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// Appends one chunk's size line, `{len:X}\r\n`, written before its data (the caller writes the
/// data, then `CHUNK_END`; the body ends with `LAST_CHUNK`). `len` is not 0: that is the last
/// chunk.
pub(crate) fn chunk_head(len: usize, out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut buf = [0u8; 2 * size_of::<usize>() + 2];
    let mut i = buf.len() - 2;
    buf[i..].copy_from_slice(b"\r\n");
    let mut n = len;
    loop {
        i -= 1;
        buf[i] = HEX[n & 0xF];
        n >>= 4;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[i..]);
}

thread_local! {
    /// The loop time (`nodus::time::loop_now_ns`) before which the wall clock is still in the
    /// second last rendered, and that second's IMF-fixdate.
    static DATE_CACHE: Cell<(u64, [u8; DATE_LEN])> = const { Cell::new((0, [0; DATE_LEN])) };
}

/// The IMF-fixdate of now, the `Date` header's value, rendered at most once a second per thread
/// (hyper renders once a second too, `common/date.rs`). Within a second it costs no clock read:
/// the loop's time says when the wall clock's next second starts, so the date lags by at most the
/// current poll (a wall clock step shows at the next second). A clock before the Unix epoch reads
/// as the epoch.
pub(crate) fn date_now() -> [u8; DATE_LEN] {
    let now = nodus::time::loop_now_ns();
    DATE_CACHE.with(|cache| {
        let (until, bytes) = cache.get();
        if now < until {
            return bytes;
        }
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let bytes = render_date(wall.as_secs());
        let rest_of_second = u64::from(1_000_000_000 - wall.subsec_nanos());
        cache.set((now.saturating_add(rest_of_second), bytes));
        bytes
    })
}

fn render_date(secs: u64) -> [u8; DATE_LEN] {
    struct Buf([u8; DATE_LEN], usize);
    impl std::fmt::Write for Buf {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            let end = self.1 + s.len();
            self.0
                .get_mut(self.1..end)
                .ok_or(std::fmt::Error)?
                .copy_from_slice(s.as_bytes());
            self.1 = end;
            Ok(())
        }
    }
    let mut buf = Buf([0; DATE_LEN], 0);
    let date = httpdate::HttpDate::from(UNIX_EPOCH + Duration::from_secs(secs));
    // An HttpDate is always DATE_LEN bytes (years before 10000).
    let _ = std::fmt::Write::write_fmt(&mut buf, format_args!("{date}"));
    debug_assert_eq!(buf.1, DATE_LEN);
    buf.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderMap;

    const DATE: &[u8] = b"Sun, 06 Nov 1994 08:49:37 GMT";

    fn map(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for &(n, v) in pairs {
            m.append(n, HeaderValue::from_static(v));
        }
        m
    }

    /// A 200 to an HTTP/1.1 GET with a 13-byte body, kept alive.
    fn get(headers: &HeaderMap) -> Head<'_> {
        Head {
            status: StatusCode::OK,
            headers,
            version: Version::HTTP_11,
            request_version: Version::HTTP_11,
            request_is_head: false,
            request_is_connect: false,
            body_len: Some(13),
            body_empty: false,
            keep_alive: true,
        }
    }

    fn enc(head: &Head<'_>) -> (String, Framing, bool) {
        let mut out = b"x".to_vec();
        let (framing, open) = encode_head(head, DATE, &mut out).unwrap();
        assert_eq!(out[0], b'x', "appends");
        (String::from_utf8(out[1..].to_vec()).unwrap(), framing, open)
    }

    fn err(head: &Head<'_>) -> HeadError {
        let mut out = b"x".to_vec();
        let e = encode_head(head, DATE, &mut out).unwrap_err();
        assert_eq!(out, b"x", "rewound");
        e
    }

    const D: &str = "date: Sun, 06 Nov 1994 08:49:37 GMT\r\n\r\n";

    #[test]
    fn a_200_with_a_known_body() {
        let m = map(&[("content-type", "text/plain")]);
        assert_eq!(
            enc(&get(&m)),
            (
                format!("HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 13\r\n{D}"),
                Framing::Length(13),
                true
            )
        );
    }

    #[test]
    fn a_2xx_to_connect_has_no_body_nor_length_headers() {
        let m = map(&[
            ("content-length", "13"),
            ("transfer-encoding", "chunked"),
            ("x", "1"),
        ]);
        let connect = |status, body_len| Head {
            status,
            request_is_connect: true,
            keep_alive: false,
            body_len,
            ..get(&m)
        };
        for body_len in [Some(13), None] {
            assert_eq!(
                enc(&connect(StatusCode::OK, body_len)),
                (
                    format!("HTTP/1.1 200 OK\r\nx: 1\r\nconnection: close\r\n{D}"),
                    Framing::NoBody,
                    false
                )
            );
        }
        // Any other status is framed as for any method.
        let plain = map(&[("x", "1")]);
        let h = Head {
            status: StatusCode::METHOD_NOT_ALLOWED,
            request_is_connect: true,
            keep_alive: false,
            ..get(&plain)
        };
        assert_eq!(
            enc(&h).0,
            format!(
                "HTTP/1.1 405 Method Not Allowed\r\nx: 1\r\nconnection: close\r\ncontent-length: 13\r\n{D}"
            )
        );
    }

    #[test]
    fn an_empty_body_gets_content_length_0_and_a_user_one_moves_last() {
        let m = map(&[("content-length", "0"), ("x", "1")]);
        let h = Head {
            body_len: Some(0),
            body_empty: true,
            ..get(&m)
        };
        assert_eq!(
            enc(&h),
            (
                format!("HTTP/1.1 200 OK\r\nx: 1\r\ncontent-length: 0\r\n{D}"),
                Framing::Length(0),
                true
            )
        );
    }

    #[test]
    fn a_user_content_length_is_kept_in_place() {
        let m = map(&[("content-length", "13"), ("x", "1")]);
        let want = format!("HTTP/1.1 200 OK\r\ncontent-length: 13\r\nx: 1\r\n{D}");
        assert_eq!(enc(&get(&m)), (want.clone(), Framing::Length(13), true));
        // It frames a body of unknown length; repeated equal values are written once.
        let m = map(&[
            ("content-length", "13"),
            ("content-length", "13"),
            ("x", "1"),
        ]);
        let h = Head {
            body_len: None,
            ..get(&m)
        };
        assert_eq!(enc(&h), (want, Framing::Length(13), true));
    }

    #[test]
    fn a_bad_content_length_is_refused() {
        for (cl, len) in [
            ("12", Some(13)),
            ("abc", Some(13)),
            ("abc", None),
            ("+5", None),
            ("", None),
        ] {
            let m = map(&[("content-length", cl)]);
            assert_eq!(
                err(&Head {
                    body_len: len,
                    ..get(&m)
                }),
                HeadError::Header,
                "{cl}"
            );
        }
        let m = map(&[("content-length", "5"), ("content-length", "6")]);
        assert_eq!(
            err(&Head {
                body_len: None,
                ..get(&m)
            }),
            HeadError::Header
        );
        let m = map(&[("content-length", "99999999999999999999")]);
        assert_eq!(
            err(&Head {
                body_len: None,
                ..get(&m)
            }),
            HeadError::Header
        );
        // With transfer-encoding, in either order.
        for m in [
            map(&[("content-length", "13"), ("transfer-encoding", "chunked")]),
            map(&[("transfer-encoding", "chunked"), ("content-length", "13")]),
        ] {
            assert_eq!(err(&get(&m)), HeadError::Header);
        }
    }

    #[test]
    fn unknown_length_on_1_1_is_chunked() {
        let m = map(&[("content-type", "text/plain")]);
        let h = Head {
            body_len: None,
            ..get(&m)
        };
        assert_eq!(
            enc(&h),
            (
                format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n{D}"
                ),
                Framing::Chunked,
                true
            )
        );
    }

    #[test]
    fn a_user_transfer_encoding_gets_chunked_last() {
        let m = map(&[("transfer-encoding", "gzip"), ("connection", "x")]);
        assert_eq!(
            enc(&get(&m)),
            (
                format!(
                    "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\nconnection: x\r\n{D}"
                ),
                Framing::Chunked,
                true
            )
        );
        let m = map(&[
            ("transfer-encoding", "gzip"),
            ("transfer-encoding", "chunked"),
        ]);
        assert_eq!(
            enc(&get(&m)).0,
            format!("HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n{D}")
        );
    }

    #[test]
    fn unknown_length_on_1_0_is_close_delimited() {
        let m = map(&[("transfer-encoding", "chunked"), ("trailer", "x")]);
        for keep_alive in [true, false] {
            let h = Head {
                body_len: None,
                request_version: Version::HTTP_10,
                keep_alive,
                ..get(&m)
            };
            assert_eq!(
                enc(&h),
                (
                    format!("HTTP/1.0 200 OK\r\nconnection: close\r\n{D}"),
                    Framing::CloseDelimited,
                    false
                )
            );
        }
        // So is it to 1.1 when the handler said HTTP/1.0.
        let h = Head {
            body_len: None,
            version: Version::HTTP_10,
            ..get(&m)
        };
        assert_eq!(
            enc(&h),
            (
                format!("HTTP/1.0 200 OK\r\nconnection: close\r\n{D}"),
                Framing::CloseDelimited,
                false
            )
        );
    }

    #[test]
    fn http_1_0_keep_alive_is_answered_in_kind() {
        let m = map(&[]);
        let h = Head {
            request_version: Version::HTTP_10,
            ..get(&m)
        };
        assert_eq!(
            enc(&h),
            (
                format!("HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 13\r\n{D}"),
                Framing::Length(13),
                true
            )
        );
        // Appended to the handler's own field, not repeated, and not after its `close`.
        let m = map(&[("connection", "foo"), ("x", "1")]);
        assert_eq!(
            enc(&Head {
                request_version: Version::HTTP_10,
                ..get(&m)
            })
            .0,
            format!(
                "HTTP/1.0 200 OK\r\nconnection: foo, keep-alive\r\nx: 1\r\ncontent-length: 13\r\n{D}"
            )
        );
        let m = map(&[("connection", "Keep-Alive")]);
        assert_eq!(
            enc(&Head {
                request_version: Version::HTTP_10,
                ..get(&m)
            })
            .0,
            format!("HTTP/1.0 200 OK\r\nconnection: Keep-Alive\r\ncontent-length: 13\r\n{D}")
        );
        let m = map(&[("connection", "close")]);
        assert_eq!(
            enc(&Head {
                request_version: Version::HTTP_10,
                ..get(&m)
            }),
            (
                format!("HTTP/1.0 200 OK\r\nconnection: close\r\ncontent-length: 13\r\n{D}"),
                Framing::Length(13),
                false
            )
        );
        // Without keep-alive the 1.0 answer says close.
        let m = map(&[]);
        let h = Head {
            request_version: Version::HTTP_10,
            keep_alive: false,
            ..get(&m)
        };
        assert_eq!(
            enc(&h),
            (
                format!("HTTP/1.0 200 OK\r\nconnection: close\r\ncontent-length: 13\r\n{D}"),
                Framing::Length(13),
                false
            )
        );
    }

    #[test]
    fn keep_alive_false_says_close_once() {
        let m = map(&[("x", "1")]);
        assert_eq!(
            enc(&Head {
                keep_alive: false,
                ..get(&m)
            }),
            (
                format!(
                    "HTTP/1.1 200 OK\r\nx: 1\r\nconnection: close\r\ncontent-length: 13\r\n{D}"
                ),
                Framing::Length(13),
                false
            )
        );
        let m = map(&[("connection", "upgrade"), ("x", "1")]);
        assert_eq!(
            enc(&Head {
                keep_alive: false,
                ..get(&m)
            })
            .0,
            format!(
                "HTTP/1.1 200 OK\r\nconnection: upgrade, close\r\nx: 1\r\ncontent-length: 13\r\n{D}"
            )
        );
        let m = map(&[("connection", "foo, Close")]);
        assert_eq!(
            enc(&Head {
                keep_alive: false,
                ..get(&m)
            })
            .0,
            format!("HTTP/1.1 200 OK\r\nconnection: foo, Close\r\ncontent-length: 13\r\n{D}")
        );
        // The handler's `close` ends a kept-alive connection.
        assert!(!enc(&get(&m)).2);
    }

    #[test]
    fn head_describes_the_body_and_sends_none() {
        let m = map(&[]);
        let h = Head {
            request_is_head: true,
            request_is_connect: false,
            ..get(&m)
        };
        assert_eq!(
            enc(&h),
            (
                format!("HTTP/1.1 200 OK\r\ncontent-length: 13\r\n{D}"),
                Framing::NoBody,
                true
            )
        );
        // Unknown length: no length header at all; an empty body: none either.
        for (len, empty) in [(None, false), (Some(0), true)] {
            let h = Head {
                request_is_head: true,
                request_is_connect: false,
                body_len: len,
                body_empty: empty,
                ..get(&m)
            };
            assert_eq!(
                enc(&h),
                (format!("HTTP/1.1 200 OK\r\n{D}"), Framing::NoBody, true)
            );
        }
        // The handler's content-length is kept, with an empty body too.
        let m = map(&[("content-length", "42"), ("transfer-encoding", "chunked")]);
        let h = Head {
            request_is_head: true,
            request_is_connect: false,
            body_len: Some(0),
            body_empty: true,
            ..get(&m)
        };
        assert_eq!(
            err(&h),
            HeadError::Header,
            "transfer-encoding after content-length"
        );
        let m = map(&[("transfer-encoding", "chunked"), ("content-length", "42")]);
        let h = Head {
            request_is_head: true,
            request_is_connect: false,
            body_len: Some(0),
            body_empty: true,
            ..get(&m)
        };
        assert_eq!(
            enc(&h),
            (
                format!("HTTP/1.1 200 OK\r\ncontent-length: 42\r\n{D}"),
                Framing::NoBody,
                true
            )
        );
    }

    #[test]
    fn no_content_and_not_modified_have_no_body() {
        for (status, line) in [(204, "204 No Content"), (304, "304 Not Modified")] {
            let status = StatusCode::from_u16(status).unwrap();
            let m = map(&[("etag", "\"a\"")]);
            for (len, empty) in [(Some(13), false), (None, false), (Some(0), true)] {
                let h = Head {
                    status,
                    body_len: len,
                    body_empty: empty,
                    ..get(&m)
                };
                assert_eq!(
                    enc(&h),
                    (
                        format!("HTTP/1.1 {line}\r\netag: \"a\"\r\n{D}"),
                        Framing::NoBody,
                        true
                    )
                );
            }
            // transfer-encoding is dropped; the handler's content-length is kept.
            let m = map(&[("transfer-encoding", "chunked"), ("content-length", "13")]);
            assert_eq!(
                enc(&Head { status, ..get(&m) }),
                (
                    format!("HTTP/1.1 {line}\r\ncontent-length: 13\r\n{D}"),
                    Framing::NoBody,
                    true
                )
            );
        }
    }

    #[test]
    fn informational_statuses() {
        let m = map(&[("upgrade", "websocket")]);
        let h = Head {
            status: StatusCode::SWITCHING_PROTOCOLS,
            body_empty: true,
            ..get(&m)
        };
        assert_eq!(
            enc(&h),
            (
                format!("HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\n{D}"),
                Framing::NoBody,
                false
            )
        );
        let h = Head {
            status: StatusCode::CONTINUE,
            ..get(&m)
        };
        assert_eq!(err(&h), HeadError::Informational);
    }

    #[test]
    fn status_lines() {
        let m = map(&[("date", "then")]);
        for (status, line) in [
            (299, "HTTP/1.1 299 <none>"),
            (404, "HTTP/1.1 404 Not Found"),
            (599, "HTTP/1.1 599 <none>"),
        ] {
            let h = Head {
                status: StatusCode::from_u16(status).unwrap(),
                ..get(&m)
            };
            assert_eq!(
                enc(&h).0,
                format!("{line}\r\ndate: then\r\ncontent-length: 13\r\n\r\n")
            );
        }
        let h = Head {
            version: Version::HTTP_2,
            ..get(&m)
        };
        assert_eq!(
            enc(&h).0,
            "HTTP/1.1 200 OK\r\ndate: then\r\ncontent-length: 13\r\n\r\n"
        );
    }

    #[test]
    fn chunk_framing() {
        let mut out = Vec::new();
        chunk_head(0x1, &mut out);
        chunk_head(0xABCDEF, &mut out);
        chunk_head(usize::MAX, &mut out);
        assert_eq!(out, b"1\r\nABCDEF\r\nFFFFFFFFFFFFFFFF\r\n");
        assert_eq!((CHUNK_END, LAST_CHUNK), (&b"\r\n"[..], &b"0\r\n\r\n"[..]));
    }

    #[test]
    fn decimal_lengths() {
        for n in [0, 7, 10, 4096, u64::MAX] {
            let mut out = Vec::new();
            push_decimal(n, &mut out);
            assert_eq!(out, n.to_string().as_bytes());
        }
    }

    #[test]
    fn the_date_is_an_imf_fixdate_of_now() {
        assert_eq!(&render_date(784111777), DATE);
        let before = SystemTime::now();
        let now = date_now();
        let parsed = httpdate::parse_http_date(std::str::from_utf8(&now).unwrap()).unwrap();
        let after = SystemTime::now();
        assert!(parsed + Duration::from_secs(1) > before && parsed <= after);
        // Cached: the same second reads the same bytes.
        assert_eq!(DATE_CACHE.with(Cell::get).1, now);
        // The cache ends with its second: a second later, the date is a later one.
        std::thread::sleep(Duration::from_millis(1050));
        let later = date_now();
        let parsed_later = httpdate::parse_http_date(std::str::from_utf8(&later).unwrap()).unwrap();
        assert!(parsed_later > parsed, "{later:?} after {now:?}");
    }
}

/// The same heads as hyper 1.12 writes them: its HTTP/1 server connection, driven over an
/// in-memory stream by polling with a no-op waker (the service answers at once, no timer runs).
#[cfg(test)]
mod against_hyper {
    use super::*;
    use bytes::Bytes;
    use http::{HeaderMap, Response};
    use hyper::body::{Frame, SizeHint};
    use std::cell::RefCell;
    use std::convert::Infallible;
    use std::pin::Pin;
    use std::rc::Rc;
    use std::task::{Context, Poll, Waker};

    /// A body of one frame, its length told (`exact`) or not.
    struct OneFrame {
        data: Option<Bytes>,
        exact: bool,
    }

    impl hyper::body::Body for OneFrame {
        type Data = Bytes;
        type Error = Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            Poll::Ready(self.data.take().map(|d| Ok(Frame::data(d))))
        }

        fn is_end_stream(&self) -> bool {
            self.data.is_none()
        }

        fn size_hint(&self) -> SizeHint {
            match &self.data {
                Some(d) if self.exact => SizeHint::with_exact(d.len() as u64),
                Some(_) => SizeHint::default(),
                None => SizeHint::with_exact(0),
            }
        }
    }

    /// Reads `input` then waits forever; keeps what is written.
    struct Stream {
        input: Vec<u8>,
        output: Rc<RefCell<Vec<u8>>>,
    }

    impl hyper::rt::Read for Stream {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            mut buf: hyper::rt::ReadBufCursor<'_>,
        ) -> Poll<std::io::Result<()>> {
            if self.input.is_empty() {
                return Poll::Pending;
            }
            let n = buf.remaining().min(self.input.len());
            buf.put_slice(&self.input[..n]);
            self.input.drain(..n);
            Poll::Ready(Ok(()))
        }
    }

    impl hyper::rt::Write for Stream {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            self.output.borrow_mut().extend_from_slice(buf);
            Poll::Ready(Ok(buf.len()))
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// One response case: the request, and the handler's answer.
    struct Case {
        request: &'static str,
        status: u16,
        version: Version,
        headers: &'static [(&'static str, &'static str)],
        body: &'static str,
        exact: bool,
    }

    const fn case(request: &'static str, status: u16) -> Case {
        Case {
            request,
            status,
            version: Version::HTTP_11,
            headers: &[],
            body: "Hello, World!",
            exact: true,
        }
    }

    fn headers(case: &Case) -> HeaderMap {
        let mut m = HeaderMap::new();
        for &(n, v) in case.headers {
            m.append(n, HeaderValue::from_static(v));
        }
        m
    }

    /// What hyper writes for `case`, and whether the connection was still open after the
    /// response (hyper's connection future not finished).
    fn hyper_writes(case: &Case) -> (Vec<u8>, bool) {
        let output = Rc::new(RefCell::new(Vec::new()));
        let io = Stream {
            input: case.request.as_bytes().to_vec(),
            output: output.clone(),
        };
        let service = hyper::service::service_fn(|_req| {
            let mut r = Response::new(OneFrame {
                data: (!case.body.is_empty()).then(|| Bytes::from_static(case.body.as_bytes())),
                exact: case.exact,
            });
            *r.status_mut() = StatusCode::from_u16(case.status).unwrap();
            *r.version_mut() = case.version;
            *r.headers_mut() = headers(case);
            async { Ok::<_, Infallible>(r) }
        });
        let conn = hyper::server::conn::http1::Builder::new().serve_connection(io, service);
        let mut conn = std::pin::pin!(conn);
        let mut cx = Context::from_waker(Waker::noop());
        let mut open = true;
        for _ in 0..64 {
            if conn.as_mut().poll(&mut cx).is_ready() {
                open = false;
                break;
            }
        }
        let out = output.borrow().clone();
        (out, open)
    }

    fn nodus_writes(case: &Case, date: &[u8]) -> Result<(Vec<u8>, Framing, bool), HeadError> {
        let (req_head, _) = case.request.split_once("\r\n").unwrap();
        let request_version = if req_head.ends_with("HTTP/1.0") {
            Version::HTTP_10
        } else {
            Version::HTTP_11
        };
        let lower = case.request.to_ascii_lowercase();
        let keep_alive = if request_version == Version::HTTP_10 {
            lower.contains("connection: keep-alive")
        } else {
            !lower.contains("connection: close")
        };
        let headers = headers(case);
        let head = Head {
            status: StatusCode::from_u16(case.status).unwrap(),
            headers: &headers,
            version: case.version,
            request_version,
            request_is_head: req_head.starts_with("HEAD "),
            request_is_connect: req_head.starts_with("CONNECT "),
            body_len: case.exact.then_some(case.body.len() as u64),
            body_empty: case.body.is_empty(),
            keep_alive,
        };
        let mut out = Vec::new();
        let (framing, open) = encode_head(&head, date, &mut out)?;
        Ok((out, framing, open))
    }

    fn head_of(bytes: &[u8]) -> &[u8] {
        let end = bytes.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        &bytes[..end]
    }

    /// hyper's `date` value in `head`, or the fixed one when the handler set its own.
    fn date_in(head: &[u8]) -> &[u8] {
        match head.windows(6).position(|w| w == b"date: ") {
            Some(i) => &head[i + 6..i + 6 + DATE_LEN],
            None => b"Sun, 06 Nov 1994 08:49:37 GMT",
        }
    }

    const GET: &str = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    const HEAD: &str = "HEAD / HTTP/1.1\r\nHost: x\r\n\r\n";
    const GET_CLOSE: &str = "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    const GET_10_KEEP_ALIVE: &str = "GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n";
    const CONNECT: &str = "CONNECT x:443 HTTP/1.1\r\nHost: x:443\r\n\r\n";

    #[test]
    fn heads_match_hyper_byte_for_byte() {
        let cases = [
            Case {
                headers: &[("content-type", "text/plain")],
                ..case(GET, 200)
            },
            Case {
                exact: false,
                ..case(GET, 200)
            },
            Case {
                body: "",
                ..case(GET, 200)
            },
            Case {
                headers: &[("content-length", "13"), ("x", "1")],
                exact: false,
                ..case(GET, 200)
            },
            Case {
                headers: &[("content-length", "0"), ("x", "1")],
                body: "",
                ..case(GET, 200)
            },
            Case {
                headers: &[("transfer-encoding", "gzip")],
                ..case(GET, 200)
            },
            Case {
                headers: &[
                    ("transfer-encoding", "gzip"),
                    ("transfer-encoding", "chunked"),
                ],
                ..case(GET, 200)
            },
            Case {
                headers: &[("trailer", "a"), ("trailer", "b")],
                exact: false,
                ..case(GET, 200)
            },
            Case {
                headers: &[("set-cookie", "a=1"), ("set-cookie", "b=2")],
                ..case(GET, 200)
            },
            Case {
                headers: &[("date", "then"), ("x", "1")],
                ..case(GET, 200)
            },
            case(HEAD, 200),
            Case {
                exact: false,
                ..case(HEAD, 200)
            },
            // A 2xx to CONNECT: no body, no length headers; another status: as to GET.
            case(CONNECT, 200),
            case(CONNECT, 405),
            Case {
                body: "",
                ..case(HEAD, 200)
            },
            Case {
                headers: &[("content-length", "42")],
                body: "",
                ..case(HEAD, 200)
            },
            case(GET, 204),
            Case {
                headers: &[("etag", "\"a\"")],
                exact: false,
                ..case(GET, 304)
            },
            Case {
                headers: &[("content-length", "13")],
                ..case(GET, 304)
            },
            case(GET, 299),
            case(GET, 404),
            Case {
                body: "",
                ..case(GET, 500)
            },
            case(GET_CLOSE, 200),
            Case {
                headers: &[("connection", "upgrade"), ("x", "1")],
                ..case(GET_CLOSE, 200)
            },
            Case {
                headers: &[("connection", "close")],
                ..case(GET, 200)
            },
            case(GET_10_KEEP_ALIVE, 200),
            Case {
                headers: &[("connection", "foo")],
                ..case(GET_10_KEEP_ALIVE, 200)
            },
            Case {
                version: Version::HTTP_10,
                ..case(GET, 200)
            },
        ];
        for (i, case) in cases.iter().enumerate() {
            let (hyper, hyper_open) = hyper_writes(case);
            let hyper = head_of(&hyper);
            let (ours, framing, open) = nodus_writes(case, date_in(hyper)).unwrap();
            assert_eq!(
                String::from_utf8_lossy(&ours),
                String::from_utf8_lossy(hyper),
                "case {i}"
            );
            // hyper hands a connection whose CONNECT got a 2xx to an upgrade (not open for
            // HTTP); nodus's server never asks to keep it (`h1::head`: a CONNECT's `keep_alive`
            // is false), so the head alone is compared there.
            let tunnel = case.request.starts_with("CONNECT ") && (200..300).contains(&case.status);
            if !tunnel {
                assert_eq!(open, hyper_open, "case {i}: {framing:?}");
            }
        }
    }

    #[test]
    fn where_nodus_differs_from_hyper() {
        // (case, hyper's head, ours), dates left out.
        let cases = [
            // An HTTP/1.0 request without keep-alive: hyper says nothing of the close.
            (
                case("GET / HTTP/1.0\r\n\r\n", 200),
                "HTTP/1.0 200 OK\r\ncontent-length: 13\r\n",
                "HTTP/1.0 200 OK\r\nconnection: close\r\ncontent-length: 13\r\n",
            ),
            // A close-delimited body to a keep-alive HTTP/1.0 request: hyper promises keep-alive.
            (
                Case {
                    exact: false,
                    ..case(GET_10_KEEP_ALIVE, 200)
                },
                "HTTP/1.0 200 OK\r\nconnection: keep-alive\r\n",
                "HTTP/1.0 200 OK\r\nconnection: close\r\n",
            ),
            // `must_write_chunked` outlives hyper's transfer-encoding line.
            (
                Case {
                    headers: &[("transfer-encoding", "gzip"), ("connection", "x")],
                    ..case(GET, 200)
                },
                "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\nconnection: x, chunked\r\n",
                "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\nconnection: x\r\n",
            ),
        ];
        for (i, (case, hyper_head, our_head)) in cases.iter().enumerate() {
            let (hyper, _) = hyper_writes(case);
            let hyper = head_of(&hyper);
            let date = date_in(hyper);
            let (ours, _, _) = nodus_writes(case, date).unwrap();
            let with_date = |h: &str| {
                let mut v = h.as_bytes().to_vec();
                v.extend_from_slice(b"date: ");
                v.extend_from_slice(date);
                v.extend_from_slice(b"\r\n\r\n");
                String::from_utf8(v).unwrap()
            };
            assert_eq!(
                String::from_utf8_lossy(hyper),
                with_date(hyper_head),
                "case {i}"
            );
            assert_eq!(
                String::from_utf8_lossy(&ours),
                with_date(our_head),
                "case {i}"
            );
        }
    }

    #[test]
    fn refusals_are_hyper_errors() {
        let cases = [
            Case {
                headers: &[("content-length", "abc")],
                exact: false,
                ..case(GET, 200)
            },
            Case {
                headers: &[("content-length", "5"), ("content-length", "6")],
                exact: false,
                ..case(GET, 200)
            },
            Case {
                headers: &[("content-length", "13"), ("transfer-encoding", "chunked")],
                ..case(GET, 200)
            },
            Case {
                headers: &[("transfer-encoding", "chunked"), ("content-length", "13")],
                ..case(GET, 200)
            },
        ];
        for (i, case) in cases.iter().enumerate() {
            let (hyper, open) = hyper_writes(case);
            assert_eq!((hyper.as_slice(), open), (&b""[..], false), "case {i}");
            assert_eq!(
                nodus_writes(case, b"").unwrap_err(),
                HeadError::Header,
                "case {i}"
            );
        }
        // A 1xx other than 101: hyper writes an empty 500 and ends the connection.
        let (hyper, open) = hyper_writes(&case(GET, 100));
        let hyper = String::from_utf8_lossy(head_of(&hyper)).into_owned();
        assert!(
            hyper.starts_with("HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\ndate: "),
            "{hyper}"
        );
        assert!(!open);
        assert_eq!(
            nodus_writes(&case(GET, 100), b"").unwrap_err(),
            HeadError::Informational
        );
    }
}
