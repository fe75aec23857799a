//! The event log's writer: the JSON lines of `--events FILE` written off the primary's loop.
//!
//! FILE may be a pipe whose reader stalls (`--events /dev/stdout` into a hung log shipper) or a
//! file on a hung mount, so a `write` to it may block for good; the loop must not. As with our own
//! stdout and stderr (`process::output`), the loop queues each line ([`Log::push`], a short
//! lock, never a `write`) for a thread of the log's own ("nodus-events"), which writes it with a
//! plain blocking `write`. The queue is bounded ([`QUEUE_LIMIT`], 1 MiB): a line that does not
//! fit is dropped and counted (a worker's own message, application traffic that may come in
//! floods, fits only in the queue's first half, so a flood of them never crowds out the
//! lifecycle events: [`Line::message`]) (one WARN line when dropping begins, again once the writer has
//! caught up and dropping begins anew), and the writer, when it reaches that point of the queue,
//! writes one `{"t_ns":...,"event":"log_gap","dropped":N,"failed":F}` line in its place.
//!
//! A write that fails (`ENOSPC`, `EIO`, a short write) does not turn the log off: the line is
//! counted as failed and every later line is tried again. The first failure is one ERROR line;
//! the first write that succeeds after it is a `log_gap` line with the count (`failed`), before
//! the next event, and one WARN line saying how many were lost. A line is written with one
//! `write` as far as the kernel allows; one cut short (part of it written) leaves the file
//! without a final `\n`, so the next write starts with `\n`: the cut line stays a line of its own
//! (invalid JSON, skipped by a reader), never glued to the next one. The same holds for what a
//! previous primary left: a file whose last byte is not `\n` gets `\n` before the first line.
//!
//! Invariants: [`Log::push`] never blocks on the file and the queue holds at most
//! [`QUEUE_LIMIT`] bytes of lines (dropped ones merged into one count at the queue's end); lines
//! are written in their order; the first line written whole carries `unix_ns` (the anchor: see
//! `events`), so the anchor is never a lost or cut line. When the log is dropped, its thread
//! writes what is queued and ends; one stalled for good dies with the process.

use std::collections::VecDeque;
use std::io::{self, Write};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::SystemTime;

use serde::Serialize;

/// The most bytes of lines queued for the writer (1 MiB: thousands of lifecycle events, or
/// sixteen of the largest `message` events); past it, lines are dropped and counted.
pub const QUEUE_LIMIT: usize = 1024 * 1024;

/// One event's line: its JSON object (no `\n`) and the wall clock read just after its `t_ns`,
/// added as `unix_ns` if it is the anchor.
pub struct Line {
    pub json: Vec<u8>,
    pub unix_ns: u64,
    /// A worker's own message (a `message` event): queued only while the queue is less than half
    /// full, the other half kept for the lifecycle events.
    pub message: bool,
}

enum Item {
    Line(Line),
    /// Lines dropped here for want of room.
    Dropped(u64),
}

#[derive(Default)]
struct Queue {
    items: VecDeque<Item>,
    /// Bytes of the queued lines and of the one being written.
    bytes: usize,
    /// The writer holds a line (or a drop count) it took off `items`.
    writing: bool,
    /// Dropping was said (a WARN line) and the writer has not reached the drops yet.
    drop_said: bool,
    closed: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    /// Notified when an item is queued or the log closes (the writer waits), and when the writer
    /// is done with an item (a flush polls `drained`).
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The queue of lines to the writer thread; dropping it lets the thread end once it has written
/// what is queued.
pub struct Log {
    shared: Arc<Shared>,
}

impl Log {
    /// Starts the writer thread on `out`; `at_line_start` is false when what `out` already holds
    /// does not end with `\n`.
    pub fn start<W: Write + Send + 'static>(out: W, at_line_start: bool) -> io::Result<Log> {
        // Before the first thread of nodus's (see `parent_env`).
        crate::parent_env::take();
        let shared = Arc::new(Shared {
            queue: Mutex::default(),
            changed: Condvar::new(),
        });
        let thread_shared = shared.clone();
        let writer = Writer::new(out, at_line_start);
        std::thread::Builder::new()
            .name("nodus-events".to_owned())
            .spawn(move || write_loop(&thread_shared, writer))?;
        Ok(Log { shared })
    }

    /// Queues `line`, or drops and counts it if the queue is full (one WARN line when dropping
    /// begins).
    pub fn push(&self, line: Line) {
        let mut q = self.shared.lock();
        let limit = if line.message {
            QUEUE_LIMIT / 2
        } else {
            QUEUE_LIMIT
        };
        if q.bytes + line.json.len() + 1 > limit {
            match q.items.back_mut() {
                Some(Item::Dropped(n)) => *n += 1,
                _ => q.items.push_back(Item::Dropped(1)),
            }
            if !std::mem::replace(&mut q.drop_said, true) {
                let queued = q.bytes;
                drop(q);
                tracing::warn!(
                    target: "nodus::cluster",
                    "the event log's writer is {queued} bytes behind (its file takes no more, \
                     or workers' messages came faster than it writes): events are dropped and \
                     counted until it catches up (workers' messages first: they may fill only \
                     half of its queue)"
                );
                return;
            }
        } else {
            q.bytes += line.json.len() + 1;
            q.items.push_back(Item::Line(line));
        }
        drop(q);
        self.shared.changed.notify_all();
    }

    /// Whether every line queued so far has been written (or has failed).
    pub fn drained(&self) -> bool {
        let q = self.shared.lock();
        q.items.is_empty() && !q.writing
    }

    /// Bytes of lines not written yet.
    pub fn queued(&self) -> usize {
        self.shared.lock().bytes
    }
}

impl Drop for Log {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.changed.notify_all();
    }
}

fn write_loop<W: Write>(shared: &Shared, mut writer: Writer<W>) {
    let mut q = shared.lock();
    loop {
        let Some(item) = q.items.pop_front() else {
            if q.closed {
                return;
            }
            q = shared.changed.wait(q).unwrap_or_else(|e| e.into_inner());
            continue;
        };
        q.writing = true;
        drop(q);
        let bytes = match &item {
            Item::Line(line) => {
                writer.line(line);
                line.json.len() + 1
            }
            Item::Dropped(n) => {
                writer.dropped(*n);
                0
            }
        };
        q = shared.lock();
        q.bytes -= bytes;
        q.writing = false;
        if matches!(item, Item::Dropped(_)) {
            q.drop_said = false;
        }
        shared.changed.notify_all();
    }
}

/// The line written in place of lines lost: `dropped` for want of room in the queue, `failed`
/// by writes that failed.
#[derive(Serialize)]
struct Gap {
    t_ns: u64,
    event: &'static str,
    dropped: u64,
    failed: u64,
}

/// Writes lines to `out`, counting what is lost (see the module docs).
struct Writer<W> {
    out: W,
    /// What `out` holds ends with `\n` (or is empty).
    at_line_start: bool,
    /// A line carrying `unix_ns` has been written whole.
    anchored: bool,
    /// Writes fail: the ERROR line was said, the WARN line is due at the next success.
    failing: bool,
    /// Lines lost (`dropped`, `failed`) and not yet said by a `log_gap` line.
    dropped: u64,
    failed: u64,
}

impl<W: Write> Writer<W> {
    fn new(out: W, at_line_start: bool) -> Writer<W> {
        Writer {
            out,
            at_line_start,
            anchored: false,
            failing: false,
            dropped: 0,
            failed: 0,
        }
    }

    /// Writes an event's line, after the `log_gap` line that is due, if any.
    fn line(&mut self, line: &Line) {
        if (self.failed > 0 || self.dropped > 0) && self.gap().is_err() {
            self.failed += 1;
            return;
        }
        match self.put(&line.json, line.unix_ns) {
            Ok(()) => self.resumed(),
            Err(e) => {
                self.failed += 1;
                self.fail(&e);
            }
        }
    }

    /// `n` lines were dropped here: says so now.
    fn dropped(&mut self, n: u64) {
        self.dropped += n;
        let _ = self.gap();
    }

    /// Writes the `log_gap` line with the counts, which start again from 0 once it is written.
    fn gap(&mut self) -> io::Result<()> {
        let unix_ns = unix_now();
        let gap = Gap {
            t_ns: crate::clock::now_ns(),
            event: "log_gap",
            dropped: self.dropped,
            failed: self.failed,
        };
        let json = serde_json::to_vec(&gap).expect("a gap serializes");
        match self.put(&json, unix_ns) {
            Ok(()) => {
                self.resumed();
                self.dropped = 0;
                self.failed = 0;
                Ok(())
            }
            Err(e) => {
                self.fail(&e);
                Err(e)
            }
        }
    }

    fn fail(&mut self, e: &io::Error) {
        if !std::mem::replace(&mut self.failing, true) {
            tracing::error!(
                target: "nodus::cluster",
                "event log write failed: {e}; the events lost are counted and later ones \
                 written once writes succeed again"
            );
        }
    }

    fn resumed(&mut self) {
        if std::mem::replace(&mut self.failing, false) {
            tracing::warn!(
                target: "nodus::cluster",
                "event log writes succeed again; {} events were lost (a log_gap line says so)",
                self.failed
            );
        }
    }

    /// Writes `json` as one line (with `unix_ns` if it is the anchor), after a `\n` if the file
    /// does not end with one.
    fn put(&mut self, json: &[u8], unix_ns: u64) -> io::Result<()> {
        let mut buf = Vec::with_capacity(json.len() + 32);
        if !self.at_line_start {
            buf.push(b'\n');
        }
        let anchor = !self.anchored;
        match json.split_last() {
            Some((b'}', fields)) if anchor => {
                buf.extend_from_slice(fields);
                buf.extend_from_slice(format!(",\"unix_ns\":{unix_ns}}}").as_bytes());
            }
            _ => buf.extend_from_slice(json),
        }
        buf.push(b'\n');
        let mut done = 0;
        let result = loop {
            if done == buf.len() {
                break Ok(());
            }
            match self.out.write(&buf[done..]) {
                Ok(0) => break Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => break Err(e),
            }
        };
        if done > 0 {
            self.at_line_start = buf[done - 1] == b'\n';
        }
        if result.is_ok() && anchor {
            self.anchored = true;
        }
        result
    }
}

/// The wall clock, in nanoseconds since the Unix epoch.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::{Line, Log, QUEUE_LIMIT, Writer};
    use std::io::{self, Write};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    /// A file that takes `room` more bytes, then fails with `ENOSPC` (a full disk), until given
    /// more room.
    struct Disk {
        data: Vec<u8>,
        room: usize,
    }

    impl Write for Disk {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if self.room == 0 {
                return Err(io::Error::from_raw_os_error(libc::ENOSPC));
            }
            let n = buf.len().min(self.room);
            self.room -= n;
            self.data.extend_from_slice(&buf[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn line(n: u32) -> Line {
        Line {
            json: format!("{{\"t_ns\":{n},\"event\":\"ready\"}}").into_bytes(),
            unix_ns: 7,
            message: false,
        }
    }

    fn lines(w: &Writer<Disk>) -> Vec<String> {
        String::from_utf8(w.out.data.clone())
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn a_full_disk_costs_the_lines_it_refuses_and_writes_resume_after_a_gap_line() {
        let mut w = Writer::new(
            Disk {
                data: Vec::new(),
                room: 1000,
            },
            true,
        );
        w.line(&line(1));
        // Room for part of the next line only: it is cut, the one after it refused.
        w.out.room = 5;
        w.line(&line(2));
        w.line(&line(3));
        assert_eq!(w.failed, 2);
        // Space again: the cut line ends where it was cut, a gap line says what was lost.
        w.out.room = 1000;
        w.line(&line(4));
        let got = lines(&w);
        assert_eq!(got[0], "{\"t_ns\":1,\"event\":\"ready\",\"unix_ns\":7}");
        assert_eq!(got[1], "{\"t_n");
        let gap: serde_json::Value = serde_json::from_str(&got[2]).unwrap();
        assert_eq!(gap["event"], "log_gap");
        assert_eq!(gap["failed"], 2);
        assert_eq!(gap["dropped"], 0);
        assert_eq!(got[3], "{\"t_ns\":4,\"event\":\"ready\"}");
        assert_eq!(got.len(), 4);
        assert_eq!(w.failed, 0);
        assert!(!w.failing);
    }

    #[test]
    fn the_anchor_is_the_first_line_written_whole_and_a_file_left_cut_gets_a_newline_first() {
        let mut w = Writer::new(
            Disk {
                data: b"{\"cut".to_vec(),
                room: 0,
            },
            false,
        );
        w.line(&line(1));
        w.out.room = 1000;
        w.line(&line(2));
        w.line(&line(3));
        let got = lines(&w);
        assert_eq!(got[0], "{\"cut");
        let gap: serde_json::Value = serde_json::from_str(&got[1]).unwrap();
        assert_eq!(
            (gap["event"].as_str(), gap["failed"].as_u64()),
            (Some("log_gap"), Some(1))
        );
        assert!(
            gap["unix_ns"].is_u64(),
            "the first line written is the anchor: {gap}"
        );
        assert_eq!(got[2], "{\"t_ns\":2,\"event\":\"ready\"}");
        assert_eq!(got[3], "{\"t_ns\":3,\"event\":\"ready\"}");
    }

    /// A pipe whose reader stalls until `open` is set: what it took so far.
    #[derive(Clone, Default)]
    struct Gated {
        open: Arc<AtomicBool>,
        data: Arc<Mutex<Vec<u8>>>,
    }

    impl Write for Gated {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            while !self.open.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(5));
            }
            self.data.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn push_never_waits_for_a_stalled_file_and_drops_past_the_limit_then_says_how_many() {
        let pipe = Gated::default();
        let log = Log::start(pipe.clone(), true).unwrap();
        let line = |n: usize| Line {
            json: format!("{{\"t_ns\":{n},\"pad\":\"{}\"}}", "x".repeat(1000)).into_bytes(),
            unix_ns: 7,
            message: false,
        };
        // Twice the queue's room, while the writer is stuck on the first line.
        let pushed = 2 * QUEUE_LIMIT / 1000;
        for n in 0..pushed {
            log.push(line(n));
        }
        assert!(log.queued() <= QUEUE_LIMIT);
        assert!(!log.drained());
        pipe.open.store(true, Ordering::Release);
        let drained = || {
            let deadline = Instant::now() + Duration::from_secs(20);
            while !log.drained() {
                assert!(Instant::now() < deadline, "never drained");
                std::thread::sleep(Duration::from_millis(5));
            }
        };
        drained();
        log.push(line(pushed));
        drained();
        let data = pipe.data.lock().unwrap().clone();
        let got: Vec<serde_json::Value> = String::from_utf8(data)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let gap = got.iter().position(|v| v["event"] == "log_gap").unwrap();
        let dropped = got[gap]["dropped"].as_u64().unwrap() as usize;
        assert_eq!(got.len() - 1 + dropped, pushed + 1);
        // The gap stands where the lines were dropped: after every line queued, before the line
        // pushed once the writer caught up.
        assert_eq!(got[gap - 1]["t_ns"], gap - 1);
        assert_eq!(got[gap + 1]["t_ns"], pushed);
        assert_eq!(got.last().unwrap()["t_ns"], pushed);
    }

    /// A flood of workers' messages fills half the queue at most: the lifecycle events after it
    /// still fit, and are written, while messages past the half are dropped and counted.
    #[test]
    fn a_flood_of_workers_messages_never_crowds_out_the_lifecycle_events() {
        let pipe = Gated::default();
        let log = Log::start(pipe.clone(), true).unwrap();
        let line = |n: usize, message: bool| Line {
            json: format!("{{\"t_ns\":{n},\"pad\":\"{}\"}}", "x".repeat(1000)).into_bytes(),
            unix_ns: 7,
            message,
        };
        let messages = QUEUE_LIMIT / 1000;
        for n in 0..messages {
            log.push(line(n, true));
        }
        assert!(log.queued() <= QUEUE_LIMIT / 2 + 1100);
        let lifecycle = 100;
        for n in messages..messages + lifecycle {
            log.push(line(n, false));
        }
        pipe.open.store(true, Ordering::Release);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !log.drained() {
            assert!(Instant::now() < deadline, "never drained");
            std::thread::sleep(Duration::from_millis(5));
        }
        let data = pipe.data.lock().unwrap().clone();
        let written: Vec<u64> = String::from_utf8(data)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter(|v| v["event"] != "log_gap")
            .map(|v| v["t_ns"].as_u64().unwrap())
            .collect();
        let kept = written
            .iter()
            .filter(|&&n| (n as usize) >= messages)
            .count();
        assert_eq!(kept, lifecycle, "every lifecycle event written");
        assert!(written.len() < messages, "messages past the half dropped");
    }

    #[test]
    fn dropped_lines_are_said_where_they_were_dropped() {
        let mut w = Writer::new(
            Disk {
                data: Vec::new(),
                room: 1000,
            },
            true,
        );
        w.line(&line(1));
        w.dropped(3);
        w.line(&line(2));
        let got = lines(&w);
        let gap: serde_json::Value = serde_json::from_str(&got[1]).unwrap();
        assert_eq!(
            (gap["dropped"].as_u64(), gap["failed"].as_u64()),
            (Some(3), Some(0))
        );
        assert_eq!(got[2], "{\"t_ns\":2,\"event\":\"ready\"}");
    }
}
