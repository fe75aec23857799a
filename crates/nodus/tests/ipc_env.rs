//! The variables a parent sets for this process alone (`NODE_CHANNEL_FD`, `NODE_UNIQUE_ID`).
//!
//! `Channel::from_env` takes ownership of the fd `NODE_CHANNEL_FD` names only when a parent
//! passed it: an fd inherited across `exec` (so not close-on-exec) that is a connected Unix
//! stream socket. A stale or wrong variable that names an fd this process opened itself (every
//! fd nodus and std open is close-on-exec: the loop's epoll, a file, a socket) is refused without
//! taking, or closing, that fd. The variables are taken out of the environment by the first
//! runtime, and handed out once. `Channel::from_env` and `Worker::get` called outside a loop
//! panic before taking anything: a later call in a loop finds the channel and the worker.
//!
//! nodus takes the variables once per process: each test runs alone, in a fresh process of this
//! binary (`nodus_testkit::alone`), which sets them before its first runtime.

mod common;

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use common::bounded;
use nodus::ipc::{Channel, IpcError};
use nodus_testkit::alone::scenario as alone;

fn still_open(fd: RawFd) -> bool {
    // SAFETY: borrowed only for the check, which fails if no fd `fd` is open.
    rustix::io::fcntl_getfd(unsafe { BorrowedFd::borrow_raw(fd) }).is_ok()
}

/// Names `fd` in `NODE_CHANNEL_FD`, before this fresh process's first runtime.
fn name_channel(fd: RawFd) {
    // SAFETY: this process runs one test, on one thread, and no other thread reads the
    // environment meanwhile.
    unsafe { std::env::set_var("NODE_CHANNEL_FD", fd.to_string()) };
}

/// One end of a connected Unix stream socket pair made inheritable (not close-on-exec), as a
/// parent passes it; and the other end.
fn inherited_pair() -> (RawFd, UnixStream) {
    let (ours, peer) = UnixStream::pair().unwrap();
    let ours: OwnedFd = ours.into();
    rustix::io::fcntl_setfd(&ours, rustix::io::FdFlags::empty()).unwrap();
    // Ownership moves to the channel the test makes of it.
    let raw = ours.as_raw_fd();
    std::mem::forget(ours);
    (raw, peer)
}

#[test]
fn a_file_this_process_opened_is_neither_adopted_nor_closed() {
    if !alone("a_file_this_process_opened_is_neither_adopted_nor_closed") {
        return;
    }
    // A file: not a socket. Before the fix, the refusal closed it (its `OwnedFd` was made and
    // dropped), and the file's owner later closed a number that may have been reused.
    let file = std::fs::File::open("/dev/null").unwrap();
    name_channel(file.as_raw_fd());
    bounded(async {
        let err = Channel::from_env().expect_err("a file is no channel");
        assert!(matches!(err, IpcError::BadChannelFd(_)), "{err}");
    });
    assert!(
        still_open(file.as_fd().as_raw_fd()),
        "the refusal closed an fd it did not own"
    );
}

#[test]
fn a_socket_this_process_opened_is_neither_adopted_nor_closed() {
    if !alone("a_socket_this_process_opened_is_neither_adopted_nor_closed") {
        return;
    }
    // A Unix stream socket this process opened (close-on-exec): before the fix it was adopted,
    // so two owners would close the same number.
    let (mine, _peer) = UnixStream::pair().unwrap();
    name_channel(mine.as_raw_fd());
    bounded(async {
        let err =
            Channel::from_env().expect_err("an fd this process opened is no inherited channel");
        assert!(matches!(err, IpcError::BadChannelFd(_)), "{err}");
    });
    assert!(still_open(mine.as_raw_fd()));
}

#[test]
fn an_inherited_socket_is_the_channel_once_and_its_variable_is_taken_by_the_first_runtime() {
    if !alone(
        "an_inherited_socket_is_the_channel_once_and_its_variable_is_taken_by_the_first_runtime",
    ) {
        return;
    }
    let (raw, peer) = inherited_pair();
    name_channel(raw);
    let rt = nodus::Runtime::new();
    assert!(
        std::env::var_os("NODE_CHANNEL_FD").is_none(),
        "taken by the first runtime"
    );
    rt.block_on(async {
        let channel = Channel::from_env().unwrap().expect("a channel");
        assert!(Channel::from_env().unwrap().is_none(), "handed out once");
        // Its peer is gone: it ends.
        drop(peer);
        assert!(channel.recv().await.is_none());
    });
}

#[test]
fn from_env_outside_a_loop_panics_before_taking_the_channel() {
    if !alone("from_env_outside_a_loop_panics_before_taking_the_channel") {
        return;
    }
    let (raw, peer) = inherited_pair();
    name_channel(raw);
    let outside = std::panic::catch_unwind(Channel::from_env);
    assert!(outside.is_err(), "panics outside a loop, as documented");
    // Before the fix, the variable was removed and the fd closed (the parent saw its end of
    // file) by then: a retry found no channel.
    assert!(still_open(raw), "the channel's fd is left open");
    bounded(async {
        let channel = Channel::from_env().unwrap().expect("still there");
        drop(peer);
        assert!(channel.recv().await.is_none());
    });
}

#[test]
fn worker_get_outside_a_loop_panics_before_taking_the_worker() {
    if !alone("worker_get_outside_a_loop_panics_before_taking_the_worker") {
        return;
    }
    let (raw, peer) = inherited_pair();
    name_channel(raw);
    // SAFETY: as in `name_channel`.
    unsafe { std::env::set_var("NODE_UNIQUE_ID", "7") };
    let outside = std::panic::catch_unwind(nodus::cluster::Worker::get);
    assert!(outside.is_err(), "panics outside a loop, as documented");
    assert!(still_open(raw), "the channel's fd is left open");
    assert!(nodus::cluster::is_worker());
    let rt = nodus::Runtime::new();
    rt.block_on(async {
        let worker = nodus::cluster::Worker::get()
            .unwrap()
            .expect("still a worker");
        assert_eq!(worker.id(), 7);
    });
    assert!(nodus::cluster::is_worker(), "once taken too");
    // The worker said `online` on its channel.
    let mut line = String::new();
    peer.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(&peer), &mut line).unwrap();
    assert!(line.contains("\"online\""), "{line}");
    drop(rt);
}
