//! hyper's timer on nodus timers (used for header-read timeouts and HTTP/2 keep-alive pings).
//!
//! `nodus::Sleep` is `Send + Sync` as hyper requires, but it belongs to the loop that polls it
//! first; hyper polls its sleeps from the connection task, on that loop.

use std::pin::Pin;
use std::time::{Duration, Instant};

/// The nodus timer, for `hyper` builders.
#[derive(Debug, Clone, Copy, Default)]
pub struct NodusTimer;

impl hyper::rt::Timer for NodusTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(TimerSleep(nodus::sleep(duration)))
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(TimerSleep(nodus::time::sleep_until(deadline)))
    }
}

/// hyper's `Sleep` is a sealed-by-convention trait over our future.
struct TimerSleep(nodus::Sleep);

impl std::future::Future for TimerSleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        Pin::new(&mut self.0).poll(cx)
    }
}

impl hyper::rt::Sleep for TimerSleep {}
