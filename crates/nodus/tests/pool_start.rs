//! A worker pool that cannot start its threads (`RLIMIT_AS` too low for their stacks, as a full
//! `pids.max` would refuse them): every use is an error the caller gets, never a panic, the
//! threads that did start are ended, and a use once threads can be started again starts it; a
//! readiness probe (`pool::start_failure`) names the pool meanwhile, and its own try starts it.
//! Alone in a fresh process: it lowers the process's address-space limit and starts the
//! process-wide I/O pool.

use std::io;

use nodus::pool::{self, OffloadError, PoolBuilder};
use nodus::{Runtime, fs, offload_io};
use nodus_testkit::alone;

/// The process's virtual size now, in bytes.
fn vsize() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().next().unwrap().parse().unwrap();
    // SAFETY: sysconf has no preconditions.
    pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64
}

/// Sets the soft address-space limit to `soft` bytes (the hard one stays).
fn limit_as(soft: u64) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid rlimit to fill and then to read.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_AS, &mut limit), 0);
        limit.rlim_cur = soft.min(limit.rlim_max);
        assert_eq!(libc::setrlimit(libc::RLIMIT_AS, &limit), 0);
    }
}

/// Names of this process's threads that start with `prefix`.
fn threads_named(prefix: &str) -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|n| n.trim().to_owned())
        .filter(|n| n.starts_with(prefix))
        .collect()
}

#[test]
fn a_pool_that_cannot_start_its_threads_is_an_error_then_starts_later() {
    if !alone::scenario("a_pool_that_cannot_start_its_threads_is_an_error_then_starts_later") {
        return;
    }
    let rt = Runtime::new();
    rt.block_on(async { nodus::sleep(1).await });
    // Never asked for work: no start failed.
    assert_eq!(pool::start_failure(), None);

    // Room for small allocations, none for an 8 MiB pool thread's stack.
    limit_as(vsize() + (4 << 20));
    rt.block_on(async {
        let e = fs::metadata("/").await.unwrap_err();
        assert!(
            matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::OutOfMemory
            ),
            "{e:?}"
        );
        assert!(e.to_string().contains("cannot start its threads"), "{e}");
        // Each use tries again, and fails again, as an error.
        let e = offload_io(|| 1).await.unwrap_err();
        let OffloadError::NoThreads {
            pool,
            started,
            threads,
            ..
        } = e
        else {
            panic!("{e:?}");
        };
        assert_eq!((pool.as_str(), started, threads), ("io", 0, 4));
        assert!(pool::try_io().is_err());
    });
    assert!(threads_named("nodus-io").is_empty());
    // A readiness probe says so (and its own try fails too).
    assert_eq!(
        pool::start_failure(),
        Some("pool io: no thread could be started")
    );
    assert!(threads_named("nodus-io").is_empty());

    // Room for one thread of four: the one that started is ended again.
    limit_as(vsize() + (9 << 20));
    let e = PoolBuilder::new("part").threads(4).build().unwrap_err();
    let inner = e.get_ref().and_then(|e| e.downcast_ref::<OffloadError>());
    assert!(
        matches!(
            inner,
            Some(OffloadError::NoThreads {
                started: 1..=3,
                threads: 4,
                ..
            })
        ),
        "{e}"
    );
    assert_eq!(threads_named("nodus-part"), Vec::<String>::new());

    // A pool built apart is its builder's error: the probe still names the I/O pool only.
    assert_eq!(
        pool::start_failure(),
        Some("pool io: no thread could be started")
    );

    // Once threads can start, the probe's own try starts the pool: no work needed.
    limit_as(u64::MAX);
    assert_eq!(pool::start_failure(), None);
    assert_eq!(pool::try_io().unwrap().threads(), 4);
    rt.block_on(async {
        assert!(fs::metadata("/").await.unwrap().is_dir());
        assert_eq!(offload_io(|| 7).await.unwrap(), 7);
    });
    assert_eq!(pool::try_io().unwrap().threads(), 4);
    // A thread takes its name once it runs: the four are counted once each has.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while threads_named("nodus-io").len() < 4 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(threads_named("nodus-io").len(), 4);
}
