//! Worker pools: where work that must not block the loop runs (DESIGN.md section 4, seed 003).
//!
//! Two process-wide pools, like libuv's one, but kept apart so CPU-heavy work cannot starve file
//! I/O: the **I/O pool** (default 4 threads, `NODUS_IO_THREADS`; fs, dns) and the **CPU pool**
//! (default = available cores, `NODUS_CPU_THREADS`; zlib, crypto, json). Each is created on first
//! use with all of its threads (`nodus-io-N`, `nodus-cpu-N`), and is a fixed-size FIFO.
//!
//! A pool starts all of its threads or none: when one cannot be started (a full `pids.max`,
//! `RLIMIT_NPROC`, `RLIMIT_AS` too low for its stack) those already started are ended and joined,
//! and the start fails with [`OffloadError::NoThreads`] (as an `io::Error`: `WouldBlock` for
//! `EAGAIN`, `OutOfMemory` for `ENOMEM`). For a process-wide pool every use then fails so (an
//! fs or dns call's error, an offload's `Err`) and the next use tries again: the pool exists
//! once a start succeeded. Nothing panics and nothing is logged here; the caller says it.
//! [`start_failure`] says so for a readiness probe (`pool io: no thread could be started`) while
//! such a pool's last start failed, and tries the start again itself, so a process no work
//! reaches any more (a load balancer took it out of rotation) becomes ready again by itself. The
//! failure is one flag per process-wide pool, written by a start (never on the offload path).
//!
//! [`offload_io`] / [`offload_cpu`] submit a closure and return an [`Offload`] future. The worker
//! stores the result and wakes the awaiting task; a wake from a pool thread lands on the loop's
//! remote queue, so the task resumes in the poll phase, exactly where libuv runs `uv_work_t`
//! completions.
//!
//! Invariants:
//! - An in-flight offload counts in the loop's `requests` (it keeps `Runtime::run` alive, Node's
//!   rule) from submit until its future completes or is dropped, wherever it is dropped (the unit
//!   goes back to the loop it was taken from at once; see `offload`).
//! - Work whose future is dropped before a worker picks it up is never run (`uv_cancel`).
//! - A panic inside work reaches the awaiting task as [`OffloadError::Panicked`]; it never takes
//!   a pool thread down.
//! - Slow work (DNS) never occupies more than `(n + 1) / 2` of a pool's `n` threads (libuv's
//!   rule for `UV__WORK_SLOW_IO`), so a hanging resolver cannot starve file I/O.
//! - An optional queue bound rejects submissions with [`OffloadError::QueueFull`]; the default
//!   is unbounded, as in libuv. A job whose future was dropped before it started is off the
//!   queue at once (`worker`): it counts neither against the bound nor in the depth.
//! - The metrics snapshot lists `io` and `cpu` (once they exist), then the live pools built with
//!   [`PoolBuilder`] in build order, each under its own name (the `pool` label), at most
//!   [`MAX_LISTED`] pools in all, names unique and at most 256 bytes (the limits every nodus
//!   build takes from another process's snapshot). A pool that cannot be listed (its name taken
//!   by a live listed pool, `io` or `cpu`, too long, or the list full) still works; its build
//!   says why in one WARN line, and [`Pool::stats`] still measures it. A dropped pool leaves the
//!   list.
//!
//! Pool-backed modules partition their work (64 KiB of file I/O, 256 KiB of zlib input, 1 MiB of
//! hashing per job), so one large request never holds a thread for long.

mod offload;
mod worker;

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

pub use offload::Offload;

use crate::metrics::PoolSnapshot;
use worker::Inner;

/// Largest pool size accepted (libuv's `MAX_THREADPOOL_SIZE`).
pub const MAX_THREADS: usize = 1024;

/// Default size of the I/O pool (libuv's `UV_THREADPOOL_SIZE` default).
pub const DEFAULT_IO_THREADS: usize = 4;

/// Most pools a metrics snapshot lists: `io`, `cpu` and 14 built with [`PoolBuilder`] (the
/// limit every nodus build takes from another process's snapshot).
pub const MAX_LISTED: usize = crate::metrics::wire::POOLS;

/// Why an offload produced no value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OffloadError {
    /// The work panicked; the message is the panic payload when it was a string.
    Panicked(String),
    /// The pool's queue was at its bound when the work was submitted; the work was not queued.
    QueueFull { pool: String, limit: usize },
    /// The pool could not start its threads (`started` of `threads` had started, and were
    /// ended); `error` is the OS's reason, `kind` its kind. The work was not queued.
    NoThreads {
        pool: String,
        started: usize,
        threads: usize,
        kind: std::io::ErrorKind,
        error: String,
    },
}

impl fmt::Display for OffloadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OffloadError::Panicked(msg) => write!(f, "pool work panicked: {msg}"),
            OffloadError::QueueFull { pool, limit } => {
                write!(f, "pool {pool:?} is full ({limit} queued jobs)")
            }
            OffloadError::NoThreads {
                pool,
                started,
                threads,
                error,
                ..
            } => write!(
                f,
                "pool {pool:?} cannot start its threads ({started} of {threads} started, \
                 ended again): {error}"
            ),
        }
    }
}

impl std::error::Error for OffloadError {}

impl From<OffloadError> for std::io::Error {
    fn from(e: OffloadError) -> std::io::Error {
        let kind = match e {
            OffloadError::Panicked(_) => std::io::ErrorKind::Other,
            OffloadError::QueueFull { .. } => std::io::ErrorKind::WouldBlock,
            OffloadError::NoThreads { kind, .. } => kind,
        };
        std::io::Error::new(kind, e)
    }
}

/// Configures a [`Pool`].
#[derive(Debug, Clone)]
pub struct PoolBuilder {
    name: String,
    threads: usize,
    max_queue: Option<usize>,
}

impl PoolBuilder {
    /// A pool named `name`: its threads are `nodus-{name}-N`, and it is listed under it (the
    /// `pool` label) in the metrics snapshot, Prometheus text and `nodus top` while it lives,
    /// when the name is free (see the module docs).
    pub fn new(name: impl Into<String>) -> PoolBuilder {
        PoolBuilder {
            name: name.into(),
            threads: DEFAULT_IO_THREADS,
            max_queue: None,
        }
    }

    /// Number of threads, clamped to `1..=MAX_THREADS` (default 4).
    pub fn threads(mut self, n: usize) -> PoolBuilder {
        self.threads = n.clamp(1, MAX_THREADS);
        self
    }

    /// At most `n` jobs waiting; a submission beyond it fails with `QueueFull` (default: no bound).
    pub fn max_queue(mut self, n: usize) -> PoolBuilder {
        self.max_queue = Some(n);
        self
    }

    /// Starts the threads and lists the pool in the metrics snapshot (module docs).
    ///
    /// # Errors
    /// `InvalidInput` for a name with a NUL byte (it names threads); an [`OffloadError::NoThreads`]
    /// when a thread cannot be started (none is left running then).
    pub fn build(self) -> std::io::Result<Pool> {
        let pool = self.start()?;
        list(&pool.inner);
        Ok(pool)
    }

    fn start(self) -> std::io::Result<Pool> {
        if self.name.contains('\0') {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("pool name {:?} contains a NUL byte", self.name),
            ));
        }
        Ok(Pool {
            inner: Inner::start(self.name, self.threads, self.max_queue)?,
        })
    }
}

/// The pools built with `PoolBuilder` that the snapshot lists, in build order.
static LISTED: Mutex<Vec<Arc<Inner>>> = Mutex::new(Vec::new());

fn listed() -> std::sync::MutexGuard<'static, Vec<Arc<Inner>>> {
    // Every update is one statement: consistent across a panic.
    LISTED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Lists `pool` in the snapshot if it can be (module docs), or says why not.
fn list(pool: &Arc<Inner>) {
    let name = pool.name();
    let mut listed = listed();
    let why = if name == "io" || name == "cpu" {
        Some("the name of a process-wide pool".to_owned())
    } else if listed.iter().any(|p| p.name() == name) {
        Some("the name of another live pool".to_owned())
    } else if name.len() > crate::metrics::wire::NAME {
        Some(format!("longer than {} bytes", crate::metrics::wire::NAME))
    } else if listed.len() + 2 >= MAX_LISTED {
        Some(format!("{MAX_LISTED} pools are listed already"))
    } else {
        None
    };
    match why {
        None => listed.push(pool.clone()),
        Some(why) => {
            drop(listed);
            tracing::warn!(
                target: "nodus::pool",
                "pool {name:?} is not in the metrics ({why}); Pool::stats still measures it"
            );
        }
    }
}

/// A fixed-size FIFO pool of worker threads. Dropping it lets the queued work finish, then
/// stops its threads; the process-wide pools ([`io`], [`cpu`]) live forever.
pub struct Pool {
    inner: Arc<Inner>,
}

impl Pool {
    pub fn builder(name: impl Into<String>) -> PoolBuilder {
        PoolBuilder::new(name)
    }

    /// Runs `work` on this pool; the future resolves to its result.
    ///
    /// Counts as an in-flight request of the current nodus loop, if any, until the future
    /// completes or is dropped. Dropping the future before a worker picks the work up means it
    /// never runs.
    pub fn offload<F, T>(&self, work: F) -> Offload<T>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        Offload::submit(&self.inner, work, false)
    }

    /// Like `offload`, as slow work: at most `(threads + 1) / 2` slow jobs run at once (DNS).
    pub(crate) fn offload_slow<F, T>(&self, work: F) -> Offload<T>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        Offload::submit(&self.inner, work, true)
    }

    /// The pool's name (`"io"`, `"cpu"` for the process-wide ones).
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// Number of worker threads.
    pub fn threads(&self) -> usize {
        self.inner.threads()
    }

    /// Most slow jobs (DNS) that run at once: `(threads + 1) / 2`.
    pub fn slow_limit(&self) -> usize {
        self.inner.slow_limit()
    }

    /// The pool's measurements now.
    pub fn stats(&self) -> PoolSnapshot {
        self.inner.snapshot()
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        listed().retain(|p| !Arc::ptr_eq(p, &self.inner));
        self.inner.shutdown();
    }
}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("name", &self.name())
            .field("threads", &self.threads())
            .finish()
    }
}

/// A process-wide pool: the pool once a start succeeded, and whether the last start failed.
struct Global {
    pool: OnceLock<Pool>,
    name: &'static str,
    /// Set by a start that failed, cleared by one that succeeded; read only by [`start_failure`]
    /// (never on the offload path, which reads `pool` alone).
    start_failed: AtomicBool,
    /// What [`start_failure`] says of it.
    failure: &'static str,
    builder: fn() -> PoolBuilder,
}

impl Global {
    const fn new(
        name: &'static str,
        failure: &'static str,
        builder: fn() -> PoolBuilder,
    ) -> Global {
        Global {
            pool: OnceLock::new(),
            name,
            start_failed: AtomicBool::new(false),
            failure,
            builder,
        }
    }
}

static IO: Global = Global::new("io", "pool io: no thread could be started", io_builder);
static CPU: Global = Global::new("cpu", "pool cpu: no thread could be started", cpu_builder);

/// Reads a thread count from the environment: unset means `default`, 0 means 1, at most
/// `MAX_THREADS`; an unparsable value is reported and ignored.
fn env_threads(var: &str, default: usize) -> usize {
    match std::env::var(var) {
        Err(_) => default,
        Ok(v) => match v.trim().parse::<usize>() {
            Ok(n) => n.clamp(1, MAX_THREADS),
            Err(_) => {
                tracing::warn!(target: "nodus::pool", "ignoring {var}={v:?}: not a number");
                default
            }
        },
    }
}

/// Held while a process-wide pool starts: one start at a time, so no two pools of one name.
static STARTING: Mutex<()> = Mutex::new(());

/// The pool `g`, started from `builder` if there is none yet; the start's error if it fails
/// (the next call tries again). A start from `g`'s own builder records whether it failed; an
/// [`init_io`] / [`init_cpu`] start's failure is its caller's, and is not recorded.
fn global(
    g: &'static Global,
    builder: impl FnOnce() -> PoolBuilder,
) -> Result<&'static Pool, OffloadError> {
    started(g, builder, true)
}

fn started(
    g: &'static Global,
    builder: impl FnOnce() -> PoolBuilder,
    record: bool,
) -> Result<&'static Pool, OffloadError> {
    if let Some(pool) = g.pool.get() {
        return Ok(pool);
    }
    // Nothing but a start runs under it.
    let _one = STARTING.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(pool) = g.pool.get() {
        return Ok(pool);
    }
    let builder = builder();
    let start = Inner::start(g.name.to_owned(), builder.threads, builder.max_queue);
    if record || start.is_ok() {
        g.start_failed.store(start.is_err(), Ordering::Relaxed);
    }
    let inner = start?;
    Ok(g.pool.get_or_init(|| Pool { inner }))
}

/// Why a process-wide pool cannot take work, for a readiness probe: `pool io: no thread could be
/// started` while the I/O pool (then the CPU pool) has been asked for work, does not exist, and
/// its last start failed; `None` otherwise (a pool never asked for work has had no start to
/// fail). Such a pool's start is tried again here first, so a process a load balancer took out
/// of rotation for it, and sends no work, is ready again once a thread can start. Cheap
/// otherwise: two atomic loads.
pub fn start_failure() -> Option<&'static str> {
    [&IO, &CPU].into_iter().find_map(|g| {
        let retry = g.pool.get().is_none() && g.start_failed.load(Ordering::Relaxed);
        (retry && global(g, g.builder).is_err()).then_some(g.failure)
    })
}

fn io_builder() -> PoolBuilder {
    PoolBuilder::new("io").threads(env_threads("NODUS_IO_THREADS", DEFAULT_IO_THREADS))
}

fn cpu_builder() -> PoolBuilder {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    PoolBuilder::new("cpu").threads(env_threads("NODUS_CPU_THREADS", cores))
}

/// The process-wide I/O pool (fs, dns), started on first use with `NODUS_IO_THREADS` threads
/// (default 4).
///
/// # Errors
/// [`OffloadError::NoThreads`] when its threads cannot be started; a later call tries again.
pub fn try_io() -> std::io::Result<&'static Pool> {
    Ok(global(&IO, io_builder)?)
}

/// The process-wide CPU pool (zlib, crypto, json), started on first use with
/// `NODUS_CPU_THREADS` threads (default: the available cores).
///
/// # Errors
/// As [`try_io`].
pub fn try_cpu() -> std::io::Result<&'static Pool> {
    Ok(global(&CPU, cpu_builder)?)
}

/// [`try_io`], for code that cannot go on without the pool.
///
/// # Panics
/// When the pool's threads cannot be started.
pub fn io() -> &'static Pool {
    try_io().unwrap_or_else(|e| panic!("nodus: {e}"))
}

/// [`try_cpu`], for code that cannot go on without the pool.
///
/// # Panics
/// When the pool's threads cannot be started.
pub fn cpu() -> &'static Pool {
    try_cpu().unwrap_or_else(|e| panic!("nodus: {e}"))
}

/// Installs `builder` as the process-wide I/O pool (named `"io"` whatever the builder says), to
/// set a queue bound or a size in code.
///
/// # Errors
/// `AlreadyExists` if the pool exists already; the start's error ([`PoolBuilder::build`]).
pub fn init_io(builder: PoolBuilder) -> std::io::Result<&'static Pool> {
    init(&IO, builder)
}

/// Installs `builder` as the process-wide CPU pool (named `"cpu"`); see [`init_io`].
///
/// # Errors
/// As [`init_io`].
pub fn init_cpu(builder: PoolBuilder) -> std::io::Result<&'static Pool> {
    init(&CPU, builder)
}

fn init(g: &'static Global, builder: PoolBuilder) -> std::io::Result<&'static Pool> {
    let mut ours = false;
    let pool = started(
        g,
        || {
            ours = true;
            builder
        },
        false,
    )?;
    if !ours {
        return Err(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            format!("the process-wide {:?} pool exists already", g.name),
        ));
    }
    Ok(pool)
}

/// Runs `work` on the process-wide I/O pool (blocking file or network calls); the future is an
/// [`OffloadError::NoThreads`] when the pool cannot start.
pub fn offload_io<F, T>(work: F) -> Offload<T>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    offload_on(global(&IO, io_builder), work)
}

/// Runs `work` on the process-wide CPU pool (computation: compression, hashing, parsing); the
/// future is an [`OffloadError::NoThreads`] when the pool cannot start.
pub fn offload_cpu<F, T>(work: F) -> Offload<T>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    offload_on(global(&CPU, cpu_builder), work)
}

fn offload_on<F, T>(pool: Result<&'static Pool, OffloadError>, work: F) -> Offload<T>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    match pool {
        Ok(pool) => pool.offload(work),
        Err(e) => Offload::failed(e),
    }
}

/// Measurements of the listed pools: the process-wide ones that exist (`io` first), then those
/// built with `PoolBuilder` (module docs), for [`crate::metrics::Snapshot`].
pub(crate) fn snapshots() -> Vec<PoolSnapshot> {
    let mut pools: Vec<PoolSnapshot> = [&IO, &CPU]
        .into_iter()
        .filter_map(|g| g.pool.get().map(Pool::stats))
        .collect();
    pools.extend(listed().iter().map(|p| p.snapshot()));
    pools
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed_names() -> Vec<String> {
        listed().iter().map(|p| p.name().to_owned()).collect()
    }

    /// The snapshot lists at most `MAX_LISTED` pools (what a primary of any build takes): past
    /// that a pool works unlisted, and a dropped pool's place is free again.
    #[test]
    fn built_pools_are_listed_up_to_the_wire_limit() {
        let room = MAX_LISTED - 2;
        let mut pools: Vec<Pool> = (0..room)
            .map(|i| {
                PoolBuilder::new(format!("full-{i}"))
                    .threads(1)
                    .build()
                    .unwrap()
            })
            .collect();
        let extra = PoolBuilder::new("full-extra").threads(1).build().unwrap();
        let names = listed_names();
        assert_eq!(names.len(), room, "{names:?}");
        assert!(!names.contains(&"full-extra".to_owned()));
        let rt = crate::Runtime::new();
        assert_eq!(rt.block_on(extra.offload(|| 7)).unwrap(), 7);
        assert_eq!(extra.stats().completed_total, 1);
        let snap = rt.enter(crate::metrics::snapshot);
        assert!(snap.pools.len() <= MAX_LISTED && snap.out_of_bounds().is_none());
        pools.pop();
        let late = PoolBuilder::new("full-late").threads(1).build().unwrap();
        assert!(listed_names().contains(&"full-late".to_owned()));
        // A name too long for the wire is not listed either, room or not.
        drop(late);
        let long = PoolBuilder::new("n".repeat(crate::metrics::wire::NAME + 1))
            .threads(1)
            .build()
            .unwrap();
        assert_eq!(listed_names().len(), room - 1);
        drop((pools, extra, long));
        assert!(listed_names().is_empty());
    }
}
