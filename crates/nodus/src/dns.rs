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
//!
//! IPv6 zones (scope ids) are kept. An [`Address`] is an IP address with, for IPv6, its scope id
//! ([`Address::socket_addr`] puts it in the `SocketAddrV6`) and the zone as Node shows it
//! ([`Address`]'s `Display`). A literal with a zone, `fe80::1%lo` or `fe80::1%1`, is a literal
//! as in Node (whose `net.isIP` accepts a zone of `[0-9A-Za-z.:-]`): returned as it was written,
//! `fe80::1%lo` (Node 20 prints exactly that), without the pool; a named zone costs one
//! `if_nametoindex` (an ioctl, no network). Unlike Node, which hands back any zone unchecked (the
//! socket then gets scope 0), a name that is no interface here is a `NotFound` error, as
//! `getaddrinfo` makes it (`ENOTFOUND`). An address `getaddrinfo` returns with a scope id (an
//! `/etc/hosts` entry `fe80::1%eth0`) keeps it, shown by interface name.

use std::ffi::{CStr, CString};
use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr, SocketAddrV6};
use std::os::raw::c_int;

use crate::pool;

/// Longest host name accepted (RFC 1035's 253 characters in text form).
pub const MAX_HOST_LEN: usize = 253;

/// One address a lookup found: an IP address and, for IPv6, its scope id and zone.
///
/// `Display` is Node's text for the address: `127.0.0.1`, `::1`, `fe80::1%lo` (the zone as the
/// literal wrote it, by name or number, or the interface's name for a scope id the resolver
/// gave).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Address {
    ip: IpAddr,
    /// The IPv6 scope id (`sin6_scope_id`, an interface index); 0 for none and for IPv4.
    scope_id: u32,
    /// The zone as shown after `%`; `None` without a scope.
    zone: Option<Box<str>>,
}

impl Address {
    /// The IP address (without its zone).
    pub fn ip(&self) -> IpAddr {
        self.ip
    }

    /// The IPv6 scope id (an interface index), 0 when there is none.
    pub fn scope_id(&self) -> u32 {
        self.scope_id
    }

    /// The zone as Node shows it after `%` (`lo`, `1`), if the address has one.
    pub fn zone(&self) -> Option<&str> {
        self.zone.as_deref()
    }

    /// 4 or 6, as Node's `family`.
    pub fn family(&self) -> u8 {
        if self.ip.is_ipv4() { 4 } else { 6 }
    }

    /// The socket address for `port`, with the scope id for IPv6 (what `connect` needs to reach
    /// a link-local address).
    pub fn socket_addr(&self, port: u16) -> SocketAddr {
        match self.ip {
            IpAddr::V4(ip) => SocketAddr::new(ip.into(), port),
            IpAddr::V6(ip) => SocketAddrV6::new(ip, port, 0, self.scope_id).into(),
        }
    }

    /// An address from the resolver: the zone is the scope id's interface name (its number if
    /// no interface has it).
    fn from_socket_addr(addr: SocketAddr) -> Address {
        match addr {
            SocketAddr::V6(v6) if v6.scope_id() != 0 => Address {
                ip: IpAddr::V6(*v6.ip()),
                scope_id: v6.scope_id(),
                zone: Some(interface_name(v6.scope_id()).into()),
            },
            other => Address::from(other.ip()),
        }
    }
}

impl From<IpAddr> for Address {
    fn from(ip: IpAddr) -> Address {
        Address {
            ip,
            scope_id: 0,
            zone: None,
        }
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.zone {
            Some(zone) => write!(f, "{}%{zone}", self.ip),
            None => write!(f, "{}", self.ip),
        }
    }
}

/// The addresses `host` resolves to, in the resolver's order without duplicates (Node's
/// `dns.lookup(host, { all: true })`).
pub async fn lookup(host: &str) -> io::Result<Vec<Address>> {
    lookup_with(host, system_resolve).await
}

/// The first address `host` resolves to (Node's `dns.lookup(host)`).
pub async fn lookup_one(host: &str) -> io::Result<Address> {
    lookup(host)
        .await?
        .into_iter()
        .next()
        .ok_or_else(|| host_error(host, io::Error::from(io::ErrorKind::NotFound)))
}

/// `lookup` with another resolver in place of `getaddrinfo`, run the same way (as slow work on
/// the I/O pool). For tests that need a resolver that blocks or fails.
#[doc(hidden)]
pub async fn lookup_with<R>(host: &str, resolve: R) -> io::Result<Vec<Address>>
where
    R: FnOnce(&str) -> io::Result<Vec<Address>> + Send + 'static,
{
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(vec![ip.into()]);
    }
    if let Some((ip, zone)) = scoped_literal(host) {
        let scope_id = scope_id(zone).map_err(|e| host_error(host, e))?;
        return Ok(vec![Address {
            ip: IpAddr::V6(ip),
            scope_id,
            zone: Some(zone.into()),
        }]);
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
    let found = pool::try_io()?
        .offload_slow(move || resolve(&owned))
        .await?;
    let mut addrs = found.map_err(|e| host_error(host, e))?;
    let mut seen = Vec::with_capacity(addrs.len());
    addrs.retain(|a| {
        let key = (a.ip, a.scope_id);
        let new = !seen.contains(&key);
        seen.push(key);
        new
    });
    Ok(addrs)
}

/// `host` as an IPv6 literal with a zone, read into the address and its scope id: `None` when
/// `host` is not one, an error when the zone names no interface (or is out of range). For
/// `nodus::net`'s string addresses (`"[fe80::1%lo]:80"`), which need no lookup either.
pub(crate) fn zoned_ip(host: &str) -> Option<io::Result<(Ipv6Addr, u32)>> {
    let (ip, zone) = scoped_literal(host)?;
    Some(scope_id(zone).map(|scope_id| (ip, scope_id)))
}

/// `host` as an IPv6 literal with a zone (`fe80::1%lo`, `fe80::1%1`), as Node's `net.isIPv6`
/// accepts it: the zone is one or more of `[0-9A-Za-z.:-]`.
fn scoped_literal(host: &str) -> Option<(Ipv6Addr, &str)> {
    let (ip, zone) = host.split_once('%')?;
    let ip = ip.parse::<Ipv6Addr>().ok()?;
    let node_zone = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | ':' | '-');
    (!zone.is_empty() && zone.chars().all(node_zone)).then_some((ip, zone))
}

/// The scope id a zone names: a number as it is, a name through `if_nametoindex` (`NotFound`,
/// as `getaddrinfo`'s `ENOTFOUND`, when no interface has it).
fn scope_id(zone: &str) -> io::Result<u32> {
    if zone.bytes().all(|b| b.is_ascii_digit()) {
        return zone.parse::<u32>().map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("scope id {zone} is out of range"),
            )
        });
    }
    let no_such = || {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("ENOTFOUND (no network interface named '{zone}')"),
        )
    };
    // `zone` is `[0-9A-Za-z.:-]` only (`scoped_literal`): no NUL.
    let name = CString::new(zone).map_err(|_| no_such())?;
    // SAFETY: `name` is a NUL-terminated string that outlives the call; if_nametoindex only reads
    // it and returns 0 for a name no interface has.
    match unsafe { libc::if_nametoindex(name.as_ptr()) } {
        0 => Err(no_such()),
        index => Ok(index),
    }
}

/// The name of the interface with index `index`, or the number itself when there is none.
fn interface_name(index: u32) -> String {
    let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: `buf` has the IF_NAMESIZE bytes if_indextoname may write (a NUL-terminated name);
    // it returns null and writes nothing useful when no interface has the index.
    let name = unsafe { libc::if_indextoname(index, buf.as_mut_ptr()) };
    if name.is_null() {
        return index.to_string();
    }
    // SAFETY: on success if_indextoname wrote a NUL-terminated name into `buf`.
    unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

/// `getaddrinfo(host)` for stream sockets, any family. (std's `to_socket_addrs` would do, but
/// it flattens the `EAI_*` code into a message: a caller could not tell "no such name" from
/// "the DNS server did not answer".)
fn system_resolve(host: &str) -> io::Result<Vec<Address>> {
    let name = CString::new(host).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `addrinfo` is plain C data; all-zero is a valid value (null pointers, no flags).
    let mut hints: libc::addrinfo = unsafe { std::mem::zeroed() };
    hints.ai_family = libc::AF_UNSPEC;
    hints.ai_socktype = libc::SOCK_STREAM;
    let mut list: *mut libc::addrinfo = std::ptr::null_mut();
    // SAFETY: `name` is NUL-terminated and outlives the call, `hints` is initialized, and `list`
    // is a valid out-pointer; a list returned is freed below, once. It reads the environment
    // (`RES_OPTIONS`, `LOCALDOMAIN`...) through libc's `getenv`, on a pool thread: nodus writes
    // the environment only before it starts any thread (`parent_env`).
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
                addrs.push(Address::from_socket_addr(addr));
            }
            entry = ai.ai_next;
        }
    }
    // SAFETY: `list` came from a successful getaddrinfo and is freed only here.
    unsafe { libc::freeaddrinfo(list) };
    Ok(addrs)
}

/// The IPv4 or IPv6 address at `addr` (`len` bytes), if it is one, with its IPv6 scope id
/// (port and flow info 0).
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
                let ip = Ipv6Addr::from(v6.sin6_addr.s6_addr);
                Some(SocketAddrV6::new(ip, 0, 0, v6.sin6_scope_id).into())
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
    use nodus_testkit::net::loopback_index;

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
        assert!(addrs.iter().all(|a| a.ip().is_loopback()), "{addrs:?}");
        assert!(!addrs.is_empty());
    }

    #[test]
    fn a_scope_id_from_getaddrinfo_is_kept_and_named() {
        // glibc resolves the zone itself here: the scope id comes back in `sin6_scope_id`.
        let addrs = system_resolve("fe80::1%lo").unwrap();
        assert_eq!(addrs.len(), 1, "{addrs:?}");
        assert_eq!(addrs[0].scope_id(), loopback_index());
        assert_eq!(addrs[0].to_string(), "fe80::1%lo");
        match addrs[0].socket_addr(443) {
            SocketAddr::V6(v6) => assert_eq!((v6.scope_id(), v6.port()), (loopback_index(), 443)),
            v4 => panic!("{v4}"),
        }
    }

    #[test]
    fn socket_addr_reads_the_scope_id() {
        // SAFETY: all-zero is a valid sockaddr_in6.
        let mut raw: libc::sockaddr_in6 = unsafe { std::mem::zeroed() };
        raw.sin6_family = libc::AF_INET6 as libc::sa_family_t;
        raw.sin6_addr.s6_addr = "fe80::2".parse::<Ipv6Addr>().unwrap().octets();
        raw.sin6_scope_id = loopback_index();
        // SAFETY: `raw` is a whole sockaddr_in6 and lives through the call.
        let addr = unsafe {
            socket_addr(
                (&raw const raw).cast(),
                size_of::<libc::sockaddr_in6>() as libc::socklen_t,
            )
        }
        .unwrap();
        assert_eq!(
            addr.to_string(),
            format!("[fe80::2%{}]:0", loopback_index())
        );
        assert_eq!(Address::from_socket_addr(addr).to_string(), "fe80::2%lo");
        // A scope id no interface has is shown as its number.
        let v6 = SocketAddrV6::new("fe80::2".parse().unwrap(), 0, 0, 999_999);
        assert_eq!(
            Address::from_socket_addr(v6.into()).to_string(),
            "fe80::2%999999"
        );
    }

    #[test]
    fn zoned_literals_are_read_as_node_reads_them() {
        let ll = "fe80::1".parse::<Ipv6Addr>().unwrap();
        assert_eq!(scoped_literal("fe80::1%lo"), Some((ll, "lo")));
        assert_eq!(scoped_literal("fe80::1%eth0.10"), Some((ll, "eth0.10")));
        assert_eq!(scoped_literal("fe80::1%"), None);
        assert_eq!(scoped_literal("fe80::1%l o"), None);
        assert_eq!(scoped_literal("127.0.0.1%lo"), None);
        assert_eq!(scoped_literal("host%lo"), None);
        assert_eq!(scope_id("7").unwrap(), 7);
        assert_eq!(scope_id("lo").unwrap(), loopback_index());
        assert_eq!(
            scope_id("nodus-no-if").unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
        assert_eq!(
            scope_id("99999999999").unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
    }
}
