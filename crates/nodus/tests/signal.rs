//! Signals arrive as a stream on the loop, and do not keep it alive unless ref'd.

use std::time::Duration;

use nodus::signal::{SIGTERM, SIGUSR1, SIGUSR2, Signals};
use nodus::{Runtime, set_timeout};

#[test]
fn signals_are_delivered_on_the_loop() {
    let rt = Runtime::new();
    let got = rt.block_on(async {
        let mut signals = Signals::new(&[SIGUSR1, SIGUSR2]).unwrap();
        let pid = rustix::process::getpid();
        set_timeout(5, move || {
            rustix::process::kill_process(pid, rustix::process::Signal::USR2).unwrap();
        });
        let first = signals.recv().await;
        rustix::process::kill_process(pid, rustix::process::Signal::USR1).unwrap();
        let second = nodus::timeout(Duration::from_secs(5), signals.recv())
            .await
            .unwrap();
        (first, second)
    });
    assert_eq!(got, (SIGUSR2, SIGUSR1));
}

#[test]
fn a_signal_stream_does_not_keep_run_alive_unless_refd() {
    let rt = Runtime::new();
    let signals = rt.enter(|| Signals::new(&[SIGUSR2]).unwrap());
    rt.run(); // returns at once: nothing ref'd
    rt.enter(|| {
        signals.ref_();
        set_timeout(5, || nodus::rt::stop());
    });
    rt.run(); // kept alive by the ref'd stream until stop()
    rt.enter(|| drop(signals));
}

/// The child half of the next test, run in a process of its own (this test binary again): its
/// default action kills the process.
fn catch_then_release_sigterm() {
    let rt = Runtime::new();
    rt.block_on(async {
        let pid = rustix::process::getpid();
        let term = || rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
        let first = Signals::new(&[SIGTERM]).unwrap();
        let mut second = Signals::new(&[SIGTERM, SIGTERM]).unwrap();
        drop(first);
        term();
        let got = nodus::timeout(Duration::from_secs(20), second.recv()).await;
        println!("the second stream caught {got:?}");
        drop(second);
        println!("no stream left");
        term();
        nodus::sleep(Duration::from_secs(20)).await;
        println!("still alive");
    });
}

#[test]
fn once_no_stream_catches_a_signal_its_default_action_is_back() {
    const CHILD: &str = "NODUS_TEST_SIGNAL_CHILD";
    if std::env::var_os(CHILD).is_some() {
        catch_then_release_sigterm();
        return;
    }
    let mut child = nodus_testkit::proc::Proc::spawn(
        std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "once_no_stream_catches_a_signal_its_default_action_is_back",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD, "1")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped()),
    );
    child.wait_line(&format!("the second stream caught Ok({SIGTERM})"));
    child.wait_line("no stream left");
    let status = child
        .exited_within(Duration::from_secs(30))
        .expect("the child exits");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        status.signal(),
        Some(SIGTERM),
        "{status}: {:?}",
        child.output()
    );
}

#[test]
fn a_signal_that_cannot_be_caught_is_an_error() {
    let rt = Runtime::new();
    let err = rt
        .enter(|| Signals::new(&[SIGUSR1, nodus::signal::SIGKILL]))
        .err()
        .expect("SIGKILL cannot be caught");
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    assert!(err.to_string().contains("SIGKILL"), "{err}");
}

/// Forks a process that runs `child` and `_exit`s with its code; returns its wait status
/// (SIGKILLed after 20 s).
fn fork_and_wait(child: fn() -> i32) -> libc::c_int {
    // SAFETY: the forked process runs `child` (nodus code of this test) and `_exit`s, never
    // returning into the harness.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let code = std::panic::catch_unwind(child).unwrap_or(99);
        // SAFETY: ends the forked process without running this one's exit handlers.
        unsafe { libc::_exit(code) };
    }
    assert!(pid > 0, "fork: {}", std::io::Error::last_os_error());
    nodus_testkit::proc::reap_within(pid, Duration::from_secs(20))
}

/// Sends SIGTERM to this process, then waits 5 s for it to end: 3 if it did not.
fn term_self() -> i32 {
    let me = rustix::process::getpid();
    rustix::process::kill_process(me, rustix::process::Signal::TERM).unwrap();
    std::thread::sleep(Duration::from_secs(5));
    3
}

fn assert_ended_by_sigterm(status: libc::c_int, what: &str) {
    assert!(
        libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == SIGTERM,
        "{what}: wait status {status:#x} (exit code {} when it did not end by SIGTERM: 2 = its \
         own stream caught nothing, 3 = SIGTERM swallowed)",
        libc::WEXITSTATUS(status)
    );
}

/// A process forked without `exec` from one whose loop catches SIGTERM runs none of that loop:
/// there a SIGTERM does what it does by default (ends it) instead of being written to a pipe no
/// one reads. A stream it makes of its own catches it, and once that stream is dropped the
/// default is back. The parent's stream still catches it in the parent.
#[test]
fn a_process_forked_without_exec_gets_the_default_action_of_what_its_parents_loop_caught() {
    const NAME: &str =
        "a_process_forked_without_exec_gets_the_default_action_of_what_its_parents_loop_caught";
    if !nodus_testkit::alone::is_inner(NAME) {
        let (code, out) = nodus_testkit::alone::run(NAME);
        assert!(code == Some(0) && out.contains("1 passed"), "{out}");
        return;
    }
    let rt = Runtime::new();
    let mut parents = rt.enter(|| Signals::new(&[SIGTERM, SIGUSR1]).unwrap());
    assert_ended_by_sigterm(fork_and_wait(term_self), "forked, SIGTERM");
    let status = fork_and_wait(|| {
        let rt = Runtime::new();
        let caught = rt.block_on(async {
            let mut own = Signals::new(&[SIGTERM]).unwrap();
            let me = rustix::process::getpid();
            rustix::process::kill_process(me, rustix::process::Signal::TERM).unwrap();
            nodus::timeout(Duration::from_secs(5), own.recv()).await
        });
        if caught != Ok(SIGTERM) {
            return 2;
        }
        term_self()
    });
    assert_ended_by_sigterm(
        status,
        "forked, a stream of its own caught SIGTERM and was dropped",
    );
    let got = rt.block_on(async {
        let me = rustix::process::getpid();
        rustix::process::kill_process(me, rustix::process::Signal::TERM).unwrap();
        nodus::timeout(Duration::from_secs(5), parents.recv()).await
    });
    assert_eq!(got, Ok(SIGTERM));
}
