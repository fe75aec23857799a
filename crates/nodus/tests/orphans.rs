//! The orphan reaper (`process/orphans.rs`) where a process forks or its fd limit is lowered.
//! Each scenario runs in a fresh process of its own (this test binary re-executed, one test, one thread), since
//! it forks or lowers a process-wide limit. Every process started is killed by pid; every wait is
//! bounded.

use std::os::unix::process::CommandExt;
use std::time::{Duration, Instant};

use nodus::Runtime;
use nodus::process::Command;
use nodus_testkit::tree;

const INNER: &str = "NODUS_ORPHANS_TEST_INNER";

/// Runs test `name` alone in a new process of this binary (the scenario itself, `INNER` set),
/// leading a process group of its own; returns its exit code and its output. Its group is
/// SIGKILLed after 30 s (a process it forked, which holds its output open, with it).
fn in_own_process(name: &str) -> (Option<i32>, String) {
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--test-threads=1", "--nocapture"])
        .env(INNER, name)
        .process_group(0)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            // SAFETY: a plain syscall on the group our unreaped child leads (its number cannot
            // be another's).
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

fn inner(name: &str) -> bool {
    std::env::var(INNER).is_ok_and(|n| n == name)
}

/// Whether `pid` is an unreaped zombie child of this process.
fn our_zombie(pid: i32) -> bool {
    tree::parent_of(pid) == Some(std::process::id()) && tree::is_zombie(pid)
}

/// The pid of a `sleep SECS` spawned on a runtime that is then dropped, its `Child` with it:
/// handed to the orphan reaper's thread.
fn orphan_sleep(secs: &str) -> i32 {
    let rt = Runtime::new();
    let pid = rt.block_on(async { Command::new("sleep").arg(secs).spawn().unwrap().id() });
    drop(rt);
    pid as i32
}

/// Whether this process has a thread named `nodus-orphans`.
fn orphan_thread_runs() -> bool {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .any(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .is_ok_and(|c| c.trim() == "nodus-orphans")
        })
}

/// The orphan queue survives a `fork` (without `exec`), its thread does not: the forked process's
/// first hand-off starts a thread of its own, which reaps the child.
#[test]
fn a_forked_process_reaps_its_orphans_with_a_thread_of_its_own() {
    const NAME: &str = "a_forked_process_reaps_its_orphans_with_a_thread_of_its_own";
    if inner(NAME) {
        // The thread runs in this (single-threaded until now) process, holding a long child.
        let long = orphan_sleep("20");
        let deadline = Instant::now() + Duration::from_secs(5);
        while !orphan_thread_runs() {
            assert!(Instant::now() < deadline, "no orphan thread");
            std::thread::sleep(Duration::from_millis(5));
        }
        // SAFETY: the child only runs nodus code of this test and `_exit`s; the other thread
        // (the orphan reaper) holds at most nodus's queue lock or registry lock, which nodus's
        // fork handlers take around the fork, or glibc's malloc locks, which glibc's do.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let code = std::panic::catch_unwind(|| {
                let short = orphan_sleep("0.2");
                std::thread::sleep(Duration::from_millis(1500));
                if our_zombie(short) {
                    println!(
                        "FORKED: child {short} exited 1.3 s ago and is still our zombie \
                         (orphan thread in this process: {})",
                        orphan_thread_runs()
                    );
                    3
                } else {
                    println!("FORKED: child {short} reaped");
                    0
                }
            })
            .unwrap_or(4);
            // SAFETY: ends the forked child without running the parent's atexit handlers.
            unsafe { libc::_exit(code) };
        }
        assert!(pid > 0);
        let mut status = 0;
        // SAFETY: waits for our own child, bounded by the outer test's 30 s.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        // SAFETY: `long` is our unreaped child (the orphan thread holds it).
        unsafe { libc::kill(long, libc::SIGKILL) };
        assert!(libc::WIFEXITED(status), "forked child: status {status:#x}");
        assert_eq!(
            libc::WEXITSTATUS(status),
            0,
            "in the forked process, a child whose runtime was dropped was left a zombie"
        );
        return;
    }
    let (code, out) = in_own_process(NAME);
    assert_eq!(code, Some(0), "{out}");
}

/// More orphans than the soft `RLIMIT_NOFILE` (lowered after their pidfds were opened: `prlimit`,
/// a sandboxing step) make one `poll` of them all fail with `EINVAL`; they are still reaped, by
/// the thread looking at each fd alone.
#[test]
fn orphans_past_a_lowered_fd_limit_are_still_reaped() {
    const NAME: &str = "orphans_past_a_lowered_fd_limit_are_still_reaped";
    if inner(NAME) {
        let pids: Vec<i32> = (0..12).map(|_| orphan_sleep("0.3")).collect();
        // One more, its `Child` kept past its runtime: dropped below, a hand-off that needs no
        // new fd and wakes the thread, whose next `poll` then has 14 fds.
        let rt = Runtime::new();
        let last = rt.block_on(async { Command::new("sleep").arg("0.3").spawn().unwrap() });
        drop(rt);
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: reads this process's limit into a valid struct.
        assert_eq!(
            unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) },
            0
        );
        let saved = limit;
        limit.rlim_cur = 8;
        // SAFETY: sets this process's soft limit from a valid struct.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) }, 0);
        drop(last);
        std::thread::sleep(Duration::from_millis(1500));
        let zombies: Vec<i32> = pids.iter().copied().filter(|&p| our_zombie(p)).collect();
        // SAFETY: as above.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &saved) }, 0);
        assert!(
            zombies.is_empty(),
            "{} of {} orphans exited 1.2 s ago and are still our zombies",
            zombies.len(),
            pids.len()
        );
        return;
    }
    let (code, out) = in_own_process(NAME);
    assert_eq!(code, Some(0), "{out}");
}
