//! `AsyncFd`: readiness-based async I/O for any file descriptor the loop can poll.
//!
//! The fd is made non-blocking and registered (edge-triggered) with the reactor. Operations are
//! attempted optimistically; `WouldBlock` clears the remembered readiness and the task waits for
//! the next edge. Every readiness check draws on the task's cooperative budget.
//!
//! A registered `AsyncFd` is an active handle: it keeps the loop alive (`run`) until dropped or
//! `unref`'d, like a libuv stream.

use std::future::poll_fn;
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::panic::Location;
use std::rc::Rc;
use std::task::{Context, Poll};

use mio::unix::SourceFd;

use super::coop::poll_proceed;
use super::reactor::{IoState, READ_CLOSED, READABLE, WRITABLE, WRITE_CLOSED};
use crate::rt::context::{try_with_core, with_core};
use crate::rt::hooks::close_callback;

/// A file descriptor registered with the current loop.
pub struct AsyncFd<T: AsFd> {
    inner: Option<T>,
    state: Rc<IoState>,
    loop_id: u64,
}

impl<T: AsFd> AsyncFd<T> {
    /// Makes `inner` non-blocking and registers it with the current loop.
    #[track_caller]
    pub fn new(inner: T) -> io::Result<AsyncFd<T>> {
        rustix::io::ioctl_fionbio(inner.as_fd(), true)?;
        AsyncFd::register(inner)
    }

    /// Registers `inner`, which the caller knows to be non-blocking already (saves the
    /// `FIONBIO` of [`new`](Self::new)). A blocking fd here would block the loop.
    #[track_caller]
    pub(crate) fn new_nonblocking(inner: T) -> io::Result<AsyncFd<T>> {
        AsyncFd::register(inner)
    }

    #[track_caller]
    fn register(inner: T) -> io::Result<AsyncFd<T>> {
        with_core("nodus::io::AsyncFd::new", |core| {
            let fd = inner.as_fd().as_raw_fd();
            let state = core.reactor.register(&mut SourceFd(&fd))?;
            core.ref_handle();
            Ok(AsyncFd {
                inner: Some(inner),
                state,
                loop_id: core.loop_id(),
            })
        })
    }

    pub fn get_ref(&self) -> &T {
        self.inner.as_ref().expect("present until into_inner")
    }

    pub fn get_mut(&mut self) -> &mut T {
        self.inner.as_mut().expect("present until into_inner")
    }

    /// Deregisters and returns the fd (still non-blocking).
    pub fn into_inner(mut self) -> T {
        self.deregister();
        self.inner.take().expect("present until into_inner")
    }

    /// Ready when the fd may be readable (or the task's budget allows another try).
    pub fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_ready(cx, READABLE)
    }

    /// Ready when the fd may be writable.
    pub fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_ready(cx, WRITABLE)
    }

    fn poll_ready(&self, cx: &mut Context<'_>, bit: u8) -> Poll<io::Result<()>> {
        if poll_proceed(cx).is_pending() {
            return Poll::Pending;
        }
        let closed = if bit == READABLE {
            READ_CLOSED
        } else {
            WRITE_CLOSED
        };
        if self.state.ready.get() & (bit | closed) != 0 {
            return Poll::Ready(Ok(()));
        }
        let slot = if bit == READABLE {
            &self.state.read_waker
        } else {
            &self.state.write_waker
        };
        let old = slot.replace(Some(cx.waker().clone()));
        drop(old);
        Poll::Pending
    }

    /// Forgets read readiness (after `WouldBlock`, or a short read of a stream: edge-triggered
    /// epoll reports data that arrives later). An EOF already seen stays visible.
    pub fn clear_read_ready(&self) {
        self.state.ready.set(self.state.ready.get() & !READABLE);
    }

    /// Forgets write readiness (after `WouldBlock`).
    pub fn clear_write_ready(&self) {
        self.state.ready.set(self.state.ready.get() & !WRITABLE);
    }

    /// Runs `op` until it does not return `WouldBlock`, waiting for read readiness in between.
    pub async fn read_with<R>(&self, mut op: impl FnMut(&T) -> io::Result<R>) -> io::Result<R> {
        loop {
            poll_fn(|cx| self.poll_read_ready(cx)).await?;
            match op(self.get_ref()) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.clear_read_ready(),
                other => return other,
            }
        }
    }

    /// Runs `op` until it does not return `WouldBlock`, waiting for write readiness in between.
    pub async fn write_with<R>(&self, mut op: impl FnMut(&T) -> io::Result<R>) -> io::Result<R> {
        loop {
            poll_fn(|cx| self.poll_write_ready(cx)).await?;
            match op(self.get_ref()) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.clear_write_ready(),
                other => return other,
            }
        }
    }

    /// It no longer keeps the loop alive by itself.
    pub fn unref(&self) {
        if self.state.refd.replace(false) {
            self.on_loop(|core| core.unref_handle());
        }
    }

    /// It keeps the loop alive again (the default).
    pub fn ref_(&self) {
        if !self.state.refd.replace(true) {
            self.on_loop(|core| core.ref_handle());
        }
    }

    pub fn has_ref(&self) -> bool {
        self.state.refd.get()
    }

    /// Deregisters and drops the fd now, and runs `callback` in the close phase.
    #[track_caller]
    pub fn close(mut self, callback: impl FnOnce() + 'static) {
        self.deregister();
        drop(self.inner.take());
        close_callback(Box::new(callback), Location::caller());
    }

    fn on_loop(&self, f: impl FnOnce(&crate::rt::core::Core)) {
        try_with_core(|core| {
            if core.loop_id() == self.loop_id {
                f(core)
            }
        });
    }

    fn deregister(&mut self) {
        let Some(inner) = self.inner.as_ref() else {
            return;
        };
        let fd = inner.as_fd().as_raw_fd();
        let state = self.state.clone();
        let wakers = try_with_core(|core| {
            if core.loop_id() != self.loop_id {
                return None;
            }
            if state.refd.replace(false) {
                core.unref_handle();
            }
            Some(core.reactor.deregister(&mut SourceFd(&fd), &state))
        });
        drop(wakers);
    }
}

impl<T: AsFd> Drop for AsyncFd<T> {
    fn drop(&mut self) {
        self.deregister();
    }
}
