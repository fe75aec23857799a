//! What the handles of a loop's entries share ([`Timer`](crate::Timer) and a `Sleep`'s timer,
//! [`Immediate`](super::Immediate), [`HookHandle`](super::HookHandle)): removing the entry, a
//! close callback after it, ref/unref and `has_ref`, each acting on the entry's own loop.
//!
//! Invariant: a handle names its loop by id and its entry by a key that loop never gives
//! another entry; every method here reaches that loop through `context::with_loop` (whether it
//! is current, not current, or another `Runtime` is) and does nothing once that loop's `Runtime`
//! is dropped, or on another thread. A removed entry gives its ref back to its own loop, and is
//! dropped only after that loop's tables are released: its drop (a callback and what it
//! captured) may re-enter a loop.

use std::panic::Location;

use super::context::with_loop;
use super::core::Core;
use super::hooks::close_callback_on;

/// A handle to an entry in one loop's tables; each type says where its entry lives.
pub(crate) trait EntryHandle {
    /// The entry as its loop holds it.
    type Entry;

    /// The id of the loop that holds the entry.
    fn loop_id(&self) -> u64;

    /// Takes the live entry out of `core`, and out of whatever else counts it there, its ref
    /// aside; `None` once it is gone.
    fn take(&self, core: &Core) -> Option<Self::Entry>;

    /// Whether a taken entry held a ref on its loop.
    fn held_ref(entry: &Self::Entry) -> bool;

    /// Runs `f` on the live entry's ref flag in `core`; `None` once the entry is gone.
    fn with_ref_flag<R>(&self, core: &Core, f: impl FnOnce(&mut bool) -> R) -> Option<R>;

    /// Takes the entry out of `core`, its loop, and gives its ref back there; the caller drops it
    /// once it holds no borrow of that loop's tables.
    fn remove_from(&self, core: &Core) -> Option<Self::Entry> {
        let entry = self.take(core)?;
        if Self::held_ref(&entry) {
            core.unref_handle();
        }
        Some(entry)
    }

    /// Takes the entry out of its loop and gives its ref back there.
    fn remove_entry(&self) {
        let removed = with_loop(self.loop_id(), |core| self.remove_from(core));
        drop(removed);
    }

    /// [`remove_entry`](Self::remove_entry), then `callback` queued for its loop's close phase.
    fn close_entry(&self, callback: Box<dyn FnOnce()>, location: &'static Location<'static>) {
        self.remove_entry();
        close_callback_on(self.loop_id(), callback, location);
    }

    /// Sets the entry's ref flag, counting a change in its loop's refs.
    fn set_entry_ref(&self, on: bool) {
        with_loop(self.loop_id(), |core| {
            self.with_ref_flag(core, |refd| core.set_refd(refd, on))
        });
    }

    /// Whether the entry is live and ref'd.
    fn entry_refd(&self) -> bool {
        with_loop(self.loop_id(), |core| {
            self.with_ref_flag(core, |refd| *refd)
        })
        .flatten()
        .unwrap_or(false)
    }
}
