//! `nodus run` whose stderr is a pipe nobody reads: closed (`2>&1 | head -2`) or full
//! (`2>&1 | sleep 25`). The primary's log lines must neither kill the task that logs (a panic on
//! `EPIPE`) nor block its loop (a `write` to a full pipe): it still gives up with 75, and still
//! drains on SIGTERM, and its stop, `nodus serve`'s too, is over within its bound however long
//! the pipe stays full (the exit's flush of queued output takes what is left of it). And one
//! whose stdout is read late: the output queued at its exit waits for the reader; one whose
//! stdout is read slowly: a stopped worker's pipe is read to its end before the exit; one whose
//! stdout is closed: one WARN line says the workers' output is discarded.
//!
//! Every primary is started in its own process group, killed by PID when the test ends.

mod common;

use std::io::{BufRead, BufReader, PipeReader, Read};
use std::os::fd::AsFd;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::NODUS;
use common::cluster::{run_sh, spawn_into_pipe};
use nodus_testkit::proc::Proc;
use rustix::process::Signal;

/// `nodus run ARGS` with stdout and stderr both into one new pipe (as `2>&1 |` does): the
/// process and the pipe's read end.
fn run_into_pipe(args: &[&str]) -> (Proc, PipeReader) {
    let mut cmd = Command::new(NODUS);
    cmd.arg("run").args(args).env("RUST_LOG", "info");
    spawn_into_pipe(cmd)
}

/// A worker that crashes 0.2 s after it starts, and a budget spent by its second crash: exit 75.
const CRASHING: &[&str] = &[
    "-w",
    "1",
    "--max-restarts",
    "1",
    "--",
    "sh",
    "-c",
    "sleep 0.2; exit 3",
];

/// A closed stdout (`nodus run ... | head -0`): the workers' output is discarded from its first
/// failed write, said in one WARN line (its target, `nodus::process::output`, named once), and
/// the run goes on to its end.
#[test]
fn run_says_once_that_its_closed_stdout_discards_the_workers_output() {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let mut primary = Proc::spawn_group(
        Command::new(NODUS)
            .args(["run", "-w", "1", "--restart", "temporary", "--"])
            .args(["sh", "-c", "echo one; sleep 0.2; echo two"])
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(writer)
            .stderr(Stdio::piped()),
    );
    assert_eq!(primary.wait_exit(Duration::from_secs(30)), Some(0));
    let said: Vec<&String> = primary
        .output()
        .iter()
        .filter(|l| l.contains("writing child output failed"))
        .collect();
    assert_eq!(said.len(), 1, "{:#?}", primary.output());
    assert!(
        said[0].contains("WARN nodus::process::output: writing child output failed (Broken pipe")
            && said[0].ends_with("discarding from now on"),
        "{said:#?}"
    );
}

#[test]
fn run_gives_up_with_75_when_its_stderr_is_closed_from_the_start() {
    let (mut primary, reader) = run_into_pipe(CRASHING);
    drop(reader);
    assert_eq!(primary.wait_exit(Duration::from_secs(30)), Some(75));
}

#[test]
fn run_gives_up_with_75_when_its_stderr_reader_goes_away_after_a_line() {
    let (mut primary, reader) = run_into_pipe(CRASHING);
    // `head -1`-like: up to the start line, then the read end is closed; the crashes come later.
    // (A loaded host may put a watchdog line before it: those are read past.)
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut reader = BufReader::new(reader);
        let mut line = String::new();
        for _ in 0..20 {
            line.clear();
            if reader.read_line(&mut line).unwrap_or(0) == 0 || !line.contains("nodus::watchdog") {
                break;
            }
        }
        let _ = tx.send(line);
    });
    let first = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(first.contains("supervising 1 worker"), "{first:?}");
    // Two crashes 0.2 s apart, then the give-up: 30 s only catches a hang on a loaded host.
    assert_eq!(primary.wait_exit(Duration::from_secs(30)), Some(75));
}

#[test]
fn run_drains_on_sigterm_while_its_stderr_is_a_full_pipe() {
    let (mut primary, reader) = run_into_pipe(&[
        "-w",
        "1",
        "--kill-timeout",
        "1",
        "--",
        "sh",
        "-c",
        "yes chatty-worker-output-line >&2",
    ]);
    // The worker's prefixed lines fill the pipe (64 KiB on Linux); nobody reads it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while rustix::io::ioctl_fionread(reader.as_fd()).unwrap() < 60 * 1024 {
        assert!(Instant::now() < deadline, "the pipe never filled up");
        std::thread::sleep(Duration::from_millis(10));
    }
    // The drain starts with a log line: a blocking write of it would stall the loop for good.
    primary.signal(Signal::TERM);
    let stopping = Instant::now();
    // The drain takes a moment; the exit then waits for the queued output, and 1 s for the drop
    // notices, before it gives up on a pipe nobody reads: all of it within the stop's bound,
    // twice the kill timeout + 3 s (the flush alone may take 10 s).
    assert_eq!(primary.wait_exit(Duration::from_secs(25)), Some(0));
    within_bound(stopping.elapsed(), Duration::from_secs(2 + 3));
    drop(reader);
}

/// A stop that lasted `took`, which its bound says is at most `bound`: within it, give or take
/// a scheduling delay.
fn within_bound(took: Duration, bound: Duration) {
    assert!(
        took < bound + Duration::from_millis(1500),
        "the stop took {took:?}, its bound is {bound:?}"
    );
}

/// `nodus serve --workers 2` whose stdout and stderr are a full pipe nobody reads (journald
/// stalled): its stop is over within `--shutdown-delay` + `--drain-timeout` + 8 s, the exit's
/// flush of queued output and the drop notices included (the flush alone may take 10 s).
#[test]
fn serve_stops_within_its_bound_while_its_stderr_is_a_full_pipe() {
    let dir = nodus_testkit::tmp::TempDir::new("serve-stalled-stderr");
    std::fs::write(dir.path().join("a.txt"), "a\n").unwrap();
    let addr = nodus_testkit::net::free_addr();
    let mut cmd = Command::new(NODUS);
    cmd.arg("serve")
        .arg(dir.path())
        .args(["--workers", "2", "--access-log", "--drain-timeout", "0"])
        .args(["--listen", &addr.to_string()])
        .env("RUST_LOG", "info");
    let (mut primary, reader) = spawn_into_pipe(cmd);
    // One page: the start lines and a few access log lines fill it.
    let size = rustix::pipe::fcntl_setpipe_size(&reader, 4096).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut full_since = None;
    while full_since.is_none_or(|n| n < 20) {
        assert!(Instant::now() < deadline, "the pipe never filled up");
        // Refused until the primary listens.
        if let Ok(r) = nodus_testkit::http::request(addr, TIMEOUTS, "GET", "/a.txt", &[]) {
            assert_eq!(r.status, 200);
        } else {
            std::thread::sleep(Duration::from_millis(20));
        }
        // Full, and more queued behind it.
        if rustix::io::ioctl_fionread(reader.as_fd()).unwrap() as usize + 256 > size {
            full_since = Some(full_since.map_or(0, |n| n + 1));
        }
    }
    primary.signal(Signal::TERM);
    let stopping = Instant::now();
    assert_eq!(primary.wait_exit(Duration::from_secs(30)), Some(0));
    within_bound(stopping.elapsed(), Duration::from_secs(8));
    drop(reader);
}

/// A client's bounds for the requests that fill the pipe.
const TIMEOUTS: nodus_testkit::http::Timeouts = nodus_testkit::http::Timeouts {
    connect: Duration::from_secs(5),
    io: Duration::from_secs(5),
};

/// The numbers `seq` printed in worker 1, as `out` (the primary's stdout) has them: each line
/// must be `[worker 1 PID] N`.
fn worker_1_numbers(out: &str) -> Vec<usize> {
    out.lines()
        .map(|l| {
            let (prefix, n) = l.split_once("] ").unwrap_or_else(|| panic!("{l:?}"));
            assert!(prefix.starts_with("[worker 1 "), "{l:?}");
            n.parse().unwrap_or_else(|_| panic!("{l:?}"))
        })
        .collect()
}

/// A worker writes more than a pipe holds and exits, and the primary with it, while nothing
/// reads the primary's stdout (journald under pressure, a log shipper that stalls): the output
/// still queued at the exit waits for the reader, up to 10 s, and every line arrives whole.
#[test]
fn run_writes_the_output_queued_at_its_exit_for_a_reader_that_comes_late() {
    const LINES: usize = 20_000; // about 450 KB with the prefixes
    let (reader, writer) = std::io::pipe().unwrap();
    let mut cmd = run_sh(
        ["-w", "1", "--restart", "temporary"],
        &format!("seq 1 {LINES}"),
    );
    cmd.stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::null());
    let mut primary = Proc::spawn_group(&mut cmd);
    drop(cmd); // our copy of the write end
    std::thread::sleep(Duration::from_secs(3));
    let reading = std::thread::spawn(move || {
        let mut out = String::new();
        BufReader::new(reader).read_to_string(&mut out).unwrap();
        out
    });
    assert_eq!(primary.wait_exit(Duration::from_secs(20)), Some(0));
    let out = reading.join().unwrap();
    let numbers = worker_1_numbers(&out);
    assert_eq!(numbers, (1..=LINES).collect::<Vec<_>>());
}

/// A worker writes more than the primary's pipe and queue hold for a reader slower than it
/// (a log shipper behind), and the primary is stopped as soon as the worker has written it all,
/// while the reader pauses for half a second (a garbage collection; less than the 1 s that makes
/// it a stalled reader): what is still in the worker's pipe at its exit is read to end of file
/// and handed on before the primary exits, so every line arrives, in order, and nothing is said
/// dropped.
#[test]
fn run_reads_a_stopped_workers_pipe_to_its_end_for_a_slow_reader() {
    const LINES: usize = 200_000; // about 4.6 MB with the prefixes, past the queue's 4 MiB
    let (reader, writer) = std::io::pipe().unwrap();
    let mut cmd = run_sh(
        ["-w", "1"],
        &format!("seq 1 {LINES}; echo written >&2; exec sleep 600"),
    );
    cmd.stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::piped())
        .env("RUST_LOG", "info");
    let mut primary = Proc::spawn_group(&mut cmd);
    drop(cmd); // our copy of the write end
    // 64 KiB every 20 ms: slower than the worker writes, never a stalled reader (a write to it
    // waits 20 ms at most, 520 ms once).
    let (pause, paused) = mpsc::channel::<()>();
    let reading = std::thread::spawn(move || {
        let (mut reader, mut out, mut buf) = (reader, Vec::new(), vec![0u8; 64 * 1024]);
        loop {
            if paused.try_recv().is_ok() {
                std::thread::sleep(Duration::from_millis(500));
            }
            match reader.read(&mut buf).unwrap() {
                0 => return String::from_utf8(out).unwrap(),
                n => out.extend_from_slice(&buf[..n]),
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    primary.wait_line("] written");
    pause.send(()).unwrap();
    primary.signal(Signal::TERM);
    assert_eq!(primary.wait_exit(Duration::from_secs(30)), Some(0));
    let out = reading.join().unwrap();
    assert!(!out.contains("dropped"), "{}", &out[out.len() - 200..]);
    let numbers = worker_1_numbers(&out);
    assert_eq!(numbers.len(), LINES);
    assert_eq!(numbers, (1..=LINES).collect::<Vec<_>>());
}
