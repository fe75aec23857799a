//! `nodus::net` TCP: echo, concurrency, half-close, close callbacks, ref/unref, errors, fd
//! conversions, SO_REUSEPORT and backpressure. 127.0.0.1 only; every test bounded in time.

mod common;

use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::io::{IoSlice, Write};
use std::net::{Shutdown, SocketAddr};
use std::os::fd::OwnedFd;
use std::pin::Pin;
use std::rc::Rc;
use std::time::{Duration, Instant};

use common::net::{accept_backs_off_out_of_fds, echo, fill_fds, read_to_end};
use common::{bounded, cloexec};
use futures_io::AsyncWrite;
use nodus::net::{ListenOptions, TcpListener, TcpStream};
use nodus::{Runtime, next_tick, set_immediate, set_timeout, sleep, spawn, yield_now};

type Trace = Rc<RefCell<Vec<&'static str>>>;

/// A port nothing listens on (bound then released).
fn closed_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

#[test]
fn echo_round_trip() {
    bounded(async {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        assert_eq!(addr.ip().to_string(), "127.0.0.1");
        let server = spawn(async move {
            let (s, peer) = listener.accept().await.unwrap();
            assert_eq!(s.peer_addr().unwrap(), peer);
            assert!(cloexec(&s), "accepted sockets are close-on-exec");
            echo(s).await;
        });
        let mut c = TcpStream::connect(addr).await.unwrap();
        assert!(cloexec(&c), "connected sockets are close-on-exec");
        assert_eq!(c.peer_addr().unwrap(), addr);
        c.set_nodelay(true).unwrap();
        assert!(c.nodelay().unwrap());
        c.write_all(b"hello ").await.unwrap();
        // A vectored write through the futures-io impl.
        let bufs = [IoSlice::new(b"vectored "), IoSlice::new(b"world")];
        let mut sent = 0;
        while sent < 14 {
            let n = poll_fn(|cx| Pin::new(&mut c).poll_write_vectored(cx, &bufs))
                .await
                .unwrap();
            assert_eq!(n, 14, "a small vectored write goes out whole");
            sent += n;
        }
        c.shutdown(Shutdown::Write).unwrap();
        assert_eq!(read_to_end(&c).await, b"hello vectored world");
        server.await.unwrap();
    });
}

#[test]
fn many_concurrent_connections_served_by_tasks() {
    const N: usize = 100;
    bounded(async {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let served = Rc::new(Cell::new(0));
        let s = served.clone();
        let acceptor = spawn(async move {
            let mut conns = Vec::new();
            for _ in 0..N {
                let (conn, _) = listener.accept().await.unwrap();
                let s = s.clone();
                conns.push(spawn(async move {
                    echo(conn).await;
                    s.set(s.get() + 1);
                }));
            }
            for c in conns {
                c.await.unwrap();
            }
        });
        let clients: Vec<_> = (0..N)
            .map(|i| {
                spawn(async move {
                    let c = TcpStream::connect(addr).await.unwrap();
                    let msg = format!("client {i} says hello").repeat(i + 1);
                    c.write_all(msg.as_bytes()).await.unwrap();
                    c.shutdown(Shutdown::Write).unwrap();
                    assert_eq!(read_to_end(&c).await, msg.as_bytes());
                })
            })
            .collect();
        for c in clients {
            c.await.unwrap();
        }
        acceptor.await.unwrap();
        assert_eq!(served.get(), N);
    });
}

#[test]
fn half_close_server_reads_eof_then_still_replies() {
    bounded(async {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = spawn(async move {
            let (s, _) = listener.accept().await.unwrap();
            let got = read_to_end(&s).await;
            assert_eq!(got, b"question");
            // EOF seen; the write side is still open.
            s.write_all(b"answer to ").await.unwrap();
            s.write_all(&got).await.unwrap();
        });
        let c = TcpStream::connect(addr).await.unwrap();
        c.write_all(b"question").await.unwrap();
        c.shutdown(Shutdown::Write).unwrap();
        assert!(
            c.write(b"more").await.is_err(),
            "writing after the half-close fails"
        );
        assert_eq!(read_to_end(&c).await, b"answer to question");
        server.await.unwrap();
    });
}

#[test]
fn listener_close_frees_the_port_now_and_calls_back_in_the_close_phase() {
    let rt = Runtime::new();
    let trace: Trace = Rc::default();
    let t = trace.clone();
    rt.enter(|| {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let t1 = t.clone();
        listener.close(move || t1.borrow_mut().push("close"));
        let t2 = t.clone();
        set_immediate(move || t2.borrow_mut().push("immediate"));
        let t3 = t.clone();
        next_tick(move || t3.borrow_mut().push("tick"));
        // The fd is gone already, before the close phase.
        let err = std::net::TcpStream::connect(addr).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused);
    });
    rt.run();
    assert_eq!(*trace.borrow(), ["tick", "immediate", "close"]);
}

#[test]
fn stream_close_is_seen_by_the_peer_and_calls_back_after_the_check_phase() {
    let trace: Trace = Rc::default();
    let t = trace.clone();
    bounded(async move {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let c = TcpStream::connect(addr).await.unwrap();
        let (s, _) = listener.accept().await.unwrap();
        let t1 = t.clone();
        c.close(move || t1.borrow_mut().push("close"));
        let t2 = t.clone();
        set_immediate(move || t2.borrow_mut().push("immediate"));
        assert_eq!(read_to_end(&s).await, b"", "the peer reads EOF");
        // Each yield waits for a check phase; the close phase follows the first one.
        while t.borrow().len() < 2 {
            yield_now().await;
        }
        assert_eq!(*t.borrow(), ["immediate", "close"]);
    });
    assert_eq!(trace.borrow().len(), 2);
}

#[test]
fn an_unrefd_listener_lets_run_return() {
    let rt = Runtime::new();
    let start = Instant::now();
    rt.enter(|| {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        assert!(listener.has_ref());
        listener.unref();
        assert!(!listener.has_ref());
        spawn(async move {
            let _ = listener.accept().await;
            unreachable!("nobody connects");
        })
        .detach();
    });
    rt.run();
    assert!(start.elapsed() < Duration::from_secs(1));
}

#[test]
fn a_refd_listener_keeps_run_going() {
    // Before the loop exists: its clock (from which the timer's deadline counts) is not older.
    let start = Instant::now();
    let rt = Runtime::new();
    let fired = Rc::new(Cell::new(false));
    let f = fired.clone();
    rt.enter(|| {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.unref();
        listener.ref_();
        assert!(listener.has_ref());
        spawn(async move {
            let _ = listener.accept().await;
            unreachable!("nobody connects");
        })
        .detach();
        // Unref'd: only the listener keeps the loop alive until this fires.
        let timer = set_timeout(50, move || {
            f.set(true);
            nodus::rt::stop();
        });
        timer.unref();
    });
    rt.run();
    assert!(fired.get(), "run returned before the timer");
    assert!(start.elapsed() >= Duration::from_millis(50));
}

#[test]
fn connecting_to_a_closed_port_is_refused() {
    let addr = closed_port();
    bounded(async move {
        let err = TcpStream::connect(addr).await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused, "{err}");
    });
}

#[test]
fn host_names_are_rejected_with_a_clear_error() {
    bounded(async {
        let err = TcpListener::bind("localhost:0").unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
        assert!(err.to_string().contains("not an IP address"), "{err}");
        let err = TcpStream::connect(("example.com", 80)).await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
        // Literals in every accepted form.
        let l = TcpListener::bind(("127.0.0.1", 0)).unwrap();
        drop(l);
        let l = TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)).unwrap();
        drop(l);
        let l = TcpListener::bind(String::from("127.0.0.1:0")).unwrap();
        drop(l);
    });
}

#[test]
fn from_and_into_std_and_owned_fds() {
    bounded(async {
        // Bound by std, adopted by nodus.
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = std_listener.local_addr().unwrap();
        let listener = TcpListener::from_std(std_listener).unwrap();
        let c = TcpStream::connect(addr).await.unwrap();
        let (s, _) = listener.accept().await.unwrap();
        s.write_all(b"1").await.unwrap();
        let mut b = [0u8; 1];
        assert_eq!(c.read(&mut b).await.unwrap(), 1);

        // Back to std (non-blocking, same socket): nothing waiting, so WouldBlock.
        let std_listener = listener.into_std();
        assert_eq!(
            std_listener.accept().unwrap_err().kind(),
            std::io::ErrorKind::WouldBlock
        );
        // Through an OwnedFd that lost its close-on-exec flag (as inherited LISTEN_FDS do).
        let fd = OwnedFd::from(std_listener);
        socket2::SockRef::from(&fd).set_cloexec(false).unwrap();
        assert!(!cloexec(&fd));
        let listener = TcpListener::from_owned_fd(fd).unwrap();
        assert!(cloexec(&listener), "adopted fds are made close-on-exec");
        let c2 = TcpStream::connect(addr).await.unwrap();
        let (s2, _) = listener.accept().await.unwrap();

        // A stream out to std and back.
        let mut std_stream = s2.into_std();
        std_stream.set_nonblocking(false).unwrap();
        std_stream.write_all(b"via std").unwrap();
        let s2 = TcpStream::from_owned_fd(OwnedFd::from(std_stream)).unwrap();
        s2.shutdown(Shutdown::Write).unwrap();
        assert_eq!(read_to_end(&c2).await, b"via std");
        let c2 = TcpStream::try_from(c2.into_std()).unwrap();
        drop(c2);

        // The wrong kind of socket is refused.
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let err = TcpListener::from_owned_fd(udp.into()).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
        assert!(err.to_string().contains("listening TCP socket"), "{err}");
        let err = TcpListener::from_owned_fd(OwnedFd::from(s.into_std())).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput, "{err}");
        let err = TcpStream::from_owned_fd(OwnedFd::from(listener)).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput, "{err}");
        let file = std::fs::File::open("/dev/null").unwrap();
        let err = TcpStream::from_owned_fd(file.into()).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput, "{err}");
    });
}

/// With `defer_accept` a connection is accepted once its client sent something: one that sent
/// nothing waits in the kernel (here past 300 ms, where the talking one connected later is
/// accepted at once), and is accepted after the kernel's deferral (about a second) all the same.
#[test]
fn a_deferred_accept_takes_a_connection_once_its_client_spoke() {
    bounded(async {
        let opts = ListenOptions {
            defer_accept: true,
            ..ListenOptions::default()
        };
        let listener = TcpListener::bind_with("127.0.0.1:0", opts).unwrap();
        assert!(listener.defer_accept().unwrap());
        let plain = TcpListener::bind("127.0.0.1:0").unwrap();
        assert!(!plain.defer_accept().unwrap(), "off by default");
        plain.set_defer_accept(true).unwrap();
        assert!(plain.defer_accept().unwrap());
        plain.set_defer_accept(false).unwrap();
        assert!(!plain.defer_accept().unwrap());

        let addr = listener.local_addr().unwrap();
        let accepted: Rc<RefCell<Vec<TcpStream>>> = Rc::default();
        let queue = accepted.clone();
        spawn(async move {
            loop {
                let (s, _) = listener.accept().await.unwrap();
                queue.borrow_mut().push(s);
            }
        })
        .detach();
        let count = || accepted.borrow().len();
        let started = Instant::now();
        let silent = TcpStream::connect(addr).await.unwrap();
        sleep(Duration::from_millis(300)).await;
        // Unless a loaded host slowed this past the kernel's deferral (about 1 s).
        if started.elapsed() < Duration::from_millis(800) {
            assert_eq!(count(), 0, "a silent client is not accepted yet");
        }
        let talking = TcpStream::connect(addr).await.unwrap();
        talking.write_all(b"GET").await.unwrap();
        talking.shutdown(Shutdown::Write).unwrap();
        while count() < 1 {
            sleep(Duration::from_millis(10)).await;
        }
        let first = accepted.borrow_mut().remove(0);
        assert_eq!(read_to_end(&first).await, b"GET", "the talking one first");
        // Still silent: the kernel queues it once its deferral ran out.
        while count() < 1 {
            sleep(Duration::from_millis(10)).await;
        }
        silent.shutdown(Shutdown::Write).unwrap();
        let second = accepted.borrow_mut().remove(0);
        assert_eq!(read_to_end(&second).await, b"", "the silent one");
    });
}

#[test]
fn so_reuseport_lets_two_listeners_share_a_port() {
    const N: usize = 32;
    bounded(async {
        let opts = ListenOptions {
            reuse_port: true,
            ..ListenOptions::default()
        };
        let a = TcpListener::bind_with("127.0.0.1:0", opts).unwrap();
        let addr = a.local_addr().unwrap();
        let b = TcpListener::bind_with(addr, opts).unwrap();
        assert_eq!(b.local_addr().unwrap(), addr);
        let err = TcpListener::bind(addr).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse);

        let counts = Rc::new([Cell::new(0usize), Cell::new(0usize)]);
        for (i, l) in [a, b].into_iter().enumerate() {
            let counts = counts.clone();
            spawn(async move {
                loop {
                    let (s, _) = l.accept().await.unwrap();
                    counts[i].set(counts[i].get() + 1);
                    drop(s);
                }
            })
            .detach();
        }
        for _ in 0..N {
            let c = TcpStream::connect(addr).await.unwrap();
            assert_eq!(read_to_end(&c).await, b"");
        }
        assert_eq!(counts[0].get() + counts[1].get(), N);
        assert!(
            counts[0].get() > 0 && counts[1].get() > 0,
            "the kernel spread {N} connections over both: {} / {}",
            counts[0].get(),
            counts[1].get()
        );
    });
}

#[test]
fn a_large_write_to_a_slow_reader_completes_without_loss() {
    const TOTAL: usize = 8 << 20;
    const READER_START: Duration = Duration::from_millis(30);
    fn byte(i: usize) -> u8 {
        (i % 251) as u8
    }
    bounded(async {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let start = Instant::now();
        let writer = spawn(async move {
            let c = TcpStream::connect(addr).await.unwrap();
            // Small kernel buffers: 8 MiB cannot fit, so the writer must wait for the reader.
            socket2::SockRef::from(&c)
                .set_send_buffer_size(64 << 10)
                .unwrap();
            let data: Vec<u8> = (0..TOTAL).map(byte).collect();
            c.write_all(&data).await.unwrap();
            let done = start.elapsed();
            c.shutdown(Shutdown::Write).unwrap();
            done
        });
        let (s, _) = listener.accept().await.unwrap();
        socket2::SockRef::from(&s)
            .set_recv_buffer_size(64 << 10)
            .unwrap();
        sleep(READER_START).await;
        let reader_start = start.elapsed();
        let mut buf = vec![0u8; 16 << 10];
        let mut total = 0;
        let mut since_pause = 0;
        loop {
            let n = s.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            for (k, b) in buf[..n].iter().enumerate() {
                assert_eq!(*b, byte(total + k), "byte {} corrupted", total + k);
            }
            total += n;
            since_pause += n;
            if since_pause >= 512 << 10 {
                since_pause = 0;
                sleep(1).await;
            }
        }
        assert_eq!(total, TOTAL);
        let writer_done = writer.await.unwrap();
        assert!(
            writer_done > reader_start,
            "the writer finished at {writer_done:?}, before the reader started at \
             {reader_start:?}: no backpressure?"
        );
    });
}

/// The N-acceptors pattern: tasks accepting on one shared listener. Every waiter is woken when a
/// connection comes, so each connection is accepted (a listener remembering only its latest
/// waiter would leave the first acceptor asleep and its connection unaccepted).
#[test]
fn two_tasks_accepting_on_one_listener_both_accept() {
    bounded(async {
        let listener = Rc::new(TcpListener::bind("127.0.0.1:0").unwrap());
        let addr = listener.local_addr().unwrap();
        let acceptors: Vec<_> = (0..2)
            .map(|_| {
                let l = listener.clone();
                spawn(async move { l.accept().await.unwrap().1 })
            })
            .collect();
        // Both are waiting before the first connection comes.
        sleep(10).await;
        let c1 = TcpStream::connect(addr).await.unwrap();
        let c2 = TcpStream::connect(addr).await.unwrap();
        let mut peers = Vec::new();
        for (i, a) in acceptors.into_iter().enumerate() {
            let peer = nodus::timeout(Duration::from_secs(5), a)
                .await
                .unwrap_or_else(|_| panic!("acceptor {i} was never woken"));
            peers.push(peer.unwrap());
        }
        peers.sort();
        let mut want = vec![c1.local_addr().unwrap(), c2.local_addr().unwrap()];
        want.sort();
        assert_eq!(peers, want);
    });
}

/// Two acceptors, one connection: one accepts it, the other finds `WouldBlock` and waits again,
/// without waking the first or being woken over and over (no busy loop).
#[test]
fn the_acceptor_that_loses_the_race_waits_quietly() {
    bounded(async {
        let listener = Rc::new(TcpListener::bind("127.0.0.1:0").unwrap());
        let addr = listener.local_addr().unwrap();
        let polls = Rc::new(Cell::new(0u32));
        let acceptors: Vec<_> = (0..2)
            .map(|_| {
                let (l, polls) = (listener.clone(), polls.clone());
                spawn(async move {
                    let mut accept = std::pin::pin!(l.accept());
                    poll_fn(|cx| {
                        polls.set(polls.get() + 1);
                        accept.as_mut().poll(cx)
                    })
                    .await
                    .unwrap()
                })
            })
            .collect();
        sleep(10).await;
        let _c = TcpStream::connect(addr).await.unwrap();
        let start = Instant::now();
        while !acceptors.iter().any(|a| a.is_finished()) {
            assert!(start.elapsed() < Duration::from_secs(5), "nobody accepted");
            sleep(1).await;
        }
        sleep(100).await;
        let done = acceptors.iter().filter(|a| a.is_finished()).count();
        assert_eq!(done, 1, "one connection, one acceptor done");
        // Each polled once to wait and once when the connection came.
        assert!(
            polls.get() <= 4,
            "{} polls: the acceptors woke each other",
            polls.get()
        );
        for a in acceptors {
            a.abort();
        }
    });
}

/// Out of fds, a plain accept loop does not spin: each failed accept (`EMFILE`, returned to the
/// caller every time) makes the listener's next accept wait 100 ms (or for a new connection),
/// and the queued connection is accepted once fds are freed. Before, the accept failed again at
/// once, forever (millions of failures a second). Run alone: it takes every fd of the process.
#[test]
fn out_of_fds_an_accept_loop_backs_off_and_accepts_once_fds_are_freed() {
    const NAME: &str = "out_of_fds_an_accept_loop_backs_off_and_accepts_once_fds_are_freed";
    if !nodus_testkit::alone::scenario(NAME) {
        return;
    }
    let rt = nodus::Builder::new().watchdog(false).build().unwrap();
    rt.block_on(async {
        let listener = Rc::new(TcpListener::bind("127.0.0.1:0").unwrap());
        let _client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let fds = fill_fds();
        let accept = move || {
            let l = listener.clone();
            async move { l.accept().await.map(drop) }
        };
        accept_backs_off_out_of_fds(accept, fds).await;
    });
}
