//! Listening sockets by server key, `queryServer` answers, and the accept-and-hand-off loop of
//! the round-robin and least policies.
//!
//! Invariants:
//! - One `Server` per listening socket the primary holds; several keys may name it (a pre-bound
//!   listener matched by address). A server whose policy is round-robin or least is accepted on by
//!   one task of the primary; a shared one is only duplicated into workers (never registered with
//!   the primary's reactor, so incoming connections do not wake the primary).
//! - Reuse-port sockets are bound per worker and not kept: a socket nobody accepts on would
//!   swallow its share of connections.
//! - At most [`PARK_LIMIT`] accepted connections wait for a worker (none listening yet, or all at
//!   their in-flight cap); past it the primary stops accepting and the kernel's backlog holds
//!   newcomers.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::poll_fn;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsFd, OwnedFd};
use std::rc::Rc;
use std::task::{Poll, Waker};

use super::balance::{self, Candidate};
use super::proc::{Proc, ProcState};
use super::{Policy, State};
use crate::cluster::protocol::{Incoming, NODE_CLUSTER, NewConn, QueryReply, SockName, server_key};
use crate::io::AsyncFd;
use crate::ipc::SendHandle;
use crate::net::{ListenOptions, TcpListener};
use crate::process::Command;

/// Accepted connections that may wait for a worker before the primary stops accepting.
pub(super) const PARK_LIMIT: usize = 1024;

enum Sock {
    /// The primary accepts (round-robin, least).
    Accepting(AsyncFd<std::net::TcpListener>),
    /// Workers accept on duplicates of it.
    Shared(std::net::TcpListener),
    /// Reuse-port: only the address is kept; each worker binds (gets) a socket of its own.
    Released,
}

pub(super) struct Server {
    pub addr: SocketAddr,
    sock: Sock,
    /// Workers taking connections from this server, with the key each asked with.
    members: RefCell<Vec<(Rc<Proc>, String)>>,
    cursor: Cell<usize>,
    parked: RefCell<VecDeque<OwnedFd>>,
    accept_waker: RefCell<Option<Waker>>,
    accepting: Cell<bool>,
}

impl Server {
    /// Wraps a listener bound before the workers started.
    pub fn prebound(st: &Rc<State>, listener: TcpListener) -> io::Result<Rc<Server>> {
        Server::new(st, listener.into_std(), st.config.policy)
    }

    fn new(
        st: &Rc<State>,
        listener: std::net::TcpListener,
        policy: Policy,
    ) -> io::Result<Rc<Server>> {
        let addr = listener.local_addr()?;
        let sock = match policy {
            Policy::RoundRobin | Policy::Least => {
                listener.set_nonblocking(true)?;
                Sock::Accepting(AsyncFd::new(listener)?)
            }
            // Shared duplicates share the file's flags: blocking, as a service manager passes
            // sockets (a nodus or Node worker makes its copy non-blocking itself).
            Policy::Shared => {
                listener.set_nonblocking(false)?;
                Sock::Shared(listener)
            }
            Policy::ReusePort => Sock::Released,
        };
        let server = Rc::new(Server {
            addr,
            sock,
            members: RefCell::default(),
            cursor: Cell::new(0),
            parked: RefCell::default(),
            accept_waker: RefCell::new(None),
            accepting: Cell::new(false),
        });
        if matches!(server.sock, Sock::Accepting(_)) {
            let (s, srv) = (st.clone(), server.clone());
            server.accepting.set(true);
            crate::task::spawn_named("cluster:accept", async move { accept_loop(&s, &srv).await })
                .detach();
        }
        Ok(server)
    }

    fn wake_accept(&self) {
        if let Some(w) = self.accept_waker.borrow_mut().take() {
            w.wake();
        }
    }

    /// Removes `proc` from the members (it closes, drains or died).
    pub fn remove_member(&self, proc: &Proc) {
        self.members
            .borrow_mut()
            .retain(|(p, _)| p.unique != proc.unique);
    }
}

/// The address a `queryServer` asks for (Node sends `null` for "any": IPv6 any, dual-stack, as
/// Node's own listen does).
fn requested_addr(m: &Incoming<'_>) -> SocketAddr {
    let port = m.port.unwrap_or(0);
    let ip = m
        .address
        .as_deref()
        .and_then(|a| a.parse::<IpAddr>().ok())
        .unwrap_or(
            if m.address_type.as_ref().and_then(|v| v.as_u64()) == Some(4) {
                IpAddr::V4(Ipv4Addr::UNSPECIFIED)
            } else {
                IpAddr::V6(Ipv6Addr::UNSPECIFIED)
            },
        );
    SocketAddr::new(ip, port)
}

/// Finds (or binds) the server a key names.
fn server_for(st: &Rc<State>, key: &str, addr: SocketAddr) -> io::Result<Rc<Server>> {
    if let Some(s) = st.servers.borrow().get(key) {
        return Ok(s.clone());
    }
    let prebound = st
        .prebound
        .borrow()
        .iter()
        .find(|(_, s)| {
            s.addr.port() == addr.port() && (s.addr.ip() == addr.ip() || addr.ip().is_unspecified())
        })
        .map(|(_, s)| s.clone());
    let server = match prebound {
        Some(s) => s,
        None => {
            let l = TcpListener::bind(addr)?;
            Server::new(st, l.into_std(), st.config.policy)?
        }
    };
    st.servers
        .borrow_mut()
        .insert(key.to_owned(), server.clone());
    Ok(server)
}

/// Answers a worker's `queryServer`.
pub(super) fn query(st: &Rc<State>, proc: &Rc<Proc>, m: &Incoming<'_>) {
    let key = server_key(m);
    let addr = requested_addr(m);
    let Some(ack) = m.seq else { return };
    let reply = |errno: Option<String>, sockname: Option<SockName>| QueryReply {
        cmd: NODE_CLUSTER,
        errno,
        key: key.clone(),
        ack,
        data: None,
        sockname,
        seq: st.next_seq(),
    };
    let result = if st.config.policy == Policy::ReusePort {
        reuseport_socket(st, &key, addr).map(|fd| (None, Some(fd)))
    } else {
        server_for(st, &key, addr).and_then(|server| match &server.sock {
            Sock::Shared(l) => Ok((None, Some(l.as_fd().try_clone_to_owned()?))),
            Sock::Released => unreachable!("released sockets exist only under reuseport"),
            Sock::Accepting(_) => {
                server
                    .members
                    .borrow_mut()
                    .push((proc.clone(), key.clone()));
                server.wake_accept();
                Ok((Some(server.addr), None))
            }
        })
    };
    let Some(channel) = &proc.channel else { return };
    let sent = match result {
        Ok((Some(local), None)) => channel.send(&reply(
            None,
            Some(SockName {
                address: local.ip().to_string(),
                family: if local.is_ipv4() { "IPv4" } else { "IPv6" },
                port: local.port(),
            }),
        )),
        Ok((_, Some(fd))) => channel.send_handle(&reply(None, None), SendHandle::fd(fd)),
        Ok((None, None)) => unreachable!("a server answers with an address or an fd"),
        Err(e) => {
            tracing::error!(
                target: "nodus::cluster",
                "worker {} (pid {}) cannot listen on {addr}: {e}", proc.slot, proc.pid
            );
            // Node's workers expect a negative libuv errno.
            let errno = format!("{}", -e.raw_os_error().unwrap_or(EIO));
            channel.send(&reply(Some(errno), None))
        }
    };
    if let Err(e) = sent {
        tracing::debug!(target: "nodus::cluster", "cannot answer queryServer: {e}");
    }
}

/// The errno sent for an error without one.
const EIO: i32 = 5;

/// A fresh `SO_REUSEPORT` socket for one worker. Port 0 is resolved once per key so every
/// worker shares the port.
fn reuseport_socket(st: &Rc<State>, key: &str, addr: SocketAddr) -> io::Result<OwnedFd> {
    let mut addr = addr;
    if addr.port() == 0
        && let Some(port) = st.reuseport_ports.borrow().get(key)
    {
        addr.set_port(*port);
    }
    let options = ListenOptions {
        reuse_port: true,
        ..ListenOptions::default()
    };
    let l = TcpListener::bind_with(addr, options)?;
    if addr.port() == 0 {
        let port = l.local_addr()?.port();
        st.reuseport_ports.borrow_mut().insert(key.to_owned(), port);
    }
    Ok(OwnedFd::from(l.into_std()))
}

/// Gives a plain program the primary's listeners the systemd way: fds 3.. with `LISTEN_FDS` and
/// `LISTEN_FDNAMES` (`LISTEN_PID` must be the program's own pid: a launcher sets it). Under
/// `reuseport` each worker gets fresh sockets bound to the same addresses.
pub(super) fn pass_listeners(st: &Rc<State>, cmd: &mut Command) -> io::Result<()> {
    let prebound = st.prebound.borrow();
    let mut names = Vec::with_capacity(prebound.len());
    for (i, (name, server)) in prebound.iter().enumerate() {
        let fd: OwnedFd = match (&server.sock, st.config.policy) {
            (_, Policy::ReusePort) => {
                let options = ListenOptions {
                    reuse_port: true,
                    ..ListenOptions::default()
                };
                let l = TcpListener::bind_with(server.addr, options)?.into_std();
                l.set_nonblocking(false)?;
                OwnedFd::from(l)
            }
            (Sock::Shared(l), _) => l.as_fd().try_clone_to_owned()?,
            (Sock::Accepting(io), _) => io.get_ref().as_fd().try_clone_to_owned()?,
            (Sock::Released, _) => unreachable!("released sockets exist only under reuseport"),
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

/// The worker answered a `newconn`.
pub(super) fn on_accepted(st: &Rc<State>, proc: &Rc<Proc>, ack: u64, accepted: bool) {
    let Some((server, fd)) = proc.pending.borrow_mut().remove(&ack) else {
        return;
    };
    if accepted {
        proc.handed.set(proc.handed.get() + 1);
        drop(fd);
    } else {
        // The worker is closing: it leaves, and the connection goes to someone else.
        server.remove_member(proc);
        dispatch(st, &server, fd);
    }
    server.wake_accept();
}

/// Gives back every connection `proc` had not accepted (it died) to the other workers.
pub(super) fn redistribute(st: &Rc<State>, proc: &Proc) {
    let pending: Vec<_> = proc.pending.borrow_mut().drain().map(|(_, v)| v).collect();
    for (server, fd) in pending {
        dispatch(st, &server, fd);
        server.wake_accept();
    }
}

/// Hands `fd` to a worker of `server`, or parks it.
fn dispatch(st: &Rc<State>, server: &Rc<Server>, fd: OwnedFd) {
    let choice = {
        let members = server.members.borrow();
        let cands: Vec<Candidate> = members
            .iter()
            .map(|(p, _)| Candidate {
                in_flight: p.pending.borrow().len() as u64,
                load: p.load_estimate(),
            })
            .collect();
        let mut cursor = server.cursor.get();
        let pick = match st.config.policy {
            Policy::Least => balance::least(&cands, &mut cursor),
            _ => balance::round_robin(&cands, &mut cursor),
        };
        server.cursor.set(cursor);
        pick.map(|i| members[i].clone())
    };
    match choice {
        Some((proc, key)) => handoff(st, server, &proc, &key, fd),
        None => server.parked.borrow_mut().push_back(fd),
    }
}

fn handoff(st: &Rc<State>, server: &Rc<Server>, proc: &Rc<Proc>, key: &str, fd: OwnedFd) {
    let Some(channel) = &proc.channel else {
        server.parked.borrow_mut().push_back(fd);
        return;
    };
    let copy = match fd.try_clone() {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(target: "nodus::cluster", "cannot hand a connection over: {e}");
            return;
        }
    };
    let seq = st.next_seq();
    let msg = NewConn {
        cmd: NODE_CLUSTER,
        act: "newconn",
        key,
        seq,
    };
    match channel.send_handle(&msg, SendHandle::fd(copy)) {
        Ok(_) => {
            proc.pending.borrow_mut().insert(seq, (server.clone(), fd));
        }
        Err(e) => {
            tracing::debug!(target: "nodus::cluster", "worker {}: handoff failed: {e}", proc.slot);
            server.remove_member(proc);
            server.parked.borrow_mut().push_back(fd);
        }
    }
}

/// Whether some member can take a connection now.
fn has_room(server: &Server) -> bool {
    server.members.borrow().iter().any(|(p, _)| {
        p.state.get() < ProcState::Draining
            && (p.pending.borrow().len() as u64) < balance::MAX_IN_FLIGHT
    })
}

async fn accept_loop(st: &Rc<State>, server: &Rc<Server>) {
    let Sock::Accepting(io) = &server.sock else {
        return;
    };
    loop {
        // Hand parked connections out first.
        while has_room(server) {
            let Some(fd) = server.parked.borrow_mut().pop_front() else {
                break;
            };
            dispatch(st, server, fd);
        }
        let accepted = poll_fn(|cx| {
            if server.parked.borrow().len() >= PARK_LIMIT
                || (!server.parked.borrow().is_empty() && !has_room(server))
            {
                *server.accept_waker.borrow_mut() = Some(cx.waker().clone());
                return Poll::Pending;
            }
            if !server.parked.borrow().is_empty() && has_room(server) {
                return Poll::Ready(None);
            }
            *server.accept_waker.borrow_mut() = Some(cx.waker().clone());
            loop {
                match io.poll_read_ready(cx) {
                    Poll::Ready(Ok(())) => {}
                    Poll::Ready(Err(e)) => return Poll::Ready(Some(Err(e))),
                    Poll::Pending => return Poll::Pending,
                }
                match rustix::net::accept_with(io.get_ref(), rustix::net::SocketFlags::CLOEXEC) {
                    Ok(fd) => return Poll::Ready(Some(Ok(fd))),
                    Err(rustix::io::Errno::AGAIN) => io.clear_read_ready(),
                    Err(rustix::io::Errno::INTR | rustix::io::Errno::CONNABORTED) => {}
                    Err(e) => return Poll::Ready(Some(Err(io::Error::from(e)))),
                }
            }
        })
        .await;
        match accepted {
            Some(Ok(fd)) => dispatch(st, server, fd),
            Some(Err(e)) => {
                // EMFILE and friends: back off briefly instead of spinning.
                tracing::error!(target: "nodus::cluster", "accept on {} failed: {e}", server.addr);
                crate::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            None => {}
        }
    }
}
