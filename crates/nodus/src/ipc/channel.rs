//! [`Channel`]: one end of a Node IPC channel (AF_UNIX stream, `json` mode), driven by a task
//! on the loop.
//!
//! The task ("ipc:channel") reads whenever the socket is readable, whether or not anyone is
//! receiving (Node's channel never stops reading), so handle ACKs, NACKs, internal messages and
//! `NODE_SOCKET_NOTIFY_CLOSE` are handled promptly whatever waits unread (see **Unread
//! messages**); it also writes what `send` could not write at once.
//!
//! Invariants:
//! - **Order.** Frames are written in `send` order. While a handle waits for its ACK, every later
//!   message (plain ones too) is held back and written after the ACK, as Node's `_handleQueue`
//!   does; only one handle is in flight. ACK/NACK replies bypass the hold (Node's deadlock fix).
//! - **Fd bursts between nodus peers.** [`Channel::send_fds`] wraps a message as
//!   `{"cmd":"NODE_NODUS_FDS","count":n,"msg":M}` with up to 64 fds in one `sendmsg`, and is neither
//!   ACKed nor held for. Only for a peer known to be nodus: a Node peer would take the frame for
//!   an unknown internal message and leak the fds.
//! - **Fds go with their frames' bytes** (Node's rule). The fds one read brings belong to the
//!   frames that start in that read (the kernel delivers a `sendmsg`'s fds with its first byte
//!   and ends the read in that `sendmsg`; see `fdpass`), and to no other: in order, to those
//!   that announce fds, a `NODE_HANDLE` one, a `NODE_NODUS_FDS` frame `count`, any other frame
//!   none (so `{"pre":1}`, a `NODE_HANDLE` and `{"post":1}` written with one `sendmsg` give the
//!   fd to the handle, as Node does). Before the first of those frames is taken, all of them are
//!   buffered whole and their announced fds counted: unless that is what arrived (fewer only
//!   when the kernel truncated them, given in order), none is kept, since which would be whose
//!   is unknown: the fds are closed and reported as [`IpcError::UnexpectedFds`] (not reported
//!   when one of those frames is bad: its own error covers them), and the frames are handled
//!   without them (a `NODE_HANDLE` gets a NACK). Fds in a read where no frame starts are closed
//!   and reported at once. They are never queued for whichever frame asks next, and the channel
//!   stays open. A read's fds (64 at most) wait for its frames, tied to their stream offsets, so
//!   they stay with them across the reads that bring the rest of those frames.
//! - **Retransmission.** A NACK resends the in-flight handle frame with its fd, at most 3 times
//!   (Node's `MAX_HANDLE_RETRANSMISSIONS`); the 4th NACK drops the handle, delivers
//!   [`IpcError::HandleNotReceived`] and releases the held messages.
//! - **Taking back.** A handle held behind the one in flight has not been written: the sender
//!   may take it back ([`Channel::take_back_held_handles`]; a cluster primary does so for
//!   connections a stalled Node worker has not taken), its fd closed, the rest in order.
//! - **Backpressure, nothing lost.** `send` never drops: it queues and returns `Ok(false)` once
//!   128 KiB or more waits in user space (Node's `send()` return value).
//! - **Fds once, with the first byte.** A frame's fds go in the `sendmsg` that writes its first
//!   byte and in no later one; a `sendmsg` that fails took nothing, so the next try of the frame
//!   carries them again.
//! - **Transient send errors are retried.** A `sendmsg` the kernel refuses for want of memory
//!   (`ENOBUFS`, `ENOMEM`, `ETOOMANYREFS`) keeps the frame and its fds queued and is tried
//!   again after a backoff on a loop timer (1 ms doubling to 128 ms, no busy loop, no write in
//!   between); 16 refusals in a row (about 1.3 s) are an [`IpcError::Io`] event, then the
//!   channel closes. `EPIPE`/`ECONNRESET` end the channel at once (the peer is gone).
//! - **Hardened.** A frame over the cap or not valid JSON is dropped (with its fds) and delivered
//!   as an [`IpcError::Frame`] event, logged by no one but its reader (who knows the peer, and
//!   limits its lines: a cluster primary's are one per worker per 10 s); the channel stays open
//!   and reads on from the next line (no JSON text contains a raw newline, so the stream keeps
//!   its sync). At most 64 input error
//!   events wait unread (past them one warning, then one line per 10 s while the queue keeps
//!   filling). The channel's own answers to the
//!   peer's frames (ACK, NACK, socket replies) wait unwritten 1024 at most (more are dropped): a
//!   peer that asks and never reads cannot grow this side either. Nothing panics and nothing
//!   exits the process.
//! - **Unread messages: kept up to a generous bound, then the oldest dropped.** The channel
//!   never stops reading for want of a reader: one queue's unread messages never hold back the
//!   other's, nor the frames the channel handles itself (a stop in reading would: the socket is
//!   one ordered stream), and two peers that each wait for their writes (`flush`) before reading
//!   never wait for each other. Messages wait for [`Channel::recv`] up to
//!   [`MAX_UNREAD_MESSAGES`] (256 Ki), [`MAX_UNREAD_BYTES`] of JSON (64 MiB) or [`MAX_UNREAD_FDS`]
//!   in their handles (4096); below all three nothing is dropped, so a slow reader, a read of
//!   thousands of coalesced frames or a program that starts reading late gets every message.
//!   Past one, the oldest are dropped (their handles closed; the newest is always kept): Node
//!   buffers without bound instead, and a program that never reads (a cluster worker that only
//!   serves, or read once, as `process.once('message')`) must not grow without bound. Each drop
//!   is counted ([`Channel::dropped_unread`]); the first of a burst is a WARN line, then one
//!   line per 10 s while drops go on (`log_limit`). The rule holds whether or not `recv` was
//!   ever called, and the internal messages for [`Channel::recv_internal`] have it too, in a
//!   queue of their own. At the end of input, what is buffered is taken, then the channel
//!   closes.
//! - **Liveness.** An open channel is a ref'd handle (Node's `channel.ref()`); `unref()` lets the
//!   loop exit while it is open. Closing (EOF, an error, `disconnect`, drop) releases it.
//! - **Disconnect.** `disconnect()` (or dropping the `Channel`) stops new sends, writes what is
//!   queued (waiting for a pending ACK), then closes the fd; the peer reads EOF. EOF from the
//!   peer closes this side too. After the close, `recv` yields what was received, then `None`.
//! - **Writes need the loop.** The channel's task writes what is queued while its loop runs: a
//!   `block_on` that returns, or a runtime dropped, with frames still queued (a burst of `send`s
//!   the peer has not read yet) loses them, with a WARN line that counts them. Await
//!   [`Channel::flush`] before the loop ends (Node's process writes its queue before it exits).

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::fmt;
use std::future::poll_fn;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;

use super::fdpass;
use super::framing::{DEFAULT_MAX_FRAME, Decoder, FrameError, encode};
use super::handles::{
    self, ACK, FdsFrame, Handle, HandleFrame, NACK, NODE_HANDLE, NODUS_FDS, SendHandle, SocketReply,
};
use crate::io::AsyncFd;
use crate::log_limit::{self, LogLimit};
use crate::time::Sleep;

/// `send` returns `false` from this many queued bytes on (Node: `writeQueueSize < 65536 * 2`).
pub const HIGH_WATER: usize = 128 * 1024;

/// Node's `MAX_HANDLE_RETRANSMISSIONS`.
const MAX_RETRANSMISSIONS: u32 = 3;

/// Error events about the peer's input ([`IpcError::UnexpectedFds`], [`IpcError::Frame`]) queued
/// unread at most; while this many wait, further ones are not queued (the stray fds and bad
/// frames are still dropped) and one warning says so.
const MAX_UNREAD_ERRORS: usize = 64;

/// Messages kept unread for [`Channel::recv`] at most (the internal ones kept for
/// [`Channel::recv_internal`] have the same bounds, in a queue of their own). Past this, or
/// [`MAX_UNREAD_BYTES`] or [`MAX_UNREAD_FDS`], the oldest are dropped (their handles closed;
/// the newest is always kept), counted and warned about; the channel reads on regardless.
pub const MAX_UNREAD_MESSAGES: usize = 256 * 1024;
/// The JSON bytes of the messages kept unread, at most (see [`MAX_UNREAD_MESSAGES`]).
pub const MAX_UNREAD_BYTES: usize = 64 * 1024 * 1024;
/// The fds in the handles of the messages kept unread, at most (see [`MAX_UNREAD_MESSAGES`]).
pub const MAX_UNREAD_FDS: usize = 4096;

/// The channel's own answers to the peer's frames (ACK, NACK, `NODE_SOCKET_*` replies) queued
/// unwritten at most: a peer that waits for its answers has a few; one that sends handle frames
/// or socket queries and never reads would otherwise grow this side without bound. Past it,
/// answers are dropped (that peer reads none of them anyway).
const MAX_UNREAD_REPLIES: usize = 1024;

/// What unread messages hold: how many, their JSON bytes and the fds of their handles.
#[derive(Default)]
struct Unread {
    messages: usize,
    bytes: usize,
    fds: usize,
}

impl Unread {
    fn add(&mut self, msg: &Message) {
        self.messages += 1;
        self.bytes += msg.json.get().len();
        self.fds += msg.handles.len();
    }

    fn remove(&mut self, msg: &Message) {
        self.messages -= 1;
        self.bytes -= msg.json.get().len();
        self.fds -= msg.handles.len();
    }

    /// Past a bound, with more than one message (the newest is always kept).
    fn over(&self) -> bool {
        self.messages > 1
            && (self.messages > MAX_UNREAD_MESSAGES
                || self.bytes > MAX_UNREAD_BYTES
                || self.fds > MAX_UNREAD_FDS)
    }
}

/// A `sendmsg` the kernel refused for want of memory is tried again after 1, 2, 4 ... ms (at
/// most [`SEND_RETRY_MAX_DELAY_MS`] apart), this many times in a row (about 1.3 s), before the
/// channel gives up.
const SEND_RETRIES: u32 = 16;

/// The longest wait between two tries of a refused `sendmsg`.
const SEND_RETRY_MAX_DELAY_MS: u64 = 128;

/// Fds one [`Channel::send_fds`] frame may carry.
pub const MAX_FDS_PER_FRAME: usize = fdpass::MAX_FDS;

/// How a channel is set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelOptions {
    /// The largest frame accepted or sent, in bytes (default 16 MiB).
    pub max_frame: usize,
}

impl Default for ChannelOptions {
    fn default() -> Self {
        ChannelOptions {
            max_frame: DEFAULT_MAX_FRAME,
        }
    }
}

/// What can go wrong on a channel.
#[derive(Debug)]
pub enum IpcError {
    /// The channel is disconnected (Node's `ERR_IPC_CHANNEL_CLOSED`).
    Closed,
    /// A malformed or oversized frame arrived and was dropped (with any fds it brought); the
    /// channel stays open and reads on from the next frame.
    Frame(FrameError),
    /// Fds arrived that do not match the frame they came with: `received` of them where the
    /// frame carries `expected` (0 for a frame without a handle, 1 for `NODE_HANDLE`, the count
    /// of a `NODE_NODUS_FDS` frame), or in the middle of a frame (`expected` 0). They were
    /// closed and the frame handled without them (a `NODE_HANDLE` is NACKed); the channel stays
    /// open, and later frames still get their own fds.
    UnexpectedFds { expected: usize, received: usize },
    /// A message to send is larger than the frame cap.
    TooLarge { len: usize, max: usize },
    /// A handle was NACKed 4 times and dropped (Node's `SentHandleNotReceivedWarning`); the
    /// message it was sent with (JSON), so the sender knows which one.
    HandleNotReceived(Box<RawValue>),
    /// A message could not be serialized as JSON.
    Serialize(serde_json::Error),
    /// The socket failed, and the channel closed: a read error, or a `sendmsg` the kernel kept
    /// refusing for want of memory (`ENOBUFS`, `ENOMEM`, `ETOOMANYREFS`) through every retry.
    /// A peer that is gone (`EPIPE`, `ECONNRESET`) is no error: the channel just ends.
    Io(io::Error),
    /// The parent asked for a serialization mode nodus does not speak.
    UnsupportedSerialization(String),
    /// `NODE_CHANNEL_FD` is not a usable fd.
    BadChannelFd(String),
}

impl fmt::Display for IpcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IpcError::Closed => write!(f, "nodus::ipc: channel closed"),
            IpcError::Frame(e) => write!(
                f,
                "nodus::ipc: {e}; frame dropped, the channel reads on from the next one"
            ),
            IpcError::UnexpectedFds { expected, received } => write!(
                f,
                "nodus::ipc: {received} fd(s) arrived with a frame that carries {expected}; \
                 closed them"
            ),
            IpcError::TooLarge { len, max } => {
                write!(
                    f,
                    "nodus::ipc: message of {len} bytes exceeds the {max}-byte frame cap"
                )
            }
            IpcError::HandleNotReceived(_) => write!(
                f,
                "nodus::ipc: handle did not reach the receiving process (NACKed {} times), dropped",
                MAX_RETRANSMISSIONS + 1
            ),
            IpcError::Serialize(e) => write!(f, "nodus::ipc: cannot serialize message: {e}"),
            IpcError::Io(e) => write!(f, "nodus::ipc: {e}; channel closed"),
            IpcError::UnsupportedSerialization(mode) => write!(
                f,
                "nodus::ipc: the parent uses serialization '{mode}'; nodus speaks only 'json' \
                 (fork it with the default serialization, or {{ serialization: 'json' }})"
            ),
            IpcError::BadChannelFd(why) => write!(f, "nodus::ipc: NODE_CHANNEL_FD {why}"),
        }
    }
}

impl std::error::Error for IpcError {}

/// A received message: its JSON text exactly as the peer wrote it, and the handle it carried
/// (several for a nodus peer's [`Channel::send_fds`]).
pub struct Message {
    json: Box<RawValue>,
    handles: Vec<Handle>,
}

impl Message {
    /// The message's JSON text (object keys in the sender's order).
    pub fn json(&self) -> &str {
        self.json.get()
    }

    /// Parses the message into `T`.
    ///
    /// # Errors
    /// The JSON does not fit `T`, or holds what serde_json refuses and JavaScript's `JSON.parse`
    /// takes: a lone UTF-16 surrogate escape (`"\ud83d"`, which `JSON.stringify` writes for a
    /// string cut inside an emoji). [`json`](Self::json) still has the text.
    pub fn deserialize<T: DeserializeOwned>(&self) -> serde_json::Result<T> {
        serde_json::from_str(self.json.get())
    }

    /// The handle that came with it, if any (the first, if several came).
    pub fn handle(&self) -> Option<&Handle> {
        self.handles.first()
    }

    /// Takes the (first) handle out (to convert it into a socket).
    pub fn take_handle(&mut self) -> Option<Handle> {
        (!self.handles.is_empty()).then(|| self.handles.remove(0))
    }

    /// Takes every handle out, in the order they were sent.
    pub fn take_handles(&mut self) -> Vec<Handle> {
        std::mem::take(&mut self.handles)
    }
}

impl Serialize for Message {
    /// Serializes as the received JSON, unchanged (so it can be echoed or forwarded).
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.json.serialize(s)
    }
}

impl fmt::Debug for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Message")
            .field("json", &self.json.get())
            .field("handles", &self.handles)
            .finish()
    }
}

/// What travels with a frame's first byte.
enum Attach {
    None,
    /// The in-flight handle's fd.
    InFlight,
    /// A [`Channel::send_fds`] burst (shared with the sender, which may keep the fds open).
    Fds(Vec<Rc<OwnedFd>>),
}

/// A frame in the write queue.
struct Out {
    bytes: Vec<u8>,
    written: usize,
    attach: Attach,
    /// The channel's own answer to a frame of the peer's (ACK, NACK, `NODE_SOCKET_*`).
    reply: bool,
}

/// A frame `submit` may have to hold back behind an in-flight handle.
enum Payload {
    Plain,
    Handle(SendHandle),
    Fds(Vec<Rc<OwnedFd>>),
}

/// The fds a read brought.
struct Arrived {
    fds: Vec<OwnedFd>,
    /// The kernel closed some of them (`MSG_CTRUNC`): `fds` are the first ones sent.
    truncated: bool,
}

/// The fds one read brought, for the frames that start in it (stream offsets `from..to`) and
/// announce fds, in order. Matched once every such frame is buffered whole (`matched`): their
/// announced fds are counted, and unless that is what arrived (fewer only when the kernel
/// truncated them) all are closed and none given.
struct FdGroup {
    from: u64,
    to: u64,
    fds: VecDeque<OwnedFd>,
    truncated: bool,
    /// The frames from `from` up to this offset are counted.
    counted_to: u64,
    /// The bytes from `counted_to` up to this offset hold no `\n`.
    searched_to: u64,
    /// Fds the counted frames announce.
    announced: usize,
    /// A counted frame is malformed or too large (it may have been the fds' frame).
    bad: bool,
    matched: bool,
}

impl FdGroup {
    /// Counts the fds announced by the frames of this group buffered in `decoder`; `true` once
    /// all are counted. `at_end`: no more bytes will come (an unfinished frame announces none).
    fn count(&mut self, decoder: &Decoder, max_frame: usize, at_end: bool) -> bool {
        while self.counted_to < self.to {
            let rest = decoder.buffered_from(self.counted_to);
            let skip = usize::try_from(self.searched_to - self.counted_to).unwrap_or(usize::MAX);
            match rest
                .get(skip..)
                .and_then(|r| r.iter().position(|&b| b == b'\n'))
            {
                Some(pos) => {
                    let line = &rest[..skip + pos];
                    match (line.len() <= max_frame)
                        .then(|| serde_json::from_slice::<&RawValue>(line).ok())
                        .flatten()
                    {
                        Some(json) => {
                            self.announced += handles::internal(json).map_or(0, |i| i.carries());
                        }
                        None => self.bad = true,
                    }
                    self.counted_to += (skip + pos + 1) as u64;
                    self.searched_to = self.counted_to;
                }
                // The group's last frame, unfinished: too large already, or never to finish.
                None if rest.len() > max_frame || at_end => {
                    self.bad = true;
                    self.counted_to = self.to;
                }
                None => {
                    self.searched_to = self.counted_to + rest.len() as u64;
                    return false;
                }
            }
        }
        true
    }
}

/// The `sendmsg` call the channel writes with: [`fdpass::send`]; a seam through which the unit
/// tests inject the kernel's errors and short writes.
type SendFn = fn(BorrowedFd<'_>, &[u8], &[BorrowedFd<'_>]) -> io::Result<usize>;

/// The handle waiting for its ACK.
struct InFlight {
    frame: Vec<u8>,
    fd: OwnedFd,
    retransmissions: u32,
}

struct State {
    decoder: Decoder,
    max_frame: usize,
    /// The fds of reads whose frames are not all taken yet, in stream order.
    fd_groups: VecDeque<FdGroup>,
    /// The peer's end of input was read: an unfinished frame will never finish.
    eof: bool,
    incoming: VecDeque<Result<Message, IpcError>>,
    /// The messages (`Ok` items) in `incoming`.
    unread: Unread,
    /// Input error events (`UnexpectedFds`, `Frame`) in `incoming`.
    unread_errors: usize,
    internal: VecDeque<Message>,
    /// The messages in `internal`.
    internal_unread: Unread,
    /// Messages (of either queue) dropped unread past the bounds since the channel opened.
    dropped_unread: u64,
    /// The drop warnings: the first of a burst in full, then one line per window.
    drop_warnings: Rc<LogLimit>,
    /// The warnings that input errors stopped being queued (the queue full), limited the same
    /// way: a peer writing junk fills it again each time it is read.
    error_queue_warnings: Rc<LogLimit>,
    out: VecDeque<Out>,
    out_bytes: usize,
    /// The `reply` frames in `out`; `replies_dropped` once one was dropped for want of room
    /// (warned), until one is queued again.
    replies_queued: usize,
    replies_dropped: bool,
    held: VecDeque<(Vec<u8>, Payload)>,
    held_bytes: usize,
    /// The handles (`Payload::Handle`) in `held`.
    held_handles: usize,
    in_flight: Option<InFlight>,
    /// `sendmsg` refusals in a row for want of kernel memory.
    send_failures: u32,
    /// Armed after such a refusal: nothing is written until it fires (the driver polls it).
    backoff: Option<Sleep>,
    /// `send` is allowed (false after `disconnect` or the close).
    connected: bool,
    /// The fd is closed.
    closed: bool,
    recv_waker: Option<Waker>,
    internal_waker: Option<Waker>,
    driver: Option<Waker>,
    flush_waiters: Vec<Waker>,
}

impl State {
    /// Puts a frame on the wire queue, or makes it the in-flight handle.
    fn enqueue(&mut self, bytes: Vec<u8>, payload: Payload) {
        let attach = match payload {
            Payload::Plain => Attach::None,
            Payload::Handle(h) => {
                self.in_flight = Some(InFlight {
                    frame: bytes.clone(),
                    fd: h.fd,
                    retransmissions: 0,
                });
                Attach::InFlight
            }
            Payload::Fds(fds) => Attach::Fds(fds),
        };
        self.out_bytes += bytes.len();
        self.out.push_back(Out {
            bytes,
            written: 0,
            attach,
            reply: false,
        });
    }

    /// After an ACK (or giving up): sends held messages until the next handle. With nothing held
    /// or queued, the flush waiters are woken here: no write will (the ACK was the last thing a
    /// flush waited for).
    fn release_held(&mut self, wake: &mut Vec<Waker>) {
        while self.in_flight.is_none() {
            let Some((bytes, payload)) = self.held.pop_front() else {
                break;
            };
            self.held_bytes -= bytes.len();
            self.held_handles -= usize::from(matches!(payload, Payload::Handle(_)));
            self.enqueue(bytes, payload);
        }
        if self.idle() {
            wake.append(&mut self.flush_waiters);
        }
    }

    /// Queues the channel's own answer to a frame of the peer's, unless [`MAX_UNREAD_REPLIES`]
    /// of them wait unwritten already: a peer that keeps asking and never reads gets no more
    /// (one warning per stretch).
    fn control(&mut self, bytes: &[u8]) {
        if self.replies_queued >= MAX_UNREAD_REPLIES {
            if !self.replies_dropped {
                tracing::warn!(
                    target: "nodus::ipc",
                    "{MAX_UNREAD_REPLIES} answers to the peer's frames wait unread: dropping more \
                     (the peer does not read its channel)"
                );
                self.replies_dropped = true;
            }
            return;
        }
        self.replies_dropped = false;
        self.replies_queued += 1;
        self.out_bytes += bytes.len();
        self.out.push_back(Out {
            bytes: bytes.to_vec(),
            written: 0,
            attach: Attach::None,
            reply: true,
        });
    }

    fn deliver(&mut self, item: Result<Message, IpcError>, wake: &mut Vec<Waker>) {
        if let Ok(msg) = &item {
            self.unread.add(msg);
        }
        self.incoming.push_back(item);
        while self.unread.over() {
            self.drop_oldest_message();
        }
        wake.extend(self.recv_waker.take());
    }

    /// Drops the oldest unread message (its handles close), counted and warned about.
    fn drop_oldest_message(&mut self) {
        let Some(at) = self.incoming.iter().position(Result::is_ok) else {
            return;
        };
        let Some(Ok(msg)) = self.incoming.remove(at) else {
            return;
        };
        self.dropped(false);
        self.unread.remove(&msg);
    }

    /// Counts a message about to be dropped from a full queue (`internal`: the one for
    /// `recv_internal`) and warns: the first of a burst in full, the rest in one line per window.
    fn dropped(&mut self, internal: bool) {
        self.dropped_unread += 1;
        let (unread, reader) = if internal {
            (&self.internal_unread, "recv_internal")
        } else {
            (&self.unread, "recv")
        };
        if self.drop_warnings.first(|| reader.to_owned()) {
            tracing::warn!(
                target: "nodus::ipc",
                "{} messages ({} bytes, {} fds) wait unread on an IPC channel (the program does \
                 not call {reader} as fast as they come): dropping the oldest past \
                 {MAX_UNREAD_MESSAGES} messages, {} MiB or {MAX_UNREAD_FDS} fds (further drops \
                 counted: one line per {:?})",
                unread.messages,
                unread.bytes,
                unread.fds,
                MAX_UNREAD_BYTES >> 20,
                log_limit::WINDOW,
            );
        }
    }

    /// Queues an error event about the peer's input, unless [`MAX_UNREAD_ERRORS`] wait unread.
    fn input_error(&mut self, error: IpcError, wake: &mut Vec<Waker>) {
        if self.unread_errors == MAX_UNREAD_ERRORS {
            if self.error_queue_warnings.first(String::new) {
                tracing::warn!(
                    target: "nodus::ipc",
                    "{MAX_UNREAD_ERRORS} input errors wait unread: not queueing more until they \
                     are read (stray fds and bad frames are still dropped; this again is counted: \
                     one line per {:?})",
                    log_limit::WINDOW
                );
            }
            self.unread_errors += 1; // Said or counted: once until the queue is read.
        }
        if self.unread_errors >= MAX_UNREAD_ERRORS {
            return;
        }
        self.unread_errors += 1;
        self.deliver(Err(error), wake);
    }

    /// Takes one read: `bytes`, and the fds that came with them. A `sendmsg`'s fds come with
    /// its first byte, and a read ends with the bytes that carried fds (see `fdpass`), so they
    /// belong to the frames that start in this read: in order, to those that announce fds
    /// (Node gives a read's handle to its `NODE_HANDLE` frame), whichever read brings their
    /// ends. Fds in a read where no frame starts belong to none.
    fn on_read(&mut self, bytes: &[u8], arrived: Option<Arrived>, wake: &mut Vec<Waker>) {
        if let Some(arrived) = arrived {
            let begin = self.decoder.pushed();
            let first = if self.decoder.at_frame_start() {
                Some(0)
            } else {
                bytes[..bytes.len() - 1]
                    .iter()
                    .position(|&b| b == b'\n')
                    .map(|newline| newline + 1)
            };
            match first {
                Some(first) => {
                    let from = begin + first as u64;
                    self.fd_groups.push_back(FdGroup {
                        from,
                        to: begin + bytes.len() as u64,
                        fds: arrived.fds.into(),
                        truncated: arrived.truncated,
                        counted_to: from,
                        searched_to: from,
                        announced: 0,
                        bad: false,
                        matched: false,
                    });
                }
                None => self.unexpected_fds(arrived.fds, 0, wake),
            }
        }
        self.decoder.push(bytes);
        self.take_frames(wake);
    }

    /// Acts on the complete frames buffered, in order, until more bytes are needed (a frame
    /// unfinished, or the fds of a read waiting for the rest of its frames). A bad frame is
    /// reported and dropped; the frames after it go on.
    fn take_frames(&mut self, wake: &mut Vec<Waker>) {
        while self.match_fds(wake) {
            match self.decoder.next_frame() {
                Ok(Some(frame)) => {
                    let start = self.decoder.frame_start();
                    self.on_frame(frame, start, wake);
                }
                Ok(None) => return,
                Err(e) => self.input_error(IpcError::Frame(e), wake),
            }
        }
    }

    /// Before the decoder's next frame is taken: if it may be the first of a read that brought
    /// fds, matches them to that read's frames, which must all be buffered (`false` until they
    /// are). A mismatch closes them and reports it, unless a bad frame of that read may have
    /// been theirs (its own error says so).
    fn match_fds(&mut self, wake: &mut Vec<Waker>) -> bool {
        let Some(group) = self.fd_groups.iter_mut().find(|g| !g.matched) else {
            return true;
        };
        if !self.decoder.skipping() && self.decoder.position() < group.from {
            return true; // The next frame starts before the read that brought fds.
        }
        if !group.count(&self.decoder, self.max_frame, self.eof) {
            return false;
        }
        group.matched = true;
        let received = group.fds.len();
        let (announced, truncated, bad) = (group.announced, group.truncated, group.bad);
        if received == announced || (truncated && received < announced) {
            return true;
        }
        let fds: Vec<OwnedFd> = group.fds.drain(..).collect();
        if bad {
            drop(fds);
        } else {
            self.unexpected_fds(fds, announced, wake);
        }
        true
    }

    /// Closes fds that do not match their frame and reports them.
    fn unexpected_fds(&mut self, fds: Vec<OwnedFd>, expected: usize, wake: &mut Vec<Waker>) {
        let received = fds.len();
        drop(fds);
        self.input_error(IpcError::UnexpectedFds { expected, received }, wake);
    }

    /// Acts on one received frame, which starts at stream offset `start`. It takes the fds it
    /// announces from those of the read it starts in, matched already (`match_fds`): all of
    /// them, or what the kernel did not truncate, or none after a mismatch.
    fn on_frame(&mut self, json: Box<RawValue>, start: u64, wake: &mut Vec<Waker>) {
        while self.fd_groups.front().is_some_and(|g| g.to <= start) {
            self.fd_groups.pop_front(); // Every frame of that read was taken.
        }
        let internal = handles::internal(&json);
        let mut fds = Vec::new();
        if let Some(group) = self.fd_groups.front_mut()
            && group.from <= start
        {
            debug_assert!(
                group.matched,
                "a read's fds are matched before its frames go"
            );
            let n = internal.as_ref().map_or(0, |i| i.carries());
            fds.extend(group.fds.drain(..n.min(group.fds.len())));
        }
        let Some(internal) = internal else {
            self.deliver(
                Ok(Message {
                    json,
                    handles: Vec::new(),
                }),
                wake,
            );
            return;
        };
        match internal.cmd() {
            NODE_HANDLE => match fds.pop() {
                Some(fd) => {
                    self.control(ACK);
                    let msg = internal.msg.map_or_else(null, ToOwned::to_owned);
                    let node_type = internal.node_type.map(Cow::into_owned);
                    let handle = Handle::new(fd, node_type.unwrap_or_default());
                    self.deliver_wrapped(msg, vec![handle], wake);
                }
                None => self.control(NACK),
            },
            NODUS_FDS => {
                let handles = fds
                    .into_iter()
                    .map(|fd| Handle::new(fd, "net.Native"))
                    .collect();
                let msg = internal.msg.map_or_else(null, ToOwned::to_owned);
                self.deliver_wrapped(msg, handles, wake);
            }
            "NODE_HANDLE_ACK" => {
                drop(self.in_flight.take());
                self.release_held(wake);
            }
            "NODE_HANDLE_NACK" => {
                let Some(in_flight) = self.in_flight.as_mut() else {
                    return;
                };
                if in_flight.retransmissions == MAX_RETRANSMISSIONS {
                    let dropped = self.in_flight.take().expect("checked");
                    let msg = handles::sent_message(&dropped.frame).unwrap_or_else(null);
                    self.deliver(Err(IpcError::HandleNotReceived(msg)), wake);
                    self.release_held(wake);
                } else {
                    in_flight.retransmissions += 1;
                    let bytes = in_flight.frame.clone();
                    self.out_bytes += bytes.len();
                    self.out.push_back(Out {
                        bytes,
                        written: 0,
                        attach: Attach::InFlight,
                        reply: false,
                    });
                }
            }
            // nodus passes no tracked sockets' lifetimes back: a received socket belongs to the
            // receiving program, so "all closed" is answered at once and the count is 0.
            cmd @ ("NODE_SOCKET_NOTIFY_CLOSE" | "NODE_SOCKET_GET_COUNT") => {
                let Some(key) = internal.key else {
                    return;
                };
                let reply = if cmd == "NODE_SOCKET_NOTIFY_CLOSE" {
                    SocketReply {
                        cmd: "NODE_SOCKET_ALL_CLOSED",
                        key,
                        count: None,
                    }
                } else {
                    SocketReply {
                        cmd: "NODE_SOCKET_COUNT",
                        key,
                        count: Some(0),
                    }
                };
                if let Ok(bytes) = encode(&reply) {
                    self.control(&bytes);
                }
            }
            _ => self.push_internal(
                Message {
                    json,
                    handles: Vec::new(),
                },
                wake,
            ),
        }
    }

    /// Delivers a message that arrived wrapped with fds. As in Node, it is internal or not by
    /// its own `cmd` (a cluster `newconn` travels with its connection's fd).
    fn deliver_wrapped(
        &mut self,
        json: Box<RawValue>,
        handles: Vec<Handle>,
        wake: &mut Vec<Waker>,
    ) {
        let msg = Message { json, handles };
        if handles::internal(&msg.json).is_some() {
            self.push_internal(msg, wake);
        } else {
            self.deliver(Ok(msg), wake);
        }
    }

    fn push_internal(&mut self, msg: Message, wake: &mut Vec<Waker>) {
        self.internal_unread.add(&msg);
        self.internal.push_back(msg);
        while self.internal_unread.over() {
            self.dropped(true);
            let dropped = self.internal.pop_front().expect("more than one");
            self.internal_unread.remove(&dropped);
        }
        wake.extend(self.internal_waker.take());
    }

    fn queued(&self) -> usize {
        self.out_bytes + self.held_bytes
    }

    /// Nothing left to write or to wait for before a disconnect may close the fd.
    fn idle(&self) -> bool {
        self.out.is_empty() && self.held.is_empty() && self.in_flight.is_none()
    }
}

/// The drop warnings' limiter: after a burst's first line, one line per window while it lasts.
fn drop_warnings() -> Rc<LogLimit> {
    LogLimit::new(log_limit::WINDOW, |n, reader| {
        tracing::warn!(
            target: "nodus::ipc",
            "{n} more unread messages dropped on an IPC channel in the last {:?} (the program \
             does not call {reader} as fast as they come)",
            log_limit::WINDOW
        );
    })
}

/// The limiter of the warning that input errors stopped being queued.
fn error_queue_warnings() -> Rc<LogLimit> {
    LogLimit::new(log_limit::WINDOW, |n, _| {
        tracing::warn!(
            target: "nodus::ipc",
            "{MAX_UNREAD_ERRORS} input errors waited unread {n} more times in the last {:?}: not \
             queued meanwhile",
            log_limit::WINDOW
        );
    })
}

fn null() -> Box<RawValue> {
    RawValue::from_string("null".into()).expect("null is JSON")
}

struct Inner {
    io: RefCell<Option<AsyncFd<OwnedFd>>>,
    send: SendFn,
    /// The receive buffer (64 KiB, Node's size).
    rbuf: RefCell<Vec<u8>>,
    st: RefCell<State>,
}

/// One end of a Node IPC channel. See the module docs for the rules it keeps.
pub struct Channel {
    inner: Rc<Inner>,
}

impl Channel {
    /// Adopts `fd`, an AF_UNIX stream socket connected to a Node (or nodus) peer: makes it
    /// close-on-exec and non-blocking, registers it, and starts the channel's task.
    ///
    /// # Errors
    /// `InvalidInput` if `fd` is not a Unix stream socket.
    ///
    /// # Panics
    /// Outside a running nodus loop.
    #[track_caller]
    pub fn from_fd(fd: OwnedFd, options: ChannelOptions) -> io::Result<Channel> {
        Channel::with_send(fd, options, fdpass::send)
    }

    /// [`from_fd`](Self::from_fd), writing through `send`.
    #[track_caller]
    fn with_send(fd: OwnedFd, options: ChannelOptions, send: SendFn) -> io::Result<Channel> {
        let sock = socket2::SockRef::from(&fd);
        let ok = sock.domain().ok() == Some(socket2::Domain::UNIX)
            && sock.r#type().ok() == Some(socket2::Type::STREAM);
        if !ok {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "nodus::ipc::Channel: the fd is not a Unix stream socket",
            ));
        }
        sock.set_cloexec(true)?;
        let io = AsyncFd::new(fd)?;
        let inner = Rc::new(Inner {
            io: RefCell::new(Some(io)),
            send,
            rbuf: RefCell::new(vec![0; 64 * 1024]),
            st: RefCell::new(State {
                decoder: Decoder::new(options.max_frame),
                max_frame: options.max_frame,
                fd_groups: VecDeque::new(),
                eof: false,
                incoming: VecDeque::new(),
                unread: Unread::default(),
                unread_errors: 0,
                internal: VecDeque::new(),
                internal_unread: Unread::default(),
                dropped_unread: 0,
                drop_warnings: drop_warnings(),
                error_queue_warnings: error_queue_warnings(),
                out: VecDeque::new(),
                out_bytes: 0,
                replies_queued: 0,
                replies_dropped: false,
                held: VecDeque::new(),
                held_bytes: 0,
                held_handles: 0,
                in_flight: None,
                send_failures: 0,
                backoff: None,
                connected: true,
                closed: false,
                recv_waker: None,
                internal_waker: None,
                driver: None,
                flush_waiters: Vec::new(),
            }),
        });
        let driver = inner.clone();
        crate::task::spawn_named("ipc:channel", async move {
            poll_fn(|cx| driver.poll_drive(cx)).await;
        })
        .detach();
        Ok(Channel { inner })
    }

    /// Sends `msg` as one JSON frame. Returns `Ok(false)` when 128 KiB or more is queued in user
    /// space (slow down; nothing is dropped).
    ///
    /// Object keys go out in `msg`'s serialization order: struct fields in declaration order, a
    /// received [`Message`] exactly as it arrived, a `serde_json::Value` in its map's order
    /// (sorted, unless serde_json's `preserve_order` feature is on).
    ///
    /// # Errors
    /// [`IpcError::Closed`] after a disconnect, [`IpcError::Serialize`], [`IpcError::TooLarge`].
    pub fn send<T: Serialize + ?Sized>(&self, msg: &T) -> Result<bool, IpcError> {
        let bytes = encode(msg).map_err(IpcError::Serialize)?;
        self.inner.submit(bytes, Payload::Plain)
    }

    /// Sends `msg` with a handle (Node's `send(msg, handle)`): the fd travels in the same
    /// `sendmsg` as the frame. Later messages wait until the peer ACKs it.
    pub fn send_handle<T: Serialize + ?Sized>(
        &self,
        msg: &T,
        handle: impl Into<SendHandle>,
    ) -> Result<bool, IpcError> {
        let handle = handle.into();
        let frame = HandleFrame {
            cmd: NODE_HANDLE,
            node_type: handle.node_type,
            msg,
            dgram_type: handle.dgram_type,
        };
        let bytes = encode(&frame).map_err(IpcError::Serialize)?;
        self.inner.submit(bytes, Payload::Handle(handle))
    }

    /// Sends `msg` with up to [`MAX_FDS_PER_FRAME`] fds in one `sendmsg`, to a **nodus** peer only
    /// (see the module docs); the peer receives one [`Message`] whose
    /// [`take_handles`](Message::take_handles) yields them in order (as `net.Native`). The fds
    /// are shared: the channel drops its references once they are written (or the channel
    /// closes); the caller may keep its own. Ordered with every other send; not ACKed.
    ///
    /// # Panics
    /// More than [`MAX_FDS_PER_FRAME`] fds.
    pub fn send_fds<T: Serialize + ?Sized>(
        &self,
        msg: &T,
        fds: Vec<Rc<OwnedFd>>,
    ) -> Result<bool, IpcError> {
        assert!(fds.len() <= MAX_FDS_PER_FRAME, "too many fds for one frame");
        let frame = FdsFrame {
            cmd: NODUS_FDS,
            count: fds.len(),
            msg,
        };
        let bytes = encode(&frame).map_err(IpcError::Serialize)?;
        self.inner.submit(bytes, Payload::Fds(fds))
    }

    /// The next message (or error event); `None` once the channel is closed and drained.
    /// One task receives at a time. Messages wait for it whether or not it was ever called, up
    /// to [`MAX_UNREAD_MESSAGES`], [`MAX_UNREAD_BYTES`] and [`MAX_UNREAD_FDS`]; past those, the
    /// oldest are dropped ([`dropped_unread`](Self::dropped_unread); see the module docs).
    pub async fn recv(&self) -> Option<Result<Message, IpcError>> {
        poll_fn(|cx| self.poll_recv(cx)).await
    }

    /// Polls for the next message.
    pub fn poll_recv(&self, cx: &mut Context<'_>) -> Poll<Option<Result<Message, IpcError>>> {
        let mut st = self.inner.st.borrow_mut();
        if let Some(item) = st.incoming.pop_front() {
            match &item {
                Ok(msg) => st.unread.remove(msg),
                Err(IpcError::UnexpectedFds { .. } | IpcError::Frame(_)) => {
                    // Reading one ends a saturation (and its warning) at once.
                    st.unread_errors = st.unread_errors.min(MAX_UNREAD_ERRORS) - 1;
                }
                Err(_) => {}
            }
            return Poll::Ready(Some(item));
        }
        if st.closed {
            return Poll::Ready(None);
        }
        let old = st.recv_waker.replace(cx.waker().clone());
        drop(st);
        drop(old);
        Poll::Pending
    }

    /// The next internal (`NODE_*`) message that nodus did not handle itself (`NODE_CLUSTER`,
    /// say); `None` once closed. They wait in a queue of their own, never behind unread user
    /// messages, with the bounds and rule of [`recv`](Self::recv)'s.
    pub async fn recv_internal(&self) -> Option<Message> {
        poll_fn(|cx| {
            let mut st = self.inner.st.borrow_mut();
            if let Some(m) = st.internal.pop_front() {
                st.internal_unread.remove(&m);
                return Poll::Ready(Some(m));
            }
            if st.closed {
                return Poll::Ready(None);
            }
            let old = st.internal_waker.replace(cx.waker().clone());
            drop(st);
            drop(old);
            Poll::Pending
        })
        .await
    }

    /// Waits until everything sent so far has been written to the socket (handles ACKed).
    ///
    /// # Errors
    /// [`IpcError::Closed`] if the channel closed first.
    pub async fn flush(&self) -> Result<(), IpcError> {
        poll_fn(|cx| {
            let mut st = self.inner.st.borrow_mut();
            if st.idle() {
                return Poll::Ready(Ok(()));
            }
            if st.closed {
                return Poll::Ready(Err(IpcError::Closed));
            }
            st.flush_waiters.push(cx.waker().clone());
            Poll::Pending
        })
        .await
    }

    /// Bytes waiting in user space (written when the peer reads).
    pub fn queued_bytes(&self) -> usize {
        self.inner.st.borrow().queued()
    }

    /// Messages dropped unread since the channel opened, from either queue ([`recv`]'s and
    /// [`recv_internal`]'s): the oldest, past [`MAX_UNREAD_MESSAGES`], [`MAX_UNREAD_BYTES`] or
    /// [`MAX_UNREAD_FDS`].
    ///
    /// [`recv`]: Self::recv
    /// [`recv_internal`]: Self::recv_internal
    pub fn dropped_unread(&self) -> u64 {
        self.inner.st.borrow().dropped_unread
    }

    /// Handles sent with [`send_handle`](Self::send_handle) the peer has not ACKed: the one in
    /// flight and those held behind it (each holds its fd).
    pub(crate) fn handles_waiting(&self) -> usize {
        let st = self.inner.st.borrow();
        usize::from(st.in_flight.is_some()) + st.held_handles
    }

    /// Takes back handles sent with [`send_handle`](Self::send_handle) that wait behind the one
    /// in flight (the peer has not ACKed it): never written, so the peer has seen none of them.
    /// `take` is given each one's message (the `msg` sent with it, as JSON text) and says which;
    /// those leave the queue, their fds (the channel's) closed, and the others keep their order.
    /// Returns how many were taken back. The handle in flight is the peer's to ACK or NACK.
    pub fn take_back_held_handles(&self, mut take: impl FnMut(&str) -> bool) -> usize {
        #[derive(serde::Deserialize)]
        struct Held<'a> {
            #[serde(borrow)]
            msg: &'a RawValue,
        }
        let mut st = self.inner.st.borrow_mut();
        let st = &mut *st;
        let before = st.held.len();
        let mut freed = 0;
        st.held.retain(|(bytes, payload)| {
            let taken = matches!(payload, Payload::Handle(_))
                && serde_json::from_slice::<Held<'_>>(bytes).is_ok_and(|h| take(h.msg.get()));
            if taken {
                freed += bytes.len();
            }
            !taken
        });
        st.held_bytes -= freed;
        st.held_handles -= before - st.held.len();
        before - st.held.len()
    }

    /// Whether `send` is still allowed.
    pub fn is_connected(&self) -> bool {
        self.inner.st.borrow().connected
    }

    /// Stops sending; the fd closes once the queue is written (Node's `disconnect()`).
    pub fn disconnect(&self) {
        self.inner.disconnect();
    }

    /// The open channel no longer keeps the loop alive (Node's `channel.unref()`).
    pub fn unref(&self) {
        if let Some(io) = self.inner.io.borrow().as_ref() {
            io.unref();
        }
    }

    /// The open channel keeps the loop alive (the default).
    pub fn ref_(&self) {
        if let Some(io) = self.inner.io.borrow().as_ref() {
            io.ref_();
        }
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        self.inner.disconnect();
    }
}

impl Drop for Inner {
    /// Gone with what it had not written: the loop that was to write it ended (a `block_on`
    /// returned, the runtime dropped the channel's task) before it was written. Said, not lost in
    /// silence.
    fn drop(&mut self) {
        let st = self.st.get_mut();
        let (bytes, messages) = (st.queued(), st.out.len() + st.held.len());
        if bytes > 0 {
            tracing::warn!(
                target: "nodus::ipc",
                "an IPC channel ended with its loop before writing {messages} queued frames \
                 ({bytes} bytes): they are lost; await `Channel::flush` (or let the loop run \
                 on) before the loop ends"
            );
        }
    }
}

impl fmt::Debug for Channel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.inner.st.borrow();
        f.debug_struct("Channel")
            .field("connected", &st.connected)
            .field("closed", &st.closed)
            .field("queued", &st.queued())
            .finish()
    }
}

impl Inner {
    fn submit(&self, bytes: Vec<u8>, payload: Payload) -> Result<bool, IpcError> {
        let mut st = self.st.borrow_mut();
        if !st.connected {
            return Err(IpcError::Closed);
        }
        if bytes.len() - 1 > st.max_frame {
            return Err(IpcError::TooLarge {
                len: bytes.len() - 1,
                max: st.max_frame,
            });
        }
        if st.in_flight.is_some() {
            st.held_bytes += bytes.len();
            st.held_handles += usize::from(matches!(payload, Payload::Handle(_)));
            st.held.push_back((bytes, payload));
        } else {
            st.enqueue(bytes, payload);
        }
        drop(st);
        let mut wake = Vec::new();
        if !self.write_some(&mut wake, false) {
            self.close(&mut wake);
        }
        wake_all(wake);
        Ok(self.st.borrow().queued() < HIGH_WATER)
    }

    fn disconnect(&self) {
        let mut st = self.st.borrow_mut();
        st.connected = false;
        let driver = st.driver.take();
        drop(st);
        if let Some(w) = driver {
            w.wake();
        }
    }

    /// Writes queued frames until the queue is empty, the socket is full or the kernel refuses
    /// for want of memory (then a backoff is armed, and nothing is written until it fires). On
    /// either outside the driver, the driver is woken to wait. `false` when the socket failed
    /// (the peer is gone, or the refusals outlasted the retries: an error event) or is closed.
    fn write_some(&self, wake: &mut Vec<Waker>, from_driver: bool) -> bool {
        let guard = self.io.borrow();
        let Some(io) = guard.as_ref() else {
            return false;
        };
        let mut st = self.st.borrow_mut();
        let st = &mut *st;
        if st.backoff.is_some() {
            return true;
        }
        loop {
            let Some(front) = st.out.front_mut() else {
                if st.held.is_empty() && st.in_flight.is_none() {
                    wake.append(&mut st.flush_waiters);
                }
                return true;
            };
            // The fds go with the frame's first byte only.
            let fds: Vec<BorrowedFd<'_>> = match (&front.attach, &st.in_flight) {
                _ if front.written > 0 => Vec::new(),
                (Attach::InFlight, Some(f)) => vec![f.fd.as_fd()],
                (Attach::Fds(shared), _) => shared.iter().map(|fd| fd.as_fd()).collect(),
                _ => Vec::new(),
            };
            // A failed `sendmsg` took nothing: the frame's fds go with the next try.
            match (self.send)(io.get_ref().as_fd(), &front.bytes[front.written..], &fds) {
                Ok(n) => {
                    st.send_failures = 0;
                    front.written += n;
                    st.out_bytes -= n;
                    if front.written == front.bytes.len() {
                        st.replies_queued -= usize::from(front.reply);
                        st.out.pop_front();
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    io.clear_write_ready();
                    if !from_driver {
                        wake.extend(st.driver.take());
                    }
                    return true;
                }
                Err(e) if short_of_memory(&e) => {
                    if st.send_failures == SEND_RETRIES {
                        st.deliver(Err(IpcError::Io(e)), wake);
                        return false;
                    }
                    let delay = (1u64 << st.send_failures).min(SEND_RETRY_MAX_DELAY_MS);
                    st.send_failures += 1;
                    let mut backoff = crate::time::sleep(Duration::from_millis(delay));
                    // The open channel keeps the loop alive, or not (`unref`): not its timer.
                    backoff.unref();
                    st.backoff = Some(backoff);
                    if !from_driver {
                        wake.extend(st.driver.take());
                    }
                    return true;
                }
                // EPIPE / ECONNRESET: the peer is gone, which the close reports as the end.
                Err(_) => return false,
            }
        }
    }

    /// Closes the fd (deregistering it) and wakes everyone waiting. No borrow may be held.
    fn close(&self, wake: &mut Vec<Waker>) {
        let mut st = self.st.borrow_mut();
        st.closed = true;
        st.connected = false;
        st.out.clear();
        st.replies_queued = 0;
        st.out_bytes = 0;
        let held = std::mem::take(&mut st.held);
        st.held_bytes = 0;
        st.held_handles = 0;
        let in_flight = st.in_flight.take();
        let fd_groups = std::mem::take(&mut st.fd_groups);
        let backoff = st.backoff.take();
        wake.extend(st.recv_waker.take());
        wake.extend(st.internal_waker.take());
        wake.extend(st.driver.take());
        wake.append(&mut st.flush_waiters);
        drop(st);
        let io = self.io.borrow_mut().take();
        drop((io, held, in_flight, fd_groups, backoff));
    }

    /// The channel task: read, write, close when done. `Ready` once closed.
    fn poll_drive(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut wake = Vec::new();
        let done = self.drive(cx, &mut wake);
        if done {
            self.close(&mut wake);
        }
        wake_all(wake);
        if done { Poll::Ready(()) } else { Poll::Pending }
    }

    /// One round of the channel task; `true` when the channel must close (or has).
    fn drive(&self, cx: &mut Context<'_>, wake: &mut Vec<Waker>) -> bool {
        {
            let mut st = self.st.borrow_mut();
            if st.closed {
                return true;
            }
            st.driver = Some(cx.waker().clone());
        }
        // Read while readable (the cooperative budget bounds this loop), whatever waits unread.
        loop {
            let guard = self.io.borrow();
            let Some(io) = guard.as_ref() else {
                return true;
            };
            match io.poll_read_ready(cx) {
                Poll::Ready(Ok(())) => {}
                _ => break,
            }
            let mut buf = self.rbuf.borrow_mut();
            let mut st = self.st.borrow_mut();
            match fdpass::recv(io.get_ref().as_fd(), &mut buf) {
                Ok(got) if got.len == 0 => {
                    // What is buffered still goes (an unfinished frame never will).
                    st.eof = true;
                    st.take_frames(wake);
                    return true;
                }
                Ok(got) => {
                    // A truncated read counts without fds: its frame's fds were lost (a
                    // NODE_HANDLE gets a NACK, a NODE_NODUS_FDS frame goes through without).
                    let arrived = (!got.fds.is_empty() || got.truncated).then_some(Arrived {
                        fds: got.fds,
                        truncated: got.truncated,
                    });
                    st.on_read(&buf[..got.len], arrived, wake);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => io.clear_read_ready(),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    let reset = matches!(
                        e.kind(),
                        io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe
                    );
                    if !reset {
                        st.deliver(Err(IpcError::Io(e)), wake);
                    }
                    return true;
                }
            }
        }
        // Write what is queued while writable, once a backoff (if armed) has fired.
        loop {
            {
                let mut st = self.st.borrow_mut();
                if st.out.is_empty() {
                    break;
                }
                if let Some(backoff) = st.backoff.as_mut() {
                    if Pin::new(backoff).poll(cx).is_pending() {
                        break;
                    }
                    st.backoff = None;
                }
            }
            let ready = match self.io.borrow().as_ref() {
                Some(io) => io.poll_write_ready(cx),
                None => return true,
            };
            if !matches!(ready, Poll::Ready(Ok(()))) {
                break;
            }
            if !self.write_some(wake, true) {
                return true;
            }
        }
        let st = self.st.borrow();
        st.closed || (!st.connected && st.idle())
    }
}

/// A `sendmsg` error that says the kernel is short of memory, for the data (`ENOBUFS`,
/// `ENOMEM`) or for fds in flight (`ETOOMANYREFS`: the sender's in-flight fds are over its
/// `RLIMIT_NOFILE` until the peer takes some), rather than that the peer is gone: worth another
/// try.
fn short_of_memory(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOBUFS | libc::ENOMEM | libc::ETOOMANYREFS)
    )
}

fn wake_all(wake: Vec<Waker>) {
    for w in wake {
        w.wake();
    }
}

#[cfg(test)]
mod tests;
