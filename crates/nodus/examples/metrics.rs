//! A small mixed workload (timers, an interval, immediates, next-ticks, tasks that yield and
//! sleep), then the loop's measurements as Prometheus text on stdout.
//!
//! `cargo run --release -p nodus --example metrics`

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use nodus::{
    Runtime, metrics, next_tick, set_immediate, set_interval, set_timeout, sleep, spawn_named,
    yield_now,
};

fn main() {
    let rt = Runtime::new();
    rt.block_on(async {
        let ticks = Rc::new(Cell::new(0));
        let t = ticks.clone();
        let every_5ms = set_interval(5, move || t.set(t.get() + 1));
        for i in 0..50 {
            set_timeout(i % 20, move || {
                next_tick(move || {
                    std::hint::black_box(i);
                })
            });
            set_immediate(move || {
                std::hint::black_box(i);
            });
        }
        let mut workers = Vec::new();
        for w in 0..4 {
            workers.push(spawn_named("worker", async move {
                for round in 0..20 {
                    // A little CPU work, then let others run.
                    let end = Instant::now() + Duration::from_micros(200);
                    while Instant::now() < end {}
                    if round % 5 == 4 {
                        sleep(2 + w).await;
                    } else {
                        yield_now().await;
                    }
                }
            }));
        }
        for w in workers {
            w.await.expect("workers do not panic");
        }
        sleep(30).await;
        every_5ms.clear();
        eprintln!("interval ticked {} times", ticks.get());
    });
    print!(
        "{}",
        metrics::prometheus::render(&rt.enter(metrics::snapshot))
    );
}
