//! The `--events` log at its edges: a FIFO whose reader never reads (a stalled log shipper)
//! neither stalls the primary's loop (it serves, readyz answers) nor holds up its exit on
//! SIGTERM; a file whose last line was cut (no final `\n`) gets a `\n` before the new primary's
//! first line, so that line stays valid JSON.
//!
//! Every primary is started in its own process group and the whole group is killed by PID when
//! the test ends.

mod common;

use std::fs::File;
use std::time::{Duration, Instant};

use common::NODUS;
use common::cluster::{assert_exit, run_sh, spawn};
use common::http::get;
use nodus_testkit::net::free_addr;
use nodus_testkit::tmp::TempDir;
use rustix::process::Signal;
use std::process::Command;

#[test]
fn a_primary_whose_event_log_is_a_fifo_nobody_reads_keeps_serving_and_stops_on_sigterm() {
    let dir = TempDir::new("events-fifo");
    let www = dir.path().join("www");
    std::fs::create_dir(&www).unwrap();
    std::fs::write(www.join("index.html"), "hello\n").unwrap();
    let fifo = dir.path().join("events.fifo");
    rustix::fs::mkfifoat(
        rustix::fs::CWD,
        &fifo,
        rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR,
    )
    .unwrap();
    // A reader that never reads, on a pipe made small (one page) so that a few reloads fill it.
    let held = File::options().read(true).write(true).open(&fifo).unwrap();
    let size = rustix::pipe::fcntl_setpipe_size(&held, 4096).unwrap();
    let admin = free_addr();
    let mut primary = spawn(
        Command::new(NODUS)
            .arg("serve")
            .arg(&www)
            .args(["--listen", "127.0.0.1:0", "--workers", "2", "--events"])
            .arg(&fifo)
            .args(["--admin", &admin.to_string()])
            .env("RUST_LOG", "info"),
    );
    let line = primary.wait_line("on http://");
    let addr: std::net::SocketAddr = line
        .split("on http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no address in the startup line {line:?}"));
    primary.wait_line("2 workers ready");
    // Reloads until the pipe is full (all but the room of a line).
    let deadline = Instant::now() + Duration::from_secs(40);
    while rustix::io::ioctl_fionread(&held).unwrap() + 512 < size as u64 {
        assert!(Instant::now() < deadline, "the pipe never filled");
        primary.signal(Signal::HUP);
        std::thread::sleep(Duration::from_millis(300));
    }
    // More events, each a write the pipe does not take.
    primary.signal(Signal::HUP);
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(get(admin, "/_nodus/readyz").status, 200);
    let page = get(addr, "/");
    assert_eq!((page.status, page.body.as_slice()), (200, &b"hello\n"[..]));
    // Its exit waits a bounded time for the lines the pipe did not take, and says so.
    primary.signal(Signal::TERM);
    assert_exit(&mut primary, Duration::from_secs(20), 0);
    assert!(
        primary
            .output()
            .iter()
            .any(|l| l.contains("bytes of events not written")),
        "{:#?}",
        primary.output()
    );
}

#[test]
fn a_cut_last_line_gets_a_newline_before_the_new_primarys_first_line() {
    let dir = TempDir::new("events-cut");
    let log = dir.path().join("events.jsonl");
    std::fs::write(&log, "{\"t_ns\":1,\"event\":\"ready\"}\n{\"t_ns\":2,\"ev").unwrap();
    let log_arg = log.to_str().unwrap();
    let mut primary = spawn(&mut run_sh(
        ["-w", "1", "--events", log_arg],
        "exec sleep 30",
    ));
    let deadline = Instant::now() + Duration::from_secs(20);
    while !std::fs::read_to_string(&log)
        .unwrap()
        .contains("\"event\":\"fork\"")
    {
        assert!(Instant::now() < deadline, "no fork event");
        std::thread::sleep(Duration::from_millis(20));
    }
    primary.signal(Signal::TERM);
    assert_exit(&mut primary, Duration::from_secs(20), 0);
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[1], "{\"t_ns\":2,\"ev", "{text}");
    let first: serde_json::Value = serde_json::from_str(lines[2])
        .unwrap_or_else(|e| panic!("the new primary's first line: {e}: {text}"));
    assert_eq!(first["event"], "fork", "{text}");
    assert!(first["unix_ns"].is_u64(), "the anchor: {text}");
    for line in &lines[2..] {
        serde_json::from_str::<serde_json::Value>(line).unwrap_or_else(|e| panic!("{e}: {text}"));
    }
}
