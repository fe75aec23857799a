//! `Content-Type` of a served file, from its extension alone (never by sniffing its content).
//!
//! The table is `mime_guess`'s (case-insensitive extensions). Text types, and the script and
//! markup types browsers decode as text (`application/javascript`, `application/xml`,
//! `image/svg+xml`...), get `; charset=utf-8`, so a UTF-8 page is not decoded as Latin-1.
//! A file without a known extension is `application/octet-stream`: a browser downloads it rather
//! than guessing, and `X-Content-Type-Options: nosniff` (set by the caller) keeps it that way.

use std::path::Path;

/// The type for files whose extension is unknown or missing.
pub const OCTET_STREAM: &str = "application/octet-stream";

/// The `Content-Type` header value for a file at `path`.
pub fn content_type(path: &Path) -> String {
    match mime_guess::from_path(path).first_raw() {
        Some(t) if is_textual(t) => format!("{t}; charset=utf-8"),
        Some(t) => t.to_owned(),
        None => OCTET_STREAM.to_owned(),
    }
}

fn is_textual(t: &str) -> bool {
    t.starts_with("text/")
        || t.ends_with("+xml")
        || matches!(
            t,
            "application/javascript" | "application/ecmascript" | "application/xml"
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ct(name: &str) -> String {
        content_type(Path::new(name))
    }

    #[test]
    fn by_extension() {
        assert_eq!(ct("index.html"), "text/html; charset=utf-8");
        assert_eq!(ct("INDEX.HTM"), "text/html; charset=utf-8");
        assert_eq!(ct("a/b/style.css"), "text/css; charset=utf-8");
        assert_eq!(ct("notes.txt"), "text/plain; charset=utf-8");
        assert!(
            ct("app.js").ends_with("javascript; charset=utf-8"),
            "{}",
            ct("app.js")
        );
        assert!(
            ct("app.mjs").ends_with("javascript; charset=utf-8"),
            "{}",
            ct("app.mjs")
        );
        assert_eq!(ct("logo.svg"), "image/svg+xml; charset=utf-8");
        assert_eq!(ct("data.json"), "application/json");
        assert_eq!(ct("photo.JPG"), "image/jpeg");
        assert_eq!(ct("image.png"), "image/png");
        assert_eq!(ct("module.wasm"), "application/wasm");
        assert_eq!(ct("archive.tar.gz"), "application/gzip");
    }

    #[test]
    fn unknown_is_octet_stream() {
        assert_eq!(ct("README"), OCTET_STREAM);
        assert_eq!(ct("blob.zzqqxx"), OCTET_STREAM);
        assert_eq!(ct("trailing."), OCTET_STREAM);
    }
}
