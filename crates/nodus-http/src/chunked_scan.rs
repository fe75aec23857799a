//! The framing of a chunked HTTP/1 request body, followed as the connection reads it, for the
//! one lenience of hyper's chunked decoder that Node's (llhttp, strict) does not have: a line
//! feed without its CR in the trailer section.
//!
//! hyper ends a trailer line only at CR LF and keeps a bare line feed as one of its bytes, so
//! after `0\r\n\n` (or `0\r\nX: y\n`) it reads on, taking the next request on the connection for
//! trailer lines until a CR LF CR LF. A proxy in front that ends the body at the bare line feed
//! sends that request and waits for its answer, which never comes: the two ends disagree on where
//! a request ends, the stuff of request smuggling. Node answers 400 and closes. Here the read
//! that brings the bare line feed hands hyper only the bytes before it and fails the next read
//! (`io::HyperIo`): the body's read fails, the connection closes after its response, and nothing
//! after the bare line feed is ever read as a request.
//!
//! Invariants:
//! - A scan begins at the body's first byte (`Scan::chunked_body_at` finds it, in the read that
//!   ends a head with a `Transfer-Encoding` line: hyper refuses a request whose last coding is not
//!   chunked, so it reads no body the scan follows wrongly) and ends with the body: the bytes
//!   after its last line are the next head's.
//! - It parses as hyper's decoder does wherever hyper accepts the bytes: chunk sizes (hex digits
//!   up to the first other byte of the size line), data skipped by count (a data byte is never
//!   looked at), each chunk's CR LF, then the trailer lines to the empty one. Where hyper refuses
//!   the bytes itself (a bad size, a missing CR after data), the scan gives up following: hyper's
//!   own error ends the body.
//! - Any line feed in a size line or in the trailer section must follow a CR (hyper already
//!   refuses a bare one in a size line; the scan does too, which changes nothing).
//! - Constant size, nothing allocated; a read's data bytes cost one subtraction.

/// Where a scan is in a chunked body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum At {
    /// At a chunk's size line's first byte: a hex digit.
    SizeStart,
    /// In a chunk's size line: its size so far, whether its hex digits ended (an extension or
    /// whitespace follows), whether the last byte was a CR.
    Size {
        size: u64,
        digits_ended: bool,
        cr: bool,
    },
    /// In a chunk's data: bytes left.
    Data(u64),
    /// After a chunk's data: its CR (`false`) or its line feed (`true`) comes next.
    DataEnd { cr_seen: bool },
    /// In the trailer section: whether the current line is empty so far, whether the last byte
    /// was a CR.
    Trailer { empty: bool, cr: bool },
}

/// A chunked request body being followed (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Chunked {
    at: At,
}

/// What a scan found in the bytes it followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// The body goes on past them.
    More,
    /// The body ended with the first `n` of them (the rest begins the next request).
    Ended(usize),
    /// A line feed without its CR at this index: nothing from it on may reach hyper.
    BareLineFeed(usize),
    /// hyper refuses the body itself: the scan no longer follows it.
    HyperRefuses,
}

impl Chunked {
    /// A scan at a chunked body's first byte.
    pub(crate) fn new() -> Chunked {
        Chunked { at: At::SizeStart }
    }

    /// Follows the body through `bytes`, the next bytes read.
    pub(crate) fn follow(&mut self, bytes: &[u8]) -> Step {
        let mut i = 0;
        while i < bytes.len() {
            let b = bytes[i];
            self.at = match self.at {
                At::Data(left) => {
                    let take = left.min((bytes.len() - i) as u64);
                    i += take as usize;
                    self.at = match left - take {
                        0 => At::DataEnd { cr_seen: false },
                        left => At::Data(left),
                    };
                    continue;
                }
                At::SizeStart => match hex_digit(b) {
                    Some(size) => At::Size {
                        size,
                        digits_ended: false,
                        cr: false,
                    },
                    None => return Step::HyperRefuses,
                },
                At::Size {
                    size,
                    digits_ended,
                    cr,
                } => match b {
                    b'\n' if !cr => return Step::BareLineFeed(i),
                    b'\n' if size == 0 => At::Trailer {
                        empty: true,
                        cr: false,
                    },
                    b'\n' => At::Data(size),
                    _ if cr => return Step::HyperRefuses,
                    b'\r' => At::Size {
                        size,
                        digits_ended,
                        cr: true,
                    },
                    _ => match (digits_ended, hex_digit(b)) {
                        (false, Some(d)) => {
                            let Some(size) = size.checked_mul(16).and_then(|s| s.checked_add(d))
                            else {
                                return Step::HyperRefuses;
                            };
                            At::Size {
                                size,
                                digits_ended,
                                cr,
                            }
                        }
                        _ => At::Size {
                            size,
                            digits_ended: true,
                            cr,
                        },
                    },
                },
                At::DataEnd { cr_seen: false } if b == b'\r' => At::DataEnd { cr_seen: true },
                At::DataEnd { cr_seen: true } if b == b'\n' => At::SizeStart,
                At::DataEnd { .. } => return Step::HyperRefuses,
                At::Trailer { empty, cr } => match b {
                    b'\n' if !cr => return Step::BareLineFeed(i),
                    b'\n' if empty => return Step::Ended(i + 1),
                    b'\n' => At::Trailer {
                        empty: true,
                        cr: false,
                    },
                    _ if cr => return Step::HyperRefuses,
                    b'\r' => At::Trailer { empty, cr: true },
                    _ => At::Trailer {
                        empty: false,
                        cr: false,
                    },
                },
            };
            i += 1;
        }
        Step::More
    }
}

fn hex_digit(b: u8) -> Option<u64> {
    (b as char).to_digit(16).map(u64::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What following `body` gives, in one read and split in two anywhere (an index in the
    /// second part counted from the body's start).
    fn follow_split_anywhere(body: &[u8]) -> Step {
        let whole = Chunked::new().follow(body);
        for at in 0..=body.len() {
            let mut scan = Chunked::new();
            let split = match scan.follow(&body[..at]) {
                Step::More => match scan.follow(&body[at..]) {
                    Step::Ended(n) => Step::Ended(at + n),
                    Step::BareLineFeed(n) => Step::BareLineFeed(at + n),
                    step => step,
                },
                step => step,
            };
            assert_eq!(
                split,
                whole,
                "split at {at}: {}",
                String::from_utf8_lossy(body)
            );
        }
        whole
    }

    /// A chunk of `data`, with its size line and its CR LF.
    fn chunk(data: &[u8]) -> Vec<u8> {
        [format!("{:x}\r\n", data.len()).as_bytes(), data, b"\r\n"].concat()
    }

    #[test]
    fn a_well_formed_body_ends_after_its_last_line_and_nothing_in_its_data_is_looked_at() {
        // Data that looks like framing: bare line feeds, a last chunk, a request.
        let framing_in_data = [
            chunk(b"\n\n0\r\n\n\r\n\n\r"),
            chunk(b"x\ny"),
            chunk(b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n"),
            b"0\r\n\r\n".to_vec(),
        ]
        .concat();
        for body in [
            &b"0\r\n\r\n"[..],
            b"5\r\nhello\r\n0\r\n\r\n",
            &framing_in_data,
            // Extensions, whitespace after the size, uppercase hex, leading zeros.
            b"5;a=b\r\nhello\r\n005 \t;x\r\nworld\r\nA\r\n0123456789\r\n0;last\r\n\r\n",
            // Trailers.
            b"5\r\nhello\r\n0\r\nX-A: 1\r\nX-B: 2\r\n\r\n",
        ] {
            let end = body.len();
            let mut next = body.to_vec();
            next.extend_from_slice(b"GET / HTTP/1.1\r\n\n");
            assert_eq!(
                follow_split_anywhere(&next),
                Step::Ended(end),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn a_line_feed_without_its_cr_in_a_size_line_or_the_trailers_is_found_where_it_is() {
        for (body, at) in [
            // The trailer section's end, a trailer line's.
            (&b"5\r\nhello\r\n0\r\n\n"[..], 13),
            (b"0\r\n\n", 3),
            (b"0\r\nX: y\n\r\n", 7),
            (b"0\r\nX: y\r\nZ\n\r\n\r\n", 10),
            // A size line's (hyper refuses those too).
            (b"5\nhello\r\n0\r\n\r\n", 1),
            (b"5;ext\nhello\r\n0\r\n\r\n", 5),
            (b"0\n\r\n", 1),
        ] {
            assert_eq!(
                follow_split_anywhere(body),
                Step::BareLineFeed(at),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn what_hyper_refuses_itself_is_no_longer_followed() {
        for body in [
            &b"5\r\nhelloX\r\n"[..],
            b"5\r\nhello\n0\r\n\r\n",
            b"5\rX\nhello",
            b"0\r\nX: y\rZ\r\n\r\n",
            b"10000000000000000\r\n",
            // No size digit.
            b"\r\n\r\n",
            b";x\r\n",
        ] {
            assert_eq!(
                follow_split_anywhere(body),
                Step::HyperRefuses,
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn a_body_that_has_not_ended_asks_for_more() {
        for body in [&b""[..], b"5\r\nhel", b"5\r\nhello\r\n", b"0\r\nX: y\r\n"] {
            assert_eq!(follow_split_anywhere(body), Step::More);
        }
    }
}
