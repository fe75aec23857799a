//! What `nodus serve` answers to a request for a static file: a decision, made before any byte of
//! content is read.
//!
//! `plan` looks at the method, the URI path and the request headers, opens what the path names
//! (`resolve`), opens a regular file for reading (`open_verified`), and returns a `Plan`: refuse
//! (400/403/404/405/412/501), 304, 301 to the slash form of a directory (query kept), 416, an
//! HTML listing, a file, open, with its status (200/206), byte range and every response header,
//! or a failure of the server's own (503/500: `Failure`).
//! The HTTP glue then only has to stream `range` from that file (from the I/O pool), or send the
//! in-memory body of the other variants. Keeping the decision free of any HTTP framework makes
//! every rule testable with a temp directory and no sockets.
//!
//! Invariants:
//! - Nothing outside the root is served, listed or disclosed. The path decoder (`uri_path`)
//!   refuses `..`, encoded separators, NUL and empty segments with 400; then `resolve` opens the
//!   joined path (`O_PATH`, following symlinks) and reads the real path of what it opened back
//!   from the descriptor (`/proc/self/fd/N`): it must lie under the (canonical) root, so a symlink
//!   that leaves the root gets the same 404 as a name that does not exist, whether or not its
//!   target exists. Everything after that (its metadata, the file read, the directory listed, the
//!   `index.html` looked up in it) goes through that descriptor, never through a path looked up
//!   again: a local writer who swaps a directory for a symlink while a request is planned
//!   (`renameat2(RENAME_EXCHANGE)`) gets the inside file, a 404, or the outside refused, never the
//!   outside served. Symlinks inside the root are followed as the kernel follows them, relative or
//!   absolute, through the outside and back; only where they land counts. The root's own path
//!   (and its ancestors) are trusted: whoever can rename them chooses what is served anyway.
//!   `canonical_root` refuses to start where `/proc` cannot tell a descriptor's path.
//! - Hidden names (`hidden`) are 404, both as requested and on the real path of what was opened
//!   (a `link -> .env` is hidden too), and left out of listings: dotfiles and dot-directories
//!   (`.git/config`, `.env`) unless `Dotfiles::Allow`, except a top-level `.well-known`
//!   (RFC 8615: ACME HTTP-01 challenges, `security.txt`; a dot-name inside it is still hidden);
//!   and a top-level `_nodus` when the admin endpoints own `/_nodus/` on this listener
//!   (`StaticOptions::admin_dir_hidden`).
//! - Only regular files and directories are served. A FIFO, device or socket is 403 after a mere
//!   `fstat` of its `O_PATH` descriptor (seed 003's `nodus serve /dev` + `GET /random` attack): it
//!   is never opened for reading, and `open_verified` opens only the very regular file `resolve`
//!   checked (through its descriptor).
//! - A regular file is opened before any precondition or range is evaluated: one this process
//!   cannot open is 403 whatever the request's headers, so no 304 or 416 discloses the `ETag`
//!   (size, mtime) or length of a file GET would refuse. The validators come from the open file's
//!   `fstat`, so they describe the very file that is streamed.
//! - No content is read here: validators come from metadata (see `conditional`), so empty and huge
//!   sparse files cost the same.
//! - HEAD gets exactly the headers GET would get, `Range` and `--gzip` included (the caller omits
//!   the body). With `--gzip`, the representation (gzip or identity, see `gzip`) is chosen before
//!   preconditions are evaluated, so a 304 carries the `ETag` and `Vary` of the 200 it stands for.
//!
//! - Methods (RFC 9110 section 9.1): GET and HEAD are served; another method HTTP defines
//!   (`known_method`) is 405 with `Allow: GET, HEAD`; any other is 501, a method this server
//!   does not implement at all.
//!
//! - A 404 or 403 says what the request names, never the server's state: only an errno that says
//!   the name is missing (`ENOENT`, `ENOTDIR`, `ENAMETOOLONG`, `ELOOP`) is 404, only one that
//!   says this process may not (`EACCES`, `EPERM`) is 403 (404 while a name is being looked up,
//!   where it lands cannot be checked). Anything else, out of descriptors or memory above all
//!   (`EMFILE`, `ENFILE`, `ENOMEM`: 503 with `Retry-After`) or an I/O error (500), is a
//!   `Failure` at every step: the lookup, `index.html`'s, the open for reading, the listing's
//!   read and each entry's look. Its answer is never cached (`Cache-Control: no-store`), and the
//!   caller logs it (`app`).
//!
//! - A directory without `index.html` is listed (`listing`), or 404 as a missing name with
//!   `StaticOptions::no_listings` (`--listings off`); one whose `index.html` could not be looked
//!   up (a `Failure`) is that failure, never its listing. `plan_deferred` makes the same decision but
//!   leaves the listing to its caller (`Planned::List`: a `ListJob` holding the directory's
//!   descriptor, the very one checked, which the build reads, and the `dev`/`ino` and
//!   `mtime`/`ctime` of its `fstat`, for `listing_cache`); `plan` (for tests) builds it.
//!
//! `plan_deferred` makes blocking system calls (open, readlink, fstat), and so does
//! `ListJob::build` (readdir, stat): run them on the I/O pool.

use std::fs::{self, Metadata, OpenOptions};
use std::io;
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};
use std::time::SystemTime;

use http::header::{
    ACCEPT_RANGES, ALLOW, CACHE_CONTROL, CONTENT_LENGTH, CONTENT_RANGE, CONTENT_SECURITY_POLICY,
    CONTENT_TYPE, ETAG, LAST_MODIFIED, LOCATION, RANGE, RETRY_AFTER, VARY, X_CONTENT_TYPE_OPTIONS,
};
use http::{HeaderMap, HeaderValue, Method, StatusCode};

use super::conditional::{self, Precondition, Validators};
use super::gzip;
use super::listing;
use super::mime;
use super::range::{self, RangeOutcome};
use super::uri_path::{self, DecodedPath};

/// Whether names starting with `.` may be served and listed (`Deny`: all but a top-level
/// `.well-known`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Dotfiles {
    Allow,
    #[default]
    Deny,
}

/// Options of the static handler.
#[derive(Debug, Clone, Default)]
pub struct StaticOptions {
    pub dotfiles: Dotfiles,
    /// `--gzip`: compressible files also have a gzip representation (see `gzip`).
    pub gzip: bool,
    /// A top-level `_nodus` is hidden: the admin endpoints answer `/_nodus/` on this listener.
    pub admin_dir_hidden: bool,
    /// `--listings off`: a directory without `index.html` is 404, as a missing name.
    pub no_listings: bool,
}

/// A file or directory under the root, as `resolve` found it: held open with `O_PATH` (no read
/// permission needed, and opening a FIFO or device this way neither blocks nor reaches its
/// driver), with the real path read back from that descriptor and its `fstat`. What is served is
/// decided from it, never from a path looked up again.
#[derive(Debug)]
pub struct Resolved {
    fd: fs::File,
    /// The real path: canonical, under the root, not hidden.
    pub path: PathBuf,
    pub meta: Metadata,
}

impl Resolved {
    /// A path that names this very file or directory while `self` lives (`/proc/self/fd/N`):
    /// opening it, or a name below it, starts from the descriptor, whatever was renamed since.
    pub fn fd_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))
    }
}

/// The answer to one request. Every variant carries its complete response headers (including
/// `Content-Length` where there is a body); `Plan::inline_body` is the body of all but `File`.
#[derive(Debug)]
pub enum Plan {
    /// 400/403/404/405/412/501 with a short plain-text reason (never a path).
    Refuse {
        status: StatusCode,
        reason: &'static str,
        headers: HeaderMap,
    },
    /// 304 with `ETag` and `Last-Modified`, no body.
    NotModified { headers: HeaderMap },
    /// 301 to the slash form of a directory (`Location` in `headers`), empty body.
    Redirect { headers: HeaderMap },
    /// 200 or 206: stream `range` of `file` (open, read-only, inside the root), gzipped if
    /// `gzip` (then `headers` are already those of the gzip response, and `range` is whole).
    File {
        file: fs::File,
        status: StatusCode,
        range: Range<u64>,
        headers: HeaderMap,
        gzip: bool,
    },
    /// 416 with `Content-Range: bytes */len`, empty body.
    RangeNotSatisfiable { headers: HeaderMap },
    /// 200 with an HTML directory listing.
    Listing { html: String, headers: HeaderMap },
    /// 503 or 500: a file system call failed for the server's own reason ([`Failure`]), said in
    /// the log (by the caller), never to the client.
    Failed {
        failure: Failure,
        headers: HeaderMap,
    },
}

/// A file system call that failed for another reason than the name asked for: not a missing or
/// hidden name, nothing outside the root, no permission refused (those are 404 and 403), but the
/// server's own trouble (out of descriptors or memory, an I/O error). Answered 503 or 500
/// ([`Failure::status`]), which no cache keeps as it keeps a 404, and never a listing in place of
/// an `index.html` it could not open. Errno → answer, as nginx's: `ENOENT`, `ENOTDIR`,
/// `ENAMETOOLONG` and `ELOOP` are a missing name (404); `EACCES` and `EPERM` are 403 for a file
/// or directory `resolve` found (its real path checked) and 404 while looking one up (where it
/// lands cannot be checked then); anything else is a `Failure`.
#[derive(Debug)]
pub struct Failure {
    /// What failed, for the log (`open`, `list the directory`...).
    pub op: &'static str,
    pub error: io::Error,
}

/// `Retry-After` of a 503 (seconds): the keep-alive timeout of an idle connection, which is what
/// holds the descriptors most often when they run out.
pub const RETRY_AFTER_SECS: u32 = 5;

impl Failure {
    /// 503 with `Retry-After` for a shortage that passes (`EMFILE`, `ENFILE`: out of
    /// descriptors, the process's or the system's; `ENOMEM`; an I/O pool that cannot start its
    /// threads), 500 for anything else (`EIO`...).
    pub fn status(&self) -> StatusCode {
        if shortage(&self.error) {
            StatusCode::SERVICE_UNAVAILABLE
        } else {
            StatusCode::INTERNAL_SERVER_ERROR
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cannot {}: {}", self.op, self.error)
    }
}

impl Plan {
    pub fn status(&self) -> StatusCode {
        match self {
            Plan::Refuse { status, .. } | Plan::File { status, .. } => *status,
            Plan::Failed { failure, .. } => failure.status(),
            Plan::NotModified { .. } => StatusCode::NOT_MODIFIED,
            Plan::Redirect { .. } => StatusCode::MOVED_PERMANENTLY,
            Plan::RangeNotSatisfiable { .. } => StatusCode::RANGE_NOT_SATISFIABLE,
            Plan::Listing { .. } => StatusCode::OK,
        }
    }

    pub fn headers(&self) -> &HeaderMap {
        match self {
            Plan::Refuse { headers, .. }
            | Plan::NotModified { headers }
            | Plan::Redirect { headers, .. }
            | Plan::File { headers, .. }
            | Plan::RangeNotSatisfiable { headers }
            | Plan::Listing { headers, .. }
            | Plan::Failed { headers, .. } => headers,
        }
    }

    /// The body of every variant but `File` (which is streamed from disk): `None` for `File`.
    pub fn inline_body(&self) -> Option<String> {
        match self {
            Plan::Refuse { reason, .. } => Some(format!("{reason}\n")),
            Plan::Listing { html, .. } => Some(html.clone()),
            Plan::Failed { failure, .. } => Some(failed_body(failure.status()).to_owned()),
            Plan::NotModified { .. } | Plan::Redirect { .. } | Plan::RangeNotSatisfiable { .. } => {
                Some(String::new())
            }
            Plan::File { .. } => None,
        }
    }
}

/// Canonicalizes the directory to serve (what `plan` expects as its root), and checks that
/// `resolve` can read its real path back from `/proc/self/fd` (else nothing could be served).
pub fn canonical_root(dir: &Path) -> io::Result<PathBuf> {
    let root = fs::canonicalize(dir)?;
    if !fs::metadata(&root)?.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::NotADirectory,
            format!("{} is not a directory", nodus::fs::quote(dir)),
        ));
    }
    if resolve(&root, &root, &StaticOptions::default())
        .map_err(|failure| failure.error)?
        .is_none_or(|r| r.path != root)
    {
        return Err(io::Error::other(
            "/proc/self/fd does not tell the real path of an open file (is /proc mounted?): \
             nodus serve checks there that what it opens lies under the root",
        ));
    }
    Ok(root)
}

/// Decides the answer to `method uri_path` under `root_canonical` (see `canonical_root`).
/// `uri_path` may carry the request's query (`/dir?x=1`): it is ignored, but kept in the
/// redirect of a directory to its slash form (`/dir/?x=1`), as nginx and `serve-static` do.
/// The listing of a directory is built here: the whole answer, what the tests look at (`nodus
/// serve` calls `plan_deferred`, and caches listings).
#[cfg(test)]
pub fn plan(
    root_canonical: &Path,
    method: &Method,
    uri_path: &str,
    headers: &HeaderMap,
    opts: &StaticOptions,
) -> Plan {
    plan_at(
        root_canonical,
        method,
        uri_path,
        headers,
        opts,
        SystemTime::now(),
    )
}

/// `plan` with the response time given (it decides whether a `Last-Modified` is strong enough
/// for `If-Range`, and whether an `If-Modified-Since` is in the future, so ignored).
#[cfg(test)]
pub fn plan_at(
    root: &Path,
    method: &Method,
    uri_path: &str,
    headers: &HeaderMap,
    opts: &StaticOptions,
    now: SystemTime,
) -> Plan {
    match plan_deferred_at(root, method, uri_path, headers, opts, now) {
        Planned::Done(plan) => plan,
        Planned::List(job) => job.build(),
    }
}

/// `plan`'s decision, but a listing is left to the caller, who may have it cached
/// (`listing_cache`): `Planned::List` carries what identifies and validates it.
pub fn plan_deferred(
    root: &Path,
    method: &Method,
    uri_path: &str,
    headers: &HeaderMap,
    opts: &StaticOptions,
) -> Planned {
    plan_deferred_at(root, method, uri_path, headers, opts, SystemTime::now())
}

/// What `plan_deferred` decided.
#[derive(Debug)]
pub enum Planned {
    /// The whole answer.
    Done(Plan),
    /// A listing of this directory is the answer: `ListJob::build` it (blocking I/O). Boxed: it
    /// holds the directory's `fstat`, and most answers are `Done`.
    List(Box<ListJob>),
}

/// A directory to list, opened and checked (`resolve`) when the request was planned.
#[derive(Debug)]
pub struct ListJob {
    /// Root and options: what `build` judges entries by.
    root: PathBuf,
    opts: StaticOptions,
    /// The directory, held open: `build` reads it through this descriptor, never by path again.
    dir: Resolved,
    /// The identity of the page: the request's decoded path (its title; `/` has no `../`), the
    /// directory's real path and its `dev`/`ino` (from the descriptor's `fstat`).
    pub key: ListingKey,
    /// The directory's `mtime` and `ctime` (seconds, nanoseconds) at that `fstat`, before `build`
    /// reads it: a cached page built from a stat with other times is stale.
    pub changed: [(i64, i64); 2],
}

/// What a listing page is a listing of, and under which name it was asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListingKey {
    pub display: String,
    pub dir: PathBuf,
    pub id: FileId,
}

/// Which directory (its `fstat`'s device and inode): a path renamed onto another directory
/// keys another page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileId {
    pub dev: u64,
    pub ino: u64,
}

impl ListJob {
    /// Reads the directory (through the descriptor `plan_deferred` opened) and renders its page
    /// (blocking: run it on the I/O pool).
    pub fn build(self) -> Plan {
        listing_plan(&self.root, &self.dir, &self.key.display, &self.opts)
    }
}

fn plan_deferred_at(
    root: &Path,
    method: &Method,
    uri_path: &str,
    headers: &HeaderMap,
    opts: &StaticOptions,
    now: SystemTime,
) -> Planned {
    let done = Planned::Done;
    if method != Method::GET && method != Method::HEAD {
        if !known_method(method) {
            return done(refuse(
                StatusCode::NOT_IMPLEMENTED,
                "method not implemented",
            ));
        }
        let mut plan = refuse(StatusCode::METHOD_NOT_ALLOWED, "method not allowed");
        if let Plan::Refuse { headers, .. } = &mut plan {
            headers.insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        }
        return done(plan);
    }
    let decoded = match uri_path::decode(uri_path) {
        Ok(d) => d,
        Err(bad) => return done(refuse(StatusCode::BAD_REQUEST, bad.reason())),
    };
    if hidden_names(decoded.segments.iter().map(|s| s.as_bytes()), opts) {
        return done(not_found());
    }
    let mut joined = root.to_path_buf();
    joined.extend(&decoded.segments);
    let found = match resolve(root, &joined, opts) {
        Ok(Some(found)) => found,
        Ok(None) => return done(not_found()),
        Err(failure) => return done(failed(failure)),
    };
    if found.meta.is_dir() {
        if !decoded.trailing_slash {
            return done(redirect(
                decoded.encoded(true),
                uri_path.split_once('?').map(|(_, q)| q),
            ));
        }
        // In the very directory resolved, not in whatever its path names now. Listed only
        // when there is no `index.html` to serve, never when looking for one failed.
        match resolve(root, &found.fd_path().join("index.html"), opts) {
            Ok(Some(index)) if index.meta.is_file() => {
                let name = Path::new("index.html");
                return done(file_plan(&index, name, method, headers, opts, now));
            }
            Ok(_) => {}
            Err(failure) => return done(failed(failure)),
        }
        if opts.no_listings {
            return done(not_found());
        }
        return Planned::List(Box::new(list_job(root, found, &decoded, opts)));
    }
    if !found.meta.is_file() {
        return done(refuse(
            StatusCode::FORBIDDEN,
            "forbidden: not a regular file",
        ));
    }
    if decoded.trailing_slash {
        return done(not_found());
    }
    // The type follows the requested name (as a client sees it), not a symlink's target.
    let name = Path::new(decoded.segments.last().map_or("", String::as_str));
    done(file_plan(&found, name, method, headers, opts, now))
}

/// Whether HTTP defines `method`: RFC 9110's eight and RFC 5789's PATCH. A server that does not
/// allow one of these for a resource answers 405; one it does not know at all (`FOO`,
/// WebDAV's `PROPFIND`) is a method it does not implement: 501 (RFC 9110 section 9.1).
pub fn known_method(method: &Method) -> bool {
    [
        Method::GET,
        Method::HEAD,
        Method::POST,
        Method::PUT,
        Method::DELETE,
        Method::CONNECT,
        Method::OPTIONS,
        Method::TRACE,
        Method::PATCH,
    ]
    .contains(method)
}

/// Opens `path` as the kernel resolves it (symlinks followed) with `O_PATH`, reads the real path
/// of what it opened back from the descriptor, and `fstat`s it; `None` if it does not exist,
/// lies outside `root`, or is hidden. The check is on the opened file or directory itself, so a
/// component of `path` swapped for a symlink meanwhile cannot make it pass for something else.
///
/// # Errors
/// A [`Failure`] when a call failed for another reason than the name (out of descriptors, say):
/// never taken for a missing name. A lookup refused (`EACCES`, `EPERM`: a directory on the way
/// that this process may not search, maybe outside the root through a symlink) is `None`, as a
/// name outside the root is, since where it leads cannot be checked.
pub fn resolve(
    root: &Path,
    path: &Path,
    opts: &StaticOptions,
) -> Result<Option<Resolved>, Failure> {
    let opened = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH)
        .open(path);
    let fd = match opened {
        Ok(fd) => fd,
        Err(e) if missing(&e) || denied(&e) => return Ok(None),
        Err(error) => return Err(Failure { op: "open", error }),
    };
    let real =
        fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).map_err(|error| Failure {
            op: "read the real path of what was opened",
            error,
        })?;
    if hidden(&real, root, opts) {
        return Ok(None);
    }
    let meta = fd
        .metadata()
        .map_err(|error| Failure { op: "stat", error })?;
    Ok(Some(Resolved {
        fd,
        path: real,
        meta,
    }))
}

/// An error that says the name is not there: 404 (see [`Failure`]).
pub fn missing(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOENT | libc::ENOTDIR | libc::ENAMETOOLONG | libc::ELOOP)
    )
}

/// An error that says the process is short of descriptors, memory or threads for now: 503 (see
/// [`Failure`]). Threads: the I/O pool could not start its own (`OffloadError::NoThreads`).
pub fn shortage(e: &io::Error) -> bool {
    let no_threads = || {
        e.get_ref()
            .and_then(|inner| inner.downcast_ref::<nodus::OffloadError>())
            .is_some_and(|inner| matches!(inner, nodus::OffloadError::NoThreads { .. }))
    };
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOMEM)
    ) || no_threads()
}

/// An error that says this process may not: 403 for what was resolved (see [`Failure`]).
pub fn denied(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM))
}

/// The answer to `error` from `op` on a file or directory `resolve` found: 403 with `forbidden`,
/// 404, or the [`Failure`]'s 503 or 500.
fn refused_for(error: io::Error, op: &'static str, forbidden: &'static str) -> Plan {
    if denied(&error) {
        refuse(StatusCode::FORBIDDEN, forbidden)
    } else if missing(&error) {
        not_found()
    } else {
        failed(Failure { op, error })
    }
}

/// Whether `path` (a real path) is hidden from requests and listings: true if it is not under
/// `root`, or if its components below the root name something hidden (see `hidden_names`).
pub fn hidden(path: &Path, root: &Path, opts: &StaticOptions) -> bool {
    let Ok(rel) = path.strip_prefix(root) else {
        return true;
    };
    let mut names = Vec::new();
    for c in rel.components() {
        match c {
            Component::Normal(name) => names.push(name.as_encoded_bytes()),
            _ => return true,
        }
    }
    hidden_names(names.into_iter(), opts)
}

/// Whether a path below the root, given as its names from the top, is hidden: a name starting
/// with `.` (unless `Dotfiles::Allow`) other than a top-level `.well-known`, or a top-level
/// `_nodus` when `admin_dir_hidden`.
fn hidden_names<'a>(names: impl Iterator<Item = &'a [u8]>, opts: &StaticOptions) -> bool {
    let allow_dot = opts.dotfiles == Dotfiles::Allow;
    names.enumerate().any(|(depth, name)| {
        (!allow_dot && name.starts_with(b".") && !(depth == 0 && name == b".well-known"))
            || (opts.admin_dir_hidden && depth == 0 && name == b"_nodus")
    })
}

/// Opens the regular file `found` and plans its response; `name` decides the `Content-Type`.
fn file_plan(
    found: &Resolved,
    name: &Path,
    method: &Method,
    req: &HeaderMap,
    opts: &StaticOptions,
    now: SystemTime,
) -> Plan {
    // Before any precondition or range: a 304 or 416 must not describe a file GET would refuse.
    let (file, meta) = match open_verified(found) {
        Ok(opened) => opened,
        Err(e) => return refused_for(e, "open for reading", "forbidden: not readable"),
    };
    let len = meta.len();
    let content_type = mime::content_type(name);
    // Which representation, chosen before any validator is compared: with `--gzip`, a
    // compressible file is gzipped for a client that accepts it and asks for no range.
    let varies = opts.gzip && gzip::compressible(&content_type, len);
    let gzipped = varies && !req.contains_key(RANGE) && gzip::accepts_gzip(req);
    let mut validators = Validators::from_metadata(&meta, now);
    validators.weak = gzipped;
    let mut headers = HeaderMap::new();
    headers.insert(ETAG, value(validators.etag_header()));
    if let Some(lm) = validators.last_modified_header() {
        headers.insert(LAST_MODIFIED, value(lm));
    }
    if varies {
        headers.insert(VARY, HeaderValue::from_static("Accept-Encoding"));
    }
    match conditional::preconditions(method, req, &validators, now) {
        Precondition::Proceed => {}
        Precondition::NotModified => return Plan::NotModified { headers },
        Precondition::Failed => {
            return refuse(StatusCode::PRECONDITION_FAILED, "precondition failed");
        }
    }
    if gzipped {
        headers.insert(CONTENT_TYPE, value(content_type));
        headers.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
        gzip::gzip_headers(&mut headers);
        return Plan::File {
            file,
            status: StatusCode::OK,
            range: 0..len,
            headers,
            gzip: true,
        };
    }
    headers.insert(ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    let mut ranges = req.get_all(RANGE).iter();
    let outcome = match (ranges.next(), ranges.next()) {
        (Some(r), None) if conditional::if_range_allows(req, &validators, now) => r
            .to_str()
            .map_or(RangeOutcome::Full, |r| range::evaluate(r, len)),
        _ => RangeOutcome::Full,
    };
    let (status, range) = match outcome {
        RangeOutcome::Full => (StatusCode::OK, 0..len),
        RangeOutcome::Partial(r) => {
            headers.insert(CONTENT_RANGE, value(range::content_range(&r, len)));
            (StatusCode::PARTIAL_CONTENT, r)
        }
        RangeOutcome::Unsatisfiable => {
            headers.insert(CONTENT_RANGE, value(range::unsatisfied_range(len)));
            headers.insert(CONTENT_LENGTH, HeaderValue::from(0u64));
            return Plan::RangeNotSatisfiable { headers };
        }
    };
    headers.insert(CONTENT_TYPE, value(content_type));
    headers.insert(CONTENT_LENGTH, HeaderValue::from(range.end - range.start));
    headers.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    Plan::File {
        file,
        status,
        range,
        headers,
        gzip: false,
    }
}

fn list_job(root: &Path, dir: Resolved, decoded: &DecodedPath, opts: &StaticOptions) -> ListJob {
    let meta = &dir.meta;
    ListJob {
        root: root.to_path_buf(),
        opts: opts.clone(),
        key: ListingKey {
            display: decoded.display(),
            dir: dir.path.clone(),
            id: FileId {
                dev: meta.dev(),
                ino: meta.ino(),
            },
        },
        changed: [
            (meta.mtime(), meta.mtime_nsec()),
            (meta.ctime(), meta.ctime_nsec()),
        ],
        dir,
    }
}

/// The listing of `dir` asked for as `display` (the decoded request path: `/` is the root).
fn listing_plan(root: &Path, dir: &Resolved, display: &str, opts: &StaticOptions) -> Plan {
    let (entries, over_cap) = match listing::read_entries(dir, root, opts) {
        Ok(read) => read,
        Err(e) => return refused_for(e, "list the directory", "forbidden: directory not readable"),
    };
    let html = listing::render(display, display == "/", &entries, over_cap);
    let mut headers = HeaderMap::new();
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    headers.insert(CONTENT_LENGTH, HeaderValue::from(html.len()));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(
        CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("default-src 'none'; style-src 'unsafe-inline'"),
    );
    Plan::Listing { html, headers }
}

/// The headers of a short plain-text answer of `len` bytes.
fn text_headers(len: usize) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    headers.insert(CONTENT_LENGTH, HeaderValue::from(len));
    headers.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers
}

fn refuse(status: StatusCode, reason: &'static str) -> Plan {
    let headers = text_headers(reason.len() + 1);
    Plan::Refuse {
        status,
        reason,
        headers,
    }
}

fn not_found() -> Plan {
    refuse(StatusCode::NOT_FOUND, "not found")
}

/// The answer to a [`Failure`]: 503 with `Retry-After` or 500, a short reason (never the error:
/// that is for the log), `Cache-Control: no-store`.
pub fn failed(failure: Failure) -> Plan {
    let status = failure.status();
    let mut headers = text_headers(failed_body(status).len());
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if status == StatusCode::SERVICE_UNAVAILABLE {
        headers.insert(RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
    }
    Plan::Failed { failure, headers }
}

fn failed_body(status: StatusCode) -> &'static str {
    if status == StatusCode::SERVICE_UNAVAILABLE {
        "service unavailable: out of resources, try again later\n"
    } else {
        "internal error\n"
    }
}

/// A 301 to `path` (canonically encoded) with `query` (as the request sent it, which `http`
/// already checked is visible ASCII) appended.
fn redirect(path: String, query: Option<&str>) -> Plan {
    let mut headers = HeaderMap::new();
    let with_query = query
        .filter(|q| !q.is_empty())
        .and_then(|q| HeaderValue::try_from(format!("{path}?{q}")).ok());
    headers.insert(LOCATION, with_query.unwrap_or_else(|| value(path)));
    headers.insert(CONTENT_LENGTH, HeaderValue::from(0u64));
    Plan::Redirect { headers }
}

/// Header values built here are ASCII by construction (hex, percent-encoded paths, MIME types,
/// HTTP-dates), so this cannot fail.
fn value(s: String) -> HeaderValue {
    HeaderValue::try_from(s).expect("header value built from visible ASCII")
}

/// Opens the regular file `found` holds for reading, through its descriptor (`fd_path`): the
/// very file `resolve` checked, whatever was renamed or swapped for a symlink since; returns it
/// with its `fstat`. Anything else `found` may be (a FIFO, a device) is refused without being
/// opened. The length may still change before reading ends: read at most `range`'s length and
/// treat a short read as an error (abort the response; the headers are already sent).
pub fn open_verified(found: &Resolved) -> io::Result<(fs::File, Metadata)> {
    if !found.meta.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(found.fd_path())?;
    let meta = file.metadata()?;
    Ok((file, meta))
}

#[cfg(test)]
#[path = "static_files_tests.rs"]
mod tests;
