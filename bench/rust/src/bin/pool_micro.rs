//! Worker-pool benchmarks on a tokio current_thread runtime with `spawn_blocking` capped at 4
//! threads (= libuv's default UV_THREADPOOL_SIZE and nodus's I/O pool): the tokio peer of
//! nodus's `crates/nodus/benches/pool.rs` and `bench/node/pool.js`.
//! Each invocation runs ONE benchmark and prints one JSON line.
//! Usage: pool_micro <bench> [n]
//!   pool_trivial  100k spawn_blocking(|| trivial) round trips, 64 in flight
//!   stat          100k spawn_blocking(|| std::fs::metadata("/etc/hostname")), 64 in flight
//!   read_1g       stream a 1 GiB sparse file (read once untimed first, to fill the page
//!                 cache), 64 KiB per spawn_blocking read, one in flight
//!                 (what tokio::fs::File does; this crate builds tokio without its `fs`
//!                 feature); n = MiB
//! (pbkdf2 and gzip have no tokio peer here: tokio has no crypto or zlib of its own.)
use std::io::Read;
use std::sync::Arc;
use std::time::{Duration, Instant};

const STAT_PATH: &str = "/etc/hostname";
const CONC: usize = 64;
const THREADS: usize = 4;

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

fn emit(bench: &str, n: usize, total: Duration, extra: &str) {
    let ns = total.as_nanos() as f64;
    println!(
        "{{\"impl\":\"tokio-current_thread\",\"bench\":\"{bench}\",\"n\":{n},\"total_ms\":{:.3},\"ns_per_op\":{:.2},\"ops_per_s\":{:.0},\"max_rss_kb\":{},\"max_blocking_threads\":{THREADS}{extra}}}",
        ns / 1e6,
        ns / n as f64,
        n as f64 / (ns / 1e9),
        max_rss_kb()
    );
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(THREADS)
        .build()
        .unwrap()
}

/// `n` round trips, `CONC` tasks each awaiting its share one after another (as nodus and Node).
fn in_flight(bench: &str, n: usize, stat: bool) {
    let rt = rt();
    let total = rt.block_on(async move {
        let t = Instant::now();
        let tasks: Vec<_> = (0..CONC)
            .map(|i| {
                let share = n / CONC + usize::from(i < n % CONC);
                tokio::spawn(async move {
                    for j in 0..share {
                        let r = if stat {
                            tokio::task::spawn_blocking(|| {
                                std::fs::metadata(STAT_PATH).map(|m| m.len()).unwrap_or(0)
                            })
                            .await
                        } else {
                            tokio::task::spawn_blocking(move || std::hint::black_box(j as u64))
                                .await
                        };
                        std::hint::black_box(r.unwrap());
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        t.elapsed()
    });
    emit(bench, n, total, &format!(",\"concurrency\":{CONC}"));
}

fn read_1g(mib: u64) {
    const CHUNK: usize = 64 * 1024;
    let path = std::env::temp_dir().join(format!("tokio-bench-read-{}", std::process::id()));
    let bytes = mib << 20;
    std::fs::File::create(&path)
        .unwrap()
        .set_len(bytes)
        .unwrap();
    // Untimed warm-up read: the timed one measures the pool and the page cache (as the peers).
    std::io::copy(
        &mut std::fs::File::open(&path).unwrap(),
        &mut std::io::sink(),
    )
    .unwrap();
    let rt = rt();
    let p = path.clone();
    let (total, took) = rt.block_on(async move {
        let t = Instant::now();
        let file = Arc::new(
            tokio::task::spawn_blocking(move || std::fs::File::open(p))
                .await
                .unwrap()
                .unwrap(),
        );
        let mut buf = vec![0u8; CHUNK];
        let mut total = 0u64;
        loop {
            let f = file.clone();
            let (b, n) = tokio::task::spawn_blocking(move || {
                let n = (&*f).read(&mut buf).unwrap();
                (buf, n)
            })
            .await
            .unwrap();
            buf = b;
            if n == 0 {
                break;
            }
            total += n as u64;
        }
        (total, t.elapsed())
    });
    let _ = std::fs::remove_file(&path);
    assert_eq!(total, bytes);
    let mb_s = bytes as f64 / 1e6 / took.as_secs_f64();
    emit(
        "read_1g",
        (bytes / CHUNK as u64) as usize,
        took,
        &format!(",\"bytes\":{bytes},\"mb_per_s\":{mb_s:.1}"),
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let bench = args.get(1).map(String::as_str).unwrap_or("pool_trivial");
    let n: Option<usize> = args.get(2).map(|s| s.parse().unwrap());
    match bench {
        "pool_trivial" => in_flight(bench, n.unwrap_or(100_000), false),
        "stat" => in_flight(bench, n.unwrap_or(100_000), true),
        "read_1g" => read_1g(n.unwrap_or(1024) as u64),
        other => {
            eprintln!("unknown bench {other}; one of pool_trivial stat read_1g");
            std::process::exit(2);
        }
    }
}
