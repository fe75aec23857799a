//! A worker's captured stdout and stderr as the primary sees them: the tasks copying them to the
//! primary's own (`crate::process::output`), and what the reads of their pipes tell about the
//! worker.
//!
//! Invariants:
//! - Each pipe is read through a [`Watched`] reader, which records on the loop whether its last
//!   read is waiting (the pipe was empty), when a read last found the pipe full (it took the
//!   pipe's whole capacity, or a whole read buffer) and end of file. A pipe whose read is not
//!   waiting holds data the primary has not copied yet (or its task waits for room in the
//!   sink, the worker's writes held back meanwhile).
//! - [`Captured::backlog`] is what the early kill signal of a Node worker's stop waits out
//!   (`conns::until_idle`): the worker may hold output it could not write yet (a Node stream's
//!   queue, a logger retrying on a timer) while a pipe of its is not waiting, or was full within
//!   [`BACKLOG_QUIET`]. A worker that writes a line now and then, into a pipe the primary keeps
//!   empty, has none.
//! - The tasks are waited for at the worker's exit, [`OUTPUT_EOF_WAIT`] at most, so its exit line
//!   follows its last lines ([`Captured::ended`]); those still running then are kept in
//!   `State::output_left` and waited for again when the run ends ([`drain_left`]), before `run`
//!   returns, so the primary exits having read every worker's pipes to end of file and handed
//!   all of it to its own output: unless a pipe stays open and empty that long (a process that
//!   left the worker's group holds it, silent), or the bound passes (the stop's own: what a slow
//!   reader of the primary's output still has not taken is then the exit flush's to drop, with
//!   a notice).

use std::cell::{Cell, RefCell};
use std::future::{Future, poll_fn};
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use super::State;
use crate::JoinHandle;
use crate::process::Child;
use crate::process::output::{Sink, prefix_lines, raw_lines};

/// How long a worker's exit line waits for its output pipes to reach end of file once it exited;
/// at the end of the run, how long a pipe may stay open and empty before the primary stops
/// waiting for its end of file: a grandchild that inherited it and left the worker's process
/// group (`setsid`), so was not killed with it, can keep it open for good (its output is still
/// copied while the primary runs).
pub(super) const OUTPUT_EOF_WAIT: Duration = Duration::from_millis(200);

/// How long after its pipe was last full a worker may still hold output it could not write
/// ([`Captured::backlog`]): more than the retry timer of a logger that waits when the pipe is
/// full (pino's sonic-boom retries every 100 ms), so the retry comes within it.
const BACKLOG_QUIET: Duration = Duration::from_millis(250);

/// How often the end of the run looks at the pipes still being read ([`drain_left`]).
const DRAIN_LOOK: Duration = Duration::from_millis(20);

/// What the reads of one pipe said.
struct PipeWatch {
    /// Since when its read waits for data (the pipe is empty); `None` while a read returns data
    /// or the task is busy with what it read.
    waiting_since: Cell<Option<Instant>>,
    /// When a read last took all the pipe held, the pipe full.
    full_at: Cell<Option<Instant>>,
    eof: Cell<bool>,
    /// A read of this many bytes found the pipe full: its capacity (or the read buffer, if
    /// less).
    full: usize,
}

impl PipeWatch {
    /// A pipe's watch before its first read: not waiting, never full, not at end of file.
    fn new(full: usize) -> PipeWatch {
        PipeWatch {
            waiting_since: Cell::new(None),
            full_at: Cell::new(None),
            eof: Cell::new(false),
            full,
        }
    }
}

/// A pipe's reader that tells its [`PipeWatch`] what each read found.
struct Watched<R> {
    inner: R,
    watch: Rc<PipeWatch>,
}

impl<R: futures_io::AsyncRead + Unpin> futures_io::AsyncRead for Watched<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        let watch = &this.watch;
        match &polled {
            Poll::Pending => {
                if watch.waiting_since.get().is_none() {
                    watch.waiting_since.set(Some(Instant::now()));
                }
            }
            Poll::Ready(read) => {
                watch.waiting_since.set(None);
                match read {
                    Ok(0) => watch.eof.set(true),
                    Ok(n) if *n >= watch.full.min(buf.len()) => {
                        watch.full_at.set(Some(Instant::now()));
                    }
                    Ok(_) | Err(_) => {}
                }
            }
        }
        polled
    }
}

/// One captured pipe: what its reads said, and the task copying it until it has ended.
struct Pipe {
    watch: Rc<PipeWatch>,
    task: RefCell<Option<JoinHandle<io::Result<()>>>>,
}

impl Pipe {
    /// Starts copying the pipe `source` to `sink`, each line behind `prefix` (as it is with
    /// `raw`).
    fn copy<R>(source: R, prefix: &str, raw: bool, sink: Sink) -> Pipe
    where
        R: futures_io::AsyncRead + std::os::fd::AsFd + Unpin + 'static,
    {
        let watch = Rc::new(PipeWatch::new(capacity(&source)));
        let source = Watched {
            inner: source,
            watch: watch.clone(),
        };
        let task = match raw {
            true => raw_lines(source, prefix.to_owned(), sink),
            false => prefix_lines(source, prefix.to_owned(), sink),
        };
        Pipe {
            watch,
            task: RefCell::new(Some(task)),
        }
    }
}

/// A worker's captured stdout and stderr (none when they are inherited).
#[derive(Default)]
pub(super) struct Captured {
    pipes: Vec<Pipe>,
}

impl Captured {
    /// Starts copying `child`'s stdout and stderr pipes (each line behind `prefix`, or as it is
    /// with `raw`) to the primary's own.
    pub fn start(child: &mut Child, prefix: &str, raw: bool) -> Captured {
        let mut pipes = Vec::new();
        if let Some(out) = child.stdout.take() {
            pipes.push(Pipe::copy(out, prefix, raw, Sink::Stdout));
        }
        if let Some(err) = child.stderr.take() {
            pipes.push(Pipe::copy(err, prefix, raw, Sink::Stderr));
        }
        Captured { pipes }
    }

    /// Whether the worker may still hold output it could not write: a pipe of its not at end of
    /// file whose read is not waiting (data there not copied yet, or the copy held back by the
    /// sink), or that was full within [`BACKLOG_QUIET`].
    pub fn backlog(&self) -> bool {
        self.pipes.iter().any(|p| {
            let w = &p.watch;
            !w.eof.get()
                && (w.waiting_since.get().is_none()
                    || w.full_at.get().is_some_and(|t| t.elapsed() < BACKLOG_QUIET))
        })
    }

    /// Waits, at most `within`, until every pipe reached end of file and what was read from it
    /// was written out (or dropped: see `crate::process::output`); whether they all did. The
    /// copying goes on past `within`.
    pub async fn ended(&self, within: Duration) -> bool {
        crate::time::timeout(within, poll_fn(|cx| self.poll_ended(cx)))
            .await
            .is_ok()
    }

    fn poll_ended(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut running = false;
        for pipe in &self.pipes {
            let mut task = pipe.task.borrow_mut();
            if let Some(t) = task.as_mut() {
                match Pin::new(t).poll(cx) {
                    Poll::Ready(_) => *task = None,
                    Poll::Pending => running = true,
                }
            }
        }
        if running {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    }

    /// Whether a pipe is still being copied.
    fn running(&self) -> bool {
        self.pipes.iter().any(|p| {
            let mut task = p.task.borrow_mut();
            if task.as_ref().is_some_and(|t| t.is_finished()) {
                *task = None;
            }
            task.is_some()
        })
    }

    /// Whether every pipe still being copied has been open and empty for [`OUTPUT_EOF_WAIT`]:
    /// its task waits for data nothing writes (a process that left the worker's group holds the
    /// pipe).
    fn silent(&self) -> bool {
        self.pipes
            .iter()
            .filter(|p| p.task.borrow().is_some())
            .all(|p| {
                p.watch
                    .waiting_since
                    .get()
                    .is_some_and(|t| t.elapsed() >= OUTPUT_EOF_WAIT)
            })
    }
}

/// The capacity of the pipe `fd` (64 KiB by default; less for a user past
/// `pipe-user-pages-soft`), or `usize::MAX` if it cannot be read (a full read is then one that
/// fills the reader's buffer).
fn capacity(fd: &impl std::os::fd::AsFd) -> usize {
    rustix::pipe::fcntl_getpipe_size(fd).unwrap_or(usize::MAX)
}

/// At the end of the run: waits until the output of every worker whose pipes were still being
/// copied at its exit has been (see the module doc), or is silent, or the workers' part of the
/// stop's bound passed: the shutdown delay and the kill timeout from the stop's start (at least
/// [`OUTPUT_EOF_WAIT`] from now: the stop of what they left behind may have taken that and
/// more); the kill timeout from now when the run ends with no stop (no worker left to run). The
/// exit's flush of what is queued then has what is left of a caller's stop bound past that
/// (`nodus run`'s and `nodus serve`'s keep 3 s for it).
pub(super) async fn drain_left(st: &State) {
    let mut left = std::mem::take(&mut *st.output_left.borrow_mut());
    left.retain(|c| c.running());
    if left.is_empty() {
        return;
    }
    let now = Instant::now();
    let kill = st.config.kill_timeout;
    let deadline = match st.stop_began.get() {
        Some(began) => (began + st.config.shutdown_delay + kill).max(now + OUTPUT_EOF_WAIT),
        None => now + kill,
    };
    loop {
        left.retain(|c| c.running() && !c.silent());
        if left.is_empty() || Instant::now() >= deadline {
            return;
        }
        crate::time::sleep(DRAIN_LOOK).await;
    }
}

/// Keeps `captured` for [`drain_left`] if it is still being copied (dropping the ones done).
pub(super) fn keep_if_running(st: &State, captured: Rc<Captured>) {
    let mut left = st.output_left.borrow_mut();
    left.retain(|c| c.running());
    if captured.running() {
        left.push(captured);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader returning `reads` one after another (`None`: not ready), then end of file.
    struct Script(Vec<Option<usize>>);

    impl futures_io::AsyncRead for Script {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
            _buf: &mut [u8],
        ) -> Poll<io::Result<usize>> {
            match self.0.is_empty() {
                true => Poll::Ready(Ok(0)),
                false => match self.0.remove(0) {
                    Some(n) => Poll::Ready(Ok(n)),
                    None => Poll::Pending,
                },
            }
        }
    }

    fn captured(watch: &Rc<PipeWatch>) -> Captured {
        Captured {
            pipes: vec![Pipe {
                watch: watch.clone(),
                task: RefCell::new(None),
            }],
        }
    }

    #[test]
    fn a_pipe_is_backlogged_while_it_is_read_or_was_full_lately() {
        let watch = Rc::new(PipeWatch::new(4096));
        let c = captured(&watch);
        let mut reader = Watched {
            inner: Script(vec![Some(100), None, Some(4096), None, None]),
            watch: watch.clone(),
        };
        let mut buf = vec![0u8; 64 * 1024];
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        let mut read =
            || futures_io::AsyncRead::poll_read(Pin::new(&mut reader), &mut cx, &mut buf);
        // Never read yet, then a short read: data may be coming.
        assert!(c.backlog());
        assert!(read().is_ready());
        assert!(c.backlog());
        // Waiting on an empty pipe, never full: nothing held back.
        assert!(read().is_pending());
        assert!(!c.backlog());
        // A read that took the pipe's capacity: full a moment ago, so still held back while the
        // read waits, until BACKLOG_QUIET has passed.
        assert!(read().is_ready());
        assert!(read().is_pending());
        assert!(c.backlog());
        watch.full_at.set(Some(
            Instant::now() - BACKLOG_QUIET - Duration::from_millis(1),
        ));
        assert!(read().is_pending());
        assert!(!c.backlog());
        // End of file: nothing more can come.
        watch.full_at.set(Some(Instant::now()));
        assert!(matches!(read(), Poll::Ready(Ok(0))));
        assert!(watch.eof.get());
        assert!(!c.backlog());
    }

    #[test]
    fn a_pipe_open_and_empty_long_enough_is_silent() {
        let watch = Rc::new(PipeWatch::new(4096));
        let c = captured(&watch);
        // No task running: silent (nothing to wait for).
        assert!(c.silent());
        crate::Runtime::new().block_on(async {
            let c = Captured {
                pipes: vec![Pipe {
                    watch: watch.clone(),
                    task: RefCell::new(Some(crate::spawn(std::future::pending()))),
                }],
            };
            assert!(c.running());
            assert!(!c.silent(), "a read that returned data last");
            watch.waiting_since.set(Some(Instant::now()));
            assert!(!c.silent(), "empty for less than OUTPUT_EOF_WAIT");
            watch
                .waiting_since
                .set(Some(Instant::now() - OUTPUT_EOF_WAIT));
            assert!(c.silent());
        });
    }
}
