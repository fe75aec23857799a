//! `next_tick` and `queue_microtask`: the two queues drained after every macrotask callback.

use std::panic::Location;

use super::context::with_core;
use super::queues::Micro;

/// Queues `callback` on the next-tick queue: it runs when the current callback returns, before
/// any microtask (Node's `process.nextTick`). Ticks queued while ticks drain join the same drain,
/// so a recursive chain starves the loop, as in Node.
#[track_caller]
#[inline]
pub fn next_tick(callback: impl FnOnce() + 'static) {
    let location = Location::caller();
    with_core("nodus::next_tick", |core| {
        core.ticks
            .borrow_mut()
            .push_back((Box::new(callback), location))
    });
}

/// Queues `callback` on the microtask queue (Node's `queueMicrotask`, and where woken tasks are
/// polled): it runs after the next-tick queue is empty, in FIFO order with task polls.
#[track_caller]
#[inline]
pub fn queue_microtask(callback: impl FnOnce() + 'static) {
    let location = Location::caller();
    with_core("nodus::queue_microtask", |core| {
        core.micro
            .borrow_mut()
            .push_back(Micro::Closure(Box::new(callback), location))
    });
}
