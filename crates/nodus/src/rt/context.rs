//! Which loop (if any) the current thread is running: the thread-local behind every free
//! function (`set_timeout`, `spawn`, `next_tick`, ...).
//!
//! Invariants:
//! - `CURRENT` is non-null only while an [`Entered`] guard lives on this thread's stack; the guard
//!   holds an `Rc<Core>`, so the pointer is valid for the guard's whole life.
//! - Guards nest (the previous value is restored on drop, including while unwinding), but nodus
//!   refuses to *run* a loop inside a running loop (`block_on` inside a callback would deadlock).
//!
//! A raw pointer instead of `RefCell<Option<Rc<Core>>>`: the free functions are on the hottest
//! paths (`next_tick` is a 25 ns operation), and a `Cell<*const _>` read is one load.

use std::cell::Cell;
use std::ptr;
use std::rc::Rc;

use super::core::Core;

thread_local! {
    static CURRENT: Cell<*const Core> = const { Cell::new(ptr::null()) };
    static RUNNING: Cell<bool> = const { Cell::new(false) };
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
