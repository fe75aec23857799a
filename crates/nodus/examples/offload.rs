//! Seed 003's lesson as a program: don't block the event loop.
//!
//! A 10 ms interval ticks while a ~2 s CPU job (PBKDF2-HMAC-SHA512 with enough iterations) runs,
//! twice: first on the CPU pool (`crypto::pbkdf2`), then inline on the loop (`pbkdf2_sync`, Node's
//! `pbkdf2Sync`). Each run uses a fresh loop, so its timer-lateness histogram covers that run
//! only. Offloaded, the ticks stay on time; inline, the loop cannot fire a timer until the job
//! returns, the watchdog reports the stall on stderr while it is happening, and the slow poll is
//! logged when it ends.
//!
//! `cargo run --release -p nodus --example offload`

use std::time::{Duration, Instant};

use nodus::crypto::{self, Algorithm, MAX_PBKDF2_WORK};
use nodus::metrics::{self, StallReport};
use nodus::{Runtime, interval, sleep, spawn_named};

const PASSWORD: &[u8] = b"correct horse battery staple";
const SALT: &[u8] = b"nodus-offload-example";

/// Iterations that take about `target` here, measured on a small run.
fn calibrate(target: Duration) -> u32 {
    let probe = 200_000;
    crypto::pbkdf2_sync(PASSWORD, SALT, probe / 10, 64, Algorithm::Sha512).expect("warm-up");
    let start = Instant::now();
    crypto::pbkdf2_sync(PASSWORD, SALT, probe, 64, Algorithm::Sha512).expect("within limits");
    let per_iteration = start.elapsed().as_secs_f64() / f64::from(probe);
    ((target.as_secs_f64() / per_iteration) as u64).clamp(1, MAX_PBKDF2_WORK) as u32
}

struct Outcome {
    job: Duration,
    worst_lateness: Duration,
    ticks: u64,
    stalls: Vec<StallReport>,
}

/// Runs the job (inline or on the pool) while a 10 ms interval ticks.
fn run(iterations: u32, inline: bool) -> Outcome {
    let rt = Runtime::new();
    let (job, ticks) = rt.block_on(async move {
        let ticker = spawn_named("ticker", async {
            let mut every_10ms = interval(10);
            loop {
                every_10ms.tick().await;
            }
        });
        sleep(50).await;
        let name = if inline {
            "pbkdf2-inline"
        } else {
            "pbkdf2-on-pool"
        };
        let job = spawn_named(name, async move {
            let start = Instant::now();
            let key = if inline {
                crypto::pbkdf2_sync(PASSWORD, SALT, iterations, 64, Algorithm::Sha512)
            } else {
                crypto::pbkdf2(PASSWORD, SALT, iterations, 64, Algorithm::Sha512).await
            };
            assert_eq!(key.expect("within limits").len(), 64);
            start.elapsed()
        });
        let took = job.await.expect("the job does not panic");
        sleep(50).await;
        ticker.abort();
        let ticks = metrics::snapshot().loop_stats.timer_lateness.count;
        (took, ticks)
    });
    let snap = rt.enter(metrics::snapshot);
    Outcome {
        job,
        worst_lateness: Duration::from_nanos(snap.loop_stats.timer_lateness.max),
        ticks,
        stalls: snap.stalls,
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    let color = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(color)
        .with_target(false)
        .init();
    let iterations = calibrate(Duration::from_secs(2));
    println!("job: PBKDF2-HMAC-SHA512, {iterations} iterations (about 2 s here)");

    let pooled = run(iterations, false);
    println!(
        "on the CPU pool: job took {:.0} ms; the loop fired {} timers",
        ms(pooled.job),
        pooled.ticks
    );
    let inline = run(iterations, true);
    println!(
        "inline on the loop: job took {:.0} ms; the loop fired {} timers",
        ms(inline.job),
        inline.ticks
    );
    for s in &inline.stalls {
        println!(
            "watchdog stall report: task {:?} at {} blocked loop {} for {:.0} ms ({}{})",
            s.task_name,
            s.location,
            s.loop_id,
            s.elapsed_seconds * 1e3,
            s.class,
            if s.ongoing { ", ongoing" } else { "" }
        );
    }
    if inline.stalls.is_empty() {
        println!("watchdog stall report: none recorded (the watchdog is off or not built in)");
    }
    println!(
        "worst timer lateness, job on the CPU pool:  {:>8.1} ms",
        ms(pooled.worst_lateness)
    );
    println!(
        "worst timer lateness, job inline on the loop: {:>8.1} ms ({:.0}x worse)",
        ms(inline.worst_lateness),
        inline.worst_lateness.as_secs_f64() / pooled.worst_lateness.as_secs_f64().max(1e-6)
    );
}
