//! Lifecycle events of a cluster: delivered to subscribers and, optionally, appended to a
//! JSON-lines event log (one object per line, `t_ns` on `CLOCK_MONOTONIC`: nanoseconds since an
//! arbitrary point, the boot on Linux, not wall time).
//!
//! Invariants: emitting never fails the primary: a log write error is reported once and the log
//! is then off. The first line a primary writes to its log also has `unix_ns`, the wall clock
//! (`CLOCK_REALTIME`, nanoseconds since the Unix epoch) read just after its `t_ns`: the anchor
//! that turns every later `t_ns` of that primary into wall time (`unix_ns + t_ns - anchor's
//! t_ns`), the log being appended to by one primary after another.

use std::cell::{Cell, RefCell};
use std::fs::File;
use std::io::{self, Write};
use std::path::Path;
use std::time::SystemTime;

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

/// An event with the wall clock beside it: the log's first line from a primary.
#[derive(Serialize)]
struct Anchored<'a> {
    #[serde(flatten)]
    event: &'a Event,
    unix_ns: u64,
}

type Subscriber = Box<dyn Fn(&Event)>;

pub(super) struct Events {
    log: RefCell<Option<File>>,
    /// Whether a line has been written to `log` (the first carries `unix_ns`).
    anchored: Cell<bool>,
    subscribers: RefCell<Vec<Subscriber>>,
}

impl Events {
    pub fn open(path: Option<&Path>) -> io::Result<Events> {
        let log = path
            .map(|p| {
                File::options()
                    .create(true)
                    .append(true)
                    .open(p)
                    .map_err(|e| {
                        io::Error::new(
                            e.kind(),
                            format!("cannot open the event log {}: {e}", crate::fs::quote(p)),
                        )
                    })
            })
            .transpose()?;
        Ok(Events {
            log: RefCell::new(log),
            anchored: Cell::new(false),
            subscribers: RefCell::default(),
        })
    }

    pub fn subscribe(&self, f: Subscriber) {
        self.subscribers.borrow_mut().push(f);
    }

    pub fn emit(&self, event: Event) {
        let mut log = self.log.borrow_mut();
        if let Some(file) = log.as_mut() {
            let mut line = if self.anchored.replace(true) {
                serde_json::to_vec(&event)
            } else {
                let unix_ns = SystemTime::now()
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
                serde_json::to_vec(&Anchored {
                    event: &event,
                    unix_ns,
                })
            }
            .expect("events serialize");
            line.push(b'\n');
            if let Err(e) = file.write_all(&line) {
                tracing::error!(target: "nodus::cluster", "event log write failed, log off: {e}");
                *log = None;
            }
        }
        drop(log);
        for f in self.subscribers.borrow().iter() {
            f(&event);
        }
    }
}
