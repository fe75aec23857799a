//! `nodus run`'s supervision at its edges: a primary with no worker left to run exits, a
//! replacement that cannot be started is retried instead of ending the service, a terminal's
//! hangup (the kernel's SIGHUP, or an interactive shell's forwarding it) is a stop and no
//! reload, one under `nohup` changes nothing (a `kill -HUP` then still reloads), a SIGHUP
//! during a reload queues one more reload (started once the old workers have exited, so its
//! lines follow all of the first's), the default restart budget outlasts every worker
//! crashing once (and a smaller explicit one is warned of), a window or a kill timeout of 0
//! seconds and a negative number are refused as usage errors, the notify socket
//! heeds only the worker's own process group (anyone else's datagrams counted in the stats and
//! said once) and is closed with its worker, a worker's junk on its channel is one line then
//! counted, a Node worker's
//! pipe `listen` gets a Unix socket (not TCP), `--node`'s `-l` socket serves a worker's
//! `listen` on an address it covers (another address on its port is said), a `--node` `listen`
//! with no host is bound `::` dual-stack as plain `node` binds it (`ipv6Only` honoured), a
//! `--node` worker's first message is said once and one that never listens is warned about,
//! `node -e CODE` with no script is refused (and said at each worker's `listen` behind a
//! wrapper), the program follows the options with or without `--`, a program that cannot be run
//! (its name quoted; an ELF file for another machine, or a corrupt one, too) is refused before
//! any worker starts while a script with no `#!` line runs with `/bin/sh` (another machine's
//! program, with binfmt_misc not mounted to judge it, is one line and exit code 1 at the
//! workers' exec, never a worker of `/bin/sh`), an empty program name
//! is a usage error, a stop that had to kill workers exits
//! with its own code (124, or 128 + a second signal's number) while a drain in time exits 0, a
//! worker's exit is logged after its last output line, and no child of a worker outlives it (a
//! stop, a crash loop to the give-up, a clean exit) while what a worker left in its group at its
//! exit is said and counted (`group_killed`), a stopped worker is continued after its kill
//! signal and stops in time, `--wait-ready` waits for a worker's own word
//! (`READY=1`, or a Node worker's `process.send('ready')`) before a reload drains the old one
//! and warns once per worker about one that has not said it within the ready timeout, a `--node`
//! worker gets a `NOTIFY_SOCKET` of its own (never the primary's: its `READY=1` and `STOPPING=1`
//! reach nodus, not systemd), a reload and each backoff wait are logged, and a stopped `--node`
//! worker a timer keeps alive gets its SIGTERM a second after it has disconnected, holding no
//! inbound connection (not at the drain deadline), but not before its in-flight response is
//! done, and
//! `--kill-signal` (SIGINT, for an app written for PM2) is what stops a worker instead of
//! SIGTERM, a plain program's at once and a Node worker's after its `disconnect`, while an
//! uncatchable or unknown signal is a usage error; `STOPPING=1` then exit code 0 is no crash
//! under any restart type (a `permanent` worker is replaced at once, the others' exit decides;
//! one that stays gets the kill signal past its drain deadline, then SIGKILL)
//! and a give-up names a notice or the exit after it as it was; exits of any status before
//! `--min-uptime` back off as crashes do; "no worker left to run" follows every exit line.
//!
//! Every process is started in its own process group and the whole group is killed by PID when
//! the test ends; a worker's background children, which a worker writes to a file, are killed by
//! PID too if they are still there. The workers are `sh` scripts.

mod common;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::{Duration, Instant};

use common::cluster::{
    assert_exit, copy_nodus, count, events, run_sh, spawn, spawn_into_pipe, wait_events,
    wait_ready_pids,
};
use common::{NODUS, have};
use nodus_testkit::proc::Proc;
use nodus_testkit::tmp::TempDir;
use nodus_testkit::tree::{self, gone};
use rustix::process::{Pid, Signal};

fn script(dir: &TempDir, name: &str, body: &str) -> std::path::PathBuf {
    script_with(dir, name, &format!("#!/bin/sh\n{body}\n"))
}

/// An executable file `name` in `dir` holding `text`.
fn script_with(dir: &TempDir, name: &str, text: &str) -> std::path::PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

#[test]
fn a_primary_with_no_worker_left_to_restart_exits() {
    // (restart type, worker's exit code, the primary's exit code)
    for (restart, worker_code, expected) in [
        ("temporary", 0, 0),
        ("transient", 0, 0),
        ("temporary", 3, 1),
    ] {
        let mut primary = spawn(&mut run_sh(
            ["-w", "2", "--restart", restart],
            &format!("exit {worker_code}"),
        ));
        assert_eq!(
            primary.wait_exit(Duration::from_secs(20)),
            Some(expected),
            "--restart {restart}, workers exiting {worker_code}: {:#?}",
            primary.output()
        );
    }
}

/// The command may follow the options without `--`: everything from the first argument that is
/// not an option of nodus on is the program's, its options and a `--` included.
#[test]
fn the_program_and_its_options_need_no_double_dash() {
    for (args, expected) in [
        (
            &["sh", "-c", "echo \"args: $*\"", "sh", "-u", "--", "-w"][..],
            "args: -u -- -w",
        ),
        (
            &["--", "sh", "-c", "echo \"args: $*\"", "sh", "-u"][..],
            "args: -u",
        ),
    ] {
        let mut primary = spawn(
            Command::new(NODUS)
                .args(["run", "-w", "1", "--restart", "temporary"])
                .args(args),
        );
        primary.wait_line(expected);
        assert_eq!(
            primary.wait_exit(Duration::from_secs(20)),
            Some(0),
            "{args:?}: {:#?}",
            primary.output()
        );
    }
}

#[test]
fn a_replacement_that_cannot_be_started_is_retried_and_the_service_stays_up() {
    // A worker of `run` starts as the nodus binary (its `__exec-listen` step), from the path the
    // primary was started from: a copy of it, which the test then takes away.
    let dir = TempDir::new("spawn-fail");
    let program = dir.path().join("nodus");
    copy_nodus(&program);
    let away = dir.path().join("nodus.away");
    let log = dir.path().join("events.jsonl");
    let mut primary = spawn(
        Command::new(&program)
            .args(["run", "-w", "2", "--backoff", "0.1,1,0.1"])
            .args(["--max-restarts", "50", "--restart-window", "60", "--events"])
            .arg(&log)
            .args(["--", "sleep", "60"])
            .env("RUST_LOG", "info"),
    );
    let evs = wait_events(&log, |e| count(e, "fork") == 2);
    let first = evs
        .iter()
        .find(|e| e["event"] == "fork" && e["worker"] == 1)
        .expect("worker 1 forked");
    let pid = first["pid"].as_i64().unwrap() as i32;

    // A non-atomic deploy: the binary is gone when worker 1 dies.
    std::fs::rename(&program, &away).unwrap();
    rustix::process::kill_process(Pid::from_raw(pid).unwrap(), Signal::KILL).unwrap();
    wait_events(&log, |e| count(e, "spawn_failed") >= 2);
    assert_eq!(count(&events(&log), "give_up"), 0, "{:#?}", events(&log));
    assert!(
        primary.exited_within(Duration::ZERO).is_none(),
        "the primary still runs"
    );

    // The binary is back: the next retry starts worker 1 again.
    std::fs::rename(&away, &program).unwrap();
    let evs = wait_events(&log, |e| count(e, "fork") == 3);
    let failed = evs.iter().filter(|e| e["event"] == "spawn_failed");
    assert!(failed.clone().all(|e| e["worker"] == 1), "{evs:#?}");
    assert_eq!(count(&evs, "give_up"), 0, "{evs:#?}");

    primary.signal(Signal::TERM);
    assert_eq!(primary.wait_exit(Duration::from_secs(20)), Some(0));
    // Logged in the order it happened: the exit, then the replacement that could not start.
    let lines = primary.output();
    let at = |what: &str| {
        lines
            .iter()
            .position(|l| l.contains(what))
            .unwrap_or_else(|| panic!("no {what:?}: {lines:#?}"))
    };
    assert!(
        at(&format!("worker 1 (pid {pid}) killed by signal 9"))
            < at("worker 1 could not be started"),
        "{lines:#?}"
    );
}

/// A terminal's hangup (an SSH session dropped: the kernel's SIGHUP) stops a foreground
/// primary as SIGTERM does, exit code 0, with the reason said; it is no reload after which the
/// primary serves on detached, holding its port. (`kill -HUP` is still a reload: below.)
#[test]
fn a_terminal_hangup_stops_the_primary_as_sigterm_does_not_a_reload() {
    if !have("python3") {
        return;
    }
    let dir = TempDir::new("hangup");
    let log = dir.path().join("events.jsonl");
    let outcome = common::hang_up("2 workers ready", &sleepers("2", &log));
    let evs = events(&log);
    assert_eq!(outcome, "exit 0", "{evs:#?}");
    assert_stopped_by_the_hangup(&evs);
    assert_eq!(count(&evs, "exit"), 2, "{evs:#?}");
}

/// The usual hangup: an interactive shell leads the session and forwards the kernel's SIGHUP to
/// its foreground job with `killpg` (`SI_USER`, as bash does), the kernel's own never reaching
/// the primary. The terminal is hung up by then: a stop, exit code 0, no reload.
#[test]
fn a_hangup_a_shell_forwards_stops_the_primary_not_a_reload() {
    if !have("python3") {
        return;
    }
    let dir = TempDir::new("hangup-shell");
    let log = dir.path().join("events.jsonl");
    let args = sleepers("1", &log);
    let hung_up = common::hang_up_as(common::Tty::Shell, "1 worker ready", &args, 30);
    let evs = events(&log);
    assert_eq!(hung_up.outcome, "exit 0", "{evs:#?}");
    assert_stopped_by_the_hangup(&evs);
}

/// `nodus run` of `workers` workers of `sleep 100`, ready after 0.2 s, its events in `log`: the
/// primary the hangup tests hang up.
fn sleepers<'a>(workers: &'a str, log: &'a std::path::Path) -> [&'a str; 10] {
    let log = log.to_str().unwrap();
    [
        "run",
        "-w",
        workers,
        "--ready-after",
        "0.2",
        "--events",
        log,
        "--",
        "sleep",
        "100",
    ]
}

/// The events say a shutdown for the terminal's hangup, and no reload.
fn assert_stopped_by_the_hangup(evs: &[serde_json::Value]) {
    assert_eq!(count(evs, "reload_start"), 0, "{evs:#?}");
    let shutdown = evs.iter().find(|e| e["event"] == "shutdown").unwrap();
    let why = shutdown["why"].as_str().unwrap();
    assert!(why.contains("the terminal hung up"), "{evs:#?}");
}

/// Under `nohup` (SIGHUP ignored at start, output to a file) the primary outlives its terminal:
/// the hangup is one line and changes nothing, and a `kill -HUP` afterwards is still a reload,
/// stdin on /dev/null (nohup's) or left on the hung-up terminal.
#[test]
fn under_nohup_a_hangup_changes_nothing_and_kill_hup_still_reloads() {
    if !have("python3") {
        return;
    }
    for stdin_null in [true, false] {
        let dir = TempDir::new("hangup-nohup");
        let log = dir.path().join("events.jsonl");
        let out = dir.path().join("nohup.out");
        let args = sleepers("1", &log);
        let tty = common::Tty::Nohup(&out, stdin_null);
        let hung_up = common::hang_up_as(tty, "1 worker ready", &args, 3);
        let evs = events(&log);
        assert_eq!(hung_up.outcome, "still running", "{stdin_null} {evs:#?}");
        assert_eq!(count(&evs, "shutdown"), 0, "{stdin_null} {evs:#?}");
        assert_eq!(count(&evs, "reload_start"), 0, "{stdin_null} {evs:#?}");
        let output = std::fs::read_to_string(&out).unwrap();
        assert!(
            output.contains("SIGHUP was ignored at start (nohup): serving on"),
            "{output}"
        );
        rustix::process::kill_process(Pid::from_raw(hung_up.pid).unwrap(), Signal::HUP).unwrap();
        let evs = wait_events(&log, |e| count(e, "reload_done") == 1);
        assert_eq!(count(&evs, "shutdown"), 0, "{stdin_null} {evs:#?}");
    }
}

#[test]
fn a_sighup_during_a_reload_queues_one_more_reload() {
    let dir = TempDir::new("reload-again");
    // Ready after 0.3 s up (no READY=1): each reload takes that long per slot.
    let program = script(&dir, "worker.sh", "exec sleep 60");
    let log = dir.path().join("events.jsonl");
    let mut primary = spawn(
        Command::new(NODUS)
            .args(["run", "-w", "1", "--ready-after", "0.3", "--events"])
            .arg(&log)
            .arg("--")
            .arg(&program),
    );
    wait_events(&log, |e| count(e, "ready") == 1);
    primary.signal(Signal::HUP);
    wait_events(&log, |e| count(e, "reload_start") == 1);
    primary.signal(Signal::HUP);
    primary.signal(Signal::HUP); // folded into the one queued
    let evs = wait_events(&log, |e| count(e, "reload_done") == 2);
    let reloads: Vec<(String, u64)> = evs
        .iter()
        .filter(|e| e["event"].as_str().unwrap().starts_with("reload_"))
        .map(|e| {
            (
                e["event"].as_str().unwrap().to_owned(),
                e["generation"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        reloads,
        [
            ("reload_start".to_owned(), 1),
            ("reload_done".to_owned(), 1),
            ("reload_start".to_owned(), 2),
            ("reload_done".to_owned(), 2),
        ]
    );
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(count(&events(&log), "reload_start"), 2, "no third reload");
    assert_eq!(
        count(&events(&log), "fork"),
        3,
        "the first worker and one per reload"
    );

    primary.signal(Signal::TERM);
    assert_eq!(primary.wait_exit(Duration::from_secs(20)), Some(0));
}

#[test]
fn the_lines_of_a_queued_reload_follow_every_line_of_the_one_before() {
    let dir = TempDir::new("reload-order");
    // The first worker takes 3 s to exit after its SIGTERM, later ones 0.2 s: the old worker of
    // reload 1 outlives all of reload 2 unless reload 2 waits for it.
    let program = script(
        &dir,
        "worker.sh",
        &format!(
            "if mkdir {}/first 2>/dev/null; then delay=3; else delay=0.2; fi\n\
             trap 'sleep $delay; exit 0' TERM\n\
             while :; do sleep 1 & wait $!; done",
            dir.path().display()
        ),
    );
    let log = dir.path().join("events.jsonl");
    let mut primary = spawn(
        Command::new(NODUS)
            .args(["run", "-w", "1", "--ready-after", "0.5", "--events"])
            .arg(&log)
            .arg("--")
            .arg(&program)
            .env("RUST_LOG", "info"),
    );
    let evs = wait_events(&log, |e| count(e, "ready") == 1);
    let first = evs.iter().find(|e| e["event"] == "fork").unwrap()["pid"].clone();
    primary.signal(Signal::HUP);
    wait_events(&log, |e| count(e, "reload_start") == 1);
    primary.signal(Signal::HUP); // queued
    let evs = wait_events(&log, |e| {
        count(e, "reload_done") == 2 && count(e, "exit") == 2
    });
    // Reload 2 started once the first worker, reload 1's old one, had exited.
    let at = |what: &str, key: &str, value: &serde_json::Value| {
        evs.iter()
            .position(|e| e["event"] == what && e[key] == *value)
            .unwrap_or_else(|| panic!("no {what}: {evs:#?}"))
    };
    assert!(
        at("exit", "pid", &first) < at("reload_start", "generation", &2.into()),
        "{evs:#?}"
    );
    primary.signal(Signal::TERM);
    assert_exit(&mut primary, Duration::from_secs(20), 0);
    let lines: Vec<&String> = primary
        .output()
        .iter()
        .filter(|l| l.contains("nodus::cluster:"))
        .collect();
    let line = |what: &str| {
        lines
            .iter()
            .position(|l| l.contains(what))
            .unwrap_or_else(|| panic!("no {what:?}: {lines:#?}"))
    };
    let order = [
        "reloading: generation 1,",
        "reload to generation 1: worker 1 pid ",
        "reload done: generation 1 serving (in ",
        "reload to generation 1: the old workers have exited",
        "reloading: generation 2,",
        "reload to generation 2: worker 1 pid ",
        "reload done: generation 2 serving",
    ];
    let at: Vec<usize> = order.iter().map(|what| line(what)).collect();
    assert!(at.is_sorted(), "{order:#?} out of order: {lines:#?}");
    // Every line about reload 1 comes before reload 2's first.
    let last_of_1 = lines
        .iter()
        .rposition(|l| l.contains("generation 1"))
        .unwrap();
    assert!(last_of_1 < line("reloading: generation 2,"), "{lines:#?}");
    assert!(
        lines[line("SIGHUP during the reload to generation 1")]
            .ends_with("another reload follows once its old workers have exited"),
        "{lines:#?}"
    );
}

#[test]
fn the_default_budget_outlasts_every_worker_crashing_once() {
    // A database restart: each of 8 workers crashes once (a marker file per NODUS_WORKER_ID),
    // then stays up. 8 restarts are more than 5: a budget that does not grow with -w gives up.
    let dir = TempDir::new("crash-once");
    let log = dir.path().join("events.jsonl");
    let marker = dir.path().join("crashed-");
    let worker = format!(
        "m={}$NODUS_WORKER_ID; [ -e \"$m\" ] || {{ : > \"$m\"; exit 3; }}; exec sleep 60",
        marker.display()
    );
    let mut primary = spawn(
        run_sh(["-w", "8", "--events", log.to_str().unwrap()], &worker).env("RUST_LOG", "info"),
    );
    let evs = wait_events(&log, |e| count(e, "fork") == 16 || count(e, "give_up") > 0);
    assert_eq!(count(&evs, "give_up"), 0, "{evs:#?}");
    assert_eq!(count(&evs, "restart"), 8, "{evs:#?}");
    assert!(
        primary.exited_within(Duration::ZERO).is_none(),
        "the primary still runs"
    );
    let start = primary.wait_line("supervising 8 workers");
    assert!(
        start.contains("at most 16 restarts within 60s"),
        "the start line says the budget: {start}"
    );

    // The log's first line anchors t_ns (CLOCK_MONOTONIC) to the wall clock; no other has it.
    let now_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let anchor = evs[0]["unix_ns"]
        .as_u64()
        .expect("unix_ns on the first line");
    assert!(
        now_ns.abs_diff(anchor) < 120_000_000_000,
        "{anchor} vs {now_ns}"
    );
    assert!(
        evs[1..].iter().all(|e| e.get("unix_ns").is_none()),
        "{evs:#?}"
    );

    primary.signal(Signal::TERM);
    assert_exit(&mut primary, Duration::from_secs(20), 0);
}

#[test]
fn a_budget_below_the_worker_count_is_warned_of_at_the_start() {
    for (budget, warned) in [("3", true), ("4", false)] {
        let mut primary = spawn(
            run_sh(["-w", "4", "--max-restarts", budget], "exec sleep 60").env("RUST_LOG", "info"),
        );
        primary.wait_line("supervising 4 workers");
        primary.signal(Signal::TERM);
        assert_exit(&mut primary, Duration::from_secs(20), 0);
        let lines = primary.output();
        let warnings: Vec<_> = lines
            .iter()
            .filter(|l| l.contains("WARN") && l.contains("--max-restarts"))
            .collect();
        let expected = format!(
            "--max-restarts {budget} is below the worker count (4): one event that restarts every \
             worker once (a database restart, say) gives up (exit 75)"
        );
        if warned {
            assert_eq!(warnings.len(), 1, "{lines:#?}");
            assert!(warnings[0].contains(&expected), "{lines:#?}");
        } else {
            assert!(warnings.is_empty(), "{lines:#?}");
        }
    }
}

/// A worker ready only by time must be able to be ready within the ready timeout, or every
/// reload fails: `--ready-after` (1 s by default) at or past `--ready-timeout` is warned of at
/// the start, once; below it, nothing is said.
#[test]
fn a_ready_after_not_below_the_ready_timeout_is_warned_of_at_the_start() {
    for (flags, warned) in [
        (
            &["--ready-after", "1", "--ready-timeout", "0.5"][..],
            Some("1s"),
        ),
        (&["--ready-timeout", "1"], Some("1s")),
        (&["--ready-after", "0.2", "--ready-timeout", "1"], None),
        (&["--wait-ready", "--ready-timeout", "0.5"], None),
    ] {
        let mut args = vec!["-w", "1"];
        args.extend_from_slice(flags);
        let mut primary = spawn(run_sh(args, "exec sleep 60").env("RUST_LOG", "info"));
        primary.wait_line("supervising 1 worker");
        primary.signal(Signal::TERM);
        assert_exit(&mut primary, Duration::from_secs(20), 0);
        let lines = primary.output();
        let warnings: Vec<_> = lines
            .iter()
            .filter(|l| l.contains("WARN") && l.contains("--ready-after"))
            .collect();
        match warned {
            Some(after) => {
                assert_eq!(warnings.len(), 1, "{flags:?}: {lines:#?}");
                assert!(
                    warnings[0].contains(&format!("--ready-after {after} is not below")),
                    "{flags:?}: {lines:#?}"
                );
            }
            None => assert!(warnings.is_empty(), "{flags:?}: {lines:#?}"),
        }
    }
}

/// A crash loop's lines read in the order things happened, even when an exit line waits for the
/// worker's output to end (a child it put in a session of its own holds its stdout): each exit,
/// then the backoff it led to, then the replacement started after that backoff. The replacement
/// was started on time; only its line waited for the exit line before it.
#[test]
fn a_crash_loops_lines_say_each_exit_before_the_restart_it_led_to() {
    let mut primary = spawn(
        run_sh(
            [
                "-w",
                "1",
                "--max-restarts",
                "3",
                "--backoff",
                "0.05,2,1",
                "--min-uptime",
                "30",
            ],
            "setsid sleep 30 & sleep 0.2; exit 3",
        )
        .env("RUST_LOG", "info"),
    );
    assert_exit(&mut primary, Duration::from_secs(20), 75);
    let lines: Vec<&str> = primary
        .output()
        .iter()
        .filter(|l| !l.contains("giving up"))
        .filter_map(|l| {
            [" exited with code 3", " restarts in ", " restarted "]
                .into_iter()
                .find(|what| l.contains(what))
        })
        .collect();
    // Four exits, the second and third backed off, the fourth past the budget.
    assert_eq!(
        lines,
        [
            " exited with code 3",
            " restarted ",
            " exited with code 3",
            " restarts in ",
            " restarted ",
            " exited with code 3",
            " restarts in ",
            " restarted ",
            " exited with code 3",
        ],
        "{:#?}",
        primary.output()
    );
}

/// A SIGTERM that comes while the primary is still starting (here from its first worker, the
/// moment it runs) is a stop like any other: drain, exit 0. The primary catches it from before
/// its first worker's fork; before, it caught signals only once the start was done, and such a
/// SIGTERM killed it (the default action), its workers half started.
#[test]
fn a_sigterm_during_the_start_is_a_clean_stop() {
    for round in 0..5 {
        let mut primary = spawn(
            run_sh(
                ["-w", "4"],
                r#"[ "$NODUS_WORKER_ID" = 1 ] && kill -TERM $PPID; exec sleep 60"#,
            )
            .env("RUST_LOG", "info"),
        );
        let code = primary.wait_exit(Duration::from_secs(20));
        let lines = primary.output();
        assert_eq!(code, Some(0), "round {round}: {lines:#?}");
        assert!(
            lines
                .iter()
                .any(|l| l.contains("nodus::cluster: SIGTERM: ")),
            "round {round}: {lines:#?}"
        );
    }
}

/// A SIGHUP once a stop began (a `systemctl reload` racing a stop) starts no reload and is no
/// second signal: one line says so, and the stop ends as it would have.
#[test]
fn a_sighup_during_the_stop_is_said_and_starts_no_reload() {
    let mut primary = spawn(
        run_sh(
            ["-w", "1", "--ready-after", "0.1", "--kill-timeout", "20"],
            "trap 'echo got-term; sleep 1; exit 0' TERM; while :; do sleep 0.05; done",
        )
        .env("RUST_LOG", "info"),
    );
    primary.wait_line("1 worker ready");
    primary.signal(Signal::TERM);
    primary.wait_line("got-term");
    primary.signal(Signal::HUP);
    primary.wait_line("SIGHUP during the stop: no reload");
    assert_eq!(primary.wait_exit(Duration::from_secs(20)), Some(0));
    let lines = primary.output();
    assert!(!lines.iter().any(|l| l.contains("reloading")), "{lines:#?}");
}

/// A stop while every worker waits out a backoff (a crash loop) is still said, with the restart
/// it cancels, and is over at once.
#[test]
fn a_stop_during_a_backoff_wait_says_what_it_cancels() {
    let mut primary = spawn(
        run_sh(
            ["-w", "1", "--backoff", "5,2,10", "--min-uptime", "5"],
            "exit 3",
        )
        .env("RUST_LOG", "info"),
    );
    primary.wait_line("worker 1 restarts in 5000 ms");
    primary.signal(Signal::TERM);
    primary.wait_line("SIGTERM: no worker running; 1 restart waiting out a backoff not started");
    assert!(primary.wait_exit(Duration::from_secs(20)).is_some());
}

#[test]
fn a_zero_kill_timeout_is_refused() {
    let out = Command::new(NODUS)
        .args(["run", "--kill-timeout", "0", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("invalid value '0' for '--kill-timeout <SECS>'")
            && stderr.contains("above 0"),
        "{stderr}"
    );
}

#[test]
fn a_negative_number_is_an_invalid_value_not_a_hint_to_use_double_dash() {
    for (args, flag) in [
        (&["-w", "-1"][..], "--workers <WORKERS>"),
        (&["--workers", "-1"], "--workers <WORKERS>"),
        (&["--max-restarts", "-1"], "--max-restarts <R>"),
        (&["--restart-window", "-1"], "--restart-window <SECS>"),
        (&["--min-uptime", "-1"], "--min-uptime <SECS>"),
        (&["--kill-timeout", "-1"], "--kill-timeout <SECS>"),
        (&["--ready-timeout", "-1"], "--ready-timeout <SECS>"),
        (&["--ready-after", "-1"], "--ready-after <SECS>"),
        (&["--backoff", "-1,2,3"], "--backoff <I,F,C>"),
    ] {
        let out = Command::new(NODUS)
            .arg("run")
            .args(args)
            .args(["--", "true"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        let value = args[1];
        assert!(
            stderr.contains(&format!("invalid value '{value}' for '{flag}'")),
            "{args:?}: {stderr}"
        );
        // clap's tip for a value that looks like a flag: `--` would start nodus run's PROGRAM.
        assert!(
            !stderr.contains("as a value, use '--"),
            "{args:?}: {stderr}"
        );
    }
    // The message of a count.
    let out = Command::new(NODUS)
        .args(["run", "-w", "-1", "--", "true"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("must be a whole number from 1 to 1024"),
        "{stderr}"
    );
}

#[test]
fn a_zero_restart_window_or_ready_timeout_is_refused() {
    for flag in ["--restart-window", "--ready-timeout"] {
        let out = Command::new(NODUS)
            .args(["run", flag, "0", "--", "true"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{flag} 0");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("above 0"), "{flag} 0: {stderr}");
    }
}

#[test]
fn a_program_that_cannot_be_run_is_one_line_and_exit_code_1_before_any_worker() {
    let dir = TempDir::new("unrunnable");
    let not_executable = dir.path().join("data.txt");
    std::fs::write(&not_executable, "not a program").unwrap();
    let missing = dir.path().join("missing");
    let no_interpreter = script_with(&dir, "bad.sh", "#!/nonexistent/interp\necho hi\n");
    let no_env_command = script_with(
        &dir,
        "env.sh",
        "#!/usr/bin/env nodus-test-no-such-interp\necho hi\n",
    );
    let crlf = script_with(&dir, "crlf.sh", "#!/bin/sh\r\necho hi\r\n");
    // ELF files the kernel refuses (ENOEXEC), which execvp would run with /bin/sh: a program
    // for another machine (/bin/true, its e_machine made ARM's), an object file (its e_type made
    // ET_REL's) and a corrupt one.
    let true_with = |name: &str, at: usize, value: u16| {
        let mut elf = std::fs::read("/bin/true").unwrap();
        elf[at..at + 2].copy_from_slice(&value.to_le_bytes());
        let path = script_with(&dir, name, "");
        std::fs::write(&path, elf).unwrap();
        path
    };
    let other_machine = true_with("arm-true", 18, 40);
    let object = true_with("true.o", 16, 1);
    let corrupt = script_with(&dir, "corrupt", "\x7fELFgarbage");
    // Another machine's program is refused only when binfmt_misc is mounted (no entry takes a
    // 64-bit ARM one): unmounted, as in most containers, the host's entries may run it.
    let binfmt_misc = std::fs::read_to_string("/proc/sys/fs/binfmt_misc/status")
        .is_ok_and(|s| matches!(s.trim(), "enabled" | "disabled"));
    let mut cases = vec![
        (
            no_interpreter.to_str().unwrap(),
            "its interpreter '/nonexistent/interp' (#! line) does not exist",
        ),
        (
            no_env_command.to_str().unwrap(),
            "its interpreter 'nodus-test-no-such-interp' (#!/usr/bin/env line) is not found in PATH",
        ),
        (
            crlf.to_str().unwrap(),
            "its interpreter '/bin/sh\\r' (#! line) does not exist",
        ),
        (missing.to_str().unwrap(), "No such file"),
        ("nodus-test-no-such-program", "not found in PATH"),
        (not_executable.to_str().unwrap(), "Permission denied"),
        (dir.path().to_str().unwrap(), "not a file"),
        (
            object.to_str().unwrap(),
            "Exec format error: an ELF relocatable object",
        ),
        (
            corrupt.to_str().unwrap(),
            "Exec format error: an ELF file of no valid class",
        ),
    ];
    if binfmt_misc {
        cases.push((
            other_machine.to_str().unwrap(),
            "Exec format error: an ELF program for ARM (64-bit, little-endian), which this \
             machine's kernel",
        ));
    }
    for (program, why) in cases {
        // Bounded without a timeout of its own: a regression gives up on the restart budget.
        let out = Command::new(NODUS)
            .args(["run", "-w", "2", "--", program])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{program}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{program}: {stderr}");
        assert!(
            stderr.starts_with(&format!("nodus run: cannot run '{program}': "))
                && stderr.contains(why),
            "{program}: {stderr}"
        );
    }
    // `node` with a script that is no file (nor with an extension Node tries): one line, before
    // any worker, where every worker would exit at once with MODULE_NOT_FOUND until the budget
    // gave up. Plain and `--node` alike; and a busy `--admin` address is named as the admin's.
    let script = dir.path().join("no-such-app.js");
    for node in [false, true] {
        let out = Command::new(NODUS)
            .args(["run", "-w", "2"])
            .args(node.then_some("--node"))
            .args(["--", "node"])
            .arg(&script)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "--node {node}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "--node {node}: {stderr}");
        assert!(
            stderr.trim_end()
                == format!(
                    "nodus run: cannot run node's script '{}': no such file, nor with .js, .mjs, \
                     .cjs, .json or .node (Node would exit at once with MODULE_NOT_FOUND in \
                     every worker)",
                    script.display()
                ),
            "--node {node}: {stderr}"
        );
    }
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy = busy.local_addr().unwrap().to_string();
    let out = Command::new(NODUS)
        .args(["run", "-w", "1", "--admin", &busy, "--", "sleep", "30"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "cannot listen on {busy} (--admin): the address is already in use"
        )),
        "{stderr}"
    );
    // Another machine's program, binfmt_misc mounted or not (unmounted, it is left to the
    // workers' exec, which an emulator the host registered could take; none takes a 64-bit ARM
    // one, and the kernel refuses it): one line naming it and what it is, exit code 1, no
    // worker line (`/bin/sh` reading it would have written some, crash after crash), no give-up.
    // Plain (the launcher's exec) and `--node` (the worker's spawn) alike.
    for node in [false, true] {
        let out = Command::new(NODUS)
            .args(["run", "-w", "2"])
            .args(node.then_some("--node"))
            .arg("--")
            .arg(&other_machine)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "--node {node}: {stderr}");
        let said: Vec<&str> = stderr
            .lines()
            .filter(|l| l.contains("Exec format error"))
            .collect();
        assert_eq!(said.len(), 1, "--node {node}: {stderr}");
        assert!(
            said[0].contains(&format!("'{}'", other_machine.display()))
                && said[0].contains("an ELF program for ARM (64-bit, little-endian)"),
            "--node {node}: {stderr}"
        );
        assert!(
            !format!("{stdout}{stderr}").contains("[worker ") && !stderr.contains("giving up"),
            "--node {node}: {stdout}{stderr}"
        );
    }
    // An empty name is a usage error (exit code 2), not a program looked for in PATH.
    let out = Command::new(NODUS)
        .args(["run", "--", ""])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.starts_with("nodus run: the program's name is empty"),
        "{stderr}"
    );
    // A shell script with no #! line still runs (execvp gives it to /bin/sh, as Node does).
    let no_shebang = script_with(&dir, "plain.sh", "echo ran by sh; exit 0\n");
    let out = Command::new(NODUS)
        .args(["run", "-w", "1", "--restart", "temporary", "--"])
        .arg(&no_shebang)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("] ran by sh"), "{stdout}");
    // A control character in the name is escaped, as Node quotes a path: the message stays one line.
    let out = Command::new(NODUS)
        .args(["run", "--", "nodus-no\nsuch"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.starts_with("nodus run: cannot run 'nodus-no\\nsuch': "),
        "{stderr}"
    );
}

/// A copy of a dynamically linked program (`/bin/true`) whose ELF interpreter (the dynamic
/// loader) does not exist: there as a file, executable, without a `#!` line, yet its `exec`
/// fails (`ENOENT`), which only the exec itself finds. `None` for a static `/bin/true`.
fn without_its_loader(dir: &TempDir) -> Option<std::path::PathBuf> {
    let mut elf = std::fs::read("/bin/true").unwrap();
    let u16_at = |b: &[u8], at: usize| u16::from_le_bytes(b[at..at + 2].try_into().unwrap());
    let u64_at =
        |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap()) as usize;
    // ELF64, little-endian: the program headers, and the one of type PT_INTERP (3).
    assert!(elf.starts_with(b"\x7fELF\x02\x01"), "an ELF64 LE /bin/true");
    let (offset, size, count) = (u64_at(&elf, 0x20), u16_at(&elf, 0x36), u16_at(&elf, 0x38));
    let interp = (0..count as usize)
        .map(|i| offset + i * size as usize)
        .find(|&h| u32::from_le_bytes(elf[h..h + 4].try_into().unwrap()) == 3)?;
    let (at, len) = (u64_at(&elf, interp + 8), u64_at(&elf, interp + 32));
    let missing = b"/nodus-test-no-such-loader/ld.so";
    assert!(len > 2, "a loader path");
    for (i, byte) in elf[at..at + len - 1].iter_mut().enumerate() {
        *byte = *missing.get(i).unwrap_or(&b'z');
    }
    let path = dir.path().join("no-loader");
    std::fs::write(&path, elf).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    Some(path)
}

#[test]
fn an_exec_that_fails_before_any_worker_ran_the_program_is_exit_code_1_and_one_line() {
    let dir = TempDir::new("exec-fails");
    let Some(program) = without_its_loader(&dir) else {
        println!("skipped: /bin/true is statically linked");
        return;
    };
    let mut primary = spawn(
        Command::new(NODUS)
            .args(["run", "-w", "2", "--"])
            .arg(&program)
            .env("RUST_LOG", "info"),
    );
    // Bounded: a regression spends the restart budget (exit code 75).
    assert_exit(&mut primary, Duration::from_secs(20), 1);
    let lines = primary.output();
    let said: Vec<&String> = lines.iter().filter(|l| l.contains("cannot run")).collect();
    assert_eq!(said.len(), 1, "{lines:#?}");
    assert!(
        said[0].contains("ERROR")
            && said[0].contains(&format!("cannot run '{}'", program.display()))
            && said[0].contains("the file exists")
            && said[0].ends_with("no worker could run it; exiting with code 1"),
        "{lines:#?}"
    );
    assert!(
        !lines
            .iter()
            .any(|l| l.starts_with("[worker ") || l.contains("giving up")),
        "{lines:#?}"
    );
}

#[test]
fn an_exec_that_fails_after_the_program_ran_is_a_crash_that_says_why() {
    let dir = TempDir::new("exec-fails-later");
    let Some(broken) = without_its_loader(&dir) else {
        println!("skipped: /bin/true is statically linked");
        return;
    };
    // The program runs (its worker is ready), then a deploy replaces it with one that cannot.
    let program = script(&dir, "app", "echo up; exec sleep 60");
    let log = dir.path().join("events.jsonl");
    let mut primary = spawn(
        Command::new(NODUS)
            .args([
                "run",
                "-w",
                "1",
                "--ready-after",
                "0.1",
                "--backoff",
                "0.1,1,0.1",
            ])
            .args(["--max-restarts", "50", "--events"])
            .arg(&log)
            .arg("--")
            .arg(&program)
            .env("RUST_LOG", "info"),
    );
    let evs = wait_events(&log, |e| count(e, "ready") == 1);
    let pid = evs.iter().find(|e| e["event"] == "fork").unwrap()["pid"]
        .as_i64()
        .unwrap() as i32;
    std::fs::rename(&broken, &program).unwrap();
    rustix::process::kill_process(Pid::from_raw(pid).unwrap(), Signal::KILL).unwrap();
    wait_events(&log, |e| count(e, "fork") >= 3);
    let line = primary.wait_line("could not run the program");
    assert!(
        line.contains(&format!("cannot run '{}'", program.display()))
            && line.ends_with("(exited with code 127)"),
        "{line}"
    );
    assert!(
        primary.exited_within(Duration::ZERO).is_none(),
        "the primary still runs"
    );
    primary.signal(Signal::TERM);
    assert_exit(&mut primary, Duration::from_secs(20), 0);
}

#[test]
fn a_reload_a_shutdown_cuts_short_is_abandoned_not_failed() {
    let dir = TempDir::new("reload-abandoned");
    let log = dir.path().join("events.jsonl");
    // A new worker is ready only after 60 s: the reload is still waiting when the stop comes.
    let mut primary = spawn(
        run_sh(
            [
                "-w",
                "1",
                "--ready-after",
                "60",
                "--events",
                log.to_str().unwrap(),
            ],
            "exec sleep 60",
        )
        .env("RUST_LOG", "info"),
    );
    wait_events(&log, |e| count(e, "fork") == 1);
    primary.signal(Signal::HUP);
    wait_events(&log, |e| count(e, "fork") == 2);
    primary.signal(Signal::TERM);
    assert_exit(&mut primary, Duration::from_secs(20), 0);
    let lines = primary.output();
    assert!(
        lines.iter().any(|l| l.contains(" INFO ")
            && l.ends_with("reload to generation 1 abandoned: a shutdown began")),
        "{lines:#?}"
    );
    assert!(!lines.iter().any(|l| l.contains("failed")), "{lines:#?}");
}

/// A plain program that sends `READY=1` to its `NOTIFY_SOCKET` `READY_DELAY` seconds after its
/// start, then sleeps; SIGTERM ends it `STOP_DELAY` seconds later.
const PYTHON_READY_LATE: &str = r#"
import os, signal, socket, time
def stop(*_):
    time.sleep(float(os.environ['STOP_DELAY']))
    os._exit(0)
signal.signal(signal.SIGTERM, stop)
time.sleep(float(os.environ['READY_DELAY']))
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.sendto(b'READY=1', '\0' + os.environ['NOTIFY_SOCKET'][1:])
time.sleep(60)
"#;

/// A log line's time of day in seconds (`2026-01-02T03:04:05.678901Z  INFO ...`).
fn log_time(line: &str) -> f64 {
    let time = line
        .split(['T', 'Z'])
        .nth(1)
        .unwrap_or_else(|| panic!("{line}"));
    time.split(':')
        .map(|part| part.parse::<f64>().unwrap_or_else(|_| panic!("{line}")))
        .fold(0.0, |sum, part| sum * 60.0 + part)
}

/// The `t_ns` of the first event `event` of `pid` in `evs`, and its index.
fn event_of(evs: &[serde_json::Value], event: &str, pid: u64) -> (usize, u64) {
    evs.iter()
        .enumerate()
        .find(|(_, e)| e["event"] == event && e["pid"] == pid)
        .map(|(i, e)| (i, e["t_ns"].as_u64().unwrap()))
        .unwrap_or_else(|| panic!("no {event} of pid {pid}: {evs:#?}"))
}

#[test]
fn with_wait_ready_a_reload_drains_the_old_worker_only_after_the_new_one_sent_ready() {
    if !have("python3") {
        return;
    }
    let dir = TempDir::new("wait-ready");
    let app = dir.path().join("app.py");
    std::fs::write(&app, PYTHON_READY_LATE).unwrap();
    let log = dir.path().join("events.jsonl");
    // READY=1 2 s after the start: past the 1 s `--ready-after` would count it ready at.
    let mut primary = spawn(
        Command::new(NODUS)
            .args(["run", "-w", "1", "--wait-ready", "--ready-timeout", "20"])
            .arg("--events")
            .arg(&log)
            .args(["--", "python3"])
            .arg(&app)
            .env("READY_DELAY", "2")
            .env("STOP_DELAY", "1")
            .env("RUST_LOG", "info"),
    );
    let evs = wait_events(&log, |e| count(e, "ready") == 1);
    let old = evs.iter().find(|e| e["event"] == "fork").unwrap()["pid"]
        .as_u64()
        .unwrap();
    primary.signal(Signal::HUP);
    let evs = wait_events(&log, |e| {
        count(e, "exit") == 1 && count(e, "reload_done") == 1
    });
    let new = evs.iter().filter(|e| e["event"] == "fork").nth(1).unwrap()["pid"]
        .as_u64()
        .unwrap();
    let (_, forked) = event_of(&evs, "fork", new);
    let (ready_at, ready) = event_of(&evs, "ready", new);
    let (drain_at, _) = event_of(&evs, "drain", old);
    // The old worker is asked to drain only after the new one's READY=1, 2 s after its start.
    assert!(ready_at < drain_at, "{evs:#?}");
    assert!(
        ready - forked >= 1_900_000_000,
        "ready {} ms after the fork: {evs:#?}",
        (ready - forked) / 1_000_000
    );
    // One line for the switch, "reload done" then, and one more once the old worker has exited.
    let exited = primary.wait_line("reload to generation 1: the old workers have exited");
    let lines = primary.output().to_vec();
    let at = |what: &str| {
        lines
            .iter()
            .position(|l| l.contains(what))
            .unwrap_or_else(|| panic!("no {what:?}: {lines:#?}"))
    };
    let switch = format!("reload to generation 1: worker 1 pid {old} → pid {new} (ready ");
    // Whole milliseconds, as every duration the primary measured.
    assert!(
        lines[at(&switch)].ends_with(&format!(" ms after its start); pid {old} asked to stop")),
        "{lines:#?}"
    );
    let done = at("reload done: generation 1 serving (in ");
    assert!(
        lines[done].ends_with(&format!("waiting for 1 old worker to exit (pid {old})"))
            && at(&switch) < done
            && done < at(&exited),
        "{lines:#?}"
    );
    // The last line waited for the old worker's exit, 1 s after its SIGTERM.
    let waited = (log_time(&exited) - log_time(&lines[at(&switch)])).rem_euclid(86_400.0);
    assert!(waited >= 0.9, "{waited} s: {lines:#?}");
    primary.signal(Signal::TERM);
    assert_exit(&mut primary, Duration::from_secs(20), 0);
}

/// A Node worker that never listens and says it is ready (PM2's `process.send('ready')`).
const NODE_APP_THAT_SENDS_READY: &str = r#"
const timer = setInterval(() => {}, 1000);
process.on('disconnect', () => clearInterval(timer));
setTimeout(() => process.send('ready'), 200);
"#;

/// A Node worker that listens and never says it is ready.
const NODE_APP_THAT_ONLY_LISTENS: &str = r#"
require('http').createServer((q, r) => r.end('hello\n')).listen(+process.env.PORT, '127.0.0.1');
"#;

#[test]
fn with_node_and_wait_ready_a_worker_is_ready_when_it_sends_ready_not_when_it_listens() {
    if !have("node") {
        return;
    }
    // `process.send('ready')`: ready (no `listening` ever), and a reload completes.
    let (_dir, _addr, mut primary) = common::cluster::run_node_app(
        "wait-ready-node",
        NODE_APP_THAT_SENDS_READY,
        1,
        &["--wait-ready", "--ready-timeout", "20"],
    );
    primary.signal(Signal::HUP);
    primary.wait_line("reload done: generation 1 serving");
    primary.signal(Signal::TERM);
    assert_exit(&mut primary, Duration::from_secs(20), 0);

    // Listening, but never saying it is ready: not ready, and a reload fails at the ready
    // timeout while the old worker keeps serving.
    let dir = TempDir::new("wait-ready-node-never");
    std::fs::write(dir.path().join("app.js"), NODE_APP_THAT_ONLY_LISTENS).unwrap();
    let log = dir.path().join("events.jsonl");
    let addr = nodus_testkit::net::free_addr();
    let mut primary = spawn(
        Command::new(NODUS)
            .args(["run", "--node", "-w", "1", "--wait-ready"])
            .args(["--ready-timeout", "1", "--max-restarts", "0", "--events"])
            .arg(&log)
            .args(["--", "node"])
            .arg(dir.path().join("app.js"))
            .env("PORT", addr.port().to_string())
            .env("RUST_LOG", "info"),
    );
    wait_events(&log, |e| count(e, "listening") == 1);
    assert_eq!(common::http::get(addr, "/").body, b"hello\n");
    // Said once the ready timeout is up, with what it waits for.
    let warning = primary.wait_line("has not said it is ready in 1s");
    assert!(
        warning.contains("(READY=1 to its NOTIFY_SOCKET, or process.send('ready'))"),
        "{warning}"
    );
    primary.signal(Signal::HUP);
    let failed = primary.wait_line("reload to generation 1 failed");
    assert!(
        failed.contains("was not ready within 1s (it never said it was ready"),
        "{failed}"
    );
    assert_eq!(common::http::get(addr, "/").body, b"hello\n");
    primary.signal(Signal::TERM);
    assert_exit(&mut primary, Duration::from_secs(20), 0);
    let evs = events(&log);
    assert_eq!(count(&evs, "ready"), 0, "{evs:#?}");
    let lines = primary.output();
    assert!(
        !lines.iter().any(|l| l.contains("worker ready")),
        "{lines:#?}"
    );
    // The reload's new worker is the reload's to report: its failure line, not also the
    // warning the first worker got.
    let warned = lines.iter().filter(|l| l.contains("has not said")).count();
    assert_eq!(warned, 1, "the first worker only: {lines:#?}");
}

/// A Node worker that tells its `NOTIFY_SOCKET` it is ready (as the npm `sd-notify` package
/// does; Node has no Unix datagrams, so through a `python3` child, in the worker's process
/// group, which stays 1 s after its send: the primary heeds a sender it finds in the worker's
/// group), after writing that socket's name to `$SOCK_FILE<worker id>`; the one that removes
/// `$GO` says `STOPPING=1` and exits. Every message it sends says `STATUS=from-worker`.
const NODE_APP_THAT_NOTIFIES: &str = r#"
const { execFileSync } = require('child_process');
const fs = require('fs');
const target = process.env.NOTIFY_SOCKET || '';
const send = (text) => execFileSync('python3', ['-c', `
import socket, sys, time
target = sys.argv[1]
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.sendto(sys.argv[2].encode(), '\\0' + target[1:] if target.startswith('@') else target)
time.sleep(1)
`, target, text]);
fs.writeFileSync(process.env.SOCK_FILE + process.env.NODUS_WORKER_ID, target);
send('READY=1\nSTATUS=from-worker');
const timer = setInterval(() => {
  try { fs.unlinkSync(process.env.GO); } catch (e) { return; }
  send('STOPPING=1\nSTATUS=from-worker');
  setTimeout(() => process.exit(0), 100);
}, 20);
process.on('disconnect', () => clearInterval(timer));
"#;

/// Every datagram waiting on `socket`, as text.
fn drain_datagrams(socket: &std::os::unix::net::UnixDatagram) -> Vec<String> {
    socket.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 4096];
    let mut heard = Vec::new();
    while let Ok(n) = socket.recv(&mut buf) {
        heard.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    heard
}

/// Under systemd (`Type=notify`, `NOTIFY_SOCKET` in nodus's environment), a `--node` worker's
/// `sd_notify` reaches nodus, not systemd: each worker gets a `NOTIFY_SOCKET` of its own, where
/// `READY=1` makes it ready under `--wait-ready` and `STOPPING=1` is its "going down" notice;
/// the service's socket hears only the primary.
#[test]
fn with_node_a_worker_gets_a_notify_socket_of_its_own_not_the_primarys() {
    if !have("node") || !have("python3") {
        return;
    }
    let dir = TempDir::new("node-notify");
    let manager_path = dir.path().join("systemd.sock");
    let manager = std::os::unix::net::UnixDatagram::bind(&manager_path).unwrap();
    manager
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let app = dir.path().join("app.js");
    std::fs::write(&app, NODE_APP_THAT_NOTIFIES).unwrap();
    let log = dir.path().join("events.jsonl");
    let sock_file = dir.path().join("sock-");
    let go = dir.path().join("go");
    let mut primary = spawn(
        Command::new(NODUS)
            .args(["run", "--node", "-w", "2", "--wait-ready"])
            .args(["--ready-timeout", "20", "--events"])
            .arg(&log)
            .args(["--", "node"])
            .arg(&app)
            .env("NOTIFY_SOCKET", &manager_path)
            .env("SOCK_FILE", &sock_file)
            .env("GO", &go)
            .env("RUST_LOG", "info"),
    );
    let mut seen = Vec::new();
    for id in 1..=2 {
        let file = dir.path().join(format!("sock-{id}"));
        let deadline = Instant::now() + Duration::from_secs(20);
        let name = loop {
            match std::fs::read_to_string(&file) {
                Ok(name) if !name.is_empty() => break name,
                _ => assert!(Instant::now() < deadline, "worker {id} wrote no {file:?}"),
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_ne!(
            name,
            manager_path.to_str().unwrap(),
            "worker {id} got the primary's NOTIFY_SOCKET"
        );
        assert!(name.starts_with("@nodus/"), "worker {id}: {name}");
        seen.push(name);
    }
    assert_ne!(seen[0], seen[1], "one socket per worker");
    // Ready at their READY=1 (they never listen nor send 'ready'): the primary then tells the
    // service manager.
    primary.wait_line("2 workers ready");
    let mut buf = [0u8; 512];
    let n = common::recv_datagram(&manager, &mut buf).expect("a notification within 20 s");
    assert_eq!(
        String::from_utf8_lossy(&buf[..n]),
        "READY=1\nSTATUS=serving",
        "the primary's own READY=1, first"
    );
    // The events file is written by its own thread: the second `ready` may land just after the
    // line.
    let evs = wait_events(&log, |e| count(e, "ready") == 2);
    assert_eq!(count(&evs, "ready"), 2, "{evs:#?}");

    // STOPPING=1 from a worker: its replacement starts at once.
    std::fs::write(&go, "").unwrap();
    let evs = wait_events(&log, |e| {
        count(e, "going_down") == 1 && count(e, "fork") == 3 && count(e, "ready") == 3
    });
    assert_eq!(count(&evs, "give_up"), 0, "{evs:#?}");
    primary.signal(Signal::TERM);
    assert_exit(&mut primary, Duration::from_secs(20), 0);
    let heard = drain_datagrams(&manager);
    assert!(
        heard.iter().any(|m| m.starts_with("STOPPING=1")),
        "the primary's own STOPPING=1: {heard:?}"
    );
    assert!(
        !heard.iter().any(|m| m.contains("from-worker")),
        "a worker's message reached the service manager: {heard:?}"
    );
}

#[test]
fn with_wait_ready_a_worker_that_never_says_it_is_ready_is_warned_about_once() {
    let mut primary = spawn(
        run_sh(
            ["-w", "2", "--wait-ready", "--ready-timeout", "1"],
            "echo \"up $$\"; exec sleep 60",
        )
        .env("RUST_LOG", "info"),
    );
    for slot in 1..=2 {
        let up = primary.wait_line(&format!("[worker {slot} "));
        let pid = up.rsplit(' ').next().unwrap().to_owned();
        let warning = primary.wait_line(&format!("worker {slot} (pid {pid}) has not said"));
        assert!(
            warning.contains(" WARN ")
                && warning.ends_with(
                    "has not said it is ready in 1s: with --wait-ready a worker is ready only \
                     when it says so (READY=1 to its NOTIFY_SOCKET), so it is not ready yet"
                ),
            "{warning}"
        );
    }
    // Once per worker: nothing more after another ready timeout.
    std::thread::sleep(Duration::from_millis(1500));
    primary.signal(Signal::TERM);
    assert_exit(&mut primary, Duration::from_secs(20), 0);
    let lines = primary.output();
    let warned = lines.iter().filter(|l| l.contains("has not said")).count();
    assert_eq!(warned, 2, "once per worker: {lines:#?}");
    assert!(
        !lines.iter().any(|l| l.contains("workers ready")),
        "{lines:#?}"
    );
}

#[test]
fn wait_ready_and_ready_after_together_are_refused() {
    let out = Command::new(NODUS)
        .args(["run", "--wait-ready", "--ready-after", "1", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--ready-after"), "{stderr}");
}

#[test]
fn each_backoff_wait_is_one_line_after_the_exit_that_led_to_it() {
    // Crashes 2 and 3 wait 100 ms and 200 ms; the 4th restart is past the budget.
    let mut primary = spawn(
        run_sh(
            ["-w", "1", "--backoff", "0.1,2,1", "--max-restarts", "3"],
            "exit 3",
        )
        .env("RUST_LOG", "info"),
    );
    assert_exit(&mut primary, Duration::from_secs(20), 75);
    let lines = primary.output();
    let waits: Vec<usize> = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| l.contains(" restarts in "))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(waits.len(), 2, "{lines:#?}");
    for (i, (ms, crash)) in waits.iter().zip([(100, 2), (200, 3)]) {
        assert!(
            lines[*i].contains(" INFO ")
                && lines[*i].ends_with(&format!(
                    "worker 1 restarts in {ms} ms (exit {crash} in a row that crashed or came \
                     less than 1s after its start)"
                ))
                && lines[i - 1].ends_with("exited with code 3"),
            "{lines:#?}"
        );
    }
}

/// The delays of the `restart` events in the log at `path`, in milliseconds, in order.
fn restart_delays(path: &std::path::Path) -> Vec<u64> {
    events(path)
        .iter()
        .filter(|e| e["event"] == "restart")
        .map(|e| e["delay_ms"].as_u64().unwrap())
        .collect()
}

/// A worker that exits before `--min-uptime`, with exit code 0 too (`/bin/true`, a program that
/// daemonizes by mistake), is paced by the backoff as a crash is, and its wait's line says why;
/// one that stayed up `--min-uptime` before its clean exit is restarted at once.
#[test]
fn clean_exits_before_min_uptime_back_off_as_crashes_do() {
    let dir = TempDir::new("clean-backoff");
    // (worker, --min-uptime, its restarts' delays)
    for (worker, min_uptime, delays) in [
        ("exit 0", "5", [0, 100, 200]),
        ("sleep 0.3; exit 0", "0.1", [0, 0, 0]),
    ] {
        let log = dir.path().join(format!("{}.jsonl", delays[1]));
        let mut primary = spawn(
            run_sh(
                ["-w", "1", "--backoff", "0.1,2,1", "--max-restarts", "3"]
                    .into_iter()
                    .chain([
                        "--min-uptime",
                        min_uptime,
                        "--events",
                        log.to_str().unwrap(),
                    ]),
                worker,
            )
            .env("RUST_LOG", "info"),
        );
        assert_exit(&mut primary, Duration::from_secs(20), 75);
        assert_eq!(
            restart_delays(&log),
            delays,
            "{worker}: {:#?}",
            events(&log)
        );
        let lines = primary.output();
        let waits: Vec<&String> = lines
            .iter()
            .filter(|l| l.contains(" restarts in "))
            .collect();
        if delays[1] == 0 {
            assert!(waits.is_empty(), "{worker}: {lines:#?}");
            continue;
        }
        assert_eq!(waits.len(), 2, "{lines:#?}");
        assert!(
            waits[0].contains(
                "worker 1 restarts in 100 ms (exit 2 in a row that crashed or came less than 5s \
                 after its start; it exited with code 0 that soon"
            ),
            "{lines:#?}"
        );
        let give_up = lines.iter().find(|l| l.contains("giving up")).unwrap();
        assert!(
            give_up.contains("more than 3 restarts within 60s (last: worker 1 (pid ")
                && give_up.contains(") exited with code 0)"),
            "{give_up}"
        );
    }
}

/// Under `transient`, a worker that says it is going down and then stays is out of routing:
/// its stay is bounded as a stop's is, by the kill signal (SIGTERM) past its drain deadline,
/// then SIGKILL at the kill timeout (for one that ignores SIGTERM), and either is an exit that
/// restarts the slot.
#[test]
fn a_going_down_worker_that_stays_gets_the_kill_signal_then_sigkill() {
    if !have("python3") {
        return;
    }
    for (ignore_term, signal) in [("", 15), ("1", 9)] {
        let dir = TempDir::new("stopping-stays");
        let log = dir.path().join("events.jsonl");
        let once = dir.path().join("once");
        let mut primary = run_going_down(
            &dir,
            &log,
            &["--restart", "transient", "--kill-timeout", "1"],
            &[
                ("HOLD", "1"),
                ("ONCE", once.to_str().unwrap()),
                ("IGNORE_TERM", ignore_term),
            ],
        );
        let evs = wait_events(&log, |e| count(e, "exit") == 1 && count(e, "fork") == 2);
        let exit = evs.iter().find(|e| e["event"] == "exit").unwrap();
        assert_eq!(exit["signal"].as_i64(), Some(signal), "{evs:#?}");
        let line = primary.wait_line("(past its deadline): SIGTERM");
        assert!(line.contains("after saying it was going down"), "{line}");
        primary.signal(Signal::TERM);
        assert_exit(&mut primary, Duration::from_secs(20), 0);
    }
}

/// A plain program that says `READY=1`, then `STOPPING=1` 0.5 s later, then after 0.3 s more
/// exits with `$CODE` (or, with `$HOLD` set, runs on). With `$ONCE` (a file) set, only the
/// first worker does so: the others just run. With `$IGNORE_TERM` set, it (the first worker
/// alone, with `$ONCE`) ignores SIGTERM.
const GOES_DOWN: &str = r#"
import os, signal, socket, sys, time
once = os.environ.get('ONCE')
if once and os.path.exists(once):
    time.sleep(60)
    sys.exit(0)
if once:
    open(once, 'w').close()
if os.environ.get('IGNORE_TERM'):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
to = '\0' + os.environ['NOTIFY_SOCKET'][1:]
s.sendto(b'READY=1', to)
time.sleep(0.5)
s.sendto(b'STOPPING=1', to)
time.sleep(60 if os.environ.get('HOLD') else 0.3)
print('exiting', flush=True)
sys.exit(int(os.environ.get('CODE', '0')))
"#;

/// `nodus run -w 1 --min-uptime 0.2 --events LOG OPTIONS -- python3 GOES_DOWN`, with `env`.
fn run_going_down(
    dir: &TempDir,
    log: &std::path::Path,
    options: &[&str],
    env: &[(&str, &str)],
) -> Proc {
    let program = dir.path().join("goes_down.py");
    std::fs::write(&program, GOES_DOWN).unwrap();
    let mut cmd = Command::new(NODUS);
    cmd.args(["run", "-w", "1", "--min-uptime", "0.2", "--events"])
        .arg(log)
        .args(options)
        .arg("--")
        .arg("python3")
        .arg(&program)
        .env("RUST_LOG", "info")
        .envs(env.iter().copied());
    spawn(&mut cmd)
}

/// The pids of the `fork` events in `evs`, in order.
fn forked(evs: &[serde_json::Value]) -> Vec<i64> {
    evs.iter()
        .filter(|e| e["event"] == "fork")
        .map(|e| e["pid"].as_i64().unwrap())
        .collect()
}

/// `STOPPING=1` and then exit code 0 is no crash, whatever the restart type (systemd takes
/// `STOPPING=1` as a status; the exit decides): under `transient` and `temporary` the notice
/// restarts and stops nothing, and the clean exit leaves the slot empty (exit code 0); under
/// `permanent` the worker that serves is replaced at once, and its exit, one line with its
/// status, restarts nothing more. The notice is one line naming the worker and its pid (and the
/// replacement's).
#[test]
fn stopping_then_exit_0_is_no_crash_under_any_restart_type() {
    if !have("python3") {
        return;
    }
    let dir = TempDir::new("stopping-clean");
    for restart in ["temporary", "transient", "permanent"] {
        let log = dir.path().join(format!("{restart}.jsonl"));
        let once = dir.path().join(format!("{restart}.once"));
        let mut primary = run_going_down(
            &dir,
            &log,
            &["--restart", restart],
            &[("ONCE", once.to_str().unwrap())],
        );
        let evs = if restart == "permanent" {
            wait_events(&log, |e| {
                count(e, "going_down") == 1 && count(e, "exit") == 1 && count(e, "ready") == 2
            })
        } else {
            assert_exit(&mut primary, Duration::from_secs(20), 0);
            events(&log)
        };
        let pids = forked(&evs);
        let old = pids[0];
        let exit = evs.iter().find(|e| e["event"] == "exit").unwrap();
        assert_eq!(
            (exit["pid"].as_i64(), exit["code"].as_i64()),
            (Some(old), Some(0)),
            "{restart}: {evs:#?}"
        );
        let notice = primary.wait_line(&format!("worker 1 (pid {old}) said it is going down"));
        let exit_line = primary.wait_line(&format!("worker 1 (pid {old}) exited with code 0"));
        let lines = primary.output().to_vec();
        let at = |l: &String| lines.iter().position(|x| x == l);
        assert!(at(&notice) < at(&exit_line), "{restart}: {lines:#?}");
        assert!(notice.contains(" INFO "), "{notice}");
        if restart == "permanent" {
            assert_eq!(pids.len(), 2, "{evs:#?}");
            assert!(
                notice.ends_with(&format!(
                    "said it is going down: its replacement is pid {}; pid {old} has 10s to \
                     exit",
                    pids[1]
                )),
                "{notice}"
            );
            assert!(
                exit_line.ends_with("exited with code 0, after going down"),
                "{exit_line}"
            );
            assert_eq!(restart_delays(&log), [0], "{evs:#?}");
            // Its exit is no slot's: nothing more is restarted for it.
            std::thread::sleep(Duration::from_millis(500));
            let evs = events(&log);
            assert_eq!(
                (count(&evs, "fork"), count(&evs, "restart")),
                (2, 1),
                "{evs:#?}"
            );
            primary.signal(Signal::TERM);
            assert_exit(&mut primary, Duration::from_secs(20), 0);
        } else {
            // Neither restarted nor stopped: it exited 0 by itself, and that ended the run.
            assert_eq!(pids.len(), 1, "{restart}: {evs:#?}");
            for event in ["restart", "drain", "give_up"] {
                assert_eq!(count(&evs, event), 0, "{restart}: {evs:#?}");
            }
            assert!(
                notice.ends_with(&format!(
                    "said it is going down: no replacement before it exits (restart type \
                     {restart}), its exit decides; it has 10s to exit"
                )),
                "{notice}"
            );
            let none_left =
                format!("no worker left to run (restart type {restart}): exiting with code 0");
            assert!(lines.iter().any(|l| l.ends_with(&none_left)), "{lines:#?}");
        }
        assert!(
            !lines.iter().any(|l| l.contains("exited with code 1")),
            "{restart}: {lines:#?}"
        );
    }
}

/// The give-up names what spent the budget as it was: a going-down notice (no exit code
/// invented for it), or the exit that followed one, with its own status.
#[test]
fn a_give_up_after_going_down_notices_names_each_as_it_was() {
    if !have("python3") {
        return;
    }
    let dir = TempDir::new("stopping-give-up");
    // (restart type, what the worker does after its notice, the give-up's last cause)
    for (restart, env, last) in [
        ("permanent", ("HOLD", "1"), "said it was going down"),
        ("transient", ("CODE", "3"), "exited with code 3"),
    ] {
        let log = dir.path().join(format!("{restart}.jsonl"));
        let mut primary = run_going_down(
            &dir,
            &log,
            &["--restart", restart, "--max-restarts", "1"],
            &[env],
        );
        assert_exit(&mut primary, Duration::from_secs(20), 75);
        let evs = events(&log);
        let pids = forked(&evs);
        assert_eq!(pids.len(), 2, "{restart}: {evs:#?}");
        let why = format!(
            "more than 1 restart within 60s (last: worker 1 (pid {}) {last})",
            pids[1]
        );
        let give_up = evs.iter().find(|e| e["event"] == "give_up").unwrap();
        assert_eq!(give_up["why"], why.as_str(), "{restart}: {evs:#?}");
        let lines = primary.output();
        assert!(
            lines
                .iter()
                .any(|l| l.contains(&format!("giving up: {why};"))),
            "{restart}: {lines:#?}"
        );
        assert!(
            lines.iter().any(|l| l.contains("supervising 1 worker")
                && l.contains("at most 1 restart within 60s)")),
            "{lines:#?}"
        );
    }
}

/// With no worker left to run, "no worker left to run" follows every worker's exit line, one
/// whose output ends late (a background process held its pipes, 200 ms at most) included.
#[test]
fn no_worker_left_is_said_after_every_exit_line() {
    if !have("setsid") {
        return;
    }
    let dir = TempDir::new("no-worker-left-order");
    let kids = Grandchildren::new(&dir);
    let held = dir.path().join("held");
    // Worker 2 leaves a process holding its output (out of its group: not killed with it) and
    // exits; worker 1 exits 50 ms later, while worker 2's exit line waits for that output.
    let worker = format!(
        "if [ \"$NODUS_WORKER_ID\" = 2 ]; then setsid sleep 5 & echo $! >> {kids}; : > {held}; \
         exit 0; fi; while [ ! -e {held} ]; do sleep 0.01; done; sleep 0.05; exit 0",
        kids = kids.0.display(),
        held = held.display()
    );
    let mut primary =
        spawn(run_sh(["-w", "2", "--restart", "transient"], &worker).env("RUST_LOG", "info"));
    assert_exit(&mut primary, Duration::from_secs(20), 0);
    let lines = primary.output();
    let at = |what: &str| {
        lines
            .iter()
            .position(|l| l.contains(what))
            .unwrap_or_else(|| panic!("no {what:?}: {lines:#?}"))
    };
    let none_left = at("no worker left to run");
    for id in [1, 2] {
        let exit = at(&format!("worker {id} (pid "));
        assert!(exit < none_left, "worker {id}: {lines:#?}");
    }
}

/// Every restart, at once or after a backoff, is one line naming the replacement's pid, after
/// the exit line of the worker it replaces.
#[test]
fn each_restart_names_the_new_pid() {
    let mut primary = spawn(
        run_sh(
            ["-w", "1", "--backoff", "0.1,2,1", "--max-restarts", "3"],
            "echo \"pid $$\"; exit 3",
        )
        .env("RUST_LOG", "info"),
    );
    assert_exit(&mut primary, Duration::from_secs(20), 75);
    let lines = primary.output();
    // The workers' own lines, in their order (stdout: not ordered with the primary's stderr).
    let pids: Vec<&str> = lines
        .iter()
        .filter_map(|l| l.split("] pid ").nth(1))
        .collect();
    assert_eq!(pids.len(), 4, "{lines:#?}");
    let at = |what: &str| lines.iter().position(|l| l.contains(what));
    for (old, (new, how)) in
        pids.iter().zip(
            pids[1..]
                .iter()
                .zip(["at once", "after 100 ms", "after 200 ms"]),
        )
    {
        let said = format!("worker 1 restarted {how}: pid {new}");
        let exit = at(&format!("worker 1 (pid {old}) exited with code 3"));
        assert!(
            at(&said).is_some_and(|i| lines[i].contains(" INFO ") && Some(i) > exit),
            "{said:?} after pid {old}'s exit line: {lines:#?}"
        );
    }
}

#[test]
fn the_start_line_names_the_addresses_bound() {
    let mut primary = spawn(
        Command::new(NODUS)
            .args([
                "run",
                "-w",
                "1",
                "-l",
                "127.0.0.1:0",
                "--admin",
                "127.0.0.1:0",
            ])
            .args(["--", "sleep", "60"])
            .env("RUST_LOG", "info"),
    );
    let line = primary.wait_line("supervising 1 worker of 'sleep'");
    let after = |what: &str| {
        line.split_once(what)
            .and_then(|(_, rest)| {
                rest.split([' ', '/'])
                    .next()?
                    .parse::<std::net::SocketAddr>()
                    .ok()
            })
            .unwrap_or_else(|| panic!("no address after {what:?}: {line}"))
    };
    let (public, admin) = (after("listening on "), after("admin endpoints on http://"));
    assert!(
        line.contains(&format!("{public} (fd 3, listen0)")),
        "{line}"
    );
    assert!(public.port() != 0 && admin.port() != 0, "{line}");
    // They are the real ones: the admin endpoints answer there.
    let reply = common::http::get(admin, "/_nodus/healthz");
    assert_eq!(reply.status, 200);
    std::net::TcpStream::connect(public).unwrap();
    primary.signal(Signal::TERM);
    assert_exit(&mut primary, Duration::from_secs(20), 0);
}

/// `nodus run --node -w 1 -l LISTEN -- node app.js`, the app listening on `PORT`.
fn node_with_listen(dir: &TempDir, listen: &str, port: u16) -> Proc {
    node_app(dir, &["-l", listen], None, port)
}

/// A Node app listening on `HOST` (none: any host) port `PORT`, then printing `address` and its
/// `server.address()`.
const NODE_APP: &str = "require('http').createServer((q, r) => r.end('hello\\n'))\n  \
     .listen(+process.env.PORT, process.env.HOST, function () {\n    \
     console.log('address', JSON.stringify(this.address()));\n  });\n";

/// `nodus run --node -w 1 --ready-timeout 1 OPTIONS... -- node app.js`, the app [`NODE_APP`].
fn node_app(dir: &TempDir, options: &[&str], host: Option<&str>, port: u16) -> Proc {
    let app = dir.path().join("app.js");
    std::fs::write(&app, NODE_APP).unwrap();
    let mut cmd = Command::new(NODUS);
    cmd.args(["run", "--node", "-w", "1", "--ready-timeout", "1"])
        .args(options)
        .args(["--", "node"])
        .arg(&app)
        .env("PORT", port.to_string())
        .env("RUST_LOG", "info");
    if let Some(host) = host {
        cmd.env("HOST", host);
    }
    spawn(&mut cmd)
}

#[test]
fn with_node_an_l_socket_is_the_one_a_worker_listen_on_its_port_takes() {
    if !have("node") {
        return;
    }
    let dir = TempDir::new("node-l");
    let [taken, other] = nodus_testkit::net::free_addrs::<2>();
    // The app listens on -l's port: it is given that socket (no new one).
    let mut primary = node_with_listen(&dir, &taken.to_string(), taken.port());
    let line = primary.wait_line("supervising 1 worker");
    assert!(
        line.ends_with(&format!(
            "listening on {taken} (for a worker's listen on port {})",
            taken.port()
        )),
        "{line}"
    );
    primary.wait_line("1 worker ready");
    assert_eq!(common::http::get(taken, "/").body, b"hello\n");
    primary.signal(Signal::TERM);
    assert_exit(&mut primary, Duration::from_secs(20), 0);
    assert!(
        !primary
            .output()
            .iter()
            .any(|l| l.contains("no worker listens")),
        "{:#?}",
        primary.output()
    );

    // The app listens on another port: said once the worker is ready.
    let mut primary = node_with_listen(&dir, &taken.to_string(), other.port());
    let warning = primary.wait_line("no worker listens on");
    assert!(
        warning.contains(&format!("no worker listens on {taken} (listen0, "))
            && warning.contains("reset after 1s"),
        "{warning}"
    );
    assert_eq!(common::http::get(other, "/").body, b"hello\n");
    primary.signal(Signal::TERM);
    assert_exit(&mut primary, Duration::from_secs(20), 0);

    // Port 0 names no port a worker could listen on: a usage error.
    let mut primary = node_with_listen(&dir, "127.0.0.1:0", other.port());
    assert_exit(&mut primary, Duration::from_secs(20), 2);
    let lines = primary.output();
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(
        lines[0].starts_with("nodus run: -l 127.0.0.1:0: with --node, "),
        "{lines:#?}"
    );
}

#[test]
fn with_node_an_l_socket_serves_a_listen_on_an_address_it_covers() {
    if !have("node") {
        return;
    }
    let dir = TempDir::new("node-l-cover");
    let l = nodus_testkit::net::free_addr();
    let listen = l.to_string();
    // (policy, the app's host, what its server.address() says). Loopback only: that -l 0.0.0.0
    // or [::] covers any address of its family is the `covers` unit test's.
    for (policy, host, address) in [
        // Any host: under reuseport the worker's own socket is bound to -l's address too.
        ("reuseport", None, "127.0.0.1"),
        // The same address (IPv4-mapped): -l's socket, under every policy.
        ("rr", Some("::ffff:127.0.0.1"), "127.0.0.1"),
        ("shared", Some("::ffff:127.0.0.1"), "127.0.0.1"),
        ("reuseport", Some("::ffff:127.0.0.1"), "127.0.0.1"),
    ] {
        let mut primary = node_app(&dir, &["-l", &listen, "--policy", policy], host, l.port());
        let line = primary.wait_line("] address ");
        assert!(
            line.contains(&format!(
                r#"{{"address":"{address}","family":"IPv4","port":"#
            )),
            "{policy}, host {host:?}: {line}"
        );
        primary.wait_line("1 worker ready");
        assert_eq!(common::http::get(l, "/").body, b"hello\n");
        primary.signal(Signal::TERM);
        assert_exit(&mut primary, Duration::from_secs(20), 0);
        let lines = primary.output();
        assert!(
            !lines
                .iter()
                .any(|l| l.contains("no worker listens") || l.contains("does not cover")),
            "{policy}, host {host:?}: {lines:#?}"
        );
    }

    // Another address on -l's port: the worker gets a socket of its own, and that is said.
    let mut primary = node_app(&dir, &["-l", &listen], Some("127.0.0.2"), l.port());
    let warning = primary.wait_line("does not cover");
    assert!(
        warning.contains(" WARN ")
            && warning.contains(&format!(
                "listens on 127.0.0.2:{}, on the port of {l} (listen0, ",
                l.port()
            )),
        "{warning}"
    );
    primary.wait_line("no worker listens on");
    let own = std::net::SocketAddr::from(([127, 0, 0, 2], l.port()));
    assert_eq!(common::http::get(own, "/").body, b"hello\n");
    primary.signal(Signal::TERM);
    assert_exit(&mut primary, Duration::from_secs(20), 0);
    assert_eq!(
        primary
            .output()
            .iter()
            .filter(|l| l.contains("does not cover"))
            .count(),
        1,
        "{:#?}",
        primary.output()
    );
}

#[test]
fn with_node_a_listen_with_no_host_is_bound_dual_stack_as_node_binds_it() {
    if !have("node") {
        return;
    }
    if std::net::TcpListener::bind("[::1]:0").is_err() {
        println!("skipped: no IPv6 loopback");
        return;
    }
    let dir = TempDir::new("node-any-host");
    let port = nodus_testkit::net::free_addr().port();
    let v4 = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let v6 = std::net::SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, port));

    // Plain node: `::`, dual-stack.
    let app = dir.path().join("plain.js");
    std::fs::write(&app, NODE_APP).unwrap();
    let mut plain = spawn(Command::new("node").arg(&app).env("PORT", port.to_string()));
    let expected = plain.wait_line("address ");
    assert_eq!(
        expected,
        format!(r#"address {{"address":"::","family":"IPv6","port":{port}}}"#)
    );
    for addr in [v4, v6] {
        assert_eq!(common::http::get(addr, "/").body, b"hello\n", "{addr}");
    }
    plain.signal(Signal::KILL);
    assert!(plain.exited_within(Duration::from_secs(20)).is_some());

    // Its workers under nodus, whatever the policy: the same.
    for policy in ["rr", "least", "shared", "reuseport"] {
        let mut primary = node_app(&dir, &["--policy", policy], None, port);
        let line = primary.wait_line("] address ");
        assert!(line.ends_with(&format!("] {expected}")), "{policy}: {line}");
        primary.wait_line("1 worker ready");
        for addr in [v4, v6] {
            assert_eq!(
                common::http::get(addr, "/").body,
                b"hello\n",
                "{policy}: {addr}"
            );
        }
        primary.signal(Signal::TERM);
        assert_exit(&mut primary, Duration::from_secs(20), 0);
    }

    // `ipv6Only` (with host `::`, where Node passes it on): IPv6 only, as Node binds it.
    let app = dir.path().join("v6only.js");
    std::fs::write(
        &app,
        "require('http').createServer((q, r) => r.end('hello\\n'))\n  \
         .listen({ port: +process.env.PORT, host: '::', ipv6Only: true }, function () {\n    \
         console.log('address', JSON.stringify(this.address()));\n  });\n",
    )
    .unwrap();
    for policy in ["rr", "shared", "reuseport"] {
        let mut primary = spawn(
            Command::new(NODUS)
                .args(["run", "--node", "-w", "1", "--policy", policy, "--", "node"])
                .arg(&app)
                .env("PORT", port.to_string())
                .env("RUST_LOG", "info"),
        );
        primary.wait_line("1 worker ready");
        assert_eq!(common::http::get(v6, "/").body, b"hello\n", "{policy}");
        let refused = std::net::TcpStream::connect_timeout(&v4, Duration::from_secs(5));
        assert!(
            refused.is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused),
            "{policy}: IPv4 is not served"
        );
        primary.signal(Signal::TERM);
        assert_exit(&mut primary, Duration::from_secs(20), 0);
    }
}

#[test]
fn with_node_a_worker_message_is_said_once_and_a_worker_that_never_listens_is_warned_about() {
    if !have("node") {
        return;
    }
    let dir = TempDir::new("node-no-listen");
    let log = dir.path().join("events.jsonl");
    let app = dir.path().join("consumer.js");
    // Never listens; two application messages; gone when the primary disconnects it.
    std::fs::write(
        &app,
        "process.send({ hello: 1 }); process.send('again');\n\
         process.on('disconnect', () => process.exit(0));\n\
         console.log('up'); setInterval(() => {}, 1000);\n",
    )
    .unwrap();
    let mut primary = spawn(
        Command::new(NODUS)
            .args([
                "run",
                "--node",
                "-w",
                "2",
                "--ready-timeout",
                "1",
                "--events",
            ])
            .arg(&log)
            .args(["--", "node"])
            .arg(&app)
            .env("RUST_LOG", "info"),
    );
    for slot in 1..=2 {
        let up = primary.wait_line(&format!("[worker {slot} "));
        let pid = up.split([' ', ']']).nth(2).unwrap().to_owned();
        let warning = primary.wait_line(&format!("worker {slot} (pid {pid}) has not listened"));
        assert!(
            warning.contains(" WARN ")
                && warning.contains(
                    "has not listened in 1s: with --node a worker is ready at its first listen"
                )
                && warning.ends_with("is ready after --ready-after SECS (a Rust primary: `Readiness::ListeningOrAlive`)"),
            "{warning}"
        );
    }
    wait_events(&log, |e| count(e, "message") == 4);
    primary.signal(Signal::TERM);
    assert_exit(&mut primary, Duration::from_secs(20), 0);
    let lines = primary.output();
    let said: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("sent a message"))
        .collect();
    assert_eq!(said.len(), 1, "{lines:#?}");
    assert!(
        said[0].contains(" INFO ")
            && said[0].contains(" sent a message (process.send, ")
            && said[0].contains(" bytes of JSON); ")
            && !said[0].contains("hello")
            && said[0].contains("no cluster.on('message') handler receives worker messages")
            && said[0].contains("`message` event, written to the event log (--events FILE)"),
        "{}",
        said[0]
    );
    let warned = lines
        .iter()
        .filter(|l| l.contains("has not listened"))
        .count();
    assert_eq!(warned, 2, "once per worker: {lines:#?}");
}

/// `nodus run --node -w 2 -- node ARGS...` with the app's code as `-e`'s, listening on 127.0.0.1
/// port `port`.
fn node_eval(args: &[&str], port: u16) -> Command {
    let code = "require('http').createServer((q, r) => r.end('hello\\n'))\
                .listen(+process.env.PORT, '127.0.0.1')";
    let mut cmd = Command::new(NODUS);
    cmd.args(["run", "--node", "-w", "2", "--max-restarts", "1", "--"])
        .args(args.iter().map(|a| if *a == "CODE" { code } else { a }))
        .env("PORT", port.to_string())
        .env("RUST_LOG", "info");
    cmd
}

#[test]
fn with_node_code_with_no_script_is_refused_and_with_an_argument_it_runs() {
    let port = nodus_testkit::net::free_addr().port();
    // Node leaves process.argv[1] unset: not a cluster worker, its listen never answered. Said
    // before any worker starts (no need for node to see that).
    for args in [
        &["node", "-e", "CODE"][..],
        &["node", "-p", "CODE"],
        &["node", "--eval", "CODE", "--"],
        &["node", "-r", "fs", "-e", "CODE", "--title", "t"],
        &["/usr/bin/node", "-e", "CODE", "--", ""],
    ] {
        let mut primary = spawn(&mut node_eval(args, port));
        assert_exit(&mut primary, Duration::from_secs(20), 2);
        let lines = primary.output();
        assert_eq!(lines.len(), 1, "{args:?}: {lines:#?}");
        assert!(
            lines[0].starts_with("nodus run: --node: node with no script (-e or -p code alone) ")
                && lines[0].ends_with("(node -e CODE -- ARG)"),
            "{args:?}: {lines:#?}"
        );
    }
    if !have("node") {
        return;
    }
    // An argument after the code is process.argv[1]: the workers serve.
    let mut primary = spawn(&mut node_eval(
        &["node", "-e", "CODE", "--", "worker"],
        port,
    ));
    primary.wait_line("2 workers ready");
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    assert_eq!(common::http::get(addr, "/").body, b"hello\n");
    primary.signal(Signal::TERM);
    assert_exit(&mut primary, Duration::from_secs(20), 0);

    // Behind a wrapper nodus cannot see through: the worker's listen, before any `online`, is
    // said to be that, by every worker, until the restart budget is spent.
    let mut primary = spawn(&mut node_eval(
        &["sh", "-c", "exec node -e \"$0\"", "CODE"],
        port,
    ));
    assert_exit(&mut primary, Duration::from_secs(20), 75);
    let lines = primary.output();
    let said = lines
        .iter()
        .filter(|l| {
            l.contains(" ERROR ")
                && l.contains("asked to listen before it said online: Node did not set it up")
        })
        .count();
    assert!(said >= 2, "{lines:#?}");
}

/// Open fds of process `pid`.
fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

#[test]
fn a_worker_notify_socket_is_closed_with_its_worker() {
    let dir = TempDir::new("notify-fds");
    let log = dir.path().join("events.jsonl");
    let primary = spawn(&mut run_sh(
        [
            "-w",
            "1",
            "--backoff",
            "0.01,1,0.01",
            "--max-restarts",
            "1000",
            "--restart-window",
            "60",
            "--events",
            log.to_str().unwrap(),
        ],
        "sleep 0.02; exit 1",
    ));
    wait_events(&log, |e| count(e, "fork") >= 5);
    let before = fd_count(primary.id());
    wait_events(&log, |e| count(e, "fork") >= 45);
    let after = fd_count(primary.id());
    // One worker at a time: a socket, two output pipes and a pidfd come and go with it.
    assert!(
        after <= before + 4,
        "fds grew from {before} to {after} over 40 restarts"
    );
}

#[test]
fn notify_messages_from_outside_the_worker_process_group_are_ignored() {
    if !have("python3") {
        return;
    }
    let dir = TempDir::new("notify-spoof");
    let log = dir.path().join("events.jsonl");
    let go = dir.path().join("go");
    // The worker says STOPPING=1 through a child of its own (same process group) once told to;
    // the child stays up a moment, since a sender already gone when its datagram is read is
    // ignored (its group cannot be checked).
    let send = "import os, socket; s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); \
                s.sendto(b'STOPPING=1', '\\0' + os.environ['NOTIFY_SOCKET'][1:]); \
                import time; time.sleep(1)";
    let worker = format!(
        "echo \"sock=$NOTIFY_SOCKET\"; while [ ! -e {go} ]; do sleep 0.02; done; \
         python3 -c \"{send}\"; exec sleep 60",
        go = go.display()
    );
    let admin = nodus_testkit::net::free_addr();
    let mut primary = spawn(
        run_sh(
            [
                "-w",
                "1",
                "--ready-after",
                "0.2",
                "--min-uptime",
                "0.1",
                "--admin",
                &admin.to_string(),
                "--events",
                log.to_str().unwrap(),
            ],
            &worker,
        )
        .env("RUST_LOG", "info"),
    );
    let line = primary.wait_line("sock=@");
    let name = line.split("sock=@").nth(1).unwrap().trim().to_owned();

    // Anyone else (this test process) who finds the name: heard, counted, said once (a flood of
    // them is no flood of log lines: one more line a minute at most), its pid said plainly.
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let spoofer = std::os::unix::net::UnixDatagram::unbound().unwrap();
    const SPOOFED: u64 = 300;
    for _ in 0..SPOOFED {
        spoofer.send_to_addr(b"STOPPING=1", &addr).unwrap();
    }
    let line = primary.wait_line("ignored a notify message");
    assert!(
        line.contains(&format!("from pid {},", std::process::id())),
        "{line}"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let ignored = loop {
        let reply = common::http::get(admin, "/_nodus/stats");
        let stats: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
        if stats["notify_ignored"] == SPOOFED || Instant::now() > deadline {
            break stats["notify_ignored"].clone();
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(ignored, SPOOFED);
    let metrics = common::http::get(admin, "/_nodus/metrics");
    let text = String::from_utf8_lossy(&metrics.body);
    let series = format!("nodus_cluster_notify_ignored_total {SPOOFED}");
    assert!(text.lines().any(|l| l == series), "{series} in {text}");
    let evs = events(&log);
    assert_eq!(count(&evs, "going_down"), 0, "{evs:#?}");
    assert_eq!(count(&evs, "fork"), 1, "{evs:#?}");

    // The worker's own group, once the worker serves (ready, up its min uptime): heeded, the
    // replacement starts at once.
    wait_events(&log, |e| count(e, "ready") == 1);
    std::fs::write(&go, "").unwrap();
    let evs = wait_events(&log, |e| {
        count(e, "going_down") == 1 && count(e, "fork") == 2
    });
    assert_eq!(count(&evs, "give_up"), 0, "{evs:#?}");
    primary.signal(Signal::TERM);
    assert_eq!(primary.wait_exit(Duration::from_secs(20)), Some(0));
    let said: Vec<&String> = primary
        .output()
        .iter()
        .filter(|l| l.contains("notify message"))
        .collect();
    assert_eq!(said.len(), 1, "{said:#?}");
}

/// A wrapper script that does not `exec` its program (`sh -c 'sleep 300; echo done'`): SIGTERM
/// ends the shell, and what it left in its process group is SIGKILLed at its exit, as
/// systemd's `KillMode=mixed` does. That is said (one WARN line: the worker, the group, what was
/// killed, the `exec` advice) and counted in the exit event (`group_killed`); a worker that
/// `exec`s its program leaves nothing, and no line.
#[test]
fn what_a_worker_left_in_its_process_group_at_its_exit_is_said_and_counted() {
    let dir = TempDir::new("group-killed");
    for (script, left) in [("sleep 300; echo done", 1), ("exec sleep 300", 0)] {
        let log = dir.path().join(format!("events-{left}.jsonl"));
        let mut primary = spawn(
            run_sh(
                [
                    "-w",
                    "1",
                    "--ready-after",
                    "0.1",
                    "--events",
                    log.to_str().unwrap(),
                ],
                script,
            )
            .env("RUST_LOG", "info"),
        );
        let evs = wait_events(&log, |e| count(e, "ready") == 1);
        let pid = evs.iter().find(|e| e["event"] == "fork").unwrap()["pid"].clone();
        // The shell's `sleep` has started (the worker's own child, in its group).
        let deadline = Instant::now() + Duration::from_secs(20);
        while left == 1
            && tree::children(pid.as_u64().unwrap() as u32).is_empty()
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        primary.signal(Signal::TERM);
        assert_exit(&mut primary, Duration::from_secs(20), 0);
        let evs = events(&log);
        let exit = evs.iter().find(|e| e["event"] == "exit").unwrap();
        assert_eq!(exit["group_killed"], left, "{evs:#?}");
        let said: Vec<&String> = primary
            .output()
            .iter()
            .filter(|l| l.contains("in its process group"))
            .collect();
        if left == 0 {
            assert!(said.is_empty(), "{said:#?}");
            continue;
        }
        assert_eq!(said.len(), 1, "{:#?}", primary.output());
        assert!(
            said[0].contains("WARN")
                && said[0].contains(&format!(
                    "worker 1 (pid {pid}) exited and left 1 process in its process group {pid}: \
                     SIGKILLed pid "
                ))
                && said[0].contains(
                    " (sleep); a wrapper script should `exec` its program, so \
                                     that the program gets SIGTERM itself"
                ),
            "{said:#?}"
        );
    }
}

/// A stopped worker (SIGSTOP, a debugger) gets SIGCONT right after its kill signal, as systemd
/// sends it: it handles the signal and stops in time (exit code 0), rather than stay stopped
/// until its SIGKILL at the kill timeout (exit code 124).
#[test]
fn a_stopped_worker_is_continued_after_its_kill_signal_and_stops_in_time() {
    let dir = TempDir::new("sigcont");
    let log = dir.path().join("events.jsonl");
    let mut primary = spawn(
        run_sh(
            [
                "-w",
                "1",
                "--ready-after",
                "0.1",
                "--kill-timeout",
                "30",
                "--events",
                log.to_str().unwrap(),
            ],
            "trap 'echo got TERM; exit 0' TERM; while :; do sleep 0.1; done",
        )
        .env("RUST_LOG", "info"),
    );
    let evs = wait_events(&log, |e| count(e, "ready") == 1);
    let pid = evs.iter().find(|e| e["event"] == "fork").unwrap()["pid"]
        .as_i64()
        .unwrap() as i32;
    let worker = Pid::from_raw(pid).unwrap();
    rustix::process::kill_process(worker, Signal::STOP).unwrap();
    // Stopped before the SIGTERM comes ('T' in /proc/PID/stat).
    let deadline = Instant::now() + Duration::from_secs(20);
    let stopped = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('T')
        })
    };
    while !stopped() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(stopped(), "the worker did not stop");
    primary.signal(Signal::TERM);
    // Well inside the 30 s kill timeout: a regression waits it out and exits 124.
    assert_exit(&mut primary, Duration::from_secs(20), 0);
    assert!(
        primary.output().iter().any(|l| l.ends_with("] got TERM")),
        "{:#?}",
        primary.output()
    );
}

/// A Node worker's `listen(path)` is bound as a Unix socket on that path (its `server.address()`
/// the path, as under Node's primary), not as TCP.
#[test]
fn a_node_worker_listening_on_a_pipe_gets_a_unix_socket_not_tcp() {
    if !have("node") {
        return;
    }
    let dir = TempDir::new("node-pipe");
    let app = dir.path().join("app.js");
    std::fs::write(
        &app,
        "const s = require('net').createServer();\n\
         s.on('error', (e) => { console.log('listen error ' + e.code); process.exit(0); });\n\
         s.listen(process.argv[2], () => { console.log('listening ' + JSON.stringify(s.address())); process.exit(0); });\n",
    )
    .unwrap();
    let mut primary = spawn(
        Command::new(NODUS)
            .args([
                "run",
                "--node",
                "-w",
                "1",
                "--restart",
                "temporary",
                "--",
                "node",
            ])
            .arg(&app)
            .arg(dir.path().join("app.sock")),
    );
    assert_eq!(primary.wait_exit(Duration::from_secs(30)), Some(0));
    let want = format!(
        "listening {:?}",
        dir.path().join("app.sock").to_str().unwrap()
    );
    let lines = primary.output();
    assert!(lines.iter().any(|l| l.ends_with(&want)), "{lines:#?}");
}

/// A worker that ignores SIGTERM (its `sleep`s too: an ignored signal stays ignored across
/// `exec`), and one that stops when asked, after a last line.
const DEAF: &str = "trap '' TERM; echo up; while :; do sleep 0.05; done";
const POLITE: &str = "trap 'echo bye; exit 0' TERM; echo up; while :; do sleep 0.05; done";

/// `nodus run -w 2 --kill-timeout SECS -- sh -c WORKER`, once both workers said `up`.
fn two_workers(kill_timeout: &str, worker: &str) -> nodus_testkit::proc::Proc {
    let mut primary =
        spawn(run_sh(["-w", "2", "--kill-timeout", kill_timeout], worker).env("RUST_LOG", "info"));
    primary.wait_line("[worker 1 ");
    primary.wait_line("[worker 2 ");
    primary
}

#[test]
fn a_stop_that_had_to_kill_a_worker_exits_124_and_a_drain_in_time_exits_0() {
    let mut primary = two_workers("1", DEAF);
    let asked = Instant::now();
    primary.signal(Signal::TERM);
    assert_exit(&mut primary, Duration::from_secs(20), 124);
    assert!(
        asked.elapsed() >= Duration::from_secs(1),
        "the kill timeout"
    );
    primary.wait_line("SIGKILL");

    let mut primary = two_workers("10", POLITE);
    primary.signal(Signal::TERM);
    assert_exit(&mut primary, Duration::from_secs(20), 0);
    // Their last lines were written before the primary exited.
    assert_eq!(
        workers_saying(&mut primary, "bye"),
        2,
        "{:#?}",
        primary.output()
    );
}

#[test]
fn a_second_signal_during_the_drain_exits_128_plus_its_number() {
    for (signal, code) in [(Signal::TERM, 143), (Signal::INT, 130)] {
        // The kill timeout is far: only the second signal can end this stop.
        let mut primary = two_workers("60", DEAF);
        primary.signal(signal);
        // A plain program gets no drain deadline: the line says what it gets.
        let line = primary.wait_line("SIGTERM to 2 workers");
        assert!(
            line.ends_with("SIGKILL after 60s if still running"),
            "{line}"
        );
        primary.signal(signal);
        assert_eq!(
            primary.wait_exit(Duration::from_secs(20)),
            Some(code),
            "{signal:?} twice: {:#?}",
            primary.output()
        );
    }
}

/// A worker that writes which of SIGINT and SIGTERM it got into the file `$MARK` (appending
/// `int` or `term`) and exits 0 then.
const MARKS_ITS_STOP: &str = "trap 'echo int >>\"$MARK\"; exit 0' INT; \
     trap 'echo term >>\"$MARK\"; exit 0' TERM; echo up; while :; do sleep 0.05; done";

/// `nodus run -w 1 --events FILE OPTIONS -- sh -c MARKS_ITS_STOP`, stopped by a SIGTERM once
/// its worker is up, its stop line naming `signal`: what the worker wrote, and its exit event,
/// once nodus exited 0.
fn stopped_with(dir: &TempDir, options: &[&str], signal: &str) -> (String, serde_json::Value) {
    let (mark, log) = (dir.path().join("mark"), dir.path().join("events.jsonl"));
    let _ = std::fs::remove_file(&mark);
    let _ = std::fs::remove_file(&log);
    let mut primary = spawn(
        run_sh(
            ["-w", "1", "--events", log.to_str().unwrap()]
                .iter()
                .chain(options),
            MARKS_ITS_STOP,
        )
        .env("MARK", &mark)
        .env("RUST_LOG", "info"),
    );
    primary.wait_line("[worker 1 ");
    primary.signal(Signal::TERM);
    assert_exit(&mut primary, Duration::from_secs(20), 0);
    let exit = events(&log)
        .into_iter()
        .find(|e| e["event"] == "exit")
        .unwrap_or_else(|| panic!("no exit event: {:#?}", primary.output()));
    assert!(
        primary
            .output()
            .iter()
            .any(|l| l.contains(&format!("{signal} to 1 worker, SIGKILL after"))),
        "the stop line names {signal}: {:#?}",
        primary.output()
    );
    (std::fs::read_to_string(&mark).unwrap_or_default(), exit)
}

/// `--kill-signal SIGINT` (PM2's default kill signal) stops a plain program with SIGINT, so the
/// cleanup of an app written for PM2 runs (reviewer's item 8: it got SIGTERM and died of it);
/// by default it gets SIGTERM. A worker that answers it with exit 0 stopped as asked.
#[test]
fn kill_signal_is_what_stops_a_worker_and_sigterm_by_default() {
    let dir = TempDir::new("kill-signal");
    for given in ["SIGINT", "INT", "int", "2"] {
        let (mark, exit) = stopped_with(&dir, &["--kill-signal", given], "SIGINT");
        assert_eq!(mark, "int\n", "--kill-signal {given}");
        assert_eq!(exit["code"], 0, "{exit}");
        assert_eq!(exit["reason"], "stopped as asked", "{exit}");
    }
    let (mark, exit) = stopped_with(&dir, &[], "SIGTERM");
    assert_eq!(mark, "term\n", "the default");
    assert_eq!(exit["reason"], "stopped as asked", "{exit}");
}

/// A worker that dies of the kill signal (no handler) stopped as asked: exit code 0, its exit
/// event naming the signal. Not "killed by signal 2 while draining" (a signal nodus did not send).
#[test]
fn a_worker_that_dies_of_the_kill_signal_stopped_as_asked() {
    let dir = TempDir::new("kill-signal-dies");
    let log = dir.path().join("events.jsonl");
    // The worker is `sleep` itself, which has no handler of SIGINT.
    let mut primary = spawn(
        run_sh(
            [
                "-w",
                "1",
                "--kill-signal",
                "INT",
                "--events",
                log.to_str().unwrap(),
            ],
            "echo up; exec sleep 600",
        )
        .env("RUST_LOG", "info"),
    );
    primary.wait_line("[worker 1 ");
    primary.signal(Signal::TERM);
    assert_exit(&mut primary, Duration::from_secs(20), 0);
    let exit = events(&log)
        .into_iter()
        .find(|e| e["event"] == "exit")
        .unwrap();
    assert_eq!(exit["signal"], 2, "{exit}");
    assert_eq!(exit["reason"], "stopped as asked", "{exit}");
}

/// Every standard signal has its name in the stop's lines, 16 and 30 too (SIGSTKFLT, SIGPWR:
/// said "signal" before), given by name or number; `sleep` dies of it, as asked.
#[test]
fn the_stop_line_names_sigstkflt_and_sigpwr() {
    let dir = TempDir::new("kill-signal-named");
    let log = dir.path().join("events.jsonl");
    for (given, n, name) in [("30", 30, "SIGPWR"), ("stkflt", 16, "SIGSTKFLT")] {
        let _ = std::fs::remove_file(&log);
        let options = ["-w", "1", "--kill-signal", given, "--events"];
        let mut primary = spawn(
            run_sh(
                options.iter().chain(&[log.to_str().unwrap()]),
                "echo up; exec sleep 600",
            )
            .env("RUST_LOG", "info"),
        );
        primary.wait_line("[worker 1 ");
        primary.signal(Signal::TERM);
        assert_exit(&mut primary, Duration::from_secs(20), 0);
        assert!(
            primary
                .output()
                .iter()
                .any(|l| l.contains(&format!("{name} to 1 worker, SIGKILL after"))),
            "--kill-signal {given}: {:#?}",
            primary.output()
        );
        let exit = events(&log)
            .into_iter()
            .find(|e| e["event"] == "exit")
            .unwrap();
        assert_eq!(exit["signal"], n, "{exit}");
        assert_eq!(exit["reason"], "stopped as asked", "{exit}");
    }
}

#[test]
fn a_kill_signal_that_cannot_be_caught_or_is_no_signal_is_a_usage_error() {
    for (bad, says) in [
        ("SIGKILL", "SIGKILL cannot be caught"),
        ("9", "SIGKILL cannot be caught"),
        ("stop", "SIGSTOP cannot be caught"),
        ("SIGFOO", "not a signal"),
        ("0", "not a signal"),
        ("32", "not a signal"),
        ("", "not a signal"),
    ] {
        let out = Command::new(NODUS)
            .args(["run", "--kill-signal", bad, "--", "true"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {stderr}");
        assert!(
            stderr.contains(&format!(
                "invalid value '{bad}' for '--kill-signal <SIGNAL>'"
            )) && stderr.contains(says),
            "{bad}: {stderr}"
        );
    }
    let help = Command::new(NODUS)
        .args(["run", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.contains("--kill-signal <SIGNAL>") && help.contains("[default: SIGTERM]"),
        "{help}"
    );
}

/// A Node app written for PM2: a pool (here a timer) keeps it alive, and its cleanup is a
/// SIGINT handler.
const NODE_PM2_SIGINT_APP: &str = r#"
const http = require('http');
http.createServer((q, r) => r.end('ok\n')).listen(+process.env.PORT, '127.0.0.1');
setInterval(() => {}, 1000);
process.on('SIGINT', () => { console.log('db closed'); process.exit(0); });
"#;

/// With `--node --kill-signal SIGINT`, a Node worker kept alive after its `disconnect` gets
/// SIGINT (not SIGTERM), so its PM2-style cleanup runs and the stop is a clean one.
#[test]
fn with_node_the_kill_signal_reaches_a_worker_kept_alive_after_its_disconnect() {
    if !have("node") {
        return;
    }
    let (_dir, _addr, mut primary) = common::cluster::run_node_app(
        "node-kill-signal",
        NODE_PM2_SIGINT_APP,
        1,
        &["--kill-signal", "SIGINT"],
    );
    primary.signal(Signal::TERM);
    assert_exit(&mut primary, Duration::from_secs(30), 0);
    assert!(
        primary.output().iter().any(|l| l.ends_with("] db closed")),
        "{:#?}",
        primary.output()
    );
}

/// A worker that, asked to stop, says so and takes 5 s to finish.
const SLOW_STOP: &str =
    "trap 'echo draining; sleep 5; exit 0' TERM; echo up; while :; do sleep 0.05; done";

/// A worker asked to stop that dies of a signal nodus did not send (a crash, the OOM killer, an
/// operator's `kill -9`) did not stop as asked: what it still held was cut. One WARN line says
/// so, and so does its exit event's reason (not "stopped as asked"); a reload's old worker that
/// does leaves the service serving, while a shutdown it happens in exits 124, as one that had to
/// kill a worker. Both were silent, and that shutdown exited 0 (found by bench/soak/soak.py:
/// `kill -9` of a Node worker draining after a reload).
#[test]
fn a_worker_killed_while_it_drains_is_said_and_makes_a_shutdown_exit_124() {
    let dir = TempDir::new("drain-killed");
    let log = dir.path().join("events.jsonl");
    let log_arg = log.to_str().unwrap();
    let mut primary =
        spawn(run_sh(["-w", "1", "--events", log_arg], SLOW_STOP).env("RUST_LOG", "info"));
    let old = wait_ready_pids(&log, 1)[0];
    let kill_draining = |primary: &mut Proc, pid: i32| {
        primary.wait_line(&format!(" {pid}] draining"));
        rustix::process::kill_process(Pid::from_raw(pid).unwrap(), Signal::KILL).unwrap();
        let line = primary.wait_line(&format!("(pid {pid}) killed by signal 9 while draining"));
        assert!(line.contains("WARN"), "{line}");
        let evs = wait_events(&log, |e| {
            e.iter().any(|e| e["event"] == "exit" && e["pid"] == pid)
        });
        let exit = evs
            .iter()
            .find(|e| e["event"] == "exit" && e["pid"] == pid)
            .unwrap();
        assert_eq!(
            exit["reason"], "killed by signal 9 while draining",
            "{exit}"
        );
        assert_eq!(exit["signal"], 9, "{exit}");
        evs
    };

    // A reload: the old worker is killed while it drains; the new one serves on, no restart.
    primary.signal(Signal::HUP);
    let new = wait_ready_pids(&log, 2)[1];
    let evs = kill_draining(&mut primary, old);
    assert_eq!(count(&evs, "restart"), 0, "{evs:#?}");
    primary.wait_line("the old workers have exited");
    assert!(!gone(new), "the new worker serves on");

    // A shutdown: its worker is killed while it drains.
    primary.signal(Signal::TERM);
    kill_draining(&mut primary, new);
    assert_exit(&mut primary, Duration::from_secs(20), 124);
}

/// Worker pids whose "exited" log line came before one of their own output lines, and how many
/// exit lines were checked.
fn exits_logged_before_output(lines: &[String]) -> (Vec<u32>, usize) {
    let mut early = Vec::new();
    let mut checked = 0;
    for (at, line) in lines.iter().enumerate() {
        let Some(pid) = line
            .split_once("(pid ")
            .filter(|_| line.contains(") exited with code"))
            .and_then(|(_, rest)| rest.split_once(')'))
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        checked += 1;
        let before = |what: &str| {
            lines[..at]
                .iter()
                .any(|l| l.ends_with(&format!("] {what}-{pid}")))
        };
        if !before("out") || !before("err") {
            early.push(pid);
        }
    }
    (early, checked)
}

#[test]
fn a_worker_exit_is_logged_after_its_last_output_lines() {
    // Workers that write a line to stdout and one to stderr and exit at once, restarted (no
    // backoff) until the budget is spent (exit 75); the primary's stdout and stderr share one
    // pipe.
    let mut cmd = run_sh(
        [
            "-w",
            "2",
            "--max-restarts",
            "150",
            "--restart-window",
            "600",
            "--backoff",
            "0,1,0",
        ],
        "echo out-$$; echo err-$$ >&2",
    );
    cmd.env("RUST_LOG", "info");
    let (mut primary, reader) = spawn_into_pipe(cmd);
    let reading = std::thread::spawn(move || {
        BufReader::new(reader)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<_>>()
    });
    assert_eq!(primary.wait_exit(Duration::from_secs(60)), Some(75));
    // The pipe's last write end closed with the primary.
    let lines = reading.join().unwrap();
    let (early, checked) = exits_logged_before_output(&lines);
    assert!(checked >= 100, "{checked} exit lines: {lines:#?}");
    assert!(
        early.is_empty(),
        "{} of {checked} exits logged before the worker's last line (pids {early:?})",
        early.len()
    );
}

/// A grandchild that inherited a worker's output pipes and left its process group (so it is not
/// killed with the worker) keeps them open after the worker exits: the exit line waits for them
/// at most 200 ms, and the restart does not wait at all.
#[test]
fn output_held_open_by_a_grandchild_delays_the_exit_line_a_little_and_the_restart_not_at_all() {
    if !have("setsid") {
        return;
    }
    let dir = TempDir::new("grandchild");
    let log = dir.path().join("events.jsonl");
    let started = Instant::now();
    let mut primary = spawn(
        run_sh(
            [
                "-w",
                "1",
                "--max-restarts",
                "1",
                "--events",
                log.to_str().unwrap(),
            ],
            // Not a group leader, so `setsid` execs `sleep` in a session of its own.
            "setsid sleep 10 & echo \"grandchild $!\"; exit 3",
        )
        .env("RUST_LOG", "info"),
    );
    let status = primary.exited_within(Duration::from_secs(20));
    let lines = primary.output().to_vec();
    for pid in lines
        .iter()
        .filter_map(|l| l.split_once("] grandchild ")?.1.parse().ok())
    {
        let _ = rustix::process::kill_process(Pid::from_raw(pid).unwrap(), Signal::KILL);
    }
    assert_eq!(status.and_then(|s| s.code()), Some(75), "{lines:#?}");
    assert!(started.elapsed() < Duration::from_secs(5), "{lines:#?}");
    let evs = events(&log);
    let at = |event: &str| {
        evs.iter()
            .find(|e| e["event"] == event)
            .and_then(|e| e["t_ns"].as_u64())
            .unwrap_or_else(|| panic!("no {event}: {evs:#?}"))
    };
    assert!(
        at("restart") - at("exit") < 100_000_000,
        "the restart waited for the output: {evs:#?}"
    );
    let exited = lines
        .iter()
        .filter(|l| l.ends_with(") exited with code 3"))
        .count();
    assert_eq!(exited, 2, "both exits logged: {lines:#?}");
}

/// The background children a test's workers started, which each worker appends to a file (one
/// pid a line); any still running when this is dropped is SIGKILLed by PID, so a failing test
/// leaks none.
struct Grandchildren(std::path::PathBuf);

impl Grandchildren {
    fn new(dir: &TempDir) -> Grandchildren {
        Grandchildren(dir.path().join("grandchildren"))
    }

    /// `sh` that starts `sleep 60` in the background and writes its pid down.
    fn start_one(&self) -> String {
        format!("sleep 60 & echo $! >> {}", self.0.display())
    }

    fn pids(&self) -> Vec<i32> {
        std::fs::read_to_string(&self.0)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// Waits (20 s at most) until `n` were started; their pids, each checked running.
    fn wait_started(&self, n: usize) -> Vec<i32> {
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.pids().len() < n {
            assert!(Instant::now() < deadline, "started: {:?}", self.pids());
            std::thread::sleep(Duration::from_millis(20));
        }
        let pids = self.pids();
        assert!(pids.iter().all(|&p| !gone(p)), "{pids:?} all running");
        pids
    }

    /// Asserts that every one started is gone within 10 s (a SIGKILL is delivered, not awaited).
    fn assert_all_gone(&self) {
        if let Err(left) = tree::wait_gone(&self.pids(), Duration::from_secs(10)) {
            panic!("worker children {left:?} outlived their workers");
        }
    }
}

impl Drop for Grandchildren {
    fn drop(&mut self) {
        for pid in self.pids().into_iter().filter(|&p| !gone(p)) {
            let _ = rustix::process::kill_process(Pid::from_raw(pid).unwrap(), Signal::KILL);
        }
    }
}

#[test]
fn a_stop_asks_the_worker_alone_and_leaves_none_of_its_children() {
    let dir = TempDir::new("orphans-stop");
    let kids = Grandchildren::new(&dir);
    // On SIGTERM the worker's child is still there (the stop asks the worker alone); the worker
    // then exits, as asked, without stopping it.
    let worker = format!(
        "trap 'kill -0 $! && echo child alive; exit 0' TERM; {}; wait",
        kids.start_one()
    );
    let mut primary = spawn(&mut run_sh(["-w", "2", "--kill-timeout", "30"], &worker));
    kids.wait_started(2);
    primary.signal(Signal::TERM);
    assert_exit(&mut primary, Duration::from_secs(20), 0);
    kids.assert_all_gone();
    let alive = workers_saying(&mut primary, "child alive");
    assert_eq!(alive, 2, "{:#?}", primary.output());
}

#[test]
fn a_crash_loop_to_the_give_up_leaves_none_of_the_workers_children() {
    let dir = TempDir::new("orphans-give-up");
    let kids = Grandchildren::new(&dir);
    let mut primary = spawn(&mut run_sh(
        ["-w", "1", "--max-restarts", "2", "--backoff", "0,1,0"],
        &format!("{}; exit 1", kids.start_one()),
    ));
    assert_exit(&mut primary, Duration::from_secs(20), 75);
    assert_eq!(kids.pids().len(), 3, "one per worker");
    kids.assert_all_gone();
}

#[test]
fn a_worker_that_exits_cleanly_takes_its_children_with_it_while_the_primary_runs() {
    let dir = TempDir::new("orphans-exit");
    let kids = Grandchildren::new(&dir);
    let once = dir.path().join("once");
    // The first worker starts a child and exits 0; its replacement just runs.
    let worker = format!(
        "if [ ! -e {once} ]; then : > {once}; {}; exit 0; fi; exec sleep 60",
        kids.start_one(),
        once = once.display()
    );
    let log = dir.path().join("events.jsonl");
    let mut primary = spawn(&mut run_sh(
        ["-w", "1", "--events", log.to_str().unwrap()],
        &worker,
    ));
    wait_events(&log, |e| count(e, "fork") == 2);
    kids.assert_all_gone();
    assert_eq!(kids.pids().len(), 1);
    assert!(
        primary.exited_within(Duration::ZERO).is_none(),
        "the primary still runs"
    );
    primary.signal(Signal::TERM);
    assert_eq!(primary.wait_exit(Duration::from_secs(20)), Some(0));
}

/// How many of the primary's output lines are a worker's (prefixed) line `text`.
fn workers_saying(primary: &mut Proc, text: &str) -> usize {
    let suffix = format!("] {text}");
    primary
        .output()
        .iter()
        .filter(|l| l.ends_with(&suffix))
        .count()
}

/// A Node app a timer keeps alive after its `disconnect`, with two servers: the cluster's on
/// `PORT`, and one of its own (`exclusive`: not the primary's, not closed by the `disconnect`) on
/// a port it prints (`own port N`). On either, `/slow` answers its first half at once and the
/// rest 1.5 s later, `/slower` 3 s later (saying `slow request in on PORT` when either starts);
/// anything else at once.
const NODE_APP_KEPT_ALIVE: &str = r#"
const http = require('http');
const handler = (q, r) => {
  if (!q.url.startsWith('/slow')) return r.end('quick\n');
  console.log('slow request in on', q.socket.localPort);
  r.write('first half,');
  setTimeout(() => r.end(' second half\n'), q.url === '/slower' ? 3000 : 1500);
};
http.createServer(handler).listen(+process.env.PORT, '127.0.0.1');
const own = http.createServer(handler);
own.listen({ port: 0, host: '127.0.0.1', exclusive: true }, () => {
  console.log('own port', own.address().port);
});
setInterval(() => {}, 1000);
"#;

/// A stopped Node worker a timer keeps alive is SIGTERMed a second after it has disconnected,
/// holding no inbound connection, not 0.2 s after its drain deadline (9.2 s at the default kill
/// timeout).
#[test]
fn with_node_a_worker_holding_no_connection_is_stopped_right_after_its_disconnect() {
    if !have("node") {
        return;
    }
    let (_dir, addr, mut primary) =
        common::cluster::run_node_app("node-drain-idle", NODE_APP_KEPT_ALIVE, 1, &[]);
    primary.wait_line("own port");
    // A connection came and went (Connection: close): none is held at the stop.
    assert_eq!(common::http::get(addr, "/").status, 200);
    let asked = Instant::now();
    primary.signal(Signal::TERM);
    assert_exit(&mut primary, Duration::from_secs(30), 0);
    let took = asked.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "took {took:?} (the drain deadline's SIGTERM comes at 9.2 s): {:#?}",
        primary.output()
    );
}

/// Reads from `conn` until what was read ends with `end` (a closed or cut connection fails).
fn read_until(conn: &mut std::net::TcpStream, end: &[u8]) -> String {
    use std::io::Read;
    let (mut read, mut buf) = (Vec::new(), [0u8; 512]);
    while !read.ends_with(end) {
        let n = conn.read(&mut buf).unwrap();
        assert!(n > 0, "cut: {}", String::from_utf8_lossy(&read));
        read.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&read).into_owned()
}

/// A kept-alive connection to `addr` (a first request answered on it) with a request for `path`
/// in flight on it, once the app said so.
fn slow_request_on_a_kept_alive_connection(
    primary: &mut Proc,
    addr: std::net::SocketAddr,
    path: &str,
) -> std::net::TcpStream {
    use std::io::Write;
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    conn.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    read_until(&mut conn, b"quick\n");
    conn.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .unwrap();
    primary.wait_line(&format!("slow request in on {}", addr.port()));
    conn
}

/// A stopped Node worker serving a slow request on a keep-alive connection is not SIGTERMed
/// before the response is done: the client gets all of it, on the cluster's port, and on a server
/// of the worker's own (which the `disconnect` leaves open) a slower one that outlasts the end
/// of the worker's channel (once the first connection is closed); once the client has closed
/// both, the stop ends well before the drain deadline.
#[test]
fn with_node_a_worker_is_not_stopped_before_its_in_flight_response_is_done() {
    if !have("node") {
        return;
    }
    let (_dir, addr, mut primary) =
        common::cluster::run_node_app("node-drain-busy", NODE_APP_KEPT_ALIVE, 1, &[]);
    let line = primary.wait_line("own port");
    let own_port: u16 = line.rsplit(' ').next().unwrap().parse().unwrap();
    let own = std::net::SocketAddr::from(([127, 0, 0, 1], own_port));
    let conns = [
        slow_request_on_a_kept_alive_connection(&mut primary, addr, "/slow"),
        slow_request_on_a_kept_alive_connection(&mut primary, own, "/slower"),
    ];
    let asked = Instant::now();
    primary.signal(Signal::TERM);
    for mut conn in conns {
        // The last chunk of the chunked body ends the response; the client then closes the
        // connection (else Node's keepAliveTimeout, 5 s, would end it).
        let reply = read_until(&mut conn, b"0\r\n\r\n");
        assert!(reply.starts_with("HTTP/1.1 200 OK\r\n"), "{reply}");
        assert!(
            reply.contains("first half,") && reply.contains(" second half\n"),
            "the whole response: {reply}"
        );
    }
    assert_exit(&mut primary, Duration::from_secs(30), 0);
    let took = asked.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "took {took:?} (the drain deadline's SIGTERM comes at 9.2 s): {:#?}",
        primary.output()
    );
}

/// A Node app whose `/slow` is never answered and whose `/spin` answers, then blocks its loop
/// for good (a busy loop); each request says `request in PATH` first.
const NODE_APP_STUCK: &str = r#"
const http = require('http');
http.createServer((q, r) => {
  console.log('request in', q.url);
  if (q.url === '/spin') { r.end('spinning\n'); setTimeout(() => { for (;;) {} }, 10); return; }
  if (q.url === '/slow') return;
  r.end('quick\n');
}).listen(+process.env.PORT, '127.0.0.1');
"#;

/// A `--node` worker still busy at its drain deadline (a request in flight; a loop blocked, with
/// a connection handed to it and never taken) is SIGTERMed, which cuts what it held: the stop
/// is a forced one (exit code 124), and the SIGTERM and the worker's death from it are logged
/// (WARN). A client of the cut request gets no response.
#[test]
fn with_node_a_worker_sigtermed_past_its_drain_deadline_makes_the_stop_exit_124() {
    use std::io::{Read, Write};
    if !have("node") {
        return;
    }
    for path in ["/slow", "/spin"] {
        let (_dir, addr, mut primary) = common::cluster::run_node_app(
            "node-stuck",
            NODE_APP_STUCK,
            1,
            &["--kill-timeout", "3"],
        );
        let mut conn = std::net::TcpStream::connect(addr).unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        conn.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
            .unwrap();
        primary.wait_line(&format!("request in {path}"));
        if path == "/spin" {
            read_until(&mut conn, b"spinning\n");
            // Its loop blocks 10 ms later; a connection made then is handed to the blocked
            // worker, never taken.
            std::thread::sleep(Duration::from_millis(300));
            conn = std::net::TcpStream::connect(addr).unwrap();
            conn.set_read_timeout(Some(Duration::from_secs(20)))
                .unwrap();
            conn.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                .unwrap();
        }
        primary.signal(Signal::TERM);
        let mut reply = Vec::new();
        let _ = conn.read_to_end(&mut reply);
        assert!(
            reply.is_empty(),
            "{path}: {}",
            String::from_utf8_lossy(&reply)
        );
        assert_exit(&mut primary, Duration::from_secs(20), 124);
        let line = primary.wait_line("past its deadline");
        assert!(
            line.contains("WARN") && line.ends_with(": SIGTERM"),
            "{line}"
        );
        let line = primary.wait_line("after its SIGTERM past the drain deadline");
        assert!(
            line.contains("WARN") && line.contains("killed by signal 15"),
            "{line}"
        );
    }
}

/// A worker writing junk to its channel (`--node`: 200 lines that are not JSON) costs a line or
/// two of the primary's log, not one or two per bad frame; and it still serves (is not stopped).
#[test]
fn a_worker_writing_junk_to_its_channel_is_one_line_then_counted() {
    const JUNK: u32 = 200;
    let mut primary = spawn(
        run_sh(
            ["--node", "-w", "1"],
            &format!(
                "i=0; while [ $i -lt {JUNK} ]; do echo 'not json' >&$NODE_CHANNEL_FD; \
                 i=$((i+1)); done; echo junk-written; exec sleep 30"
            ),
        )
        .env("RUST_LOG", "info"),
    );
    primary.wait_line("junk-written");
    // The primary reads what the worker wrote within a moment; give it a generous one.
    std::thread::sleep(Duration::from_secs(2));
    let lines = primary.output_so_far().to_vec();
    let about_junk: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("channel error") || l.contains("bad frame"))
        .collect();
    assert!(
        !about_junk.is_empty() && about_junk.len() <= 2,
        "{} lines about {JUNK} bad frames: {about_junk:#?}",
        about_junk.len()
    );
    assert!(primary.exited_within(Duration::ZERO).is_none());
    primary.signal(Signal::TERM);
    primary.wait_exit(Duration::from_secs(20));
}
