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
//! - `SHARED` lists every loop of the process whose `Runtime` is alive, each by its id with a
//!   weak reference to its [`Shared`] part (added when its `Core` is made, removed when its
//!   `Runtime` is dropped): how a `Send` handle used on another thread reaches its loop
//!   ([`on_loop`]), or learns it is alive there ([`on_loop_thread`]). It is read only when the
//!   handle's loop is not on the reading thread's `LOOPS`, a cold path. Its lock is never copied held into a forked process (`crate::atfork`
//!   takes it around every `fork`): a process forked without `exec` can make a `Runtime`.
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
//! since names nothing). Once its `Runtime` is dropped there is nothing to reach and the handle
//! does nothing: the loop's entries went with it. On another thread (the handles that are `Send`:
//! `Timer`, `Immediate`, `HookHandle`, `Sleep`) the loop's state is not theirs to touch: a
//! change made there (a `Sleep` dropped, reset or unref'd; a clear, stop, ref or unref) is
//! posted to its loop's remote queue ([`on_loop`]), which runs it in that loop's poll phase; on
//! the loop's own thread it runs at once, as above. A method that cannot be posted (a query,
//! which needs an answer; a `close`, whose callback is not `Send`) panics there naming itself
//! ([`on_loop_thread`]), rather than answer wrong or do nothing. Handles that are `!Send` hold
//! the weak reference themselves (an I/O source's
//! [`Registration`](crate::io::reactor::Registration)); the `Send` ones hold the loop's id.

use std::cell::{Cell, RefCell};
use std::panic::Location;
use std::ptr;
use std::rc::{Rc, Weak};
use std::sync::{Arc, Mutex};

use super::core::{Core, Remote, Shared};

thread_local! {
    static CURRENT: Cell<*const Core> = const { Cell::new(ptr::null()) };
    static RUNNING: Cell<bool> = const { Cell::new(false) };
    /// This thread's loops whose `Runtime` is alive (see the module docs): few, so a `Vec`.
    static LOOPS: RefCell<Vec<(u64, Weak<Core>)>> = const { RefCell::new(Vec::new()) };
}

/// The process's loops whose `Runtime` is alive (see the module docs): few, so a `Vec`.
static SHARED: Mutex<Vec<(u64, std::sync::Weak<Shared>)>> = Mutex::new(Vec::new());

/// [`SHARED`]'s lock, held across a `fork` by the forking thread (see `crate::atfork`).
pub(crate) type LoopsGuard = std::sync::MutexGuard<'static, Vec<(u64, std::sync::Weak<Shared>)>>;

fn shared_loops() -> LoopsGuard {
    crate::atfork::register();
    lock_loops()
}

/// [`shared_loops`] without the fork handlers' registration: for the handlers themselves.
pub(crate) fn lock_loops() -> LoopsGuard {
    SHARED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Lists a new loop of this thread (from `Core::new`).
pub(crate) fn add_loop(loop_id: u64, core: Weak<Core>, shared: &Arc<Shared>) {
    {
        let mut all = shared_loops();
        all.retain(|(_, w)| w.strong_count() > 0);
        all.push((loop_id, Arc::downgrade(shared)));
    }
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
    {
        let mut all = shared_loops();
        if let Some(at) = all.iter().position(|(id, _)| *id == loop_id) {
            all.swap_remove(at);
        }
    }
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

/// Runs `f` with loop `loop_id` wherever that loop is: at once if it is alive on this thread
/// ([`with_loop`]); if it is alive on another thread, in its poll phase (posted to its remote
/// queue, as a callback from `location`), with it current; never once its `Runtime` is dropped.
/// For a `Send` handle used on a thread that may not be its loop's (see the module docs).
pub(crate) fn on_loop(
    loop_id: u64,
    location: &'static Location<'static>,
    f: impl FnOnce(&Core) + Send + 'static,
) {
    let mut f = Some(f);
    if with_loop(loop_id, |core| f.take().map(|f| f(core))).is_some() {
        return;
    }
    let Some(f) = f else { return };
    post_elsewhere(
        loop_id,
        location,
        Box::new(move || {
            let _ = with_loop(loop_id, f);
        }),
    );
}

/// Runs `f` with loop `loop_id` if it is alive on this thread ([`with_loop`]); `None` once its
/// `Runtime` is dropped. Panics, naming `ty::method` and saying `why`, if it is alive on another
/// thread: for a `Send` handle's method that cannot be posted there (it needs an answer, or
/// takes a callback that is not `Send`). On the loop's own thread this costs one test of `None`.
#[inline]
#[track_caller]
pub(crate) fn on_loop_thread<R>(
    loop_id: u64,
    ty: &str,
    method: &str,
    why: &str,
    f: impl FnOnce(&Core) -> R,
) -> Option<R> {
    let r = with_loop(loop_id, f);
    if r.is_none() {
        not_on_loop_thread(loop_id, ty, method, why);
    }
    r
}

/// Panics if loop `loop_id` is alive (so on another thread: [`on_loop_thread`]).
#[cold]
#[inline(never)]
#[track_caller]
fn not_on_loop_thread(loop_id: u64, ty: &str, method: &str, why: &str) {
    let alive = shared_loops()
        .iter()
        .any(|(id, w)| *id == loop_id && w.strong_count() > 0);
    if alive {
        panic!(
            "nodus: {ty}::{method} called on another thread than its loop's: {why}. Call it on \
             the loop's thread (from another thread, through the loop's LoopHandle::post)"
        );
    }
}

/// Posts `job` to loop `loop_id`'s remote queue if that loop is alive (on another thread: this
/// thread's own were looked for first); drops it otherwise.
#[cold]
#[inline(never)]
fn post_elsewhere(
    loop_id: u64,
    location: &'static Location<'static>,
    job: Box<dyn FnOnce() + Send>,
) {
    let shared = shared_loops()
        .iter()
        .find(|(id, _)| *id == loop_id)
        .and_then(|(_, w)| w.upgrade());
    if let Some(shared) = shared {
        // Refused once the loop closed its queue (its `Runtime` is being dropped): the job is
        // dropped here, with nothing left to do.
        let _ = shared.push_remote(Remote::Callback(job, location));
    }
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
#[inline(always)]
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
         Runtime::block_on, Runtime::run or Runtime::enter. From another thread (a job in \
         offload_cpu/offload_io, a std::thread), take the loop's handle on the loop \
         (nodus::LoopHandle::current(), or Runtime::handle()), move it there and call \
         handle.post(move || ...): the closure runs on the loop, where this call works"
    )
}
