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

/// More stalls than the recent stalls keep (the watchdog's ring buffer, 64): the loop's snapshot
/// counts every one, by class, in its JSON (`stalls_total`) and in the Prometheus text
/// (`nodus_loop_stalls_total`), while `stalls` and `nodus_stalls_recent` stop at 64.
#[test]
fn a_loops_stall_counts_go_on_past_its_64_recent_stalls() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    const STALLS: u64 = 70;
    let rt = Runtime::builder()
        .stall_threshold(Duration::from_millis(10))
        .build()
        .unwrap();
    let loop_id = rt.id();
    let snap = rt.block_on(async move {
        for _ in 0..STALLS {
            spawn_named("sleeper", async {
                std::thread::sleep(Duration::from_millis(50));
            })
            .await
            .unwrap();
            // Out of the drain: the next stall is a hold of its own.
            sleep(Duration::from_millis(1)).await;
        }
        // A stall is counted when the watchdog sees it end: wait for its look at the last one.
        let give_up = Instant::now() + Duration::from_secs(10);
        while recent_stalls_for(loop_id).last().is_none_or(|r| r.ongoing) {
            assert!(Instant::now() < give_up, "the last stall never ended");
            sleep(Duration::from_millis(5)).await;
        }
        nodus::metrics::snapshot()
    });
    let counts = snap.stalls_total;
    // Each stall is five thresholds long: the watchdog sees (nearly) every one.
    let blocked = counts.blocked_in_syscall;
    assert!(blocked > 64 && blocked <= STALLS, "{counts:?}");
    assert_eq!(counts.total(), blocked, "sleeping polls: {counts:?}");
    assert!(snap.stalls.len() <= 64);
    let json = serde_json::to_value(&snap).unwrap();
    assert_eq!(
        json["stalls_total"]["blocked-in-syscall"], blocked,
        "{json}"
    );
    assert_eq!(json["stalls_total"]["on-cpu"], 0, "{json}");
    let text = nodus::metrics::prometheus::render(&snap);
    for line in [
        format!("nodus_loop_stalls_total{{class=\"blocked-in-syscall\"}} {blocked}"),
        "nodus_loop_stalls_total{class=\"waiting-for-cpu\"} 0".to_owned(),
        format!("nodus_stalls_recent {}", snap.stalls.len()),
    ] {
        assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
    }
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

/// The test that [`a_stopped_process_is_not_blamed_on_the_task_it_was_polling`] runs in a child.
const STOPPED_CHILD: &str = "a_stopped_process_is_not_blamed_on_the_task_it_was_polling";
/// How long the outer test keeps the child stopped.
const STOP: Duration = Duration::from_millis(1500);
/// Stall and slow-poll threshold in the child: well above the spin before the stop (the outer
/// test stops the child about 20 ms after it asks) and the 100 ms after it (time for the
/// watchdog, continued with the loop, to see the hold).
const CHILD_THRESHOLD: Duration = Duration::from_millis(300);

/// In the child: asks the outer test to stop this process, then spins until it sees the clock
/// jump by the stop (its poll spans it); panics if no stop comes within 10 s.
fn spin_through_a_stop() {
    println!("stop me");
    let give_up = Instant::now() + Duration::from_secs(10);
    let mut last = Instant::now();
    loop {
        let now = Instant::now();
        if now - last >= STOP / 2 {
            return;
        }
        assert!(now < give_up, "no stop came");
        last = now;
        std::hint::spin_loop();
    }
}

/// A SIGSTOP/SIGCONT is not a task blocking the loop: a poll that spans the stop is a stall of
/// class "stopped" and its slow-poll line says the process was stopped, naming the task only as
/// the one being polled; a loop stopped while idle reports nothing; a poll that really runs
/// long after a stop is still blamed on its task, with the stop told apart. The child process
/// (this test, in a fresh process of this binary) asks to be stopped by printing "stop me"; this
/// test stops it for 1.5 s and continues it, and reads its log.
#[test]
fn a_stopped_process_is_not_blamed_on_the_task_it_was_polling() {
    if nodus_testkit::alone::is_inner(STOPPED_CHILD) {
        return stopped_child();
    }
    use std::io::{BufRead, BufReader, Read};
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Stdio};
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([STOPPED_CHILD, "--exact", "--test-threads=1", "--nocapture"])
        .env(nodus_testkit::alone::INNER, STOPPED_CHILD)
        .process_group(0)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let errors = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    // A hang bound: the child is killed after 60 s (its stdout then ends).
    let done = Arc::new(AtomicBool::new(false));
    let d = done.clone();
    let killer = std::thread::spawn(move || {
        let give_up = Instant::now() + Duration::from_secs(60);
        while !d.load(Ordering::Acquire) && Instant::now() < give_up {
            std::thread::sleep(Duration::from_millis(20));
        }
        if !d.load(Ordering::Acquire) {
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
    });
    let mut out = String::new();
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if line.ends_with("stop me") {
            std::thread::sleep(Duration::from_millis(20));
            rustix::process::kill_process(pid, rustix::process::Signal::STOP).unwrap();
            std::thread::sleep(STOP);
            rustix::process::kill_process(pid, rustix::process::Signal::CONT).unwrap();
        }
        out.push_str(&line);
        out.push('\n');
    }
    let status = child.wait().unwrap();
    done.store(true, Ordering::Release);
    killer.join().unwrap();
    let log = errors.join().unwrap();
    assert!(
        status.success() && out.contains("1 passed"),
        "child: {status}\n{out}\n{log}"
    );
    let lines = |what: &str, task: &str| -> Vec<&str> {
        log.lines()
            .filter(|l| l.contains(what) && l.contains(&format!("\"{task}\"")))
            .collect()
    };
    // The poll that spans the stop: its stall and slow poll say the process was stopped.
    for what in ["loop stalled: ", "stall ended: ", "slow poll: "] {
        let found = lines(what, "frozen");
        assert!(
            !found.is_empty(),
            "no {what:?} line for \"frozen\" in:\n{log}"
        );
        for l in found {
            assert!(
                l.contains("the process was stopped or frozen (SIGSTOP, a debugger, a VM pause)")
                    && (l.contains("no task blocked it") || l.contains("not a blocking task"))
                    && !l.contains("ran for"),
                "{l}"
            );
        }
    }
    // The poll that ran long after a stop: blamed on its task, the stop told apart.
    let found = lines("slow poll: ", "frozen-then-busy");
    assert_eq!(found.len(), 1, "{log}");
    assert!(
        found[0].contains("\"frozen-then-busy\"")
            && found[0].contains(" ran for ")
            && found[0].contains("ms of it with the process stopped or frozen"),
        "{}",
        found[0]
    );
    let ended = lines("stall ended: ", "frozen-then-busy");
    assert!(
        ended.len() == 1 && ended[0].contains("ms of it with the process stopped or frozen"),
        "{log}"
    );
    // The idle loop stopped: nothing at all.
    assert!(
        !log.contains("\"idle\""),
        "a loop stopped while idle is reported:\n{log}"
    );
}

/// The child's side: three phases, each stopped once by the outer test.
fn stopped_child() {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    let rt = Runtime::builder()
        .stall_threshold(CHILD_THRESHOLD)
        .slow_poll_threshold(CHILD_THRESHOLD)
        .build()
        .unwrap();
    let loop_id = rt.id();
    rt.block_on(async {
        // A poll that spans the stop and runs 100 ms more.
        spawn_named("frozen", async {
            spin_through_a_stop();
            spin(Duration::from_millis(100));
        })
        .await
        .unwrap();
        // An idle loop (waiting for a timer) is stopped.
        spawn_named("idle", async {
            println!("stop me");
            let give_up = Instant::now() + Duration::from_secs(10);
            let mut last = Instant::now();
            while last.elapsed() < STOP / 2 {
                assert!(Instant::now() < give_up, "no stop came");
                last = Instant::now();
                sleep(Duration::from_millis(50)).await;
            }
        })
        .await
        .unwrap();
        // A poll that runs twice the threshold after the stop: a stall of its own.
        spawn_named("frozen-then-busy", async {
            spin_through_a_stop();
            spin(2 * CHILD_THRESHOLD);
        })
        .await
        .unwrap();
    });
    let stalls = settled_stalls(loop_id);
    let classes: Vec<(&str, &str)> = stalls
        .iter()
        .map(|r| (r.task_name.as_str(), r.class.as_str()))
        .collect();
    assert_eq!(classes.len(), 2, "{stalls:#?}");
    assert_eq!(classes[0], ("frozen", "stopped"), "{stalls:#?}");
    assert_eq!(classes[1].0, "frozen-then-busy", "{stalls:#?}");
    assert!(
        classes[1].1 == "on-cpu" || classes[1].1 == "waiting-for-cpu",
        "the stop is not part of its scheduler window: {stalls:#?}"
    );
    for r in &stalls {
        assert!(
            r.stopped_seconds >= STOP.as_secs_f64() * 0.5 && r.stopped_seconds <= r.elapsed_seconds,
            "{r:?}"
        );
    }
}
