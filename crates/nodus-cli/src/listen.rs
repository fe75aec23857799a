//! The listeners of `nodus serve` and `nodus run`, bound the same way by both: one message for
//! an address that cannot be bound (under reuseport too, where the bind itself would join another
//! process's group), and the check, before anything is bound, that no two of the addresses given
//! on the command line name the same socket.
//!
//! Under reuseport every worker binds a socket of its own to the listener's address, so a socket
//! a service manager passed (socket activation) cannot be served that way, and both commands
//! refuse it with [`reuseport_refused`], naming its address: one without `SO_REUSEPORT` refuses
//! the workers' binds, and one with it (a `.socket` unit's `ReusePort=yes`) would stay listening
//! in the manager, which keeps its copy open: the kernel would queue part of the connections
//! there, where nobody accepts them (and systemd's socket is root's, so a service running as
//! another user could not join its group anyway).

use std::net::SocketAddr;

use nodus::net::{ListenOptions, TcpListener};

/// Binds and listens on `addr`, with `SO_REUSEPORT` for the reuseport policy (so a busy address
/// is reported here, before any worker starts, and port 0 is resolved to the port every worker
/// binds).
pub fn bind(addr: SocketAddr, reuse_port: bool) -> Result<TcpListener, String> {
    bind_as(addr, reuse_port, "")
}

/// Binds the `--admin` listener on `addr`; a failure names the flag (two addresses are given).
pub fn bind_admin(addr: SocketAddr) -> Result<TcpListener, String> {
    bind_as(addr, false, " (--admin)")
}

/// [`bind`], whose messages say `role` after the address.
fn bind_as(addr: SocketAddr, reuse_port: bool, role: &str) -> Result<TcpListener, String> {
    let in_use = || format!("cannot listen on {addr}{role}: the address is already in use");
    // A reuse-port bind joins any reuse-port group of this user's (another nodus started on the
    // same port by mistake): the kernel would split the traffic between the two.
    if reuse_port && addr.port() != 0 && taken(addr) {
        return Err(in_use());
    }
    let options = ListenOptions {
        reuse_port,
        ..ListenOptions::default()
    };
    TcpListener::bind_with(addr, options).map_err(|e| match e.kind() {
        std::io::ErrorKind::AddrInUse => in_use(),
        _ => format!("cannot listen on {addr}{role}: {e}"),
    })
}

/// The start failure of `--policy reuseport` with `listener`, a socket a service manager
/// passed (see the module doc).
pub fn reuseport_refused(listener: &TcpListener) -> String {
    let addr = listener
        .local_addr()
        .map_or_else(|e| format!("(its address: {e})"), |a| a.to_string());
    let why = if rustix::net::sockopt::socket_reuseport(listener).unwrap_or(false) {
        "the service manager that passed it keeps its own copy listening (systemd does), and the \
         kernel would queue part of the connections there, where no worker accepts them"
    } else {
        "it has no SO_REUSEPORT, so no worker's own socket can bind its address beside it (and \
         ReusePort=yes in a .socket unit would not do: systemd keeps its copy listening, where \
         part of the connections would wait for nobody)"
    };
    format!(
        "--policy reuseport cannot serve the socket passed on {addr} (socket activation): {why}; \
         use --policy rr or shared"
    )
}

/// Whether a socket already listens on `addr` or holds it: then a plain bind (with
/// `SO_REUSEADDR`, so connections in `TIME_WAIT` do not count) fails, whatever options the
/// holder set. The probe never listens, so it takes no connection.
fn taken(addr: SocketAddr) -> bool {
    use rustix::net::{AddressFamily, SocketType, sockopt};
    let family = if addr.is_ipv6() {
        AddressFamily::INET6
    } else {
        AddressFamily::INET
    };
    let Ok(probe) = rustix::net::socket(family, SocketType::STREAM, None) else {
        return false;
    };
    let _ = sockopt::set_socket_reuseaddr(&probe, true);
    if addr.is_ipv6() {
        // Dual-stack, as the listeners are bound: the IPv4 side counts too.
        let _ = sockopt::set_ipv6_v6only(&probe, false);
    }
    rustix::net::bind(&probe, &addr) == Err(rustix::io::Errno::ADDRINUSE)
}

/// Whether binding both `a` and `b` would clash: the same port (port 0 is a new one each time)
/// on the same address, or on any address and one it covers (an IPv6 "any" is dual-stack, as
/// nodus binds it).
pub fn clash(a: SocketAddr, b: SocketAddr) -> bool {
    let covers = |any: SocketAddr, other: SocketAddr| {
        any.ip().is_unspecified() && (any.is_ipv6() || other.is_ipv4())
    };
    a.port() != 0 && a.port() == b.port() && (a.ip() == b.ip() || covers(a, b) || covers(b, a))
}

/// The first clash among the addresses given on the command line (each with its flag), as a
/// usage error's message: found here, it is not reported as a busy address.
pub fn first_clash(addrs: &[(&str, SocketAddr)]) -> Option<String> {
    addrs.iter().enumerate().find_map(|(i, &(flag_b, b))| {
        let &(flag_a, a) = addrs[..i].iter().find(|&&(_, a)| clash(a, b))?;
        Some(match (a == b, flag_a == flag_b) {
            (true, true) => format!("{flag_b} {b} is given twice"),
            (true, false) => format!("{flag_b} {b} is also a {flag_a} address"),
            (false, _) => format!("{flag_b} {b} overlaps {flag_a} {a} (the same port)"),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::{clash, first_clash};

    #[test]
    fn clashes_are_the_same_port_on_overlapping_addresses() {
        let c = |a: &str, b: &str| clash(a.parse().unwrap(), b.parse().unwrap());
        assert!(c("127.0.0.1:80", "127.0.0.1:80"));
        assert!(c("0.0.0.0:80", "127.0.0.1:80"));
        assert!(c("127.0.0.1:80", "[::]:80"));
        assert!(c("[::1]:80", "[::]:80"));
        assert!(!c("127.0.0.1:0", "127.0.0.1:0"));
        assert!(!c("127.0.0.1:80", "127.0.0.1:81"));
        assert!(!c("127.0.0.1:80", "127.0.0.2:80"));
        assert!(!c("0.0.0.0:80", "[::1]:80"));
        assert!(!c("127.0.0.1:80", "[::1]:80"));
    }

    #[test]
    fn the_first_clash_is_named_with_its_flags() {
        let a = |s: &str| s.parse().unwrap();
        let l = a("127.0.0.1:8080");
        assert_eq!(
            first_clash(&[("-l", l), ("-l", a("127.0.0.1:0")), ("-l", l)]).as_deref(),
            Some("-l 127.0.0.1:8080 is given twice")
        );
        assert_eq!(
            first_clash(&[("--listen", l), ("--admin", l)]).as_deref(),
            Some("--admin 127.0.0.1:8080 is also a --listen address")
        );
        assert_eq!(
            first_clash(&[("-l", a("0.0.0.0:8080")), ("-l", l)]).as_deref(),
            Some("-l 127.0.0.1:8080 overlaps -l 0.0.0.0:8080 (the same port)")
        );
        assert_eq!(first_clash(&[("-l", l), ("-l", a("127.0.0.1:8081"))]), None);
    }
}
