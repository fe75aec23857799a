//! `--gzip`: compressing static responses for clients that accept it, on the CPU pool.
//!
//! A file of a compressible type (text, JavaScript, JSON, XML, SVG, wasm) of at least 1 KiB has
//! two representations, and `static_files::plan` picks one before it compares any validator: the
//! gzip one for a request that accepts gzip (`accepts_gzip`) and carries no `Range`, else the
//! identity one. The gzip one has no `Content-Length` (it streams, chunked), no `Accept-Ranges`,
//! `Content-Encoding: gzip` and a weak `ETag` (its bytes differ from the file's), and HEAD and
//! 304 answer with exactly those headers; every response of such a file, either representation,
//! carries `Vary: Accept-Encoding`, so no shared cache hands one client's choice to another.
//! Every 64 KiB chunk is compressed in its own CPU-pool job (`nodus::zlib::Compressor`), so a
//! large file never holds the loop or a pool thread for long.

use std::io;

use bytes::Bytes;
use futures_util::stream;
use http::header::{ACCEPT_ENCODING, ACCEPT_RANGES, CONTENT_ENCODING, CONTENT_LENGTH};
use http::{HeaderMap, HeaderValue};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use nodus::zlib::{Compressor, Format};
use nodus_http::Body;

const MIN_SIZE: u64 = 1024;
const LEVEL: u32 = 6;

/// Whether the request accepts gzip: `Accept-Encoding` lists `gzip` (or `x-gzip`) with a
/// non-zero `q`, or, when it does not name gzip at all, `*` with a non-zero `q` (RFC 9110 section
/// 12.5.3: `gzip;q=0, *` refuses gzip). Parameter names are case-insensitive (`Q=0`); a `q`
/// that does not parse counts as 0, so a garbled header never gets a compressed answer.
pub fn accepts_gzip(request: &HeaderMap) -> bool {
    let (mut gzip, mut any) = (None::<bool>, None::<bool>);
    let items = request
        .get_all(ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','));
    for item in items {
        let mut parts = item.split(';').map(str::trim);
        let coding = parts.next().unwrap_or("");
        let mut acceptable = true;
        for param in parts {
            if let Some((name, q)) = param.split_once('=')
                && name.trim().eq_ignore_ascii_case("q")
            {
                acceptable = q.trim().parse::<f32>().is_ok_and(|q| q > 0.0 && q <= 1.0);
            }
        }
        if coding.eq_ignore_ascii_case("gzip") || coding.eq_ignore_ascii_case("x-gzip") {
            gzip = Some(gzip.unwrap_or(false) || acceptable);
        } else if coding == "*" {
            any = Some(any.unwrap_or(false) || acceptable);
        }
    }
    gzip.or(any).unwrap_or(false)
}

/// Whether a file of this `Content-Type` and length is worth compressing.
pub fn compressible(content_type: &str, len: u64) -> bool {
    let ct = content_type.split(';').next().unwrap_or("").trim();
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

/// Turns the headers of the identity response into those of the gzip one: no `Content-Length`
/// (it streams) and no `Accept-Ranges` (a gzip stream has no byte ranges), `Content-Encoding`.
/// The caller gives it the weak `ETag` and `Vary: Accept-Encoding`.
pub fn gzip_headers(headers: &mut HeaderMap) {
    headers.remove(CONTENT_LENGTH);
    headers.remove(ACCEPT_RANGES);
    headers.insert(CONTENT_ENCODING, HeaderValue::from_static("gzip"));
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
        assert!(accepts_gzip(&req("GZIP")));
        assert!(accepts_gzip(&req("x-gzip")));
        assert!(accepts_gzip(&req("br, gzip;q=0.8")));
        assert!(accepts_gzip(&req("gzip;q=0.001")));
        assert!(accepts_gzip(&req("*")));
        assert!(accepts_gzip(&req("br;q=0, *;q=0.5")));
        assert!(!accepts_gzip(&req("gzip;q=0")));
        assert!(!accepts_gzip(&req("gzip; q=0.000")));
        assert!(!accepts_gzip(&req("gzip;Q=0")));
        assert!(!accepts_gzip(&req("gzip;q=0, *")));
        assert!(!accepts_gzip(&req("*, gzip;q=0")));
        assert!(!accepts_gzip(&req("*;q=0")));
        assert!(!accepts_gzip(&req("gzip;q=abc")));
        assert!(!accepts_gzip(&req("br, deflate")));
        assert!(!accepts_gzip(&req("identity")));
        assert!(!accepts_gzip(&HeaderMap::new()));
    }

    #[test]
    fn what_is_compressed() {
        assert!(compressible("text/html; charset=utf-8", 4096));
        assert!(compressible("image/svg+xml; charset=utf-8", 1024));
        assert!(!compressible("text/html; charset=utf-8", 100));
        assert!(!compressible("image/png", 4096));
    }

    #[test]
    fn headers_are_rewritten() {
        let mut h = HeaderMap::new();
        h.insert(CONTENT_LENGTH, HeaderValue::from_static("5000"));
        h.insert(ACCEPT_RANGES, HeaderValue::from_static("bytes"));
        gzip_headers(&mut h);
        assert!(h.get(CONTENT_LENGTH).is_none());
        assert!(h.get(ACCEPT_RANGES).is_none());
        assert_eq!(h[CONTENT_ENCODING], "gzip");
    }
}
