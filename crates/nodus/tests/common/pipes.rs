//! Pipes as fds to pass, and whether a passed one was closed everywhere (the fd-passing tests:
//! an fd nodus drops must be closed, not leaked).

use std::os::fd::OwnedFd;

/// A pipe: its read end (non-blocking), kept to see whether every write end was closed, and its
/// write end, the fd to pass.
pub fn pipe() -> (OwnedFd, OwnedFd) {
    let (r, w) = std::io::pipe().unwrap();
    rustix::fs::fcntl_setfl(&r, rustix::fs::OFlags::NONBLOCK).unwrap();
    (r.into(), w.into())
}

/// Whether every write end of the pipe is closed (a read sees EOF rather than `EAGAIN`).
pub fn write_end_closed(read_end: &OwnedFd) -> bool {
    match rustix::io::read(read_end, &mut [0u8; 1]) {
        Ok(0) => true,
        Err(rustix::io::Errno::AGAIN) => false,
        other => panic!("unexpected pipe read: {other:?}"),
    }
}
