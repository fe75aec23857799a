//! The meter at callback boundaries: a task poll or macrotask callback begins and ends, a timer
//! fires, a batch of next-tick and microtask closures runs, the poll phase blocks and returns.
//!
//! Invariants:
//! - A poll's start is published in the watchdog's `LoopSlot` (`begin_poll`, `begin_batch`,
//!   `begin_closure`) and cleared when it returns (`end_poll`, `closures_end`, whose end is the
//!   one clock read of the boundary). The first poll after a drain returned opens the slot's
//!   hold, and `drained` closes it at that read: the watchdog times a stall over the callback and
//!   its whole drain. Only a batch's first closure checks for an open hold.
//! - Only a block with a non-zero timeout counts as idle, and only then is the loop idle to the
//!   watchdog (`before_block` / `after_block`).
//! - A poll at least `slow_poll` long is counted and logged once (target `nodus::slow_poll`, with
//!   the note the poll set last or kept, `nodus::task::set_note`, cleared since or not), and
//!   so is a closure batch (`closures_end`): a batch is timed as a whole, so it is the batch, named
//!   after its last closure, that counts (rt/drain.rs says why and what that misses). Only then,
//!   on that cold path, is the watchdog's record of process stops read (`stopped_during`): a
//!   poll that was slow only because the process was stopped or frozen is logged as such, not
//!   blamed on its task; it still counts as a slow poll (the loop was held that long).
//! - The log's "N runnable waiting" (`run_queue=N`) is the run-queue length when the poll or
//!   batch returned, remote work posted and not yet taken included: every entry that waited
//!   behind it, from its start (`run_queue_at_start`, "K when it began") or from its wake during
//!   it (a task it woke or spawned, an immediate it set, a wake from another thread, the awaiter
//!   its completion woke). Not its own re-wake (a yield: runnable only once it returned), nor an
//!   entry made runnable and cancelled within it.

use std::time::Duration;

use super::{Meter, PollTarget};

impl Meter {
    /// A poll or callback starts at `start` (a boundary time).
    #[inline]
    pub(crate) fn begin_poll(&self, target: &PollTarget, start: u64) {
        #[cfg(feature = "measure")]
        {
            self.waiting_at_start.set(self.runnable.get());
            self.slot
                .begin(target.task_id, target.name, target.location, start);
        }
        #[cfg(not(feature = "measure"))]
        let _ = (target, start);
    }

    /// The first next-tick or microtask closure of a batch that began at `start` starts: it may
    /// open the watchdog's hold (the batch is timed as a whole: `closures_start`, `closures_end`).
    #[inline]
    pub(crate) fn begin_batch(&self, target: &PollTarget, start: u64) {
        #[cfg(feature = "measure")]
        self.slot
            .begin(target.task_id, target.name, target.location, start);
        #[cfg(not(feature = "measure"))]
        let _ = (target, start);
    }

    /// A later closure of that batch starts: published to the watchdog, inside the hold.
    #[inline]
    pub(crate) fn begin_closure(&self, target: &PollTarget, start: u64) {
        #[cfg(feature = "measure")]
        self.slot
            .begin_in_hold(target.task_id, target.name, target.location, start);
        #[cfg(not(feature = "measure"))]
        let _ = (target, start);
    }

    /// The poll that began at `start` returned.
    #[inline]
    pub(crate) fn end_poll(&self, target: &PollTarget, start: u64) {
        #[cfg(feature = "measure")]
        {
            let end = self.refresh();
            self.slot.end();
            let d = end.saturating_sub(start);
            let phase = self.phase.get() as usize;
            let slow = {
                let mut s = self.stats.borrow_mut();
                s.polls += 1;
                s.poll_duration.record(d);
                s.phase_ns[phase] += d;
                s.phase_callbacks[phase] += 1;
                let c = &mut s.classes[target.class as usize];
                c.polls += 1;
                c.poll_duration.record(d);
                let slow = d >= self.config.slow_poll.as_nanos() as u64;
                if slow {
                    s.slow_polls += 1;
                }
                slow
            };
            if slow {
                self.log_slow_poll(target, start, end);
            }
        }
        #[cfg(not(feature = "measure"))]
        let _ = (target, start);
    }

    /// Entries waiting as a slow poll returns: runnable, or posted from another thread and not
    /// yet taken; not the poll's own re-wake (it did not wait behind itself).
    #[cfg(feature = "measure")]
    #[cold]
    fn waiting_after(&self) -> u64 {
        (self.runnable.get() + self.shared.posted_len() as u64)
            .saturating_sub(u64::from(self.self_woken.get()))
    }

    /// How a slow poll from `start` to `end` is told: who ran for how long, and how much of it
    /// the process was stopped or frozen (`watchdog::freeze`); a poll that would not have been
    /// slow without the stop is not blamed on its task. Returns the text and the stop (ns).
    #[cfg(feature = "measure")]
    #[cold]
    fn slow_text(&self, who: &str, start: u64, end: u64) -> (String, u64) {
        let d = end.saturating_sub(start);
        let stopped = self.slot.stopped_during(start, end);
        let (ms, stopped_ms) = (d as f64 / 1e6, stopped as f64 / 1e6);
        let text = if stopped == 0 {
            format!("{who} ran for {ms:.1} ms")
        } else if d - stopped.min(d) < self.config.slow_poll.as_nanos() as u64 {
            format!(
                "the process was stopped or frozen (SIGSTOP, a debugger, a VM pause) for \
                 ~{stopped_ms:.0} ms of the {ms:.1} ms that {who} took; not a blocking task,"
            )
        } else {
            format!(
                "{who} ran for {ms:.1} ms, ~{stopped_ms:.0} ms of it with the process stopped or frozen,"
            )
        };
        (text, stopped)
    }

    #[cfg(feature = "measure")]
    #[cold]
    fn log_slow_poll(&self, target: &PollTarget, start: u64, end: u64) {
        // The note the poll set last (or kept from an earlier one), cleared since or not.
        let note = self
            .slot
            .poll_note()
            .map_or(String::new(), |(note, _)| note.render());
        let task = crate::watchdog::named(target.name, &note, &target.location.to_string());
        let (text, stopped) = self.slow_text(&format!("task {task}"), start, end);
        let (waiting, at_start) = (self.waiting_after(), self.waiting_at_start.get());
        tracing::warn!(
            target: "nodus::slow_poll",
            task = target.name,
            note,
            location = %target.location,
            duration_ms = end.saturating_sub(start) as f64 / 1e6,
            stopped_ms = stopped as f64 / 1e6,
            run_queue = waiting,
            run_queue_at_start = at_start,
            "slow poll: {text} with {waiting} runnable waiting ({at_start} when it began)",
        );
    }

    /// The drain returned: the loop has left the macrotask (callback and drain) it was in, which
    /// ends the watchdog's hold at the latest clock read (the end of the drain's last poll or
    /// batch: no read of its own).
    #[inline]
    pub(crate) fn drained(&self) {
        #[cfg(feature = "measure")]
        self.slot.end_hold(Some(self.now.get()));
    }

    /// A timer with `deadline` fires at boundary `t`.
    #[inline]
    pub(crate) fn timer_fired(&self, deadline: u64, t: u64) {
        #[cfg(feature = "measure")]
        self.stats
            .borrow_mut()
            .timer_lateness
            .record(t.saturating_sub(deadline));
        #[cfg(not(feature = "measure"))]
        let _ = (deadline, t);
    }

    /// A batch of next-tick and microtask closures starts (timed per batch, not one by one);
    /// returns its start time.
    #[inline]
    pub(crate) fn closures_start(&self) -> u64 {
        #[cfg(feature = "measure")]
        {
            let t = self.boundary_time();
            self.tick_batch.set(Some(t));
            self.waiting_at_start.set(self.runnable.get());
            t
        }
        #[cfg(not(feature = "measure"))]
        0
    }

    /// The closure batch ended with `last`; `ticks` and `microtasks` closures ran in it.
    #[inline]
    pub(crate) fn closures_end(&self, last: &PollTarget, ticks: u64, microtasks: u64) {
        #[cfg(feature = "measure")]
        if let Some(start) = self.tick_batch.take() {
            let end = self.refresh();
            self.slot.end();
            let d = end.saturating_sub(start);
            let slow = d >= self.config.slow_poll.as_nanos() as u64;
            {
                let mut s = self.stats.borrow_mut();
                s.tick_drain_ns += d;
                s.ticks += ticks;
                s.microtasks += microtasks;
                if slow {
                    s.slow_polls += 1;
                }
            }
            if slow {
                self.log_slow_closures(last, ticks + microtasks, start, end);
            }
        }
        #[cfg(not(feature = "measure"))]
        let _ = (last, ticks, microtasks);
    }

    #[cfg(feature = "measure")]
    #[cold]
    fn log_slow_closures(&self, last: &PollTarget, closures: u64, start: u64, end: u64) {
        let what = match closures {
            1 => format!("{:?} closure", last.name),
            n => format!("{n} closures ending with a {:?} closure", last.name),
        };
        let (text, stopped) = self.slow_text(&format!("{what} ({})", last.location), start, end);
        let (waiting, at_start) = (self.waiting_after(), self.waiting_at_start.get());
        tracing::warn!(
            target: "nodus::slow_poll",
            task = last.name,
            location = %last.location,
            closures,
            duration_ms = end.saturating_sub(start) as f64 / 1e6,
            stopped_ms = stopped as f64 / 1e6,
            run_queue = waiting,
            run_queue_at_start = at_start,
            "slow poll: {text} with {waiting} runnable waiting ({at_start} when it began)",
        );
    }

    /// The poll phase is about to block for `timeout` (None = forever).
    #[inline]
    pub(crate) fn before_block(&self, timeout: Option<Duration>) {
        #[cfg(feature = "measure")]
        if timeout != Some(Duration::ZERO) {
            self.block_start.set(self.boundary_time());
            self.slot.enter_idle();
        }
        #[cfg(not(feature = "measure"))]
        let _ = timeout;
    }

    /// The poll phase returned from waiting with `events` events.
    #[inline]
    pub(crate) fn after_block(&self, timeout: Option<Duration>, events: usize) {
        if timeout != Some(Duration::ZERO) {
            let t = self.refresh();
            #[cfg(feature = "measure")]
            {
                self.slot.leave_idle();
                self.stats
                    .borrow_mut()
                    .add_idle(self.block_start.get(), t, self.interval_ns());
            }
            #[cfg(not(feature = "measure"))]
            let _ = t;
        }
        #[cfg(feature = "measure")]
        {
            let mut s = self.stats.borrow_mut();
            s.events_total += events as u64;
            s.events_per_poll.record(events as u64);
        }
        #[cfg(not(feature = "measure"))]
        let _ = events;
    }

    /// One more event or completion dispatched in this poll phase (beyond the epoll batch).
    #[inline]
    pub(crate) fn extra_events(&self, n: usize) {
        #[cfg(feature = "measure")]
        {
            self.stats.borrow_mut().events_total += n as u64;
        }
        #[cfg(not(feature = "measure"))]
        let _ = n;
    }
}
