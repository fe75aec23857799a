//! `nodus serve`: the HTTP-framework-independent parts.
//!
//! - `static_files`: `plan`, the decision for one static-file request (refuse, 304, redirect,
//!   file + range + headers, 416, listing), made from what `resolve` opened (an `O_PATH`
//!   descriptor whose real path lies under the root), and, for a regular file, `open_verified`
//!   through that descriptor before any precondition or range is looked at (the plan holds it
//!   open);
//! - `uri_path`: request path → safe decoded segments (the traversal defence);
//! - `conditional`: ETag/Last-Modified and RFC 9110 preconditions (`If-None-Match`, `If-Range`...);
//! - `range`: `Range: bytes=` evaluation and `Content-Range` strings;
//! - `listing`: HTML directory listings (escaped, percent-encoded, never showing what cannot be
//!   served, capped at 10,000 entries);
//! - `listing_cache`: the per-process cache of listing pages (validated by the directory's
//!   times) and the one-at-a-time turn for building them, so listings' cost stays bounded;
//! - `mime`: `Content-Type` by extension;
//! - `own_socket`: a reuse-port worker's listener, whose drain may stop deferring its accepts;
//! - `fd_budget`: the connection cap from the open-files limit (two fds per connection, a
//!   reserve for everything else), or `--max-connections`;
//! - `ADMIN_PAGE_HTML`: the self-contained live page served at `/_nodus/`, which polls
//!   `/_nodus/stats` (one `Snapshot`, or `{"workers": [{worker, pid, snapshot}]}` for a cluster).
//!
//! How the HTTP glue uses it, per request (off the loop thread: `plan_deferred` opens and reads
//! links): `let p = static_files::plan_deferred(&root, &method, uri.path(), &headers, &opts);`
//! then, for `Planned::Done(p)`, answer `p.status()` with `p.headers()`, and as body
//! `p.inline_body()`, or for `Plan::File { file, range, .. }` the bytes `range` of `file`,
//! streamed; for `Planned::List(job)` (which holds the directory's descriptor), the page
//! `listing_cache::Listings::page(job)` answers (cached, or built on the I/O pool through that
//! descriptor, one at a time). HEAD (and 304) send no body; every other header is already right.
//! `root` comes from `static_files::canonical_root(dir)` once at startup.

mod access_log;
pub(crate) mod admin;
pub mod app;
mod cluster_primary;
pub mod conditional;
mod fd_budget;
mod file_body;
mod gzip;
pub mod listing;
pub mod listing_cache;
pub mod mime;
mod own_socket;
pub mod range;
pub mod static_files;
pub mod uri_path;

/// The admin page (`GET /_nodus/`): one HTML file with inline CSS and JS, no external resources.
/// Serve it as `text/html; charset=utf-8` with `Cache-Control: no-cache`.
pub const ADMIN_PAGE_HTML: &str = include_str!("admin_page.html");
