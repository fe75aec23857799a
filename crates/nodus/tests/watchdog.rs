//! The watchdog reports a task while it is still blocking the loop, three ways.
#![cfg(feature = "measure")]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nodus::watchdog::{StallReport, recent_stalls_for};
use nodus::{Runtime, next_tick, queue_microtask, spawn_named};

const THRESHOLD: Duration = Duration::from_millis(50);

/// The watchdog is process-wide: these tests pin threads and spin, so they run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// Runs `block` inside a task named `name` on a fresh loop while another thread watches the
/// stall reports. Returns the first report and whether the block was still running when seen.
fn observe(name: &'static str, block: impl FnOnce() + 'static) -> (StallReport, bool) {
    observe_run(block, move |rt, block| {
        rt.block_on(async move { spawn_named(name, async move { block() }).await.unwrap() })
    })
}

/// Like `observe`, but `run` is given the loop and `block` (flagged while it runs) to run in it:
/// in a task, a closure, ...
fn observe_run(
    block: impl FnOnce() + 'static,
    run: impl FnOnce(&Runtime, Box<dyn FnOnce()>),
) -> (StallReport, bool) {
    let rt = Runtime::builder()
        .stall_threshold(THRESHOLD)
        .build()
        .unwrap();
    let loop_id = rt.id();
    let blocking = Arc::new(AtomicBool::new(false));
    let seen: Arc<Mutex<Option<(StallReport, bool)>>> = Arc::default();
    let (b, s) = (blocking.clone(), seen.clone());
    let observer = std::thread::spawn(move || {
        let give_up = Instant::now() + Duration::from_secs(10);
        while Instant::now() < give_up {
            if let Some(r) = recent_stalls_for(loop_id).into_iter().next() {
                *s.lock().unwrap() = Some((r, b.load(Ordering::Acquire)));
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    });
    let b = blocking.clone();
    run(
        &rt,
        Box::new(move || {
            b.store(true, Ordering::Release);
            block();
            b.store(false, Ordering::Release);
        }),
    );
    observer.join().unwrap();
    seen.lock().unwrap().take().expect("a stall report")
}

/// Checks the report names the task and its spawn site and came while the task still blocked.
fn assert_named_while_blocking(r: &StallReport, name: &str, still_blocking: bool) {
    assert!(
        still_blocking,
        "the report came while the task was still blocking: {r:?}"
    );
    assert_eq!(r.task_name, name);
    assert!(
        r.location.contains("tests/watchdog.rs:"),
        "spawn site: {}",
        r.location
    );
}

/// Runs `attempt` up to three times and checks that the first report came within threshold +
/// 10 ms in at least one: a shared CI machine can delay any one thread by tens of milliseconds,
/// and the watchdog's bound is about the watchdog, not about the machine's load that moment.
fn within_bound_in_one_of_three(mut attempt: impl FnMut() -> StallReport) -> StallReport {
    let limit = THRESHOLD + Duration::from_millis(10);
    let mut latencies = Vec::new();
    for _ in 0..3 {
        let r = attempt();
        let after = Duration::from_secs_f64(r.detected_after_seconds);
        if after <= limit {
            return r;
        }
        latencies.push(after);
    }
    panic!("first reports came after {latencies:?} (threshold {THRESHOLD:?}, bound {limit:?})");
}

fn spin(d: Duration) {
    let end = Instant::now() + d;
    while Instant::now() < end {
        std::hint::spin_loop();
    }
}

#[test]
fn a_busy_loop_is_reported_on_cpu() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let r = within_bound_in_one_of_three(|| {
        let (r, still) = observe("busy-loop", || spin(Duration::from_millis(400)));
        assert_named_while_blocking(&r, "busy-loop", still);
        r
    });
    // A loaded machine may make the spinner wait for a CPU, but it is never "in a syscall".
    assert!(r.class == "on-cpu" || r.class == "waiting-for-cpu", "{r:?}");
    assert!(r.on_cpu_share + r.waiting_for_cpu_share > 0.5, "{r:?}");
}

#[test]
fn a_blocking_sleep_is_reported_in_a_syscall() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let r = within_bound_in_one_of_three(|| {
        let (r, still) = observe("sleeper", || std::thread::sleep(Duration::from_millis(400)));
        assert_named_while_blocking(&r, "sleeper", still);
        r
    });
    assert_eq!(r.class, "blocked-in-syscall", "{r:?}");
}

#[test]
fn a_busy_loop_sharing_its_cpu_is_reported_waiting_for_a_cpu() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let cpu = {
        let set = rustix::thread::sched_getaffinity(None).unwrap();
        (0..rustix::thread::CpuSet::MAX_CPU)
            .find(|&c| set.is_set(c))
            .unwrap()
    };
    let mut one = rustix::thread::CpuSet::new();
    one.set(cpu);
    let stop = Arc::new(AtomicBool::new(false));
    let st = stop.clone();
    let competitor = std::thread::spawn(move || {
        rustix::thread::sched_setaffinity(None, &one).unwrap();
        while !st.load(Ordering::Relaxed) {
            std::hint::spin_loop();
        }
    });
    let r = within_bound_in_one_of_three(|| {
        let (r, still) = observe("crowded", move || {
            rustix::thread::sched_setaffinity(None, &one).unwrap();
            spin(Duration::from_millis(400));
        });
        assert_named_while_blocking(&r, "crowded", still);
        r
    });
    stop.store(true, Ordering::Relaxed);
    competitor.join().unwrap();
    assert!(r.waiting_for_cpu_share > 0.3, "{r:?}");
    assert_eq!(r.class, "waiting-for-cpu", "{r:?}");
}

#[test]
fn a_stall_in_a_next_tick_or_microtask_closure_names_its_queue() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let sleep = || std::thread::sleep(Duration::from_millis(400));
    let (r, still) = observe_run(sleep, |rt, block| rt.enter(|| next_tick(block)));
    assert_named_while_blocking(&r, "next_tick", still);
    let (r, still) = observe_run(sleep, |rt, block| rt.enter(|| queue_microtask(block)));
    assert_named_while_blocking(&r, "microtask", still);
}

/// Spins until the watchdog has published a stall for `loop_id` (10 s at most); returns when the
/// spin started.
fn spin_until_reported(loop_id: u64) -> Instant {
    let start = Instant::now();
    while recent_stalls_for(loop_id).is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no stall reported in 10 s"
        );
        std::hint::spin_loop();
    }
    spin(THRESHOLD);
    start
}

#[test]
fn a_loops_own_snapshot_right_after_a_stall_says_it_ended_with_its_exact_duration() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let rt = Runtime::builder()
        .stall_threshold(THRESHOLD)
        .build()
        .unwrap();
    let loop_id = rt.id();
    let (snap, ran) = rt.block_on(async move {
        let ran = spawn_named("hog", async move { spin_until_reported(loop_id).elapsed() })
            .await
            .unwrap();
        // The next poll after the stall: the watchdog has most likely not looked since it ended.
        (nodus::metrics::snapshot(), ran)
    });
    let last = snap.stalls.last().expect("the stall");
    assert_eq!(last.task_name, "hog");
    assert!(
        !last.ongoing,
        "the loop taking the snapshot is not stalled: {last:?}"
    );
    assert!(
        last.elapsed_seconds >= ran.as_secs_f64(),
        "the exact duration, at least the {ran:?} the task spun: {last:?}"
    );
}

#[test]
fn a_snapshot_taken_inside_the_stalled_poll_times_it_to_that_moment() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let rt = Runtime::builder()
        .stall_threshold(THRESHOLD)
        .build()
        .unwrap();
    let loop_id = rt.id();
    let (snap, ran) = rt.block_on(async move {
        spawn_named("hog", async move {
            let ran = spin_until_reported(loop_id).elapsed();
            (nodus::metrics::snapshot(), ran)
        })
        .await
        .unwrap()
    });
    let last = snap.stalls.last().expect("the stall");
    assert_eq!(last.task_name, "hog");
    assert!(last.ongoing, "{last:?}");
    assert!(
        last.elapsed_seconds >= ran.as_secs_f64(),
        "timed to the snapshot, at least the {ran:?} the task had spun: {last:?}"
    );
}
