//! The scheduling policy of a cluster primary's loop thread.
//!
//! A round-robin primary wakes for every few new connections, accepts them and hands them on: work
//! that loses nothing by waiting for a busy core to come free. Under the normal policy each wake-up
//! preempts a worker or the client, and the primary runs for one or two connections at a time.
//! `SCHED_BATCH` (same CPU share, no wake-up preemption) lets connections gather while the cores
//! are busy: more per wake-up, fewer context switches; on an idle core it runs at once, as before
//! (BENCHMARKS.md, cluster section).
//!
//! Invariants: only a thread running the normal policy is switched (a policy the user chose, with
//! `chrt` say, stays); the policy is inherited across `fork` and `exec`, so every child a switched
//! thread spawns through [`Command`] (its workers, and any other) is put back to the normal policy
//! before `exec` ([`switched_this_thread`]).
//!
//! [`Command`]: super::Command

use std::cell::Cell;
use std::io;

thread_local! {
    /// This thread runs `SCHED_BATCH` because [`batch_this_thread`] switched it.
    static SWITCHED: Cell<bool> = const { Cell::new(false) };
}

/// Whether nodus switched the calling thread to `SCHED_BATCH` (its children must not inherit it).
pub(crate) fn switched_this_thread() -> bool {
    SWITCHED.with(Cell::get)
}

/// Switches the calling thread from the normal policy to `SCHED_BATCH`; `true` when it did.
pub(crate) fn batch_this_thread() -> bool {
    // SAFETY: plain syscalls on the calling thread (pid 0) with a valid, initialized param.
    unsafe {
        if libc::sched_getscheduler(0) != libc::SCHED_OTHER {
            return false;
        }
        let param = libc::sched_param { sched_priority: 0 };
        if libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) != 0 {
            tracing::debug!(
                "cannot switch to SCHED_BATCH: {}",
                io::Error::last_os_error()
            );
            return false;
        }
    }
    SWITCHED.with(|s| s.set(true));
    true
}

/// Puts the calling thread back to the normal policy. Async-signal-safe: one syscall, no
/// allocation (for a child between `fork` and `exec`).
pub(crate) fn normal_this_thread() -> io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: a plain syscall on the calling thread with a valid, initialized param.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_OTHER, &param) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_switches_to_batch_and_back() {
        std::thread::spawn(|| {
            // SAFETY: a plain query of the calling thread's policy.
            let policy = || unsafe { libc::sched_getscheduler(0) };
            assert_eq!(policy(), libc::SCHED_OTHER);
            assert!(batch_this_thread());
            assert_eq!(policy(), libc::SCHED_BATCH);
            assert!(!batch_this_thread(), "only the normal policy is switched");
            normal_this_thread().unwrap();
            assert_eq!(policy(), libc::SCHED_OTHER);
        })
        .join()
        .unwrap();
    }
}
