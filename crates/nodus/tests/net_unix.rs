//! `nodus::net` Unix sockets: path bind/connect, `pair()`, concurrency, half-close, close
//! callbacks and path unlinking, ref/unref, errors, fd conversions and backpressure. Every test
//! bounded in time.

mod common;

use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::pin::Pin;
use std::rc::Rc;
use std::time::{Duration, Instant};

use common::net::{accept_backs_off_out_of_fds, echo, fill_fds, read_to_end};
use common::{bounded, cloexec};
use futures_io::AsyncWrite;
use nodus::net::{UnixListener, UnixStream};
use nodus::{Runtime, set_immediate, set_timeout, sleep, spawn, yield_now};

/// A fresh socket path for this test (removed first, in case an earlier run left it).
fn sock_path(name: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("nodus-{}-{name}.sock", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

#[test]
fn path_bind_connect_echo() {
    let path = sock_path("echo");
    let p = path.clone();
    bounded(async move {
        let listener = UnixListener::bind(&p).unwrap();
        assert!(cloexec(&listener));
        assert_eq!(listener.local_addr().unwrap().as_pathname(), Some(&*p));
        let server = spawn(async move {
            let (s, peer) = listener.accept().await.unwrap();
            assert!(peer.is_unnamed());
            assert!(cloexec(&s));
            echo(s).await;
        });
        let c = UnixStream::connect(&p).await.unwrap();
        assert!(cloexec(&c));
        assert_eq!(c.peer_addr().unwrap().as_pathname(), Some(&*p));
        c.write_all(b"over a unix socket").await.unwrap();
        c.shutdown(std::net::Shutdown::Write).unwrap();
        assert_eq!(read_to_end(&c).await, b"over a unix socket");
        server.await.unwrap();
    });
    assert!(!path.exists(), "the dropped listener unlinked its path");
}

#[test]
fn abstract_names_bind_and_connect() {
    let name = format!("\0nodus-test-{}", std::process::id());
    bounded(async move {
        let listener = UnixListener::bind(&name).unwrap();
        spawn(async move { echo(listener.accept().await.unwrap().0).await }).detach();
        let c = UnixStream::connect(&name).await.unwrap();
        c.write_all(b"abstract").await.unwrap();
        let mut buf = [0u8; 8];
        let mut got = 0;
        while got < 8 {
            got += c.read(&mut buf[got..]).await.unwrap();
        }
        assert_eq!(&buf, b"abstract");
    });
}

/// A fresh socket path of exactly `len` bytes, in the temp dir.
fn path_of_len(len: usize) -> PathBuf {
    let base = std::env::temp_dir().join(format!("nodus-{}-len{len}-", std::process::id()));
    let pad = len - base.as_os_str().len();
    let p = PathBuf::from(format!("{}{}", base.display(), "x".repeat(pad)));
    assert_eq!(p.as_os_str().len(), len);
    let _ = std::fs::remove_file(&p);
    p
}

/// A path that fills `sun_path` (108 bytes, no room for a NUL) binds and connects, as on Linux
/// and in Node; before, it was refused ("path must be shorter than SUN_LEN").
#[test]
fn a_path_of_108_bytes_binds_and_connects() {
    let path = path_of_len(108);
    let p = path.clone();
    bounded(async move {
        let listener = UnixListener::bind(&p).unwrap();
        assert_eq!(listener.local_addr().unwrap().as_pathname(), Some(&*p));
        let c = UnixStream::connect(&p).await.unwrap();
        let (s, _) = listener.accept().await.unwrap();
        c.write_all(b"108").await.unwrap();
        let mut buf = [0u8; 3];
        let mut got = 0;
        while got < 3 {
            got += s.read(&mut buf[got..]).await.unwrap();
        }
        assert_eq!(&buf, b"108");
    });
    assert!(!path.exists(), "the dropped listener unlinked its path");
}

/// A longer path is refused by bind and connect, the message naming its length and the limit.
#[test]
fn a_path_longer_than_108_bytes_is_refused_naming_its_length() {
    let path = path_of_len(109);
    bounded(async move {
        let bind = UnixListener::bind(&path).unwrap_err();
        let connect = UnixStream::connect(&path).await.unwrap_err();
        for err in [bind, connect] {
            assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput, "{err}");
            let text = err.to_string();
            assert!(
                text.contains("109 bytes") && text.contains("at most 108"),
                "{text}"
            );
        }
        assert!(!path.exists());
    });
}

/// A NUL inside a path is refused: the kernel would bind the path cut there, which the
/// listener's drop would not unlink.
#[test]
fn a_path_holding_a_nul_is_refused() {
    let cut = sock_path("cut");
    let mut with_nul = cut.clone().into_os_string();
    with_nul.push("\0tail");
    bounded(async move {
        let err = UnixListener::bind(&with_nul).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput, "{err}");
        assert!(err.to_string().contains("NUL"), "{err}");
        assert!(!cut.exists(), "bound at the path cut at its NUL");
    });
}

#[test]
fn pair_round_trip_both_ways() {
    bounded(async {
        let (a, b) = UnixStream::pair().unwrap();
        assert!(cloexec(&a) && cloexec(&b));
        a.write_all(b"to b").await.unwrap();
        let mut buf = [0u8; 4];
        let mut got = 0;
        while got < 4 {
            got += b.read(&mut buf[got..]).await.unwrap();
        }
        assert_eq!(&buf, b"to b");
        b.write_all(b"to a, then EOF").await.unwrap();
        drop(b);
        assert_eq!(read_to_end(&a).await, b"to a, then EOF");
    });
}

#[test]
fn many_concurrent_connections_served_by_tasks() {
    const N: usize = 64;
    let path = sock_path("many");
    bounded(async move {
        let listener = UnixListener::bind(&path).unwrap();
        let served = Rc::new(Cell::new(0));
        let s = served.clone();
        spawn(async move {
            loop {
                let (conn, _) = listener.accept().await.unwrap();
                let s = s.clone();
                spawn(async move {
                    echo(conn).await;
                    s.set(s.get() + 1);
                })
                .detach();
            }
        })
        .detach();
        let clients: Vec<_> = (0..N)
            .map(|i| {
                let path = path.clone();
                spawn(async move {
                    let c = UnixStream::connect(&path).await.unwrap();
                    let msg = format!("unix client {i}").repeat(i + 1);
                    c.write_all(msg.as_bytes()).await.unwrap();
                    c.shutdown(std::net::Shutdown::Write).unwrap();
                    assert_eq!(read_to_end(&c).await, msg.as_bytes());
                })
            })
            .collect();
        for c in clients {
            c.await.unwrap();
        }
        // A server task counts before its connection closes, so before its client sees EOF.
        assert_eq!(served.get(), N);
    });
}

#[test]
fn half_close_through_async_write_poll_close() {
    let path = sock_path("half");
    bounded(async move {
        let listener = UnixListener::bind(&path).unwrap();
        let server = spawn(async move {
            let (s, _) = listener.accept().await.unwrap();
            let got = read_to_end(&s).await;
            s.write_all(b"reply to ").await.unwrap();
            s.write_all(&got).await.unwrap();
        });
        let mut c = UnixStream::connect(&path).await.unwrap();
        c.write_all(b"request").await.unwrap();
        poll_fn(|cx| Pin::new(&mut c).poll_close(cx)).await.unwrap();
        assert_eq!(read_to_end(&c).await, b"reply to request");
        server.await.unwrap();
    });
}

#[test]
fn close_unlinks_and_calls_back_in_the_close_phase() {
    let path = sock_path("close");
    let rt = Runtime::new();
    let trace = Rc::new(RefCell::new(Vec::new()));
    let t = trace.clone();
    let p = path.clone();
    rt.enter(|| {
        let listener = UnixListener::bind(&p).unwrap();
        assert!(p.exists());
        let t1 = t.clone();
        let p1 = p.clone();
        listener.close(move || {
            assert!(!p1.exists());
            t1.borrow_mut().push("close");
        });
        assert!(!p.exists(), "unlinked at once");
        let t2 = t.clone();
        set_immediate(move || t2.borrow_mut().push("immediate"));
    });
    rt.run();
    assert_eq!(*trace.borrow(), ["immediate", "close"]);

    // A stream's close: the peer reads EOF, the callback runs after immediates.
    let trace = Rc::new(RefCell::new(Vec::new()));
    let t = trace.clone();
    bounded(async move {
        let (a, b) = UnixStream::pair().unwrap();
        let t1 = t.clone();
        a.close(move || t1.borrow_mut().push("close"));
        let t2 = t.clone();
        set_immediate(move || t2.borrow_mut().push("immediate"));
        assert_eq!(read_to_end(&b).await, b"");
        // Each yield waits for a check phase; the close phase follows the first one.
        while t.borrow().len() < 2 {
            yield_now().await;
        }
    });
    assert_eq!(*trace.borrow(), ["immediate", "close"]);
}

#[test]
fn adopted_and_released_listeners_never_unlink() {
    let path = sock_path("adopt");
    let p = path.clone();
    bounded(async move {
        // Bound by std, adopted, dropped: the path stays.
        let std_listener = std::os::unix::net::UnixListener::bind(&p).unwrap();
        let listener = UnixListener::from_std(std_listener).unwrap();
        let c = UnixStream::connect(&p).await.unwrap();
        let (s, _) = listener.accept().await.unwrap();
        drop((c, s));
        drop(listener);
        assert!(p.exists(), "an adopted listener does not own its path");
        std::fs::remove_file(&p).unwrap();

        // Bound by nodus, released to std: the path stays too, and the socket still works.
        let listener = UnixListener::bind(&p).unwrap();
        let std_listener = listener.into_std();
        assert!(p.exists());
        assert_eq!(
            std_listener.accept().unwrap_err().kind(),
            std::io::ErrorKind::WouldBlock
        );
        let fd = OwnedFd::from(std_listener);
        socket2::SockRef::from(&fd).set_cloexec(false).unwrap();
        let listener = UnixListener::from_owned_fd(fd).unwrap();
        assert!(cloexec(&listener));
        let c = UnixStream::connect(&p).await.unwrap();
        let (s, _) = listener.accept().await.unwrap();
        let s = UnixStream::from_owned_fd(OwnedFd::from(s.into_std())).unwrap();
        s.write_all(b"adopted").await.unwrap();
        drop(s);
        assert_eq!(read_to_end(&c).await, b"adopted");
        drop(listener);
        assert!(p.exists());

        // Wrong kinds are refused.
        let (x, _y) = std::os::unix::net::UnixStream::pair().unwrap();
        let err = UnixListener::from_owned_fd(x.into()).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput, "{err}");
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let err = UnixStream::from_owned_fd(tcp.into()).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput, "{err}");
        let (d, _e) = std::os::unix::net::UnixDatagram::pair().unwrap();
        let err = UnixStream::from_owned_fd(d.into()).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput, "{err}");
    });
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn connect_errors() {
    let missing = sock_path("missing");
    let stale = sock_path("stale");
    // A socket file nobody listens on any more.
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    let s = stale.clone();
    bounded(async move {
        let err = UnixStream::connect(&missing).await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::NotFound, "{err}");
        let err = UnixStream::connect(&s).await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused, "{err}");
        let err = UnixListener::bind(&s).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse, "{err}");
        assert!(s.exists(), "a failed bind removes nothing");
    });
    std::fs::remove_file(&stale).unwrap();
}

#[test]
fn unref_and_ref() {
    let path = sock_path("unref");
    let rt = Runtime::new();
    let start = Instant::now();
    let p = path.clone();
    rt.enter(|| {
        let listener = UnixListener::bind(&p).unwrap();
        listener.unref();
        spawn(async move {
            let _ = listener.accept().await;
            unreachable!("nobody connects");
        })
        .detach();
    });
    rt.run();
    assert!(start.elapsed() < Duration::from_secs(1));
    drop(rt);
    assert!(
        !path.exists(),
        "dropping the loop dropped the task and its listener"
    );

    let rt = Runtime::new();
    let fired = Rc::new(Cell::new(false));
    let f = fired.clone();
    rt.enter(|| {
        let (a, b) = UnixStream::pair().unwrap();
        a.unref();
        a.ref_();
        assert!(a.has_ref());
        b.unref();
        spawn(async move {
            let _ = a.read(&mut [0u8; 1]).await;
            drop(b);
        })
        .detach();
        set_timeout(30, move || {
            f.set(true);
            nodus::rt::stop();
        })
        .unref();
    });
    rt.run();
    assert!(fired.get(), "the ref'd stream kept the loop running");
}

#[test]
fn a_large_write_over_a_pair_completes_without_loss() {
    const TOTAL: usize = 8 << 20;
    fn byte(i: usize) -> u8 {
        (i % 253) as u8
    }
    bounded(async {
        let (a, b) = UnixStream::pair().unwrap();
        let writer = spawn(async move {
            let data: Vec<u8> = (0..TOTAL).map(byte).collect();
            a.write_all(&data).await.unwrap();
        });
        sleep(20).await;
        let mut buf = vec![0u8; 16 << 10];
        let mut total = 0;
        while total < TOTAL {
            let n = b.read(&mut buf).await.unwrap();
            assert!(n > 0);
            for (k, x) in buf[..n].iter().enumerate() {
                assert_eq!(*x, byte(total + k), "byte {} corrupted", total + k);
            }
            total += n;
        }
        writer.await.unwrap();
        assert_eq!(
            read_to_end(&b).await,
            b"",
            "the writer's socket was dropped"
        );
    });
}

/// Out of fds, a Unix listener's accept loop backs off as a TCP one's does (`net_tcp.rs`).
#[test]
fn out_of_fds_an_accept_loop_backs_off_and_accepts_once_fds_are_freed() {
    const NAME: &str = "out_of_fds_an_accept_loop_backs_off_and_accepts_once_fds_are_freed";
    if !nodus_testkit::alone::scenario(NAME) {
        return;
    }
    let path = sock_path("emfile");
    let rt = nodus::Builder::new().watchdog(false).build().unwrap();
    rt.block_on(async {
        let listener = Rc::new(UnixListener::bind(&path).unwrap());
        let _client = std::os::unix::net::UnixStream::connect(&path).unwrap();
        let fds = fill_fds();
        let accept = move || {
            let l = listener.clone();
            async move { l.accept().await.map(drop) }
        };
        accept_backs_off_out_of_fds(accept, fds).await;
    });
}
