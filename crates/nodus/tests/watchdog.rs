//! The watchdog reports a task while it is still blocking the loop, three ways; and a drain of
//! many short polls that holds the loop (tasks waking each other, a chain of closures) as one
//! stall, while it holds it.
#![cfg(feature = "measure")]

use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use nodus::watchdog::{StallReport, recent_stalls_for};
use nodus::{Runtime, next_tick, queue_microtask, set_timeout, sleep, spawn_named, yield_now};

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
        // Out of the drain the stall is (the next turn's check phase): the watchdog has most
        // likely not looked since it ended.
        yield_now().await;
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

/// Waits (10 s at most) until the watchdog has seen every stall of `loop_id` end; returns them.
fn settled_stalls(loop_id: u64) -> Vec<StallReport> {
    let give_up = Instant::now() + Duration::from_secs(10);
    loop {
        let stalls = recent_stalls_for(loop_id);
        if !stalls.iter().any(|r| r.ongoing) {
            return stalls;
        }
        assert!(Instant::now() < give_up, "a stall never ended: {stalls:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Watches `loop_id` from another thread: returns the handle that answers when the first
/// ongoing stall of more than one poll was seen (`None`: not within 10 s, or `stop` was set).
fn first_drain_stall_seen(
    loop_id: u64,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Option<Instant>> {
    std::thread::spawn(move || {
        let give_up = Instant::now() + Duration::from_secs(10);
        while Instant::now() < give_up && !stop.load(Ordering::Acquire) {
            if recent_stalls_for(loop_id)
                .iter()
                .any(|r| r.ongoing && r.polls > 1)
            {
                return Some(Instant::now());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        None
    })
}

/// Whose turn it is, and the waker of the player waiting for it: a local channel in miniature.
#[derive(Default)]
struct Table {
    turn: Cell<usize>,
    waiting: RefCell<[Option<Waker>; 2]>,
}

/// Player `me` of a ping-pong on `table` until `until`: waits for its turn, passes it and wakes
/// the other player (queued as a microtask, so the drain never empties). Returns its turns.
async fn play(table: Rc<Table>, me: usize, until: Instant) -> u64 {
    let mut turns = 0;
    while Instant::now() < until {
        poll_fn(|cx| {
            if table.turn.get() == me {
                Poll::Ready(())
            } else {
                table.waiting.borrow_mut()[me] = Some(cx.waker().clone());
                Poll::Pending
            }
        })
        .await;
        turns += 1;
        table.turn.set(1 - me);
        let other = table.waiting.borrow_mut()[1 - me].take();
        if let Some(waker) = other {
            waker.wake();
        }
    }
    turns
}

#[test]
fn tasks_that_wake_each_other_are_one_stall_reported_while_they_hold_the_loop() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let rt = Runtime::builder()
        .stall_threshold(THRESHOLD)
        .build()
        .unwrap();
    let loop_id = rt.id();
    let stop = Arc::new(AtomicBool::new(false));
    let observer = first_drain_stall_seen(loop_id, stop.clone());
    let hold = Duration::from_millis(600);
    let (turns, ended) = rt.block_on(async move {
        let table = Rc::new(Table::default());
        let until = Instant::now() + hold;
        let ping = spawn_named("ping", play(table.clone(), 0, until));
        let pong = spawn_named("pong", play(table, 1, until));
        let turns = ping.await.unwrap() + pong.await.unwrap();
        (turns, Instant::now())
    });
    stop.store(true, Ordering::Release);
    let seen = observer.join().unwrap();
    let stalls = settled_stalls(loop_id);
    let ours: Vec<_> = stalls
        .iter()
        .filter(|r| r.task_name == "ping" || r.task_name == "pong")
        .collect();
    assert_eq!(
        ours.len(),
        1,
        "one stall for the whole ping-pong: {stalls:?}"
    );
    let r = ours[0];
    assert!(
        r.elapsed_seconds >= hold.as_secs_f64() * 0.8 && r.polls >= turns,
        "the stall spans the ping-pong's {turns} polls: {r:?}"
    );
    assert!(r.location.contains("tests/watchdog.rs:"), "{r:?}");
    let seen = seen.expect("a stall reported while the tasks held the loop");
    assert!(seen < ended, "reported while the ping-pong went on: {r:?}");
}

/// Queues itself as a microtask until `until`: each closure is tiny, the drain never empties.
fn chain(until: Instant) {
    if Instant::now() < until {
        queue_microtask(move || chain(until));
    }
}

/// Runs a chain of closures for `hold` (from a timer callback) on a fresh loop, after `before`
/// (in the main future); returns the loop's stalls once settled.
fn chain_stalls(hold: Duration, before: impl FnOnce() + 'static) -> Vec<StallReport> {
    let rt = Runtime::builder()
        .stall_threshold(THRESHOLD)
        .build()
        .unwrap();
    let loop_id = rt.id();
    rt.block_on(async move {
        before();
        yield_now().await;
        let until = Instant::now() + hold;
        set_timeout(1, move || chain(until));
        sleep(hold + Duration::from_millis(100)).await;
    });
    settled_stalls(loop_id)
}

#[test]
fn a_chain_of_closures_is_one_stall() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let hold = Duration::from_millis(600);
    let stalls = chain_stalls(hold, || {});
    let ours: Vec<_> = stalls
        .iter()
        .filter(|r| r.task_name == "microtask")
        .collect();
    assert_eq!(ours.len(), 1, "one entry for the whole chain: {stalls:?}");
    let r = ours[0];
    assert!(
        r.elapsed_seconds >= hold.as_secs_f64() * 0.8 && r.polls > 1000,
        "{r:?}"
    );
    assert!(r.began_with.starts_with("\"timer\""), "{r:?}");
}

#[test]
fn a_long_chain_of_closures_leaves_earlier_stalls_in_the_history() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // Long enough for a stall a tick (64 fill the history) even if the watchdog ticks late.
    let stalls = chain_stalls(Duration::from_secs(3), || {
        spin(THRESHOLD * 3);
    });
    assert!(
        stalls
            .iter()
            .any(|r| r.task_name == "main" && r.polls == 1 && r.elapsed_seconds >= 0.1),
        "the earlier stall is still there: {stalls:?}"
    );
    let chains = stalls.iter().filter(|r| r.task_name == "microtask").count();
    assert_eq!(chains, 1, "{stalls:?}");
}

/// Spins until the watchdog has published `n` stalls for `loop_id` (10 s at most).
fn spin_until_stalls(loop_id: u64, n: usize) {
    let start = Instant::now();
    while recent_stalls_for(loop_id).len() < n {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{n} stalls not reported in 10 s"
        );
        std::hint::spin_loop();
    }
}

/// A task's note (`nodus::task::set_note`) names it in the report while it blocks, from a later
/// poll than the one that set it, escaped; it is not lent to the next task, nor kept once cleared.
#[test]
fn a_tasks_note_names_it_while_it_blocks_until_cleared() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let rt = Runtime::builder()
        .stall_threshold(THRESHOLD)
        .build()
        .unwrap();
    let loop_id = rt.id();
    rt.block_on(async move {
        // Sets its note, then awaits: it blocks in a later poll.
        spawn_named("job", async move {
            nodus::task::set_note("job 42\n");
            sleep(5).await;
            spin_until_stalls(loop_id, 1);
        })
        .await
        .unwrap();
        // No note of its own: none lent from the task before.
        spawn_named("plain", async move {
            sleep(1).await;
            spin_until_stalls(loop_id, 2);
        })
        .await
        .unwrap();
        // Set and cleared in an earlier poll: none.
        spawn_named("cleared", async move {
            nodus::task::set_note("job 43");
            yield_now().await;
            nodus::task::clear_note();
            sleep(1).await;
            spin_until_stalls(loop_id, 3);
        })
        .await
        .unwrap();
    });
    let stalls = recent_stalls_for(loop_id);
    let named: Vec<(&str, &str)> = stalls
        .iter()
        .map(|r| (r.task_name.as_str(), r.note.as_str()))
        .collect();
    assert_eq!(
        named,
        [("job", "job 42\\u{a}"), ("plain", ""), ("cleared", "")]
    );
}
