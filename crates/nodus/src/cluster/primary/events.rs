//! Lifecycle events of a cluster: delivered to subscribers and, optionally, appended to a
//! JSON-lines event log (one object per line, `t_ns` on `CLOCK_MONOTONIC`: nanoseconds since an
//! arbitrary point, the boot on Linux, not wall time).
//!
//! Invariants: emitting never fails the primary and never blocks its loop: a line is queued for
//! the log's writer thread (`log`: a bounded queue; lines that do not fit are dropped and
//! counted, a write that fails is counted and later lines tried again, and the log says what it
//! lost in a `log_gap` line). The first line a primary writes whole to its log also has
//! `unix_ns`, the wall clock (`CLOCK_REALTIME`, nanoseconds since the Unix epoch) read just after
//! its event's `t_ns` (the time the line was queued): the anchor that turns every later `t_ns` of
//! that primary into wall time (`unix_ns + t_ns - anchor's t_ns`), the log being appended to by
//! one primary after another. The file is opened once, `O_APPEND`, and never reopened (so
//! logrotate's `copytruncate` rotates it, a rename does not: no signal reopens it); when its
//! last byte is not `\n` (a line cut by a full disk, a killed writer), the primary's first line
//! starts with `\n`. At its end, [`Events::flush`] waits a bounded time for what is queued.

mod log;

use std::cell::RefCell;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

use serde::Serialize;

/// One event. `worker` is the slot id (`NODUS_WORKER_ID`), absent for cluster-wide events.
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    pub t_ns: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    #[serde(flatten)]
    pub kind: EventKind,
}

/// What happened.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum EventKind {
    /// A worker process was started (`generation` counts reloads).
    Fork {
        generation: u64,
    },
    /// The worker said `online`.
    Online,
    /// The worker listens on `address` (Node's `listening`).
    Listening {
        address: String,
    },
    /// The worker is ready for traffic.
    Ready,
    /// The worker was asked to drain (`disconnect` with a deadline, or the kill signal,
    /// `Config::kill_signal`, for a plain program).
    Drain,
    /// The worker's IPC channel closed (Node's `'disconnect'`).
    Disconnect,
    /// The worker said it is about to exit (a "going down" notice): no exit, no crash. A
    /// `permanent` worker that serves (ready and up `min_uptime`) is replaced now (a `restart`
    /// event follows); otherwise its exit decides.
    GoingDown,
    /// The worker exited. `exited_after_disconnect` is true iff the primary or the worker asked
    /// for the exit (a drain, a reload, `disconnect()`), whatever the exit status.
    Exit {
        code: Option<i32>,
        signal: Option<i32>,
        exited_after_disconnect: bool,
        reason: String,
        /// The processes left in its process group at its exit, SIGKILLed then (systemd's
        /// `KillMode=mixed`; 0 when the primary had SIGKILLed the group itself): a wrapper
        /// script's program that never got the kill signal, say.
        group_killed: usize,
    },
    /// A worker could not be started (fork or exec failed); it counts as a crash of its slot.
    SpawnFailed {
        error: String,
    },
    /// A replacement for the slot starts after `delay_ms`.
    Restart {
        delay_ms: u64,
    },
    /// An application message from the worker (`process.send()`): its size in bytes of JSON,
    /// and the JSON itself, which the serialized event (the event log's line) leaves out when it
    /// is longer than [`MESSAGE_LOG_MAX`], saying `"truncated": true` instead (subscribers get it
    /// whole).
    Message {
        bytes: usize,
        #[serde(skip_serializing_if = "too_long_to_log")]
        json: String,
        /// `bytes` is above [`MESSAGE_LOG_MAX`].
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        truncated: bool,
    },
    ReloadStart {
        generation: u64,
    },
    ReloadDone {
        generation: u64,
    },
    ReloadFailed {
        generation: u64,
        why: String,
    },
    /// The restart budget ran out: the primary stops everything and exits.
    GiveUp {
        why: String,
    },
    /// A graceful shutdown began.
    Shutdown {
        why: String,
    },
}

/// The longest application message whose JSON a serialized `message` event keeps (64 KiB): a
/// payload may hold what belongs in no log, and a worker sending megabytes would make the event
/// log as large; past it, the event has its size alone.
pub const MESSAGE_LOG_MAX: usize = 64 * 1024;

impl EventKind {
    /// The `message` event of an application message whose JSON is `json`.
    pub(super) fn message(json: &str) -> EventKind {
        EventKind::Message {
            bytes: json.len(),
            json: json.to_owned(),
            truncated: json.len() > MESSAGE_LOG_MAX,
        }
    }
}

/// Whether a message's JSON is left out of its serialized event ([`MESSAGE_LOG_MAX`]).
fn too_long_to_log(json: &str) -> bool {
    json.len() > MESSAGE_LOG_MAX
}

type Subscriber = Box<dyn Fn(&Event)>;

/// The most events kept for subscribers before `Primary::run` (a primary never run keeps no
/// more).
const EARLY_KEPT: usize = 1024;

pub(super) struct Events {
    log: Option<log::Log>,
    subscribers: RefCell<Vec<Subscriber>>,
    /// The events of `Primary::start` (the first workers' `fork`), which come before anyone can
    /// subscribe: each subscriber gets them first, until `Primary::run` begins (`started`).
    early: RefCell<Option<Vec<Event>>>,
}

impl Events {
    pub fn open(path: Option<&Path>) -> io::Result<Events> {
        let log = path
            .map(|p| {
                let file = File::options()
                    .create(true)
                    .append(true)
                    .open(p)
                    .map_err(|e| {
                        io::Error::new(
                            e.kind(),
                            format!("cannot open the event log {}: {e}", crate::fs::quote(p)),
                        )
                    })?;
                let at_line_start = ends_a_line(&file, p);
                log::Log::start(file, at_line_start).map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!("cannot start the event log's writer thread: {e}"),
                    )
                })
            })
            .transpose()?;
        Ok(Events {
            log,
            subscribers: RefCell::default(),
            early: RefCell::new(Some(Vec::new())),
        })
    }

    /// Adds a subscriber; before `Primary::run` began, it is first called with the events
    /// emitted so far.
    pub fn subscribe(&self, f: Subscriber) {
        // A copy: `f` may cause events of its own (a `stop_worker`), which `emit` records.
        let early = self.early.borrow().clone();
        early.iter().flatten().for_each(&f);
        self.subscribers.borrow_mut().push(f);
    }

    /// `Primary::run` began: later subscribers get only the events from then on.
    pub fn started(&self) {
        self.early.borrow_mut().take();
    }

    pub fn emit(&self, event: Event) {
        if let Some(log) = &self.log {
            log.push(log::Line {
                json: serde_json::to_vec(&event).expect("events serialize"),
                unix_ns: log::unix_now(),
                message: matches!(event.kind, EventKind::Message { .. }),
            });
        }
        if let Some(early) = &mut *self.early.borrow_mut()
            && early.len() < EARLY_KEPT
        {
            early.push(event.clone());
        }
        for f in self.subscribers.borrow().iter() {
            f(&event);
        }
    }

    /// Waits until the log's writer has written every line queued (or failed to), for `bound` at
    /// most (a stalled file is not waited for longer): one WARN line if it has not.
    pub async fn flush(&self, bound: Duration) {
        let Some(log) = &self.log else { return };
        let deadline = Instant::now() + bound;
        while !log.drained() {
            if Instant::now() >= deadline {
                tracing::warn!(
                    target: "nodus::cluster",
                    "the event log's file took no more: {} bytes of events not written",
                    log.queued()
                );
                return;
            }
            crate::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// Whether the regular file `file` (opened at `path`) is empty or ends with `\n`; true for what
/// is not a regular file or cannot be read.
fn ends_a_line(file: &File, path: &Path) -> bool {
    let len = match file.metadata() {
        Ok(m) if m.is_file() && m.len() > 0 => m.len(),
        _ => return true,
    };
    let mut last = [0];
    File::open(path)
        .and_then(|f| f.read_at(&mut last, len - 1))
        .map_or(true, |n| n == 0 || last[0] == b'\n')
}
