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
//! Unlike Node, a malformed or oversized frame is an error event on that channel, which then
//! closes; fds that do not match the frame they came with are closed and an error event, and the
//! channel goes on (fds are matched to frames by where they arrive in the byte stream, so a
//! mismatch never shifts fds onto later messages); the process keeps running. Only the `json` serialization is spoken: a Node parent that
//! forks with `serialization: 'advanced'` gets [`IpcError::UnsupportedSerialization`] from
//! [`Channel::from_env`].

mod channel;
mod fdpass;
pub mod framing;
mod handles;

use std::os::fd::{FromRawFd, OwnedFd};

pub use channel::{Channel, ChannelOptions, HIGH_WATER, IpcError, MAX_FDS_PER_FRAME, Message};
pub use framing::{DEFAULT_MAX_FRAME, FrameError};
pub use handles::{Handle, SendHandle};

impl Channel {
    /// The channel a parent gave this process (Node's `process.channel`), from
    /// `NODE_CHANNEL_FD`; `Ok(None)` when there is none. Both `NODE_CHANNEL_*` variables are
    /// removed from the environment, as Node does, so grandchildren do not inherit them (and a
    /// second call returns `None`). Call it early, before other threads read the environment.
    ///
    /// # Errors
    /// [`IpcError::UnsupportedSerialization`] for a parent using `serialization: 'advanced'`;
    /// [`IpcError::BadChannelFd`] when the variable is not an open Unix stream socket.
    ///
    /// # Panics
    /// Outside a running nodus loop.
    #[track_caller]
    pub fn from_env() -> Result<Option<Channel>, IpcError> {
        Channel::from_env_with(ChannelOptions::default())
    }

    /// [`from_env`](Self::from_env) with options (a different frame cap).
    #[track_caller]
    pub fn from_env_with(options: ChannelOptions) -> Result<Option<Channel>, IpcError> {
        let Some(fd) = std::env::var_os("NODE_CHANNEL_FD") else {
            return Ok(None);
        };
        let mode = std::env::var_os("NODE_CHANNEL_SERIALIZATION_MODE");
        // SAFETY: `remove_var` races only with other threads reading or writing the environment
        // at the same time. The runtime's own threads never touch it, and the contract of this
        // function (documented above) is to be called before user threads do.
        unsafe {
            std::env::remove_var("NODE_CHANNEL_FD");
            std::env::remove_var("NODE_CHANNEL_SERIALIZATION_MODE");
        }
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
        if std::fs::symlink_metadata(format!("/proc/self/fd/{fd}")).is_err() {
            return Err(IpcError::BadChannelFd(format!("{fd} is not an open fd")));
        }
        // SAFETY: the fd is open (checked above) and was handed to this process to own: the
        // parent passed it for exactly this channel, and the variable naming it is now removed,
        // so no other code in the process is told to take it.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        Channel::from_fd(owned, options)
            .map(Some)
            .map_err(|e| IpcError::BadChannelFd(format!("{fd}: {e}")))
    }
}
