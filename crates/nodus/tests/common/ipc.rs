//! A raw IPC peer: a socket that reads frames (and the fds that came with them) and writes
//! bytes, with or without `SCM_RIGHTS` fds, by hand, facing a nodus [`Channel`].

use std::collections::VecDeque;
use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use nodus::ipc::{Channel, ChannelOptions};
use nodus::net::UnixStream;
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

/// A channel and a raw peer socket.
pub fn with_raw(options: ChannelOptions) -> (Channel, Raw) {
    let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
    let channel = Channel::from_fd(a.into(), options).unwrap();
    (
        channel,
        Raw {
            sock: UnixStream::from_std(b).unwrap(),
            buf: Vec::new(),
            fds: VecDeque::new(),
        },
    )
}

/// A peer that reads frames (and fds) and writes bytes by hand.
pub struct Raw {
    pub sock: UnixStream,
    buf: Vec<u8>,
    fds: VecDeque<OwnedFd>,
}

impl Raw {
    /// The next line and the fds that arrived with the bytes read for it.
    pub async fn frame(&mut self) -> (String, Vec<OwnedFd>) {
        let mut fds = Vec::new();
        loop {
            if let Some(pos) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=pos).collect();
                fds.extend(self.fds.drain(..));
                return (String::from_utf8(line[..pos].to_vec()).unwrap(), fds);
            }
            let mut chunk = vec![0u8; 65536];
            let (n, got) = self
                .sock
                .read_with(|s| {
                    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(4))];
                    let mut control = RecvAncillaryBuffer::new(&mut space);
                    let mut iov = [IoSliceMut::new(&mut chunk)];
                    let r =
                        rustix::net::recvmsg(s, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC)?;
                    let mut got = Vec::new();
                    for m in control.drain() {
                        if let RecvAncillaryMessage::ScmRights(fds) = m {
                            got.extend(fds);
                        }
                    }
                    Ok((r.bytes, got))
                })
                .await
                .unwrap();
            assert!(n > 0, "raw peer: unexpected EOF");
            self.buf.extend_from_slice(&chunk[..n]);
            self.fds.extend(got);
        }
    }

    pub async fn write(&self, bytes: &[u8]) {
        self.sock.write_all(bytes).await.unwrap();
    }

    /// One `sendmsg` of `bytes` with `fds` attached, now (without yielding to the loop, so the
    /// channel reads nothing in between); the socket must take all of it.
    pub fn send_now(&self, bytes: &[u8], fds: &[BorrowedFd<'_>]) {
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(8))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !fds.is_empty() {
            assert!(control.push(SendAncillaryMessage::ScmRights(fds)));
        }
        let iov = [IoSlice::new(bytes)];
        let n = rustix::net::sendmsg(self.sock.as_fd(), &iov, &mut control, SendFlags::empty())
            .unwrap();
        assert_eq!(n, bytes.len(), "raw peer: a short write");
    }

    /// Bytes written that the channel has not read yet (`SIOCOUTQ`, which is `TIOCOUTQ`).
    pub fn unread_by_peer(&self) -> usize {
        let mut n: libc::c_int = 0;
        // SAFETY: SIOCOUTQ (TIOCOUTQ) on a socket fd writes one int through the pointer, which is
        // valid and writable for the call.
        let rc = unsafe { libc::ioctl(self.sock.as_fd().as_raw_fd(), libc::TIOCOUTQ, &mut n) };
        assert_eq!(rc, 0, "SIOCOUTQ: {}", std::io::Error::last_os_error());
        usize::try_from(n).unwrap()
    }

    /// Waits until the channel has read everything written.
    pub async fn all_read(&self) {
        while self.unread_by_peer() > 0 {
            nodus::sleep(5).await;
        }
    }

    /// Reads until EOF; returns the bytes.
    pub async fn rest(&mut self) -> Vec<u8> {
        let mut out = std::mem::take(&mut self.buf);
        let mut chunk = [0u8; 4096];
        loop {
            match self.sock.read(&mut chunk).await.unwrap() {
                0 => return out,
                n => out.extend_from_slice(&chunk[..n]),
            }
        }
    }
}
