//! `nodus::cluster::Primary` from Rust, with plain programs as workers (`sh -c 'sleep 30'`):
//! events, `kill_worker` (an exit the primary asked for is not a crash and says so, unlike
//! Node's `worker.kill()`), a crash restarted by the policy, and a graceful shutdown.
//!
//! Bounded: every wait has a deadline; the workers die with the test process (PDEATHSIG) and are
//! drained by `shutdown` at the end.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use nodus::cluster::{Config, Event, EventKind, Primary, Readiness, WorkerCommand};

fn sleeper_config(workers: usize) -> Config {
    let mut config = Config::new(
        workers,
        WorkerCommand {
            program: "sh".into(),
            args: vec!["-c".into(), "exec sleep 30".into()],
            env: Vec::new(),
            ipc: false,
        },
    );
    config.readiness = Readiness::Alive(Duration::from_millis(10));
    config.prefix_output = false;
    config.kill_timeout = Duration::from_secs(5);
    config
}

async fn wait_until(events: &Rc<RefCell<Vec<Event>>>, what: impl Fn(&[Event]) -> bool) {
    for _ in 0..1000 {
        if what(&events.borrow()) {
            return;
        }
        nodus::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out; events: {:#?}", events.borrow());
}

fn exits(events: &[Event]) -> Vec<(u32, bool)> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::Exit {
                exited_after_disconnect,
                ..
            } => Some((e.pid.unwrap(), *exited_after_disconnect)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_primary_side_kill_is_an_asked_exit_and_a_crash_is_restarted() {
    let rt = nodus::Runtime::new();
    rt.block_on(async {
        let primary = Primary::start(sleeper_config(2)).expect("sh runs");
        let events: Rc<RefCell<Vec<Event>>> = Rc::default();
        let sink = events.clone();
        primary.on_event(move |e| sink.borrow_mut().push(e.clone()));
        let run = nodus::spawn({
            let p = primary.clone();
            async move { p.run().await }
        });
        wait_until(&events, |ev| {
            ev.iter()
                .filter(|e| matches!(e.kind, EventKind::Ready))
                .count()
                == 2
        })
        .await;
        let pids = primary.worker_pids();
        let (w1, w2) = (pids[0].1, pids[1].1);

        // Killed by the primary: exited_after_disconnect is true, and the slot stays empty.
        primary.kill_worker(1, nodus::signal::SIGTERM).unwrap();
        wait_until(&events, |ev| exits(ev).contains(&(w1, true))).await;
        assert_eq!(
            primary.worker_pids()[0].1,
            0,
            "an asked exit is not restarted"
        );

        // Killed from outside: a crash, exited_after_disconnect false, restarted at once.
        rustix::process::kill_process(
            rustix::process::Pid::from_raw(w2 as i32).unwrap(),
            rustix::process::Signal::KILL,
        )
        .unwrap();
        wait_until(&events, |ev| exits(ev).contains(&(w2, false))).await;
        wait_until(&events, |ev| {
            ev.iter().any(|e| {
                matches!(e.kind, EventKind::Fork { .. }) && e.worker == Some(2) && e.pid != Some(w2)
            })
        })
        .await;
        assert_ne!(primary.worker_pids()[1].1, 0);

        primary.shutdown();
        let code = nodus::timeout(Duration::from_secs(20), run)
            .await
            .expect("shutdown finishes")
            .unwrap();
        assert_eq!(code, 0);
        assert!(
            events
                .borrow()
                .iter()
                .any(|e| matches!(e.kind, EventKind::Shutdown { .. }))
        );
    });
}
