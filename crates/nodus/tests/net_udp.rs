//! `nodus::net::UdpSocket`: datagram round trips, connected sockets, close callbacks,
//! ref/unref, errors and fd conversions. 127.0.0.1 only; every test bounded in time.

mod common;

use std::cell::{Cell, RefCell};
use std::os::fd::OwnedFd;
use std::rc::Rc;
use std::time::{Duration, Instant};

use common::{bounded, cloexec};
use nodus::net::UdpSocket;
use nodus::{Runtime, set_immediate, set_timeout, spawn};

#[test]
fn send_to_and_recv_from_round_trip() {
    bounded(async {
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").unwrap();
        assert!(cloexec(&a));
        let (a_addr, b_addr) = (a.local_addr().unwrap(), b.local_addr().unwrap());
        let echo = spawn(async move {
            let mut buf = [0u8; 64];
            let (n, from) = b.recv_from(&mut buf).await.unwrap();
            b.send_to(&buf[..n], from).await.unwrap();
            from
        });
        assert_eq!(a.send_to(b"ping", b_addr).await.unwrap(), 4);
        let mut buf = [0u8; 64];
        let (n, from) = a.recv_from(&mut buf).await.unwrap();
        assert_eq!((&buf[..n], from), (&b"ping"[..], b_addr));
        assert_eq!(echo.await.unwrap(), a_addr);
    });
}

#[test]
fn many_datagrams_from_many_sockets() {
    const N: usize = 50;
    bounded(async {
        let server = UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = server.local_addr().unwrap();
        spawn(async move {
            let mut buf = [0u8; 1500];
            loop {
                let (n, from) = server.recv_from(&mut buf).await.unwrap();
                buf[..n].reverse();
                server.send_to(&buf[..n], from).await.unwrap();
            }
        })
        .detach();
        let clients: Vec<_> = (0..N)
            .map(|i| {
                spawn(async move {
                    let c = UdpSocket::bind("127.0.0.1:0").unwrap();
                    c.connect(addr).unwrap();
                    let msg = format!("datagram number {i}");
                    c.send(msg.as_bytes()).await.unwrap();
                    let mut buf = [0u8; 1500];
                    let n = c.recv(&mut buf).await.unwrap();
                    let want: String = msg.chars().rev().collect();
                    assert_eq!(&buf[..n], want.as_bytes());
                })
            })
            .collect();
        for c in clients {
            c.await.unwrap();
        }
    });
}

#[test]
fn connected_send_and_recv() {
    bounded(async {
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").unwrap();
        assert_eq!(
            a.peer_addr().unwrap_err().kind(),
            std::io::ErrorKind::NotConnected
        );
        a.connect(b.local_addr().unwrap()).unwrap();
        b.connect(a.local_addr().unwrap()).unwrap();
        assert_eq!(a.peer_addr().unwrap(), b.local_addr().unwrap());
        a.send(b"one").await.unwrap();
        a.send(b"two").await.unwrap();
        let mut buf = [0u8; 16];
        let n = b.recv(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"one");
        let n = b.recv(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"two");
        b.send(b"back").await.unwrap();
        let n = a.recv(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"back");
    });
}

#[test]
fn a_connected_socket_learns_the_port_is_closed() {
    let port = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    bounded(async move {
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        a.connect(port).unwrap();
        a.send(b"anyone?").await.unwrap();
        let mut buf = [0u8; 16];
        // The ICMP port-unreachable arrives as an error on the next receive.
        let err = a.recv(&mut buf).await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused, "{err}");
    });
}

#[test]
fn close_calls_back_in_the_close_phase_after_immediates() {
    let rt = Runtime::new();
    let trace = Rc::new(RefCell::new(Vec::new()));
    let t = trace.clone();
    rt.enter(|| {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = s.local_addr().unwrap();
        let t1 = t.clone();
        s.close(move || t1.borrow_mut().push("close"));
        let t2 = t.clone();
        set_immediate(move || t2.borrow_mut().push("immediate"));
        // The port is free again at once.
        std::net::UdpSocket::bind(addr).unwrap();
    });
    rt.run();
    assert_eq!(*trace.borrow(), ["immediate", "close"]);
}

#[test]
fn unref_and_ref() {
    // Unref'd: run returns with a receive still pending.
    let rt = Runtime::new();
    let start = Instant::now();
    rt.enter(|| {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        s.unref();
        assert!(!s.has_ref());
        spawn(async move {
            let _ = s.recv_from(&mut [0u8; 8]).await;
            unreachable!("nothing is sent");
        })
        .detach();
    });
    rt.run();
    assert!(start.elapsed() < Duration::from_secs(1));

    // Ref'd: run keeps going until an unref'd timer stops it.
    let rt = Runtime::new();
    let fired = Rc::new(Cell::new(false));
    let f = fired.clone();
    rt.enter(|| {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        spawn(async move {
            let _ = s.recv_from(&mut [0u8; 8]).await;
            unreachable!("nothing is sent");
        })
        .detach();
        set_timeout(30, move || {
            f.set(true);
            nodus::rt::stop();
        })
        .unref();
    });
    rt.run();
    assert!(fired.get());
}

#[test]
fn from_and_into_std_and_owned_fds() {
    bounded(async {
        let std_socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let a = UdpSocket::from_std(std_socket).unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b_addr = b.local_addr().unwrap();
        a.send_to(b"x", b_addr).await.unwrap();
        let mut buf = [0u8; 4];
        assert_eq!(b.recv_from(&mut buf).await.unwrap().0, 1);

        let std_b = b.into_std();
        assert_eq!(
            std_b.recv_from(&mut buf).unwrap_err().kind(),
            std::io::ErrorKind::WouldBlock,
            "still non-blocking"
        );
        let fd = OwnedFd::from(std_b);
        socket2::SockRef::from(&fd).set_cloexec(false).unwrap();
        let b = UdpSocket::from_owned_fd(fd).unwrap();
        assert!(cloexec(&b));
        assert_eq!(b.local_addr().unwrap(), b_addr);
        a.send_to(b"yz", b_addr).await.unwrap();
        assert_eq!(b.recv_from(&mut buf).await.unwrap().0, 2);

        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let err = UdpSocket::from_owned_fd(tcp.into()).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
        assert!(err.to_string().contains("not a UDP socket"), "{err}");
    });
}

/// Two tasks receiving on one shared socket, two datagrams: both are received (every waiter is
/// woken when the socket becomes readable; one remembering only its latest waiter would leave the
/// first receiver asleep and the second datagram unread).
#[test]
fn two_tasks_receiving_on_one_socket_both_receive() {
    bounded(async {
        let socket = Rc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
        let addr = socket.local_addr().unwrap();
        let receivers: Vec<_> = (0..2)
            .map(|_| {
                let s = socket.clone();
                spawn(async move {
                    let mut buf = [0u8; 16];
                    let (n, _) = s.recv_from(&mut buf).await.unwrap();
                    buf[..n].to_vec()
                })
            })
            .collect();
        // Both are waiting before the first datagram comes.
        nodus::sleep(10).await;
        let client = UdpSocket::bind("127.0.0.1:0").unwrap();
        client.send_to(b"a", addr).await.unwrap();
        client.send_to(b"b", addr).await.unwrap();
        let mut got = Vec::new();
        for (i, r) in receivers.into_iter().enumerate() {
            let data = nodus::timeout(Duration::from_secs(5), r)
                .await
                .unwrap_or_else(|_| panic!("receiver {i} was never woken"));
            got.push(data.unwrap());
        }
        got.sort();
        assert_eq!(got, [b"a".to_vec(), b"b".to_vec()]);
    });
}
