//! A one-shot reply slot on the loop: one side fills it, the other awaits it (with a deadline).
//!
//! Invariant: single-threaded (`Rc`), filled at most once; a slot dropped by its waiter is simply
//! never read.

use std::cell::RefCell;
use std::future::poll_fn;
use std::rc::Rc;
use std::task::{Poll, Waker};
use std::time::Duration;

pub(crate) struct ReplySlot<T> {
    inner: Rc<RefCell<(Option<T>, Option<Waker>)>>,
}

impl<T> Clone for ReplySlot<T> {
    fn clone(&self) -> Self {
        ReplySlot {
            inner: self.inner.clone(),
        }
    }
}

impl<T> ReplySlot<T> {
    pub fn new() -> ReplySlot<T> {
        ReplySlot {
            inner: Rc::new(RefCell::new((None, None))),
        }
    }

    /// Fills the slot and wakes its waiter.
    pub fn fill(&self, value: T) {
        let waker = {
            let mut inner = self.inner.borrow_mut();
            inner.0 = Some(value);
            inner.1.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// The value if the slot is filled (and not yet read), without waiting.
    pub fn take(&self) -> Option<T> {
        self.inner.borrow_mut().0.take()
    }

    /// The value, or `None` after `limit`.
    pub async fn wait(&self, limit: Duration) -> Option<T> {
        let wait = poll_fn(|cx| {
            let mut inner = self.inner.borrow_mut();
            match inner.0.take() {
                Some(v) => Poll::Ready(v),
                None => {
                    inner.1 = Some(cx.waker().clone());
                    Poll::Pending
                }
            }
        });
        crate::time::timeout(limit, wait).await.ok()
    }
}
