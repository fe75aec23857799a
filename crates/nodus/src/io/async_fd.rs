//! `AsyncFd`: readiness-based async I/O for any file descriptor the loop can poll.
//!
//! The fd is made non-blocking and registered (edge-triggered) with the reactor. Operations are
//! attempted optimistically; `WouldBlock` clears the remembered readiness and the task waits for
//! the next edge. Every readiness check draws on the task's cooperative budget.
//!
//! A registered `AsyncFd` is an active handle: it keeps the loop alive (`run`) until dropped or
//! `unref`'d, like a libuv stream.
//!
//! Invariant: the fd leaves the epoll set of the loop that registered it before it is closed,
//! wherever the `AsyncFd` is dropped (on its loop, after `block_on` returned, while another loop
//! runs on the thread), and stops counting as that loop's handle; `ref_`/`unref` count in that
//! loop too, and `close`'s callback runs in that loop's close phase (never in another loop's;
//! dropped unrun once the loop is gone). Its [`Registration`] holds a weak reference to the loop
//! for this; once the loop is gone (its `Runtime` dropped) closing is enough, its epoll instance
//! having gone with it. An `AsyncFd` is `!Send`, so this always happens on the loop's own
//! thread. A closed fd's number may be reused at once: the registration's token is never reused
//! (`reactor.rs`), so no event meant for this fd reaches the next owner of the number or of the
//! slab key.

use std::future::poll_fn;
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::panic::Location;
use std::task::{Context, Poll};

use mio::unix::SourceFd;

use super::coop::poll_proceed;
use super::reactor::{READ_CLOSED, READABLE, Registration, WRITABLE, WRITE_CLOSED};
use crate::rt::context::with_core;

/// A file descriptor registered with the current loop.
///
/// Not `Send`: it is dropped on the thread of the loop it is registered with.
///
/// ```compile_fail
/// fn send<T: Send>() {}
/// send::<nodus::io::AsyncFd<std::net::TcpStream>>();
/// ```
pub struct AsyncFd<T: AsFd> {
    inner: Option<T>,
    reg: Registration,
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
            let reg = Registration::new(core, &mut SourceFd(&fd), true)?;
            Ok(AsyncFd {
                inner: Some(inner),
                reg,
            })
        })
    }

    pub fn get_ref(&self) -> &T {
        self.inner.as_ref().expect("present until into_inner")
    }

    /// The inner value, mutably. Do not replace its fd through this: the registration is taken
    /// out of epoll by the number of the fd held at drop, so a swapped-out fd whose open file
    /// lives on would stay registered. To change the fd, take it out with
    /// [`into_inner`](Self::into_inner) and register the new one.
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
        let state = self.reg.state();
        if state.ready.get() & (bit | closed) != 0 {
            return Poll::Ready(Ok(()));
        }
        let slot = if bit == READABLE {
            &state.read_waker
        } else {
            &state.write_waker
        };
        let old = slot.replace(Some(cx.waker().clone()));
        drop(old);
        Poll::Pending
    }

    /// Forgets read readiness (after `WouldBlock`, or a short read of a stream: edge-triggered
    /// epoll reports data that arrives later). An EOF already seen stays visible.
    pub fn clear_read_ready(&self) {
        let ready = &self.reg.state().ready;
        ready.set(ready.get() & !READABLE);
    }

    /// Forgets write readiness (after `WouldBlock`).
    pub fn clear_write_ready(&self) {
        let ready = &self.reg.state().ready;
        ready.set(ready.get() & !WRITABLE);
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

    /// It no longer keeps its loop alive by itself.
    pub fn unref(&self) {
        self.reg.set_ref(false);
    }

    /// It keeps its loop alive again (the default).
    pub fn ref_(&self) {
        self.reg.set_ref(true);
    }

    pub fn has_ref(&self) -> bool {
        self.reg.state().refd.get()
    }

    /// Deregisters and drops the fd now, and runs `callback` in its loop's close phase (never,
    /// if that loop is gone).
    #[track_caller]
    pub fn close(mut self, callback: impl FnOnce() + 'static) {
        self.deregister();
        drop(self.inner.take());
        self.reg
            .close_callback(Box::new(callback), Location::caller());
    }

    /// Takes the fd out of its loop's epoll set while it is still open (a no-op once the fd
    /// is taken or the loop is gone).
    fn deregister(&mut self) {
        let Some(inner) = self.inner.as_ref() else {
            return;
        };
        let fd = inner.as_fd().as_raw_fd();
        self.reg.deregister(&mut SourceFd(&fd));
    }
}

impl<T: AsFd> Drop for AsyncFd<T> {
    fn drop(&mut self) {
        self.deregister();
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    use super::AsyncFd;
    use crate::rt::context::with_core;

    /// The fds registered with the epoll instance `epfd` (its `tfd:` lines in `fdinfo`).
    fn registered(epfd: i32) -> Vec<i32> {
        std::fs::read_to_string(format!("/proc/self/fdinfo/{epfd}"))
            .unwrap()
            .lines()
            .filter_map(|l| l.strip_prefix("tfd:"))
            .filter_map(|l| l.split_whitespace().next()?.parse().ok())
            .collect()
    }

    /// Closing an fd whose open file lives on (a `dup` here; a child or an IPC peer holding it
    /// alike) does not take it out of epoll: an `AsyncFd` dropped outside its loop must.
    #[test]
    fn dropped_outside_its_loop_it_leaves_the_epoll_set_and_the_slab() {
        let rt = crate::Runtime::new();
        let (a, _peer) = UnixStream::pair().unwrap();
        let keep = a.try_clone().unwrap();
        let raw = a.as_raw_fd();
        let fd = rt.block_on(async { AsyncFd::new(a).unwrap() });
        let (epfd, sources) =
            rt.enter(|| with_core("test", |core| (core.reactor.epoll_fd(), core.reactor.len())));
        assert!(registered(epfd).contains(&raw));
        assert_eq!(sources, 1);
        drop(fd);
        assert!(
            !registered(epfd).contains(&raw),
            "fd {raw} is still in the loop's epoll set"
        );
        assert_eq!(rt.enter(|| with_core("test", |core| core.reactor.len())), 0);
        drop(keep);
    }
}
