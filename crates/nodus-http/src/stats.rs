//! HTTP measurements of the current loop: responses by status class, request duration,
//! requests in flight, connections (open, accepted, the accepting servers' caps), bytes.
//! Loop-thread-only (thread-local `Cell`s), folded into the loop's `nodus::metrics::Snapshot` by
//! `fill_snapshot`.

use std::cell::{Cell, RefCell};

use nodus::metrics::{Histogram, HttpSnapshot, Snapshot};

#[derive(Default)]
struct HttpStats {
    by_class: [Cell<u64>; 5],
    duration: RefCell<Histogram>,
    in_flight: Cell<u64>,
    open: Cell<u64>,
    /// The caps of the servers accepting on this loop, summed.
    max: Cell<u64>,
    accepted: Cell<u64>,
    received: Cell<u64>,
    sent: Cell<u64>,
}

thread_local! {
    static STATS: HttpStats = HttpStats::default();
}

fn add(c: &Cell<u64>, n: u64) {
    c.set(c.get() + n);
}

pub(crate) fn received(n: usize) {
    STATS.with(|s| add(&s.received, n as u64));
}

pub(crate) fn sent(n: usize) {
    STATS.with(|s| add(&s.sent, n as u64));
}

pub(crate) fn connection_opened() {
    STATS.with(|s| {
        add(&s.open, 1);
        add(&s.accepted, 1);
    });
}

pub(crate) fn connection_closed() {
    STATS.with(|s| s.open.set(s.open.get().saturating_sub(1)));
}

/// A server's cap on this loop's books while it accepts: added now, taken off when dropped (its
/// accept task ended: a drain, its listener's end, or the runtime's drop).
pub(crate) struct Cap(u64);

impl Cap {
    pub(crate) fn new(max: usize) -> Cap {
        let max = u64::try_from(max).unwrap_or(u64::MAX);
        STATS.with(|s| s.max.set(s.max.get().saturating_add(max)));
        Cap(max)
    }
}

impl Drop for Cap {
    fn drop(&mut self) {
        // The thread's own state may be gone already when a runtime is dropped at its exit.
        let _ = STATS.try_with(|s| s.max.set(s.max.get().saturating_sub(self.0)));
    }
}

pub(crate) fn request_started() {
    STATS.with(|s| add(&s.in_flight, 1));
}

/// A request's response head is ready after `ns`.
pub(crate) fn request_finished(status: http::StatusCode, ns: u64) {
    STATS.with(|s| {
        s.in_flight.set(s.in_flight.get().saturating_sub(1));
        add(&s.by_class[class(status)], 1);
        s.duration.borrow_mut().record(ns);
    });
}

/// A request head that could not be parsed was answered with `status` (never in flight, no
/// duration: it has no start).
pub(crate) fn request_refused(status: http::StatusCode) {
    STATS.with(|s| add(&s.by_class[class(status)], 1));
}

fn class(status: http::StatusCode) -> usize {
    (status.as_u16() / 100).clamp(1, 5) as usize - 1
}

/// A request was dropped unanswered (its connection was cut).
pub(crate) fn request_abandoned() {
    STATS.with(|s| s.in_flight.set(s.in_flight.get().saturating_sub(1)));
}

/// Adds this loop's HTTP figures to `snapshot`.
pub fn fill_snapshot(snapshot: &mut Snapshot) {
    STATS.with(|s| {
        snapshot.http = HttpSnapshot {
            responses_by_class: std::array::from_fn(|i| s.by_class[i].get()),
            request_duration: s.duration.borrow().snapshot(),
            requests_in_flight: s.in_flight.get(),
            connections_open: s.open.get(),
            connections_max: s.max.get(),
            connections_total: s.accepted.get(),
            bytes_received_total: s.received.get(),
            bytes_sent_total: s.sent.get(),
        };
    });
}

/// The current loop's snapshot, HTTP figures included.
///
/// # Panics
/// On a thread with no nodus loop.
pub fn snapshot() -> Snapshot {
    let mut s = nodus::metrics::snapshot();
    fill_snapshot(&mut s);
    s
}
