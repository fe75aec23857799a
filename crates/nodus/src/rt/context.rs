//! Which loop (if any) the current thread is running: the thread-local behind every free
//! function (`set_timeout`, `spawn`, `next_tick`, ...).
//!
//! Invariants:
//! - `CURRENT` is non-null only while an [`Entered`] guard lives on this thread's stack; the guard
//!   holds an `Rc<Core>`, so the pointer is valid for the guard's whole life.
//! - Guards nest (the previous value is restored on drop, including while unwinding), but nodus
//!   refuses to *run* a loop inside a running loop (`block_on` inside a callback would deadlock).
//! - `LOOPS` lists the loops of this thread whose `Runtime` is alive, each by its id with a weak
//!   reference (`Core::me`): a loop is added when its `Core` is made and removed when its
//!   `Runtime` is dropped (after its shutdown). [`with_loop`] reaches a handle's own loop through
//!   it when that loop is not the current one. Every access is a `try_with`, so none panics during
//!   the thread's teardown: a `Runtime` made by a thread-local's destructor once the list is gone
//!   works unlisted (its handles reach it only while it is current).
//!
//! A raw pointer instead of `RefCell<Option<Rc<Core>>>`: the free functions are on the hottest
//! paths (`next_tick` is a 25 ns operation), and a `Cell<*const _>` read is one load.
//!
//! **Handles reach their own loop.** A handle that names an entry of a loop (a timer, a sleep,
//! an immediate, a hook, a request unit) acts on the loop that made it, whichever loop is current
//! when it is used or dropped: that loop's own state when it is current (one load and a compare,
//! the hot path), else through `LOOPS` (after `block_on` returned, while another `Runtime` is
//! current or drops, or from code run by no loop). Never another loop's entry (loop ids are
//! unique in the process, and every entry carries its own id or generation, so a key reused
//! since names nothing). Once its `Runtime` is dropped, or from another thread (the handles that
//! are `Send`: `Timer`, `Immediate`, `HookHandle`, `Sleep`), there is nothing to reach and the
//! handle does nothing: the loop's entries went with it, or belong to that loop's thread.
//! Handles that are `!Send` hold the weak reference themselves (an I/O source's
//! [`Registration`](crate::io::reactor::Registration)); the `Send` ones hold the loop's id.

use std::cell::{Cell, RefCell};
use std::ptr;
use std::rc::{Rc, Weak};

use super::core::Core;

thread_local! {
    static CURRENT: Cell<*const Core> = const { Cell::new(ptr::null()) };
    static RUNNING: Cell<bool> = const { Cell::new(false) };
    /// This thread's loops whose `Runtime` is alive (see the module docs): few, so a `Vec`.
    static LOOPS: RefCell<Vec<(u64, Weak<Core>)>> = const { RefCell::new(Vec::new()) };
}

/// Lists a new loop of this thread (from `Core::new`).
pub(crate) fn add_loop(loop_id: u64, core: Weak<Core>) {
    // `try_with`: a `Runtime` may be made by a thread-local's destructor after the list is gone;
    // its loop then goes unlisted (its handles reach it only while it is current).
    let _ = LOOPS.try_with(|l| {
        let mut loops = l.borrow_mut();
        loops.retain(|(_, w)| w.strong_count() > 0);
        loops.push((loop_id, core));
    });
}

/// Takes a loop off this thread's list (its `Runtime` is being dropped, its shutdown done).
pub(crate) fn remove_loop(loop_id: u64) {
    // `try_with`: a `Runtime` kept in another thread-local may be dropped after this one.
    let removed = LOOPS.try_with(|l| {
        let mut loops = l.borrow_mut();
        let at = loops.iter().position(|(id, _)| *id == loop_id);
        at.map(|at| loops.swap_remove(at))
    });
    drop(removed);
}

/// Runs `f` with loop `loop_id` if it is alive on this thread: the current loop (the hot path)
/// or another one (see the module docs). `None` once that loop's `Runtime` is dropped, or on
/// another thread.
#[inline]
pub(crate) fn with_loop<R>(loop_id: u64, f: impl FnOnce(&Core) -> R) -> Option<R> {
    let ptr = CURRENT.with(|c| c.get());
    if !ptr.is_null() {
        // SAFETY: as in `with_core`.
        let core = unsafe { &*ptr };
        if core.loop_id() == loop_id {
            return Some(f(core));
        }
    }
    let core = find_loop(loop_id)?;
    Some(f(&core))
}

/// Loop `loop_id` from this thread's list, if its `Runtime` is alive.
#[cold]
#[inline(never)]
fn find_loop(loop_id: u64) -> Option<Rc<Core>> {
    LOOPS
        .try_with(|l| {
            l.borrow()
                .iter()
                .find(|(id, _)| *id == loop_id)
                .and_then(|(_, w)| w.upgrade())
        })
        .ok()
        .flatten()
}

/// Sets the current loop for as long as it lives.
pub(crate) struct Entered {
    previous: *const Core,
    // Keeps the core alive while its pointer is published.
    _core: Rc<Core>,
}

impl Entered {
    pub(crate) fn new(core: &Rc<Core>) -> Entered {
        let previous = CURRENT.with(|c| c.replace(Rc::as_ptr(core)));
        Entered {
            previous,
            _core: core.clone(),
        }
    }
}

impl Drop for Entered {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(self.previous));
    }
}

/// Marks the thread as running a loop (`run`, `block_on`) for as long as it lives.
pub(crate) struct Running(());

impl Running {
    #[track_caller]
    pub(crate) fn new(what: &str) -> Running {
        if RUNNING.with(|r| r.replace(true)) {
            panic!(
                "nodus: {what} called from inside a running nodus loop; a thread runs one loop at \
                 a time (this one would stop until the other returned). Spawn the work with \
                 nodus::spawn, or give the other loop a thread of its own"
            );
        }
        Running(())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        RUNNING.with(|r| r.set(false));
    }
}

/// Runs `f` with the current loop, or panics with a message that names the API.
#[inline]
#[track_caller]
pub(crate) fn with_core<R>(api: &str, f: impl FnOnce(&Core) -> R) -> R {
    let ptr = CURRENT.with(|c| c.get());
    if ptr.is_null() {
        no_runtime(api);
    }
    // SAFETY: CURRENT is non-null only while an `Entered` guard holding an `Rc<Core>` lives on
    // this thread's stack (module invariant), so the pointee is alive for this call.
    f(unsafe { &*ptr })
}

/// Runs `f` with the current loop if there is one.
#[inline]
pub(crate) fn try_with_core<R>(f: impl FnOnce(&Core) -> R) -> Option<R> {
    let ptr = CURRENT.with(|c| c.get());
    if ptr.is_null() {
        return None;
    }
    // SAFETY: as in `with_core`.
    Some(f(unsafe { &*ptr }))
}

#[cold]
#[track_caller]
fn no_runtime(api: &str) -> ! {
    panic!(
        "nodus: {api} called on a thread with no nodus loop; call it from inside \
         Runtime::block_on, Runtime::run or Runtime::enter"
    )
}
