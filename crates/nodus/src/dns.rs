//! Name resolution through the system resolver (`getaddrinfo`), on the I/O pool: Node's
//! `dns.lookup`.
//!
//! `getaddrinfo` blocks, sometimes for seconds (a dead DNS server, a slow NSS module). Like libuv,
//! nodus submits it as *slow* work: at most `(n + 1) / 2` of the I/O pool's `n` threads resolve
//! names at once, so the rest always serve file I/O. Further lookups wait in the queue.
//!
//! Invariants: a literal IP address is returned without touching the pool; a host name is
//! checked (non-empty, at most 253 bytes, no NUL) before it reaches the resolver; errors name the
//! host (`getaddrinfo 'nope.invalid': ...`).

use std::io;
use std::net::{IpAddr, ToSocketAddrs};

use crate::pool;

/// Longest host name accepted (RFC 1035's 253 characters in text form).
pub const MAX_HOST_LEN: usize = 253;

/// The addresses `host` resolves to, in the resolver's order without duplicates (Node's
/// `dns.lookup(host, { all: true })`).
pub async fn lookup(host: &str) -> io::Result<Vec<IpAddr>> {
    lookup_with(host, system_resolve).await
}

/// The first address `host` resolves to (Node's `dns.lookup(host)`).
pub async fn lookup_one(host: &str) -> io::Result<IpAddr> {
    lookup(host)
        .await?
        .into_iter()
        .next()
        .ok_or_else(|| host_error(host, io::Error::from(io::ErrorKind::NotFound)))
}

/// `lookup` with another resolver in place of `getaddrinfo`, run the same way (as slow work on
/// the I/O pool). For tests that need a resolver that blocks or fails.
#[doc(hidden)]
pub async fn lookup_with<R>(host: &str, resolve: R) -> io::Result<Vec<IpAddr>>
where
    R: FnOnce(&str) -> io::Result<Vec<IpAddr>> + Send + 'static,
{
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(vec![ip]);
    }
    let invalid = |why: &str| {
        let e = io::Error::new(io::ErrorKind::InvalidInput, why.to_owned());
        host_error(host, e)
    };
    if host.is_empty() {
        return Err(invalid("empty host name"));
    }
    if host.len() > MAX_HOST_LEN {
        return Err(invalid("host name longer than 253 bytes"));
    }
    if host.contains('\0') {
        return Err(invalid("host name contains a NUL byte"));
    }
    let owned = host.to_owned();
    let found = pool::io().offload_slow(move || resolve(&owned)).await?;
    let mut addrs = found.map_err(|e| host_error(host, e))?;
    let mut seen = Vec::with_capacity(addrs.len());
    addrs.retain(|a| {
        let new = !seen.contains(a);
        seen.push(*a);
        new
    });
    Ok(addrs)
}

fn system_resolve(host: &str) -> io::Result<Vec<IpAddr>> {
    Ok((host, 0).to_socket_addrs()?.map(|a| a.ip()).collect())
}

fn host_error(host: &str, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("getaddrinfo '{host}': {e}"))
}
