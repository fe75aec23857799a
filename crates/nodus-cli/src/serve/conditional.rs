//! Validators (`ETag`, `Last-Modified`) of a file and conditional requests (RFC 9110 section 13).
//!
//! The ETag is derived from metadata alone (length, mtime in nanoseconds), so no file content is
//! ever read to compute it; a file rewritten gets a new mtime and so a new tag. It holds no inode,
//! so replicas serving the same file (same length and mtime, e.g. from `rsync -t` or an image)
//! give the same tag, and revalidation and `If-Range` resumes work across them (as nginx; Apache
//! 2.4 dropped the inode for this reason). It is strong, except for the gzip representation
//! (`--gzip`), whose tag is the same one made weak (`W/`): it then matches `If-None-Match` (weak
//! comparison) but never `If-Match` or `If-Range` (strong).
//!
//! `Last-Modified` is the mtime truncated to whole seconds, never later than the response's time:
//! a future mtime is replaced by the response's date (RFC 9110 section 8.8.2.1), and every
//! comparison (`If-Modified-Since`, `If-Unmodified-Since`, `If-Range`) uses that clamped value,
//! the one the client was sent. It is omitted when it cannot be written as an HTTP-date (before
//! 1970), which httpdate would panic on.
//!
//! Preconditions are evaluated in the order RFC 9110 section 13.2.2 prescribes: `If-Match`, else
//! `If-Unmodified-Since` (412 when false); `If-None-Match` (304 for GET/HEAD, using the weak
//! comparison), else `If-Modified-Since` (304 when not modified since; a date later than the
//! wall clock at the request is invalid and ignored, RFC 9110 section 13.1.3, as nginx does);
//! then `If-Range` decides whether a `Range` is honoured (strong comparison only; a date matches
//! only an exact, strong `Last-Modified`). Malformed conditional headers are ignored, never an
//! error.

use std::fs::Metadata;
use std::os::unix::fs::MetadataExt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::header::{
    HeaderName, IF_MATCH, IF_MODIFIED_SINCE, IF_NONE_MATCH, IF_RANGE, IF_UNMODIFIED_SINCE,
};
use http::{HeaderMap, Method};

/// Largest time an HTTP-date can express (9999-12-31T23:59:59Z), in seconds since the epoch.
const MAX_HTTP_DATE_SECS: u64 = 253_402_300_799;

/// The validators of one file, computed from its metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Validators {
    /// The entity tag's opaque part, quoted: `"len-mtime_ns"` in hex.
    pub etag: String,
    /// The tag is weak (`W/`): the representation is a transformation of the file (gzip), whose
    /// bytes are not the file's. A weak tag never matches strongly (`If-Match`, `If-Range`).
    pub weak: bool,
    /// The mtime truncated to seconds and clamped to the response's time, if an HTTP-date can
    /// express it.
    pub last_modified: Option<SystemTime>,
}

impl Validators {
    /// The validators of a file with `meta`, for a response made at `now`.
    pub fn from_metadata(meta: &Metadata, now: SystemTime) -> Validators {
        let mtime_ns = i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec());
        let etag = format!("\"{:x}-{:x}\"", meta.len(), mtime_ns);
        let now_secs = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let last_modified = u64::try_from(meta.mtime())
            .ok()
            .map(|s| s.min(now_secs).min(MAX_HTTP_DATE_SECS))
            .map(|s| UNIX_EPOCH + Duration::from_secs(s));
        Validators {
            etag,
            weak: false,
            last_modified,
        }
    }

    /// `ETag` header value: the tag, with `W/` when weak.
    pub fn etag_header(&self) -> String {
        if self.weak {
            format!("W/{}", self.etag)
        } else {
            self.etag.clone()
        }
    }

    /// `Last-Modified` header value, if any.
    pub fn last_modified_header(&self) -> Option<String> {
        self.last_modified.map(httpdate::fmt_http_date)
    }
}

/// What the preconditions say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precondition {
    /// Go on and serve (subject to `Range`/`If-Range`).
    Proceed,
    /// 304 Not Modified.
    NotModified,
    /// 412 Precondition Failed.
    Failed,
}

/// Evaluates `If-Match`, `If-Unmodified-Since`, `If-None-Match` and `If-Modified-Since`; `now`
/// is the wall clock at the request (an `If-Modified-Since` later than it is ignored).
pub fn preconditions(
    method: &Method,
    headers: &HeaderMap,
    v: &Validators,
    now: SystemTime,
) -> Precondition {
    let safe = method == Method::GET || method == Method::HEAD;
    if let Some(list) = joined(headers, IF_MATCH) {
        if !matches_list(&list, v, true) {
            return Precondition::Failed;
        }
    } else if let (Some(date), Some(lm)) =
        (single_date(headers, IF_UNMODIFIED_SINCE), v.last_modified)
        && lm > date
    {
        return Precondition::Failed;
    }
    if let Some(list) = joined(headers, IF_NONE_MATCH) {
        if matches_list(&list, v, false) {
            return if safe {
                Precondition::NotModified
            } else {
                Precondition::Failed
            };
        }
    } else if safe
        && let (Some(date), Some(lm)) = (single_date(headers, IF_MODIFIED_SINCE), v.last_modified)
        && date <= now
        && lm <= date
    {
        return Precondition::NotModified;
    }
    Precondition::Proceed
}

/// Whether a `Range` may be honoured: true without `If-Range`, else only if it matches strongly.
/// `now` is the response's date (a `Last-Modified` less than a second old is weak).
pub fn if_range_allows(headers: &HeaderMap, v: &Validators, now: SystemTime) -> bool {
    let mut values = headers.get_all(IF_RANGE).iter();
    let value = match (values.next(), values.next()) {
        (None, _) => return true,
        (Some(value), None) => value,
        (Some(_), Some(_)) => return false,
    };
    let Ok(value) = value.to_str() else {
        return false;
    };
    let value = value.trim();
    if value.starts_with('"') || value.starts_with("W/") {
        return !v.weak
            && matches!(parse_tags(value).as_slice(), [Tag { weak: false, opaque }] if *opaque == v.etag);
    }
    match (httpdate::parse_http_date(value), v.last_modified) {
        (Ok(date), Some(lm)) => date == lm && lm + Duration::from_secs(1) <= now,
        _ => false,
    }
}

/// All values of a list header, joined with commas; `None` if absent or not visible ASCII.
fn joined(headers: &HeaderMap, name: HeaderName) -> Option<String> {
    let mut out: Option<String> = None;
    for value in headers.get_all(name) {
        let s = value.to_str().ok()?;
        match &mut out {
            Some(o) => {
                o.push(',');
                o.push_str(s);
            }
            None => out = Some(s.to_owned()),
        }
    }
    out
}

/// A single, valid HTTP-date header value; `None` if absent, repeated or invalid.
fn single_date(headers: &HeaderMap, name: HeaderName) -> Option<SystemTime> {
    let mut values = headers.get_all(name).iter();
    let (Some(value), None) = (values.next(), values.next()) else {
        return None;
    };
    httpdate::parse_http_date(value.to_str().ok()?.trim()).ok()
}

/// One entity tag from a list; `opaque` keeps its quotes.
#[derive(Debug, PartialEq, Eq)]
struct Tag<'a> {
    weak: bool,
    opaque: &'a str,
}

/// Parses `#entity-tag` (commas may appear inside quotes). Stops at the first malformed element,
/// keeping what was parsed before it.
fn parse_tags(list: &str) -> Vec<Tag<'_>> {
    let mut tags = Vec::new();
    let mut rest = list;
    loop {
        rest = rest.trim_start_matches([' ', '\t', ',']);
        if rest.is_empty() {
            return tags;
        }
        let weak = rest.starts_with("W/");
        if weak {
            rest = &rest[2..];
        }
        if !rest.starts_with('"') {
            return tags;
        }
        let Some(close) = rest[1..].find('"') else {
            return tags;
        };
        let (opaque, after) = rest.split_at(close + 2);
        if !(after.is_empty() || after.starts_with([' ', '\t', ','])) {
            return tags;
        }
        tags.push(Tag { weak, opaque });
        rest = after;
    }
}

/// `*` matches any current representation; otherwise strong or weak comparison against ours
/// (a strong comparison fails if either tag is weak).
fn matches_list(list: &str, ours: &Validators, strong: bool) -> bool {
    if list.trim() == "*" {
        return true;
    }
    parse_tags(list)
        .iter()
        .any(|t| t.opaque == ours.etag && !(strong && (t.weak || ours.weak)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn v() -> Validators {
        Validators {
            etag: "\"abc\"".into(),
            weak: false,
            last_modified: Some(UNIX_EPOCH + Duration::from_secs(1_000_000_000)),
        }
    }

    fn h(pairs: &[(HeaderName, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, val) in pairs {
            m.append(k.clone(), HeaderValue::from_str(val).unwrap());
        }
        m
    }

    /// The wall clock at the request: a minute after `LM`.
    fn now() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_000_000_060)
    }

    const LM: &str = "Sun, 09 Sep 2001 01:46:40 GMT";
    const BEFORE: &str = "Sun, 09 Sep 2001 01:46:39 GMT";
    const AFTER: &str = "Sun, 09 Sep 2001 01:46:41 GMT";

    #[test]
    fn tag_lists() {
        assert_eq!(
            parse_tags(r#""a", W/"b",,"c,d" , "e"#),
            vec![
                Tag {
                    weak: false,
                    opaque: "\"a\""
                },
                Tag {
                    weak: true,
                    opaque: "\"b\""
                },
                Tag {
                    weak: false,
                    opaque: "\"c,d\""
                },
            ]
        );
        assert!(parse_tags("abc").is_empty());
        assert!(parse_tags(r#""a"x, "b""#).is_empty());
        assert_eq!(parse_tags(r#""a", "b"x"#).len(), 1);
    }

    #[test]
    fn if_none_match() {
        let get = Method::GET;
        let pre = |hs: &[(HeaderName, &str)]| preconditions(&get, &h(hs), &v(), now());
        assert_eq!(pre(&[]), Precondition::Proceed);
        assert_eq!(
            pre(&[(IF_NONE_MATCH, "\"abc\"")]),
            Precondition::NotModified
        );
        assert_eq!(
            pre(&[(IF_NONE_MATCH, "W/\"abc\"")]),
            Precondition::NotModified
        );
        assert_eq!(
            pre(&[(IF_NONE_MATCH, "\"x\", W/\"abc\"")]),
            Precondition::NotModified
        );
        assert_eq!(
            pre(&[(IF_NONE_MATCH, "\"x\""), (IF_NONE_MATCH, "\"abc\"")]),
            Precondition::NotModified
        );
        assert_eq!(pre(&[(IF_NONE_MATCH, "*")]), Precondition::NotModified);
        assert_eq!(pre(&[(IF_NONE_MATCH, "\"abcd\"")]), Precondition::Proceed);
        assert_eq!(pre(&[(IF_NONE_MATCH, "abc")]), Precondition::Proceed);
        // If-None-Match present: If-Modified-Since is not looked at.
        assert_eq!(
            pre(&[(IF_NONE_MATCH, "\"x\""), (IF_MODIFIED_SINCE, AFTER)]),
            Precondition::Proceed
        );
        assert_eq!(
            preconditions(
                &Method::HEAD,
                &h(&[(IF_NONE_MATCH, "\"abc\"")]),
                &v(),
                now()
            ),
            Precondition::NotModified
        );
        assert_eq!(
            preconditions(&Method::PUT, &h(&[(IF_NONE_MATCH, "\"abc\"")]), &v(), now()),
            Precondition::Failed
        );
    }

    #[test]
    fn if_modified_since() {
        let pre = |hs: &[(HeaderName, &str)]| preconditions(&Method::GET, &h(hs), &v(), now());
        assert_eq!(pre(&[(IF_MODIFIED_SINCE, LM)]), Precondition::NotModified);
        assert_eq!(
            pre(&[(IF_MODIFIED_SINCE, AFTER)]),
            Precondition::NotModified
        );
        assert_eq!(pre(&[(IF_MODIFIED_SINCE, BEFORE)]), Precondition::Proceed);
        assert_eq!(
            pre(&[(IF_MODIFIED_SINCE, "yesterday")]),
            Precondition::Proceed
        );
        assert_eq!(
            pre(&[(IF_MODIFIED_SINCE, LM), (IF_MODIFIED_SINCE, LM)]),
            Precondition::Proceed
        );
        let no_lm = Validators {
            last_modified: None,
            ..v()
        };
        assert_eq!(
            preconditions(
                &Method::GET,
                &h(&[(IF_MODIFIED_SINCE, AFTER)]),
                &no_lm,
                now()
            ),
            Precondition::Proceed
        );
        assert_eq!(
            preconditions(
                &Method::POST,
                &h(&[(IF_MODIFIED_SINCE, AFTER)]),
                &v(),
                now()
            ),
            Precondition::Proceed
        );
    }

    #[test]
    fn an_if_modified_since_later_than_now_is_ignored() {
        let at = |now: SystemTime| {
            preconditions(&Method::GET, &h(&[(IF_MODIFIED_SINCE, AFTER)]), &v(), now)
        };
        let after = UNIX_EPOCH + Duration::from_secs(1_000_000_001);
        // RFC 9110 section 13.1.3: a date later than the server's current time is invalid.
        assert_eq!(at(after - Duration::from_millis(1)), Precondition::Proceed);
        assert_eq!(at(after), Precondition::NotModified);
        assert_eq!(
            at(after + Duration::from_millis(1)),
            Precondition::NotModified
        );
        // Not a reason to refuse: the request is answered as without the header.
        let far = "Fri, 31 Dec 9999 23:59:59 GMT";
        assert_eq!(
            preconditions(&Method::GET, &h(&[(IF_MODIFIED_SINCE, far)]), &v(), now()),
            Precondition::Proceed
        );
    }

    #[test]
    fn if_match_and_if_unmodified_since() {
        let pre = |hs: &[(HeaderName, &str)]| preconditions(&Method::GET, &h(hs), &v(), now());
        assert_eq!(pre(&[(IF_MATCH, "\"abc\"")]), Precondition::Proceed);
        assert_eq!(pre(&[(IF_MATCH, "*")]), Precondition::Proceed);
        assert_eq!(pre(&[(IF_MATCH, "W/\"abc\"")]), Precondition::Failed);
        assert_eq!(pre(&[(IF_MATCH, "\"zzz\"")]), Precondition::Failed);
        assert_eq!(pre(&[(IF_UNMODIFIED_SINCE, BEFORE)]), Precondition::Failed);
        assert_eq!(pre(&[(IF_UNMODIFIED_SINCE, LM)]), Precondition::Proceed);
        // If-Match present: If-Unmodified-Since is not looked at.
        assert_eq!(
            pre(&[(IF_MATCH, "\"abc\""), (IF_UNMODIFIED_SINCE, BEFORE)]),
            Precondition::Proceed
        );
    }

    #[test]
    fn a_weak_tag_matches_weakly_only() {
        let gz = Validators { weak: true, ..v() };
        assert_eq!(gz.etag_header(), "W/\"abc\"");
        assert_eq!(v().etag_header(), "\"abc\"");
        let pre = |hs: &[(HeaderName, &str)]| preconditions(&Method::GET, &h(hs), &gz, now());
        assert_eq!(
            pre(&[(IF_NONE_MATCH, "W/\"abc\"")]),
            Precondition::NotModified
        );
        assert_eq!(
            pre(&[(IF_NONE_MATCH, "\"abc\"")]),
            Precondition::NotModified
        );
        assert_eq!(pre(&[(IF_MATCH, "W/\"abc\"")]), Precondition::Failed);
        assert_eq!(pre(&[(IF_MATCH, "\"abc\"")]), Precondition::Failed);
        assert_eq!(pre(&[(IF_MATCH, "*")]), Precondition::Proceed);
        let now = SystemTime::now();
        assert!(!if_range_allows(&h(&[(IF_RANGE, "\"abc\"")]), &gz, now));
    }

    #[test]
    fn if_range() {
        let now = SystemTime::now();
        let ok = |hs: &[(HeaderName, &str)]| if_range_allows(&h(hs), &v(), now);
        assert!(ok(&[]));
        assert!(ok(&[(IF_RANGE, "\"abc\"")]));
        assert!(!ok(&[(IF_RANGE, "W/\"abc\"")]));
        assert!(!ok(&[(IF_RANGE, "\"old\"")]));
        assert!(ok(&[(IF_RANGE, LM)]));
        assert!(!ok(&[(IF_RANGE, AFTER)]));
        assert!(!ok(&[(IF_RANGE, BEFORE)]));
        assert!(!ok(&[(IF_RANGE, "garbage")]));
        assert!(!ok(&[(IF_RANGE, "\"abc\""), (IF_RANGE, "\"abc\"")]));
        // A Last-Modified less than a second before the response is weak: no match.
        let just_now = UNIX_EPOCH + Duration::from_secs(1_000_000_000) + Duration::from_millis(500);
        assert!(!if_range_allows(&h(&[(IF_RANGE, LM)]), &v(), just_now));
    }
}
