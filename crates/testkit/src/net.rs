//! Free loopback addresses: bound on 127.0.0.1 port 0, then released, for a server under test to
//! bind next (a race with other processes is possible but unlikely); the loopback interface's
//! index.

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

/// The loopback interface's index, as the kernel numbers it.
pub fn loopback_index() -> u32 {
    std::fs::read_to_string("/sys/class/net/lo/ifindex")
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}
