//! A SIGHUP sent to a cluster worker itself is answered by a line naming the primary's pid, the
//! one the worker had as its parent when it started; once the primary is gone (the worker has
//! been re-parented to init or a subreaper) the line says so instead of naming whatever process
//! is the worker's parent then.
//!
//! The worker is this test binary run again ([`ROLE`]), started in the background by `sh`, its
//! primary as far as it knows, with a channel whose other end this test holds: the worker
//! outlives `sh` instead of exiting at the channel's end. Both are killed by pid.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nodus::cluster::Worker;
use nodus::ipc::ChannelOptions;
use nodus::process::{Command, Stdio};
use nodus_testkit::tmp::TempDir;
use nodus_testkit::tree;
use rustix::process::{Pid, Signal, kill_process};

/// Set in the worker this binary starts from itself.
const ROLE: &str = "NODUS_TEST_WORKER_ROLE";
/// The directory the worker writes `ready` to.
const DIR: &str = "NODUS_TEST_DIR";
const TEST: &str = "a_sighup_to_a_worker_names_the_primary_it_started_with_or_says_it_is_gone";

/// The worker: warnings to stderr, `ready` written once it is a cluster worker (catching
/// SIGHUP), then a wait.
fn worker() -> ! {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_max_level(tracing_subscriber::filter::LevelFilter::WARN)
        .init();
    let dir = PathBuf::from(std::env::var_os(DIR).expect("the test sets the dir"));
    nodus::Runtime::new().block_on(async move {
        let _worker = Worker::get().unwrap().expect("started as a cluster worker");
        std::fs::write(dir.join("ready"), b"").unwrap();
        nodus::sleep(Duration::from_secs(60)).await;
    });
    std::process::exit(0);
}

/// Kills a process that is not our child by pid when dropped.
struct KillOnDrop(i32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(pid) = Pid::from_raw(self.0) {
            let _ = kill_process(pid, Signal::KILL);
        }
    }
}

/// The `n`th (from 1) SIGHUP line in the worker's stderr `log`, within 20 s.
async fn hup_line(log: &Path, n: usize) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if let Some(line) = text
            .lines()
            .filter(|l| l.contains("ignored a SIGHUP"))
            .nth(n - 1)
        {
            return line.to_owned();
        }
        assert!(Instant::now() < deadline, "no SIGHUP line {n}:\n{text}");
        nodus::sleep(Duration::from_millis(20)).await;
    }
}

#[test]
fn a_sighup_to_a_worker_names_the_primary_it_started_with_or_says_it_is_gone() {
    if std::env::var(ROLE).as_deref() == Ok("worker") {
        worker();
    }
    let dir = TempDir::new("worker-sighup");
    let (log, pid_file, ready) = (
        dir.path().join("stderr"),
        dir.path().join("pid"),
        dir.path().join("ready"),
    );
    nodus::Runtime::new().block_on(async {
        let primary = Command::new("sh")
            .args([
                "-c",
                r#""$@" 2>"$LOG" & echo $! >"$PID"; exec sleep 60"#,
                "sh",
            ])
            .arg(std::env::current_exe().unwrap())
            .args([TEST, "--exact", "--nocapture"])
            .env(ROLE, "worker")
            .env(DIR, dir.path())
            .env("LOG", &log)
            .env("PID", &pid_file)
            .env("NODE_UNIQUE_ID", "1")
            .env("NODUS_PRIMARY", "1")
            .stdout(Stdio::Null)
            .ipc(ChannelOptions::default())
            .spawn()
            .unwrap();
        let _primary_killed = KillOnDrop(primary.id() as i32);
        let worker = tree::pid_in(&pid_file, Duration::from_secs(20));
        let _worker_killed = KillOnDrop(worker);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !ready.exists() {
            assert!(Instant::now() < deadline, "the worker never got ready");
            nodus::sleep(Duration::from_millis(20)).await;
        }
        let hup = || kill_process(Pid::from_raw(worker).unwrap(), Signal::HUP).unwrap();

        // Its primary's child: that pid is named.
        hup();
        let line = hup_line(&log, 1).await;
        assert!(
            line.contains(&format!("kill -HUP {})", primary.id())),
            "{line}"
        );

        // The primary dies; the worker (its channel still open here) has another parent.
        primary.kill(libc::SIGKILL).unwrap();
        primary.wait().await.unwrap();
        assert_ne!(tree::parent_of(worker), Some(primary.id()));
        hup();
        let line = hup_line(&log, 2).await;
        assert!(
            line.contains("its cluster primary is gone") && !line.contains("kill -HUP"),
            "{line}"
        );
        assert!(!tree::gone(worker), "the SIGHUP stopped the worker");
    });
}
