//! Timer futures: `sleep`, `interval`, `timeout`.
//!
//! A `Sleep` fixes its deadline when created (or reset), from a fresh read of the process clock
//! the loops share, inside a loop or not (so work done earlier in the same poll does not shorten
//! it; see the `time` module docs), and joins the timer queue of the loop that first
//! polls it, as a waker entry (no boxed callback). While armed and ref'd it keeps the loop alive,
//! like a pending `setTimeout` promise; dropping it cancels the timer.
//!
//! Invariant: an armed `Sleep` holds its timer's key and its loop's id, and dropping, resetting
//! or unref'ing it acts on that loop's queue wherever it happens: on its loop, after `block_on`
//! returned, while another `Runtime` is current (`rt::context::with_loop`). So a `Sleep` dropped
//! off its loop neither keeps that loop alive until its deadline nor leaves a timer that wakes
//! a task for nothing; once the loop's `Runtime` is dropped its timer went with it. `Sleep` is
//! `Send + Sync` (hyper's timer requires it) and holds no reference to its loop (no count to
//! keep per arm): dropped, reset or unref'd on another thread, it touches none of its loop's
//! state there, but posts the change to the loop's remote queue (`rt::context::on_loop`), which
//! makes it in that loop's next poll phase (waking a loop blocked in `epoll_wait`). Until then
//! the timer may still fire and wake the task that polled the sleep: a spurious wake. It is
//! polled only on its loop (`poll` asserts it when armed).
//!
//! Unlike `set_timeout`, these take delays past Node's maximum (2^31 − 1 ms, about 24.8 days): a
//! longer sleep arms its timer for at most that long and re-arms it, from the loop's time, for
//! what is left each time it fires, until its deadline (fixed when it was made: the steps
//! shorten nothing). A sleep within the maximum arms once.

use std::fmt;
use std::future::Future;
use std::panic::Location;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use super::delay::IntoDelay;
use super::queue::{TimerAction, TimerKey};
use crate::rt::context::{on_loop, with_core};
use crate::rt::entry::EntryHandle;

/// The longest one timer of a `Sleep` is armed for: Node's maximum delay.
#[cfg(not(test))]
fn max_step_ns() -> u64 {
    super::MAX_DELAY.as_nanos() as u64
}

#[cfg(test)]
thread_local! {
    /// A shorter step, so that the unit tests see a long sleep re-arm.
    static MAX_STEP_NS: std::cell::Cell<u64> =
        const { std::cell::Cell::new(super::MAX_DELAY.as_nanos() as u64) };
}

#[cfg(test)]
fn max_step_ns() -> u64 {
    MAX_STEP_NS.get()
}

/// Completes once its deadline has passed on the loop clock. See [`sleep`].
#[must_use = "futures do nothing unless awaited"]
pub struct Sleep {
    deadline: u64,
    /// When it was made (or reset): its first timer counts from here (timers of one delay share
    /// a list in the queue).
    start: u64,
    key: Option<TimerKey>,
    /// The loop whose queue holds `key`.
    loop_id: u64,
    refd: bool,
    fired: bool,
    location: &'static Location<'static>,
}

/// Waits for `delay` (at least 1 ms, Node's rule), counted from this call: the clock is read
/// here, so synchronous work done earlier in the same poll does not shorten the wait (see the
/// `time` module docs). It completes in the first timers pass at or past its deadline.
///
#[track_caller]
pub fn sleep(delay: impl IntoDelay) -> Sleep {
    sleep_from(
        crate::clock::now_ns(),
        delay.into_unlimited_delay_ns(),
        Location::caller(),
    )
}

/// A sleep of `delay` ns from `start`.
fn sleep_from(start: u64, delay: u64, location: &'static Location<'static>) -> Sleep {
    Sleep {
        deadline: start.saturating_add(delay),
        start,
        key: None,
        loop_id: 0,
        refd: true,
        fired: false,
        location,
    }
}

/// Waits until `deadline` (at least 1 ms from this call, Node's rule).
///
#[track_caller]
pub fn sleep_until(deadline: Instant) -> Sleep {
    let now = crate::clock::now_ns();
    let delay = deadline.saturating_duration_since(crate::clock::instant_at(now));
    sleep_from(now, delay.into_unlimited_delay_ns(), Location::caller())
}

impl Sleep {
    /// The sleep no longer keeps the loop alive (`run` may return before it completes).
    pub fn unref(&mut self) {
        if !std::mem::replace(&mut self.refd, false) {
            return;
        }
        let Some(key) = self.key else { return };
        on_loop(self.loop_id, self.location, move |core| {
            if let Some(e) = core.timers.borrow_mut().get_mut(key) {
                core.set_refd(&mut e.refd, false);
            }
        });
    }

    /// When it completes.
    pub fn deadline(&self) -> Instant {
        crate::clock::instant_at(self.deadline)
    }

    /// Whether the deadline has been reached (the timer fired).
    pub fn is_elapsed(&self) -> bool {
        self.fired
    }

    /// Re-arms the sleep for `delay` from this call (a fresh clock read, as [`sleep`]).
    #[track_caller]
    pub fn reset(&mut self, delay: impl IntoDelay) {
        let delay = delay.into_unlimited_delay_ns();
        self.cancel();
        self.start = crate::clock::now_ns();
        self.deadline = self.start.saturating_add(delay);
        self.fired = false;
    }

    /// Disarms its timer in the loop that holds it, wherever this runs (see the module docs): as
    /// clearing a `Timer` with its key does.
    fn cancel(&mut self) {
        let Some(key) = self.key.take() else { return };
        let timer = super::Timer {
            key,
            loop_id: self.loop_id,
        };
        on_loop(self.loop_id, self.location, move |core| {
            drop(timer.remove_from(core));
        });
    }
}

impl Future for Sleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        if this.fired {
            return Poll::Ready(());
        }
        with_core("Sleep::poll", |core| {
            if this.key.is_some() {
                assert_eq!(
                    core.loop_id(),
                    this.loop_id,
                    "nodus: a Sleep was moved to another loop while armed"
                );
            }
            let mut timers = core.timers.borrow_mut();
            // The start of the step to arm: the sleep's own start, or the loop's time for the
            // next step of a long sleep whose timer fired before its deadline.
            let start = match this.key {
                None => this.start,
                Some(key) => match timers.get_mut(key) {
                    Some(e) => {
                        if let TimerAction::Wake(w) = &mut e.action
                            && !w.as_ref().is_some_and(|w| w.will_wake(cx.waker()))
                        {
                            let old = w.replace(cx.waker().clone());
                            drop(timers);
                            drop(old);
                        }
                        return Poll::Pending;
                    }
                    // Judged on the loop clock, on which a sleep never ends early; the deadline
                    // is fixed, so a step armed from the cached time shortens nothing.
                    None if this.deadline - this.start > max_step_ns()
                        && core.meter.now() < this.deadline =>
                    {
                        core.meter.now()
                    }
                    None => {
                        this.key = None;
                        this.fired = true;
                        return Poll::Ready(());
                    }
                },
            };
            this.loop_id = core.loop_id();
            let action = TimerAction::Wake(Some(cx.waker().clone()));
            this.key = Some(timers.insert(
                start,
                (this.deadline - start).min(max_step_ns()),
                action,
                this.refd,
                this.location,
            ));
            drop(timers);
            if this.refd {
                core.ref_handle();
            }
            Poll::Pending
        })
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        self.cancel();
    }
}

impl fmt::Debug for Sleep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sleep")
            .field("deadline", &self.deadline())
            .field("fired", &self.fired)
            .finish()
    }
}

/// Ticks every `period`, the first tick one period after this call (like `setInterval`; the clock
/// is read here, as [`sleep`] does). A tick that is late re-arms from when it ran, so late ticks
/// are not bunched up.
///
#[track_caller]
pub fn interval(period: impl IntoDelay) -> Interval {
    let period = Duration::from_nanos(period.into_unlimited_delay_ns());
    Interval {
        period,
        sleep: sleep(period),
    }
}

/// See [`interval`].
#[derive(Debug)]
pub struct Interval {
    period: Duration,
    sleep: Sleep,
}

impl Interval {
    /// Waits for the next tick.
    pub async fn tick(&mut self) {
        std::future::poll_fn(|cx| self.poll_tick(cx)).await
    }

    /// Polls for the next tick.
    pub fn poll_tick(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        match Pin::new(&mut self.sleep).poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(()) => {
                self.sleep.reset(self.period);
                Poll::Ready(())
            }
        }
    }

    /// The interval no longer keeps the loop alive.
    pub fn unref(&mut self) {
        self.sleep.unref();
    }

    pub fn period(&self) -> Duration {
        self.period
    }
}

/// Runs `future` for at most `limit`, counted from this call (the clock is read here, as
/// [`sleep`] does: work done earlier in the same poll does not shorten the limit); `Err(Elapsed)`
/// if the time ran out first.
///
#[track_caller]
pub fn timeout<F: Future>(limit: impl IntoDelay, future: F) -> Timeout<F> {
    Timeout {
        future,
        sleep: sleep(limit),
    }
}

/// See [`timeout`].
#[must_use = "futures do nothing unless awaited"]
pub struct Timeout<F> {
    future: F,
    sleep: Sleep,
}

/// The time limit of [`timeout`] ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Elapsed;

impl fmt::Display for Elapsed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("deadline has elapsed")
    }
}

impl std::error::Error for Elapsed {}

impl<F: Future> Future for Timeout<F> {
    type Output = Result<F::Output, Elapsed>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // SAFETY: `future` is structurally pinned (never moved out, no Unpin impl for `Timeout`,
        // no Drop impl); `sleep` is `Unpin` and never pinned.
        let this = unsafe { self.get_unchecked_mut() };
        // SAFETY: see above.
        let future = unsafe { Pin::new_unchecked(&mut this.future) };
        if let Poll::Ready(v) = future.poll(cx) {
            return Poll::Ready(Ok(v));
        }
        Pin::new(&mut this.sleep).poll(cx).map(|()| Err(Elapsed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::loop_now_ns;

    #[test]
    fn a_sleep_longer_than_one_step_rearms_until_its_deadline() {
        MAX_STEP_NS.set(5_000_000);
        let rt = crate::Runtime::new();
        let (deadline, woke) = rt.block_on(async {
            let s = sleep(Duration::from_millis(23));
            let deadline = s.deadline;
            s.await;
            (deadline, loop_now_ns())
        });
        assert!(
            woke >= deadline,
            "woke {} ms before the deadline",
            (deadline - woke) as f64 / 1e6
        );
        // A sleep within one step arms once and ends at its deadline too.
        let (deadline, woke) = rt.block_on(async {
            let s = sleep(Duration::from_millis(3));
            let deadline = s.deadline;
            s.await;
            (deadline, loop_now_ns())
        });
        assert!(woke >= deadline);
    }
}
