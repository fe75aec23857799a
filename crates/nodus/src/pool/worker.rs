//! A pool's queue, its worker threads, and its measurements.
//!
//! One mutex guards the queue (two FIFOs: fast work and slow work, ordered between them by a
//! sequence number, so the pool as a whole stays FIFO as libuv's does with its slow-I/O sentinel)
//! plus the counts the workers keep under it (slow running, idle, waking). Idle workers
//! wait on a condition variable. A submission signals one only when a worker is idle and none is
//! already on its way; a signalled worker that finds more work than it can take signals the
//! next. So a burst of short jobs wakes one thread at a time instead of every thread once per
//! job, while long jobs still spread over every thread. Before sleeping, a worker yields its CPU
//! a few times and looks again (`SPINS`).
//!
//! A job whose future is dropped before it starts leaves the queued count (`queued`, what the
//! bound and the depth metric read) at once, from the dropping thread, without the queue lock,
//! like `uv_cancel`; its entry stays in the FIFO as an empty husk (the closure is dropped
//! already) that workers drop unopened when it reaches the front, and that a submission
//! sweeps out once husks outnumber the waiting jobs, so a stuck pool whose submitters give up
//! does not grow its FIFO without bound.
//!
//! Invariants:
//! - `queued` counts jobs submitted and neither started nor cancelled; it is raised only under
//!   the queue lock (so the bound holds) and lowered once per job by whichever of its worker and
//!   its dropped future takes the closure (`offload`).
//! - A worker takes a slow job only while fewer than `slow_limit` slow jobs run; a worker that
//!   finishes a slow job signals an idle worker if slow work waits, since the limit just freed.
//! - User code (the job, and dropping its result) runs outside the queue lock; a husk dropped
//!   under it holds none.
//! - Measurements are per worker (its own mutex, uncontended but for snapshots): queue wait and
//!   run time histograms in ns, completed jobs. Busy threads are read under the queue lock.
//!   A job's start is a clock read when the worker takes it, except for a job that was already
//!   waiting when the previous one on this worker ended, taken on the worker's next look: its
//!   start is that end. That saves one read per job in a backlog (a job then costs one read,
//!   any other two), at the cost of counting the worker's bookkeeping between the two jobs
//!   (recording, waking the previous job's task: well under a microsecond unless the thread is
//!   preempted there) as run time rather than wait. A look that finds nothing ends it, so the
//!   worker's spins and sleeps never count as run time.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use super::OffloadError;
use super::offload::Run;
use crate::clock::now_ns;
use crate::metrics::{Histogram, PoolSnapshot};

/// libuv's stack size for pool threads (8 MiB since v1.45): deep recursion in user work fails
/// where it would on Node.
const STACK_SIZE: usize = 8 << 20;

type Job = Arc<dyn Run>;

/// Times a worker that found no work yields its CPU and looks again before it sleeps: the loop
/// usually submits the next job within microseconds of a completion, and a futex sleep and
/// wake-up per job costs more than the job (a trivial round trip went from 0.74 to 0.42 µs).
const SPINS: u32 = 16;

#[derive(Default)]
struct Queue {
    fast: VecDeque<(u64, Job)>,
    slow: VecDeque<(u64, Job)>,
    seq: u64,
    slow_running: usize,
    idle: usize,
    /// Workers signalled and not yet back at the queue: while one is on its way, a submission
    /// signals no other (it will take the job, and signal the next worker if work remains).
    waking: usize,
    shutdown: bool,
}

/// Husks a submission leaves in the FIFO beyond the number of waiting jobs before it sweeps
/// them out (so a sweep's cost is spread over at least this many cancellations).
const HUSKS_KEPT: usize = 64;

impl Queue {
    /// Drops the cancelled jobs at the front of each FIFO.
    fn drop_cancelled_fronts(&mut self) {
        for fifo in [&mut self.fast, &mut self.slow] {
            while fifo.front().is_some_and(|(_, j)| j.cancelled()) {
                fifo.pop_front();
            }
        }
    }

    /// Sweeps the cancelled jobs out once they outnumber the `queued` ones by `HUSKS_KEPT`.
    fn sweep(&mut self, queued: usize) {
        let held = self.fast.len() + self.slow.len();
        if held > 2 * queued + HUSKS_KEPT {
            self.fast.retain(|(_, j)| !j.cancelled());
            self.slow.retain(|(_, j)| !j.cancelled());
        }
    }

    /// The oldest job a worker may take now, and whether it is slow.
    fn take(&mut self, slow_limit: usize) -> Option<(Job, bool)> {
        self.drop_cancelled_fronts();
        let slow_ok = self.slow_running < slow_limit;
        let take_slow = match (self.fast.front(), self.slow.front()) {
            (_, None) => false,
            (None, Some(_)) => slow_ok,
            (Some(&(f, _)), Some(&(s, _))) => slow_ok && s < f,
        };
        if take_slow {
            self.slow_running += 1;
            self.slow.pop_front().map(|(_, j)| (j, true))
        } else {
            self.fast.pop_front().map(|(_, j)| (j, false))
        }
    }

    /// Whether to signal an idle worker: one could take a job now (a cancelled one at a front
    /// counts: the worker signalled then finds nothing) and none is on its way already. Counts
    /// the signal.
    fn should_signal(&mut self, slow_limit: usize) -> bool {
        let eligible =
            !self.fast.is_empty() || (!self.slow.is_empty() && self.slow_running < slow_limit);
        let signal = eligible && self.idle > self.waking && self.waking == 0;
        if signal {
            self.waking += 1;
        }
        signal
    }
}

#[derive(Default)]
struct WorkerStats {
    queue_wait: Histogram,
    run: Histogram,
    completed: u64,
}

/// The shared state of one pool.
pub(crate) struct Inner {
    name: String,
    threads: usize,
    slow_limit: usize,
    max_queue: Option<usize>,
    queue: Mutex<Queue>,
    wakeup: Condvar,
    workers: Vec<Mutex<WorkerStats>>,
    /// Jobs submitted and neither started nor cancelled (see the module docs).
    queued: AtomicUsize,
    /// Threads running a job, from its start until its result is handed over (lowered before
    /// the waiting task is woken, so a task that has its result never sees its job counted).
    busy: AtomicUsize,
    cancelled: AtomicU64,
    rejected: AtomicU64,
    panicked: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // No user code runs under these locks; recover rather than propagate a poison anyway.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Inner {
    /// Starts the pool's threads, all or none: when one cannot start, those already started
    /// are ended and joined, and the error says how many there were.
    pub(crate) fn start(
        name: String,
        threads: usize,
        max_queue: Option<usize>,
    ) -> Result<Arc<Inner>, OffloadError> {
        // Before the first thread of nodus's (see `parent_env`).
        crate::parent_env::take();
        let inner = Arc::new(Inner {
            slow_limit: threads.div_ceil(2),
            threads,
            max_queue,
            queue: Mutex::new(Queue::default()),
            wakeup: Condvar::new(),
            workers: (0..threads).map(|_| Mutex::default()).collect(),
            queued: AtomicUsize::new(0),
            busy: AtomicUsize::new(0),
            cancelled: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            panicked: AtomicU64::new(0),
            name,
        });
        let mut started = Vec::with_capacity(threads);
        for i in 0..threads {
            let pool = inner.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("nodus-{}-{i}", inner.name))
                .stack_size(STACK_SIZE)
                .spawn(move || pool.work(i));
            match spawned {
                Ok(handle) => started.push(handle),
                Err(e) => {
                    inner.shutdown();
                    let count = started.len();
                    for handle in started {
                        // A worker catches every panic of user code; there is none queued yet.
                        let _ = handle.join();
                    }
                    return Err(OffloadError::NoThreads {
                        pool: inner.name.clone(),
                        started: count,
                        threads,
                        kind: e.kind(),
                        error: e.to_string(),
                    });
                }
            }
        }
        Ok(inner)
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn threads(&self) -> usize {
        self.threads
    }

    pub(crate) fn slow_limit(&self) -> usize {
        self.slow_limit
    }

    /// Queues `job`; `Err(limit)` when the queue is at its bound.
    pub(crate) fn submit(&self, job: Job, slow: bool) -> Result<(), usize> {
        let mut q = lock(&self.queue);
        // Only raised under this lock: read here, it cannot pass the bound.
        let queued = self.queued.load(Ordering::Relaxed);
        if let Some(limit) = self.max_queue
            && queued >= limit
        {
            drop(q);
            self.rejected.fetch_add(1, Ordering::Relaxed);
            return Err(limit);
        }
        self.queued.fetch_add(1, Ordering::Relaxed);
        q.sweep(queued);
        q.seq += 1;
        let seq = q.seq;
        if slow {
            q.slow.push_back((seq, job));
        } else {
            q.fast.push_back((seq, job));
        }
        let signal = q.should_signal(self.slow_limit);
        drop(q);
        if signal {
            self.wakeup.notify_one();
        }
        Ok(())
    }

    /// A job's work is starting: it leaves the queued count.
    pub(crate) fn started(&self) {
        self.queued.fetch_sub(1, Ordering::Relaxed);
    }

    /// A job's future was dropped before its work started: it leaves the queued count.
    pub(crate) fn cancelled(&self) {
        self.queued.fetch_sub(1, Ordering::Relaxed);
        self.cancelled.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn panicked(&self) {
        self.panicked.fetch_add(1, Ordering::Relaxed);
    }

    /// Lets the queued work finish, then ends the threads.
    pub(crate) fn shutdown(&self) {
        lock(&self.queue).shutdown = true;
        self.wakeup.notify_all();
    }

    /// One worker thread's life.
    fn work(&self, index: usize) {
        let stats = &self.workers[index];
        let mut q = lock(&self.queue);
        // End time of the job just run, until a look for work comes up empty: the start of a
        // job this look finds that was waiting by then (see the module docs).
        let mut last_end = None;
        let mut spins = 0;
        loop {
            let Some((job, slow)) = q.take(self.slow_limit) else {
                last_end = None;
                if q.shutdown {
                    return;
                }
                if spins < SPINS {
                    spins += 1;
                    drop(q);
                    std::thread::yield_now();
                    q = lock(&self.queue);
                    continue;
                }
                spins = 0;
                q.idle += 1;
                q = self.wakeup.wait(q).unwrap_or_else(|e| e.into_inner());
                q.idle -= 1;
                // Signalled (or woken spuriously while a signal is pending, which is as good).
                q.waking = q.waking.saturating_sub(1);
                continue;
            };
            self.busy.fetch_add(1, Ordering::Relaxed);
            // More work than this worker: pass the signal on.
            let signal = q.should_signal(self.slow_limit);
            drop(q);
            if signal {
                self.wakeup.notify_one();
            }

            let queued_at = job.queued_at();
            // Only a job that was waiting when the previous one ended starts at that end; one
            // submitted since may have found this worker anywhere (preempted, say).
            let start = match last_end {
                Some(end) if queued_at <= end => end,
                _ => now_ns(),
            };
            let ran = job.run();
            let end = now_ns();
            last_end = Some(end);
            // Before the wake: the woken task's snapshot (whose wake orders it after this) does
            // not count a job whose result it holds.
            self.busy.fetch_sub(1, Ordering::Relaxed);
            if let Some(waker) = ran {
                {
                    let mut s = lock(stats);
                    s.queue_wait.record(start.saturating_sub(queued_at));
                    s.run.record(end.saturating_sub(start));
                    s.completed += 1;
                }
                if let Some(waker) = waker {
                    job.wake(waker);
                }
            }
            drop(job);

            q = lock(&self.queue);
            if slow {
                q.slow_running -= 1;
                // The slow limit just freed a place: waiting slow work may need a worker.
                if q.should_signal(self.slow_limit) {
                    self.wakeup.notify_one();
                }
            }
        }
    }

    pub(crate) fn snapshot(&self) -> PoolSnapshot {
        let queue_depth = self.queued.load(Ordering::Relaxed) as u64;
        let busy = self.busy.load(Ordering::Relaxed) as u64;
        let mut queue_wait = Histogram::new();
        let mut run = Histogram::new();
        let mut completed = 0;
        for w in &self.workers {
            let s = lock(w);
            queue_wait.merge(&s.queue_wait);
            run.merge(&s.run);
            completed += s.completed;
        }
        PoolSnapshot {
            pool: self.name.clone(),
            threads: self.threads as u64,
            queue_depth,
            busy_threads: busy,
            completed_total: completed,
            cancelled_total: self.cancelled.load(Ordering::Relaxed),
            rejected_total: self.rejected.load(Ordering::Relaxed),
            panicked_total: self.panicked.load(Ordering::Relaxed),
            queue_wait: queue_wait.snapshot(),
            run: run.snapshot(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::Duration;

    use super::*;
    use crate::pool::Offload;

    /// A pool stuck on one job while its submitters keep giving up: the husks of their jobs
    /// are swept out of the FIFO, which stays near the number of live jobs.
    #[test]
    fn the_husks_of_dropped_jobs_do_not_pile_up_in_a_stuck_pool() {
        let inner = Inner::start("husks".into(), 1, None).unwrap();
        let (release, held) = mpsc::channel::<()>();
        let (started_tx, started) = mpsc::channel();
        Offload::submit(
            &inner,
            move || {
                started_tx.send(()).unwrap();
                let _ = held.recv_timeout(Duration::from_secs(10));
            },
            false,
        )
        .detach();
        started.recv_timeout(Duration::from_secs(10)).unwrap();
        let live: Vec<_> = (0..10)
            .map(|_| Offload::submit(&inner, || (), false))
            .collect();
        for _ in 0..10_000 {
            drop(Offload::submit(&inner, || (), false));
        }
        let held = lock(&inner.queue).fast.len();
        assert!(
            held <= 2 * 10 + HUSKS_KEPT + 1,
            "{held} jobs held for 10 live"
        );
        assert_eq!(inner.snapshot().queue_depth, 10);
        drop((release, live));
        inner.shutdown();
    }
}
