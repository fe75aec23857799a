//! Unix signals as an async stream, delivered in the poll phase.
//!
//! A signal handler (signal-hook) writes to a self-pipe registered with the reactor, the approach
//! libuv takes, so no code runs in signal context beyond that write, and the loop sees the signal
//! as readiness in its poll phase. Like Node's `process.on('SIGINT')`, a `Signals` stream does not
//! keep the loop alive by itself (`ref_()` makes it).
//!
//! Invariants: readiness is edge-triggered, so every wake-up drains every pending signal before
//! clearing readiness; a signal arriving after the drain writes to the pipe again and produces a
//! new edge.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::io;
use std::rc::Rc;
use std::task::{Context, Poll};

use signal_hook_mio::v1_0::Signals as PipeSignals;

pub use signal_hook::consts::signal::{
    SIGHUP, SIGINT, SIGKILL, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2,
};

use crate::io::coop::poll_proceed;
use crate::io::reactor::{IoState, READABLE};
use crate::rt::context::{try_with_core, with_core};

/// A signal's name ("SIGTERM"), or "signal" for a number nobody named.
pub fn name(signal: i32) -> &'static str {
    signal_hook::low_level::signal_name(signal).unwrap_or("signal")
}

/// A stream of the signals it was created for.
pub struct Signals {
    pipe: PipeSignals,
    state: Rc<IoState>,
    loop_id: u64,
    queued: VecDeque<i32>,
}

impl Signals {
    /// Starts catching `signals` (their default action, such as terminating, no longer happens).
    ///
    /// # Errors
    /// For signals that cannot be caught (`SIGKILL`, `SIGSTOP`, `SIGSEGV`...).
    #[track_caller]
    pub fn new(signals: &[i32]) -> io::Result<Signals> {
        let mut pipe = PipeSignals::new(signals.iter().copied())?;
        with_core("nodus::signal::Signals::new", |core| {
            let state = core.reactor.register(&mut pipe)?;
            // Unref'd by default (Node's rule); the registration did not count in `refs`.
            state.refd.set(false);
            Ok(Signals {
                pipe,
                state,
                loop_id: core.loop_id(),
                queued: VecDeque::new(),
            })
        })
    }

    /// The next signal.
    pub async fn recv(&mut self) -> i32 {
        poll_fn(|cx| self.poll_recv(cx)).await
    }

    /// Polls for the next signal.
    pub fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<i32> {
        loop {
            if let Some(sig) = self.queued.pop_front() {
                return Poll::Ready(sig);
            }
            if poll_proceed(cx).is_pending() {
                return Poll::Pending;
            }
            if self.state.ready.get() & READABLE == 0 {
                let old = self.state.read_waker.replace(Some(cx.waker().clone()));
                drop(old);
                return Poll::Pending;
            }
            self.queued.extend(self.pipe.pending());
            if self.queued.is_empty() {
                self.state.ready.set(self.state.ready.get() & !READABLE);
            }
        }
    }

    /// The stream keeps `Runtime::run` alive while it exists.
    pub fn ref_(&self) {
        if !self.state.refd.replace(true) {
            self.on_loop(|core| core.ref_handle());
        }
    }

    /// The stream no longer keeps the loop alive (the default).
    pub fn unref(&self) {
        if self.state.refd.replace(false) {
            self.on_loop(|core| core.unref_handle());
        }
    }

    fn on_loop(&self, f: impl FnOnce(&crate::rt::core::Core)) {
        try_with_core(|core| {
            if core.loop_id() == self.loop_id {
                f(core)
            }
        });
    }
}

impl Drop for Signals {
    fn drop(&mut self) {
        let state = self.state.clone();
        let pipe = &mut self.pipe;
        let wakers = try_with_core(|core| {
            if core.loop_id() != self.loop_id {
                return None;
            }
            if state.refd.replace(false) {
                core.unref_handle();
            }
            Some(core.reactor.deregister(pipe, &state))
        });
        drop(wakers);
    }
}
