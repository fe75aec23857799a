//! The network namespace's TCP sockets through `NETLINK_SOCK_DIAG` (inet_diag,
//! `SOCK_DIAG_BY_FAMILY`): those in the states asked for, and optionally on the local ports asked
//! for, chosen by the kernel, so a host with very many sockets sends only those.
//!
//! Invariants:
//! - One dump at a time per socket (the kernel refuses a second with `EBUSY`): a dump is read to
//!   its end unless its caller stops it, and then the socket is dropped ([`Diag::dump`]).
//! - The socket is connected to the kernel (port id 0): no other process's message is taken for
//!   an answer; a message of another sequence number is skipped.
//! - Every read is bounded ([`RECV_TIMEOUT`]): a kernel that never answers is an error, never a
//!   pool thread blocked for good. A message longer than the buffer is an error, not a cut one.
//! - The port filter is bytecode the kernel checks (`inet_diag_bc_audit`) before it runs it: an
//!   OR of `sport == P` (Linux ≥ 4.16, below nodus's floor), one op pair and a jump per port.

use std::io;
use std::ops::ControlFlow;
use std::os::fd::OwnedFd;
use std::time::Duration;

use rustix::net::netlink::{self, SocketAddrNetlink};
use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType};

/// `include/net/tcp_states.h`, as `idiag_states` bits.
pub(super) const LISTENING: u32 = 1 << 10;
/// Every state of a connected socket that an fd can hold: `ESTABLISHED`, `SYN_SENT`, `SYN_RECV`,
/// `FIN_WAIT1`, `FIN_WAIT2`, `CLOSE_WAIT`, `LAST_ACK`, `CLOSING` (not `TIME_WAIT` nor a request
/// socket, `NEW_SYN_RECV`: no fd holds one; nor `CLOSE` and `LISTEN`).
pub(super) const CONNECTED: u32 =
    1 << 1 | 1 << 2 | 1 << 3 | 1 << 4 | 1 << 5 | 1 << 8 | 1 << 9 | 1 << 11;

/// The longest wait for one message of a dump.
const RECV_TIMEOUT: Duration = Duration::from_secs(1);
/// The read buffer: the kernel sizes a dump's messages to the reader's buffer, 32 KiB at most.
const BUF: usize = 32 << 10;
/// Ports past which the filter would be too long for its 16-bit jumps: then none, and
/// [`Diag::dump`] checks every socket's port itself.
const MAX_FILTERED_PORTS: usize = 1024;

/// `linux/netlink.h`, `linux/sock_diag.h`, `linux/inet_diag.h`.
const NLMSG_HDR: usize = 16;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 0x01;
const NLM_F_DUMP: u16 = 0x300;
const SOCK_DIAG_BY_FAMILY: u16 = 20;
/// `struct inet_diag_req_v2`: family, protocol, ext, pad, states, then a zeroed socket id.
const REQ_LEN: usize = 56;
const INET_DIAG_REQ_BYTECODE: u16 = 1;
const INET_DIAG_BC_JMP: u8 = 1;
const INET_DIAG_BC_S_EQ: u8 = 11;
/// `struct inet_diag_msg`: `id.idiag_sport` (big-endian) at 4, `idiag_inode` at 68.
const MSG_LEN: usize = 72;

/// A `NETLINK_SOCK_DIAG` socket.
pub(super) struct Diag {
    fd: OwnedFd,
    buf: Vec<u8>,
    seq: u32,
}

impl Diag {
    pub(super) fn open() -> io::Result<Diag> {
        let fd = rustix::net::socket_with(
            AddressFamily::NETLINK,
            SocketType::RAW,
            SocketFlags::CLOEXEC,
            Some(netlink::SOCK_DIAG),
        )?;
        rustix::net::connect(&fd, &SocketAddrNetlink::new(0, 0))?;
        rustix::net::sockopt::set_socket_timeout(
            &fd,
            rustix::net::sockopt::Timeout::Recv,
            Some(RECV_TIMEOUT),
        )?;
        Ok(Diag {
            fd,
            buf: vec![0; BUF],
            seq: 0,
        })
    }

    /// Calls `each(local port, inode)` for every TCP socket of `family` (`AF_INET`, `AF_INET6`)
    /// in `states` (`idiag_states` bits) and, if `ports` is given (sorted), whose local port is
    /// one of them, until it breaks; returns whether it did. After a break the socket is in the
    /// middle of the dump: drop it.
    pub(super) fn dump(
        &mut self,
        family: i32,
        states: u32,
        ports: Option<&[u16]>,
        mut each: impl FnMut(u16, u64) -> ControlFlow<()>,
    ) -> io::Result<ControlFlow<()>> {
        self.seq = self.seq.wrapping_add(1);
        // The kernel checks the ports, or (too many for its filter) this loop does.
        let (filter, unfiltered) = match ports {
            Some(p) if !p.is_empty() && p.len() <= MAX_FILTERED_PORTS => {
                (Some(port_filter(p)), None)
            }
            _ => (None, ports),
        };
        let req = request(self.seq, family, states, filter.as_deref());
        if rustix::net::send(&self.fd, &req, SendFlags::empty())? != req.len() {
            return Err(io::Error::other("sock_diag: short send"));
        }
        loop {
            let (got, len) = rustix::net::recv(&self.fd, &mut self.buf[..], RecvFlags::TRUNC)?;
            if len > got {
                return Err(io::Error::other(
                    "sock_diag: message longer than the buffer",
                ));
            }
            let mut rest = &self.buf[..got];
            while rest.len() >= NLMSG_HDR {
                let msg_len = u32::from_ne_bytes(rest[0..4].try_into().unwrap()) as usize;
                if msg_len < NLMSG_HDR || msg_len > rest.len() {
                    return Err(io::Error::other("sock_diag: malformed message"));
                }
                let kind = u16::from_ne_bytes(rest[4..6].try_into().unwrap());
                let seq = u32::from_ne_bytes(rest[8..12].try_into().unwrap());
                let body = &rest[NLMSG_HDR..msg_len];
                rest = &rest[msg_len.next_multiple_of(4).min(rest.len())..];
                if seq != self.seq {
                    continue;
                }
                match kind {
                    // Both carry an errno (negative; 0 in a dump's end that went well).
                    NLMSG_DONE | NLMSG_ERROR => {
                        let errno = body
                            .get(..4)
                            .map_or(0, |e| i32::from_ne_bytes(e.try_into().unwrap()));
                        return match (kind, errno) {
                            (NLMSG_DONE, 0) => Ok(ControlFlow::Continue(())),
                            _ => Err(io::Error::from_raw_os_error(-errno)),
                        };
                    }
                    SOCK_DIAG_BY_FAMILY if body.len() >= MSG_LEN => {
                        let port = u16::from_be_bytes(body[4..6].try_into().unwrap());
                        let inode = u32::from_ne_bytes(body[68..72].try_into().unwrap());
                        if unfiltered.is_none_or(|p| p.binary_search(&port).is_ok())
                            && each(port, u64::from(inode)).is_break()
                        {
                            return Ok(ControlFlow::Break(()));
                        }
                    }
                    _ => {}
                }
            }
        }
    }
}

/// A dump request: `nlmsghdr`, `inet_diag_req_v2` for TCP, the filter as its bytecode attribute.
fn request(seq: u32, family: i32, states: u32, filter: Option<&[u8]>) -> Vec<u8> {
    let attr_len = filter.map_or(0, |f| 4 + f.len());
    let len = NLMSG_HDR + REQ_LEN + attr_len;
    let mut req = Vec::with_capacity(len);
    req.extend_from_slice(&(len as u32).to_ne_bytes());
    req.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    req.extend_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    req.extend_from_slice(&seq.to_ne_bytes());
    req.extend_from_slice(&0u32.to_ne_bytes());
    req.extend_from_slice(&[family as u8, libc::IPPROTO_TCP as u8, 0, 0]);
    req.extend_from_slice(&states.to_ne_bytes());
    req.resize(NLMSG_HDR + REQ_LEN, 0);
    if let Some(filter) = filter {
        req.extend_from_slice(&(attr_len as u16).to_ne_bytes());
        req.extend_from_slice(&INET_DIAG_REQ_BYTECODE.to_ne_bytes());
        req.extend_from_slice(filter);
    }
    req
}

/// The bytecode of `sport == ports[0] || sport == ports[1] || ...` (at least one port, at most
/// [`MAX_FILTERED_PORTS`]). Ops are `{code: u8, yes: u8, no: u16}`, jumps in bytes from the op;
/// reaching the end accepts, jumping 4 past it rejects. Per port: `S_EQ` (yes: on to the `JMP`
/// after it; no: on to the next port's `S_EQ`, or past the end for the last) with the port in a
/// second op's `no`, then a `JMP` (always its `no`) to the end, the last port's left out.
fn port_filter(ports: &[u16]) -> Vec<u8> {
    let total = 12 * ports.len() - 4;
    let op = |code: u8, yes: u8, no: usize| {
        let mut op = [code, yes, 0, 0];
        op[2..].copy_from_slice(&(no as u16).to_ne_bytes());
        op
    };
    let mut code = Vec::with_capacity(total);
    for (i, &port) in ports.iter().enumerate() {
        code.extend_from_slice(&op(INET_DIAG_BC_S_EQ, 8, 12));
        code.extend_from_slice(&op(0, 0, usize::from(port)));
        if i + 1 < ports.len() {
            code.extend_from_slice(&op(INET_DIAG_BC_JMP, 4, total - code.len()));
        }
    }
    code
}
