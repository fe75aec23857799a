//! Connections a listener has yet to accept, as the kernel lists them (`/proc/net/tcp` and
//! `/proc/net/tcp6`): those half-open (SYN received, as a deferred accept holds a client that
//! has said nothing yet) and those queued for `accept` (established or closed by their client,
//! and no process's socket yet: inode 0). A server that stops deferring at a drain accepts on
//! while any is left, rather than have the kernel reset them as its listener closes.
//!
//! - Rows match on the local port, and on the local address unless the listener's is the
//!   wildcard (an IPv4-mapped IPv6 address matches as its IPv4 one). Other sockets bound to the
//!   same port (`SO_REUSEPORT` siblings, other processes') are counted too: a count may be high,
//!   never low, and a caller waits for it with a bound.
//! - The files are read on the I/O pool (`pool::offload_io`), never on the loop. A system
//!   without them (no `/proc`) is an error, as is a pool that cannot take the work.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// `/proc/net/tcp`'s states: SYN received, established, close-wait (the client sent its FIN).
const SYN_RECV: u8 = 0x03;
const ESTABLISHED: u8 = 0x01;
const CLOSE_WAIT: u8 = 0x08;

/// How many connections to `listener` (its local address) the kernel holds that no process has
/// accepted: half-open ones and those queued for `accept` (see the module docs).
pub async fn unaccepted(listener: SocketAddr) -> io::Result<usize> {
    crate::pool::offload_io(move || count(listener))
        .await
        .map_err(io::Error::other)?
}

fn count(listener: SocketAddr) -> io::Result<usize> {
    let mut n = 0;
    for file in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = match std::fs::read_to_string(file) {
            Ok(text) => text,
            // A kernel without IPv6 has no tcp6.
            Err(e) if e.kind() == io::ErrorKind::NotFound && file.ends_with('6') => continue,
            Err(e) => return Err(e),
        };
        n += text
            .lines()
            .skip(1)
            .filter(|row| unaccepted_row(row, listener))
            .count();
    }
    Ok(n)
}

/// Whether `row` (`sl local rem st tx:rx tr:when retrnsmt uid timeout inode ...`) is a
/// connection to `listener` not accepted yet.
fn unaccepted_row(row: &str, listener: SocketAddr) -> bool {
    let f: Vec<&str> = row.split_whitespace().collect();
    let (Some(local), Some(state), Some(inode)) = (f.get(1), f.get(3), f.get(9)) else {
        return false;
    };
    let Some((ip, port)) = parse_addr(local) else {
        return false;
    };
    let listen_ip = listener.ip().to_canonical();
    if port != listener.port() || !(listen_ip.is_unspecified() || ip.to_canonical() == listen_ip) {
        return false;
    }
    match u8::from_str_radix(state, 16) {
        Ok(SYN_RECV) => true,
        Ok(ESTABLISHED | CLOSE_WAIT) => *inode == "0",
        _ => false,
    }
}

/// `0100007F:1F90` (IPv4) or 32 hex digits `:PORT` (IPv6): each 32-bit word of the address as
/// the kernel holds it (network order) printed as a native integer; the port in hex.
fn parse_addr(s: &str) -> Option<(IpAddr, u16)> {
    let (addr, port) = s.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |i: usize| {
        addr.get(i * 8..i * 8 + 8)
            .and_then(|w| u32::from_str_radix(w, 16).ok())
            .map(u32::to_ne_bytes)
    };
    let ip = match addr.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(0)?)),
        32 => {
            let mut octets = [0u8; 16];
            for i in 0..4 {
                octets[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
            IpAddr::V6(Ipv6Addr::from(octets))
        }
        _ => return None,
    };
    Some((ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(local: &str, state: &str, inode: &str) -> String {
        format!(
            "   0: {local} 0100007F:D431 {state} 00000000:00000000 00:00000000 00000000  1000 \
             0 {inode} 1 0000000000000000 20 4 30 10 -1"
        )
    }

    #[test]
    fn rows_match_on_port_address_state_and_inode() {
        let at = |s: &str| s.parse::<SocketAddr>().unwrap();
        let local = "0100007F:1F90"; // 127.0.0.1:8080
        assert!(unaccepted_row(&row(local, "03", "0"), at("127.0.0.1:8080")));
        assert!(unaccepted_row(&row(local, "03", "0"), at("0.0.0.0:8080")));
        assert!(unaccepted_row(&row(local, "03", "0"), at("[::]:8080")));
        assert!(unaccepted_row(&row(local, "01", "0"), at("127.0.0.1:8080")));
        assert!(unaccepted_row(&row(local, "08", "0"), at("127.0.0.1:8080")));
        assert!(!unaccepted_row(
            &row(local, "01", "4242"),
            at("127.0.0.1:8080")
        ));
        assert!(!unaccepted_row(
            &row(local, "0A", "4242"),
            at("127.0.0.1:8080")
        ));
        assert!(!unaccepted_row(
            &row(local, "06", "0"),
            at("127.0.0.1:8080")
        ));
        assert!(!unaccepted_row(
            &row(local, "03", "0"),
            at("127.0.0.2:8080")
        ));
        assert!(!unaccepted_row(
            &row(local, "03", "0"),
            at("127.0.0.1:8081")
        ));
        let v6 = "00000000000000000000000001000000:1F90"; // [::1]:8080
        assert!(unaccepted_row(&row(v6, "03", "0"), at("[::1]:8080")));
        assert!(!unaccepted_row(&row(v6, "03", "0"), at("127.0.0.1:8080")));
        let mapped = "0000000000000000FFFF00000100007F:1F90"; // [::ffff:127.0.0.1]:8080
        assert!(unaccepted_row(
            &row(mapped, "03", "0"),
            at("127.0.0.1:8080")
        ));
    }

    #[test]
    fn a_connection_queued_for_accept_is_counted_until_accepted() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        assert_eq!(count(addr).unwrap(), 0);
        let _client = std::net::TcpStream::connect(addr).unwrap();
        assert_eq!(count(addr).unwrap(), 1);
        let _accepted = listener.accept().unwrap();
        assert_eq!(count(addr).unwrap(), 0);
    }
}
