//! What a directory listing costs `nodus serve`, bounded whatever clients do: a per-process
//! cache of listing pages, and one listing built at a time.
//!
//! A listing reads the whole directory with one `stat` per entry (about 16 ms of CPU for 5,000
//! entries), on the I/O pool that every file's stat, open and 64 KiB read also use. Without a
//! bound, a flood of requests for a large directory (each closed by its client at once: an
//! HTTP/1 server cannot tell that from a half-close, so each is still answered) queued listings
//! without end ahead of every other request's file I/O.
//!
//! Invariants:
//! - At most one listing is queued on or running in the I/O pool per process. Other
//!   requests for a listing wait their turn on the loop (an async lock), not in the pool's FIFO,
//!   so a file's stat, open or read never waits behind more than that one listing. The turn is
//!   held until the build's pool job is over, even if the request that started it is dropped
//!   (an HTTP/2 reset): the build runs in a task of its own, and fills the cache.
//! - A cached page is answered only to a request for the same decoded path, of the same directory
//!   (real path, `dev`, `ino`), whose own `fstat` (of the descriptor `static_files::plan_deferred`
//!   opened and checked, on the pool, before any build reads the directory) saw the `mtime` and
//!   `ctime` the page was built after: a directory that gained, lost or renamed an entry is
//!   listed afresh. A build reads the directory through its job's descriptor, never by path. A waiting request
//!   that finds the page cached when its turn comes answers with it. What changes inside an
//!   entry without touching the directory (a file's size and date) shows after at most
//!   [`MAX_AGE`], when a cached page is built again.
//! - A page is cached only if the directory's `ctime` was at least [`RACY`] older than the start
//!   of its build, so a change in the same clock tick as the stat, after it, cannot hide behind
//!   equal times (git's "racy clean" rule). Refusals (an unreadable directory) and failures
//!   (out of descriptors while reading it: `static_files::Failure`) are never cached.
//! - At most [`MAX_PAGES`] pages and [`MAX_BYTES`] of HTML are kept, the least recently used
//!   dropped first; a larger page is answered but not kept.
//! - Nothing here touches the filesystem on the loop: the one `stat` that validates a page is
//!   `plan_deferred`'s, and a build runs on the I/O pool.

use std::cell::{Cell, RefCell};
use std::io;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use futures_util::lock::Mutex;
use http::{HeaderMap, StatusCode};

use super::static_files::{Failure, ListJob, ListingKey, Plan};

/// Pages kept.
pub const MAX_PAGES: usize = 32;
/// HTML bytes kept, all pages together.
pub const MAX_BYTES: usize = 8 << 20;
/// How much older than a build's start the directory's `ctime` must be for its page to be kept.
pub const RACY: Duration = Duration::from_secs(2);
/// How long a kept page is answered at most (then built again, if asked for).
pub const MAX_AGE: Duration = Duration::from_secs(5);

/// A listing whose build never ran to its end (the pool's or the task's failure).
fn pool_failure(error: io::Error) -> Failure {
    Failure {
        op: "build the listing",
        error,
    }
}

/// A listing's answer: 200 with the page, or the refusal of a directory that cannot be read.
#[derive(Debug, Clone)]
pub struct Page {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Page {
    fn of(plan: Plan) -> Page {
        match plan {
            Plan::Listing { html, headers } => Page {
                status: StatusCode::OK,
                headers,
                body: html.into(),
            },
            other => Page {
                status: other.status(),
                headers: other.headers().clone(),
                body: other.inline_body().unwrap_or_default().into(),
            },
        }
    }
}

/// How a listing is built: `ListJob::build`, or a test's stand-in.
type Build = Arc<dyn Fn(ListJob) -> Plan + Send + Sync>;

/// The bounds of a [`Listings`] (the constants above, or a test's).
#[derive(Debug, Clone, Copy)]
struct Limits {
    pages: usize,
    bytes: usize,
    racy: Duration,
    max_age: Duration,
}

/// The per-process listing cache and build turn (one per `nodus serve` process, on its loop).
pub struct Listings {
    cache: RefCell<Vec<Kept>>,
    /// Bumped on every use: the least recently used page has the lowest `used`.
    clock: Cell<u64>,
    turn: Arc<Mutex<()>>,
    build: Build,
    limits: Limits,
}

struct Kept {
    key: ListingKey,
    changed: [(i64, i64); 2],
    built: Instant,
    used: u64,
    page: Page,
}

impl Listings {
    pub fn new() -> Rc<Listings> {
        Listings::with(
            Arc::new(ListJob::build),
            Limits {
                pages: MAX_PAGES,
                bytes: MAX_BYTES,
                racy: RACY,
                max_age: MAX_AGE,
            },
        )
    }

    fn with(build: Build, limits: Limits) -> Rc<Listings> {
        Rc::new(Listings {
            cache: RefCell::new(Vec::new()),
            clock: Cell::new(0),
            turn: Arc::new(Mutex::new(())),
            build,
            limits,
        })
    }

    /// The answer to `job`: its cached page, or one built on the I/O pool when this request's
    /// turn comes (see the module's invariants).
    ///
    /// # Errors
    /// The build failed for the server's own reason (out of descriptors, say), or the I/O pool
    /// did: the caller answers 503 or 500 and logs it.
    pub async fn page(self: &Rc<Listings>, job: ListJob) -> Result<Page, Failure> {
        if let Some(page) = self.cached(&job) {
            return Ok(page);
        }
        let turn = self.turn.clone().lock_owned().await;
        if let Some(page) = self.cached(&job) {
            return Ok(page);
        }
        let (this, build) = (self.clone(), self.build.clone());
        let built = nodus::spawn_named("serve:listing", async move {
            // Held until the pool job is over, whether or not the request still waits.
            let _turn = turn;
            let (key, changed) = (job.key.clone(), job.changed);
            let (plan, started) = nodus::pool::offload_io(move || {
                let started = SystemTime::now();
                (build(job), started)
            })
            .await
            .map_err(|e| pool_failure(e.into()))?;
            if let Plan::Failed { failure, .. } = plan {
                return Err(failure);
            }
            let page = Page::of(plan);
            this.keep(key, changed, started, &page);
            Ok(page)
        });
        built
            .await
            .map_err(|e| pool_failure(io::Error::other(e.to_string())))?
    }

    fn cached(&self, job: &ListJob) -> Option<Page> {
        let mut cache = self.cache.borrow_mut();
        let kept = cache.iter_mut().find(|k| {
            k.key == job.key && k.changed == job.changed && k.built.elapsed() < self.limits.max_age
        })?;
        kept.used = self.tick();
        Some(kept.page.clone())
    }

    fn keep(&self, key: ListingKey, changed: [(i64, i64); 2], started: SystemTime, page: &Page) {
        let (secs, nanos) = changed[1];
        let ctime = SystemTime::UNIX_EPOCH
            + Duration::new(
                u64::try_from(secs).unwrap_or(0),
                nanos.clamp(0, 999_999_999) as u32,
            );
        let settled = ctime + self.limits.racy <= started;
        if page.status != StatusCode::OK || !settled || page.body.len() > self.limits.bytes {
            return;
        }
        let mut cache = self.cache.borrow_mut();
        cache.retain(|k| k.key != key);
        cache.push(Kept {
            key,
            changed,
            built: Instant::now(),
            used: self.tick(),
            page: page.clone(),
        });
        while cache.len() > self.limits.pages
            || cache.iter().map(|k| k.page.body.len()).sum::<usize>() > self.limits.bytes
        {
            let oldest = (0..cache.len()).min_by_key(|&i| cache[i].used);
            cache.swap_remove(oldest.expect("over a bound, so not empty"));
        }
    }

    fn tick(&self) -> u64 {
        self.clock.set(self.clock.get() + 1);
        self.clock.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::static_files::{Planned, StaticOptions, plan_deferred};
    use http::Method;
    use std::fs;
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Pages kept at once, whatever the directory's times (`racy` zero).
    const EAGER: Limits = Limits {
        pages: 4,
        bytes: 1 << 20,
        racy: Duration::ZERO,
        max_age: Duration::from_secs(3600),
    };

    fn temp_root(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("nodus-lc-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("d")).unwrap();
        fs::canonicalize(dir).unwrap()
    }

    fn job(root: &Path, path: &str) -> ListJob {
        match plan_deferred(
            root,
            &Method::GET,
            path,
            &HeaderMap::new(),
            &StaticOptions::default(),
        ) {
            Planned::List(job) => *job,
            Planned::Done(plan) => panic!("expected a listing job, got {plan:#?}"),
        }
    }

    /// A build through `ListJob::build` that counts, then sleeps `slow`.
    fn counting(builds: &Arc<AtomicUsize>, slow: Duration) -> Build {
        let builds = builds.clone();
        Arc::new(move |job| {
            builds.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(slow);
            job.build()
        })
    }

    fn body(page: &Page) -> &str {
        std::str::from_utf8(&page.body).unwrap()
    }

    #[test]
    fn a_changed_directory_is_listed_afresh() {
        let root = temp_root("fresh");
        fs::write(root.join("d/a.txt"), "a").unwrap();
        let builds = Arc::new(AtomicUsize::new(0));
        let listings = Listings::with(counting(&builds, Duration::ZERO), EAGER);
        nodus::Runtime::new().block_on(async {
            let first = listings.page(job(&root, "/d/")).await.unwrap();
            assert!(body(&first).contains(">a.txt</a>"));
            // Unchanged: the cached page, HEAD's too (same plan, same job).
            let again = listings.page(job(&root, "/d/")).await.unwrap();
            assert_eq!(again.body, first.body);
            assert_eq!(builds.load(Ordering::SeqCst), 1);
            // A new entry changes the directory's mtime (set apart, should the clock not tick).
            fs::write(root.join("d/b.txt"), "b").unwrap();
            let dir = fs::File::open(root.join("d")).unwrap();
            dir.set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000))
                .unwrap();
            let fresh = listings.page(job(&root, "/d/")).await.unwrap();
            assert!(body(&fresh).contains(">b.txt</a>"), "{}", body(&fresh));
            assert_eq!(builds.load(Ordering::SeqCst), 2);
        });
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn concurrent_requests_build_one_listing() {
        let root = temp_root("one");
        fs::write(root.join("d/a.txt"), "a").unwrap();
        let builds = Arc::new(AtomicUsize::new(0));
        let listings = Listings::with(counting(&builds, Duration::from_millis(50)), EAGER);
        nodus::Runtime::new().block_on(async {
            let waiting: Vec<_> = (0..20)
                .map(|_| {
                    let (l, j) = (listings.clone(), job(&root, "/d/"));
                    nodus::spawn(async move { l.page(j).await.unwrap() })
                })
                .collect();
            for w in waiting {
                let page = w.await.unwrap();
                assert!(body(&page).contains(">a.txt</a>"));
            }
        });
        assert_eq!(builds.load(Ordering::SeqCst), 1);
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn file_work_waits_behind_at_most_one_listing() {
        let root = temp_root("turn");
        for i in 0..12 {
            fs::create_dir(root.join(format!("d/{i}"))).unwrap();
        }
        // Slow builds that record how many run at once.
        let (running, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let started = Arc::new(AtomicUsize::new(0));
        let build: Build = {
            let (running, most, started) = (running.clone(), most.clone(), started.clone());
            Arc::new(move |job| {
                started.fetch_add(1, Ordering::SeqCst);
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(100));
                running.fetch_sub(1, Ordering::SeqCst);
                job.build()
            })
        };
        let listings = Listings::with(build, EAGER);
        nodus::Runtime::new().block_on(async {
            // 12 different directories (nothing to share), one of them dropped mid-build.
            let mut waiting: Vec<_> = (0..12)
                .map(|i| {
                    let (l, j) = (listings.clone(), job(&root, &format!("/d/{i}/")));
                    nodus::spawn(async move { l.page(j).await.map(|p| p.status) })
                })
                .collect();
            nodus::sleep(Duration::from_millis(20)).await;
            waiting.remove(0).abort();
            // A file's work, asked for now: behind at most the one listing being built.
            let s = started.clone();
            let seen = nodus::pool::offload_io(move || s.load(Ordering::SeqCst))
                .await
                .unwrap();
            assert!(seen <= 2, "{seen} listings started before the file's job");
            for w in waiting {
                assert_eq!(w.await.unwrap().unwrap(), StatusCode::OK);
            }
        });
        assert_eq!(most.load(Ordering::SeqCst), 1);
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn bounded_and_settled() {
        let root = temp_root("bounds");
        for i in 0..6 {
            fs::create_dir(root.join(format!("d/{i}"))).unwrap();
        }
        let builds = Arc::new(AtomicUsize::new(0));
        let listings = Listings::with(counting(&builds, Duration::ZERO), EAGER);
        nodus::Runtime::new().block_on(async {
            for i in 0..6 {
                listings
                    .page(job(&root, &format!("/d/{i}/")))
                    .await
                    .unwrap();
            }
            assert_eq!(listings.cache.borrow().len(), EAGER.pages);
            // The least recently used (0, 1) went first.
            listings.page(job(&root, "/d/5/")).await.unwrap();
            assert_eq!(builds.load(Ordering::SeqCst), 6);
            listings.page(job(&root, "/d/0/")).await.unwrap();
            assert_eq!(builds.load(Ordering::SeqCst), 7);
        });
        // A directory changed just now is answered, not kept.
        let fresh = Listings::with(
            counting(&builds, Duration::ZERO),
            Limits {
                racy: RACY,
                ..EAGER
            },
        );
        nodus::Runtime::new().block_on(async {
            fresh.page(job(&root, "/d/1/")).await.unwrap();
        });
        assert!(fresh.cache.borrow().is_empty());
        fs::remove_dir_all(&root).unwrap();
    }
}
