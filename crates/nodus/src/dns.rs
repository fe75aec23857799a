//! Name resolution through the system resolver (`getaddrinfo`), on the I/O pool: Node's
//! `dns.lookup`.
//!
//! `getaddrinfo` blocks, sometimes for seconds (a dead DNS server, a slow NSS module). Like libuv,
//! nodus submits it as *slow* work: at most `(n + 1) / 2` of the I/O pool's `n` threads resolve
//! names at once, so the rest always serve file I/O. Further lookups wait in the queue.
//!
//! Invariants: a literal IP address is returned without touching the pool; a host name is
//! checked (non-empty, at most 253 bytes, no NUL) before it reaches the resolver; errors name the
//! host and the resolver's code, Node's (`getaddrinfo 'nope.invalid': ENOTFOUND (...)`), and their
//! kind tells a name that does not exist (`NotFound`: `EAI_NONAME`, `EAI_NODATA`) from a failure
//! worth retrying (`TimedOut`: `EAI_AGAIN`); `EAI_SYSTEM` carries the OS error.

use std::ffi::{CStr, CString};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::raw::c_int;

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

/// `getaddrinfo(host)` for stream sockets, any family. (std's `to_socket_addrs` would do, but
/// it flattens the `EAI_*` code into a message: a caller could not tell "no such name" from
/// "the DNS server did not answer".)
fn system_resolve(host: &str) -> io::Result<Vec<IpAddr>> {
    let name = CString::new(host).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `addrinfo` is plain C data; all-zero is a valid value (null pointers, no flags).
    let mut hints: libc::addrinfo = unsafe { std::mem::zeroed() };
    hints.ai_family = libc::AF_UNSPEC;
    hints.ai_socktype = libc::SOCK_STREAM;
    let mut list: *mut libc::addrinfo = std::ptr::null_mut();
    // SAFETY: `name` is NUL-terminated and outlives the call, `hints` is initialized, and `list`
    // is a valid out-pointer; a list returned is freed below, once.
    let code = unsafe { libc::getaddrinfo(name.as_ptr(), std::ptr::null(), &hints, &mut list) };
    if code != 0 {
        return Err(resolver_error(code));
    }
    let mut addrs = Vec::new();
    let mut entry = list;
    while !entry.is_null() {
        // SAFETY: `entry` is a node of the list getaddrinfo returned, not yet freed; its
        // `ai_addr` points to `ai_addrlen` bytes of a socket address of its family.
        unsafe {
            let ai = &*entry;
            if let Some(addr) = socket_addr(ai.ai_addr, ai.ai_addrlen) {
                addrs.push(addr.ip());
            }
            entry = ai.ai_next;
        }
    }
    // SAFETY: `list` came from a successful getaddrinfo and is freed only here.
    unsafe { libc::freeaddrinfo(list) };
    Ok(addrs)
}

/// The IPv4 or IPv6 address at `addr` (`len` bytes), if it is one.
///
/// # Safety
/// `addr` points to at least `len` readable bytes of a socket address.
unsafe fn socket_addr(addr: *const libc::sockaddr, len: libc::socklen_t) -> Option<SocketAddr> {
    if addr.is_null() {
        return None;
    }
    // SAFETY: the caller's contract; the family is checked against the length before the cast,
    // and `read_unaligned` needs no alignment.
    unsafe {
        match c_int::from((*addr).sa_family) {
            libc::AF_INET if len as usize >= size_of::<libc::sockaddr_in>() => {
                let v4 = std::ptr::read_unaligned(addr.cast::<libc::sockaddr_in>());
                let ip = std::net::Ipv4Addr::from(u32::from_be(v4.sin_addr.s_addr));
                Some(SocketAddr::new(ip.into(), 0))
            }
            libc::AF_INET6 if len as usize >= size_of::<libc::sockaddr_in6>() => {
                let v6 = std::ptr::read_unaligned(addr.cast::<libc::sockaddr_in6>());
                let ip = std::net::Ipv6Addr::from(v6.sin6_addr.s6_addr);
                Some(SocketAddr::new(ip.into(), 0))
            }
            _ => None,
        }
    }
}

/// The error for a `getaddrinfo` failure `code`: its kind (see the module doc) and Node's code.
fn resolver_error(code: c_int) -> io::Error {
    let (kind, node_code) = match code {
        libc::EAI_NONAME | libc::EAI_NODATA => (io::ErrorKind::NotFound, "ENOTFOUND"),
        libc::EAI_AGAIN => (io::ErrorKind::TimedOut, "EAI_AGAIN"),
        libc::EAI_SYSTEM => return io::Error::last_os_error(),
        libc::EAI_MEMORY => (io::ErrorKind::OutOfMemory, "EAI_MEMORY"),
        libc::EAI_FAIL => (io::ErrorKind::Other, "EAI_FAIL"),
        _ => (io::ErrorKind::Other, "EAI_OTHER"),
    };
    // SAFETY: gai_strerror returns a pointer to a static NUL-terminated string for any code.
    let text = unsafe { CStr::from_ptr(libc::gai_strerror(code)) };
    io::Error::new(kind, format!("{node_code} ({})", text.to_string_lossy()))
}

fn host_error(host: &str, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("getaddrinfo '{host}': {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolver_errors_say_what_happened_as_node_does() {
        let not_found = resolver_error(libc::EAI_NONAME);
        assert_eq!(not_found.kind(), io::ErrorKind::NotFound);
        assert!(
            not_found.to_string().starts_with("ENOTFOUND ("),
            "{not_found}"
        );
        assert_eq!(
            resolver_error(libc::EAI_NODATA).kind(),
            io::ErrorKind::NotFound
        );
        let again = resolver_error(libc::EAI_AGAIN);
        assert_eq!(again.kind(), io::ErrorKind::TimedOut);
        assert!(again.to_string().starts_with("EAI_AGAIN ("), "{again}");
        assert_eq!(resolver_error(libc::EAI_FAIL).kind(), io::ErrorKind::Other);
    }

    #[test]
    fn localhost_resolves_through_getaddrinfo() {
        let addrs = system_resolve("localhost").unwrap();
        assert!(addrs.iter().all(|a| a.is_loopback()), "{addrs:?}");
        assert!(!addrs.is_empty());
    }
}
