//! Running work: one macrotask callback, one task poll, and the queue drain after each.
//!
//! The drain is Node's rule (DESIGN.md section 2): after every macrotask callback, run the whole
//! next-tick queue, then the whole microtask queue, and repeat until both are empty. A woken
//! task's poll is a microtask.
//!
//! Invariants:
//! - Closures are timed per batch, not one by one: a batch is the closures run between two
//!   boundaries (the drain's start, a task poll, the end of a round that emptied both queues). It
//!   starts at the boundary's (usually cached) time and ends with one clock read. A chained closure
//!   costs a few nanoseconds and a chain is one batch: a read per closure (a vDSO
//!   `clock_gettime`) would cost several times the closure.
//! - Each closure is published to the watchdog with its queue's name, `"next_tick"` or
//!   `"microtask"`, and where it was queued (nothing else per closure: the batch's start is
//!   already known). The watchdog's unit is the hold: from the first poll after the previous drain
//!   returned (usually the macrotask callback) until this drain returns (`Meter::drained`, at the
//!   last poll's or batch's clock read). However short each poll or closure, a drain that never
//!   empties (tasks that wake each other, a chain of closures) is one stall, reported while it
//!   lasts and named after the polls the watchdog saw running in it.
//! - A batch at least the slow-poll threshold long counts as one slow poll and is logged once,
//!   named after its last closure (the one in the watchdog's slot when it ended). That is exact for
//!   a batch of one closure, the usual shape of a slow one (a callback queues a heavy closure). A
//!   longer batch is logged with its size: the slow closure may be an earlier one, several slow
//!   closures in one batch count once, and many short ones that add up to the threshold count too
//!   (the loop ran that long without a boundary all the same). No slow closure goes uncounted:
//!   its batch is at least as long.

use std::panic::Location;

use super::core::{COOP_BUDGET, Core};
use super::queues::{Micro, RunItem};
use crate::metrics::classes;
use crate::metrics::meter::PollTarget;

impl Core {
    /// Runs `f` as a macrotask callback (measured, watched) and drains the queues after it.
    #[inline]
    pub(crate) fn run_callback(
        &self,
        target: PollTarget,
        queued_at: Option<u64>,
        f: impl FnOnce(),
    ) {
        let t = self.boundary();
        if let Some(at) = queued_at {
            self.meter.depart(at, t);
        }
        self.meter.begin_poll(&target, t);
        f();
        self.meter.end_poll(&target, t);
        self.drain();
    }

    /// Polls a task or the main future that left a queue at boundary `t`.
    pub(crate) fn run_item(&self, item: RunItem, queued_at: u64, t: u64) {
        self.meter.depart(queued_at, t);
        match item {
            RunItem::Task(runnable) => {
                let meta = *runnable.metadata();
                let target = PollTarget {
                    task_id: meta.id,
                    name: meta.name,
                    location: meta.location,
                    class: meta.class,
                };
                self.current.set(Some(target));
                self.budget.set(COOP_BUDGET);
                self.meter.begin_poll(&target, t);
                self.meter.begin_task_note(meta.key, meta.id);
                runnable.run();
                if self.meter.note_state_set() {
                    self.end_task_note(meta.key, meta.id);
                }
                self.meter.end_poll(&target, t);
                self.after_poll();
                self.current.set(None);
            }
            RunItem::Main => self.poll_main(t),
        }
    }

    /// Drains next-ticks and microtasks until both queues are empty.
    pub(crate) fn drain(&self) {
        self.meter.sample_run_queue();
        let mut batch = Batch::default();
        loop {
            loop {
                let tick = self.ticks.borrow_mut().pop_front();
                let Some((f, location)) = tick else { break };
                self.closure(&mut batch, "next_tick", location);
                batch.ticks += 1;
                f();
            }
            loop {
                let popped = self.micro.borrow_mut().pop_front();
                match popped {
                    None => break,
                    Some(Micro::Closure(f, location)) => {
                        self.closure(&mut batch, "microtask", location);
                        batch.micros += 1;
                        f();
                    }
                    Some(Micro::Run(item, at)) => {
                        self.end_batch(&mut batch);
                        let t = self.boundary();
                        self.run_item(item, at, t);
                    }
                }
            }
            self.end_batch(&mut batch);
            if self.ticks.borrow().is_empty() && self.micro.borrow().is_empty() {
                self.meter.drained();
                return;
            }
        }
    }

    /// A closure from the queue `name` (`"next_tick"` or `"microtask"`) is about to run.
    #[inline]
    fn closure(&self, batch: &mut Batch, name: &'static str, location: &'static Location<'static>) {
        let target = Core::callback_target(name, location, classes::MAIN);
        if batch.last.is_none() {
            batch.start = self.meter.closures_start();
            self.meter.begin_batch(&target, batch.start);
        } else {
            self.meter.begin_closure(&target, batch.start);
        }
        batch.last = Some(target);
    }

    #[inline]
    fn end_batch(&self, batch: &mut Batch) {
        if let Some(last) = batch.last {
            self.meter.closures_end(&last, batch.ticks, batch.micros);
            *batch = Batch::default();
        }
    }
}

/// Next-tick and microtask closures run since the last boundary.
#[derive(Default)]
struct Batch {
    start: u64,
    ticks: u64,
    micros: u64,
    /// The closure that ran last (none yet: no batch in progress).
    last: Option<PollTarget>,
}
