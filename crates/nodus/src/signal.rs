//! Unix signals as an async stream, delivered in the poll phase.
//!
//! A signal handler (signal-hook) writes to a self-pipe registered with the reactor, the approach
//! libuv takes, so no code runs in signal context beyond that write, and the loop sees the signal
//! as readiness in its poll phase. Like Node's `process.on('SIGINT')`, a `Signals` stream does not
//! keep the loop alive by itself (`ref_()` makes it).
//!
//! While a `Signals` stream lives, its signals' default actions (terminating, say) do not happen;
//! once no stream of the process catches a signal any more, its default action is back, as in
//! Node once the last `process.on('SIGTERM')` listener is removed. (signal-hook's handler stays
//! installed for good, and with no action left it would swallow the signal: a conditional
//! action per signal, registered with the first stream, runs the default while no stream lives.
//! That holds even if other code in the process registered its own signal-hook action.)
//!
//! Invariants: readiness is edge-triggered, so every wake-up drains every pending signal before
//! clearing readiness; a signal arriving after the drain writes to the pipe again and produces a
//! new edge. `LISTENERS` counts, per signal, the live streams catching it; its flag is `true`
//! exactly when the count is 0. Its lock is never copied held into a forked process
//! (`crate::atfork` takes it around every `fork`).

use std::collections::{BTreeMap, VecDeque};
use std::future::poll_fn;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use signal_hook_mio::v1_0::Signals as PipeSignals;

pub use signal_hook::consts::signal::{
    SIGHUP, SIGINT, SIGKILL, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2,
};

use crate::io::coop::poll_proceed;
use crate::io::reactor::{READABLE, Registration};
use crate::rt::context::with_core;

/// A signal's name ("SIGTERM"), or "signal" for a number nobody named.
pub fn name(signal: i32) -> &'static str {
    signal_hook::low_level::signal_name(signal).unwrap_or("signal")
}

/// Per signal: the flag of its conditional default action (`true`: no stream catches it, run the
/// default) and the number of live streams that catch it.
static LISTENERS: Mutex<BTreeMap<i32, (Arc<AtomicBool>, usize)>> = Mutex::new(BTreeMap::new());

/// [`LISTENERS`]'s lock, held across a `fork` by the forking thread (see `crate::atfork`).
pub(crate) type ListenersGuard = MutexGuard<'static, BTreeMap<i32, (Arc<AtomicBool>, usize)>>;

fn listeners() -> ListenersGuard {
    crate::atfork::register();
    lock_listeners()
}

/// [`listeners`] without the fork handlers' registration: for the handlers themselves.
pub(crate) fn lock_listeners() -> ListenersGuard {
    LISTENERS.lock().unwrap_or_else(|e| e.into_inner())
}

/// How many live streams of the process catch `signal`.
pub(crate) fn streams_catching(signal: i32) -> usize {
    listeners().get(&signal).map_or(0, |&(_, count)| count)
}

/// A stream of the signals it was created for.
pub struct Signals {
    /// Declared first, so dropped before `pipe`: once released, a signal gets its default.
    _listening: Listening,
    pipe: PipeSignals,
    reg: Registration,
    queued: VecDeque<i32>,
}

/// Counts its signals in [`LISTENERS`] while it lives. The first count of a signal registers its
/// conditional default action, before any stream's pipe action for it: signal-hook runs a
/// signal's actions in registration order, so a handler reads the flag before it writes to a
/// pipe, and a stream that got the signal and was dropped at once (its flag back to `true`) can
/// never have the same handler run go on to the default action.
struct Listening(Box<[i32]>);

impl Listening {
    fn new(signals: &[i32]) -> Listening {
        let mut signals = signals.to_vec();
        signals.sort_unstable();
        signals.dedup();
        let mut listeners = listeners();
        for &signal in &signals {
            let (idle, count) = listeners.entry(signal).or_insert_with(|| {
                let idle = Arc::new(AtomicBool::new(false));
                // A signal signal-hook has no default for (a real-time one) cannot get this
                // action: once no stream catches it, it stays swallowed.
                let _ = signal_hook::flag::register_conditional_default(signal, idle.clone());
                (idle, 0)
            });
            *count += 1;
            idle.store(false, Ordering::SeqCst);
        }
        Listening(signals.into_boxed_slice())
    }
}

impl Drop for Listening {
    fn drop(&mut self) {
        let mut listeners = listeners();
        for signal in &self.0 {
            if let Some((idle, count)) = listeners.get_mut(signal) {
                *count -= 1;
                if *count == 0 {
                    idle.store(true, Ordering::SeqCst);
                }
            }
        }
    }
}

impl Signals {
    /// Starts catching `signals`: their default action (terminating, say) no longer happens
    /// until no stream catches them any more (see the module docs).
    ///
    /// # Errors
    /// For signals that cannot be caught (`SIGKILL`, `SIGSTOP`, `SIGSEGV`...).
    ///
    /// # Panics
    /// On a thread with no nodus loop (the stream registers with the current loop's reactor).
    #[track_caller]
    pub fn new(signals: &[i32]) -> io::Result<Signals> {
        if let Some(&forbidden) = signals
            .iter()
            .find(|s| signal_hook::consts::FORBIDDEN.contains(s))
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} ({forbidden}) cannot be caught", name(forbidden)),
            ));
        }
        let listening = Listening::new(signals);
        let mut pipe = PipeSignals::new(signals.iter().copied())?;
        with_core("nodus::signal::Signals::new", |core| {
            // Unref'd by default (Node's rule).
            let reg = Registration::new(core, &mut pipe, false)?;
            Ok(Signals {
                _listening: listening,
                pipe,
                reg,
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
            let state = self.reg.state();
            if state.ready.get() & READABLE == 0 {
                let old = state.read_waker.replace(Some(cx.waker().clone()));
                drop(old);
                return Poll::Pending;
            }
            self.queued.extend(self.pipe.pending());
            if self.queued.is_empty() {
                let ready = &self.reg.state().ready;
                ready.set(ready.get() & !READABLE);
            }
        }
    }

    /// The stream keeps its loop's `Runtime::run` alive while it exists.
    pub fn ref_(&self) {
        self.reg.set_ref(true);
    }

    /// The stream no longer keeps the loop alive (the default).
    pub fn unref(&self) {
        self.reg.set_ref(false);
    }
}

impl Drop for Signals {
    /// Leaves its loop's epoll set before the pipe closes, wherever it is dropped (see
    /// `io::reactor::Registration`).
    fn drop(&mut self) {
        self.reg.deregister(&mut self.pipe);
    }
}
