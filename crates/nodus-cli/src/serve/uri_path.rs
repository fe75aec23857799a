//! Turning a request's URI path into a list of safe, decoded path segments.
//!
//! This is the first line of defence of `nodus serve` against path traversal. A path is accepted
//! only if every segment, once percent-decoded, is a plain file name: not empty (except a final
//! trailing slash), not `.` or `..`, valid UTF-8, and free of `/`, `\` and NUL. Raw backslashes,
//! malformed percent escapes (`%zz`, `%4`) and paths that do not start with exactly one `/` (so
//! `//etc/passwd` and `/a//b` too) are refused as a whole. Nothing here touches the file system.
//!
//! Why refuse rather than normalize: browsers resolve dot segments before sending a request, so a
//! request that still contains them (raw or encoded) was crafted, and a strict parser has no
//! ambiguous cases to get wrong. Joining accepted segments onto the root can never leave it, since
//! no segment is absolute, empty, or a parent reference; symlinks are dealt with separately (see
//! `static_files`), after canonicalization.

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, percent_encode};

/// Why a URI path was refused (each maps to `400 Bad Request`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadPath {
    /// Does not start with `/`, or has an empty segment (`//x`, `/a//b`).
    NotAbsolute,
    /// A raw or encoded backslash, or an encoded slash inside a segment.
    Separator,
    /// A `%` not followed by two hex digits.
    BadEscape,
    /// An encoded NUL byte.
    Nul,
    /// Not UTF-8 after percent-decoding.
    NotUtf8,
    /// A `.` or `..` segment, raw or encoded.
    DotSegment,
}

impl BadPath {
    /// A short reason for the plain-text 400 body.
    pub fn reason(self) -> &'static str {
        match self {
            BadPath::NotAbsolute => "bad request path: empty segment",
            BadPath::Separator => "bad request path: encoded slash or backslash",
            BadPath::BadEscape => "bad request path: malformed percent escape",
            BadPath::Nul => "bad request path: NUL byte",
            BadPath::NotUtf8 => "bad request path: not UTF-8",
            BadPath::DotSegment => "bad request path: dot segment",
        }
    }
}

/// A request path split into decoded segments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedPath {
    /// Decoded, non-empty segments; never `.`/`..`, never containing `/`, `\` or NUL.
    pub segments: Vec<String>,
    /// The path ended with `/` (always true for `/` itself).
    pub trailing_slash: bool,
}

impl DecodedPath {
    /// The path re-encoded canonically (`/a%20b/c`), with a trailing slash if `slash`.
    /// Safe for a `Location` header: ASCII only, and never starts with `//`.
    pub fn encoded(&self, slash: bool) -> String {
        let mut out = String::from("/");
        for (i, seg) in self.segments.iter().enumerate() {
            if i > 0 {
                out.push('/');
            }
            out.push_str(&encode_segment(seg.as_bytes()));
        }
        if slash && !self.segments.is_empty() {
            out.push('/');
        }
        out
    }

    /// The decoded path as text (`/a b/c/`), for display only (HTML-escape it before use).
    pub fn display(&self) -> String {
        let mut out = String::from("/");
        for seg in &self.segments {
            out.push_str(seg);
            out.push('/');
        }
        if !self.trailing_slash && !self.segments.is_empty() {
            out.pop();
        }
        out
    }
}

/// Everything but RFC 3986's unreserved characters is percent-encoded in a segment. Encoding `:`
/// keeps a relative href such as `javascript:x` from being read as a scheme.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Percent-encodes one path segment (raw bytes: file names need not be UTF-8).
pub fn encode_segment(bytes: &[u8]) -> String {
    percent_encode(bytes, SEGMENT).to_string()
}

/// Splits and decodes a URI path (a query, if one is passed along, is ignored).
pub fn decode(uri_path: &str) -> Result<DecodedPath, BadPath> {
    let path = uri_path.split_once('?').map_or(uri_path, |(p, _)| p);
    let Some(rest) = path.strip_prefix('/') else {
        return Err(BadPath::NotAbsolute);
    };
    if path.contains('\\') {
        return Err(BadPath::Separator);
    }
    check_escapes(path)?;
    let mut raw: Vec<&str> = rest.split('/').collect();
    // "/" splits into [""], "/a/" into ["a", ""]: a final empty segment is the trailing slash.
    let trailing_slash = raw.last() == Some(&"");
    if trailing_slash {
        raw.pop();
    }
    let mut segments = Vec::with_capacity(raw.len());
    for seg in raw {
        if seg.is_empty() {
            return Err(BadPath::NotAbsolute);
        }
        let bytes: Vec<u8> = percent_decode_str(seg).collect();
        if bytes.contains(&0) {
            return Err(BadPath::Nul);
        }
        if bytes.contains(&b'/') || bytes.contains(&b'\\') {
            return Err(BadPath::Separator);
        }
        let text = String::from_utf8(bytes).map_err(|_| BadPath::NotUtf8)?;
        if text == "." || text == ".." {
            return Err(BadPath::DotSegment);
        }
        segments.push(text);
    }
    Ok(DecodedPath {
        segments,
        trailing_slash: trailing_slash || rest.is_empty(),
    })
}

fn check_escapes(path: &str) -> Result<(), BadPath> {
    let b = path.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let ok =
                i + 2 < b.len() && b[i + 1].is_ascii_hexdigit() && b[i + 2].is_ascii_hexdigit();
            if !ok {
                return Err(BadPath::BadEscape);
            }
            i += 3;
        } else {
            i += 1;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segs(p: &str) -> Vec<String> {
        decode(p).unwrap().segments
    }

    #[test]
    fn plain_paths() {
        assert_eq!(
            decode("/").unwrap(),
            DecodedPath {
                segments: vec![],
                trailing_slash: true
            }
        );
        assert_eq!(segs("/a/b.txt"), ["a", "b.txt"]);
        assert!(!decode("/a/b.txt").unwrap().trailing_slash);
        assert!(decode("/a/").unwrap().trailing_slash);
        assert_eq!(segs("/a%20b/%C3%A9"), ["a b", "é"]);
        assert_eq!(segs("/a+b"), ["a+b"]);
        assert_eq!(segs("/x?y=../.."), ["x"]);
        assert_eq!(segs("/..a/b..c/..."), ["..a", "b..c", "..."]);
    }

    #[test]
    fn traversal_is_refused() {
        for p in [
            "/..",
            "/../etc/passwd",
            "/a/../../etc/passwd",
            "/a/..",
            "/%2e%2e/etc/passwd",
            "/%2E%2e/etc/passwd",
            "/.%2E/x",
            "/%2e./x",
            "/a/%2e%2e",
            "/./a",
            "/a/%2e/b",
        ] {
            assert_eq!(decode(p), Err(BadPath::DotSegment), "{p}");
        }
    }

    #[test]
    fn separators_nul_escapes_and_utf8() {
        assert_eq!(decode("/a%2fb"), Err(BadPath::Separator));
        assert_eq!(decode("/%2F..%2Fetc"), Err(BadPath::Separator));
        assert_eq!(decode("/a%5cb"), Err(BadPath::Separator));
        assert_eq!(decode("/a%5C..%5Cb"), Err(BadPath::Separator));
        assert_eq!(decode("/a\\b"), Err(BadPath::Separator));
        assert_eq!(decode("/..\\..\\etc"), Err(BadPath::Separator));
        assert_eq!(decode("/a%00.txt"), Err(BadPath::Nul));
        assert_eq!(decode("/a%zz"), Err(BadPath::BadEscape));
        assert_eq!(decode("/a%4"), Err(BadPath::BadEscape));
        assert_eq!(decode("/a%"), Err(BadPath::BadEscape));
        assert_eq!(decode("/%ff%fe"), Err(BadPath::NotUtf8));
        assert_eq!(decode("/%c0%ae%c0%ae/x"), Err(BadPath::NotUtf8));
    }

    #[test]
    fn smuggled_absolute_paths_are_refused() {
        assert_eq!(decode("//etc/passwd"), Err(BadPath::NotAbsolute));
        assert_eq!(decode("/a//b"), Err(BadPath::NotAbsolute));
        assert_eq!(decode("etc/passwd"), Err(BadPath::NotAbsolute));
        assert_eq!(decode(""), Err(BadPath::NotAbsolute));
        assert_eq!(decode("%2fetc/passwd"), Err(BadPath::NotAbsolute));
    }

    #[test]
    fn dot_segments_and_reencoding() {
        // A dot-name is a segment like any other (`static_files::hidden` decides), decoded.
        assert_eq!(decode("/%2eenv").unwrap().segments, [".env"]);
        assert_eq!(
            decode("/a/.hidden/b").unwrap().segments,
            ["a", ".hidden", "b"]
        );
        let d = decode("/a%20b/c:d/%3Cx%3E").unwrap();
        assert_eq!(d.encoded(true), "/a%20b/c%3Ad/%3Cx%3E/");
        assert_eq!(d.encoded(false), "/a%20b/c%3Ad/%3Cx%3E");
        assert_eq!(d.display(), "/a b/c:d/<x>");
        assert_eq!(decode("/").unwrap().encoded(true), "/");
        assert_eq!(encode_segment(b"\xff a~b"), "%FF%20a~b");
    }
}
