//! Node's event-order corpus (`node-order/`, copied from the project's shared conformance set),
//! ported one test per scenario. Each port mirrors its `.js` file line for line: the same calls
//! in the same order, tokens printed only from inside callbacks. The trace is compared byte for
//! byte with the `.expected` file Node 20 printed.
//!
//! Mapping: `setTimeout(cb, ms)` → `set_timeout(ms, cb)`, `setImmediate` → `set_immediate`,
//! `process.nextTick` → `next_tick`, `Promise.resolve().then(cb)` and `queueMicrotask(cb)` →
//! `queue_microtask(cb)` (one FIFO in both), the main script → `Runtime::enter`, the loop →
//! `Runtime::run`, `process.on('exit')` → what runs after `run` returns.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::{Duration, Instant};

use nodus::{
    Immediate, Runtime, Timer, clear_immediate, clear_interval, clear_timeout, next_tick,
    queue_microtask, set_immediate, set_interval, set_timeout,
};

/// `console.log` into a trace.
#[derive(Clone, Default)]
struct Log(Rc<RefCell<String>>);

impl Log {
    fn log(&self, s: impl AsRef<str>) {
        let mut t = self.0.borrow_mut();
        t.push_str(s.as_ref());
        t.push('\n');
    }
}

/// Runs `main` as the main script, then the loop, then `exit`; returns the trace.
fn node(main: impl FnOnce(&Log), exit: impl FnOnce(&Log)) -> String {
    let log = Log::default();
    let rt = Runtime::new();
    rt.enter(|| main(&log));
    rt.run();
    exit(&log);
    log.0.take()
}

fn busy_wait(ms: u64) {
    let end = Instant::now() + Duration::from_millis(ms);
    while Instant::now() < end {}
}

#[test]
fn s01_nexttick_before_microtasks() {
    let trace = node(
        |l| {
            l.log("sync-start");
            let (a, b, c, d, e) = (l.clone(), l.clone(), l.clone(), l.clone(), l.clone());
            queue_microtask(move || a.log("promise1"));
            queue_microtask(move || b.log("microtask1"));
            next_tick(move || c.log("tick1"));
            queue_microtask(move || d.log("promise2"));
            next_tick(move || e.log("tick2"));
            l.log("sync-end");
        },
        |_| {},
    );
    assert_eq!(
        trace,
        include_str!("node-order/01_nexttick_before_microtasks.expected")
    );
}

#[test]
fn s02_nested_nexttick_drain() {
    let trace = node(
        |l| {
            let (a, b, c) = (l.clone(), l.clone(), l.clone());
            queue_microtask(move || a.log("promise-from-main"));
            next_tick(move || {
                b.log("tick1");
                let b1 = b.clone();
                queue_microtask(move || b1.log("promise-from-tick1"));
                let b2 = b.clone();
                next_tick(move || {
                    b2.log("tick1.1");
                    let b3 = b2.clone();
                    next_tick(move || b3.log("tick1.1.1"));
                });
            });
            next_tick(move || c.log("tick2"));
            l.log("sync-end");
        },
        |_| {},
    );
    assert_eq!(
        trace,
        include_str!("node-order/02_nested_nexttick_drain.expected")
    );
}

#[test]
fn s03_microtask_schedules_nexttick() {
    let trace = node(
        |l| {
            let (a, b, c, d) = (l.clone(), l.clone(), l.clone(), l.clone());
            set_immediate(move || a.log("immediate"));
            next_tick(move || b.log("tick1"));
            queue_microtask(move || {
                c.log("p1");
                let c1 = c.clone();
                next_tick(move || {
                    c1.log("tick-from-p1");
                    let c2 = c1.clone();
                    queue_microtask(move || c2.log("p-from-tick-from-p1"));
                });
                let c3 = c.clone();
                queue_microtask(move || c3.log("p1.1"));
            });
            queue_microtask(move || d.log("p2"));
        },
        |_| {},
    );
    assert_eq!(
        trace,
        include_str!("node-order/03_microtask_schedules_nexttick.expected")
    );
}

/// `body(name)` of scenario 04: logs, then queues a tick and a microtask that log.
fn body(l: &Log, name: &'static str) -> impl FnOnce() + 'static {
    let l = l.clone();
    move || {
        l.log(name);
        let t = l.clone();
        next_tick(move || t.log(format!("{name}:tick")));
        let p = l.clone();
        queue_microtask(move || p.log(format!("{name}:promise")));
    }
}

#[test]
fn s04_queues_drain_between_callbacks() {
    let trace = node(
        |l| {
            let l = l.clone();
            set_timeout(1, move || {
                set_timeout(1, body(&l, "timeout1"));
                set_timeout(1, body(&l, "timeout2"));
                set_immediate(body(&l, "immediate1"));
                set_immediate(body(&l, "immediate2"));
            });
        },
        |_| {},
    );
    assert_eq!(
        trace,
        include_str!("node-order/04_queues_drain_between_callbacks.expected")
    );
}

#[test]
fn s06_immediate_added_during_check_runs_next_turn() {
    let trace = node(
        |l| {
            let (a, b) = (l.clone(), l.clone());
            set_immediate(move || {
                a.log("immA");
                let c = a.clone();
                set_immediate(move || {
                    c.log("immC");
                    let e = c.clone();
                    set_immediate(move || e.log("immE"));
                });
                let t = a.clone();
                next_tick(move || t.log("immA:tick"));
            });
            set_immediate(move || {
                b.log("immB");
                let d = b.clone();
                set_immediate(move || d.log("immD"));
            });
        },
        |_| {},
    );
    assert_eq!(
        trace,
        include_str!("node-order/06_immediate_added_during_check_runs_next_turn.expected")
    );
}

#[test]
fn s07_timer_ordering() {
    let trace = node(
        |l| {
            let l = l.clone();
            set_timeout(1, move || {
                let t = |s: &'static str| {
                    let l = l.clone();
                    move || l.log(s)
                };
                set_timeout(30, t("d30"));
                set_timeout(10, t("d10-a"));
                set_timeout(10, t("d10-b"));
                set_timeout(1, t("d1"));
                set_timeout(0, t("d0"));
                set_timeout(-5, t("dneg"));
                set_timeout(f64::NAN, t("dNaN"));
                set_timeout(10, t("d10-c"));
                set_timeout(5, t("d5"));
            });
        },
        |_| {},
    );
    assert_eq!(trace, include_str!("node-order/07_timer_ordering.expected"));
}

#[test]
fn s08_cancel_from_earlier_callback() {
    let trace = node(
        |l| {
            let t_b: Rc<Cell<Option<Timer>>> = Rc::default();
            let i_b: Rc<Cell<Option<Immediate>>> = Rc::default();
            let (a, b, c, d) = (l.clone(), l.clone(), l.clone(), l.clone());
            let tb = t_b.clone();
            set_timeout(5, move || {
                a.log("timerA");
                clear_timeout(&tb.get().unwrap());
            });
            t_b.set(Some(set_timeout(5, move || b.log("timerB-SHOULD-NOT-RUN"))));
            set_timeout(5, move || c.log("timerC"));

            set_timeout(20, move || {
                let (d1, d2, d3) = (d.clone(), d.clone(), d.clone());
                let ib = i_b.clone();
                set_immediate(move || {
                    d1.log("immA");
                    clear_immediate(&ib.get().unwrap());
                });
                i_b.set(Some(set_immediate(move || d2.log("immB-SHOULD-NOT-RUN"))));
                set_immediate(move || d3.log("immC"));
            });
        },
        |_| {},
    );
    assert_eq!(
        trace,
        include_str!("node-order/08_cancel_from_earlier_callback.expected")
    );
}

#[test]
fn s10_interval_rearm() {
    let trace = node(
        |l| {
            let n = Rc::new(Cell::new(0));
            let iv: Rc<Cell<Option<Timer>>> = Rc::default();
            let (a, b) = (l.clone(), l.clone());
            let iv2 = iv.clone();
            iv.set(Some(set_interval(10, move || {
                n.set(n.get() + 1);
                a.log(format!("interval{}", n.get()));
                if n.get() == 3 {
                    clear_interval(&iv2.get().unwrap());
                    let a2 = a.clone();
                    set_timeout(30, move || a2.log("after-clear"));
                }
            })));
            set_timeout(10, move || b.log("timeout10"));
        },
        |_| {},
    );
    assert_eq!(trace, include_str!("node-order/10_interval_rearm.expected"));
}

#[test]
fn s16_same_delay_list_runs_whole() {
    let trace = node(
        |l| {
            let (a, b, c) = (l.clone(), l.clone(), l.clone());
            set_timeout(10, move || a.log("A-d10"));
            busy_wait(2);
            set_timeout(10, move || c.log("C-d10"));
            set_timeout(9, move || b.log("B-d9"));
            busy_wait(20);
        },
        |_| {},
    );
    assert_eq!(
        trace,
        include_str!("node-order/16_same_delay_list_runs_whole.expected")
    );
}

#[test]
fn s17_interval_rearm_behind_timeout_from_its_callback() {
    let trace = node(
        |l| {
            let n = Rc::new(Cell::new(0));
            let iv: Rc<Cell<Option<Timer>>> = Rc::default();
            let a = l.clone();
            let iv2 = iv.clone();
            iv.set(Some(set_interval(10, move || {
                n.set(n.get() + 1);
                a.log(format!("interval{}", n.get()));
                if n.get() == 1 {
                    let a2 = a.clone();
                    set_timeout(10, move || a2.log("timeout-from-interval"));
                }
                if n.get() == 3 {
                    clear_interval(&iv2.get().unwrap());
                }
            })));
        },
        |_| {},
    );
    assert_eq!(
        trace,
        include_str!("node-order/17_interval_rearm_behind_timeout_from_its_callback.expected")
    );
}

#[test]
fn s11_unref_timer_does_not_keep_alive() {
    let trace = node(
        |l| {
            let (a, b, c) = (l.clone(), l.clone(), l.clone());
            set_timeout(2000, move || a.log("unref-SHOULD-NOT-RUN")).unref();
            let t = set_timeout(20, move || b.log("ref-again-fired"));
            t.unref();
            t.ref_();
            set_timeout(10, move || c.log("ref-fired"));
            l.log("sync-end");
        },
        |l| l.log("exit"),
    );
    assert_eq!(
        trace,
        include_str!("node-order/11_unref_timer_does_not_keep_alive.expected")
    );
}

#[test]
fn s13_nexttick_starves_loop() {
    let trace = node(
        |l| {
            let (a, b) = (l.clone(), l.clone());
            set_timeout(0, move || a.log("timeout"));
            set_immediate(move || b.log("immediate"));
            let ticks = Rc::new(Cell::new(0u32));
            fn tick(ticks: Rc<Cell<u32>>, l: Log) {
                ticks.set(ticks.get() + 1);
                if ticks.get() < 10000 {
                    next_tick(move || tick(ticks, l));
                } else {
                    l.log(format!("tick-chain-done:{}", ticks.get()));
                }
            }
            let l2 = l.clone();
            next_tick(move || tick(ticks, l2));
            // `p = p.then(...)` 1000 times, then `p.then(log)`: each link is a microtask queued
            // when the previous one ran.
            let chain = Rc::new(Cell::new(0u32));
            fn link(i: u32, chain: Rc<Cell<u32>>, l: Log) {
                queue_microtask(move || {
                    chain.set(chain.get() + 1);
                    if i + 1 < 1000 {
                        link(i + 1, chain, l);
                    } else {
                        queue_microtask(move || {
                            l.log(format!("promise-chain-done:{}", chain.get()))
                        });
                    }
                });
            }
            link(0, chain, l.clone());
            // Busy-wait so the 0 ms timer is definitely due before the loop starts.
            busy_wait(5);
        },
        |_| {},
    );
    assert_eq!(
        trace,
        include_str!("node-order/13_nexttick_starves_loop.expected")
    );
}

#[test]
fn s15_immediate_chain_does_not_starve_timers() {
    let trace = node(
        |l| {
            let timer_fired = Rc::new(Cell::new(false));
            let fired_at = Rc::new(Cell::new(-1i64));
            let turns = Rc::new(Cell::new(0i64));
            let (tf, fa, tu) = (timer_fired.clone(), fired_at.clone(), turns.clone());
            set_timeout(2, move || {
                tf.set(true);
                fa.set(tu.get());
            });
            fn again(turns: Rc<Cell<i64>>, fired: Rc<Cell<bool>>, at: Rc<Cell<i64>>, l: Log) {
                turns.set(turns.get() + 1);
                if turns.get() == 1 {
                    busy_wait(5); // make the 2 ms timer due
                }
                if turns.get() < 20 {
                    set_immediate(move || again(turns, fired, at, l));
                } else {
                    l.log("chain-done");
                    l.log(format!(
                        "timer-fired-during-chain={}",
                        fired.get() && at.get() < 20
                    ));
                }
            }
            let l2 = l.clone();
            set_immediate(move || again(turns, timer_fired, fired_at, l2));
        },
        |_| {},
    );
    assert_eq!(
        trace,
        include_str!("node-order/15_immediate_chain_does_not_starve_timers.expected")
    );
}
