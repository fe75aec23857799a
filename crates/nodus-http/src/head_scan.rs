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
    /// The last byte read was a CR (kept only where the next read may need it).
    cr: bool,
    /// A line of the head ended in a line feed without a CR.
    bare_lf: bool,
    /// `Content-Length` field lines, up to 2.
    content_lengths: u8,
    /// A `Transfer-Encoding` field line.
    transfer_encoding: bool,
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

impl Scan {
    /// Follows the head through `bytes`, the next bytes read.
    pub(crate) fn read(&mut self, bytes: &[u8]) {
        let mut i = 0;
        while let Some(&b) = bytes.get(i) {
            match self.at {
                At::RequestLine | At::Rest => {
                    let rest = &bytes[i..];
                    let Some(lf) = rest.iter().position(|&b| b == b'\n') else {
                        if self.at == At::RequestLine {
                            self.line += rest.len();
                        }
                        self.cr = rest.last() == Some(&b'\r');
                        return;
                    };
                    if self.at == At::RequestLine {
                        self.line += lf;
                    }
                    let cr = match lf {
                        0 => self.cr,
                        _ => rest[lf - 1] == b'\r',
                    };
                    self.bare_lf |= !cr;
                    self.at = At::LineStart;
                    i += lf + 1;
                    continue;
                }
                At::LineStart => {
                    self.at = match b.to_ascii_lowercase() {
                        b'\r' => At::EmptyCr,
                        b'\n' => {
                            self.bare_lf = true;
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
                        match name {
                            0 => self.content_lengths = (self.content_lengths + 1).min(2),
                            _ => self.transfer_encoding = true,
                        }
                        At::Rest
                    };
                }
                At::End => return,
            }
            i += 1;
        }
    }

    /// Bytes of the request line read so far (its line feed excluded), and whether it ended.
    pub(crate) fn request_line(&self) -> (usize, bool) {
        (self.line, self.at != At::RequestLine)
    }

    /// Whether nothing was read.
    pub(crate) fn is_empty(&self) -> bool {
        *self == Scan::default()
    }

    /// Whether Node refuses the head this scan followed (a bare line feed, `Content-Length`
    /// twice, or with `Transfer-Encoding`), given `line`, the length of the request line hyper
    /// parsed without its line end. A scan that did not follow that whole head says nothing.
    pub(crate) fn refuses(&self, line: usize) -> bool {
        let whole = self.at == At::End && (self.line == line + 1 || self.line == line);
        whole
            && (self.bare_lf
                || self.content_lengths > 1
                || (self.content_lengths > 0 && self.transfer_encoding))
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

    /// Every way of splitting `head` in two reads scans as it does in one (but for `cr`, which
    /// only the next read looks at).
    fn same_split_anywhere(head: &[u8]) -> Scan {
        let facts = |mut s: Scan| {
            s.cr = false;
            s
        };
        let whole = facts(scan(&[head]));
        for at in 0..=head.len() {
            let split = facts(scan(&[&head[..at], &head[at..]]));
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
                !s.refuses(parsed_line(head)),
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
                s.refuses(parsed_line(head)),
                "{}",
                String::from_utf8_lossy(head)
            );
        }
    }

    #[test]
    fn a_scan_of_another_request_line_or_an_unended_head_says_nothing() {
        let s = scan(&[b"GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n"]);
        assert!(s.refuses(14));
        // Begun in the middle of a head (the rest read ahead): not the parsed request line.
        assert!(!s.refuses(20));
        let s = scan(&[b"GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n"]);
        assert!(!s.refuses(14));
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
