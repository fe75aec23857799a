//! Idle and prepare hooks (libuv's `uv_idle_t` / `uv_prepare_t`), the pending queue, and close
//! callbacks.
//!
//! Invariants: a hook's callback is taken out of its slot while it runs, so it may stop or close
//! itself, and put back when it returns or panics (`RunningHook`, a drop guard: a panicking hook
//! stays registered and runs again, as a libuv handle stays active); an active ref'd hook counts
//! in `Core::refs`; an active idle hook makes the poll phase non-blocking (libuv's rule). A
//! pending or close callback that panics leaves the rest of its phase's batch at the head of its
//! queue (`Unrun`), for the next turn.
//!
//! A [`HookHandle`] names its hook by slab key, an id this loop never gives another hook, and
//! its loop's id: once the hook is stopped its key may hold a newer hook, which the handle never
//! reaches (a second `stop`, an `unref`, do nothing). `stop`/`close`/`ref_`/`unref` act on the
//! hook's own loop wherever they are called (its loop current or not, another `Runtime` current:
//! `entry::EntryHandle`, through `context::with_loop`), so a hook stopped off its loop leaves that
//! loop's handle count; once the loop's `Runtime` is dropped (its hooks with it), they do
//! nothing. The handle is `Send`: on another thread `stop`/`ref_`/`unref` are posted to the
//! loop's remote queue (`context::on_loop`), made in its next poll phase, while `has_ref` and
//! `close` (a callback that is not `Send`) panic, naming the method. A pass runs the hooks
//! active when it starts: one started by a callback of the pass (even in a slot a stopped one
//! left) first runs in the next pass, as in libuv. Dropping the handle does not stop the hook (a
//! libuv handle lives until closed), on its loop or off it. Close callbacks are queued on the
//! closed handle's own loop (`Core::queue_close`).

use std::panic::Location;

use slab::Slab;

use super::context::with_core;
use super::core::{Core, Tick};
use super::entry::EntryHandle;
use crate::metrics::classes;
use crate::metrics::phase::Phase;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HookKind {
    Idle,
    Prepare,
}

pub(crate) struct Hook {
    /// Never reused by this loop: tells the hook from a later one in the same slab slot.
    id: u64,
    kind: HookKind,
    callback: Option<Box<dyn FnMut()>>,
    refd: bool,
    location: &'static Location<'static>,
}

pub(crate) struct Hooks {
    slots: Slab<Hook>,
    active_idle: usize,
    next_id: u64,
}

impl Hooks {
    pub(crate) fn new() -> Hooks {
        Hooks {
            slots: Slab::new(),
            active_idle: 0,
            next_id: 1,
        }
    }

    /// The live hook `(key, id)`.
    fn get_mut(&mut self, key: usize, id: u64) -> Option<&mut Hook> {
        self.slots.get_mut(key).filter(|h| h.id == id)
    }

    pub(crate) fn idle_active(&self) -> bool {
        self.active_idle > 0
    }

    pub(crate) fn take_all(&mut self) -> Vec<Hook> {
        self.active_idle = 0;
        self.slots.drain().collect()
    }
}

/// A running idle or prepare hook. Dropping the handle does not stop it; `stop` or `close` does,
/// wherever it is called (see the module docs).
#[derive(Debug)]
pub struct HookHandle(HookKey);

/// What names a hook: what a change posted to its loop from another thread carries (the handle
/// itself is not `Copy`, as a libuv handle).
#[derive(Debug, Clone, Copy)]
struct HookKey {
    key: usize,
    id: u64,
    loop_id: u64,
}

/// Runs `callback` once per loop iteration, before the poll phase, and keeps the poll phase from
/// blocking while active (libuv's idle handle).
#[track_caller]
pub fn idle(callback: impl FnMut() + 'static) -> HookHandle {
    start(HookKind::Idle, Box::new(callback), Location::caller())
}

/// Runs `callback` once per loop iteration, right before the poll phase (libuv's prepare handle).
#[track_caller]
pub fn prepare(callback: impl FnMut() + 'static) -> HookHandle {
    start(HookKind::Prepare, Box::new(callback), Location::caller())
}

#[track_caller]
fn start(
    kind: HookKind,
    callback: Box<dyn FnMut()>,
    location: &'static Location<'static>,
) -> HookHandle {
    with_core("nodus::rt::idle/prepare", |core| {
        let mut hooks = core.hooks.borrow_mut();
        let id = hooks.next_id;
        hooks.next_id += 1;
        let key = hooks.slots.insert(Hook {
            id,
            kind,
            callback: Some(callback),
            refd: true,
            location,
        });
        if kind == HookKind::Idle {
            hooks.active_idle += 1;
        }
        drop(hooks);
        core.ref_handle();
        HookHandle(HookKey {
            key,
            id,
            loop_id: core.loop_id(),
        })
    })
}

impl EntryHandle for HookKey {
    const NAME: &'static str = "HookHandle";

    type Entry = Hook;

    fn loop_id(&self) -> u64 {
        self.loop_id
    }

    fn take(&self, core: &Core) -> Option<Hook> {
        let mut hooks = core.hooks.borrow_mut();
        hooks.get_mut(self.key, self.id)?;
        let hook = hooks.slots.remove(self.key);
        if hook.kind == HookKind::Idle {
            hooks.active_idle -= 1;
        }
        Some(hook)
    }

    fn held_ref(hook: &Hook) -> bool {
        hook.refd
    }

    fn with_ref_flag<R>(&self, core: &Core, f: impl FnOnce(&mut bool) -> R) -> Option<R> {
        Some(f(&mut core
            .hooks
            .borrow_mut()
            .get_mut(self.key, self.id)?
            .refd))
    }
}

impl HookHandle {
    /// Stops the hook; its callback is dropped. From another thread than its loop's, in that
    /// loop's next poll phase.
    #[track_caller]
    pub fn stop(&self) {
        self.0.remove_entry();
    }

    /// Stops the hook and runs `callback` in its loop's close phase.
    ///
    /// # Panics
    /// On another thread than its loop's (the callback is not `Send`): call `stop` there, or
    /// `close` on the loop's thread.
    #[track_caller]
    pub fn close(&self, callback: impl FnOnce() + 'static) {
        self.0.close_entry(Box::new(callback), Location::caller());
    }

    /// The hook no longer keeps the loop alive. From another thread than its loop's, in that
    /// loop's next poll phase.
    #[track_caller]
    pub fn unref(&self) {
        self.0.set_entry_ref(false);
    }

    /// The hook keeps the loop alive again (the default). From another thread than its loop's,
    /// in that loop's next poll phase.
    #[track_caller]
    pub fn ref_(&self) {
        self.0.set_entry_ref(true);
    }

    /// Whether the hook is active and ref'd (`false` once its loop's `Runtime` is dropped).
    ///
    /// # Panics
    /// On another thread than its loop's, which alone can answer: ask there (from another
    /// thread, through the loop's [`LoopHandle::post`](super::LoopHandle::post)).
    #[track_caller]
    pub fn has_ref(&self) -> bool {
        self.0.entry_refd()
    }
}

/// Runs `callback` in the pending phase of the next iteration (libuv's pending queue: for I/O
/// work that completed synchronously and must not call back re-entrantly).
#[track_caller]
pub fn defer(callback: impl FnOnce() + 'static) {
    let location = Location::caller();
    with_core("nodus::rt::defer", |core| {
        core.pending
            .borrow_mut()
            .push_back((Box::new(callback), location))
    });
}

impl Core {
    /// Queues `callback` for this loop's close phase.
    pub(crate) fn queue_close(
        &self,
        callback: Box<dyn FnOnce()>,
        location: &'static Location<'static>,
    ) {
        self.closing.borrow_mut().push((callback, location));
    }

    /// Runs every hook of `kind` once, each followed by a drain.
    pub(crate) fn run_hooks(&self, kind: HookKind) {
        let phase = match kind {
            HookKind::Idle => Phase::Idle,
            HookKind::Prepare => Phase::Prepare,
        };
        self.meter.phase(phase);
        let keys: Vec<(usize, u64)> = {
            let hooks = self.hooks.borrow();
            if hooks.slots.is_empty() {
                return;
            }
            hooks
                .slots
                .iter()
                .filter(|(_, h)| h.kind == kind)
                .map(|(k, h)| (k, h.id))
                .collect()
        };
        for (key, id) in keys {
            let taken = {
                let mut hooks = self.hooks.borrow_mut();
                hooks
                    .get_mut(key, id)
                    .and_then(|h| Some((h.callback.take()?, h.location)))
            };
            let Some((callback, location)) = taken else {
                continue;
            };
            let mut running = RunningHook {
                core: self,
                key,
                id,
                callback,
            };
            self.run_callback(
                Core::callback_target("hook", location, classes::HOOK),
                None,
                &mut running.callback,
            );
        }
    }

    /// The pending phase: callbacks deferred before this iteration started.
    pub(crate) fn run_pending(&self) {
        self.meter.phase(Phase::Pending);
        if self.pending.borrow().is_empty() {
            return;
        }
        let batch: Vec<_> = self.pending.borrow_mut().drain(..).collect();
        let mut rest = Unrun {
            core: self,
            queue: Queue::Pending,
            items: batch.into_iter(),
        };
        for (callback, location) in rest.items.by_ref() {
            self.run_callback(
                Core::callback_target("pending", location, classes::PENDING),
                None,
                callback,
            );
        }
    }

    /// The close phase: close callbacks queued before it started, in the order `close` was called.
    pub(crate) fn run_closing(&self) {
        self.meter.phase(Phase::Close);
        if self.closing.borrow().is_empty() {
            return;
        }
        let batch = std::mem::take(&mut *self.closing.borrow_mut());
        let mut rest = Unrun {
            core: self,
            queue: Queue::Closing,
            items: batch.into_iter(),
        };
        for (callback, location) in rest.items.by_ref() {
            self.run_callback(
                Core::callback_target("close", location, classes::CLOSE),
                None,
                callback,
            );
        }
    }
}

/// A hook whose callback is running (taken out of its slot): the callback goes back when it
/// returns or unwinds, so a panicking hook stays registered and runs again in the next pass (a
/// libuv handle stays active); it is dropped instead if the hook was stopped meanwhile.
struct RunningHook<'a> {
    core: &'a Core,
    key: usize,
    id: u64,
    callback: Box<dyn FnMut()>,
}

impl Drop for RunningHook<'_> {
    fn drop(&mut self) {
        // A zero-sized closure takes its place: no allocation.
        let callback = std::mem::replace(&mut self.callback, Box::new(|| {}));
        let stopped = match self.core.hooks.borrow_mut().get_mut(self.key, self.id) {
            Some(h) => {
                h.callback = Some(callback);
                None
            }
            None => Some(callback),
        };
        // Stopped while it ran: its callback is dropped here, after the borrow.
        drop(stopped);
    }
}

/// The queue a phase's batch was taken from.
#[derive(Clone, Copy)]
enum Queue {
    Pending,
    Closing,
}

/// The callbacks of a pending or close phase not yet run when a callback panics: back at the head
/// of their queue, ahead of any queued since, for the next turn (nothing is lost).
struct Unrun<'a> {
    core: &'a Core,
    queue: Queue,
    items: std::vec::IntoIter<Tick>,
}

impl Drop for Unrun<'_> {
    fn drop(&mut self) {
        if self.items.as_slice().is_empty() {
            return;
        }
        let rest = self.items.by_ref();
        match self.queue {
            Queue::Pending => {
                let mut pending = self.core.pending.borrow_mut();
                for item in rest.rev() {
                    pending.push_front(item);
                }
            }
            Queue::Closing => {
                self.core.closing.borrow_mut().splice(0..0, rest);
            }
        }
    }
}
