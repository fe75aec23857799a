//! The cluster through the `nodus` command: `serve --workers 2` (stats of the whole cluster,
//! `nodus top --once` showing both workers, metrics that carry the stats' figures), `run` with a plain program reading `LISTEN_FDS`
//! (Python), `run --node` with a stock Node app (HTTP, and UDP through `dgram`), a nodus worker
//! under a stock Node primary, `run`'s restart budget, and the notify protocol (watchdog pings
//! with nodus and with Node workers).
//!
//! Every process is started in its own process group and the whole group is killed by PID when
//! the test ends (workers die with their primary anyway: `PR_SET_PDEATHSIG`). Node and Python
//! are needed: under `CI` a missing one fails the test, elsewhere it is skipped.

mod common;

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use common::cluster::{count, events, run_node_app, run_sh, spawn, wait_events, wait_ready_pids};
use common::http::{get_ok, try_request};
use common::{NODUS, have};
use nodus_testkit::net::free_addr;
use nodus_testkit::proc::Proc;
use nodus_testkit::scrape::{self, family_type, find};
use nodus_testkit::tmp::TempDir;
use nodus_testkit::tree::gone;
use serde_json::Value;

/// `nodus serve --workers 2` on a free loopback port, serving a directory with `a.txt` in it;
/// returned once both workers are ready.
fn two_worker_serve(tag: &str) -> (TempDir, SocketAddr, Proc) {
    let dir = TempDir::new(tag);
    std::fs::write(dir.path().join("a.txt"), "hello cluster\n").unwrap();
    let addr = free_addr();
    let mut primary = spawn(
        Command::new(NODUS)
            .arg("serve")
            .arg(dir.path())
            .args(["--workers", "2", "--listen", &addr.to_string()])
            .env("RUST_LOG", "info"),
    );
    primary.wait_line("2 workers ready");
    (dir, addr, primary)
}

/// Under rr, two healthy workers under a steady load of new connections take them as they come:
/// hardly any connection waits in the primary (`connections_waited`), which is for a worker
/// whose loop is busy. Sixteen clients make a new connection per request for 1.5 s; at most 5 %
/// of the connections may have waited (a pipeline window of 2 ms, too short for a loaded
/// host's loop turns, parked about a quarter of them).
#[test]
fn rr_keeps_healthy_workers_under_load_fed_without_parking_connections() {
    let (_dir, addr, mut primary) = two_worker_serve("rr-steady");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients: Vec<_> = (0..16)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut answered = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let r = try_request(addr, "GET", "/a.txt", &["Connection: close"])
                        .unwrap_or_else(|e| panic!("GET /a.txt: {e}"));
                    assert_eq!(r.status, 200);
                    answered += 1;
                }
                answered
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let answered: u64 = clients.into_iter().map(|c| c.join().unwrap()).sum();
    let stats: Value = serde_json::from_str(&get_ok(addr, "/_nodus/stats")).unwrap();
    let waited = stats["connections_waited"]
        .as_u64()
        .expect("connections_waited");
    assert!(answered >= 100, "{answered} answered");
    assert!(
        waited * 20 <= answered,
        "{waited} of {answered} connections waited in the primary: {stats}"
    );
    let metrics = get_ok(addr, "/_nodus/metrics");
    assert!(
        find(&metrics, "nodus_cluster_connections_waited_total", &[]).is_some(),
        "{metrics}"
    );
    primary.signal(rustix::process::Signal::TERM);
    assert_eq!(primary.wait_exit(Duration::from_secs(30)), Some(0));
}

#[test]
fn serve_with_two_workers_shows_the_whole_cluster_in_stats_and_top() {
    let (_dir, addr, mut primary) = two_worker_serve("serve");
    // Without --admin, the workers answer /_nodus/ on the public listener (loopback clients)
    // and ask the primary for the whole cluster's figures.
    let admin_addr = addr;
    for _ in 0..10 {
        assert_eq!(get_ok(addr, "/a.txt"), "hello cluster\n");
    }
    // The primary answers for the whole cluster: both workers, each with its own snapshot.
    let stats: Value = serde_json::from_str(&get_ok(admin_addr, "/_nodus/stats")).unwrap();
    let workers = stats["workers"].as_array().unwrap();
    assert_eq!(workers.len(), 2, "{stats}");
    assert_eq!(stats["workers_up"], 2);
    assert_eq!(stats["policy"], "rr");
    let mut ids: Vec<u64> = workers
        .iter()
        .map(|w| w["worker"].as_u64().unwrap())
        .collect();
    ids.sort();
    assert_eq!(ids, [1, 2]);
    for w in workers {
        assert_eq!(
            w["snapshot"]["pid"], w["pid"],
            "each snapshot is its worker's own"
        );
    }
    let handed: u64 = workers
        .iter()
        .map(|w| w["connections_handed"].as_u64().unwrap())
        .sum();
    assert!(handed >= 10, "{stats}");
    let metrics = get_ok(admin_addr, "/_nodus/metrics");
    assert!(metrics.contains("nodus_cluster_workers_up 2"), "{metrics}");
    assert!(metrics.contains("worker=\"1\"") && metrics.contains("worker=\"2\""));
    // Without an OpenMetrics `Accept` (curl, promtool): the classic text format, whose counter
    // families are named after their `_total` samples.
    assert!(!metrics.contains("# EOF"), "{metrics}");
    assert!(
        metrics.contains(
            "# TYPE nodus_cluster_restarts_total counter\nnodus_cluster_restarts_total 0\n"
        ),
        "{metrics}"
    );
    // What Prometheus asks for: OpenMetrics.
    let om = try_request(
        admin_addr,
        "GET",
        "/_nodus/metrics",
        &["Accept: application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"],
    )
    .unwrap();
    assert!(
        om.header("content-type")
            .is_some_and(|t| t.starts_with("application/openmetrics-text")),
        "{:?}",
        om.headers
    );
    let om = String::from_utf8(om.body).unwrap();
    assert!(om.trim_end().ends_with("# EOF"), "{om}");
    assert!(
        om.contains("# TYPE nodus_cluster_restarts counter\n"),
        "{om}"
    );
    // Every family named after a unit (the workers' and the primary's: `_seconds`, `_bytes`)
    // has its `# UNIT` line.
    assert_eq!(
        nodus_testkit::scrape::unit_mistakes(&om),
        Vec::<String>::new(),
        "{om}"
    );
    assert!(
        om.contains("# UNIT nodus_cluster_worker_rss_bytes bytes\n"),
        "{om}"
    );
    // Per worker process: up, memory, handoffs in flight; per slot: restarts.
    for w in workers {
        let labels = format!("{{worker=\"{}\",pid=\"{}\"}}", w["worker"], w["pid"]);
        let value = |name: &str| {
            let line = format!("{name}{labels} ");
            metrics
                .lines()
                .find_map(|l| l.strip_prefix(&line))
                .unwrap_or_else(|| panic!("no {line}in\n{metrics}"))
                .parse::<f64>()
                .unwrap()
        };
        assert_eq!(value("nodus_cluster_worker_up"), 1.0);
        assert!(value("nodus_cluster_worker_rss_bytes") > 0.0);
        assert!(value("nodus_cluster_worker_handoffs_in_flight") >= 0.0);
        let restarts = format!(
            "nodus_cluster_worker_restarts_total{{worker=\"{}\"}} 0",
            w["worker"]
        );
        assert!(metrics.contains(&restarts), "no {restarts} in\n{metrics}");
    }

    // `nodus top --once` shows one row per worker.
    let out = Command::new(NODUS)
        .args(["top", "--once", &admin_addr.to_string()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    for w in workers {
        let pid = w["pid"].as_u64().unwrap().to_string();
        assert!(text.contains(&pid), "top shows worker pid {pid}:\n{text}");
    }

    // The handoff counter of each slot counts every generation: a reload does not reset it.
    let before = handed_total(&metrics);
    assert!(before >= 10, "{metrics}");
    primary.signal(rustix::process::Signal::HUP);
    primary.wait_line("reload done");
    // The old workers exit after "reload done" (they drain first): the last exit is theirs once
    // the reload says they have exited.
    primary.wait_line("the old workers have exited");
    let metrics = get_ok(admin_addr, "/_nodus/metrics");
    let after = handed_total(&metrics);
    assert!(
        after >= before,
        "the counter went down: {before} then {after}"
    );
    // The reload's last exit: the slot and the cause as labels (no pid: one series per cause),
    // the pid in the stats' line.
    let last = metrics
        .lines()
        .find(|l| l.starts_with("nodus_cluster_last_exit{"))
        .unwrap_or_else(|| panic!("no last exit in\n{metrics}"));
    assert!(
        last.ends_with(",reason=\"stopped as asked\"} 1") && !last.contains("pid"),
        "{last}"
    );
    let stats: Value = serde_json::from_str(&get_ok(admin_addr, "/_nodus/stats")).unwrap();
    let line = stats["last_exit"].as_str().unwrap();
    assert!(
        line.contains("(pid ") && line.ends_with("stopped as asked"),
        "{line}"
    );

    primary.signal(rustix::process::Signal::TERM);
    assert_eq!(primary.wait_exit(Duration::from_secs(30)), Some(0));
}

/// `GET /_nodus/metrics` as Prometheus asks for it: the OpenMetrics text.
fn openmetrics(addr: SocketAddr) -> String {
    let accept = "Accept: application/openmetrics-text;version=1.0.0";
    let r = try_request(addr, "GET", "/_nodus/metrics", &[accept]).unwrap();
    assert_eq!(r.status, 200);
    String::from_utf8(r.body).unwrap()
}

/// The figures of a cluster's stats that its metrics lacked, scraped: the primary's memory and
/// uptime and whether a reload is under way (no labels), each worker process's generation and
/// uptime, and each worker loop's run-queue lifetime maximum and wait, last interval's mean and
/// length, and slow-poll threshold (`worker` and `pid` labels), each family's type and each
/// value against the stats. The primary pulls its workers' snapshots at most once a second, so
/// when the stats before and after a scrape show the same snapshots, the scrape shows them too.
#[test]
fn serve_cluster_metrics_carry_the_figures_of_its_stats() {
    let (_dir, addr, mut primary) = two_worker_serve("metrics-json");
    for _ in 0..10 {
        assert_eq!(get_ok(addr, "/a.txt"), "hello cluster\n");
    }
    let stats = || -> Value { serde_json::from_str(&get_ok(addr, "/_nodus/stats")).unwrap() };
    let snapshots = |doc: &Value| -> Vec<Value> {
        let workers = doc["workers"].as_array().unwrap();
        workers
            .iter()
            .map(|w| w["snapshot"]["taken_at_unix_ms"].clone())
            .collect()
    };
    // The primary's memory may change a page between two requests: it too is read again until
    // the stats on both sides agree with the metrics.
    let rss = "nodus_cluster_primary_rss_bytes";
    assert_eq!(
        family_type(&openmetrics(addr), rss).as_deref(),
        Some("gauge")
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let (before, text, after) = loop {
        let (before, text, after) = (stats(), openmetrics(addr), stats());
        let scraped = find(&text, rss, &[]).map(|s| s.value);
        let same = snapshots(&before) == snapshots(&after)
            && snapshots(&before).iter().all(Value::is_u64)
            && before["primary"]["rss_bytes"] == after["primary"]["rss_bytes"]
            && scraped == before["primary"]["rss_bytes"].as_f64();
        if same {
            break (before, text, after);
        }
        assert!(
            Instant::now() < deadline,
            "the snapshots or the primary's memory kept changing ({rss} {scraped:?}):\n{before}\n{after}"
        );
    };
    let kind = |family: &str| family_type(&text, family);
    let one = |sample: &str, labels: &[(&str, &str)]| {
        find(&text, sample, labels)
            .unwrap_or_else(|| panic!("no {sample}{labels:?} in\n{text}"))
            .value
    };
    let num = |v: &Value| v.as_f64().unwrap();

    // The primary's own: no labels.
    assert_eq!(kind("nodus_cluster_reloading").as_deref(), Some("gauge"));
    assert_eq!(before["reloading"], false);
    assert_eq!(one("nodus_cluster_reloading", &[]), 0.0);
    assert_eq!(one(rss, &[]), num(&before["primary"]["rss_bytes"]));
    let uptime = "nodus_cluster_primary_uptime_seconds";
    assert_eq!(kind(uptime).as_deref(), Some("gauge"));
    let (from, to) = (
        &before["primary"]["uptime_seconds"],
        &after["primary"]["uptime_seconds"],
    );
    let up = one(uptime, &[]);
    assert!(
        num(from) <= up && up <= num(to),
        "{up} not within {from} and {to}"
    );

    let loop_figures = [
        (
            "nodus_run_queue_length_lifetime_max",
            "gauge",
            "",
            "/run_queue/max",
        ),
        (
            "nodus_run_queue_length_mean",
            "gauge",
            "",
            "/run_queue/interval_mean",
        ),
        (
            "nodus_run_queue_wait_seconds",
            "counter",
            "_total",
            "/run_queue/wait_seconds",
        ),
        (
            "nodus_loop_interval_seconds",
            "gauge",
            "",
            "/loop_stats/interval_seconds",
        ),
        (
            "nodus_loop_slow_poll_threshold_seconds",
            "gauge",
            "",
            "/loop_stats/slow_poll_threshold_seconds",
        ),
    ];
    let workers = before["workers"].as_array().unwrap();
    assert_eq!(workers.len(), 2, "{before}");
    for (w, w_after) in workers.iter().zip(after["workers"].as_array().unwrap()) {
        let (slot, pid) = (w["worker"].to_string(), w["pid"].to_string());
        let labels = [("worker", slot.as_str()), ("pid", pid.as_str())];
        let family = "nodus_cluster_worker_generation";
        assert_eq!(kind(family).as_deref(), Some("gauge"));
        assert_eq!(one(family, &labels), num(&w["generation"]));
        let family = "nodus_cluster_worker_uptime_seconds";
        assert_eq!(kind(family).as_deref(), Some("gauge"));
        let (from, to) = (&w["uptime_seconds"], &w_after["uptime_seconds"]);
        let up = one(family, &labels);
        assert!(
            num(from) <= up && up <= num(to),
            "{up} not within {from} and {to}"
        );
        for (family, type_, suffix, pointer) in loop_figures {
            assert_eq!(kind(family).as_deref(), Some(type_), "{family}");
            let got = one(&format!("{family}{suffix}"), &labels);
            let want = num(w["snapshot"].pointer(pointer).unwrap());
            assert_eq!(got, want, "{family} of worker {slot} against its {pointer}");
        }
        assert!(num(&w["snapshot"]["run_queue"]["max"]) >= 1.0, "{w}");
    }

    primary.signal(rustix::process::Signal::TERM);
    assert_eq!(primary.wait_exit(Duration::from_secs(30)), Some(0));
}

/// The primary's own loop (under rr every connection passes through it) is in the cluster's
/// metrics and stats as a worker's is, whichever process answers (the primary on `--admin`, a
/// worker on the public listener, which asks it over IPC): its loop series once each, labelled
/// `worker="primary"` and its pid, in the workers' families (one `# TYPE` each, no series twice),
/// and its snapshot the stats' `primary.snapshot`, outside `workers[]`, which still lists the two
/// workers alone, as `nodus top --once` does.
#[test]
fn serve_cluster_shows_the_primarys_own_loop_as_worker_primary() {
    let dir = TempDir::new("primary-loop");
    std::fs::write(dir.path().join("a.txt"), "hello cluster\n").unwrap();
    let (addr, admin) = (free_addr(), free_addr());
    let mut primary = spawn(
        Command::new(NODUS)
            .arg("serve")
            .arg(dir.path())
            .args(["--workers", "2", "--listen", &addr.to_string()])
            .args(["--admin", &admin.to_string(), "--admin-on-public", "on"])
            .env("RUST_LOG", "info"),
    );
    primary.wait_line("2 workers ready");
    for _ in 0..10 {
        assert_eq!(get_ok(addr, "/a.txt"), "hello cluster\n");
    }
    let pid = primary.id().to_string();
    let loop_samples = [
        "nodus_loop_iterations_total",
        "nodus_loop_busy_seconds_total",
        "nodus_loop_utilization",
        "nodus_task_schedule_delay_seconds_count",
        "nodus_loop_slow_polls_total",
        "nodus_stalls_recent",
        "nodus_timer_lateness_seconds_count",
        "nodus_process_resident_memory_bytes",
        "nodus_http_connections_accepted_total",
    ];
    for (who, at) in [("the primary", admin), ("a worker", addr)] {
        let stats: Value = serde_json::from_str(&get_ok(at, "/_nodus/stats")).unwrap();
        assert_eq!(stats["primary"]["pid"].to_string(), pid, "{who}: {stats}");
        let own = &stats["primary"]["snapshot"];
        assert_eq!(own["pid"].to_string(), pid, "{who}: {stats}");
        assert!(
            own["loop_stats"]["iterations"].as_u64() > Some(0),
            "{who}: {own}"
        );
        let workers = stats["workers"].as_array().unwrap();
        assert_eq!(workers.len(), 2, "{who}: {stats}");
        assert_eq!(stats["workers_up"], 2, "{who}: {stats}");
        assert!(
            workers.iter().all(|w| w["worker"].is_u64()),
            "{who}: {stats}"
        );

        let text = openmetrics(at);
        let mut seen = std::collections::HashSet::new();
        let twice: Vec<&str> = text
            .lines()
            .filter(|l| !l.is_empty() && (l.starts_with("# TYPE ") || !l.starts_with('#')))
            .map(|l| l.rsplit_once(' ').map_or(l, |(head, _)| head))
            .filter(|head| !seen.insert(*head))
            .collect();
        assert_eq!(twice, Vec::<&str>::new(), "{who}: written twice in\n{text}");
        assert_eq!(scrape::unit_mistakes(&text), Vec::<String>::new(), "{who}");
        for sample in loop_samples {
            let all = scrape::series(&text, sample);
            let labels = |s: &scrape::Series| s.labels.iter().find(|(k, _)| k == "worker").cloned();
            let ours: Vec<_> = all
                .iter()
                .filter(|s| labels(s).is_some_and(|(_, v)| v == "primary"))
                .collect();
            assert_eq!(ours.len(), 1, "{who}: {sample} of the primary in\n{text}");
            assert_eq!(
                ours[0].labels,
                [
                    ("worker".into(), "primary".into()),
                    ("pid".into(), pid.clone())
                ],
                "{who}: {sample}"
            );
            assert!(ours[0].value >= 0.0, "{who}: {sample} {}", ours[0].value);
            // The workers' own: one each, numbered.
            let mut slots: Vec<String> = all
                .iter()
                .filter_map(|s| labels(s).map(|(_, v)| v))
                .filter(|v| v != "primary")
                .collect();
            slots.sort();
            assert_eq!(slots, ["1", "2"], "{who}: {sample} in\n{text}");
        }
        let iterations = find(
            &text,
            "nodus_loop_iterations_total",
            &[("worker", "primary"), ("pid", &pid)],
        );
        assert!(iterations.is_some_and(|s| s.value > 0.0), "{who}");
    }
    // The admin server runs on the primary's loop: its HTTP figures are the primary's.
    let accepted = find(
        &openmetrics(admin),
        "nodus_http_connections_accepted_total",
        &[("worker", "primary"), ("pid", &pid)],
    );
    assert!(
        accepted.as_ref().is_some_and(|s| s.value >= 1.0),
        "{accepted:?}"
    );

    // `nodus top --once` still counts two workers, with no row of the primary's.
    let out = Command::new(NODUS)
        .args(["top", "--once", &admin.to_string()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains(" 2 workers "), "{text}");
    assert!(
        !text.lines().any(|l| l.starts_with(&format!("{pid} "))),
        "{text}"
    );

    primary.signal(rustix::process::Signal::TERM);
    assert_eq!(primary.wait_exit(Duration::from_secs(30)), Some(0));
}

/// The `(slot, pid, connections handed)` of each worker in a cluster's stats.
fn worker_rows(stats: &Value) -> Vec<(u64, u64, u64)> {
    let rows = stats["workers"].as_array().unwrap().iter();
    let field = |w: &Value, name: &str| w[name].as_u64().unwrap();
    rows.map(|w| {
        let handed = field(w, "connections_handed");
        (field(w, "worker"), field(w, "pid"), handed)
    })
    .collect()
}

/// A SIGHUP sent to a worker itself (`kill -HUP` on every nodus pid, a PM2 habit) is not a
/// reload and costs none: the worker says where a reload is asked for (the primary's pid) and
/// serves on as the same process, the primary restarts nothing, and the stop paths are intact
/// (SIGTERM to the primary drains it and exits 0).
#[test]
fn a_sighup_sent_to_a_serve_worker_itself_neither_stops_nor_restarts_it() {
    let (_dir, addr, mut primary) = two_worker_serve("serve-worker-hup");
    let stats: Value = serde_json::from_str(&get_ok(addr, "/_nodus/stats")).unwrap();
    let (slot, victim, handed) = worker_rows(&stats)[0];

    let pid = rustix::process::Pid::from_raw(victim as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::HUP).unwrap();
    let line = primary.wait_line("ignored a SIGHUP");
    assert!(
        line.contains(&format!("worker {slot} "))
            && line.contains(&format!("kill -HUP {}", primary.id())),
        "{line}"
    );
    // Killed by it, the worker would be gone (and replaced) well within this.
    std::thread::sleep(Duration::from_millis(500));
    assert!(!gone(victim as i32), "{:#?}", primary.output());
    for _ in 0..20 {
        assert_eq!(get_ok(addr, "/a.txt"), "hello cluster\n");
    }
    let stats: Value = serde_json::from_str(&get_ok(addr, "/_nodus/stats")).unwrap();
    assert_eq!(stats["restarts"], 0, "{stats}");
    let rows = worker_rows(&stats);
    assert!(
        rows.iter()
            .any(|&(s, p, h)| (s, p) == (slot, victim) && h > handed),
        "the same process still serves as worker {slot}: {rows:?}"
    );
    // No exit line (`worker 1 (pid N) ...`) since the SIGHUP's.
    let exit_line = format!("(pid {victim})");
    let since: Vec<String> = primary.lines.try_iter().collect();
    assert!(!since.iter().any(|l| l.contains(&exit_line)), "{since:#?}");

    primary.signal(rustix::process::Signal::TERM);
    assert_eq!(primary.wait_exit(Duration::from_secs(30)), Some(0));
}

/// A worker of `nodus serve --workers N` runs its generation's pinned binary through
/// `/proc/self/fd/FD`, which names the process `FD` (`/proc/PID/comm`: what `ps`, `top`,
/// `pgrep -x` and `pidof` read); it takes its binary's name back, after a reload too. They
/// were `100` and `101` (found by bench/soak/soak.py, in `ps --ppid PRIMARY`).
#[test]
fn serve_workers_bear_their_binarys_name_not_the_pinned_fds_number() {
    let (_dir, _addr, mut primary) = two_worker_serve("serve-comm");
    let name = std::path::Path::new(NODUS)
        .file_name()
        .unwrap()
        .as_encoded_bytes();
    let primary_pid = primary.id();
    let workers = || -> Vec<i32> {
        nodus_testkit::tree::children(primary_pid)
            .into_iter()
            .filter(|&p| !nodus_testkit::tree::is_named(p, b"nodus-guard"))
            .collect()
    };
    let named = |pids: &[i32]| -> Vec<String> {
        pids.iter()
            .map(|p| std::fs::read_to_string(format!("/proc/{p}/comm")).unwrap_or_default())
            .collect()
    };
    let first = workers();
    assert_eq!(first.len(), 2, "{first:?}");
    assert!(
        first
            .iter()
            .all(|&p| nodus_testkit::tree::is_named(p, name)),
        "{:?}",
        named(&first)
    );
    primary.signal(rustix::process::Signal::HUP);
    primary.wait_line("the old workers have exited");
    let second = workers();
    assert!(
        second.len() == 2 && second.iter().all(|p| !first.contains(p)),
        "{first:?} then {second:?}"
    );
    assert!(
        second
            .iter()
            .all(|&p| nodus_testkit::tree::is_named(p, name)),
        "{:?}",
        named(&second)
    );
    primary.signal(rustix::process::Signal::TERM);
    assert_eq!(primary.wait_exit(Duration::from_secs(30)), Some(0));
}

/// The sum over slots of `nodus_cluster_connections_handed_total`.
fn handed_total(metrics: &str) -> u64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("nodus_cluster_connections_handed_total{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum()
}

/// A Python HTTP server that takes its socket the systemd way and checks `LISTEN_PID`.
const PY_SERVER: &str = r#"
import os, socket, sys
assert os.environ["LISTEN_PID"] == str(os.getpid()), "LISTEN_PID is not my pid"
assert os.environ["LISTEN_FDS"] == "1"
assert "NODE_UNIQUE_ID" not in os.environ, "a plain program is no cluster worker"
s = socket.socket(fileno=3)
n = os.environ.get("NOTIFY_SOCKET")
if n:
    u = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    u.sendto(b"READY=1", "\0" + n[1:] if n.startswith("@") else n)
print("python worker", os.environ["NODUS_WORKER_ID"], "up", flush=True)
while True:
    c, _ = s.accept()
    c.recv(65536)
    b = ("pid %d worker %s" % (os.getpid(), os.environ["NODUS_WORKER_ID"])).encode()
    c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(b), b))
    c.close()
"#;

#[test]
fn run_passes_listeners_the_systemd_way_to_a_plain_program() {
    if !have("python3") {
        return;
    }
    let dir = TempDir::new("run-py");
    let script = dir.path().join("server.py");
    std::fs::write(&script, PY_SERVER).unwrap();
    let log = dir.path().join("events.jsonl");
    let addr = free_addr();
    let mut primary = spawn(
        Command::new(NODUS)
            .args(["run", "-w", "2", "-l", &addr.to_string()])
            .arg("--events")
            .arg(&log)
            .args(["--", "python3"])
            .arg(&script)
            .env("RUST_LOG", "info"),
    );
    // Output is captured with a worker prefix.
    let line = primary.wait_line("python worker");
    assert!(line.starts_with("[worker "), "{line}");
    primary.wait_line("2 workers ready");
    let mut pids = std::collections::HashSet::new();
    for _ in 0..30 {
        let text = get_ok(addr, "/");
        pids.insert(text.split_whitespace().nth(1).unwrap().to_owned());
    }
    assert!(!pids.is_empty());
    // The events file is written by its own thread, so it may lag the line.
    let evs = wait_events(&log, |e| count(e, "ready") == 2);
    assert_eq!(
        count(&evs, "ready"),
        2,
        "both workers said READY=1 or stayed up"
    );
    primary.signal(rustix::process::Signal::TERM);
    assert_eq!(primary.wait_exit(Duration::from_secs(30)), Some(0));
}

/// A stock Node program that takes its socket the systemd way (`listen({ fd: 3 })`, as the deploy
/// files show). Node takes a process with `NODE_UNIQUE_ID` for a cluster worker and asks a primary
/// for the listener, so a plain program must not get it.
#[test]
fn run_passes_listeners_to_a_node_program_without_making_it_a_cluster_worker() {
    if !have("node") {
        return;
    }
    let addr = free_addr();
    let program = "require('http').createServer((q, s) => \
                   s.end('fd3 worker ' + require('cluster').isWorker)).listen({ fd: 3 })";
    let mut primary = spawn(
        Command::new(NODUS)
            .args(["run", "-w", "2", "-l", &addr.to_string()])
            .args(["--", "node", "-e", program])
            .env("RUST_LOG", "info"),
    );
    primary.wait_line("2 workers ready");
    for _ in 0..5 {
        assert_eq!(get_ok(addr, "/"), "fd3 worker false");
    }
    primary.signal(rustix::process::Signal::TERM);
    assert_eq!(primary.wait_exit(Duration::from_secs(30)), Some(0));
}

#[test]
fn run_with_admin_serves_the_clusters_endpoints_and_top_watches_it() {
    let admin = free_addr();
    let mut primary = spawn(
        run_sh(["-w", "2", "--admin", &admin.to_string()], "exec sleep 30").env("RUST_LOG", "info"),
    );
    primary.wait_line("2 workers ready");
    assert_eq!(get_ok(admin, "/_nodus/readyz"), "ready\n");
    let stats: Value = serde_json::from_str(&get_ok(admin, "/_nodus/stats")).unwrap();
    assert_eq!(stats["workers_up"], 2, "{stats}");
    let pids: Vec<String> = stats["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["pid"].as_u64().unwrap().to_string())
        .collect();
    assert_eq!(pids.len(), 2, "{stats}");
    let metrics = get_ok(admin, "/_nodus/metrics");
    assert!(metrics.contains("nodus_cluster_workers_up 2"), "{metrics}");
    let out = Command::new(NODUS)
        .args(["top", "--once", &admin.to_string()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    for pid in &pids {
        let row = text
            .lines()
            .find(|l| l.starts_with(pid.as_str()))
            .unwrap_or_else(|| panic!("top shows worker pid {pid}:\n{text}"));
        let uptime = row.split_whitespace().nth(1).unwrap();
        assert_ne!(
            uptime, "–",
            "the primary's uptime stands in for the snapshot's: {row}"
        );
    }
    primary.signal(rustix::process::Signal::TERM);
    assert_eq!(primary.wait_exit(Duration::from_secs(30)), Some(0));
}

#[test]
fn run_gives_up_on_a_program_that_exits_at_once() {
    let options = [
        "-w",
        "1",
        "--max-restarts",
        "3",
        "--restart-window",
        "30",
        "--backoff",
        "0.01,2,0.1",
    ];
    let mut primary = spawn(run_sh(options, "exit 3").env("RUST_LOG", "info"));
    assert_eq!(
        primary.wait_exit(Duration::from_secs(30)),
        Some(75),
        "the give-up exit code"
    );
    let lines = primary.output();
    let giving_up: Vec<&String> = lines.iter().filter(|l| l.contains("giving up")).collect();
    assert_eq!(giving_up.len(), 1, "one clear line: {lines:#?}");
    let crashes = lines
        .iter()
        .filter(|l| l.contains("exited with code 3") && !l.contains("giving up"))
        .count();
    assert_eq!(
        crashes, 4,
        "the first start and 3 restarts, never more: {lines:#?}"
    );
}

#[test]
fn run_refuses_an_address_given_twice() {
    let addr = free_addr().to_string();
    let out = Command::new(NODUS)
        .args(["run", "-l", &addr, "-l", &addr, "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        format!("nodus run: -l {addr} is given twice")
    );
}

#[test]
fn run_refuses_handoff_policies_for_plain_programs() {
    let out = Command::new(NODUS)
        .args(["run", "--policy", "rr", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("needs --node"));
}

const NODE_APP: &str = r#"
const http = require('http');
const cluster = require('cluster');
http.createServer((req, res) => {
  res.end(`pid ${process.pid} worker ${process.env.NODUS_WORKER_ID} isWorker ${cluster.isWorker}`);
}).listen(+process.env.PORT, '127.0.0.1');
"#;

#[test]
fn run_node_makes_nodus_the_primary_of_a_stock_node_app() {
    if !have("node") {
        return;
    }
    let dir = TempDir::new("run-node");
    std::fs::write(dir.path().join("app.js"), NODE_APP).unwrap();
    let log = dir.path().join("events.jsonl");
    let addr = free_addr();
    let mut primary = spawn(
        Command::new(NODUS)
            .args(["run", "--node", "-w", "2", "--events"])
            .arg(&log)
            .args(["--", "node"])
            .arg(dir.path().join("app.js"))
            .env("PORT", addr.port().to_string())
            .env("RUST_LOG", "info"),
    );
    primary.wait_line("2 workers ready");
    let mut workers = std::collections::HashSet::new();
    for _ in 0..20 {
        let text = get_ok(addr, "/");
        assert!(text.ends_with("isWorker true"), "{text}");
        workers.insert(text.split_whitespace().nth(3).unwrap().to_owned());
    }
    assert_eq!(
        workers.len(),
        2,
        "round-robin reaches both Node workers: {workers:?}"
    );
    // Rolling reload of the Node workers.
    primary.signal(rustix::process::Signal::HUP);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !events(&log).iter().any(|e| e["event"] == "reload_done") {
        assert!(
            Instant::now() < deadline,
            "no reload_done: {:#?}",
            events(&log)
        );
        assert_eq!(
            try_request(addr, "GET", "/", &[]).map(|r| r.status).ok(),
            Some(200)
        );
    }
    primary.signal(rustix::process::Signal::TERM);
    assert_eq!(primary.wait_exit(Duration::from_secs(30)), Some(0));
}

/// A Node app that a timer keeps alive after its `disconnect`, and that ends on SIGTERM.
const NODE_APP_WITH_A_TIMER: &str = r#"
require('http').createServer((q, s) => s.end('ok')).listen(+process.env.PORT, '127.0.0.1');
setInterval(() => {}, 1000);
process.on('SIGTERM', () => { console.log('SIGTERM handler ran'); process.exit(0); });
"#;

#[test]
fn a_node_worker_kept_alive_by_a_timer_gets_sigterm_not_sigkill() {
    if !have("node") {
        return;
    }
    let (_dir, addr, mut primary) = run_node_app(
        "run-node-timer",
        NODE_APP_WITH_A_TIMER,
        1,
        &["--kill-timeout", "3"],
    );
    assert_eq!(get_ok(addr, "/"), "ok");
    primary.signal(rustix::process::Signal::TERM);
    assert_eq!(
        primary.wait_exit(Duration::from_secs(20)),
        Some(0),
        "a stop the worker's SIGTERM handler ended is not a forced one: {:#?}",
        primary.output()
    );
    let out = primary.output();
    assert!(
        out.iter().any(|l| l.ends_with("] SIGTERM handler ran")),
        "{out:#?}"
    );
    assert!(!out.iter().any(|l| l.ends_with(": SIGKILL")), "{out:#?}");
    // The last line but the watchdog's and slow polls': on a loaded machine a stall may end
    // after the stop.
    let last = out
        .iter()
        .rev()
        .find(|l| !l.contains("nodus::watchdog") && !l.contains("nodus::slow_poll"));
    assert!(
        last.is_some_and(|l| l.ends_with("every worker has stopped: exit code 0")),
        "the stop's end is logged: {out:#?}"
    );
}

/// A Node app that answers UDP datagrams with its worker id (`dgram` in a cluster worker).
const NODE_UDP_APP: &str = r#"
const s = require('dgram').createSocket('udp4');
s.on('message', (m, r) => s.send(`${m} from ${process.env.NODUS_WORKER_ID}`, r.port, r.address));
s.bind(+process.env.PORT, '127.0.0.1', () => console.log('udp bound', s.address().port));
"#;

#[test]
fn run_node_shares_one_udp_socket_with_every_worker_as_nodes_primary_does() {
    if !have("node") {
        return;
    }
    // Before: the primary answered a `udp4` queryServer as a TCP one (under rr, with no
    // handle), and Node's worker crashed in `dgram` (`recvStart is not a function`).
    let (_dir, addr, mut primary) = run_node_app("run-node-udp", NODE_UDP_APP, 2, &[]);
    let client = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    for i in 0..4 {
        client.send_to(format!("ping{i}").as_bytes(), addr).unwrap();
        let mut buf = [0; 64];
        let (n, _) = client
            .recv_from(&mut buf)
            .unwrap_or_else(|e| panic!("no answer to ping{i} ({e}): {:#?}", primary.output()));
        let text = std::str::from_utf8(&buf[..n]).unwrap();
        assert!(text.starts_with(&format!("ping{i} from ")), "{text}");
    }
    let bound = |out: &[String]| out.iter().filter(|l| l.contains("] udp bound")).count();
    primary.wait_line("] udp bound");
    primary.signal(rustix::process::Signal::TERM);
    assert_eq!(primary.wait_exit(Duration::from_secs(30)), Some(0));
    let out = primary.output();
    assert_eq!(bound(out), 2, "both workers bound the port: {out:#?}");
    assert!(
        !out.iter().any(|l| l.contains("exited with code")),
        "{out:#?}"
    );
}

/// A Node worker that never listens (a queue consumer): it never sends `listening`.
const NODE_APP_THAT_NEVER_LISTENS: &str = r#"
console.log('consuming');
const timer = setInterval(() => {}, 1000);
process.on('disconnect', () => clearInterval(timer));
"#;

#[test]
fn run_node_with_ready_after_counts_a_worker_that_never_listens_as_ready() {
    if !have("node") {
        return;
    }
    // Before: `--ready-after` was ignored under `--node`, so such a worker was never ready: no
    // "workers ready" (nor READY=1 to systemd), and every reload failed at the ready timeout.
    let (_dir, _addr, mut primary) = run_node_app(
        "run-node-never-listens",
        NODE_APP_THAT_NEVER_LISTENS,
        2,
        &["--ready-after", "0.2", "--ready-timeout", "20"],
    );
    primary.signal(rustix::process::Signal::HUP);
    primary.wait_line("reload done: generation 1 serving");
    primary.signal(rustix::process::Signal::TERM);
    assert_eq!(primary.wait_exit(Duration::from_secs(30)), Some(0));
    let out = primary.output();
    assert!(!out.iter().any(|l| l.contains("not ready")), "{out:#?}");
}

/// Worker 1 fills its fd table once it listens: every connection handed to it is NACKed.
const NODE_APP_AT_FD_LIMIT: &str = r#"
const http = require('http');
const fs = require('fs');
http.createServer((req, res) => res.end(`worker ${process.env.NODUS_WORKER_ID}`))
  .listen(+process.env.PORT, '127.0.0.1', () => {
    if (process.env.NODUS_WORKER_ID !== '1') return;
    const held = [];
    try { for (;;) held.push(fs.openSync('/dev/null', 'r')); } catch (e) {
      console.log(`worker 1 holds ${held.length} fds: ${e.code}`);
    }
  });
"#;

#[test]
fn a_connection_a_node_worker_cannot_receive_goes_to_another_worker() {
    if !have("node") {
        return;
    }
    let dir = TempDir::new("run-node-emfile");
    std::fs::write(dir.path().join("app.js"), NODE_APP_AT_FD_LIMIT).unwrap();
    let addr = free_addr();
    // A low limit keeps filling the table quick.
    let mut primary = spawn(
        run_sh(["--node", "-w", "2"], "ulimit -n 256 && exec node \"$0\"")
            .arg(dir.path().join("app.js"))
            .env("PORT", addr.port().to_string())
            .env("RUST_LOG", "info,nodus::cluster=debug"),
    );
    primary.wait_line("2 workers ready");
    primary.wait_line("worker 1 holds");
    // Spaced past the 100 ms a worker that refused gets nothing, so worker 1 is tried again.
    for i in 0..12 {
        let reply = try_request(addr, "GET", "/", &[])
            .unwrap_or_else(|e| panic!("request {i}: {e}: {:#?}", primary.output()));
        assert_eq!(
            String::from_utf8(reply.body).unwrap(),
            "worker 2",
            "request {i}"
        );
        std::thread::sleep(Duration::from_millis(150));
    }
    primary.wait_line("could not receive a connection");
    primary.signal(rustix::process::Signal::TERM);
    assert_eq!(primary.wait_exit(Duration::from_secs(30)), Some(0));
    // Every connection worker 1 could not receive was refused (DEBUG), and said once (WARN,
    // then counted: one line per 10 s).
    let out = primary.output();
    let said = |needle: &str| out.iter().filter(|l| l.contains(needle)).count();
    assert!(said("worker 1 refused 1 connection") >= 2, "{out:#?}");
    assert_eq!(said("could not receive a connection"), 1, "{out:#?}");
}

/// A stock Node primary forking `nodus serve` as its cluster worker.
const NODE_PRIMARY: &str = r#"
const cluster = require('cluster');
const [nodus, dir, port] = process.argv.slice(2);
process.execPath = nodus;   // cluster has no execPath setting: fork runs execPath [exec, ...args]
cluster.setupPrimary({ exec: 'serve', args: [dir, '--listen', `127.0.0.1:${port}`] });
const w = cluster.fork();
w.on('listening', (addr) => console.log(`worker listening ${addr.port}`));
w.on('online', () => console.log(`worker pid ${w.process.pid}`));
w.on('exit', (code, signal) => console.log(`worker exit ${code} ${signal}`));
process.on('SIGTERM', () => { w.disconnect(); });
"#;

/// `NODE_PRIMARY` in a new directory (which its worker serves), with its worker listening; the
/// directory, the worker's address and pid, and the primary.
fn node_primary_with_a_nodus_worker(name: &str) -> (TempDir, SocketAddr, i32, Proc) {
    let dir = TempDir::new(name);
    std::fs::write(dir.path().join("primary.js"), NODE_PRIMARY).unwrap();
    let addr = free_addr();
    let mut primary = spawn(
        Command::new("node")
            .arg(dir.path().join("primary.js"))
            .arg(NODUS)
            .arg(dir.path())
            .arg(addr.port().to_string()),
    );
    let line = primary.wait_line("worker pid ");
    let worker = line.rsplit(' ').next().unwrap().parse().unwrap();
    primary.wait_line(&format!("worker listening {}", addr.port()));
    (dir, addr, worker, primary)
}

#[test]
fn a_nodus_worker_joins_a_stock_node_primary() {
    if !have("node") {
        return;
    }
    let (dir, addr, _, mut primary) = node_primary_with_a_nodus_worker("node-primary");
    std::fs::write(dir.path().join("a.txt"), "from a nodus worker\n").unwrap();
    for _ in 0..10 {
        assert_eq!(get_ok(addr, "/a.txt"), "from a nodus worker\n");
    }
    // A Node primary keeps no cluster stats: the worker answers with its own at once rather than
    // asking a primary that never answers (10 s).
    let asked = Instant::now();
    let stats: Value = serde_json::from_str(&get_ok(addr, "/_nodus/stats")).unwrap();
    assert!(stats.is_object(), "{stats}");
    assert!(
        get_ok(addr, "/_nodus/metrics").contains("# TYPE nodus_loop_busy_seconds_total counter")
    );
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "waited {:?} for a Node primary",
        asked.elapsed()
    );
    // Node's primary-side disconnect drains the nodus worker, which exits 0.
    primary.signal(rustix::process::Signal::TERM);
    let line = primary.wait_line("worker exit");
    assert_eq!(line, "worker exit 0 null");
}

/// A nodus worker stopped directly says goodbye to its primary and waits for the answer; a primary
/// that is gone by then must not keep it waiting (it waited 10 s).
#[test]
fn a_nodus_worker_stopped_as_its_node_primary_dies_exits_at_once() {
    if !have("node") {
        return;
    }
    let (_dir, _, worker, primary) = node_primary_with_a_nodus_worker("node-primary-gone");
    // The primary cannot answer the goodbye: frozen, then killed.
    primary.signal(rustix::process::Signal::STOP);
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(worker).unwrap(),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    primary.signal(rustix::process::Signal::KILL);
    let killed = Instant::now();
    while !gone(worker) {
        assert!(
            killed.elapsed() < Duration::from_secs(5),
            "the worker still waits for a primary that is gone"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_primary_speaks_the_notify_protocol_with_watchdog_pings() {
    let dir = TempDir::new("notify");
    let sock = dir.path().join("notify.sock");
    let manager = std::os::unix::net::UnixDatagram::bind(&sock).unwrap();
    manager
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut primary = spawn(
        Command::new(NODUS)
            .arg("serve")
            .arg(dir.path())
            .args(["--workers", "2", "--listen", "127.0.0.1:0"])
            .env("NOTIFY_SOCKET", &sock)
            .env("WATCHDOG_USEC", "400000"),
    );
    let mut heard = Vec::new();
    let mut buf = [0u8; 512];
    let mut next = |heard: &mut Vec<String>| {
        let n = common::recv_datagram(&manager, &mut buf).expect("a notification within 20 s");
        let text = String::from_utf8_lossy(&buf[..n]).into_owned();
        heard.push(text.clone());
        text
    };
    while !next(&mut heard).contains("READY=1") {}
    // Pings come every 200 ms while both worker loops answer.
    let mut pings = 0;
    while pings < 3 {
        if next(&mut heard).contains("WATCHDOG=1") {
            pings += 1;
        }
    }
    primary.signal(rustix::process::Signal::HUP);
    while !next(&mut heard).contains("RELOADING=1") {}
    while !next(&mut heard).contains("READY=1") {}
    primary.signal(rustix::process::Signal::TERM);
    while !next(&mut heard).contains("STOPPING=1") {}
    assert_eq!(
        primary.wait_exit(Duration::from_secs(30)),
        Some(0),
        "{heard:?}"
    );
}

/// Node workers have no loop the primary can ask (they never answer a snapshot request): they
/// do not hold the watchdog pings back.
#[test]
fn node_workers_do_not_hold_back_the_watchdog_pings() {
    if !have("node") {
        return;
    }
    let dir = TempDir::new("notify-node");
    let sock = dir.path().join("notify.sock");
    let manager = std::os::unix::net::UnixDatagram::bind(&sock).unwrap();
    manager
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let app = dir.path().join("app.js");
    std::fs::write(
        &app,
        "require('http').createServer((q, s) => s.end('ok')).listen(+process.env.PORT);",
    )
    .unwrap();
    let addr = free_addr();
    let mut primary = spawn(
        Command::new(NODUS)
            .args(["run", "--node", "-w", "2", "--", "node"])
            .arg(&app)
            .env("PORT", addr.port().to_string())
            .env("NOTIFY_SOCKET", &sock)
            .env("WATCHDOG_USEC", "400000"),
    );
    let mut buf = [0u8; 512];
    let mut heard = Vec::new();
    let mut pings = 0;
    while pings < 3 {
        let n = common::recv_datagram(&manager, &mut buf)
            .unwrap_or_else(|e| panic!("no notification within 20 s ({e}): {heard:?}"));
        let text = String::from_utf8_lossy(&buf[..n]).into_owned();
        pings += usize::from(text.contains("WATCHDOG=1"));
        heard.push(text);
    }
    primary.signal(rustix::process::Signal::TERM);
    assert_eq!(primary.wait_exit(Duration::from_secs(30)), Some(0));
}

#[test]
fn run_under_systemd_socket_activation_passes_the_inherited_socket_on() {
    if !have("python3") || !have("systemd-socket-activate") {
        return;
    }
    let dir = TempDir::new("run-activate");
    let script = dir.path().join("server.py");
    std::fs::write(&script, PY_SERVER).unwrap();
    let addr = free_addr();
    let mut activated = spawn(
        Command::new("systemd-socket-activate")
            .args(["-l", &addr.to_string(), "--fdname=http"])
            .args([NODUS, "run", "-w", "2", "--", "python3"])
            .arg(&script)
            .env("RUST_LOG", "info"),
    );
    // The first connection starts nodus, which hands the socket on to both Python workers
    // (each checks that LISTEN_PID is its own pid).
    let mut workers = std::collections::HashSet::new();
    for _ in 0..40 {
        let text = get_ok(addr, "/");
        workers.insert(text.split_whitespace().nth(3).unwrap().to_owned());
    }
    assert!(!workers.is_empty());
    activated.wait_line("2 workers ready");
    activated.signal(rustix::process::Signal::TERM);
    assert_eq!(activated.wait_exit(Duration::from_secs(30)), Some(0));
}

/// `LISTEN_*` variables `nodus run` inherited for another process (`LISTEN_PID` not its pid: a
/// socket-activated parent that did not `exec` it) never reach a worker, plain program or Node
/// one, made to look like its own; with `-l`, a plain program sees only the cluster's listener.
#[test]
fn run_gives_workers_no_listen_variables_meant_for_another_process() {
    const SAYS: &str =
        "echo \"vars [${LISTEN_FDS-unset} ${LISTEN_PID-unset} ${LISTEN_FDNAMES-unset}] $$\"";
    let addr = free_addr().to_string();
    for options in [
        &["-w", "1"][..],
        &["-w", "1", "--node"],
        &["-w", "1", "-l", &addr],
    ] {
        let mut primary = spawn(
            run_sh(options.iter().chain(&["--restart", "temporary"]), SAYS)
                .env("LISTEN_FDS", "2")
                .env("LISTEN_PID", "1")
                .env("LISTEN_FDNAMES", "a:b"),
        );
        common::cluster::assert_exit(&mut primary, Duration::from_secs(20), 0);
        let line = primary.wait_line("vars [");
        let pid = line.rsplit(' ').next().unwrap();
        let expected = if options.contains(&"-l") {
            format!("vars [1 {pid} listen0] {pid}")
        } else {
            format!("vars [unset unset unset] {pid}")
        };
        assert!(line.ends_with(&expected), "{options:?}: {line}");
    }
}

/// How many fds process `pid` holds.
fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// One request per connection, from `threads` clients at once, until `stop`: what keeps a
/// primary under `ulimit -n 64` at its open-files limit.
fn flood(
    addr: SocketAddr,
    threads: usize,
    stop: &std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Vec<std::thread::JoinHandle<()>> {
    use std::io::{Read, Write};
    use std::sync::atomic::Ordering;
    (0..threads)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let Ok(mut s) =
                        std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1))
                    else {
                        continue;
                    };
                    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                    let _ = s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
                    let _ = s.read_to_end(&mut Vec::new());
                }
            })
        })
        .collect()
}

/// Waits (20 s at most) until the flood has taken `primary_pid` to its open-files limit of 64:
/// 60 fds or more open.
fn wait_at_limit(primary_pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while fd_count(primary_pid) < 60 {
        assert!(
            Instant::now() < deadline,
            "the flood never took the primary to its limit"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A primary whose open-files limit is too low for a whole fd reserve once its workers run
/// (`ulimit -n 40`) keeps half of what it can take and serves with the rest: the public listener
/// and the admin listener answer (it accepted nothing, ever, waiting for a reserve it could never
/// fill), and a WARN line says how much it keeps.
#[test]
fn a_primary_whose_limit_cannot_hold_its_whole_fd_reserve_still_serves() {
    let dir = TempDir::new("fd-limit-tiny");
    std::fs::write(dir.path().join("a.txt"), "hello cluster\n").unwrap();
    let (addr, admin) = (free_addr(), free_addr());
    let mut primary = spawn(
        Command::new("sh")
            .args(["-c", "ulimit -n 40 && exec \"$0\" \"$@\"", NODUS, "serve"])
            .arg(dir.path())
            .args(["--listen", &addr.to_string(), "--workers", "2"])
            .args(["--admin", &admin.to_string()])
            .env("RUST_LOG", "info"),
    );
    primary.wait_line("2 workers ready");
    assert_eq!(get_ok(addr, "/a.txt"), "hello cluster\n");
    assert_eq!(get_ok(admin, "/_nodus/readyz").trim(), "ready");
    let warned = primary
        .output_so_far()
        .iter()
        .filter(|l| l.contains("for the 16 it keeps for its own spawns: it keeps "))
        .count();
    assert!(warned >= 1, "{:#?}", primary.output_so_far());
    primary.signal(rustix::process::Signal::TERM);
    assert_eq!(primary.wait_exit(Duration::from_secs(20)), Some(0));
}

/// Workers fed by the primary under a low open-files limit (`ulimit -n 128`) keep the fds their
/// connections' file opens need: 200 clients connected at once, then 5 keep-alive requests
/// each, all get their file (those past the workers' connection caps wait). With a fixed handoff window, the
/// connections handed over and not yet accepted took the fds, each worker's cap was 1, and most
/// answers were 503.
#[test]
fn workers_under_a_low_open_files_limit_answer_a_crowd_without_503() {
    use nodus_testkit::http::{Timeouts, connect, read_reply, write_request};
    let dir = TempDir::new("fd-limit-crowd");
    std::fs::write(dir.path().join("a.txt"), "hello crowd\n").unwrap();
    let addr = free_addr();
    let mut primary = spawn(
        Command::new("sh")
            .args(["-c", "ulimit -n 128 && exec \"$0\" \"$@\"", NODUS, "serve"])
            .arg(dir.path())
            .args(["--listen", &addr.to_string(), "--workers", "2"])
            .env("RUST_LOG", "info"),
    );
    primary.wait_line("2 workers ready");
    let t = Timeouts {
        connect: Duration::from_secs(10),
        io: Duration::from_secs(30),
    };
    // All connected first: the primary hands them over before any is served.
    let conns: Vec<_> = (0..200)
        .map(|_| connect(addr, t).expect("connect"))
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let clients: Vec<_> = conns
        .into_iter()
        .map(|s| {
            std::thread::spawn(move || {
                let mut r = std::io::BufReader::new(s.try_clone().unwrap());
                let mut w = s;
                (0..5)
                    .map(|_| {
                        write_request(&mut w, "GET", "/a.txt", &[]).expect("write");
                        let reply = read_reply(&mut r, false).expect("reply");
                        (reply.status, reply.body)
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    for c in clients {
        for (status, body) in c.join().unwrap() {
            assert_eq!(
                (status, body.as_slice()),
                (200, &b"hello crowd\n"[..]),
                "{:#?}",
                primary.output_so_far()
            );
        }
    }
    primary.signal(rustix::process::Signal::TERM);
    assert_eq!(primary.wait_exit(Duration::from_secs(20)), Some(0));
}

/// A primary at its open-files limit (`ulimit -n 64`, a flood of connections) keeps the fds its
/// own spawns need: a worker killed then is replaced, a reload then is done, and the primary's
/// fd shortage is never counted as crashes of the worker (which spent the restart budget in a
/// second: exit 75).
#[test]
fn a_primary_at_its_open_files_limit_still_replaces_a_killed_worker() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = TempDir::new("fd-limit-restart");
    std::fs::write(dir.path().join("index.html"), "hi\n").unwrap();
    let log = dir.path().join("events.jsonl");
    let addr = free_addr();
    let mut primary = spawn(
        Command::new("sh")
            .args(["-c", "ulimit -n 64 && exec \"$0\" \"$@\"", NODUS, "serve"])
            .arg(dir.path())
            .args(["--listen", &addr.to_string(), "--workers", "2", "--events"])
            .arg(&log)
            .env("RUST_LOG", "info"),
    );
    let primary_pid = primary.id();
    wait_ready_pids(&log, 2);
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let clients = flood(addr, 200, &stop);
    // Four kills (within the default budget of 5), each once the primary holds nearly 64 fds.
    for round in 0..4 {
        let slot = round % 2 + 1;
        let pid = events(&log)
            .iter()
            .rev()
            .find(|e| e["event"] == "ready" && e["worker"] == slot)
            .map(|e| e["pid"].as_i64().unwrap() as i32)
            .unwrap();
        wait_at_limit(primary_pid);
        rustix::process::kill_process(
            rustix::process::Pid::from_raw(pid).unwrap(),
            rustix::process::Signal::KILL,
        )
        .unwrap();
        // Its replacement is ready, the flood still on.
        let evs = wait_events(&log, |e| {
            count(e, "ready") == 3 + round || count(e, "give_up") > 0
        });
        if count(&evs, "give_up") > 0 {
            break;
        }
    }
    // A reload, the flood still on, once the primary is at its limit again: done, not failed.
    if count(&events(&log), "give_up") == 0 {
        wait_at_limit(primary_pid);
        primary.signal(rustix::process::Signal::HUP);
        wait_events(&log, |e| {
            count(e, "reload_done") + count(e, "reload_failed") + count(e, "give_up") > 0
        });
    }
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().unwrap();
    }
    let evs = events(&log);
    assert_eq!(count(&evs, "give_up"), 0, "{:#?}", primary.output_so_far());
    assert_eq!(count(&evs, "reload_done"), 1, "{evs:#?}");
    assert_eq!(count(&evs, "ready"), 8, "{evs:#?}");
    assert!(
        primary.exited_within(Duration::ZERO).is_none(),
        "the primary still runs"
    );
    primary.signal(rustix::process::Signal::TERM);
    assert_eq!(primary.wait_exit(Duration::from_secs(20)), Some(0));
}
