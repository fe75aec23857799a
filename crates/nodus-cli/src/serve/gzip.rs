//! `--gzip`: compressing static responses for clients that accept it, on the CPU pool.
//!
//! Only whole (200) GET responses of compressible types (text, JavaScript, JSON, XML, SVG) of at
//! least 1 KiB are compressed; ranges, 304s and HEAD are left alone. The compressed response has
//! no `Content-Length` (it streams, chunked), `Content-Encoding: gzip`, `Vary: Accept-Encoding`,
//! and a weak `ETag` (the bytes differ from the identity representation). Every 64 KiB chunk is
//! compressed in its own CPU-pool job (`nodus::zlib::Compressor`), so a large file never holds
//! the loop or a pool thread for long.

use std::io;

use bytes::Bytes;
use futures_util::stream;
use http::header::{ACCEPT_ENCODING, CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE, ETAG, VARY};
use http::{HeaderMap, HeaderValue};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use nodus::zlib::{Compressor, Format};
use nodus_http::Body;

const MIN_SIZE: u64 = 1024;
const LEVEL: u32 = 6;

/// Whether the request accepts gzip (`Accept-Encoding: gzip`, not with `q=0`).
pub fn accepts_gzip(request: &HeaderMap) -> bool {
    request
        .get_all(ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|item| {
            let mut parts = item.split(';').map(str::trim);
            let coding = parts.next().unwrap_or("");
            let q_zero = parts.any(|p| {
                p.strip_prefix("q=")
                    .is_some_and(|q| q.trim().parse::<f32>().is_ok_and(|q| q == 0.0))
            });
            (coding.eq_ignore_ascii_case("gzip") || coding == "*") && !q_zero
        })
}

/// Whether a full response with these headers and length is worth compressing.
pub fn compressible(response: &HeaderMap, len: u64) -> bool {
    let Some(ct) = response.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let ct = ct.split(';').next().unwrap_or("").trim();
    len >= MIN_SIZE
        && (ct.starts_with("text/")
            || matches!(
                ct,
                "application/javascript"
                    | "application/json"
                    | "application/xml"
                    | "image/svg+xml"
                    | "application/wasm"
            ))
}

/// Rewrites the headers of a response that is about to be gzipped.
pub fn gzip_headers(headers: &mut HeaderMap) {
    headers.remove(CONTENT_LENGTH);
    headers.insert(CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    headers.append(VARY, HeaderValue::from_static("Accept-Encoding"));
    if let Some(etag) = headers.get(ETAG).and_then(|v| v.to_str().ok())
        && !etag.starts_with("W/")
        && let Ok(weak) = HeaderValue::from_str(&format!("W/{etag}"))
    {
        headers.insert(ETAG, weak);
    }
}

/// `body`, gzipped chunk by chunk on the CPU pool.
pub fn gzip_body(body: Body) -> io::Result<Body> {
    let compressor = Compressor::new(Format::Gzip, LEVEL)?;
    let chunks = stream::unfold(Some((body, compressor)), |state| async move {
        let (mut body, mut compressor) = state?;
        loop {
            match body.frame().await {
                Some(Ok(frame)) => {
                    let Ok(data) = frame.into_data() else {
                        continue;
                    };
                    match compressor.write(data.to_vec()).await {
                        Ok(out) if out.is_empty() => continue,
                        Ok(out) => {
                            return Some((
                                Ok(Frame::data(Bytes::from(out))),
                                Some((body, compressor)),
                            ));
                        }
                        Err(e) => return Some((Err(e), None)),
                    }
                }
                Some(Err(e)) => return Some((Err(e), None)),
                None => {
                    return match compressor.finish().await {
                        Ok(out) => Some((Ok(Frame::data(Bytes::from(out))), None)),
                        Err(e) => Some((Err(e), None)),
                    };
                }
            }
        }
    });
    Ok(nodus_http::boxed(StreamBody::new(chunks)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(ACCEPT_ENCODING, HeaderValue::from_str(v).unwrap());
        h
    }

    #[test]
    fn accept_encoding() {
        assert!(accepts_gzip(&req("gzip")));
        assert!(accepts_gzip(&req("br, gzip;q=0.8")));
        assert!(accepts_gzip(&req("*")));
        assert!(!accepts_gzip(&req("gzip;q=0")));
        assert!(!accepts_gzip(&req("br, deflate")));
        assert!(!accepts_gzip(&HeaderMap::new()));
    }

    #[test]
    fn what_is_compressed() {
        let mut h = HeaderMap::new();
        h.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/html; charset=utf-8"),
        );
        assert!(compressible(&h, 4096));
        assert!(!compressible(&h, 100));
        h.insert(CONTENT_TYPE, HeaderValue::from_static("image/png"));
        assert!(!compressible(&h, 4096));
    }

    #[test]
    fn headers_are_rewritten() {
        let mut h = HeaderMap::new();
        h.insert(CONTENT_LENGTH, HeaderValue::from_static("5000"));
        h.insert(ETAG, HeaderValue::from_static("\"abc\""));
        gzip_headers(&mut h);
        assert!(h.get(CONTENT_LENGTH).is_none());
        assert_eq!(h[CONTENT_ENCODING], "gzip");
        assert_eq!(h[ETAG], "W/\"abc\"");
        assert_eq!(h[VARY], "Accept-Encoding");
    }
}
