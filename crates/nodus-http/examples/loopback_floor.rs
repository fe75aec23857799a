//! The kernel's floor under a keep-alive request on this machine: what one `send` of a
//! hello-world response and one `recv` of it cost on a connected 127.0.0.1 TCP pair, with no
//! server, no event loop and no sleep (one thread sends and receives in turn). A keep-alive
//! request costs a server at least this much CPU: on loopback the sender's `send` also runs the
//! receiving socket's side of TCP, so the server's `send` of its response and `recv` of the next
//! request together do the same kernel work as this loop's `send` and `recv` of one message.
//! BENCHMARKS.md compares it with servers' CPU per request (`bench/cluster/run.py`).
//!
//! Usage: `cargo run --release -p nodus-http --example loopback_floor [ITERATIONS]`
//! (default 200,000 per pass; the best of 7 passes is printed for each way of writing:
//! `send` of one buffer, as nodus writes a small response, and `sendmsg` of head and body).

use std::io::IoSlice;
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::time::Instant;

use rustix::net::{RecvFlags, SendFlags};

/// The bytes of nodus's hello-world response head and its body (`examples/hello_http.rs`).
const HEAD_LEN: usize = 102;
const BODY_LEN: usize = 13;

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
    let head = [b'h'; HEAD_LEN];
    let body = [b'b'; BODY_LEN];
    let mut flat = [0u8; HEAD_LEN + BODY_LEN];
    let mut received = [0u8; 4096];

    let mut pass = |gathered: bool| -> std::io::Result<f64> {
        let start = Instant::now();
        for _ in 0..iterations {
            let sent = if gathered {
                let slices = [IoSlice::new(&head), IoSlice::new(&body)];
                rustix::net::sendmsg(
                    server.as_fd(),
                    &slices,
                    &mut Default::default(),
                    SendFlags::NOSIGNAL,
                )?
            } else {
                flat[..HEAD_LEN].copy_from_slice(&head);
                flat[HEAD_LEN..].copy_from_slice(&body);
                rustix::net::send(server.as_fd(), &flat, SendFlags::NOSIGNAL)?
            };
            let mut got = 0;
            while got < sent {
                let (filled, _) =
                    rustix::net::recv(client.as_fd(), &mut received[..], RecvFlags::empty())?;
                got += filled;
            }
        }
        Ok(start.elapsed().as_nanos() as f64 / f64::from(iterations))
    };
    for (name, gathered) in [
        ("send + recv", false),
        ("sendmsg (head, body) + recv", true),
    ] {
        let mut best = f64::INFINITY;
        for _ in 0..7 {
            best = best.min(pass(gathered)?);
        }
        println!("{name:28} {best:7.0} ns per message ({iterations} per pass, best of 7)");
    }
    Ok(())
}
