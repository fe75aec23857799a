//! Handles that name an entry of a loop (timers, sleeps, immediates, hooks) act on the loop that
//! made them wherever they are used or dropped: after `block_on` returned (no loop current),
//! while another `Runtime` is current or is being dropped, on another thread (through the loop's
//! remote queue; a query, or a `close` with its non-`Send` callback, panics there), and do
//! nothing once their own `Runtime` is gone. They never reach another loop's entry, even one
//! under the same slab key, nor a later entry of their own loop in a slot they left.
//!
//! Bounded: every loop is run with `run_nowait` (no blocking) but those whose `run` an unref'd
//! 10 s timer stops, and the timers are 60 s ones that never fire during a test (or 2 s ones
//! that must not).

use std::cell::{Cell, RefCell};
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use nodus::rt::{self, HookHandle};
use nodus::{Runtime, set_immediate, set_interval, set_timeout, sleep};

const LONG: Duration = Duration::from_secs(60);

/// Polls `f` once on `rt`'s loop (arming a timer there); it must be pending.
fn arm<F: Future + Unpin>(rt: &Runtime, f: &mut F) {
    rt.block_on(poll_fn(|cx| {
        assert!(Pin::new(&mut *f).poll(cx).is_pending());
        Poll::Ready(())
    }));
}

/// The id of the loop running the caller (for callbacks to say where they ran).
fn here() -> u64 {
    rt::handle().loop_id()
}

#[test]
fn a_sleep_dropped_or_unrefd_outside_any_loop_leaves_its_loop() {
    let rt = Runtime::new();
    let mut s = sleep(LONG);
    arm(&rt, &mut s);
    assert!(rt.run_nowait(), "an armed sleep keeps its loop alive");
    drop(s); // no loop is current
    assert!(
        !rt.run_nowait(),
        "a sleep dropped after block_on returned still keeps its loop alive"
    );

    let mut s = sleep(LONG);
    arm(&rt, &mut s);
    s.unref();
    assert!(!rt.run_nowait(), "unref outside the loop was not counted");

    // An interval and a timeout hold a sleep too.
    let mut i = nodus::interval(LONG);
    rt.block_on(poll_fn(|cx| {
        assert!(i.poll_tick(cx).is_pending());
        Poll::Ready(())
    }));
    let mut t = Box::pin(nodus::timeout(LONG, std::future::pending::<()>()));
    rt.block_on(poll_fn(|cx| {
        assert!(t.as_mut().poll(cx).is_pending());
        Poll::Ready(())
    }));
    assert!(rt.run_nowait());
    drop((i, t));
    assert!(
        !rt.run_nowait(),
        "a dropped interval or timeout is still armed"
    );
    drop(s);
}

/// `Sleep` is `Send` (hyper's timer requires it): dropped, reset or unref'd on another thread,
/// it reaches its loop through the loop's remote queue, never its thread-local state.
#[test]
fn a_sleep_dropped_reset_or_unrefd_on_another_thread_leaves_its_loop() {
    let rt = Runtime::new();
    let elsewhere = |f: Box<dyn FnOnce() + Send>| std::thread::spawn(f).join().unwrap();

    let mut s = sleep(LONG);
    arm(&rt, &mut s);
    elsewhere(Box::new(move || drop(s)));
    assert!(
        !rt.run_nowait(),
        "a sleep dropped on another thread still keeps its loop alive"
    );

    let mut s = sleep(LONG);
    arm(&rt, &mut s);
    let s = std::thread::spawn(move || {
        s.unref();
        s
    })
    .join()
    .unwrap();
    assert!(!rt.run_nowait(), "unref on another thread was not counted");
    drop(s);

    let mut s = sleep(LONG);
    arm(&rt, &mut s);
    let mut s = std::thread::spawn(move || {
        s.reset(LONG);
        s
    })
    .join()
    .unwrap();
    assert!(
        !rt.run_nowait(),
        "a sleep reset on another thread left its timer armed"
    );
    // Armed again (and only once) where it is next polled.
    arm(&rt, &mut s);
    assert!(rt.run_nowait());
    drop(s);
    assert!(!rt.run_nowait());

    // An interval and a timeout hold a sleep too.
    let mut i = nodus::interval(LONG);
    rt.block_on(poll_fn(|cx| {
        assert!(i.poll_tick(cx).is_pending());
        Poll::Ready(())
    }));
    let mut t = Box::pin(nodus::timeout(LONG, std::future::pending::<()>()));
    arm(&rt, &mut t);
    elsewhere(Box::new(move || drop((i, t))));
    assert!(
        !rt.run_nowait(),
        "an interval or timeout dropped on another thread is still armed"
    );

    // Once its loop is gone: nothing to reach.
    let mut s = sleep(LONG);
    arm(&rt, &mut s);
    drop(rt);
    elsewhere(Box::new(move || drop(s)));
}

/// The remote queue wakes a loop blocked on the sleep's timer: `run` returns once the sleep is
/// dropped on another thread, not at its deadline. Bounded by an unref'd 10 s timer.
#[test]
fn a_sleep_dropped_on_another_thread_lets_a_blocked_run_return() {
    let rt = Runtime::new();
    let mut s = sleep(LONG);
    arm(&rt, &mut s);
    let late = bound_run(&rt);
    let dropper = while_run_blocks(move || drop(s));
    rt.run();
    dropper.join().unwrap();
    assert!(
        !late.get(),
        "run went on for 10 s after the sleep keeping it alive was dropped"
    );
}

#[test]
fn a_sleep_dropped_while_another_loop_is_current_leaves_its_own_loop_only() {
    let (rt1, rt2) = (Runtime::new(), Runtime::new());
    let mut s1 = sleep(LONG);
    arm(&rt1, &mut s1);
    // The same slot and timer id in the other loop's queue.
    let mut s2 = sleep(LONG);
    arm(&rt2, &mut s2);
    rt2.enter(|| drop(s1));
    assert!(
        !rt1.run_nowait(),
        "a sleep dropped while another loop was current is still armed in its own"
    );
    assert!(
        rt2.run_nowait(),
        "the other loop's timer in the same slot was cancelled"
    );

    // Dropped by another runtime's shutdown (a task of rt2 held rt1's sleep).
    let mut s1 = sleep(LONG);
    arm(&rt1, &mut s1);
    rt2.enter(|| {
        nodus::spawn(async move {
            let _held = s1;
            std::future::pending::<()>().await
        })
        .detach()
    });
    assert!(rt1.run_nowait());
    drop(rt2);
    assert!(
        !rt1.run_nowait(),
        "a sleep dropped by another runtime's drop is still armed"
    );

    // Outliving its runtime: nothing to do, and nothing done to another loop.
    let rt3 = Runtime::new();
    let mut s3 = sleep(LONG);
    arm(&rt3, &mut s3);
    drop(s2);
    let mut s1 = sleep(LONG);
    arm(&rt1, &mut s1);
    drop(rt1);
    rt3.enter(|| drop(s1));
    assert!(
        rt3.run_nowait(),
        "a stale sleep cancelled another loop's timer"
    );
    drop(s3);
    assert!(!rt3.run_nowait());
}

#[test]
fn a_timer_handle_acts_on_its_own_loop_wherever_it_is_used() {
    let (rt1, rt2) = (Runtime::new(), Runtime::new());
    let t1 = rt1.enter(|| set_timeout(LONG, || {}));
    let t2 = rt2.enter(|| set_timeout(LONG, || {}));

    rt2.enter(|| {
        t1.unref();
        assert!(!t1.has_ref() && t1.is_active());
    });
    assert!(!rt1.run_nowait(), "unref with another loop current");
    assert!(rt2.run_nowait());
    rt2.enter(|| assert!(t2.has_ref(), "the other loop's timer was unref'd"));

    // With no loop current (this used to panic).
    t1.ref_();
    assert!(t1.has_ref());
    assert!(rt1.run_nowait());
    t1.clear();
    assert!(!t1.is_active());
    assert!(!rt1.run_nowait(), "a cleared timer keeps its loop alive");

    // An interval cleared while another loop is current never fires.
    let fired = Rc::new(Cell::new(0));
    let f = fired.clone();
    let i = rt1.enter(|| set_interval(1, move || f.set(f.get() + 1)));
    rt2.enter(|| i.clear());
    std::thread::sleep(Duration::from_millis(5));
    assert!(!rt1.run_nowait());
    assert_eq!(fired.get(), 0, "a cleared interval fired");

    // `close` runs its callback in the timer's loop.
    let ran = Rc::new(Cell::new(None));
    let r = ran.clone();
    let t3 = rt1.enter(|| set_timeout(LONG, || {}));
    rt2.enter(|| t3.close(move || r.set(Some(here()))));
    rt2.run_nowait();
    assert_eq!(ran.get(), None, "the close callback ran in another loop");
    assert!(!rt1.run_nowait());
    assert_eq!(ran.get(), Some(rt1.id()));

    // Once its runtime is gone: nothing, and nothing to another loop's timer in the same slot.
    let t1 = rt1.enter(|| set_timeout(LONG, || {}));
    drop(rt1);
    t1.clear();
    assert!(!t1.is_active() && !t1.has_ref());
    rt2.enter(|| {
        t1.clear();
        t1.unref();
        t1.close(|| panic!("the close callback of a timer whose loop is gone ran"));
        assert!(t2.is_active() && t2.has_ref());
    });
    rt2.run_nowait();
    rt2.enter(|| t2.clear());
}

#[test]
fn an_immediate_is_cleared_in_its_own_loop_wherever_it_is_cleared() {
    let (rt1, rt2) = (Runtime::new(), Runtime::new());
    let ran = Rc::new(Cell::new(0));
    let (a, b) = (ran.clone(), ran.clone());
    let i1 = rt1.enter(|| set_immediate(move || a.set(a.get() + 1)));
    let i2 = rt2.enter(|| set_immediate(move || b.set(b.get() + 10)));
    rt2.enter(|| {
        i1.clear();
        assert!(i2.has_ref(), "the other loop's immediate was cleared");
    });
    assert!(!rt1.run_nowait());
    assert_eq!(ran.get(), 0, "an immediate cleared from another loop ran");

    // With no loop current (this used to panic).
    let c = ran.clone();
    let i3 = rt1.enter(|| set_immediate(move || c.set(c.get() + 100)));
    i3.unref();
    assert!(!i3.has_ref());
    i3.clear();
    assert!(!rt1.run_nowait());
    assert_eq!(ran.get(), 0, "an immediate cleared outside any loop ran");

    rt2.run_nowait();
    assert_eq!(ran.get(), 10);
}

#[test]
fn a_hook_handle_stops_its_own_hook_wherever_it_is_used() {
    let (rt1, rt2) = (Runtime::new(), Runtime::new());
    let h1 = rt1.enter(|| rt::prepare(|| {}));
    let h2 = rt2.enter(|| rt::prepare(|| {}));
    rt2.enter(|| h1.stop());
    assert!(
        !rt1.run_nowait(),
        "a hook stopped while another loop was current still counts"
    );
    rt2.enter(|| assert!(h2.has_ref(), "the other loop's hook was stopped"));

    // With no loop current (this used to panic); `close` calls back in the hook's loop.
    let h = rt1.enter(|| rt::idle(|| {}));
    h.unref();
    assert!(!rt1.run_nowait());
    h.ref_();
    assert!(rt1.run_nowait());
    let ran = Rc::new(Cell::new(None));
    let r = ran.clone();
    rt2.enter(|| h.close(move || r.set(Some(here()))));
    rt2.run_nowait();
    assert_eq!(ran.get(), None);
    assert!(!rt1.run_nowait());
    assert_eq!(ran.get(), Some(rt1.id()));

    // Once its runtime is gone: nothing.
    let h = rt1.enter(|| rt::prepare(|| {}));
    drop(rt1);
    rt2.enter(|| {
        h.stop();
        h.unref();
        assert!(h2.has_ref());
    });
    h2.stop();
    assert!(!rt2.run_nowait());
}

#[test]
fn a_stopped_hooks_handle_never_reaches_the_hook_that_took_its_slot() {
    let rt = Runtime::new();
    rt.enter(|| {
        let a = rt::idle(|| {});
        a.stop();
        let b = rt::idle(|| {});
        a.stop();
        a.unref();
        assert!(!a.has_ref());
        assert!(
            b.has_ref(),
            "a stale handle stopped or unref'd a newer hook"
        );
        b.stop();
    });
    assert!(!rt.run_nowait());
}

#[test]
fn a_hook_started_during_a_pass_first_runs_in_the_next_one() {
    let rt = Runtime::new();
    let trace: Rc<RefCell<Vec<&str>>> = Rc::default();
    let started: Rc<RefCell<Vec<HookHandle>>> = Rc::default();
    let (t, s) = (trace.clone(), started.clone());
    let first = rt.enter(|| {
        let c = Rc::new(RefCell::new(None::<HookHandle>));
        let cc = c.clone();
        let a = rt::idle(move || {
            t.borrow_mut().push("a");
            // Stop `c` (after `a` in this pass) and start `b`, which takes `c`'s slot.
            if let Some(c) = cc.borrow_mut().take() {
                c.stop();
                let tb = t.clone();
                s.borrow_mut()
                    .push(rt::idle(move || tb.borrow_mut().push("b")));
            }
        });
        let tc = trace.clone();
        *c.borrow_mut() = Some(rt::idle(move || tc.borrow_mut().push("c")));
        a
    });
    rt.run_nowait();
    assert_eq!(
        *trace.borrow(),
        ["a"],
        "a hook started in the pass ran in it"
    );
    rt.run_nowait();
    assert_eq!(*trace.borrow(), ["a", "a", "b"]);
    first.stop();
    for h in started.borrow_mut().drain(..) {
        h.stop();
    }
    assert!(!rt.run_nowait());
}

/// A `Runtime` made (and run) by a thread-local's destructor, after the thread's list of loops
/// is gone: it works, unlisted. Run in a child process (this test binary, filtered to the
/// ignored helper below): a panic in a thread-local destructor aborts the process.
#[test]
fn a_runtime_made_during_thread_local_teardown_works() {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "runtime_in_a_thread_local_destructor",
            "--ignored",
            "--nocapture",
        ])
        .env("NODUS_TEST_TLS_CHILD", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
    assert!(
        stderr.contains("made and ran a loop in a TLS destructor"),
        "{stderr}"
    );
}

#[test]
#[ignore = "run by a_runtime_made_during_thread_local_teardown_works in a child process"]
fn runtime_in_a_thread_local_destructor() {
    if std::env::var_os("NODUS_TEST_TLS_CHILD").is_none() {
        return;
    }
    struct MakeOnDrop;
    impl Drop for MakeOnDrop {
        fn drop(&mut self) {
            let rt = Runtime::new();
            rt.block_on(sleep(Duration::from_millis(1)));
            eprintln!("made and ran a loop in a TLS destructor");
        }
    }
    thread_local! {
        static HOLDER: RefCell<Option<MakeOnDrop>> = const { RefCell::new(None) };
    }
    std::thread::spawn(|| {
        // Registered before the list of loops (made by the first `Runtime`), so destroyed after
        // it: thread-local destructors run in reverse order of registration.
        HOLDER.with(|h| *h.borrow_mut() = Some(MakeOnDrop));
        Runtime::new().block_on(async {});
    })
    .join()
    .unwrap();
}

/// Runs `f` on a new thread and returns its panic message (`None` if it did not panic).
fn panic_elsewhere(f: impl FnOnce() + Send + 'static) -> Option<String> {
    let payload = std::thread::spawn(f).join().err()?;
    Some(match payload.downcast::<String>() {
        Ok(s) => *s,
        Err(p) => p
            .downcast::<&str>()
            .map_or_else(|_| "?".into(), |s| s.to_string()),
    })
}

/// Runs `f` on another thread 50 ms from now, once the loop's `run` is (most likely) blocked in
/// its poll phase.
fn while_run_blocks(f: impl FnOnce() + Send + 'static) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        f();
    })
}

/// Arms an unref'd 10 s timer on `rt` that stops its `run`: the bound of a test that runs it;
/// the flag says it fired.
fn bound_run(rt: &Runtime) -> Rc<Cell<bool>> {
    let late = Rc::new(Cell::new(false));
    let l = late.clone();
    rt.enter(|| {
        set_timeout(Duration::from_secs(10), move || {
            l.set(true);
            rt::stop();
        })
        .unref()
    });
    late
}

/// A `Timer` is `Copy + Send`: cleared on another thread, it is cleared in its loop (through the
/// remote queue), before `run` starts or while `run` is blocked on it.
#[test]
fn a_timer_cleared_on_another_thread_never_fires_and_lets_run_return() {
    let rt = Runtime::new();
    let late = bound_run(&rt);
    let fired = Rc::new(Cell::new(0));
    let (a, b) = (fired.clone(), fired.clone());
    let early = rt.enter(|| set_timeout(Duration::from_secs(2), move || a.set(a.get() + 1)));
    let blocked = rt.enter(|| set_interval(Duration::from_secs(2), move || b.set(b.get() + 10)));
    // Before `run`: the reviewer's case.
    std::thread::spawn(move || early.clear()).join().unwrap();
    // While `run` is blocked in its poll phase.
    let clearer = while_run_blocks(move || blocked.clear());
    rt.run();
    clearer.join().unwrap();
    assert_eq!(fired.get(), 0, "a timer cleared on another thread fired");
    assert!(!late.get(), "run went on after its timers were cleared");
}

#[test]
fn a_timer_or_hook_unrefd_or_stopped_on_another_thread_lets_run_return() {
    let rt = Runtime::new();
    let late = bound_run(&rt);
    let t = rt.enter(|| set_timeout(LONG, || {}));
    let unref = while_run_blocks(move || t.unref());
    rt.run();
    unref.join().unwrap();
    assert!(
        !late.get(),
        "a timer unref'd on another thread kept run going"
    );

    // ... and ref'd again there, it keeps the loop alive.
    std::thread::spawn(move || t.ref_()).join().unwrap();
    assert!(rt.run_nowait(), "a timer ref'd on another thread was not");
    t.clear();

    // A hook stopped, or unref'd, on another thread.
    let late = bound_run(&rt);
    let h = rt.enter(|| rt::prepare(|| {}));
    let stop = while_run_blocks(move || h.stop());
    rt.run();
    stop.join().unwrap();
    assert!(
        !late.get(),
        "a hook stopped on another thread kept run going"
    );
    let h = rt.enter(|| rt::prepare(|| {}));
    let h = std::thread::spawn(move || {
        h.unref();
        h
    })
    .join()
    .unwrap();
    assert!(
        !rt.run_nowait(),
        "a hook unref'd on another thread still counts"
    );
    h.stop();
}

#[test]
fn an_immediate_cleared_on_another_thread_does_not_run() {
    let rt = Runtime::new();
    let ran = Rc::new(Cell::new(0));
    let a = ran.clone();
    let i = rt.enter(|| set_immediate(move || a.set(a.get() + 1)));
    std::thread::spawn(move || i.clear()).join().unwrap();
    assert!(!rt.run_nowait(), "a cleared immediate kept its loop alive");
    assert_eq!(ran.get(), 0, "an immediate cleared on another thread ran");
}

/// A query only the loop's thread can answer, and a `close` whose callback cannot be sent
/// there, panic on another thread with a message naming the method, instead of a wrong answer
/// or nothing done. Once the loop is gone there is nothing to ask: `false`, no panic.
#[test]
fn a_query_or_close_on_another_thread_panics_naming_the_method() {
    let rt = Runtime::new();
    let t = rt.enter(|| set_timeout(LONG, || {}));
    let i = rt.enter(|| set_immediate(|| {}));
    let h = rt.enter(|| rt::idle(|| {}));
    let h = Arc::new(h);
    let expect = |what: &str, msg: Option<String>| {
        let msg = msg.unwrap_or_else(|| panic!("{what} on another thread did not panic"));
        assert!(
            msg.contains(what) && msg.contains("another thread than its loop's"),
            "{what}: {msg}"
        );
        assert!(msg.contains("LoopHandle::post"), "{what}: {msg}");
    };
    expect(
        "Timer::is_active",
        panic_elsewhere(move || {
            let _ = t.is_active();
        }),
    );
    expect(
        "Timer::has_ref",
        panic_elsewhere(move || {
            let _ = t.has_ref();
        }),
    );
    expect("Timer::close", panic_elsewhere(move || t.close(|| {})));
    expect(
        "Immediate::has_ref",
        panic_elsewhere(move || {
            let _ = i.has_ref();
        }),
    );
    expect("Immediate::close", panic_elsewhere(move || i.close(|| {})));
    let h2 = h.clone();
    expect(
        "HookHandle::has_ref",
        panic_elsewhere(move || {
            let _ = h2.has_ref();
        }),
    );
    let h2 = h.clone();
    expect(
        "HookHandle::close",
        panic_elsewhere(move || h2.close(|| {})),
    );
    // The panics changed nothing.
    rt.enter(|| {
        assert!(t.is_active() && t.has_ref() && i.has_ref() && h.has_ref());
        t.clear();
        i.clear();
        h.stop();
    });
    assert!(!rt.run_nowait());

    let t = rt.enter(|| set_timeout(LONG, || {}));
    drop(rt);
    assert_eq!(
        panic_elsewhere(move || assert!(!t.is_active() && !t.has_ref())),
        None,
        "a query of a timer whose loop is gone panicked"
    );
}
