//! Lifecycle events of a cluster: delivered to subscribers and, optionally, appended to a
//! JSON-lines event log (one object per line, `t_ns` on `CLOCK_MONOTONIC`).
//!
//! Invariant: emitting never fails the primary: a log write error is reported once and the log
//! is then off.

use std::cell::RefCell;
use std::fs::File;
use std::io::{self, Write};
use std::path::Path;

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
    /// The worker was asked to drain (`disconnect` with a deadline, or SIGTERM for a plain
    /// program).
    Drain,
    /// The worker's IPC channel closed (Node's `'disconnect'`).
    Disconnect,
    /// The worker said it is about to exit; its replacement starts now.
    GoingDown,
    /// The worker exited. `exited_after_disconnect` is true iff the primary or the worker asked
    /// for the exit (a drain, a reload, `disconnect()`), whatever the exit status.
    Exit {
        code: Option<i32>,
        signal: Option<i32>,
        exited_after_disconnect: bool,
        reason: String,
    },
    /// A worker could not be started (fork or exec failed); it counts as a crash of its slot.
    SpawnFailed {
        error: String,
    },
    /// A replacement for the slot starts after `delay_ms`.
    Restart {
        delay_ms: u64,
    },
    /// An application message from the worker (its JSON).
    Message {
        json: String,
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

type Subscriber = Box<dyn Fn(&Event)>;

pub(super) struct Events {
    log: RefCell<Option<File>>,
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
            subscribers: RefCell::default(),
        })
    }

    pub fn subscribe(&self, f: Subscriber) {
        self.subscribers.borrow_mut().push(f);
    }

    pub fn emit(&self, event: Event) {
        let mut log = self.log.borrow_mut();
        if let Some(file) = log.as_mut() {
            let mut line = serde_json::to_vec(&event).expect("events serialize");
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
