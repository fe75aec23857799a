//! The cooperative budget: a task reading a source that is always ready cannot starve a timer,
//! and neither can the `block_on` future.
#![cfg(feature = "measure")]

use std::cell::Cell;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::rc::Rc;
use std::time::{Duration, Instant};

use nodus::io::AsyncFd;
use nodus::io::consume_budget;
use nodus::{Runtime, set_timeout, spawn_named};

#[test]
fn an_always_ready_reader_does_not_starve_a_due_timer() {
    let (reader, mut writer) = UnixStream::pair().unwrap();
    // Keep the socket readable for the whole test.
    writer.set_nonblocking(false).unwrap();
    // Readable from the start whenever the feeder thread gets a CPU (a loaded machine may run it
    // late): far more bytes than the reads the assertion below asks for.
    writer.write_all(&[7u8; 64 * 1024]).unwrap();
    let feeder = std::thread::spawn(move || {
        let chunk = [7u8; 4096];
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline && writer.write_all(&chunk).is_ok() {}
    });
    let rt = Runtime::new();
    let lateness = rt.block_on(async move {
        let fd = AsyncFd::new(reader).unwrap();
        let stop = Rc::new(Cell::new(false));
        let s = stop.clone();
        let reads = spawn_named("always-ready-reader", async move {
            let mut n = 0u64;
            let mut byte = [0u8; 1];
            // Bounded, in case the budget did not work: the test then fails instead of hanging.
            while !s.get() && n < 20_000_000 {
                fd.read_with(|mut sock| sock.read(&mut byte)).await.unwrap();
                n += 1;
            }
            n
        });
        let start = Instant::now();
        let fired = Rc::new(Cell::new(None));
        let f = fired.clone();
        set_timeout(10, move || {
            f.set(Some(start.elapsed()));
            stop.set(true);
        });
        let n = reads.await.unwrap();
        assert!(n > 128, "the reader made progress: {n} reads");
        let snap = nodus::metrics::snapshot();
        let class = snap
            .task_classes
            .iter()
            .find(|c| c.name == "always-ready-reader")
            .unwrap();
        assert!(
            class.forced_yields > 0,
            "forced yields counted per task name: {class:?}"
        );
        assert!(snap.tasks.forced_yields_total >= class.forced_yields);
        // Measured from after the loop clock was read: the timer may look a little early.
        fired
            .get()
            .expect("the timer fired")
            .saturating_sub(Duration::from_millis(10))
    });
    // Generous for a loaded machine, and still far below starvation: a starved timer would wait
    // for all 20M reads (many seconds). The lateness itself is measured in benchmarks.
    assert!(
        lateness <= Duration::from_secs(1),
        "a due 10 ms timer was delayed by {lateness:?}"
    );
    drop(rt); // closes the reader: the feeder's write fails and it exits
    feeder.join().unwrap();
}

/// The `block_on` future looping on `consume_budget` (always-ready work, as its doc says to
/// call it) is budgeted like a task: it yields to the loop, so a due 10 ms timer runs. Before,
/// its budget never ran out and the loop never came round (no `epoll_wait` at all).
#[test]
fn the_block_on_future_is_budgeted_too() {
    let rt = Runtime::new();
    let (fired, turns) = rt.block_on(async {
        let fired = Rc::new(Cell::new(false));
        let f = fired.clone();
        set_timeout(10, move || f.set(true));
        // The hang guard is the wall clock, not a timer: a starved timer is what is tested.
        let give_up = Instant::now() + Duration::from_secs(10);
        let mut turns = 0u64;
        while !fired.get() && Instant::now() < give_up {
            consume_budget().await;
            turns += 1;
        }
        (fired.get(), turns)
    });
    assert!(
        fired,
        "the timer never ran while block_on's future looped ({turns} turns)"
    );
    let snap = rt.enter(nodus::metrics::snapshot);
    let main = snap.task_classes.iter().find(|c| c.name == "main").unwrap();
    assert!(
        main.forced_yields > 0,
        "the main future's forced yields are counted under `main`: {main:?}"
    );
}
