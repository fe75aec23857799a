//! An incremental decoder of a chunked HTTP/1 request body (RFC 9112 section 7.1), fed from the
//! connection's read buffer: [`ChunkedDecoder::decode`] consumes the framing at the front of the
//! buffer (size lines, the CR LF after each chunk's data, the trailer section) and splits data
//! off it without copying.
//!
//! Invariants:
//! - Framing is consumed eagerly: a call consumes every framing byte before the first data byte,
//!   so data is returned as soon as one of its bytes is buffered, and after the data it returns,
//!   every framing byte that follows it (so [`ChunkedDecoder::is_done`] is true once the body's
//!   end is buffered; [`Decoded::End`] comes from the next call).
//! - No byte after the body's last (the LF of the empty line ending the trailer section) is ever
//!   consumed: after `End`, the buffer begins with the next request.
//! - A refused byte is not consumed and leaves the state as it was: a call that meets it again
//!   (the one after a `Data` whose following framing holds it) refuses it again.
//! - Data bytes are never looked at (split off by count). Constant size, nothing allocated.
//!
//! It follows hyper 1.12's decoder (`proto/h1/decode.rs`), with hyper's default bounds:
//! - A size line is hex digits, optional chunk extensions and CR LF. Extension bytes (after each
//!   size line's first `;`, to its CR) are bounded over the whole body
//!   ([`EXTENSION_BYTES_LIMIT`]).
//! - The trailer section is bounded in bytes ([`TRAILER_BYTES_LIMIT`]; an empty section's CR LF
//!   is counted here, not by hyper, which changes nothing) and lines ([`MAX_TRAILERS`]). Its
//!   lines are checked as hyper checks them with httparse at the section's end (a token name,
//!   `:`, a value of HTAB, SP, visible and obs-text bytes; no obs-fold), here as they arrive.
//!   Trailer fields are discarded.
//!
//! Where it differs:
//! - Every line ends with CR LF, as in Node (llhttp): a LF without its CR is
//!   [`ChunkedError::BareLineFeed`]. hyper refuses one in a size line too, but takes one in the
//!   trailer section as a trailer line's byte and reads on, the next request included, to a
//!   CR LF CR LF (`0\r\n\n` ends no body there).
//! - A size has at most 16 hex digits (so it never overflows a u64); hyper takes any number of
//!   leading zeros.
//! - A space or tab after a size's digits is refused, as Node refuses it; hyper takes any number
//!   of them.
//! - Chunk extensions are parsed byte by byte as Node's llhttp (strict) parses them; hyper skips
//!   every byte but CR and LF. Each one is `;`, a name of `tchar`s (RFC 9110 token bytes), and
//!   optionally `=` and a value: `tchar`s, then optionally a quoted string, which ends the
//!   extension. A quoted string's bytes are HTAB, SP and visible bytes but `"` and `\`, and
//!   obs-text (0x80 to 0xFF); `\` escapes one HTAB, SP, visible or obs-text byte. There is no
//!   whitespace outside quoted strings, and the CR is refused right after a `;` (`5;\r`). As in
//!   llhttp, a name or an unquoted value may be empty (`5;=b`, `5;a=`, `5;;a`).
//! - A `Content-Length` or `Transfer-Encoding` trailer field (any case) is
//!   [`ChunkedError::FramingTrailer`], as Node refuses it; hyper hands it to the service as a
//!   trailer.

use bytes::{Buf, Bytes, BytesMut};

/// The bound on a whole body's chunk extension bytes (after each size line's first `;`, to its
/// CR): the byte that makes them this many is refused (hyper's `CHUNKED_EXTENSIONS_LIMIT`).
const EXTENSION_BYTES_LIMIT: u32 = 16 * 1024;

/// The bound on a trailer section's bytes, from its first to its last LF: the byte that makes
/// them this many is refused (hyper's `TRAILER_LIMIT`, its default for `h1_max_header_size`).
const TRAILER_BYTES_LIMIT: u32 = 16 * 1024;

/// Most trailer lines; the LF ending one more is refused (hyper's default for `h1_max_headers`,
/// `DEFAULT_MAX_HEADERS`).
const MAX_TRAILERS: u32 = 100;

/// Most hex digits of a chunk size: 16 make any u64 and no more.
const MAX_SIZE_DIGITS: u8 = 16;

/// Where the decoder is in the body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// In a size line's hex digits: how many so far.
    Size(u8),
    /// After a `;` of a size line: an extension's name, its `=` or another `;` comes next.
    ExtensionStart,
    /// In an extension's name.
    ExtensionName,
    /// In an extension's unquoted value, after its `=`.
    ExtensionValue,
    /// In an extension value's quoted string.
    Quoted,
    /// After a `\` in a quoted string.
    QuotedPair,
    /// After a quoted string's closing `"`: a `;` or the CR comes next.
    QuotedEnd,
    /// After a size line's CR.
    SizeLf,
    /// In a chunk's data (`ChunkedDecoder::left` bytes to go, never 0).
    Data,
    /// After a chunk's data: its CR comes next.
    DataCr,
    /// After the CR following a chunk's data.
    DataLf,
    /// At a line of the trailer section: a trailer's first byte, or the CR of the empty line.
    LineStart,
    /// In a trailer's name, as far as it matches a framing field's.
    TrailerName(FramingName),
    /// In a trailer's value, after the `:`.
    TrailerValue,
    /// After a trailer line's CR.
    TrailerLf,
    /// After the CR of the empty line ending the trailer section.
    EndLf,
    /// The body ended.
    End,
}

/// A chunked request body being decoded (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ChunkedDecoder {
    state: State,
    /// The chunk's size while its size line is read, then its data bytes left.
    left: u64,
    /// Extension bytes so far in the body.
    extension_bytes: u32,
    /// Trailer section bytes so far.
    trailer_bytes: u32,
    /// Trailer lines so far.
    trailers: u32,
}

/// What [`ChunkedDecoder::decode`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decoded {
    /// Body data, split off the front of `buf` (zero copy: `buf.split_to(n).freeze()`), at most
    /// `max` bytes.
    Data(Bytes),
    /// `buf` holds no more of the body yet: read more and call again.
    NeedMore,
    /// The body ended (last chunk and trailer section consumed): `buf` now starts with the next
    /// request.
    End,
}

/// Why a body is refused; the refused byte is the first of `buf`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChunkedError {
    /// A bad size line (a malformed extension or a space or tab after the size too), a missing
    /// CR LF after data, a size over 16 hex digits, a trailer line that is no field, extensions
    /// or a trailer section over hyper's bounds.
    Malformed,
    /// A LF without its CR in a size line, after data, or in the trailer section (Node refuses;
    /// hyper takes it in trailers).
    BareLineFeed,
    /// A `Content-Length` or `Transfer-Encoding` trailer field, refused at its `:` (Node
    /// refuses; hyper takes it).
    FramingTrailer,
}

impl ChunkedDecoder {
    /// A decoder at a chunked body's first byte.
    pub fn new() -> Self {
        ChunkedDecoder {
            state: State::Size(0),
            left: 0,
            extension_bytes: 0,
            trailer_bytes: 0,
            trailers: 0,
        }
    }

    /// Whether the body ended: its last byte was consumed.
    pub fn is_done(&self) -> bool {
        self.state == State::End
    }

    /// Consumes framing bytes from `buf` and returns the next piece.
    pub fn decode(&mut self, buf: &mut BytesMut, max: usize) -> Result<Decoded, ChunkedError> {
        debug_assert!(max > 0, "a Data piece of at most 0 bytes");
        self.framing(buf)?;
        match self.state {
            State::End => Ok(Decoded::End),
            State::Data if !buf.is_empty() => {
                let n = usize::try_from(self.left)
                    .unwrap_or(usize::MAX)
                    .min(buf.len())
                    .min(max);
                self.left -= n as u64;
                if self.left == 0 {
                    self.state = State::DataCr;
                }
                let data = buf.split_to(n).freeze();
                // A byte refused here is met again, and refused, by the next call.
                let _ = self.framing(buf);
                Ok(Decoded::Data(data))
            }
            _ => Ok(Decoded::NeedMore),
        }
    }

    /// Consumes the framing bytes at the front of `buf`, up to a data byte, the body's end, the
    /// end of `buf`, or a refused byte (not consumed).
    fn framing(&mut self, buf: &mut BytesMut) -> Result<(), ChunkedError> {
        let mut used = 0;
        let mut result = Ok(());
        for &b in buf.iter() {
            if matches!(self.state, State::Data | State::End) {
                break;
            }
            if let Err(e) = self.step(b) {
                result = Err(e);
                break;
            }
            used += 1;
        }
        buf.advance(used);
        result
    }

    /// Takes one framing byte; a refused one changes nothing.
    fn step(&mut self, b: u8) -> Result<(), ChunkedError> {
        use State::*;
        if b == b'\n' && !matches!(self.state, SizeLf | DataLf | TrailerLf | EndLf) {
            return Err(ChunkedError::BareLineFeed);
        }
        self.state = match (self.state, b) {
            (Size(digits), _) if b.is_ascii_hexdigit() => {
                if digits == MAX_SIZE_DIGITS {
                    return Err(ChunkedError::Malformed);
                }
                // At most 16 digits: no overflow.
                self.left = self.left << 4 | hex_value(b);
                Size(digits + 1)
            }
            (Size(0), _) => return Err(ChunkedError::Malformed),
            (Size(_), b';') => ExtensionStart,
            (Size(_), b'\r') => SizeLf,
            (
                ExtensionStart | ExtensionName | ExtensionValue | Quoted | QuotedPair | QuotedEnd,
                _,
            ) => {
                let next = extension_next(self.state, b).ok_or(ChunkedError::Malformed)?;
                if next != SizeLf {
                    self.extension_byte()?;
                }
                next
            }
            (SizeLf, b'\n') if self.left == 0 => LineStart,
            (SizeLf, b'\n') => Data,
            (DataCr, b'\r') => DataLf,
            (DataLf, b'\n') => Size(0),
            (LineStart, b'\r') => {
                self.trailer_byte()?;
                EndLf
            }
            (LineStart, _) if is_token(b) => {
                self.trailer_byte()?;
                TrailerName(FramingName::START.push(b))
            }
            (TrailerName(name), _) if is_token(b) => {
                self.trailer_byte()?;
                TrailerName(name.push(b))
            }
            (TrailerName(name), b':') => {
                if name.is_whole() {
                    return Err(ChunkedError::FramingTrailer);
                }
                self.trailer_byte()?;
                TrailerValue
            }
            (TrailerValue, b'\r') => {
                self.trailer_byte()?;
                TrailerLf
            }
            (TrailerValue, _) if is_value(b) => {
                self.trailer_byte()?;
                TrailerValue
            }
            (TrailerLf, b'\n') => {
                if self.trailers == MAX_TRAILERS {
                    return Err(ChunkedError::Malformed);
                }
                self.trailer_byte()?;
                self.trailers += 1;
                LineStart
            }
            (EndLf, b'\n') => {
                self.trailer_byte()?;
                End
            }
            _ => return Err(ChunkedError::Malformed),
        };
        Ok(())
    }

    /// Counts an extension byte; the one reaching the bound is refused, uncounted.
    fn extension_byte(&mut self) -> Result<(), ChunkedError> {
        if self.extension_bytes + 1 >= EXTENSION_BYTES_LIMIT {
            return Err(ChunkedError::Malformed);
        }
        self.extension_bytes += 1;
        Ok(())
    }

    /// Counts a trailer section byte; the one reaching the bound is refused, uncounted.
    fn trailer_byte(&mut self) -> Result<(), ChunkedError> {
        if self.trailer_bytes + 1 >= TRAILER_BYTES_LIMIT {
            return Err(ChunkedError::Malformed);
        }
        self.trailer_bytes += 1;
        Ok(())
    }
}

/// The state after byte `b` of a chunk extension in `state` (one of the extension states), or
/// `None` if `b` is refused there (llhttp's strict chunk extension states).
fn extension_next(state: State, b: u8) -> Option<State> {
    use State::*;
    Some(match (state, b) {
        (ExtensionStart, b'\r') => return None,
        (ExtensionName | ExtensionValue | QuotedEnd, b'\r') => SizeLf,
        (ExtensionStart | ExtensionName | ExtensionValue | QuotedEnd, b';') => ExtensionStart,
        (ExtensionStart | ExtensionName, b'=') => ExtensionValue,
        (ExtensionStart | ExtensionName, _) if is_token(b) => ExtensionName,
        (ExtensionValue, b'"') => Quoted,
        (ExtensionValue, _) if is_token(b) => ExtensionValue,
        (Quoted, b'"') => QuotedEnd,
        (Quoted, b'\\') => QuotedPair,
        // HTAB, SP, visible, obs-text: qdtext with `"` and `\` taken above, or a quoted-pair's
        // second byte.
        (Quoted | QuotedPair, _) if is_value(b) => Quoted,
        _ => return None,
    })
}

/// The framing fields a trailer may not be, lowercase.
const FRAMING_NAMES: [&[u8]; 2] = [b"content-length", b"transfer-encoding"];

/// How much of a trailer's name is read, and which of [`FRAMING_NAMES`] begin with it (any case).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FramingName {
    /// Bytes so far, counted while some framing name matches them (so at most 18).
    len: u8,
    /// Bit `i`: `FRAMING_NAMES[i]` begins with the name so far.
    names: u8,
}

impl FramingName {
    /// An empty name: every framing name begins with it.
    const START: FramingName = FramingName {
        len: 0,
        names: 0b11,
    };

    /// The name with `b` after it.
    fn push(self, b: u8) -> FramingName {
        if self.names == 0 {
            return self;
        }
        let mut names = 0;
        for (i, name) in FRAMING_NAMES.iter().enumerate() {
            if self.names & 1 << i != 0
                && name.get(usize::from(self.len)) == Some(&b.to_ascii_lowercase())
            {
                names |= 1 << i;
            }
        }
        FramingName {
            len: self.len + 1,
            names,
        }
    }

    /// Whether the name is a framing field's, whole.
    fn is_whole(self) -> bool {
        FRAMING_NAMES
            .iter()
            .enumerate()
            .any(|(i, name)| self.names & 1 << i != 0 && name.len() == usize::from(self.len))
    }
}

/// The value of a hex digit.
fn hex_value(b: u8) -> u64 {
    u64::from(match b {
        b'0'..=b'9' => b - b'0',
        b'a'..=b'f' => b - b'a' + 10,
        _ => b - b'A' + 10,
    })
}

/// Whether `b` may be in a field name (RFC 9110 `tchar`, httparse's `TOKEN_MAP`).
fn is_token(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Whether `b` may be in a field value (HTAB, SP, visible, obs-text: httparse's
/// `HEADER_VALUE_MAP`).
fn is_value(b: u8) -> bool {
    b == b'\t' || (b' '..=b'~').contains(&b) || b >= 0x80
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What decoding `input` gives when it arrives in `pieces` (lengths; the rest after them)
    /// with `max`: the data pieces, then the outcome with what is left unconsumed of `input`.
    #[derive(Debug, PartialEq, Eq)]
    enum Outcome {
        /// The body ended; the bytes after it.
        End(Vec<u8>),
        /// Refused, at this index of `input`.
        Refused(ChunkedError, usize),
        /// All of `input` consumed, the body not ended.
        NeedMore,
    }

    fn decode_in(input: &[u8], pieces: &[usize], max: usize) -> (Vec<Bytes>, Outcome) {
        let mut decoder = ChunkedDecoder::new();
        let mut buf = BytesMut::new();
        let mut data = Vec::new();
        let mut fed = 0;
        let mut cuts = pieces.iter().copied().chain(std::iter::once(usize::MAX));
        loop {
            match decoder.decode(&mut buf, max) {
                Ok(Decoded::Data(d)) => {
                    assert!(!d.is_empty() && d.len() <= max, "{d:?}");
                    data.push(d);
                }
                Ok(Decoded::End) => {
                    assert!(decoder.is_done());
                    // Again: End, nothing consumed.
                    buf.extend_from_slice(&input[fed..]);
                    let left = buf.to_vec();
                    assert_eq!(decoder.decode(&mut buf, max), Ok(Decoded::End));
                    assert_eq!(buf, left);
                    return (data, Outcome::End(left));
                }
                Ok(Decoded::NeedMore) => {
                    assert!(buf.is_empty(), "NeedMore with {buf:?} buffered");
                    if fed == input.len() {
                        return (data, Outcome::NeedMore);
                    }
                    let n = cuts.next().unwrap().min(input.len() - fed);
                    buf.extend_from_slice(&input[fed..fed + n]);
                    fed += n;
                }
                Err(e) => {
                    // Refused again, where it was.
                    let at = fed - buf.len();
                    assert_eq!(decoder.decode(&mut buf, max), Err(e));
                    assert_eq!(fed - buf.len(), at);
                    return (data, Outcome::Refused(e, at));
                }
            }
        }
    }

    /// What decoding `input` whole gives (data concatenated), checked to be the same for every
    /// two-piece split, byte by byte, pseudo-random splits, and several `max`.
    fn decode_any_split(input: &[u8]) -> (Vec<u8>, Outcome) {
        let concat = |(data, outcome): (Vec<Bytes>, Outcome)| (data.concat(), outcome);
        let whole = concat(decode_in(input, &[], usize::MAX));
        let show = String::from_utf8_lossy(input);
        for max in [1, 3, 7, usize::MAX] {
            assert_eq!(
                concat(decode_in(input, &[], max)),
                whole,
                "max {max}: {show}"
            );
            let bytes = vec![1; input.len()];
            assert_eq!(
                concat(decode_in(input, &bytes, max)),
                whole,
                "bytes: {show}"
            );
        }
        for at in 0..=input.len() {
            assert_eq!(concat(decode_in(input, &[at], 5)), whole, "{at}: {show}");
        }
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        for _ in 0..200 {
            let mut pieces = Vec::new();
            for _ in 0..input.len() {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                pieces.push((seed % 9) as usize);
            }
            let max = (seed >> 32) as usize % 6 + 1;
            let got = concat(decode_in(input, &pieces, max));
            assert_eq!(got, whole, "{pieces:?} max {max}: {show}");
        }
        whole
    }

    const NEXT: &[u8] = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n";

    fn with_next(body: &[u8]) -> Vec<u8> {
        [body, NEXT].concat()
    }

    /// That `input`, followed by the next request, is refused with `error` at byte `at`, however
    /// it arrives.
    fn assert_refused_at(input: &[u8], error: ChunkedError, at: usize) {
        let input = with_next(input);
        assert_eq!(
            decode_any_split(&input).1,
            Outcome::Refused(error, at),
            "{}",
            String::from_utf8_lossy(&input)
        );
    }

    #[test]
    fn one_chunk() {
        let mut buf = BytesMut::from(&b"5\r\nhello\r\n0\r\n\r\n"[..]);
        let mut decoder = ChunkedDecoder::new();
        assert_eq!(
            decoder.decode(&mut buf, 64),
            Ok(Decoded::Data(Bytes::from_static(b"hello")))
        );
        // The body's end was buffered: consumed with the data.
        assert!(decoder.is_done());
        assert!(buf.is_empty());
        assert_eq!(decoder.decode(&mut buf, 64), Ok(Decoded::End));
    }

    #[test]
    fn several_chunks_in_one_buffer() {
        let input = b"5\r\nhello\r\n1\r\n,\r\n6\r\n world\r\n0\r\n\r\n";
        let (data, outcome) = decode_in(input, &[], usize::MAX);
        assert_eq!(data, [&b"hello"[..], b",", b" world"]);
        assert_eq!(outcome, Outcome::End(Vec::new()));
    }

    #[test]
    fn a_chunk_split_across_calls_comes_in_pieces() {
        let mut decoder = ChunkedDecoder::new();
        let mut buf = BytesMut::from(&b"a\r\n01234"[..]);
        assert_eq!(
            decoder.decode(&mut buf, 64),
            Ok(Decoded::Data(Bytes::from_static(b"01234")))
        );
        assert_eq!(decoder.decode(&mut buf, 64), Ok(Decoded::NeedMore));
        buf.extend_from_slice(b"56789\r");
        assert_eq!(
            decoder.decode(&mut buf, 64),
            Ok(Decoded::Data(Bytes::from_static(b"56789")))
        );
        assert!(buf.is_empty());
        buf.extend_from_slice(b"\n0\r\n\r\n");
        assert_eq!(decoder.decode(&mut buf, 64), Ok(Decoded::End));
        assert!(buf.is_empty());
    }

    #[test]
    fn max_bounds_each_piece() {
        let (data, outcome) = decode_in(b"a\r\n0123456789\r\n2\r\nab\r\n0\r\n\r\n", &[], 4);
        assert_eq!(data, [&b"0123"[..], b"4567", b"89", b"ab"]);
        assert_eq!(outcome, Outcome::End(Vec::new()));
    }

    #[test]
    fn any_split_gives_the_same_data_and_end_and_leaves_the_next_request() {
        // Data that looks like framing: bare line feeds, a last chunk, a request.
        let framing_in_data = b"\n\n0\r\n\n\r\n\n\rGET / HTTP/1.1\r\n\r\n";
        for (body, data) in [
            (&b"0\r\n\r\n"[..], &b""[..]),
            (
                // Extensions, uppercase hex, leading zeros, trailers.
                b"5;a=b\r\nhello\r\n005;x;y=\"q\"\r\nworld\r\nA\r\n0123456789\r\n\
                  0;last\r\nX-A: 1\r\nX-Empty:\r\nX-B:\t2 \xff\r\n\r\n",
                b"helloworld0123456789",
            ),
            (
                &[
                    format!("{:x}\r\n", framing_in_data.len()).as_bytes(),
                    framing_in_data,
                    b"\r\n0\r\n\r\n",
                ]
                .concat(),
                framing_in_data,
            ),
        ] {
            let (got, outcome) = decode_any_split(&with_next(body));
            assert_eq!(got, data);
            assert_eq!(outcome, Outcome::End(NEXT.to_vec()));
        }
    }

    #[test]
    fn end_leaves_a_pipelined_request_in_buf() {
        let mut buf = BytesMut::from(&with_next(b"3\r\nabc\r\n0\r\n\r\n")[..]);
        let mut decoder = ChunkedDecoder::new();
        assert_eq!(
            decoder.decode(&mut buf, 64),
            Ok(Decoded::Data(Bytes::from_static(b"abc")))
        );
        assert_eq!(decoder.decode(&mut buf, 64), Ok(Decoded::End));
        assert_eq!(buf, NEXT);
        assert_eq!(decoder.decode(&mut buf, 64), Ok(Decoded::End));
        assert_eq!(buf, NEXT);
    }

    #[test]
    fn a_body_not_ended_needs_more() {
        for input in [
            &b""[..],
            b"5",
            b"5;x",
            b"5;a=\"b",
            b"5\r",
            b"5\r\nhel",
            b"5\r\nhello\r\n",
            b"0\r\n",
            b"0\r\nX: y\r\n",
            b"0\r\n\r",
            b"FFFFFFFFFFFFFFFF\r\n",
        ] {
            assert_eq!(decode_any_split(input).1, Outcome::NeedMore);
        }
    }

    #[test]
    fn a_line_feed_without_its_cr_is_refused_where_it_is() {
        for (input, at) in [
            // In a size line.
            (&b"5\nhello\r\n0\r\n\r\n"[..], 1),
            (b"5;a=\"b\nc\"\r\nhello", 6),
            (b"5;ext\nhello", 5),
            (b"\n", 0),
            (b"0\n\r\n", 1),
            (b"5\r\nhello\r\n\n", 10),
            // After data.
            (b"5\r\nhello\n0\r\n\r\n", 8),
            // In the trailer section.
            (b"0\r\nX: y\n\r\n", 7),
            (b"0\r\nX\n", 4),
            (b"0\r\nX: y\r\nZ\n\r\n\r\n", 10),
            // Ending it.
            (b"5\r\nhello\r\n0\r\n\n", 13),
            (b"0\r\nX: y\r\n\n", 9),
        ] {
            assert_refused_at(input, ChunkedError::BareLineFeed, at);
        }
    }

    #[test]
    fn malformed_framing_is_refused_where_it_is() {
        let seventeen = b"00000000000000005\r\nhello\r\n0\r\n\r\n";
        for (input, at) in [
            // Bad size lines: no digit, a bad digit, no LF after CR.
            (&b"\r\n"[..], 0),
            (b";x\r\n", 0),
            (b" 5\r\n", 0),
            (b"g\r\n", 0),
            (b"5g\r\n", 1),
            (b"0x5\r\n", 1),
            (b"-5\r\n", 0),
            (b"5\rX", 2),
            (b"5;x\r\r\n", 4),
            // 17 digits: an overflow, or leading zeros.
            (b"10000000000000000\r\n", 16),
            (seventeen, 16),
            // No CR LF after data.
            (b"5\r\nhelloX\r\n", 8),
            (b"5\r\nhello\rX", 9),
            (b"5\r\nhello\r\r\n", 9),
            // Trailer lines that are no field: no colon, no name, whitespace, a control byte,
            // obs-fold, no LF after CR.
            (b"0\r\nX\r\n\r\n", 4),
            (b"0\r\n: v\r\n\r\n", 3),
            (b"0\r\nX y: z\r\n\r\n", 4),
            (b"0\r\nX : z\r\n\r\n", 4),
            (b"0\r\nX: \x01\r\n\r\n", 6),
            (b"0\r\nX: \x7f\r\n\r\n", 6),
            (b"0\r\nX: y\r\n z\r\n\r\n", 9),
            (b"0\r\nX: y\rZ\r\n\r\n", 8),
            (b"0\r\n\rX", 4),
        ] {
            assert_refused_at(input, ChunkedError::Malformed, at);
        }
    }

    #[test]
    fn extensions_are_bounded_over_the_whole_body_as_hyper_bounds_them() {
        // A body whose extension bytes (those after its first `;`) total `n`.
        let body = |n: usize| {
            [
                b"1;".as_slice(),
                &vec![b'e'; n - 6],
                b";e=\"q\"\r\nx\r\n0\r\n\r\n",
            ]
            .concat()
        };
        let limit = EXTENSION_BYTES_LIMIT as usize;
        let (data, outcome) = decode_in(&with_next(&body(limit - 1)), &[], usize::MAX);
        assert_eq!(
            (data.concat(), outcome),
            (b"x".to_vec(), Outcome::End(NEXT.to_vec()))
        );
        let (data, outcome) = decode_in(&with_next(&body(limit)), &[], usize::MAX);
        assert!(data.is_empty());
        // Refused at its last `"`, the byte reaching the bound.
        assert_eq!(
            outcome,
            Outcome::Refused(ChunkedError::Malformed, limit + 1)
        );
        // Across chunks.
        let chunk = [b"1;".as_slice(), &[b'e'; 8192], b"\r\nx\r\n"].concat();
        let input = [&chunk[..], &chunk, b"0\r\n\r\n"].concat();
        let (data, outcome) = decode_in(&input, &[], usize::MAX);
        assert_eq!(data, [&b"x"[..]]);
        assert_eq!(
            outcome,
            Outcome::Refused(ChunkedError::Malformed, chunk.len() + 2 + 8191)
        );
    }

    #[test]
    fn trailers_are_bounded_as_hyper_bounds_them() {
        // A trailer section of `n` bytes (its empty line's CR LF included).
        let section = |n: usize| {
            let field = [b"X: ".as_slice(), &vec![b'v'; n - 7], b"\r\n"].concat();
            [b"0\r\n".as_slice(), &field, b"\r\n"].concat()
        };
        let limit = TRAILER_BYTES_LIMIT as usize;
        let (_, outcome) = decode_in(&with_next(&section(limit - 1)), &[], usize::MAX);
        assert_eq!(outcome, Outcome::End(NEXT.to_vec()));
        // Refused at its last byte.
        let input = with_next(&section(limit));
        let (_, outcome) = decode_in(&input, &[], usize::MAX);
        assert_eq!(
            outcome,
            Outcome::Refused(ChunkedError::Malformed, 3 + limit - 1)
        );
        // 100 trailer lines, then 101: refused at the 101st's LF.
        let lines = |n: usize| {
            let fields = b"X: y\r\n".repeat(n);
            [b"0\r\n".as_slice(), &fields, b"\r\n"].concat()
        };
        let max = MAX_TRAILERS as usize;
        let (_, outcome) = decode_in(&with_next(&lines(max)), &[], usize::MAX);
        assert_eq!(outcome, Outcome::End(NEXT.to_vec()));
        let (_, outcome) = decode_in(&with_next(&lines(max + 1)), &[], usize::MAX);
        assert_eq!(
            outcome,
            Outcome::Refused(ChunkedError::Malformed, 3 + 6 * max + 5)
        );
    }

    #[test]
    fn extensions_node_takes_are_taken_on_data_and_last_chunks() {
        for ext in [
            &b";a=b"[..],
            b";a=\"x y\"",
            b";a=\"q\\\"uote\"",
            b";a;b=c",
            b";A=B;c=\"d e\";f",
            b";!#$%&'*+-.^_`|~09AZaz=!#$%&'*+-.^_`|~09AZaz",
            b";a=\"\"",
            // HTAB, obs-text, a quoted-pair of each kind.
            b";a=\"\t\x80\xff\"",
            b";a=\"\\\t\\ \\\\\\\"\\~\\\xff\"",
            b";a=\"b\";c",
            // Taken by llhttp: a quoted string after token bytes, empty names and values.
            b";a=b\"c\"",
            b";=b",
            b";a=",
            b";;a",
            b";a=;b",
        ] {
            let body = [b"5", ext, b"\r\nhello\r\n0", ext, b"\r\nX-Check: 1\r\n\r\n"].concat();
            let (data, outcome) = decode_any_split(&with_next(&body));
            assert_eq!(data, b"hello", "{}", String::from_utf8_lossy(ext));
            assert_eq!(outcome, Outcome::End(NEXT.to_vec()));
        }
        let (data, outcome) = decode_any_split(&with_next(b"0;ext=1\r\n\r\n"));
        assert_eq!((data, outcome), (Vec::new(), Outcome::End(NEXT.to_vec())));
    }

    #[test]
    fn whitespace_after_a_size_is_refused_where_it_is() {
        for (input, at) in [
            (&b"5 \r\nhello\r\n0\r\n\r\n"[..], 1),
            (b"5\t\r\nhello\r\n0\r\n\r\n", 1),
            (b"5 ;a=b\r\nhello\r\n0\r\n\r\n", 1),
            (b"0 \r\n\r\n", 1),
            (b"5\r\nhello\r\n0\t;a\r\n\r\n", 11),
        ] {
            assert_refused_at(input, ChunkedError::Malformed, at);
        }
    }

    #[test]
    fn extensions_node_refuses_are_refused_where_they_are() {
        // An extension, and the index in it of its refused byte (its length: the CR after it).
        for (ext, at) in [
            // Whitespace.
            (&b"; a=b"[..], 1),
            (b";a =b", 2),
            (b";a= b", 3),
            (b";a=b ", 4),
            (b";a=b\t", 4),
            (b";a=\"b\" ", 6),
            // A `;` with no name, no `=`, nor `;` after it.
            (b";", 1),
            (b";a=b;", 5),
            (b";;", 2),
            // Bytes no token holds.
            (b";a@b=c", 2),
            (b";\"a\"", 1),
            (b";\x80", 1),
            (b";a=b=c", 4),
            (b";a=\x00", 3),
            (b";a=\x01", 3),
            (b";a=\x7f", 3),
            (b";a=\x80", 3),
            // Quoted strings: a control byte, one escaped, bytes after it, no end.
            (b";a=\"\x00\"", 4),
            (b";a=\"\x01\"", 4),
            (b";a=\"\x7f\"", 4),
            (b";a=\"\\\x01\"", 5),
            (b";a=\"\\\x7f\"", 5),
            (b";a=\"b\"c", 6),
            (b";a=\"b\"=", 6),
            (b";a=\"b\"\"\"", 6),
            (b";a=\"b", 5),
            (b";a=\"b\\", 6),
            (b";a=\"b\r\nc\"", 5),
        ] {
            for (before, after) in [
                (&b"5"[..], &b"\r\nhello\r\n0\r\n\r\n"[..]),
                (b"5\r\nhello\r\n0", b"\r\n\r\n"),
            ] {
                let input = with_next(&[before, ext, after].concat());
                assert_eq!(
                    decode_any_split(&input).1,
                    Outcome::Refused(ChunkedError::Malformed, before.len() + at),
                    "{}",
                    String::from_utf8_lossy(&input)
                );
            }
        }
    }

    #[test]
    fn framing_trailers_are_refused_at_their_colon() {
        for (input, at) in [
            (&b"0\r\nContent-Length: 5\r\n\r\n"[..], 17),
            (b"0\r\ncontent-length:\r\n\r\n", 17),
            (b"0\r\nTRANSFER-ENCODING: chunked\r\n\r\n", 20),
            (b"0\r\ntRaNsFeR-eNcOdInG: gzip\r\n\r\n", 20),
            (
                b"5\r\nhello\r\n0\r\nX: 1\r\nContent-Length: 0\r\n\r\n",
                13 + 6 + 14,
            ),
        ] {
            assert_refused_at(input, ChunkedError::FramingTrailer, at);
        }
        // Names that only begin like them, or end like them, are discarded as any other.
        let long = [b"0\r\n".as_slice(), &[b'c'; 300], b": 1\r\n\r\n"].concat();
        for input in [
            &b"0\r\nX-Check: 1\r\n\r\n"[..],
            b"0\r\nContent-Lengthx: 5\r\n\r\n",
            b"0\r\nContent-Lengt: 5\r\n\r\n",
            b"0\r\nXContent-Length: 5\r\n\r\n",
            b"0\r\nContent-Length-X: 5\r\n\r\n",
            b"0\r\nTransfer-Encodings: chunked\r\n\r\n",
            b"0\r\nTransfer: chunked\r\n\r\n",
            b"0\r\nX: Content-Length\r\n\r\n",
            &long,
        ] {
            let input = with_next(input);
            assert_eq!(
                decode_any_split(&input).1,
                Outcome::End(NEXT.to_vec()),
                "{}",
                String::from_utf8_lossy(&input)
            );
        }
    }
}
