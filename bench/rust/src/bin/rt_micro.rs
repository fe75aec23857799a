//! Event-loop microbenchmarks on a tokio current_thread runtime (a peer program of nodus's
//! bench/run.sh, copied from the project's baseline anchors; added here: `rss_before_kb` in the
//! timer benchmarks).
//! Each invocation runs ONE benchmark and prints one JSON line.
//! Usage: rt_micro <bench> [n]
//!   yield            1M chained tokio::task::yield_now() in one spawned task
//!   spawn_join       spawn 1M empty tasks, then await every JoinHandle
//!   spawn_chain      1M sequential `tokio::spawn(async {}).await`
//!   timers_spawn     1M spawned tasks, each `sleep(rand 0..1000 ms).await`
//!   timers_fu        1M `sleep(rand 0..1000 ms)` futures in one FuturesUnordered (no spawn)
//!                    (like setTimeout, each deadline is relative to when the Sleep is created)
//!   blocking_trivial 100k spawn_blocking(|| trivial) round trips, 64 in flight
//!   blocking_stat    100k spawn_blocking(|| std::fs::metadata(..)), 64 in flight
//!   blocking_trivial_4 / blocking_stat_4: same with max_blocking_threads(4)
//!                    (= libuv's default UV_THREADPOOL_SIZE)
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use futures_util::stream::{FuturesUnordered, StreamExt};

const STAT_PATH: &str = "/etc/hostname";

fn cpu_ns() -> u64 {
    // user+sys CPU time of the whole process (all threads)
    // SAFETY: `rusage` is a plain C struct of integers, for which all-zero bytes are a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable `rusage` for the duration of the call.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1_000;
    us(ru.ru_utime) + us(ru.ru_stime)
}

/// Peak RSS (VmHWM) of this process image. (getrusage's ru_maxrss is not used: on
/// Linux it keeps the pre-exec high-water mark of the forking parent.)
fn max_rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

/// Current RSS (VmRSS), read just before the timers are created.
fn rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

/// Deterministic xorshift64* so the deadline set is the same every run.
fn deadlines_ms(n: usize) -> Vec<u64> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..n)
        .map(|_| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) % 1000
        })
        .collect()
}

fn rt(max_blocking: Option<usize>) -> tokio::runtime::Runtime {
    let mut b = tokio::runtime::Builder::new_current_thread();
    b.enable_all();
    if let Some(m) = max_blocking {
        b.max_blocking_threads(m);
    }
    b.build().unwrap()
}

fn emit(bench: &str, n: usize, total: Duration, extra: &str) {
    let ns = total.as_nanos() as f64;
    println!(
        "{{\"impl\":\"tokio-current_thread\",\"bench\":\"{bench}\",\"n\":{n},\"total_ms\":{:.3},\"ns_per_op\":{:.2},\"ops_per_s\":{:.0},\"max_rss_kb\":{}{extra}}}",
        ns / 1e6,
        ns / n as f64,
        n as f64 / (ns / 1e9),
        max_rss_kb()
    );
}

fn bench_yield(n: usize) {
    let rt = rt(None);
    let total = rt.block_on(async move {
        tokio::spawn(async move {
            let t = Instant::now();
            for _ in 0..n {
                tokio::task::yield_now().await;
            }
            t.elapsed()
        })
        .await
        .unwrap()
    });
    emit("yield", n, total, "");
}

fn bench_spawn_join(n: usize) {
    let rt = rt(None);
    let total = rt.block_on(async move {
        let t = Instant::now();
        let mut hs = Vec::with_capacity(n);
        for i in 0..n {
            hs.push(tokio::spawn(async move { i }));
        }
        let mut sum = 0usize;
        for h in hs {
            sum = sum.wrapping_add(h.await.unwrap());
        }
        std::hint::black_box(sum);
        t.elapsed()
    });
    emit("spawn_join", n, total, "");
}

fn bench_spawn_chain(n: usize) {
    let rt = rt(None);
    let total = rt.block_on(async move {
        let t = Instant::now();
        let mut sum = 0usize;
        for i in 0..n {
            sum = sum.wrapping_add(tokio::spawn(async move { i }).await.unwrap());
        }
        std::hint::black_box(sum);
        t.elapsed()
    });
    emit("spawn_chain", n, total, "");
}

/// insert_ms: the synchronous scheduling loop; registered_ms: until every timer is
/// registered in the wheel (tokio registers a Sleep on its first poll);
/// fire_all_ms: start -> last timer fired; lag_ms = fire_all_ms - largest deadline;
/// cpu_ns_per_timer: process CPU (user+sys) for the whole run / n.
fn timers_extra(n: usize, insert: Duration, registered: Duration, total: Duration, cpu_total_ns: u64, max_dl: u64, rss0: u64) -> String {
    format!(
        ",\"insert_ms\":{:.3},\"insert_ns_per_op\":{:.2},\"registered_ms\":{:.3},\"fire_all_ms\":{:.3},\"max_deadline_ms\":{},\"lag_ms\":{:.3},\"cpu_ns_per_timer\":{:.2},\"rss_before_kb\":{}",
        insert.as_secs_f64() * 1e3,
        insert.as_nanos() as f64 / n as f64,
        registered.as_secs_f64() * 1e3,
        total.as_secs_f64() * 1e3,
        max_dl,
        total.as_secs_f64() * 1e3 - max_dl as f64,
        cpu_total_ns as f64 / n as f64,
        rss0
    )
}

fn bench_timers_spawn(n: usize) {
    let dl = deadlines_ms(n);
    let max_dl = *dl.iter().max().unwrap();
    let rt = rt(None);
    let rss0 = rss_kb();
    let cpu0 = cpu_ns();
    let (insert, registered, total) = rt.block_on(async move {
        let left = Arc::new(AtomicUsize::new(n));
        let done = Arc::new(tokio::sync::Notify::new());
        let wall0 = Instant::now();
        for &ms in &dl {
            let left = left.clone();
            let done = done.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                if left.fetch_sub(1, Ordering::Relaxed) == 1 {
                    done.notify_one();
                }
            });
        }
        let insert = wall0.elapsed();
        // Tasks run FIFO on current_thread: this marker is first polled only after
        // every timer task has been polled once (i.e. has registered its timer).
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let _ = tx.send(Instant::now());
        });
        let registered = rx.await.unwrap() - wall0;
        done.notified().await;
        (insert, registered, wall0.elapsed())
    });
    let cpu = cpu_ns() - cpu0;
    emit("timers_spawn", n, total, &timers_extra(n, insert, registered, total, cpu, max_dl, rss0));
}

fn bench_timers_fu(n: usize) {
    let dl = deadlines_ms(n);
    let max_dl = *dl.iter().max().unwrap();
    let rt = rt(None);
    let rss0 = rss_kb();
    let cpu0 = cpu_ns();
    let (insert, registered, total) = rt.block_on(tokio::task::unconstrained(async move {
        let wall0 = Instant::now();
        let mut fu: FuturesUnordered<Pin<Box<tokio::time::Sleep>>> = FuturesUnordered::new();
        for &ms in &dl {
            fu.push(Box::pin(tokio::time::sleep(Duration::from_millis(ms))));
        }
        let insert = wall0.elapsed();
        // First sweep: poll every future once so each registers its timer.
        let mut fired = 0usize;
        std::future::poll_fn(|cx| {
            loop {
                match fu.poll_next_unpin(cx) {
                    Poll::Ready(Some(())) => fired += 1,
                    _ => break,
                }
            }
            Poll::Ready(())
        })
        .await;
        let registered = wall0.elapsed();
        while fu.next().await.is_some() {
            fired += 1;
        }
        assert_eq!(fired, n);
        (insert, registered, wall0.elapsed())
    }));
    let cpu = cpu_ns() - cpu0;
    emit("timers_fu", n, total, &timers_extra(n, insert, registered, total, cpu, max_dl, rss0));
}

fn bench_blocking(name: &str, n: usize, stat: bool, max_blocking: Option<usize>) {
    const CONC: usize = 64;
    let rt = rt(max_blocking);
    let total = rt.block_on(async move {
        let t = Instant::now();
        let mut started = 0usize;
        let mut finished = 0usize;
        let mut inflight: FuturesUnordered<tokio::task::JoinHandle<u64>> = FuturesUnordered::new();
        let spawn_one = |i: usize| {
            if stat {
                tokio::task::spawn_blocking(move || {
                    std::fs::metadata(STAT_PATH).map(|m| m.len()).unwrap_or(0) + i as u64
                })
            } else {
                tokio::task::spawn_blocking(move || std::hint::black_box(i as u64))
            }
        };
        while started < CONC.min(n) {
            inflight.push(spawn_one(started));
            started += 1;
        }
        while let Some(r) = inflight.next().await {
            std::hint::black_box(r.unwrap());
            finished += 1;
            if started < n {
                inflight.push(spawn_one(started));
                started += 1;
            }
        }
        assert_eq!(finished, n);
        t.elapsed()
    });
    let extra = format!(
        ",\"concurrency\":64,\"max_blocking_threads\":{}",
        max_blocking.map(|m| m.to_string()).unwrap_or_else(|| "512".into())
    );
    emit(name, n, total, &extra);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let bench = args.get(1).map(String::as_str).unwrap_or("yield");
    let n_arg: Option<usize> = args.get(2).map(|s| s.parse().unwrap());
    let m = n_arg.unwrap_or(1_000_000);
    let k = n_arg.unwrap_or(100_000);
    match bench {
        "yield" => bench_yield(m),
        "spawn_join" => bench_spawn_join(m),
        "spawn_chain" => bench_spawn_chain(m),
        "timers_spawn" => bench_timers_spawn(m),
        "timers_fu" => bench_timers_fu(m),
        "blocking_trivial" => bench_blocking(bench, k, false, None),
        "blocking_stat" => bench_blocking(bench, k, true, None),
        "blocking_trivial_4" => bench_blocking(bench, k, false, Some(4)),
        "blocking_stat_4" => bench_blocking(bench, k, true, Some(4)),
        other => {
            eprintln!("unknown bench {other}");
            std::process::exit(2);
        }
    }
}
