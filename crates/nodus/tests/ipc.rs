//! `nodus::ipc` between two nodus ends and against a raw peer that speaks the wire format by
//! hand: messages, key order, handles, ACK/NACK and retransmission, internal messages, Node's
//! socket-list replies, malformed and oversized frames, backpressure, disconnect. Every test
//! bounded in time.

mod common;

use std::cell::Cell;
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::rc::Rc;
use std::time::Duration;

use common::ipc::with_raw;
use common::{bounded, bounded_for, cloexec};
use nodus::ipc::{Channel, ChannelOptions, FrameError, HIGH_WATER, IpcError, SendHandle};
use nodus::net::{TcpListener, TcpStream};
use nodus::{Runtime, spawn};
use serde::Serialize;

/// Two connected channels.
fn pair() -> (Channel, Channel) {
    let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
    (
        Channel::from_fd(a.into(), ChannelOptions::default()).unwrap(),
        Channel::from_fd(b.into(), ChannelOptions::default()).unwrap(),
    )
}

fn is_listener(fd: &OwnedFd) -> bool {
    socket2::SockRef::from(fd).is_listener().unwrap()
}

#[derive(Serialize)]
struct Ordered {
    zeta: u32,
    alpha: &'static str,
    mid: [u8; 2],
}

#[test]
fn messages_both_ways_keep_key_order_and_node_text() {
    bounded(async {
        let (a, b) = pair();
        assert!(
            a.send(&Ordered {
                zeta: 1,
                alpha: "é€😀",
                mid: [1, 2]
            })
            .unwrap()
        );
        a.send("a plain string").unwrap();
        a.send(&42).unwrap();
        a.send(&f64::NAN).unwrap();
        let m = b.recv().await.unwrap().unwrap();
        assert_eq!(m.json(), r#"{"zeta":1,"alpha":"é€😀","mid":[1,2]}"#);
        assert_eq!(
            b.recv()
                .await
                .unwrap()
                .unwrap()
                .deserialize::<String>()
                .unwrap(),
            "a plain string"
        );
        assert_eq!(b.recv().await.unwrap().unwrap().json(), "42");
        assert_eq!(b.recv().await.unwrap().unwrap().json(), "null");
        // Echoing a received message keeps its text (a struct keeps field order; a
        // `serde_json::Value` would sort its keys).
        #[derive(Serialize)]
        struct Echo<'a> {
            echo: &'a nodus::ipc::Message,
        }
        b.send(&Echo { echo: &m }).unwrap();
        let back = a.recv().await.unwrap().unwrap();
        assert_eq!(
            back.json(),
            r#"{"echo":{"zeta":1,"alpha":"é€😀","mid":[1,2]}}"#
        );
    });
}

#[test]
fn a_listener_passed_between_nodus_channels_accepts() {
    bounded(async {
        let (a, b) = pair();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        a.send_handle(&"take it", listener).unwrap();
        a.send(&"after").unwrap();
        let mut m = b.recv().await.unwrap().unwrap();
        assert_eq!(m.json(), r#""take it""#);
        let handle = m.take_handle().unwrap();
        assert_eq!(handle.node_type(), "net.Server");
        assert!(cloexec(&handle), "received fds are close-on-exec");
        let listener = handle.into_tcp_listener().unwrap();
        assert_eq!(b.recv().await.unwrap().unwrap().json(), r#""after""#);
        let server = spawn(async move {
            let (s, _) = listener.accept().await.unwrap();
            s.write_all(b"served").await.unwrap();
        });
        let c = TcpStream::connect(addr).await.unwrap();
        let mut buf = [0u8; 16];
        let n = c.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"served");
        server.await.unwrap();
        a.flush().await.unwrap();
    });
}

/// A pipe: the read end kept, the write end shared as the fds `send_fds` takes.
fn pipe_pair() -> (std::io::PipeReader, std::rc::Rc<OwnedFd>) {
    let (r, w) = std::io::pipe().unwrap();
    (r, std::rc::Rc::new(OwnedFd::from(w)))
}

#[test]
fn a_burst_of_fds_travels_in_one_frame_in_order_between_other_messages() {
    use std::io::{Read, Write};
    bounded(async {
        let (a, b) = pair();
        let pipes: Vec<_> = (0..5).map(|_| pipe_pair()).collect();
        a.send(&"before").unwrap();
        a.send_fds(&"burst", pipes.iter().map(|(_, w)| w.clone()).collect())
            .unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        a.send_handle(&"one", listener).unwrap();
        a.send_fds(&"empty", Vec::new()).unwrap();
        a.send(&"after").unwrap();

        assert_eq!(b.recv().await.unwrap().unwrap().json(), r#""before""#);
        let mut burst = b.recv().await.unwrap().unwrap();
        assert_eq!(burst.json(), r#""burst""#);
        let handles = burst.take_handles();
        assert_eq!(handles.len(), 5);
        for (i, h) in handles.into_iter().enumerate() {
            assert!(cloexec(&h), "received fds are close-on-exec");
            let mut w = std::fs::File::from(h.into_owned_fd());
            w.write_all(&[b'0' + i as u8]).unwrap();
        }
        // The sender's own references stay open until it drops them.
        assert!(pipes.iter().all(|(_, w)| std::rc::Rc::strong_count(w) == 1));
        for (i, (mut r, _)) in pipes.into_iter().enumerate() {
            let mut byte = [0u8; 1];
            r.read_exact(&mut byte).unwrap();
            assert_eq!(byte[0], b'0' + i as u8, "fds arrive in the order sent");
        }
        let mut one = b.recv().await.unwrap().unwrap();
        assert_eq!(one.json(), r#""one""#);
        assert!(one.take_handle().unwrap().into_tcp_listener().is_ok());
        let mut empty = b.recv().await.unwrap().unwrap();
        assert_eq!(empty.json(), r#""empty""#);
        assert!(empty.take_handles().is_empty());
        assert_eq!(b.recv().await.unwrap().unwrap().json(), r#""after""#);
    });
}

#[test]
fn bursts_larger_than_the_socket_buffer_keep_their_fds_paired() {
    use std::io::{Read, Write};
    bounded(async {
        let (a, b) = pair();
        // Each frame is larger than the socketpair's buffer: it goes out in several writes, its
        // fds with the first only, and arrives in several reads.
        let big = "x".repeat(600 * 1024);
        let bursts: Vec<Vec<_>> = (0..3)
            .map(|_| (0..3).map(|_| pipe_pair()).collect())
            .collect();
        for (i, burst) in bursts.iter().enumerate() {
            let msg = serde_json::json!({ "burst": i, "pad": big });
            a.send_fds(&msg, burst.iter().map(|(_, w)| w.clone()).collect())
                .unwrap();
        }
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        a.send_handle(&"one", listener).unwrap();
        for (i, burst) in bursts.into_iter().enumerate() {
            let mut m = b.recv().await.unwrap().unwrap();
            let v: serde_json::Value = m.deserialize().unwrap();
            assert_eq!(v["burst"], i);
            let handles = m.take_handles();
            assert_eq!(handles.len(), 3, "burst {i}");
            for (j, h) in handles.into_iter().enumerate() {
                let mut w = std::fs::File::from(h.into_owned_fd());
                w.write_all(&[j as u8]).unwrap();
            }
            for (j, (mut r, _)) in burst.into_iter().enumerate() {
                let mut byte = [0u8; 1];
                r.read_exact(&mut byte).unwrap();
                assert_eq!(byte[0], j as u8, "burst {i}: fd {j} is the one sent there");
            }
        }
        let mut one = b.recv().await.unwrap().unwrap();
        assert_eq!(one.json(), r#""one""#);
        assert!(one.take_handle().unwrap().into_tcp_listener().is_ok());
    });
}

#[test]
fn a_burst_frame_is_the_nodus_wrapper_and_is_not_acked() {
    bounded(async {
        let (ch, mut raw) = with_raw(ChannelOptions::default());
        let (_r, w) = pipe_pair();
        ch.send_fds(&serde_json::json!({"k": 1}), vec![w.clone(), w])
            .unwrap();
        ch.send(&"next").unwrap();
        let (frame, fds) = raw.frame().await;
        assert_eq!(frame, r#"{"cmd":"NODE_NODUS_FDS","count":2,"msg":{"k":1}}"#);
        assert_eq!(fds.len(), 2);
        // Not held for an ACK: the next message follows at once.
        let (next, _) = raw.frame().await;
        assert_eq!(next, r#""next""#);
    });
}

#[test]
fn two_nacks_give_exactly_two_retransmissions_then_the_handle_is_delivered() {
    bounded(async {
        let (ch, mut raw) = with_raw(ChannelOptions::default());
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        ch.send_handle(&serde_json::json!({ "n": 1 }), listener)
            .unwrap();
        // Held until the ACK, and reported as queued.
        ch.send(&"after").unwrap();
        assert!(ch.queued_bytes() > 0);
        let mut handle_frames = 0;
        loop {
            let (line, fds) = raw.frame().await;
            if line.contains("NODE_HANDLE") {
                assert_eq!(
                    line,
                    r#"{"cmd":"NODE_HANDLE","type":"net.Server","msg":{"n":1}}"#
                );
                assert_eq!(fds.len(), 1, "every (re)transmission carries the fd");
                handle_frames += 1;
                if handle_frames <= 2 {
                    raw.write(b"{\"cmd\":\"NODE_HANDLE_NACK\"}\n").await;
                } else {
                    assert!(is_listener(&fds[0]), "the delivered handle is the listener");
                    raw.write(b"{\"cmd\":\"NODE_HANDLE_ACK\"}\n").await;
                }
            } else {
                assert_eq!(line, r#""after""#, "held messages follow the ACK");
                assert!(fds.is_empty());
                break;
            }
        }
        assert_eq!(
            handle_frames, 3,
            "1 transmission + exactly 2 retransmissions"
        );
        ch.send(&"end").unwrap();
        assert_eq!(raw.frame().await.0, r#""end""#);
        ch.flush().await.unwrap();
    });
}

/// A loop that ends with frames still queued (the peer has not read them) says what was lost.
#[test]
fn a_loop_that_ends_with_frames_unwritten_says_they_are_lost() {
    let (warnings, _guard) = common::Warnings::capture();
    let raw = Runtime::new().block_on(async {
        let (ch, raw) = with_raw(ChannelOptions::default());
        // More than the socket's buffers hold while the peer reads nothing.
        let big = "x".repeat(64 * 1024);
        for _ in 0..64 {
            ch.send(&big).unwrap();
        }
        nodus::sleep(10).await;
        assert!(ch.queued_bytes() > 0);
        raw
    });
    drop(raw);
    let text = warnings.text();
    assert!(
        text.contains("an IPC channel ended with its loop before writing"),
        "{text}"
    );
}

/// `send_handle` then `flush`, Node's `process.send(msg, handle, cb)`: the flush ends at the
/// handle's ACK, with nothing sent after it (no write left to wake it).
#[test]
fn a_flush_after_a_handle_ends_at_its_ack() {
    bounded_for(Duration::from_secs(10), async {
        let (ch, mut raw) = with_raw(ChannelOptions::default());
        let (fd, _keep) = std::os::unix::net::UnixStream::pair().unwrap();
        ch.send_handle(&1, SendHandle::fd(fd.into())).unwrap();
        // Flushed in a task of its own, woken only by the channel.
        let flushed = Rc::new(Cell::new(false));
        let f = flushed.clone();
        let ch2 = Rc::new(ch);
        let flush = spawn(async move {
            ch2.flush().await.unwrap();
            f.set(true);
        });
        let (line, fds) = raw.frame().await;
        assert!(line.starts_with(r#"{"cmd":"NODE_HANDLE""#), "{line}");
        assert_eq!(fds.len(), 1);
        nodus::sleep(20).await;
        assert!(!flushed.get(), "the flush waits for the ACK");
        raw.write(b"{\"cmd\":\"NODE_HANDLE_ACK\"}\n").await;
        flush.await.unwrap();
    });
}

#[test]
fn handles_held_behind_the_one_in_flight_can_be_taken_back_unwritten() {
    bounded(async {
        let (ch, mut raw) = with_raw(ChannelOptions::default());
        let (mut read_end, write_end) = std::io::pipe().unwrap();
        let (first, _keep) = std::os::unix::net::UnixStream::pair().unwrap();
        let (third, _keep3) = std::os::unix::net::UnixStream::pair().unwrap();
        ch.send_handle(&serde_json::json!({ "n": 1 }), SendHandle::fd(first.into()))
            .unwrap();
        ch.send_handle(
            &serde_json::json!({ "n": 2 }),
            SendHandle::fd(OwnedFd::from(write_end)),
        )
        .unwrap();
        ch.send(&"between").unwrap();
        ch.send_handle(&serde_json::json!({ "n": 3 }), SendHandle::fd(third.into()))
            .unwrap();
        let queued = ch.queued_bytes();
        let mut offered = Vec::new();
        let taken = ch.take_back_held_handles(|msg| {
            offered.push(msg.to_owned());
            msg == r#"{"n":2}"#
        });
        assert_eq!(taken, 1);
        // Only held handles are offered: not the one in flight, nor a plain message.
        assert_eq!(offered, [r#"{"n":2}"#, r#"{"n":3}"#]);
        assert!(ch.queued_bytes() < queued);
        // Its fd (the channel's, the only copy) is closed: the pipe's reader sees end of file.
        let mut rest = Vec::new();
        std::io::Read::read_to_end(&mut read_end, &mut rest).unwrap();
        let (line, fds) = raw.frame().await;
        assert_eq!(
            line,
            r#"{"cmd":"NODE_HANDLE","type":"net.Native","msg":{"n":1}}"#
        );
        assert_eq!(fds.len(), 1);
        raw.write(b"{\"cmd\":\"NODE_HANDLE_ACK\"}\n").await;
        let (between, with_it) = raw.frame().await;
        assert_eq!(between, r#""between""#);
        let (line, fds) = raw.frame().await;
        assert_eq!(
            line,
            r#"{"cmd":"NODE_HANDLE","type":"net.Native","msg":{"n":3}}"#
        );
        // One read may bring both frames (the raw peer gives its fds to the first).
        assert_eq!(with_it.len() + fds.len(), 1);
        raw.write(b"{\"cmd\":\"NODE_HANDLE_ACK\"}\n").await;
        ch.send(&"end").unwrap();
        assert_eq!(raw.frame().await.0, r#""end""#, "nothing else was written");
        ch.flush().await.unwrap();
    });
}

#[test]
fn four_nacks_give_an_error_event_and_release_held_messages() {
    bounded(async {
        let (ch, mut raw) = with_raw(ChannelOptions::default());
        let (fd, _keep) = std::os::unix::net::UnixStream::pair().unwrap();
        ch.send_handle(&1, SendHandle::fd(fd.into())).unwrap();
        ch.send(&"after").unwrap();
        for _ in 0..4 {
            let (line, fds) = raw.frame().await;
            assert!(
                line.starts_with(r#"{"cmd":"NODE_HANDLE","type":"net.Native""#),
                "{line}"
            );
            assert_eq!(fds.len(), 1);
            raw.write(b"{\"cmd\":\"NODE_HANDLE_NACK\"}\n").await;
        }
        match ch.recv().await {
            Some(Err(IpcError::HandleNotReceived(msg))) => assert_eq!(msg.get(), "1"),
            other => panic!("expected HandleNotReceived, got {other:?}"),
        }
        assert_eq!(raw.frame().await.0, r#""after""#);
        assert!(ch.is_connected(), "the channel stays open");
    });
}

#[test]
fn received_handles_are_acked_and_a_missing_fd_is_nacked() {
    bounded(async {
        let (ch, mut raw) = with_raw(ChannelOptions::default());
        raw.write(b"{\"cmd\":\"NODE_HANDLE\",\"type\":\"net.Server\",\"msg\":\"no fd\"}\n")
            .await;
        assert_eq!(raw.frame().await.0, r#"{"cmd":"NODE_HANDLE_NACK"}"#);
        // Now with an fd, sent like Node: one sendmsg for frame and fd.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let frame =
            b"{\"cmd\":\"NODE_HANDLE\",\"type\":\"net.Server\",\"msg\":{\"b\":1,\"a\":2}}\n";
        raw.sock
            .write_with(|s| {
                let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
                let mut control = rustix::net::SendAncillaryBuffer::new(&mut space);
                let fds = [std::os::fd::AsFd::as_fd(&l)];
                control.push(rustix::net::SendAncillaryMessage::ScmRights(&fds));
                let iov = [std::io::IoSlice::new(frame)];
                Ok(rustix::net::sendmsg(
                    s,
                    &iov,
                    &mut control,
                    rustix::net::SendFlags::empty(),
                )?)
            })
            .await
            .unwrap();
        assert_eq!(raw.frame().await.0, r#"{"cmd":"NODE_HANDLE_ACK"}"#);
        let mut m = ch.recv().await.unwrap().unwrap();
        assert_eq!(m.json(), r#"{"b":1,"a":2}"#);
        let l2 = m.take_handle().unwrap().into_tcp_listener().unwrap();
        assert_eq!(l2.local_addr().unwrap(), l.local_addr().unwrap());
    });
}

#[test]
fn internal_messages_are_kept_from_user_receivers_and_socket_queries_answered() {
    bounded(async {
        let (ch, mut raw) = with_raw(ChannelOptions::default());
        raw.write(b"{\"cmd\":\"NODE_PYTHON_TEST\",\"x\":1}\n{\"cmd\":\"NODE_\"}\n\"user\"\n")
            .await;
        raw.write(b"{\"cmd\":\"NODE_SOCKET_NOTIFY_CLOSE\",\"key\":\"4:127.0.0.1:0\"}\n")
            .await;
        raw.write(b"{\"cmd\":\"NODE_SOCKET_GET_COUNT\",\"key\":\"k\"}\n")
            .await;
        // "NODE_" alone is not internal (Node: cmd longer than 5).
        assert_eq!(
            ch.recv().await.unwrap().unwrap().json(),
            r#"{"cmd":"NODE_"}"#
        );
        assert_eq!(ch.recv().await.unwrap().unwrap().json(), r#""user""#);
        assert_eq!(
            ch.recv_internal().await.unwrap().json(),
            r#"{"cmd":"NODE_PYTHON_TEST","x":1}"#
        );
        assert_eq!(
            raw.frame().await.0,
            r#"{"cmd":"NODE_SOCKET_ALL_CLOSED","key":"4:127.0.0.1:0"}"#
        );
        assert_eq!(
            raw.frame().await.0,
            r#"{"cmd":"NODE_SOCKET_COUNT","key":"k","count":0}"#
        );
    });
}

#[test]
fn a_malformed_frame_is_an_error_and_the_channel_goes_on() {
    bounded(async {
        let (ch, mut raw) = with_raw(ChannelOptions::default());
        raw.write(b"\"ok\"\n{not json}\n\n\"still here\"\n").await;
        assert_eq!(ch.recv().await.unwrap().unwrap().json(), r#""ok""#);
        for _ in 0..2 {
            match ch.recv().await {
                Some(Err(e @ IpcError::Frame(FrameError::Malformed { .. }))) => {
                    // What a user logs must not claim the channel is gone: it is not.
                    let text = e.to_string();
                    assert!(!text.contains("closed"), "{text}");
                    assert!(text.contains("frame dropped"), "{text}");
                }
                other => panic!("expected a malformed-frame error, got {other:?}"),
            }
        }
        assert_eq!(ch.recv().await.unwrap().unwrap().json(), r#""still here""#);
        assert!(ch.is_connected(), "the channel stays open");
        ch.send(&"reply").unwrap();
        assert_eq!(raw.frame().await.0, r#""reply""#);
    });
}

#[test]
fn an_oversized_frame_is_an_error_before_it_is_buffered_whole_and_the_next_one_arrives() {
    bounded(async {
        let (ch, raw) = with_raw(ChannelOptions { max_frame: 1024 });
        raw.write(&vec![b'1'; 4000]).await;
        match ch.recv().await {
            Some(Err(IpcError::Frame(FrameError::TooLarge { max: 1024, .. }))) => {}
            other => panic!("expected TooLarge, got {other:?}"),
        }
        // The rest of the line is discarded, reported no more; the next frame arrives.
        raw.write(&vec![b'2'; 4000]).await;
        raw.write(b"\n\"after\"\n").await;
        assert_eq!(ch.recv().await.unwrap().unwrap().json(), r#""after""#);
        assert!(ch.is_connected());
        let (ch2, _raw2) = with_raw(ChannelOptions { max_frame: 16 });
        assert!(matches!(
            ch2.send(&"x".repeat(100)),
            Err(IpcError::TooLarge { .. })
        ));
    });
}

#[test]
fn bad_frames_nobody_reads_are_bounded_and_the_messages_after_them_arrive() {
    bounded(async {
        let (ch, raw) = with_raw(ChannelOptions::default());
        raw.write(&b"{oops}\n".repeat(100)).await;
        raw.write(b"\"last\"\n").await;
        raw.all_read().await;
        let mut errors = 0;
        loop {
            match ch.recv().await.unwrap() {
                Err(IpcError::Frame(_)) => errors += 1,
                Ok(m) => {
                    assert_eq!(m.json(), r#""last""#);
                    break;
                }
                Err(e) => panic!("unexpected error event: {e}"),
            }
        }
        assert_eq!(errors, 64, "at most 64 input errors wait unread");
    });
}

#[test]
fn a_peer_that_stops_reading_gets_backpressure_and_nothing_is_lost() {
    bounded(async {
        let (ch, mut raw) = with_raw(ChannelOptions::default());
        let payload = "x".repeat(16 * 1024);
        let mut first_false = None;
        for i in 0..64u32 {
            let ok = ch
                .send(&serde_json::json!({ "i": i, "p": payload }))
                .unwrap();
            if !ok && first_false.is_none() {
                first_false = Some(i);
                assert!(ch.queued_bytes() >= HIGH_WATER);
            }
        }
        assert!(first_false.is_some(), "send() reported backpressure");
        for i in 0..64u32 {
            let (line, _) = raw.frame().await;
            let v: serde_json::Value = serde_json::from_str(&line).unwrap();
            assert_eq!(v["i"], i);
            assert_eq!(v["p"].as_str().unwrap().len(), payload.len());
        }
        ch.flush().await.unwrap();
        assert_eq!(ch.queued_bytes(), 0);
    });
}

#[test]
fn disconnect_is_seen_on_both_sides() {
    bounded(async {
        let (a, b) = pair();
        a.send(&"last").unwrap();
        a.disconnect();
        assert!(!a.is_connected());
        assert!(matches!(a.send(&1), Err(IpcError::Closed)));
        assert_eq!(b.recv().await.unwrap().unwrap().json(), r#""last""#);
        assert!(b.recv().await.is_none(), "EOF");
        assert!(!b.is_connected());
        assert!(a.recv().await.is_none());
    });
}

#[test]
fn an_open_channel_keeps_run_alive_until_unrefd() {
    let rt = Runtime::new();
    let (a, b) = rt.enter(pair);
    rt.enter(|| {
        a.unref();
        b.unref();
    });
    rt.run(); // returns: both unref'd
    rt.enter(|| {
        b.ref_();
        drop(a); // disconnect: b reads EOF and closes, releasing the loop
    });
    rt.run();
    rt.enter(|| drop(b));
}
