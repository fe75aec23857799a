//! The kernel's floor under a keep-alive request on this machine: what one `send` of a
//! hello-world response and one `recv` of it cost on a connected 127.0.0.1 TCP pair, with no
//! server, no event loop and no sleep (one thread sends and receives in turn). On loopback the
//! sender's `send` also runs the receiving socket's side of TCP, so a server's `send` of its
//! response and `recv` of the next request do the kernel work of this loop's `send` and `recv`
//! of one message. BENCHMARKS.md compares it with servers' CPU per request.
//!
//! Four ways, each the best of 7 passes:
//! - `send + recv, inline`: the syscalls inlined into the timing loop, which never returns
//!   between them: the floor.
//! - `... from functions that return`: each syscall made in a function that returns after it,
//!   as in any real program (libc's wrappers, a server's read and write paths).
//! - `... + return-stack refill`: the same, with `nodus::io::after_syscall`'s refill after each
//!   syscall, forced on (`NODUS_RSB_REFILL=on` semantics, whatever this machine's kernel reports):
//!   on a kernel whose AMD SRSO mitigation is "Safe RET", this is the floor again (see
//!   `nodus::io::after_syscall`).
//! - `sendmsg (head, body) + recv, inline`: what gathering the head and the body costs.
//!
//! Usage: `cargo run --release -p nodus-http --example loopback_floor [ITERATIONS]` (default
//! 200,000 per pass).

use std::io::IoSlice;
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsFd, BorrowedFd};
use std::time::Instant;

use rustix::net::{RecvFlags, SendFlags};

/// The bytes of nodus's hello-world response head and its body (`examples/hello_http.rs`).
const HEAD_LEN: usize = 102;
const BODY_LEN: usize = 13;

#[derive(Clone, Copy, PartialEq)]
enum Way {
    Inline,
    Returning,
    ReturningRefilled,
    Gathered,
}

#[inline(never)]
fn send_returning(fd: BorrowedFd<'_>, buf: &[u8], refill: bool) -> rustix::io::Result<usize> {
    let sent = rustix::net::send(fd, buf, SendFlags::NOSIGNAL);
    if refill {
        nodus::io::refill_return_stack();
    }
    sent
}

#[inline(never)]
fn recv_returning(fd: BorrowedFd<'_>, buf: &mut [u8], refill: bool) -> rustix::io::Result<usize> {
    let received = rustix::net::recv(fd, buf, RecvFlags::empty()).map(|(n, _)| n);
    if refill {
        nodus::io::refill_return_stack();
    }
    received
}

fn main() -> std::io::Result<()> {
    let iterations: u32 = match std::env::args().nth(1) {
        None => 200_000,
        Some(arg) => arg.parse().ok().filter(|&n| n > 0).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("ITERATIONS must be a positive whole number, not {arg:?}"),
            )
        })?,
    };
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let client = TcpStream::connect(listener.local_addr()?)?;
    let (server, _) = listener.accept()?;
    server.set_nodelay(true)?;
    client.set_nodelay(true)?;
    let (server, client) = (server.as_fd(), client.as_fd());
    let head = [b'h'; HEAD_LEN];
    let body = [b'b'; BODY_LEN];
    let mut flat = [0u8; HEAD_LEN + BODY_LEN];
    flat[..HEAD_LEN].copy_from_slice(&head);
    flat[HEAD_LEN..].copy_from_slice(&body);
    let mut received = [0u8; 4096];

    let mut pass = |way: Way| -> std::io::Result<f64> {
        let start = Instant::now();
        for _ in 0..iterations {
            let sent = match way {
                Way::Inline => rustix::net::send(server, &flat, SendFlags::NOSIGNAL)?,
                Way::Returning | Way::ReturningRefilled => {
                    send_returning(server, &flat, way == Way::ReturningRefilled)?
                }
                Way::Gathered => {
                    let slices = [IoSlice::new(&head), IoSlice::new(&body)];
                    let mut control = Default::default();
                    rustix::net::sendmsg(server, &slices, &mut control, SendFlags::NOSIGNAL)?
                }
            };
            let mut got = 0;
            while got < sent {
                got += match way {
                    Way::Returning | Way::ReturningRefilled => {
                        recv_returning(client, &mut received, way == Way::ReturningRefilled)?
                    }
                    Way::Inline | Way::Gathered => {
                        rustix::net::recv(client, &mut received, RecvFlags::empty())?.0
                    }
                };
            }
        }
        Ok(start.elapsed().as_nanos() as f64 / f64::from(iterations))
    };
    for (name, way) in [
        ("send + recv, inline", Way::Inline),
        ("... from functions that return", Way::Returning),
        ("... + return-stack refill", Way::ReturningRefilled),
        ("sendmsg (head, body) + recv, inline", Way::Gathered),
    ] {
        let mut best = f64::INFINITY;
        for _ in 0..7 {
            best = best.min(pass(way)?);
        }
        println!("{name:36} {best:7.0} ns per message ({iterations} per pass, best of 7)");
    }
    Ok(())
}
