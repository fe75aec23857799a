//! Handles on the wire: what is sent ([`SendHandle`]), what arrives ([`Handle`]), and the
//! `NODE_*` control frames (`NODE_HANDLE`, its ACK/NACK, `NODE_SOCKET_*`).
//!
//! Node wraps a message that carries a handle as `{"cmd":"NODE_HANDLE","type":T,"msg":M}` and
//! sends the fd with the bytes of that frame. `T` tells the receiver what to rebuild:
//! `net.Server` (a listening socket), `net.Socket` (a connected stream), `dgram.Socket` (UDP,
//! with `dgramType`), `net.Native` (any other fd; nodus uses it for arbitrary fds).
//!
//! Invariants: a frame is internal iff it is an object whose `cmd` is a string longer than 5
//! characters starting with `NODE_` (Node's `isInternal`); internal frames never reach the user's
//! message stream. Received fds are close-on-exec; converting a [`Handle`] checks the fd's kind.

use std::borrow::Cow;
use std::fmt;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::net::{TcpListener, TcpStream, UdpSocket, UnixListener, UnixStream};

pub(crate) const NODE_HANDLE: &str = "NODE_HANDLE";
/// nodus-to-nodus wrapper of a message with several fds (not ACKed; see `channel`).
pub(crate) const NODUS_FDS: &str = "NODE_NODUS_FDS";
pub(crate) const ACK: &[u8] = b"{\"cmd\":\"NODE_HANDLE_ACK\"}\n";
pub(crate) const NACK: &[u8] = b"{\"cmd\":\"NODE_HANDLE_NACK\"}\n";

/// An fd to send with a message, and the Node type the receiver rebuilds it as.
#[derive(Debug)]
pub struct SendHandle {
    pub(crate) fd: OwnedFd,
    pub(crate) node_type: &'static str,
    pub(crate) dgram_type: Option<&'static str>,
}

impl SendHandle {
    /// Any fd (a pipe, a memfd, a file), sent as Node's `net.Native`. A nodus receiver gets the
    /// fd. A Node receiver takes only sockets and pipes: any other fd (a regular file, a memfd,
    /// `/dev/null`) aborts the Node process (libuv sees a `UV_FILE`, which Node's channel
    /// asserts against), so send those to nodus peers only.
    pub fn fd(fd: OwnedFd) -> SendHandle {
        SendHandle {
            fd,
            node_type: "net.Native",
            dgram_type: None,
        }
    }

    /// The Node type name it is sent as (`net.Server`, `net.Socket`, ...).
    pub fn node_type(&self) -> &'static str {
        self.node_type
    }
}

impl From<TcpListener> for SendHandle {
    /// Sent as `net.Server`: a Node receiver listens on it. To keep listening here too, send a
    /// duplicate (`listener.as_fd().try_clone_to_owned()` then `SendHandle::from(TcpListener::from_owned_fd(..)?)`).
    fn from(l: TcpListener) -> SendHandle {
        SendHandle {
            fd: l.into(),
            node_type: "net.Server",
            dgram_type: None,
        }
    }
}

impl From<UnixListener> for SendHandle {
    fn from(l: UnixListener) -> SendHandle {
        SendHandle {
            fd: l.into(),
            node_type: "net.Server",
            dgram_type: None,
        }
    }
}

impl From<TcpStream> for SendHandle {
    fn from(s: TcpStream) -> SendHandle {
        SendHandle {
            fd: s.into(),
            node_type: "net.Socket",
            dgram_type: None,
        }
    }
}

impl From<UnixStream> for SendHandle {
    fn from(s: UnixStream) -> SendHandle {
        SendHandle {
            fd: s.into(),
            node_type: "net.Socket",
            dgram_type: None,
        }
    }
}

impl From<UdpSocket> for SendHandle {
    fn from(s: UdpSocket) -> SendHandle {
        let v6 = s.local_addr().map(|a| a.is_ipv6()).unwrap_or(false);
        SendHandle {
            fd: s.into(),
            node_type: "dgram.Socket",
            dgram_type: Some(if v6 { "udp6" } else { "udp4" }),
        }
    }
}

/// A handle received with a message: an fd (close-on-exec) and the Node type it was sent as.
pub struct Handle {
    fd: OwnedFd,
    /// Borrowed for nodus's own `net.Native` (one per connection a primary hands over), owned
    /// for a name read from a `NODE_HANDLE` frame.
    node_type: Cow<'static, str>,
}

impl Handle {
    pub(crate) fn new(fd: OwnedFd, node_type: impl Into<Cow<'static, str>>) -> Handle {
        Handle {
            fd,
            node_type: node_type.into(),
        }
    }

    /// The sender's type name: `net.Server`, `net.Socket`, `dgram.Socket`, `net.Native`...
    pub fn node_type(&self) -> &str {
        &self.node_type
    }

    /// A listening TCP socket (`InvalidInput` if the fd is not one).
    #[track_caller]
    pub fn into_tcp_listener(self) -> std::io::Result<TcpListener> {
        TcpListener::from_owned_fd(self.fd)
    }

    /// A connected TCP stream.
    #[track_caller]
    pub fn into_tcp_stream(self) -> std::io::Result<TcpStream> {
        TcpStream::from_owned_fd(self.fd)
    }

    /// A UDP socket.
    #[track_caller]
    pub fn into_udp_socket(self) -> std::io::Result<UdpSocket> {
        UdpSocket::from_owned_fd(self.fd)
    }

    /// A connected Unix stream.
    #[track_caller]
    pub fn into_unix_stream(self) -> std::io::Result<UnixStream> {
        UnixStream::from_owned_fd(self.fd)
    }

    /// A listening Unix socket.
    #[track_caller]
    pub fn into_unix_listener(self) -> std::io::Result<UnixListener> {
        UnixListener::from_owned_fd(self.fd)
    }

    /// The fd itself.
    pub fn into_owned_fd(self) -> OwnedFd {
        self.fd
    }
}

impl AsFd for Handle {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl fmt::Debug for Handle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Handle")
            .field("type", &self.node_type)
            .field("fd", &self.fd.as_raw_fd())
            .finish()
    }
}

/// The fields of an internal frame nodus reads, borrowed from the frame's text (a frame is
/// read once per step that needs it, and nothing is copied until a message is delivered). Each
/// is `None` when absent or of another JSON type than expected: a field nodus cannot use does
/// not make the frame a user message.
#[derive(Deserialize)]
pub(crate) struct Internal<'a> {
    #[serde(borrow, default, deserialize_with = "lenient_str")]
    cmd: Option<Cow<'a, str>>,
    #[serde(rename = "type", borrow, default, deserialize_with = "lenient_str")]
    pub(crate) node_type: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub(crate) msg: Option<&'a RawValue>,
    #[serde(borrow)]
    pub(crate) key: Option<&'a RawValue>,
    /// How many fds a `NODE_NODUS_FDS` frame carries.
    #[serde(default, deserialize_with = "lenient")]
    pub(crate) count: Option<usize>,
}

impl Internal<'_> {
    /// The frame's `cmd` (`NODE_...`; `internal` returns only frames that have one).
    pub(crate) fn cmd(&self) -> &str {
        self.cmd.as_deref().unwrap_or_default()
    }

    /// The fds the frame announces: one for a `NODE_HANDLE`, `count` for a `NODE_NODUS_FDS`,
    /// none for any other.
    pub(crate) fn carries(&self) -> usize {
        match self.cmd() {
            NODE_HANDLE => 1,
            NODUS_FDS => self.count.unwrap_or(0),
            _ => 0,
        }
    }
}

/// A field's value as `T`, or `None` if it is some other JSON value.
fn lenient<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::de::DeserializeOwned,
{
    let raw = <&RawValue>::deserialize(d)?;
    Ok(serde_json::from_str(raw.get()).ok())
}

/// A string field's value, borrowed unless it has escapes, or `None` if it is some other JSON
/// value.
fn lenient_str<'de, D>(d: D) -> Result<Option<Cow<'de, str>>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    let raw = <&'de RawValue>::deserialize(d)?;
    Ok(match serde_json::from_str::<&'de str>(raw.get()) {
        Ok(plain) => Some(Cow::Borrowed(plain)),
        Err(_) => serde_json::from_str::<String>(raw.get())
            .ok()
            .map(Cow::Owned),
    })
}

/// The internal frame in `raw`, if it is one (Node's `isInternal`: an object whose `cmd` is a
/// string over 5 characters starting with `NODE_`; its other fields do not matter).
pub(crate) fn internal(raw: &RawValue) -> Option<Internal<'_>> {
    if !raw.get().starts_with('{') {
        return None;
    }
    let probe: Internal = serde_json::from_str(raw.get()).ok()?;
    let cmd = probe.cmd.as_deref()?;
    (cmd.len() > 5 && cmd.starts_with("NODE_")).then_some(probe)
}

/// The message inside a handle's frame as it was sent (`frame`: the JSON line).
pub(crate) fn sent_message(frame: &[u8]) -> Option<Box<RawValue>> {
    let raw: &RawValue = serde_json::from_slice(frame.trim_ascii_end()).ok()?;
    internal(raw)?.msg.map(ToOwned::to_owned)
}

/// The wrapper a handle's message travels in.
#[derive(Serialize)]
pub(crate) struct HandleFrame<'a, T: ?Sized + Serialize> {
    pub(crate) cmd: &'static str,
    #[serde(rename = "type")]
    pub(crate) node_type: &'static str,
    pub(crate) msg: &'a T,
    #[serde(rename = "dgramType", skip_serializing_if = "Option::is_none")]
    pub(crate) dgram_type: Option<&'static str>,
}

/// The wrapper of a message sent with several fds to a nodus peer.
#[derive(Serialize)]
pub(crate) struct FdsFrame<'a, T: ?Sized + Serialize> {
    pub(crate) cmd: &'static str,
    pub(crate) count: usize,
    pub(crate) msg: &'a T,
}

/// A reply to `NODE_SOCKET_NOTIFY_CLOSE` / `NODE_SOCKET_GET_COUNT`.
#[derive(Serialize)]
pub(crate) struct SocketReply<'a> {
    pub(crate) cmd: &'static str,
    pub(crate) key: &'a RawValue,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) count: Option<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(text: &str) -> Box<RawValue> {
        RawValue::from_string(text.to_owned()).unwrap()
    }

    #[test]
    fn internal_is_decided_by_cmd_alone() {
        for text in [
            r#"{"cmd":"NODE_CLUSTER","act":"online"}"#,
            r#"{"cmd":"NODE_HANDLE","type":5,"msg":"m"}"#,
            r#"{"cmd":"NODE_NODUS_FDS","count":-1,"msg":1}"#,
            r#"{"cmd":"NODE_X","key":[1],"count":1.5,"type":null}"#,
            // An escape in `cmd` is read as JSON.parse reads it.
            r#"{"cmd":"NODE\u005fCLUSTER","act":"online"}"#,
        ] {
            assert!(internal(&raw(text)).is_some(), "{text}");
        }
        for text in [
            r#"{"cmd":"NODE_"}"#,
            r#"{"cmd":5}"#,
            r#"{"cmd":["NODE_CLUSTER"]}"#,
            r#"{"act":"online"}"#,
            r#"["NODE_CLUSTER"]"#,
            r#""NODE_CLUSTER""#,
        ] {
            assert!(internal(&raw(text)).is_none(), "{text}");
        }
        let odd = raw(r#"{"cmd":"NODE_NODUS_FDS","count":-1,"type":{}}"#);
        let odd = internal(&odd).unwrap();
        assert_eq!(odd.cmd(), "NODE_NODUS_FDS");
        assert_eq!((odd.count, odd.node_type.as_deref()), (None, None));
        let escaped = raw(r#"{"cmd":"NODE_HANDLE","type":"net.\u0053ocket","msg":{"a":1}}"#);
        let escaped = internal(&escaped).unwrap();
        assert_eq!(escaped.node_type.as_deref(), Some("net.Socket"));
        assert_eq!(
            (escaped.carries(), escaped.msg.map(RawValue::get)),
            (1, Some(r#"{"a":1}"#))
        );
    }
}
