//! A child's output copied to our own stdout or stderr line by line, each line behind a prefix
//! (`[worker 2 pid 4242] `): [`prefix_lines`].
//!
//! Lines are bytes, not text: nothing is decoded or replaced. A line ends at `\n`; one longer
//! than [`MAX_LINE`] is cut into pieces of that size (each written as a line of its own), and a
//! last line without `\n` is written at end of file with one added.
//!
//! Writing must never stall the loop, but our stdout may be a full pipe or a slow terminal, and
//! making fd 1 non-blocking is not an option (`O_NONBLOCK` belongs to the open file description,
//! which we share with the rest of the process and with our own parent). So the loop task hands
//! batches of prefixed lines to a writer thread (one per sink: one for stdout and one for stderr,
//! shared by every task writing there, each living as long as the process), which writes them
//! with plain blocking `write`s. The hand-off is bounded by bytes ([`QUEUE_LIMIT`] per sink):
//! a batch that does not fit is dropped and counted, and the task's next batch that fits starts
//! with `PREFIX[N bytes of output dropped]`. A sink that fails (`EPIPE`) discards from then on.
//!
//! Invariants: the loop task never blocks and its memory is bounded (one read buffer, one
//! partial line of at most [`MAX_LINE`], one batch); lines of one task keep their order; lines of
//! different tasks never interleave (a sink's thread writes each batch whole before the next).
//! The task ends after end of file once its last batch has been written (or dropped), and until
//! then it keeps the loop alive: a stalled sink keeps it waiting, as a full stdout pipe does in
//! Node.

use std::future::poll_fn;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Poll, Waker};
use std::time::Duration;

use crate::JoinHandle;
use crate::rt::context::{try_with_core, with_core};

/// The longest line written whole; longer ones are cut into pieces of this size.
pub const MAX_LINE: usize = 64 * 1024;

/// The most bytes one sink holds waiting for its writer thread; beyond it, batches are dropped.
pub const QUEUE_LIMIT: usize = 1024 * 1024;

/// Batches are handed over once they reach this size.
const BATCH: usize = 64 * 1024;

/// Where prefixed lines go.
#[derive(Debug)]
pub enum Sink {
    /// This process's stdout (fd 1).
    Stdout,
    /// This process's stderr (fd 2).
    Stderr,
    /// Any fd (a file, a pipe), with a writer thread of its own that ends with the task.
    Fd(OwnedFd),
}

/// Copies `source` (a [`ChildStdout`](super::ChildStdout), a [`ChildStderr`](super::ChildStderr)
/// or any reader on the loop) to `sink` line by line, each line behind `prefix`, in a task of
/// its own. The task resolves after end of file, once everything is written (or dropped: see
/// the module doc), or with the first read error (after writing what it had).
///
/// # Panics
/// Outside a running nodus loop.
#[track_caller]
pub fn prefix_lines<R>(source: R, prefix: String, sink: Sink) -> JoinHandle<io::Result<()>>
where
    R: futures_io::AsyncRead + Unpin + 'static,
{
    crate::spawn_named(
        "process:output",
        copy_lines(source, prefix.into_bytes(), sink),
    )
}

async fn copy_lines<R>(mut source: R, prefix: Vec<u8>, sink: Sink) -> io::Result<()>
where
    R: futures_io::AsyncRead + Unpin,
{
    let writer = Writer::for_sink(sink)?;
    let mut lines = Lines::new(prefix);
    let mut buf = vec![0u8; BATCH];
    let result = loop {
        match poll_fn(|cx| Pin::new(&mut source).poll_read(cx, &mut buf)).await {
            Ok(0) => break Ok(()),
            Ok(n) => lines.push(&buf[..n], &writer),
            Err(e) => break Err(e),
        }
    };
    lines.finish(&writer);
    writer.flush().await;
    result
}

/// The line splitter of one task: the partial line so far and the batch being built.
struct Lines {
    prefix: Vec<u8>,
    partial: Vec<u8>,
    batch: Vec<u8>,
    /// Source bytes in `batch` (without prefixes and added newlines), counted when dropped.
    batch_source: usize,
    /// Source bytes dropped since the last batch that got through.
    dropped: usize,
}

impl Lines {
    fn new(prefix: Vec<u8>) -> Lines {
        Lines {
            prefix,
            partial: Vec::new(),
            batch: Vec::new(),
            batch_source: 0,
            dropped: 0,
        }
    }

    fn push(&mut self, mut data: &[u8], writer: &Writer) {
        while !data.is_empty() {
            let room = MAX_LINE - self.partial.len();
            let window = &data[..data.len().min(room + 1)];
            match window.iter().position(|&b| b == b'\n') {
                Some(i) => {
                    let (line, rest) = data.split_at(i + 1);
                    self.emit(line);
                    data = rest;
                }
                None if data.len() > room => {
                    let (piece, rest) = data.split_at(room);
                    self.emit(piece);
                    data = rest;
                }
                None => {
                    self.partial.extend_from_slice(data);
                    data = &[];
                }
            }
            if self.batch.len() >= BATCH {
                self.hand_over(writer);
            }
        }
        self.hand_over(writer);
    }

    /// Appends `partial + tail` as one prefixed line to the batch (adding the newline a piece
    /// or a last line lacks).
    fn emit(&mut self, tail: &[u8]) {
        self.batch.extend_from_slice(&self.prefix);
        self.batch.extend_from_slice(&self.partial);
        self.batch.extend_from_slice(tail);
        self.batch_source += self.partial.len() + tail.len();
        self.partial.clear();
        if self.batch.last() != Some(&b'\n') {
            self.batch.push(b'\n');
        }
    }

    /// End of file: the last partial line, and a last drop notice even if the queue is full.
    fn finish(&mut self, writer: &Writer) {
        if !self.partial.is_empty() {
            self.emit(&[]);
        }
        self.hand_over(writer);
        if self.dropped > 0 {
            writer.queue(self.notice());
            self.dropped = 0;
        }
    }

    /// Queues the batch, after a drop notice if batches were dropped since the last one queued.
    fn hand_over(&mut self, writer: &Writer) {
        if self.batch.is_empty() {
            return;
        }
        let bytes = if self.dropped > 0 {
            let mut bytes = self.notice();
            bytes.append(&mut self.batch);
            bytes
        } else {
            std::mem::take(&mut self.batch)
        };
        let source = std::mem::take(&mut self.batch_source);
        if writer.try_queue(bytes) {
            self.dropped = 0;
        } else {
            self.dropped += source;
        }
    }

    fn notice(&self) -> Vec<u8> {
        let mut notice = self.prefix.clone();
        notice
            .extend_from_slice(format!("[{} bytes of output dropped]\n", self.dropped).as_bytes());
        notice
    }
}

/// A sink's writer thread, seen from a task: the channel and the sink's queued-byte count.
#[derive(Clone)]
struct Writer {
    tx: mpsc::Sender<Message>,
    queued: Arc<AtomicUsize>,
}

enum Message {
    Bytes(Vec<u8>),
    Flush(FlushToken),
}

static STDOUT: OnceLock<Writer> = OnceLock::new();
static STDERR: OnceLock<Writer> = OnceLock::new();

impl Writer {
    fn for_sink(sink: Sink) -> io::Result<Writer> {
        let (cell, target, name) = match sink {
            Sink::Fd(fd) => return Writer::start(Target::Fd(fd), "nodus-output"),
            Sink::Stdout => (&STDOUT, Target::Stdout(std::io::stdout()), "nodus-stdout"),
            Sink::Stderr => (&STDERR, Target::Stderr(std::io::stderr()), "nodus-stderr"),
        };
        if let Some(w) = cell.get() {
            return Ok(w.clone());
        }
        // A thread started by a losing racer ends at once: its only sender is dropped here.
        let started = Writer::start(target, name)?;
        Ok(cell.get_or_init(|| started).clone())
    }

    fn start(target: Target, name: &str) -> io::Result<Writer> {
        let (tx, rx) = mpsc::channel();
        let queued = Arc::new(AtomicUsize::new(0));
        let counter = queued.clone();
        std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || write_loop(target, rx, counter))?;
        Ok(Writer { tx, queued })
    }

    /// Queues `bytes` if the sink has room for them.
    fn try_queue(&self, bytes: Vec<u8>) -> bool {
        let len = bytes.len();
        if self.queued.fetch_add(len, Ordering::AcqRel) + len > QUEUE_LIMIT {
            self.queued.fetch_sub(len, Ordering::AcqRel);
            return false;
        }
        self.send(Message::Bytes(bytes));
        true
    }

    /// Queues `bytes` regardless of the limit (one drop notice per task at most).
    fn queue(&self, bytes: Vec<u8>) {
        self.queued.fetch_add(bytes.len(), Ordering::AcqRel);
        self.send(Message::Bytes(bytes));
    }

    fn send(&self, message: Message) {
        // Fails only if the thread is gone; a flush token dropped with the message still wakes.
        let _ = self.tx.send(message);
    }

    /// Waits until the writer thread has dealt with everything queued before (keeping the loop
    /// alive meanwhile).
    async fn flush(&self) {
        let flush = Arc::new(Flush::default());
        let _in_flight = InFlight::begin();
        self.send(Message::Flush(FlushToken(flush.clone())));
        poll_fn(|cx| {
            let mut state = flush.state.lock().expect("no panic while held");
            if state.0 {
                return Poll::Ready(());
            }
            state.1 = Some(cx.waker().clone());
            Poll::Pending
        })
        .await
    }
}

/// A flush's state: (done, waiter).
#[derive(Default)]
struct Flush {
    state: Mutex<(bool, Option<Waker>)>,
}

impl Flush {
    fn set(&self) {
        let waker = {
            let mut state = self.state.lock().expect("no panic while held");
            state.0 = true;
            state.1.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

/// Completes its flush when dropped: by the writer thread once everything queued before it is
/// written, or with its message if the thread is gone (so a flush never waits forever on a
/// thread that died).
struct FlushToken(Arc<Flush>);

impl Drop for FlushToken {
    fn drop(&mut self) {
        self.0.set();
    }
}

/// One unit of the loop's in-flight `requests` (what keeps it alive) while a flush is awaited.
/// Created and dropped on the loop thread (the task's).
struct InFlight {
    loop_id: u64,
}

impl InFlight {
    #[track_caller]
    fn begin() -> InFlight {
        with_core("nodus::process::output", |core| {
            core.begin_request();
            InFlight {
                loop_id: core.loop_id(),
            }
        })
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        try_with_core(|core| {
            if core.loop_id() == self.loop_id {
                core.end_request();
            }
        });
    }
}

enum Target {
    Stdout(std::io::Stdout),
    Stderr(std::io::Stderr),
    Fd(OwnedFd),
}

impl Target {
    fn fd(&self) -> BorrowedFd<'_> {
        match self {
            Target::Stdout(s) => s.as_fd(),
            Target::Stderr(s) => s.as_fd(),
            Target::Fd(fd) => fd.as_fd(),
        }
    }
}

fn write_loop(target: Target, rx: mpsc::Receiver<Message>, queued: Arc<AtomicUsize>) {
    let mut failed = false;
    for message in rx {
        match message {
            Message::Bytes(bytes) => {
                if !failed && let Err(e) = write_all(target.fd(), &bytes) {
                    failed = true;
                    tracing::warn!(
                        "nodus::process::output: writing child output failed ({e}); discarding from now on"
                    );
                }
                queued.fetch_sub(bytes.len(), Ordering::AcqRel);
            }
            Message::Flush(token) => drop(token),
        }
    }
}

/// Blocking `write` until done; waits a little on `EAGAIN` (someone made the fd non-blocking).
fn write_all(fd: BorrowedFd<'_>, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        match rustix::io::write(fd, bytes) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(rustix::io::Errno::INTR) => {}
            Err(rustix::io::Errno::AGAIN) => std::thread::sleep(Duration::from_millis(2)),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}
