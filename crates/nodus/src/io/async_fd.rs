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
//! slot.
//!
//! Invariant: the inner value's fd is the one registered, from `new` until `into_inner`/`close`/
//! drop. [`AsyncFd::get_mut`] lends the value through an [`AsyncFdMut`], which checks the fd's
//! number when the borrow ends and panics if it changed (the registration would be left on the
//! old fd and the new one never polled). A number compare costs nothing, but it cannot see a
//! value that closes its fd and opens another under the same number within one borrow: that is
//! the caller's to avoid (the docs of `get_mut` say so).

use std::future::poll_fn;
use std::io;
use std::ops::{Deref, DerefMut};
use std::os::fd::{AsFd, AsRawFd, RawFd};
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

    /// The inner value, mutably, for as long as the returned borrow lives.
    ///
    /// Its fd must stay the registered one: to change the fd, take the value out with
    /// [`into_inner`](Self::into_inner) and register the new one. Replacing the value (or its
    /// fd) through this borrow would leave the registration on the old fd (still in epoll while
    /// its open file lives on elsewhere) and never poll the new one.
    ///
    /// # Panics
    /// When the borrow ends, if the value's fd number changed. (A value that closes its fd and
    /// opens another under the same number meanwhile goes unnoticed: do not do that either.)
    #[track_caller]
    pub fn get_mut(&mut self) -> AsyncFdMut<'_, T> {
        let inner = self.inner.as_mut().expect("present until into_inner");
        AsyncFdMut {
            fd: inner.as_fd().as_raw_fd(),
            inner,
            location: Location::caller(),
        }
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
        if bit == WRITABLE
            && let Some(e) = state.write_watch_error()
        {
            return Poll::Ready(Err(e));
        }
        let waiters = if bit == READABLE {
            &state.readers
        } else {
            &state.writers
        };
        waiters.register(cx.waker());
        Poll::Pending
    }

    /// How many wakers wait for readability and for writability.
    #[cfg(test)]
    pub(crate) fn waiters(&self) -> (usize, usize) {
        let state = self.reg.state();
        (state.readers.len(), state.writers.len())
    }

    /// Forgets read readiness (after `WouldBlock`, or a short read of a stream: edge-triggered
    /// epoll reports data that arrives later). An EOF already seen stays visible.
    pub fn clear_read_ready(&self) {
        let ready = &self.reg.state().ready;
        ready.set(ready.get() & !READABLE);
    }

    /// Forgets read readiness, as after `WouldBlock`, and has the loop make the fd read-ready
    /// again `delay` ns from now, unless an edge does first: the next attempt waits for
    /// whichever comes first (a retry later, for an error another attempt at once would repeat:
    /// an accept out of file descriptors).
    #[track_caller]
    pub(crate) fn retry_read_after(&self, delay: u64) {
        self.clear_read_ready();
        self.reg.ready_after(READABLE, delay);
    }

    /// Forgets write readiness (after `WouldBlock`); from then on the fd is watched for
    /// writability (it is not before: see `Registration::watch_writes`).
    pub fn clear_write_ready(&self) {
        let ready = &self.reg.state().ready;
        ready.set(ready.get() & !WRITABLE);
        let fd = self.get_ref().as_fd().as_raw_fd();
        self.reg.watch_writes(&mut SourceFd(&fd));
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

/// The inner value of an [`AsyncFd`], lent by [`AsyncFd::get_mut`]: it dereferences to the
/// value, and panics when dropped if the value's fd was replaced meanwhile.
pub struct AsyncFdMut<'a, T: AsFd> {
    inner: &'a mut T,
    /// The registered fd.
    fd: RawFd,
    /// Where `get_mut` was called (for the panic message: a drop has no caller to track).
    location: &'static Location<'static>,
}

impl<T: AsFd> Deref for AsyncFdMut<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        self.inner
    }
}

impl<T: AsFd> DerefMut for AsyncFdMut<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        self.inner
    }
}

impl<T: AsFd + std::fmt::Debug> std::fmt::Debug for AsyncFdMut<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl<T: AsFd> Drop for AsyncFdMut<'_, T> {
    fn drop(&mut self) {
        let now = self.inner.as_fd().as_raw_fd();
        // While unwinding, a second panic would abort: the first one is reported instead.
        if now != self.fd && !std::thread::panicking() {
            panic!(
                "nodus: the fd of an AsyncFd was replaced through the borrow AsyncFd::get_mut \
                 lent at {}: fd {} became fd {now}. The loop's registration is still fd {}'s, and \
                 fd {now} is never polled. To change the fd, take the value out with \
                 AsyncFd::into_inner and register the new one with AsyncFd::new",
                self.location, self.fd, self.fd
            );
        }
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
