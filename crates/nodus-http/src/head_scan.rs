//! The framing facts of an HTTP/1 request head that hyper's parse hides, gathered as the
//! connection reads it.
//!
//! httparse takes a bare line feed for a line's end, and hyper keeps one `Content-Length` of
//! several equal ones and drops it beside `Transfer-Encoding`; Node (llhttp, strict) answers all
//! three with 400, and a proxy that reads the head otherwise is the stuff of request smuggling. A
//! [`Scan`] follows the bytes of a head as they are read (`head_wait::line_read`, in the read
//! that brings them) and notes them, so that the server refuses the request before its handler.
//!
//! Invariants:
//! - One pass over the bytes of the head, none over the body: each line is searched for its line
//!   feed, the byte before it checked for a CR, and its first bytes compared with the two names,
//!   most lines leaving the comparison at their first byte. Nothing is allocated; a scan is a
//!   few words, kept in the connection's head wait.
//! - Two ways, one answer: a head read whole by the wait's first read (the common case) is
//!   scanned 16 bytes at a time for its line feeds (`LineFeeds`, SSE2 on x86_64), only the bytes
//!   around each looked at ([`Scan::whole`]); any other read is followed a byte at a time but for
//!   the line feed search, from any state ([`Scan::follow`]). Both give the same scan of the
//!   same head (tested on random heads), `cr` included, so that a scan is a function of the bytes
//!   read, not of how they were split.
//! - A scan begins where the head wait began: the first byte is taken for the request line's,
//!   never a field name's. A head hyper had partly read ahead with the previous request is
//!   followed from the middle, so what a scan says counts only if its request line is the length
//!   of the request hyper parsed ([`Scan::refuses`]); otherwise (a pipelined head) it says
//!   nothing and the request is served as hyper parsed it.
//! - Names and line ends are followed across reads: a head split anywhere is scanned as if read
//!   at once.

/// What a connection has read of a request head since it began waiting for it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Scan {
    /// Bytes of the request line read so far, its line feed excluded (its CR, if any, included).
    line: usize,
    at: At,
    /// The last byte followed was a CR (kept only where the next one may need it: where a line
    /// feed is searched for; false at the head's end).
    cr: bool,
    /// What Node refuses a head for was seen: a line ended by a line feed without a CR,
    /// `Content-Length` twice, or with `Transfer-Encoding`.
    refused: bool,
    /// A `Content-Length` field line.
    content_length: bool,
    /// A `Transfer-Encoding` field line.
    transfer_encoding: bool,
    /// Where the request line's first `#` is (a fragment, which the parsed target drops), and
    /// the last space after it (before the version): what [`Scan::refuses`] leaves out of the
    /// line's length. Kept at the head's end only when it is refused.
    hash_at: Option<usize>,
    last_space: usize,
}

/// Where a scan is in the head.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum At {
    #[default]
    RequestLine,
    /// At a field line's first byte.
    LineStart,
    /// After a CR that began a line: the head's end if a line feed follows.
    EmptyCr,
    /// In a field name that matches `NAMES[name][..matched]` so far.
    Name { name: u8, matched: u8 },
    /// In a field line, past what the names are compared on.
    Rest,
    /// Past the head's empty line.
    End,
}

/// The field names compared, lowercase, with their colon (httparse refuses whitespace before it).
const NAMES: [&[u8]; 2] = [b"content-length:", b"transfer-encoding:"];

/// The first bytes of a line [`Scan::whole`] looks further at: a line end, the names' first.
static LOOKED_FOR: [bool; 256] = {
    let mut looked_for = [false; 256];
    let mut i = 0;
    while i < 6 {
        looked_for[b"\n\rcCtT"[i] as usize] = true;
        i += 1;
    }
    looked_for
};

/// In a request line (`line`, its line feed excluded): its first `#`, and the last space after
/// it (0 if none), as [`Scan::follow_request_line`] notes them.
fn fragment_bounds(line: &[u8]) -> (Option<usize>, usize) {
    match line.iter().position(|&b| b == b'#') {
        None => (None, 0),
        Some(h) => (
            Some(h),
            line[h..]
                .iter()
                .rposition(|&b| b == b' ')
                .map_or(0, |sp| h + sp),
        ),
    }
}

/// Whether `line` begins with `NAMES[name]`, in any case.
#[inline(never)]
fn is_name(line: &[u8], name: usize) -> bool {
    let want = NAMES[name];
    line.get(..want.len())
        .is_some_and(|got| got.eq_ignore_ascii_case(want))
}

/// The positions of the line feeds in some bytes, in order, found 16 bytes at a time: the
/// 16 bytes from `next` (the last 16, near the end) give a mask, whose bits are taken one by one.
struct LineFeeds<'a> {
    bytes: &'a [u8],
    /// The first byte no mask compared.
    next: usize,
    /// The line feeds among the bytes from `base` not yet taken, a bit each.
    mask: u32,
    base: usize,
}

impl<'a> LineFeeds<'a> {
    /// `None` for fewer than 16 bytes.
    fn new(bytes: &'a [u8]) -> Option<LineFeeds<'a>> {
        (bytes.len() >= 16).then_some(LineFeeds {
            bytes,
            next: 0,
            mask: 0,
            base: 0,
        })
    }
}

impl Iterator for LineFeeds<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        while self.mask == 0 {
            if self.next >= self.bytes.len() {
                return None;
            }
            // The last 16 bytes overlap those compared before: their bits are shifted out.
            let start = self.next.min(self.bytes.len() - 16);
            let chunk = self.bytes[start..].first_chunk::<16>()?;
            self.mask = lf_mask(chunk) >> (self.next - start);
            self.base = self.next;
            self.next = start + 16;
        }
        let at = self.base + self.mask.trailing_zeros() as usize;
        self.mask &= self.mask - 1;
        Some(at)
    }
}

/// A bit for each line feed among the 16 bytes (the first byte's the lowest): SSE2, part of
/// every x86_64.
#[cfg(target_arch = "x86_64")]
fn lf_mask(chunk: &[u8; 16]) -> u32 {
    use std::arch::x86_64::{_mm_cmpeq_epi8, _mm_loadu_si128, _mm_movemask_epi8, _mm_set1_epi8};
    // SAFETY: SSE2 is enabled on every x86_64 target; the load reads the 16 bytes of `chunk`
    // (an unaligned load: any address).
    unsafe {
        let bytes = _mm_loadu_si128(chunk.as_ptr().cast());
        _mm_movemask_epi8(_mm_cmpeq_epi8(bytes, _mm_set1_epi8(b'\n' as i8))) as u32
    }
}

/// A bit for each line feed among the 16 bytes (the first byte's the lowest).
#[cfg(any(not(target_arch = "x86_64"), test))]
fn lf_mask_bytewise(chunk: &[u8; 16]) -> u32 {
    chunk
        .iter()
        .enumerate()
        .fold(0, |mask, (i, &b)| mask | u32::from(b == b'\n') << i)
}

#[cfg(not(target_arch = "x86_64"))]
use lf_mask_bytewise as lf_mask;

impl Scan {
    /// Follows the head through `bytes`, the next bytes read.
    #[inline]
    pub(crate) fn read(&mut self, mut bytes: &[u8]) {
        if self.is_empty() {
            // Empty lines before the request line are skipped, as httparse and Node skip them.
            let skip = bytes
                .iter()
                .take_while(|&&b| b == b'\r' || b == b'\n')
                .count();
            bytes = &bytes[skip..];
            if let Some(whole) = Scan::whole(bytes) {
                *self = whole;
                return;
            }
        }
        self.follow(bytes);
    }

    /// Whether the head ended with a `Transfer-Encoding` line and no refusal: its body, if hyper
    /// reads one, is chunked (hyper refuses a request whose last coding is not).
    #[inline]
    pub(crate) fn ends_before_a_chunked_body(&self) -> bool {
        self.transfer_encoding && self.at == At::End && !self.refused
    }

    /// Where, in `bytes`, the read that ends the head this scan (the scan before that read)
    /// follows, the chunked body begins ([`Scan::ends_before_a_chunked_body`] after the read).
    #[cold]
    pub(crate) fn chunked_body_at(mut self, bytes: &[u8]) -> usize {
        let skip = if self.is_empty() {
            bytes
                .iter()
                .take_while(|&&b| b == b'\r' || b == b'\n')
                .count()
        } else {
            0
        };
        skip + self.follow(&bytes[skip..])
    }

    /// The scan of a head read whole at once, the first bytes of `bytes`: `None` if they do not
    /// hold all of it, or are fewer than 16. Only the line feeds are looked for (16 bytes at a
    /// time), and the first bytes of each line after one; it says what [`Scan::follow`] would.
    #[inline]
    fn whole(bytes: &[u8]) -> Option<Scan> {
        let mut scan = Scan::whole_unbounded(bytes)?;
        if scan.refused {
            (scan.hash_at, scan.last_space) = fragment_bounds(&bytes[..scan.line]);
        }
        Some(scan)
    }

    /// [`Scan::whole`] but for the request line's fragment, which only a refusal looks at.
    #[inline]
    fn whole_unbounded(bytes: &[u8]) -> Option<Scan> {
        let mut lfs = LineFeeds::new(bytes)?;
        let line = lfs.next()?;
        let mut scan = Scan {
            line,
            at: At::End,
            ..Scan::default()
        };
        let mut lf = line;
        loop {
            scan.refused |= bytes.get(lf.wrapping_sub(1)) != Some(&b'\r');
            let first = *bytes.get(lf + 1)?;
            // Most lines begin with none of the bytes looked for: one comparison.
            if LOOKED_FOR[usize::from(first)] {
                match first {
                    b'\n' => {
                        scan.refused = true;
                        return Some(scan);
                    }
                    b'\r' if *bytes.get(lf + 2)? == b'\n' => return Some(scan),
                    b'c' | b'C' if is_name(&bytes[lf + 1..], 0) => scan.named(0),
                    b't' | b'T' if is_name(&bytes[lf + 1..], 1) => scan.named(1),
                    _ => {}
                }
            }
            lf = lfs.next()?;
        }
    }

    /// [`Scan::read`] a byte at a time but for the line feed search: any head, from any state.
    /// How many of the bytes it followed: all of them, or those up to the head's end.
    #[inline(never)]
    fn follow(&mut self, bytes: &[u8]) -> usize {
        let mut i = 0;
        while let Some(&b) = bytes.get(i) {
            match self.at {
                At::RequestLine | At::Rest => {
                    let rest = &bytes[i..];
                    let Some(lf) = rest.iter().position(|&b| b == b'\n') else {
                        if self.at == At::RequestLine {
                            self.follow_request_line(rest);
                        }
                        self.cr = rest.last() == Some(&b'\r');
                        return bytes.len();
                    };
                    if self.at == At::RequestLine {
                        self.follow_request_line(&rest[..lf]);
                    }
                    let cr = match lf {
                        0 => self.cr,
                        _ => rest[lf - 1] == b'\r',
                    };
                    self.refused |= !cr;
                    self.at = At::LineStart;
                    i += lf + 1;
                    continue;
                }
                At::LineStart => {
                    self.at = match b.to_ascii_lowercase() {
                        b'\r' => At::EmptyCr,
                        b'\n' => {
                            self.refused = true;
                            At::End
                        }
                        b'c' => At::Name {
                            name: 0,
                            matched: 1,
                        },
                        b't' => At::Name {
                            name: 1,
                            matched: 1,
                        },
                        _ => At::Rest,
                    };
                }
                At::EmptyCr => {
                    // A CR alone is no line end: hyper refuses the head.
                    self.at = if b == b'\n' { At::End } else { At::Rest };
                    if !self.refused {
                        // Looked at only for a refusal, and [`Scan::whole`] does not note them.
                        (self.hash_at, self.last_space) = (None, 0);
                    }
                }
                At::Name { name, matched } => {
                    let want = NAMES[name as usize];
                    if b.to_ascii_lowercase() != want[matched as usize] {
                        // This byte may end the line: the line's rest is searched from it.
                        self.at = At::Rest;
                        self.cr = false;
                        continue;
                    }
                    let matched = matched + 1;
                    self.at = if usize::from(matched) < want.len() {
                        At::Name { name, matched }
                    } else {
                        self.named(name.into());
                        At::Rest
                    };
                }
                At::End => return i,
            }
            self.cr = b == b'\r';
            i += 1;
        }
        i
    }

    /// Bytes of the request line read so far (its line feed excluded), and whether it ended.
    pub(crate) fn request_line(&self) -> (usize, bool) {
        (self.line, self.at != At::RequestLine)
    }

    /// Follows `part`, the next bytes of the request line (no line feed among them).
    fn follow_request_line(&mut self, part: &[u8]) {
        for (at, &b) in (self.line..).zip(part) {
            match b {
                b'#' if self.hash_at.is_none() => self.hash_at = Some(at),
                b' ' if self.hash_at.is_some() => self.last_space = at,
                _ => {}
            }
        }
        self.line += part.len();
    }

    /// Notes a field line named `NAMES[name]`.
    fn named(&mut self, name: usize) {
        if name == 0 {
            self.refused |= self.content_length || self.transfer_encoding;
            self.content_length = true;
        } else {
            self.refused |= self.content_length;
            self.transfer_encoding = true;
        }
    }

    /// Whether nothing was read (the request line's state is the scan's only one then).
    pub(crate) fn is_empty(&self) -> bool {
        self.at == At::RequestLine && self.line == 0
    }

    /// Whether the scan noted what Node refuses a head for (a bare line feed, `Content-Length`
    /// twice, or with `Transfer-Encoding`), whichever head it followed.
    pub(crate) fn noted(&self) -> bool {
        self.refused
    }

    /// Whether Node refuses the head this scan followed ([`Scan::noted`]), given `line`, the
    /// length of the request line hyper parsed without its line end (asked for only then). A
    /// scan that did not follow that whole head says nothing.
    pub(crate) fn refuses(&self, line: impl FnOnce() -> usize) -> bool {
        self.noted() && self.at == At::End && {
            // Its CR, and an absolute target without a path (parsed, it has one: `/`), make one
            // byte of difference; the fragment is not in the parsed target at all.
            let fragment = self
                .hash_at
                .map_or(0, |h| self.last_space.saturating_sub(h));
            (self.line - fragment).abs_diff(line()) <= 1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(parts: &[&[u8]]) -> Scan {
        let mut scan = Scan::default();
        for part in parts {
            scan.read(part);
        }
        scan
    }

    /// Every way of splitting `head` in two reads scans as it does in one.
    fn same_split_anywhere(head: &[u8]) -> Scan {
        let whole = scan(&[head]);
        for at in 0..=head.len() {
            let split = scan(&[&head[..at], &head[at..]]);
            assert_eq!(split, whole, "split at {at}");
        }
        whole
    }

    /// The length of `head`'s request line as hyper parses it: no CR, no line feed.
    fn parsed_line(head: &[u8]) -> usize {
        head.windows(9).position(|w| w == b" HTTP/1.1").unwrap() + 9
    }

    #[test]
    fn a_well_formed_head_is_not_refused() {
        for head in [
            &b"GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive\r\n\r\n"[..],
            b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc\n\n",
            b"POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Type: t\r\n\r\n",
            b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Lengthy: 3\r\nContent-Length: 3\r\n\r\n",
        ] {
            let s = same_split_anywhere(head);
            assert_eq!(s.at, At::End);
            assert!(
                !s.refuses(|| parsed_line(head)),
                "{}",
                String::from_utf8_lossy(head)
            );
        }
    }

    #[test]
    fn bare_line_feeds_and_hidden_lengths_are_refused() {
        for head in [
            &b"GET / HTTP/1.1\nHost: a\r\n\r\n"[..],
            b"GET / HTTP/1.1\r\nHost: a\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\n\n",
            b"POST / HTTP/1.1\r\nContent-Length: 3\r\ncontent-length: 3\r\n\r\n",
            b"POST / HTTP/1.1\r\nTRANSFER-ENCODING: chunked\r\nContent-Length: 3\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
        ] {
            let s = same_split_anywhere(head);
            assert_eq!(s.at, At::End);
            assert!(
                s.refuses(|| parsed_line(head)),
                "{}",
                String::from_utf8_lossy(head)
            );
        }
    }

    #[test]
    fn a_scan_of_another_request_line_or_an_unended_head_says_nothing() {
        let s = scan(&[b"GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n"]);
        assert!(s.refuses(|| 14));
        // Begun in the middle of a head (the rest read ahead): not the parsed request line.
        assert!(!s.refuses(|| 20));
        let s = scan(&[b"GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n"]);
        assert!(!s.refuses(|| 14));
    }

    #[test]
    fn leading_empty_lines_fragments_and_a_target_without_a_path_still_refuse() {
        for (parts, parsed) in [
            // Empty lines before the request line are skipped (parsed: "GET / HTTP/1.1").
            (&[&b"\r\n\r\nGET / HTTP/1.1\nHost: a\r\n\r\n"[..]][..], 14),
            (&[b"\r\n", b"\r", b"\nGET / HTTP/1.1\nHost: a\r\n\r\n"], 14),
            // A fragment, left out of the parsed target ("GET /x HTTP/1.1").
            (&[b"GET /x#frag HTTP/1.1\r\nHost: a\nX: y\r\n\r\n"], 15),
            (&[b"GET /x#f", b"rag HTTP/1.1\r\nHost: a\nX: y\r\n\r\n"], 15),
            // An absolute target without a path: parsed, it has one ("GET http://a/ HTTP/1.1").
            (&[b"GET http://a HTTP/1.1\nHost: a\r\n\r\n"], 22),
        ] {
            let s = scan(parts);
            assert!(s.refuses(|| parsed), "{parts:?}: {s:?}");
        }
    }

    #[test]
    fn a_head_read_at_once_scans_as_followed_a_byte_at_a_time() {
        const PARTS: [&[u8]; 12] = [
            b"GET / HTTP/1.1",
            b"\r\n",
            b"\r",
            b"\n",
            b"Content-Length:",
            b"content-length: 1",
            b"TRANSFER-ENCODING:",
            b"Transfer-Encodin",
            b"c",
            b"t",
            b"Host: a",
            b"xxxxxxxxxxxxxxxxxxxxxxx",
        ];
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut random = |n: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % n as u64) as usize
        };
        let mut wholes = 0;
        for _ in 0..20_000 {
            let mut head = Vec::new();
            for _ in 0..random(24) {
                head.extend_from_slice(PARTS[random(PARTS.len())]);
            }
            let mut followed = Scan::default();
            followed.follow(&head);
            match Scan::whole(&head) {
                Some(whole) => {
                    wholes += 1;
                    assert_eq!(whole, followed, "{}", String::from_utf8_lossy(&head));
                }
                None => assert!(head.len() < 16 || followed.at != At::End),
            }
        }
        assert!(wholes > 3_000, "{wholes}");
    }

    #[test]
    fn line_feeds_are_found_16_bytes_at_a_time_as_one_at_a_time() {
        let mut chunk = [b'a'; 16];
        for mask in [0, 1, 0x8000, 0xffff, 0x1234, 0x8001] {
            for (i, b) in chunk.iter_mut().enumerate() {
                *b = if mask >> i & 1 == 1 { b'\n' } else { b'\r' };
            }
            assert_eq!(lf_mask(&chunk), mask);
            assert_eq!(lf_mask_bytewise(&chunk), mask);
        }
        let bytes = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n\n\n";
        for len in 16..=bytes.len() {
            let found: Vec<usize> = LineFeeds::new(&bytes[..len]).unwrap().collect();
            let want: Vec<usize> = (0..len).filter(|&i| bytes[i] == b'\n').collect();
            assert_eq!(found, want);
        }
        assert!(LineFeeds::new(&bytes[..15]).is_none());
    }

    #[test]
    fn the_request_line_is_followed_to_its_line_feed() {
        let mut s = Scan::default();
        s.read(b"GET /aaa");
        assert_eq!(s.request_line(), (8, false));
        s.read(b" HTTP/1.1\r\nX: ");
        assert_eq!(s.request_line(), (18, true));
        s.read(&[b'v'; 64]);
        assert_eq!(s.request_line(), (18, true));
    }
}
