//! JSON with limits, large documents parsed off the loop (seed 003's "JSON DOS": `JSON.parse`
//! of a big or deep document blocks Node's loop for as long as it takes).
//!
//! Invariants:
//! - A document longer than `max_bytes` is refused before any parsing; one nested deeper than
//!   `max_depth` is refused after a linear scan, before serde builds anything.
//! - Documents of at most `offload_threshold` bytes (default 64 KiB, well under a millisecond
//!   to parse) are parsed inline: a pool round trip would cost more than it saves. Larger ones
//!   are scanned and parsed on the CPU pool.
//! - serde_json refuses 128 levels of nesting by itself, so the depth actually checked is
//!   `max_depth` capped at [`MAX_DEPTH_CAP`] (127): a document nested deeper fails with
//!   `TooDeep { limit }` naming that checked depth, never with serde_json's recursion error.
//!
//! Where [`parse`] differs from Node's `JSON.parse` (serde_json with `float_roundtrip`, so that
//! a number parses to the correctly rounded double, as in Node; no `arbitrary_precision`, no
//! `preserve_order`):
//! - A number out of the `f64` range (`1e400`, `-1e400`) is a `Syntax` error; Node gives
//!   `Infinity`. One that underflows (`1e-400`) is 0 in both.
//! - A lone surrogate escape (`"\ud800"`, `"\udc00"`) is a `Syntax` error; Node keeps it in the
//!   string.
//! - Input bytes that are not UTF-8 are a `Syntax` error; Node's `JSON.parse(buf.toString())`
//!   reads each bad sequence as U+FFFD.
//! - An integer within `i64` or `u64` stays exact in a `Value` (`9007199254740993`); Node rounds
//!   every number to a double (`9007199254740992`). A larger integer is an `f64` in both.
//! - A `Value` object's keys are sorted; Node keeps insertion order (integer-like keys first).
//!   A repeated key: the last wins in a `Value`, as in Node; a derived struct refuses it.

use std::fmt;
use std::io::Write;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::pool::{OffloadError, offload_cpu};

/// Default longest document accepted: 16 MiB.
pub const DEFAULT_MAX_BYTES: usize = 16 << 20;

/// Default deepest nesting of arrays and objects accepted.
pub const DEFAULT_MAX_DEPTH: usize = 64;

/// Deepest nesting any parse accepts, whatever `max_depth` says: serde_json's recursion limit
/// refuses the 128th level.
pub const MAX_DEPTH_CAP: usize = 127;

/// Default size above which a document is parsed on the CPU pool: 64 KiB.
pub const DEFAULT_OFFLOAD_THRESHOLD: usize = 64 * 1024;

/// Limits of one parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_bytes: usize,
    /// Deepest nesting of arrays and objects; above [`MAX_DEPTH_CAP`] it acts as that cap.
    pub max_depth: usize,
    pub offload_threshold: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bytes: DEFAULT_MAX_BYTES,
            max_depth: DEFAULT_MAX_DEPTH,
            offload_threshold: DEFAULT_OFFLOAD_THRESHOLD,
        }
    }
}

/// Why a document was not parsed (or a value not serialized).
#[derive(Debug)]
pub enum Error {
    /// The document (or the serialized value) is longer than the limit; `len` is its length,
    /// or for `stringify` the length reached when the limit was passed.
    TooLarge { len: usize, limit: usize },
    /// Arrays and objects nest deeper than the limit (`max_depth`, or [`MAX_DEPTH_CAP`] if lower).
    TooDeep { limit: usize },
    /// Not valid JSON, or not the shape `T` expects.
    Syntax(serde_json::Error),
    /// The pool job failed (it panicked, or the queue was full).
    Offload(OffloadError),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::TooLarge { len, limit } => {
                write!(f, "JSON of {len}+ bytes is over the limit of {limit}")
            }
            Error::TooDeep { limit } => {
                write!(f, "JSON nests deeper than the limit of {limit} levels")
            }
            Error::Syntax(e) => write!(f, "invalid JSON: {e}"),
            Error::Offload(e) => write!(f, "JSON parse failed on the pool: {e}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Syntax(e) => Some(e),
            Error::Offload(e) => Some(e),
            _ => None,
        }
    }
}

/// Parses `input` with the default [`Limits`].
pub async fn parse<T, I>(input: I) -> Result<T, Error>
where
    T: DeserializeOwned + Send + 'static,
    I: AsRef<[u8]> + Send + 'static,
{
    parse_with(input, Limits::default()).await
}

/// Parses `input` as a `T` (`serde_json::Value` for any JSON), within `limits`.
pub async fn parse_with<T, I>(input: I, limits: Limits) -> Result<T, Error>
where
    T: DeserializeOwned + Send + 'static,
    I: AsRef<[u8]> + Send + 'static,
{
    let len = input.as_ref().len();
    if len > limits.max_bytes {
        return Err(Error::TooLarge {
            len,
            limit: limits.max_bytes,
        });
    }
    if len <= limits.offload_threshold {
        return parse_inline(input.as_ref(), limits.max_depth);
    }
    offload_cpu(move || parse_inline(input.as_ref(), limits.max_depth))
        .await
        .map_err(Error::Offload)?
}

fn parse_inline<T: DeserializeOwned>(bytes: &[u8], max_depth: usize) -> Result<T, Error> {
    check_depth(bytes, max_depth.min(MAX_DEPTH_CAP))?;
    serde_json::from_slice(bytes).map_err(Error::Syntax)
}

/// Fails if brackets outside strings nest deeper than `max` (malformed input is left to serde).
fn check_depth(bytes: &[u8], max: usize) -> Result<(), Error> {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for &b in bytes {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > max {
                    return Err(Error::TooDeep { limit: max });
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

/// Serializes `value` on the calling thread, failing with `TooLarge` as soon as the output
/// would pass `max_bytes` (so a huge value costs at most `max_bytes` of memory).
pub fn stringify<T: Serialize + ?Sized>(value: &T, max_bytes: usize) -> Result<Vec<u8>, Error> {
    struct Capped {
        out: Vec<u8>,
        max: usize,
        over: Option<usize>,
    }
    impl Write for Capped {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if self.out.len() + buf.len() > self.max {
                self.over = Some(self.out.len() + buf.len());
                return Err(std::io::Error::other("over the limit"));
            }
            self.out.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut w = Capped {
        out: Vec::new(),
        max: max_bytes,
        over: None,
    };
    match (serde_json::to_writer(&mut w, value), w.over) {
        (Ok(()), _) => Ok(w.out),
        (Err(_), Some(len)) => Err(Error::TooLarge {
            len,
            limit: max_bytes,
        }),
        (Err(e), None) => Err(Error::Syntax(e)),
    }
}
