//! Idle and prepare hooks (libuv's `uv_idle_t` / `uv_prepare_t`), the pending queue, and close
//! callbacks.
//!
//! Invariants: a hook's callback is taken out of its slot while it runs, so it may stop or close
//! itself; an active ref'd hook counts in `Core::refs`; an active idle hook makes the poll phase
//! non-blocking (libuv's rule).

use std::panic::Location;

use slab::Slab;

use super::context::{with_core, with_loop};
use super::core::Core;
use crate::metrics::classes;
use crate::metrics::phase::Phase;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HookKind {
    Idle,
    Prepare,
}

pub(crate) struct Hook {
    kind: HookKind,
    callback: Option<Box<dyn FnMut()>>,
    refd: bool,
    location: &'static Location<'static>,
}

pub(crate) struct Hooks {
    slots: Slab<Hook>,
    active_idle: usize,
}

impl Hooks {
    pub(crate) fn new() -> Hooks {
        Hooks {
            slots: Slab::new(),
            active_idle: 0,
        }
    }

    pub(crate) fn idle_active(&self) -> bool {
        self.active_idle > 0
    }

    pub(crate) fn take_all(&mut self) -> Vec<Hook> {
        self.active_idle = 0;
        self.slots.drain().collect()
    }
}

/// A running idle or prepare hook. Dropping the handle does not stop it; `stop` or `close` does.
#[derive(Debug)]
pub struct HookHandle {
    key: usize,
    kind: HookKind,
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
        let key = core.hooks.borrow_mut().slots.insert(Hook {
            kind,
            callback: Some(callback),
            refd: true,
            location,
        });
        if kind == HookKind::Idle {
            core.hooks.borrow_mut().active_idle += 1;
        }
        core.ref_handle();
        HookHandle {
            key,
            kind,
            loop_id: core.loop_id(),
        }
    })
}

impl HookHandle {
    fn with_hook<R>(&self, f: impl FnOnce(&Core, &mut Hook) -> R) -> Option<R> {
        with_core("HookHandle", |core| {
            if core.loop_id() != self.loop_id {
                return None;
            }
            let mut hooks = core.hooks.borrow_mut();
            let hook = hooks
                .slots
                .get_mut(self.key)
                .filter(|h| h.kind == self.kind)?;
            Some(f(core, hook))
        })
    }

    /// Stops the hook; its callback is dropped.
    pub fn stop(&self) {
        let removed = with_core("HookHandle::stop", |core| {
            let mut hooks = core.hooks.borrow_mut();
            if core.loop_id() != self.loop_id
                || !hooks
                    .slots
                    .get(self.key)
                    .is_some_and(|h| h.kind == self.kind)
            {
                return None;
            }
            let hook = hooks.slots.remove(self.key);
            if hook.kind == HookKind::Idle {
                hooks.active_idle -= 1;
            }
            drop(hooks);
            if hook.refd {
                core.unref_handle();
            }
            Some(hook)
        });
        drop(removed);
    }

    /// Stops the hook and runs `callback` in the close phase.
    #[track_caller]
    pub fn close(&self, callback: impl FnOnce() + 'static) {
        self.stop();
        close_callback(Box::new(callback), Location::caller());
    }

    /// The hook no longer keeps the loop alive.
    pub fn unref(&self) {
        self.with_hook(|core, h| core.set_refd(&mut h.refd, false));
    }

    /// The hook keeps the loop alive again (the default).
    pub fn ref_(&self) {
        self.with_hook(|core, h| core.set_refd(&mut h.refd, true));
    }

    pub fn has_ref(&self) -> bool {
        self.with_hook(|_, h| h.refd).unwrap_or(false)
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

/// Queues `callback` for the close phase (used by every handle's `close`).
pub(crate) fn close_callback(callback: Box<dyn FnOnce()>, location: &'static Location<'static>) {
    with_core("close", |core| {
        core.closing.borrow_mut().push((callback, location))
    });
}

/// Queues `callback` for the close phase of loop `loop_id` (a handle's `close`), whichever loop
/// is current. Dropped unrun if that loop is gone (its close phase never comes) or lives on
/// another thread.
pub(crate) fn close_callback_on(
    loop_id: u64,
    callback: Box<dyn FnOnce()>,
    location: &'static Location<'static>,
) {
    with_loop(loop_id, move |core| core.queue_close(callback, location));
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
        let keys: Vec<usize> = {
            let hooks = self.hooks.borrow();
            if hooks.slots.is_empty() {
                return;
            }
            hooks
                .slots
                .iter()
                .filter(|(_, h)| h.kind == kind)
                .map(|(k, _)| k)
                .collect()
        };
        for key in keys {
            let taken = {
                let mut hooks = self.hooks.borrow_mut();
                hooks
                    .slots
                    .get_mut(key)
                    .filter(|h| h.kind == kind)
                    .and_then(|h| Some((h.callback.take()?, h.location)))
            };
            let Some((mut callback, location)) = taken else {
                continue;
            };
            self.run_callback(
                Core::callback_target("hook", location, classes::HOOK),
                None,
                &mut callback,
            );
            let mut hooks = self.hooks.borrow_mut();
            if let Some(h) = hooks
                .slots
                .get_mut(key)
                .filter(|h| h.kind == kind && h.callback.is_none())
            {
                h.callback = Some(callback);
            }
        }
    }

    /// The pending phase: callbacks deferred before this iteration started.
    pub(crate) fn run_pending(&self) {
        self.meter.phase(Phase::Pending);
        if self.pending.borrow().is_empty() {
            return;
        }
        let batch: Vec<_> = self.pending.borrow_mut().drain(..).collect();
        for (callback, location) in batch {
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
        for (callback, location) in batch {
            self.run_callback(
                Core::callback_target("close", location, classes::CLOSE),
                None,
                callback,
            );
        }
    }
}
