//! The orphan reaper (`process/orphans.rs`) where a process forks or its fd limit is lowered, or
//! where a subreaper primary's runtime is dropped without a stop (its adopted processes are
//! handed to the orphan reaper). Each scenario runs in a fresh process of its own (this test
//! binary re-executed, one test, one thread), since it forks, lowers a process-wide limit or
//! marks the process a subreaper. Every process started is killed by pid; every wait is bounded.

use std::time::{Duration, Instant};

use nodus::Runtime;
use nodus::cluster::{Config, Primary, Readiness, WorkerCommand};
use nodus::process::Command;
use nodus_testkit::tree;

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
    if nodus_testkit::alone::is_inner(NAME) {
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
    let (code, out) = nodus_testkit::alone::run(NAME);
    assert_eq!(code, Some(0), "{out}");
}

/// More orphans than the soft `RLIMIT_NOFILE` (lowered after their pidfds were opened: `prlimit`,
/// a sandboxing step) make one `poll` of them all fail with `EINVAL`; they are still reaped, by
/// the thread looking at each fd alone.
#[test]
fn orphans_past_a_lowered_fd_limit_are_still_reaped() {
    const NAME: &str = "orphans_past_a_lowered_fd_limit_are_still_reaped";
    if nodus_testkit::alone::is_inner(NAME) {
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
    let (code, out) = nodus_testkit::alone::run(NAME);
    assert_eq!(code, Some(0), "{out}");
}

/// Whether `pid` has been reaped (no `/proc` entry, zombie or not).
fn reaped(pid: i32) -> bool {
    std::fs::metadata(format!("/proc/{pid}")).is_err()
}

/// Whether this process is a child subreaper (`PR_GET_CHILD_SUBREAPER`).
fn is_subreaper() -> bool {
    let mut on: libc::c_int = 0;
    // SAFETY: `prctl` writes one int through the pointer, which is valid for that.
    let r = unsafe { libc::prctl(libc::PR_GET_CHILD_SUBREAPER, &mut on as *mut libc::c_int) };
    assert_eq!(r, 0);
    on != 0
}

/// A subreaper primary (one worker, `sh`) whose worker orphans a `sleep 30` (its parent, a
/// second `sh`, exits at once): the primary, its runtime (the primary runs no `run`), and the
/// adopted sleep's pid, once the primary has adopted it and its reaper has counted it (so the
/// orphan guard remembers it); and a guard that kills the worker and the sleep by pid.
fn primary_with_an_adopted_sleep(
    dir: &nodus_testkit::tmp::TempDir,
) -> (Runtime, Primary, i32, tree::KillOnDrop) {
    let file = dir.path().join("pid");
    let script = format!(
        "sh -c 'sleep 30 & echo $! > {}'; exec sleep 30",
        file.display()
    );
    let mut config = Config::new(
        1,
        WorkerCommand {
            program: "sh".into(),
            args: vec!["-c".into(), script.into()],
            env: Vec::new(),
            ipc: false,
        },
    );
    config.readiness = Readiness::Alive(Duration::from_millis(10));
    config.prefix_output = false;
    config.subreaper = true;
    let rt = Runtime::new();
    let primary = rt.block_on(async { Primary::start(config).unwrap() });
    let orphan = tree::pid_in(&file, Duration::from_secs(10));
    tree::wait_parent(orphan, std::process::id(), Duration::from_secs(10));
    rt.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !primary
            .stats_json()
            .await
            .contains(r#""orphans_adopted":1"#)
        {
            assert!(Instant::now() < deadline, "{}", primary.stats_json().await);
            nodus::sleep(Duration::from_millis(20)).await;
        }
    });
    let mut pids: Vec<i32> = primary
        .worker_pids()
        .iter()
        .map(|&(_, p)| p as i32)
        .collect();
    pids.push(orphan);
    (rt, primary, orphan, tree::KillOnDrop(pids))
}

/// Waits until `pid` is reaped (10 s at most); `false` if it is still there then.
fn reaped_within_10s(pid: i32) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !reaped(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    reaped(pid)
}

/// A child this program starts with `std::process` keeps its exit status (no one else reaps
/// it).
fn a_std_child_keeps_its_status() {
    let status = std::process::Command::new("sh")
        .args(["-c", "sleep 0.2; exit 7"])
        .status()
        .expect("its own wait gets its status");
    assert_eq!(status.code(), Some(7));
}

/// A subreaper primary's runtime dropped without a stop, its `Primary` with it: the orphan
/// guard's end of file SIGKILLs the process the primary adopted, which is then reaped (by the
/// orphan reaper, after the guard's exit): no zombie is left. The subreaper mark is off, and a
/// child the program starts afterwards with `std::process` keeps its exit status.
#[test]
fn a_subreaper_primary_dropped_without_a_stop_leaves_no_zombie() {
    const NAME: &str = "a_subreaper_primary_dropped_without_a_stop_leaves_no_zombie";
    if nodus_testkit::alone::is_inner(NAME) {
        let dir = nodus_testkit::tmp::TempDir::new("orphans-subreaper-drop");
        let (rt, primary, orphan, _kill) = primary_with_an_adopted_sleep(&dir);
        drop(primary);
        drop(rt);
        assert!(
            reaped_within_10s(orphan),
            "adopted process {orphan} (zombie: {}) still there 10 s after its primary's runtime \
             was dropped",
            tree::is_zombie(orphan)
        );
        assert!(!is_subreaper(), "still a subreaper, with no reaper");
        a_std_child_keeps_its_status();
        return;
    }
    let (code, out) = nodus_testkit::alone::run(NAME);
    assert_eq!(code, Some(0), "{out}");
}

/// A subreaper primary's runtime dropped without a stop while its `Primary` is still held: the
/// reaper ends with the runtime (its task), so the process is no subreaper any more (an orphan
/// would find no one to reap it here); the process it adopted is reaped once it has exited and
/// the orphan guard, which remembers it, is gone too (the `Primary`'s drop closes it).
#[test]
fn a_subreaper_primary_held_past_its_runtime_leaves_no_zombie() {
    const NAME: &str = "a_subreaper_primary_held_past_its_runtime_leaves_no_zombie";
    if nodus_testkit::alone::is_inner(NAME) {
        let dir = nodus_testkit::tmp::TempDir::new("orphans-subreaper-held");
        let (rt, primary, orphan, _kill) = primary_with_an_adopted_sleep(&dir);
        drop(rt);
        assert!(!is_subreaper(), "still a subreaper, with no reaper");
        // It exits while the guard still remembers it: not reaped yet (its number stays taken).
        // SAFETY: a plain syscall on our unreaped child (its number cannot be another's).
        assert_eq!(unsafe { libc::kill(orphan, libc::SIGKILL) }, 0);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !tree::is_zombie(orphan) {
            assert!(Instant::now() < deadline, "{orphan} does not die");
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(200));
        assert!(
            tree::is_zombie(orphan),
            "reaped while the orphan guard remembers it"
        );
        drop(primary);
        assert!(
            reaped_within_10s(orphan),
            "adopted process {orphan} still a zombie 10 s after its primary was dropped"
        );
        a_std_child_keeps_its_status();
        return;
    }
    let (code, out) = nodus_testkit::alone::run(NAME);
    assert_eq!(code, Some(0), "{out}");
}
