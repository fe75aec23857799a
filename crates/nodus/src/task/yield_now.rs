//! `yield_now`: give the loop a turn (Node's `await new Promise(r => setImmediate(r))`).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// Re-queues the current task in the check phase, so timers, I/O and other tasks run first.
/// The partitioning primitive: call it between chunks of a long computation.
pub fn yield_now() -> YieldNow {
    YieldNow { yielded: false }
}

/// The future returned by [`yield_now`].
#[must_use = "futures do nothing unless awaited"]
pub struct YieldNow {
    yielded: bool,
}

impl Future for YieldNow {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.yielded {
            return Poll::Ready(());
        }
        self.yielded = true;
        // A wake from inside the task's own poll is a yield: the loop queues it for the check phase.
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}
