//! `nodus run` whose stderr is a pipe nobody reads: closed (`2>&1 | head -2`) or full
//! (`2>&1 | sleep 25`). The primary's log lines must neither kill the task that logs (a panic on
//! `EPIPE`) nor block its loop (a `write` to a full pipe): it still gives up with 75, and still
//! drains on SIGTERM.
//!
//! Every primary is started in its own process group, killed by PID when the test ends.

mod common;

use std::io::{BufRead, BufReader, PipeReader};
use std::os::fd::AsFd;
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::NODUS;
use common::cluster::spawn_into_pipe;
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

#[test]
fn run_gives_up_with_75_when_its_stderr_is_closed_from_the_start() {
    let (mut primary, reader) = run_into_pipe(CRASHING);
    drop(reader);
    assert_eq!(primary.wait_exit(Duration::from_secs(10)), Some(75));
}

#[test]
fn run_gives_up_with_75_when_its_stderr_reader_goes_away_after_a_line() {
    let (mut primary, reader) = run_into_pipe(CRASHING);
    // `head -1`: the first line, then the read end is closed; the crashes come later.
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(reader).read_line(&mut line);
        let _ = tx.send(line);
    });
    let first = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(first.contains("supervising 1 worker"), "{first:?}");
    assert_eq!(primary.wait_exit(Duration::from_secs(10)), Some(75));
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
    assert_eq!(primary.wait_exit(Duration::from_secs(10)), Some(0));
    drop(reader);
}
