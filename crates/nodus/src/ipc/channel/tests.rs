//! The channel's writes through a scripted `sendmsg` (the [`SendFn`] seam): refusals for want of
//! kernel memory are tried again after a backoff with the frame and its fds kept, a short write
//! sends the fds once with the frame's first byte, refusals that outlast the retries are an
//! error event, and `EPIPE` still ends the channel at once. The peer is a real channel.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::os::fd::{BorrowedFd, OwnedFd};
use std::rc::Rc;
use std::time::Duration;

use super::{Channel, ChannelOptions, IpcError, SEND_RETRIES};
use crate::ipc::{SendHandle, fdpass};

/// What a scripted `sendmsg` does.
#[derive(Clone, Copy)]
enum Step {
    /// Refuses with this errno, taking nothing.
    Fail(i32),
    /// Sends at most this many bytes (with the fds, if any).
    Short(usize),
}

/// One call: bytes offered, fds attached, bytes taken (`None`: refused).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Call {
    len: usize,
    fds: usize,
    sent: Option<usize>,
}

thread_local! {
    /// The next calls' steps; an empty script sends for real.
    static SCRIPT: RefCell<VecDeque<Step>> = const { RefCell::new(VecDeque::new()) };
    static CALLS: RefCell<Vec<Call>> = const { RefCell::new(Vec::new()) };
}

fn scripted(socket: BorrowedFd<'_>, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<usize> {
    let result = match SCRIPT.with(|s| s.borrow_mut().pop_front()) {
        Some(Step::Fail(errno)) => Err(io::Error::from_raw_os_error(errno)),
        Some(Step::Short(n)) => fdpass::send(socket, &bytes[..n.min(bytes.len())], fds),
        None => fdpass::send(socket, bytes, fds),
    };
    let call = Call {
        len: bytes.len(),
        fds: fds.len(),
        sent: result.as_ref().ok().copied(),
    };
    CALLS.with(|c| c.borrow_mut().push(call));
    result
}

/// A channel writing through `scripted` (with `script`), and a real peer.
fn scripted_pair(script: &[Step]) -> (Channel, Channel) {
    SCRIPT.with(|s| s.borrow_mut().extend(script.iter().copied()));
    let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
    let ch = Channel::with_send(a.into(), ChannelOptions::default(), scripted).unwrap();
    let peer = Channel::from_fd(b.into(), ChannelOptions::default()).unwrap();
    (ch, peer)
}

fn calls() -> Vec<Call> {
    CALLS.with(|c| c.borrow().clone())
}

fn bounded<F: Future>(f: F) -> F::Output {
    crate::Runtime::new().block_on(async {
        crate::timeout(Duration::from_secs(20), f)
            .await
            .expect("test timed out")
    })
}

/// Writes a byte through a received pipe write end and reads it from `read_end`.
fn same_pipe(read_end: &mut std::io::PipeReader, write_end: OwnedFd, byte: u8) {
    std::fs::File::from(write_end).write_all(&[byte]).unwrap();
    let mut got = [0u8; 1];
    read_end.read_exact(&mut got).unwrap();
    assert_eq!(got[0], byte);
}

#[test]
fn refusals_for_want_of_memory_are_retried_keeping_the_frame_and_its_fd() {
    bounded(async {
        let refusals = [libc::ENOBUFS, libc::ENOMEM, libc::ETOOMANYREFS];
        let (ch, peer) = scripted_pair(&refusals.map(Step::Fail));
        let (mut r, w) = std::io::pipe().unwrap();
        ch.send_handle(&"handle", SendHandle::fd(w.into())).unwrap();
        ch.send(&"after").unwrap();
        let mut m = peer.recv().await.unwrap().unwrap();
        assert_eq!(m.json(), r#""handle""#);
        same_pipe(&mut r, m.take_handle().unwrap().into_owned_fd(), 7);
        assert_eq!(peer.recv().await.unwrap().unwrap().json(), r#""after""#);
        ch.flush().await.unwrap();
        assert!(ch.is_connected());
        let calls = calls();
        // Three refusals, each followed by one try after a backoff (no busy loop), the frame
        // whole and its fd on every try; then the held message after the peer's ACK.
        assert_eq!(calls.len(), 5, "{calls:?}");
        let frame = calls[0].len;
        for call in &calls[..3] {
            assert_eq!(
                *call,
                Call {
                    len: frame,
                    fds: 1,
                    sent: None
                }
            );
        }
        assert_eq!(
            calls[3],
            Call {
                len: frame,
                fds: 1,
                sent: Some(frame)
            }
        );
        assert_eq!(calls[4].fds, 0);
    });
}

#[test]
fn a_short_write_sends_the_fds_once_with_the_first_byte() {
    bounded(async {
        let (ch, peer) =
            scripted_pair(&[Step::Short(3), Step::Fail(libc::ENOBUFS), Step::Short(5)]);
        let pipes: Vec<_> = (0..2).map(|_| std::io::pipe().unwrap()).collect();
        let fds: Vec<Rc<OwnedFd>> = pipes
            .iter()
            .map(|(_, w)| Rc::new(OwnedFd::from(w.try_clone().unwrap())))
            .collect();
        ch.send_fds(&"two", fds.clone()).unwrap();
        let mut m = peer.recv().await.unwrap().unwrap();
        assert_eq!(m.json(), r#""two""#);
        let handles = m.take_handles();
        assert_eq!(handles.len(), 2);
        for (i, (h, (mut r, _))) in handles.into_iter().zip(pipes).enumerate() {
            same_pipe(&mut r, h.into_owned_fd(), i as u8);
        }
        ch.flush().await.unwrap();
        assert!(
            fds.iter().all(|fd| Rc::strong_count(fd) == 1),
            "written, released"
        );
        let calls = calls();
        let frame = calls[0].len;
        assert_eq!(
            calls[0],
            Call {
                len: frame,
                fds: 2,
                sent: Some(3)
            }
        );
        assert_eq!(
            calls[1],
            Call {
                len: frame - 3,
                fds: 0,
                sent: None
            }
        );
        assert_eq!(
            calls[2],
            Call {
                len: frame - 3,
                fds: 0,
                sent: Some(5)
            }
        );
        assert_eq!(
            calls[3],
            Call {
                len: frame - 8,
                fds: 0,
                sent: Some(frame - 8)
            }
        );
        assert_eq!(calls.len(), 4);
    });
}

#[test]
fn refusals_that_outlast_the_retries_are_an_error_event_then_the_channel_closes() {
    bounded(async {
        let refusals = vec![Step::Fail(libc::ENOBUFS); SEND_RETRIES as usize + 1];
        let (ch, peer) = scripted_pair(&refusals);
        let (_r, w) = std::io::pipe().unwrap();
        let w = Rc::new(OwnedFd::from(w));
        ch.send_fds(&"never", vec![w.clone()]).unwrap();
        match ch.recv().await {
            Some(Err(IpcError::Io(e))) => assert_eq!(e.raw_os_error(), Some(libc::ENOBUFS)),
            other => panic!("expected the ENOBUFS error event, got {other:?}"),
        }
        assert!(ch.recv().await.is_none(), "closed after the error");
        assert!(!ch.is_connected());
        assert_eq!(calls().len(), SEND_RETRIES as usize + 1);
        assert!(calls().iter().all(|c| c.fds == 1 && c.sent.is_none()));
        assert_eq!(Rc::strong_count(&w), 1, "the channel let go of the fd");
        assert!(peer.recv().await.is_none(), "the peer reads EOF");
    });
}

#[test]
fn epipe_ends_the_channel_at_once() {
    bounded(async {
        let (ch, _peer) = scripted_pair(&[Step::Fail(libc::EPIPE)]);
        ch.send(&"x").unwrap();
        assert!(ch.recv().await.is_none(), "the end, not an error event");
        assert!(!ch.is_connected());
        assert_eq!(calls().len(), 1, "not retried");
    });
}
