//! `nodus::cluster::Primary` from Rust, with plain programs as workers (`sh -c 'sleep 30'`):
//! events, `kill_worker` (an exit the primary asked for is not a crash and says so, unlike
//! Node's `worker.kill()`; a stop signal sent through it pauses the worker), a crash restarted by the policy, readiness (one ready worker is
//! enough, a shutdown ends it), a graceful shutdown, and a worker that exits as its drain
//! deadline or kill timeout expires, before its reap (not killed, not a forced stop); with nodus
//! workers, the stats of a worker whose loop does not answer (its last snapshot kept, with its
//! age; before its first request, none), readiness while the only worker's loop is blocked, and
//! a listener the worker closed released at once (the port free again); a worker program the
//! kernel refuses to execute fails the start (never run by `/bin/sh`).
//!
//! Bounded: every wait has a deadline; the workers die with the test process (PDEATHSIG) and are
//! drained by `shutdown` at the end.
//!
//! A test that needs a nodus worker runs this test binary again as the worker (the variable
//! [`ROLE`] says which), filtered to the same test: the test function plays the worker there.

mod common;

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use common::Warnings;
use nodus::cluster::{
    Config, Event, EventKind, Policy, Primary, Readiness, ReadyState, Worker, WorkerCommand,
};
use nodus_testkit::tree;

/// Set in a worker this binary starts from itself: the worker role to play.
const ROLE: &str = "NODUS_TEST_WORKER_ROLE";

/// A worker that runs this test binary's test `name` with [`ROLE`] = `role`.
fn self_as_worker(name: &str, role: &str) -> WorkerCommand {
    WorkerCommand {
        program: std::env::current_exe().unwrap(),
        args: vec![name.into(), "--exact".into(), "--nocapture".into()],
        env: vec![(ROLE.into(), role.into())],
        ipc: true,
    }
}

/// The config of `workers` workers that play `role` of this binary's test `test` (see
/// [`self_as_worker`]), each with [`DIR`] = `dir` and the (variable, port) pairs `ports` in its
/// environment: ready by message, output unprefixed, a 2 s drain timeout and a 5 s kill timeout.
fn role_config(
    test: &str,
    role: &str,
    workers: usize,
    dir: &std::path::Path,
    ports: &[(&str, u16)],
) -> Config {
    let mut command = self_as_worker(test, role);
    command.env.push((DIR.into(), dir.as_os_str().to_owned()));
    for (var, port) in ports {
        command.env.push(((*var).into(), port.to_string().into()));
    }
    let mut config = Config::new(workers, command);
    config.readiness = Readiness::Message;
    config.prefix_output = false;
    config.drain_timeout = Duration::from_secs(2);
    config.kill_timeout = Duration::from_secs(5);
    config
}

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

type Events = Rc<RefCell<Vec<Event>>>;

/// Records `primary`'s events and runs it on a task of its own.
fn record_and_run(primary: &Primary) -> (Events, nodus::JoinHandle<i32>) {
    let events: Events = Rc::default();
    let sink = events.clone();
    primary.on_event(move |e| sink.borrow_mut().push(e.clone()));
    let p = primary.clone();
    (events, nodus::spawn(async move { p.run().await }))
}

/// Shuts `primary` down; its exit code, once `run` has returned (within 20 s).
async fn shut_down(primary: &Primary, run: nodus::JoinHandle<i32>) -> i32 {
    primary.shutdown();
    nodus::timeout(Duration::from_secs(20), run)
        .await
        .expect("shutdown finishes")
        .unwrap()
}

async fn wait_until(events: &Events, what: impl Fn(&[Event]) -> bool) {
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

/// A stop signal a caller sends through `kill_worker` pauses the worker: no SIGCONT follows it
/// (one follows every other signal, so that a stopped worker acts on it).
#[test]
fn a_stop_signal_sent_through_kill_worker_is_not_undone() {
    let rt = nodus::Runtime::new();
    rt.block_on(async {
        let primary = Primary::start(sleeper_config(1)).expect("sh runs");
        let (events, run) = record_and_run(&primary);
        wait_until(&events, |ev| {
            ev.iter().any(|e| matches!(e.kind, EventKind::Ready))
        })
        .await;
        let pid = primary.worker_pids()[0].1 as i32;
        primary.kill_worker(1, libc::SIGSTOP).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !tree::is_stopped(pid) {
            assert!(
                std::time::Instant::now() < deadline,
                "worker {pid} never stopped"
            );
            nodus::time::sleep(Duration::from_millis(10)).await;
        }
        nodus::time::sleep(Duration::from_millis(200)).await;
        assert!(tree::is_stopped(pid), "worker {pid} was continued");
        assert_eq!(shut_down(&primary, run).await, 0);
    });
}

#[test]
fn a_primary_side_kill_is_an_asked_exit_and_a_crash_is_restarted() {
    let rt = nodus::Runtime::new();
    rt.block_on(async {
        let primary = Primary::start(sleeper_config(2)).expect("sh runs");
        let (events, run) = record_and_run(&primary);
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

        assert_eq!(shut_down(&primary, run).await, 0);
        assert!(
            events
                .borrow()
                .iter()
                .any(|e| matches!(e.kind, EventKind::Shutdown { .. }))
        );
        assert_eq!(
            primary.worker_pids(),
            [(1, 0), (2, 0)],
            "no pid of an exited worker"
        );
    });
}

#[test]
fn a_cluster_of_no_workers_is_refused() {
    nodus::Runtime::new().block_on(async {
        let Err(err) = Primary::start(sleeper_config(0)) else {
            panic!("a cluster of no workers started");
        };
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    });
}

/// A worker program that is an ELF file the kernel refuses to execute (`ENOEXEC`; here a corrupt
/// header, refused whatever binfmt_misc holds; in life another machine's program) fails the
/// start: it is executed with `execve` alone, where `execvp` would have `/bin/sh` read it, and
/// fail, worker after worker.
#[test]
fn a_worker_program_the_kernel_refuses_to_execute_fails_the_start() {
    use std::os::unix::fs::PermissionsExt;
    let dir = nodus_testkit::tmp::TempDir::new("cluster-enoexec");
    let program = dir.path().join("corrupt-elf");
    std::fs::write(&program, b"\x7fELF\n").unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    nodus::Runtime::new().block_on(async {
        let mut config = sleeper_config(1);
        config.command.program = program.clone();
        config.command.args = Vec::new();
        let err = match Primary::start(config) {
            Ok(primary) => {
                let (_, run) = record_and_run(&primary);
                shut_down(&primary, run).await;
                panic!("a worker was started");
            }
            Err(err) => err,
        };
        let enoexec = std::io::Error::from_raw_os_error(libc::ENOEXEC).to_string();
        assert!(err.to_string().ends_with(&enoexec), "{err}");
    });
}

/// The worker role of the test below: listens, says ready, waits for the drain, then asks for a
/// second listener. Exits 0 when the primary refused it, 3 when it granted it.
fn listen_after_drain_worker() -> ! {
    let code = nodus::Runtime::new().block_on(async {
        let worker = Worker::get().unwrap().expect("started as a cluster worker");
        let _first = worker.listen("127.0.0.1:0".parse().unwrap()).await.unwrap();
        worker.ready();
        worker.drain_requested().await;
        match worker.listen("127.0.0.1:0".parse().unwrap()).await {
            Err(e)
                if e.to_string()
                    .contains(&std::io::Error::from_raw_os_error(libc::ESHUTDOWN).to_string()) =>
            {
                0
            }
            Err(e) => {
                eprintln!("refused, but not for stopping: {e}");
                4
            }
            Ok(_) => 3,
        }
    });
    std::process::exit(code);
}

#[test]
fn a_draining_worker_gets_no_new_listener() {
    if std::env::var(ROLE).as_deref() == Ok("listen-after-drain") {
        listen_after_drain_worker();
    }
    let rt = nodus::Runtime::new();
    rt.block_on(async {
        let mut config = Config::new(
            1,
            self_as_worker(
                "a_draining_worker_gets_no_new_listener",
                "listen-after-drain",
            ),
        );
        config.readiness = Readiness::Message;
        config.prefix_output = false;
        config.drain_timeout = Duration::from_secs(5);
        config.kill_timeout = Duration::from_secs(10);
        let primary = Primary::start(config).expect("the test binary runs");
        let (events, run) = record_and_run(&primary);
        wait_until(&events, |ev| {
            ev.iter().any(|e| matches!(e.kind, EventKind::Ready))
        })
        .await;
        assert_eq!(shut_down(&primary, run).await, 0);
        let worker_codes: Vec<Option<i32>> = events
            .borrow()
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::Exit { code, .. } => Some(*code),
                _ => None,
            })
            .collect();
        assert_eq!(
            worker_codes,
            [Some(0)],
            "0: the second listen was refused for stopping"
        );
    });
}

/// The directory a worker of the stats tests below shares with its test (files as signals).
const DIR: &str = "NODUS_TEST_DIR";

/// Waits (polling, at most 30 s) until `path` exists; false if it never does.
async fn file_appears(path: &std::path::Path) -> bool {
    for _ in 0..3000 {
        if path.exists() {
            return true;
        }
        nodus::sleep(Duration::from_millis(10)).await;
    }
    false
}

/// The worker role of the stats tests: reports snapshots, says ready; when the file `stall`
/// appears it writes `stalled` and blocks its loop until `release` appears; once asked to drain
/// it stays (its loop answering) until `release` appears. Every wait gives up after 30 s.
fn snapshot_worker() -> ! {
    let dir = std::path::PathBuf::from(std::env::var_os(DIR).expect("the test sets the dir"));
    let code = nodus::Runtime::new().block_on(async move {
        let worker = Worker::get().unwrap().expect("started as a cluster worker");
        worker.set_snapshot(nodus::metrics::snapshot);
        worker.ready();
        let d = dir.clone();
        let staller = nodus::spawn_named("test:staller", async move {
            if file_appears(&d.join("stall")).await {
                std::fs::write(d.join("stalled"), b"").unwrap();
                // Blocks the loop: no snapshot request can be answered meanwhile.
                for _ in 0..3000 {
                    if d.join("release").exists() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        });
        worker.drain_requested().await;
        staller.abort();
        file_appears(&dir.join("release")).await;
        0
    });
    std::process::exit(code);
}

/// Sample lines of an exposition, each (name, labels): duplicates make it invalid.
fn duplicate_samples(text: &str) -> Vec<&str> {
    let mut seen = std::collections::HashSet::new();
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.rsplit_once(' ').map(|(series, _)| series))
        .filter(|series| !seen.insert(*series))
        .collect()
}

fn stats_config(test: &str, dir: &std::path::Path) -> Config {
    let mut config = role_config(test, "snapshot", 1, dir, &[]);
    config.drain_timeout = Duration::from_secs(30);
    config.kill_timeout = Duration::from_secs(40);
    config
}

/// A one-worker primary of [`stats_config`] for `test`, its events recorded and its `run`
/// spawned; returned once the worker is ready.
async fn start_ready(
    test: &str,
    dir: &std::path::Path,
) -> (Primary, Events, nodus::JoinHandle<i32>) {
    let primary = Primary::start(stats_config(test, dir)).expect("the test binary runs");
    let (events, run) = record_and_run(&primary);
    wait_until(&events, |ev| {
        ev.iter().any(|e| matches!(e.kind, EventKind::Ready))
    })
    .await;
    (primary, events, run)
}

#[test]
fn two_processes_of_one_slot_in_a_reload_have_distinct_series() {
    if std::env::var(ROLE).as_deref() == Ok("snapshot") {
        snapshot_worker();
    }
    let dir = nodus_testkit::tmp::TempDir::new("reload-series");
    let rt = nodus::Runtime::new();
    rt.block_on(async {
        let config = stats_config(
            "two_processes_of_one_slot_in_a_reload_have_distinct_series",
            dir.path(),
        );
        let primary = Primary::start(config).expect("the test binary runs");
        let (events, run) = record_and_run(&primary);
        let count =
            |ev: &[Event], f: fn(&EventKind) -> bool| ev.iter().filter(|e| f(&e.kind)).count();
        wait_until(&events, |ev| {
            count(ev, |k| matches!(k, EventKind::Ready)) == 1
        })
        .await;
        primary.reload();
        // The new worker is ready and the old one drains (it stays until `release`).
        wait_until(&events, |ev| {
            count(ev, |k| matches!(k, EventKind::Ready)) == 2
                && count(ev, |k| matches!(k, EventKind::Drain)) == 1
        })
        .await;
        let pids: Vec<u32> = events
            .borrow()
            .iter()
            .filter(|e| matches!(e.kind, EventKind::Ready))
            .filter_map(|e| e.pid)
            .collect();
        let text = primary.metrics_text().await;
        std::fs::write(dir.path().join("release"), b"").unwrap();
        assert_eq!(duplicate_samples(&text), Vec::<&str>::new(), "{text}");
        for pid in &pids {
            let line = format!("nodus_uptime_seconds{{worker=\"1\",pid=\"{pid}\"}} ");
            assert!(text.contains(&line), "no {line:?} in\n{text}");
        }
        assert_eq!(shut_down(&primary, run).await, 0);
    });
}

/// The worker role of the test below: reports snapshots (and, each time it builds one once
/// `unblock1` exists, writes `answered`: the answer to the request its blocked loop left
/// waiting), says ready; blocks its loop from `block1` (writing `blocked1`) until `unblock1`
/// appears, then the same from `block2` to `unblock2`. Every wait gives up after 30 s.
fn blocking_worker() -> ! {
    let dir = std::path::PathBuf::from(std::env::var_os(DIR).expect("the test sets the dir"));
    let code = nodus::Runtime::new().block_on(async move {
        let worker = Worker::get().unwrap().expect("started as a cluster worker");
        let d = dir.clone();
        worker.set_snapshot(move || {
            if d.join("unblock1").exists() {
                std::fs::write(d.join("answered"), b"").unwrap();
            }
            nodus::metrics::snapshot()
        });
        worker.ready();
        let d = dir.clone();
        let blocker = nodus::spawn_named("test:blocker", async move {
            for n in 1..=2 {
                if !file_appears(&d.join(format!("block{n}"))).await {
                    return;
                }
                std::fs::write(d.join(format!("blocked{n}")), b"").unwrap();
                // Blocks the loop: no snapshot request can be answered meanwhile.
                for _ in 0..3000 {
                    if d.join(format!("unblock{n}")).exists() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        });
        worker.drain_requested().await;
        blocker.abort();
        0
    });
    std::process::exit(code);
}

/// A worker whose loop does not answer in time keeps its last snapshot, its loop series with
/// it, said to be old (`answering` false) and how old; an answer that comes after its wait ran
/// out is its newest snapshot the next time it does not answer; it answers again once its loop
/// runs.
#[test]
fn a_worker_that_stops_answering_keeps_its_last_snapshot_with_its_age() {
    if std::env::var(ROLE).as_deref() == Ok("blocking") {
        blocking_worker();
    }
    let dir = nodus_testkit::tmp::TempDir::new("stale-snapshot");
    let rt = nodus::Runtime::new();
    rt.block_on(async {
        let name = "a_worker_that_stops_answering_keeps_its_last_snapshot_with_its_age";
        let mut config = stats_config(name, dir.path());
        config.command.env[0].1 = "blocking".into();
        let primary = Primary::start(config).expect("the test binary runs");
        let (events, run) = record_and_run(&primary);
        wait_until(&events, |ev| {
            ev.iter().any(|e| matches!(e.kind, EventKind::Ready))
        })
        .await;
        let file = |name: &str| dir.path().join(name);
        let worker = |json: &str| -> serde_json::Value {
            let v: serde_json::Value = serde_json::from_str(json).unwrap();
            v["workers"][0].clone()
        };
        let taken_at = |w: &serde_json::Value| w["snapshot"]["taken_at_unix_ms"].as_u64();
        let before = worker(&primary.stats_json().await);
        assert_eq!(before["answering"], true, "{before}");
        assert!(taken_at(&before).is_some(), "{before}");
        let pid = before["pid"].as_u64().unwrap();

        std::fs::write(file("block1"), b"").unwrap();
        assert!(file_appears(&file("blocked1")).await);
        // Past the primary's 1 s cache, so the next document asks the worker again.
        nodus::sleep(Duration::from_millis(1100)).await;
        let during = worker(&primary.stats_json().await);
        let text = primary.metrics_text().await;
        assert_eq!(during["answering"], false, "{during}");
        assert_eq!(taken_at(&during), taken_at(&before), "{during}");
        // It came before `before` was made, 1.1 s and a wait for the answer ago.
        let age = during["snapshot_age_seconds"].as_f64().unwrap();
        assert!(age >= 1.1, "{during}");
        let labels = format!("{{worker=\"1\",pid=\"{pid}\"}}");
        for series in [
            format!("nodus_uptime_seconds{labels} "),
            format!("nodus_cluster_worker_answering{labels} 0\n"),
        ] {
            assert!(text.contains(&series), "no {series:?} in\n{text}");
        }
        let gauge = format!("nodus_cluster_worker_snapshot_age_seconds{labels} ");
        let line = text.lines().find(|l| l.starts_with(&gauge));
        let value = line.and_then(|l| l[gauge.len()..].parse::<f64>().ok());
        assert!(value.is_some_and(|v| v >= 1.1), "{line:?} in\n{text}");

        // Its loop runs again and answers the request late; then it blocks again.
        std::fs::write(file("unblock1"), b"").unwrap();
        assert!(file_appears(&file("answered")).await);
        std::fs::write(file("block2"), b"").unwrap();
        assert!(file_appears(&file("blocked2")).await);
        nodus::sleep(Duration::from_millis(1100)).await;
        let late = worker(&primary.stats_json().await);
        assert_eq!(late["answering"], false, "{late}");
        assert!(
            taken_at(&late) > taken_at(&before),
            "the late answer is not its snapshot: {late}"
        );

        // Once the loop runs again, it answers again.
        std::fs::write(file("unblock2"), b"").unwrap();
        let mut after = serde_json::Value::Null;
        for _ in 0..30 {
            nodus::sleep(Duration::from_millis(1100)).await;
            after = worker(&primary.stats_json().await);
            if after["answering"] == true {
                break;
            }
        }
        assert_eq!(after["answering"], true, "{after}");
        assert!(taken_at(&after) > taken_at(&late), "{after}");
        assert_eq!(shut_down(&primary, run).await, 0);
    });
}

/// A worker whose loop blocks before the primary ever asked it for a snapshot is not answering
/// from the first request on, as one that answered before would be.
#[test]
fn a_worker_that_stalls_before_its_first_snapshot_request_is_not_answering() {
    if std::env::var(ROLE).as_deref() == Ok("snapshot") {
        snapshot_worker();
    }
    let dir = nodus_testkit::tmp::TempDir::new("stall-before-first");
    let rt = nodus::Runtime::new();
    rt.block_on(async {
        let (primary, _events, run) = start_ready(
            "a_worker_that_stalls_before_its_first_snapshot_request_is_not_answering",
            dir.path(),
        )
        .await;
        std::fs::write(dir.path().join("stall"), b"").unwrap();
        assert!(file_appears(&dir.path().join("stalled")).await);
        let pid = primary.worker_pids()[0].1;
        let doc: serde_json::Value = serde_json::from_str(&primary.stats_json().await).unwrap();
        let text = primary.metrics_text().await;
        std::fs::write(dir.path().join("release"), b"").unwrap();
        let worker = &doc["workers"][0];
        assert_eq!(worker["answering"], false, "{worker}");
        assert!(worker["snapshot"].is_null(), "{worker}");
        let gauge = format!("nodus_cluster_worker_answering{{worker=\"1\",pid=\"{pid}\"}} 0");
        assert!(text.contains(&gauge), "no {gauge:?} in\n{text}");
        assert_eq!(shut_down(&primary, run).await, 0);
    });
}

/// A one-worker cluster whose worker's loop blocks, with no connection to hand it: once the
/// snapshot request `ready_state` sends (without waiting for it) has gone unanswered for 1 s,
/// every ready worker is stalled and the cluster is not ready; it is again once the loop runs.
#[test]
fn a_cluster_whose_only_worker_is_stalled_is_not_ready_until_its_loop_runs() {
    if std::env::var(ROLE).as_deref() == Ok("snapshot") {
        snapshot_worker();
    }
    let dir = nodus_testkit::tmp::TempDir::new("ready-stall");
    let rt = nodus::Runtime::new();
    rt.block_on(async {
        let (primary, _events, run) = start_ready(
            "a_cluster_whose_only_worker_is_stalled_is_not_ready_until_its_loop_runs",
            dir.path(),
        )
        .await;
        assert_eq!(primary.ready_state(), ReadyState::Ready);
        std::fs::write(dir.path().join("stall"), b"").unwrap();
        assert!(file_appears(&dir.path().join("stalled")).await);
        let until = async |want: ReadyState, other: ReadyState| {
            for _ in 0..200 {
                match primary.ready_state() {
                    state if state == want => return,
                    state => assert_eq!(state, other),
                }
                nodus::sleep(Duration::from_millis(50)).await;
            }
            panic!("never {want:?}");
        };
        let stalled = ReadyState::Stalled { workers: 1 };
        until(stalled.clone(), ReadyState::Ready).await;
        assert!(!primary.is_ready());
        std::fs::write(dir.path().join("release"), b"").unwrap();
        until(ReadyState::Ready, stalled).await;
        // The stall, over, is counted in the worker's snapshot, with its labels (by its watchdog:
        // none without the measurements).
        if cfg!(feature = "measure") {
            stall_counted(&primary).await;
        }
        assert_eq!(shut_down(&primary, run).await, 0);
    });
}

/// Waits (10 s at most) for the stall of worker 1's loop to be counted in the cluster's metrics
/// and stats, as `blocked-in-syscall`.
async fn stall_counted(primary: &Primary) {
    let pid = primary.worker_pids()[0].1;
    let counted = format!(
        "nodus_loop_stalls_total{{worker=\"1\",pid=\"{pid}\",class=\"blocked-in-syscall\"}} "
    );
    let mut text = String::new();
    for _ in 0..200 {
        text = primary.metrics_text().await;
        let n = text.lines().find_map(|l| l.strip_prefix(counted.as_str()));
        if n.is_some_and(|n| n != "0") {
            break;
        }
        nodus::sleep(Duration::from_millis(50)).await;
    }
    let n = text.lines().find_map(|l| l.strip_prefix(counted.as_str()));
    assert!(n.is_some_and(|n| n != "0"), "no {counted:?}N in\n{text}");
    assert_eq!(duplicate_samples(&text), Vec::<&str>::new(), "{text}");
    let doc: serde_json::Value = serde_json::from_str(&primary.stats_json().await).unwrap();
    let counts = &doc["workers"][0]["snapshot"]["stalls_total"];
    assert!(counts["blocked-in-syscall"].as_u64() >= Some(1), "{doc}");
}

/// Whether the cluster takes traffic: ready with one worker of two down, not ready with none,
/// and stopping (not ready) from the shutdown on.
#[test]
fn the_cluster_is_ready_while_one_worker_is_and_no_shutdown_began() {
    let rt = nodus::Runtime::new();
    rt.block_on(async {
        let mut config = sleeper_config(2);
        // The replacement of a killed worker is not ready for a while.
        config.readiness = Readiness::Alive(Duration::from_secs(3));
        let primary = Primary::start(config).expect("sh runs");
        assert!(!primary.is_ready(), "no worker is ready yet");
        assert!(!primary.is_stopping());
        let (events, run) = record_and_run(&primary);
        let ready = |ev: &[Event]| {
            ev.iter()
                .filter(|e| matches!(e.kind, EventKind::Ready))
                .count()
        };
        wait_until(&events, |ev| ready(ev) == 2).await;
        assert!(primary.is_ready());
        let w1 = primary.worker_pids()[0].1;
        rustix::process::kill_process(
            rustix::process::Pid::from_raw(w1 as i32).unwrap(),
            rustix::process::Signal::KILL,
        )
        .unwrap();
        // The replacement's fork.
        wait_until(&events, |ev| {
            ev.iter().any(|e| {
                matches!(e.kind, EventKind::Fork { .. }) && e.worker == Some(1) && e.pid != Some(w1)
            })
        })
        .await;
        assert_eq!(
            ready(&events.borrow()),
            2,
            "the replacement is not ready yet"
        );
        assert!(primary.is_ready(), "one worker of two is ready");
        primary.shutdown();
        assert!(primary.is_stopping());
        assert!(!primary.is_ready(), "a shutdown began");
        assert_eq!(
            nodus::timeout(Duration::from_secs(20), run)
                .await
                .expect("shutdown finishes")
                .unwrap(),
            0
        );
    });
}

/// A plain program (no channel) cannot take connections the primary accepted: round-robin and
/// least are refused at the start, naming the policy, as `nodus run` refuses `--policy rr`
/// without `--node`; `Config::new` gives a plain program `shared`, whose listener it gets
/// blocking, as systemd passes one.
#[test]
fn a_plain_program_gets_a_blocking_shared_listener_and_never_round_robin() {
    let dir = nodus_testkit::tmp::TempDir::new("plain-policy");
    let out = dir.path().join("flags");
    let rt = nodus::Runtime::new();
    rt.block_on(async {
        for policy in [Policy::RoundRobin, Policy::Least] {
            let mut config = sleeper_config(1);
            config.policy = policy;
            let listener = nodus::net::TcpListener::bind("127.0.0.1:0").unwrap();
            config.listeners.push(("http".into(), listener));
            let Err(err) = Primary::start(config) else {
                panic!("a plain program started under {policy:?}");
            };
            assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
            assert!(err.to_string().contains(policy.name()), "{err}");
        }

        let mut config = Config::new(
            1,
            WorkerCommand {
                program: "sh".into(),
                args: vec![
                    "-c".into(),
                    "grep '^flags' /proc/self/fdinfo/3 > \"$OUT.tmp\" && mv \"$OUT.tmp\" \"$OUT\"; \
                     exec sleep 30"
                        .into(),
                ],
                env: vec![("OUT".into(), out.clone().into_os_string())],
                ipc: false,
            },
        );
        assert_eq!(config.policy, Policy::Shared);
        config.readiness = Readiness::Alive(Duration::from_millis(10));
        config.prefix_output = false;
        config.kill_timeout = Duration::from_secs(5);
        let listener = nodus::net::TcpListener::bind("127.0.0.1:0").unwrap();
        config.listeners.push(("http".into(), listener));
        let primary = Primary::start(config).expect("sh runs");
        let (_events, run) = record_and_run(&primary);
        assert!(file_appears(&out).await, "the worker wrote no flags");
        let text = std::fs::read_to_string(&out).unwrap();
        let flags = u32::from_str_radix(text.trim().trim_start_matches("flags:").trim(), 8)
            .unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert_eq!(
            flags & libc::O_NONBLOCK as u32,
            0,
            "the plain program's listener is non-blocking: {text:?}"
        );
        assert_eq!(shut_down(&primary, run).await, 0);
    });
}

/// The worker roles of the test below, by slot. Slot 1 is a nodus worker: it listens, says so
/// with the file `b-listening`, and for each connection it accepts appends a line to
/// `b-accepted` and answers `hi`. Slot 2 speaks the protocol by hand, as a buggy or hostile
/// worker could: it asks for the same listener (and another, which it keeps: closing its last
/// one would be a "going down" notice), closes it, and gives back as `returned` five
/// fds none of which is a connection of that listener; then it writes `a-sent` and waits for the
/// primary's `disconnect`.
fn returning_worker() -> ! {
    let dir = std::path::PathBuf::from(std::env::var_os(DIR).expect("the test sets the dir"));
    let port: u16 = std::env::var("PORT").unwrap().parse().unwrap();
    let addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
    let slot = std::env::var("NODUS_WORKER_ID").unwrap();
    let code = nodus::Runtime::new().block_on(async move {
        if slot == "1" {
            let worker = Worker::get().unwrap().expect("started as a cluster worker");
            let listener = worker.listen(addr).await.unwrap();
            std::fs::write(dir.join("b-listening"), b"").unwrap();
            worker.ready();
            let serving = nodus::spawn(async move {
                use std::io::Write;
                while let Ok((stream, peer)) = listener.accept().await {
                    let mut log = std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(dir.join("b-accepted"))
                        .unwrap();
                    writeln!(log, "{peer}").unwrap();
                    let _ = stream.write_all(b"hi\n").await;
                }
            });
            worker.drain_requested().await;
            serving.abort();
            return 0;
        }
        let channel = nodus::ipc::Channel::from_env()
            .unwrap()
            .expect("started with a channel");
        assert!(file_appears(&dir.join("b-listening")).await);
        channel
            .send(&serde_json::json!({
                "cmd": "NODE_CLUSTER", "act": "queryServer", "address": "127.0.0.1",
                "port": port, "addressType": 4, "index": 0, "flags": 0, "backlog": 511, "seq": 1
            }))
            .unwrap();
        let key = loop {
            let msg = channel.recv_internal().await.expect("the primary answers");
            let v: serde_json::Value = serde_json::from_str(msg.json()).unwrap();
            if v["ack"] == 1 {
                break v["key"].as_str().expect("a key").to_owned();
            }
        };
        // A second listener, kept: closing its last one would be a "going down" notice.
        channel
            .send(&serde_json::json!({
                "cmd": "NODE_CLUSTER", "act": "queryServer", "address": "127.0.0.1",
                "port": 0, "addressType": 4, "index": 1, "flags": 0, "backlog": 511, "seq": 4
            }))
            .unwrap();
        loop {
            let msg = channel.recv_internal().await.expect("the primary answers");
            let v: serde_json::Value = serde_json::from_str(msg.json()).unwrap();
            if v["ack"] == 4 {
                break;
            }
        }
        channel
            .send(&serde_json::json!({"cmd": "NODE_CLUSTER", "act": "close", "key": key, "seq": 2}))
            .unwrap();
        let (pipe, _w) = std::io::pipe().unwrap();
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let (unix, _peer) = std::os::unix::net::UnixStream::pair().unwrap();
        let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        // A connection of its own, elsewhere: connected TCP, but not one of that listener.
        let own = std::net::TcpStream::connect(other.local_addr().unwrap()).unwrap();
        let fds: Vec<std::rc::Rc<std::os::fd::OwnedFd>> = vec![
            std::rc::Rc::new(pipe.into()),
            std::rc::Rc::new(udp.into()),
            std::rc::Rc::new(unix.into()),
            std::rc::Rc::new(other.into()),
            std::rc::Rc::new(own.into()),
        ];
        let peers = vec![serde_json::Value::Null; fds.len()];
        channel
            .send_fds(
                &serde_json::json!({
                    "cmd": "NODE_NODUS", "act": "returned", "key": key, "seq": 3, "peers": peers
                }),
                fds,
            )
            .unwrap();
        std::fs::write(dir.join("a-sent"), b"").unwrap();
        while let Some(msg) = channel.recv_internal().await {
            if msg.json().contains("\"disconnect\"") {
                break;
            }
        }
        0
    });
    std::process::exit(code);
}

#[test]
fn fds_given_back_that_are_not_connections_are_closed_and_counted_never_handed_on() {
    if std::env::var(ROLE).as_deref() == Ok("returning") {
        returning_worker();
    }
    let dir = nodus_testkit::tmp::TempDir::new("returned-fds");
    let rt = nodus::Runtime::new();
    rt.block_on(async {
        let listener = nodus::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mut config = role_config(
            "fds_given_back_that_are_not_connections_are_closed_and_counted_never_handed_on",
            "returning",
            2,
            dir.path(),
            &[("PORT", addr.port())],
        );
        assert_eq!(config.policy, Policy::RoundRobin);
        config.listeners.push(("http".into(), listener));
        let primary = Primary::start(config).expect("the test binary runs");
        let (_events, run) = record_and_run(&primary);
        assert!(file_appears(&dir.path().join("a-sent")).await);

        let mut rejected = serde_json::Value::Null;
        for _ in 0..1000 {
            let stats: serde_json::Value =
                serde_json::from_str(&primary.stats_json().await).unwrap();
            rejected = stats["returned_rejected"].clone();
            if rejected == 5 {
                break;
            }
            nodus::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(rejected, 5, "the five fds were not all refused");
        assert!(
            primary
                .metrics_text()
                .await
                .contains("nodus_cluster_returned_fds_rejected_total 5"),
            "no counter in the metrics"
        );

        // The primary still hands real connections to the worker that listens.
        let client = nodus::net::TcpStream::connect(addr).await.unwrap();
        let mut buf = [0u8; 3];
        let n = nodus::timeout(Duration::from_secs(10), client.read(&mut buf))
            .await
            .expect("the worker answered")
            .unwrap();
        assert_eq!(&buf[..n], b"hi\n");
        let accepted = std::fs::read_to_string(dir.path().join("b-accepted")).unwrap();
        let client_addr = client.local_addr().unwrap().to_string();
        assert_eq!(
            accepted.lines().collect::<Vec<_>>(),
            [client_addr.as_str()],
            "the worker was handed something other than the client's connection"
        );
        drop(client);
        assert_eq!(shut_down(&primary, run).await, 0);
    });
}

/// The worker role of the test below: listens on `PORT` and `PORT2`, says ready, closes (drops)
/// its listener on `PORT2` and writes the file `closed`; it stays until the primary's
/// `disconnect`.
fn closing_worker() -> ! {
    let dir = std::path::PathBuf::from(std::env::var_os(DIR).expect("the test sets the dir"));
    let addr = |var: &str| -> std::net::SocketAddr {
        ([127, 0, 0, 1], std::env::var(var).unwrap().parse().unwrap()).into()
    };
    let (kept, closed) = (addr("PORT"), addr("PORT2"));
    let code = nodus::Runtime::new().block_on(async move {
        let worker = Worker::get().unwrap().expect("started as a cluster worker");
        let _kept = worker.listen(kept).await.unwrap();
        let closing = worker.listen(closed).await.unwrap();
        worker.ready();
        drop(closing);
        std::fs::write(dir.join("closed"), b"").unwrap();
        worker.drain_requested().await;
        0
    });
    std::process::exit(code);
}

/// A listener a nodus worker closed (its `Listener` dropped), the only one to hold it, is
/// released by the primary at once under rr and shared: the port is free again (another
/// process binds it; closed, a connection to it is refused).
#[test]
fn a_listener_a_nodus_worker_closed_is_released() {
    if std::env::var(ROLE).as_deref() == Ok("closing") {
        closing_worker();
    }
    for policy in [Policy::RoundRobin, Policy::Shared] {
        let dir = nodus_testkit::tmp::TempDir::new("nodus-worker-closes");
        let [kept, closed] = nodus_testkit::net::free_addrs::<2>();
        let rt = nodus::Runtime::new();
        rt.block_on(async {
            let mut config = role_config(
                "a_listener_a_nodus_worker_closed_is_released",
                "closing",
                1,
                dir.path(),
                &[("PORT", kept.port()), ("PORT2", closed.port())],
            );
            config.policy = policy;
            let primary = Primary::start(config).expect("the test binary runs");
            let (_events, run) = record_and_run(&primary);
            assert!(file_appears(&dir.path().join("closed")).await);
            let free = || {
                std::net::TcpListener::bind(closed).is_ok()
                    && std::net::TcpStream::connect(closed)
                        .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused)
            };
            let mut released = false;
            for _ in 0..1000 {
                if free() {
                    released = true;
                    break;
                }
                nodus::sleep(Duration::from_millis(10)).await;
            }
            assert!(released, "{policy:?}: {closed} is still taken");
            // The other listener is still the primary's.
            assert!(
                std::net::TcpListener::bind(kept).is_err(),
                "{policy:?}: {kept} was released too"
            );
            assert_eq!(shut_down(&primary, run).await, 0);
        });
    }
}

/// The worker role of the test below: reports whether the reuse-port socket it got is v6-only,
/// in the file `v6only` (`true`/`false`). With a channel it asks for it as a Node worker does
/// (`queryServer` for `::1` on `PORT`) and then waits for the primary's `disconnect`; a plain
/// program takes fd 3 (`LISTEN_FDS`) and waits to be stopped.
fn v6only_worker() -> ! {
    let dir = std::path::PathBuf::from(std::env::var_os(DIR).expect("the test sets the dir"));
    let report = |fd: &std::os::fd::OwnedFd| {
        let only = socket2::SockRef::from(fd).only_v6().unwrap();
        let tmp = dir.join("v6only.tmp");
        std::fs::write(&tmp, only.to_string()).unwrap();
        std::fs::rename(&tmp, dir.join("v6only")).unwrap();
    };
    if std::env::var_os("NODE_CHANNEL_FD").is_none() {
        assert_eq!(std::env::var("LISTEN_FDS").as_deref(), Ok("1"));
        // SAFETY: fd 3 is the listener the primary passed (LISTEN_FDS=1); nothing else owns it.
        let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(3) };
        report(&fd);
        std::thread::sleep(Duration::from_secs(30));
        std::process::exit(0);
    }
    let port: u16 = std::env::var("PORT").unwrap().parse().unwrap();
    let code = nodus::Runtime::new().block_on(async move {
        let channel = nodus::ipc::Channel::from_env()
            .unwrap()
            .expect("started with a channel");
        channel
            .send(&serde_json::json!({
                "cmd": "NODE_CLUSTER", "act": "queryServer", "address": "::1",
                "port": port, "addressType": 6, "index": 0, "flags": 0, "backlog": 511, "seq": 1
            }))
            .unwrap();
        loop {
            let mut msg = channel.recv_internal().await.expect("the primary answers");
            let v: serde_json::Value = serde_json::from_str(msg.json()).unwrap();
            if v["ack"] == 1 {
                assert!(v["errno"].is_null(), "{v}");
                report(&msg.take_handle().expect("a socket").into_owned_fd());
                break;
            }
        }
        while let Some(msg) = channel.recv_internal().await {
            if msg.json().contains("\"disconnect\"") {
                break;
            }
        }
        0
    });
    std::process::exit(code);
}

/// Under reuseport the workers' sockets for a pre-bound v6-only `::` socket (as systemd's
/// `BindIPv6Only=ipv6-only` passes one) are v6-only too, for a Node worker and a plain program:
/// dual-stack ones would take IPv4 connections the operator did not ask for. The wildcard is
/// needed (Linux makes every socket bound to a specific IPv6 address v6-only); nothing connects.
#[test]
fn reuseport_sockets_for_a_v6_only_prebound_socket_are_v6_only() {
    const NAME: &str = "reuseport_sockets_for_a_v6_only_prebound_socket_are_v6_only";
    if std::env::var(ROLE).as_deref() == Ok("v6only") {
        v6only_worker();
    }
    if std::net::TcpListener::bind("[::1]:0").is_err() {
        println!("skipped: no IPv6 loopback");
        return;
    }
    let rt = nodus::Runtime::new();
    rt.block_on(async {
        for ipc in [true, false] {
            let dir = nodus_testkit::tmp::TempDir::new("reuseport-v6only");
            let options = nodus::net::ListenOptions {
                ipv6_only: true,
                reuse_port: true,
                ..nodus::net::ListenOptions::default()
            };
            let listener = nodus::net::TcpListener::bind_with("[::]:0", options).unwrap();
            let port = listener.local_addr().unwrap().port();
            let mut command = self_as_worker(NAME, "v6only");
            command.ipc = ipc;
            command
                .env
                .push((DIR.into(), dir.path().as_os_str().to_owned()));
            command.env.push(("PORT".into(), port.to_string().into()));
            let mut config = Config::new(1, command);
            config.policy = Policy::ReusePort;
            config.listeners.push(("http".into(), listener));
            config.readiness = Readiness::Alive(Duration::from_millis(10));
            config.prefix_output = false;
            config.kill_timeout = Duration::from_secs(5);
            let primary = Primary::start(config).expect("the test binary runs");
            let (_events, run) = record_and_run(&primary);
            let report = dir.path().join("v6only");
            assert!(file_appears(&report).await, "ipc {ipc}: no report");
            assert_eq!(
                std::fs::read_to_string(&report).unwrap(),
                "true",
                "ipc {ipc}: the worker's socket is dual-stack"
            );
            shut_down(&primary, run).await;
        }
    });
}

/// Set in a primary this binary starts from itself (the orphan-guard tests): what to do
/// (`kill`: run until killed; `stop`: shut down, then check no guard is left) and the file the
/// worker writes its background child's pid to, as `ROLE:FILE`.
const PRIMARY_ROLE: &str = "NODUS_TEST_PRIMARY_ROLE";

/// The children of every thread of this process.
fn own_children() -> Vec<i32> {
    tree::children(std::process::id())
}

fn is_guard(pid: i32) -> bool {
    tree::is_named(pid, nodus::process::GUARD_NAME.to_bytes())
}

/// The primary role of the orphan-guard tests, in a process of its own (this binary, run
/// again): one `sh` worker that starts `sleep 300` in the background and writes its pid down.
fn play_primary(role: &str, file: &str) {
    let mut config = sleeper_config(1);
    config.command.args = vec![
        "-c".into(),
        format!("sleep 300 & echo $! > {file}; wait").into(),
    ];
    nodus::Runtime::new().block_on(async {
        let primary = Primary::start(config).expect("sh runs");
        // The guard names itself after its fork, so its name may come a moment later.
        let named_by = std::time::Instant::now() + Duration::from_secs(5);
        let guards: Vec<i32> = loop {
            let guards: Vec<i32> = own_children()
                .into_iter()
                .filter(|&p| is_guard(p))
                .collect();
            if !guards.is_empty() || std::time::Instant::now() > named_by {
                break guards;
            }
            nodus::sleep(Duration::from_millis(5)).await;
        };
        assert_eq!(guards.len(), 1, "one guard: {:?}", own_children());
        let (_events, run) = record_and_run(&primary);
        if role == "kill" {
            // Until the test kills this process (bounded, should the test be gone: then the
            // process exits, and the guard takes the worker's group with it).
            let _ = nodus::timeout(Duration::from_secs(60), run).await;
            std::process::exit(3);
        }
        while std::fs::metadata(file).map_or(true, |m| m.len() == 0) {
            nodus::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(shut_down(&primary, run).await, 0);
        // `run` has reaped the guard: it is no child of ours any more.
        assert!(
            own_children().iter().all(|&p| !is_guard(p)),
            "a guard left: {:?}",
            own_children()
        );
        assert!(guards.iter().all(|&g| tree::gone(g)));
    });
}

/// Runs this test binary's test `name` as a primary in `role`, its worker's child's pid written
/// to a file in `dir`: the process and the file.
fn primary_process(
    name: &str,
    role: &str,
    dir: &nodus_testkit::tmp::TempDir,
) -> (std::process::Child, std::path::PathBuf) {
    let file = dir.path().join("pid");
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--nocapture", "--test-threads", "1"])
        .env(PRIMARY_ROLE, format!("{role}:{}", file.display()))
        .stdin(std::process::Stdio::null())
        .spawn()
        .unwrap();
    (child, file)
}

/// A Rust program's primary killed with SIGKILL: its worker's child is gone within 2 s (the
/// orphan guard), though the worker's parent-death signal only reaches the worker.
#[test]
fn a_rust_primary_killed_with_sigkill_leaves_no_child_of_a_worker() {
    const NAME: &str = "a_rust_primary_killed_with_sigkill_leaves_no_child_of_a_worker";
    if let Ok(role) = std::env::var(PRIMARY_ROLE) {
        let (role, file) = role.split_once(':').unwrap();
        return play_primary(role, file);
    }
    let dir = nodus_testkit::tmp::TempDir::new("guard-lib-kill");
    let (mut primary, file) = primary_process(NAME, "kill", &dir);
    let grandchild = tree::pid_in(&file, Duration::from_secs(20));
    let kill = |pid: i32| {
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_raw(pid).unwrap(),
            rustix::process::Signal::KILL,
        );
    };
    assert!(!tree::gone(grandchild), "the worker's child runs");
    primary.kill().unwrap();
    primary.wait().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    while !tree::gone(grandchild) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let left = !tree::gone(grandchild);
    if left {
        kill(grandchild);
    }
    assert!(
        !left,
        "the worker's child {grandchild} outlived its primary by 2 s"
    );
}

/// A Rust program's primary that shuts down reaps its guard before `run` returns.
#[test]
fn a_rust_primary_that_shuts_down_leaves_no_guard() {
    const NAME: &str = "a_rust_primary_that_shuts_down_leaves_no_guard";
    if let Ok(role) = std::env::var(PRIMARY_ROLE) {
        let (role, file) = role.split_once(':').unwrap();
        return play_primary(role, file);
    }
    let dir = nodus_testkit::tmp::TempDir::new("guard-lib-stop");
    let (mut primary, _file) = primary_process(NAME, "stop", &dir);
    let status = (0..1000)
        .find_map(|_| {
            let status = primary.try_wait().unwrap();
            if status.is_none() {
                std::thread::sleep(Duration::from_millis(20));
            }
            status
        })
        .unwrap_or_else(|| {
            let _ = primary.kill();
            panic!("the primary did not finish within 20 s");
        });
    primary.wait().unwrap();
    assert!(status.success(), "{status}");
}

/// One worker (`sh`, which ignores SIGTERM) that exits with `code` once `file` exists; `ipc`
/// gives it a channel (it never reads it), so a drain deadline.
fn exit_on_file_config(file: &std::path::Path, code: i32, ipc: bool) -> Config {
    let script = format!("trap '' TERM; while [ ! -e \"$1\" ]; do sleep 0.01; done; exit {code}");
    let mut config = Config::new(
        1,
        WorkerCommand {
            program: "sh".into(),
            args: vec!["-c".into(), script.into(), "sh".into(), file.into()],
            env: Vec::new(),
            ipc,
        },
    );
    config.readiness = Readiness::Alive(Duration::from_millis(10));
    config.prefix_output = false;
    config
}

/// Has the worker `pid()` exit (it waits for `file`) exactly as a timer the primary armed by now
/// for `expiry` expires: once the primary's tasks have run (50 ms), in the check phase (after
/// this loop turn's poll phase) it creates `file`, then blocks the loop until the worker is a
/// zombie and `expiry` has passed, so the next turn runs the timer (timers phase) before the
/// poll phase that reaps the worker.
async fn exit_as_it_expires(pid: impl Fn() -> u32, file: &std::path::Path, expiry: Duration) {
    nodus::sleep(Duration::from_millis(50)).await;
    let armed_by = std::time::Instant::now();
    let pid = pid();
    assert_ne!(pid, 0, "the worker runs");
    nodus::yield_now().await;
    std::fs::write(file, b"").unwrap();
    let start = std::time::Instant::now();
    while !tree::is_zombie(pid as i32) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "worker {pid} did not exit"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let due = armed_by + expiry + Duration::from_millis(100);
    std::thread::sleep(due.saturating_duration_since(std::time::Instant::now()));
}

/// Shuts `primary` (one ready worker, from [`exit_on_file_config`]) down, its worker exiting as
/// the kill timer's `expiry` passes ([`exit_as_it_expires`]); `run`'s exit code.
async fn exit_as_the_kill_timer_expires(
    primary: &Primary,
    run: nodus::JoinHandle<i32>,
    file: &std::path::Path,
    expiry: Duration,
) -> i32 {
    let pid = primary.worker_pids()[0].1;
    // The drain arms the kill timer (its task runs in this turn).
    primary.shutdown();
    exit_as_it_expires(|| pid, file, expiry).await;
    nodus::timeout(Duration::from_secs(20), run)
        .await
        .expect("the shutdown finishes")
        .unwrap()
}

/// A worker that exits as its kill timeout expires, before the loop has reaped it, is not
/// "still running": no SIGKILL line, and the stop is not a forced one (exit code 0, not 124).
#[test]
fn a_worker_that_exits_as_its_kill_timeout_expires_is_not_killed() {
    let dir = nodus_testkit::tmp::TempDir::new("kill-timeout-race");
    let file = dir.path().join("exit");
    let (warnings, _guard) = Warnings::capture();
    let rt = nodus::Runtime::new();
    let code = rt.block_on(async {
        let mut config = exit_on_file_config(&file, 0, false);
        let kill_timeout = Duration::from_millis(300);
        config.kill_timeout = kill_timeout;
        let primary = Primary::start(config).expect("sh runs");
        let (events, run) = record_and_run(&primary);
        wait_until(&events, |ev| {
            ev.iter().any(|e| matches!(e.kind, EventKind::Ready))
        })
        .await;
        exit_as_the_kill_timer_expires(&primary, run, &file, kill_timeout).await
    });
    let warnings = warnings.text();
    assert!(!warnings.contains("still running"), "{warnings}");
    assert_eq!(code, 0, "{warnings}");
}

/// A worker with a channel that exits as its drain deadline passes (the kill signal's time),
/// before the loop has reaped it, gets no kill signal: no "past its deadline" line, and its exit
/// (code 3, not a forced stop's) is not one the kill signal cut (exit code 0, not 124).
#[test]
fn a_worker_that_exits_as_its_drain_deadline_passes_gets_no_kill_signal() {
    let dir = nodus_testkit::tmp::TempDir::new("drain-deadline-race");
    let file = dir.path().join("exit");
    let (warnings, _guard) = Warnings::capture();
    let rt = nodus::Runtime::new();
    let code = rt.block_on(async {
        let mut config = exit_on_file_config(&file, 3, true);
        config.drain_timeout = Duration::from_millis(100);
        config.kill_timeout = Duration::from_secs(10);
        let primary = Primary::start(config).expect("sh runs");
        let (events, run) = record_and_run(&primary);
        wait_until(&events, |ev| {
            ev.iter().any(|e| matches!(e.kind, EventKind::Ready))
        })
        .await;
        // The kill signal comes 200 ms (`DRAIN_GRACE`) after the drain deadline.
        let term_at = Duration::from_millis(300);
        exit_as_the_kill_timer_expires(&primary, run, &file, term_at).await
    });
    let warnings = warnings.text();
    for line in ["past its deadline", "past the drain deadline"] {
        assert!(!warnings.contains(line), "{warnings}");
    }
    assert_eq!(code, 0, "{warnings}");
}

/// A worker that exits as its ready timeout expires, before its reap, is not warned about as
/// not ready: it is gone, and its exit says so.
#[test]
fn a_worker_that_exits_as_its_ready_timeout_expires_is_not_called_not_ready() {
    let dir = nodus_testkit::tmp::TempDir::new("ready-timeout-race");
    let file = dir.path().join("exit");
    let (warnings, _guard) = Warnings::capture();
    let rt = nodus::Runtime::new();
    let code = rt.block_on(async {
        let mut config = exit_on_file_config(&file, 0, false);
        config.readiness = Readiness::Message;
        let ready_timeout = Duration::from_millis(300);
        config.ready_timeout = ready_timeout;
        // Not restarted: with no worker left, the primary exits (0: a clean exit).
        config.restart.restart = nodus::cluster::RestartType::Temporary;
        let primary = Primary::start(config).expect("sh runs");
        let (_events, run) = record_and_run(&primary);
        let pid = primary.worker_pids()[0].1;
        // Its spawn armed the not-ready warning's timer.
        exit_as_it_expires(|| pid, &file, ready_timeout).await;
        nodus::timeout(Duration::from_secs(20), run)
            .await
            .expect("the primary exits with its last worker")
            .unwrap()
    });
    let warnings = warnings.text();
    assert!(!warnings.contains("has not said it is ready"), "{warnings}");
    assert_eq!(code, 0, "{warnings}");
}

/// A reload's new worker that exits as the reload's ready timeout expires, before its reap,
/// fails the reload as an exit ("exited before it was ready", with its status), not as a worker
/// that was late.
#[test]
fn a_reloads_worker_that_exits_as_its_ready_timeout_expires_fails_it_as_an_exit() {
    let dir = nodus_testkit::tmp::TempDir::new("reload-ready-race");
    let file = dir.path().join("exit");
    let old = dir.path().join("old");
    let (warnings, _guard) = Warnings::capture();
    let rt = nodus::Runtime::new();
    let why = rt.block_on(async {
        // The first worker marks `old` and sleeps; the reload's waits for `file`, then exits 3.
        let script = "if [ -e \"$2\" ]; then while [ ! -e \"$1\" ]; do sleep 0.01; done; \
                      exit 3; fi; : > \"$2\"; exec sleep 30";
        let mut config = Config::new(
            1,
            WorkerCommand {
                program: "sh".into(),
                args: vec![
                    "-c".into(),
                    script.into(),
                    "sh".into(),
                    file.clone().into(),
                    old.clone().into(),
                ],
                env: Vec::new(),
                ipc: false,
            },
        );
        config.prefix_output = false;
        // Never ready by time within the test: the reload waits its ready timeout.
        config.readiness = Readiness::Alive(Duration::from_secs(60));
        let ready_timeout = Duration::from_millis(300);
        config.ready_timeout = ready_timeout;
        // The first failed attempt fails the reload.
        config.max_restarts = 0;
        config.kill_timeout = Duration::from_secs(5);
        let primary = Primary::start(config).expect("sh runs");
        let (events, run) = record_and_run(&primary);
        for _ in 0..1000 {
            if old.exists() {
                break;
            }
            nodus::sleep(Duration::from_millis(10)).await;
        }
        assert!(old.exists(), "the first worker ran");
        primary.reload();
        let new_pid = || {
            events
                .borrow()
                .iter()
                .find(|e| matches!(e.kind, EventKind::Fork { generation: 1 }))
                .and_then(|e| e.pid)
                .unwrap_or(0)
        };
        exit_as_it_expires(new_pid, &file, ready_timeout).await;
        wait_until(&events, |ev| {
            ev.iter()
                .any(|e| matches!(e.kind, EventKind::ReloadFailed { .. }))
        })
        .await;
        let why = events
            .borrow()
            .iter()
            .find_map(|e| match &e.kind {
                EventKind::ReloadFailed { why, .. } => Some(why.clone()),
                _ => None,
            })
            .unwrap();
        assert_eq!(shut_down(&primary, run).await, 0);
        why
    });
    let warnings = warnings.text();
    assert!(
        why.starts_with("worker 1 of generation 1 exited before it was ready (exit code 3)"),
        "{why}\n{warnings}"
    );
}

/// The worker role of the test below: listens on port 0, writes the address its listener says
/// to `DIR/port-ID`, and says ready.
fn port_zero_worker() -> ! {
    nodus::Runtime::new().block_on(async {
        let worker = Worker::get().unwrap().expect("started as a cluster worker");
        let listener = worker.listen("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let dir = std::path::PathBuf::from(std::env::var_os(DIR).unwrap());
        let said = listener.local_addr().unwrap().to_string();
        std::fs::write(dir.join(format!("port-{}", worker.id())), said).unwrap();
        worker.ready();
        worker.drain_requested().await;
        drop(listener);
    });
    std::process::exit(0);
}

/// Port 0 under round-robin and least (the primary binds, the workers get connections over the
/// channel): every worker's listener says the port the primary bound, as Node's `server.address()`
/// does, and so does its `listening` event; that port takes connections.
#[test]
fn a_port_zero_listen_under_round_robin_says_the_port_the_primary_bound() {
    const TEST: &str = "a_port_zero_listen_under_round_robin_says_the_port_the_primary_bound";
    if std::env::var(ROLE).as_deref() == Ok("port-zero") {
        port_zero_worker();
    }
    for policy in [Policy::RoundRobin, Policy::Least] {
        let dir = nodus_testkit::tmp::TempDir::new("port-zero");
        let rt = nodus::Runtime::new();
        rt.block_on(async {
            let mut config = role_config(TEST, "port-zero", 2, dir.path(), &[]);
            config.policy = policy;
            let primary = Primary::start(config).expect("the test binary runs");
            let (events, run) = record_and_run(&primary);
            wait_until(&events, |ev| {
                ev.iter()
                    .filter(|e| matches!(e.kind, EventKind::Ready))
                    .count()
                    == 2
            })
            .await;
            let said: Vec<std::net::SocketAddr> = (1..=2)
                .map(|id| {
                    std::fs::read_to_string(dir.path().join(format!("port-{id}")))
                        .unwrap()
                        .parse()
                        .unwrap()
                })
                .collect();
            assert_ne!(said[0].port(), 0, "{policy:?}: {said:?}");
            assert_eq!(said[0], said[1], "{policy:?}");
            let listening: Vec<String> = events
                .borrow()
                .iter()
                .filter_map(|e| match &e.kind {
                    EventKind::Listening { address } => Some(address.clone()),
                    _ => None,
                })
                .collect();
            assert_eq!(listening, [said[0].to_string(), said[0].to_string()]);
            std::net::TcpStream::connect(said[0]).expect("the port takes connections");
            assert_eq!(shut_down(&primary, run).await, 0);
        });
    }
}

/// The worker role of the test below: says ready, then blocks its loop (reads nothing) until
/// `DIR/release` appears (30 s at most).
fn deaf_worker() -> ! {
    nodus::Runtime::new().block_on(async {
        let worker = Worker::get().unwrap().expect("started as a cluster worker");
        worker.ready();
        let release = std::path::PathBuf::from(std::env::var_os(DIR).unwrap()).join("release");
        for _ in 0..3000 {
            if release.exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        worker.drain_requested().await;
    });
    std::process::exit(0);
}

/// `Primary::send` and `broadcast` say when a worker does not read (`false` once 128 KiB waits
/// for it, as Node's `worker.send()`), rather than queue without a word; a message over the
/// frame cap is an error from both, not a broadcast that reaches no one.
#[test]
fn sending_to_a_worker_that_reads_nothing_says_slow_down_and_an_oversized_broadcast_fails() {
    const TEST: &str =
        "sending_to_a_worker_that_reads_nothing_says_slow_down_and_an_oversized_broadcast_fails";
    if std::env::var(ROLE).as_deref() == Ok("deaf") {
        deaf_worker();
    }
    let dir = nodus_testkit::tmp::TempDir::new("slow-down");
    let rt = nodus::Runtime::new();
    rt.block_on(async {
        let primary = Primary::start(role_config(TEST, "deaf", 1, dir.path(), &[])).unwrap();
        let (events, run) = record_and_run(&primary);
        wait_until(&events, |ev| {
            ev.iter().any(|e| matches!(e.kind, EventKind::Ready))
        })
        .await;
        let message = "x".repeat(1024);
        let sent = (0..20_000).take_while(|_| primary.send(1, &message).unwrap());
        let before_slow_down = sent.count();
        assert!(before_slow_down < 20_000, "send never said slow down");
        assert!(!primary.broadcast(&message).unwrap(), "broadcast too");
        let huge = "x".repeat(17 << 20);
        for e in [
            primary.send(1, &huge),
            primary.broadcast(&huge).map(|_| true),
        ] {
            assert_eq!(e.unwrap_err().kind(), std::io::ErrorKind::InvalidInput);
        }
        std::fs::write(dir.path().join("release"), "").unwrap();
        assert_eq!(shut_down(&primary, run).await, 0);
    });
}

/// The worker role of the test below: listens on port 0 twice and on `DIR/port`'s port twice,
/// and writes what it got to `DIR/got-ID`: the two port-0 addresses, then `ok` or the error of
/// the second listen on the fixed port.
fn listen_twice_worker() -> ! {
    nodus::Runtime::new().block_on(async {
        let worker = Worker::get().unwrap().expect("started as a cluster worker");
        let dir = std::path::PathBuf::from(std::env::var_os(DIR).unwrap());
        let any = "127.0.0.1:0".parse().unwrap();
        let a = worker.listen(any).await.unwrap();
        let b = worker.listen(any).await.unwrap();
        let port: u16 = std::env::var("PORT").unwrap().parse().unwrap();
        let fixed = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let _first = worker.listen(fixed).await.unwrap();
        let second = match worker.listen(fixed).await {
            Ok(_) => "ok".to_string(),
            Err(e) => e.to_string(),
        };
        let got = format!(
            "{}\n{}\n{second}",
            a.local_addr().unwrap(),
            b.local_addr().unwrap()
        );
        std::fs::write(dir.join(format!("got-{}", worker.id())), got).unwrap();
        worker.ready();
        worker.drain_requested().await;
    });
    std::process::exit(0);
}

/// A worker's listens on one address are numbered as Node's worker numbers its servers (each a
/// key of its own): two port-0 listens get two ports, and a second listen on a port the worker
/// already listens on is refused `EADDRINUSE`, as under a Node primary (whose round-robin handle
/// died of the same key asked twice).
#[test]
fn a_workers_second_listen_on_one_address_is_a_server_of_its_own_as_in_node() {
    const TEST: &str = "a_workers_second_listen_on_one_address_is_a_server_of_its_own_as_in_node";
    if std::env::var(ROLE).as_deref() == Ok("listen-twice") {
        listen_twice_worker();
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = nodus_testkit::tmp::TempDir::new("listen-twice");
    let rt = nodus::Runtime::new();
    rt.block_on(async {
        let config = role_config(TEST, "listen-twice", 1, dir.path(), &[("PORT", port)]);
        let primary = Primary::start(config).unwrap();
        let (events, run) = record_and_run(&primary);
        wait_until(&events, |ev| {
            ev.iter().any(|e| matches!(e.kind, EventKind::Ready))
        })
        .await;
        let got = std::fs::read_to_string(dir.path().join("got-1")).unwrap();
        let lines: Vec<&str> = got.lines().collect();
        let a: std::net::SocketAddr = lines[0].parse().unwrap();
        let b: std::net::SocketAddr = lines[1].parse().unwrap();
        assert!(
            a.port() != 0 && b.port() != 0 && a.port() != b.port(),
            "{got}"
        );
        let in_use = std::io::Error::from_raw_os_error(libc::EADDRINUSE).to_string();
        assert!(lines[2].contains(&in_use), "{got}");
        assert_eq!(shut_down(&primary, run).await, 0);
    });
}

/// `on_event` misses no event: a subscriber added before `run` gets the first workers' `fork`
/// events, which `Primary::start` emitted before anyone could subscribe, then the rest in order.
#[test]
fn a_subscriber_added_before_run_gets_the_first_workers_forks() {
    let rt = nodus::Runtime::new();
    rt.block_on(async {
        let primary = Primary::start(sleeper_config(2)).unwrap();
        let (events, run) = record_and_run(&primary);
        wait_until(&events, |ev| {
            ev.iter()
                .filter(|e| matches!(e.kind, EventKind::Ready))
                .count()
                == 2
        })
        .await;
        let forks: Vec<Option<u32>> = events
            .borrow()
            .iter()
            .take(2)
            .filter(|e| matches!(e.kind, EventKind::Fork { generation: 0 }))
            .map(|e| e.worker)
            .collect();
        assert_eq!(forks, [Some(1), Some(2)], "{:#?}", events.borrow());
        // One added once `run` began gets what comes from then on only.
        let late: Events = Rc::default();
        let sink = late.clone();
        primary.on_event(move |e| sink.borrow_mut().push(e.clone()));
        assert!(late.borrow().is_empty(), "{:#?}", late.borrow());
        assert_eq!(shut_down(&primary, run).await, 0);
        assert!(!late.borrow().is_empty(), "the shutdown's events");
    });
}
