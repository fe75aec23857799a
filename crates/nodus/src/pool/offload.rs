//! `Offload`: the future of one piece of pool work, and the job the worker runs.
//!
//! One allocation per offload: an `Arc<Job<F, T>>` seen by the queue as `dyn Run` and by the
//! future as `dyn Completion<T>`. Its state sits behind a mutex that is never held while user
//! code runs: the worker takes the closure out, runs it unlocked inside `catch_unwind`, then
//! stores the output and takes the waker under the lock, and wakes after releasing it.
//!
//! Invariants:
//! - Dropping the future before a worker takes the closure drops the closure unrun (on the
//!   dropping thread) and the worker skips the job; dropping it later discards the output.
//! - Whoever takes the closure out of the state, under its mutex, takes the job off the pool's
//!   queued count: the worker that starts it, or the dropped future that cancels it (and marks
//!   it, so a worker discards it unopened). Exactly one of them does, once.
//! - The loop's `requests` count holds one unit per live, unfinished `Offload` created on that
//!   loop: taken at submit, given back when the future returns `Ready` or is dropped. The unit
//!   ([`Request`]) is `!Send`, so it is dropped on its loop's thread, and gives the unit back to
//!   its own loop at once wherever it is dropped: with that loop current or not, or another
//!   `Runtime` current (`rt::context::with_loop`); once the loop's `Runtime` is dropped there is
//!   nothing to give back.
//! - A job detached with [`Offload::detach_then`] keeps its unit until it ends (libuv's active
//!   request): the unit becomes a [`SendRequest`], which the worker drops after running `done`,
//!   and which gives it back on its loop (posted there: `rt::context::on_loop`). A plain
//!   [`Offload::detach`] gives the unit back at once.

use std::any::Any;
use std::future::Future;
use std::marker::PhantomData;
use std::panic::{AssertUnwindSafe, Location, catch_unwind};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use super::OffloadError;
use super::worker::Inner;
use crate::rt::context::{on_loop, try_with_core, with_loop};
use crate::rt::core::{Core, Remote, Shared};

/// What the queue sees of a job.
pub(crate) trait Run: Send + Sync {
    /// When it was submitted (`clock::now_ns`).
    fn queued_at(&self) -> u64;
    /// Its future was dropped before the work started: it is off the queued count already and
    /// never runs.
    fn cancelled(&self) -> bool;
    /// Runs the work unless it was cancelled; returns, if it ran, the waker of the task waiting
    /// for it, for the worker to pass to `wake` once it has recorded its measurements (so an
    /// awaiting task sees the job counted).
    fn run(&self) -> Option<Option<Waker>>;
    /// Wakes the awaiting task: through its loop's remote queue when it was submitted on a
    /// loop, so that the task runs in the poll phase.
    fn wake(&self, waker: Waker);
}

/// What the future sees of a job.
trait Completion<T>: Send + Sync {
    fn poll_output(&self, cx: &mut Context<'_>) -> Poll<Result<T, OffloadError>>;
    /// The future is gone: skip the work if not started, drop the output.
    fn cancel(&self);
    /// The future is gone but the work should still run.
    fn detach(&self);
    /// The future is gone, the work should still run, and `done` gets its output: here if it
    /// has one already, else on the worker once it ends.
    fn detach_then(&self, done: Done<T>);
}

/// What a job detached with [`Offload::detach_then`] does with its output.
type Done<T> = Box<dyn FnOnce(Result<T, OffloadError>) + Send>;

struct State<F, T> {
    work: Option<F>,
    output: Option<Result<T, OffloadError>>,
    waker: Option<Waker>,
    /// Nobody will take the output.
    abandoned: bool,
    /// Detached with [`Offload::detach_then`]: takes the output on the worker.
    done: Option<Done<T>>,
}

struct Job<F, T> {
    state: Mutex<State<F, T>>,
    queued_at: u64,
    /// Set once the future took the unstarted work back (`cancel`).
    cancelled: AtomicBool,
    /// The pool it was submitted to, whose queued count it is in until started or cancelled.
    pool: Arc<Inner>,
    /// The loop it was submitted on.
    home: Option<Arc<Shared>>,
}

impl<F, T> Job<F, T> {
    fn lock(&self) -> MutexGuard<'_, State<F, T>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    payload
        .downcast_ref::<&'static str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "<non-string panic payload>".to_owned())
}

impl<F, T> Run for Job<F, T>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    fn queued_at(&self) -> u64 {
        self.queued_at
    }

    fn cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Acquire)
    }

    fn run(&self) -> Option<Option<Waker>> {
        // None: cancelled, and off the queued count already.
        let work = self.lock().work.take()?;
        self.pool.started();
        let output = catch_unwind(AssertUnwindSafe(work)).map_err(|payload| {
            self.pool.panicked();
            let msg = panic_message(&*payload);
            // Dropping a payload can itself panic; keep that off the worker.
            let _ = catch_unwind(AssertUnwindSafe(move || drop(payload)));
            OffloadError::Panicked(msg)
        });
        let mut state = self.lock();
        if let Some(done) = state.done.take() {
            drop(state);
            // User code, as the job is: a panic in it must not take the worker down.
            let _ = catch_unwind(AssertUnwindSafe(move || done(output)));
            return Some(None);
        }
        if state.abandoned {
            drop(state);
            // The output's destructor is user code: it must not take the worker down either.
            let _ = catch_unwind(AssertUnwindSafe(move || drop(output)));
            return Some(None);
        }
        state.output = Some(output);
        Some(state.waker.take())
    }

    fn wake(&self, waker: Waker) {
        // A wake from this thread would reach the loop's remote queue too, but if it lands while
        // the loop is still polling the task, the loop takes it for a self-wake and runs the
        // task in the check phase. A posted callback wakes it on the loop, in the poll phase.
        let Some(home) = &self.home else {
            return waker.wake();
        };
        let posted = home.push_remote(Remote::Callback(
            Box::new(move || waker.wake()),
            std::panic::Location::caller(),
        ));
        if let Err(Remote::Callback(wake, _)) = posted {
            wake();
        }
    }
}

impl<F, T> Completion<T> for Job<F, T>
where
    F: Send,
    T: Send,
{
    fn poll_output(&self, cx: &mut Context<'_>) -> Poll<Result<T, OffloadError>> {
        let mut state = self.lock();
        if let Some(out) = state.output.take() {
            return Poll::Ready(out);
        }
        match &mut state.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            slot => *slot = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    fn cancel(&self) {
        let mut state = self.lock();
        state.abandoned = true;
        let work = state.work.take();
        let output = state.output.take();
        let waker = state.waker.take();
        drop(state);
        if work.is_some() {
            // Not started: off the queue now (`uv_cancel`), not when a worker reaches it.
            self.cancelled.store(true, Ordering::Release);
            self.pool.cancelled();
        }
        drop((work, output, waker));
    }

    fn detach(&self) {
        let mut state = self.lock();
        state.abandoned = true;
        let output = state.output.take();
        let waker = state.waker.take();
        drop(state);
        drop((output, waker));
    }

    fn detach_then(&self, done: Done<T>) {
        let mut state = self.lock();
        let waker = state.waker.take();
        match state.output.take() {
            Some(output) => {
                state.abandoned = true;
                drop(state);
                done(output);
            }
            None => {
                state.done = Some(done);
                drop(state);
            }
        }
        drop(waker);
    }
}

/// One unit of a loop's in-flight `requests` (what keeps `run` going), given back to that loop
/// when dropped, wherever (see the module invariants). Also the unit of an awaited flush of a
/// child's output (`process::output`).
pub(crate) struct Request {
    loop_id: u64,
    // Dropped on the thread that created it (see the module invariants).
    _not_send: PhantomData<*const ()>,
}

impl Core {
    pub(crate) fn begin_request(&self) {
        self.requests.set(self.requests.get() + 1);
    }

    pub(crate) fn end_request(&self) {
        self.requests.set(self.requests.get() - 1);
    }
}

impl Request {
    /// A unit of the current loop's requests, if a loop is current.
    pub(crate) fn begin() -> Option<Request> {
        try_with_core(|core| core.request())
    }
}

impl Core {
    /// Takes a unit of this loop's requests.
    pub(crate) fn request(&self) -> Request {
        self.begin_request();
        Request {
            loop_id: self.loop_id(),
            _not_send: PhantomData,
        }
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        with_loop(self.loop_id, |core| core.end_request());
    }
}

impl Request {
    /// The same unit, as one that may be dropped on any thread.
    fn into_send(self) -> SendRequest {
        let unit = SendRequest {
            loop_id: self.loop_id,
        };
        std::mem::forget(self);
        unit
    }
}

/// A unit of a loop's requests held by a detached job (see the module invariants): dropped on a
/// worker, it is given back on its loop, posted there; on the loop's own thread, at once.
struct SendRequest {
    loop_id: u64,
}

impl Drop for SendRequest {
    fn drop(&mut self) {
        on_loop(self.loop_id, Location::caller(), |core| core.end_request());
    }
}

enum Slot<T> {
    Queued(Arc<dyn Completion<T>>),
    Failed(OffloadError),
    Done,
}

/// The result of work running on a pool: resolves to the closure's return value, or to an
/// [`OffloadError`] if it panicked, the queue was full or the pool could not start.
///
/// Dropping it before the work started means the work never runs; dropping it later discards
/// the result. It is `!Send`: it belongs to the loop that created it, which it keeps alive
/// until it completes or is dropped. [`Offload::detach`] lets the work run with nobody waiting.
#[must_use = "pool work whose future is dropped before it starts never runs"]
pub struct Offload<T> {
    inner: Slot<T>,
    request: Option<Request>,
}

impl<T: Send + 'static> Offload<T> {
    pub(crate) fn submit<F>(pool: &Arc<Inner>, work: F, slow: bool) -> Offload<T>
    where
        F: FnOnce() -> T + Send + 'static,
    {
        let job = Arc::new(Job {
            state: Mutex::new(State {
                work: Some(work),
                output: None,
                waker: None,
                abandoned: false,
                done: None,
            }),
            queued_at: crate::clock::now_ns(),
            cancelled: AtomicBool::new(false),
            pool: pool.clone(),
            home: try_with_core(|core| core.shared.clone()),
        });
        let completion: Arc<dyn Completion<T>> = job.clone();
        match pool.submit(job, slow) {
            Ok(()) => Offload {
                inner: Slot::Queued(completion),
                request: Request::begin(),
            },
            Err(limit) => Offload {
                inner: Slot::Failed(OffloadError::QueueFull {
                    pool: pool.name().to_owned(),
                    limit,
                }),
                request: None,
            },
        }
    }

    /// A future that resolves to `error` at once, for work no pool took (`NoThreads`).
    pub(crate) fn failed(error: OffloadError) -> Offload<T> {
        Offload {
            inner: Slot::Failed(error),
            request: None,
        }
    }

    /// Lets the work run (or keep running) with nobody waiting, as [`Offload::detach`], but
    /// keeps the loop alive until it has ended, as libuv's active requests do (`run` returns
    /// only after it), and gives its output to `done`: on the worker once the work ends there,
    /// or here at once if it has ended already (or the pool refused it).
    pub(crate) fn detach_then(
        mut self,
        done: impl FnOnce(Result<T, OffloadError>) + Send + 'static,
    ) {
        match std::mem::replace(&mut self.inner, Slot::Done) {
            Slot::Queued(job) => {
                // Given back once `done` has run, wherever that is.
                let unit = self.request.take().map(Request::into_send);
                job.detach_then(Box::new(move |output| {
                    done(output);
                    drop(unit);
                }));
            }
            Slot::Failed(e) => done(Err(e)),
            Slot::Done => {}
        }
    }
}

impl<T> Offload<T> {
    /// Lets the work run (or keep running) with nobody waiting for its result, which is
    /// dropped on the worker. The loop is no longer kept alive by it.
    pub fn detach(mut self) {
        if let Slot::Queued(job) = std::mem::replace(&mut self.inner, Slot::Done) {
            job.detach();
        }
    }
}

impl<T> Future for Offload<T> {
    type Output = Result<T, OffloadError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let out = match &this.inner {
            Slot::Queued(job) => match job.poll_output(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(out) => out,
            },
            Slot::Failed(_) => match std::mem::replace(&mut this.inner, Slot::Done) {
                Slot::Failed(e) => Err(e),
                _ => unreachable!("matched Failed above"),
            },
            Slot::Done => panic!("nodus: Offload polled after it completed"),
        };
        this.inner = Slot::Done;
        this.request = None;
        Poll::Ready(out)
    }
}

impl<T> Drop for Offload<T> {
    fn drop(&mut self) {
        if let Slot::Queued(job) = &self.inner {
            job.cancel();
        }
    }
}

impl<T> std::fmt::Debug for Offload<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.inner {
            Slot::Queued(_) => "queued or running",
            Slot::Failed(_) => "failed",
            Slot::Done => "done",
        };
        f.debug_struct("Offload").field("state", &state).finish()
    }
}

#[cfg(test)]
mod tests {
    use std::future::{Future, poll_fn};
    use std::sync::mpsc;
    use std::task::Poll;

    use crate::rt::context::with_core;

    /// The unit an `Offload` holds goes back to its own loop when the future is dropped, at
    /// once, wherever: outside any loop and while another loop is current.
    #[test]
    fn a_dropped_offload_gives_its_request_back_to_its_loop_at_once() {
        let (rt1, rt2) = (crate::Runtime::new(), crate::Runtime::new());
        let requests = |rt: &crate::Runtime| rt.enter(|| with_core("test", |c| c.requests.get()));
        let (tx, rx) = mpsc::channel::<()>();
        let gate = move || {
            let _ = rx.recv();
        };
        let mut job = Box::pin(rt1.enter(|| crate::offload_io(gate)));
        rt1.block_on(poll_fn(|cx| {
            assert!(job.as_mut().poll(cx).is_pending());
            Poll::Ready(())
        }));
        let other = rt2.enter(|| crate::offload_io(|| ()));
        assert_eq!((requests(&rt1), requests(&rt2)), (1, 1));
        rt2.enter(|| drop(job));
        assert_eq!(
            (requests(&rt1), requests(&rt2)),
            (0, 1),
            "the unit was not given back to its own loop at once"
        );
        let job = rt1.enter(|| crate::offload_io(|| ()));
        drop(job); // no loop current
        assert_eq!(requests(&rt1), 0);
        drop(tx);
        drop(other);
    }

    /// A job detached with `detach_then` keeps `run` going until it ends (libuv's active
    /// request), `done` gets its output, and the unit goes back to the loop.
    #[test]
    fn a_job_detached_with_detach_then_keeps_run_going_until_it_ends() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};

        let rt = crate::Runtime::new();
        let requests = || rt.enter(|| with_core("test", |c| c.requests.get()));
        let (tx, rx) = mpsc::channel::<()>();
        let (got, ran) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        let (g, r) = (got.clone(), ran.clone());
        rt.enter(|| {
            let job = crate::offload_io(move || {
                let _ = rx.recv();
                r.store(true, Ordering::SeqCst);
                7
            });
            job.detach_then(move |output| g.store(output == Ok(7), Ordering::SeqCst));
        });
        assert_eq!(requests(), 1);
        let release = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(50));
            drop(tx);
        });
        rt.run();
        assert!(
            ran.load(Ordering::SeqCst),
            "run returned before the job ran"
        );
        assert!(got.load(Ordering::SeqCst), "done did not get the output");
        assert_eq!(requests(), 0);
        release.join().unwrap();
    }
}
