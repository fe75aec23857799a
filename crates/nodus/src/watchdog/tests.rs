//! End-to-end tests of the watchdog: loops played by plain threads stall in a poll (spinning,
//! sleeping, starved of a CPU) and the reports are read back through `recent_stalls_for`; plus
//! the park/unpark accounting. Also the helpers the unit tests in `slot`, `proc` and `thread`
//! share.
//!
//! These tests share the process-wide watchdog and are timing-sensitive: every one that stalls
//! or spins takes `serial()` first.

use std::panic::Location;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::Duration;

use super::proc::{ThreadProc, WAITING_FOR_CPU_SHARE};
use super::thread::{IDLE_WAKES, WAKES};
use super::{
    ACTIVITY, LoopSlot, PARKED, StallCounts, StallReport, lock, recent_stalls_for, register,
    stalls_seen_by_loop,
};
use crate::clock::now_ns;

pub(super) const MS: u64 = 1_000_000;

/// The stall tests share the process-wide watchdog and are timing-sensitive on a 2-core
/// machine: they, and the tests that spin, run one at a time.
pub(super) fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    lock(&SERIAL)
}

/// Loop ids far from the ones real loops get.
pub(super) const ID_BASE: u64 = 0x5741_7463_0000_0000;

pub(super) fn spin_until(deadline: u64) {
    while now_ns() < deadline {
        std::hint::spin_loop();
    }
}

fn location_string(loc: &Location<'_>) -> String {
    format!("{}:{}:{}", loc.file(), loc.line(), loc.column())
}

/// Runs `body` as a poll of task "hog" on a thread playing the loop; returns the poll's
/// (start, end) in `now_ns`, and the slot (the loop lives on until the caller drops it).
fn spawn_loop(
    loop_id: u64,
    threshold: Duration,
    location: &'static Location<'static>,
    setup: impl FnOnce() + Send + 'static,
    body: impl FnOnce() + Send + 'static,
) -> thread::JoinHandle<(u64, u64, Arc<LoopSlot>)> {
    thread::spawn(move || {
        setup();
        let slot = LoopSlot::new(loop_id, threshold);
        register(&slot);
        let start = now_ns();
        slot.begin(7, "hog", location, start);
        body();
        let end = now_ns();
        slot.end();
        slot.end_hold(Some(end));
        (start, end, slot)
    })
}

/// Polls loop `loop_id`'s stalls until `pick` finds something; returns it and when it was seen.
fn wait_for(
    loop_id: u64,
    timeout: Duration,
    pick: fn(&[StallReport]) -> Option<&StallReport>,
) -> Option<(StallReport, u64)> {
    let deadline = now_ns() + timeout.as_nanos() as u64;
    while now_ns() < deadline {
        if let Some(found) = pick(&recent_stalls_for(loop_id)) {
            return Some((found.clone(), now_ns()));
        }
        thread::sleep(Duration::from_millis(1));
    }
    None
}

fn ongoing(stalls: &[StallReport]) -> Option<&StallReport> {
    stalls.iter().find(|r| r.ongoing)
}

fn ended(stalls: &[StallReport]) -> Option<&StallReport> {
    stalls.last().filter(|r| !r.ongoing)
}

/// A spinning poll is runnable all the time: on-CPU, unless other threads kept it off the CPU
/// (the machine is saturated, e.g. by tests running alongside), when the right answer is
/// waiting-for-cpu until its own CPU time reaches the threshold, on-CPU after. Either way it is
/// never "blocked". (The shares are exact to a slice at each end of the window, a few ms under
/// heavy load, so their sum is checked loosely.)
fn assert_runnable_class(report: &StallReport) {
    assert!(
        report.on_cpu_share + report.waiting_for_cpu_share > 0.5,
        "{report:?}"
    );
    if report.waiting_for_cpu_share < WAITING_FOR_CPU_SHARE {
        assert_eq!(report.class, "on-cpu", "{report:?}");
        assert!(report.on_cpu_share > 0.5, "{report:?}");
    } else {
        assert!(
            report.class == "waiting-for-cpu" || report.class == "on-cpu",
            "{report:?}"
        );
        eprintln!("saturated machine: a spinning poll waited for a CPU: {report:?}");
    }
}

#[test]
fn reports_a_busy_poll_while_it_runs() {
    let _serial = serial();
    let id = ID_BASE + 1;
    let location = Location::caller();
    let handle = spawn_loop(
        id,
        Duration::from_millis(50),
        location,
        || {},
        || spin_until(now_ns() + 400 * MS),
    );
    let (first, seen_at) = wait_for(id, Duration::from_secs(2), ongoing).expect("no report");
    let (start, end, _loop_alive) = handle.join().unwrap();
    assert!(
        seen_at < end,
        "seen {} ms after the poll ended",
        (seen_at - end) / MS
    );
    assert_eq!(first.task_name, "hog");
    assert_eq!(first.task_id, 7);
    assert_eq!(first.location, location_string(location));
    assert_runnable_class(&first);
    // The strict bound (threshold + 10 ms) is tests/watchdog.rs's, best of three attempts; here
    // a bound that survives a loaded machine and still proves the report came mid-poll.
    assert!(
        first.detected_after_seconds >= 0.050 && first.detected_after_seconds < 0.150,
        "first report after {} s",
        first.detected_after_seconds
    );
    assert!(first.at_unix_ms > 0);

    let (last, _) = wait_for(id, Duration::from_secs(1), ended).expect("never ended");
    assert_eq!(recent_stalls_for(id).len(), 1, "one poll, one stall");
    assert!(!last.ongoing);
    assert_runnable_class(&last);
    let ran = (end - start) as f64 / 1e9;
    // The loop recorded the end, so the ended stall's duration is the poll's own, to the ns.
    assert!(
        (last.elapsed_seconds - ran).abs() < 1e-6,
        "the stall ended with {} s, the poll ran {ran} s",
        last.elapsed_seconds
    );
    assert!(last.reports >= 3, "{last:?}");
}

#[test]
fn classifies_a_sleeping_poll_as_blocked() {
    let _serial = serial();
    let id = ID_BASE + 2;
    let location = Location::caller();
    let handle = spawn_loop(
        id,
        Duration::from_millis(50),
        location,
        || {},
        || thread::sleep(Duration::from_millis(400)),
    );
    let (first, seen_at) = wait_for(id, Duration::from_secs(2), ongoing).expect("no report");
    let (_, end, _loop_alive) = handle.join().unwrap();
    assert!(seen_at < end);
    assert_eq!(first.class, "blocked-in-syscall", "{first:?}");
    assert!(first.on_cpu_share < 0.2, "{first:?}");
    assert!(first.detected_after_seconds < 0.150, "{first:?}"); // strict bound: tests/watchdog.rs
    let (last, _) = wait_for(id, Duration::from_secs(1), ended).expect("never ended");
    assert_eq!(last.class, "blocked-in-syscall", "{last:?}");
}

/// Runs a poll of loop `id` (threshold 50 ms) that spins until it has run `cpu_ns` on a CPU
/// itself, on a CPU it shares with three spinning threads (so it gets about a quarter of it);
/// returns its stall once the watchdog saw it end.
fn starved_poll(id: u64, cpu_ns: u64) -> StallReport {
    let allowed = rustix::thread::sched_getaffinity(None).unwrap();
    let cpu = (0..rustix::thread::CpuSet::MAX_CPU)
        .rev()
        .find(|&c| allowed.is_set(c))
        .unwrap();
    let mut one_cpu = rustix::thread::CpuSet::new();
    one_cpu.set(cpu);

    const SPINNERS: usize = 3;
    let stop = Arc::new(AtomicBool::new(false));
    let pinned = Arc::new(std::sync::Barrier::new(SPINNERS + 1));
    let spinners: Vec<_> = (0..SPINNERS)
        .map(|_| {
            let (stop, pinned) = (stop.clone(), pinned.clone());
            thread::spawn(move || {
                rustix::thread::sched_setaffinity(None, &one_cpu).unwrap();
                pinned.wait();
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        })
        .collect();
    let handle = spawn_loop(
        id,
        Duration::from_millis(50),
        Location::caller(),
        move || {
            rustix::thread::sched_setaffinity(None, &one_cpu).unwrap();
            pinned.wait();
        },
        move || {
            let clock = ThreadProc::open(rustix::thread::gettid().as_raw_pid());
            let cpu = || clock.read_cpu_ns().expect("the thread's CPU clock");
            let (until, give_up) = (cpu() + cpu_ns, now_ns() + 10_000 * MS);
            while cpu() < until && now_ns() < give_up {
                std::hint::spin_loop();
            }
        },
    );
    handle.join().unwrap();
    stop.store(true, Ordering::Relaxed);
    for spinner in spinners {
        spinner.join().unwrap();
    }
    wait_for(id, Duration::from_secs(1), ended)
        .expect("never ended")
        .0
}

/// A poll kept off its CPU by other threads for most of its hold, whose own CPU time stays
/// under the threshold (25 ms of 50): the wait made the stall.
#[test]
fn classifies_a_starved_poll_as_waiting_for_cpu() {
    let _serial = serial();
    let last = starved_poll(ID_BASE + 3, 25 * MS);
    assert!(last.waiting_for_cpu_share > 0.3, "{last:?}");
    assert_eq!(last.class, "waiting-for-cpu", "{last:?}");
}

/// A CPU hog kept off its CPU by other threads for most of its hold, whose own CPU time reaches
/// 3x the threshold (150 ms of 50): it would have stalled the loop on an idle machine, so it is
/// on a CPU, not a noisy neighbour's victim (it was `waiting-for-cpu`, from its shares alone).
#[test]
fn a_cpu_hog_sharing_its_cpu_is_on_a_cpu_once_it_ran_for_the_threshold() {
    let _serial = serial();
    let last = starved_poll(ID_BASE + 0x11, 150 * MS);
    assert!(last.waiting_for_cpu_share > 0.3, "crowded: {last:?}");
    assert_eq!(last.class, "on-cpu", "{last:?}");
}

/// More stalls than the ring buffer keeps: the loop's counts go on past 64, by class (each
/// stall under its final class), while its recent stalls stop at the ring's size.
#[test]
fn stalls_are_counted_past_the_ring_buffers_size() {
    let _serial = serial();
    const HOLDS: u64 = 70;
    let id = ID_BASE + 0x12;
    let location = Location::caller();
    let handle = thread::spawn(move || {
        let slot = LoopSlot::new(id, Duration::from_millis(10));
        register(&slot);
        for _ in 0..HOLDS {
            slot.begin(7, "sleeper", location, now_ns());
            thread::sleep(Duration::from_millis(50));
            slot.end();
            slot.end_hold(Some(now_ns()));
        }
        slot
    });
    // The loop lives on (registered and busy) until the watchdog has seen its last stall end.
    let slot = handle.join().unwrap();
    let deadline = now_ns() + 10_000 * MS;
    while recent_stalls_for(id).last().is_none_or(|r| r.ongoing) {
        assert!(now_ns() < deadline, "the last stall never ended");
        thread::sleep(Duration::from_millis(5));
    }
    let (_, counts) = stalls_seen_by_loop(&slot, now_ns());
    // Each hold is five thresholds long: the watchdog sees (nearly) every one.
    let blocked = counts.blocked_in_syscall;
    assert!(blocked > 64 && blocked <= HOLDS, "{counts:?}");
    assert_eq!(
        counts,
        StallCounts {
            blocked_in_syscall: blocked,
            ..StallCounts::default()
        },
        "sleeping polls are blocked in a syscall"
    );
    assert!(recent_stalls_for(id).len() <= super::RING_CAPACITY);
}

#[test]
fn backs_off_exponentially() {
    let _serial = serial();
    let id = ID_BASE + 4;
    let handle = spawn_loop(
        id,
        Duration::from_millis(100),
        Location::caller(),
        || {},
        || thread::sleep(Duration::from_secs(1)),
    );
    handle.join().unwrap();
    let (last, _) = wait_for(id, Duration::from_secs(1), ended).expect("never ended");
    // Reports at 100, 200, 400 and 800 ms.
    assert!((3..=5).contains(&last.reports), "{last:?}");
    assert!(last.elapsed_seconds > 0.9, "{last:?}");
}

#[test]
fn parks_while_every_loop_is_idle() {
    let _serial = serial();
    let id = ID_BASE + 5;
    let ready = Arc::new(std::sync::Barrier::new(2));
    let go = Arc::new(std::sync::Barrier::new(2));
    let location = Location::caller();
    let handle = {
        let (ready, go) = (ready.clone(), go.clone());
        thread::spawn(move || {
            let slot = LoopSlot::new(id, Duration::from_millis(50));
            register(&slot);
            slot.enter_idle();
            ready.wait();
            go.wait();
            slot.leave_idle();
            let start = now_ns();
            slot.begin(9, "wakes-the-watchdog", location, start);
            thread::sleep(Duration::from_millis(150));
            slot.end();
            slot.end_hold(Some(now_ns()));
            slot.enter_idle();
            // Drop while idle: the count must stay balanced.
        })
    };
    // A busy slot that was never registered must not keep the watchdog awake.
    let _unregistered = LoopSlot::new(ID_BASE + 7, Duration::from_millis(50));
    ready.wait();
    thread::sleep(Duration::from_millis(50));
    let (wakes, idle_wakes) = (
        WAKES.load(Ordering::Relaxed),
        IDLE_WAKES.load(Ordering::Relaxed),
    );
    thread::sleep(Duration::from_millis(500));
    let idle_woken = IDLE_WAKES.load(Ordering::Relaxed) - idle_wakes;
    let woken = WAKES.load(Ordering::Relaxed) - wakes;
    assert!(
        idle_woken <= 2,
        "woke {idle_woken} times while idle ({woken} wakes in all)"
    );

    // `leave_idle` must unpark it in time to catch a stall at its threshold.
    go.wait();
    let (first, _) = wait_for(id, Duration::from_secs(2), ongoing).expect("no report");
    assert!(first.detected_after_seconds < 0.150, "{first:?}"); // strict bound: tests/watchdog.rs
    handle.join().unwrap();
    wait_for(id, Duration::from_secs(1), ended).expect("never ended");
}

#[test]
fn only_registered_busy_slots_count() {
    let _serial = serial();
    let busy = || ACTIVITY.load(Ordering::Acquire) & !PARKED;
    // Loops of other tests may come and go meanwhile: one clean attempt out of a few is enough.
    let clean = (0..20).any(|_| {
        let before = busy();
        let unregistered = LoopSlot::new(ID_BASE + 8, Duration::from_millis(50));
        unregistered.enter_idle();
        unregistered.leave_idle();
        let after_new = busy();
        let registered = LoopSlot::new(ID_BASE + 8, Duration::from_millis(50));
        register(&registered);
        let after_register = busy();
        registered.enter_idle();
        let after_idle = busy();
        drop((unregistered, registered));
        let after_drop = busy();
        [after_new, after_register, after_idle, after_drop] == [before, before + 1, before, before]
    });
    assert!(clean, "ACTIVITY miscounted");
}
