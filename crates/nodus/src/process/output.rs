//! A child's output copied to our own stdout or stderr line by line, each line behind a prefix
//! (`[worker 2 pid 4242] `): [`prefix_lines`]; and our own log lines to stderr the same way:
//! [`log_writer`].
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
//!
//! Our own log lines go through the stderr sink's thread too: [`log_writer`] is the writer for a
//! `tracing-subscriber` fmt layer, which formats an event whole and writes it with one
//! `write_all`, queued as one message. So a log line never interleaves with prefixed lines, and
//! logging never blocks or panics, whatever stderr is (a full pipe, a closed one): a line that
//! does not fit is dropped and counted, and the next one that fits is preceded by
//! `[nodus: N bytes of log output dropped]`. Queued lines die with the process: before exiting,
//! [`flush_stderr`] waits for them, from any thread and for a bounded time.

use std::future::poll_fn;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::task::{Poll, Waker};
use std::time::Duration;

use crate::JoinHandle;
use crate::rt::context::with_core;

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
        // One unit of the loop's in-flight requests (it keeps the loop alive) while awaited.
        let _in_flight = with_core("nodus::process::output", |core| core.request());
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

    /// Blocks the calling thread until the writer thread has dealt with everything queued
    /// before, at most `timeout`; whether it did.
    fn flush_blocking(&self, timeout: Duration) -> bool {
        let flush = Arc::new(Flush::default());
        self.send(Message::Flush(FlushToken(flush.clone())));
        let state = flush.state.lock().expect("no panic while held");
        let (state, _) = flush
            .done
            .wait_timeout_while(state, timeout, |s| !s.0)
            .expect("no panic while held");
        state.0
    }
}

/// Waits until everything queued for our stderr so far (log lines, prefixed lines) is written,
/// at most `timeout` (a stalled stderr must not hang the exit); whether it was. Meant for the end
/// of the process, before `std::process::exit`, from any thread: it blocks the calling thread,
/// the loop's included.
pub fn flush_stderr(timeout: Duration) -> bool {
    STDERR.get().is_none_or(|w| w.flush_blocking(timeout))
}

/// Log bytes dropped (the stderr queue was full) since the last log line queued.
static LOG_DROPPED: AtomicUsize = AtomicUsize::new(0);

/// A writer for log lines to our stderr through its writer thread (see the module doc), e.g.
/// `tracing_subscriber::fmt().with_writer(log_writer)`. Each `write` is queued whole as one
/// message, or dropped and counted if the queue is full; it never blocks and never fails.
pub fn log_writer() -> LogWriter {
    LogWriter {
        writer: Writer::for_sink(Sink::Stderr).ok(),
    }
}

/// See [`log_writer`].
pub struct LogWriter {
    /// `None` if the writer thread could not be started: lines are then written directly.
    writer: Option<Writer>,
}

impl io::Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match &self.writer {
            _ if buf.is_empty() => {}
            Some(w) => queue_log(w, &LOG_DROPPED, buf),
            // Errors are ignored, as the writer thread does: there is nowhere to report them.
            None => drop(write_all(io::stderr().as_fd(), buf)),
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Queues `line` (after a notice of what `dropped` counts, if any) or adds it to `dropped`.
fn queue_log(writer: &Writer, dropped: &AtomicUsize, line: &[u8]) {
    let before = dropped.swap(0, Ordering::AcqRel);
    let mut bytes = Vec::with_capacity(line.len() + if before > 0 { 64 } else { 0 });
    if before > 0 {
        bytes.extend_from_slice(
            format!("[nodus: {before} bytes of log output dropped]\n").as_bytes(),
        );
    }
    bytes.extend_from_slice(line);
    if !writer.try_queue(bytes) {
        dropped.fetch_add(before + line.len(), Ordering::AcqRel);
    }
}

/// A flush's state: (done, waiting task); a waiting thread waits on `done`.
#[derive(Default)]
struct Flush {
    state: Mutex<(bool, Option<Waker>)>,
    done: Condvar,
}

impl Flush {
    fn set(&self) {
        let waker = {
            let mut state = self.state.lock().expect("no panic while held");
            state.0 = true;
            state.1.take()
        };
        self.done.notify_all();
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
                    // Said on stderr, so not when stderr is what failed: through `log_writer`
                    // the warning would come back to this thread only to be discarded, and
                    // through a subscriber writing fd 2 itself it would be one more write to a
                    // dead pipe (which tracing-subscriber reports by default with `eprintln!`,
                    // a panic on this thread). Another sink's warning reaches stderr, through
                    // `log_writer` without ever blocking this thread.
                    if !matches!(target, Target::Stderr(_)) {
                        tracing::warn!(
                            "nodus::process::output: writing child output failed ({e}); discarding from now on"
                        );
                    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn log_lines_dropped_on_a_full_queue_are_counted_before_the_next_line_that_fits() {
        let (mut reader, pipe) = io::pipe().unwrap();
        let writer = Writer::start(Target::Fd(pipe.into()), "test-log").unwrap();
        let dropped = AtomicUsize::new(0);
        queue_log(&writer, &dropped, b"first\n");
        assert!(writer.flush_blocking(Duration::from_secs(10)));
        // Nothing is queued now: a full queue is simulated by its count.
        writer.queued.store(QUEUE_LIMIT, Ordering::Release);
        queue_log(&writer, &dropped, b"lost\n");
        queue_log(&writer, &dropped, b"lost too\n");
        assert_eq!(dropped.load(Ordering::Acquire), 14);
        writer.queued.store(0, Ordering::Release);
        queue_log(&writer, &dropped, b"kept\n");
        queue_log(&writer, &dropped, b"last\n");
        assert_eq!(dropped.load(Ordering::Acquire), 0);
        drop(writer); // the thread writes what is queued, then ends and closes the pipe
        let mut out = String::new();
        reader.read_to_string(&mut out).unwrap();
        assert_eq!(
            out,
            "first\n[nodus: 14 bytes of log output dropped]\nkept\nlast\n"
        );
    }

    #[test]
    fn a_blocking_flush_gives_up_after_its_timeout_and_completes_once_written() {
        let (mut reader, pipe) = io::pipe().unwrap();
        let writer = Writer::start(Target::Fd(pipe.into()), "test-log").unwrap();
        // More than a pipe holds: the thread blocks until someone reads.
        assert!(writer.try_queue(vec![b'x'; 512 * 1024]));
        assert!(!writer.flush_blocking(Duration::from_millis(100)));
        let reading = std::thread::spawn(move || {
            let mut out = Vec::new();
            reader.read_to_end(&mut out).unwrap();
            out.len()
        });
        assert!(writer.flush_blocking(Duration::from_secs(10)));
        drop(writer);
        assert_eq!(reading.join().unwrap(), 512 * 1024);
    }
}
