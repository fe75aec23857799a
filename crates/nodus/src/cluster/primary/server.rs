//! Listening sockets by server key, `queryServer` answers, and the accept loop of the
//! round-robin and least policies (what it accepts is handed out by `handoff`).
//!
//! Invariants:
//! - One `Server` per listening socket the primary holds; several keys may name it; a worker is
//!   one member of it however often it asks (one share of its connections). At most
//!   [`MAX_KEYS`] keys are kept at once (listeners, UDP sockets, reuse-port ports; a released
//!   one no longer counts): a `queryServer` for one more is refused with `EMFILE`, so a worker
//!   cannot spend the primary's fds. A pre-bound
//!   listener (`nodus run --node -l`, a socket systemd passed) serves every `queryServer` on its
//!   port whose address it covers ([`covers`]: no host asked, the same address, or the pre-bound
//!   one is its family's wildcard, `::` dual-stack covering IPv4 too; an explicit wildcard asked
//!   is an address like the others, so a v6-only `::` covers neither `0.0.0.0` nor a dual-stack
//!   `::`); under reuseport the worker's own socket is bound to the pre-bound address, not the
//!   one asked, and v6-only as the pre-bound socket is. An address on its port it does not cover
//!   gets a socket of its own and a warning, once per address. A pre-bound listener that no
//!   worker with a channel has asked for once every worker is first ready is said in a warning
//!   ([`warn_unclaimed`]): its connections wait for a worker that may never ask. A server whose
//!   policy is round-robin or least is accepted on by one task of the primary; a shared one is
//!   only duplicated into workers (never registered with the primary's reactor, so incoming
//!   connections do not wake the primary).
//! - A worker's TCP `listen` is bound as Node's own primary binds it ([`Bind`]): with no host,
//!   `::` (Node always sends `addressType` 4 then), falling back to `0.0.0.0` only when that
//!   cannot be bound for another reason than a busy port; an IPv6 socket is dual-stack unless the
//!   worker asked `ipv6Only`. Its `server.address()` is the socket's address (`::`, IPv6).
//! - A worker's `listen(path)` (`addressType` -1) is a Unix stream socket bound on that path
//!   once per key, as Node's primary binds it (the path as the worker sent it: a relative one is
//!   the primary's working directory's, which is the workers'). A path that exists, a stale
//!   socket file too, fails the bind with `EADDRINUSE`, answered as Node's primary answers it:
//!   nothing is removed first (the app or the operator removes a stale file). It is served under
//!   rr, least and shared as TCP is (accepted Unix connections handed out, or the listening
//!   socket duplicated); under reuseport it is shared, since Linux has no `SO_REUSEPORT` for Unix
//!   sockets. Its answer under rr and least carries no sockname, so Node's worker says the path
//!   as `server.address()`. Its file is removed when the primary closes the socket (a release,
//!   below, or [`stop_accepting`]), as libuv removes a pipe server's on close, and only while the
//!   path still names the socket bound (device and inode): never a newer one's. A path whose
//!   NUL byte leads it relative to the working directory (a Node worker's `listen('\0name')`
//!   arrives resolved, `CWD/\0name`, and Node's primary takes it relative again) names an
//!   abstract socket ([`unix_addr`]): bound as is, at the name's own length (no file; as libuv
//!   1.48 and later, Node 22 on, bind and connect one); a NUL anywhere else is `EINVAL`.
//! - Each listener the primary bound for its workers is counted by the live workers that hold
//!   it (`Proc::holds`: a `queryServer` answer gave it them, no `close` since), as Node's
//!   primary counts a handle's workers. The last holder's `close` (a Node worker's server
//!   closed, a nodus worker's `Listener` dropped) closes it at once ([`closed`]): its port is
//!   refused and free, its file removed, what was parked on it reset. A holder that leaves
//!   otherwise (its exit, or a `close` on its way out: asked to stop, or going down) leaves it
//!   to its slot's next worker, which asks again, so nothing is refused in between. Being
//!   ready does not mean that worker has asked yet (a Node worker is ready at its first
//!   `listening`, and may listen on its main port after more start-up; `--ready-after` may
//!   come before any), so the listener is kept until a worker asks for it again, until every
//!   slot its holders were of has had a ready, staying worker for a grace ([`orphan_grace`])
//!   without one asking, or has no worker to come ([`release_orphans`]; a task wakes when a
//!   grace ends), or until a worker's bind finds it in the way (`EADDRINUSE` against it,
//!   [`release_in_the_way`]: closed, and the bind tried again). The grace is the
//!   `ready_timeout`, the time the cluster gives a worker's start-up elsewhere (a reload waits
//!   that long for a new worker to be ready, a parked connection that long for a worker): a
//!   program still starting that long after it said it was ready is not waited for, and what
//!   was parked on the listener would have been reset by its own bound by then; a deploy that
//!   drops a port has it refused (and free) that long after its new workers are ready.
//!   Meanwhile no connection is refused: under rr and least the primary accepts and parks
//!   them (below: one accept batch, the rest wait in the kernel's backlog) for the worker that
//!   asks; a shared socket stays listening through the primary's copy, its connections in its
//!   backlog for the worker that gets a duplicate. Under reuseport the primary keeps no
//!   listener (only a port 0's resolved port, kept as long): its workers' sockets are their
//!   own, and a port none of them listens on is refused until one does. Pre-bound listeners
//!   are the operator's: never closed before the drain. Each
//!   release is one INFO line; the last [`MAX_KEYS`] released keys and addresses are kept
//!   (`State::released`) so a draining worker's connections on them still count
//!   (`conns`) and connections given back for them are closed without a complaint.
//! - A plain program gets listeners only under `shared` and `reuseport` (blocking, as systemd
//!   passes them); never the primary's own non-blocking accept socket.
//! - Reuse-port sockets are bound per worker and not kept: a socket nobody accepts on would
//!   swallow its share of connections. For a pre-bound address the primary keeps a socket bound
//!   with `SO_REUSEPORT` (v6-only as the pre-bound one) but not listening (only listening sockets
//!   share the connections): the port (the one port 0 resolved to) stays taken, for the workers
//!   alone, while none of them holds it, until the drain begins.
//! - Accepted connections wait for a worker ("parked": none listening yet, all at their in-flight
//!   cap or, under rr, none free nor taking its handoffs, or no fd to hand them over with) only
//!   up to one accept batch plus what dead, refusing or closing workers left or gave back, and
//!   within the bounds of `parked` (a cap, and `ready_timeout` each, then a reset); while any
//!   are parked and no worker has room, the
//!   primary does not accept and the kernel's backlog holds newcomers. A turn of the accept task
//!   hands out parked connections or accepts new ones, never both: accepting does not take the
//!   fds a handoff of parked ones needs.
//! - When a shutdown's drain begins ([`stop_accepting`]) the primary closes the sockets it accepts
//!   on, as Node's `server.close()` does: the kernel refuses new connections and resets those
//!   left in its backlog (a socket a service manager passed in stays open there, its backlog
//!   kept for the next start). Parked connections are reset then, and any parked later on arrival;
//!   connections handed to workers drain with them. No new listener is bound after that. A
//!   shared socket's copy in the primary is closed then too: the socket closes (and refuses)
//!   once the draining workers have closed theirs, instead of queueing connections nobody will
//!   accept until the primary exits.
//! - A Node worker's `dgram` bind (`addressType` `udp4`/`udp6`) gets a duplicate of one UDP
//!   socket per key under every policy, as Node's primary shares it (datagrams cannot be handed
//!   over): bound at the first such `queryServer`, the primary's copy kept (never read: what
//!   arrives while no worker reads waits in the socket's buffer) until the drain begins, or
//!   until it is released as a listener is (its last holder's `close`, and the rest above).
//! - A worker asked to drain, or that said it is going down, is never made a member again: its
//!   `queryServer` is refused with `ESHUTDOWN` under every policy.
//! - Connections are accepted non-blocking (the flag lives in the file description the worker
//!   shares), up to [`ACCEPT_BATCH`] per wake-up, and handed out per worker in one message
//!   (`handoff`). After a failed accept, or a handoff that found no fd, the accept task pauses
//!   [`RETRY_PAUSE`].

use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::future::poll_fn;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use super::handoff::{dispatch, has_room};
use super::parked::{Conn, MAX_PARKED, Parked};
use super::proc::Proc;
use super::{Policy, State};
use crate::cluster::board::Board;
use crate::cluster::protocol::{Incoming, NODE_CLUSTER, Nodus, QueryReply, SockName, server_key};
use crate::io::AsyncFd;
use crate::ipc::SendHandle;
use crate::net::{ListenOptions, TcpListener};
use crate::process::Command;

/// Connections accepted per wake-up of the accept task before they are handed out.
const ACCEPT_BATCH: usize = 64;

/// A worker taking connections from a server.
#[derive(Clone)]
pub(super) struct Member {
    pub(super) proc: Rc<Proc>,
    /// The key it asked with.
    pub(super) key: String,
    /// A nodus worker: takes `newconns` batches.
    pub(super) batches: bool,
    /// The most connections it may have handed and not taken: its `queryServer`'s `window`
    /// (1 to [`MAX_IN_FLIGHT`](super::balance::MAX_IN_FLIGHT), the default).
    pub(super) window: u64,
}

/// What a server listens on: a TCP address, or a Unix socket (Node's `listen(path)`): a path,
/// or a name in Linux's abstract namespace.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Addr {
    Tcp(SocketAddr),
    /// As the worker asked it (a relative path is the primary's working directory's, which is
    /// the workers' too, as under Node's primary).
    Unix(PathBuf),
    /// An abstract socket's name, without its leading NUL (`listen('\0name')`): no file.
    Abstract(Vec<u8>),
}

impl Addr {
    /// The TCP address, if it is one.
    pub(super) fn tcp(&self) -> Option<SocketAddr> {
        match self {
            Addr::Tcp(a) => Some(*a),
            Addr::Unix(_) | Addr::Abstract(_) => None,
        }
    }

    /// A Unix socket's address as `/proc/net/unix` shows it: the path, or `@` and an abstract
    /// name with its NULs as `@` (the kernel's, and `ss`'s, way).
    pub(super) fn unix_shown(&self) -> Option<String> {
        match self {
            Addr::Tcp(_) => None,
            Addr::Unix(path) => Some(path.to_string_lossy().into_owned()),
            Addr::Abstract(name) => {
                let name: Vec<u8> = name
                    .iter()
                    .map(|&b| if b == 0 { b'@' } else { b })
                    .collect();
                Some(format!("@{}", String::from_utf8_lossy(&name)))
            }
        }
    }

    /// Whether a socket bound on `self` and one bound on `other` (both TCP, or both Unix) may
    /// be in each other's way: the same port on the same address or a wildcard (a port taken
    /// on one address makes a wildcard bind of it fail, and the other way round), or the same
    /// path or name.
    fn clashes(&self, other: &Addr) -> bool {
        match (self, other) {
            (Addr::Tcp(a), Addr::Tcp(b)) => {
                let (x, y) = (a.ip().to_canonical(), b.ip().to_canonical());
                a.port() == b.port() && (x.is_unspecified() || y.is_unspecified() || x == y)
            }
            _ => self == other,
        }
    }
}

impl std::fmt::Display for Addr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Addr::Tcp(a) => a.fmt(f),
            Addr::Unix(p) => write!(f, "unix:{}", p.display()),
            Addr::Abstract(_) => write!(f, "unix:{}", self.unix_shown().unwrap_or_default()),
        }
    }
}

enum Sock {
    /// The primary accepts (round-robin, least); `None` once it stopped (released, or
    /// [`stop_accepting`]: the socket is closed).
    Accepting(RefCell<Option<AsyncFd<OwnedFd>>>),
    /// Workers accept on duplicates of it; `None` once released or the primary stopped accepting
    /// (its copy is closed: the socket closes when the last worker closes its own).
    Shared(RefCell<Option<OwnedFd>>),
    /// Reuse-port: each worker binds (gets) a socket of its own; the primary holds the port with
    /// a socket bound but not listening (`None` once it stopped accepting).
    Released(RefCell<Option<socket2::Socket>>),
}

pub(super) struct Server {
    pub addr: Addr,
    sock: Sock,
    /// A Unix socket's file as bound (device, inode): removed when the primary closes the socket
    /// if the path still names it (taken then).
    socket_file: Cell<Option<(u64, u64)>>,
    /// Workers taking connections from this server, with the key each asked with.
    pub(super) members: RefCell<Vec<Member>>,
    pub(super) cursor: Cell<usize>,
    pub parked: Parked,
    accept_waker: RefCell<Option<Waker>>,
    /// A pre-bound listener a worker's `queryServer` named (see [`warn_unclaimed`]).
    claimed: Cell<bool>,
    /// An IPv6 socket with `IPV6_V6ONLY` (a wildcard one takes no IPv4 connection); kept for the
    /// workers' sockets under reuseport.
    ipv6_only: bool,
    /// The addresses on this pre-bound listener's port it did not cover, each warned about once.
    uncovered: RefCell<Vec<IpAddr>>,
}

impl Server {
    /// Wraps a listener bound before the workers started.
    pub fn prebound(st: &Rc<State>, listener: TcpListener) -> io::Result<Rc<Server>> {
        Server::tcp(st, listener.into_std(), st.config.policy)
    }

    fn tcp(
        st: &Rc<State>,
        listener: std::net::TcpListener,
        policy: Policy,
    ) -> io::Result<Rc<Server>> {
        let addr = listener.local_addr()?;
        let ipv6_only = addr.is_ipv6() && socket2::SockRef::from(&listener).only_v6()?;
        if st.config.defer_accept {
            crate::net::tcp::set_defer_accept(&listener, true)?;
        }
        Server::new(st, listener.into(), Addr::Tcp(addr), ipv6_only, policy)
    }

    /// A Unix socket bound on `addr`, a path (`bind` fails with `EADDRINUSE` if the path exists,
    /// a stale socket file too: Node's primary does not remove it either) or an abstract name
    /// (no file; `EADDRINUSE` while another socket has the name). Under reuseport it is shared:
    /// Linux has no `SO_REUSEPORT` for Unix sockets.
    fn unix(st: &Rc<State>, addr: &Addr) -> io::Result<Rc<Server>> {
        use std::os::linux::net::SocketAddrExt;
        use std::os::unix::net::{SocketAddr as UnixAddr, UnixListener};
        let (listener, file) = match addr {
            Addr::Unix(path) => {
                let listener = UnixListener::bind(path)?;
                let file = std::fs::symlink_metadata(path)?;
                (listener, Some((file.dev(), file.ino())))
            }
            Addr::Abstract(name) => (
                UnixListener::bind_addr(&UnixAddr::from_abstract_name(name)?)?,
                None,
            ),
            Addr::Tcp(_) => unreachable!("a Unix socket's address"),
        };
        let policy = match st.config.policy {
            Policy::ReusePort => Policy::Shared,
            policy => policy,
        };
        let server = Server::new(st, listener.into(), addr.clone(), false, policy)?;
        server.socket_file.set(file);
        Ok(server)
    }

    fn new(
        st: &Rc<State>,
        listener: OwnedFd,
        addr: Addr,
        ipv6_only: bool,
        policy: Policy,
    ) -> io::Result<Rc<Server>> {
        let sock = match policy {
            Policy::RoundRobin | Policy::Least => {
                socket2::SockRef::from(&listener).set_nonblocking(true)?;
                Sock::Accepting(RefCell::new(Some(AsyncFd::new(listener)?)))
            }
            // Shared duplicates share the file's flags. Workers with a channel (Node, nodus)
            // get it non-blocking, as Node's own primary makes it: a Node worker does not set
            // the flag on a handle it receives (a Unix socket's, at least), and two workers that
            // wake for one connection would leave the loser blocked in `accept` (its loop stuck,
            // its `disconnect` unread, until the next connection or SIGTERM). A plain program
            // gets it blocking, as a service manager passes sockets.
            Policy::Shared => {
                socket2::SockRef::from(&listener).set_nonblocking(st.config.command.ipc)?;
                Sock::Shared(RefCell::new(Some(listener)))
            }
            // Bound before the listener is closed (at the end of this function): the port is
            // never free.
            Policy::ReusePort => {
                let addr = addr.tcp().ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::InvalidInput,
                        "no SO_REUSEPORT for Unix sockets",
                    )
                })?;
                Sock::Released(RefCell::new(Some(hold_port(addr, ipv6_only)?)))
            }
        };
        let server = Rc::new(Server {
            addr,
            sock,
            socket_file: Cell::new(None),
            members: RefCell::default(),
            cursor: Cell::new(0),
            // A parked connection waits as long as a new worker may take to be ready: that
            // covers a restart (its backoff, 10 s at most by default) and the start-up.
            parked: Parked::new(MAX_PARKED, st.config.ready_timeout),
            accept_waker: RefCell::new(None),
            claimed: Cell::new(false),
            ipv6_only,
            uncovered: RefCell::default(),
        });
        if matches!(server.sock, Sock::Accepting(_)) {
            let (s, srv) = (st.clone(), server.clone());
            crate::task::spawn_named("cluster:accept", async move { accept_loop(&s, &srv).await })
                .detach();
        }
        Ok(server)
    }

    pub fn wake_accept(&self) {
        if let Some(w) = self.accept_waker.borrow_mut().take() {
            w.wake();
        }
    }

    /// The socket the primary accepts on, until it stopped.
    fn accepting(&self) -> Option<std::cell::Ref<'_, AsyncFd<OwnedFd>>> {
        let Sock::Accepting(listener) = &self.sock else {
            return None;
        };
        std::cell::Ref::filter_map(listener.borrow(), Option::as_ref).ok()
    }

    /// Closes the primary's socket (the one it accepts on, or its copy of a shared one) and
    /// resets what is parked. A Unix socket's file is removed, as libuv removes a pipe server's
    /// on close (only while the path still names that socket).
    fn stop(&self) {
        if let (Addr::Unix(path), Some(bound)) = (&self.addr, self.socket_file.take())
            && std::fs::symlink_metadata(path).is_ok_and(|m| (m.dev(), m.ino()) == bound)
            && let Err(e) = std::fs::remove_file(path)
        {
            tracing::warn!(target: "nodus::cluster", "cannot remove {}: {e}", path.display());
        }
        let listener = match &self.sock {
            Sock::Accepting(listener) => listener,
            Sock::Shared(copy) => {
                copy.borrow_mut().take();
                return;
            }
            Sock::Released(hold) => {
                hold.borrow_mut().take();
                return;
            }
        };
        if listener.borrow_mut().take().is_none() {
            return;
        }
        let n = self.parked.close();
        if n > 0 {
            tracing::info!(
                target: "nodus::cluster",
                "{} to {} no worker had taken: reset",
                super::count(n, "connection"),
                self.addr
            );
        }
        self.wake_accept();
    }

    /// Removes `proc` from the members (it closes, drains or died). Parked connections may go to
    /// those left (a member that is not ready takes connections once no member is).
    pub fn remove_member(&self, proc: &Proc) {
        self.members
            .borrow_mut()
            .retain(|m| m.proc.unique != proc.unique);
        if !self.parked.is_empty() {
            self.wake_accept();
        }
    }
}

/// Whether a `queryServer` is a Node worker's `dgram` bind (`addressType` `udp4` or `udp6`).
fn is_datagram(m: &Incoming<'_>) -> bool {
    matches!(
        m.address_type.as_ref().and_then(|v| v.as_str()),
        Some("udp4" | "udp6")
    )
}

/// The path of a `queryServer` for a Unix socket (Node's `listen(path)`: `addressType` and
/// `port` -1).
fn pipe_path<'m>(m: &'m Incoming<'_>) -> Option<&'m Path> {
    let pipe = m.address_type.as_ref().and_then(|v| v.as_i64()) == Some(-1);
    m.address.as_deref().filter(|_| pipe).map(Path::new)
}

/// The Unix socket a pipe `queryServer` names: its path, or a name in Linux's abstract namespace
/// (a leading NUL, `listen('\0name')`). A Node worker resolves what it listens on against its
/// working directory (`path.resolve`), so `'\0name'` arrives as `CWD/\0name`; Node's primary
/// takes it relative to its own working directory (the workers') again, where the NUL leads:
/// so does this. A NUL anywhere else names no socket (`InvalidInput`).
fn unix_addr(path: &Path) -> io::Result<Addr> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_os_str().as_bytes();
    if !bytes.contains(&0) {
        return Ok(Addr::Unix(path.to_owned()));
    }
    let cwd = std::env::current_dir()?;
    let cwd = cwd.as_os_str().as_bytes();
    let relative = bytes
        .strip_prefix(cwd)
        .and_then(|rest| {
            if cwd.ends_with(b"/") {
                Some(rest)
            } else {
                rest.strip_prefix(b"/")
            }
        })
        .filter(|rest| rest.first() == Some(&0));
    match relative.or_else(|| Some(bytes).filter(|b| b.first() == Some(&0))) {
        Some(name) => Ok(Addr::Abstract(name[1..].to_vec())),
        None => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "a NUL byte in a Unix socket path: only an abstract socket's name may hold one, \
             leading (listen('\\0name'), relative to the working directory)",
        )),
    }
}

/// The address a TCP or UDP `queryServer` asks for (a host name is resolved by the worker before
/// it asks). Node sends `null` for "any": a TCP `listen` with no host (always `addressType` 4) is
/// `::`, bound as [`Bind`] says (dual-stack, `0.0.0.0` if IPv6 cannot be bound); a `dgram` bind
/// is its type's wildcard (`udp4`: `0.0.0.0`). Anything else that is not a pipe ([`pipe_path`])
/// is refused with `EAFNOSUPPORT`: the primary must not bind "any" in its place.
fn requested_addr(m: &Incoming<'_>) -> io::Result<SocketAddr> {
    let ip = match m.address.as_deref() {
        Some(a) => a.parse::<IpAddr>().map_err(|_| {
            io::Error::new(
                io::ErrorKind::Unsupported,
                format!("{a:?} is not an IP address"),
            )
        })?,
        None if m.address_type.as_ref().and_then(|v| v.as_str()) == Some("udp4") => {
            IpAddr::V4(Ipv4Addr::UNSPECIFIED)
        }
        None => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    };
    let port = m.port.unwrap_or(0);
    let port = u16::try_from(port).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("port {port} out of range"),
        )
    })?;
    Ok(SocketAddr::new(ip, port))
}

/// Node's `UV_TCP_IPV6ONLY` bind flag (a `queryServer`'s `flags`: `listen({ ipv6Only: true })`).
const UV_TCP_IPV6ONLY: u64 = 1;

/// How a worker's TCP `listen` is bound, as Node's own primary binds it (`createServerHandle`
/// and `setupListenHandle` in Node's `net`).
#[derive(Clone, Copy)]
struct Bind {
    /// `ipv6Only`: an IPv6 socket takes IPv6 connections only (otherwise it is dual-stack).
    ipv6_only: bool,
    /// No host was named (`::` asked): if `::` cannot be bound (no IPv6), `0.0.0.0` is. Not for a
    /// busy port: libuv reports that at `listen`, where Node does not fall back.
    any: bool,
    /// `TCP_DEFER_ACCEPT` ([`Config::defer_accept`](super::Config::defer_accept)).
    defer_accept: bool,
}

impl Bind {
    fn of(m: &Incoming<'_>, st: &State) -> Bind {
        Bind {
            ipv6_only: m.flags.unwrap_or(0) & UV_TCP_IPV6ONLY != 0,
            any: m.address.is_none(),
            defer_accept: st.config.defer_accept,
        }
    }

    /// A listening socket on `addr` (`reuse_port`: with `SO_REUSEPORT`).
    fn listen(self, addr: SocketAddr, reuse_port: bool) -> io::Result<TcpListener> {
        let options = ListenOptions {
            reuse_port,
            ipv6_only: self.ipv6_only,
            defer_accept: self.defer_accept,
            ..ListenOptions::default()
        };
        match TcpListener::bind_with(addr, options) {
            Err(e) if self.any && e.kind() != io::ErrorKind::AddrInUse => {
                let v4 = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), addr.port());
                TcpListener::bind_with(v4, options)
            }
            bound => bound,
        }
    }
}

/// A socket bound to `addr` with `SO_REUSEPORT`, not listening: it keeps the port from anyone
/// but this user's reuse-port sockets (it sets no `SO_REUSEADDR`, which would let others bind
/// it), and takes no connection. An IPv6 one is `ipv6_only` as the pre-bound socket was.
fn hold_port(addr: SocketAddr, ipv6_only: bool) -> io::Result<socket2::Socket> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    socket.set_reuse_port(true)?;
    if addr.is_ipv6() {
        // As the workers' sockets are bound: a dual-stack one holds the IPv4 side of the port too.
        socket.set_only_v6(ipv6_only)?;
    }
    socket.bind(&addr.into())?;
    Ok(socket)
}

/// Finds the server a key names, or makes it (`make`: binds it, or claims a pre-bound one).
fn server_for(
    st: &Rc<State>,
    key: &str,
    make: impl FnOnce() -> io::Result<Rc<Server>>,
) -> io::Result<Rc<Server>> {
    if let Some(s) = st.servers.borrow().get(key) {
        return Ok(s.clone());
    }
    if st.accepting_stopped.get() {
        return Err(io::Error::other("the cluster primary is shutting down"));
    }
    let server = make()?;
    st.servers
        .borrow_mut()
        .insert(key.to_owned(), server.clone());
    Ok(server)
}

/// Whether a pre-bound listener on `bound` (`ipv6_only`: `IPV6_V6ONLY` set) serves a worker's
/// `listen` on `asked` (bound as `bind` says): it takes every connection the worker's own socket
/// would. The same port, and no host asked (`bind.any`: the operator's address wins), or:
/// - a named address: the same one, or `bound` is the wildcard of its family (or `::` dual-stack,
///   and `asked` is IPv4);
/// - an explicit wildcard: `bound` is the wildcard of its family, or `::` dual-stack for
///   `0.0.0.0`; for `::` (dual-stack unless `ipv6Only`) `bound` is dual-stack too unless the
///   worker asked `ipv6Only`.
///
/// An IPv4-mapped IPv6 address counts as its IPv4 one.
fn covers(bound: SocketAddr, ipv6_only: bool, asked: SocketAddr, bind: Bind) -> bool {
    let (b, a) = (bound.ip().to_canonical(), asked.ip().to_canonical());
    let dual_stack = b.is_ipv6() && b.is_unspecified() && !ipv6_only;
    // `bound` takes every address of `a`'s family.
    let family = b.is_unspecified() && (b.is_ipv4() == a.is_ipv4() || (dual_stack && a.is_ipv4()));
    bound.port() == asked.port()
        && (bind.any
            || if a.is_unspecified() {
                family && (a.is_ipv4() || bind.ipv6_only || dual_stack)
            } else {
                a == b || family
            })
}

/// The pre-bound listener a worker's `queryServer` for `addr` (bound as `bind` says) gets
/// instead of a new socket (one that [`covers`] it), marked claimed. A pre-bound listener on the
/// same port that does not cover `addr` is warned about, once per address: the worker gets a
/// socket of its own.
fn claim_prebound(st: &State, proc: &Proc, addr: SocketAddr, bind: Bind) -> Option<Rc<Server>> {
    let prebound = st.prebound.borrow();
    if let Some((_, server)) = prebound.iter().find(|(_, s)| {
        s.addr
            .tcp()
            .is_some_and(|b| covers(b, s.ipv6_only, addr, bind))
    }) {
        server.claimed.set(true);
        return Some(server.clone());
    }
    for (name, server) in prebound
        .iter()
        .filter(|(_, s)| s.addr.tcp().is_some_and(|b| b.port() == addr.port()))
    {
        let mut uncovered = server.uncovered.borrow_mut();
        if uncovered.contains(&addr.ip()) {
            continue;
        }
        uncovered.push(addr.ip());
        tracing::warn!(
            target: "nodus::cluster",
            "worker {} (pid {}) listens on {addr}, on the port of {} ({name}, bound before the \
             workers started) but on an address that one does not cover (it serves a listen with no \
             host, its own address, and as a wildcard its family's, IPv4 too as a dual-stack \
             [::]): the worker gets a socket of its own",
            proc.slot, proc.pid, server.addr
        );
    }
    None
}

/// Once every worker is first ready: a warning for each pre-bound listener (`nodus run --node
/// -l`, a socket systemd passed) that no worker's `queryServer` named, when the workers speak the
/// cluster protocol (a plain program gets them all as fds). Its connections wait for a worker
/// that never asks, so the mismatch (the program listens on another port) is said, once.
pub(super) fn warn_unclaimed(st: &State) {
    if !st.config.command.ipc {
        return;
    }
    for (name, server) in st.prebound.borrow().iter() {
        let Some(addr) = server.addr.tcp().filter(|_| !server.claimed.get()) else {
            continue;
        };
        let fate = match server.sock {
            Sock::Accepting(_) => format!(
                "accepted connections wait for one and are reset after {:?}",
                st.config.ready_timeout
            ),
            _ => "connections wait in its backlog".to_owned(),
        };
        tracing::warn!(
            target: "nodus::cluster",
            "no worker listens on {} ({name}, bound before the workers started; a worker's listen \
             on port {} would take it, on any host or an address it covers): {fate}",
            addr,
            addr.port()
        );
    }
}

/// Answers a worker's `queryServer`.
pub(super) fn query(st: &Rc<State>, proc: &Rc<Proc>, m: &Incoming<'_>) {
    let key = server_key(m);
    let Some(ack) = m.seq else { return };
    // A worker that does not read its answers gets neither an answer nor a listener.
    if !proc.may_answer() {
        return;
    }
    let reply = |errno: Option<String>, sockname: Option<SockName>| QueryReply {
        cmd: NODE_CLUSTER,
        errno,
        key: key.clone(),
        ack,
        data: None,
        sockname,
        seq: st.next_seq(),
    };
    let pipe = pipe_path(m);
    // A Unix socket is shared under reuseport (no `SO_REUSEPORT` for Unix sockets).
    let reuse_port = st.config.policy == Policy::ReusePort && !is_datagram(m) && pipe.is_none();
    // A reuse-port socket is the worker's: the primary keeps an entry only to resolve port 0.
    let keeps_entry = !reuse_port || requested_addr(m).is_ok_and(|a| a.port() == 0);
    let answer = || -> io::Result<Answer> {
        if proc.drained.get() || proc.going_down.get() {
            // A worker on its way out gets no new listener: as a member it would be handed
            // connections (or under shared and reuseport, take them from a queue) it cannot
            // serve.
            return Err(io::Error::from_raw_os_error(libc::ESHUTDOWN));
        }
        if keeps_entry && !key_room(st, &key) {
            return Err(io::Error::new(
                io::ErrorKind::QuotaExceeded,
                format!("the cluster primary keeps at most {MAX_KEYS} listeners for its workers"),
            ));
        }
        if is_datagram(m) {
            // UDP is connectionless: every policy shares one socket, as Node's primary does.
            let addr = requested_addr(m)?;
            return datagram_copy(st, &key, addr, m.flags.unwrap_or(0)).map(Answer::Fd);
        }
        if let Some(path) = pipe {
            let addr = unix_addr(path)?;
            let server = server_for(st, &key, || Server::unix(st, &addr))?;
            return join(proc, m, &key, &server);
        }
        let (addr, bind) = (requested_addr(m)?, Bind::of(m, st));
        if reuse_port {
            // A pre-bound port is only held: the worker binds a socket of its own on it, on the
            // pre-bound address (the operator's, v6-only or dual-stack as held), not the one
            // asked.
            let (addr, bind) = claim_prebound(st, proc, addr, bind)
                .and_then(|server| {
                    let held = Bind {
                        ipv6_only: server.ipv6_only,
                        any: false,
                        ..bind
                    };
                    Some((server.addr.tcp()?, held))
                })
                .unwrap_or((addr, bind));
            return reuseport_socket(st, &key, addr, bind).map(Answer::Fd);
        }
        let server = server_for(st, &key, || match claim_prebound(st, proc, addr, bind) {
            Some(s) => Ok(s),
            None => Server::tcp(st, bind.listen(addr, false)?.into_std(), st.config.policy),
        })?;
        join(proc, m, &key, &server)
    };
    let mut result = answer();
    // Our own listener that no worker holds any more (its holders left, and no worker asked
    // for it again yet) may be what the address is taken by.
    if result
        .as_ref()
        .is_err_and(|e| e.kind() == io::ErrorKind::AddrInUse)
        && release_in_the_way(st, proc, m)
    {
        result = answer();
    }
    if result.is_ok() {
        proc.gave_listener(&key);
        st.orphans.borrow_mut().remove(&key);
    }
    let Some(channel) = &proc.channel else { return };
    let sent = match result {
        // A Unix socket has no sockname: Node's worker then says its path as `server.address()`.
        Ok(Answer::Member(local)) => channel.send(&reply(
            None,
            local.map(|local| SockName {
                address: local.ip().to_string(),
                family: if local.is_ipv4() { "IPv4" } else { "IPv6" },
                port: local.port(),
            }),
        )),
        Ok(Answer::Fd(fd)) => channel.send_handle(&reply(None, None), SendHandle::fd(fd)),
        Err(e) => {
            let what = match pipe {
                Some(path) => match unix_addr(path).ok().and_then(|a| a.unix_shown()) {
                    Some(shown) => format!("unix socket {shown}"),
                    None => format!("unix socket {path:?}"),
                },
                None => format!(
                    "{:?} port {}",
                    m.address.as_deref().unwrap_or("any"),
                    m.port.unwrap_or(0)
                ),
            };
            if e.raw_os_error() == Some(libc::ESHUTDOWN) {
                tracing::warn!(
                    target: "nodus::cluster",
                    "worker {} (pid {}) asked to listen on {what} while stopping: refused",
                    proc.slot, proc.pid
                );
            } else {
                tracing::error!(
                    target: "nodus::cluster",
                    "worker {} (pid {}) cannot listen on {what}: {e}",
                    proc.slot, proc.pid
                );
            }
            // Node's workers expect a negative libuv errno.
            let raw = match e.kind() {
                io::ErrorKind::Unsupported => libc::EAFNOSUPPORT,
                io::ErrorKind::InvalidInput => libc::EINVAL,
                io::ErrorKind::QuotaExceeded => libc::EMFILE,
                _ => e.raw_os_error().unwrap_or(libc::EIO),
            };
            let errno = format!("{}", -raw);
            channel.send(&reply(Some(errno), None))
        }
    };
    if let Err(e) = sent {
        tracing::debug!(target: "nodus::cluster", "cannot answer queryServer: {e}");
    }
}

/// A `queryServer`'s answer.
enum Answer {
    /// The worker is a member of a server the primary accepts on (round-robin, least): its TCP
    /// address, none for a Unix socket.
    Member(Option<SocketAddr>),
    /// A socket of the worker's own to listen on: a shared socket's duplicate, a reuse-port
    /// socket, a UDP socket's duplicate.
    Fd(OwnedFd),
}

/// `proc` joins `server`: a duplicate of a shared socket, or membership of one the primary
/// accepts on (a worker that asks again, with the same key or another the server covers, is a
/// member once: one share of the connections).
fn join(proc: &Rc<Proc>, m: &Incoming<'_>, key: &str, server: &Server) -> io::Result<Answer> {
    match &server.sock {
        Sock::Shared(copy) => Ok(Answer::Fd(shared_copy(copy)?)),
        Sock::Released(_) => unreachable!("released sockets exist only under reuseport"),
        Sock::Accepting(_) => {
            if m.nodus == Some(1) && m.board == Some(1) {
                give_board(proc);
            }
            let mut members = server.members.borrow_mut();
            if !members
                .iter()
                .any(|member| member.proc.unique == proc.unique)
            {
                members.push(Member {
                    proc: proc.clone(),
                    key: key.to_owned(),
                    batches: m.nodus == Some(1),
                    window: m.window.map_or(super::balance::MAX_IN_FLIGHT, |w| {
                        w.clamp(1, super::balance::MAX_IN_FLIGHT)
                    }),
                });
            }
            drop(members);
            server.wake_accept();
            Ok(Answer::Member(server.addr.tcp()))
        }
    }
}

/// Server keys the primary keeps for its workers at most (a listener bound, a UDP socket, a
/// reuse-port key's port 0 resolved): a worker asking for more (a `listen` on port 0 in a loop)
/// gets `EMFILE`, and the primary's fds and memory stay its own.
pub(super) const MAX_KEYS: usize = 1024;

/// Whether `key` is kept already, or there is room for one more key.
fn key_room(st: &State, key: &str) -> bool {
    let (servers, datagrams, ports) = (
        st.servers.borrow(),
        st.datagrams.borrow(),
        st.reuseport_ports.borrow(),
    );
    servers.contains_key(key)
        || datagrams.contains_key(key)
        || ports.contains_key(key)
        || servers.len() + datagrams.len() + ports.len() < MAX_KEYS
}

/// A duplicate of the UDP socket for `key`, bound on first use with the worker's libuv flags
/// (`UV_UDP_IPV6ONLY` 1, `UV_UDP_REUSEADDR` 4), as Node's primary binds a `dgram` shared handle.
/// The worker's libuv makes its copy non-blocking (the flag lives in the shared description).
fn datagram_copy(st: &Rc<State>, key: &str, addr: SocketAddr, flags: u64) -> io::Result<OwnedFd> {
    if st.accepting_stopped.get() {
        return Err(io::Error::other("the cluster primary is shutting down"));
    }
    let mut datagrams = st.datagrams.borrow_mut();
    let socket = match datagrams.entry(key.to_owned()) {
        std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
        std::collections::hash_map::Entry::Vacant(e) => {
            let socket = socket2::Socket::new(
                socket2::Domain::for_address(addr),
                socket2::Type::DGRAM,
                Some(socket2::Protocol::UDP),
            )?;
            if flags & 4 != 0 {
                socket.set_reuse_address(true)?;
            }
            if addr.is_ipv6() && flags & 1 != 0 {
                socket.set_only_v6(true)?;
            }
            socket.bind(&addr.into())?;
            e.insert(socket.into())
        }
    };
    socket.as_fd().try_clone_to_owned()
}

/// Sends a nodus worker its board (once), before the `queryServer` answer, so it is mapped before
/// any `newconns` arrives. Without one (no memfd here) the worker sends `took` messages.
fn give_board(proc: &Proc) {
    let Some(channel) = &proc.channel else { return };
    if proc.board.get().is_some() {
        return;
    }
    let sent = Board::create().and_then(|(board, fd)| {
        channel
            .send_fds(&Nodus::act("board"), vec![Rc::new(fd)])
            .map_err(|e| io::Error::other(e.to_string()))?;
        Ok(board)
    });
    match sent {
        Ok(board) => {
            let _ = proc.board.set(board);
        }
        Err(e) => {
            tracing::debug!(target: "nodus::cluster", "worker {}: no board ({e}); it sends `took`", proc.slot)
        }
    }
}

/// A fresh `SO_REUSEPORT` socket for one worker, bound as `bind` says. Port 0 is resolved once
/// per key so every worker shares the port.
fn reuseport_socket(
    st: &Rc<State>,
    key: &str,
    addr: SocketAddr,
    bind: Bind,
) -> io::Result<OwnedFd> {
    let mut addr = addr;
    if addr.port() == 0
        && let Some(port) = st.reuseport_ports.borrow().get(key)
    {
        addr.set_port(*port);
    }
    let l = bind.listen(addr, true)?;
    if addr.port() == 0 {
        let port = l.local_addr()?.port();
        st.reuseport_ports.borrow_mut().insert(key.to_owned(), port);
    }
    Ok(OwnedFd::from(l.into_std()))
}

/// The socket-activation variables, removed from every worker's environment (`Proc::spawn`)
/// before [`pass_listeners`] sets them for the cluster's own listeners.
pub(super) const LISTEN_VARS: [&str; 3] = ["LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES"];

/// Gives a plain program the primary's listeners the systemd way: fds 3.. with `LISTEN_FDS` and
/// `LISTEN_FDNAMES` (`LISTEN_PID` must be the program's own pid: a launcher sets it), blocking as
/// systemd passes them; with no listener to pass, none of the variables (an inherited
/// `LISTEN_FDS` meant for another process never reaches a worker). Under `reuseport` each worker gets fresh sockets bound to the same
/// addresses; under `shared` a duplicate of the one socket. Round-robin and least have nothing to
/// pass (the primary accepts; `Primary::start` refuses them for plain programs).
pub(super) fn pass_listeners(st: &Rc<State>, cmd: &mut Command) -> io::Result<()> {
    let prebound = st.prebound.borrow();
    let mut names = Vec::with_capacity(prebound.len());
    for (i, (name, server)) in prebound.iter().enumerate() {
        let fd: OwnedFd = match (&server.sock, st.config.policy) {
            (_, Policy::ReusePort) => {
                let options = ListenOptions {
                    reuse_port: true,
                    ipv6_only: server.ipv6_only,
                    defer_accept: st.config.defer_accept,
                    ..ListenOptions::default()
                };
                let addr = server.addr.tcp().ok_or_else(|| {
                    io::Error::new(io::ErrorKind::InvalidInput, "a pre-bound listener is TCP")
                })?;
                let l = TcpListener::bind_with(addr, options)?.into_std();
                l.set_nonblocking(false)?;
                OwnedFd::from(l)
            }
            (Sock::Shared(copy), _) => shared_copy(copy)?,
            // The primary's own non-blocking accept socket is never passed: `Primary::start`
            // refuses round-robin and least for plain programs.
            (Sock::Accepting(_), policy) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "policy {} cannot pass a listener to a plain program",
                        policy.name()
                    ),
                ));
            }
            (Sock::Released(_), _) => unreachable!("released sockets exist only under reuseport"),
        };
        cmd.pass_fd(3 + i as i32, fd);
        names.push(name.as_str());
    }
    if !prebound.is_empty() {
        cmd.env("LISTEN_FDS", prebound.len().to_string())
            .env("LISTEN_FDNAMES", names.join(":"));
    }
    Ok(())
}

/// A duplicate of a shared socket for a worker, while the primary has not stopped accepting.
fn shared_copy(copy: &RefCell<Option<OwnedFd>>) -> io::Result<OwnedFd> {
    copy.borrow()
        .as_ref()
        .ok_or_else(|| io::Error::other("the cluster primary stopped accepting"))?
        .as_fd()
        .try_clone_to_owned()
}

/// `proc` no longer takes connections for `key` (its `close`).
pub(super) fn leave(st: &Rc<State>, proc: &Proc, key: &str) {
    if let Some(server) = st.servers.borrow().get(key) {
        server.remove_member(proc);
    }
}

/// `proc` stops taking connections from every server (it drains or died).
pub(super) fn leave_all(st: &Rc<State>, proc: &Proc) {
    for server in st.servers.borrow().values() {
        server.remove_member(proc);
    }
    for (_, server) in st.prebound.borrow().iter() {
        server.remove_member(proc);
    }
}

/// Whether a live worker holds `key`: a `queryServer` answer gave it a listener for it, and it
/// has not closed it since (`Proc::holds`). The primary's listeners are counted by these.
fn held(st: &State, key: &str) -> bool {
    st.procs.borrow().values().any(|p| p.holds(key))
}

/// Whether `server` is the operator's: bound by `nodus run -l` or `nodus serve`, or passed by a
/// service manager (`LISTEN_FDS`). Never released.
fn is_prebound(st: &State, server: &Rc<Server>) -> bool {
    st.prebound
        .borrow()
        .iter()
        .any(|(_, s)| Rc::ptr_eq(s, server))
}

/// Whether the primary keeps something of its own for `key` that a release would close or
/// forget: a listener it bound (not a pre-bound one), a UDP socket, a reuse-port port.
fn releasable(st: &State, key: &str) -> bool {
    let server = st.servers.borrow().get(key).cloned();
    server.is_some_and(|s| !is_prebound(st, &s))
        || st.datagrams.borrow().contains_key(key)
        || st.reuseport_ports.borrow().contains_key(key)
}

/// `proc` closed its listener for `key` (its `close`; `Proc::closed_listener` has forgotten it).
/// The last holder's close releases the listener at once, as Node's primary closes a handle its
/// last worker removes, unless `proc` is on its way out (asked to stop, or going down: a Node
/// worker's `disconnect` closes every server, and a worker that closed its last one unasked is
/// replaced): its slot's next worker asks again, so the listener waits for it as after an exit
/// ([`exited`]).
pub(super) fn closed(st: &Rc<State>, proc: &Proc, key: &str) {
    if held(st, key) || !releasable(st, key) {
        return;
    }
    if proc.drained.get() || proc.going_down.get() {
        orphan(st, key, proc.slot);
        release_orphans(st);
    } else {
        let why = format!(
            "worker {} (pid {}) closed it and no other worker holds it",
            proc.slot, proc.pid
        );
        release(st, key, &why);
    }
}

/// `proc` exited (it is out of `State::procs`): each listener it held that no live worker holds
/// now waits for its slot's next worker ([`release_orphans`] decides, once the exit's restart
/// decision is made). Not released at once: the replacement asks for it again, and until then
/// its connections wait (parked in the primary, or in a shared socket's backlog) rather than
/// being refused.
pub(super) fn exited(st: &State, proc: &Proc) {
    for key in proc.held_keys() {
        if !held(st, &key) && releasable(st, &key) {
            orphan(st, &key, proc.slot);
        }
    }
}

/// `key`'s last holder, of slot `slot`, left without closing it as a choice of its own.
fn orphan(st: &State, key: &str, slot: u32) {
    let mut orphans = st.orphans.borrow_mut();
    let slots = orphans.entry(key.to_owned()).or_default();
    if !slots.contains(&slot) {
        slots.push(slot);
    }
}

/// How long a slot's worker, once ready, has to ask again for a listener its slot's worker
/// left before it is released: the cluster's `ready_timeout` (see the module docs).
fn orphan_grace(st: &State) -> Duration {
    st.config.ready_timeout
}

/// From when slot `id` no longer keeps a listener its worker left: once its current worker,
/// ready and staying (not asked to stop, not going down), has been ready for the grace
/// ([`orphan_grace`]) without asking for it again; now if it has no worker and none is coming
/// (its restart type said no). `None` while a worker of it may still ask: one is coming, or
/// the current one is not ready yet, or is on its way out (or the grace never ends).
fn slot_done_with(st: &State, id: u32) -> Option<Instant> {
    let slots = st.slots.borrow();
    let Some(slot) = slots.get((id as usize).wrapping_sub(1)) else {
        return Some(Instant::now());
    };
    match &slot.current {
        Some(p) if !p.is_ready() || p.drained.get() || p.going_down.get() => None,
        Some(p) => p.ready_at.get()?.checked_add(orphan_grace(st)),
        None if slot.pending_restart => None,
        None => Some(Instant::now()),
    }
}

/// Releases each listener that lost its last holder to an exit (or a worker's way out) once
/// every slot those holders were of is done with it ([`slot_done_with`]) without asking for
/// it again; one asked for again is held, and no longer waits. Called when a worker is ready,
/// after an exit's restart decision, when a slot is left empty, and when a grace is over (a
/// task, [`wake_for_orphans`]).
pub(super) fn release_orphans(st: &Rc<State>) {
    if st.accepting_stopped.get() {
        // Everything is closed already (`stop_accepting`): nothing to wait for.
        st.orphans.borrow_mut().clear();
        return;
    }
    let now = Instant::now();
    let mut due = Vec::new();
    let mut next: Option<Instant> = None;
    for (key, slots) in st.orphans.borrow().iter() {
        if held(st, key) {
            due.push((key.clone(), None));
            continue;
        }
        let Some(at) = slots
            .iter()
            .map(|&id| slot_done_with(st, id))
            .try_fold(now, |latest, at| Some(latest.max(at?)))
        else {
            continue;
        };
        if at <= now {
            due.push((key.clone(), Some(slots.clone())));
        } else {
            next = Some(next.map_or(at, |n| n.min(at)));
        }
    }
    for (key, slots) in due {
        let Some(slots) = slots else {
            st.orphans.borrow_mut().remove(&key);
            continue;
        };
        let has_worker = {
            let all = st.slots.borrow();
            slots.iter().any(|&id| {
                all.get((id as usize).wrapping_sub(1))
                    .is_some_and(|s| s.current.is_some())
            })
        };
        let reason = match has_worker {
            true => format!(
                "none asked for it again within {:?} (the ready timeout) of being ready",
                orphan_grace(st)
            ),
            false => "none is to come".to_owned(),
        };
        let why = format!(
            "no worker holds it since {} left, and {reason}",
            workers(&slots)
        );
        release(st, &key, &why);
    }
    if let Some(at) = next {
        wake_for_orphans(st, at);
    }
}

/// Runs [`release_orphans`] again at `at` (a grace over), unless a task already wakes for it
/// by then: one task for the soonest, another only for a sooner one.
fn wake_for_orphans(st: &Rc<State>, at: Instant) {
    if st.orphans_wake.get().is_some_and(|w| w <= at) {
        return;
    }
    st.orphans_wake.set(Some(at));
    let s = st.clone();
    crate::task::spawn_named("cluster:orphans", async move {
        crate::time::sleep(at.saturating_duration_since(Instant::now())).await;
        if s.orphans_wake.get() == Some(at) {
            s.orphans_wake.set(None);
        }
        release_orphans(&s);
    })
    .detach();
}

/// "worker 1", "workers 1, 2" (slots).
fn workers(slots: &[u32]) -> String {
    let ids: Vec<String> = slots.iter().map(u32::to_string).collect();
    let s = if slots.len() == 1 { "" } else { "s" };
    format!("worker{s} {}", ids.join(", "))
}

/// A worker's `queryServer` (`m`) failed with `EADDRINUSE`: releases the listeners no worker
/// holds whose address may be what took it (the same path or name, or a TCP or UDP port on the
/// same address or a wildcard), so the caller can try once more. A deploy that moves the
/// listener from `127.0.0.1` to every address finds the old one in its way until its holders
/// have left; once they have, it is this primary's own stale socket. Returns whether any was.
fn release_in_the_way(st: &Rc<State>, proc: &Proc, m: &Incoming<'_>) -> bool {
    let want = match pipe_path(m) {
        Some(path) => unix_addr(path),
        None => requested_addr(m).map(Addr::Tcp),
    };
    let Ok(want) = want else { return false };
    let stale: Vec<String> = if is_datagram(m) {
        st.datagrams
            .borrow()
            .iter()
            .filter(|(key, socket)| {
                !held(st, key)
                    && socket
                        .local_addr()
                        .is_ok_and(|a| Addr::Tcp(a).clashes(&want))
            })
            .map(|(key, _)| key.clone())
            .collect()
    } else {
        st.servers
            .borrow()
            .iter()
            .filter(|(key, s)| !held(st, key) && !is_prebound(st, s) && s.addr.clashes(&want))
            .map(|(key, _)| key.clone())
            .collect()
    };
    for key in &stale {
        let left = st
            .orphans
            .borrow()
            .get(key)
            .map_or_else(String::new, |slots| {
                format!(" since {} left", workers(slots))
            });
        let why = format!(
            "no worker holds it{left}, and worker {} (pid {}) asks to listen on {want}, which it \
             is in the way of",
            proc.slot, proc.pid
        );
        release(st, key, &why);
    }
    !stale.is_empty()
}

/// How many released listeners' addresses are remembered ([`tcp_ports`], [`unix_paths`],
/// [`was_released`]).
const RELEASED_KEPT: usize = MAX_KEYS;

/// Closes what the primary keeps for `key`, no worker holding it (`why`, in the one INFO line):
/// a listener (what was parked on it reset, a socket file removed, as at a stop), a UDP socket
/// (the primary's copy), a reuse-port key's port. The operator's listeners are never closed, and
/// once the primary stopped accepting it has closed everything already. A listener's address
/// and key are remembered (the last [`RELEASED_KEPT`]): a draining worker may still serve a
/// connection accepted on it, and a worker may still give back connections for its key.
fn release(st: &Rc<State>, key: &str, why: &str) {
    st.orphans.borrow_mut().remove(key);
    if st.accepting_stopped.get() {
        return;
    }
    let server = st.servers.borrow().get(key).cloned();
    if let Some(server) = server.filter(|s| !is_prebound(st, s)) {
        st.servers.borrow_mut().remove(key);
        server.stop();
        tracing::info!(target: "nodus::cluster", "{} released: {why}", server.addr);
        let mut released = st.released.borrow_mut();
        if released.len() == RELEASED_KEPT {
            released.pop_front();
        }
        released.push_back((key.to_owned(), server.addr.clone()));
    }
    if let Some(socket) = st.datagrams.borrow_mut().remove(key) {
        let addr = socket
            .local_addr()
            .map_or_else(|_| key.to_owned(), |a| a.to_string());
        tracing::info!(target: "nodus::cluster", "udp {addr} released: {why}");
    }
    if let Some(port) = st.reuseport_ports.borrow_mut().remove(key) {
        tracing::debug!(target: "nodus::cluster", "reuse-port port {port} forgotten: {why}");
    }
}

/// Whether the listener for `key` was released (one of the last [`RELEASED_KEPT`]).
pub(super) fn was_released(st: &State, key: &str) -> bool {
    st.released.borrow().iter().any(|(k, _)| k == key)
}

/// The ports of the cluster's TCP listeners (every policy; kept after it stopped accepting),
/// and of those released lately.
pub(super) fn tcp_ports(st: &State) -> HashSet<u16> {
    let servers = st.servers.borrow();
    let prebound = st.prebound.borrow();
    let released = st.released.borrow();
    servers
        .values()
        .chain(prebound.iter().map(|(_, s)| s))
        .map(|s| &s.addr)
        .chain(released.iter().map(|(_, a)| a))
        .filter_map(Addr::tcp)
        .map(|a| a.port())
        .collect()
}

/// The cluster's Unix sockets as `/proc/net/unix` shows them (kept after it stopped accepting),
/// and those released lately.
pub(super) fn unix_paths(st: &State) -> HashSet<String> {
    let servers = st.servers.borrow();
    let released = st.released.borrow();
    servers
        .values()
        .map(|s| &s.addr)
        .chain(released.iter().map(|(_, a)| a))
        .filter_map(Addr::unix_shown)
        .collect()
}

/// How long the accept task pauses after a failed accept (EMFILE and friends) or a handoff that
/// found no fd, instead of spinning.
pub(super) const RETRY_PAUSE: Duration = Duration::from_millis(50);

/// A shutdown's drain begins: the primary stops accepting and resets what is parked (see the
/// module docs). Idempotent.
pub(super) fn stop_accepting(st: &State) {
    if st.accepting_stopped.replace(true) {
        return;
    }
    let servers: Vec<Rc<Server>> = st
        .servers
        .borrow()
        .values()
        .chain(st.prebound.borrow().iter().map(|(_, s)| s))
        .cloned()
        .collect();
    for server in servers {
        server.stop();
    }
    // The workers' copies of a UDP socket stay open until they close them.
    st.datagrams.borrow_mut().clear();
}

/// The accept task's next step.
enum Work {
    /// Hand out parked connections: a worker has room.
    Parked,
    /// Accept: the socket is readable.
    Accept,
    /// Polling the socket failed.
    Failed(io::Error),
    /// The primary stopped accepting.
    Stop,
}

/// What the accept task does next: parked connections go out first, once a worker has room;
/// with nothing parked it accepts when the socket is readable (its readiness is polled here).
fn poll_work(st: &State, server: &Server, cx: &mut Context<'_>) -> Poll<Work> {
    let Some(io) = server.accepting() else {
        return Poll::Ready(Work::Stop);
    };
    let parked = !server.parked.is_empty();
    if parked && has_room(st, server) {
        return Poll::Ready(Work::Parked);
    }
    // Connections parked from outside this task (a refusal, a death, a give-back), room for
    // them, an expiry and a stop wake it through `accept_waker`; new connections through the
    // socket.
    *server.accept_waker.borrow_mut() = Some(cx.waker().clone());
    if parked {
        return Poll::Pending;
    }
    io.poll_read_ready(cx)
        .map(|r| r.map_or_else(Work::Failed, |()| Work::Accept))
}

async fn accept_loop(st: &Rc<State>, server: &Rc<Server>) {
    loop {
        let ((conns, failure), fresh) = match poll_fn(|cx| poll_work(st, server, cx)).await {
            Work::Stop => return,
            Work::Failed(e) => {
                back_off(st, server, e).await;
                continue;
            }
            Work::Parked => ((server.parked.take(ACCEPT_BATCH), None), false),
            Work::Accept if !st.fd_reserve.refill() => {
                short_of_fds(st, server).await;
                continue;
            }
            Work::Accept => (accept_batch(server), true),
        };
        let parked_before = server.parked.len();
        let short = dispatch(st, server, conns).is_err();
        if fresh {
            let waited = server.parked.len().saturating_sub(parked_before) as u64;
            st.connections_waited
                .set(st.connections_waited.get() + waited);
        }
        if let Some(e) = failure {
            back_off(st, server, e).await;
        } else if short {
            crate::time::sleep(RETRY_PAUSE).await;
        }
    }
}

/// Accepts up to [`ACCEPT_BATCH`] connections, until the backlog is empty or an accept fails.
fn accept_batch(server: &Server) -> (Vec<Conn>, Option<io::Error>) {
    let Some(io) = server.accepting() else {
        return (Vec::new(), None);
    };
    let flags = rustix::net::SocketFlags::CLOEXEC | rustix::net::SocketFlags::NONBLOCK;
    let since = crate::time::loop_now_ns();
    let mut conns = Vec::new();
    while conns.len() < ACCEPT_BATCH {
        match rustix::net::acceptfrom_with(io.get_ref(), flags) {
            Ok((fd, peer)) => conns.push(Conn {
                fd: Rc::new(fd),
                peer: peer.and_then(|p| SocketAddr::try_from(p).ok()),
                since,
            }),
            Err(rustix::io::Errno::AGAIN) => {
                io.clear_read_ready();
                break;
            }
            Err(rustix::io::Errno::INTR | rustix::io::Errno::CONNABORTED) => {}
            Err(e) => return (conns, Some(io::Error::from(e))),
        }
    }
    (conns, None)
}

/// After a failed accept (EMFILE and friends): log (once per burst, `handoff::Floods`) and pause
/// briefly instead of spinning.
async fn back_off(st: &State, server: &Server, e: io::Error) {
    if st.floods.accept.first(|| format!("{}: {e}", server.addr)) {
        tracing::error!(
            target: "nodus::cluster",
            "accept on {} failed: {e}; retrying in {RETRY_PAUSE:?} (further failures are counted: \
             one line per {:?})",
            server.addr,
            crate::log_limit::WINDOW
        );
    }
    crate::time::sleep(RETRY_PAUSE).await;
}

/// The fd reserve is short (a spawn kept some, a duplicate took one) and cannot be refilled:
/// nothing is accepted (newcomers wait in the kernel's backlog) until it can, so that a flood
/// of connections cannot take the fds a worker's restart needs. Logged once per burst.
async fn short_of_fds(st: &State, server: &Server) {
    let (held, target) = (st.fd_reserve.held(), st.fd_reserve.target());
    if st
        .floods
        .reserve
        .first(|| format!("{}: {held} of {target} held", server.addr))
    {
        tracing::warn!(
            target: "nodus::cluster",
            "the primary is at its open-files limit and holds {held} of the {target} fds it \
             keeps for its own spawns: not accepting on {} until connections close, they wait in \
             the kernel's backlog (raise the limit: LimitNOFILE=, ulimit -Hn; further waits are \
             counted: one line per {:?})",
            server.addr,
            crate::log_limit::WINDOW
        );
    }
    crate::time::sleep(RETRY_PAUSE).await;
}

#[cfg(test)]
mod tests {
    use std::net::{SocketAddr, TcpStream};
    use std::time::Duration;

    use socket2::{Domain, Socket, Type};

    use super::{Addr, Bind, covers, hold_port, unix_addr};

    #[test]
    fn a_nul_leading_a_name_relative_to_the_working_directory_is_an_abstract_socket() {
        use std::ffi::OsStr;
        use std::os::unix::ffi::OsStrExt;
        use std::path::{Path, PathBuf};
        let path = |bytes: &[u8]| PathBuf::from(OsStr::from_bytes(bytes));
        let cwd = std::env::current_dir().unwrap();
        let mut resolved = cwd.as_os_str().as_bytes().to_vec();
        resolved.extend_from_slice(b"/\0app/1");
        // As a Node worker sends `listen('\0app/1')`, and as sent raw.
        for asked in [path(&resolved), path(b"\0app/1")] {
            assert_eq!(
                unix_addr(&asked).unwrap(),
                Addr::Abstract(b"app/1".to_vec()),
                "{asked:?}"
            );
        }
        assert_eq!(
            unix_addr(Path::new("/run/app.sock")).unwrap(),
            Addr::Unix("/run/app.sock".into())
        );
        // A NUL anywhere else names no socket: not another directory's, not inside a name.
        for asked in [path(b"/nowhere-else/\0app"), path(b"/run/a\0b")] {
            let err = unix_addr(&asked).unwrap_err();
            assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput, "{asked:?}");
        }
        assert_eq!(
            Addr::Abstract(b"a\0b".to_vec()).to_string(),
            "unix:@a@b",
            "as /proc/net/unix and ss show it"
        );
    }

    #[test]
    fn listeners_clash_on_one_port_of_one_address_or_a_wildcard_and_on_one_path() {
        let tcp = |s: &str| Addr::Tcp(s.parse().unwrap());
        for (a, b) in [
            ("127.0.0.1:80", "127.0.0.1:80"),
            ("127.0.0.1:80", "[::]:80"),
            ("0.0.0.0:80", "127.0.0.1:80"),
            ("127.0.0.1:80", "[::ffff:127.0.0.1]:80"),
        ] {
            assert!(tcp(a).clashes(&tcp(b)), "{a} {b}");
            assert!(tcp(b).clashes(&tcp(a)), "{b} {a}");
        }
        for (a, b) in [
            ("127.0.0.1:80", "127.0.0.1:81"),
            ("127.0.0.1:80", "127.0.0.2:80"),
        ] {
            assert!(!tcp(a).clashes(&tcp(b)), "{a} {b}");
        }
        let unix = Addr::Unix("/run/a.sock".into());
        assert!(unix.clashes(&Addr::Unix("/run/a.sock".into())));
        assert!(!unix.clashes(&Addr::Unix("/run/b.sock".into())));
        assert!(!unix.clashes(&Addr::Abstract(b"/run/a.sock".to_vec())));
    }

    #[test]
    fn a_prebound_socket_covers_no_host_its_own_address_and_as_a_wildcard_its_family() {
        let a = |s: &str| s.parse::<SocketAddr>().unwrap();
        let any = Bind {
            ipv6_only: false,
            any: true,
            defer_accept: false,
        };
        let named = Bind { any: false, ..any };
        let v6only = Bind {
            ipv6_only: true,
            ..named
        };
        // (bound, its IPV6_V6ONLY, asked, how the worker asked it)
        for (bound, only, asked, bind) in [
            // No host: whatever the pre-bound address, on its port.
            ("0.0.0.0:80", false, "[::]:80", any),
            ("127.0.0.1:80", false, "[::]:80", any),
            ("[::1]:80", true, "[::]:80", any),
            ("[::]:80", true, "[::]:80", any),
            ("0.0.0.0:80", false, "127.0.0.1:80", named),
            ("0.0.0.0:80", false, "10.1.2.3:80", named),
            ("127.0.0.1:80", false, "127.0.0.1:80", named),
            ("127.0.0.1:80", false, "[::ffff:127.0.0.1]:80", named),
            ("0.0.0.0:80", false, "[::ffff:127.0.0.1]:80", named),
            ("[::]:80", false, "[::1]:80", named),
            ("[::]:80", false, "127.0.0.1:80", named),
            ("[::]:80", true, "[::1]:80", named),
            ("[::1]:80", false, "[::1]:80", named),
            ("[::1]:80", true, "[::1]:80", v6only),
            // An explicit wildcard: a wildcard that takes all it would.
            ("0.0.0.0:80", false, "0.0.0.0:80", named),
            ("[::]:80", false, "0.0.0.0:80", named),
            ("[::]:80", false, "[::]:80", named),
            ("[::]:80", false, "[::]:80", v6only),
            ("[::]:80", true, "[::]:80", v6only),
        ] {
            let how = (bind.any, bind.ipv6_only);
            assert!(
                covers(a(bound), only, a(asked), bind),
                "{bound} v6only {only}, {asked} (any, ipv6Only) {how:?}"
            );
        }
        for (bound, only, asked, bind) in [
            ("0.0.0.0:80", false, "127.0.0.1:81", named),
            ("0.0.0.0:80", false, "[::]:81", any),
            ("0.0.0.0:80", false, "[::1]:80", named),
            ("127.0.0.1:80", false, "127.0.0.2:80", named),
            ("127.0.0.1:80", false, "[::1]:80", named),
            ("[::]:80", true, "127.0.0.1:80", named),
            ("[::]:80", true, "[::ffff:127.0.0.1]:80", named),
            ("[::1]:80", false, "127.0.0.1:80", named),
            ("[::1]:80", false, "[::2]:80", named),
            // An explicit wildcard is no "no host": an address or a wildcard that misses part
            // of it does not cover it (a v6-only `::` takes no IPv4).
            ("127.0.0.1:80", false, "0.0.0.0:80", named),
            ("[::1]:80", false, "0.0.0.0:80", named),
            ("[::]:80", true, "0.0.0.0:80", named),
            ("0.0.0.0:80", false, "[::]:80", named),
            ("0.0.0.0:80", false, "[::]:80", v6only),
            ("[::1]:80", false, "[::]:80", v6only),
            ("[::]:80", true, "[::]:80", named),
        ] {
            let how = (bind.any, bind.ipv6_only);
            assert!(
                !covers(a(bound), only, a(asked), bind),
                "{bound} v6only {only}, {asked} (any, ipv6Only) {how:?}"
            );
        }
    }

    #[test]
    fn any_host_falls_back_to_ipv4_when_ipv6_cannot_be_bound_but_not_when_the_port_is_busy() {
        crate::Runtime::new().block_on(async {
            let any = Bind {
                ipv6_only: false,
                any: true,
                defer_accept: false,
            };
            // An address this host does not have stands for IPv6 that cannot be bound.
            let unbindable: SocketAddr = "[2001:db8::1]:0".parse().unwrap();
            let bound = any.listen(unbindable, false).unwrap();
            assert_eq!(bound.local_addr().unwrap().ip().to_string(), "0.0.0.0");
            let named = Bind { any: false, ..any };
            assert!(named.listen(unbindable, false).is_err());
            // A busy port is an error, as in Node (libuv reports it at `listen`).
            let Ok(taken) = std::net::TcpListener::bind("[::1]:0") else {
                return; // no IPv6 loopback here
            };
            let err = any.listen(taken.local_addr().unwrap(), false).unwrap_err();
            assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse);
        });
    }

    /// A worker's socket: `SO_REUSEADDR` and `SO_REUSEPORT`, listening.
    fn reuseport_listener(addr: SocketAddr) -> std::net::TcpListener {
        let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        s.set_reuse_address(true).unwrap();
        s.set_reuse_port(true).unwrap();
        s.bind(&addr.into()).unwrap();
        s.listen(128).unwrap();
        s.into()
    }

    #[test]
    fn a_held_port_takes_no_connection_and_no_one_else_binds_it() {
        let hold = hold_port("127.0.0.1:0".parse().unwrap(), false).unwrap();
        let addr = hold.local_addr().unwrap().as_socket().unwrap();
        let worker = reuseport_listener(addr);
        worker.set_nonblocking(true).unwrap();
        let connect = || TcpStream::connect_timeout(&addr, Duration::from_secs(2)).unwrap();
        let clients: Vec<TcpStream> = (0..50).map(|_| connect()).collect();
        let accepted = std::iter::from_fn(|| worker.accept().ok()).count();
        assert_eq!(
            accepted,
            clients.len(),
            "every connection reaches the worker"
        );
        drop(worker);
        // No worker listens: the port is still taken, for anyone without SO_REUSEPORT.
        let err = std::net::TcpListener::bind(addr).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse);
        assert!(
            TcpStream::connect(addr).is_err(),
            "a held port is not listening"
        );
        drop(reuseport_listener(addr));
    }

    #[test]
    fn a_held_ipv6_wildcard_port_holds_ipv4_as_the_prebound_socket_did() {
        // Neither socket listens: nothing takes a connection on the wildcard.
        for (ipv6_only, ipv4_free) in [(true, true), (false, false)] {
            let Ok(hold) = hold_port("[::]:0".parse().unwrap(), ipv6_only) else {
                return; // no IPv6 here
            };
            let port = hold.local_addr().unwrap().as_socket().unwrap().port();
            let v4 = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
            let bound = v4.bind(&SocketAddr::from(([127, 0, 0, 1], port)).into());
            assert_eq!(bound.is_ok(), ipv4_free, "v6-only {ipv6_only}: {bound:?}");
        }
    }
}
