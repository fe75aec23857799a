//! Worker pools: where work that must not block the loop runs (DESIGN.md section 4, seed 003).
//!
//! Two process-wide pools, like libuv's one, but kept apart so CPU-heavy work cannot starve file
//! I/O: the **I/O pool** (default 4 threads, `NODUS_IO_THREADS`; fs, dns) and the **CPU pool**
//! (default = available cores, `NODUS_CPU_THREADS`; zlib, crypto, json). Each is created on first
//! use with all of its threads (`nodus-io-N`, `nodus-cpu-N`), and is a fixed-size FIFO.
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
}

impl fmt::Display for OffloadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OffloadError::Panicked(msg) => write!(f, "pool work panicked: {msg}"),
            OffloadError::QueueFull { pool, limit } => {
                write!(f, "pool {pool:?} is full ({limit} queued jobs)")
            }
        }
    }
}

impl std::error::Error for OffloadError {}

impl From<OffloadError> for std::io::Error {
    fn from(e: OffloadError) -> std::io::Error {
        let kind = match e {
            OffloadError::Panicked(_) => std::io::ErrorKind::Other,
            OffloadError::QueueFull { .. } => std::io::ErrorKind::WouldBlock,
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
    /// `InvalidInput` for a name with a NUL byte (it names threads); the OS error when a thread
    /// cannot be started.
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

static IO: OnceLock<Pool> = OnceLock::new();
static CPU: OnceLock<Pool> = OnceLock::new();

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

fn start_global(builder: PoolBuilder) -> Pool {
    builder
        .start()
        .unwrap_or_else(|e| panic!("nodus: cannot start a worker pool thread: {e}"))
}

/// The process-wide I/O pool (fs, dns), created on first use with `NODUS_IO_THREADS` threads
/// (default 4).
pub fn io() -> &'static Pool {
    IO.get_or_init(|| {
        let n = env_threads("NODUS_IO_THREADS", DEFAULT_IO_THREADS);
        start_global(PoolBuilder::new("io").threads(n))
    })
}

/// The process-wide CPU pool (zlib, crypto, json), created on first use with `NODUS_CPU_THREADS`
/// threads (default: the available cores).
pub fn cpu() -> &'static Pool {
    CPU.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let n = env_threads("NODUS_CPU_THREADS", cores);
        start_global(PoolBuilder::new("cpu").threads(n))
    })
}

/// Installs `builder` as the process-wide I/O pool (named `"io"` whatever the builder says), to
/// set a queue bound or a size in code. Fails with the builder if the pool already exists.
pub fn init_io(builder: PoolBuilder) -> Result<&'static Pool, PoolBuilder> {
    init(&IO, "io", builder)
}

/// Installs `builder` as the process-wide CPU pool (named `"cpu"`); see [`init_io`].
pub fn init_cpu(builder: PoolBuilder) -> Result<&'static Pool, PoolBuilder> {
    init(&CPU, "cpu", builder)
}

fn init(
    slot: &'static OnceLock<Pool>,
    name: &str,
    mut builder: PoolBuilder,
) -> Result<&'static Pool, PoolBuilder> {
    if slot.get().is_some() {
        return Err(builder);
    }
    builder.name = name.to_owned();
    let mut given = Some(builder);
    let pool = slot.get_or_init(|| start_global(given.take().expect("taken once")));
    match given {
        Some(builder) => Err(builder), // another thread got there first
        None => Ok(pool),
    }
}

/// Runs `work` on the process-wide I/O pool (blocking file or network calls).
pub fn offload_io<F, T>(work: F) -> Offload<T>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    io().offload(work)
}

/// Runs `work` on the process-wide CPU pool (computation: compression, hashing, parsing).
pub fn offload_cpu<F, T>(work: F) -> Offload<T>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    cpu().offload(work)
}

/// Measurements of the listed pools: the process-wide ones that exist (`io` first), then those
/// built with `PoolBuilder` (module docs), for [`crate::metrics::Snapshot`].
pub(crate) fn snapshots() -> Vec<PoolSnapshot> {
    let mut pools: Vec<PoolSnapshot> = [&IO, &CPU]
        .into_iter()
        .filter_map(|p| p.get().map(Pool::stats))
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
