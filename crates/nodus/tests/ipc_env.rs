//! `Channel::from_env` takes ownership of the fd `NODE_CHANNEL_FD` names only when a parent
//! passed it: an fd inherited across `exec` (so not close-on-exec) that is a connected Unix
//! stream socket. A stale or wrong variable that names an fd this process opened itself (every
//! fd nodus and std open is close-on-exec: the loop's epoll, a file, a socket) is refused without
//! taking, or closing, that fd.
//!
//! One test in this file: it sets the process's environment, which no other test may read
//! meanwhile.

mod common;

use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use common::bounded;
use nodus::ipc::{Channel, IpcError};

fn still_open(fd: &impl AsFd) -> bool {
    rustix::io::fcntl_getfd(fd).is_ok()
}

fn from_env_naming(fd: &impl AsRawFd) -> Result<Option<Channel>, IpcError> {
    // SAFETY: the only test in this binary; nothing else reads the environment meanwhile.
    unsafe { std::env::set_var("NODE_CHANNEL_FD", fd.as_raw_fd().to_string()) };
    Channel::from_env()
}

#[test]
fn an_fd_this_process_opened_is_neither_adopted_nor_closed() {
    bounded(async {
        // A file: not a socket. Before the fix, the refusal closed it (its `OwnedFd` was made
        // and dropped), and the file's owner later closed a number that may have been reused.
        let file = std::fs::File::open("/dev/null").unwrap();
        let err = from_env_naming(&file).expect_err("a file is no channel");
        assert!(matches!(err, IpcError::BadChannelFd(_)), "{err}");
        assert!(still_open(&file), "the refusal closed an fd it did not own");

        // A Unix stream socket this process opened (close-on-exec): before the fix it was
        // adopted, so two owners would close the same number.
        let (mine, _peer) = std::os::unix::net::UnixStream::pair().unwrap();
        let err =
            from_env_naming(&mine).expect_err("an fd this process opened is no inherited channel");
        assert!(matches!(err, IpcError::BadChannelFd(_)), "{err}");
        assert!(still_open(&mine));

        // The same socket, inherited (no close-on-exec): a channel.
        let inherited: OwnedFd = {
            let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
            drop(b);
            a.into()
        };
        rustix::io::fcntl_setfd(&inherited, rustix::io::FdFlags::empty()).unwrap();
        let raw = inherited.as_raw_fd();
        // Ownership moves to the channel.
        std::mem::forget(inherited);
        // SAFETY: as above.
        unsafe { std::env::set_var("NODE_CHANNEL_FD", raw.to_string()) };
        let channel = Channel::from_env().unwrap().expect("a channel");
        assert!(std::env::var_os("NODE_CHANNEL_FD").is_none());
        // Its peer is gone: it ends.
        assert!(channel.recv().await.is_none());
    });
}
