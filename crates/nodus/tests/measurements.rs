//! The always-on measurements hold the values they claim (DESIGN.md section 3).
#![cfg(feature = "measure")]

use std::cell::Cell;
use std::io::Write;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nodus::metrics::{prometheus, snapshot};
use nodus::{
    Runtime, next_tick, queue_microtask, set_immediate, set_timeout, sleep, spawn_named, yield_now,
};
use nodus_testkit::scrape::{family_type, series};

fn spin(d: Duration) {
    let end = Instant::now() + d;
    while Instant::now() < end {}
}

#[test]
fn n_immediates_take_at_least_n_iterations() {
    let rt = Runtime::new();
    let n = 500;
    fn chain(left: u32) {
        if left > 0 {
            set_immediate(move || chain(left - 1));
        }
    }
    rt.enter(|| chain(n));
    rt.run();
    let snap = rt.enter(snapshot);
    assert!(
        snap.loop_stats.iterations >= n as u64,
        "{} iterations",
        snap.loop_stats.iterations
    );
    let check = snap.phases.iter().find(|p| p.phase == "check").unwrap();
    assert_eq!(check.callbacks, n as u64);
}

#[test]
fn a_blocking_callback_records_its_poll_duration() {
    let rt = Runtime::new();
    rt.enter(|| {
        set_timeout(1, || spin(Duration::from_millis(50)));
    });
    rt.run();
    let snap = rt.enter(snapshot);
    assert!(
        snap.loop_stats.poll_duration.max >= 50_000_000,
        "{:?}",
        snap.loop_stats.poll_duration
    );
    let timer = snap
        .task_classes
        .iter()
        .find(|c| c.name == "timer")
        .unwrap();
    assert!(timer.poll_duration.max >= 50_000_000);
    let timers = snap.phases.iter().find(|p| p.phase == "timers").unwrap();
    assert!(timers.seconds >= 0.05);
    assert!(snap.loop_stats.busy_seconds >= 0.05);
}

#[test]
fn sleeping_on_an_idle_loop_counts_as_idle_time() {
    let rt = Runtime::new();
    let before = rt.enter(snapshot).loop_stats.idle_seconds;
    rt.block_on(sleep(20));
    let after = rt.enter(snapshot);
    assert!(
        after.loop_stats.idle_seconds - before >= 0.020,
        "idle grew by {}",
        after.loop_stats.idle_seconds - before
    );
    assert!(after.loop_stats.timer_lateness.count >= 1);
    assert!(after.loop_stats.utilization < 0.9);
}

#[test]
fn run_queue_length_arrivals_and_delay_agree_with_littles_law() {
    let rt = Runtime::new();
    rt.block_on(async {
        let mut handles = Vec::new();
        for _ in 0..8 {
            handles.push(spawn_named("littles-law", async {
                for _ in 0..300 {
                    spin(Duration::from_micros(20));
                    yield_now().await;
                }
            }));
        }
        for h in handles {
            h.await.unwrap();
        }
    });
    let s = rt.enter(snapshot);
    let l = s.run_queue.mean;
    let lambda = s.run_queue.arrivals_total as f64 / s.uptime_seconds;
    let w = s.loop_stats.schedule_delay.mean / 1e9;
    assert!(s.run_queue.arrivals_total >= 2400);
    assert!(l > 1.0, "8 tasks queue behind each other: mean length {l}");
    let ratio = l / (lambda * w);
    assert!(
        (0.9..=1.1).contains(&ratio),
        "L = {l}, lambda = {lambda}, W = {w}: L/(lambda W) = {ratio}"
    );
    assert!(s.run_queue.max >= 7);
}

#[test]
fn per_name_poll_durations_and_prometheus_text() {
    let rt = Runtime::new();
    rt.block_on(async {
        spawn_named("busy", async {
            spin(Duration::from_millis(5));
        })
        .await
        .unwrap();
        sleep(2).await;
    });
    let snap = rt.enter(snapshot);
    let busy = snap.task_classes.iter().find(|c| c.name == "busy").unwrap();
    assert_eq!(busy.spawned, 1);
    assert!(busy.poll_duration.max >= 5_000_000);
    let text = prometheus::render(&snap);
    for name in [
        "nodus_task_schedule_delay_seconds",
        "nodus_run_queue_length",
        "nodus_loop_busy_seconds_total",
        "nodus_loop_idle_seconds_total",
        "nodus_timer_lateness_seconds",
        "nodus_task_poll_duration_seconds",
        "nodus_loop_iterations_total",
    ] {
        assert!(text.contains(name), "{name} missing from:\n{text}");
    }
    assert!(text.contains("task=\"busy\""));
    assert!(
        snap.rss_bytes > 1 << 20,
        "resident memory: {} bytes",
        snap.rss_bytes
    );
    assert!(text.contains("nodus_process_resident_memory_bytes"));
    let json = serde_json::to_string(&snap).unwrap();
    let back: nodus::metrics::Snapshot = serde_json::from_str(&json).unwrap();
    assert_eq!(back.loop_stats.iterations, snap.loop_stats.iterations);
}

#[test]
fn task_panics_are_counted_per_name_whether_or_not_the_handle_was_kept() {
    let rt = Runtime::new();
    rt.enter(|| {
        // Detached: its panic reaches nothing but the panic hook (and now the metrics).
        drop(spawn_named("doomed", async {
            sleep(1).await;
            panic!("a detached task's panic");
        }));
        drop(spawn_named("fine", async { sleep(1).await }));
    });
    rt.run();
    rt.block_on(async {
        let err = spawn_named("doomed", async { panic!("an awaited task's panic") })
            .await
            .unwrap_err();
        assert!(err.is_panic());
    });
    let snap = rt.enter(snapshot);
    let class = |name: &str| snap.task_classes.iter().find(|c| c.name == name).unwrap();
    assert_eq!(class("doomed").panics, 2);
    assert_eq!(class("fine").panics, 0);
    assert_eq!(snap.tasks.panics_total, 2);
    let text = prometheus::render(&snap);
    assert_eq!(
        family_type(&text, "nodus_task_panics").as_deref(),
        Some("counter")
    );
    assert!(
        text.lines()
            .any(|l| l == r#"nodus_task_panics_total{task="doomed"} 2"#),
        "{text}"
    );
}

/// Captures tracing output.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A loop with slow-poll `threshold` (and no watchdog), and a subscriber that writes what is
/// logged to the `Captured` buffer.
fn logging_loop(threshold: Duration) -> (Captured, tracing::Dispatch, Runtime) {
    let out = Captured::default();
    let writer = out.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let rt = Runtime::builder()
        .slow_poll_threshold(threshold)
        .watchdog(false)
        .build()
        .unwrap();
    (out, tracing::Dispatch::new(subscriber), rt)
}

#[test]
fn slow_polls_are_logged_with_name_location_duration_and_queue_length() {
    let (out, logging, rt) = logging_loop(Duration::from_millis(10));
    let slow_ran = Rc::new(Cell::new(false));
    let s = slow_ran.clone();
    tracing::dispatcher::with_default(&logging, || {
        rt.block_on(async move {
            spawn_named("sluggish", async move {
                spin(Duration::from_millis(25));
                s.set(true);
            })
            .await
            .unwrap();
        });
    });
    assert!(slow_ran.get());
    let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
    let line = text
        .lines()
        .find(|l| l.contains("slow poll"))
        .unwrap_or_else(|| panic!("no slow-poll line in:\n{text}"));
    assert!(line.contains("sluggish"), "{line}");
    assert!(line.contains("measurements.rs:"), "{line}");
    assert!(line.contains("run_queue="), "{line}");
    assert_eq!(rt.enter(snapshot).loop_stats.slow_polls_total, 1);
}

/// Runs one closure that sleeps 200 ms, queued by `queue` from the main script, on a loop with a
/// 50 ms slow-poll threshold; returns the slow-poll lines logged and the slow polls counted.
fn slow_closure(queue: impl FnOnce(Box<dyn FnOnce()>)) -> (Vec<String>, u64) {
    let (out, logging, rt) = logging_loop(Duration::from_millis(50));
    tracing::dispatcher::with_default(&logging, || {
        rt.enter(|| queue(Box::new(|| std::thread::sleep(Duration::from_millis(200)))));
    });
    let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
    let lines = text
        .lines()
        .filter(|l| l.contains("nodus::slow_poll"))
        .map(str::to_owned)
        .collect();
    (lines, rt.enter(snapshot).loop_stats.slow_polls_total)
}

#[test]
fn a_slow_next_tick_closure_is_a_slow_poll_named_next_tick() {
    let (lines, slow_polls) = slow_closure(|f| next_tick(f));
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(lines[0].contains("\"next_tick\" closure"), "{}", lines[0]);
    assert!(lines[0].contains("measurements.rs:"), "{}", lines[0]);
    assert_eq!(slow_polls, 1);
}

#[test]
fn a_slow_microtask_closure_is_a_slow_poll_named_microtask() {
    let (lines, slow_polls) = slow_closure(|f| queue_microtask(f));
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(lines[0].contains("\"microtask\" closure"), "{}", lines[0]);
    assert!(lines[0].contains("measurements.rs:"), "{}", lines[0]);
    assert_eq!(slow_polls, 1);
}

#[test]
fn closures_timed_as_one_batch_are_one_slow_poll_logged_with_the_batch_size() {
    // The batch is timed as a whole (rt/drain.rs): the slow tick and the quick microtask after it.
    let (lines, slow_polls) = slow_closure(|f| {
        next_tick(f);
        queue_microtask(|| {});
    });
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(
        lines[0].contains("2 closures ending with a \"microtask\" closure"),
        "{}",
        lines[0]
    );
    assert!(lines[0].contains("closures=2"), "{}", lines[0]);
    assert_eq!(slow_polls, 1);
}

#[test]
fn tasks_woken_by_io_count_their_wait_behind_earlier_events() {
    use std::io::Read;
    use std::os::unix::net::UnixStream;
    let rt = Runtime::new();
    let (readers, mut writers): (Vec<_>, Vec<_>) =
        (0..4).map(|_| UnixStream::pair().unwrap()).unzip();
    rt.block_on(async move {
        let mut tasks = Vec::new();
        for r in readers {
            let fd = nodus::io::AsyncFd::new(r).unwrap();
            tasks.push(spawn_named("io-reader", async move {
                let mut b = [0u8; 1];
                // The first attempt finds nothing; then all four wake in one poll phase.
                fd.read_with(|mut s| s.read(&mut b)).await.unwrap();
                spin(Duration::from_millis(2));
            }));
        }
        nodus::yield_now().await; // let every reader find its socket empty and wait
        for w in &mut writers {
            std::io::Write::write_all(w, b"x").unwrap();
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
    let snap = rt.enter(snapshot);
    // The last of the four waited behind three 2 ms polls since epoll_wait returned.
    assert!(
        snap.loop_stats.schedule_delay.max >= 4_000_000,
        "{:?}",
        snap.loop_stats.schedule_delay
    );
}

/// Spawns a task named `name` that parks on its first poll and ends on its next: the task, and
/// the cell its waker is put in once it has run.
fn spawn_parking(
    name: &'static str,
) -> (nodus::JoinHandle<()>, Rc<Cell<Option<std::task::Waker>>>) {
    let waker = Rc::new(Cell::new(None));
    let w = waker.clone();
    let mut polled = false;
    let task = spawn_named(
        name,
        std::future::poll_fn(move |cx| {
            if std::mem::replace(&mut polled, true) {
                std::task::Poll::Ready(())
            } else {
                w.set(Some(cx.waker().clone()));
                std::task::Poll::Pending
            }
        }),
    );
    (task, waker)
}

/// A slow poll's "N runnable waiting" counts every entry that waited behind it: those queued
/// when it began, and those it made runnable (a task it spawned, the awaiter its completion
/// woke) or that another thread woke during it. Before, only the first kind was counted.
#[test]
fn a_slow_poll_counts_what_waited_behind_it_from_its_start_or_its_wake() {
    let (out, logging, rt) = logging_loop(Duration::from_millis(10));
    tracing::dispatcher::with_default(&logging, || {
        rt.block_on(async {
            let (parked, parked_waker) = spawn_parking("parked");
            yield_now().await; // "parked" runs and parks
            let waker = parked_waker.take().expect("parked has run");
            // Two tasks queued behind "sluggish"; it spawns a third, has a fourth woken from
            // another thread and, as its poll ends, its completion wakes this one (a fifth).
            let slow = spawn_named("sluggish", async move {
                spawn_named("late", async {}).detach();
                std::thread::spawn(move || waker.wake()).join().unwrap();
                spin(Duration::from_millis(25));
            });
            let others: Vec<_> = (0..2).map(|_| spawn_named("other", async {})).collect();
            slow.await.unwrap();
            for o in others {
                o.await.unwrap();
            }
            parked.await.unwrap();
        });
    });
    let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
    let line = text
        .lines()
        .find(|l| l.contains("slow poll") && l.contains("sluggish"))
        .unwrap_or_else(|| panic!("no slow-poll line in:\n{text}"));
    assert!(
        line.contains("with 5 runnable waiting (2 when it began)"),
        "{line}"
    );
    assert!(line.contains("run_queue=5"), "{line}");
    assert!(line.contains("run_queue_at_start=2"), "{line}");
}

/// Runs `wake_then_hog` as `block_on`'s future, on a fresh loop: it makes something runnable on
/// the loop, then holds the loop for 100 ms. Returns the loop's snapshot after.
fn woken_behind_a_hog(
    wake_then_hog: impl std::future::Future<Output = ()>,
) -> nodus::metrics::Snapshot {
    let rt = Runtime::new();
    rt.block_on(wake_then_hog);
    rt.enter(snapshot)
}

/// What a hog makes runnable early in its poll waits behind the rest of it: its schedule delay
/// counts from the wake, spawn or `set_immediate` itself, and so does the run-queue integral
/// (Little's law). Before, entries queued during a poll were stamped when it returned, and a task
/// woken 100 ms before it could run showed a delay of microseconds.
#[test]
fn what_a_long_poll_makes_runnable_counts_the_rest_of_it_as_schedule_delay() {
    let hog = || spin(Duration::from_millis(100));
    let local_wake = woken_behind_a_hog(async move {
        let (victim, waker) = spawn_parking("victim");
        yield_now().await; // the victim runs and parks
        let before = snapshot().loop_stats.schedule_delay.max;
        assert!(before < 100_000_000, "nothing waited yet: {before} ns");
        waker.take().expect("the victim has run").wake();
        hog();
        victim.await.unwrap();
    });
    let spawned = woken_behind_a_hog(async move {
        spawn_named("victim", async {}).detach();
        hog();
    });
    let immediate = woken_behind_a_hog(async move {
        set_immediate(|| {});
        hog();
        yield_now().await; // to the check phase, behind the immediate
    });
    for (what, s) in [
        ("a local wake", local_wake),
        ("a spawn", spawned),
        ("an immediate", immediate),
    ] {
        let max = s.loop_stats.schedule_delay.max;
        assert!(
            max >= 100_000_000,
            "{what} 100 ms before the hog returned: max schedule delay {max} ns"
        );
        assert!(
            s.run_queue.wait_seconds >= 0.1,
            "{what}: its wait is in the run-queue integral too: {} s",
            s.run_queue.wait_seconds
        );
    }
}

/// A task that wakes itself (a yield) is running until its poll returns: it is runnable from
/// then, so the rest of its own poll is not schedule delay (it waited behind nothing).
#[test]
fn a_task_that_wakes_itself_and_runs_on_is_not_waiting_meanwhile() {
    let rt = Runtime::new();
    rt.block_on(async {
        let mut polled = false;
        spawn_named(
            "yielder",
            std::future::poll_fn(move |cx| {
                if std::mem::replace(&mut polled, true) {
                    return std::task::Poll::Ready(());
                }
                cx.waker().wake_by_ref();
                spin(Duration::from_millis(100));
                std::task::Poll::Pending
            }),
        )
        .await
        .unwrap();
    });
    let s = rt.enter(snapshot);
    let max = s.loop_stats.schedule_delay.max;
    assert!(
        max < 100_000_000,
        "its own 100 ms counted as waiting: {max} ns"
    );
    assert!(
        s.run_queue.wait_seconds < 0.1,
        "nor in the run-queue integral: {} s",
        s.run_queue.wait_seconds
    );
}

/// Polls `f` once (registering the current task's waker), keeping it pending.
async fn poll_once<F: std::future::Future + Unpin>(f: &mut F) {
    std::future::poll_fn(|cx| {
        assert!(std::pin::Pin::new(&mut *f).poll(cx).is_pending());
        std::task::Poll::Ready(())
    })
    .await;
}

#[test]
fn pool_completions_waiting_behind_a_blocked_loop_are_schedule_delay_and_run_queue() {
    let rt = Runtime::new();
    rt.block_on(async {
        // Eight jobs held until the loop starts an 800 ms block, awaited (their completions will
        // be posted to the loop) and then finishing while it blocks.
        let go = Arc::new((Mutex::new(false), std::sync::Condvar::new()));
        let mut jobs: Vec<_> = (0..8)
            .map(|_| {
                let go = go.clone();
                Box::pin(nodus::offload_io(move || {
                    let (lock, cv) = &*go;
                    let mut started = lock.lock().unwrap();
                    while !*started {
                        started = cv.wait(started).unwrap();
                    }
                }))
            })
            .collect();
        for job in &mut jobs {
            poll_once(job).await;
        }
        *go.0.lock().unwrap() = true;
        go.1.notify_all();
        spin(Duration::from_millis(800));
        // The poll phase takes the eight completions together.
        yield_now().await;
        for job in jobs {
            job.await.unwrap();
        }
    });
    let s = rt.enter(snapshot);
    assert!(
        s.loop_stats.schedule_delay.max >= 200_000_000,
        "a completion waited behind the 800 ms block: {:?}",
        s.loop_stats.schedule_delay
    );
    assert!(
        s.run_queue.max >= 8,
        "eight completions waited together: max {}",
        s.run_queue.max
    );
    // Each completion's wait is in the time-integrated length (about 8 × 0.7 task-seconds).
    let integral = s.run_queue.mean * s.uptime_seconds;
    assert!(
        integral >= 1.5,
        "run-queue integral {integral} task-seconds"
    );
}

#[test]
fn work_posted_and_not_yet_taken_counts_in_the_current_run_queue() {
    let rt = Runtime::new();
    let handle = rt.handle();
    let current = rt.block_on(async move {
        std::thread::spawn(move || assert!(handle.post(|| {})))
            .join()
            .unwrap();
        snapshot().run_queue.current
    });
    assert!(
        current >= 1,
        "a post waiting for the loop: current {current}"
    );
}

/// A posted callback that panics ends the loop's turn (as an uncaught exception ends Node's), but
/// the posts behind it are neither lost nor left counted: they run at the next turn, and the run
/// queue is empty after it.
#[test]
fn posts_behind_a_panicking_one_run_at_the_next_turn() {
    let rt = Runtime::new();
    let handle = rt.handle();
    let ran = Arc::new(Mutex::new(0));
    let r = ran.clone();
    assert!(handle.post(|| panic!("a posted callback's bug")));
    assert!(handle.post(move || *r.lock().unwrap() += 1));
    let turn = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| rt.run_once()));
    assert!(turn.is_err(), "the panic reaches the caller");
    assert_eq!(*ran.lock().unwrap(), 0);
    rt.run_once();
    assert_eq!(*ran.lock().unwrap(), 1, "the post behind the panic ran");
    let current = rt.block_on(async { snapshot().run_queue.current });
    assert_eq!(current, 0, "nothing left counted in the run queue");
}

#[test]
fn a_snapshot_after_a_long_wait_reports_the_wait_not_the_work_before_it() {
    let rt = Runtime::builder()
        .metrics_interval(Duration::from_millis(100))
        .build()
        .unwrap();
    let handle = rt.handle();
    type Slot = Arc<Mutex<(Option<nodus::metrics::Snapshot>, Option<std::task::Waker>)>>;
    let slot: Slot = Arc::default();
    let got = slot.clone();
    let snap = rt.block_on(async move {
        spawn_named("busy", async { spin(Duration::from_millis(300)) })
            .await
            .unwrap();
        // After 500 ms of waiting in epoll, a callback in the poll phase (as a cluster worker
        // answers the primary's snapshot request) takes the snapshot.
        let post = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(500));
            handle.post(move || {
                let mut slot = slot.lock().unwrap();
                slot.0 = Some(snapshot());
                if let Some(w) = slot.1.take() {
                    w.wake();
                }
            })
        });
        let snap = std::future::poll_fn(|cx| {
            let mut got = got.lock().unwrap();
            match got.0.take() {
                Some(s) => std::task::Poll::Ready(s),
                None => {
                    got.1 = Some(cx.waker().clone());
                    std::task::Poll::Pending
                }
            }
        })
        .await;
        assert!(post.join().unwrap());
        snap
    });
    let ls = &snap.loop_stats;
    assert!(
        ls.interval_utilization < 0.5,
        "the last interval is the 500 ms wait: utilization {} over {} s",
        ls.interval_utilization,
        ls.interval_seconds
    );
    assert!(ls.interval_seconds >= 0.1, "{} s", ls.interval_seconds);
    assert_eq!(snap.run_queue.interval_max, 0, "nothing ran in the wait");
}

#[test]
fn before_the_first_interval_closes_the_interval_is_the_time_since_start() {
    let rt = Runtime::new(); // 1 s intervals
    let snap = rt.block_on(async {
        let tasks: Vec<_> = (0..3).map(|_| spawn_named("q", yield_now())).collect();
        spawn_named("busy", async { spin(Duration::from_millis(100)) })
            .await
            .unwrap();
        for t in tasks {
            t.await.unwrap();
        }
        snapshot()
    });
    let (ls, rq) = (&snap.loop_stats, &snap.run_queue);
    assert!(ls.interval_seconds > 0.0, "{} s", ls.interval_seconds);
    assert!(
        ls.interval_utilization > 0.5,
        "a loop that never waited: utilization {}",
        ls.interval_utilization
    );
    assert!(rq.interval_max >= 3, "interval max {}", rq.interval_max);
    assert!(rq.interval_mean > 0.0, "interval mean {}", rq.interval_mean);
}

/// The figures the exposition took over from the stats JSON, scraped from one snapshot's
/// exposition (a cluster worker's: `worker` and `pid` labels first): each family's type, each
/// series' labels, and the value the JSON of the same snapshot has.
#[test]
fn the_exposition_carries_the_run_queue_and_interval_figures_of_the_json() {
    // 100 ms intervals: a burst of 8 queued tasks, then an idle wait of several intervals, so the
    // lifetime figures and the last interval's differ.
    let rt = Runtime::builder()
        .metrics_interval(Duration::from_millis(100))
        .build()
        .unwrap();
    let snap = rt.block_on(async {
        let tasks: Vec<_> = (0..8)
            .map(|_| spawn_named("burst", async { spin(Duration::from_millis(2)) }))
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        sleep(350).await;
        snapshot()
    });
    let json = serde_json::to_value(&snap).unwrap();
    let (rq, ls) = (&snap.run_queue, &snap.loop_stats);
    assert!(rq.max >= 7, "lifetime max {}", rq.max);
    assert!(
        rq.interval_max < rq.max,
        "{} vs {}",
        rq.interval_max,
        rq.max
    );
    assert!(
        rq.interval_mean < rq.mean,
        "{} vs {}",
        rq.interval_mean,
        rq.mean
    );
    assert!(rq.wait_seconds > 0.0);
    let lifetime_mean = rq.wait_seconds / snap.uptime_seconds;
    assert!(
        (lifetime_mean / rq.mean - 1.0).abs() < 1e-9,
        "the integral over the uptime is the lifetime mean: {lifetime_mean} vs {}",
        rq.mean
    );

    // A cluster worker's series: the primary's labels come first.
    let labels = vec![
        ("worker".to_owned(), "2".to_owned()),
        ("pid".to_owned(), snap.pid.to_string()),
    ];
    let text = prometheus::render_labeled(&[(labels.clone(), &snap)]);
    // (family, type, sample, the same figure in the JSON)
    for (family, kind, sample, pointer) in [
        (
            "nodus_run_queue_length_lifetime_max",
            "gauge",
            "nodus_run_queue_length_lifetime_max",
            "/run_queue/max",
        ),
        (
            "nodus_run_queue_length_mean",
            "gauge",
            "nodus_run_queue_length_mean",
            "/run_queue/interval_mean",
        ),
        (
            "nodus_run_queue_length_max",
            "gauge",
            "nodus_run_queue_length_max",
            "/run_queue/interval_max",
        ),
        (
            "nodus_run_queue_wait_seconds",
            "counter",
            "nodus_run_queue_wait_seconds_total",
            "/run_queue/wait_seconds",
        ),
        (
            "nodus_loop_interval_seconds",
            "gauge",
            "nodus_loop_interval_seconds",
            "/loop_stats/interval_seconds",
        ),
        (
            "nodus_loop_slow_poll_threshold_seconds",
            "gauge",
            "nodus_loop_slow_poll_threshold_seconds",
            "/loop_stats/slow_poll_threshold_seconds",
        ),
    ] {
        assert_eq!(
            family_type(&text, family).as_deref(),
            Some(kind),
            "{family}"
        );
        let got = series(&text, sample);
        assert_eq!(got.len(), 1, "{sample}: {got:?}");
        assert_eq!(got[0].labels, labels, "{sample}");
        let want = json.pointer(pointer).and_then(|v| v.as_f64()).unwrap();
        assert_eq!(got[0].value, want, "{sample} against the JSON's {pointer}");
    }
    assert_eq!(ls.slow_poll_threshold_seconds, 0.1);
    assert!(ls.interval_seconds >= 0.1, "{} s", ls.interval_seconds);
    // The lifetime utilization stays in the JSON: the counters give it.
    let busy = series(&text, "nodus_loop_busy_seconds_total")[0].value;
    let idle = series(&text, "nodus_loop_idle_seconds_total")[0].value;
    assert!((busy / (busy + idle) - ls.utilization).abs() < 1e-9);
}
