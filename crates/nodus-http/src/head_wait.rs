//! The HTTP/1 header-read timeout without a timer per request.
//!
//! hyper arms its header-read timer each time a connection starts waiting for a request head and
//! drops it once the head is parsed: on nodus timers that is a boxed sleep, a clock read and a
//! timer-queue insert and cancel per keep-alive request. `HeadTimer`, the HTTP/1 builders' timer,
//! makes it two thread-local writes: arming records a deadline in the `HeadWait` of the
//! connection being polled and returns a zero-sized sleep (boxing it does not allocate), which
//! completes once that connection has found the deadline passed with its one timer
//! (`server.rs`, re-armed lazily).
//!
//! Invariants:
//! - Connections poll hyper inside `scope`, which installs their `HeadWait` in a thread-local
//!   slot for the poll and takes it back after (a nested scope restores the outer one). Outside
//!   every scope the slot is empty, and `HeadTimer` falls back to a nodus sleep.
//! - `HeadTimer`'s clock stands still at `base`: hyper's deadline is `now() + timeout`, so
//!   `deadline - base` is the timeout, counted from the connection's time when hyper arms it.
//!   The configured timeout's deadline is always the same `Instant`: for it the nanoseconds are
//!   worked out once. A timeout past what a u64 of nanoseconds holds is no deadline (`u64::MAX`),
//!   not one wrapped around to a near one.
//! - hyper's HTTP/1 server uses its timer for the header-read timeout only, so a connection has
//!   at most one wait, armed when a head is awaited and disarmed (dropped) when it is parsed.
//! - A wait also follows the head as the connection reads it (`line_read`, a `head_scan::Scan`):
//!   its request line is the bytes read since the wait was armed, until the first line feed,
//!   and the framing facts the server refuses a head for (`parsed`) are noted up to its empty
//!   line. When hyper has parsed the head and drops its sleep, a scan that noted any of them is
//!   kept (`Parsed`) for the server's call of its service, in the same poll, which takes it (a
//!   well-formed head's leaves nothing to take). hyper refuses any head over
//!   its size limit with 431; a request line that alone is over it gets 414 instead (nginx's
//!   answer to a URI too long), which the connection can give only by ending the read before
//!   hyper sees the head grow past its limit. Bytes hyper read ahead with the previous request
//!   are not seen here, so for a pipelined head the answer may be the other of the two; the limit
//!   itself is hyper's, exact either way. With h2c, the connection's first bytes are read before
//!   hyper's HTTP/1 side waits for the head (hyper-util's sniff for the HTTP/2 preface, which
//!   hands them on): their scan is `carry`d into the first wait, whose deadline it brings back
//!   to the header-read timeout from the connection's start (the head began before the wait).

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper::rt::Timer;

use crate::head_scan::Scan;
use crate::timer::NodusTimer;

/// Where a connection is in waiting for a request head.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum HeadWait {
    /// hyper is not waiting for a head (or has no timeout for it).
    #[default]
    Idle,
    /// hyper is waiting for a head that must be complete by this time (`nodus::clock` ns); what
    /// has been read of it.
    Until(u64, Scan),
    /// The deadline passed: hyper's sleep completes when it next polls it.
    Expired,
    /// hyper parsed the head this scan followed, which noted what Node refuses a head for
    /// (`Scan::noted`), and has not handed it to the service yet.
    Parsed(Scan),
}

thread_local! {
    /// The wait of the connection being polled; `None` outside every `scope`.
    static CURRENT: Cell<Option<HeadWait>> = const { Cell::new(None) };
}

/// Runs `poll` (a poll of hyper's connection) with `wait` as the current connection's wait.
pub(crate) fn scope<R>(wait: &mut HeadWait, poll: impl FnOnce() -> R) -> R {
    let outer = CURRENT.replace(Some(*wait));
    let result = poll();
    *wait = CURRENT.replace(outer).unwrap_or_default();
    result
}

/// Takes `ahead`, the scan of the connection's first bytes (read before any wait), for the
/// current connection's wait if it has read nothing yet, and ends the wait by `by` at the latest
/// (the head began before the wait did); whether it did.
pub(crate) fn carry(ahead: Scan, by: u64) -> bool {
    CURRENT.with(|current| {
        let Some(HeadWait::Until(deadline, scan)) = current.get() else {
            return false;
        };
        if !scan.is_empty() {
            return false;
        }
        current.set(Some(HeadWait::Until(deadline.min(by), ahead)));
        true
    })
}

/// What [`line_read`] found in a read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct LineRead {
    /// The request line, line feed excluded, is now `limit` bytes or more.
    pub(crate) too_long: bool,
    /// The head ended in the read, before a chunked body that begins at this index in it.
    pub(crate) chunked_body_at: Option<usize>,
}

/// Follows the head the current connection is waiting for through `bytes`, just read. Outside
/// a head wait (a body being read, or no connection's scope) it does nothing.
pub(crate) fn line_read(bytes: &[u8], limit: usize) -> LineRead {
    CURRENT.with(|current| {
        let Some(HeadWait::Until(deadline, mut scan)) = current.get() else {
            return LineRead::default();
        };
        let before = scan;
        scan.read(bytes);
        current.set(Some(HeadWait::Until(deadline, scan)));
        LineRead {
            too_long: !before.request_line().1 && scan.request_line().0 >= limit,
            chunked_body_at: (scan.ends_before_a_chunked_body()
                && !before.ends_before_a_chunked_body())
            .then(|| before.chunked_body_at(bytes)),
        }
    })
}

/// The scan of the head hyper just parsed for the current connection, taken if it noted what
/// Node refuses a head for: `None` if not, if hyper waited for none (no header-read timeout), or
/// outside every scope.
pub(crate) fn parsed() -> Option<Scan> {
    CURRENT.with(|current| match current.get() {
        Some(HeadWait::Parsed(scan)) => {
            current.set(Some(HeadWait::Idle));
            Some(scan)
        }
        _ => None,
    })
}

/// hyper's timer for the HTTP/1 header-read timeout (see the module docs).
#[derive(Debug, Clone, Copy)]
pub(crate) struct HeadTimer {
    base: Instant,
    /// The header-read timeout hyper is configured with, and the deadline it asks for with it
    /// every time (`base` plus the timeout; `None` past what an `Instant` holds)...
    timeout: Duration,
    deadline: Option<Instant>,
    /// ...and the timeout in nanoseconds, worked out once.
    timeout_ns: u64,
}

impl HeadTimer {
    pub(crate) fn new(timeout: Duration) -> HeadTimer {
        let base = Instant::now();
        HeadTimer {
            base,
            timeout,
            deadline: base.checked_add(timeout),
            timeout_ns: saturating_ns(timeout),
        }
    }

    /// Arms the current connection's wait for `timeout_ns` (`duration`) from now; outside every
    /// scope, a nodus sleep.
    #[inline]
    fn wait(&self, timeout_ns: u64, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        let armed = CURRENT.with(|current| {
            current.get().map(|_| {
                let deadline = crate::io::now_ns().saturating_add(timeout_ns);
                current.set(Some(HeadWait::Until(deadline, Scan::default())));
            })
        });
        match armed {
            Some(()) => Box::pin(HeadSleep),
            None => NodusTimer.sleep(duration),
        }
    }
}

/// `d` in nanoseconds; one past what a u64 holds is no deadline (not one wrapped).
fn saturating_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Timer for HeadTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        self.wait(saturating_ns(duration), duration)
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        // The configured timeout: its nanoseconds are at hand.
        if Some(deadline) == self.deadline {
            return self.wait(self.timeout_ns, self.timeout);
        }
        let duration = deadline.saturating_duration_since(self.base);
        self.wait(saturating_ns(duration), duration)
    }

    fn now(&self) -> Instant {
        self.base
    }
}

/// The current connection's header-read timeout, as hyper sees it.
struct HeadSleep;

impl Future for HeadSleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<()> {
        // The connection's own timer wakes the task when the deadline passes.
        match CURRENT.get() {
            Some(HeadWait::Expired) => Poll::Ready(()),
            _ => Poll::Pending,
        }
    }
}

impl hyper::rt::Sleep for HeadSleep {}

impl Drop for HeadSleep {
    fn drop(&mut self) {
        // Each arm sets the wait whole: a well-formed head's costs a store.
        CURRENT.with(|current| match current.get() {
            None => {}
            Some(HeadWait::Until(_, scan)) if scan.noted() => {
                current.set(Some(HeadWait::Parsed(scan)));
            }
            Some(_) => current.set(Some(HeadWait::Idle)),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arming_inside_a_scope_records_the_deadline_and_dropping_keeps_a_refused_scan_for_the_service()
     {
        let timer = HeadTimer::new(Duration::from_secs(10));
        let mut wait = HeadWait::Idle;
        let before = crate::io::now_ns();
        let sleep = scope(&mut wait, || {
            timer.sleep_until(timer.now() + Duration::from_secs(10))
        });
        let HeadWait::Until(deadline, scan) = wait else {
            panic!("not armed: {wait:?}")
        };
        assert!(scan.is_empty());
        assert!(deadline >= before + 10_000_000_000);
        assert!(deadline < crate::io::now_ns() + 11_000_000_000);
        scope(&mut wait, || drop(sleep));
        assert_eq!(wait, HeadWait::Idle);
        assert_eq!(scope(&mut wait, parsed), None);
        // A scan that noted a refusal is kept for the service, once.
        let sleep = scope(&mut wait, || timer.sleep(Duration::from_secs(10)));
        scope(&mut wait, || {
            line_read(b"GET / HTTP/1.1\nHost: a\r\n\r\n", usize::MAX)
        });
        scope(&mut wait, || drop(sleep));
        let HeadWait::Parsed(scan) = wait else {
            panic!("not kept: {wait:?}")
        };
        assert!(scan.noted() && scan.refuses(|| 14));
        assert_eq!(scope(&mut wait, parsed), Some(scan));
        assert_eq!(wait, HeadWait::Idle);
        assert_eq!(scope(&mut wait, parsed), None);
    }

    #[test]
    fn a_timeout_past_a_u64_of_nanoseconds_is_no_deadline() {
        // 2^62 s: `Instant` holds it (hyper adds it to `now()`), its nanoseconds no u64 does.
        let far = Duration::from_secs(1 << 62);
        // The configured timeout, and another.
        for timer in [HeadTimer::new(far), HeadTimer::new(Duration::from_secs(10))] {
            let mut wait = HeadWait::Idle;
            let _sleep = scope(&mut wait, || timer.sleep_until(timer.now() + far));
            assert_eq!(wait, HeadWait::Until(u64::MAX, Scan::default()));
        }
    }

    #[test]
    fn the_sleep_completes_only_once_its_connection_expired_it() {
        let timer = HeadTimer::new(Duration::from_secs(10));
        let mut wait = HeadWait::Idle;
        let mut sleep = scope(&mut wait, || timer.sleep(Duration::from_secs(1)));
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        assert!(scope(&mut wait, || sleep.as_mut().poll(&mut cx)).is_pending());
        // Another connection's expiry does not complete it.
        let mut other = HeadWait::Expired;
        assert!(
            scope(&mut other, || {
                scope(&mut wait, || sleep.as_mut().poll(&mut cx))
            })
            .is_pending()
        );
        assert_eq!(other, HeadWait::Expired);
        wait = HeadWait::Expired;
        assert!(scope(&mut wait, || sleep.as_mut().poll(&mut cx)).is_ready());
    }

    #[test]
    fn the_request_line_is_followed_from_the_arming_to_its_line_feed() {
        let timer = HeadTimer::new(Duration::from_secs(10));
        let mut wait = HeadWait::Idle;
        let too_long = |wait: &mut HeadWait, bytes: &[u8], limit| {
            scope(wait, || line_read(bytes, limit)).too_long
        };
        // Not waiting for a head: nothing is followed.
        assert!(!too_long(&mut wait, &[b'a'; 64], 10));
        let _sleep = scope(&mut wait, || timer.sleep(Duration::from_secs(1)));
        assert!(!too_long(&mut wait, b"GET /aaa", 10));
        assert!(matches!(wait, HeadWait::Until(_, s) if s.request_line() == (8, false)));
        assert!(too_long(&mut wait, b"aa", 10));
        // A line feed ends it: what follows is headers, whatever their length.
        let _sleep = scope(&mut wait, || timer.sleep(Duration::from_secs(1)));
        assert!(!too_long(&mut wait, b"GET / HTTP/1.1\r\nX: ", 20));
        assert!(matches!(wait, HeadWait::Until(_, s) if s.request_line().1));
        assert!(!too_long(&mut wait, &[b'v'; 64], 20));
        // A line feed past the limit: the line was over it.
        let _sleep = scope(&mut wait, || timer.sleep(Duration::from_secs(1)));
        assert!(too_long(&mut wait, b"GET /aaaaaaaaaa\n", 10));
    }

    #[test]
    fn the_read_that_ends_a_head_with_transfer_encoding_says_where_its_body_begins() {
        let timer = HeadTimer::new(Duration::from_secs(10));
        let head = &b"\r\nPOST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"[..];
        let body = &b"5\r\nhello\r\n0\r\n\r\n"[..];
        let whole = [head, body].concat();
        // In one read, or in two split anywhere: only the read that ends the head says it.
        for at in 0..=whole.len() {
            let mut wait = HeadWait::Idle;
            let _sleep = scope(&mut wait, || timer.sleep(Duration::from_secs(1)));
            let first = scope(&mut wait, || line_read(&whole[..at], usize::MAX));
            let second = scope(&mut wait, || line_read(&whole[at..], usize::MAX));
            let found = match (first.chunked_body_at, second.chunked_body_at) {
                (Some(i), None) => i,
                (None, Some(i)) => at + i,
                other => panic!("split at {at}: {other:?}"),
            };
            assert_eq!(found, head.len(), "split at {at}");
        }
        // Without Transfer-Encoding, or refused (a bare line feed), no body is followed.
        for head in [
            &b"POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello"[..],
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\n\r\n0\r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n",
        ] {
            let mut wait = HeadWait::Idle;
            let _sleep = scope(&mut wait, || timer.sleep(Duration::from_secs(1)));
            let read = scope(&mut wait, || line_read(head, usize::MAX));
            assert_eq!(
                read.chunked_body_at,
                None,
                "{}",
                String::from_utf8_lossy(head)
            );
        }
    }

    #[test]
    fn outside_a_scope_it_is_a_nodus_sleep() {
        let timer = HeadTimer::new(Duration::from_secs(10));
        nodus::Runtime::new().block_on(async {
            let start = Instant::now();
            timer.sleep(Duration::from_millis(20)).await;
            assert!(start.elapsed() >= Duration::from_millis(20));
        });
    }
}
