//! `Note`: the short dynamic text a task attaches to itself (`nodus::task::set_note`, e.g. the
//! request an HTTP handler serves), as the loop publishes it in its `LoopSlot` and the watchdog
//! shows it next to the task's static name.
//!
//! A note is a `&'static str` prefix (shared by pointer, as task names are: `"GET "`) and a
//! dynamic text (copied: `/slow/thing`), so the common case copies only what is dynamic.
//!
//! Invariants:
//! - The text is at most [`NOTE_MAX`] bytes less the prefix's length: a longer one is cut at the
//!   last char boundary within them (`cut`), so the loop copies a bounded number of words and
//!   never allocates for it.
//! - The text is plain words: the slot keeps it in atomics, so the watchdog's read of a note the
//!   loop is rewriting is a data-race-free torn read that the note's seqlock discards, never
//!   undefined behaviour. Only the prefix is a pointer, and it always comes from a
//!   `&'static str` (`LoopSlot::read_note`'s `unsafe`).
//! - What is shown (`render`) is never trusted to be one piece of text: the prefix and the
//!   longest valid UTF-8 prefix of the text's bytes, cut to [`NOTE_MAX`] bytes at a char
//!   boundary, with every control character and backslash escaped, so a note cannot break a log
//!   line or drive a terminal (`nodus top`).

use std::fmt::Write as _;

/// The longest note, in bytes.
pub(crate) const NOTE_MAX: usize = 64;
pub(super) const NOTE_WORDS: usize = NOTE_MAX / 8;

/// A note: its static prefix, and its text's bytes packed in little-endian words (`pack`; `len`
/// of them are the text). The empty note has neither.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Note {
    pub(super) prefix: &'static str,
    pub(super) words: [u64; NOTE_WORDS],
    pub(super) len: u8,
}

impl Default for Note {
    fn default() -> Note {
        Note {
            prefix: "",
            words: [0; NOTE_WORDS],
            len: 0,
        }
    }
}

/// `text` cut to at most `max` bytes, at a char boundary.
pub(crate) fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The text of a note with `prefix`: `text` cut to what fits with it in [`NOTE_MAX`] bytes.
#[inline(always)]
pub(crate) fn fit<'a>(prefix: &str, text: &'a str) -> &'a str {
    cut(text, NOTE_MAX.saturating_sub(prefix.len()))
}

/// Packs `bytes` (at most [`NOTE_MAX`]) into little-endian words: `store(i, word)` for each, in
/// order, the last one padded with zeros. No buffer and no `memcpy`: eight bytes at a time, the
/// last few in one or two loads (`load_short`).
#[inline(always)]
pub(crate) fn pack(bytes: &[u8], mut store: impl FnMut(usize, u64)) {
    let mut chunks = bytes.chunks_exact(8);
    let mut i = 0;
    for chunk in &mut chunks {
        store(
            i,
            u64::from_le_bytes([
                chunk[0], chunk[1], chunk[2], chunk[3], chunk[4], chunk[5], chunk[6], chunk[7],
            ]),
        );
        i += 1;
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        store(i, load_short(rest));
    }
}

/// `b` (1 to 7 bytes) as a little-endian word, zero above them, without a loop: two overlapping
/// loads of 4 bytes, or of the first, middle and last byte.
#[inline(always)]
fn load_short(b: &[u8]) -> u64 {
    let n = b.len();
    if n >= 4 {
        let lo = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        let hi = u32::from_le_bytes([b[n - 4], b[n - 3], b[n - 2], b[n - 1]]);
        u64::from(lo) | u64::from(hi) << ((n - 4) * 8)
    } else {
        u64::from(b[0]) | u64::from(b[n / 2]) << (n / 2 * 8) | u64::from(b[n - 1]) << ((n - 1) * 8)
    }
}

impl Note {
    pub(crate) fn is_empty(&self) -> bool {
        self.prefix.is_empty() && self.len == 0
    }

    /// The text's bytes.
    fn bytes(&self) -> ([u8; NOTE_MAX], usize) {
        let mut out = [0u8; NOTE_MAX];
        for (chunk, word) in out.chunks_exact_mut(8).zip(self.words) {
            chunk.copy_from_slice(&word.to_le_bytes());
        }
        (out, usize::from(self.len).min(NOTE_MAX))
    }

    /// The note as shown in reports and logs: the prefix and the text's longest valid UTF-8
    /// prefix, cut to [`NOTE_MAX`] bytes at a char boundary, each control character escaped as
    /// `\u{..}` and each backslash doubled. Empty for the empty note.
    pub(crate) fn render(&self) -> String {
        let (bytes, len) = self.bytes();
        let bytes = &bytes[..len];
        let text = match std::str::from_utf8(bytes) {
            Ok(text) => text,
            Err(e) => std::str::from_utf8(&bytes[..e.valid_up_to()]).unwrap_or_default(),
        };
        let joined = format!("{}{text}", self.prefix);
        let mut out = String::with_capacity(joined.len());
        for c in cut(&joined, NOTE_MAX).chars() {
            if c.is_control() {
                let _ = write!(out, "{}", c.escape_unicode());
            } else if c == '\\' {
                out.push_str("\\\\");
            } else {
                out.push(c);
            }
        }
        out
    }
}

#[cfg(test)]
impl Note {
    /// The note of `prefix` and `text`, as the slot stores it.
    pub(crate) fn prefixed(prefix: &'static str, text: &str) -> Note {
        let text = fit(prefix, text).as_bytes();
        let mut note = Note {
            prefix,
            len: text.len() as u8,
            ..Note::default()
        };
        pack(text, |i, word| note.words[i] = word);
        note
    }

    pub(crate) fn of(text: &str) -> Note {
        Note::prefixed("", text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_note_is_cut_on_a_char_boundary_and_escaped_when_shown() {
        assert_eq!(Note::of("GET /slow/thing").render(), "GET /slow/thing");
        assert_eq!(
            Note::prefixed("GET ", "/slow/thing").render(),
            "GET /slow/thing"
        );
        assert_eq!(Note::default().render(), "");
        assert!(Note::of("").is_empty());
        assert!(!Note::prefixed("CONNECT", "").is_empty());
        // Every length of text, after every prefix length: packed and shown whole.
        let text = "abcdefghijklmnopqrstuvwxyz0123456789";
        for (prefix, n) in [("", 0), ("GET ", 4), ("DELETE ", 7), ("PROPFIND ", 9)] {
            for len in 0..=text.len() {
                assert_eq!(
                    Note::prefixed(prefix, &text[..len]).render(),
                    format!("{}{}", &prefix[..n], &text[..len])
                );
            }
        }
        // Cut at 64 bytes in all; a two-byte char across the cut goes whole.
        let long = format!("/{}", "a".repeat(100));
        assert_eq!(cut(&long, NOTE_MAX).len(), NOTE_MAX);
        assert_eq!(Note::of(&long).render(), long[..NOTE_MAX]);
        assert_eq!(
            Note::prefixed("GET ", &long).render(),
            format!("GET {}", &long[..NOTE_MAX - 4])
        );
        let straddling = format!("{}é tail", "x".repeat(NOTE_MAX - 1));
        assert_eq!(cut(&straddling, NOTE_MAX), "x".repeat(NOTE_MAX - 1));
        assert_eq!(Note::of(&straddling).render(), "x".repeat(NOTE_MAX - 1));
        let long_prefix: &'static str = "p".repeat(100).leak();
        assert_eq!(
            Note::prefixed(long_prefix, "x").render(),
            "p".repeat(NOTE_MAX)
        );
        // Control characters (C0, DEL, C1) and backslashes are escaped; the rest is kept.
        assert_eq!(
            Note::of("GET /a\r\nX: \u{1b}[2J\u{7f}\u{85}\\é").render(),
            "GET /a\\u{d}\\u{a}X: \\u{1b}[2J\\u{7f}\\u{85}\\\\é"
        );
        // Bytes that are not UTF-8 (a torn copy cannot be, but the reader does not trust it).
        let mut torn = Note::of("ok");
        torn.words[0] = u64::from_le_bytes([b'o', b'k', 0xc3, 0, 0, 0, 0, 0]);
        torn.len = 3;
        assert_eq!(torn.render(), "ok");
    }
}
