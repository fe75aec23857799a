//! The `block_on` future: polled like a task, but borrowed from `block_on`'s stack frame, so it
//! need not be `'static`.
//!
//! Invariants: `Core::main` holds a pointer to the pinned future only while `block_on` runs (the
//! `MainGuard` clears it on return and while unwinding). A wake of the main future after that is
//! a stale queue entry that `poll_main` ignores.
//!
//! A poll of the main future is a task poll for the cooperative budget: it is `Core::current`
//! (as the target it is metered under, `"main"` of class `MAIN`, task id 0) with a fresh budget,
//! so an always-ready resource it loops on yields to the loop after `COOP_BUDGET` checks (its
//! forced yields count under `main`), as a spawned task's does. `current` is `None` again once
//! the poll returns or unwinds (the `MainGuard` clears it too).

use std::future::Future;
use std::panic::Location;
use std::pin::Pin;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use super::context::try_with_core;
use super::core::{COOP_BUDGET, Core, MainPtr, Shared};
use super::queues::RunItem;
use crate::metrics::classes;

/// The main future's waker: `Send + Sync`, coalescing (one queue entry at a time).
pub(crate) struct MainWaker {
    shared: Arc<Shared>,
    queued: AtomicBool,
}

impl Wake for MainWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if self.queued.swap(true, Ordering::AcqRel) {
            return;
        }
        let local = try_with_core(|core| {
            if core.loop_id() == self.shared.loop_id {
                core.schedule_local(RunItem::Main, core.main_running.get());
                true
            } else {
                false
            }
        });
        if local != Some(true) {
            self.shared.schedule_remote(RunItem::Main);
        }
    }
}

/// Clears the main-future slot when `block_on` returns or unwinds.
pub(crate) struct MainGuard<'a> {
    core: &'a Core,
}

impl Drop for MainGuard<'_> {
    fn drop(&mut self) {
        self.core.main.set(None);
        // A poll that unwound left it set.
        self.core.current.set(None);
        self.core.main_waker.borrow_mut().take();
        self.core.main_running.set(false);
        self.core.main_done.set(false);
    }
}

impl Core {
    /// Publishes the `block_on` future for the loop to poll.
    pub(crate) fn install_main<'a>(
        &'a self,
        future: Pin<&mut (dyn Future<Output = ()> + '_)>,
        location: &'static Location<'static>,
    ) -> MainGuard<'a> {
        // SAFETY: only the lifetime is erased. The pointer is dereferenced only by `poll_main`,
        // while `block_on` (which owns the pinned future and this guard) is on the stack: the
        // guard clears it before the future can be dropped, including while unwinding.
        let ptr: MainPtr = unsafe {
            std::mem::transmute::<NonNull<dyn Future<Output = ()> + '_>, MainPtr>(NonNull::from(
                future.get_unchecked_mut(),
            ))
        };
        self.main.set(Some(ptr));
        self.main_done.set(false);
        self.main_location.set(location);
        *self.main_waker.borrow_mut() = Some(Arc::new(MainWaker {
            shared: self.shared.clone(),
            queued: AtomicBool::new(false),
        }));
        MainGuard { core: self }
    }

    /// Polls the main future (a microtask, or the first poll of `block_on`).
    pub(crate) fn poll_main(&self, t: u64) {
        let Some(mut ptr) = self.main.get() else {
            return;
        };
        let Some(main_waker) = self.main_waker.borrow().clone() else {
            return;
        };
        main_waker.queued.store(false, Ordering::Release);
        let waker = Waker::from(main_waker);
        let mut cx = Context::from_waker(&waker);
        let target = Core::callback_target("main", self.main_location.get(), classes::MAIN);
        self.main_running.set(true);
        self.current.set(Some(target));
        self.budget.set(COOP_BUDGET);
        self.meter.begin_poll(&target, t);
        // SAFETY: see `install_main`: the pointee is pinned in `block_on`'s frame and alive while
        // `main` is `Some`; `poll_main` is not re-entered (it runs only from the loop, and
        // `block_on` cannot be nested).
        let ready = unsafe { Pin::new_unchecked(ptr.as_mut()) }.poll(&mut cx);
        self.meter.end_poll(&target, t);
        self.after_poll();
        self.current.set(None);
        self.main_running.set(false);
        if let Poll::Ready(()) = ready {
            self.main_done.set(true);
            self.main.set(None);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::panic::{AssertUnwindSafe, catch_unwind};

    use crate::rt::context::with_core;

    /// A poll of the main future that unwinds leaves no budgeted poll behind: later callbacks
    /// (the next `run`'s) are not charged to a `block_on` that is gone.
    #[test]
    fn a_main_future_that_panics_leaves_nothing_current() {
        let rt = crate::Runtime::new();
        let unwound = catch_unwind(AssertUnwindSafe(|| {
            rt.block_on(async { panic!("the main future panics") })
        }));
        assert!(unwound.is_err());
        let current = rt.enter(|| with_core("test", |core| core.current.get().map(|t| t.name)));
        assert_eq!(current, None);
    }
}
