//! Node's `json` serialization mode: one message per line, `JSON.stringify(msg) + "\n"`, with a
//! frame-size cap that Node does not have.
//!
//! Invariants:
//! - A frame is the bytes before a `\n`; JSON never contains a raw newline, so the split is
//!   unambiguous. A frame is valid UTF-8 JSON (serde_json checks both) or it is an error.
//! - No frame, complete or still arriving, may exceed `max_frame` bytes (default 16 MiB): the
//!   decoder reports that as soon as the buffered partial line passes the cap, then discards the
//!   rest of that line as it arrives, so memory stays bounded by about `max_frame` + one read.
//! - A bad frame costs only itself: after a malformed line or an oversized one the decoder goes
//!   on at the next `\n`, which no JSON text contains, so the stream never loses sync (Node
//!   would throw from its channel and crash the process).
//! - Positions are absolute stream offsets (bytes pushed since the start): [`Decoder::position`],
//!   [`Decoder::pushed`], [`Decoder::frame_start`]; a caller can tie side data (the fds a read
//!   brought) to the frames that start in a range of the stream.
//! - Frames are kept as raw JSON text ([`RawValue`]): a message reaches the user with its object
//!   keys in the sender's order, and is parsed into a user type only when asked.

use std::fmt;

use serde_json::value::RawValue;

/// The default cap on one frame: 16 MiB. A wire limit between nodus peers of any build, never
/// lowered (a worker's snapshot, at most 4 MiB, stays well under it; the cluster stats a
/// primary relays to a worker, every worker's snapshot in them, leave snapshots out to fit it).
pub const DEFAULT_MAX_FRAME: usize = 16 * 1024 * 1024;

/// Why a frame was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    /// A line longer than the cap (`len` is what was seen so far).
    TooLarge { len: usize, max: usize },
    /// A line that is not valid UTF-8 JSON.
    Malformed { message: String },
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::TooLarge { len, max } => {
                write!(f, "IPC frame of {len}+ bytes exceeds the {max}-byte cap")
            }
            FrameError::Malformed { message } => write!(f, "malformed IPC frame: {message}"),
        }
    }
}

impl std::error::Error for FrameError {}

/// Splits a byte stream into JSON frames.
#[derive(Debug)]
pub struct Decoder {
    buf: Vec<u8>,
    /// Start of the first unconsumed byte.
    start: usize,
    /// Bytes from `start` already searched for `\n`.
    scanned: usize,
    max_frame: usize,
    /// Discarding the rest of an oversized line, up to its `\n`.
    skipping: bool,
    /// The stream offset of `buf[0]`.
    base: u64,
    /// The last byte pushed was not a `\n`: a line is open.
    line_open: bool,
    /// The stream offset where the frame last returned (or refused) starts.
    last_start: u64,
}

impl Decoder {
    /// A decoder that refuses frames longer than `max_frame` bytes (not counting the `\n`).
    pub fn new(max_frame: usize) -> Decoder {
        Decoder {
            buf: Vec::new(),
            start: 0,
            scanned: 0,
            max_frame,
            skipping: false,
            base: 0,
            line_open: false,
            last_start: 0,
        }
    }

    /// Appends received bytes.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.start > 0 && self.start >= self.buf.len() / 2 {
            self.buf.drain(..self.start);
            self.base += self.start as u64;
            self.start = 0;
        }
        if let Some(&last) = bytes.last() {
            self.line_open = last != b'\n';
        }
        self.buf.extend_from_slice(bytes);
    }

    /// The stream offset of the first byte not consumed yet (the next frame's start, unless
    /// the rest of an oversized line is being discarded).
    pub fn position(&self) -> u64 {
        self.base + self.start as u64
    }

    /// The stream offset the next byte pushed will have.
    pub fn pushed(&self) -> u64 {
        self.base + self.buf.len() as u64
    }

    /// The stream offset where the frame [`next_frame`](Self::next_frame) last returned, or
    /// last refused, starts.
    pub fn frame_start(&self) -> u64 {
        self.last_start
    }

    /// The rest of an oversized line is being discarded, up to its `\n`.
    pub fn skipping(&self) -> bool {
        self.skipping
    }

    /// The bytes buffered from stream offset `at` on (empty if `at` is not buffered: consumed,
    /// discarded or not pushed yet).
    pub fn buffered_from(&self, at: u64) -> &[u8] {
        match at.checked_sub(self.base).map(usize::try_from) {
            Some(Ok(i)) if i >= self.start && i <= self.buf.len() => &self.buf[i..],
            _ => &[],
        }
    }

    /// Bytes of an incomplete frame held back.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.start
    }

    /// The next byte pushed starts a frame: the last byte pushed ended a line (or none was
    /// pushed), whether or not complete frames wait to be taken.
    pub fn at_frame_start(&self) -> bool {
        !self.line_open
    }

    /// The next complete frame, `Ok(None)` if more bytes are needed.
    ///
    /// # Errors
    /// A frame over the cap (reported once, as soon as it passes the cap) or a line that is not
    /// valid JSON. The bad frame is dropped and the next call goes on after it.
    pub fn next_frame(&mut self) -> Result<Option<Box<RawValue>>, FrameError> {
        loop {
            let pending = &self.buf[self.start..];
            let newline = pending[self.scanned..].iter().position(|&b| b == b'\n');
            if self.skipping {
                match newline {
                    Some(pos) => {
                        self.start += self.scanned + pos + 1;
                        self.scanned = 0;
                        self.skipping = false;
                        continue;
                    }
                    None => {
                        self.discard_pending();
                        return Ok(None);
                    }
                }
            }
            self.last_start = self.base + self.start as u64;
            let Some(pos) = newline else {
                self.scanned = pending.len();
                if pending.len() > self.max_frame {
                    let len = pending.len();
                    self.discard_pending();
                    self.skipping = true;
                    return Err(FrameError::TooLarge {
                        len,
                        max: self.max_frame,
                    });
                }
                return Ok(None);
            };
            let end = self.scanned + pos;
            let parsed = (end <= self.max_frame)
                .then(|| serde_json::from_slice::<Box<RawValue>>(&pending[..end]));
            self.start += end + 1;
            self.scanned = 0;
            return match parsed {
                Some(Ok(v)) => Ok(Some(v)),
                Some(Err(e)) => Err(FrameError::Malformed {
                    message: e.to_string(),
                }),
                None => Err(FrameError::TooLarge {
                    len: end,
                    max: self.max_frame,
                }),
            };
        }
    }

    /// Drops every buffered byte (the head of an oversized line).
    fn discard_pending(&mut self) {
        self.base += self.buf.len() as u64;
        self.buf = Vec::new();
        self.start = 0;
        self.scanned = 0;
    }
}

/// Serializes `msg` as one frame (`JSON + "\n"`), the way Node's `JSON.stringify` writes it:
/// compact, non-ASCII as raw UTF-8, NaN and infinities as `null`.
pub fn encode<T: serde::Serialize + ?Sized>(msg: &T) -> serde_json::Result<Vec<u8>> {
    let mut out = serde_json::to_vec(msg)?;
    out.push(b'\n');
    Ok(out)
}
