//! Node's IPC channel: a parent and a child (Node or nodus, either side) exchange JSON messages
//! and pass sockets and other fds over an AF_UNIX stream socket.
//!
//! Wire format (Node v20 `json` mode, verified byte for byte): each message is
//! `JSON.stringify(msg) + "\n"`; a message with a handle is wrapped as
//! `{"cmd":"NODE_HANDLE","type":T,"msg":M}` and its fd travels in the same `sendmsg`
//! (`SCM_RIGHTS`); the receiver answers `{"cmd":"NODE_HANDLE_ACK"}` or `NODE_HANDLE_NACK`.
//! A child finds its end through `NODE_CHANNEL_FD` (and `NODE_CHANNEL_SERIALIZATION_MODE`).
//!
//! - [`framing`]: the line decoder, with a frame-size cap (default 16 MiB) Node does not have.
//! - `fdpass`: `sendmsg`/`recvmsg` with `SCM_RIGHTS`; received fds are close-on-exec.
//! - `handles`: [`SendHandle`] / [`Handle`] and the `NODE_*` control frames.
//! - `channel`: [`Channel`], its task, ordering, ACK/NACK, backpressure, disconnect, and
//!   [`Channel::send_fds`] (several fds in one frame, between nodus peers).
//!
//! Unlike Node, a malformed or oversized frame is an error event on that channel, which reads on
//! from the next line; fds that do not match the frame they came with are closed and an error
//! event, and the channel goes on (fds are matched to frames by where they arrive in the byte
//! stream: in order, to the frames of the read they came with that announce fds, so a mismatch
//! never shifts fds onto later messages); the process keeps running. As in Node, the channel
//! reads whatever the program does, so internal messages never wait behind unread ones; unlike
//! Node, unread messages are bounded ([`MAX_UNREAD_MESSAGES`], [`MAX_UNREAD_BYTES`],
//! [`MAX_UNREAD_FDS`]): below the bounds none is lost, past them the oldest are dropped, counted
//! ([`Channel::dropped_unread`]) and warned about. Only the `json` serialization is spoken: a
//! Node parent that forks with `serialization: 'advanced'` gets
//! [`IpcError::UnsupportedSerialization`] from [`Channel::from_env`].

mod channel;
mod fdpass;
pub mod framing;
mod handles;

use std::os::fd::{BorrowedFd, FromRawFd, OwnedFd};

pub use channel::{
    Channel, ChannelOptions, HIGH_WATER, IpcError, MAX_FDS_PER_FRAME, MAX_UNREAD_BYTES,
    MAX_UNREAD_FDS, MAX_UNREAD_MESSAGES, Message,
};
pub use framing::{DEFAULT_MAX_FRAME, FrameError};
pub use handles::{Handle, SendHandle};

impl Channel {
    /// The channel a parent gave this process (Node's `process.channel`), from
    /// `NODE_CHANNEL_FD`; `Ok(None)` when there is none. Both `NODE_CHANNEL_*` variables are
    /// taken out of the environment, as Node takes them, so grandchildren do not inherit them,
    /// and handed out once (a second call returns `None`): by the first runtime built at the
    /// latest (see [`Builder::build`](crate::rt::Builder::build) for when other threads may read
    /// the environment), so one the program sets itself afterwards is not seen.
    ///
    /// # Errors
    /// [`IpcError::UnsupportedSerialization`] for a parent using `serialization: 'advanced'`;
    /// [`IpcError::BadChannelFd`] when the variable does not name a channel a parent passed: an
    /// open, inherited (not close-on-exec: an fd this process opened itself is owned elsewhere)
    /// and connected Unix stream socket. A refused fd is left as it was, never closed.
    ///
    /// # Panics
    /// Outside a running nodus loop (before anything is taken: a later call in a loop still
    /// finds the channel).
    #[track_caller]
    pub fn from_env() -> Result<Option<Channel>, IpcError> {
        Channel::from_env_with(ChannelOptions::default())
    }

    /// [`from_env`](Self::from_env) with options (a different frame cap).
    #[track_caller]
    pub fn from_env_with(options: ChannelOptions) -> Result<Option<Channel>, IpcError> {
        crate::rt::context::with_core("nodus::ipc::Channel::from_env", |_| ());
        let Some((fd, mode)) = crate::parent_env::channel() else {
            return Ok(None);
        };
        if let Some(mode) = mode
            && mode != "json"
        {
            return Err(IpcError::UnsupportedSerialization(
                mode.to_string_lossy().into_owned(),
            ));
        }
        let text = fd.to_string_lossy();
        let fd: i32 = text
            .parse()
            .ok()
            .filter(|fd| *fd >= 0)
            .ok_or_else(|| IpcError::BadChannelFd(format!("is {text:?}, not an fd number")))?;
        check_inherited(fd).map_err(|why| IpcError::BadChannelFd(format!("{fd} {why}")))?;
        // SAFETY: fd `fd` is open, was inherited across exec (it is not close-on-exec, which
        // every fd this process opens is: so no other owner in this process knows it) and is a
        // connected Unix stream socket, not a listener `net::listen_fds` could take
        // (`check_inherited`). The parent passed it for exactly this channel, and the variable
        // naming it is handed out once (`parent_env`), so no other code in the process is told
        // to take it.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        Channel::from_fd(owned, options)
            .map(Some)
            .map_err(|e| IpcError::BadChannelFd(format!("{fd}: {e}")))
    }
}

/// Why fd `raw` is not a channel a parent passed, if it is not: it must be open, inherited (not
/// close-on-exec: every fd this process opened itself is, and is owned elsewhere, the loop's
/// epoll say) and a connected (not listening) Unix stream socket. Only borrowed: a refused fd
/// is left as it was, never closed.
fn check_inherited(raw: i32) -> Result<(), String> {
    // SAFETY: only borrowed for the checks below, which read flags and options of whatever fd
    // `raw` is (or fail if none is open); nothing is closed.
    let fd = unsafe { BorrowedFd::borrow_raw(raw) };
    let flags = rustix::io::fcntl_getfd(fd).map_err(|e| format!("is not an open fd ({e})"))?;
    if flags.contains(rustix::io::FdFlags::CLOEXEC) {
        return Err("is close-on-exec: this process opened it, no parent passed it".to_owned());
    }
    let sock = socket2::SockRef::from(&fd);
    let stream = sock.domain().ok() == Some(socket2::Domain::UNIX)
        && sock.r#type().ok() == Some(socket2::Type::STREAM);
    if !stream {
        return Err("is not a Unix stream socket".to_owned());
    }
    if rustix::net::sockopt::socket_acceptconn(fd).unwrap_or(false) {
        return Err("is a listening socket, not a channel".to_owned());
    }
    Ok(())
}
