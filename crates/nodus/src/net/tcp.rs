//! TCP: [`TcpListener`] (bind with Node's defaults, accept) and [`TcpStream`] (connect, read,
//! write, half-close), both over `AsyncFd` and the std types.
//!
//! - Listening uses Node's defaults: `SO_REUSEADDR` on, a backlog of 511, and IPv6 sockets
//!   dual-stack (`IPV6_V6ONLY` off) whatever the system default, as libuv sets it.
//!   [`ListenOptions`] adds `SO_REUSEPORT`, which lets several sockets (and processes) bind the
//!   same port with the kernel balancing connections between them, and deferred accept
//!   (`TCP_DEFER_ACCEPT`, nginx's `listen ... deferred`, systemd's `DeferAcceptSec=`): a
//!   connection is queued for `accept` once its first bytes arrived, or once the kernel's one
//!   retransmitted SYN-ACK (about 1 s) was answered without any. A protocol whose client speaks
//!   first (HTTP, TLS) loses nothing and the server saves a wake-up and a read that would find
//!   nothing per connection; one whose server speaks first waits that second: off by default.
//! - `accept` skips `ECONNABORTED` (a connection reset before it was accepted; libuv does the
//!   same) and returns every other error; the listener stays usable. After one out of file
//!   descriptors or memory (`EMFILE`, say) the next accept waits 100 ms or for a new connection
//!   (the [module docs](super) say why).
//! - `connect` is a non-blocking `connect(2)`: it waits for writability, then reads `SO_ERROR`
//!   (`ECONNREFUSED` and friends) and confirms there is a peer.

use std::fmt;
use std::future::poll_fn;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::task::{Context, Poll};

use socket2::{Domain, Protocol, Socket, Type};

use super::IntoSocketAddr;
use super::sys::{self, AcceptBackoff, Kind, socket_common, stream_io};
use crate::io::AsyncFd;

/// How [`TcpListener::bind_with`] sets up its socket. The default is Node's `listen()`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenOptions {
    /// Pending-connection queue length (Node's default 511; the kernel caps it at
    /// `net.core.somaxconn`).
    pub backlog: u32,
    /// `SO_REUSEADDR`: rebind a port whose old connections are in `TIME_WAIT` (default on).
    pub reuse_address: bool,
    /// `SO_REUSEPORT`: several sockets bind the same address and the kernel balances incoming
    /// connections between them (every one of them must set it; default off).
    pub reuse_port: bool,
    /// For an IPv6 address: accept IPv6 only, not IPv4-mapped connections too (default off,
    /// dual-stack).
    pub ipv6_only: bool,
    /// Deferred accept (`TCP_DEFER_ACCEPT` for [`DEFER_ACCEPT_SECS`], nginx's `listen ...
    /// deferred`, systemd's `DeferAcceptSec=`; default off): a connection is queued for `accept`
    /// once its first bytes arrived, or once the kernel's one retransmitted SYN-ACK (about 1 s)
    /// was answered without any. A protocol whose client speaks first (HTTP, TLS) loses nothing,
    /// and the server saves a wake-up and an empty read per connection; one whose server speaks
    /// first waits that second. A connection held so when the listener closes is reset.
    pub defer_accept: bool,
}

/// How long a deferred accept waits for a silent client: the kernel rounds it to one
/// retransmission of the SYN-ACK, so such a connection is accepted after about a second.
pub const DEFER_ACCEPT_SECS: u32 = 1;

impl Default for ListenOptions {
    fn default() -> Self {
        ListenOptions {
            backlog: 511,
            reuse_address: true,
            reuse_port: false,
            ipv6_only: false,
            defer_accept: false,
        }
    }
}

/// A TCP socket listening for connections.
pub struct TcpListener {
    io: AsyncFd<std::net::TcpListener>,
    backoff: AcceptBackoff,
}

impl TcpListener {
    /// Binds and listens with Node's defaults (`SO_REUSEADDR`, backlog 511). Port 0 picks a free
    /// port: see [`local_addr`](Self::local_addr).
    #[track_caller]
    pub fn bind(addr: impl IntoSocketAddr) -> io::Result<TcpListener> {
        TcpListener::bind_with(addr, ListenOptions::default())
    }

    /// Binds and listens with `options`.
    #[track_caller]
    pub fn bind_with(addr: impl IntoSocketAddr, options: ListenOptions) -> io::Result<TcpListener> {
        let addr = addr.into_socket_addr()?;
        let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
        if options.reuse_address {
            socket.set_reuse_address(true)?;
        }
        if options.reuse_port {
            socket.set_reuse_port(true)?;
        }
        if addr.is_ipv6() {
            socket.set_only_v6(options.ipv6_only)?;
        }
        socket.bind(&addr.into())?;
        if options.defer_accept {
            set_defer_accept(&socket, true)?;
        }
        socket.listen(options.backlog.min(i32::MAX as u32) as i32)?;
        TcpListener::from_std(socket.into())
    }

    /// Turns deferred accept ([`ListenOptions::defer_accept`]) on or off, on a
    /// listener bound here or passed in (socket activation): the kernel reads it for each new
    /// connection, so it holds from the next one.
    pub fn set_defer_accept(&self, on: bool) -> io::Result<()> {
        set_defer_accept(self.io.get_ref(), on)
    }

    /// Whether deferred accept is on.
    pub fn defer_accept(&self) -> io::Result<bool> {
        defer_accept_of(self.io.get_ref())
    }

    /// Waits for the next connection. Several tasks may accept on one listener (an
    /// `Rc<TcpListener>` shared by N acceptors): a connection wakes them all, one takes it and
    /// the others wait again (see the [module docs](super)).
    pub async fn accept(&self) -> io::Result<(TcpStream, SocketAddr)> {
        poll_fn(|cx| self.poll_accept(cx)).await
    }

    /// Accepts a connection if one is queued; otherwise registers the task to be woken.
    pub fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<io::Result<(TcpStream, SocketAddr)>> {
        sys::poll_accept(
            &self.io,
            &self.backoff,
            cx,
            accept_nonblocking,
            TcpStream::from_nonblocking,
        )
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.io.get_ref().local_addr()
    }

    /// Closes the socket now (the port is free again) and runs `callback` in this iteration's
    /// close phase.
    #[track_caller]
    pub fn close(self, callback: impl FnOnce() + 'static) {
        self.io.close(callback)
    }

    /// Adopts a listening std socket: makes it non-blocking and registers it with the current
    /// loop.
    ///
    /// # Panics
    /// Outside a running nodus loop.
    #[track_caller]
    pub fn from_std(listener: std::net::TcpListener) -> io::Result<TcpListener> {
        Ok(TcpListener {
            io: AsyncFd::new(listener)?,
            backoff: AcceptBackoff::default(),
        })
    }

    /// Adopts a listening TCP socket fd (inherited through `LISTEN_FDS`, received over IPC):
    /// checks that it is one (`InvalidInput` otherwise, and the fd is closed), makes it
    /// close-on-exec and non-blocking, and registers it.
    #[track_caller]
    pub fn from_owned_fd(fd: OwnedFd) -> io::Result<TcpListener> {
        sys::adopt_check(
            &fd,
            &Kind {
                api: "nodus::net::TcpListener::from_owned_fd",
                expected: "a listening TCP socket",
                domains: &[Domain::IPV4, Domain::IPV6],
                ty: Type::STREAM,
                listening: true,
            },
        )?;
        TcpListener::from_std(fd.into())
    }

    /// Deregisters the socket and gives it back, still non-blocking.
    pub fn into_std(self) -> std::net::TcpListener {
        self.io.into_inner()
    }
}

socket_common!(TcpListener, std::net::TcpListener);

impl fmt::Debug for TcpListener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TcpListener")
            .field("addr", &self.local_addr().ok())
            .field("fd", &self.as_raw_fd())
            .finish()
    }
}

/// A TCP connection.
pub struct TcpStream {
    io: AsyncFd<std::net::TcpStream>,
}

impl TcpStream {
    /// Connects to `addr` without blocking the loop. A refused connection is
    /// `ErrorKind::ConnectionRefused`.
    pub async fn connect(addr: impl IntoSocketAddr) -> io::Result<TcpStream> {
        let addr = addr.into_socket_addr()?;
        let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
        Ok(TcpStream {
            io: sys::connect(socket, &addr.into()).await?,
        })
    }

    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.io.get_ref().peer_addr()
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.io.get_ref().local_addr()
    }

    /// `TCP_NODELAY`: send small writes at once instead of coalescing them (Nagle off).
    pub fn set_nodelay(&self, nodelay: bool) -> io::Result<()> {
        self.io.get_ref().set_nodelay(nodelay)
    }

    pub fn nodelay(&self) -> io::Result<bool> {
        self.io.get_ref().nodelay()
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
    pub fn from_std(stream: std::net::TcpStream) -> io::Result<TcpStream> {
        Ok(TcpStream {
            io: AsyncFd::new(stream)?,
        })
    }

    /// Adopts a TCP stream socket fd: checks that it is one (`InvalidInput` otherwise, and the fd
    /// is closed), makes it close-on-exec and non-blocking, and registers it.
    #[track_caller]
    pub fn from_owned_fd(fd: OwnedFd) -> io::Result<TcpStream> {
        sys::adopt_check(
            &fd,
            &Kind {
                api: "nodus::net::TcpStream::from_owned_fd",
                expected: "a TCP stream socket",
                domains: &[Domain::IPV4, Domain::IPV6],
                ty: Type::STREAM,
                listening: false,
            },
        )?;
        TcpStream::from_std(fd.into())
    }

    /// Adopts a connection accepted with `SOCK_NONBLOCK | SOCK_CLOEXEC` (here, or by a nodus
    /// cluster primary: the flag lives in the file description it shares, and `recvmsg` sets
    /// close-on-exec), so it is only registered: no `FIONBIO`.
    #[track_caller]
    pub(crate) fn from_nonblocking(fd: OwnedFd) -> io::Result<TcpStream> {
        Ok(TcpStream {
            io: AsyncFd::new_nonblocking(std::net::TcpStream::from(fd))?,
        })
    }

    /// Deregisters the socket and gives it back, still non-blocking.
    pub fn into_std(self) -> std::net::TcpStream {
        self.io.into_inner()
    }
}

socket_common!(TcpStream, std::net::TcpStream);

/// `accept4` with `SOCK_NONBLOCK | SOCK_CLOEXEC`: the new socket needs no `FIONBIO` of its own.
fn accept_nonblocking(listener: &std::net::TcpListener) -> io::Result<(OwnedFd, SocketAddr)> {
    use rustix::net::SocketFlags;
    let (fd, peer) =
        rustix::net::acceptfrom_with(listener, SocketFlags::NONBLOCK | SocketFlags::CLOEXEC)?;
    let peer = peer
        .and_then(|p| SocketAddr::try_from(p).ok())
        .ok_or_else(|| io::Error::other("accept4 gave no IP peer address"))?;
    Ok((fd, peer))
}
stream_io!(TcpStream, std::net::TcpStream);

impl fmt::Debug for TcpStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TcpStream")
            .field("addr", &self.local_addr().ok())
            .field("peer", &self.peer_addr().ok())
            .field("fd", &self.as_raw_fd())
            .finish()
    }
}

/// Sets `TCP_DEFER_ACCEPT` on `socket`: [`DEFER_ACCEPT_SECS`], or 0 (off).
pub(crate) fn set_defer_accept(socket: &impl AsRawFd, on: bool) -> io::Result<()> {
    let secs: libc::c_int = if on {
        DEFER_ACCEPT_SECS as libc::c_int
    } else {
        0
    };
    // SAFETY: the fd is borrowed from a live socket for the call; the option value points to a
    // `c_int` on this stack frame and its length is that of a `c_int`, as the kernel reads it.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_DEFER_ACCEPT,
            (&raw const secs).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Whether `TCP_DEFER_ACCEPT` is set on `socket`.
fn defer_accept_of(socket: &impl AsRawFd) -> io::Result<bool> {
    let mut secs: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: the fd is borrowed from a live socket for the call; the kernel writes at most `len`
    // bytes (the size of the `c_int` on this stack frame) and the new length into `len`.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_DEFER_ACCEPT,
            (&raw mut secs).cast(),
            &raw mut len,
        )
    };
    if rc == 0 {
        Ok(secs > 0)
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::future::poll_fn;
    use std::pin::pin;
    use std::rc::Rc;
    use std::task::Poll;
    use std::time::Duration;

    use super::{TcpListener, TcpStream};
    use crate::{sleep, spawn, timeout, yield_now};

    /// Polls `accept` once (it must be waiting) and drops it, as a timeout that fires does.
    async fn give_up_on(listener: &TcpListener) {
        let mut accept = pin!(listener.accept());
        poll_fn(|cx| {
            assert!(accept.as_mut().poll(cx).is_pending(), "nothing to accept");
            Poll::Ready(())
        })
        .await;
    }

    /// A task that gives up on accept again and again stays one stored waker: the same task's
    /// waker is not stored twice.
    #[test]
    fn a_task_giving_up_on_accept_10000_times_stays_one_waiter() {
        crate::Runtime::new().block_on(async {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            for i in 0..10_000 {
                give_up_on(&listener).await;
                assert_eq!(listener.io.waiters(), (1, 0), "after give-up {i}");
                // A new poll each time (and a fresh cooperative budget).
                yield_now().await;
            }
            for _ in 0..20 {
                assert!(timeout(1, listener.accept()).await.is_err());
            }
            assert_eq!(listener.io.waiters(), (1, 0));
        });
    }

    /// A waiter that gave up and now waits for something else is woken once by the next
    /// connection, spuriously, and forgotten then: the next connection does not wake it again.
    #[test]
    fn a_waiter_that_gave_up_is_woken_once_and_forgotten() {
        crate::Runtime::new().block_on(async {
            let listener = Rc::new(TcpListener::bind("127.0.0.1:0").unwrap());
            let addr = listener.local_addr().unwrap();
            let l = listener.clone();
            let polls = Rc::new(Cell::new(0u32));
            let p = polls.clone();
            let quitter = spawn(async move {
                give_up_on(&l).await;
                let mut other = pin!(sleep(Duration::from_secs(60)));
                poll_fn(|cx| {
                    p.set(p.get() + 1);
                    other.as_mut().poll(cx)
                })
                .await;
            });
            let l = listener.clone();
            let acceptor = spawn(async move {
                let a = l.accept().await.unwrap();
                let b = l.accept().await.unwrap();
                (a, b)
            });
            sleep(10).await;
            assert_eq!(polls.get(), 1);
            assert_eq!(
                listener.io.waiters(),
                (2, 0),
                "the quitter and the acceptor"
            );
            let _c1 = TcpStream::connect(addr).await.unwrap();
            let _c2 = TcpStream::connect(addr).await.unwrap();
            timeout(Duration::from_secs(5), acceptor)
                .await
                .expect("the acceptor was never woken")
                .unwrap();
            assert_eq!(listener.io.waiters(), (0, 0), "the quitter is forgotten");
            assert_eq!(polls.get(), 2, "the quitter is woken once, spuriously");
            quitter.abort();
        });
    }
}
