//! What the handles of a loop's entries share ([`Timer`](crate::Timer) and a `Sleep`'s timer,
//! [`Immediate`](super::Immediate), [`HookHandle`](super::HookHandle)): removing the entry, a
//! close callback after it, ref/unref and `has_ref`, each acting on the entry's own loop.
//!
//! Invariant: a handle names its loop by id and its entry by a key that loop never gives
//! another entry; every method here reaches that loop through `context::with_loop` when it is
//! alive on the calling thread (whether it is current, not current, or another `Runtime` is),
//! and does nothing once that loop's `Runtime` is dropped. On another thread than the loop's
//! (the handles are `Copy + Send`): removing the entry and ref/unref are posted to the loop's
//! remote queue (`context::on_loop`, the cold path: on the loop's thread they run at once),
//! made in its next poll phase; `has_ref` and `close` (whose callback is not `Send`)
//! panic, naming the method (`context::on_loop_thread`), rather than answer wrong or do nothing.
//! A removed entry gives its ref back to its own loop, and is dropped only after that loop's
//! tables are released: its drop (a callback and what it captured) may re-enter a loop.

use std::panic::Location;

use super::context::{on_loop, on_loop_thread};
use super::core::Core;

/// Why a query cannot be made on another thread than the loop's.
pub(crate) const QUERY: &str =
    "its loop's state can be read only on that loop's thread (answering needs a round trip)";

/// A handle to an entry in one loop's tables; each type says where its entry lives. A `Copy`
/// of the handle is what a change posted to its loop from another thread carries.
pub(crate) trait EntryHandle: Copy + Send + 'static {
    /// The public type's name, for the panic of a method used off its loop's thread.
    const NAME: &'static str;

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

    /// Takes the entry out of its loop and gives its ref back there; from another thread, in
    /// the loop's next poll phase.
    #[track_caller]
    fn remove_entry(&self) {
        let this = *self;
        on_loop(self.loop_id(), Location::caller(), move |core| {
            drop(this.remove_from(core));
        });
    }

    /// [`remove_entry`](Self::remove_entry), then `callback` queued for its loop's close phase.
    /// Panics on another thread than the loop's (the callback is not `Send`).
    #[track_caller]
    fn close_entry(&self, callback: Box<dyn FnOnce()>, location: &'static Location<'static>) {
        on_loop_thread(
            self.loop_id(),
            Self::NAME,
            "close",
            "its callback, not Send, cannot be sent to the loop (clear or stop the handle here: \
             that is posted to the loop)",
            |core| {
                let removed = self.remove_from(core);
                core.queue_close(callback, location);
                removed
            },
        );
    }

    /// Sets the entry's ref flag, counting a change in its loop's refs; from another thread, in
    /// the loop's next poll phase.
    #[track_caller]
    fn set_entry_ref(&self, on: bool) {
        let this = *self;
        on_loop(self.loop_id(), Location::caller(), move |core| {
            this.with_ref_flag(core, |refd| core.set_refd(refd, on));
        });
    }

    /// Whether the entry is live and ref'd; `false` once its loop is gone. Panics on another
    /// thread than the loop's.
    #[track_caller]
    fn entry_refd(&self) -> bool {
        on_loop_thread(self.loop_id(), Self::NAME, "has_ref", QUERY, |core| {
            self.with_ref_flag(core, |refd| *refd)
        })
        .flatten()
        .unwrap_or(false)
    }
}
