//! `set_immediate`: callbacks for the check phase of the current (or next) iteration.
//!
//! Invariant: an [`Immediate`] (`Copy`, `Send`) names its entry by slab key, an id its loop
//! never reuses, and its loop's id, and acts on that loop wherever it is used: `clear` cancels it
//! there (leaving that loop's handle count and run queue) whether that loop is current or not,
//! or another `Runtime` is current (`entry::EntryHandle`, through `context::with_loop`); it never
//! reaches an entry of another loop or a later immediate in the same slot. Once the loop's
//! `Runtime` is dropped it does nothing. On another thread `clear`/`ref_`/`unref` are posted to
//! the loop's remote queue (`context::on_loop`), made in its next poll phase (which precedes its
//! check phase: a cleared immediate runs only if its check phase began before the clear came). `has_ref` and `close` (a callback that
//! is not `Send`) panic there, naming the method. Dropping the handle does not cancel the
//! immediate (Node's rule).

use std::panic::Location;

use super::context::with_core;
use super::core::Core;
use super::entry::EntryHandle;
use super::queues::ImmediateEntry;

/// A queued immediate; clearing it after it ran does nothing. Dropping the handle does not
/// cancel it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Immediate {
    key: usize,
    id: u64,
    loop_id: u64,
}

/// Runs `callback` in the check phase (Node's `setImmediate`). An immediate queued during the
/// check phase runs on the next turn; inside an I/O or timer callback an immediate always runs
/// before a new 0 ms timer.
#[track_caller]
pub fn set_immediate(callback: impl FnOnce() + 'static) -> Immediate {
    let location = Location::caller();
    with_core("nodus::set_immediate", |core| {
        // Runnable from now: its schedule delay counts the rest of the callback that set it.
        let at = core.meter.wake_time();
        let (key, id) = core
            .check
            .borrow_mut()
            .push_immediate(Box::new(callback), location, at);
        core.meter.arrive_at(at);
        core.ref_handle();
        Immediate {
            key,
            id,
            loop_id: core.loop_id(),
        }
    })
}

/// Cancels an immediate that has not run yet; it never runs, even if cleared by an earlier
/// immediate of the same check phase.
#[track_caller]
pub fn clear_immediate(immediate: &Immediate) {
    immediate.clear();
}

impl EntryHandle for Immediate {
    const NAME: &'static str = "Immediate";

    type Entry = ImmediateEntry;

    fn loop_id(&self) -> u64 {
        self.loop_id
    }

    fn take(&self, core: &Core) -> Option<ImmediateEntry> {
        let e = core
            .check
            .borrow_mut()
            .remove_immediate(self.key, self.id)?;
        core.meter.cancel();
        Some(e)
    }

    fn held_ref(e: &ImmediateEntry) -> bool {
        e.refd
    }

    fn with_ref_flag<R>(&self, core: &Core, f: impl FnOnce(&mut bool) -> R) -> Option<R> {
        let mut check = core.check.borrow_mut();
        Some(f(&mut check.immediate_mut(self.key, self.id)?.refd))
    }
}

impl Immediate {
    /// Cancels it (same as `clear_immediate`). From another thread than its loop's, in that
    /// loop's next poll phase (before its check phase).
    #[track_caller]
    pub fn clear(&self) {
        self.remove_entry();
    }

    /// Cancels it and runs `callback` in the close phase.
    ///
    /// # Panics
    /// On another thread than its loop's (the callback is not `Send`): call `clear` there, or
    /// `close` on the loop's thread.
    #[track_caller]
    pub fn close(&self, callback: impl FnOnce() + 'static) {
        self.close_entry(Box::new(callback), Location::caller());
    }

    /// It no longer keeps the loop alive by itself. From another thread than its loop's, in that
    /// loop's next poll phase.
    #[track_caller]
    pub fn unref(&self) {
        self.set_entry_ref(false);
    }

    /// It keeps the loop alive again (the default). From another thread than its loop's, in
    /// that loop's next poll phase.
    #[track_caller]
    pub fn ref_(&self) {
        self.set_entry_ref(true);
    }

    /// Whether it is queued and ref'd (`false` once its loop's `Runtime` is dropped).
    ///
    /// # Panics
    /// On another thread than its loop's, which alone can answer: ask there (from another
    /// thread, through the loop's [`LoopHandle::post`](crate::LoopHandle::post)).
    #[track_caller]
    pub fn has_ref(&self) -> bool {
        self.entry_refd()
    }
}
