//! `nodus::process`: spawn with pipes, exit codes and signals through the pidfd, kill, process
//! groups and kill-tree, the parent-death signal, ref/unref, exec and exec_file (buffer limit, timeout, failure), and fork of a nodus child.
//! Every test bounded in time.

use std::future::Future;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use nodus::process::{Command, ExecErrorKind, ExecOptions, Stdio, exec, exec_file};
use nodus::signal::{SIGKILL, SIGTERM};
use nodus::{Runtime, spawn};

fn bounded<F: Future>(f: F) -> F::Output {
    let rt = Runtime::new();
    rt.block_on(async {
        nodus::timeout(Duration::from_secs(30), f)
            .await
            .expect("test timed out")
    })
}

fn state_of(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')').next()?.trim().chars().next()
}

#[test]
fn spawn_with_pipes_both_ways_and_exit_code() {
    bounded(async {
        let mut child = Command::new("sh")
            .args(["-c", "cat; echo err >&2; exit 7"])
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        stdin.write_all(b"through the pipe\n").await.unwrap();
        stdin.close();
        let mut out = Vec::new();
        child
            .stdout
            .as_ref()
            .unwrap()
            .read_to_end(&mut out)
            .await
            .unwrap();
        let mut err = Vec::new();
        child
            .stderr
            .as_ref()
            .unwrap()
            .read_to_end(&mut err)
            .await
            .unwrap();
        let status = child.wait().await.unwrap();
        assert_eq!(out, b"through the pipe\n");
        assert_eq!(err, b"err\n");
        assert_eq!(status.code(), Some(7));
        assert!(!status.success());
    });
}

#[test]
fn env_cwd_and_stdio_null_inherit_fd() {
    bounded(async {
        let dir = std::env::temp_dir();
        let file = tempfile_path("stdout");
        let f = std::fs::File::create(&file).unwrap();
        let child = Command::new("sh")
            .args(["-c", "printf '%s %s' \"$NODUS_T\" \"$(pwd)\"; cat"])
            .env("NODUS_T", "value")
            .current_dir(&dir)
            .stdin(Stdio::Null)
            .stdout(Stdio::Fd(f.into()))
            .stderr(Stdio::Inherit)
            .spawn()
            .unwrap();
        assert!(child.stdout.is_none());
        assert!(child.wait().await.unwrap().success());
        let got = std::fs::read_to_string(&file).unwrap();
        let _ = std::fs::remove_file(&file);
        assert_eq!(
            got,
            format!("value {}", dir.canonicalize().unwrap().display())
        );
    });
}

fn tempfile_path(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("nodus-proc-{}-{name}", std::process::id()))
}

#[test]
fn kill_reports_the_signal_and_a_second_kill_is_not_found() {
    bounded(async {
        let child = Command::new("sleep").arg("30").spawn().unwrap();
        child.kill(SIGTERM).unwrap();
        let status = child.wait().await.unwrap();
        assert_eq!(status.signal(), Some(SIGTERM));
        assert_eq!(status.code(), None);
        assert_eq!(
            child.kill(SIGTERM).unwrap_err().kind(),
            std::io::ErrorKind::NotFound
        );
        assert_eq!(
            child.kill(12345).unwrap_err().kind(),
            std::io::ErrorKind::InvalidInput
        );
        let missing = Command::new("/nonexistent/program").spawn().unwrap_err();
        assert_eq!(missing.kind(), std::io::ErrorKind::NotFound);
    });
}

#[test]
fn process_group_and_kill_tree_reach_grandchildren() {
    bounded(async {
        let script = "sleep 30 & echo $!; wait";
        let group = Command::new("sh")
            .args(["-c", script])
            .process_group(0)
            .spawn()
            .unwrap();
        let g1 = grand_pid(&group).await;
        group.kill_group(SIGKILL).unwrap();
        assert_eq!(group.wait().await.unwrap().signal(), Some(SIGKILL));
        wait_gone(g1).await;

        let tree = Command::new("sh").args(["-c", script]).spawn().unwrap();
        let g2 = grand_pid(&tree).await;
        tree.kill_tree(SIGKILL).unwrap();
        assert_eq!(tree.wait().await.unwrap().signal(), Some(SIGKILL));
        wait_gone(g2).await;
    });
}

/// The pid a child printed on its first line (a shell's background grandchild).
async fn grand_pid(child: &nodus::process::Child) -> u32 {
    let mut line = String::new();
    let mut buf = [0u8; 64];
    while !line.ends_with('\n') {
        let n = child.stdout.as_ref().unwrap().read(&mut buf).await.unwrap();
        assert!(n > 0);
        line.push_str(std::str::from_utf8(&buf[..n]).unwrap());
    }
    line.trim().parse::<u32>().unwrap()
}

/// Waits until `pid` is gone or a zombie (reaped by init once its parent died).
async fn wait_gone(pid: u32) {
    let start = Instant::now();
    while matches!(state_of(pid), Some(s) if s != 'Z') {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{pid} still alive"
        );
        nodus::sleep(10).await;
    }
}

#[test]
fn a_child_keeps_run_alive_until_it_exits_unless_unrefd() {
    let rt = Runtime::new();
    let start = Instant::now();
    rt.enter(|| {
        let child = Command::new("sleep").arg("0.3").spawn().unwrap();
        spawn(async move {
            child.wait().await.unwrap();
        })
        .detach();
    });
    rt.run();
    assert!(
        start.elapsed() >= Duration::from_millis(250),
        "run waited for the exit"
    );

    let start = Instant::now();
    let child = rt.enter(|| {
        // Pipes are handles of their own (as in Node, where `detached` + `stdio: 'ignore'` +
        // `unref()` is the recipe).
        let c = Command::new("sleep")
            .arg("5")
            .stdin(Stdio::Null)
            .stdout(Stdio::Null)
            .stderr(Stdio::Null)
            .spawn()
            .unwrap();
        c.unref();
        c
    });
    rt.run();
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "an unref'd child does not hold the loop"
    );
    rt.block_on(async {
        child.kill(SIGKILL).unwrap();
        child.wait().await.unwrap();
    });
}

#[test]
fn the_parent_death_signal_fires_when_the_spawning_thread_exits() {
    let pid = std::thread::spawn(|| {
        let rt = Runtime::new();
        rt.block_on(async {
            let child = Command::new("sleep")
                .arg("30")
                .parent_death_signal(Some(SIGKILL))
                .spawn()
                .unwrap();
            child.unref();
            child.id()
        })
    })
    .join()
    .unwrap();
    let start = Instant::now();
    // Killed when the thread exited; left as our zombie (its reaper task died with that loop).
    while state_of(pid) != Some('Z') {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "child {pid} survived its parent thread"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let pidfd = rustix::process::pidfd_open(
        rustix::process::Pid::from_raw(pid as i32).unwrap(),
        rustix::process::PidfdFlags::empty(),
    )
    .unwrap();
    let st = rustix::process::waitid(
        rustix::process::WaitId::PidFd(pidfd.as_fd()),
        rustix::process::WaitIdOptions::EXITED,
    )
    .unwrap()
    .unwrap();
    assert_eq!(st.terminating_signal(), Some(SIGKILL));
}

#[test]
fn exec_collects_output_and_reports_failures() {
    bounded(async {
        let out = exec("echo hello; echo oops >&2", &ExecOptions::default())
            .await
            .unwrap();
        assert_eq!(out.stdout, b"hello\n");
        assert_eq!(out.stderr, b"oops\n");
        assert!(out.status.success());

        let err = exec("echo partial; exit 3", &ExecOptions::default())
            .await
            .unwrap_err();
        assert!(matches!(err.kind, ExecErrorKind::Failed));
        assert_eq!(err.status.unwrap().code(), Some(3));
        assert_eq!(err.stdout, b"partial\n");

        // No shell: the argument is passed as it is.
        let out = exec_file("echo", ["$HOME; not a shell"], &ExecOptions::default())
            .await
            .unwrap();
        assert_eq!(out.stdout, b"$HOME; not a shell\n");

        let opts = ExecOptions {
            env: vec![("NODUS_X".into(), "42".into())],
            ..Default::default()
        };
        assert_eq!(
            exec("printf %s $NODUS_X", &opts).await.unwrap().stdout,
            b"42"
        );
    });
}

#[test]
fn exec_max_buffer_kills_the_child() {
    bounded(async {
        let opts = ExecOptions {
            max_buffer: 1000,
            ..Default::default()
        };
        let start = Instant::now();
        let err = exec("yes", &opts).await.unwrap_err();
        assert!(
            matches!(err.kind, ExecErrorKind::MaxBuffer("stdout")),
            "{err}"
        );
        assert_eq!(err.stdout.len(), 1000);
        assert_eq!(err.status.unwrap().signal(), Some(SIGTERM));
        assert!(start.elapsed() < Duration::from_secs(5));
    });
}

#[test]
fn exec_timeout_kills_the_child() {
    bounded(async {
        let opts = ExecOptions {
            timeout: Some(Duration::from_millis(200)),
            ..Default::default()
        };
        let start = Instant::now();
        // The shell's background grandchild keeps the pipes open: the result must not wait for it.
        let err = exec("echo started; sleep 30 & wait", &opts)
            .await
            .unwrap_err();
        assert!(matches!(err.kind, ExecErrorKind::Timeout), "{err}");
        assert_eq!(err.stdout, b"started\n");
        assert_eq!(err.status.unwrap().signal(), Some(SIGTERM));
        assert!(start.elapsed() < Duration::from_secs(5));
    });
}
