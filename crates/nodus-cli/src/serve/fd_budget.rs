//! How many connections `nodus serve` keeps open: a cap below the open-files limit, so a server
//! whose clients hold connections up to that limit still has the fds to serve them (nginx's
//! `worker_connections`, checked against the limit; nodus-http's own default, 10,000, knows
//! nothing of the limit or of what a request needs).
//!
//! Invariants:
//! - Computed once per process, at its start (after `raise_fd_limit`, with its listeners open):
//!   from the soft `RLIMIT_NOFILE` and the fds open then (`/proc/self/fd`). Each process of a
//!   cluster computes its own (a worker inherits the limit). A limit lowered later (`prlimit`) is
//!   not seen: the cap stays, and what the fds no longer hold is answered 503 (`static_files`).
//! - What one connection of the public listener needs at most: 2 fds, its socket and the file
//!   it streams (HTTP/1, one request at a time; gzip and the access log open nothing). So the cap
//!   is half of what is left once the reserve is taken: `(limit - open - reserve) / 2`, at least
//!   1, at most [`DEFAULT_MAX`] (nodus-http's default).
//! - The reserve, [`reserve`]: an eighth of the limit, at least 64 (but never more than half of
//!   what is free, so a tiny limit still serves): for a plan's transient opens on the I/O pool
//!   (the directory, `index.html`'s `O_PATH`, the file: 3 at once per pool thread, 4 threads by
//!   default), a listing's build (the directory twice, one build at a time), the admin
//!   listener's connections ([`admin_max`]), the stats' `/proc` reads. A worker fed by the
//!   primary (rr, least) adds what its handed-over connections hold before the server accepts
//!   them: three handoff windows ([`window`]: two queued, one arriving), 192 fds once the limit
//!   leaves 1,024 free, fewer below (a sixteenth of what is free, at least 1 connection a
//!   window), so that a low limit still leaves each worker connections to serve: at 128 a
//!   worker's fixed 192 left it one connection, and the handed-over ones it held took the fds its
//!   file opens needed (503s).
//! - Beyond the cap the server stops accepting (nodus-http's rule): newcomers wait in the kernel's
//!   backlog (511, Node's), or under rr in the primary (parked, within its bounds), as they wait
//!   for an nginx worker at `worker_connections`.
//! - `--max-connections N` sets the cap instead; above what the limit holds it is used anyway,
//!   with a WARN line (nginx's "worker_connections exceed open file resource limit").
//! - Said once per process: INFO from the single process, DEBUG from a cluster's worker (its
//!   start line's level: N workers, N lines), WARN from either when the limit holds fewer than
//!   [`LOW`] connections or `--max-connections` asks for more than it holds.

use nodus::cluster::HANDOFF_WINDOW_MAX;

/// The most connections kept open when the fd limit allows more: nodus-http's default.
pub const DEFAULT_MAX: u64 = 10_000;

/// Below this many connections the cap is said at WARN: the limit is too low for a public server.
pub const LOW: u64 = 256;

/// The connection cap of one process and where it comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// The soft `RLIMIT_NOFILE`; `None`: unlimited.
    pub limit: Option<u64>,
    /// Fds open when it was computed.
    pub open: u64,
    /// Fds kept for everything but the public connections.
    pub reserve: u64,
    /// The most connections the fds hold: `(limit - open - reserve) / 2`, 1 to [`DEFAULT_MAX`].
    pub room: u64,
    /// The public listener's cap: `--max-connections`, else `room`.
    pub max: u64,
    /// The admin listener's cap.
    pub admin_max: u64,
}

/// The handoff window of a worker fed by the primary whose limit is `limit` with `open` fds open
/// (`None`: unlimited): a sixteenth of what is free, 1 to [`HANDOFF_WINDOW_MAX`].
pub fn window(limit: Option<u64>, open: u64) -> u64 {
    let free = limit.unwrap_or(u64::MAX).saturating_sub(open);
    (free / 16).clamp(1, HANDOFF_WINDOW_MAX as u64)
}

/// This process's open-files limit and the fds open now.
fn limit_and_open() -> (Option<u64>, u64) {
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
    // The directory's own fd is among the entries.
    let open = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count().saturating_sub(1));
    (limit, open as u64)
}

/// This process's handoff window now ([`window`]).
pub fn window_now() -> u64 {
    let (limit, open) = limit_and_open();
    window(limit, open)
}

/// The reserve of a process whose limit is `limit` with `free` fds free: an eighth of the limit,
/// at least 64 but no more than half of `free`, plus `queued` (a worker's handed-over
/// connections not yet accepted).
pub fn reserve(limit: u64, free: u64, queued: u64) -> u64 {
    (limit / 8).max(64.min(free / 2)) + queued
}

/// The admin listener's cap: a quarter of the reserve, at least 16, at most [`DEFAULT_MAX`].
pub fn admin_max(reserve: u64) -> u64 {
    (reserve / 4).clamp(16, DEFAULT_MAX)
}

/// The budget for `limit` (`None`: unlimited) with `open` fds open, for a worker fed by the
/// primary with the handoff window `window` when one is given, with `--max-connections` `given`.
pub fn budget(limit: Option<u64>, open: u64, window: Option<u64>, given: Option<u64>) -> Budget {
    // Unlimited, or past what any table here counts: the default cap rules anyway.
    let lim = limit.unwrap_or(u64::MAX).min(1 << 40);
    let free = lim.saturating_sub(open);
    let queued = window.map_or(0, |w| 3 * w);
    let reserve = reserve(lim, free, queued);
    let room = (free.saturating_sub(reserve) / 2).clamp(1, DEFAULT_MAX);
    Budget {
        limit,
        open,
        reserve,
        room,
        max: given.unwrap_or(room),
        admin_max: admin_max(reserve),
    }
}

/// This process's budget: its soft open-files limit now and the fds open now.
pub fn measure(window: Option<u64>, given: Option<u64>) -> Budget {
    let (limit, open) = limit_and_open();
    budget(limit, open, window, given)
}

impl Budget {
    /// Says the cap once: INFO (DEBUG in a worker: `quiet`), WARN when the limit holds fewer than
    /// [`LOW`] connections or `--max-connections` asks for more than it holds; `admin`: with an
    /// admin listener, whose cap it names.
    pub fn say(&self, quiet: bool, admin: bool) {
        let limit = self
            .limit
            .map_or_else(|| "unlimited".to_owned(), |l| l.to_string());
        let admin = if admin {
            format!(
                " and the admin listener (at most {} connections)",
                self.admin_max
            )
        } else {
            String::new()
        };
        let how = format!(
            "open-files limit {limit}: {} fds open, {} kept for file opens, listings and the \
             pools{admin}, 2 per connection",
            self.open, self.reserve
        );
        if self.max > self.room {
            tracing::warn!(
                "--max-connections {} is more than the {how} hold ({}): past that, requests \
                 may be answered 503 for want of fds",
                self.max,
                self.room
            );
        } else if self.room < LOW {
            tracing::warn!(
                "connection cap {}, low (the {how}): raise the limit (LimitNOFILE=, \
                 ulimit -Hn) to serve more; past it newcomers wait in the backlog",
                self.max
            );
        } else if quiet {
            tracing::debug!("connection cap {} (the {how})", self.max);
        } else {
            tracing::info!("connection cap {} (the {how})", self.max);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{DEFAULT_MAX, budget, window};

    #[test]
    fn the_cap_leaves_a_reserve_and_two_fds_per_connection() {
        // A container's 1024: 128 kept, (1024 - 10 - 128) / 2.
        let b = budget(Some(1024), 10, None, None);
        assert_eq!((b.reserve, b.room, b.max, b.admin_max), (128, 443, 443, 32));
        // Large limits: nodus-http's default.
        assert_eq!(budget(Some(1 << 20), 10, None, None).max, DEFAULT_MAX);
        assert_eq!(budget(None, 10, None, None).max, DEFAULT_MAX);
        // 64 with 12 open: half of the 52 free kept, 13 connections.
        let b = budget(Some(64), 12, None, None);
        assert_eq!((b.reserve, b.room), (26, 13));
        // A worker fed by the primary keeps room for three windows: two queued, one arriving.
        assert_eq!(window(Some(1024), 10), 63);
        assert_eq!(window(Some(4096), 10), 64);
        let b = budget(Some(1024), 10, Some(64), None);
        assert_eq!((b.reserve, b.room), (128 + 192, 347));
        // A low limit, a small window: connections left to serve (at 128, 192 fds for the
        // handed-over ones left a worker one).
        assert_eq!(window(Some(128), 14), 7);
        let b = budget(Some(128), 14, Some(7), None);
        assert_eq!((b.reserve, b.room), (57 + 21, 18));
        assert_eq!(window(Some(32), 30), 1);
        assert_eq!(window(None, 30), 64);
        // Nothing left: one at a time.
        assert_eq!(budget(Some(64), 12, Some(64), None).room, 1);
        assert_eq!(budget(Some(8), 20, None, None).room, 1);
        // --max-connections wins, either way.
        assert_eq!(budget(Some(1024), 10, None, Some(50)).max, 50);
        assert_eq!(budget(Some(1024), 10, None, Some(5000)).max, 5000);
    }
}
