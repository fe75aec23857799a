//! Render tests: a fixed sample snapshot through `render` / `render_labeled`, checked line by
//! line against the OpenMetrics text the encoder writes.

use super::*;
use crate::metrics::histogram::Histogram;
use crate::metrics::snapshot::HistogramSnapshot;
use crate::metrics::snapshot::{PhaseSnapshot, PoolSnapshot, StallReport, TaskClassSnapshot};

fn hist(values: &[(u64, u64)]) -> HistogramSnapshot {
    let mut h = Histogram::new();
    for &(v, n) in values {
        h.record_n(v, n);
    }
    h.snapshot()
}

fn sample() -> Snapshot {
    let mut s = Snapshot {
        pid: 7,
        loop_id: 1,
        uptime_seconds: 12.5,
        ..Default::default()
    };
    let ls = &mut s.loop_stats;
    ls.iterations = 42;
    ls.busy_seconds = 1.5;
    ls.idle_seconds = 10.25;
    ls.interval_utilization = 0.125;
    ls.interval_seconds = 1.25;
    ls.slow_poll_threshold_seconds = 0.1;
    ls.events_total = 100;
    // 500 ns x3 (bucket 496..=511), 800 us x2 (786432..=819199), 2 ms x1 (1966080..=2031615).
    ls.schedule_delay = hist(&[(500, 3), (800_000, 2), (2_000_000, 1)]);
    ls.poll_duration = hist(&[(1_500, 4)]);
    ls.events_per_poll = hist(&[(0, 5), (3, 2), (40, 1)]);
    ls.slow_polls_total = 2;
    ls.tick_drain_seconds = 0.5;
    ls.ticks_total = 9;
    ls.microtasks_total = 11;
    s.run_queue.current = 3;
    s.run_queue.mean = 0.75;
    s.run_queue.wait_seconds = 9.375;
    s.run_queue.max = 40;
    s.run_queue.interval_mean = 2.5;
    s.run_queue.interval_max = 17;
    s.run_queue.arrivals_total = 1000;
    s.run_queue.samples = hist(&[(0, 10), (1, 4), (2, 3), (3, 2), (5000, 1)]);
    s.tasks.alive = 4;
    s.phases = vec![
        PhaseSnapshot {
            phase: "timers".into(),
            seconds: 0.25,
            callbacks: 6,
        },
        PhaseSnapshot {
            phase: "poll".into(),
            seconds: 1.0,
            callbacks: 8,
        },
    ];
    s.task_classes = vec![TaskClassSnapshot {
        name: "http:static".into(),
        spawned: 5,
        polls: 50,
        forced_yields: 1,
        panics: 2,
        poll_duration: hist(&[(2_000, 50)]),
    }];
    s.stalls = vec![
        StallReport {
            elapsed_seconds: 0.2,
            ..Default::default()
        },
        StallReport {
            elapsed_seconds: 0.75,
            ..Default::default()
        },
    ];
    s.stalls_total.on_cpu = 70;
    s.stalls_total.waiting_for_cpu = 3;
    s
}

fn has_line(text: &str, line: &str) -> bool {
    text.lines().any(|l| l == line)
}

#[track_caller]
fn assert_lines(text: &str, lines: &[&str]) {
    for line in lines {
        assert!(has_line(text, line), "missing line {line:?} in:\n{text}");
    }
}

#[test]
fn renders_one_snapshot() {
    let text = render(&sample());
    assert_lines(
        &text,
        &[
            "# HELP nodus_loop_iterations Loop iterations.",
            "# TYPE nodus_loop_iterations counter",
            "nodus_loop_iterations_total 42",
            "# TYPE nodus_loop_busy_seconds counter",
            "# UNIT nodus_loop_busy_seconds seconds",
            "nodus_loop_busy_seconds_total 1.5",
            "nodus_loop_idle_seconds_total 10.25",
            "nodus_loop_utilization 0.125",
            "nodus_loop_events_total 100",
            "nodus_run_queue_length 3",
            // The interval's figures side by side; the lifetime's as a high-water mark and
            // the integral whose rate is a mean.
            "nodus_loop_interval_seconds 1.25",
            "nodus_run_queue_length_mean 2.5",
            "nodus_run_queue_length_max 17",
            "nodus_run_queue_length_lifetime_max 40",
            "# TYPE nodus_run_queue_wait_seconds counter",
            "nodus_run_queue_wait_seconds_total 9.375",
            "nodus_run_queue_arrivals_total 1000",
            "nodus_loop_slow_poll_threshold_seconds 0.1",
            "nodus_tasks_alive 4",
            "nodus_loop_slow_polls_total 2",
            "nodus_loop_tick_drain_seconds_total 0.5",
            "nodus_ticks_total 9",
            "nodus_microtasks_total 11",
            "nodus_stalls_recent 2",
            "# TYPE nodus_loop_stalls counter",
            r#"nodus_loop_stalls_total{class="on-cpu"} 70"#,
            r#"nodus_loop_stalls_total{class="blocked-in-syscall"} 0"#,
            r#"nodus_loop_stalls_total{class="waiting-for-cpu"} 3"#,
            r#"nodus_loop_stalls_total{class="stopped"} 0"#,
            r#"nodus_loop_stalls_total{class="unknown"} 0"#,
            "nodus_stall_last_seconds 0.75",
            "nodus_uptime_seconds 12.5",
            r#"nodus_loop_phase_seconds_total{phase="timers"} 0.25"#,
            r#"nodus_loop_phase_callbacks_total{phase="poll"} 8"#,
            r#"nodus_task_polls_total{task="http:static"} 50"#,
            r#"nodus_task_forced_yields_total{task="http:static"} 1"#,
            "# TYPE nodus_task_panics counter",
            r#"nodus_task_panics_total{task="http:static"} 2"#,
            r#"nodus_tasks_spawned_total{task="http:static"} 5"#,
            "# EOF",
        ],
    );
    assert!(text.ends_with("# EOF\n"));
}

/// A stall is a hold (one callback and its drain, however many polls: `watchdog`), not one
/// poll: the stall families' help says so.
#[test]
fn stall_help_speaks_of_a_hold() {
    let text = render(&sample());
    let help = |family: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("# HELP {family} ")))
            .unwrap_or_else(|| panic!("no HELP for {family} in\n{text}"))
            .to_owned()
    };
    let last = help("nodus_stall_last_seconds");
    assert!(
        last.contains("held by one callback and the drain after it"),
        "{last}"
    );
    assert!(!last.contains("poll took"), "{last}");
    assert!(help("nodus_stalls_recent").contains("polls"));
    assert!(help("nodus_loop_stalls").contains("held past the stall threshold by one callback"));
}

#[test]
fn renders_histograms() {
    let text = render(&sample());
    // Schedule delay: 3 samples <= 1 us, 2 more <= 1 ms, 1 more <= 2.5 ms (each `le` the bucket
    // edge nearest the round bound: 991 ns, 1.015807 ms, 2.490367 ms).
    assert_lines(
        &text,
        &[
            "# TYPE nodus_task_schedule_delay_seconds histogram",
            "# UNIT nodus_task_schedule_delay_seconds seconds",
            "nodus_task_schedule_delay_seconds_count 6",
            "nodus_task_schedule_delay_seconds_sum 0.0036015",
            r#"nodus_task_schedule_delay_seconds_bucket{le="9.91e-7"} 3"#,
            r#"nodus_task_schedule_delay_seconds_bucket{le="0.000507903"} 3"#,
            r#"nodus_task_schedule_delay_seconds_bucket{le="0.001015807"} 5"#,
            r#"nodus_task_schedule_delay_seconds_bucket{le="0.002490367"} 6"#,
            r#"nodus_task_schedule_delay_seconds_bucket{le="10.200547327"} 6"#,
            r#"nodus_task_schedule_delay_seconds_bucket{le="+Inf"} 6"#,
            // 2 us lands in 1984..=2047 ns: above 1 us, within 5 us.
            r#"nodus_task_poll_duration_seconds_bucket{le="9.91e-7",task="http:static"} 0"#,
            r#"nodus_task_poll_duration_seconds_bucket{le="0.000005119",task="http:static"} 50"#,
            r#"nodus_task_poll_duration_seconds_count{task="http:static"} 50"#,
            "nodus_loop_poll_duration_seconds_count 4",
            // Unitless: exact below 32; 40 is in 40..=41, within le=63; 5000 only in +Inf.
            r#"nodus_run_queue_length_samples_bucket{le="0.0"} 10"#,
            r#"nodus_run_queue_length_samples_bucket{le="1.0"} 14"#,
            r#"nodus_run_queue_length_samples_bucket{le="2.0"} 17"#,
            r#"nodus_run_queue_length_samples_bucket{le="4.0"} 19"#,
            r#"nodus_run_queue_length_samples_bucket{le="4095.0"} 19"#,
            r#"nodus_run_queue_length_samples_bucket{le="+Inf"} 20"#,
            "nodus_run_queue_length_samples_sum 5016.0",
            r#"nodus_loop_events_per_poll_bucket{le="4.0"} 7"#,
            r#"nodus_loop_events_per_poll_bucket{le="31.0"} 7"#,
            r#"nodus_loop_events_per_poll_bucket{le="63.0"} 8"#,
        ],
    );
    // 21 bucket lines per `_seconds` histogram, 15 per unitless one.
    let count = |prefix: &str| text.lines().filter(|l| l.starts_with(prefix)).count();
    assert_eq!(count("nodus_task_schedule_delay_seconds_bucket{"), 21);
    assert_eq!(count("nodus_run_queue_length_samples_bucket{"), 15);
}

/// The `le` bounds and the cumulative count under each, for one family without labels.
fn le_counts(text: &str, family: &str) -> Vec<(String, u64)> {
    let prefix = format!("{family}_bucket{{le=\"");
    text.lines()
        .filter_map(|l| l.strip_prefix(prefix.as_str()))
        .filter_map(|rest| {
            let (le, count) = rest.split_once("\"} ")?;
            Some((le.to_owned(), count.parse().ok()?))
        })
        .collect()
}

/// A sample is counted under every `le` at or above its value, and under none below it. Before,
/// the internal buckets were folded onto round bounds they straddle: a 97 ms sample fell in the
/// bucket 96.47..=100.66 ms and was counted only from `le="0.25"` on, outside `le="0.1"`.
#[test]
fn a_sample_is_counted_under_every_le_at_or_above_its_value() {
    let ns = |le: &str| (le.parse::<f64>().unwrap() * 1e9).round() as u64;
    let les = le_counts(&render(&sample()), "nodus_task_schedule_delay_seconds");
    assert_eq!(les.len(), 21);
    for (le, _) in les.iter().filter(|(le, _)| le != "+Inf") {
        let bound = ns(le);
        for value in [bound - 1, bound, bound + 1] {
            let mut s = Snapshot::default();
            s.loop_stats.schedule_delay = hist(&[(value, 1)]);
            let counts = le_counts(&render(&s), "nodus_task_schedule_delay_seconds");
            for (other, count) in &counts {
                let inside = other == "+Inf" || value <= ns(other);
                assert_eq!(*count, u64::from(inside), "{value} ns under le={other}");
            }
        }
    }
    // The reviewer's sample: 97 ms, in the `le` nearest 0.1 s.
    let mut s = Snapshot::default();
    s.loop_stats.schedule_delay = hist(&[(97_000_000, 1)]);
    let counts = le_counts(&render(&s), "nodus_task_schedule_delay_seconds");
    assert!(
        counts.contains(&("0.100663295".to_owned(), 1)),
        "{counts:?}"
    );
    assert!(
        counts.contains(&("0.050331647".to_owned(), 0)),
        "{counts:?}"
    );
    // Unitless: 64 is above the `le` nearest 64 (63), and counted from 127.
    let mut s = Snapshot::default();
    s.run_queue.samples = hist(&[(63, 1), (64, 1)]);
    let counts = le_counts(&render(&s), "nodus_run_queue_length_samples");
    assert!(counts.contains(&("31.0".to_owned(), 0)), "{counts:?}");
    assert!(counts.contains(&("63.0".to_owned(), 1)), "{counts:?}");
    assert!(counts.contains(&("127.0".to_owned(), 2)), "{counts:?}");
}

/// Counts no loop reaches, as a snapshot from another process may carry them: the cumulative
/// buckets stop at `u64::MAX` (the encoder adds them up and would overflow) and stay monotone.
#[test]
fn bucket_counts_that_add_up_past_u64_max_saturate() {
    let mut s = Snapshot::default();
    s.loop_stats.poll_duration.buckets = vec![(1, u64::MAX), (2_000, u64::MAX), (u64::MAX, 5)];
    let text = render(&s);
    assert_lines(
        &text,
        &[
            r#"nodus_loop_poll_duration_seconds_bucket{le="9.91e-7"} 18446744073709551615"#,
            r#"nodus_loop_poll_duration_seconds_bucket{le="0.000005119"} 18446744073709551615"#,
            r#"nodus_loop_poll_duration_seconds_bucket{le="+Inf"} 18446744073709551615"#,
            "nodus_loop_poll_duration_seconds_count 18446744073709551615",
        ],
    );
}

#[test]
fn empty_snapshot_renders_zeros() {
    let text = render(&Snapshot::default());
    assert_lines(
        &text,
        &[
            "nodus_loop_iterations_total 0",
            "nodus_stall_last_seconds 0.0",
            "nodus_task_schedule_delay_seconds_count 0",
            r#"nodus_task_schedule_delay_seconds_bucket{le="+Inf"} 0"#,
            // Every class has its series from the start, so a rate() over it is never absent.
            r#"nodus_loop_stalls_total{class="on-cpu"} 0"#,
            r#"nodus_loop_stalls_total{class="unknown"} 0"#,
        ],
    );
    // No task classes and no phases: those families are left out entirely.
    assert!(!text.contains("nodus_task_poll_duration_seconds"));
    assert!(!text.contains("nodus_loop_phase_seconds"));
}

#[test]
fn one_type_line_per_family_across_workers() {
    let a = sample();
    let mut b = sample();
    b.loop_stats.iterations = 7;
    let w = |n: &str| vec![("worker".to_owned(), n.to_owned())];
    let text = render_labeled(&[(w("1"), &a), (w("2"), &b)]);

    let mut types: Vec<&str> = text.lines().filter(|l| l.starts_with("# TYPE ")).collect();
    let n = types.len();
    types.sort_unstable();
    types.dedup();
    assert_eq!(types.len(), n, "a family's TYPE line appears twice");
    assert_eq!(
        n,
        render(&a)
            .lines()
            .filter(|l| l.starts_with("# TYPE "))
            .count()
    );

    assert_lines(
        &text,
        &[
            r#"nodus_loop_iterations_total{worker="1"} 42"#,
            r#"nodus_loop_iterations_total{worker="2"} 7"#,
            r#"nodus_task_polls_total{worker="1",task="http:static"} 50"#,
            r#"nodus_task_polls_total{worker="2",task="http:static"} 50"#,
            r#"nodus_task_schedule_delay_seconds_bucket{le="0.001015807",worker="2"} 5"#,
            r#"nodus_task_poll_duration_seconds_count{worker="1",task="http:static"} 50"#,
            r#"nodus_loop_stalls_total{worker="1",class="on-cpu"} 70"#,
            r#"nodus_loop_stalls_total{worker="2",class="on-cpu"} 70"#,
        ],
    );
    // Each family's series are contiguous: worker 2's iterations follow worker 1's.
    let lines: Vec<&str> = text.lines().collect();
    let i = lines
        .iter()
        .position(|l| l.starts_with("nodus_loop_iterations_total{worker=\"1\"}"))
        .unwrap();
    assert!(lines[i + 1].starts_with("nodus_loop_iterations_total{worker=\"2\"}"));
    assert_eq!(text.matches("# EOF").count(), 1);
}

#[test]
fn escapes_label_values() {
    let mut s = Snapshot::default();
    s.task_classes.push(TaskClassSnapshot {
        name: "a\"b\\c\nd".into(),
        polls: 3,
        ..Default::default()
    });
    let text = render_labeled(&[(vec![("worker".into(), "w\"1".into())], &s)]);
    assert_lines(
        &text,
        &[r#"nodus_task_polls_total{worker="w\"1",task="a\"b\\c\nd"} 3"#],
    );
}

#[test]
fn renders_pools_with_a_pool_label() {
    let mut s = sample();
    for (name, completed) in [("io", 1600), ("cpu", 3)] {
        s.pools.push(PoolSnapshot {
            pool: name.into(),
            threads: 4,
            queue_depth: 2,
            busy_threads: 1,
            completed_total: completed,
            cancelled_total: completed / 100,
            rejected_total: 9,
            panicked_total: completed % 2,
            queue_wait: hist(&[(500, 2)]),
            run: hist(&[(800_000, 1)]),
        });
    }
    let text = render(&s);
    assert_lines(
        &text,
        &[
            "# TYPE nodus_pool_queue_depth gauge",
            r#"nodus_pool_queue_depth{pool="io"} 2"#,
            r#"nodus_pool_busy_threads{pool="cpu"} 1"#,
            r#"nodus_pool_threads{pool="io"} 4"#,
            "# TYPE nodus_pool_completed counter",
            r#"nodus_pool_completed_total{pool="io"} 1600"#,
            r#"nodus_pool_completed_total{pool="cpu"} 3"#,
            "# HELP nodus_pool_cancelled Pool jobs whose future was dropped before a thread started them (never run).",
            "# TYPE nodus_pool_cancelled counter",
            r#"nodus_pool_cancelled_total{pool="io"} 16"#,
            r#"nodus_pool_cancelled_total{pool="cpu"} 0"#,
            "# HELP nodus_pool_rejected Pool submissions refused because the pool's queue was at its bound.",
            "# TYPE nodus_pool_rejected counter",
            r#"nodus_pool_rejected_total{pool="io"} 9"#,
            "# HELP nodus_pool_panicked Pool jobs that panicked (counted among the completed too).",
            "# TYPE nodus_pool_panicked counter",
            r#"nodus_pool_panicked_total{pool="io"} 0"#,
            r#"nodus_pool_panicked_total{pool="cpu"} 1"#,
            "# TYPE nodus_pool_queue_wait_seconds histogram",
            r#"nodus_pool_queue_wait_seconds_bucket{le="9.91e-7",pool="io"} 2"#,
            r#"nodus_pool_queue_wait_seconds_count{pool="cpu"} 2"#,
            r#"nodus_pool_run_seconds_bucket{le="0.001015807",pool="io"} 1"#,
            r#"nodus_pool_run_seconds_count{pool="io"} 1"#,
        ],
    );
    // The classic format names each counter family after its samples.
    assert_lines(
        &to_classic(&text),
        &[
            "# TYPE nodus_pool_rejected_total counter",
            r#"nodus_pool_rejected_total{pool="cpu"} 9"#,
        ],
    );
    // Without pools, no pool family is written.
    assert!(!render(&sample()).contains("nodus_pool_"));
}

#[test]
fn collector_registers_in_a_larger_registry() {
    let s = sample();
    let mut registry = Registry::default();
    registry.register_collector(Box::new(SnapshotCollector::new(&[(vec![], &s)])));
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert_eq!(text, render(&s));
}

/// Every family whose name ends in a unit (`_seconds`, `_bytes`, ...) has its `# UNIT` line, in
/// an exposition with every family (pools included, two workers).
#[test]
fn every_family_named_after_a_unit_has_its_unit_line() {
    let mut s = sample();
    s.pools.push(PoolSnapshot {
        pool: "io".into(),
        threads: 4,
        queue_wait: hist(&[(500, 2)]),
        run: hist(&[(800_000, 1)]),
        ..Default::default()
    });
    let l = |w: &str| vec![("worker".to_owned(), w.to_owned())];
    let text = render_labeled(&[(l("1"), &s), (l("2"), &s)]);
    assert_eq!(
        nodus_testkit::scrape::unit_mistakes(&text),
        Vec::<String>::new(),
        "{text}"
    );
    assert_lines(
        &text,
        &[
            "# UNIT nodus_process_resident_memory_bytes bytes",
            "# UNIT nodus_http_received_bytes bytes",
            "# UNIT nodus_http_sent_bytes bytes",
            "# UNIT nodus_pool_run_seconds seconds",
        ],
    );
    // The samples keep their names.
    assert!(text.contains("\nnodus_http_sent_bytes_total{worker=\"1\"} 0\n"));
    assert!(text.contains("\nnodus_process_resident_memory_bytes{worker=\"2\"} 0\n"));
}
