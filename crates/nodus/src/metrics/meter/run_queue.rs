//! The run queue as the meter sees it: entries become runnable (`arrive`), leave without running
//! (`cancel`) or start to run at a boundary (`depart`), and the queue length is integrated between
//! boundaries.
//!
//! Invariants:
//! - `runnable` counts the entries currently runnable, measurements on or off (the snapshot's
//!   current run-queue length reads it).
//! - Entries queued between two boundaries are counted from the second one, the same moment their
//!   schedule delay starts, so Little's law (mean length = arrival rate × mean delay) holds by
//!   construction for local wakes.
//! - Remote work (a wake from another thread, a pool completion, a `LoopHandle::post`) is
//!   runnable from its post, but the loop learns of it only when its poll phase takes the remote
//!   queue: it arrives then (`arrive_posted`), counted from that boundary on, and the wait from
//!   its post to that boundary is added to the integral at once. Its schedule delay counts from
//!   the post too, so Little's law holds for it as well (the interval's integral gets only the
//!   part of that wait inside the interval).
//! - `last_boundary` never goes back: a snapshot brings the integral up to its own clock read
//!   (`settle`), which a later boundary's cached time may precede.

use super::Meter;

impl Meter {
    /// An entry (task, main future, immediate) became runnable.
    #[inline]
    pub(crate) fn arrive(&self) {
        self.runnable.set(self.runnable.get() + 1);
        #[cfg(feature = "measure")]
        {
            let n = self.runnable.get();
            let mut s = self.stats.borrow_mut();
            s.arrivals += 1;
            s.rq_max = s.rq_max.max(n);
            s.interval.rq_max = s.interval.rq_max.max(n);
        }
    }

    /// Remote work posted at `posted` was taken from the remote queue at boundary `taken`: it is
    /// runnable from here on, and its wait since the post is added to the integrals.
    #[inline]
    pub(crate) fn arrive_posted(&self, posted: u64, taken: u64) {
        self.arrive();
        #[cfg(feature = "measure")]
        {
            // Counted from `taken` (the boundary just passed) by the integration, like a local
            // entry queued before it.
            self.runnable_at_boundary.set(self.runnable.get());
            let mut s = self.stats.borrow_mut();
            s.rq_integral += u128::from(taken.saturating_sub(posted));
            let since = posted.max(s.interval.start_ns);
            s.interval.rq_integral += u128::from(taken.saturating_sub(since));
        }
        #[cfg(not(feature = "measure"))]
        let _ = (posted, taken);
    }

    /// Remote work posted at `posted` and taken goes back on the remote queue at boundary `t`
    /// without running (`block_on` returned): undoes `arrive_posted`, so its next one counts
    /// its whole wait once.
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

    /// A boundary: returns its time (the stamp for entries queued since the previous one) and
    /// integrates the run-queue length up to it.
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

    /// Adds `n` entries × the time from the last boundary to `t` to the integrals, and makes `t`
    /// the last boundary (if it is later).
    #[cfg(feature = "measure")]
    #[inline]
    fn integrate(&self, n: u64, t: u64) {
        let last = self.last_boundary.get();
        if t > last {
            self.last_boundary.set(t);
            if n > 0 {
                let mut s = self.stats.borrow_mut();
                let area = n as u128 * (t - last) as u128;
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
