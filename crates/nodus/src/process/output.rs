//! A child's output copied to our own stdout or stderr line by line, each line behind a prefix
//! (`[worker 2 pid 4242] `): [`prefix_lines`], or as it is ([`raw_lines`]: no prefix, the
//! drop notices still prefixed); and our own log lines to stderr the same way: [`log_writer`].
//!
//! Lines are bytes, not text: nothing is decoded or replaced. A line ends at `\n`; one longer
//! than [`MAX_LINE`] (1 MiB) is cut into pieces of that size (each written as a line of its own),
//! and a last line without `\n` is written at end of file with one added.
//!
//! Writing must never stall the loop, but our stdout may be a full pipe or a slow terminal, and
//! making fd 1 non-blocking is not an option (`O_NONBLOCK` belongs to the open file description,
//! which we share with the rest of the process and with our own parent). So the loop task hands
//! batches of prefixed lines to a writer thread (one per sink: one for stdout and one for stderr,
//! shared by every task writing there, each living as long as the process), which writes them
//! with plain blocking `write`s. The hand-off is bounded by bytes ([`QUEUE_LIMIT`], 4 MiB per
//! sink, shared by its tasks; prefixed lines leave the last 256 KiB of it to log lines).
//! A batch that does not fit waits while the sink makes progress: the task stops reading its
//! source until there is room (tasks waiting on one sink get room in turn), so a worker that
//! writes faster than the sink takes meets its own full pipe, as with a plain pipe (blocking
//! writes wait; Node queues them in its own memory), and loses nothing. Once the sink is stalled (a `write` to it under way for [`STALL`], 1 s), a
//! batch that does not fit is dropped and counted, and the task's next batch that fits starts
//! with `PREFIX[N bytes of output dropped]`: a stalled reader costs lines, it does not stall the
//! workers for more than that second. A sink whose reader is gone (`EPIPE`) discards from then
//! on; one whose write fails for a cause that may pass (`ENOSPC`: a full disk) loses those lines,
//! counted, and says so with their drop notices once a write succeeds again.
//!
//! Reading is fair between the tasks of a sink, so a quiet worker's line (an error) comes out
//! promptly while a sibling floods: the sink's thread serves its tasks in turn, a batch (64 KiB)
//! a turn, so a task's batch waits for at most the batch being written and one more of each
//! other task's, however much they queued before it; a task that read a full buffer lets the
//! loop's other tasks read before it reads again; and the backpressure falls on the flood: a task
//! holding 128 KiB or more of the queue (`QUIET`) queues only up to its last 512 KiB
//! (`QUIET_ROOM`), which is the quiet tasks', so when the queue is full it is the flooding
//! worker's pipe that is left unread, and the sink stalled, its lines that are dropped.
//!
//! Invariants: the loop task never blocks (it waits for room as a future, with a timer for the
//! stall) and its memory is bounded (one read buffer, one partial line of at most [`MAX_LINE`],
//! one batch); lines of one task keep their order; lines of different tasks never interleave (a
//! sink's thread writes each batch whole before the next, or, when the exit drops what is
//! queued, to the end of a line: see below); nothing is dropped while the sink is not stalled;
//! a task's batch, once queued, waits for at most two batches of each other task of its sink.
//! The task ends after end of file once its last batch has been written (or dropped), and until
//! then it keeps the loop alive: a stalled sink keeps it waiting, as a full stdout pipe does in
//! Node. A task dropped before its end (with its runtime) queues a drop notice for the batch it
//! held and what it had dropped unsaid.
//!
//! Our own log lines go through the stderr sink's thread too: [`log_writer`] is the writer for a
//! `tracing-subscriber` fmt layer, which formats an event whole and writes it with one
//! `write_all`, queued as one message. So a log line never interleaves with prefixed lines, and
//! logging never blocks or panics, whatever stderr is (a full pipe, a closed one): a line that
//! does not fit is dropped and counted, and the next one that fits is preceded by
//! `[nodus: N bytes of log output dropped]`.
//!
//! Queued lines die with the process: before exiting, [`flush_before_exit`] waits for both sinks,
//! from any thread and for a bounded time. Past it, what is still queued is dropped: each sink's
//! thread finishes the line it is writing (it writes in pieces of at most 64 KiB and looks
//! between them), skips the rest, and writes one `PREFIX[N bytes of output dropped]` per task
//! (`[nodus: N bytes of log output dropped]` for log lines) that lost output, given at most
//! [`EXIT_DROP_GRACE`] more; a sink nobody reads at all gets nothing more, and its last line may
//! stay cut.

use std::collections::VecDeque;
use std::future::{Future, poll_fn};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::JoinHandle;
use crate::clock::now_ns;
use crate::rt::context::with_core;
use crate::time::Sleep;

/// The longest line written whole (1 MiB); longer ones are cut into pieces of this size.
pub const MAX_LINE: usize = 1024 * 1024;

/// The most bytes one sink holds waiting for its writer thread (4 MiB, shared by every task
/// writing there); beyond it, batches wait for room, or are dropped once the sink is stalled
/// (see [`STALL`]). Four times [`MAX_LINE`], so that a line that long gets through next to what
/// is still queued.
pub const QUEUE_LIMIT: usize = 4 * MAX_LINE;

/// How long a sink may take nothing before it counts as stalled (1 s): a `write` to it (at most
/// 64 KiB) under way for that long. While it is not, a task whose batch does not fit waits for
/// room and reads nothing meanwhile (the worker's pipe fills, holding the worker back as a plain
/// pipe would); once it is, batches that do not fit are dropped. Long enough that a file, a
/// terminal or a reader that keeps up never counts, however busy the host (a writer thread
/// waiting for a CPU is not in a `write`); short enough that a stalled reader holds a worker back
/// no longer than the primary's own stall rule waits for a worker's loop (1 s) before routing
/// around it. So a reader that takes less than 64 KiB a second counts as stalled.
pub const STALL: Duration = Duration::from_secs(1);

/// The part of a sink's queue kept for log lines (256 KiB): prefixed lines queue up to
/// [`QUEUE_LIMIT`] less this, so that workers holding their queue full while the sink makes
/// progress do not crowd out the primary's own log lines.
const LOG_ROOM: usize = 256 * 1024;

/// The part of prefixed lines' room kept for quiet tasks (512 KiB): a task holding [`QUIET`] or
/// more in the queue (one whose output comes faster than the sink takes it) queues up to
/// [`QUEUE_LIMIT`] less [`LOG_ROOM`] less this, so that when the queue is full it is the flooding
/// worker's pipe that is left unread, and a quiet worker's lines still get in (and, the sink
/// stalled, are kept while the flood's are dropped).
const QUIET_ROOM: usize = 512 * 1024;

/// A task holding less than this in its sink's queue (128 KiB, two batches) is quiet: it may
/// queue into [`QUIET_ROOM`], without waiting for its turn.
const QUIET: usize = 2 * BATCH;

/// After [`flush_before_exit`]'s timeout, how long the writer threads get to finish the lines
/// they are writing and to write the drop notices.
pub const EXIT_DROP_GRACE: Duration = Duration::from_secs(1);

/// Batches are handed over once they reach this size; a writer thread writes at most this much
/// per `write`.
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
        copy_lines(source, Origin::Lines(prefix.into_bytes().into()), sink),
    )
}

/// [`prefix_lines`] with no prefix: each line written as the child wrote it (a JSON log line
/// stays one), with the same line rules (whole up to [`MAX_LINE`], a last line without `\n`
/// given one) and the same bounded queue; a drop notice alone is behind `prefix`, naming whose
/// output was dropped (`[worker 2 4242] [N bytes of output dropped]`).
///
/// # Panics
/// Outside a running nodus loop.
#[track_caller]
pub fn raw_lines<R>(source: R, prefix: String, sink: Sink) -> JoinHandle<io::Result<()>>
where
    R: futures_io::AsyncRead + Unpin + 'static,
{
    crate::spawn_named(
        "process:output",
        copy_lines(source, Origin::Raw(prefix.into_bytes().into()), sink),
    )
}

async fn copy_lines<R>(mut source: R, origin: Origin, sink: Sink) -> io::Result<()>
where
    R: futures_io::AsyncRead + Unpin,
{
    let writer = Writer::for_sink(sink)?;
    let mut lines = Lines::new(origin, writer.clone());
    let mut buf = vec![0u8; BATCH];
    let result = loop {
        match poll_fn(|cx| Pin::new(&mut source).poll_read(cx, &mut buf)).await {
            Ok(0) => break Ok(()),
            Ok(n) => {
                lines.push(&buf[..n]).await;
                // A full read: more is likely waiting. The other pipes get their turn first.
                if n == buf.len() {
                    crate::yield_now().await;
                }
            }
            Err(e) => break Err(e),
        }
    };
    lines.finish().await;
    writer.flush().await;
    result
}

/// The line splitter of one task: the partial line so far and the batch being built.
struct Lines {
    /// Its prefix.
    origin: Origin,
    writer: Writer,
    partial: Vec<u8>,
    batch: Vec<u8>,
    /// Source bytes in `batch` (without prefixes and added newlines), counted when dropped.
    batch_source: usize,
    /// Source bytes dropped since the last batch that got through.
    dropped: usize,
    /// Its bytes queued and not yet written (or dropped), counted by the writer thread too.
    held: Arc<AtomicUsize>,
}

impl Lines {
    fn new(origin: Origin, writer: Writer) -> Lines {
        Lines {
            origin,
            writer,
            partial: Vec::new(),
            batch: Vec::new(),
            batch_source: 0,
            dropped: 0,
            held: Arc::default(),
        }
    }

    async fn push(&mut self, mut data: &[u8]) {
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
                self.hand_over().await;
            }
        }
        self.hand_over().await;
    }

    /// Appends `partial + tail` as one prefixed line to the batch (adding the newline a piece
    /// or a last line lacks).
    fn emit(&mut self, tail: &[u8]) {
        self.batch.extend_from_slice(self.origin.prefix());
        self.batch.extend_from_slice(&self.partial);
        self.batch.extend_from_slice(tail);
        self.batch_source += self.partial.len() + tail.len();
        self.partial.clear();
        if self.batch.last() != Some(&b'\n') {
            self.batch.push(b'\n');
        }
    }

    /// End of file: the last partial line, and a last drop notice even if the queue is full.
    async fn finish(&mut self) {
        if !self.partial.is_empty() {
            self.emit(&[]);
        }
        self.hand_over().await;
        self.say_dropped();
    }

    /// Queues a drop notice for what was dropped and not said yet, even if the queue is full.
    fn say_dropped(&mut self) {
        if self.dropped > 0 {
            self.writer.queue(Batch {
                bytes: self.origin.notice(self.dropped),
                source: std::mem::take(&mut self.dropped),
                origin: self.origin.clone(),
                held: Some(self.held.clone()),
            });
        }
    }

    /// Queues the batch, after a drop notice if batches were dropped since the last one queued:
    /// once it fits, waiting for room while the sink makes progress (see [`STALL`]); dropped
    /// and counted if the sink is stalled.
    async fn hand_over(&mut self) {
        if self.batch.is_empty() {
            return;
        }
        let notice = match self.dropped {
            0 => Vec::new(),
            n => self.origin.notice(n),
        };
        let len = notice.len() + self.batch.len();
        if !self.writer.room(len, &self.held).await {
            self.dropped += std::mem::take(&mut self.batch_source);
            self.batch.clear();
            return;
        }
        let bytes = if notice.is_empty() {
            std::mem::take(&mut self.batch)
        } else {
            let mut bytes = notice;
            bytes.append(&mut self.batch);
            bytes
        };
        let batch = Batch {
            bytes,
            // The notice's count goes with it: the batch dropped at the exit counts both.
            source: std::mem::take(&mut self.dropped) + std::mem::take(&mut self.batch_source),
            origin: self.origin.clone(),
            held: Some(self.held.clone()),
        };
        self.writer.send(Message::Bytes(batch));
    }
}

impl Drop for Lines {
    /// A task dropped before its end (with its runtime, at the primary's exit) loses the batch it
    /// was waiting to queue: said with what was dropped before it.
    fn drop(&mut self) {
        self.dropped += std::mem::take(&mut self.batch_source);
        self.say_dropped();
    }
}

/// Whose bytes a batch holds, for its drop notice.
#[derive(Clone, PartialEq)]
enum Origin {
    /// Prefixed lines of one task: the prefix.
    Lines(Arc<[u8]>),
    /// Unprefixed lines of one task ([`raw_lines`]): the prefix of its drop notices.
    Raw(Arc<[u8]>),
    /// Our own log lines.
    Log,
}

impl Origin {
    fn prefix(&self) -> &[u8] {
        match self {
            Origin::Lines(prefix) => prefix,
            Origin::Raw(_) | Origin::Log => &[],
        }
    }

    /// The line saying `dropped` source bytes were dropped.
    fn notice(&self, dropped: usize) -> Vec<u8> {
        match self {
            Origin::Lines(prefix) | Origin::Raw(prefix) => {
                let mut notice = prefix.to_vec();
                notice
                    .extend_from_slice(format!("[{dropped} bytes of output dropped]\n").as_bytes());
                notice
            }
            Origin::Log => format!("[nodus: {dropped} bytes of log output dropped]\n").into_bytes(),
        }
    }

    /// The source bytes in `lines`, whole lines of this origin: without their prefixes (a
    /// newline added to a piece or a last line counts as one).
    fn source_of(&self, lines: &[u8]) -> usize {
        let newlines = lines.iter().filter(|&&b| b == b'\n').count();
        lines.len().saturating_sub(newlines * self.prefix().len())
    }
}

/// Bytes queued for a writer thread: whole lines of one origin.
struct Batch {
    bytes: Vec<u8>,
    /// The source bytes they stand for (without prefixes; a notice's count included), counted
    /// if the exit drops them.
    source: usize,
    origin: Origin,
    /// What its task holds in the queue ([`Lines::held`]); `None` for log lines.
    held: Option<Arc<AtomicUsize>>,
}

impl Batch {
    /// Whether `other` is from the same task (log lines are all one).
    fn same_task(&self, other: &Batch) -> bool {
        match (&self.held, &other.held) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (a, b) => a.is_none() && b.is_none(),
        }
    }
}

/// A sink's writer thread, seen from a task: the channel and the state it shares with the
/// thread.
#[derive(Clone)]
struct Writer {
    tx: mpsc::Sender<Message>,
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    /// Bytes queued and not yet written (or dropped).
    queued: AtomicUsize,
    /// Set by [`Writer::drop_queued`] until its [`Message::Drop`] is handled: the thread
    /// finishes the line it is writing and drops every batch until then.
    dropping: AtomicBool,
    /// When the thread's `write` under way started ([`now_ns`]); 0 between writes.
    writing_since: AtomicU64,
    /// Tasks waiting for room ([`Writer::room`]), served in turn.
    waiting: Mutex<Waiting>,
}

#[derive(Default)]
struct Waiting {
    /// The next task's turn.
    next: u64,
    /// Turns taken and not served, oldest first, each with its task's waker.
    queue: VecDeque<(u64, Waker)>,
}

impl Shared {
    /// Adds `len` to what is queued if it fits within `limit` (or nothing is queued: a batch
    /// larger than the limit gets through a sink that keeps up).
    fn reserve(&self, len: usize, limit: usize) -> bool {
        self.queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                (q == 0 || q + len <= limit).then_some(q + len)
            })
            .is_ok()
    }

    /// When the sink counts as stalled ([`STALL`] into the write under way, or into one
    /// starting `now`): it is if that is not after `now`.
    fn stalled_at(&self, now: u64) -> u64 {
        let since = match self.writing_since.load(Ordering::Acquire) {
            0 => now,
            since => since,
        };
        since + STALL.as_nanos() as u64
    }

    /// Wakes the task whose turn it is (the turn moved on).
    fn wake_first(&self, waiting: &Waiting) {
        if let Some((_, waker)) = waiting.queue.front() {
            waker.wake_by_ref();
        }
    }

    /// Wakes every waiting task (room was freed: the first in line may go, and so may a quiet
    /// one, see [`Writer::room`]).
    fn wake_all(&self, waiting: &Waiting) {
        for (_, waker) in &waiting.queue {
            waker.wake_by_ref();
        }
    }

    /// Writes `bytes` whole, its `write`s timed for [`Shared::stalled_at`].
    fn write(&self, fd: BorrowedFd<'_>, bytes: &[u8]) -> io::Result<()> {
        // `now_ns` is never 0 (the monotonic clock counts from boot).
        self.writing_since.store(now_ns(), Ordering::Release);
        let result = write_all(fd, bytes);
        self.writing_since.store(0, Ordering::Release);
        result
    }
}

enum Message {
    Bytes(Batch),
    Flush(FlushToken),
    /// The end of a [`Writer::drop_queued`]: the drop notices, then the token.
    Drop(FlushToken),
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
        // Before the first thread of nodus's (see `parent_env`).
        crate::parent_env::take();
        let (tx, rx) = mpsc::channel();
        let shared = Arc::new(Shared::default());
        let thread_shared = shared.clone();
        std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || write_loop(target, rx, &thread_shared))?;
        Ok(Writer { tx, shared })
    }

    /// Queues `batch` (a log line) if the sink has room for it.
    fn try_queue(&self, batch: Batch) -> bool {
        if !self.shared.reserve(batch.bytes.len(), QUEUE_LIMIT) {
            return false;
        }
        self.send(Message::Bytes(batch));
        true
    }

    /// Reserves room for `len` bytes of prefixed lines of the task holding `held` bytes in the
    /// queue, waiting while the sink makes progress; `false` (nothing reserved) once it is
    /// stalled (see [`STALL`]). A quiet task (holding less than [`QUIET`]) may fill the queue up
    /// to [`QUEUE_LIMIT`] less [`LOG_ROOM`], as soon as there is room; another, up to
    /// [`QUIET_ROOM`] less, in turn with the other tasks waiting for room on this sink.
    fn room<'a>(&'a self, len: usize, held: &'a AtomicUsize) -> Room<'a> {
        Room {
            writer: self,
            len,
            held,
            turn: None,
            timer: None,
        }
    }

    /// Queues `batch` regardless of the limit (one drop notice per task at most).
    fn queue(&self, batch: Batch) {
        self.shared
            .queued
            .fetch_add(batch.bytes.len(), Ordering::AcqRel);
        if let Some(held) = &batch.held {
            held.fetch_add(batch.bytes.len(), Ordering::AcqRel);
        }
        self.send(Message::Bytes(batch));
    }

    fn send(&self, message: Message) {
        // Fails only if the thread is gone; a flush token dropped with the message still wakes.
        let _ = self.tx.send(message);
    }

    /// A flush done once the writer thread has dealt with everything queued before.
    fn flush_request(&self) -> Arc<Flush> {
        let flush = Arc::new(Flush::default());
        self.send(Message::Flush(FlushToken(flush.clone())));
        flush
    }

    /// Waits until the writer thread has dealt with everything queued before (keeping the loop
    /// alive meanwhile).
    async fn flush(&self) {
        // One unit of the loop's in-flight requests (it keeps the loop alive) while awaited.
        let _in_flight = with_core("nodus::process::output", |core| core.request());
        let flush = self.flush_request();
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

    /// Drops what is queued now (see the module doc): done once the line being written is
    /// finished and the drop notices are written.
    fn drop_queued(&self) -> Arc<Flush> {
        self.shared.dropping.store(true, Ordering::Release);
        let flush = Arc::new(Flush::default());
        self.send(Message::Drop(FlushToken(flush.clone())));
        flush
    }
}

/// See [`Writer::room`].
struct Room<'a> {
    writer: &'a Writer,
    len: usize,
    /// What its task holds in the queue.
    held: &'a AtomicUsize,
    /// Its turn, once it waits.
    turn: Option<u64>,
    /// Wakes it to look again when the sink would count as stalled at the earliest (a later
    /// write can only stall later: the timer is not moved, it is armed again once it fired).
    timer: Option<Sleep>,
}

impl Future for Room<'_> {
    type Output = bool;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<bool> {
        let this = self.get_mut();
        let writer = this.writer;
        let shared = &*writer.shared;
        loop {
            let wait = {
                let mut waiting = shared.waiting.lock().expect("no panic while held");
                let first = waiting
                    .queue
                    .front()
                    .is_none_or(|&(turn, _)| Some(turn) == this.turn);
                let (limit, in_turn) = match this.held.load(Ordering::Acquire) {
                    held if held < QUIET => (QUEUE_LIMIT - LOG_ROOM, false),
                    _ => (QUEUE_LIMIT - LOG_ROOM - QUIET_ROOM, true),
                };
                if (first || !in_turn) && shared.reserve(this.len, limit) {
                    this.held.fetch_add(this.len, Ordering::AcqRel);
                    this.leave(&mut waiting);
                    return Poll::Ready(true);
                }
                let now = now_ns();
                let stalled_at = shared.stalled_at(now);
                if stalled_at <= now {
                    this.leave(&mut waiting);
                    return Poll::Ready(false);
                }
                match this.turn {
                    Some(turn) => {
                        if let Some((_, waker)) = waiting.queue.iter_mut().find(|(t, _)| *t == turn)
                        {
                            waker.clone_from(cx.waker());
                        }
                    }
                    None => {
                        let turn = waiting.next;
                        waiting.next += 1;
                        waiting.queue.push_back((turn, cx.waker().clone()));
                        this.turn = Some(turn);
                    }
                }
                stalled_at - now
            };
            let timer = this
                .timer
                .get_or_insert_with(|| crate::time::sleep(Duration::from_nanos(wait)));
            if Pin::new(timer).poll(cx).is_pending() {
                return Poll::Pending;
            }
            // The sink may be stalled now: look again.
            this.timer = None;
        }
    }
}

impl Room<'_> {
    /// Gives up its turn, if it has one, and wakes the next task in line: it may go now.
    fn leave(&mut self, waiting: &mut Waiting) {
        let Some(turn) = self.turn.take() else { return };
        waiting.queue.retain(|(t, _)| *t != turn);
        self.writer.shared.wake_first(waiting);
    }
}

impl Drop for Room<'_> {
    fn drop(&mut self) {
        if self.turn.is_some() {
            let writer = self.writer;
            let mut waiting = writer.shared.waiting.lock().expect("no panic while held");
            self.leave(&mut waiting);
        }
    }
}

/// Waits until everything queued for our stdout and stderr so far (prefixed lines, log lines)
/// is written, at most `timeout` (a stalled sink must not hang the exit); whether it was. Past
/// `timeout`, what is still queued is dropped: each sink finishes the line it is writing and
/// writes the drop notices, given at most [`EXIT_DROP_GRACE`] more (see the module doc). Meant
/// for the end of the process, before `std::process::exit`, from any thread: it blocks the
/// calling thread, the loop's included.
pub fn flush_before_exit(timeout: Duration) -> bool {
    let writers: Vec<&Writer> = [&STDOUT, &STDERR]
        .into_iter()
        .filter_map(OnceLock::get)
        .collect();
    let deadline = Instant::now() + timeout;
    let flushes: Vec<_> = writers.iter().map(|w| w.flush_request()).collect();
    let dropping: Vec<_> = writers
        .iter()
        .zip(&flushes)
        .filter(|(_, flush)| !flush.wait_until(deadline))
        .map(|(w, _)| w.drop_queued())
        .collect();
    let grace = Instant::now() + EXIT_DROP_GRACE;
    for flush in &dropping {
        flush.wait_until(grace);
    }
    dropping.is_empty()
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
    let mut bytes = if before > 0 {
        Origin::Log.notice(before)
    } else {
        Vec::new()
    };
    bytes.extend_from_slice(line);
    let batch = Batch {
        bytes,
        source: before + line.len(),
        origin: Origin::Log,
        held: None,
    };
    if !writer.try_queue(batch) {
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

    /// Blocks the calling thread until done, or until `deadline`; whether it is done.
    fn wait_until(&self, deadline: Instant) -> bool {
        let state = self.state.lock().expect("no panic while held");
        let timeout = deadline.saturating_duration_since(Instant::now());
        let (state, _) = self
            .done
            .wait_timeout_while(state, timeout, |s| !s.0)
            .expect("no panic while held");
        state.0
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

fn write_loop(target: Target, rx: mpsc::Receiver<Message>, shared: &Shared) {
    let mut pending = Pending::default();
    // The sink is gone for good (`EPIPE`): everything is discarded from then on.
    let mut failed = false;
    let mut errors = WriteErrors::default();
    loop {
        // Wait for a message only with nothing to write (or while what is pending is being
        // dropped: until the `Drop`), then take every one that came, so that each task with a
        // batch waiting has its turn.
        if pending.tasks.is_empty() || shared.dropping.load(Ordering::Acquire) {
            match rx.recv() {
                Ok(message) => pending.take(message, &target, shared, &mut failed),
                Err(_) => break,
            }
        }
        while let Ok(message) = rx.try_recv() {
            pending.take(message, &target, shared, &mut failed);
        }
        if shared.dropping.load(Ordering::Acquire) {
            continue;
        }
        let Some(batch) = pending.next() else {
            continue;
        };
        let lost = if failed {
            0
        } else if !errors.resumed(target.fd(), shared) {
            // Still failing: this batch is lost too, and said with the others once writes work.
            errors.lose(&batch);
            0
        } else {
            match write_batch(target.fd(), &batch, shared) {
                Ok(lost) => lost,
                // A sink with room again later (a full disk, a quota): the lines are lost and
                // counted, and writing goes on.
                Err(e) if !gone_for_good(&e) => {
                    errors.lose(&batch);
                    if !matches!(target, Target::Stderr(_)) {
                        tracing::warn!(
                            "writing child output failed ({e}); its lines are lost and counted \
                             until writes succeed again"
                        );
                    }
                    0
                }
                Err(e) => {
                    failed = true;
                    // Said on stderr, so not when stderr is what failed: through `log_writer` the
                    // warning would come back to this thread only to be discarded, and through a
                    // subscriber writing fd 2 itself it would be one more write to a dead pipe
                    // (which tracing-subscriber reports by default with `eprintln!`, a panic on
                    // this thread). Another sink's warning reaches stderr, through `log_writer`
                    // without ever blocking this thread.
                    if !matches!(target, Target::Stderr(_)) {
                        tracing::warn!("writing child output failed ({e}); discarding from now on");
                    }
                    0
                }
            }
        };
        pending.done(batch, lost, shared);
    }
}

/// Whether a failed write means the sink will never take more: its reader is gone (`EPIPE`,
/// `ECONNRESET`) or the fd is (`EBADF`). Anything else (`ENOSPC`, `EDQUOT`, `EIO`) may pass.
fn gone_for_good(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EPIPE | libc::ECONNRESET | libc::EBADF)
    ) || e.kind() == io::ErrorKind::WriteZero
}

/// Lines lost to writes that failed for a passing cause (a full disk), per origin: said, each
/// by its drop notice, before the first batch written once writes succeed again.
#[derive(Default)]
struct WriteErrors {
    lost: Vec<(Origin, usize)>,
}

impl WriteErrors {
    fn lose(&mut self, batch: &Batch) {
        match self.lost.iter_mut().find(|(o, _)| *o == batch.origin) {
            Some((_, n)) => *n += batch.source,
            None => self.lost.push((batch.origin.clone(), batch.source)),
        }
    }

    /// Whether writes work (nothing was lost, or the notices of what was are written now).
    fn resumed(&mut self, fd: BorrowedFd<'_>, shared: &Shared) -> bool {
        while let Some((origin, n)) = self.lost.first() {
            if shared.write(fd, &origin.notice(*n)).is_err() {
                return false;
            }
            self.lost.remove(0);
        }
        true
    }
}

/// What a writer thread has taken from its channel and not dealt with yet: the batches, one
/// queue per task served in turn, a batch a turn (so a task's line waits for at most a batch or
/// two of each other task's, however much they queued before it), and the flushes waiting for
/// them.
#[derive(Default)]
struct Pending {
    /// Batches and flushes taken so far, numbering them in the channel's order.
    taken: u64,
    /// A queue per task with batches waiting (none empty), each in order, the next to be served
    /// first.
    tasks: VecDeque<VecDeque<(u64, Batch)>>,
    /// Flushes in order, each done once every batch taken before it is dealt with.
    flushes: VecDeque<(u64, FlushToken)>,
    /// Source bytes dropped by a `drop_queued`, per origin, until its notices are written.
    dropped: Vec<(Origin, usize)>,
}

impl Pending {
    fn take(&mut self, message: Message, target: &Target, shared: &Shared, failed: &mut bool) {
        let n = self.taken;
        self.taken += 1;
        match message {
            Message::Bytes(batch) => {
                match self.tasks.iter_mut().find(|q| q[0].1.same_task(&batch)) {
                    Some(queue) => queue.push_back((n, batch)),
                    None => self.tasks.push_back(VecDeque::from([(n, batch)])),
                }
            }
            Message::Flush(token) => {
                self.flushes.push_back((n, token));
                self.complete_flushes();
            }
            // Everything taken before it is dropped, what came after is written as usual.
            Message::Drop(token) => {
                for (_, batch) in std::mem::take(&mut self.tasks).into_iter().flatten() {
                    let lost = batch.source;
                    self.done(batch, lost, shared);
                }
                shared.dropping.store(false, Ordering::Release);
                for (origin, n) in self.dropped.drain(..) {
                    if !*failed && shared.write(target.fd(), &origin.notice(n)).is_err() {
                        *failed = true;
                    }
                }
                drop(token);
            }
        }
    }

    /// The next batch in turn.
    fn next(&mut self) -> Option<Batch> {
        let mut queue = self.tasks.pop_front()?;
        let (_, batch) = queue.pop_front().expect("no queue is empty");
        if !queue.is_empty() {
            self.tasks.push_back(queue);
        }
        Some(batch)
    }

    /// `batch` written or dropped, `lost` of its source bytes unwritten: counted, its room freed.
    fn done(&mut self, batch: Batch, lost: usize, shared: &Shared) {
        if lost > 0 {
            match self.dropped.iter_mut().find(|(o, _)| *o == batch.origin) {
                Some((_, n)) => *n += lost,
                None => self.dropped.push((batch.origin, lost)),
            }
        }
        let len = batch.bytes.len();
        shared.queued.fetch_sub(len, Ordering::AcqRel);
        if let Some(held) = &batch.held {
            held.fetch_sub(len, Ordering::AcqRel);
        }
        shared.wake_all(&shared.waiting.lock().expect("no panic while held"));
        self.complete_flushes();
    }

    /// Completes the flushes no batch taken before them is waiting for.
    fn complete_flushes(&mut self) {
        let oldest = self.tasks.iter().map(|q| q[0].0).min().unwrap_or(u64::MAX);
        while self.flushes.front().is_some_and(|&(n, _)| n < oldest) {
            self.flushes.pop_front();
        }
    }
}

/// Writes `batch` in pieces of at most [`BATCH`] bytes; once `shared.dropping` is set, only to
/// the end of the line being written. The source bytes left unwritten.
fn write_batch(fd: BorrowedFd<'_>, batch: &Batch, shared: &Shared) -> io::Result<usize> {
    let bytes = &batch.bytes[..];
    let mut done = 0;
    while done < bytes.len() {
        if done > 0 && shared.dropping.load(Ordering::Acquire) {
            let end = match bytes[done - 1] {
                b'\n' => done,
                _ => bytes[done..]
                    .iter()
                    .position(|&b| b == b'\n')
                    .map_or(bytes.len(), |i| done + i + 1),
            };
            shared.write(fd, &bytes[done..end])?;
            return Ok(batch.origin.source_of(&bytes[end..]));
        }
        let end = bytes.len().min(done + BATCH);
        shared.write(fd, &bytes[done..end])?;
        done = end;
    }
    Ok(0)
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

    fn flushed(writer: &Writer, timeout: Duration) -> bool {
        writer.flush_request().wait_until(Instant::now() + timeout)
    }

    #[test]
    fn log_lines_dropped_on_a_full_queue_are_counted_before_the_next_line_that_fits() {
        let (mut reader, pipe) = io::pipe().unwrap();
        let writer = Writer::start(Target::Fd(pipe.into()), "test-log").unwrap();
        let dropped = AtomicUsize::new(0);
        queue_log(&writer, &dropped, b"first\n");
        assert!(flushed(&writer, Duration::from_secs(10)));
        // Nothing is queued now: a full queue is simulated by its count.
        writer.shared.queued.store(QUEUE_LIMIT, Ordering::Release);
        queue_log(&writer, &dropped, b"lost\n");
        queue_log(&writer, &dropped, b"lost too\n");
        assert_eq!(dropped.load(Ordering::Acquire), 14);
        writer.shared.queued.store(0, Ordering::Release);
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

    /// A sink whose writes fail for a cause that may pass (`ENOSPC`: a full disk) loses the
    /// lines written meanwhile, counted, and takes the next ones once it has room again, the
    /// count said first; it is not given up for good as one whose reader is gone is.
    #[test]
    fn a_sink_that_was_full_for_a_while_takes_lines_again_after_saying_what_it_lost() {
        use std::os::fd::AsRawFd;
        let full: OwnedFd = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap()
            .into();
        let sink_fd = full.as_raw_fd();
        let writer = Writer::start(Target::Fd(full), "test-enospc").unwrap();
        let dropped = AtomicUsize::new(0);
        queue_log(&writer, &dropped, b"lost\n");
        assert!(flushed(&writer, Duration::from_secs(10)));
        queue_log(&writer, &dropped, b"lost too\n");
        assert!(flushed(&writer, Duration::from_secs(10)));
        // Room again: the writer's fd now refers to a pipe.
        let (mut reader, pipe) = io::pipe().unwrap();
        // SAFETY: `dup2` replaces what the writer's open fd refers to, atomically; the fd stays
        // the writer's (it closes it when it ends), and `pipe` is still ours to drop.
        assert_eq!(unsafe { libc::dup2(pipe.as_raw_fd(), sink_fd) }, sink_fd);
        drop(pipe);
        queue_log(&writer, &dropped, b"kept\n");
        drop(writer);
        let mut out = String::new();
        reader.read_to_string(&mut out).unwrap();
        assert_eq!(out, "[nodus: 14 bytes of log output dropped]\nkept\n");
    }

    /// Prefixed lines that fill their part of the queue (held back while the sink makes
    /// progress) leave room for log lines.
    #[test]
    fn log_lines_fit_where_prefixed_lines_are_held_back() {
        let (mut reader, pipe) = io::pipe().unwrap();
        let writer = Writer::start(Target::Fd(pipe.into()), "test-log").unwrap();
        // Nothing is queued: a queue full of prefixed lines is simulated by its count.
        writer
            .shared
            .queued
            .store(QUEUE_LIMIT - LOG_ROOM, Ordering::Release);
        assert!(!writer.shared.reserve(1, QUEUE_LIMIT - LOG_ROOM));
        let dropped = AtomicUsize::new(0);
        queue_log(&writer, &dropped, b"still logged\n");
        assert_eq!(dropped.load(Ordering::Acquire), 0);
        writer.shared.queued.store(0, Ordering::Release);
        drop(writer);
        let mut out = String::new();
        reader.read_to_string(&mut out).unwrap();
        assert_eq!(out, "still logged\n");
    }

    #[test]
    fn a_blocking_flush_gives_up_after_its_timeout_and_completes_once_written() {
        let (mut reader, pipe) = io::pipe().unwrap();
        let writer = Writer::start(Target::Fd(pipe.into()), "test-log").unwrap();
        // More than a pipe holds: the thread blocks until someone reads.
        queue_log(&writer, &AtomicUsize::new(0), &[b'x'; 512 * 1024]);
        assert!(!flushed(&writer, Duration::from_millis(100)));
        let reading = std::thread::spawn(move || {
            let mut out = Vec::new();
            reader.read_to_end(&mut out).unwrap();
            out.len()
        });
        assert!(flushed(&writer, Duration::from_secs(10)));
        drop(writer);
        assert_eq!(reading.join().unwrap(), 512 * 1024);
    }

    /// A task's batch waits for a batch or two of another's, not for all it queued before:
    /// the writer serves its tasks in turn.
    #[test]
    fn a_writer_serves_its_tasks_in_turn() {
        let (mut reader, pipe) = io::pipe().unwrap();
        let writer = Writer::start(Target::Fd(pipe.into()), "test-turns").unwrap();
        // Batches of one 100 KB line: more than a pipe holds, so the thread is blocked in the
        // first until someone reads, and takes in the rest meanwhile.
        let batch = |prefix: &str, held: &Arc<AtomicUsize>| {
            let line = format!("{prefix}{}\n", "x".repeat(100_000));
            Batch {
                source: line.len() - prefix.len(),
                bytes: line.into_bytes(),
                origin: Origin::Lines(prefix.as_bytes().into()),
                held: Some(held.clone()),
            }
        };
        let (a, b) = (Arc::default(), Arc::default());
        for _ in 0..10 {
            writer.queue(batch("[a] ", &a));
        }
        writer.queue(batch("[b] ", &b));
        assert!(b.load(Ordering::Acquire) > 0);
        let reading = std::thread::spawn(move || {
            let mut out = String::new();
            reader.read_to_string(&mut out).unwrap();
            out
        });
        assert!(flushed(&writer, Duration::from_secs(10)));
        assert_eq!(
            (a.load(Ordering::Acquire), b.load(Ordering::Acquire)),
            (0, 0)
        );
        drop(writer);
        let out = reading.join().unwrap();
        let order: Vec<&str> = out.lines().map(|l| &l[..3]).collect();
        assert_eq!(order.len(), 11, "every line, whole");
        let b_at = order.iter().position(|&p| p == "[b]").unwrap();
        assert!(b_at <= 2, "[b] after {b_at} batches of [a]");
    }

    /// What the exit drops: the line being written is finished, and each task that lost output
    /// gets one notice with the count of its source bytes (without prefixes).
    #[test]
    fn dropping_what_is_queued_finishes_the_line_being_written_and_counts_the_rest_per_task() {
        let (mut reader, pipe) = io::pipe().unwrap();
        let writer = Writer::start(Target::Fd(pipe.into()), "test-drop").unwrap();
        // Lines of 1000 bytes, 996 of them the task's own.
        let (a, b): (Arc<AtomicUsize>, Arc<AtomicUsize>) = Default::default();
        let batch = |prefix: &str, lines: usize| {
            let line = format!("{prefix}{}\n", "x".repeat(995));
            Batch {
                bytes: line.repeat(lines).into_bytes(),
                source: 996 * lines,
                origin: Origin::Lines(prefix.as_bytes().into()),
                held: Some(if prefix == "[a] " { &a } else { &b }.clone()),
            }
        };
        // 4 MB: far more than a pipe holds, so the thread is blocked in the middle of it.
        writer.queue(batch("[a] ", 4000));
        writer.queue(batch("[b] ", 10));
        queue_log(&writer, &AtomicUsize::new(0), b"a log line\n");
        writer.queue(batch("[b] ", 5));
        assert!(
            !flushed(&writer, Duration::from_millis(100)),
            "nobody reads"
        );
        let dropped = writer.drop_queued();
        let reading = std::thread::spawn(move || {
            let mut out = String::new();
            reader.read_to_string(&mut out).unwrap();
            out
        });
        assert!(dropped.wait_until(Instant::now() + Duration::from_secs(10)));
        drop(writer);
        let out = reading.join().unwrap();
        let lines: Vec<&str> = out.lines().collect();
        let (written, notices) = lines.split_at(lines.len() - 3);
        assert!(
            written
                .iter()
                .all(|l| *l == format!("[a] {}", "x".repeat(995))),
            "a line was cut"
        );
        let a_dropped = 996 * (4000 - written.len());
        assert!(a_dropped > 0, "the thread was blocked in the first batch");
        assert_eq!(
            notices,
            [
                format!("[a] [{a_dropped} bytes of output dropped]"),
                format!("[b] [{} bytes of output dropped]", 996 * 15),
                "[nodus: 11 bytes of log output dropped]".to_owned(),
            ]
        );
    }
}
