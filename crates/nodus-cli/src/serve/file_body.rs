//! A file range as a response body, read on the I/O pool in 64 KiB chunks.
//!
//! One chunk is read at a time, only when hyper asks for the next frame (once it holds less
//! than its buffer cap, 16 KiB: `nodus_http`'s builders), so a 1 GiB file sent to a client that
//! stops reading holds at most the rest of one chunk and the next in memory, and a pool thread
//! for one 64 KiB `pread` at a time (seed 003's `readFile` lesson).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use hyper::body::{Frame, SizeHint};
use nodus::pool::{Offload, offload_io};

const CHUNK: u64 = 64 * 1024;

/// Bytes `offset..end` of `file`.
pub struct FileBody {
    file: Arc<File>,
    offset: u64,
    end: u64,
    reading: Option<Offload<io::Result<Vec<u8>>>>,
}

impl FileBody {
    pub fn new(file: File, range: std::ops::Range<u64>) -> FileBody {
        FileBody {
            file: Arc::new(file),
            offset: range.start,
            end: range.end,
            reading: None,
        }
    }
}

/// Reads exactly `len` bytes at `offset` unless the file ends first.
fn read_chunk(file: &File, offset: u64, len: u64) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len as usize];
    let mut got = 0;
    while got < buf.len() {
        match file.read_at(&mut buf[got..], offset + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(got);
    Ok(buf)
}

impl hyper::body::Body for FileBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let this = self.get_mut();
        loop {
            if let Some(reading) = &mut this.reading {
                let result = ready!(Pin::new(reading).poll(cx));
                this.reading = None;
                let chunk = match result {
                    Ok(Ok(chunk)) => chunk,
                    Ok(Err(e)) => return Poll::Ready(Some(Err(e))),
                    Err(e) => return Poll::Ready(Some(Err(e.into()))),
                };
                if chunk.is_empty() {
                    // The file shrank since its length was sent: cut the response.
                    let e = io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "file shrank while being served",
                    );
                    return Poll::Ready(Some(Err(e)));
                }
                this.offset += chunk.len() as u64;
                return Poll::Ready(Some(Ok(Frame::data(Bytes::from(chunk)))));
            }
            if this.offset >= this.end {
                return Poll::Ready(None);
            }
            let (file, offset, len) = (
                this.file.clone(),
                this.offset,
                CHUNK.min(this.end - this.offset),
            );
            this.reading = Some(offload_io(move || read_chunk(&file, offset, len)));
        }
    }

    fn is_end_stream(&self) -> bool {
        self.offset >= self.end && self.reading.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.end - self.offset)
    }
}
