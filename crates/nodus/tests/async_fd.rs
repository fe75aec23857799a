//! `AsyncFd`'s registration outlives neither the fd nor its owner: one dropped outside its loop
//! (after `block_on` returned) leaves the loop's handles and epoll set, and an event that was
//! already in a batch for a deregistered source never reaches a source registered after it under
//! the same slab key. Its fd cannot be swapped unnoticed through `get_mut`.
//!
//! Bounded: every wait is a nodus timeout; only socket pairs, no process.

use std::cell::{Cell, RefCell};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::rc::Rc;
use std::time::Duration;

use nodus::io::AsyncFd;

/// A slot a task fills for the test (a registered socket, its peer kept open).
type Slot<T> = Rc<RefCell<Option<T>>>;

fn pair() -> (UnixStream, UnixStream) {
    let (a, b) = UnixStream::pair().unwrap();
    a.set_nonblocking(true).unwrap();
    (a, b)
}

#[test]
fn an_async_fd_dropped_outside_its_loop_no_longer_keeps_it_alive() {
    let rt = nodus::Runtime::new();
    let (a, _peer) = pair();
    let fd = rt.block_on(async { AsyncFd::new(a).unwrap() });
    assert!(rt.run_nowait(), "a registered fd keeps the loop alive");
    drop(fd); // no loop is running
    assert!(
        !rt.run_nowait(),
        "the dropped fd still counts as a handle of its loop"
    );

    // ref_/unref outside the loop count in the loop that registered it.
    let (b, _peer) = pair();
    let fd = rt.block_on(async { AsyncFd::new(b).unwrap() });
    fd.unref();
    assert!(!rt.run_nowait(), "unref outside the loop was not counted");
    fd.ref_();
    assert!(rt.run_nowait(), "ref_ outside the loop was not counted");
    drop(fd);
    assert!(!rt.run_nowait());

    // Dropped after its loop is gone: only closed.
    let (c, _peer) = pair();
    let fd = rt.block_on(async { AsyncFd::new(c).unwrap() });
    drop(rt);
    drop(fd);
}

/// X and Y are readable in the same `epoll_wait` batch, X's first; X's reader drops Y and
/// registers Z, which takes Y's slab key. Y's event (its peer hung up: a sticky "read closed")
/// must not be dispatched to Z: Z's peer is open and sends nothing, so a read on Z must wait,
/// not spin on an EOF that never comes.
#[test]
fn an_event_for_a_dropped_source_never_reaches_the_next_one() {
    let rt = nodus::Runtime::new();
    rt.block_on(async {
        let (x, mut x_peer) = pair();
        let (y, y_peer) = pair();
        let x = AsyncFd::new(x).unwrap();
        let y: Slot<AsyncFd<UnixStream>> = Rc::new(RefCell::new(Some(AsyncFd::new(y).unwrap())));
        let z: Slot<(AsyncFd<UnixStream>, UnixStream)> = Rc::default();
        let (y2, z2) = (y.clone(), z.clone());
        let reader = nodus::spawn(async move {
            let mut buf = [0u8; 16];
            x.read_with(|mut s| s.read(&mut buf)).await.unwrap();
            drop(y2.borrow_mut().take());
            let (z, z_peer) = pair();
            *z2.borrow_mut() = Some((AsyncFd::new(z).unwrap(), z_peer));
        });
        // The reader waits on X; the registrations' first edges are consumed.
        nodus::sleep(Duration::from_millis(20)).await;
        x_peer.write_all(b"x").unwrap();
        drop(y_peer);
        nodus::timeout(Duration::from_secs(5), reader)
            .await
            .expect("the reader got X's byte")
            .unwrap();
        let (z, _z_peer) = z.borrow_mut().take().expect("Z registered");
        let attempts = Cell::new(0u32);
        let mut buf = [0u8; 16];
        let read = nodus::timeout(
            Duration::from_millis(100),
            z.read_with(|mut s| {
                attempts.set(attempts.get() + 1);
                if attempts.get() > 1000 {
                    // Spinning (the loop would never get to the timeout): end the read.
                    return Err(std::io::Error::other("spinning"));
                }
                s.read(&mut buf)
            }),
        )
        .await;
        assert!(read.is_err(), "Z read something: {read:?}");
        assert_eq!(
            attempts.get(),
            1,
            "Z was woken by the dropped source's event and retried its read"
        );
    });
}

/// `close` called off the fd's loop queues its callback in that loop's close phase: not in the
/// loop that happens to be current, and without a panic when none is.
#[test]
fn close_calls_back_in_the_fds_own_loop() {
    let (rt1, rt2) = (nodus::Runtime::new(), nodus::Runtime::new());
    let ran = Rc::new(Cell::new(None));
    let here = || nodus::rt::handle().loop_id();

    let (a, _peer) = pair();
    let fd = rt1.block_on(async { AsyncFd::new(a).unwrap() });
    let r = ran.clone();
    rt2.enter(|| fd.close(move || r.set(Some(here()))));
    rt2.run_nowait();
    assert_eq!(ran.get(), None, "the close callback ran in another loop");
    assert!(!rt1.run_nowait());
    assert_eq!(ran.get(), Some(rt1.id()));

    // With no loop current.
    let (b, _peer) = pair();
    let fd = rt1.block_on(async { AsyncFd::new(b).unwrap() });
    let r = ran.clone();
    fd.close(move || r.set(Some(0)));
    assert!(!rt1.run_nowait());
    assert_eq!(ran.get(), Some(0));

    // Once its loop is gone, the callback is dropped unrun.
    let (c, _peer) = pair();
    let fd = rt1.block_on(async { AsyncFd::new(c).unwrap() });
    drop(rt1);
    rt2.enter(|| fd.close(|| panic!("a close callback ran with its loop gone")));
    rt2.run_nowait();
}

/// epoll is edge-triggered: an event the loop took from `epoll_wait` is never reported again. The
/// `block_on` future completing in a callback of a batch must not drop the rest of the batch: a
/// task waiting on a later event of it is still woken (when the loop next runs).
#[test]
fn events_after_the_one_that_completes_block_on_are_not_lost() {
    let rt = nodus::Runtime::new();
    let (a, mut peer_a) = pair();
    let (b, mut peer_b) = pair();
    let (fa, reader) = rt.enter(|| {
        let fa = AsyncFd::new(a).unwrap();
        let fb = AsyncFd::new(b).unwrap();
        let reader = nodus::spawn(async move {
            let mut buf = [0u8; 8];
            fb.read_with(|s| (&*s).read(&mut buf)).await.unwrap()
        });
        // Both peers written by one callback: their events come back in one batch, `a`'s first.
        nodus::set_timeout(5, move || {
            peer_a.write_all(b"a").unwrap();
            peer_b.write_all(b"b").unwrap();
            // Kept open: an EOF would be another event.
            std::mem::forget((peer_a, peer_b));
        });
        (fa, reader)
    });
    rt.block_on(async {
        let mut buf = [0u8; 8];
        fa.read_with(|s| (&*s).read(&mut buf)).await.unwrap();
    });
    let read = rt.block_on(nodus::timeout(Duration::from_secs(2), reader));
    assert_eq!(
        read.expect("the reader was never woken: its event was dropped with the rest of the batch")
            .unwrap(),
        1
    );
}

/// Replacing the fd through `get_mut` would leave the registration on the old fd (and the new
/// one never polled): it panics when the borrow ends. Using the value in place does not.
#[test]
fn an_fd_swapped_through_get_mut_panics_when_the_borrow_ends() {
    let rt = nodus::Runtime::new();
    let (a, _peer_a) = pair();
    let (b, _peer_b) = pair();
    let mut fd = rt.block_on(async { AsyncFd::new(a).unwrap() });
    fd.get_mut().set_nonblocking(true).unwrap();
    let swapped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        *fd.get_mut() = b;
    }));
    let panic = swapped.expect_err("swapping the fd through get_mut went unnoticed");
    let message = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .unwrap_or_default();
    assert!(
        message.contains("get_mut") && message.contains("into_inner"),
        "unclear message: {message:?}"
    );
    drop(fd);
    assert!(!rt.run_nowait(), "the AsyncFd still counts as a handle");
}
