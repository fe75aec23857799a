//! Parked connections: accepted by the primary and waiting for a worker (none listens, every
//! one is at its in-flight cap or pausing, under round-robin none is free nor taking its
//! handoffs, or the primary is out of fds to hand them over), with
//! the bounds that keep a client from waiting forever and the primary's memory bounded.
//!
//! Invariants:
//! - At most `cap` ([`MAX_PARKED`]) per server: a connection that finds the queue full is reset
//!   at once (the newest go, so the oldest keep their turn).
//! - A connection waits at most `bound` (the cluster's `ready_timeout`) from [`Conn::since`];
//!   then it is reset. A timer per server runs while anything is parked ([`arm_expiry`]).
//! - Once closed (a shutdown's drain began, `server::stop_accepting`) nothing is kept: what was
//!   parked is reset and whatever comes later (given back, refused) is reset on arrival.
//! - A reset is a close with `SO_LINGER` 0: the client reads `ECONNRESET` at once, neither a hang
//!   nor an EOF that could pass for an empty answer.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::rc::Rc;
use std::time::Duration;

use super::server::Server;

/// Parked connections per server at most. Beyond one accept batch, connections are parked only
/// when workers give back, refuse or leave behind (at their death) what they had not taken,
/// normally at most `balance::MAX_IN_FLIGHT` (64) each: this covers 16 workers doing so at once,
/// in a few dozen KiB of memory and as many fds.
pub(super) const MAX_PARKED: usize = 1024;

/// One accepted connection: the primary's reference to its fd (shared with the channel while a
/// handoff is being written), the client's address, and when the primary got it.
#[derive(Clone)]
pub(super) struct Conn {
    pub fd: Rc<OwnedFd>,
    pub peer: Option<SocketAddr>,
    /// When the primary accepted it, or a worker gave it back (the loop's time, ns): the start
    /// of its parking bound. A connection handed out and parked again keeps it.
    pub since: u64,
}

/// The connections of one server waiting for a worker, oldest first.
pub(super) struct Parked {
    conns: RefCell<VecDeque<Conn>>,
    cap: usize,
    bound: Duration,
    closed: Cell<bool>,
    /// The expiry timer runs.
    expiring: Cell<bool>,
}

impl Parked {
    /// An empty queue of at most `cap` connections, each kept `bound` at most.
    pub fn new(cap: usize, bound: Duration) -> Parked {
        Parked {
            conns: RefCell::default(),
            cap,
            bound,
            closed: Cell::new(false),
            expiring: Cell::new(false),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.conns.borrow().is_empty()
    }

    pub fn len(&self) -> usize {
        self.conns.borrow().len()
    }

    /// Takes up to `n` of the oldest out.
    pub fn take(&self, n: usize) -> Vec<Conn> {
        let mut conns = self.conns.borrow_mut();
        let n = n.min(conns.len());
        conns.drain(..n).collect()
    }

    /// Keeps `conns` up to the cap, in order; resets the rest (every one once closed). Returns
    /// how many were reset.
    pub fn push(&self, conns: impl IntoIterator<Item = Conn>) -> usize {
        let mut kept = self.conns.borrow_mut();
        let mut reset_count = 0;
        for conn in conns {
            if self.closed.get() || kept.len() >= self.cap {
                reset(conn);
                reset_count += 1;
            } else {
                kept.push_back(conn);
            }
        }
        reset_count
    }

    /// Resets the connections that have waited their bound at `now` (the loop's time, ns).
    /// Returns how many, and when the next one's bound ends.
    pub fn expire(&self, now: u64) -> (usize, Option<u64>) {
        let bound = u64::try_from(self.bound.as_nanos()).unwrap_or(u64::MAX);
        let mut conns = self.conns.borrow_mut();
        let (kept, expired): (VecDeque<Conn>, VecDeque<Conn>) = conns
            .drain(..)
            .partition(|c| c.since.saturating_add(bound) > now);
        *conns = kept;
        let next = conns.iter().map(|c| c.since.saturating_add(bound)).min();
        drop(conns);
        let n = expired.len();
        expired.into_iter().for_each(reset);
        (n, next)
    }

    /// Keeps nothing from now on: every parked connection is reset. Returns how many.
    pub fn close(&self) -> usize {
        self.closed.set(true);
        let all: Vec<Conn> = self.conns.borrow_mut().drain(..).collect();
        let n = all.len();
        all.into_iter().for_each(reset);
        n
    }
}

/// Closes a connection no worker will take with a reset, so its client sees an error at once
/// (dropping the primary's reference closes it).
fn reset(conn: Conn) {
    if let Err(e) = rustix::net::sockopt::set_socket_linger(&*conn.fd, Some(Duration::ZERO)) {
        tracing::debug!(target: "nodus::cluster", "SO_LINGER on a parked connection: {e}");
    }
    drop(conn);
}

/// Makes sure `server`'s expiry timer runs while it has parked connections: it sleeps until the
/// oldest one's bound ends, resets what waited that long, and wakes the accept task (room to
/// accept again).
pub(super) fn arm_expiry(server: &Rc<Server>) {
    let parked = &server.parked;
    if parked.is_empty() || parked.expiring.replace(true) {
        return;
    }
    let server = server.clone();
    crate::task::spawn_named("cluster:parked", async move {
        loop {
            let (n, next) = server.parked.expire(crate::time::loop_now_ns());
            if n > 0 {
                tracing::warn!(
                    target: "nodus::cluster",
                    "{} to {} waited {:?} for a worker: reset",
                    super::count(n, "connection"),
                    server.addr,
                    server.parked.bound
                );
                server.wake_accept();
            }
            let Some(next) = next else { break };
            let wait = next.saturating_sub(crate::time::loop_now_ns());
            crate::time::sleep(Duration::from_nanos(wait)).await;
        }
        server.parked.expiring.set(false);
    })
    .detach();
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{ErrorKind, Read};
    use std::net::{TcpListener, TcpStream};

    /// A connected pair: the client's end and the server's end as a parked `Conn`.
    fn pair(listener: &TcpListener, since: u64) -> (TcpStream, Conn) {
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        client
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let (server, peer) = listener.accept().unwrap();
        let conn = Conn {
            fd: Rc::new(OwnedFd::from(server)),
            peer: Some(peer),
            since,
        };
        (client, conn)
    }

    fn was_reset(mut client: TcpStream) -> bool {
        client
            .read(&mut [0u8; 1])
            .is_err_and(|e| e.kind() == ErrorKind::ConnectionReset)
    }

    fn still_open(mut client: &TcpStream) -> bool {
        client.set_nonblocking(true).unwrap();
        let open = client
            .read(&mut [0u8; 1])
            .is_err_and(|e| e.kind() == ErrorKind::WouldBlock);
        client.set_nonblocking(false).unwrap();
        open
    }

    #[test]
    fn beyond_the_cap_the_newest_are_reset() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let parked = Parked::new(2, Duration::from_secs(60));
        let (clients, conns): (Vec<_>, Vec<_>) = (0..3).map(|_| pair(&listener, 0)).unzip();
        assert_eq!(parked.push(conns), 1);
        let mut clients = clients.into_iter();
        let (a, b, c) = (
            clients.next().unwrap(),
            clients.next().unwrap(),
            clients.next().unwrap(),
        );
        assert!(was_reset(c), "the one over the cap");
        assert!(still_open(&a) && still_open(&b));
        assert_eq!(parked.take(5).len(), 2);
    }

    #[test]
    fn a_connection_is_reset_when_its_bound_ends() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let second = 1_000_000_000;
        let parked = Parked::new(8, Duration::from_secs(5));
        let (old, old_conn) = pair(&listener, 0);
        let (new, new_conn) = pair(&listener, 3 * second);
        assert_eq!(parked.push([old_conn, new_conn]), 0);
        assert_eq!(parked.expire(4 * second), (0, Some(5 * second)));
        assert_eq!(parked.expire(5 * second), (1, Some(8 * second)));
        assert!(was_reset(old));
        assert!(still_open(&new));
        assert_eq!(parked.expire(8 * second), (1, None));
        assert!(was_reset(new));
        assert!(parked.is_empty());
    }

    #[test]
    fn once_closed_nothing_is_kept() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let parked = Parked::new(8, Duration::from_secs(60));
        let (before, conn) = pair(&listener, 0);
        parked.push([conn]);
        assert_eq!(parked.close(), 1);
        assert!(was_reset(before));
        let (after, conn) = pair(&listener, 0);
        assert_eq!(parked.push([conn]), 1);
        assert!(was_reset(after));
        assert!(parked.is_empty());
    }
}
