//! Timers: Node's `setTimeout`/`setInterval` and the futures `sleep`, `interval`, `timeout`.
//!
//! Delay rules (Node's): a delay below 1 ms (0, negative, NaN) becomes 1 ms; a timer never fires
//! early on the loop clock. Order (Node's, `queue.rs`): timers of one delay form a FIFO list; a
//! timers pass runs the lists in the order of their first timers' deadlines, every due timer of
//! one list (front to back, stopping at the first not due) before the next list; so timers of
//! one delay fire in insertion order, and a timer may fire in a later pass than the first at or
//! past its deadline when it waits behind one of its list that is not due (an interval behind a
//! timeout its callback armed).
//!
//! Deadlines count from the call: `set_timeout`, `set_interval`, `sleep`, `timeout`, `interval`
//! and `Sleep::reset` read the monotonic clock when they arm (one vDSO read, about 20 ns), so
//! synchronous work earlier in the same poll does not shorten them. That is Node's rule (its
//! `setTimeout` starts from `getLibuvNow()`, which runs `uv_update_time` first) and tokio's
//! (`Instant::now()`); raw libuv's `uv_timer_start` counts from the cached `uv_now` instead. The
//! loop's cached clock ([`loop_now_ns`], the start of the current poll) is not moved by it: a
//! timers pass fires what is due at the `now` it reads when it starts, so a timer armed during
//! the pass (counting from a later read) waits for the next pass. An interval re-arms, when its
//! callback returns, from the start of its callback (Node's `listOnTimeout`), so a slow callback
//! earlier in the same pass does not shorten its next period either. nodus-http's own per-request deadlines (header read,
//! keep-alive idle, write stall) count from [`loop_now_ns`] instead, which costs no read: they
//! are seconds long and need no better than the start of the current poll, and a fresh read
//! there costs ~45 instructions per keep-alive request (+0.5 %, BENCHMARKS.md, session 17).
//!
//! A `set_timeout`/`set_interval` delay above Node's maximum
//! (2^31 − 1 ms, about 24.8 days) panics with a clear message instead of being silently changed;
//! the futures (`sleep`, `sleep_until`, `interval`, `timeout`) take longer delays and wait them
//! out in steps of at most that maximum.
//!
//! Invariant: a timer handle acts on the loop that armed it, wherever it is used. A [`Timer`]
//! (`Copy`, `Send`) and an armed [`Sleep`] hold their timer's key (slab key + an id never reused
//! by that queue) and their loop's id: `clear`, `close`, `ref_`/`unref`, `has_ref`, `is_active`,
//! and a `Sleep`'s drop, reset or unref reach that loop whether it is current, not current (after
//! `block_on` returned, with no loop current) or another `Runtime` is current
//! (`rt::context::with_loop`; `clear` and the ref methods are `rt::entry::EntryHandle`'s, and a
//! `Sleep` disarms its timer as `clear` does), and never touch another loop's timers. Once the
//! loop's `Runtime` is dropped they do nothing (`has_ref`/`is_active` are `false`): the loop's
//! timers were dropped with it. On another thread than the loop's they touch none of its state
//! there: a `Timer`'s `clear`/`ref_`/`unref` and a `Sleep`'s drop, reset or unref post the change
//! to the loop's remote queue (`rt::context::on_loop`, see `sleep.rs`; on the loop's own thread
//! it is made at once, at no extra cost), made in its next poll phase (waking it if blocked;
//! until then a timer that falls due still fires). The queries `has_ref` and `is_active`, which
//! only the loop's thread can answer, and `close`, whose callback is not `Send`, panic there with
//! a message naming the method: ask on the loop's thread (from another, through its
//! `LoopHandle::post`). Dropping a `Timer` does nothing (Node's handles); dropping a `Sleep`
//! disarms it.

mod delay;
pub(crate) mod queue;
mod sleep;
mod slots;

use std::panic::Location;

pub use delay::{IntoDelay, MAX_DELAY};
pub use sleep::{Elapsed, Interval, Sleep, Timeout, interval, sleep, sleep_until, timeout};

use self::queue::{TimerAction, TimerEntry, TimerKey};
use crate::rt::context::{on_loop_thread, try_with_core, with_core};
use crate::rt::core::Core;
use crate::rt::entry::{EntryHandle, QUERY};

/// A timer made by `set_timeout` or `set_interval`. Copying the handle is cheap; dropping it
/// does not cancel the timer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timer {
    key: TimerKey,
    loop_id: u64,
}

/// Runs `callback` once after `delay` (Node's `setTimeout(callback, delay)`). `delay` is a
/// `Duration` or a number of milliseconds (`10`, `2.5`, `-1`, `f64::NAN`), counted from this call
/// (a fresh clock read: synchronous work done earlier in the same poll does not shorten it). It
/// runs in the first timers pass at or past that deadline, never earlier.
#[track_caller]
pub fn set_timeout(delay: impl IntoDelay, callback: impl FnOnce() + 'static) -> Timer {
    let action = TimerAction::Once(Box::new(callback));
    arm(
        "nodus::set_timeout",
        delay.into_delay_ns(),
        action,
        Location::caller(),
    )
}

/// Runs `callback` every `delay` until cleared (Node's `setInterval`). The first run is `delay`
/// after this call (a fresh clock read, as for [`set_timeout`]); each run re-arms the interval
/// from the time its callback started (Node's rule), at the back of its delay's list: behind the
/// timers of its delay armed before it returned, its own callback's included, which it waits for
/// (see the module docs).
#[track_caller]
pub fn set_interval(delay: impl IntoDelay, callback: impl FnMut() + 'static) -> Timer {
    let action = TimerAction::Callback(Box::new(callback));
    arm(
        "nodus::set_interval",
        delay.into_delay_ns(),
        action,
        Location::caller(),
    )
}

/// The loop's time in `nodus::clock` nanoseconds (libuv's `uv_now`): its latest clock read (the
/// start of the current poll; with measurements compiled out, of the current iteration), read
/// without a clock read. The timer functions count from a fresh read instead (see the module
/// docs); this is for deadlines that need no better than the start of the current poll. Outside a
/// loop, the process clock.
#[inline]
pub fn loop_now_ns() -> u64 {
    try_with_core(|core| core.meter.now()).unwrap_or_else(crate::clock::now_ns)
}

/// The loop's time as of its last complete look at its sources: what was ready to read then has
/// been dispatched, its tasks run (the clock read before the last poll phase that reported every
/// ready source, set once it dispatched them all; 0 before the first). A decision that a peer has
/// been silent for some time compares against this, not [`loop_now_ns`]: when this process
/// itself was stopped (SIGSTOP, a frozen VM, a long page-in), the loop's clock has jumped in the
/// timers phase while what the peer sent meanwhile waits in a socket for the poll phase. It lags
/// the loop's clock by up to a turn (a blocked poll's wait included), and while every poll batch
/// is full by the batches until a source comes round again (`rt/phases.rs`). Outside a loop, the
/// process clock.
#[inline]
pub(crate) fn polled_ns() -> u64 {
    try_with_core(|core| core.polled.get()).unwrap_or_else(crate::clock::now_ns)
}

/// Cancels a timeout that has not fired; it never fires, even if due in the same pass.
#[track_caller]
pub fn clear_timeout(timer: &Timer) {
    timer.clear();
}

/// Cancels an interval; clearing it inside its own callback stops it.
#[track_caller]
pub fn clear_interval(timer: &Timer) {
    timer.clear();
}

#[track_caller]
fn arm(api: &str, delay: u64, action: TimerAction, location: &'static Location<'static>) -> Timer {
    with_core(api, |core| {
        let now = crate::clock::now_ns();
        let key = core
            .timers
            .borrow_mut()
            .insert(now, delay, action, true, location);
        core.ref_handle();
        Timer {
            key,
            loop_id: core.loop_id(),
        }
    })
}

/// Runs `callback` once `delay` ns from now in `core`'s timers phase, unref'd: the loop's own
/// timer, which keeps nothing alive and has no handle (an I/O source's retry later,
/// `Registration::ready_after`).
pub(crate) fn run_later_unref(
    core: &Core,
    delay: u64,
    callback: Box<dyn FnOnce()>,
    location: &'static Location<'static>,
) {
    let now = crate::clock::now_ns();
    core.timers
        .borrow_mut()
        .insert(now, delay, TimerAction::Once(callback), false, location);
}

impl EntryHandle for Timer {
    const NAME: &'static str = "Timer";

    type Entry = TimerEntry;

    fn loop_id(&self) -> u64 {
        self.loop_id
    }

    fn take(&self, core: &Core) -> Option<TimerEntry> {
        core.timers.borrow_mut().remove(self.key)
    }

    fn held_ref(e: &TimerEntry) -> bool {
        e.refd
    }

    fn with_ref_flag<R>(&self, core: &Core, f: impl FnOnce(&mut bool) -> R) -> Option<R> {
        Some(f(&mut core.timers.borrow_mut().get_mut(self.key)?.refd))
    }
}

impl Timer {
    /// Cancels the timer (`clear_timeout` / `clear_interval`). From another thread than its
    /// loop's, in that loop's next poll phase (a timer due before it still fires).
    #[track_caller]
    pub fn clear(&self) {
        self.remove_entry();
    }

    /// Cancels the timer and runs `callback` in the close phase.
    ///
    /// # Panics
    /// On another thread than the timer's loop's (the callback is not `Send`): call `clear`
    /// there, or `close` on the loop's thread.
    #[track_caller]
    pub fn close(&self, callback: impl FnOnce() + 'static) {
        self.close_entry(Box::new(callback), Location::caller());
    }

    /// The timer no longer keeps the loop alive (Node's `timeout.unref()`). From another thread
    /// than its loop's, in that loop's next poll phase.
    #[track_caller]
    pub fn unref(&self) {
        self.set_entry_ref(false);
    }

    /// The timer keeps the loop alive again (Node's `timeout.ref()`; the default). From another
    /// thread than its loop's, in that loop's next poll phase.
    #[track_caller]
    pub fn ref_(&self) {
        self.set_entry_ref(true);
    }

    /// Whether the timer is armed and ref'd (`false` once its loop's `Runtime` is dropped).
    ///
    /// # Panics
    /// On another thread than the timer's loop's, which alone can answer: ask there (from
    /// another thread, through the loop's [`LoopHandle::post`](crate::LoopHandle::post)).
    #[track_caller]
    pub fn has_ref(&self) -> bool {
        self.entry_refd()
    }

    /// Whether the timer is still armed (not fired, for a timeout; not cleared; `false` once its
    /// loop's `Runtime` is dropped).
    ///
    /// # Panics
    /// On another thread than the timer's loop's, which alone can answer: ask there (from
    /// another thread, through the loop's [`LoopHandle::post`](crate::LoopHandle::post)).
    #[track_caller]
    pub fn is_active(&self) -> bool {
        on_loop_thread(self.loop_id, "Timer", "is_active", QUERY, |core| {
            core.timers.borrow().get(self.key).is_some()
        })
        .unwrap_or(false)
    }
}
