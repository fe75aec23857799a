//! Tasks, run modes, handles and misuse: the behaviour a user relies on beyond the Node corpus.

use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;
use std::time::{Duration, Instant};

use nodus::{
    Runtime, next_tick, queue_microtask, rt, set_immediate, set_interval, set_timeout, sleep,
    spawn, spawn_named, timeout, yield_now,
};

type Trace = Rc<RefCell<Vec<String>>>;

fn push(t: &Trace, s: impl Into<String>) {
    t.borrow_mut().push(s.into());
}

#[test]
fn block_on_returns_the_output_and_may_borrow() {
    let rt = Runtime::new();
    let mut local = vec![1, 2];
    let out = rt.block_on(async {
        sleep(2).await;
        local.push(3);
        local.len()
    });
    assert_eq!(out, 3);
    assert_eq!(local, [1, 2, 3]);
}

#[test]
fn spawned_tasks_join_and_abort() {
    let rt = Runtime::new();
    rt.block_on(async {
        let a = spawn(async { 7 });
        let b = spawn_named("worker:slow", async {
            sleep(10_000).await;
            0
        });
        assert_eq!(a.await.unwrap(), 7);
        assert!(b.id() > 0);
        if cfg!(feature = "measure") {
            let snap = nodus::metrics::snapshot();
            let named = snap.task_classes.iter().find(|c| c.name == "worker:slow");
            assert_eq!(named.map(|c| c.spawned), Some(1));
        }
        b.abort();
        assert!(b.await.unwrap_err().is_cancelled());
    });
}

#[test]
fn aborting_a_finished_task_keeps_its_output() {
    let rt = Runtime::new();
    rt.block_on(async {
        let a = spawn(async { "done" });
        yield_now().await;
        assert!(a.is_finished());
        a.abort();
        assert_eq!(a.await.unwrap(), "done");
    });
}

#[test]
fn a_panicking_task_reaches_its_handle_and_the_loop_keeps_running() {
    let rt = Runtime::new();
    let ticks = Rc::new(Cell::new(0));
    let t2 = ticks.clone();
    rt.block_on(async move {
        let iv = set_interval(1, move || t2.set(t2.get() + 1));
        let bad = spawn(async {
            sleep(2).await;
            panic!("boom in a task");
        });
        let err = bad.await.unwrap_err();
        assert!(err.is_panic());
        assert_eq!(err.panic_message(), Some("boom in a task"));
        sleep(5).await;
        iv.clear();
    });
    assert!(ticks.get() >= 2, "interval kept running: {}", ticks.get());
}

/// Runs `f`, which must panic with `message`.
fn panics_with(message: &str, f: impl FnOnce()) {
    let payload = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_err();
    let got = payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str));
    assert_eq!(got, Some(message));
}

#[test]
fn a_panicking_callback_unwinds_out_of_block_on_and_run_and_the_runtime_stays_usable() {
    let rt = Runtime::new();
    let trace: Trace = Rc::default();
    let t = trace.clone();
    panics_with("timer boom", || {
        rt.block_on(async move {
            set_timeout(1, || panic!("timer boom"));
            set_timeout(1, move || push(&t, "timer behind it"));
            sleep(1_000).await;
        })
    });
    let t = trace.clone();
    rt.enter(|| {
        set_immediate(|| next_tick(|| panic!("tick boom")));
        set_immediate(move || push(&t, "immediate behind it"));
    });
    panics_with("tick boom", || rt.run());
    let t = trace.clone();
    rt.enter(|| {
        set_immediate(|| panic!("immediate boom"));
        set_immediate(move || push(&t, "second immediate"));
    });
    panics_with("immediate boom", || rt.run());
    // Usable: what was queued behind each panic runs, and so does new work.
    assert_eq!(
        rt.block_on(async {
            sleep(1).await;
            7
        }),
        7
    );
    rt.run();
    let mut got = trace.borrow().clone();
    got.sort();
    assert_eq!(
        got,
        ["immediate behind it", "second immediate", "timer behind it"]
    );
}

#[test]
fn dropped_join_handle_detaches() {
    let rt = Runtime::new();
    let done = Rc::new(Cell::new(false));
    let d = done.clone();
    rt.enter(|| {
        drop(spawn(async move {
            sleep(3).await;
            d.set(true);
        }));
    });
    rt.run();
    assert!(done.get());
}

#[test]
#[should_panic(
    expected = "called from inside a running nodus loop; a thread runs one loop at a time"
)]
fn block_on_inside_a_running_loop_panics_clearly() {
    let rt = Runtime::new();
    rt.block_on(async {
        let inner = Runtime::new();
        inner.block_on(async {});
    });
}

#[test]
#[should_panic(expected = "nodus::set_timeout called on a thread with no nodus loop")]
fn a_call_outside_any_loop_panics_clearly() {
    set_timeout(1, || {});
}

#[test]
fn a_loop_call_on_a_pool_thread_panics_naming_the_way_out_which_works() {
    let rt = Runtime::new();
    let loop_id = rt.id();
    rt.block_on(async {
        let err = nodus::offload_cpu(|| {
            set_timeout(1, || {});
        })
        .await
        .unwrap_err();
        let nodus::OffloadError::Panicked(msg) = err else {
            panic!("not a panic: {err:?}")
        };
        assert!(
            msg.contains("nodus::set_timeout called on a thread with no nodus loop"),
            "{msg}"
        );
        assert!(
            msg.contains("offload_cpu") && msg.contains("nodus::LoopHandle::current()"),
            "{msg}"
        );
        assert!(msg.contains("handle.post(move || ...)"), "{msg}");
        // The way out it names.
        let handle = nodus::LoopHandle::current();
        let (tx, rx) = std::sync::mpsc::channel();
        nodus::offload_cpu(move || {
            handle.post(move || {
                spawn(async move { tx.send(rt::handle().loop_id()).unwrap() }).detach();
            });
        })
        .await
        .unwrap();
        sleep(5).await;
        assert_eq!(rx.try_recv(), Ok(loop_id));
    });
}

#[test]
#[should_panic(expected = "longer than the maximum")]
fn a_timer_of_duration_max_panics_clearly() {
    let rt = Runtime::new();
    rt.enter(|| {
        set_timeout(Duration::MAX, || {});
    });
}

#[test]
fn the_timer_futures_take_delays_past_nodes_maximum() {
    let rt = Runtime::new();
    let forty_days = Duration::from_secs(40 * 86_400);
    let (left, answer, forever) = rt.block_on(async move {
        let s = sleep(forty_days);
        let left = s.deadline() - Instant::now();
        // Each future is pending once, so the timeout's timer is armed before it completes.
        let answer = timeout(forty_days, async {
            yield_now().await;
            42
        })
        .await;
        let forever = timeout(Duration::MAX, async {
            yield_now().await;
            7
        })
        .await;
        (left, answer, forever)
    });
    assert!(
        left > forty_days - Duration::from_secs(60),
        "deadline in {left:?}"
    );
    assert_eq!(answer, Ok(42));
    assert_eq!(forever, Ok(7));
}

#[test]
fn run_returns_when_nothing_refd_is_alive() {
    let rt = Runtime::new();
    let fired = Rc::new(Cell::new(0));
    let f = fired.clone();
    rt.enter(|| {
        set_timeout(60_000, || unreachable!()).unref();
        let mut s = sleep(60_000);
        s.unref();
        drop(spawn(async move {
            s.await;
            unreachable!()
        }));
        set_timeout(5, move || f.set(1));
    });
    let start = Instant::now();
    rt.run();
    assert_eq!(fired.get(), 1);
    assert!(start.elapsed() < Duration::from_secs(10));
}

#[test]
fn yield_now_and_self_wakes_run_in_the_check_phase_after_queued_immediates() {
    let rt = Runtime::new();
    let t: Trace = Rc::default();
    let t2 = t.clone();
    rt.block_on(async move {
        let a = t2.clone();
        set_immediate(move || push(&a, "immediate-1"));
        yield_now().await;
        push(&t2, "after-yield");
        let b = t2.clone();
        set_immediate(move || push(&b, "immediate-2"));
        // The idiom other crates use to yield: wake yourself and return Pending.
        let mut first = true;
        poll_fn(|cx| {
            if std::mem::take(&mut first) {
                cx.waker().wake_by_ref();
                Poll::Pending
            } else {
                Poll::Ready(())
            }
        })
        .await;
        push(&t2, "after-self-wake");
    });
    assert_eq!(
        *t.borrow(),
        [
            "immediate-1",
            "after-yield",
            "immediate-2",
            "after-self-wake"
        ]
    );
}

#[test]
fn inside_a_timer_callback_an_immediate_runs_before_a_new_zero_timer() {
    for _ in 0..20 {
        let rt = Runtime::new();
        let t: Trace = Rc::default();
        let t2 = t.clone();
        rt.enter(|| {
            set_timeout(1, move || {
                let (a, b) = (t2.clone(), t2.clone());
                set_timeout(0, move || push(&a, "timeout"));
                set_immediate(move || push(&b, "immediate"));
            });
        });
        rt.run();
        assert_eq!(*t.borrow(), ["immediate", "timeout"]);
    }
}

#[test]
fn inside_a_poll_phase_callback_an_immediate_runs_before_a_new_zero_timer() {
    for _ in 0..20 {
        let rt = Runtime::new();
        let handle = rt.handle();
        let trace = Arc::new(std::sync::Mutex::new(Vec::new()));
        let t = trace.clone();
        rt.block_on(async move {
            // A closure posted from another thread runs in the poll phase, like an I/O callback.
            std::thread::spawn(move || {
                handle.post(move || {
                    let (a, b) = (t.clone(), t.clone());
                    set_timeout(0, move || a.lock().unwrap().push("timeout"));
                    set_immediate(move || b.lock().unwrap().push("immediate"));
                });
            });
            while trace.lock().unwrap().len() < 2 {
                sleep(1).await;
            }
            assert_eq!(*trace.lock().unwrap(), ["immediate", "timeout"]);
        });
    }
}

#[test]
fn close_callbacks_run_after_the_check_phase_in_close_order() {
    let rt = Runtime::new();
    let t: Trace = Rc::default();
    let t2 = t.clone();
    rt.enter(|| {
        set_timeout(1, move || {
            let (a, b, c) = (t2.clone(), t2.clone(), t2.clone());
            let timer = set_timeout(50, || unreachable!());
            timer.close(move || push(&a, "close-timer"));
            let imm = set_immediate(|| unreachable!());
            imm.close(move || push(&b, "close-immediate"));
            set_immediate(move || push(&c, "immediate"));
        });
    });
    rt.run();
    assert_eq!(*t.borrow(), ["immediate", "close-timer", "close-immediate"]);
}

#[test]
fn hooks_pending_and_run_modes() {
    let rt = Runtime::new();
    let t: Trace = Rc::default();
    let (a, b, c) = (t.clone(), t.clone(), t.clone());
    let (idle, prepare) = rt.enter(|| {
        rt::defer(move || push(&a, "pending"));
        let i = rt::idle(move || push(&b, "idle"));
        let p = rt::prepare(move || push(&c, "prepare"));
        (i, p)
    });
    let start = Instant::now();
    // An active idle hook keeps the poll from blocking: run_once returns at once.
    assert!(rt.run_once());
    assert!(start.elapsed() < Duration::from_secs(1));
    assert_eq!(*t.borrow(), ["pending", "idle", "prepare"]);
    rt.enter(|| {
        idle.stop();
        prepare.unref();
    });
    assert!(
        !rt.run_nowait(),
        "an unref'd prepare hook does not keep the loop alive"
    );
    assert_eq!(t.borrow().last().unwrap(), "prepare");
    rt.enter(|| prepare.stop());
}

#[test]
fn ref_and_unref_count_once_per_transition() {
    let rt = Runtime::new();
    let ran = Rc::new(Cell::new(false));
    let r = ran.clone();
    let (timer, immediate, hook) = rt.enter(|| {
        let timer = set_timeout(60_000, || unreachable!());
        let immediate = set_immediate(move || r.set(true));
        (timer, immediate, rt::prepare(|| {}))
    });
    rt.enter(|| {
        for _ in 0..2 {
            timer.unref();
            immediate.unref();
            hook.unref();
        }
        assert!(!timer.has_ref() && !immediate.has_ref() && !hook.has_ref());
        for _ in 0..2 {
            timer.ref_();
            immediate.ref_();
            hook.ref_();
        }
        assert!(timer.has_ref() && immediate.has_ref() && hook.has_ref());
        timer.unref();
        hook.unref();
    });
    // Only the immediate is ref'd: once it ran, nothing keeps the loop alive.
    assert!(
        !rt.run_nowait(),
        "a repeated ref or unref was counted twice"
    );
    assert!(ran.get());
    rt.enter(|| {
        timer.clear();
        hook.stop();
    });
}

#[test]
fn stop_ends_run_after_the_current_iteration() {
    let rt = Runtime::new();
    let n = Rc::new(Cell::new(0));
    let n2 = n.clone();
    rt.enter(|| {
        set_interval(1, move || {
            n2.set(n2.get() + 1);
            if n2.get() == 3 {
                rt::stop();
            }
        });
    });
    rt.run();
    assert_eq!(n.get(), 3);
}

#[test]
fn wakes_from_other_threads_reach_the_loop() {
    let rt = Runtime::new();
    let flag = Arc::new(AtomicBool::new(false));
    let f = flag.clone();
    let out = rt.block_on(async move {
        let mut started = false;
        poll_fn(|cx| {
            if f.load(Ordering::Acquire) {
                return Poll::Ready("woken");
            }
            if !std::mem::replace(&mut started, true) {
                let waker = cx.waker().clone();
                let f = f.clone();
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(20));
                    f.store(true, Ordering::Release);
                    waker.wake();
                });
            }
            Poll::Pending
        })
        .await
    });
    assert_eq!(out, "woken");
    assert!(flag.load(Ordering::Acquire));
}

#[test]
fn posted_closures_run_on_the_loop_thread() {
    let rt = Runtime::new();
    let handle = rt.handle();
    let loop_thread = std::thread::current().id();
    let ran = rt.block_on(async move {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            assert!(handle.post(move || tx.send(std::thread::current().id()).unwrap()));
        });
        loop {
            if let Ok(id) = rx.try_recv() {
                return id;
            }
            sleep(1).await;
        }
    });
    assert_eq!(ran, loop_thread);
}

#[test]
fn timeout_and_interval_futures() {
    let rt = Runtime::new();
    rt.block_on(async {
        assert!(timeout(5, sleep(1_000)).await.is_err());
        assert_eq!(timeout(1_000, async { 3 }).await, Ok(3));
        let mut iv = nodus::interval(2);
        let start = Instant::now();
        for _ in 0..3 {
            iv.tick().await;
        }
        assert!(start.elapsed() >= Duration::from_millis(6));
    });
}

/// Busy on the loop's thread for `ms` (a CPU-heavy step, a slow synchronous call).
fn spin(ms: u64) {
    let end = Instant::now() + Duration::from_millis(ms);
    while Instant::now() < end {}
}

fn at_least(took: Duration, ms: u64, what: &str) {
    let want = Duration::from_millis(ms);
    assert!(took >= want, "{what} took {took:?}, less than {want:?}");
}

#[test]
fn timer_futures_count_from_the_call_not_from_the_start_of_the_poll() {
    let rt = Runtime::new();
    rt.block_on(async {
        spin(300);
        let t = Instant::now();
        sleep(200).await;
        at_least(t.elapsed(), 200, "sleep(200) after a 300 ms step");

        spin(300);
        let t = Instant::now();
        assert!(timeout(200, std::future::pending::<()>()).await.is_err());
        at_least(t.elapsed(), 200, "timeout(200) after a 300 ms step");

        spin(150);
        let t = Instant::now();
        nodus::interval(100).tick().await;
        at_least(
            t.elapsed(),
            100,
            "interval(100)'s first tick after a 150 ms step",
        );

        let mut s = sleep(1);
        spin(150);
        let t = Instant::now();
        s.reset(100);
        s.await;
        at_least(
            t.elapsed(),
            100,
            "a sleep reset to 100 ms after a 150 ms step",
        );
    });
}

#[test]
fn set_timeout_and_set_interval_count_from_the_call_not_from_the_start_of_the_callback() {
    let rt = Runtime::new();
    let took: Rc<RefCell<Vec<(&str, Duration)>>> = Rc::default();
    let (a, b) = (took.clone(), took.clone());
    rt.enter(|| {
        set_timeout(1, move || {
            spin(200);
            let t = Instant::now();
            set_timeout(150, move || {
                a.borrow_mut().push(("set_timeout(150)", t.elapsed()))
            });
            let t = Instant::now();
            let iv: Rc<Cell<Option<nodus::Timer>>> = Rc::default();
            let iv2 = iv.clone();
            iv.set(Some(set_interval(150, move || {
                b.borrow_mut().push(("set_interval(150)", t.elapsed()));
                iv2.get().unwrap().clear();
            })));
        });
    });
    rt.run();
    let took = took.borrow();
    assert_eq!(took.len(), 2, "{took:?}");
    for &(what, d) in took.iter() {
        at_least(
            d,
            150,
            &format!("{what} after a 200 ms step in a timer callback"),
        );
    }
}

#[test]
fn an_interval_rearms_from_its_callbacks_start_not_from_its_timers_pass() {
    let rt = Runtime::new();
    let runs: Rc<RefCell<Vec<Instant>>> = Rc::default();
    let r = runs.clone();
    rt.enter(|| {
        // Both are due in the first timers pass; the timeout runs first and holds the loop.
        set_timeout(40, || spin(300));
        let iv: Rc<Cell<Option<nodus::Timer>>> = Rc::default();
        let iv2 = iv.clone();
        iv.set(Some(set_interval(50, move || {
            r.borrow_mut().push(Instant::now());
            if r.borrow().len() == 2 {
                iv2.get().unwrap().clear();
            }
        })));
        spin(60);
    });
    rt.run();
    let runs = runs.borrow();
    assert_eq!(runs.len(), 2);
    at_least(
        runs[1] - runs[0],
        50,
        "the interval's second period after a slow pass",
    );
}

#[test]
fn ticks_run_before_microtasks_inside_tasks_too() {
    let rt = Runtime::new();
    let t: Trace = Rc::default();
    let t2 = t.clone();
    rt.block_on(async move {
        let (a, b) = (t2.clone(), t2.clone());
        queue_microtask(move || push(&a, "microtask"));
        next_tick(move || push(&b, "tick"));
        yield_now().await;
    });
    assert_eq!(*t.borrow(), ["tick", "microtask"]);
}

/// Runs its closure when dropped.
struct OnDrop<F: FnOnce()>(Option<F>);

impl<F: FnOnce()> Drop for OnDrop<F> {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f()
        }
    }
}

/// A flag and a value that sets it when dropped (on the thread that drops it).
fn drop_flag() -> (Rc<Cell<bool>>, impl Drop) {
    let dropped = Rc::new(Cell::new(false));
    let d = dropped.clone();
    (dropped, OnDrop(Some(move || d.set(true))))
}

#[test]
fn dropping_the_runtime_drops_pending_tasks_on_the_loop_thread() {
    let (dropped, f) = drop_flag();
    let rt = Runtime::new();
    rt.enter(|| {
        drop(spawn(async move {
            let _f = f;
            sleep(60_000).await;
        }))
    });
    rt.run_nowait();
    assert!(!dropped.get());
    drop(rt);
    assert!(dropped.get());
}

#[test]
fn dropping_the_runtime_drops_a_task_whose_handle_is_held_and_the_handle_resolves_cancelled() {
    let (dropped, f) = drop_flag();
    let rt = Runtime::new();
    let h = rt.enter(|| {
        spawn(async move {
            let _f = f;
            sleep(100_000).await;
            7
        })
    });
    rt.run_nowait();
    assert!(!dropped.get());
    drop(rt);
    assert!(
        dropped.get(),
        "the task's future was dropped with the runtime"
    );
    assert!(h.is_finished());
    let out = Runtime::new().block_on(timeout(500, h));
    assert!(
        out.expect("the handle resolved")
            .unwrap_err()
            .is_cancelled()
    );
}

#[test]
fn dropping_the_runtime_wakes_a_handle_awaited_on_another_loop() {
    let (dropped, f) = drop_flag();
    let rt = Runtime::new();
    let h = rt.enter(|| {
        spawn(async move {
            let _f = f;
            std::future::pending::<()>().await
        })
    });
    let other = Runtime::new();
    let out = other.block_on(async {
        let waiter = spawn(h);
        yield_now().await; // the waiter is parked on the handle
        drop(rt);
        timeout(500, waiter).await
    });
    assert!(dropped.get());
    let joined = out
        .expect("the waiter was woken")
        .expect("the waiter finished");
    assert!(joined.unwrap_err().is_cancelled());
}

#[test]
fn dropping_the_runtime_drops_a_detached_task_nothing_can_wake() {
    let (dropped, f) = drop_flag();
    let rt = Runtime::new();
    rt.enter(|| {
        spawn(async move {
            let _f = f;
            std::future::pending::<()>().await
        })
        .detach()
    });
    rt.run_nowait();
    assert!(!dropped.get());
    drop(rt);
    assert!(dropped.get());
}

#[test]
fn a_task_dropped_at_shutdown_may_cancel_timers_close_fds_and_spawn() {
    let rt = Runtime::new();
    let (dropped, f) = drop_flag();
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let h = rt.enter(|| {
        spawn(async move {
            let listener = nodus::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
            addr_tx.send(listener.local_addr().unwrap()).unwrap();
            let timer = set_timeout(100_000, || {});
            let _on_drop = OnDrop(Some(move || {
                nodus::clear_timeout(&timer);
                set_timeout(1, || {});
                set_immediate(|| {});
                spawn(async move {
                    let _f = f;
                    sleep(1).await;
                })
                .detach();
            }));
            let _listener = listener;
            sleep(100_000).await;
        })
    });
    rt.run_nowait();
    let addr = addr_rx.recv().unwrap();
    drop(rt);
    assert!(
        dropped.get(),
        "the task spawned during the drop was dropped too"
    );
    let refused = std::net::TcpStream::connect(addr).unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
    let out = Runtime::new().block_on(h);
    assert!(out.unwrap_err().is_cancelled());
}

#[test]
fn a_panic_in_a_task_futures_drop_at_shutdown_neither_aborts_nor_stops_the_rest() {
    let (dropped, f) = drop_flag();
    let rt = Runtime::new();
    let (bad, good) = rt.enter(|| {
        let bad = spawn(async {
            let _boom = OnDrop(Some(|| panic!("boom in a task's drop")));
            std::future::pending::<()>().await
        });
        let good = spawn(async move {
            let _f = f;
            std::future::pending::<()>().await
        });
        (bad, good)
    });
    rt.run_nowait();
    drop(rt);
    assert!(
        dropped.get(),
        "the task after the panicking one was dropped too"
    );
    let rt = Runtime::new();
    assert!(rt.block_on(bad).unwrap_err().is_cancelled());
    assert!(rt.block_on(good).unwrap_err().is_cancelled());
}

#[test]
fn two_panicking_drops_at_shutdown_do_not_abort_and_the_first_propagates() {
    let (dropped, f) = drop_flag();
    let rt = Runtime::new();
    rt.enter(|| {
        let first = OnDrop(Some(|| panic!("first boom")));
        let second = OnDrop(Some(|| panic!("second boom")));
        set_timeout(100_000, move || drop(first));
        set_timeout(100_000, move || drop(second));
        drop(spawn(async move {
            let _f = f;
            std::future::pending::<()>().await
        }));
    });
    let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(rt)))
        .expect_err("the runtime's drop resumes the panic");
    assert_eq!(panic.downcast_ref::<&str>(), Some(&"first boom"));
    assert!(dropped.get(), "the task was dropped despite the panics");
}

#[test]
fn a_panic_in_a_callbacks_drop_at_shutdown_still_drops_every_task_then_propagates() {
    let (dropped, f) = drop_flag();
    let rt = Runtime::new();
    let h = rt.enter(|| {
        let boom = OnDrop(Some(|| panic!("boom in a callback's drop")));
        set_timeout(100_000, move || drop(boom));
        spawn(async move {
            let _f = f;
            std::future::pending::<()>().await
        })
    });
    let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(rt)))
        .expect_err("the runtime's drop resumes the panic");
    assert_eq!(
        panic.downcast_ref::<&str>(),
        Some(&"boom in a callback's drop")
    );
    assert!(dropped.get(), "the task was dropped despite the panic");
    assert!(Runtime::new().block_on(h).unwrap_err().is_cancelled());
}

/// Runs `f` on a thread of its own and fails if it has not returned within `limit` (the thread,
/// spinning or blocked, is left behind): a test that would hang fails instead.
fn within(limit: Duration, f: impl FnOnce() + Send + 'static) {
    let (tx, rx) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    match rx.recv_timeout(limit) {
        Ok(()) => t.join().unwrap(),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            std::panic::resume_unwind(t.join().unwrap_err())
        }
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("hung for {limit:?}"),
    }
}

/// `stop` under `block_on` neither ends it nor makes it busy-poll, with nothing registered (it
/// used to spin forever, its clock frozen) or with an fd, and is discarded when it returns: the
/// next `run` runs its timer.
#[test]
fn stop_inside_block_on_neither_spins_nor_outlives_it() {
    within(Duration::from_secs(10), || {
        let rt = Runtime::new();
        for with_fd in [false, true] {
            let listener =
                with_fd.then(|| rt.enter(|| nodus::net::TcpListener::bind("127.0.0.1:0").unwrap()));
            let iterations = Rc::new(Cell::new(0u32));
            let n = iterations.clone();
            let start = Instant::now();
            rt.block_on(async move {
                let hook = rt::prepare(move || n.set(n.get() + 1));
                rt::stop();
                sleep(Duration::from_millis(20)).await;
                hook.stop();
            });
            assert!(start.elapsed() >= Duration::from_millis(20));
            assert!(
                iterations.get() < 50,
                "block_on busy-polled after stop ({} iterations in 20 ms, fd: {with_fd})",
                iterations.get()
            );
            drop(listener);
        }
        let fired = Rc::new(Cell::new(false));
        let f = fired.clone();
        rt.enter(|| set_timeout(5, move || f.set(true)));
        rt.run();
        assert!(
            fired.get(),
            "the stop requested under block_on ended a later run"
        );
    });
}

/// A post from another thread while no `run` runs is queued, not lost: the next `run` runs it.
/// Posting keeps nothing alive by itself: with nothing queued, `run` returns at once.
#[test]
fn a_post_between_runs_is_run_by_the_next_run() {
    within(Duration::from_secs(10), || {
        let rt = Runtime::new();
        let h = rt.handle();
        rt.run();
        let ran = Arc::new(AtomicBool::new(false));
        let r = ran.clone();
        std::thread::spawn(move || assert!(h.post(move || r.store(true, Ordering::Release))))
            .join()
            .unwrap();
        rt.run();
        assert!(ran.load(Ordering::Acquire), "the post was lost");
    });
}

/// A task run by `run`, parked, then woken from another thread once `run` has returned: the next
/// `run` polls it.
#[test]
fn a_wake_from_another_thread_between_runs_is_run_by_the_next_run() {
    within(Duration::from_secs(10), || {
        let rt = Runtime::new();
        let (tx, rx) = std::sync::mpsc::channel();
        let polls = Rc::new(Cell::new(0));
        let p = polls.clone();
        rt.enter(|| {
            spawn(poll_fn(move |cx| {
                p.set(p.get() + 1);
                if p.get() == 1 {
                    tx.send(cx.waker().clone()).unwrap();
                    return Poll::Pending;
                }
                Poll::Ready(())
            }))
            .detach()
        });
        rt.run();
        assert_eq!(polls.get(), 1);
        let waker: std::task::Waker = rx.recv().unwrap();
        std::thread::spawn(move || waker.wake()).join().unwrap();
        rt.run();
        assert_eq!(polls.get(), 2, "the wake from another thread was lost");
    });
}

/// Catches the panic of one `run`, which must be `message`'s.
fn run_panics_with(rt: &Runtime, message: &str) {
    panics_with(message, || rt.run());
}

/// An interval whose callback panics is re-armed as if the callback had returned (Node re-arms
/// in a `finally`): still active and ref'd, it runs again at the next `run`, which returns once
/// it is cleared. It used to stay `Running` off the heap: never fired again, and `run` hung.
#[test]
fn a_panicking_interval_stays_armed_and_runs_again() {
    within(Duration::from_secs(10), || {
        let rt = Runtime::new();
        let runs = Rc::new(Cell::new(0));
        let slot: Rc<Cell<Option<nodus::Timer>>> = Rc::default();
        let (n, s) = (runs.clone(), slot.clone());
        let iv = rt.enter(|| {
            set_interval(1, move || {
                n.set(n.get() + 1);
                match n.get() {
                    2 => panic!("interval boom"),
                    4 => s.get().unwrap().clear(),
                    _ => {}
                }
            })
        });
        slot.set(Some(iv));
        run_panics_with(&rt, "interval boom");
        assert_eq!(runs.get(), 2);
        assert!(rt.enter(|| iv.is_active() && iv.has_ref()));
        rt.run();
        assert_eq!(runs.get(), 4, "the interval ran again after its panic");
        assert!(!rt.enter(|| iv.is_active()));
    });
}

/// An idle or prepare hook whose callback panics keeps its callback and stays registered (a
/// libuv handle stays active): the next `run` runs it again and returns once it is stopped. The
/// callback used to be lost: the hook kept the loop alive with nothing to run (an idle hook
/// spinning it).
fn a_panicking_hook_stays_registered_and_runs_again(start: fn(Box<dyn FnMut()>) -> rt::HookHandle) {
    within(Duration::from_secs(10), move || {
        let rt = Runtime::new();
        let runs = Rc::new(Cell::new(0));
        let slot: Rc<RefCell<Option<rt::HookHandle>>> = Rc::default();
        let (n, s) = (runs.clone(), slot.clone());
        let hook = rt.enter(|| {
            start(Box::new(move || {
                n.set(n.get() + 1);
                match n.get() {
                    2 => panic!("hook boom"),
                    4 => s.borrow().as_ref().unwrap().stop(),
                    _ => {}
                }
            }))
        });
        *slot.borrow_mut() = Some(hook);
        // Keeps the poll phase from blocking (a prepare hook alone runs once per poll) and
        // `run` from ending while the hook under test is registered.
        rt.enter(|| rt::idle(|| {}).unref());
        run_panics_with(&rt, "hook boom");
        assert_eq!(runs.get(), 2);
        rt.run();
        assert_eq!(runs.get(), 4, "the hook ran again after its panic");
    });
}

#[test]
fn a_panicking_idle_hook_stays_registered_and_runs_again() {
    a_panicking_hook_stays_registered_and_runs_again(|f| rt::idle(f));
}

#[test]
fn a_panicking_prepare_hook_stays_registered_and_runs_again() {
    a_panicking_hook_stays_registered_and_runs_again(|f| rt::prepare(f));
}

/// A pending or close callback that panics ends the phase, but those queued behind it in the
/// same phase are not lost: they run at the next `run`, in their order, ahead of any queued
/// since. They used to be dropped with the phase's batch.
#[test]
fn callbacks_behind_a_panicking_pending_or_close_callback_run_at_the_next_run() {
    let rt = Runtime::new();
    let trace: Trace = Rc::default();
    let (a, b) = (trace.clone(), trace.clone());
    rt.enter(|| {
        rt::defer(|| panic!("pending boom"));
        rt::defer(move || push(&a, "pending 1"));
        rt::defer(move || push(&b, "pending 2"));
    });
    run_panics_with(&rt, "pending boom");
    let c = trace.clone();
    rt.enter(|| rt::defer(move || push(&c, "pending queued after")));
    rt.run();
    let (a, b) = (trace.clone(), trace.clone());
    rt.enter(|| {
        set_timeout(1_000, || {}).close(|| panic!("close boom"));
        set_timeout(1_000, || {}).close(move || push(&a, "close 1"));
        rt::idle(|| {}).close(move || push(&b, "close 2"));
    });
    run_panics_with(&rt, "close boom");
    rt.run();
    assert_eq!(
        *trace.borrow(),
        [
            "pending 1",
            "pending 2",
            "pending queued after",
            "close 1",
            "close 2"
        ]
    );
}

/// Node 20 (libuv 1.45+ runs timers at the end of each pass, before it looks at what is alive):
/// an unref'd timer due when the last ref'd work ends fires before `run` returns.
/// `setTimeout(3).unref(); setImmediate(() => busy 6 ms)` prints `imm`, `unref timer`.
#[test]
fn run_fires_an_unrefd_timer_that_is_due_when_the_last_refd_work_ends() {
    let rt = Runtime::new();
    let trace: Trace = Rc::default();
    let (t1, t2) = (trace.clone(), trace.clone());
    rt.enter(|| {
        set_timeout(3, move || push(&t1, "unref timer")).unref();
        set_immediate(move || {
            push(&t2, "imm");
            let until = Instant::now() + Duration::from_millis(6);
            while Instant::now() < until {}
        });
    });
    rt.run();
    assert_eq!(*trace.borrow(), ["imm", "unref timer"]);
}

/// libuv's `UV_RUN_ONCE`: a pass that waited in the poll phase for a timer runs it.
#[test]
fn run_once_runs_the_timer_it_waited_for() {
    let rt = Runtime::new();
    let fired = Rc::new(Cell::new(false));
    let f = fired.clone();
    rt.enter(|| set_timeout(20, move || f.set(true)));
    let alive = rt.run_once();
    assert!(
        fired.get(),
        "the timer fired within the pass that waited for it"
    );
    assert!(!alive);
}
