//! The run queue as the meter sees it: entries become runnable (`arrive_at`), leave without
//! running (`cancel`) or start to run at a boundary (`depart`), and the queue length is integrated
//! between boundaries.
//!
//! Invariants:
//! - `runnable` counts the entries currently runnable, measurements on or off (the snapshot's
//!   current run-queue length reads it).
//! - An entry is runnable from the time it carries (`wake_time`): a local wake, a spawn or an
//!   immediate from the moment it happens (one clock read in user code, so a task woken early in
//!   a long poll is seen waiting behind the rest of it); a task woken by the loop itself from the
//!   loop's time then (`wakes_at`: I/O readiness from the return of `epoll_wait`, a `Sleep` from
//!   its timer's boundary); a task that woke itself (a yield) from the end of its poll, as it is
//!   running until then (`arrive_self`, `self_wake_runnable`: no read of its own); remote work
//!   (a wake from another thread, a pool completion, a `LoopHandle::post`) from its post, though
//!   the loop learns of it only when its poll phase takes the remote queue.
//! - The integral counts every entry from that same time to its departure, so Little's law
//!   (mean length = arrival rate × mean delay) holds by construction: an entry arriving is
//!   counted from the last boundary on, and the difference to its own time is settled at once
//!   (its wait before that boundary, for an entry from the past) or at the next integration (the
//!   `credit`, for one that became runnable after it). An entry cancelled between two boundaries
//!   is counted up to the second.
//! - `last_boundary` never goes back: a snapshot brings the integral up to its own clock read
//!   (`settle`), which a later boundary's cached time may precede.

use super::Meter;

impl Meter {
    /// When an entry queued now becomes runnable: the time the loop declared for its own wakes
    /// (`wakes_at`), else a clock read (the wake happens in user code: a poll, a callback, a
    /// closure, the main script). 0 with measurements compiled out.
    #[inline]
    pub(crate) fn wake_time(&self) -> u64 {
        #[cfg(feature = "measure")]
        {
            match self.wake_at.get() {
                0 => crate::clock::now_ns(),
                t => t,
            }
        }
        #[cfg(not(feature = "measure"))]
        0
    }

    /// Runs `f`, in which the loop itself wakes tasks (dispatching I/O readiness, firing a
    /// `Sleep`), with `t` as the time of its wakes (`wake_time`).
    #[inline]
    pub(crate) fn wakes_at<R>(&self, t: u64, f: impl FnOnce() -> R) -> R {
        #[cfg(feature = "measure")]
        {
            /// Puts the previous wake time back, also if `f` unwinds.
            struct Restore<'a>(&'a std::cell::Cell<u64>, u64);
            impl Drop for Restore<'_> {
                fn drop(&mut self) {
                    self.0.set(self.1);
                }
            }
            let _restore = Restore(&self.wake_at, self.wake_at.replace(t));
            f()
        }
        #[cfg(not(feature = "measure"))]
        {
            let _ = t;
            f()
        }
    }

    /// An entry (task, main future, immediate, remote work) became runnable at `at`.
    #[inline]
    pub(crate) fn arrive_at(&self, at: u64) {
        self.arrive();
        #[cfg(feature = "measure")]
        {
            let last = self.last_boundary.get();
            if at >= last {
                self.credit.set(self.credit.get().saturating_add(at - last));
            } else {
                let mut s = self.stats.borrow_mut();
                s.rq_integral += u128::from(last - at);
                let since = at.max(s.interval.start_ns);
                s.interval.rq_integral += u128::from(last.saturating_sub(since));
            }
        }
        #[cfg(not(feature = "measure"))]
        let _ = at;
    }

    /// The task being polled (or the main future) woke itself: it is queued now (once: it is
    /// not queued again before it runs) and runnable once its poll returns
    /// (`self_wake_runnable`).
    #[inline]
    pub(crate) fn arrive_self(&self) {
        self.arrive();
        #[cfg(feature = "measure")]
        self.self_woken.set(true);
    }

    /// Whether the poll that just returned woke itself (its yield not yet runnable).
    #[cfg(feature = "measure")]
    #[inline]
    pub(crate) fn self_woken(&self) -> bool {
        self.self_woken.get()
    }

    /// The poll that woke itself returned, at the latest clock read (its end): its yield is
    /// runnable from then. Returns that time, its stamp.
    #[cfg(feature = "measure")]
    #[inline]
    pub(crate) fn self_wake_runnable(&self) -> u64 {
        self.self_woken.set(false);
        let t = self.now.get();
        let late = t.saturating_sub(self.last_boundary.get());
        self.credit.set(self.credit.get().saturating_add(late));
        t
    }

    /// An entry is queued: counted from the last boundary by the next integration.
    #[inline]
    fn arrive(&self) {
        self.runnable.set(self.runnable.get() + 1);
        #[cfg(feature = "measure")]
        {
            let n = self.runnable.get();
            self.runnable_at_boundary
                .set(self.runnable_at_boundary.get() + 1);
            let mut s = self.stats.borrow_mut();
            s.arrivals += 1;
            s.rq_max = s.rq_max.max(n);
            s.interval.rq_max = s.interval.rq_max.max(n);
        }
    }

    /// Remote work posted at `posted` and taken goes back on the remote queue at boundary `t`
    /// without running (`block_on` returned): undoes its `arrive_at(posted)`, so its next one
    /// counts its whole wait once.
    #[cold]
    pub(crate) fn unarrive_posted(&self, posted: u64, t: u64) {
        self.cancel();
        #[cfg(feature = "measure")]
        {
            self.runnable_at_boundary.set(self.runnable.get());
            let mut s = self.stats.borrow_mut();
            s.arrivals -= 1;
            let wait = u128::from(t.saturating_sub(posted));
            s.rq_integral = s.rq_integral.saturating_sub(wait);
            let since = posted.max(s.interval.start_ns);
            let wait = u128::from(t.saturating_sub(since));
            s.interval.rq_integral = s.interval.rq_integral.saturating_sub(wait);
        }
        #[cfg(not(feature = "measure"))]
        let _ = (posted, t);
    }

    /// A runnable entry left the queue without running (cancelled or dropped).
    #[inline]
    pub(crate) fn cancel(&self) {
        self.runnable.set(self.runnable.get() - 1);
    }

    /// Entries currently runnable.
    #[inline]
    pub(crate) fn runnable(&self) -> u64 {
        self.runnable.get()
    }

    /// Samples the run-queue length at the start of a drain.
    #[inline]
    pub(crate) fn sample_run_queue(&self) {
        #[cfg(feature = "measure")]
        {
            self.stats
                .borrow_mut()
                .rq_samples
                .record(self.runnable.get());
        }
    }

    /// A boundary: returns its time and integrates the run-queue length up to it.
    #[inline]
    pub(crate) fn boundary(&self) -> u64 {
        let t = self.boundary_time();
        #[cfg(feature = "measure")]
        {
            let n = self.runnable_at_boundary.replace(self.runnable.get());
            self.integrate(n, t);
        }
        t
    }

    /// Adds `n` entries × the time from the last boundary to `t` to the integrals, less the
    /// `credit` of entries that arrived after the last boundary, and makes `t` the last boundary
    /// (if it is later).
    #[cfg(feature = "measure")]
    #[inline]
    fn integrate(&self, n: u64, t: u64) {
        let last = self.last_boundary.get();
        if t > last {
            self.last_boundary.set(t);
            let credit = u128::from(self.credit.replace(0));
            if n > 0 {
                let mut s = self.stats.borrow_mut();
                // Never negative but for an entry stamped after a boundary's cached time (its
                // wait is then 0 too).
                let area = (n as u128 * (t - last) as u128).saturating_sub(credit);
                s.rq_integral += area;
                s.interval.rq_integral += area;
            }
        }
    }

    /// A snapshot at `now`: the integrals are brought up to `now` (the entries runnable since
    /// the last boundary stay counted from it on), and the interval is closed if it is due.
    #[cfg(feature = "measure")]
    pub(crate) fn settle(&self, now: u64) {
        self.integrate(self.runnable_at_boundary.get(), now);
        self.stats
            .borrow_mut()
            .roll_interval_if_due(now, self.interval_ns());
    }

    /// A runnable entry queued at `queued_at` starts to run at boundary `t`.
    #[inline]
    pub(crate) fn depart(&self, queued_at: u64, t: u64) {
        self.runnable.set(self.runnable.get() - 1);
        #[cfg(feature = "measure")]
        {
            self.runnable_at_boundary.set(self.runnable.get());
            self.stats
                .borrow_mut()
                .schedule_delay
                .record(t.saturating_sub(queued_at));
        }
        #[cfg(not(feature = "measure"))]
        let _ = (queued_at, t);
    }
}
