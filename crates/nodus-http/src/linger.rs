//! The lingering close of an HTTP/1 connection (RFC 9112 section 9.6; nginx's
//! `lingering_close`).
//!
//! A connection the server closes while its client may still be sending (the rest of a request
//! body nobody read, the body or head of a request refused before the handler, a next request
//! the drain's `Connection: close` came too late for, or one pipelined behind a request or
//! response that said `Connection: close`) must not simply close: the kernel answers
//! a close with input unread by a reset, which discards what the send buffer still holds of the
//! response and fails the client's writes, so the client sees "connection reset" instead of the
//! answer it was sent (a 413 to an upload, say). Instead, after the last response byte is
//! written, the connection's task shuts down the socket's write side (hyper has done so already
//! after its own last write; the client reads an EOF after the response) and reads and drops
//! what comes, until the client closes; then it closes.
//!
//! Invariants:
//! - The linger runs in the connection's task once hyper is done with the connection: hyper's
//!   connection and the stream it owns are dropped first, and the linger reads a duplicate of
//!   the socket's fd (close-on-exec) registered anew, which keeps the socket open through the
//!   stream's close. It holds no request state: the socket, one timer, and the connection's
//!   place on the server's books (it counts toward `max_connections`, and a drain waits for it).
//! - Bounded in time: it ends at the client's EOF or a read error (a reset), after
//!   `Config::lingering_timeout` without input, after `Config::lingering_time` in all, and by the
//!   drain's deadline (a drain that begins while it lingers pulls its end in to that deadline).
//!   A zero `lingering_time` turns it off (the server neither duplicates the fd nor calls it).
//!   What is still unread at its end gets the reset after all.
//! - Bounded in memory: the input is read into one buffer per thread and dropped. There is no
//!   cap on its bytes: within those times a client can make the server read no more than it can
//!   through any request body (a handler's read, the discard), and reading to drop is the least
//!   work per byte the server does; a cap would reset a client that sends its whole upload
//!   before it reads the 413, which the times let through on a fast link, as nginx does.
//! - Its reads count in the loop's HTTP bytes received, as every read of a connection does.

use std::cell::RefCell;
use std::future::{Future, poll_fn};
use std::os::fd::OwnedFd;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use rustix::io::Errno;
use rustix::net::{RecvFlags, Shutdown};

use crate::io::now_ns;
use crate::stats;

/// The size of the buffer the input is dropped from.
const SCRATCH_LEN: usize = 64 * 1024;

thread_local! {
    /// Where the lingering connections of the thread's loop read the input they drop; allocated
    /// at the first linger.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// How late the linger's timer may fire (1 ms, its granularity).
const SLACK: u64 = 1_000_000;

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Lingers on `fd`, a duplicate of a connection's socket whose last response byte is written:
/// shuts down its write side, then reads and drops its input until the client's EOF, `timeout`
/// without input, `time` in all, or the drain's deadline, which `drain` gives once a drain has
/// begun (and until then keeps the task's waker to be told of one). Not a socket, or no longer
/// connected: it returns at once (and `fd` closes).
pub(crate) async fn linger(
    fd: OwnedFd,
    time: Duration,
    timeout: Duration,
    mut drain: impl FnMut(&mut Context<'_>) -> Option<u64>,
) {
    if rustix::net::shutdown(&fd, Shutdown::Write).is_err() {
        return;
    }
    let Ok(fd) = nodus::io::AsyncFd::new(fd) else {
        return;
    };
    let start = now_ns();
    let end = start.saturating_add(ns(time));
    let timeout = ns(timeout);
    let mut last_input = start;
    let mut timer = Timer::new(end.min(start.saturating_add(timeout)), start);
    poll_fn(|cx| {
        loop {
            match fd.poll_read_ready(cx) {
                Poll::Ready(Ok(())) => match drop_input(&fd) {
                    Ok(0) => return Poll::Ready(()), // the client closed
                    Ok(n) => {
                        // A short read drained the socket's buffer (an EOF seen stays visible).
                        if n < SCRATCH_LEN {
                            fd.clear_read_ready();
                        }
                        stats::received(n);
                        last_input = now_ns();
                        continue;
                    }
                    Err(Errno::AGAIN) => {
                        fd.clear_read_ready();
                        continue;
                    }
                    Err(Errno::INTR) => continue,
                    Err(_) => return Poll::Ready(()),
                },
                Poll::Ready(Err(_)) => return Poll::Ready(()),
                // No input now (or the task's budget is spent: it is woken to go on).
                Poll::Pending => {}
            }
            let due = end
                .min(last_input.saturating_add(timeout))
                .min(drain(cx).unwrap_or(u64::MAX));
            let now = now_ns();
            if now >= due {
                return Poll::Ready(());
            }
            if timer.poll(cx, due, now).is_pending() {
                return Poll::Pending;
            }
        }
    })
    .await;
}

/// Reads what `fd` holds into the thread's scratch buffer, dropping it.
fn drop_input(fd: &nodus::io::AsyncFd<OwnedFd>) -> rustix::io::Result<usize> {
    SCRATCH.with_borrow_mut(|buf| {
        if buf.is_empty() {
            buf.resize(SCRATCH_LEN, 0);
        }
        rustix::net::recv(fd.get_ref(), &mut buf[..], RecvFlags::empty()).map(|(n, _)| n)
    })
}

/// The linger's one timer, re-armed lazily: input only moves its due time later, so it is
/// re-armed when it fires early (for the time that is then due), and moved earlier only when
/// its due time comes more than `SLACK` before it (a drain began).
struct Timer {
    sleep: nodus::Sleep,
    /// When `sleep` is due (`nodus::clock` ns), at or after the time it was armed for.
    at: u64,
}

impl Timer {
    fn new(due: u64, now: u64) -> Timer {
        let mut timer = Timer {
            sleep: nodus::sleep(1),
            at: 0,
        };
        timer.arm(due, now);
        timer
    }

    /// Ready when it fired before `due` (re-armed for `due`: poll again); pending while it waits.
    fn poll(&mut self, cx: &mut Context<'_>, due: u64, now: u64) -> Poll<()> {
        if due.saturating_add(SLACK) < self.at {
            self.arm(due, now);
        }
        if Pin::new(&mut self.sleep).poll(cx).is_pending() {
            return Poll::Pending;
        }
        self.arm(due, now);
        Poll::Ready(())
    }

    /// Re-arms the sleep for `at`, rounded up to whole milliseconds; a time beyond nodus's
    /// longest delay is checked again then.
    fn arm(&mut self, at: u64, now: u64) {
        let longest = nodus::time::MAX_DELAY.as_millis() as u64;
        let delay_ms = at.saturating_sub(now).div_ceil(SLACK).clamp(1, longest);
        self.sleep.reset(Duration::from_millis(delay_ms));
        self.at = now.saturating_add(delay_ms * SLACK);
    }
}
