//! A task named `hog` busy-loops about 600 ms on the loop while another task wants to tick every
//! 10 ms. The watchdog names `hog` and this file's spawn line on stderr *while* it still runs;
//! then the example prints `hog finished` and the loop's measurements as Prometheus text.
//!
//! `cargo run --release -p nodus --example stall`

use std::time::{Duration, Instant};

use nodus::{Runtime, interval, metrics, sleep, spawn_named};

fn main() {
    let color = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(color)
        .with_target(false)
        .init();
    let rt = Runtime::new();
    rt.block_on(async {
        let ticker = spawn_named("ticker", async {
            let mut every_10ms = interval(10);
            loop {
                every_10ms.tick().await;
            }
        });
        sleep(20).await;
        let hog = spawn_named("hog", async {
            let end = Instant::now() + Duration::from_millis(600);
            while Instant::now() < end {
                std::hint::spin_loop();
            }
        });
        hog.await.expect("the hog task does not panic");
        println!("hog finished");
        sleep(20).await;
        ticker.abort();
    });
    print!(
        "{}",
        metrics::prometheus::render(&rt.enter(metrics::snapshot))
    );
}
