//! Whether a draining Node worker still serves a connection: the early SIGTERM of its stop.
//!
//! A Node worker closes its cluster servers and then its channel on `disconnect`, but a timer or
//! a database pool keeps its loop alive, so it would run on to the SIGTERM after its drain
//! deadline. Once its channel has ended, [`until_idle`] looks at the worker's own sockets every
//! [`POLL`] and returns once it holds no inbound TCP connection, so the supervisor SIGTERMs it
//! then instead (`supervise::arm_kill_timer`).
//!
//! Invariants:
//! - Only a Node worker (a channel, and it never said it speaks nodus's own messages) is looked
//!   at: a nodus worker drains on its own deadline and exits by itself; a plain program got
//!   SIGTERM at once.
//! - Nothing is read before the channel ended (the worker's servers no longer accept then), and
//!   nothing after the worker exited (the caller stops polling): /proc is read only while a
//!   worker drains.
//! - An inbound connection is a connected TCP socket (any state but `LISTEN` and `CLOSE`:
//!   `ESTABLISHED`, `CLOSE_WAIT`, a half-closed `FIN_WAIT`...) among the fds of the worker process
//!   itself (all its threads; not its children's: they are its business while it runs, and
//!   its group is killed once it exits) whose local port is one the cluster listens on (the
//!   primary's TCP listeners, every policy) or one of the worker's own listening TCP sockets (an
//!   `exclusive` server) listens on. Outbound connections (a database pool) have an ephemeral
//!   local port and do not count, nor do Unix sockets.
//! - The sockets are the worker's `/proc/PID/fd` links (`socket:[INODE]`) matched to the rows of
//!   `/proc/PID/net/tcp` and `tcp6` (its network namespace). If they cannot be read (`hidepid`,
//!   another user's process), [`until_idle`] never returns: the deadline rule applies as before.
//! - They are read on the I/O pool, never on the primary's loop thread: the tables list every TCP
//!   socket of the namespace (megabytes on a busy host) while the loop accepts and hands on
//!   connections.

use std::collections::HashSet;
use std::io;
use std::rc::Rc;
use std::time::Duration;

use super::proc::Proc;
use super::{State, server};

/// How often a draining Node worker's sockets are looked at once its channel ended.
const POLL: Duration = Duration::from_millis(50);

/// Returns once `proc`, a Node worker asked to stop, has ended its channel and holds no inbound
/// TCP connection; never, for another kind of worker or when its sockets cannot be read.
pub(super) async fn until_idle(st: &Rc<State>, proc: &Rc<Proc>) {
    if proc.channel.is_none() || proc.speaks_nodus.get() {
        return std::future::pending().await;
    }
    let ports = std::sync::Arc::new(server::tcp_ports(st));
    let pid = proc.pid;
    loop {
        crate::time::sleep(POLL).await;
        if !proc.channel_ended.get() {
            continue;
        }
        // On the I/O pool: the tables list every TCP socket of the host's network namespace,
        // megabytes on a busy host, and the primary's loop accepts and hands on connections.
        let ports = ports.clone();
        let held = crate::pool::offload_io(move || holds_inbound(pid, &ports))
            .await
            .map_err(io::Error::other)
            .and_then(|held| held);
        match held {
            Ok(false) => return,
            Ok(true) => {}
            Err(e) => {
                tracing::debug!(
                    target: "nodus::cluster",
                    "worker {} (pid {}): cannot read its sockets ({e}): SIGTERM only after its \
                     drain deadline",
                    proc.slot, proc.pid
                );
                return std::future::pending().await;
            }
        }
    }
}

/// TCP states (`include/net/tcp_states.h`) of a socket that is not connected.
const TCP_CLOSE: u8 = 0x07;
const TCP_LISTEN: u8 = 0x0A;

/// Whether process `pid` holds a connected TCP socket whose local port is in `ports` or is one
/// it listens on itself.
fn holds_inbound(pid: u32, ports: &HashSet<u16>) -> io::Result<bool> {
    let inodes = socket_inodes(pid)?;
    if inodes.is_empty() {
        return Ok(false);
    }
    let mut tables = Vec::with_capacity(2);
    for table in ["tcp", "tcp6"] {
        match std::fs::read_to_string(format!("/proc/{pid}/net/{table}")) {
            Ok(text) => tables.push(text),
            // No IPv6 in this kernel: no `tcp6`.
            Err(e) if table == "tcp6" && e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(any_inbound(&inodes, &tables, ports))
}

/// Whether a socket of `inodes` is a connected one, in the `/proc/net/tcp` `tables`, whose local
/// port is in `ports` or one a socket of `inodes` listens on.
fn any_inbound(inodes: &HashSet<u64>, tables: &[String], ports: &HashSet<u16>) -> bool {
    let (mut listening, mut connected) = (Vec::new(), Vec::new());
    for row in tables
        .iter()
        .flat_map(|t| t.lines().skip(1))
        .filter_map(parse_row)
    {
        if !inodes.contains(&row.inode) {
            continue;
        }
        match row.state {
            TCP_LISTEN => listening.push(row.local_port),
            TCP_CLOSE => {}
            _ => connected.push(row.local_port),
        }
    }
    connected
        .iter()
        .any(|port| ports.contains(port) || listening.contains(port))
}

/// The inodes of the sockets among process `pid`'s open fds.
fn socket_inodes(pid: u32) -> io::Result<HashSet<u64>> {
    let mut inodes = HashSet::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd"))? {
        // An fd closed since the listing: skipped.
        let Ok(target) = std::fs::read_link(entry?.path()) else {
            continue;
        };
        if let Some(inode) = target
            .to_str()
            .and_then(|t| t.strip_prefix("socket:["))
            .and_then(|t| t.strip_suffix(']'))
            .and_then(|t| t.parse().ok())
        {
            inodes.insert(inode);
        }
    }
    Ok(inodes)
}

/// What matters here of a `/proc/net/tcp` row.
#[derive(Debug, PartialEq)]
struct Row {
    local_port: u16,
    state: u8,
    inode: u64,
}

/// Parses a row of `/proc/net/tcp` or `tcp6`: `sl local_address rem_address st tx_queue:rx_queue
/// tr:tm->when retrnsmt uid timeout inode ...`, addresses as `HEXIP:HEXPORT`.
fn parse_row(line: &str) -> Option<Row> {
    let mut fields = line.split_whitespace();
    let local = fields.nth(1)?;
    let state = fields.nth(1)?;
    let inode = fields.nth(5)?;
    let (_, port) = local.rsplit_once(':')?;
    Some(Row {
        local_port: u16::from_str_radix(port, 16).ok()?,
        state: u8::from_str_radix(state, 16).ok()?,
        inode: inode.parse().ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_gives_its_local_port_state_and_inode() {
        let v4 = "   1: 0100007F:1F90 0100007F:D431 01 00000000:00000000 00:00000000 00000000  \
                  1000        0 4242 1 0000000000000000 20 4 30 10 -1";
        assert_eq!(
            parse_row(v4),
            Some(Row {
                local_port: 8080,
                state: 1,
                inode: 4242
            })
        );
        let v6 = "   0: 00000000000000000000000000000000:0050 00000000000000000000000000000000:0000 \
                  0A 00000000:00000000 00:00000000 00000000     0        0 17 1 0000000000000000 \
                  100 0 0 10 0";
        assert_eq!(
            parse_row(v6),
            Some(Row {
                local_port: 80,
                state: TCP_LISTEN,
                inode: 17
            })
        );
        let header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   \
                      uid  timeout inode";
        assert_eq!(parse_row(header), None);
    }

    /// Sockets of this test (their inodes; other tests' sockets are in the tables too): an
    /// accepted connection on a cluster port counts, an outbound one (ephemeral local port) does
    /// not, and a port the process listens on itself counts as a cluster port.
    #[test]
    fn inbound_connections_are_told_from_outbound_ones() {
        use std::os::fd::AsFd;
        let inode = |fd: std::os::fd::BorrowedFd<'_>| rustix::fs::fstat(fd).unwrap().st_ino;
        let tables = || {
            ["tcp", "tcp6"]
                .iter()
                .filter_map(|t| std::fs::read_to_string(format!("/proc/self/net/{t}")).ok())
                .collect::<Vec<_>>()
        };
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (cluster, none) = (HashSet::from([port]), HashSet::new());
        let client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (served, _) = listener.accept().unwrap();
        let (l, c, s) = (
            inode(listener.as_fd()),
            inode(client.as_fd()),
            inode(served.as_fd()),
        );
        // Only a listening socket, or only an outbound connection: nothing inbound.
        assert!(!any_inbound(&HashSet::from([l]), &tables(), &cluster));
        assert!(!any_inbound(&HashSet::from([c]), &tables(), &cluster));
        // The accepted connection, on a cluster port or on one the process listens on.
        assert!(any_inbound(&HashSet::from([c, s]), &tables(), &cluster));
        assert!(any_inbound(&HashSet::from([l, s]), &tables(), &none));
        assert!(!any_inbound(&HashSet::from([s]), &tables(), &none));
        // The client closed: the server's end is in CLOSE_WAIT, still held.
        drop(client);
        std::thread::sleep(Duration::from_millis(50));
        assert!(any_inbound(&HashSet::from([s]), &tables(), &cluster));
        // This process's own fds are found.
        assert!(socket_inodes(std::process::id()).unwrap().contains(&s));
    }
}
