//! `Meter`: the loop's always-on measurements, updated at poll boundaries.
//!
//! The loop calls the same methods whether or not the `measure` feature is on; without it they
//! compile to nothing except the clock the timers need. With it:
//!
//! - **One clock read per poll boundary** (and one per wake or immediate queued by user code, for
//!   the schedule delay). A poll's end time is the next poll's start time when nothing ran in
//!   between (`fresh`). Only a syscall in the poll phase, user code outside a poll
//!   (`Runtime::enter`'s closure), the loop starting, or a whole iteration without a read
//!   (`poll_skipped`: the loop's time must advance) make the cached time stale: the rest of the
//!   loop's own bookkeeping between two polls takes nanoseconds, so it is not worth a read.
//! - **Schedule delay** is measured from the moment an entry became runnable to the boundary at
//!   which it starts to run: a task woken (or spawned) on the loop, or an immediate, from the wake
//!   itself, read from the clock then (so a task woken early in a long poll is seen waiting
//!   behind the rest of it: one clock read per wake or immediate in user code); for a task that
//!   woke itself (a yield), the end of its own poll (it was running until then); for a task woken
//!   by I/O, the moment `epoll_wait` returned (so an event that waits behind earlier events of
//!   the same poll counts, but not the time it waited in the kernel before; no read of its own);
//!   for a `Sleep`, its timer's boundary; for remote work (a wake from another thread, a pool
//!   completion, a `LoopHandle::post`), its post (`Shared::push_remote` stamps it).
//! - **Run-queue length** is integrated over time at boundaries, every entry counted from the
//!   same moment its schedule delay starts (`run_queue`), so Little's law (mean length = arrival
//!   rate × mean delay) holds by construction.
//! - **Intervals** (utilization, run-queue mean and maximum over the last one) are at least
//!   `MeterConfig::interval` long; `stats` says when one closes.
//! - **Idle** is time blocked in the poll phase with a non-zero timeout; busy is the rest.
//!
//! All state is loop-thread-only (`Cell`/`RefCell`); the watchdog reads only the `LoopSlot`.
//!
//! Layout: this file holds `Meter` itself, its construction and its clock (the cached read and
//! when it goes stale); `run_queue` the arrival/departure accounting (schedule delay, run-queue
//! length); `poll` the per-callback boundaries (polls, timers, closure batches, blocking in the
//! poll phase); `notes` the task notes the watchdog shows (`nodus::task::set_note`); `tasks` the
//! task-class counters; `stats` the plain counters they all update.

// With the `measure` feature off (the overhead benchmark only) this is compiled but not used.
#![cfg_attr(not(feature = "measure"), allow(dead_code))]

mod notes;
mod poll;
mod run_queue;
#[cfg(feature = "measure")]
mod stats;
mod tasks;

use std::cell::{Cell, RefCell};
use std::panic::Location;
use std::sync::Arc;
use std::time::Duration;

use super::classes::{ClassId, Classes};
use super::phase::Phase;
use crate::clock;
use crate::rt::core::Shared;

#[cfg(feature = "measure")]
use crate::watchdog::{LoopSlot, Note};
#[cfg(feature = "measure")]
pub(crate) use stats::{ClassStats, LoopStats};

/// Tunables of one loop's measurements.
#[derive(Debug, Clone)]
pub(crate) struct MeterConfig {
    pub(crate) slow_poll: Duration,
    pub(crate) stall: Duration,
    pub(crate) watchdog: bool,
    pub(crate) interval: Duration,
}

/// Who is being polled, for the watchdog slot and per-class statistics.
#[derive(Clone, Copy)]
pub(crate) struct PollTarget {
    pub(crate) task_id: u64,
    pub(crate) name: &'static str,
    pub(crate) location: &'static Location<'static>,
    pub(crate) class: ClassId,
}

/// The measurements of one loop.
pub(crate) struct Meter {
    /// The loop's remote queue: the remote work a slow poll's log counts as waiting.
    #[cfg(feature = "measure")]
    shared: Arc<Shared>,
    /// The latest clock read (ns since the process epoch).
    now: Cell<u64>,
    /// Whether `now` is still the current time for boundary purposes.
    #[cfg(feature = "measure")]
    fresh: Cell<bool>,
    /// Whether the clock was read since the poll phase last skipped its syscall
    /// (`poll_skipped`).
    #[cfg(feature = "measure")]
    read_since_skip: Cell<bool>,
    #[cfg(feature = "measure")]
    last_boundary: Cell<u64>,
    /// Entries runnable since the previous boundary (tasks, main, immediates).
    #[cfg(feature = "measure")]
    runnable_at_boundary: Cell<u64>,
    /// The time from the previous boundary to their own of the entries that became runnable
    /// since, summed: `runnable_at_boundary` counts them from that boundary (`run_queue`).
    #[cfg(feature = "measure")]
    credit: Cell<u64>,
    /// The time of the wakes the loop itself makes now (`wakes_at`); 0: a wake reads the clock.
    #[cfg(feature = "measure")]
    wake_at: Cell<u64>,
    /// The poll under way woke itself: its yield is runnable once it returns (`arrive_self`).
    #[cfg(feature = "measure")]
    self_woken: Cell<bool>,
    /// Entries currently runnable.
    runnable: Cell<u64>,
    /// Entries runnable when the poll (or closure batch) under way began (for the slow-poll
    /// log).
    #[cfg(feature = "measure")]
    waiting_at_start: Cell<u64>,
    #[cfg(feature = "measure")]
    phase: Cell<Phase>,
    #[cfg(feature = "measure")]
    block_start: Cell<u64>,
    #[cfg(feature = "measure")]
    tick_batch: Cell<Option<u64>>,
    pub(crate) classes: RefCell<Classes>,
    #[cfg(feature = "measure")]
    pub(crate) stats: RefCell<LoopStats>,
    #[cfg(feature = "measure")]
    pub(crate) slot: Arc<LoopSlot>,
    /// `NOTE_KEPT` | `NOTE_DIRTY`: the task poll under way and its note (`notes`).
    #[cfg(feature = "measure")]
    note_state: Cell<u8>,
    /// The notes tasks keep between polls, by task key, with the task's id (0: none), and how
    /// many there are.
    #[cfg(feature = "measure")]
    notes: RefCell<Vec<(u64, Note)>>,
    #[cfg(feature = "measure")]
    kept_notes: Cell<usize>,
    pub(crate) config: MeterConfig,
    #[cfg(not(feature = "measure"))]
    _slot: std::marker::PhantomData<Arc<()>>,
}

impl Meter {
    pub(crate) fn new(shared: &Arc<Shared>, config: MeterConfig) -> Meter {
        let loop_id = shared.loop_id;
        let now = clock::now_ns();
        #[cfg(feature = "measure")]
        let slot = {
            let slot = LoopSlot::new(loop_id, config.stall);
            if config.watchdog {
                crate::watchdog::register(&slot);
            }
            // Not running until `run`/`block_on` says so (`loop_running`).
            slot.enter_idle();
            slot
        };
        #[cfg(not(feature = "measure"))]
        let _ = loop_id;
        Meter {
            #[cfg(feature = "measure")]
            shared: shared.clone(),
            now: Cell::new(now),
            #[cfg(feature = "measure")]
            fresh: Cell::new(false),
            #[cfg(feature = "measure")]
            read_since_skip: Cell::new(false),
            #[cfg(feature = "measure")]
            last_boundary: Cell::new(now),
            #[cfg(feature = "measure")]
            runnable_at_boundary: Cell::new(0),
            #[cfg(feature = "measure")]
            credit: Cell::new(0),
            #[cfg(feature = "measure")]
            wake_at: Cell::new(0),
            #[cfg(feature = "measure")]
            self_woken: Cell::new(false),
            runnable: Cell::new(0),
            #[cfg(feature = "measure")]
            waiting_at_start: Cell::new(0),
            #[cfg(feature = "measure")]
            phase: Cell::new(Phase::Main),
            #[cfg(feature = "measure")]
            block_start: Cell::new(0),
            #[cfg(feature = "measure")]
            tick_batch: Cell::new(None),
            classes: RefCell::new(Classes::new()),
            #[cfg(feature = "measure")]
            stats: RefCell::new(LoopStats::new(now)),
            #[cfg(feature = "measure")]
            slot,
            #[cfg(feature = "measure")]
            note_state: Cell::new(0),
            #[cfg(feature = "measure")]
            notes: RefCell::new(Vec::new()),
            #[cfg(feature = "measure")]
            kept_notes: Cell::new(0),
            config,
            #[cfg(not(feature = "measure"))]
            _slot: std::marker::PhantomData,
        }
    }

    /// The latest clock read: the base new timers count from.
    #[inline]
    pub(crate) fn now(&self) -> u64 {
        self.now.get()
    }

    /// Reads the clock.
    #[inline]
    pub(crate) fn refresh(&self) -> u64 {
        let t = clock::now_ns();
        self.now.set(t);
        #[cfg(feature = "measure")]
        {
            self.fresh.set(true);
            self.read_since_skip.set(true);
        }
        t
    }

    /// The current time: the cached read if nothing ran since (measurements on), else a new read.
    #[inline]
    pub(crate) fn current_time(&self) -> u64 {
        #[cfg(feature = "measure")]
        {
            self.boundary_time()
        }
        #[cfg(not(feature = "measure"))]
        {
            self.refresh()
        }
    }

    /// The current time at a boundary: the cached read if nothing ran since, else a new read.
    #[inline]
    fn boundary_time(&self) -> u64 {
        #[cfg(feature = "measure")]
        {
            if self.fresh.get() {
                self.now.get()
            } else {
                self.refresh()
            }
        }
        #[cfg(not(feature = "measure"))]
        {
            0
        }
    }

    /// The loop starts or stops running (`run`, `block_on`, `enter`): a loop that is not running is
    /// idle to the watchdog, which can then sleep.
    #[inline]
    pub(crate) fn loop_running(&self, running: bool) {
        #[cfg(feature = "measure")]
        if running {
            self.fresh.set(false);
            self.slot.leave_idle();
        } else {
            // Normally closed by the drain already; not if a callback unwound out of the loop.
            self.slot.end_hold(None);
            self.slot.enter_idle();
        }
        #[cfg(not(feature = "measure"))]
        let _ = running;
    }

    /// Enters a phase: callbacks run from now on are attributed to it.
    #[inline]
    pub(crate) fn phase(&self, phase: Phase) {
        #[cfg(feature = "measure")]
        self.phase.set(phase);
        #[cfg(not(feature = "measure"))]
        let _ = phase;
    }

    /// Time passed outside any measured poll (a syscall, user code): the next boundary reads the
    /// clock.
    #[inline]
    pub(crate) fn stale(&self) {
        #[cfg(feature = "measure")]
        self.fresh.set(false);
    }

    /// The poll phase made no syscall (nothing registered, nothing to wait for). The loop's time
    /// still advances every iteration (libuv's `uv__update_time`), or a timer never comes due in
    /// a loop that never blocks: unless the clock was read since the last such pass (a poll's end
    /// in this iteration, the walk over empty phases ago), the next boundary reads it. A loop
    /// turn that runs one callback thus reads the clock once, at the callback's end.
    #[inline]
    pub(crate) fn poll_skipped(&self) {
        #[cfg(feature = "measure")]
        if !self.read_since_skip.replace(false) {
            self.fresh.set(false);
        }
    }

    /// A new iteration starts.
    #[inline]
    pub(crate) fn iteration(&self) {
        #[cfg(feature = "measure")]
        {
            let mut s = self.stats.borrow_mut();
            s.iterations += 1;
            s.roll_interval_if_due(self.now.get(), self.interval_ns());
        }
    }

    /// The configured interval length (`MeterConfig::interval`), in ns.
    #[cfg(feature = "measure")]
    #[inline]
    fn interval_ns(&self) -> u64 {
        u64::try_from(self.config.interval.as_nanos()).unwrap_or(u64::MAX)
    }
}
