//! The cooperative budget: each task poll, and each poll of the `block_on` future, may do
//! `COOP_BUDGET` (128) resource operations; past that, resources answer `Pending` and the task
//! is re-queued in the check phase, so timers and other I/O get their turn. Forced yields are
//! counted per task name (the `block_on` future's under `main`).

use std::future::poll_fn;
use std::task::{Context, Poll};

use crate::rt::context::try_with_core;

/// Takes one unit of the current task's budget; `Pending` (with the task re-queued) when spent.
/// Outside a poll of a task or of the `block_on` future (in a plain callback), the budget is
/// unlimited.
#[inline]
pub(crate) fn poll_proceed(cx: &mut Context<'_>) -> Poll<()> {
    if try_with_core(|core| core.consume_budget()).unwrap_or(true) {
        Poll::Ready(())
    } else {
        // A self-wake during the task's own poll: the loop queues it for the check phase.
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// Uses one unit of the current task's cooperative budget, yielding to the loop when it is spent.
/// Call it in loops over work that is always ready (a channel that is never empty, say).
pub async fn consume_budget() {
    poll_fn(poll_proceed).await
}
