//! Whether a draining Node worker still serves a connection or writes its output: the early kill
//! signal of its stop (`Config::kill_signal`, SIGTERM by default; "SIGTERM" below).
//!
//! A Node worker closes its cluster servers and then its channel on `disconnect`, but a timer or
//! a database pool keeps its loop alive, so it would run on to the SIGTERM after its drain
//! deadline. Once its channel has ended, [`until_idle`] looks at the worker every [`POLL`] and
//! returns once, [`DISCONNECT_GRACE`] after that end, it holds no inbound connection and no
//! output it could not write yet, so the supervisor SIGTERMs it then instead
//! (`supervise::arm_kill_timer`). A Node worker exits by itself once nothing keeps its loop
//! alive (Node's own primary never signals it): the grace is for its `disconnect` handlers (a
//! flush of buffered events to a collector), the output rule for what its stdout and stderr
//! streams still queue (they write to a pipe without blocking, so what the pipe cannot take
//! waits in the worker's memory and dies with it).
//!
//! Invariants:
//! - Only a Node worker (a channel, and it never said it speaks nodus's own messages) is looked
//!   at: a nodus worker drains on its own deadline and exits by itself; a plain program got
//!   SIGTERM at once.
//! - Nothing is read before the channel ended (the worker's servers no longer accept then), and
//!   nothing after the worker exited (the caller stops polling): its sockets are read only while
//!   it drains.
//! - An inbound connection is a connected TCP socket (any state but `LISTEN` and `CLOSE`:
//!   `ESTABLISHED`, `CLOSE_WAIT`, a half-closed `FIN_WAIT`...) among the fds of the worker process
//!   itself (all its threads; not its children's: they are its business while it runs, and
//!   its group is killed once it exits) whose local port is one the cluster listens on (the
//!   primary's TCP listeners, every policy, and those it released lately: a worker may still
//!   serve a connection of a server it closed) or one of the worker's own listening TCP sockets
//!   (an `exclusive` server) listens on. Outbound connections (a database pool) have an ephemeral
//!   local port and do not count. On a cluster's Unix socket path (Node's `listen(path)`), an
//!   inbound connection is a connected Unix socket of the worker's whose address is that path
//!   (an accepted socket carries its listener's), read in `/proc/PID/net/unix`; a Unix
//!   socket it connected itself (unbound) does not count.
//! - The sockets are the worker's `/proc/PID/fd` links (`socket:[INODE]`) matched by inode to
//!   the TCP sockets of its network namespace. Those come from `NETLINK_SOCK_DIAG`
//!   ([`sock_diag`]): first the listening ones (few, even on a busy host), for the worker's own
//!   ports, then only the connected ones on those ports and the cluster's (the kernel filters by
//!   state and local port), so a host with very many sockets does not send them all every
//!   [`POLL`].
//!   `/proc/PID/net/tcp` and `tcp6` (the whole table, every socket) are read instead when the
//!   worker is in another network namespace than the primary (the primary's netlink socket sees
//!   its own), or netlink fails (`EPERM` in some containers, no `inet_diag` in the kernel). If
//!   the worker's fds cannot be read (`hidepid`, another user's process), or neither source, the
//!   worker is never idle ([`until_idle`] never returns): the deadline rule applies as before.
//! - They are read on the I/O pool, never on the primary's loop thread: even filtered, a
//!   namespace's sockets are walked by the kernel (and the fallback's tables are megabytes on a
//!   busy host) while the loop accepts and hands on connections.
//! - Output it could not write yet: its captured pipes say so (`Captured::backlog`: a pipe the
//!   primary has not emptied, or one full lately), and, for any stdout or stderr (captured or
//!   not), an epoll set of the worker's that waits for its fd 1 or 2 to take more
//!   ([`writes_waiting`]: `EPOLLOUT` on that file in `/proc/PID/fdinfo`, libuv's sign of a
//!   stream's non-empty write queue). Nothing is looked at before [`DISCONNECT_GRACE`] has
//!   passed since the channel ended.

use std::collections::HashSet;
use std::io;
use std::rc::Rc;
use std::time::{Duration, Instant};

use super::proc::Proc;
use super::{State, server};

mod sock_diag;

/// How often a draining Node worker is looked at once its channel ended.
const POLL: Duration = Duration::from_millis(50);

/// How long after its channel ended a Node worker gets at least before the early SIGTERM: its
/// `disconnect` handlers' time (Node emits `disconnect` then) to finish what they started, a
/// flush to a collector, a last write to a database, as under Node's own primary, which waits
/// for the worker's exit. A second keeps a stop short (a worker a timer keeps alive still stops
/// a second after its `disconnect`, not at its drain deadline) while a flush over a local
/// network gets through; longer work belongs in a SIGTERM handler, which that SIGTERM runs.
pub(super) const DISCONNECT_GRACE: Duration = Duration::from_secs(1);

/// Returns once `proc`, a Node worker asked to stop, has ended its channel, [`DISCONNECT_GRACE`]
/// has passed since, and it holds no inbound connection (TCP, or Unix on a cluster path) and no
/// output it could not write yet; never, for another kind of worker or when its fds cannot be
/// read.
pub(super) async fn until_idle(st: &Rc<State>, proc: &Rc<Proc>) {
    if proc.channel.is_none() || proc.speaks_nodus.get() {
        return std::future::pending().await;
    }
    let ports = std::sync::Arc::new(server::tcp_ports(st));
    let paths = std::sync::Arc::new(server::unix_paths(st));
    let pid = proc.pid;
    let mut ended_at = None;
    loop {
        crate::time::sleep(POLL).await;
        if !proc.channel_ended.get() {
            continue;
        }
        let ended_at = *ended_at.get_or_insert_with(Instant::now);
        if ended_at.elapsed() < DISCONNECT_GRACE || proc.output.backlog() {
            continue;
        }
        // On the I/O pool: the kernel walks every TCP socket of the namespace (and the
        // fallback's tables are megabytes on a busy host) while the loop accepts connections.
        let (ports, paths) = (ports.clone(), paths.clone());
        let held = crate::pool::offload_io(move || busy(pid, &ports, &paths))
            .await
            .map_err(io::Error::other)
            .and_then(|held| held);
        match held {
            Ok(false) => return,
            Ok(true) => {}
            Err(e) => {
                tracing::debug!(
                    target: "nodus::cluster",
                    "worker {} (pid {}): cannot read its fds ({e}): SIGTERM only after its \
                     drain deadline",
                    proc.slot, proc.pid
                );
                return std::future::pending().await;
            }
        }
    }
}

/// Whether process `pid` holds an inbound connection ([`holds_inbound`]) or waits to write to its
/// stdout or stderr ([`writes_waiting`]).
fn busy(pid: u32, ports: &HashSet<u16>, paths: &HashSet<String>) -> io::Result<bool> {
    let fds = fds(pid)?;
    Ok(writes_waiting(pid, &fds.epolls) || holds_inbound(pid, &fds.sockets, ports, paths)?)
}

/// Whether process `pid` holds a connected TCP socket (among its sockets, `inodes`) whose local
/// port is in `ports` or is one it listens on itself, or a connected Unix socket whose address is
/// one of `paths`.
fn holds_inbound(
    pid: u32,
    inodes: &HashSet<u64>,
    ports: &HashSet<u16>,
    paths: &HashSet<String>,
) -> io::Result<bool> {
    if inodes.is_empty() {
        return Ok(false);
    }
    if !paths.is_empty() {
        let table = std::fs::read(format!("/proc/{pid}/net/unix"))?;
        if unix_inbound(inodes, &String::from_utf8_lossy(&table), paths) {
            return Ok(true);
        }
    }
    if same_network_namespace(pid)?
        && let Ok(held) = inbound_by_sock_diag(inodes, ports)
    {
        return Ok(held);
    }
    inbound_in_tables(pid, inodes, ports)
}

/// `EPOLLOUT`: an epoll set waits for its fd to take more.
const EPOLLOUT: u32 = 0x4;

/// Whether an epoll set of process `pid` (its fds `epolls`) waits for its stdout or stderr to
/// take more: libuv watches a stream's fd for writability only while the stream's write queue
/// holds what the fd did not take (Node writes to a pipe or a socket without blocking). Read in
/// `/proc/PID/fdinfo/FD` (`tfd: N events: HEX ... ino:HEX sdev:HEX`), matched by the file (its
/// device and inode), whatever fd number the set has it under. What cannot be read says no.
fn writes_waiting(pid: u32, epolls: &[u32]) -> bool {
    let files: Vec<(u64, u64)> = [1, 2]
        .iter()
        .filter_map(|fd| std::fs::metadata(format!("/proc/{pid}/fd/{fd}")).ok())
        .map(|m| {
            use std::os::unix::fs::MetadataExt;
            (kernel_dev(m.dev()), m.ino())
        })
        .collect();
    !files.is_empty()
        && epolls.iter().any(|epoll| {
            std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{epoll}"))
                .is_ok_and(|info| epoll_waits_to_write(&info, &files))
        })
}

/// A device number as the kernel prints it in fdinfo (`MAJOR << 20 | MINOR`), from `stat`'s
/// encoding of it.
fn kernel_dev(dev: u64) -> u64 {
    (u64::from(libc::major(dev)) << 20) | u64::from(libc::minor(dev))
}

/// Whether the epoll fdinfo `info` has an entry for one of `files` (device as the kernel prints
/// it, inode) that waits for `EPOLLOUT`.
fn epoll_waits_to_write(info: &str, files: &[(u64, u64)]) -> bool {
    info.lines().filter(|l| l.starts_with("tfd:")).any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let hex = |key: &str| {
            let at = fields.iter().position(|f| *f == key)?;
            u64::from_str_radix(fields.get(at + 1)?, 16).ok()
        };
        let tagged = |tag: &str| {
            let value = fields.iter().find_map(|f| f.strip_prefix(tag))?;
            u64::from_str_radix(value, 16).ok()
        };
        let (Some(events), Some(ino), Some(dev)) =
            (hex("events:"), tagged("ino:"), tagged("sdev:"))
        else {
            return false;
        };
        events & u64::from(EPOLLOUT) != 0 && files.contains(&(dev, ino))
    })
}

/// Whether process `pid` is in this process's network namespace.
fn same_network_namespace(pid: u32) -> io::Result<bool> {
    use std::os::unix::fs::MetadataExt;
    let ns = |pid: &str| std::fs::metadata(format!("/proc/{pid}/ns/net"));
    let (theirs, ours) = (ns(&pid.to_string())?, ns("self")?);
    Ok((theirs.dev(), theirs.ino()) == (ours.dev(), ours.ino()))
}

/// [`any_inbound`]'s answer from this network namespace's sockets through `NETLINK_SOCK_DIAG`.
fn inbound_by_sock_diag(inodes: &HashSet<u64>, ports: &HashSet<u16>) -> io::Result<bool> {
    use std::ops::ControlFlow::{Break, Continue};
    let mut diag = sock_diag::Diag::open()?;
    let mut wanted: Vec<u16> = ports.iter().copied().collect();
    for family in [libc::AF_INET, libc::AF_INET6] {
        let _ = diag.dump(family, sock_diag::LISTENING, None, |port, inode| {
            if inodes.contains(&inode) {
                wanted.push(port);
            }
            Continue(())
        })?;
    }
    if wanted.is_empty() {
        return Ok(false);
    }
    wanted.sort_unstable();
    wanted.dedup();
    for family in [libc::AF_INET, libc::AF_INET6] {
        let found = diag.dump(family, sock_diag::CONNECTED, Some(&wanted), |_, inode| {
            if inodes.contains(&inode) {
                Break(())
            } else {
                Continue(())
            }
        })?;
        if found.is_break() {
            return Ok(true);
        }
    }
    Ok(false)
}

/// [`any_inbound`] with process `pid`'s `/proc/PID/net/tcp` and `tcp6`.
fn inbound_in_tables(pid: u32, inodes: &HashSet<u64>, ports: &HashSet<u16>) -> io::Result<bool> {
    let mut tables = Vec::with_capacity(2);
    for table in ["tcp", "tcp6"] {
        match std::fs::read_to_string(format!("/proc/{pid}/net/{table}")) {
            Ok(text) => tables.push(text),
            // No IPv6 in this kernel: no `tcp6`.
            Err(e) if table == "tcp6" && e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(any_inbound(inodes, &tables, ports))
}

/// TCP states (`include/net/tcp_states.h`) of a socket that is not connected.
const TCP_CLOSE: u8 = 0x07;
const TCP_LISTEN: u8 = 0x0A;

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

/// `SS_CONNECTED`, a Unix socket's `St` in `/proc/net/unix`.
const UNIX_CONNECTED: &str = "03";

/// Whether a socket of `inodes` is, in the `/proc/net/unix` `table` (`Num RefCount Protocol Flags
/// Type St Inode Path`), a connected one whose address is one of `paths`.
fn unix_inbound(inodes: &HashSet<u64>, table: &str, paths: &HashSet<String>) -> bool {
    table.lines().skip(1).any(|line| {
        // Seven fields, then the path as it is (it may hold spaces).
        let (mut fields, mut rest) = (Vec::with_capacity(7), line);
        while fields.len() < 7 {
            let field = rest.trim_start();
            let end = field.find(' ').unwrap_or(field.len());
            fields.push(&field[..end]);
            rest = &field[end..];
        }
        let Some(path) = rest.strip_prefix(' ') else {
            return false;
        };
        fields[5] == UNIX_CONNECTED
            && fields[6].parse().is_ok_and(|i: u64| inodes.contains(&i))
            && paths.contains(path)
    })
}

/// What matters here of a process's open fds.
struct Fds {
    /// The inodes of its sockets.
    sockets: HashSet<u64>,
    /// Its epoll fds.
    epolls: Vec<u32>,
}

/// The sockets and epoll sets among process `pid`'s open fds.
fn fds(pid: u32) -> io::Result<Fds> {
    let mut fds = Fds {
        sockets: HashSet::new(),
        epolls: Vec::new(),
    };
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd"))? {
        let entry = entry?;
        // An fd closed since the listing: skipped.
        let Ok(target) = std::fs::read_link(entry.path()) else {
            continue;
        };
        let Some(target) = target.to_str() else {
            continue;
        };
        if target == "anon_inode:[eventpoll]" {
            if let Some(fd) = entry.file_name().to_str().and_then(|n| n.parse().ok()) {
                fds.epolls.push(fd);
            }
        } else if let Some(inode) = target
            .strip_prefix("socket:[")
            .and_then(|t| t.strip_suffix(']'))
            .and_then(|t| t.parse().ok())
        {
            fds.sockets.insert(inode);
        }
    }
    Ok(fds)
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
    use std::net::{TcpListener, TcpStream};

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

    /// A socket's inode.
    fn inode(fd: impl std::os::fd::AsFd) -> u64 {
        rustix::fs::fstat(fd).unwrap().st_ino
    }

    /// Whether the sockets `inodes` of this process hold an inbound connection on `ports` or on
    /// one they listen on, asked of both sources (netlink, and the `/proc` tables it falls back
    /// to), which must agree.
    fn inbound(inodes: &[u64], ports: &[u16]) -> bool {
        let inodes: HashSet<u64> = inodes.iter().copied().collect();
        let ports: HashSet<u16> = ports.iter().copied().collect();
        let by_diag = inbound_by_sock_diag(&inodes, &ports).unwrap();
        let by_tables = inbound_in_tables(std::process::id(), &inodes, &ports).unwrap();
        assert_eq!(
            by_diag, by_tables,
            "netlink and /proc/net/tcp disagree: sockets {inodes:?}, ports {ports:?}"
        );
        by_diag
    }

    /// A listener on 127.0.0.1, a connection to it from this process and its accepted end.
    fn listener_client_served() -> (TcpListener, TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (served, _) = listener.accept().unwrap();
        (listener, client, served)
    }

    /// Sockets of this test (their inodes; other tests' sockets are in the namespace too): an
    /// accepted connection on a cluster port counts, an outbound one (ephemeral local port) does
    /// not, and a port the process listens on itself counts as a cluster port. Both sources.
    #[test]
    fn inbound_connections_are_told_from_outbound_ones() {
        let (listener, client, served) = listener_client_served();
        let port = listener.local_addr().unwrap().port();
        let (l, c, s) = (inode(&listener), inode(&client), inode(&served));
        // Only a listening socket, or only an outbound connection: nothing inbound.
        assert!(!inbound(&[l], &[port]));
        assert!(!inbound(&[c], &[port]));
        assert!(!inbound(&[l, c], &[]));
        // The accepted connection, on a cluster port (among others: the kernel's filter is an OR
        // of ports) or on one the process listens on.
        assert!(inbound(&[c, s], &[port]));
        assert!(inbound(&[c, s], &[1, port, 65535]));
        assert!(!inbound(&[c, s], &[1, 65535]));
        assert!(inbound(&[l, s], &[]));
        assert!(inbound(&[l, s], &[1, 65535]));
        assert!(!inbound(&[s], &[]));
        // The client closed: the server's end is in CLOSE_WAIT, still held.
        drop(client);
        std::thread::sleep(Duration::from_millis(50));
        assert!(inbound(&[s], &[port]));
        // This process's own fds are found.
        assert!(fds(std::process::id()).unwrap().sockets.contains(&s));
    }

    /// The kernel sends only what was asked: connected sockets on the given local ports (the
    /// accepted end, never the outbound end whose remote port it is, nor the listener), or
    /// listening ones. With too many ports for its filter, the dump checks them itself.
    #[test]
    fn the_kernel_filters_the_dump_by_state_and_local_port() {
        use std::ops::ControlFlow::Continue;
        let (listener, client, served) = listener_client_served();
        let port = listener.local_addr().unwrap().port();
        let (l, c, s) = (inode(&listener), inode(&client), inode(&served));
        let dump = |states, ports: Option<&[u16]>| {
            let mut seen = Vec::new();
            let mut diag = sock_diag::Diag::open().unwrap();
            let r = diag.dump(libc::AF_INET, states, ports, |port, inode| {
                seen.push((port, inode));
                Continue(())
            });
            assert!(r.unwrap().is_continue());
            seen
        };
        let mut few = vec![1, port, 65535];
        few.sort_unstable();
        let mut many: Vec<u16> = (1..=1024).chain([port]).collect();
        many.sort_unstable();
        many.dedup();
        for ports in [&few, &many] {
            let seen = dump(sock_diag::CONNECTED, Some(ports));
            assert!(seen.iter().all(|(p, _)| ports.contains(p)), "{seen:?}");
            assert!(seen.contains(&(port, s)), "{seen:?}");
            assert!(!seen.iter().any(|&(_, i)| i == c || i == l), "{seen:?}");
        }
        let seen = dump(sock_diag::LISTENING, None);
        assert!(seen.contains(&(port, l)), "{seen:?}");
        assert!(!seen.iter().any(|&(_, i)| i == c || i == s), "{seen:?}");
    }

    /// From now on, `socket(AF_NETLINK, ...)` fails with `EPERM` on this thread (a seccomp
    /// filter, as some containers have).
    fn refuse_netlink_sockets() {
        const LD_W_ABS: u16 = 0x20;
        const JEQ_K: u16 = 0x15;
        const RET_K: u16 = 0x06;
        // `seccomp_data`: the syscall number at 0, the first argument (64 bits) at 16.
        let first_arg = 16 + if cfg!(target_endian = "big") { 4 } else { 0 };
        let op = |code, jt, jf, k| libc::sock_filter { code, jt, jf, k };
        let mut filter = [
            op(LD_W_ABS, 0, 0, 0),
            op(JEQ_K, 0, 3, libc::SYS_socket as u32),
            op(LD_W_ABS, 0, 0, first_arg),
            op(JEQ_K, 0, 1, libc::AF_NETLINK as u32),
            op(RET_K, 0, 0, libc::SECCOMP_RET_ERRNO | libc::EPERM as u32),
            op(RET_K, 0, 0, libc::SECCOMP_RET_ALLOW),
        ];
        let prog = libc::sock_fprog {
            len: filter.len() as u16,
            filter: filter.as_mut_ptr(),
        };
        // SAFETY: prctl with integer arguments, then with a pointer to a filter program that
        // outlives the call (the kernel copies it).
        unsafe {
            assert_eq!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
            let r = libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER, &prog);
            assert_eq!(r, 0, "seccomp: {}", io::Error::last_os_error());
        }
    }

    #[test]
    fn an_accepted_unix_connection_on_a_cluster_path_is_inbound_an_outbound_one_is_not() {
        use std::os::unix::net::{UnixListener, UnixStream};
        let dir = nodus_testkit::tmp::TempDir::new("conns-unix");
        let path = dir.path().join("app sock");
        let listener = UnixListener::bind(&path).unwrap();
        let paths = HashSet::from([path.to_str().unwrap().to_owned()]);
        let me = std::process::id();
        let held = |paths: &HashSet<String>| {
            let inodes = fds(me).unwrap().sockets;
            let table = std::fs::read_to_string("/proc/self/net/unix").unwrap();
            unix_inbound(&inodes, &table, paths)
        };
        let client = UnixStream::connect(&path).unwrap();
        // Queued, not accepted; the client's own end has no address.
        assert!(!held(&paths));
        let (served, _) = listener.accept().unwrap();
        assert!(held(&paths));
        assert!(!held(&HashSet::from(["/elsewhere.sock".to_owned()])));
        drop(served);
        assert!(!held(&paths));
        drop(client);
    }

    /// The whole check on this process's own fds (alone in a fresh process: no other test's
    /// sockets): through netlink, then, netlink refused, through the `/proc` tables.
    #[test]
    fn a_process_holds_an_inbound_connection_with_or_without_netlink() {
        if !crate::process::alone::alone(
            "cluster::primary::conns::tests::\
             a_process_holds_an_inbound_connection_with_or_without_netlink",
        ) {
            return;
        }
        let me = std::process::id();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let cluster = HashSet::from([listener.local_addr().unwrap().port()]);
        let _client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        // Not accepted yet: in the listener's queue, no fd of this process's.
        let none = HashSet::new();
        let held = || holds_inbound(me, &fds(me).unwrap().sockets, &cluster, &none).unwrap();
        assert!(!held());
        let (served, _) = listener.accept().unwrap();
        assert!(held());
        refuse_netlink_sockets();
        let refused = sock_diag::Diag::open().err().and_then(|e| e.raw_os_error());
        assert_eq!(refused, Some(libc::EPERM));
        assert!(held());
        drop(served);
        assert!(!held());
    }

    #[test]
    fn an_epoll_entry_for_stdout_waiting_to_write_is_found_by_its_file() {
        // Node's loop under a full stdout pipe (inode 0xd1268 on pipefs, device 0xf): its
        // signalfd and an eventfd wait to read, fd 1 waits to write (EPOLLOUT|EPOLLERR|EPOLLHUP).
        let info = "pos:\t0\nflags:\t02000002\nmnt_id:\t17\nino:\t1038\n\
                    tfd:       15 events:       19 data:                f  pos:0 ino:d126b sdev:f\n\
                    tfd:       17 events:       19 data:               11  pos:0 ino:40e sdev:10\n\
                    tfd:        1 events:       1c data:                1  pos:0 ino:d1268 sdev:f\n";
        let stdout = (0xf, 0xd1268);
        assert!(epoll_waits_to_write(info, &[stdout]));
        assert!(epoll_waits_to_write(info, &[(0xf, 1), stdout]));
        // Another file, or the same inode number on another device: no.
        assert!(!epoll_waits_to_write(info, &[(0xf, 0xd1269)]));
        assert!(!epoll_waits_to_write(info, &[(0x10, 0xd1268)]));
        // Watched for reading only (its queue empty, libuv dropped EPOLLOUT).
        let read_only = info.replace("events:       1c", "events:       19");
        assert!(!epoll_waits_to_write(&read_only, &[stdout]));
        // The header's own `ino:` line is not an entry.
        assert!(!epoll_waits_to_write(info, &[(0xf, 0x1038)]));
        assert_eq!(kernel_dev(libc::makedev(0, 0xf)), 0xf);
        assert_eq!(kernel_dev(libc::makedev(8, 0x101)), (8 << 20) | 0x101);
    }

    /// A pipe this process waits to write to, as libuv does with a stream's queue: found in its
    /// own epoll set's fdinfo, by the file stdout is.
    #[test]
    fn this_process_waiting_to_write_to_a_pipe_is_seen_in_its_fdinfo() {
        let (_reader, writer) = std::io::pipe().unwrap();
        let epoll =
            rustix::event::epoll::create(rustix::event::epoll::CreateFlags::CLOEXEC).unwrap();
        let me = std::process::id();
        let epolls = || -> Vec<u32> { fds(me).unwrap().epolls };
        assert!(epolls().contains(&(std::os::fd::AsRawFd::as_raw_fd(&epoll) as u32)));
        let meta = rustix::fs::fstat(&writer).unwrap();
        let file = (kernel_dev(meta.st_dev), meta.st_ino);
        let info = || {
            std::fs::read_to_string(format!(
                "/proc/self/fdinfo/{}",
                std::os::fd::AsRawFd::as_raw_fd(&epoll)
            ))
            .unwrap()
        };
        use rustix::event::epoll;
        epoll::add(
            &epoll,
            &writer,
            epoll::EventData::new_u64(1),
            epoll::EventFlags::IN,
        )
        .unwrap();
        assert!(!epoll_waits_to_write(&info(), &[file]));
        epoll::modify(
            &epoll,
            &writer,
            epoll::EventData::new_u64(1),
            epoll::EventFlags::OUT,
        )
        .unwrap();
        assert!(epoll_waits_to_write(&info(), &[file]));
    }
}
