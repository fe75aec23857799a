//! nodus's process-wide locks, kept whole across a `fork`.
//!
//! A `fork` copies the process with the forking thread alone: a lock another thread holds at
//! that moment stays held for good in the copy, its data maybe half updated. A process forked
//! without `exec` from a nodus process may still use nodus (spawn, hand children to the orphan
//! reaper, make a `Runtime`, catch signals), so the forking thread takes every process-wide lock
//! of nodus's before the fork and lets them go after it, in the parent and in the child
//! (`pthread_atfork` handlers, whichever code forks: std's `Command`, nodus's own, the
//! program's; glibc's `fork`, not a raw `clone`). In this order:
//! 1. the registry of nodus's own children (`process::reaper`),
//! 2. the orphan queue (`process::orphans`),
//! 3. the process's live loops (`rt::context`),
//! 4. the signal streams' counts (`signal`; also held around nodus's every registration and
//!    unregistration of a signal-hook action, so no fork copies signal-hook's registry lock held
//!    by a thread of nodus's: see `signal` for what that covers and what not),
//! 5. the watchdog's pending registrations, then 6. its ring of stalls (`watchdog`).
//!
//! Invariants:
//! - The handlers are registered ([`register`]) by each lock's accessor before it locks, so no
//!   thread holds one of them before they exist.
//! - None of them is held while another is taken (each guards a few statements on its own data),
//!   so the order above is never inverted and the handlers cannot deadlock with a holder. A
//!   future nested use must take them in this order.
//! - nodus never forks holding one (the handlers would wait for this very thread), nor runs code
//!   of the program's holding one (a tracing subscriber may fork, or spawn through
//!   `nodus::process`): the lines to log under one are logged once it is let go. What nodus
//!   runs in its own forked children without `exec` (`pre_exec` steps, the orphan guard) takes
//!   none: raw syscalls.
//! - The child handler gives back the default action of every signal the parent's streams catch
//!   (`signal::forked`: atomic stores through the lock it holds; the parent's loops do not run in
//!   the child, so their streams would swallow the signal), then unlocks: async-signal-safe, no
//!   allocation, no free. What the locks guard that is the parent's alone (its children, its
//!   forks in progress, the children handed to its orphan thread, its streams' counts) is dropped
//!   by the registry, the orphan queue and the signal counts themselves at their first lock in
//!   the forked process, which they tell by the pid that owns them.
//! - A fork pays six uncontended locks, or waits while a holder finishes (the longest: a
//!   subreaper pass, a listing of `/proc`; a signal stream's registration with signal-hook, which
//!   waits for signal-hook's handlers running on other threads).

use std::cell::RefCell;
use std::sync::Once;

use crate::process::{QueueGuard, TableGuard, lock_queue, lock_table};
use crate::rt::context::{LoopsGuard, lock_loops};
use crate::signal::{ListenersGuard, lock_listeners};
use crate::watchdog::{PendingGuard, RingGuard, lock_pending, lock_ring};

/// Every lock of the module doc, in its order.
struct Held {
    _registry: TableGuard,
    _orphans: QueueGuard,
    _loops: LoopsGuard,
    signals: ListenersGuard,
    _pending: PendingGuard,
    _ring: RingGuard,
}

thread_local! {
    /// The locks this thread holds across a `fork`.
    static HELD_ACROSS_FORK: RefCell<Option<Held>> = const { RefCell::new(None) };
}

/// Registers the fork handlers, once (see the module doc).
pub(crate) fn register() {
    static REGISTERED: Once = Once::new();
    REGISTERED.call_once(|| {
        // SAFETY: registers plain `extern "C"` functions without arguments; they never unwind
        // (a panic in them aborts) and stay valid for the life of the process.
        let r = unsafe { libc::pthread_atfork(Some(before_fork), Some(in_parent), Some(in_child)) };
        if r != 0 {
            tracing::warn!(
                target: "nodus",
                "cannot register fork handlers ({}): a process forked without exec may find \
                 nodus's locks held",
                std::io::Error::from_raw_os_error(r)
            );
        }
    });
}

/// Before a `fork`, on the forking thread: takes every lock, in order (fields are evaluated in
/// the order written). Not if this thread's locals are gone (it is exiting): then nothing is
/// held, as without the handlers.
extern "C" fn before_fork() {
    let _ = HELD_ACROSS_FORK.try_with(|held| {
        *held.borrow_mut() = Some(Held {
            _registry: take(0, lock_table),
            _orphans: take(1, lock_queue),
            _loops: take(2, lock_loops),
            signals: take(3, lock_listeners),
            _pending: take(4, lock_pending),
            _ring: take(5, lock_ring),
        });
    });
}

/// Takes lock number `_index` (of the module doc, from 0) for a fork; in tests, says so first.
fn take<G>(_index: usize, lock: fn() -> G) -> G {
    #[cfg(test)]
    tests::TAKING[_index].fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    lock()
}

/// After a `fork`, in the parent: lets them go.
extern "C" fn in_parent() {
    let _ = HELD_ACROSS_FORK.try_with(|held| drop(held.borrow_mut().take()));
}

/// After a `fork`, in the child (the forking thread's copy): gives the signals the parent's
/// streams catch their default action back, then lets the locks go (see the module doc).
extern "C" fn in_child() {
    let _ = HELD_ACROSS_FORK.try_with(|held| {
        let held = held.borrow_mut().take();
        if let Some(held) = &held {
            crate::signal::forked(&held.signals);
        }
        drop(held);
    });
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex, mpsc};
    use std::time::{Duration, Instant};

    use super::*;

    /// Per lock (the module doc's order): how many forks' handlers have begun to take it.
    pub(crate) static TAKING: [AtomicUsize; 6] = [const { AtomicUsize::new(0) }; 6];

    /// One such test at a time: two holders each waiting for the other's fork would only be
    /// let go by their hang bound.
    static SERIAL: Mutex<()> = Mutex::new(());

    /// Has another thread take lock `index` through `lock` and hold it until the fork has begun
    /// to take it (the fork then waits in its handler until the holder lets go) or, without a
    /// handler for it, until the fork has returned: so the fork always starts while the lock is
    /// held. The forked process takes its copy through `lock` and `_exit(0)`s. Returns its wait
    /// status (SIGKILLed after 10 s, should its copy be locked).
    fn fork_while_another_thread_holds<G: 'static>(index: usize, lock: fn() -> G) -> libc::c_int {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        register();
        let forked = Arc::new(AtomicBool::new(false));
        let (held, is_held) = mpsc::channel();
        let holder = {
            let forked = forked.clone();
            std::thread::spawn(move || {
                let before = TAKING[index].load(Ordering::SeqCst);
                let guard = lock();
                held.send(()).unwrap();
                // Bounded: a fork elsewhere in this binary, waiting for this lock, may hold
                // glibc's fork lock and so keep ours from starting.
                let limit = Instant::now() + Duration::from_secs(10);
                while TAKING[index].load(Ordering::SeqCst) == before
                    && !forked.load(Ordering::SeqCst)
                    && Instant::now() < limit
                {
                    std::thread::sleep(Duration::from_millis(1));
                }
                drop(guard);
            })
        };
        is_held.recv().unwrap();
        // SAFETY: the child takes one lock (free in its copy, or the test fails by timeout)
        // and `_exit`s: no allocation, no return into the test harness.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            drop(lock());
            // SAFETY: ends the forked child without running this process's exit handlers.
            unsafe { libc::_exit(0) };
        }
        forked.store(true, Ordering::SeqCst);
        assert!(pid > 0);
        holder.join().unwrap();
        nodus_testkit::proc::reap_within(pid, Duration::from_secs(10))
    }

    fn assert_exited_0(status: libc::c_int) {
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "forked process: wait status {status:#x} (SIGKILLed: its copy of the lock was held)"
        );
    }

    /// A fork while another thread holds the registry's lock (a subreaper pass, a spawn or a
    /// reap on another thread) waits for it: the forked process's first spawn does not block
    /// for good on a copy left locked.
    #[test]
    fn a_fork_waits_for_the_registry_lock() {
        assert_exited_0(fork_while_another_thread_holds(0, lock_table));
    }

    /// The same for the orphan queue's lock (the orphan thread taking what was handed over):
    /// the forked process's first hand-off.
    #[test]
    fn a_fork_waits_for_the_orphan_queue_lock() {
        assert_exited_0(fork_while_another_thread_holds(1, lock_queue));
    }

    /// The same for the list of live loops (a `Runtime` made or dropped on another thread, a
    /// `Sleep` posting to its loop): the forked process's first `Runtime::new`.
    #[test]
    fn a_fork_waits_for_the_loops_lock() {
        assert_exited_0(fork_while_another_thread_holds(2, lock_loops));
    }

    /// The same for the signal streams' counts (a `Signals` made or dropped on another
    /// thread): the forked process's first `Signals::new`.
    #[test]
    fn a_fork_waits_for_the_signal_listeners_lock() {
        assert_exited_0(fork_while_another_thread_holds(3, lock_listeners));
    }

    /// The same for the watchdog's pending registrations (its thread taking them, a loop made
    /// on another thread): the forked process's first `Runtime::new`.
    #[test]
    fn a_fork_waits_for_the_watchdog_pending_lock() {
        assert_exited_0(fork_while_another_thread_holds(4, lock_pending));
    }

    /// The same for the watchdog's ring of stalls (its thread writing a report): the forked
    /// process's first `recent_stalls`.
    #[test]
    fn a_fork_waits_for_the_watchdog_ring_lock() {
        assert_exited_0(fork_while_another_thread_holds(5, lock_ring));
    }
}
