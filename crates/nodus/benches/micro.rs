//! nodus event-loop microbenchmarks: the same workloads as the peers `bench/node/micro.js` and
//! `bench/rust/src/bin/rt_micro.rs` (tokio), timed the same way, so `bench/run.sh` can put their
//! numbers side by side. Not a test: it runs only when asked (`harness = false`).
//!
//! Usage: `micro <bench> [n]` (or `cargo bench -p nodus --bench micro -- <bench> [n]`); one
//! benchmark per process, one JSON line on stdout.
//!   immediate   1M chained `set_immediate` (each callback queues the next): one loop turn each
//!               (Node `setImmediate` chain; tokio `yield_now` chain)
//!   immediate_io  the same with one idle pipe registered (unref'd), so that every turn calls
//!               epoll_wait as Node and tokio do (with no I/O source, nodus skips the syscall)
//!   yield       1M chained `yield_now().await` in one spawned task (tokio `yield`)
//!   nexttick    1M chained `next_tick` (Node `process.nextTick` chain)
//!   microtask   1M chained `queue_microtask` (Node `queueMicrotask` chain; Node `await`)
//!   spawn_join  spawn 1M `async move { i }`, then await every JoinHandle (tokio `spawn_join`)
//!   timers      1M `set_timeout(d, fire)`, d = 0..999 ms from the peers' xorshift sequence
//!
//! As in the peers, the clock starts after the runtime exists (and after the delays are made);
//! process start-up is not timed. Chains start in the main script (`Runtime::enter`) and stop in
//! their last callback, as Node's do. Peak RSS is `VmHWM`. `timers` also reports process CPU time
//! (all threads) per timer, from just before the first insert to the last callback, and peak
//! memory per timer: (VmHWM at the end − VmRSS just before the first insert) / n.

use std::cell::Cell;
use std::time::{Duration, Instant};

use nodus::io::AsyncFd;
use nodus::{Runtime, next_tick, queue_microtask, set_immediate, set_timeout, spawn, yield_now};

thread_local! {
    // Shared by every callback of a chain, like the one `step` closure of the Node peer.
    static LEFT: Cell<usize> = const { Cell::new(0) };
    static END: Cell<Option<Instant>> = const { Cell::new(None) };
    static END_CPU: Cell<u64> = const { Cell::new(0) };
}

/// A `/proc/self/status` field in kB (`VmHWM`, `VmRSS`).
fn status_kb(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// CPU time of the whole process (all threads), in ns: the sum of each thread's on-CPU time in
/// `/proc/self/task/*/schedstat` (the figure getrusage's user + system time is split from; read
/// from /proc rather than a vDSO clock so that the benchmark also runs under valgrind).
fn cpu_ns() -> u64 {
    let tasks = std::fs::read_dir("/proc/self/task").expect("/proc/self/task");
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// xorshift64*, identical to the peers, so every runtime gets the same delay set.
fn deadlines_ms(n: usize) -> Vec<u32> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..n)
        .map(|_| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            ((x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) % 1000) as u32
        })
        .collect()
}

fn emit(bench: &str, n: usize, total: Duration, extra: &str) {
    let ns = total.as_nanos() as f64;
    let features = if cfg!(feature = "measure") {
        "measure"
    } else {
        ""
    };
    println!(
        "{{\"impl\":\"nodus\",\"features\":\"{features}\",\"bench\":\"{bench}\",\"n\":{n},\
         \"total_ms\":{:.3},\"ns_per_op\":{:.2},\"ops_per_s\":{:.0},\"max_rss_kb\":{}{extra}}}",
        ns / 1e6,
        ns / n as f64,
        n as f64 / (ns / 1e9),
        status_kb("VmHWM:")
    );
}

/// Counts one link of a chain; true while the chain must go on. Records the end time at the last.
#[inline]
fn link() -> bool {
    let left = LEFT.get() - 1;
    LEFT.set(left);
    if left == 0 {
        END.set(Some(Instant::now()));
    }
    left > 0
}

fn immediate_step() {
    if link() {
        set_immediate(immediate_step);
    }
}

fn start_immediate(step: fn()) {
    set_immediate(step);
}

fn tick_step() {
    if link() {
        next_tick(tick_step);
    }
}

fn microtask_step() {
    if link() {
        queue_microtask(microtask_step);
    }
}

/// A chain of `n` callbacks started from the main script; the loop then runs until it is idle.
/// With `idle_fd`, an idle pipe is registered with the loop for the whole run.
fn chain(bench: &str, n: usize, start: fn(fn()), step: fn(), idle_fd: bool) {
    let rt = Runtime::new();
    let (reader, _writer) = std::io::pipe().expect("a pipe");
    LEFT.set(n);
    let (t0, fd) = rt.enter(|| {
        let fd = idle_fd.then(|| {
            let fd = AsyncFd::new(reader).expect("register the pipe");
            fd.unref();
            fd
        });
        let t0 = Instant::now();
        start(step);
        (t0, fd)
    });
    rt.run();
    let end = END.get().expect("the chain finished");
    rt.enter(|| drop(fd));
    emit(bench, n, end - t0, "");
}

fn bench_yield(n: usize) {
    let rt = Runtime::new();
    let total = rt.block_on(async move {
        spawn(async move {
            let t = Instant::now();
            for _ in 0..n {
                yield_now().await;
            }
            t.elapsed()
        })
        .await
        .unwrap()
    });
    emit("yield", n, total, "");
}

fn bench_spawn_join(n: usize) {
    let rt = Runtime::new();
    let total = rt.block_on(async move {
        let t = Instant::now();
        let mut hs = Vec::with_capacity(n);
        for i in 0..n {
            hs.push(spawn(async move { i }));
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

fn fire() {
    if !link() {
        END_CPU.set(cpu_ns());
    }
}

fn bench_timers(n: usize) {
    let dl = deadlines_ms(n);
    let max_dl = *dl.iter().max().unwrap();
    let rt = Runtime::new();
    LEFT.set(n);
    let rss0 = status_kb("VmRSS:");
    let cpu0 = cpu_ns();
    let t0 = Instant::now();
    let insert = rt.enter(|| {
        for &d in &dl {
            set_timeout(d, fire);
        }
        t0.elapsed()
    });
    rt.run();
    let total = END.get().expect("every timer fired") - t0;
    let cpu = END_CPU.get() - cpu0;
    let hwm = status_kb("VmHWM:");
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let extra = format!(
        ",\"insert_ms\":{:.3},\"insert_ns_per_op\":{:.2},\"fire_all_ms\":{:.3},\
         \"max_deadline_ms\":{max_dl},\"lag_ms\":{:.3},\"cpu_ns_per_timer\":{:.2},\
         \"rss_before_kb\":{rss0},\"bytes_per_timer\":{:.1}",
        ms(insert),
        insert.as_nanos() as f64 / n as f64,
        ms(total),
        ms(total) - max_dl as f64,
        cpu as f64 / n as f64,
        hwm.saturating_sub(rss0) as f64 * 1024.0 / n as f64,
    );
    emit("timers", n, total, &extra);
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let bench = args.first().map(String::as_str).unwrap_or("immediate");
    let n: usize = args
        .get(1)
        .map_or(1_000_000, |s| s.parse().expect("n is a number"));
    match bench {
        "immediate" => chain(bench, n, start_immediate, immediate_step, false),
        "immediate_io" => chain(bench, n, start_immediate, immediate_step, true),
        "nexttick" => chain(bench, n, next_tick, tick_step, false),
        "microtask" => chain(bench, n, queue_microtask, microtask_step, false),
        "yield" => bench_yield(n),
        "spawn_join" => bench_spawn_join(n),
        "timers" => bench_timers(n),
        other => {
            eprintln!(
                "unknown bench {other}; one of immediate immediate_io yield nexttick microtask spawn_join timers"
            );
            std::process::exit(2);
        }
    }
}
