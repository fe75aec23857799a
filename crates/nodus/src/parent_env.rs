//! The variables a parent sets for this process alone: `NODE_CHANNEL_FD` and
//! `NODE_CHANNEL_SERIALIZATION_MODE` (the IPC channel: `ipc`), `NODE_UNIQUE_ID` and
//! `NODUS_PRIMARY` (a cluster worker: `cluster::worker`). nodus takes them out of the
//! environment once, as Node does at its startup, so that no grandchild inherits them however it
//! is spawned, and hands each out once (a second `Channel::from_env` finds no channel).
//!
//! Invariants:
//! - They are taken (read, and those set removed with `std::env::remove_var`) before nodus
//!   starts any thread of its own: by the first [`Runtime`](crate::Runtime) built, pool started
//!   or output writer started (whose threads are the only ones started without a runtime:
//!   the watchdog's and the orphan reaper's need one), or by the first call that hands one out,
//!   whichever comes first ([`take`], once; a caller meanwhile waits for it). So no thread of
//!   nodus's reads the environment through libc while it is rewritten: a pool thread's
//!   `getaddrinfo` (`dns`) reads `RES_OPTIONS`, `LOCALDOMAIN` and others with libc's `getenv`,
//!   which does not take the lock `remove_var` takes, and a tracing subscriber on one of
//!   nodus's threads may call `localtime`.
//! - The program's own threads are the program's to order, as for any `remove_var`: none may
//!   read the environment through libc while the variables are taken (std's readers,
//!   `std::env::var`, take the lock). Hence the rule its documentation states
//!   ([`Builder::build`](crate::rt::Builder::build)): the first runtime, pool or
//!   `Channel::from_env` comes before threads that call `getenv`, `getaddrinfo` or `localtime`.
//! - Set by the program itself once they were taken, they are not seen. Where none is set (a
//!   process no parent gave a channel), nothing is removed: the environment is not written.

use std::ffi::OsString;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

const CHANNEL_FD: &str = "NODE_CHANNEL_FD";
const CHANNEL_MODE: &str = "NODE_CHANNEL_SERIALIZATION_MODE";
const UNIQUE_ID: &str = "NODE_UNIQUE_ID";
/// Set (to `1`) by a nodus primary in the environment of the workers it talks to over a channel:
/// the worker knows from its first message on that it may use nodus's own messages (cluster
/// stats, giving connections back). A stock Node primary never answers them.
pub(crate) const NODUS_PRIMARY: &str = "NODUS_PRIMARY";

/// What was taken, each part handed out once.
struct Taken {
    /// `NODE_CHANNEL_FD` and `NODE_CHANNEL_SERIALIZATION_MODE`.
    channel: Option<(OsString, Option<OsString>)>,
    channel_out: AtomicBool,
    /// `NODE_UNIQUE_ID`, and whether `NODUS_PRIMARY` was `1`.
    worker: Option<(OsString, bool)>,
    worker_out: AtomicBool,
}

static TAKEN: OnceLock<Taken> = OnceLock::new();

/// Takes the variables out of the environment, the first time (see the module doc).
pub(crate) fn take() {
    taken();
}

fn taken() -> &'static Taken {
    TAKEN.get_or_init(|| {
        let [fd, mode, unique, primary] =
            [CHANNEL_FD, CHANNEL_MODE, UNIQUE_ID, NODUS_PRIMARY].map(|name| {
                let value = std::env::var_os(name);
                if value.is_some() {
                    // SAFETY: `remove_var` is sound while no other thread reads or writes the
                    // environment other than through std (whose accessors take the lock it
                    // takes). No thread of nodus's exists yet: each is started after a call to
                    // `take` has returned, and a call made meanwhile waits in this `OnceLock`
                    // (module invariant). The program's own threads that would read it through
                    // libc now break the rule its documentation states (`Builder::build`,
                    // `Channel::from_env`, `Worker::get`): the variables are taken (the first
                    // runtime built, say) before such threads start.
                    unsafe { std::env::remove_var(name) };
                }
                value
            });
        Taken {
            channel: fd.map(|fd| (fd, mode)),
            channel_out: AtomicBool::new(false),
            worker: unique.map(|unique| (unique, primary.is_some_and(|v| v == "1"))),
            worker_out: AtomicBool::new(false),
        }
    })
}

/// `NODE_CHANNEL_FD` and `NODE_CHANNEL_SERIALIZATION_MODE`, to the first caller.
pub(crate) fn channel() -> Option<(OsString, Option<OsString>)> {
    let taken = taken();
    if taken.channel_out.swap(true, Ordering::AcqRel) {
        return None;
    }
    taken.channel.clone()
}

/// `NODE_UNIQUE_ID`, and whether a nodus primary set `NODUS_PRIMARY=1`, to the first caller.
pub(crate) fn worker() -> Option<(OsString, bool)> {
    let taken = taken();
    if taken.worker_out.swap(true, Ordering::AcqRel) {
        return None;
    }
    taken.worker.clone()
}

/// Whether a cluster primary started this process (`NODE_UNIQUE_ID` set by the parent), taken
/// or not; takes nothing.
pub(crate) fn started_as_worker() -> bool {
    match TAKEN.get() {
        Some(taken) => taken.worker.is_some(),
        None => std::env::var_os(UNIQUE_ID).is_some(),
    }
}
