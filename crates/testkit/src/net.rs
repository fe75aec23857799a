//! Free loopback addresses: bound on 127.0.0.1 port 0, then released, for a server under test to
//! bind next (a race with other processes is possible but unlikely).

use std::net::{SocketAddr, TcpListener};

/// `N` distinct loopback addresses that were free a moment ago (bound together, then released).
pub fn free_addrs<const N: usize>() -> [SocketAddr; N] {
    let listeners: [TcpListener; N] =
        std::array::from_fn(|_| TcpListener::bind("127.0.0.1:0").unwrap());
    listeners.map(|l| l.local_addr().unwrap())
}

/// A loopback address that was free a moment ago.
pub fn free_addr() -> SocketAddr {
    let [addr] = free_addrs();
    addr
}
