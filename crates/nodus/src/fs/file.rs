//! `File`: an open file read and written on the I/O pool, [`CHUNK`] bytes per job, usable as
//! `AsyncRead` / `AsyncBufRead` / `AsyncWrite` (Node's `createReadStream`/`createWriteStream`
//! with a 64 KiB high-water mark).
//!
//! Invariants:
//! - At most one pool job per `File` is in flight; every operation first waits for it.
//! - Reads go through one reused `CHUNK`-sized buffer: a job fills it, callers consume it. The
//!   OS file position is therefore ahead of the caller's by the unconsumed bytes; the next write
//!   job seeks back by that much first, so reads and writes stay in order.
//! - End of file is one read job that returns 0 bytes, reported once: that read's caller gets
//!   an empty buffer (`Ok(0)`), and only a later call reads again (the file may have grown, as
//!   with tokio and std). A settled read of 0 bytes is never taken for a used-up buffer.
//! - Writes are write-behind, as in tokio: `poll_write` copies up to `CHUNK` bytes into the
//!   buffer, submits the job and returns; its error surfaces at the next operation, `flush` or
//!   `close`. A write still in flight when the `File` is dropped is detached, never cancelled,
//!   so accepted data is not lost, and keeps the loop alive until it has ended, as libuv's fs
//!   requests do (`Runtime::run` returns after it); its error, which no caller can get any
//!   more, is logged (one WARN line, target `nodus::fs`, naming the path). The descriptor is
//!   closed on the pool too, also before `run` returns.

use std::future::poll_fn;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use futures_io::{AsyncBufRead, AsyncRead, AsyncWrite};

use super::{CHUNK, blocking, check_one, path_error};
use crate::pool::{Offload, offload_io};

type Job = Offload<(Vec<u8>, io::Result<usize>)>;

/// Most bytes [`File::read_to_end`] reserves before it has read anything (64 MiB): the file's
/// size is only a hint, and a file that claims more grows its buffer as it is read.
pub const RESERVE_MAX: u64 = 64 * 1024 * 1024;

/// What [`File::read_to_end`] reserves up front for a file whose metadata says `size` bytes,
/// under `limit`: the size, capped by the limit and by [`RESERVE_MAX`].
fn initial_reserve(size: u64, limit: u64) -> usize {
    usize::try_from(size.min(limit).min(RESERVE_MAX)).unwrap_or(usize::MAX)
}

enum State {
    /// `buf[start..end]` is read data not yet consumed.
    Idle {
        buf: Vec<u8>,
        start: usize,
        end: usize,
    },
    Reading(Job),
    Writing(Job),
}

/// An open file whose reads and writes run on the I/O pool.
pub struct File {
    /// `Some` until dropped: `Drop` sends it to the pool, so that `close` runs there.
    std: Option<Arc<std::fs::File>>,
    path: Arc<Path>,
    state: State,
    /// The last read job returned 0 bytes (end of file) and no caller was told yet.
    eof: bool,
}

/// How to open a file (`std::fs::OpenOptions`, opened on the I/O pool).
#[derive(Debug, Clone)]
pub struct OpenOptions {
    std: std::fs::OpenOptions,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions::new()
    }
}

impl OpenOptions {
    pub fn new() -> OpenOptions {
        OpenOptions {
            std: std::fs::OpenOptions::new(),
        }
    }

    pub fn read(&mut self, on: bool) -> &mut Self {
        self.std.read(on);
        self
    }

    pub fn write(&mut self, on: bool) -> &mut Self {
        self.std.write(on);
        self
    }

    pub fn append(&mut self, on: bool) -> &mut Self {
        self.std.append(on);
        self
    }

    pub fn truncate(&mut self, on: bool) -> &mut Self {
        self.std.truncate(on);
        self
    }

    pub fn create(&mut self, on: bool) -> &mut Self {
        self.std.create(on);
        self
    }

    pub fn create_new(&mut self, on: bool) -> &mut Self {
        self.std.create_new(on);
        self
    }

    /// Permission bits for a file this call creates (default 0o666, less the umask).
    pub fn mode(&mut self, mode: u32) -> &mut Self {
        std::os::unix::fs::OpenOptionsExt::mode(&mut self.std, mode);
        self
    }

    /// Opens `path` on the I/O pool; an error names the path. A path with a NUL byte is refused
    /// before any pool job (`ERR_INVALID_ARG_VALUE`, see the [module](super) docs).
    pub async fn open(&self, path: impl AsRef<Path>) -> io::Result<File> {
        check_one("open", path.as_ref())?;
        let path: Arc<Path> = Arc::from(path.as_ref());
        let (options, p) = (self.std.clone(), path.clone());
        let std = blocking(
            move || options.open(&p).map_err(|e| path_error("open", &p, e)),
            |e| path_error("open", &path, e),
        )
        .await?;
        Ok(File {
            std: Some(Arc::new(std)),
            path,
            state: State::Idle {
                buf: Vec::new(),
                start: 0,
                end: 0,
            },
            eof: false,
        })
    }
}

impl File {
    /// Opens `path` for reading.
    pub async fn open(path: impl AsRef<Path>) -> io::Result<File> {
        OpenOptions::new().read(true).open(path).await
    }

    /// Opens `path` for writing, creating or truncating it.
    pub async fn create(path: impl AsRef<Path>) -> io::Result<File> {
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .await
    }

    /// The path the file was opened with.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn handle(&self) -> Arc<std::fs::File> {
        self.std.clone().expect("present until dropped")
    }

    fn error(&self, op: &'static str, e: io::Error) -> io::Error {
        path_error(op, &self.path, e)
    }

    /// Waits for the job in flight; returns the state to `Idle` (with the job's buffer).
    fn poll_settle(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let (job, writing) = match &mut self.state {
            State::Idle { .. } => return Poll::Ready(Ok(())),
            State::Reading(job) => (job, false),
            State::Writing(job) => (job, true),
        };
        let done = ready!(Pin::new(job).poll(cx));
        let (buf, result) = match done {
            Ok(v) => v,
            Err(e) => (Vec::new(), Err(e.into())),
        };
        let end = match (writing, result) {
            (false, Ok(n)) => n,
            (true, Ok(_)) => 0,
            (w, Err(e)) => {
                self.state = State::Idle {
                    buf,
                    start: 0,
                    end: 0,
                };
                return Poll::Ready(Err(self.error(if w { "write" } else { "read" }, e)));
            }
        };
        self.eof = !writing && end == 0;
        self.state = State::Idle { buf, start: 0, end };
        Poll::Ready(Ok(()))
    }

    /// Makes read data available: the unconsumed bytes, or (when none are left) the next chunk
    /// read by one pool job; empty at end of file, once per read that found it.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<&[u8]>> {
        ready!(self.poll_settle(cx))?;
        if std::mem::take(&mut self.eof) {
            // A read that was in flight found the end: that is this call's answer.
            return Poll::Ready(Ok(&[]));
        }
        if let State::Idle { buf, start, end } = &mut self.state
            && start == end
        {
            let mut buf = std::mem::take(buf);
            buf.resize(CHUNK, 0);
            let file = self.handle();
            self.state = State::Reading(offload_io(move || {
                let n = (&*file).read(&mut buf);
                (buf, n)
            }));
            ready!(self.poll_settle(cx))?;
            // Settled at once: an end of file found here is this call's answer (empty).
            self.eof = false;
        }
        Poll::Ready(Ok(self.buffered()))
    }

    /// Read data not yet consumed (empty unless idle).
    fn buffered(&self) -> &[u8] {
        match &self.state {
            State::Idle { buf, start, end } => &buf[*start..*end],
            _ => &[],
        }
    }

    fn consume_read(&mut self, n: usize) {
        if let State::Idle { start, end, .. } = &mut self.state {
            *start = (*start + n).min(*end);
        }
    }

    /// Submits a write of up to `CHUNK` bytes of `data` (after the job in flight); returns how
    /// many bytes it took.
    fn poll_submit_write(&mut self, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        ready!(self.poll_settle(cx))?;
        self.eof = false;
        let State::Idle { buf, start, end } = &mut self.state else {
            unreachable!("settled")
        };
        // Read ahead but not consumed: the OS position is that far ahead of ours.
        let rewind = (*end - *start) as i64;
        let mut buf = std::mem::take(buf);
        let n = data.len().min(CHUNK);
        buf.clear();
        buf.extend_from_slice(&data[..n]);
        let file = self.handle();
        self.state = State::Writing(offload_io(move || {
            let mut f = &*file;
            let result = if rewind > 0 {
                f.seek(SeekFrom::Current(-rewind)).map(drop)
            } else {
                Ok(())
            };
            let result = result.and_then(|()| f.write_all(&buf)).map(|()| buf.len());
            (buf, result)
        }));
        Poll::Ready(Ok(n))
    }

    /// Reads to the end of the file, appending to `buf`, one [`CHUNK`] per pool job. Fails with
    /// `FileTooLarge` (naming the path) once more than `limit` bytes would be read, and with
    /// `OutOfMemory` when `buf` cannot grow. Returns the number of bytes appended.
    ///
    /// Memory follows what is read, never the limit: `buf` is first given room for the file's
    /// size (a hint: the file may grow or shrink, and a sparse file or a `/proc` one may claim
    /// far more than it holds) but at most [`RESERVE_MAX`], then grows as data arrives. So a
    /// limit of `u64::MAX` ("no limit") on a small file reserves no more than the file.
    pub async fn read_to_end(&mut self, buf: &mut Vec<u8>, limit: u64) -> io::Result<usize> {
        let too_large = |f: &File| {
            let e = io::Error::new(
                io::ErrorKind::FileTooLarge,
                format!("file is larger than the limit of {limit} bytes"),
            );
            f.error("read", e)
        };
        let out_of_memory = |f: &File, e: std::collections::TryReserveError| {
            f.error("read", io::Error::new(io::ErrorKind::OutOfMemory, e))
        };
        let file = self.handle();
        let size = blocking(move || file.metadata().map(|m| m.len()), |e| e).await;
        if let Ok(size) = size {
            if size > limit {
                return Err(too_large(self));
            }
            buf.try_reserve(initial_reserve(size, limit))
                .map_err(|e| out_of_memory(self, e))?;
        }
        let mut read = 0u64;
        loop {
            let n = poll_fn(|cx| self.poll_fill(cx).map_ok(<[u8]>::len)).await? as u64;
            if n == 0 {
                return Ok(read as usize);
            }
            if read + n > limit {
                return Err(too_large(self));
            }
            // Grows by doubling (amortized), and an allocation the system refuses is an error.
            buf.try_reserve(n as usize)
                .map_err(|e| out_of_memory(self, e))?;
            buf.extend_from_slice(self.buffered());
            self.consume_read(n as usize);
            read += n;
        }
    }

    /// Writes all of `data`, one [`CHUNK`] per pool job, waiting for each job but the last
    /// (call [`File::flush`] to wait for that one too).
    pub async fn write_all(&mut self, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            let n = poll_fn(|cx| self.poll_submit_write(cx, data)).await?;
            data = &data[n..];
        }
        Ok(())
    }

    /// Waits until every write submitted so far has reached the OS.
    pub async fn flush(&mut self) -> io::Result<()> {
        poll_fn(|cx| self.poll_settle(cx)).await
    }

    /// Flushes, then `fsync`s data and metadata on the pool.
    pub async fn sync_all(&mut self) -> io::Result<()> {
        self.flush().await?;
        let (file, path) = (self.handle(), self.path.clone());
        blocking(
            move || file.sync_all().map_err(|e| path_error("fsync", &path, e)),
            |e| self.error("fsync", e),
        )
        .await
    }

    /// Flushes, then reads the file's metadata on the pool (`fstat`).
    pub async fn metadata(&mut self) -> io::Result<std::fs::Metadata> {
        self.flush().await?;
        let (file, path) = (self.handle(), self.path.clone());
        blocking(
            move || file.metadata().map_err(|e| path_error("fstat", &path, e)),
            |e| self.error("fstat", e),
        )
        .await
    }

    /// Flushes, then truncates or extends the file to `len` bytes (`ftruncate`; extending makes
    /// a sparse hole).
    pub async fn set_len(&mut self, len: u64) -> io::Result<()> {
        self.flush().await?;
        let (file, path) = (self.handle(), self.path.clone());
        blocking(
            move || {
                file.set_len(len)
                    .map_err(|e| path_error("ftruncate", &path, e))
            },
            |e| self.error("ftruncate", e),
        )
        .await
    }
}

impl AsyncRead for File {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if out.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let chunk = ready!(this.poll_fill(cx))?;
        let n = chunk.len().min(out.len());
        out[..n].copy_from_slice(&chunk[..n]);
        this.consume_read(n);
        Poll::Ready(Ok(n))
    }
}

impl AsyncBufRead for File {
    fn poll_fill_buf(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<&[u8]>> {
        self.get_mut().poll_fill(cx)
    }

    fn consume(self: Pin<&mut Self>, amt: usize) {
        self.get_mut().consume_read(amt);
    }
}

impl AsyncWrite for File {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        if data.is_empty() {
            return Poll::Ready(Ok(0));
        }
        self.get_mut().poll_submit_write(cx, data)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().poll_settle(cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().poll_settle(cx)
    }
}

impl Drop for File {
    fn drop(&mut self) {
        let state = std::mem::replace(
            &mut self.state,
            State::Idle {
                buf: Vec::new(),
                start: 0,
                end: 0,
            },
        );
        if let State::Writing(job) = state {
            let path = self.path.clone();
            job.detach_then(move |done| {
                let e = match done {
                    Ok((_, Ok(_))) => return,
                    Ok((_, Err(e))) => e,
                    Err(e) => e.into(),
                };
                tracing::warn!(
                    target: "nodus::fs",
                    "{} (the file was dropped with this write in flight: its data is lost)",
                    path_error("write", &path, e)
                );
            });
        }
        // `close` can block (NFS, a full disk flushing): it runs on the pool, after any write
        // still in flight (which holds the file too). Both keep the loop alive until done.
        if let Some(file) = self.std.take() {
            offload_io(move || drop(file)).detach_then(drop);
        }
    }
}

impl std::fmt::Debug for File {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("File").field("path", &self.path).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::{RESERVE_MAX, initial_reserve};

    #[test]
    fn the_first_reservation_is_the_size_capped_by_the_limit_and_reserve_max() {
        assert_eq!(initial_reserve(10, u64::MAX), 10);
        assert_eq!(initial_reserve(10, usize::MAX as u64), 10);
        assert_eq!(initial_reserve(10, 4), 4);
        assert_eq!(initial_reserve(0, u64::MAX), 0);
        // A size that is only a claim (a sparse or /proc file), with no limit: not all of it.
        assert_eq!(initial_reserve(1 << 40, u64::MAX), RESERVE_MAX as usize);
        assert_eq!(initial_reserve(u64::MAX, u64::MAX), RESERVE_MAX as usize);
    }
}
