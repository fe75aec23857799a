//! Bytes and fds over an AF_UNIX stream: `sendmsg` with the `SCM_RIGHTS` fds in the same call as
//! the frame they belong to (Node's rule: one fd; nodus peers: up to [`MAX_FDS`]), and
//! `recvmsg(MSG_CMSG_CLOEXEC)` that collects every fd the kernel hands over.
//!
//! Invariants: received fds are close-on-exec from the moment they exist (no window in which a
//! concurrent `exec` could leak them); sends use `MSG_NOSIGNAL` (a gone peer is `EPIPE`, not a
//! signal); a failed `sendmsg` took nothing, neither bytes nor fds (the frame is sent again
//! whole), and a short one took the fds with its first byte; a receive takes at most
//! [`MAX_FDS`] fds per call, as libuv does (`UV__CMSG_FD_COUNT`), and reports `MSG_CTRUNC` so
//! that a handle whose fd was lost gets a NACK.
//!
//! What the kernel does with them (Linux `unix_stream_sendmsg`/`unix_stream_read_generic`): a
//! `sendmsg`'s fds ride on the buffer holding its first byte; a read that takes bytes of such a
//! buffer takes its fds and ends there, although it may start with earlier bytes. So the fds of
//! one read belong to the frames that start in it, from that `sendmsg` on (see `channel`).

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

/// Fds accepted per `recvmsg` (libuv's `UV__CMSG_FD_COUNT`). A wire limit: a peer of any
/// nodus build, or Node, takes no more in one call, so it is never raised (a sender's frame
/// with more would reach an older peer truncated).
pub(crate) const MAX_FDS: usize = 64;

/// Sends `bytes` with `fds` attached (at most [`MAX_FDS`]). Returns how many bytes the kernel took
/// (the fds, if any, went with the first of them).
pub(crate) fn send(
    socket: BorrowedFd<'_>,
    bytes: &[u8],
    fds: &[BorrowedFd<'_>],
) -> io::Result<usize> {
    debug_assert!(fds.len() <= MAX_FDS, "at most MAX_FDS fds per frame");
    let iov = [IoSlice::new(bytes)];
    let flags = SendFlags::NOSIGNAL;
    let n = if fds.is_empty() {
        rustix::net::sendmsg(socket, &iov, &mut SendAncillaryBuffer::default(), flags)?
    } else {
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        control.push(SendAncillaryMessage::ScmRights(fds));
        rustix::net::sendmsg(socket, &iov, &mut control, flags)?
    };
    Ok(n)
}

/// What one `recvmsg` brought.
pub(crate) struct Received {
    /// Bytes read (0 = end of stream).
    pub(crate) len: usize,
    /// The fds that came with them, in the order sent.
    pub(crate) fds: Vec<OwnedFd>,
    /// `MSG_CTRUNC`: the kernel could not install every fd (this process is at its fd limit)
    /// and closed the rest; the ones in `fds` are the first ones sent.
    pub(crate) truncated: bool,
}

/// Receives into `buf`, with any fds.
pub(crate) fn recv(socket: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<Received> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut iov = [IoSliceMut::new(buf)];
    let msg = rustix::net::recvmsg(socket, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC)?;
    let mut fds = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = message {
            fds.extend(received);
        }
    }
    let mut truncated = msg.flags.contains(ReturnFlags::CTRUNC);
    // `cmsg_space!` leaves room to align the buffer, which the kernel may fill with a few fds
    // more: those are closed here, as the kernel closes the ones that do not fit.
    if fds.len() > MAX_FDS {
        fds.truncate(MAX_FDS);
        truncated = true;
    }
    Ok(Received {
        len: msg.bytes,
        fds,
        truncated,
    })
}
