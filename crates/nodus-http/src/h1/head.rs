//! One HTTP/1 request head, parsed out of the front of a connection's read buffer.
//!
//! [`parse`] is hyper 1.12's `Server::parse` (`proto/h1/role.rs`) and the limits of its read
//! (`proto/h1/io.rs`), with nodus's 414 and Node's (llhttp, strict) refusals added:
//! - httparse (default config) reads the head; empty lines before the request line (CRLF or a
//!   bare LF) are skipped, as httparse and llhttp skip them, and count toward no limit.
//! - Limits, from the request line's first byte: a request line that has no line feed within
//!   `max_head_bytes` bytes (its CR counts) is 414, even if the rest of the head is not read yet;
//!   otherwise a head longer than `max_head_bytes`, an incomplete one whose bytes already reach
//!   it, or more than `max_headers` headers is 431; a target over `u16::MAX - 1` bytes is 414
//!   (hyper). The 414 of a request line comes first, whatever else is wrong with the bytes.
//! - Framing as hyper decides it: `Transfer-Encoding` on HTTP/1.0, or whose last line's last
//!   coding is not `chunked`, is 400; otherwise the body is chunked. A `Content-Length` element
//!   (a line may list several, comma-separated) that is not all digits, overflows a u64, or
//!   differs from another is 400. Unlike hyper, every u64 is a length (hyper answers the top two
//!   with 431), comma lists of equal values are Node's refusal below (hyper: 400), and a
//!   `Content-Length` after `Transfer-Encoding` is checked too (hyper ignores it).
//! - What Node refuses and hyper serves parses but is noted (`framing_refused`): a line ended
//!   by a bare LF, `Content-Length` more than once (equal values), `Content-Length` beside
//!   `Transfer-Encoding`, or `chunked` twice among the transfer codings.
//! - `Connection` as hyper reads it: any `close` token closes. `Expect` as Node reads it (HTTP/1.1
//!   only): `100-continue` (any case, no letter, digit or `_` next to it) in any line asks for a
//!   `100 Continue` (`expect_continue`); other lines without it are noted (`expectation_failed`:
//!   Node answers 417).
//! - Request lines as Node (llhttp, strict) and nginx take them, others 400: a method of
//!   uppercase letters, `-` and `_` (nginx's rule; httparse takes any token; Node also refuses
//!   uppercase methods not in its `http.METHODS`, which nodus leaves to the application: 501);
//!   a target in origin-form (`/` first), absolute-form (a scheme) or `*` (any method), and for CONNECT in authority-form only
//!   (`host:port`, RFC 9112 section 3.2: `http::Uri` alone takes `a` or `h:80` with any method);
//!   no target byte over 0x7F (httparse and `http::Uri` take them). A CONNECT has no body and
//!   does not keep the connection (`keep_alive` false): what follows its head is a tunnel's,
//!   which the connection never parses.
//! - The `Host` lines are judged as the server refuses them (`server::Hosts`), so that the
//!   server need not look them up again.
//! - `PRI * HTTP/2.0`, the HTTP/2 preface's first line, followed by bytes the preface begins
//!   with (or all of it) is [`HeadError::Http2Preface`], decided once that line is complete; any
//!   other version than HTTP/1.0 and HTTP/1.1 is 400.
//!
//! Invariants:
//! - Zero copy: the head is split off the buffer into one `Bytes` that the target and the header
//!   values share.
//! - Nothing is allocated but that `Bytes` and the header map (and by `http`, a header name it
//!   does not know), unless `max_headers` is over [`STACK_HEADERS`] (then two vectors of that
//!   many slots).
//! - `buf` is changed only by a head parsed (its bytes and the empty lines before it taken off
//!   the front) and by a head not complete yet (the empty lines before it dropped, so that a
//!   client sending only empty lines grows no buffer). An error leaves it as it was: one found
//!   after the split (an invalid target or target form, header name or framing) puts the bytes
//!   back, a copy.

use super::digits;
use std::mem::MaybeUninit;

use bytes::{Buf, Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode, Uri, Version};

use crate::server::Hosts;

/// The limits a head is parsed within (`Config::max_header_bytes`, `Config::max_headers`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// The most bytes a head may have, from its request line's first byte.
    pub max_head_bytes: usize,
    /// The most header lines a head may have.
    pub max_headers: usize,
}

/// How the request's body is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyFraming {
    /// No body: no `Content-Length` nor `Transfer-Encoding`, or `Content-Length: 0`.
    Empty,
    /// `Content-Length` bytes.
    Length(u64),
    /// `Transfer-Encoding` whose last coding is `chunked`.
    Chunked,
}

/// A parsed request head.
#[derive(Debug)]
pub(crate) struct RequestHead {
    pub method: Method,
    pub uri: Uri,
    /// `HTTP_10` or `HTTP_11`.
    pub version: Version,
    pub headers: HeaderMap,
    pub body: BodyFraming,
    /// The client asks to keep the connection: HTTP/1.1 unless a `Connection` token `close`;
    /// HTTP/1.0 only with a `keep-alive` token (tokens comma-separated, case-insensitive, any
    /// `Connection` line). Never for a CONNECT: nothing after its head is read as a request.
    pub keep_alive: bool,
    /// An HTTP/1.1 request's `Expect` names `100-continue` as Node finds it
    /// (`names_100_continue`): a `100 Continue` is owed before its body is read.
    pub expect_continue: bool,
    /// An HTTP/1.1 request has `Expect` lines and none names `100-continue` as Node finds it
    /// (`names_100_continue`): Node answers 417 (the server refuses it before the handler).
    pub expectation_failed: bool,
    /// A `TE` token `trailers` (any line): the client takes a chunked response's trailers.
    pub te_trailers: bool,
    /// Node (llhttp, strict) refuses this framing with 400 although the head parsed (the server
    /// refuses it before the handler, reporting the request line): a line of the head ended by a
    /// bare LF (no CR before it), `Content-Length` twice (even equal values), `Content-Length`
    /// together with `Transfer-Encoding`, or `chunked` twice among the transfer codings.
    pub framing_refused: bool,
    /// The `Host` lines, judged as the server refuses them (`server::host_refusal`).
    pub hosts: Hosts,
}

/// Why a head is refused; the connection answers [`HeadError::status`] and closes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HeadError {
    /// Not a valid HTTP/1.0 or HTTP/1.1 head, or a body framing hyper refuses.
    Malformed,
    /// The request line has no line feed within the head limit, or the target is over
    /// `u16::MAX - 1` bytes.
    UriTooLong,
    /// The head is over the head limit, or has too many headers.
    TooLarge,
    /// The connection speaks HTTP/2 (its preface).
    Http2Preface,
}

impl HeadError {
    /// The status the connection answers with: 400, 414, 431, 400.
    pub fn status(&self) -> StatusCode {
        match self {
            HeadError::Malformed | HeadError::Http2Preface => StatusCode::BAD_REQUEST,
            HeadError::UriTooLong => StatusCode::URI_TOO_LONG,
            HeadError::TooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        }
    }
}

/// Header slots on the stack; a larger `max_headers` takes them from the heap.
const STACK_HEADERS: usize = 100;

/// hyper's limit on a request target (`MAX_URI_LEN`).
const MAX_URI_LEN: usize = u16::MAX as usize - 1;

/// The HTTP/2 connection preface (RFC 9113 section 3.4), and the length of its first line.
pub(crate) const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const H2_PREFACE_LINE: usize = 16;

/// Where a header's name and value are in the buffer.
#[derive(Clone, Copy)]
struct Span {
    name: (usize, usize),
    value: (usize, usize),
}

/// What the first pass, over the borrowed buffer, found.
enum Scanned {
    /// The head is not complete; the empty lines before it are this long.
    Partial {
        skipped: usize,
    },
    Complete(Line),
}

/// A complete head's request line and framing facts; offsets are in the buffer.
struct Line {
    /// The head's end (the empty lines before it included).
    end: usize,
    method: Method,
    target: (usize, usize),
    version: Version,
    headers: usize,
    bare_lf: bool,
}

/// Parses the head at the start of `buf`. Ok(None): not complete yet and still within the
/// limits (read more); the empty lines before the request line have been dropped from `buf`.
/// Ok(Some(head)): the head's bytes, and any empty lines (CRLF or bare LF) before its request
/// line, have been split off the front of `buf` (what remains is the body or the next request).
/// Err: the connection answers the status and closes; `buf` is left as is. `cached`: an empty
/// header map to fill (the connection's last response's, cleared: its allocation is reused, as
/// hyper does); taken by a complete head, parsed or not (an error ends the connection).
pub(crate) fn parse(
    buf: &mut BytesMut,
    limits: &Limits,
    cached: &mut Option<HeaderMap>,
) -> Result<Option<RequestHead>, HeadError> {
    let slots = limits.max_headers;
    if slots <= STACK_HEADERS {
        let mut spans = [MaybeUninit::<Span>::uninit(); STACK_HEADERS];
        let scanned = {
            let mut headers = [MaybeUninit::<httparse::Header<'_>>::uninit(); STACK_HEADERS];
            scan(buf, limits, &mut headers[..slots], &mut spans)?
        };
        finish(buf, scanned, &spans, cached)
    } else {
        let mut spans = vec![MaybeUninit::<Span>::uninit(); slots];
        let scanned = {
            let mut headers = vec![MaybeUninit::<httparse::Header<'_>>::uninit(); slots];
            scan(buf, limits, &mut headers, &mut spans)?
        };
        finish(buf, scanned, &spans, cached)
    }
}

/// The first pass, over the borrowed buffer: httparse, the limits, and the header spans written
/// to `spans` (at least as many as `headers`).
fn scan<'b>(
    bytes: &'b [u8],
    limits: &Limits,
    headers: &mut [MaybeUninit<httparse::Header<'b>>],
    spans: &mut [MaybeUninit<Span>],
) -> Result<Scanned, HeadError> {
    let skipped = skip_empty_lines(bytes)?;
    let rest = &bytes[skipped..];
    if rest.is_empty() || rest == b"\r" {
        return Ok(Scanned::Partial { skipped });
    }
    let mut req = httparse::Request::new(&mut []);
    let len = match req.parse_with_uninit_headers(rest, headers) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => {
            if line_over(rest, limits.max_head_bytes) {
                return Err(HeadError::UriTooLong);
            }
            if rest.len() >= limits.max_head_bytes {
                return Err(HeadError::TooLarge);
            }
            return Ok(Scanned::Partial { skipped });
        }
        Err(e) => {
            if line_over(rest, limits.max_head_bytes) {
                return Err(HeadError::UriTooLong);
            }
            return match e {
                httparse::Error::TooManyHeaders => Err(HeadError::TooLarge),
                httparse::Error::Version if rest.len() < H2_PREFACE_LINE => {
                    if H2_PREFACE.starts_with(rest) {
                        Ok(Scanned::Partial { skipped })
                    } else {
                        Err(HeadError::Malformed)
                    }
                }
                httparse::Error::Version
                    if H2_PREFACE.starts_with(rest) || rest.starts_with(H2_PREFACE) =>
                {
                    Err(HeadError::Http2Preface)
                }
                _ => Err(HeadError::Malformed),
            };
        }
    };
    let (line, bare_lf) = line_ends(&rest[..len], req.headers);
    if line >= limits.max_head_bytes {
        return Err(HeadError::UriTooLong);
    }
    if len > limits.max_head_bytes {
        return Err(HeadError::TooLarge);
    }
    let (Some(method), Some(target), Some(version)) = (req.method, req.path, req.version) else {
        return Err(HeadError::Malformed);
    };
    if target.len() > MAX_URI_LEN {
        return Err(HeadError::UriTooLong);
    }
    let method = request_method(method.as_bytes()).ok_or(HeadError::Malformed)?;
    let connect = method == Method::CONNECT;
    // Origin-form is the common case; a byte over 0x7F is refused anywhere (Node; httparse and
    // `http::Uri` take it).
    let target_bytes = target.as_bytes();
    let origin_form = !connect && target_bytes.first() == Some(&b'/');
    if !target_bytes.iter().all(|&b| b < 0x80)
        || !origin_form && !other_form_fits(connect, target_bytes)
    {
        return Err(HeadError::Malformed);
    }
    let base = bytes.as_ptr().addr();
    // An empty value's pointer is not relied on.
    let at = |s: &[u8]| {
        if s.is_empty() {
            0
        } else {
            s.as_ptr().addr() - base
        }
    };
    for (slot, header) in spans.iter_mut().zip(req.headers.iter()) {
        let (name, value) = (at(header.name.as_bytes()), at(header.value));
        slot.write(Span {
            name: (name, name + header.name.len()),
            value: (value, value + header.value.len()),
        });
    }
    let target_at = at(target.as_bytes());
    Ok(Scanned::Complete(Line {
        end: skipped + len,
        method,
        target: (target_at, target_at + target.len()),
        version: if version == 1 {
            Version::HTTP_11
        } else {
            Version::HTTP_10
        },
        headers: req.headers.len(),
        bare_lf,
    }))
}

/// The method, if its bytes are uppercase ASCII letters, `-` and `_` (nginx's rule): `get`,
/// `Get` and `G!T` are refused, as Node and nginx refuse them, while an unknown uppercase method
/// reaches the application, which can answer 501 (RFC 9110 section 9.1; `nodus serve` does). The
/// common methods are matched first, with no allocation (`http` keeps an extension method of up
/// to 15 bytes inline).
fn request_method(bytes: &[u8]) -> Option<Method> {
    match bytes {
        b"GET" => Some(Method::GET),
        b"POST" => Some(Method::POST),
        b"HEAD" => Some(Method::HEAD),
        b"PUT" => Some(Method::PUT),
        b"DELETE" => Some(Method::DELETE),
        b"OPTIONS" => Some(Method::OPTIONS),
        b"PATCH" => Some(Method::PATCH),
        b"CONNECT" => Some(Method::CONNECT),
        b"TRACE" => Some(Method::TRACE),
        _ if bytes
            .iter()
            .all(|&b| b.is_ascii_uppercase() || b == b'-' || b == b'_') =>
        {
            Method::from_bytes(bytes).ok()
        }
        _ => None,
    }
}

/// Whether a request target not in origin-form (`/` first) has a form RFC 9112 section 3.2
/// allows, as `http::Uri` will parse it (a target it cannot parse is refused all the same): for
/// a CONNECT, authority-form only (`host:port`: no `/`, `?`, `#` or userinfo, a port of digits
/// after the last colon, outside an IPv6 literal's brackets); for any other method, `*` (Node
/// takes it with any method) or absolute-form (an RFC 3986 scheme followed by `://`).
#[cold]
#[inline(never)]
fn other_form_fits(connect: bool, target: &[u8]) -> bool {
    if connect {
        let port = target
            .iter()
            .rposition(|&b| b == b':')
            .map(|at| &target[at + 1..]);
        return !target.iter().any(|b| b"/?#@".contains(b))
            && port.is_some_and(|p| !p.is_empty() && p.iter().all(u8::is_ascii_digit));
    }
    // RFC 3986's scheme: a letter, then letters, digits, `+`, `-` and `.`.
    let scheme = |b: &u8| b.is_ascii_alphanumeric() || b"+-.".contains(b);
    target == b"*"
        || target.first().is_some_and(u8::is_ascii_alphabetic)
            && target
                .iter()
                .position(|b| !scheme(b))
                .is_some_and(|at| target[at..].starts_with(b"://"))
}

/// The length of the empty lines (CRLF or a bare LF) at the start of `bytes`; a CR at the end
/// is not counted (its LF may follow), one followed by anything else is malformed (httparse).
fn skip_empty_lines(bytes: &[u8]) -> Result<usize, HeadError> {
    let mut at = 0;
    loop {
        match bytes.get(at) {
            Some(b'\n') => at += 1,
            Some(b'\r') => match bytes.get(at + 1) {
                Some(b'\n') => at += 2,
                Some(_) => return Err(HeadError::Malformed),
                None => return Ok(at),
            },
            _ => return Ok(at),
        }
    }
}

/// Whether the request line at the start of `rest` has no line feed within `max` bytes.
fn line_over(rest: &[u8], max: usize) -> bool {
    match memchr::memchr(b'\n', rest) {
        Some(lf) => lf >= max,
        None => rest.len() >= max,
    }
}

/// A complete head's request line length (its line feed excluded), and whether any of its lines
/// ends with a bare LF. A request's header line begins with its name (httparse takes no
/// whitespace there: no obs-fold), so the line feeds are those right before the `headers`'
/// names and the head's last two: its last line's and its empty line's.
/// `head` begins with its request line: `skip_empty_lines` took the empty lines before it, so
/// httparse skips none of its own.
fn line_ends(head: &[u8], headers: &[httparse::Header<'_>]) -> (usize, bool) {
    let bare = |lf: usize| head[lf - 1] != b'\r';
    let len = head.len();
    // The empty line ending the head is CR LF or a bare LF.
    let (last, empty_bare) = if head[len - 2] == b'\r' {
        (len - 3, false)
    } else {
        (len - 2, true)
    };
    let base = head.as_ptr().addr();
    let mut lfs = headers.iter().map(|h| h.name.as_ptr().addr() - base - 1);
    let first = lfs.clone().next().unwrap_or(last);
    (first, empty_bare || bare(last) || lfs.any(bare))
}

/// The second pass: splits the head off `buf` and builds it (or, a head not complete, drops the
/// empty lines before it).
fn finish(
    buf: &mut BytesMut,
    scanned: Scanned,
    spans: &[MaybeUninit<Span>],
    cached: &mut Option<HeaderMap>,
) -> Result<Option<RequestHead>, HeadError> {
    let line = match scanned {
        Scanned::Partial { skipped } => {
            buf.advance(skipped);
            return Ok(None);
        }
        Scanned::Complete(line) => line,
    };
    let taken = buf.split_to(line.end).freeze();
    match build(&taken, line, spans, cached) {
        Ok(head) => Ok(Some(head)),
        Err(e) => {
            let mut whole = BytesMut::with_capacity(taken.len() + buf.len());
            whole.extend_from_slice(&taken);
            whole.extend_from_slice(buf);
            *buf = whole;
            Err(e)
        }
    }
}

/// The head out of `taken`, the bytes split off the buffer, which `line` and `spans` index.
fn build(
    taken: &Bytes,
    line: Line,
    spans: &[MaybeUninit<Span>],
    cached: &mut Option<HeaderMap>,
) -> Result<RequestHead, HeadError> {
    let uri = Uri::from_maybe_shared(taken.slice(line.target.0..line.target.1))
        .map_err(|_| HeadError::Malformed)?;
    let connect = line.method == Method::CONNECT;
    let http_11 = line.version == Version::HTTP_11;
    let mut headers = cached
        .take()
        .unwrap_or_else(|| HeaderMap::with_capacity(line.headers));
    let mut framing = Framing::default();
    for span in &spans[..line.headers] {
        // SAFETY: `scan` wrote the first `line.headers` spans, one for each header httparse read.
        let span = unsafe { span.assume_init() };
        let name = header_name(&taken[span.name.0..span.name.1])?;
        // SAFETY: httparse took these bytes for a header value, so they are HTAB, SP, visible
        // ASCII or obs-text (0x80-0xFF): the bytes a `HeaderValue` may hold.
        let value = unsafe {
            HeaderValue::from_maybe_shared_unchecked(taken.slice(span.value.0..span.value.1))
        };
        framing.note(&name, &value, http_11)?;
        headers.append(name, value);
    }
    let (body, refused) = if framing.transfer_encoding {
        if !framing.last_chunked {
            return Err(HeadError::Malformed);
        }
        (
            BodyFraming::Chunked,
            framing.lengths > 0 || framing.chunked > 1,
        )
    } else {
        let body = match framing.length {
            None | Some(0) => BodyFraming::Empty,
            Some(n) => BodyFraming::Length(n),
        };
        (body, framing.lengths > 1)
    };
    Ok(RequestHead {
        method: line.method,
        uri,
        version: line.version,
        headers,
        // What follows a CONNECT's head is the tunnel's, not a body (llhttp).
        body: if connect { BodyFraming::Empty } else { body },
        keep_alive: !framing.close && (http_11 || framing.keep_alive) && !connect,
        expect_continue: http_11 && framing.expect_names_continue,
        expectation_failed: http_11 && framing.expect && !framing.expect_names_continue,
        te_trailers: framing.te_trailers,
        framing_refused: line.bare_lf || refused,
        hosts: framing.hosts,
    })
}

/// A header's name; `Host`, in every HTTP/1.1 head, without `HeaderName::from_bytes`'s
/// lowercased copy.
fn header_name(name: &[u8]) -> Result<HeaderName, HeadError> {
    if name.eq_ignore_ascii_case(b"host") {
        return Ok(header::HOST);
    }
    HeaderName::from_bytes(name).map_err(|_| HeadError::Malformed)
}

/// What the framing headers (and the `Host` lines) of a head said, header by header.
#[derive(Default)]
struct Framing {
    /// The `Content-Length` value, and how many values were given (lines and list elements).
    length: Option<u64>,
    lengths: usize,
    transfer_encoding: bool,
    /// The last `Transfer-Encoding` line's last coding is `chunked` (hyper's `is_chunked_`).
    last_chunked: bool,
    /// `chunked` codings among all `Transfer-Encoding` lines.
    chunked: usize,
    /// `Connection` tokens seen.
    close: bool,
    keep_alive: bool,
    /// An `Expect` line was seen, and one of them names `100-continue` as Node finds it.
    expect: bool,
    expect_names_continue: bool,
    /// A `TE` token is `trailers`.
    te_trailers: bool,
    /// The `Host` lines seen.
    hosts: Hosts,
}

impl Framing {
    fn note(
        &mut self,
        name: &HeaderName,
        value: &HeaderValue,
        http_11: bool,
    ) -> Result<(), HeadError> {
        match *name {
            header::TRANSFER_ENCODING => {
                if !http_11 {
                    return Err(HeadError::Malformed);
                }
                self.transfer_encoding = true;
                self.last_chunked = false;
                for coding in tokens(value) {
                    self.last_chunked = coding.eq_ignore_ascii_case("chunked");
                    self.chunked += usize::from(self.last_chunked);
                }
            }
            header::CONTENT_LENGTH => {
                for element in value.as_bytes().split(|&b| b == b',') {
                    let n = digits(element.trim_ascii()).ok_or(HeadError::Malformed)?;
                    if self.length.is_some_and(|length| length != n) {
                        return Err(HeadError::Malformed);
                    }
                    self.length = Some(n);
                    self.lengths += 1;
                }
            }
            header::CONNECTION => {
                for token in tokens(value) {
                    self.close |= token.eq_ignore_ascii_case("close");
                    self.keep_alive |= token.eq_ignore_ascii_case("keep-alive");
                }
            }
            header::EXPECT => {
                self.expect = true;
                self.expect_names_continue |= names_100_continue(value.as_bytes());
            }
            header::TE => {
                self.te_trailers |= tokens(value).any(|t| t.eq_ignore_ascii_case("trailers"));
            }
            header::HOST => self.hosts = self.hosts.and(value.as_bytes()),
            _ => {}
        }
        Ok(())
    }
}

/// Whether an `Expect` value holds `100-continue` (any case) with no word character (ASCII
/// letter, digit, `_`) right before or after it: Node's `/(?:^|\W)100-continue(?:$|\W)/i` on
/// the value (Node joins several lines with `, `: any line that matches makes the whole match).
fn names_100_continue(value: &[u8]) -> bool {
    const TOKEN: &[u8] = b"100-continue";
    let word = |b: &u8| b.is_ascii_alphanumeric() || *b == b'_';
    value.windows(TOKEN.len()).enumerate().any(|(at, w)| {
        w.eq_ignore_ascii_case(TOKEN)
            && (at == 0 || !word(&value[at - 1]))
            && value.get(at + TOKEN.len()).is_none_or(|b| !word(b))
    })
}

/// The comma-separated tokens of a value, trimmed; none if it is not visible ASCII (hyper's
/// `to_str`).
fn tokens(value: &HeaderValue) -> impl Iterator<Item = &str> {
    value
        .to_str()
        .ok()
        .into_iter()
        .flat_map(|s| s.split(','))
        .map(str::trim)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        max_head_bytes: 16 * 1024,
        max_headers: 100,
    };

    /// Parses `bytes` within `limits`; what is left in the buffer.
    fn parse_in(
        bytes: &[u8],
        limits: &Limits,
    ) -> (Result<Option<RequestHead>, HeadError>, BytesMut) {
        let mut buf = BytesMut::from(bytes);
        let parsed = parse(&mut buf, limits, &mut None);
        (parsed, buf)
    }

    /// A complete head out of `bytes`, the whole of them.
    fn head(bytes: &[u8]) -> RequestHead {
        match parse_in(bytes, &LIMITS) {
            (Ok(Some(head)), rest) if rest.is_empty() => head,
            (other, rest) => panic!("{:?}: {other:?}, {rest:?} left", bytes.escape_ascii()),
        }
    }

    /// The error for `bytes`, which it leaves in the buffer as they were.
    fn error_in(bytes: &[u8], limits: &Limits) -> HeadError {
        match parse_in(bytes, limits) {
            (Err(e), rest) if rest == bytes => e,
            (other, rest) => panic!("{:?}: {other:?}, {rest:?} left", bytes.escape_ascii()),
        }
    }

    fn error(bytes: &[u8]) -> HeadError {
        error_in(bytes, &LIMITS)
    }

    /// The body framing and `framing_refused` of an HTTP/1.1 POST with these header lines.
    fn framing(lines: &str) -> (BodyFraming, bool) {
        let head = head(format!("POST / HTTP/1.1\r\nHost: x\r\n{lines}\r\n").as_bytes());
        (head.body, head.framing_refused)
    }

    fn framing_error(lines: &str) -> HeadError {
        error(format!("POST / HTTP/1.1\r\nHost: x\r\n{lines}\r\n").as_bytes())
    }

    #[test]
    fn simple_get_leaves_the_pipelined_bytes() {
        let (parsed, rest) = parse_in(
            b"GET /a/b?c=d HTTP/1.1\r\nHost: example.com\r\nAccept: */*\r\n\r\nGET /next HTTP/1.1\r\n",
            &LIMITS,
        );
        let head = parsed.unwrap().unwrap();
        assert_eq!(head.method, Method::GET);
        assert_eq!(head.uri.path(), "/a/b");
        assert_eq!(head.uri.query(), Some("c=d"));
        assert_eq!(head.version, Version::HTTP_11);
        assert_eq!(head.headers.len(), 2);
        assert_eq!(head.headers["host"], "example.com");
        assert_eq!(head.headers["accept"], "*/*");
        assert!(head.keep_alive);
        assert!(!head.expect_continue);
        assert!(!head.framing_refused);
        assert_eq!(head.body, BodyFraming::Empty);
        assert_eq!(&rest[..], b"GET /next HTTP/1.1\r\n");
    }

    #[test]
    fn a_partial_head_waits_at_every_split() {
        let whole: &[u8] = b"POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc";
        let head_len = whole.len() - 3;
        for at in 0..head_len {
            let mut buf = BytesMut::from(&whole[..at]);
            assert!(
                parse(&mut buf, &LIMITS, &mut None).unwrap().is_none(),
                "split at {at}"
            );
            assert_eq!(&buf[..], &whole[..at], "split at {at}");
            buf.extend_from_slice(&whole[at..]);
            let head = parse(&mut buf, &LIMITS, &mut None).unwrap().unwrap();
            assert_eq!(head.method, Method::POST);
            assert_eq!(head.uri, "/p");
            assert_eq!(head.headers["content-length"], "3");
            assert_eq!(head.body, BodyFraming::Length(3));
            assert!(!head.framing_refused);
            assert_eq!(&buf[..], b"abc", "split at {at}");
        }
    }

    #[test]
    fn keep_alive_and_expect_follow_the_version() {
        let keep_alive = |bytes: &[u8]| head(bytes).keep_alive;
        assert!(keep_alive(b"GET / HTTP/1.1\r\n\r\n"));
        assert!(keep_alive(
            b"GET / HTTP/1.1\r\nConnection: keep-alive\r\n\r\n"
        ));
        assert!(!keep_alive(
            b"GET / HTTP/1.1\r\nConnection: Upgrade, CLOSE\r\n\r\n"
        ));
        assert!(!keep_alive(
            b"GET / HTTP/1.1\r\nConnection: close\r\nConnection: keep-alive\r\n\r\n"
        ));
        assert!(!keep_alive(b"GET / HTTP/1.0\r\n\r\n"));
        assert!(keep_alive(
            b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n"
        ));
        assert!(keep_alive(
            b"GET / HTTP/1.0\r\nConnection: foo , keep-alive\r\n\r\n"
        ));
        assert!(keep_alive(
            b"GET / HTTP/1.0\r\nX: y\r\nConnection: foo\r\nConnection: keep-alive\r\n\r\n"
        ));
        assert!(!keep_alive(
            b"GET / HTTP/1.0\r\nConnection: keep-alive\r\nConnection: close\r\n\r\n"
        ));
        assert!(!keep_alive(
            b"GET / HTTP/1.0\r\nConnection: keep-alive-ish\r\n\r\n"
        ));
        assert_eq!(head(b"GET / HTTP/1.0\r\n\r\n").version, Version::HTTP_10);

        let expect = |bytes: &[u8]| head(bytes).expect_continue;
        assert!(expect(
            b"PUT / HTTP/1.1\r\nExpect: 100-Continue\r\nContent-Length: 1\r\n\r\n"
        ));
        assert!(!expect(
            b"PUT / HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\n"
        ));
        assert!(expect(b"PUT / HTTP/1.1\r\nExpect: 100-continue, x\r\n\r\n"));
        assert!(expect(
            b"PUT / HTTP/1.1\r\nExpect: 100-continue\r\nExpect: foo\r\n\r\n"
        ));
        assert!(!expect(b"PUT / HTTP/1.1\r\nExpect: foo\r\n\r\n"));
    }

    #[test]
    fn body_framing_as_hyper_with_node_refusals_noted() {
        use BodyFraming::*;
        assert_eq!(framing(""), (Empty, false));
        assert_eq!(framing("Content-Length: 0\r\n"), (Empty, false));
        assert_eq!(framing("Content-Length: 42\r\n"), (Length(42), false));
        assert_eq!(
            framing("Content-Length: 18446744073709551615\r\n"),
            (Length(u64::MAX), false)
        );
        assert_eq!(framing("Transfer-Encoding: chunked\r\n"), (Chunked, false));
        assert_eq!(framing("Transfer-Encoding: CHUNKED\r\n"), (Chunked, false));
        assert_eq!(
            framing("Transfer-Encoding: gzip, chunked\r\n"),
            (Chunked, false)
        );
        assert_eq!(
            framing("Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n"),
            (Chunked, false)
        );
        // Node refuses these; hyper serves them.
        assert_eq!(
            framing("Content-Length: 5\r\nTransfer-Encoding: chunked\r\n"),
            (Chunked, true)
        );
        assert_eq!(
            framing("Transfer-Encoding: chunked\r\nContent-Length: 5\r\n"),
            (Chunked, true)
        );
        assert_eq!(
            framing("Content-Length: 5\r\nContent-Length: 5\r\n"),
            (Length(5), true)
        );
        assert_eq!(framing("Content-Length: 5, 5\r\n"), (Length(5), true));
        assert_eq!(
            framing("Content-Length: 0\r\nContent-Length: 0\r\n"),
            (Empty, true)
        );
        assert_eq!(
            framing("Transfer-Encoding: chunked, chunked\r\n"),
            (Chunked, true)
        );
        assert_eq!(
            framing("Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n"),
            (Chunked, true)
        );
        // hyper refuses these.
        for lines in [
            "Content-Length: 5\r\nContent-Length: 6\r\n",
            "Content-Length: 5, 6\r\n",
            "Content-Length: 5,\r\n",
            "Content-Length: \r\n",
            "Content-Length: +5\r\n",
            "Content-Length: -1\r\n",
            "Content-Length: 5x\r\n",
            "Content-Length: 0x5\r\n",
            "Content-Length: 18446744073709551616\r\n",
            "Transfer-Encoding: gzip\r\n",
            "Transfer-Encoding: chunked, gzip\r\n",
            "Transfer-Encoding: chunked\r\nTransfer-Encoding: gzip\r\n",
            "Transfer-Encoding: \r\n",
        ] {
            assert_eq!(framing_error(lines), HeadError::Malformed, "{lines:?}");
        }
        assert_eq!(
            error(b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n"),
            HeadError::Malformed
        );
    }

    #[test]
    fn a_bare_line_feed_anywhere_in_the_head_is_refused() {
        for bytes in [
            &b"GET / HTTP/1.1\nHost: x\r\nX: y\r\n\r\n"[..],
            b"GET / HTTP/1.1\r\nHost: x\nX: y\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: x\r\nX: y\n\r\n",
            b"GET / HTTP/1.1\r\nHost: x\r\nX: y\r\n\n",
            b"GET / HTTP/1.1\nHost: x\nX: y\n\n",
            b"GET / HTTP/1.1\n\n",
        ] {
            let head = head(bytes);
            assert!(head.framing_refused, "{:?}", bytes.escape_ascii());
            assert_eq!(head.body, BodyFraming::Empty);
        }
        let head = head(b"GET / HTTP/1.1\r\nHost: x\r\nX: y\r\n\r\n");
        assert!(!head.framing_refused);
        assert_eq!(head.headers["x"], "y");
    }

    #[test]
    fn empty_lines_before_the_request_line_are_skipped() {
        let (parsed, rest) = parse_in(b"\r\n\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\nrest", &LIMITS);
        let head = parsed.unwrap().unwrap();
        assert_eq!(head.uri, "/");
        assert!(!head.framing_refused);
        assert_eq!(&rest[..], b"rest");

        // Not complete: they are dropped, a CR that may begin one kept.
        let (parsed, rest) = parse_in(b"\r\n\n\r", &LIMITS);
        assert!(parsed.unwrap().is_none());
        assert_eq!(&rest[..], b"\r");
        let (parsed, rest) = parse_in(b"\n\r\nGET / HT", &LIMITS);
        assert!(parsed.unwrap().is_none());
        assert_eq!(&rest[..], b"GET / HT");
        assert_eq!(error(b"\r\n\rGET / HTTP/1.1\r\n\r\n"), HeadError::Malformed);

        // They count toward no limit.
        let limits = Limits {
            max_head_bytes: 18,
            max_headers: 100,
        };
        let (parsed, rest) = parse_in(b"\r\n\r\n\r\nGET / HTTP/1.1\r\n\r\n", &limits);
        assert_eq!(parsed.unwrap().unwrap().uri, "/");
        assert!(rest.is_empty());
    }

    #[test]
    fn a_long_request_line_is_414_long_headers_431() {
        let limits = Limits {
            max_head_bytes: 32,
            max_headers: 100,
        };
        let line = b"GET /aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa HTTP/1.1\r\n\r\n";
        // The request line, no line feed in `max_head_bytes` bytes: 414, complete or not.
        let (parsed, _) = parse_in(&line[..31], &limits);
        assert!(parsed.unwrap().is_none());
        assert_eq!(error_in(&line[..32], &limits), HeadError::UriTooLong);
        assert_eq!(error_in(&line[..40], &limits), HeadError::UriTooLong);
        assert_eq!(error_in(line, &limits), HeadError::UriTooLong);
        // Its CR counts: a line feed at the limit is past it.
        let exact = b"GET /aaaaaaaaaaaaaaaaaaaaaaa HTTP/1.1\r\n\r\n";
        let lf = exact.iter().position(|&b| b == b'\n').unwrap();
        let at = |max_head_bytes| Limits {
            max_head_bytes,
            max_headers: 100,
        };
        assert_eq!(error_in(exact, &at(lf)), HeadError::UriTooLong);
        assert_eq!(error_in(exact, &at(lf + 2)), HeadError::TooLarge);
        let (parsed, _) = parse_in(exact, &at(lf + 3));
        assert_eq!(parsed.unwrap().unwrap().uri.path().len(), 24);
        // 414 before anything else wrong with the bytes.
        assert_eq!(
            error_in(b"G@T /aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", &limits),
            HeadError::UriTooLong
        );

        // A request line in the limit, headers over it: 431, complete or not.
        let long = b"GET / HTTP/1.1\r\nHost: x\r\nX: yyyyyyyyyyyyyyyyyyyy\r\n\r\n";
        let (parsed, _) = parse_in(&long[..31], &limits);
        assert!(parsed.unwrap().is_none());
        assert_eq!(error_in(&long[..32], &limits), HeadError::TooLarge);
        assert_eq!(error_in(long, &limits), HeadError::TooLarge);
        // A complete head of exactly the limit is served.
        let fits = b"GET / HTTP/1.1\r\nHost: xxxxxx\r\n\r\nbody";
        assert_eq!(fits.len(), 32 + 4);
        let (parsed, rest) = parse_in(fits, &limits);
        assert_eq!(parsed.unwrap().unwrap().headers["host"], "xxxxxx");
        assert_eq!(&rest[..], b"body");
        let over = b"GET / HTTP/1.1\r\nHost: xxxxxxx\r\n\r\n";
        assert_eq!(error_in(over, &limits), HeadError::TooLarge);
    }

    #[test]
    fn a_target_over_hyper_s_uri_limit_is_414() {
        let limits = Limits {
            max_head_bytes: 1 << 20,
            max_headers: 100,
        };
        let request = |len: usize| format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(len - 1));
        let (parsed, _) = parse_in(request(MAX_URI_LEN).as_bytes(), &limits);
        assert_eq!(parsed.unwrap().unwrap().uri.path().len(), MAX_URI_LEN);
        assert_eq!(
            error_in(request(MAX_URI_LEN + 1).as_bytes(), &limits),
            HeadError::UriTooLong
        );
    }

    #[test]
    fn too_many_headers_is_431() {
        let request = |count: usize| {
            let mut bytes = String::from("GET / HTTP/1.1\r\n");
            for i in 0..count {
                bytes.push_str(&format!("X-{i}: {i}\r\n"));
            }
            bytes + "\r\n"
        };
        let limits = |max_headers| Limits {
            max_head_bytes: 16 * 1024,
            max_headers,
        };
        for max in [0, 2, 100, 150] {
            let (parsed, _) = parse_in(request(max).as_bytes(), &limits(max));
            let head = parsed.unwrap().unwrap();
            assert_eq!(head.headers.len(), max);
            if max > 0 {
                assert_eq!(
                    head.headers[format!("x-{}", max - 1)],
                    format!("{}", max - 1)
                );
            }
            assert_eq!(
                error_in(request(max + 1).as_bytes(), &limits(max)),
                HeadError::TooLarge,
                "{max}"
            );
        }
    }

    #[test]
    fn the_http2_preface_is_told_apart() {
        assert_eq!(error(H2_PREFACE), HeadError::Http2Preface);
        assert_eq!(error(b"PRI * HTTP/2.0\r\n"), HeadError::Http2Preface);
        assert_eq!(error(b"PRI * HTTP/2.0\r\n\r\nS"), HeadError::Http2Preface);
        let mut more = H2_PREFACE.to_vec();
        more.extend_from_slice(b"\0\0\x12\x04");
        assert_eq!(error(&more), HeadError::Http2Preface);
        // Its request line not complete yet: read more.
        for at in 1..H2_PREFACE_LINE {
            let (parsed, rest) = parse_in(&H2_PREFACE[..at], &LIMITS);
            assert!(parsed.unwrap().is_none(), "{at}");
            assert_eq!(&rest[..], &H2_PREFACE[..at]);
        }
        // Not the preface.
        assert_eq!(
            error(b"PRI * HTTP/2.0\r\nHost: x\r\n\r\n"),
            HeadError::Malformed
        );
        assert_eq!(error(b"PRI * HTTP/2.1\r\n"), HeadError::Malformed);
        assert_eq!(error(b"GET / HTTP/2.0\r\n\r\n"), HeadError::Malformed);
    }

    #[test]
    fn malformed_heads_are_400() {
        for bytes in [
            &b"GET  / HTTP/1.1\r\n\r\n"[..],
            b"GET / HTTP/1.2\r\n\r\n",
            b"GET / HTTP/3\r\n\r\n",
            b"GET /\r\n\r\n",
            b"GET / HTTP/1.1 \r\n\r\n",
            b"G@T / HTTP/1.1\r\n\r\n",
            b"GET /a b HTTP/1.1\r\n\r\n",
            b"GET / HTTP/1.1\r\nBad Name: x\r\n\r\n",
            b"GET / HTTP/1.1\r\n: x\r\n\r\n",
            b"GET / HTTP/1.1\r\nX: a\0b\r\n\r\n",
            b"GET / HTTP/1.1\r\nX: a\rb\r\n\r\n",
            b"GET / HTTP/1.1\r\n X: y\r\n\r\n",
            // Targets httparse takes and `http::Uri` refuses (found after the split, put back).
            b"GET /a<b HTTP/1.1\r\n\r\n",
            b"GET /a`b HTTP/1.1\r\n\r\n",
            b"GET http:// HTTP/1.1\r\n\r\n",
            b"GET http://[::1 HTTP/1.1\r\nHost: x\r\n\r\n",
        ] {
            assert_eq!(
                error(bytes),
                HeadError::Malformed,
                "{:?}",
                bytes.escape_ascii()
            );
        }
        // Put back with the bytes after the head.
        let bytes = b"\r\nGET / HTTP/1.1\r\nContent-Length: x\r\n\r\nGET / HTTP/1.1\r\n\r\n";
        assert_eq!(error(bytes), HeadError::Malformed);
    }

    #[test]
    fn absolute_and_asterisk_form_targets() {
        let head = head(b"GET http://example.com:8080/a?b HTTP/1.1\r\nHost: example.com\r\n\r\n");
        assert_eq!(head.uri.scheme_str(), Some("http"));
        assert_eq!(head.uri.authority().unwrap(), "example.com:8080");
        assert_eq!(head.uri.path(), "/a");
        assert_eq!(head.uri.query(), Some("b"));

        let head = self::head(b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(head.method, Method::OPTIONS);
        assert_eq!(head.uri, "*");
        assert_eq!(head.uri.path(), "*");
    }

    /// Node 20's `http.METHODS`.
    const NODE_METHODS: &str = "ACL BIND CHECKOUT CONNECT COPY DELETE GET HEAD LINK LOCK M-SEARCH \
        MERGE MKACTIVITY MKCALENDAR MKCOL MOVE NOTIFY OPTIONS PATCH POST PROPFIND PROPPATCH PURGE \
        PUT QUERY REBIND REPORT SEARCH SOURCE SUBSCRIBE TRACE UNBIND UNLINK UNLOCK UNSUBSCRIBE";

    /// That a head with this request line (and a `Host`) is malformed.
    fn assert_malformed_line(line: &[u8]) {
        let bytes = [line, b"\r\nHost: h\r\n\r\n"].concat();
        assert_eq!(
            error(&bytes),
            HeadError::Malformed,
            "{:?}",
            line.escape_ascii()
        );
    }

    #[test]
    fn methods_are_uppercase_letters_dashes_and_underscores() {
        for name in NODE_METHODS.split_ascii_whitespace().chain([
            "FOO",
            "BREW",
            "GETS",
            "PRI",
            "X_Y-Z",
            "A_VERY_LONG_EXTENSION_METHOD",
        ]) {
            let target = if name == "CONNECT" { "h:80" } else { "/" };
            let head = head(format!("{name} {target} HTTP/1.1\r\nHost: h\r\n\r\n").as_bytes());
            assert_eq!(head.method.as_str(), name);
        }
        assert_eq!(NODE_METHODS.split_ascii_whitespace().count(), 35);
        for line in [
            &b"get / HTTP/1.1"[..],
            b"Get / HTTP/1.1",
            b"post / HTTP/1.1",
            b"M-SEARCh * HTTP/1.1",
            b"G!T / HTTP/1.1",
            b"G.T / HTTP/1.1",
            b"GET1 / HTTP/1.1",
            b"connect h:80 HTTP/1.1",
        ] {
            assert_malformed_line(line);
        }
    }

    #[test]
    fn target_forms_follow_the_method() {
        for line in [
            &b"GET / HTTP/1.1"[..],
            b"GET //a?b HTTP/1.1",
            b"GET http://h HTTP/1.1",
            b"GET foo://h/a HTTP/1.1",
            b"GET * HTTP/1.1",
            b"POST * HTTP/1.1",
            b"OPTIONS * HTTP/1.1",
            b"CONNECT h:80 HTTP/1.1",
            b"CONNECT 127.0.0.1:443 HTTP/1.1",
            b"CONNECT [::1]:80 HTTP/1.1",
        ] {
            let bytes = [line, b"\r\nHost: h\r\n\r\n"].concat();
            head(&bytes);
        }
        for line in [
            // Authority-form, or what `http::Uri` reads as one, but for CONNECT.
            &b"GET h:80 HTTP/1.1"[..],
            b"OPTIONS h:80 HTTP/1.1",
            b"GET a HTTP/1.1",
            b"GET mailto:a HTTP/1.1",
            b"GET *x HTTP/1.1",
            b"GET ://h/a HTTP/1.1",
            // A scheme that does not start with a letter, or has a byte RFC 3986's has not.
            b"GET 1://h/ HTTP/1.1",
            b"GET -://h/ HTTP/1.1",
            b"GET ~://h/ HTTP/1.1",
            b"GET a~b://h/ HTTP/1.1",
            // CONNECT: authority-form with a port, no userinfo, and nothing else.
            b"CONNECT / HTTP/1.1",
            b"CONNECT * HTTP/1.1",
            b"CONNECT http://h:80/ HTTP/1.1",
            b"CONNECT h HTTP/1.1",
            b"CONNECT h: HTTP/1.1",
            b"CONNECT u@h:80 HTTP/1.1",
            // A byte over 0x7F anywhere.
            b"GET /a\xc3\xa9 HTTP/1.1",
            b"GET /\x80 HTTP/1.1",
            b"GET /a?\xff HTTP/1.1",
            b"GET http://h/\xc3\xa9 HTTP/1.1",
            b"CONNECT h\xc3\xa9:80 HTTP/1.1",
        ] {
            assert_malformed_line(line);
        }
    }

    #[test]
    fn a_connect_keeps_no_connection_and_has_no_body() {
        let (parsed, rest) = parse_in(
            b"CONNECT h:443 HTTP/1.1\r\nHost: h:443\r\nContent-Length: 5\r\n\r\n\
              helloGET /next HTTP/1.1\r\n\r\n",
            &LIMITS,
        );
        let head = parsed.unwrap().unwrap();
        assert_eq!(head.method, Method::CONNECT);
        assert_eq!(head.uri.authority().unwrap(), "h:443");
        assert_eq!(head.uri.path(), "");
        assert!(!head.keep_alive);
        assert_eq!(head.body, BodyFraming::Empty);
        // The bytes after the head are left as they are, for no one to parse.
        assert_eq!(&rest[..], b"helloGET /next HTTP/1.1\r\n\r\n");
        let head = self::head(b"CONNECT h:443 HTTP/1.1\r\nConnection: keep-alive\r\n\r\n");
        assert!(!head.keep_alive);
    }

    #[test]
    fn an_expect_node_does_not_read_as_100_continue_fails_on_http_1_1() {
        let failed = |lines: &str, version: &str| {
            let bytes = format!("PUT / {version}\r\nHost: h\r\n{lines}Content-Length: 1\r\n\r\n");
            head(bytes.as_bytes()).expectation_failed
        };
        for lines in [
            "Expect: foo\r\n",
            "Expect:\r\n",
            "Expect: 100-continuex\r\n",
            "Expect: a100-continue\r\n",
            "Expect: _100-continue\r\n",
            "Expect: 100-continu\r\n",
            "Expect: foo\r\nExpect: bar\r\n",
        ] {
            assert!(failed(lines, "HTTP/1.1"), "{lines:?}");
            // HTTP/1.0: Expect is not read.
            assert!(!failed(lines, "HTTP/1.0"), "{lines:?}");
        }
        for lines in [
            "",
            "Expect: 100-continue\r\n",
            "Expect: 100-CONTINUE\r\n",
            "Expect: 100-continue, x\r\n",
            "Expect: x;100-continue\r\n",
            "Expect: (100-continue)\r\n",
            "Expect: foo\r\nExpect: 100-continue\r\n",
            "Expect: 100-continue\r\nExpect: foo\r\n",
        ] {
            assert!(!failed(lines, "HTTP/1.1"), "{lines:?}");
        }
        // A byte over 0x7F is no word character (Node reads values as latin1).
        let head = head(b"PUT / HTTP/1.1\r\nHost: h\r\nExpect: \xe9100-continue\r\n\r\n");
        assert!(!head.expectation_failed);
        // Node's match asks for a `100 Continue` wherever it is found.
        let head = self::head(b"PUT / HTTP/1.1\r\nExpect: 100-continue, x\r\n\r\n");
        assert!(head.expect_continue && !head.expectation_failed);
    }

    #[test]
    fn obs_text_values_are_kept_byte_exact() {
        let head = head(b"GET / HTTP/1.1\r\nX-Name: caf\xe9 \x80\xff\r\nEmpty:\r\n\r\n");
        assert_eq!(head.headers["x-name"].as_bytes(), b"caf\xe9 \x80\xff");
        assert_eq!(head.headers["empty"].as_bytes(), b"");
    }

    #[test]
    fn statuses() {
        assert_eq!(HeadError::Malformed.status(), StatusCode::BAD_REQUEST);
        assert_eq!(HeadError::UriTooLong.status(), StatusCode::URI_TOO_LONG);
        assert_eq!(
            HeadError::TooLarge.status(),
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
        );
        assert_eq!(HeadError::Http2Preface.status(), StatusCode::BAD_REQUEST);
    }
}
