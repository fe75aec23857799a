//! Which message received fds belong to. A raw peer writes crafted frames with `SCM_RIGHTS` fds
//! that do not match them (a stray fd with a plain message, a `NODE_NODUS_FDS` frame whose count
//! is not the number of fds it carries, fds arriving in the middle of a frame), each followed by
//! a well-formed `NODE_HANDLE`. The rule (Node's): fds travel with the bytes of their message.
//! Checked: the mismatch is an error event on the channel, which stays open; the next handle is
//! the one sent with it; every stray fd is closed (its pipe's write end is gone, and
//! `/proc/self/fd` counts what it did before). The tests count the process's fds, so they run
//! one at a time; each is bounded in time. One test is the well-formed case the rule must keep:
//! a frame's fds arrive in a read with earlier frames, or before the rest of the frame. The last
//! ones check that the error events nobody reads are bounded while every message arrives, that
//! the fds of unread messages are bounded too, and what happens to fds the kernel cannot install
//! (the receiver at its open-files limit).

mod common;

use std::net::TcpListener;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::{Mutex, MutexGuard};

use common::bounded;
use common::ipc::{Raw, with_raw};
use common::pipes::{pipe, write_end_closed};
use nodus::ipc::{Channel, ChannelOptions, IpcError};
use nodus_testkit::fds::open_fds;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

const HANDLE_FRAME: &[u8] = b"{\"cmd\":\"NODE_HANDLE\",\"type\":\"net.Server\",\"msg\":\"next\"}\n";

/// The next event must be the fd-mismatch error.
async fn expect_fd_error(ch: &Channel, expected: usize, received: usize) {
    match ch.recv().await {
        Some(Err(e @ IpcError::UnexpectedFds { .. })) => {
            let IpcError::UnexpectedFds {
                expected: e_expected,
                received: e_received,
            } = e
            else {
                unreachable!()
            };
            assert_eq!((e_expected, e_received), (expected, received));
        }
        other => panic!("expected an fd-mismatch error event, got {other:?}"),
    }
}

/// Checks that the handle frame sent with `listener` is ACKed and delivered as itself.
async fn the_handle_arrives_as_itself(ch: &Channel, raw: &mut Raw, listener: &TcpListener) {
    assert_eq!(raw.frame().await.0, r#"{"cmd":"NODE_HANDLE_ACK"}"#);
    let mut m = ch.recv().await.unwrap().unwrap();
    assert_eq!(m.json(), r#""next""#);
    let got = m.take_handle().unwrap().into_tcp_listener().unwrap();
    assert_eq!(got.local_addr().unwrap(), listener.local_addr().unwrap());
}

/// Sends a well-formed handle (`listener`) and checks it is ACKed and delivered as itself.
async fn the_next_handle_is_its_own(ch: &Channel, raw: &mut Raw, listener: &TcpListener) {
    raw.send_now(HANDLE_FRAME, &[listener.as_fd()]);
    the_handle_arrives_as_itself(ch, raw, listener).await;
    assert!(ch.is_connected(), "the channel stays open");
}

/// Runs one case, alone, on a fresh channel and raw peer, with a listener to send as a handle;
/// when it is done (its locals dropped), the process holds no fd it did not hold before.
fn fd_case(case: impl AsyncFnOnce(&Channel, &mut Raw, &TcpListener)) {
    let _serial = serial();
    bounded(async {
        let (ch, mut raw) = with_raw(ChannelOptions::default());
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let before = open_fds();
        case(&ch, &mut raw, &listener).await;
        assert_eq!(open_fds(), before, "no fd left open");
    });
}

#[test]
fn a_stray_fd_with_a_plain_message_is_closed_and_not_given_to_the_next_handle() {
    fd_case(async |ch, raw, listener| {
        let (r, w) = pipe();
        raw.send_now(b"\"plain\"\n", &[w.as_fd()]);
        drop(w);
        expect_fd_error(ch, 0, 1).await;
        let m = ch.recv().await.unwrap().unwrap();
        assert_eq!(m.json(), r#""plain""#);
        assert!(m.handle().is_none());
        assert!(write_end_closed(&r), "the stray fd was closed");
        the_next_handle_is_its_own(ch, raw, listener).await;
    });
}

#[test]
fn a_bad_frame_is_dropped_with_its_fd_and_the_next_handle_is_its_own() {
    fd_case(async |ch, raw, listener| {
        let (r, w) = pipe();
        raw.send_now(b"{\"cmd\":\"NODE_HANDLE\",oops}\n", &[w.as_fd()]);
        drop(w);
        match ch.recv().await {
            Some(Err(IpcError::Frame(_))) => {}
            other => panic!("expected a bad-frame error event, got {other:?}"),
        }
        assert!(write_end_closed(&r), "the bad frame's fd was closed");
        the_next_handle_is_its_own(ch, raw, listener).await;
    });
}

#[test]
fn a_split_fds_frame_with_fewer_fds_than_announced_does_not_take_the_next_frames() {
    fd_case(async |ch, raw, listener| {
        let (r, w) = pipe();
        // Announces 2 fds, carries 1, and its bytes arrive in two writes: its end reaches the
        // channel in the same read as the next frame and that frame's fd.
        let frame = b"{\"cmd\":\"NODE_NODUS_FDS\",\"count\":2,\"msg\":\"burst\"}\n";
        let (head, tail) = frame.split_at(20);
        raw.send_now(head, &[w.as_fd()]);
        drop(w);
        raw.send_now(tail, &[]);
        raw.send_now(HANDLE_FRAME, &[listener.as_fd()]);
        expect_fd_error(ch, 2, 1).await;
        let mut m = ch.recv().await.unwrap().unwrap();
        assert_eq!(m.json(), r#""burst""#);
        assert!(m.take_handles().is_empty(), "no fd it cannot vouch for");
        assert!(write_end_closed(&r), "its one fd was closed");
        the_handle_arrives_as_itself(ch, raw, listener).await;
    });
}

#[test]
fn an_fds_frame_with_more_fds_than_announced_keeps_none_and_the_next_handle_is_its_own() {
    fd_case(async |ch, raw, listener| {
        let (r1, w1) = pipe();
        let (r2, w2) = pipe();
        raw.send_now(
            b"{\"cmd\":\"NODE_NODUS_FDS\",\"count\":1,\"msg\":\"burst\"}\n",
            &[w1.as_fd(), w2.as_fd()],
        );
        drop((w1, w2));
        expect_fd_error(ch, 1, 2).await;
        let mut m = ch.recv().await.unwrap().unwrap();
        assert_eq!(m.json(), r#""burst""#);
        assert!(m.take_handles().is_empty());
        assert!(write_end_closed(&r1) && write_end_closed(&r2));
        the_next_handle_is_its_own(ch, raw, listener).await;
    });
}

#[test]
fn fds_that_arrive_in_the_middle_of_a_frame_belong_to_no_message() {
    fd_case(async |ch, raw, listener| {
        let (r, w) = pipe();
        raw.send_now(b"{\"plain\":", &[]);
        // The channel reads the frame's start before the rest comes, with an fd.
        nodus::sleep(20).await;
        raw.send_now(b"1}\n", &[w.as_fd()]);
        drop(w);
        expect_fd_error(ch, 0, 1).await;
        assert_eq!(ch.recv().await.unwrap().unwrap().json(), r#"{"plain":1}"#);
        assert!(write_end_closed(&r));
        the_next_handle_is_its_own(ch, raw, listener).await;
    });
}

#[test]
fn a_handle_frame_with_two_fds_is_nacked_and_both_are_closed() {
    fd_case(async |ch, raw, listener| {
        let (r1, w1) = pipe();
        let (r2, w2) = pipe();
        raw.send_now(HANDLE_FRAME, &[w1.as_fd(), w2.as_fd()]);
        drop((w1, w2));
        assert_eq!(raw.frame().await.0, r#"{"cmd":"NODE_HANDLE_NACK"}"#);
        expect_fd_error(ch, 1, 2).await;
        assert!(write_end_closed(&r1) && write_end_closed(&r2));
        the_next_handle_is_its_own(ch, raw, listener).await;
    });
}

#[test]
fn fds_sent_with_a_frames_first_byte_reach_it_however_the_bytes_are_read() {
    fd_case(async |ch, raw, listener| {
        let (_r1, w1) = pipe();
        let (_r2, w2) = pipe();
        // Two plain frames and a burst whose fds the kernel delivers with all of them in one
        // read; then a handle frame written in two parts, its fd with the first.
        raw.send_now(b"\"one\"\n\"two\"\n", &[]);
        raw.send_now(
            b"{\"cmd\":\"NODE_NODUS_FDS\",\"count\":2,\"msg\":\"burst\"}\n",
            &[w1.as_fd(), w2.as_fd()],
        );
        let (head, tail) = HANDLE_FRAME.split_at(7);
        raw.send_now(head, &[listener.as_fd()]);
        raw.send_now(tail, &[]);
        assert_eq!(ch.recv().await.unwrap().unwrap().json(), r#""one""#);
        assert_eq!(ch.recv().await.unwrap().unwrap().json(), r#""two""#);
        let mut m = ch.recv().await.unwrap().unwrap();
        assert_eq!(m.json(), r#""burst""#);
        let handles = m.take_handles();
        assert_eq!(handles.len(), 2);
        for (h, w) in handles.into_iter().zip([&w1, &w2]) {
            let (a, b) = (
                rustix::fs::fstat(&h).unwrap(),
                rustix::fs::fstat(w).unwrap(),
            );
            assert_eq!(
                (a.st_dev, a.st_ino),
                (b.st_dev, b.st_ino),
                "in the order sent"
            );
        }
        the_handle_arrives_as_itself(ch, raw, listener).await;
    });
}

/// Node's rule: a read's fds go to the frames in it that announce fds, in order, whatever else
/// shares that read (a peer that writes several frames with one `sendmsg`).
#[test]
fn a_reads_fds_go_to_its_handle_frames_in_order_around_other_frames() {
    fd_case(async |ch, raw, listener| {
        let (r, w) = pipe();
        let mut bytes = b"{\"pre\":1}\n".to_vec();
        bytes.extend_from_slice(HANDLE_FRAME);
        bytes.extend_from_slice(b"{\"mid\":1}\n");
        bytes.extend_from_slice(
            b"{\"cmd\":\"NODE_HANDLE\",\"type\":\"net.Native\",\"msg\":\"pipe\"}\n",
        );
        bytes.extend_from_slice(b"{\"post\":1}\n");
        raw.send_now(&bytes, &[listener.as_fd(), w.as_fd()]);
        assert_eq!(ch.recv().await.unwrap().unwrap().json(), r#"{"pre":1}"#);
        the_handle_arrives_as_itself(ch, raw, listener).await;
        assert_eq!(ch.recv().await.unwrap().unwrap().json(), r#"{"mid":1}"#);
        assert_eq!(raw.frame().await.0, r#"{"cmd":"NODE_HANDLE_ACK"}"#);
        let mut m = ch.recv().await.unwrap().unwrap();
        assert_eq!(m.json(), r#""pipe""#);
        let h = m.take_handle().unwrap();
        let (a, b) = (
            rustix::fs::fstat(&h).unwrap(),
            rustix::fs::fstat(&w).unwrap(),
        );
        assert_eq!(
            (a.st_dev, a.st_ino),
            (b.st_dev, b.st_ino),
            "the second fd sent"
        );
        assert_eq!(ch.recv().await.unwrap().unwrap().json(), r#"{"post":1}"#);
        drop((h, w));
        assert!(write_end_closed(&r));
        the_next_handle_is_its_own(ch, raw, listener).await;
    });
}

#[test]
fn fd_errors_nobody_reads_are_bounded_and_their_messages_all_arrive() {
    fd_case(async |ch, raw, listener| {
        const STRAYS: usize = 100;
        let (r, w) = pipe();
        for _ in 0..STRAYS {
            raw.send_now(b"\"plain\"\n", &[w.as_fd()]);
        }
        drop(w);
        // Nothing is received until the channel has read all of it.
        raw.all_read().await;
        let (mut messages, mut errors) = (0, 0);
        while messages < STRAYS {
            match ch.recv().await.unwrap() {
                Ok(m) => {
                    assert_eq!(m.json(), r#""plain""#);
                    messages += 1;
                }
                Err(IpcError::UnexpectedFds { .. }) => errors += 1,
                Err(e) => panic!("unexpected error event: {e}"),
            }
        }
        assert_eq!(errors, 64, "at most 64 fd errors wait unread");
        assert!(write_end_closed(&r), "every stray fd was closed");
        // Once read, errors are queued again.
        let (_r2, w2) = pipe();
        raw.send_now(b"\"again\"\n", &[w2.as_fd()]);
        expect_fd_error(ch, 0, 1).await;
        assert_eq!(ch.recv().await.unwrap().unwrap().json(), r#""again""#);
        the_next_handle_is_its_own(ch, raw, listener).await;
    });
}

/// Lowers this process's soft open-files limit so that only `free` more fds can be opened (fd
/// numbers are allocated lowest first); the old limit comes back on drop.
struct FdLimit(rustix::process::Rlimit);

impl FdLimit {
    fn leave_free(free: u64) -> FdLimit {
        use rustix::process::{Resource, getrlimit, setrlimit};
        let lowest_free = std::fs::File::open("/dev/null").unwrap().as_raw_fd() as u64;
        let old = getrlimit(Resource::Nofile);
        let mut low = old;
        low.current = Some((lowest_free + free).min(old.maximum.unwrap_or(u64::MAX)));
        setrlimit(Resource::Nofile, low).unwrap();
        FdLimit(old)
    }
}

impl Drop for FdLimit {
    fn drop(&mut self) {
        rustix::process::setrlimit(rustix::process::Resource::Nofile, self.0).unwrap();
    }
}

#[test]
fn fds_the_kernel_cannot_install_get_a_nack_or_go_with_the_message_that_got_some() {
    fd_case(async |ch, raw, listener| {
        // No fd can be installed: the handle's is lost in the kernel (MSG_CTRUNC), so it is
        // NACKed, for the sender to send again, and no error is reported.
        let limit = FdLimit::leave_free(0);
        raw.send_now(HANDLE_FRAME, &[listener.as_fd()]);
        assert_eq!(raw.frame().await.0, r#"{"cmd":"NODE_HANDLE_NACK"}"#);
        drop(limit);
        // The retransmission, with room again, is the handle.
        the_next_handle_is_its_own(ch, raw, listener).await;

        // Room for one of two: the burst goes through with the one that arrived.
        let (r1, w1) = pipe();
        let (_r2, w2) = pipe();
        let limit = FdLimit::leave_free(1);
        raw.send_now(
            b"{\"cmd\":\"NODE_NODUS_FDS\",\"count\":2,\"msg\":\"burst\"}\n",
            &[w1.as_fd(), w2.as_fd()],
        );
        let mut m = ch.recv().await.unwrap().unwrap();
        drop(limit);
        assert_eq!(m.json(), r#""burst""#);
        let handles = m.take_handles();
        assert_eq!(handles.len(), 1, "the one fd that could be installed");
        drop((w1, w2, handles));
        assert!(
            write_end_closed(&r1),
            "the delivered fd was the first one sent"
        );
    });
}

#[test]
fn the_fds_of_unread_messages_are_bounded_and_the_dropped_ones_closed() {
    fd_case(async |ch, raw, _listener| {
        // 600 messages (fewer than the 1024 kept) of 8 fds each: 4800 fds, over the 4096 kept.
        let limit = FdLimit::leave_free(8192);
        let (_r, w) = pipe();
        let eight = [w.as_fd(); 8];
        for n in 0..600 {
            let frame = format!("{{\"cmd\":\"NODE_NODUS_FDS\",\"count\":8,\"msg\":{n}}}\n");
            raw.send_now(frame.as_bytes(), &eight);
            if n % 50 == 49 {
                raw.all_read().await;
            }
        }
        raw.write(b"\"end\"\n").await;
        raw.all_read().await;
        let (mut kept, mut first) = (0, None);
        loop {
            let mut m = ch.recv().await.unwrap().unwrap();
            if m.json() == r#""end""# {
                break;
            }
            first.get_or_insert(m.deserialize::<u64>().unwrap());
            kept += m.take_handles().len();
        }
        drop(limit);
        assert!(kept <= 4096, "{kept} fds held by unread messages");
        assert!(first.unwrap() > 0, "the oldest are the ones dropped");
    });
}
