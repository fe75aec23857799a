//! The parent's ends of a child's stdio pipes: [`ChildStdin`] (write) and [`ChildStdout`] /
//! [`ChildStderr`] (read), each an [`AsyncFd`] over the pipe fd std created.
//!
//! Invariants: the fds are close-on-exec (std creates them with `O_CLOEXEC`) and non-blocking
//! (only the parent's end: the child's end is a different open file description and stays
//! blocking, as a child expects). Edge-triggered readiness as everywhere else: `WouldBlock`
//! clears it, `EINTR` retries. A pipe is a ref'd handle while open, like Node's stdio streams.
//! Writing to a pipe whose reader has gone is an `EPIPE` error (Rust programs ignore `SIGPIPE`).

use std::future::poll_fn;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use crate::io::AsyncFd;

fn poll_read_fd(
    io: &AsyncFd<OwnedFd>,
    cx: &mut Context<'_>,
    buf: &mut [u8],
) -> Poll<io::Result<usize>> {
    loop {
        ready!(io.poll_read_ready(cx))?;
        match rustix::io::read(io.get_ref(), &mut *buf) {
            Ok(n) => return Poll::Ready(Ok(n)),
            Err(rustix::io::Errno::AGAIN) => io.clear_read_ready(),
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Poll::Ready(Err(e.into())),
        }
    }
}

fn poll_write_fd(
    io: &AsyncFd<OwnedFd>,
    cx: &mut Context<'_>,
    buf: &[u8],
) -> Poll<io::Result<usize>> {
    loop {
        ready!(io.poll_write_ready(cx))?;
        match rustix::io::write(io.get_ref(), buf) {
            Ok(n) => return Poll::Ready(Ok(n)),
            Err(rustix::io::Errno::AGAIN) => io.clear_write_ready(),
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Poll::Ready(Err(e.into())),
        }
    }
}

macro_rules! pipe_common {
    ($ty:ident) => {
        impl $ty {
            /// Adopts a pipe end: makes it non-blocking and registers it with the current loop.
            #[track_caller]
            pub(crate) fn new(fd: OwnedFd) -> io::Result<$ty> {
                Ok($ty {
                    io: AsyncFd::new(fd)?,
                })
            }

            /// Stops this pipe from keeping the loop alive.
            pub fn unref(&self) {
                self.io.unref()
            }

            /// Makes this pipe keep the loop alive again (the default).
            pub fn ref_(&self) {
                self.io.ref_()
            }

            /// Deregisters the pipe and gives its fd back (still non-blocking).
            pub fn into_owned_fd(self) -> OwnedFd {
                self.io.into_inner()
            }
        }

        impl AsFd for $ty {
            fn as_fd(&self) -> BorrowedFd<'_> {
                self.io.get_ref().as_fd()
            }
        }

        impl AsRawFd for $ty {
            fn as_raw_fd(&self) -> RawFd {
                self.io.get_ref().as_raw_fd()
            }
        }
    };
}

macro_rules! read_pipe {
    ($ty:ident, $what:literal) => {
        #[doc = concat!("The read end of a child's ", $what, " pipe.")]
        pub struct $ty {
            io: AsyncFd<OwnedFd>,
        }

        pipe_common!($ty);

        impl $ty {
            /// Reads into `buf`; `Ok(0)` is end of file (the child and every process sharing the
            /// pipe closed their write end).
            pub async fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
                poll_fn(|cx| poll_read_fd(&self.io, cx, buf)).await
            }

            /// Polls a read into `buf`.
            pub fn poll_read(
                &self,
                cx: &mut Context<'_>,
                buf: &mut [u8],
            ) -> Poll<io::Result<usize>> {
                poll_read_fd(&self.io, cx, buf)
            }

            /// Reads until end of file.
            pub async fn read_to_end(&self, out: &mut Vec<u8>) -> io::Result<usize> {
                let start = out.len();
                let mut buf = [0u8; 16 * 1024];
                loop {
                    match self.read(&mut buf).await? {
                        0 => return Ok(out.len() - start),
                        n => out.extend_from_slice(&buf[..n]),
                    }
                }
            }
        }

        impl futures_io::AsyncRead for $ty {
            fn poll_read(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &mut [u8],
            ) -> Poll<io::Result<usize>> {
                poll_read_fd(&self.io, cx, buf)
            }
        }
    };
}

read_pipe!(ChildStdout, "stdout");
read_pipe!(ChildStderr, "stderr");

/// The write end of a child's stdin pipe. Dropping it (or [`close`](Self::close)) gives the
/// child end of file.
pub struct ChildStdin {
    io: AsyncFd<OwnedFd>,
}

pipe_common!(ChildStdin);

impl ChildStdin {
    /// Writes some of `buf`; returns how much the pipe took.
    pub async fn write(&self, buf: &[u8]) -> io::Result<usize> {
        poll_fn(|cx| poll_write_fd(&self.io, cx, buf)).await
    }

    /// Writes all of `buf`, waiting while the pipe is full.
    pub async fn write_all(&self, mut buf: &[u8]) -> io::Result<()> {
        while !buf.is_empty() {
            match self.write(buf).await? {
                0 => return Err(io::ErrorKind::WriteZero.into()),
                n => buf = &buf[n..],
            }
        }
        Ok(())
    }

    /// Closes the pipe: the child reads end of file.
    pub fn close(self) {
        drop(self)
    }
}

impl futures_io::AsyncWrite for ChildStdin {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        poll_write_fd(&self.io, cx, buf)
    }

    /// Writes are not buffered: nothing to flush.
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    /// Nothing to do before drop closes the fd.
    fn poll_close(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
