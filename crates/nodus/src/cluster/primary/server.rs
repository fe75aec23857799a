//! Listening sockets by server key, `queryServer` answers, and the accept loop of the
//! round-robin and least policies (what it accepts is handed out by `handoff`).
//!
//! Invariants:
//! - One `Server` per listening socket the primary holds; several keys may name it; a worker is
//!   one member of it however often it asks (one share of its connections). At most
//!   [`MAX_KEYS`] keys are kept (listeners, UDP sockets, reuse-port ports): a `queryServer` for
//!   one more is refused with `EMFILE`, so a worker cannot spend the primary's fds. A pre-bound
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
//!   as `server.address()`. Its file is removed when the primary closes the socket
//!   ([`stop_accepting`]), as libuv removes a pipe server's on close, and only while the path
//!   still names the socket bound (device and inode): never a newer one's.
//! - A plain program gets listeners only under `shared` and `reuseport` (blocking, as systemd
//!   passes them); never the primary's own non-blocking accept socket.
//! - Reuse-port sockets are bound per worker and not kept: a socket nobody accepts on would
//!   swallow its share of connections. For a pre-bound address the primary keeps a socket bound
//!   with `SO_REUSEPORT` (v6-only as the pre-bound one) but not listening (only listening sockets
//!   share the connections): the port (the one port 0 resolved to) stays taken, for the workers
//!   alone, while none of them holds it, until the drain begins.
//! - Accepted connections wait for a worker ("parked": none listening yet, all at their in-flight
//!   cap, or no fd to hand them over with) only up to one accept batch plus what dead, refusing
//!   or closing workers left or gave back, and within the bounds of `parked` (a cap, and
//!   `ready_timeout` each, then a reset); while any are parked and no worker has room, the
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
//!   arrives while no worker reads waits in the socket's buffer) until the drain begins.
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
use std::time::Duration;

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
}

/// What a server listens on: a TCP address, or a Unix socket path (Node's `listen(path)`).
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Addr {
    Tcp(SocketAddr),
    /// As the worker asked it (a relative path is the primary's working directory's, which is
    /// the workers' too, as under Node's primary).
    Unix(PathBuf),
}

impl Addr {
    /// The TCP address, if it is one.
    pub(super) fn tcp(&self) -> Option<SocketAddr> {
        match self {
            Addr::Tcp(a) => Some(*a),
            Addr::Unix(_) => None,
        }
    }
}

impl std::fmt::Display for Addr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Addr::Tcp(a) => a.fmt(f),
            Addr::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

enum Sock {
    /// The primary accepts (round-robin, least); `None` once it stopped ([`stop_accepting`]: the
    /// socket is closed).
    Accepting(RefCell<Option<AsyncFd<OwnedFd>>>),
    /// Workers accept on duplicates of it; `None` once the primary stopped accepting (its copy
    /// is closed: the socket closes when the last worker closes its own).
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
        Server::new(st, listener.into(), Addr::Tcp(addr), ipv6_only, policy)
    }

    /// A Unix socket bound on `path` (`bind` fails with `EADDRINUSE` if the path exists, a stale
    /// socket file too: Node's primary does not remove it either). Under reuseport it is shared:
    /// Linux has no `SO_REUSEPORT` for Unix sockets.
    fn unix(st: &Rc<State>, path: &Path) -> io::Result<Rc<Server>> {
        let listener = std::os::unix::net::UnixListener::bind(path)?;
        let file = std::fs::symlink_metadata(path)?;
        let policy = match st.config.policy {
            Policy::ReusePort => Policy::Shared,
            policy => policy,
        };
        let server = Server::new(
            st,
            listener.into(),
            Addr::Unix(path.to_owned()),
            false,
            policy,
        )?;
        server.socket_file.set(Some((file.dev(), file.ino())));
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
}

impl Bind {
    fn of(m: &Incoming<'_>) -> Bind {
        Bind {
            ipv6_only: m.flags.unwrap_or(0) & UV_TCP_IPV6ONLY != 0,
            any: m.address.is_none(),
        }
    }

    /// A listening socket on `addr` (`reuse_port`: with `SO_REUSEPORT`).
    fn listen(self, addr: SocketAddr, reuse_port: bool) -> io::Result<TcpListener> {
        let options = ListenOptions {
            reuse_port,
            ipv6_only: self.ipv6_only,
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
    let addr = requested_addr(m);
    // A Unix socket is shared under reuseport (no `SO_REUSEPORT` for Unix sockets).
    let reuse_port = st.config.policy == Policy::ReusePort && !is_datagram(m) && pipe.is_none();
    // A reuse-port socket is the worker's: the primary keeps an entry only to resolve port 0.
    let keeps_entry = !reuse_port || addr.as_ref().is_ok_and(|a| a.port() == 0);
    let result = if proc.drained.get() || proc.going_down.get() {
        // A worker on its way out gets no new listener: as a member it would be handed
        // connections (or under shared and reuseport, take them from a queue) it cannot serve.
        Err(io::Error::from_raw_os_error(libc::ESHUTDOWN))
    } else if keeps_entry && !key_room(st, &key) {
        Err(io::Error::new(
            io::ErrorKind::QuotaExceeded,
            format!("the cluster primary keeps at most {MAX_KEYS} listeners for its workers"),
        ))
    } else if is_datagram(m) {
        // UDP is connectionless: every policy shares one socket, as Node's primary does.
        addr.and_then(|addr| datagram_copy(st, &key, addr, m.flags.unwrap_or(0)))
            .map(Answer::Fd)
    } else if let Some(path) = pipe {
        server_for(st, &key, || Server::unix(st, path))
            .and_then(|server| join(proc, m, &key, &server))
    } else if reuse_port {
        // A pre-bound port is only held: the worker binds a socket of its own on it, on the
        // pre-bound address (the operator's, v6-only or dual-stack as held), not the one asked.
        addr.map(|addr| {
            let bind = Bind::of(m);
            claim_prebound(st, proc, addr, bind)
                .and_then(|server| {
                    let held = Bind {
                        ipv6_only: server.ipv6_only,
                        any: false,
                    };
                    Some((server.addr.tcp()?, held))
                })
                .unwrap_or((addr, bind))
        })
        .and_then(|(addr, bind)| reuseport_socket(st, &key, addr, bind).map(Answer::Fd))
    } else {
        addr.and_then(|addr| {
            let bind = Bind::of(m);
            server_for(st, &key, || match claim_prebound(st, proc, addr, bind) {
                Some(s) => Ok(s),
                None => Server::tcp(st, bind.listen(addr, false)?.into_std(), st.config.policy),
            })
        })
        .and_then(|server| join(proc, m, &key, &server))
    };
    if result.is_ok() {
        proc.gave_listener(&key);
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
                Some(path) => format!("unix socket {}", path.display()),
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

/// The ports of the cluster's TCP listeners (every policy; kept after it stopped accepting).
pub(super) fn tcp_ports(st: &State) -> HashSet<u16> {
    let servers = st.servers.borrow();
    let prebound = st.prebound.borrow();
    servers
        .values()
        .chain(prebound.iter().map(|(_, s)| s))
        .filter_map(|s| s.addr.tcp())
        .map(|a| a.port())
        .collect()
}

/// The paths of the cluster's Unix sockets, as bound (kept after it stopped accepting).
pub(super) fn unix_paths(st: &State) -> HashSet<String> {
    st.servers
        .borrow()
        .values()
        .filter_map(|s| match &s.addr {
            Addr::Unix(path) => Some(path.to_string_lossy().into_owned()),
            Addr::Tcp(_) => None,
        })
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
fn poll_work(server: &Server, cx: &mut Context<'_>) -> Poll<Work> {
    let Some(io) = server.accepting() else {
        return Poll::Ready(Work::Stop);
    };
    let parked = !server.parked.is_empty();
    if parked && has_room(server) {
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
        let (conns, failure) = match poll_fn(|cx| poll_work(server, cx)).await {
            Work::Stop => return,
            Work::Failed(e) => {
                back_off(st, server, e).await;
                continue;
            }
            Work::Parked => (server.parked.take(ACCEPT_BATCH), None),
            Work::Accept => accept_batch(server),
        };
        let short = dispatch(st, server, conns).is_err();
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

#[cfg(test)]
mod tests {
    use std::net::{SocketAddr, TcpStream};
    use std::time::Duration;

    use socket2::{Domain, Socket, Type};

    use super::{Bind, covers, hold_port};

    #[test]
    fn a_prebound_socket_covers_no_host_its_own_address_and_as_a_wildcard_its_family() {
        let a = |s: &str| s.parse::<SocketAddr>().unwrap();
        let any = Bind {
            ipv6_only: false,
            any: true,
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
