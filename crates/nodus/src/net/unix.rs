//! Unix domain stream sockets: [`UnixListener`] and [`UnixStream`], over `AsyncFd` and the std
//! types. The same byte-stream semantics as TCP (half-close included); IPC passes fds over these.
//!
//! - A listener created by [`UnixListener::bind`] owns its path: closing or dropping it unlinks
//!   the path (after closing the fd), as libuv does for a bound pipe. A listener adopted from an
//!   fd or a std listener never unlinks anything (a worker closing its copy of a shared listener
//!   must not remove the primary's path), nor does one turned back into std with `into_std`.
//!   Abstract names (a path starting with a NUL byte, Linux) have nothing to unlink.
//! - A path may fill `sun_path` whole, 108 bytes with no terminating NUL, as Linux and Node
//!   allow (socket2's and std's addresses stop at 107); a longer one is `InvalidInput` naming its
//!   length and the limit, and so is a NUL inside a path (the kernel would cut the path there).
//!   An abstract name (a leading NUL) is taken at its own length, up to 108 bytes with the NUL.
//! - Binding an existing path fails with `AddrInUse` (a stale socket file is not removed for you).
//! - `accept` returns its errors as `TcpListener`'s does, with the same back-off after one out of
//!   file descriptors or memory (the [module docs](super)).
//! - `connect` is non-blocking: on Linux it completes at once or fails, `ConnectionRefused` for a
//!   path with no listener, `NotFound` for no path, and `WouldBlock` (`EAGAIN`) when the
//!   listener's backlog is full (libuv reports that as an error too).

use std::fmt;
use std::future::poll_fn;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::task::{Context, Poll};

use socket2::{Domain, SockAddr, SockAddrStorage, Socket, Type};

use super::sys::{self, AcceptBackoff, Kind, socket_common, stream_io};
use crate::io::AsyncFd;

/// Node's (and libuv's) listen backlog.
const BACKLOG: i32 = 511;

/// The address of `path`: a pathname, or an abstract name when it starts with a NUL (see the
/// module docs for the lengths taken).
fn unix_addr(path: &Path) -> io::Result<SockAddr> {
    let bytes = path.as_os_str().as_bytes();
    let mut storage = SockAddrStorage::zeroed();
    // SAFETY: `sockaddr_un` is one of this platform's `sockaddr_*` types, as `view_as` requires.
    let un = unsafe { storage.view_as::<libc::sockaddr_un>() };
    let room = un.sun_path.len();
    if bytes.len() > room {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "nodus::net: the Unix socket path {path:?} is {} bytes long; at most {room} fit \
                 (sockaddr_un's sun_path)",
                bytes.len()
            ),
        ));
    }
    let pathname = bytes.first().is_some_and(|&b| b != 0);
    if pathname && bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "nodus::net: the Unix socket path {path:?} holds a NUL byte (only an abstract \
                 name may, leading)"
            ),
        ));
    }
    un.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (to, &from) in un.sun_path.iter_mut().zip(bytes) {
        *to = from as libc::c_char;
    }
    // A pathname's terminating NUL, when there is room for one (the storage is zeroed).
    let nul = usize::from(pathname && bytes.len() < room);
    let len = std::mem::offset_of!(libc::sockaddr_un, sun_path) + bytes.len() + nul;
    // SAFETY: `storage` holds an initialized `sockaddr_un` (zeroed, then filled) of which `len`
    // bytes, at most its size, are the address.
    Ok(unsafe { SockAddr::new(storage, len as libc::socklen_t) })
}

/// A Unix domain socket listening for connections.
pub struct UnixListener {
    // Field order matters: the fd is closed before the path is unlinked.
    io: AsyncFd<std::os::unix::net::UnixListener>,
    unlink: Option<Unlink>,
    backoff: AcceptBackoff,
}

/// Removes the socket file a listener bound, when dropped.
struct Unlink(PathBuf);

impl Unlink {
    fn disarm(mut self) {
        self.0 = PathBuf::new();
    }
}

impl Drop for Unlink {
    fn drop(&mut self) {
        if !self.0.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

impl UnixListener {
    /// Binds `path` and listens (backlog 511). The path is unlinked when the listener is closed
    /// or dropped.
    #[track_caller]
    pub fn bind(path: impl AsRef<Path>) -> io::Result<UnixListener> {
        let path = path.as_ref();
        let socket = Socket::new(Domain::UNIX, Type::STREAM, None)?;
        socket.bind(&unix_addr(path)?)?;
        // Bound: the path is ours from here on, removed again if anything below fails.
        let bytes = path.as_os_str().as_bytes();
        let unlink = (bytes.first() != Some(&0)).then(|| Unlink(path.to_path_buf()));
        socket.listen(BACKLOG)?;
        let mut listener = UnixListener::from_std(socket.into())?;
        listener.unlink = unlink;
        Ok(listener)
    }

    /// Waits for the next connection. Several tasks may accept on one listener (an
    /// `Rc<UnixListener>` shared by N acceptors): a connection wakes them all, one takes it and
    /// the others wait again (see the [module docs](super)).
    pub async fn accept(&self) -> io::Result<(UnixStream, SocketAddr)> {
        poll_fn(|cx| self.poll_accept(cx)).await
    }

    /// Accepts a connection if one is queued; otherwise registers the task to be woken.
    pub fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<io::Result<(UnixStream, SocketAddr)>> {
        sys::poll_accept(
            &self.io,
            &self.backoff,
            cx,
            |l| l.accept(),
            UnixStream::from_std,
        )
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.io.get_ref().local_addr()
    }

    /// Closes the socket now, unlinks the path it bound, and runs `callback` in this iteration's
    /// close phase.
    #[track_caller]
    pub fn close(self, callback: impl FnOnce() + 'static) {
        let UnixListener { io, unlink, .. } = self;
        io.close(callback);
        drop(unlink);
    }

    /// Adopts a listening std socket: makes it non-blocking and registers it with the current
    /// loop. The listener will not unlink its path.
    ///
    /// # Panics
    /// Outside a running nodus loop.
    #[track_caller]
    pub fn from_std(listener: std::os::unix::net::UnixListener) -> io::Result<UnixListener> {
        Ok(UnixListener {
            io: AsyncFd::new(listener)?,
            unlink: None,
            backoff: AcceptBackoff::default(),
        })
    }

    /// Adopts a listening Unix stream socket fd: checks that it is one (`InvalidInput`
    /// otherwise, and the fd is closed), makes it close-on-exec and non-blocking, and registers
    /// it. The listener will not unlink its path.
    #[track_caller]
    pub fn from_owned_fd(fd: OwnedFd) -> io::Result<UnixListener> {
        sys::adopt_check(
            &fd,
            &Kind {
                api: "nodus::net::UnixListener::from_owned_fd",
                expected: "a listening Unix stream socket",
                domains: &[Domain::UNIX],
                ty: Type::STREAM,
                listening: true,
            },
        )?;
        UnixListener::from_std(fd.into())
    }

    /// Deregisters the socket and gives it back, still non-blocking; its path is no longer
    /// unlinked by nodus.
    pub fn into_std(self) -> std::os::unix::net::UnixListener {
        let UnixListener { io, unlink, .. } = self;
        if let Some(unlink) = unlink {
            unlink.disarm();
        }
        io.into_inner()
    }
}

socket_common!(UnixListener, std::os::unix::net::UnixListener);

impl fmt::Debug for UnixListener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UnixListener")
            .field("addr", &self.local_addr().ok())
            .field("fd", &self.as_raw_fd())
            .field("unlinks", &self.unlink.is_some())
            .finish()
    }
}

/// A Unix domain stream connection.
pub struct UnixStream {
    io: AsyncFd<std::os::unix::net::UnixStream>,
}

impl UnixStream {
    /// Connects to the listener at `path` without blocking the loop.
    pub async fn connect(path: impl AsRef<Path>) -> io::Result<UnixStream> {
        let addr = unix_addr(path.as_ref())?;
        let socket = Socket::new(Domain::UNIX, Type::STREAM, None)?;
        Ok(UnixStream {
            io: sys::connect(socket, &addr).await?,
        })
    }

    /// Two connected, unnamed sockets (`socketpair(2)`), both registered with the current loop.
    #[track_caller]
    pub fn pair() -> io::Result<(UnixStream, UnixStream)> {
        let (a, b) = std::os::unix::net::UnixStream::pair()?;
        Ok((UnixStream::from_std(a)?, UnixStream::from_std(b)?))
    }

    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.io.get_ref().peer_addr()
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.io.get_ref().local_addr()
    }

    /// Closes the connection now and runs `callback` in this iteration's close phase.
    #[track_caller]
    pub fn close(self, callback: impl FnOnce() + 'static) {
        self.io.close(callback)
    }

    /// Adopts a connected std stream: makes it non-blocking and registers it with the current
    /// loop.
    ///
    /// # Panics
    /// Outside a running nodus loop.
    #[track_caller]
    pub fn from_std(stream: std::os::unix::net::UnixStream) -> io::Result<UnixStream> {
        Ok(UnixStream {
            io: AsyncFd::new(stream)?,
        })
    }

    /// Adopts a Unix stream socket fd (one end of a socketpair a parent passed down, say): checks
    /// that it is one (`InvalidInput` otherwise, and the fd is closed), makes it close-on-exec and
    /// non-blocking, and registers it.
    #[track_caller]
    pub fn from_owned_fd(fd: OwnedFd) -> io::Result<UnixStream> {
        sys::adopt_check(
            &fd,
            &Kind {
                api: "nodus::net::UnixStream::from_owned_fd",
                expected: "a Unix stream socket",
                domains: &[Domain::UNIX],
                ty: Type::STREAM,
                listening: false,
            },
        )?;
        UnixStream::from_std(fd.into())
    }

    /// Deregisters the socket and gives it back, still non-blocking.
    pub fn into_std(self) -> std::os::unix::net::UnixStream {
        self.io.into_inner()
    }
}

socket_common!(UnixStream, std::os::unix::net::UnixStream);
stream_io!(UnixStream, std::os::unix::net::UnixStream);

impl fmt::Debug for UnixStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UnixStream")
            .field("addr", &self.local_addr().ok())
            .field("peer", &self.peer_addr().ok())
            .field("fd", &self.as_raw_fd())
            .finish()
    }
}
