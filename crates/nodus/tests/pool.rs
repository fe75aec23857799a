//! The worker pools: results, completion in the poll phase, liveness, panics, cancellation,
//! queue bounds, FIFO order, thread names and measurements (DESIGN.md section 4).

use std::cell::RefCell;
use std::future::{Future, poll_fn};
use std::pin::pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use nodus::metrics::{prometheus, snapshot};
use nodus::pool::{self, Pool};
use nodus::{OffloadError, Runtime, offload_cpu, offload_io, set_immediate, set_timeout, spawn};

const WAIT: Duration = Duration::from_secs(10);

#[test]
fn offloads_return_their_results_from_named_pool_threads() {
    let rt = Runtime::new();
    let (io, cpu) = rt.block_on(async {
        let io = offload_io(|| std::thread::current().name().map(str::to_owned));
        let cpu = offload_cpu(|| std::thread::current().name().map(str::to_owned));
        (io.await.unwrap(), cpu.await.unwrap())
    });
    assert!(io.unwrap().starts_with("nodus-io-"));
    assert!(cpu.unwrap().starts_with("nodus-cpu-"));
    assert!(pool::io().threads() >= 1);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if std::env::var_os("NODUS_CPU_THREADS").is_none() {
        assert_eq!(pool::cpu().threads(), cores);
    }
    if std::env::var_os("NODUS_IO_THREADS").is_none() {
        assert_eq!(pool::io().threads(), 4);
    }
}

#[test]
fn a_completion_runs_in_the_poll_phase_so_an_immediate_beats_a_timeout() {
    // Inside a poll-phase callback, an immediate always runs before a new 0 ms timer.
    for _ in 0..20 {
        let rt = Runtime::new();
        let order = Rc::new(RefCell::new(Vec::new()));
        let o = order.clone();
        rt.enter(|| {
            spawn(async move {
                // The job ends only after the task's first poll found it unfinished, so its
                // completion always comes through the poll phase (a loaded machine may run
                // the task late).
                let polled = Arc::new(AtomicBool::new(false));
                let seen = polled.clone();
                let mut job = pin!(offload_io(move || {
                    while !seen.load(Ordering::Acquire) {
                        std::thread::sleep(Duration::from_micros(100));
                    }
                }));
                poll_fn(|cx| {
                    let r = job.as_mut().poll(cx);
                    polled.store(true, Ordering::Release);
                    r
                })
                .await
                .unwrap();
                let (a, b) = (o.clone(), o.clone());
                set_timeout(0, move || a.borrow_mut().push("timeout"));
                set_immediate(move || b.borrow_mut().push("immediate"));
            })
            .detach();
        });
        rt.run();
        assert_eq!(*order.borrow(), ["immediate", "timeout"]);
    }
}

#[test]
fn in_flight_work_keeps_run_alive() {
    let rt = Runtime::new();
    let done = Rc::new(RefCell::new(None));
    let d = done.clone();
    // Before the spawn: the work may start on the pool as soon as the task is first polled.
    let start = Instant::now();
    rt.enter(|| {
        spawn(async move {
            let v = offload_io(|| {
                std::thread::sleep(Duration::from_millis(50));
                42
            })
            .await
            .unwrap();
            *d.borrow_mut() = Some(v);
        })
        .detach();
    });
    rt.run();
    assert_eq!(*done.borrow(), Some(42));
    assert!(start.elapsed() >= Duration::from_millis(50));
}

#[test]
fn a_future_dropped_off_its_loop_still_lets_run_return() {
    // The offload outlives the main script and is dropped outside the loop: its request unit comes
    // back through the loop's remote queue, so `run` does not wait forever.
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let rt = Runtime::new();
        let pending = rt.enter(|| offload_io(|| std::thread::sleep(Duration::from_millis(20))));
        drop(pending);
        rt.run();
        tx.send(()).unwrap();
    });
    rx.recv_timeout(WAIT).expect("run returned");
}

#[test]
fn a_panic_reaches_the_awaiting_task_and_the_threads_survive() {
    let pool = Pool::builder("panicky").threads(2).build().unwrap();
    let rt = Runtime::new();
    rt.block_on(async {
        for _ in 0..4 {
            let err = pool
                .offload(|| -> u32 { panic!("boom in the pool") })
                .await
                .unwrap_err();
            assert_eq!(err, OffloadError::Panicked("boom in the pool".into()));
            assert!(err.to_string().contains("boom in the pool"));
        }
        // Both threads are still there: two jobs that only finish together.
        let barrier = Arc::new(Barrier::new(2));
        let (b1, b2) = (barrier.clone(), barrier);
        let a = pool.offload(move || b1.wait().is_leader());
        let b = pool.offload(move || b2.wait().is_leader());
        let (a, b) = (a.await.unwrap(), b.await.unwrap());
        assert!(a ^ b);
    });
    let stats = pool.stats();
    assert_eq!(stats.panicked_total, 4);
    assert_eq!(stats.completed_total, 6);
}

/// A one-thread pool whose thread is held until the returned sender is used (or dropped).
fn held_pool(name: &str, max_queue: Option<usize>) -> (Pool, mpsc::Sender<()>, mpsc::Receiver<()>) {
    let mut b = Pool::builder(name).threads(1);
    if let Some(n) = max_queue {
        b = b.max_queue(n);
    }
    let pool = b.build().unwrap();
    let (release, held) = mpsc::channel::<()>();
    let (started_tx, started) = mpsc::channel();
    pool.offload(move || {
        started_tx.send(()).unwrap();
        let _ = held.recv_timeout(WAIT);
    })
    .detach();
    (pool, release, started)
}

#[test]
fn work_dropped_before_it_starts_never_runs() {
    let (pool, release, started) = held_pool("cancel", None);
    started.recv_timeout(WAIT).unwrap();
    let ran = Arc::new(AtomicBool::new(false));
    let r = ran.clone();
    let rt = Runtime::new();
    rt.block_on(async {
        let doomed = pool.offload(move || r.store(true, Ordering::SeqCst));
        assert_eq!(pool.stats().queue_depth, 1);
        drop(doomed);
        release.send(()).unwrap();
        // FIFO: once this one ran, the dropped one had its turn.
        pool.offload(|| ()).await.unwrap();
    });
    assert!(!ran.load(Ordering::SeqCst), "dropped work ran");
    assert_eq!(pool.stats().cancelled_total, 1);
}

#[test]
fn a_full_queue_refuses_work_with_an_error() {
    let (pool, release, started) = held_pool("bounded", Some(2));
    started.recv_timeout(WAIT).unwrap();
    let rt = Runtime::new();
    rt.block_on(async {
        let a = pool.offload(|| 1);
        let b = pool.offload(|| 2);
        let err = pool.offload(|| 3).await.unwrap_err();
        assert_eq!(
            err,
            OffloadError::QueueFull {
                pool: "bounded".into(),
                limit: 2
            }
        );
        let io_err: std::io::Error = err.into();
        assert_eq!(io_err.kind(), std::io::ErrorKind::WouldBlock);
        release.send(()).unwrap();
        assert_eq!(a.await.unwrap() + b.await.unwrap(), 3);
    });
    assert_eq!(pool.stats().rejected_total, 1);
}

#[test]
fn a_pool_runs_its_queue_in_fifo_order() {
    let (pool, release, started) = held_pool("fifo", None);
    started.recv_timeout(WAIT).unwrap();
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let rt = Runtime::new();
    rt.block_on(async {
        let jobs: Vec<_> = (0..20)
            .map(|i| {
                let o = order.clone();
                pool.offload(move || o.lock().unwrap().push(i))
            })
            .collect();
        release.send(()).unwrap();
        for j in jobs {
            j.await.unwrap();
        }
    });
    assert_eq!(*order.lock().unwrap(), (0..20).collect::<Vec<_>>());
}

#[test]
fn a_detached_offload_still_runs() {
    let ran = Arc::new(AtomicUsize::new(0));
    let r = ran.clone();
    let rt = Runtime::new();
    rt.block_on(async move {
        offload_io(move || r.fetch_add(1, Ordering::SeqCst)).detach();
    });
    let deadline = Instant::now() + WAIT;
    while ran.load(Ordering::SeqCst) == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(ran.load(Ordering::SeqCst), 1);
}

#[test]
fn offload_works_outside_a_loop_too() {
    // Any executor can await it; here a thread parks until the worker wakes it.
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Arc::new(Unpark(std::thread::current())).into();
    let mut cx = std::task::Context::from_waker(&waker);
    let mut fut = std::pin::pin!(offload_cpu(|| 7));
    let deadline = Instant::now() + WAIT;
    loop {
        if let std::task::Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            assert_eq!(v.unwrap(), 7);
            break;
        }
        assert!(Instant::now() < deadline);
        std::thread::park_timeout(Duration::from_millis(10));
    }
}

#[test]
fn pools_are_measured_in_the_snapshot_and_in_prometheus_text() {
    let rt = Runtime::new();
    let before = rt.enter(snapshot);
    let completed = |s: &nodus::metrics::Snapshot, name: &str| {
        s.pools
            .iter()
            .find(|p| p.pool == name)
            .map_or(0, |p| p.completed_total)
    };
    rt.block_on(async {
        for _ in 0..10 {
            offload_io(|| std::thread::sleep(Duration::from_millis(1)))
                .await
                .unwrap();
            offload_cpu(|| ()).await.unwrap();
        }
    });
    let after = rt.enter(snapshot);
    assert!(completed(&after, "io") >= completed(&before, "io") + 10);
    assert!(completed(&after, "cpu") >= completed(&before, "cpu") + 10);
    let io = after.pools.iter().find(|p| p.pool == "io").unwrap();
    assert!(io.run.count >= 10);
    assert!(io.run.max >= 1_000_000, "a 1 ms job: {:?}", io.run);
    assert!(io.queue_wait.count >= 10);
    let text = prometheus::render(&after);
    for family in [
        "nodus_pool_queue_depth",
        "nodus_pool_queue_wait_seconds_count",
        "nodus_pool_run_seconds_bucket",
        "nodus_pool_busy_threads",
        "nodus_pool_completed_total",
        "nodus_pool_cancelled_total",
        "nodus_pool_rejected_total",
        "nodus_pool_panicked_total",
    ] {
        for pool in ["io", "cpu"] {
            assert!(
                text.lines()
                    .any(|l| l.starts_with(family) && l.contains(&format!("pool=\"{pool}\""))),
                "{family} for {pool} missing from:\n{text}"
            );
        }
    }
    let json = serde_json::to_string(&after).unwrap();
    let back: nodus::metrics::Snapshot = serde_json::from_str(&json).unwrap();
    assert_eq!(back.pools.len(), after.pools.len());
}

#[test]
fn busy_threads_and_queue_depth_show_a_saturated_pool() {
    let pool = Pool::builder("busy").threads(2).build().unwrap();
    let (release, held) = mpsc::channel::<()>();
    let held = Arc::new(std::sync::Mutex::new(held));
    let started = Arc::new(Barrier::new(3));
    let rt = Runtime::new();
    rt.block_on(async {
        let jobs: Vec<_> = (0..5)
            .map(|i| {
                let (h, s) = (held.clone(), started.clone());
                pool.offload(move || {
                    if i < 2 {
                        s.wait();
                    }
                    let _ = h.lock().unwrap().recv_timeout(WAIT);
                })
            })
            .collect();
        started.wait();
        let s = pool.stats();
        assert_eq!(s.busy_threads, 2);
        assert_eq!(s.queue_depth, 3);
        for _ in 0..5 {
            release.send(()).unwrap();
        }
        for j in jobs {
            j.await.unwrap();
        }
    });
    let s = pool.stats();
    assert_eq!((s.queue_depth, s.completed_total), (0, 5));
    // Busy threads is a gauge the workers update after waking the awaiting task.
    let deadline = Instant::now() + WAIT;
    while pool.stats().busy_threads > 0 {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn work_dropped_before_it_starts_leaves_the_queue_at_once() {
    // A bounded pool whose one thread is held, its queue filled, then every future dropped:
    // the queue is empty again at once (libuv's `uv_cancel`), not when the thread frees up.
    let (pool, release, started) = held_pool("dropped", Some(10));
    started.recv_timeout(WAIT).unwrap();
    let ran = Arc::new(AtomicUsize::new(0));
    let rt = Runtime::new();
    rt.block_on(async {
        let doomed: Vec<_> = (0..10)
            .map(|_| {
                let r = ran.clone();
                pool.offload(move || r.fetch_add(1, Ordering::SeqCst))
            })
            .collect();
        assert_eq!(pool.stats().queue_depth, 10);
        drop(doomed);
        let s = pool.stats();
        assert_eq!((s.queue_depth, s.cancelled_total), (0, 10));
        // The bound counts live jobs only: ten more fit, the eleventh does not.
        let next: Vec<_> = (0..10).map(|i| pool.offload(move || i)).collect();
        let err = pool.offload(|| 10).await.unwrap_err();
        assert!(
            matches!(err, OffloadError::QueueFull { limit: 10, .. }),
            "{err}"
        );
        assert_eq!(pool.stats().queue_depth, 10);
        release.send(()).unwrap();
        for (i, j) in next.into_iter().enumerate() {
            assert_eq!(j.await.unwrap(), i);
        }
    });
    assert_eq!(ran.load(Ordering::SeqCst), 0, "dropped work ran");
    let s = pool.stats();
    // Reaching the dropped jobs' places did not count them out (or as cancelled) again.
    assert_eq!(
        (s.queue_depth, s.cancelled_total, s.rejected_total),
        (0, 10, 1)
    );
    assert_eq!(s.completed_total, 11);
}

#[test]
fn futures_dropped_while_workers_take_their_jobs_count_each_job_once() {
    // Drops racing the workers: each job either ran or was cancelled, never both or neither,
    // and the queue count ends at zero (a job counted out twice would wrap it).
    let pool = Pool::builder("race").threads(2).build().unwrap();
    let ran = Arc::new(AtomicUsize::new(0));
    let rt = Runtime::new();
    let n = 20_000;
    rt.block_on(async {
        let mut kept = Vec::new();
        for i in 0..n {
            let r = ran.clone();
            let job = pool.offload(move || {
                r.fetch_add(1, Ordering::Relaxed);
            });
            if i % 2 == 0 {
                drop(job);
            } else {
                kept.push(job);
            }
        }
        for j in kept {
            j.await.unwrap();
        }
    });
    let deadline = Instant::now() + WAIT;
    loop {
        let s = pool.stats();
        let ran = ran.load(Ordering::SeqCst) as u64;
        if s.busy_threads == 0 && s.queue_depth == 0 {
            assert_eq!(s.cancelled_total + ran, n as u64, "{s:?}");
            assert_eq!(s.completed_total, ran);
            assert!(s.cancelled_total > 0);
            break;
        }
        assert!(s.queue_depth <= n as u64, "the count wrapped: {s:?}");
        assert!(Instant::now() < deadline, "{s:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn an_idle_gap_between_jobs_is_not_counted_as_run_time() {
    // Empty jobs one after another: the pool is idle between them (the loop awaits each one,
    // then submits the next), so their run time is a small part of the wall time.
    let pool = Pool::builder("gaps").threads(1).build().unwrap();
    let rt = Runtime::new();
    let start = Instant::now();
    rt.block_on(async {
        for _ in 0..2000 {
            pool.offload(|| ()).await.unwrap();
        }
    });
    let wall = start.elapsed().as_nanos() as u64;
    let s = pool.stats();
    assert_eq!(s.run.count, 2000);
    assert!(
        s.run.sum < wall / 2,
        "run time {} ns of {wall} ns wall: the idle gaps were counted",
        s.run.sum
    );
}

#[test]
fn built_pools_are_listed_under_their_names_while_they_live() {
    let rt = Runtime::new();
    let names = |rt: &Runtime| -> Vec<String> {
        rt.enter(snapshot)
            .pools
            .into_iter()
            .map(|p| p.pool)
            .collect()
    };
    let pool = Pool::builder("listed-a").threads(1).build().unwrap();
    rt.block_on(pool.offload(|| ())).unwrap();
    let s = rt.enter(snapshot);
    let listed = s
        .pools
        .iter()
        .find(|p| p.pool == "listed-a")
        .expect("listed");
    assert_eq!((listed.threads, listed.completed_total), (1, 1));
    let text = prometheus::render(&s);
    assert!(
        text.lines().any(
            |l| l.starts_with("nodus_pool_completed_total{") && l.contains("pool=\"listed-a\"")
        ),
        "{text}"
    );
    // A second live pool of that name, or one named like a process-wide pool, still works but
    // is not listed: a name is one series.
    let twin = Pool::builder("listed-a").threads(1).build().unwrap();
    let io = Pool::builder("io").threads(1).build().unwrap();
    assert_eq!(rt.block_on(twin.offload(|| 1)).unwrap(), 1);
    assert_eq!(rt.block_on(io.offload(|| 2)).unwrap(), 2);
    rt.block_on(offload_io(|| ())).unwrap();
    let all = names(&rt);
    for name in ["listed-a", "io"] {
        assert_eq!(all.iter().filter(|n| *n == name).count(), 1, "{all:?}");
    }
    // Gone with the pool; then the name is free again.
    drop((pool, twin));
    assert!(!names(&rt).contains(&"listed-a".to_owned()));
    let again = Pool::builder("listed-a").threads(1).build().unwrap();
    assert!(names(&rt).contains(&"listed-a".to_owned()));
    drop((again, io));
    // A name that cannot name a thread is refused, with why.
    let err = Pool::builder("a\0b").build().unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    assert!(err.to_string().contains("NUL"), "{err}");
}

/// A job whose result its task holds is no longer counted busy: the pool lowers its count before
/// it wakes the task (it used to after, so a snapshot right after an await could count it).
#[test]
fn a_job_whose_result_was_awaited_is_not_counted_busy() {
    let rt = Runtime::new();
    rt.block_on(async {
        let pool = Pool::builder("busy-count").threads(2).build().unwrap();
        for i in 0..300 {
            // A job long enough that the task sleeps on it and is woken by the pool's thread.
            pool.offload(|| std::thread::sleep(Duration::from_micros(200)))
                .await
                .unwrap();
            assert_eq!(pool.stats().busy_threads, 0, "after job {i}");
        }
    });
}
