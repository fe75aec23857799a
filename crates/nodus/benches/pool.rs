//! nodus worker-pool benchmarks: the same workloads as the peers `bench/node/pool.js` (Node,
//! libuv threadpool) and `bench/rust/src/bin/pool_micro.rs` (tokio `spawn_blocking`), timed the
//! same way. Not a test: it runs only when asked (`harness = false`).
//!
//! Usage: `pool <bench> [n]` (or `cargo bench -p nodus --bench pool -- <bench> [n]`); one
//! benchmark per process, one JSON line on stdout.
//!   pool_trivial  100k round trips of a trivial job on the I/O pool, 64 in flight
//!   stat          100k `fs::metadata("/etc/hostname")`, 64 in flight (Node `fs.stat`)
//!   pbkdf2        100k `crypto::pbkdf2("password", "salt", 1, 32, sha256)`, 64 in flight
//!   read_1g       stream a 1 GiB file (sparse, made with `set_len`, read once untimed to fill
//!                 the page cache) through `File`'s `AsyncRead` with a 64 KiB buffer (Node
//!                 `createReadStream`); n = MiB, MB/s
//!   gzip          gzip n MiB (default 64) of generated text in 64 KiB stream writes
//!                 (Node `zlib.createGzip`), MB/s of input
//!
//! "64 in flight" is 64 tasks, each awaiting its operations one after another (Node: 64
//! callback chains). The clock starts once the runtime exists; pools are started before it.

use std::rc::Rc;
use std::time::{Duration, Instant};

use futures_util::AsyncReadExt;
use nodus::crypto::{self, Algorithm};
use nodus::fs::{self, File};
use nodus::zlib::{Compressor, Format};
use nodus::{Runtime, pool, spawn};

const CONC: usize = 64;
const STAT_PATH: &str = "/etc/hostname";

/// A `/proc/self/status` field in kB (`VmHWM`).
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

fn emit(bench: &str, n: usize, total: Duration, extra: &str) {
    let ns = total.as_nanos() as f64;
    let features = if cfg!(feature = "measure") {
        "measure"
    } else {
        ""
    };
    println!(
        "{{\"impl\":\"nodus\",\"features\":\"{features}\",\"bench\":\"{bench}\",\"n\":{n},\
         \"total_ms\":{:.3},\"ns_per_op\":{:.2},\"ops_per_s\":{:.0},\"max_rss_kb\":{},\
         \"io_threads\":{},\"cpu_threads\":{}{extra}}}",
        ns / 1e6,
        ns / n as f64,
        n as f64 / (ns / 1e9),
        status_kb("VmHWM:"),
        pool::io().threads(),
        pool::cpu().threads(),
    );
}

/// `n` operations made by `op`, `CONC` tasks each awaiting its share one after another.
fn in_flight<F, Fut>(bench: &str, n: usize, op: F)
where
    F: Fn() -> Fut + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    let rt = Runtime::new();
    let op = Rc::new(op);
    let start = Instant::now();
    rt.block_on(async {
        let tasks: Vec<_> = (0..CONC)
            .map(|t| {
                let op = op.clone();
                let share = n / CONC + usize::from(t < n % CONC);
                spawn(async move {
                    for _ in 0..share {
                        op().await;
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.expect("benchmark task");
        }
    });
    emit(
        bench,
        n,
        start.elapsed(),
        &format!(",\"concurrency\":{CONC}"),
    );
}

fn read_1g(mib: usize) {
    let path = std::env::temp_dir().join(format!("nodus-bench-read-{}", std::process::id()));
    let bytes = (mib as u64) << 20;
    std::fs::File::create(&path)
        .and_then(|f| f.set_len(bytes))
        .expect("create the sparse file");
    // Read once, untimed, so that the timed read measures the pool and the page cache rather
    // than the kernel zeroing fresh pages for the holes (which varies several-fold run to run).
    std::io::copy(
        &mut std::fs::File::open(&path).expect("open"),
        &mut std::io::sink(),
    )
    .expect("warm-up read");
    let rt = Runtime::new();
    let start = Instant::now();
    let total = rt.block_on(async {
        let mut f = File::open(&path).await.expect("open");
        let mut buf = vec![0u8; fs::CHUNK];
        let mut total = 0u64;
        loop {
            let n = f.read(&mut buf).await.expect("read");
            if n == 0 {
                break total;
            }
            total += n as u64;
        }
    });
    let took = start.elapsed();
    let _ = std::fs::remove_file(&path);
    assert_eq!(total, bytes);
    let mb_s = bytes as f64 / 1e6 / took.as_secs_f64();
    emit(
        "read_1g",
        (bytes / fs::CHUNK as u64) as usize,
        took,
        &format!(",\"bytes\":{bytes},\"mb_per_s\":{mb_s:.1}"),
    );
}

/// Repetitive but not trivial text (like a log file): the same xorshift32 word sequence as the
/// Node peer's.
fn text(len: usize) -> Vec<u8> {
    let words = [
        "event ", "loop ", "pool ", "worker ", "nodus ", "libuv ", "\n",
    ];
    let mut x: u32 = 0x9E37_79B9;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        out.extend_from_slice(words[(x % words.len() as u32) as usize].as_bytes());
    }
    out.truncate(len);
    out
}

fn gzip(mib: usize) {
    let input = text(mib << 20);
    let rt = Runtime::new();
    let start = Instant::now();
    let out_len = rt.block_on(async {
        let mut c = Compressor::new(Format::Gzip, 6).expect("level");
        let mut out = 0;
        for chunk in input.chunks(fs::CHUNK) {
            out += c.write(chunk).await.expect("gzip").len();
        }
        out + c.finish().await.expect("gzip").len()
    });
    let took = start.elapsed();
    let mb_s = input.len() as f64 / 1e6 / took.as_secs_f64();
    emit(
        "gzip",
        input.len() / fs::CHUNK,
        took,
        &format!(
            ",\"bytes\":{},\"out_bytes\":{out_len},\"mb_per_s\":{mb_s:.1}",
            input.len()
        ),
    );
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let bench = args.first().map(String::as_str).unwrap_or("pool_trivial");
    let n: Option<usize> = args.get(1).map(|s| s.parse().expect("n is a number"));
    // Start both pools before the clock, as libuv's is started before Node's first request.
    let _ = (pool::io(), pool::cpu());
    match bench {
        "pool_trivial" => in_flight(bench, n.unwrap_or(100_000), || async {
            nodus::offload_io(|| std::hint::black_box(1u64))
                .await
                .expect("trivial job");
        }),
        "stat" => in_flight(bench, n.unwrap_or(100_000), || async {
            fs::metadata(STAT_PATH).await.expect("stat");
        }),
        "pbkdf2" => in_flight(bench, n.unwrap_or(100_000), || async {
            crypto::pbkdf2(b"password", b"salt", 1, 32, Algorithm::Sha256)
                .await
                .expect("pbkdf2");
        }),
        "read_1g" => read_1g(n.unwrap_or(1024)),
        "gzip" => gzip(n.unwrap_or(64)),
        other => {
            eprintln!("unknown bench {other}; one of pool_trivial stat pbkdf2 read_1g gzip");
            std::process::exit(2);
        }
    }
}
