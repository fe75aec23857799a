//! `nodus::fs` tests that need the process to themselves, in a test binary of their own and one
//! at a time (`ALONE`): an I/O pool of two threads installed here, so every job it completes is
//! one of the test's (job counts are exact); the open-files limit lowered; the global log
//! subscriber.

use std::future::Future;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Once};
use std::time::{Duration, Instant};

use futures_util::{AsyncBufReadExt, AsyncReadExt, StreamExt};
use nodus::fs::{self, File, PathError};
use nodus::pool::{self, PoolBuilder};
use nodus::{Runtime, offload_io, spawn};
use nodus_testkit::tmp::TempDir;

/// One test at a time: the counts below take every job the pool completes for the test's.
static ALONE: Mutex<()> = Mutex::new(());

/// What the process-wide subscriber saw of the `nodus::fs` target: (level, message).
static FS_EVENTS: Mutex<Vec<(tracing::Level, String)>> = Mutex::new(Vec::new());

struct FsEvents;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for FsEvents {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Message(String);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0 = format!("{value:?}");
                }
            }
        }
        if event.metadata().target() == "nodus::fs" {
            let mut message = Message(String::new());
            event.record(&mut message);
            let level = *event.metadata().level();
            FS_EVENTS.lock().unwrap().push((level, message.0));
        }
    }
}

/// Takes the process for one test: the I/O pool (two threads) and the log subscriber installed
/// by the first.
fn alone() -> MutexGuard<'static, ()> {
    static SETUP: Once = Once::new();
    SETUP.call_once(|| {
        use tracing_subscriber::layer::SubscriberExt;
        pool::init_io(PoolBuilder::new("io").threads(2))
            .unwrap_or_else(|_| panic!("the I/O pool was already installed"));
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(FsEvents))
            .unwrap();
    });
    ALONE.lock().unwrap_or_else(|e| e.into_inner())
}

/// How many descriptors of this process are open on `path`.
fn open_here(path: &Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target == path)
        .count()
}

/// Waits until the I/O pool has nothing queued or running (at most 10 s).
async fn pool_idle() {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = pool::io().stats();
        if s.busy_threads == 0 && s.queue_depth == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "the I/O pool never went idle");
        nodus::sleep(1).await;
    }
}

/// Runs `read` (which returns the bytes it read) and returns how many I/O pool jobs it took,
/// its own detached close included. With `busy`, two other tasks keep the pool's two threads
/// busy meanwhile with 1 ms jobs back to back (other requests' calls), whose jobs are not
/// counted. A read that does not finish in 20 s (a hang bound) fails.
async fn jobs_of(
    busy: bool,
    expected: usize,
    read: impl Future<Output = io::Result<usize>>,
) -> u64 {
    pool_idle().await;
    let completed = || pool::io().stats().completed_total;
    let before = completed();
    let (stop, others) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let trickles: Vec<_> = (0..if busy { 2 } else { 0 })
        .map(|_| {
            let (stop, others) = (stop.clone(), others.clone());
            spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let others = others.clone();
                    offload_io(move || {
                        std::thread::sleep(Duration::from_millis(1));
                        others.fetch_add(1, Ordering::Relaxed);
                    })
                    .await
                    .unwrap();
                }
            })
        })
        .collect();
    let read = nodus::timeout(Duration::from_secs(20), read).await;
    stop.store(true, Ordering::Relaxed);
    for t in trickles {
        t.await.unwrap();
    }
    pool_idle().await;
    let jobs = completed() - before - others.load(Ordering::Relaxed);
    let n = read
        .unwrap_or_else(|_| panic!("the read never finished ({jobs} I/O pool jobs)"))
        .unwrap();
    assert_eq!(n, expected);
    jobs
}

/// Every way to read a file to its end, each from its open to its close: one job opens, one
/// reads the data, one finds the end, one closes (and `read_to_end` asks for the size first).
/// The end of the file is one read that returns 0, reported once: never a read per poll.
fn every_reader_reads_to_the_end_in_a_few_jobs(busy: bool) {
    let _alone = alone();
    let dir = TempDir::new(if busy {
        "fs-alone-eof-busy"
    } else {
        "fs-alone-eof"
    });
    let path = dir.join("small");
    let line = format!("{}\n", "x".repeat(63));
    std::fs::write(&path, line.repeat(64)).unwrap(); // 4 KiB, 64 lines
    let empty = dir.join("empty");
    std::fs::write(&empty, "").unwrap();
    let rt = Runtime::new();
    rt.block_on(async {
        let p = || path.clone();
        let mut counts = Vec::new();
        let mut count = |name: &'static str, jobs: u64| counts.push((name, jobs));
        count(
            "fs::read",
            jobs_of(busy, 4096, async { Ok(fs::read(p()).await?.len()) }).await,
        );
        count(
            "fs::read_to_string",
            jobs_of(busy, 4096, async {
                Ok(fs::read_to_string(p()).await?.len())
            })
            .await,
        );
        count(
            "fs::read of an empty file",
            jobs_of(busy, 0, async { Ok(fs::read(&empty).await?.len()) }).await,
        );
        count(
            "File::read_to_end",
            jobs_of(busy, 4096, async {
                let mut buf = Vec::new();
                File::open(p()).await?.read_to_end(&mut buf, u64::MAX).await
            })
            .await,
        );
        count(
            "AsyncReadExt::read_to_end",
            jobs_of(busy, 4096, async {
                let mut buf = Vec::new();
                AsyncReadExt::read_to_end(&mut File::open(p()).await?, &mut buf).await
            })
            .await,
        );
        count(
            "AsyncReadExt::read_to_string",
            jobs_of(busy, 4096, async {
                let mut text = String::new();
                AsyncReadExt::read_to_string(&mut File::open(p()).await?, &mut text).await
            })
            .await,
        );
        count(
            "AsyncReadExt::read until 0",
            jobs_of(busy, 4096, async {
                let mut f = File::open(p()).await?;
                let (mut total, mut buf) = (0, [0u8; 1000]);
                loop {
                    match AsyncReadExt::read(&mut f, &mut buf).await? {
                        0 => return Ok(total),
                        n => total += n,
                    }
                }
            })
            .await,
        );
        count(
            "AsyncBufReadExt::lines",
            jobs_of(busy, 4096, async {
                let lines = futures_util::io::BufReader::new(File::open(p()).await?).lines();
                let lines: Vec<_> = lines.collect().await;
                Ok(lines.len() * 64)
            })
            .await,
        );
        count(
            "File's own AsyncBufReadExt::lines",
            jobs_of(busy, 4096, async {
                let lines: Vec<_> = File::open(p()).await?.lines().collect().await;
                Ok(lines.len() * 64)
            })
            .await,
        );
        count(
            "AsyncBufReadExt::fill_buf until empty",
            jobs_of(busy, 4096, async {
                let mut f = File::open(p()).await?;
                let mut total = 0;
                loop {
                    let n = f.fill_buf().await?.len();
                    if n == 0 {
                        return Ok(total);
                    }
                    f.consume_unpin(n);
                    total += n;
                }
            })
            .await,
        );
        let pool = if busy { "busy" } else { "idle" };
        assert!(
            counts.iter().all(|(_, jobs)| *jobs <= 5),
            "I/O pool jobs per read of a 4 KiB file, pool {pool}: {counts:?}"
        );
    });
}

#[test]
fn every_reader_reads_to_the_end_in_a_few_jobs_on_an_idle_pool() {
    every_reader_reads_to_the_end_in_a_few_jobs(false);
}

#[test]
fn every_reader_reads_to_the_end_in_a_few_jobs_on_a_busy_pool() {
    every_reader_reads_to_the_end_in_a_few_jobs(true);
}

/// The end of the file is reported once, not for good: a file that has grown since is read on.
#[test]
fn a_read_after_the_end_of_the_file_reads_what_was_appended() {
    let _alone = alone();
    let dir = TempDir::new("fs-alone-grows");
    let path = dir.join("log");
    std::fs::write(&path, "one\n").unwrap();
    let rt = Runtime::new();
    rt.block_on(async {
        let mut f = File::open(&path).await.unwrap();
        let mut text = String::new();
        AsyncReadExt::read_to_string(&mut f, &mut text)
            .await
            .unwrap();
        assert_eq!(text, "one\n");
        let mut buf = [0u8; 16];
        assert_eq!(AsyncReadExt::read(&mut f, &mut buf).await.unwrap(), 0);
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .and_then(|mut a| io::Write::write_all(&mut a, b"two\n"))
            .unwrap();
        text.clear();
        AsyncReadExt::read_to_string(&mut f, &mut text)
            .await
            .unwrap();
        assert_eq!(text, "two\n");
    });
}

/// The report's case: `write_all` of 1 MiB and the `File` dropped without a flush. `run` (Node's
/// exit rule) returns only once the last chunk is written and the file closed.
#[test]
fn run_returns_after_a_dropped_file_s_last_write_and_its_close() {
    let _alone = alone();
    let dir = TempDir::new("fs-alone-dropped");
    let path = dir.join("f");
    let rt = Runtime::new();
    rt.block_on(async {
        let mut f = File::create(&path).await.unwrap();
        File::write_all(&mut f, &vec![1u8; 1 << 20]).await.unwrap();
        drop(f); // the last 64 KiB chunk is still in flight
    });
    rt.run();
    assert_eq!(open_here(&path), 0, "run returned with the file still open");
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 1 << 20);
}

/// A dropped file's write that cannot end yet (into a full FIFO, drained 200 ms later by
/// another thread) keeps `run` going: it returns with the data written and the file closed.
#[test]
fn a_dropped_file_s_blocked_write_keeps_run_going_until_it_ends() {
    let _alone = alone();
    let dir = TempDir::new("fs-alone-fifo");
    let fifo = dir.join("fifo");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: `c` is a valid NUL-terminated path for the duration of the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    // The read end, opened without waiting for a writer, then made blocking.
    let reader = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&fifo)
        .unwrap();
    // Fill the pipe, so that the next write blocks until the reader drains it.
    let mut prefill = 0;
    {
        let mut filler = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&fifo)
            .unwrap();
        for size in [4096, 1] {
            loop {
                match io::Write::write(&mut filler, &vec![0u8; size]) {
                    Ok(n) => prefill += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => panic!("{e}"),
                }
            }
        }
    }
    rustix::fs::fcntl_setfl(&reader, rustix::fs::OFlags::empty()).unwrap();
    let rt = Runtime::new();
    rt.block_on(async {
        let mut f = File::create(&fifo).await.unwrap();
        File::write_all(&mut f, &[1u8; 65536]).await.unwrap();
        drop(f); // its one write waits for room in the pipe
    });
    let (dropped, wait) = std::sync::mpsc::channel::<()>();
    let drain = std::thread::spawn(move || {
        wait.recv().unwrap();
        std::thread::sleep(Duration::from_millis(200));
        let mut all = Vec::new();
        io::Read::read_to_end(&mut &reader, &mut all).unwrap();
        all.len()
    });
    dropped.send(()).unwrap();
    rt.run();
    // The reader's descriptor, until the drain ends; never the writer's.
    assert!(
        open_here(&fifo) <= 1,
        "run returned with the write in flight"
    );
    assert_eq!(drain.join().unwrap(), prefill + 65536);
}

/// No caller can get the error of a dropped file's last write any more: it is logged, once,
/// naming the path.
#[test]
fn the_error_of_a_dropped_file_s_write_is_logged_naming_the_path() {
    let _alone = alone();
    FS_EVENTS.lock().unwrap().clear();
    let rt = Runtime::new();
    rt.block_on(async {
        let mut f = File::create("/dev/full").await.unwrap();
        File::write_all(&mut f, b"lost").await.unwrap();
        drop(f);
    });
    rt.run();
    let events = FS_EVENTS.lock().unwrap().clone();
    assert_eq!(events.len(), 1, "{events:?}");
    let (level, message) = &events[0];
    assert_eq!(*level, tracing::Level::WARN);
    assert!(
        message.starts_with("write '/dev/full': No space left on device"),
        "{message}"
    );
}

/// EMFILE, which std leaves uncategorized, keeps its errno and Node's code.
#[test]
fn an_open_past_the_open_files_limit_says_emfile() {
    let _alone = alone();
    let dir = TempDir::new("fs-alone-emfile");
    let path = dir.join("f");
    std::fs::write(&path, "x").unwrap();
    let rt = Runtime::new();
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid rlimit to write into.
    assert_eq!(
        unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) },
        0
    );
    let open_now = std::fs::read_dir("/proc/self/fd").unwrap().count() as u64;
    let lowered = libc::rlimit {
        rlim_cur: open_now + 16,
        ..limit
    };
    // SAFETY: a valid rlimit, below the hard limit.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lowered) }, 0);
    let e = rt.block_on(async {
        let mut held = Vec::new();
        loop {
            match File::open(&path).await {
                Ok(f) => held.push(f),
                Err(e) => return e,
            }
            assert!(held.len() < 64, "no open failed");
        }
    });
    // SAFETY: restores the limit read above.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) }, 0);
    rt.run();
    assert_eq!(fs::os_error(&e), Some(libc::EMFILE), "{e}");
    assert_eq!(fs::error_code(&e), Some("EMFILE"), "{e}");
    let pe = e
        .get_ref()
        .and_then(|i| i.downcast_ref::<PathError>())
        .unwrap();
    assert_eq!(
        (pe.op(), pe.raw_os_error(), pe.code()),
        ("open", Some(libc::EMFILE), Some("EMFILE"))
    );
    assert_eq!(e.kind(), io::Error::from_raw_os_error(libc::EMFILE).kind());
    assert!(
        e.to_string()
            .starts_with(&format!("open '{}': ", path.display())),
        "{e}"
    );
}
