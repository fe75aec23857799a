//! `JoinHandle`: await a task's output, or abort it; and the panic boundary around every task.
//!
//! Dropping a `JoinHandle` detaches the task (it keeps running), as in tokio; `abort` cancels it,
//! and so does dropping the runtime (the task's future is dropped with it).

use std::any::Any;
use std::cell::Cell;
use std::fmt;
use std::future::Future;
use std::mem::ManuallyDrop;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::task::{Context, Poll};

use async_task::FallibleTask;

use super::TaskMeta;

type Payload = Box<dyn Any + Send + 'static>;

/// Why a task has no output.
pub enum JoinError {
    /// The task was aborted, or its runtime dropped, before it finished.
    Cancelled,
    /// The task panicked; the payload is what it panicked with.
    Panicked(Payload),
}

impl JoinError {
    pub fn is_panic(&self) -> bool {
        matches!(self, JoinError::Panicked(_))
    }

    pub fn is_cancelled(&self) -> bool {
        matches!(self, JoinError::Cancelled)
    }

    /// The panic message, when the payload is a string.
    pub fn panic_message(&self) -> Option<&str> {
        match self {
            JoinError::Panicked(p) => p
                .downcast_ref::<&'static str>()
                .copied()
                .or_else(|| p.downcast_ref::<String>().map(|s| s.as_str())),
            JoinError::Cancelled => None,
        }
    }

    /// The panic payload, to resume the panic with `std::panic::resume_unwind`.
    pub fn into_panic(self) -> Option<Payload> {
        match self {
            JoinError::Panicked(p) => Some(p),
            JoinError::Cancelled => None,
        }
    }
}

impl fmt::Debug for JoinError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JoinError::Cancelled => f.write_str("JoinError::Cancelled"),
            JoinError::Panicked(_) => {
                write!(
                    f,
                    "JoinError::Panicked({:?})",
                    self.panic_message().unwrap_or("<non-string payload>")
                )
            }
        }
    }
}

impl fmt::Display for JoinError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JoinError::Cancelled => f.write_str("task was cancelled"),
            JoinError::Panicked(_) => {
                write!(
                    f,
                    "task panicked: {}",
                    self.panic_message().unwrap_or("<non-string payload>")
                )
            }
        }
    }
}

impl std::error::Error for JoinError {}

/// An owned permission to await a task's output or abort it.
///
/// It may outlive the task's runtime: the runtime's drop drops the task, and the handle then
/// gives `JoinError::Cancelled` wherever it is awaited.
#[must_use = "dropping a JoinHandle detaches the task; call .detach() to say so"]
pub struct JoinHandle<T> {
    task: Cell<Option<FallibleTask<Result<T, Payload>, TaskMeta>>>,
    id: u64,
    aborted: Cell<bool>,
}

impl<T> JoinHandle<T> {
    pub(crate) fn new(task: FallibleTask<Result<T, Payload>, TaskMeta>, id: u64) -> Self {
        JoinHandle {
            task: Cell::new(Some(task)),
            id,
            aborted: Cell::new(false),
        }
    }

    /// Cancels the task: its future is dropped without being polled again (on the loop, during
    /// the current queue drain). Awaiting the handle then gives `JoinError::Cancelled`, unless the
    /// task had already finished.
    pub fn abort(&self) {
        if let Some(task) = self.task.take() {
            if task.is_finished() {
                self.task.set(Some(task));
            } else {
                self.aborted.set(true);
                drop(task);
            }
        }
    }

    /// Whether the task has completed (or was aborted).
    pub fn is_finished(&self) -> bool {
        let task = self.task.take();
        let done = task.as_ref().is_none_or(|t| t.is_finished());
        self.task.set(task);
        done
    }

    /// The task's loop-unique id (as in stall reports).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Lets the task run to completion on its own, without keeping its output.
    pub fn detach(self) {
        drop(self)
    }
}

impl<T> Future for JoinHandle<T> {
    type Output = Result<T, JoinError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let Some(task) = this.task.get_mut() else {
            assert!(
                this.aborted.get(),
                "nodus: JoinHandle polled after it returned the task's output"
            );
            return Poll::Ready(Err(JoinError::Cancelled));
        };
        match Pin::new(task).poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(out) => {
                this.task.set(None);
                Poll::Ready(match out {
                    Some(Ok(v)) => Ok(v),
                    Some(Err(p)) => Err(JoinError::Panicked(p)),
                    // Cancelled: by `abort`, or by the runtime's drop (which drops every task).
                    None => {
                        this.aborted.set(true);
                        Err(JoinError::Cancelled)
                    }
                })
            }
        }
    }
}

impl<T> Drop for JoinHandle<T> {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.detach();
        }
    }
}

impl<T> fmt::Debug for JoinHandle<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JoinHandle").field("id", &self.id).finish()
    }
}

/// Runs a future, turning a panic in any poll into an `Err` output; a panic in the future's drop
/// is caught and dropped (the panic hook has reported it): async-task would abort the process,
/// and the loop, or the runtime's drop, goes on with the rest.
pub(crate) struct CatchUnwind<F> {
    future: ManuallyDrop<F>,
}

impl<F> CatchUnwind<F> {
    pub(crate) fn new(future: F) -> Self {
        CatchUnwind {
            future: ManuallyDrop::new(future),
        }
    }
}

impl<F> Drop for CatchUnwind<F> {
    fn drop(&mut self) {
        // SAFETY: `future` is dropped here once and never used again, in place (never moved out,
        // as it is pinned when `self` is).
        let dropped = catch_unwind(AssertUnwindSafe(|| unsafe {
            ManuallyDrop::drop(&mut self.future)
        }));
        drop(dropped);
    }
}

impl<F: Future> Future for CatchUnwind<F> {
    type Output = Result<F::Output, Payload>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // SAFETY: `future` is structurally pinned: it is never moved out of `self` (`Drop` drops it
        // in place), and `CatchUnwind` is `Unpin` only when `F` is.
        let future = unsafe { self.map_unchecked_mut(|s| &mut *s.future) };
        match catch_unwind(AssertUnwindSafe(|| future.poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(v)) => Poll::Ready(Ok(v)),
            Err(payload) => Poll::Ready(Err(payload)),
        }
    }
}
