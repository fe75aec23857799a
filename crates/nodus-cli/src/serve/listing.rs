//! HTML directory listings for `nodus serve` (a directory without `index.html`).
//!
//! A listing shows exactly what a request could fetch: names that are not UTF-8 or hold a
//! backslash (the path decoder refuses both, `uri_path`), hidden names (`static_files::hidden`:
//! dotfiles unless allowed, but a top-level `.well-known`; a top-level `_nodus` when the admin
//! endpoints own `/_nodus/`), special files (FIFOs, devices, sockets) and symlinks that dangle,
//! leave the root, or land on a hidden name are left out, so a listing never discloses anything
//! outside the root nor links to a page that is not the file's. Names are HTML-escaped
//! (`<>&"'`) and hrefs are percent-encoded and prefixed with `./`, so no name can inject markup or
//! turn into a `javascript:` URL. Entries are sorted directories first, then by name (byte order),
//! and capped at `MAX_ENTRIES` (the first ones `readdir` returns, one `stat` each) so a directory
//! with a million files cannot make one response unbounded: the rest are only counted, by name
//! (a hidden or unusable name is not counted), and the page says how many were left out. An
//! entry that cannot be looked at is left out (gone meanwhile, not this process's to look at, or
//! broken: an I/O error, a dead network mount's `ENOTCONN`, `ESTALE`: one broken entry does not
//! take its directory's page down), unless the server itself is short (out of descriptors or
//! memory): that fails the whole listing (`static_files::Failure`, 503), so no page lacks an
//! entry for a passing trouble of the server's, nor is cached so.
//!
//! The directory read is the one `static_files::resolve` opened and checked (through its
//! descriptor: `nodus serve` holds it from the request's plan to the listing's build, in
//! `static_files::ListJob`), and a symlinked entry is judged by what it opens (`resolve` again),
//! so renaming things meanwhile cannot make a listing show the outside.
//!
//! Reading a directory is blocking I/O: like `static_files::plan_deferred`, run it on the I/O pool
//! (`nodus serve` builds at most one listing at a time per process and caches them:
//! `listing_cache`).

use std::fs;
use std::io;
use std::path::Path;
use std::time::SystemTime;

use super::static_files::{self, Resolved, StaticOptions, hidden, resolve};
use super::uri_path::encode_segment;

/// At most this many entries are listed; the rest are counted and mentioned.
pub const MAX_ENTRIES: usize = 10_000;

/// One listed name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    pub is_dir: bool,
    /// Length in bytes (0 for directories).
    pub size: u64,
    pub modified: Option<SystemTime>,
}

/// The servable entries of `dir` (as `static_files::resolve` found it, inside `root`), sorted,
/// and how many were left out because of the cap ([`MAX_ENTRIES`]). The directory read is the one
/// `dir` holds open, and each entry is looked at from there: whatever is renamed meanwhile, only
/// what lies under the root is listed.
///
/// # Errors
/// The directory cannot be read, or an entry could not be looked at for want of descriptors or
/// memory: the listing would lack it for the server's passing trouble.
pub fn read_entries(
    dir: &Resolved,
    root: &Path,
    opts: &StaticOptions,
) -> io::Result<(Vec<Entry>, usize)> {
    read_entries_capped(dir, root, opts, MAX_ENTRIES)
}

/// [`read_entries`] with at most `cap` entries.
fn read_entries_capped(
    dir: &Resolved,
    root: &Path,
    opts: &StaticOptions,
    cap: usize,
) -> io::Result<(Vec<Entry>, usize)> {
    let mut entries = Vec::new();
    let mut over_cap = 0usize;
    for dirent in fs::read_dir(dir.fd_path())? {
        let Some(dirent) = skip_gone(dirent)? else {
            continue;
        };
        let file_name = dirent.file_name();
        let Some(name) = file_name.to_str().filter(|n| !n.contains('\\')) else {
            continue;
        };
        if hidden(&dir.path.join(name), root, opts) {
            continue;
        }
        if entries.len() >= cap {
            over_cap += 1;
            continue;
        }
        let Some(ft) = skip_gone(dirent.file_type())? else {
            continue;
        };
        let meta = if ft.is_symlink() {
            // Follow it only if it lands inside the root, off hidden names.
            let target = match resolve(root, &dirent.path(), opts) {
                Ok(Some(target)) => target,
                Ok(None) => continue,
                Err(f) if static_files::shortage(&f.error) => return Err(f.error),
                Err(_) => continue,
            };
            target.meta
        } else {
            let Some(meta) = skip_gone(dirent.metadata())? else {
                continue;
            };
            meta
        };
        if !meta.is_file() && !meta.is_dir() {
            continue;
        }
        entries.push(Entry {
            name: name.to_owned(),
            is_dir: meta.is_dir(),
            size: if meta.is_dir() { 0 } else { meta.len() },
            modified: meta.modified().ok(),
        });
    }
    entries.sort_by(|a, b| b.is_dir.cmp(&a.is_dir).then_with(|| a.name.cmp(&b.name)));
    Ok((entries, over_cap))
}

/// An entry's read or stat: an entry that cannot be looked at is left out (`None`), unless the
/// server is short of descriptors or memory: that fails the whole listing, which is never
/// answered with entries missing for a passing trouble of the server's.
fn skip_gone<T>(read: io::Result<T>) -> io::Result<Option<T>> {
    match read {
        Ok(t) => Ok(Some(t)),
        Err(e) if static_files::shortage(&e) => Err(e),
        Err(_) => Ok(None),
    }
}

/// Escapes the five HTML-significant characters.
pub fn escape_html(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Renders the listing page. `display_path` is the decoded request path (`/a b/`), shown escaped;
/// a `../` link is added unless `at_root`.
pub fn render(display_path: &str, at_root: bool, entries: &[Entry], over_cap: usize) -> String {
    let title = escape_html(&format!("Index of {display_path}"));
    let mut html = String::with_capacity(1024 + entries.len() * 160);
    html.push_str(concat!(
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n",
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
    ));
    html.push_str(&format!("<title>{title}</title>\n"));
    html.push_str(concat!(
        "<style>\n",
        "body{font:14px/1.5 system-ui,sans-serif;color:#1d2330;background:#fff;margin:2em auto;",
        "max-width:60em;padding:0 1em}\n",
        "h1{font-size:1.3em;font-weight:600;word-break:break-all}\n",
        "table{border-collapse:collapse;width:100%}\n",
        "th,td{text-align:left;padding:.25em .75em;border-bottom:1px solid #e6e8ee}\n",
        "th{font-weight:600;color:#5b6476}\n",
        "td.size,th.size{text-align:right;font-variant-numeric:tabular-nums}\n",
        "td.name{word-break:break-all}\n",
        "a{color:#1f5fbf;text-decoration:none}a:hover{text-decoration:underline}\n",
        "tr.dir a{font-weight:600}\n",
        "footer{color:#8a92a3;font-size:.85em;margin-top:1em}\n",
        "</style>\n</head>\n<body>\n"
    ));
    html.push_str(&format!("<h1>{title}</h1>\n"));
    html.push_str(concat!(
        "<table id=\"listing\">\n<thead><tr><th>Name</th><th class=\"size\">Size</th>",
        "<th>Last modified</th></tr></thead>\n<tbody>\n"
    ));
    if !at_root {
        html.push_str(concat!(
            "<tr class=\"dir parent\"><td class=\"name\"><a href=\"../\">../</a></td>",
            "<td class=\"size\"></td><td></td></tr>\n"
        ));
    }
    for e in entries {
        let slash = if e.is_dir { "/" } else { "" };
        let href = encode_segment(e.name.as_bytes());
        let name = escape_html(&e.name);
        let size = if e.is_dir {
            "-".to_owned()
        } else {
            human_size(e.size)
        };
        let modified = e.modified.and_then(http_date).unwrap_or_default();
        let class = if e.is_dir { "dir" } else { "file" };
        html.push_str(&format!(
            "<tr class=\"{class}\"><td class=\"name\"><a href=\"./{href}{slash}\">{name}{slash}</a></td>\
             <td class=\"size\">{size}</td><td>{modified}</td></tr>\n"
        ));
    }
    html.push_str("</tbody>\n</table>\n");
    if over_cap > 0 {
        html.push_str(&format!(
            "<p class=\"truncated\">{over_cap} more entries not shown.</p>\n"
        ));
    }
    html.push_str("<footer>nodus serve</footer>\n</body>\n</html>\n");
    html
}

/// An HTTP-date, when the time can be written as one.
fn http_date(t: SystemTime) -> Option<String> {
    let secs = t.duration_since(SystemTime::UNIX_EPOCH).ok()?.as_secs();
    (secs <= 253_402_300_799).then(|| httpdate::fmt_http_date(t))
}

/// `999 B`, `1.5 KiB`, `12 MiB`...
pub fn human_size(n: u64) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if v < 10.0 {
        format!("{v:.1} {}", UNITS[unit])
    } else {
        format!("{v:.0} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One broken entry (a dead network mount's `ENOTCONN`, `ESTALE`, `EIO`) is left out; only a
    /// shortage of the server's (descriptors, memory) fails the listing.
    #[test]
    fn a_broken_entry_is_left_out_and_only_a_shortage_fails_the_listing() {
        let err = |errno| Err::<(), _>(io::Error::from_raw_os_error(errno));
        for errno in [
            libc::ENOENT,
            libc::EACCES,
            libc::ENOTCONN,
            libc::ESTALE,
            libc::EIO,
        ] {
            assert!(matches!(skip_gone(err(errno)), Ok(None)), "errno {errno}");
        }
        for errno in [libc::EMFILE, libc::ENFILE, libc::ENOMEM] {
            assert!(skip_gone(err(errno)).is_err(), "errno {errno}");
        }
        assert!(matches!(skip_gone(Ok(())), Ok(Some(()))));
    }

    #[test]
    fn escapes_all_five() {
        assert_eq!(
            escape_html(r#"<a href="x">&'</a>"#),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;&lt;/a&gt;"
        );
        assert_eq!(escape_html("plain é"), "plain é");
    }

    #[test]
    fn sizes() {
        assert_eq!(human_size(0), "0 B");
        assert_eq!(human_size(1023), "1023 B");
        assert_eq!(human_size(1536), "1.5 KiB");
        assert_eq!(human_size(20 << 20), "20 MiB");
        assert_eq!(human_size(1 << 40), "1.0 TiB");
        assert_eq!(human_size(u64::MAX), "16 EiB");
    }

    #[test]
    fn entries_are_capped_and_the_rest_counted() {
        let dir = std::env::temp_dir().join(format!("nodus-listing-cap-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir(&dir).unwrap();
        for name in ["a", "b", "c", "d", "e", ".hidden"] {
            fs::write(dir.join(name), name).unwrap();
        }
        let root = fs::canonicalize(&dir).unwrap();
        let opts = StaticOptions::default();
        let found = resolve(&root, &root, &opts).unwrap().unwrap();
        let (entries, over_cap) = read_entries_capped(&found, &root, &opts, 2).unwrap();
        // Two listed (sorted), three more counted; the hidden name is neither.
        assert_eq!(entries.len(), 2);
        assert!(entries.windows(2).all(|w| w[0].name < w[1].name));
        assert_eq!(over_cap, 3);
        let html = render("/", true, &entries, over_cap);
        assert!(html.contains("3 more entries not shown."));
        let (all, none) = read_entries(&found, &root, &opts).unwrap();
        assert_eq!((all.len(), none), (5, 0));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn render_escapes_and_encodes() {
        let entries = [
            Entry {
                name: "d<i>r".into(),
                is_dir: true,
                size: 0,
                modified: None,
            },
            Entry {
                name: "a&b \"c\" 'd'.txt".into(),
                is_dir: false,
                size: 5,
                modified: Some(SystemTime::UNIX_EPOCH),
            },
            Entry {
                name: "javascript:alert(1)".into(),
                is_dir: false,
                size: 1,
                modified: None,
            },
        ];
        let html = render("/x<y>/", false, &entries, 3);
        assert!(html.contains("<title>Index of /x&lt;y&gt;/</title>"));
        assert!(html.contains(r#"<a href="../">../</a>"#));
        assert!(html.contains(r#"<a href="./d%3Ci%3Er/">d&lt;i&gt;r/</a>"#));
        assert!(html.contains(
            r#"<a href="./a%26b%20%22c%22%20%27d%27.txt">a&amp;b &quot;c&quot; &#39;d&#39;.txt</a>"#
        ));
        assert!(html.contains(r#"href="./javascript%3Aalert%281%29""#));
        assert!(html.contains("Thu, 01 Jan 1970 00:00:00 GMT"));
        assert!(html.contains("3 more entries not shown."));
        assert!(!render("/", true, &[], 0).contains("../"));
    }
}
