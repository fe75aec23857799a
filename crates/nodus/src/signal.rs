//! Unix signals as an async stream, delivered in the poll phase.
//!
//! A signal handler (signal-hook) writes to a self-pipe registered with the reactor, the approach
//! libuv takes, so no code runs in signal context beyond that write, and the loop sees the signal
//! as readiness in its poll phase. Like Node's `process.on('SIGINT')`, a `Signals` stream does not
//! keep the loop alive by itself (`ref_()` makes it).
//!
//! [`name`] and [`by_name`] read nodus's one table of signal names (`NAMES`): every Linux
//! standard signal, 1 to 31, as libc numbers it for the target (SIGSTKFLT and SIGPWR included,
//! which signal-hook's table lacks); log lines and the command line's `--kill-signal` use it.
//!
//! While a `Signals` stream lives, its signals' default actions (terminating, say) do not happen;
//! once no stream of the process catches a signal any more, its default action is back, as in
//! Node once the last `process.on('SIGTERM')` listener is removed. (signal-hook's handler stays
//! installed for good, and with no action left it would swallow the signal: a conditional
//! action per signal, registered with the first stream, runs the default while no stream lives.
//! That holds even if other code in the process registered its own signal-hook action.)
//!
//! [`Signals::recv_from`] also says who sent the signal ([`Origin`], by its `siginfo_t`'s
//! `si_code`): the kernel itself (`SI_KERNEL`: the SIGHUP of a terminal's hangup) or anything
//! else (`kill`, `sigqueue`: `SI_USER`, `SI_QUEUE`). A signal the pipe holds once for several
//! deliveries (signals merge until read) is the kernel's if any of them was.
//!
//! [`sighup`] says what a SIGHUP read means to a foreground server ([`Sighup`]): the terminal hung
//! up, or a request (`kill -HUP`: a reload). A hangup is the kernel's SIGHUP, or any SIGHUP while
//! one of the standard fds (0, 1, 2) that were terminals when the process's first stream catching
//! SIGHUP was made is a hung-up terminal (its `TIOCGPGRP` fails with `EIO`): an interactive shell
//! (bash, zsh), the session leader, gets the kernel's and forwards it to its jobs with `killpg`
//! (`SI_USER`), the terminal hung up already; the kernel's own reaches a job only when the shell
//! exits, if at all. SIGHUP's disposition is read at that first stream too, before any handler of
//! nodus's: ignored then (`nohup`), a hangup is [`Sighup::HangupIgnored`], and once one was, a
//! SIGHUP only the hung-up terminal marks is a request (the terminal stays hung up). A handler
//! other code installed for SIGHUP before that stream hides an inherited ignore.
//!
//! A process forked without `exec` runs none of its parent's loops, so its copies of the parent's
//! streams catch nothing there: from the fork on, every signal they catch has its default action
//! back in it (the fork handler, `crate::atfork`), but a real-time one (no conditional default:
//! swallowed, as in the parent once no stream catches it). Their pipe actions stay registered
//! there and write to the pipes it shares with the parent, whose streams wake with no signal to
//! read. A stream the forked process makes catches as anywhere, and a copy of the parent's
//! dropped there uncounts nothing of its own. (Node has no fork without `exec`; libuv wants
//! `uv_loop_fork` first, tokio calls a runtime unusable after one.)
//!
//! Invariants:
//! - Readiness is edge-triggered, so every wake-up drains every pending signal before clearing
//!   readiness; a signal arriving after the drain writes to the pipe again and produces a new
//!   edge.
//! - `LISTENERS` counts, per signal, the live streams of its owner process catching it; its flag
//!   is `true` exactly when the count is 0, as seen by any holder of its lock (a stream being
//!   made counts itself first and turns the flag off only once its pipe action is registered, so
//!   a signal meanwhile gets its default rather than be swallowed with no pipe to write to). Its lock is never copied held into a forked process
//!   (`crate::atfork` takes it around every `fork`).
//! - In the forked process the fork handler sets every flag to `true` (atomic stores on what the
//!   lock held across the fork guards: async-signal-safe), and the first use of `LISTENERS` there
//!   sets every count to 0 and takes the table for that process; a stream counted for another
//!   process releases nothing.
//! - A stream registers, per signal, an action that records a delivery from the kernel (its
//!   `kernel` flags) before its pipe's action: signal-hook runs a signal's actions in
//!   registration order, so a signal read from the pipe finds its origin recorded, and the read
//!   takes the record (an action's store is all it does in signal context: an atomic). The
//!   flags are cleared once the pipe's actions are registered, so a kernel's signal in between
//!   (its flag set, no pipe byte) is no later signal's origin; one landing just before that
//!   clear reads as another sender's ([`sighup`] still finds a hangup by its terminal).
//! - Every call nodus makes into signal-hook that registers or unregisters an action (a
//!   conditional default's registration; a stream's origin and pipe actions, with signal-hook's
//!   lock of that stream) is made under `LISTENERS`'s lock, so no `fork` happens while a thread of
//!   nodus's is inside signal-hook's registry: none copies its registry lock (a mutex private to
//!   `signal_hook_registry`, which no API reaches and no fork handler of its own takes) held by
//!   a thread of nodus's. Not covered, since nodus cannot wait for them: a registration by other
//!   code in the process (a library's, the program's `signal_hook::flag::register`), and a
//!   signal handler of signal-hook's running on another thread at the fork (its read count of the
//!   registry is copied and never falls back: the forked process's first registration or
//!   unregistration, a `Signals::new` or a copied stream's drop there, spins for good). A fork
//!   from a thread whose thread-locals are gone (it is exiting) holds no lock, and so gives the
//!   forked process neither guarantee nor the default actions back (`crate::atfork`).

use std::collections::{BTreeMap, VecDeque};
use std::future::poll_fn;
use std::io;
use std::mem::ManuallyDrop;
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

/// Linux's standard signals (1 to 31) by name, every one: [`name`] and [`by_name`] read this
/// table alone. The numbers are libc's (some differ by architecture); the last two rows are
/// aliases, which [`by_name`] takes and [`name`] never gives (their numbers come first above).
const NAMES: &[(i32, &str)] = &[
    (libc::SIGHUP, "SIGHUP"),
    (libc::SIGINT, "SIGINT"),
    (libc::SIGQUIT, "SIGQUIT"),
    (libc::SIGILL, "SIGILL"),
    (libc::SIGTRAP, "SIGTRAP"),
    (libc::SIGABRT, "SIGABRT"),
    (libc::SIGBUS, "SIGBUS"),
    (libc::SIGFPE, "SIGFPE"),
    (libc::SIGKILL, "SIGKILL"),
    (libc::SIGUSR1, "SIGUSR1"),
    (libc::SIGSEGV, "SIGSEGV"),
    (libc::SIGUSR2, "SIGUSR2"),
    (libc::SIGPIPE, "SIGPIPE"),
    (libc::SIGALRM, "SIGALRM"),
    (libc::SIGTERM, "SIGTERM"),
    (libc::SIGSTKFLT, "SIGSTKFLT"),
    (libc::SIGCHLD, "SIGCHLD"),
    (libc::SIGCONT, "SIGCONT"),
    (libc::SIGSTOP, "SIGSTOP"),
    (libc::SIGTSTP, "SIGTSTP"),
    (libc::SIGTTIN, "SIGTTIN"),
    (libc::SIGTTOU, "SIGTTOU"),
    (libc::SIGURG, "SIGURG"),
    (libc::SIGXCPU, "SIGXCPU"),
    (libc::SIGXFSZ, "SIGXFSZ"),
    (libc::SIGVTALRM, "SIGVTALRM"),
    (libc::SIGPROF, "SIGPROF"),
    (libc::SIGWINCH, "SIGWINCH"),
    (libc::SIGIO, "SIGIO"),
    (libc::SIGPWR, "SIGPWR"),
    (libc::SIGSYS, "SIGSYS"),
    (libc::SIGIOT, "SIGIOT"),
    (libc::SIGPOLL, "SIGPOLL"),
];

/// A signal's name ("SIGTERM"), or "signal" for a number that is no standard signal (0, a
/// real-time one).
pub fn name(signal: i32) -> &'static str {
    NAMES
        .iter()
        .find(|&&(n, _)| n == signal)
        .map_or("signal", |&(_, name)| name)
}

/// The standard signal named `name`, with or without its `SIG` prefix, in any case (`SIGINT`,
/// `int`); aliases too (`SIGIOT` is SIGABRT, `SIGPOLL` SIGIO).
pub fn by_name(name: &str) -> Option<i32> {
    let upper = name.to_ascii_uppercase();
    let bare = upper.strip_prefix("SIG").unwrap_or(&upper);
    NAMES
        .iter()
        .find(|&&(_, known)| known.strip_prefix("SIG") == Some(bare))
        .map(|&(n, _)| n)
}

/// Who sent a signal ([`Signals::recv_from`]), by its `siginfo_t`'s `si_code`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The kernel itself (`SI_KERNEL`): the SIGHUP (and SIGCONT) of a terminal's hangup, to its
    /// session leader, and to the foreground process group once that leader exits; the SIGHUP
    /// to a process group orphaned with a stopped member.
    Kernel,
    /// Any other sender: a process (`kill`, `sigqueue`, `tgkill`: `SI_USER`, `SI_QUEUE`,
    /// `SI_TKILL`), a timer, I/O.
    Other,
}

/// What a SIGHUP read from a stream means ([`sighup`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sighup {
    /// The process's terminal hung up (an SSH session dropped, a terminal closed): the kernel
    /// sent it ([`Origin::Kernel`]), or a standard fd that was a terminal is a hung-up one.
    Hangup,
    /// A hangup, but SIGHUP was ignored when the process began to catch it (`nohup`): asked
    /// to outlive its terminal.
    HangupIgnored,
    /// Anything else: a process's request (`kill -HUP`, `systemctl reload`).
    Request,
}

/// What a SIGHUP that `origin` sent means (see the module doc): [`Sighup::Hangup`] when the
/// kernel sent it or a standard fd that was a terminal at the first stream catching SIGHUP is a
/// hung-up terminal now (a `kill -HUP` then too: nothing tells them apart);
/// [`Sighup::HangupIgnored`] instead when SIGHUP was ignored then (`nohup`), for the kernel's and
/// for the first found by the terminal alone, after which such a SIGHUP is a request (the
/// process outlived its terminal, whose state tells nothing more); [`Sighup::Request`]
/// otherwise.
pub fn sighup(origin: Origin) -> Sighup {
    let start = START.get();
    let ttys = start.map_or(0, |s| s.ttys);
    let kernel = origin == Origin::Kernel;
    if !kernel && !(0..3).any(|fd| ttys & (1 << fd) != 0 && tty_hung_up(fd)) {
        return Sighup::Request;
    }
    if !start.is_some_and(|s| s.sighup_ignored) {
        return Sighup::Hangup;
    }
    let first = !HANGUP_IGNORED.swap(true, Ordering::SeqCst);
    if kernel || first {
        Sighup::HangupIgnored
    } else {
        Sighup::Request
    }
}

/// A hangup was [`Sighup::HangupIgnored`] once already.
static HANGUP_IGNORED: AtomicBool = AtomicBool::new(false);

/// Whether `fd` is a hung-up terminal: every ioctl of one fails with `EIO` (a terminal's
/// `TIOCGPGRP` that is not the caller's controlling one, or no terminal, fails with `ENOTTY`).
fn tty_hung_up(fd: i32) -> bool {
    // SAFETY: `tcgetpgrp` on any fd number only reads the kernel's state, or fails.
    let pgrp = unsafe { libc::tcgetpgrp(fd) };
    pgrp == -1 && io::Error::last_os_error().raw_os_error() == Some(libc::EIO)
}

/// The process as its first stream catching SIGHUP found it, before any handler of nodus's
/// for SIGHUP ([`sighup`]).
struct Start {
    /// Bit `fd` set: the standard fd `fd` (0, 1, 2) was a terminal, not hung up.
    ttys: u8,
    /// SIGHUP's disposition was `SIG_IGN` (`nohup`).
    sighup_ignored: bool,
}

static START: std::sync::OnceLock<Start> = std::sync::OnceLock::new();

/// Records [`START`], once: called before the first registration for SIGHUP.
fn record_start() {
    START.get_or_init(|| {
        // SAFETY: `isatty` only asks the kernel about the fd number.
        let ttys = (0..3).fold(0, |bits, fd| {
            bits | (u8::from(unsafe { libc::isatty(fd) } == 1) << fd)
        });
        // SAFETY: a zeroed sigaction is valid; `sigaction` with no new action only fills `old`.
        let sighup_ignored = unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            libc::sigaction(SIGHUP, std::ptr::null(), &raw mut old) == 0
                && old.sa_sigaction == libc::SIG_IGN
        };
        Start {
            ttys,
            sighup_ignored,
        }
    });
}

/// Per signal, the flag of its conditional default action and the live streams that catch it.
pub(crate) struct Listeners {
    /// The process the counts are for (see the module doc): 0 before its first lock.
    owner: u32,
    /// Per signal: the flag (`true`: no stream catches it, run the default) and the count.
    signals: BTreeMap<i32, (Arc<AtomicBool>, usize)>,
}

static LISTENERS: Mutex<Listeners> = Mutex::new(Listeners {
    owner: 0,
    signals: BTreeMap::new(),
});

/// [`LISTENERS`]'s lock, held across a `fork` by the forking thread (see `crate::atfork`).
pub(crate) type ListenersGuard = MutexGuard<'static, Listeners>;

/// The counts, this process's own (see the module doc).
fn listeners() -> ListenersGuard {
    crate::atfork::register();
    let mut l = lock_listeners();
    let me = std::process::id();
    if l.owner != me {
        // New, or forked from the process it was: none of that one's streams catches here.
        l.owner = me;
        for (idle, count) in l.signals.values_mut() {
            *count = 0;
            idle.store(true, Ordering::SeqCst);
        }
    }
    l
}

/// [`listeners`] without the fork handlers' registration nor the owner's check: for the
/// handlers themselves.
pub(crate) fn lock_listeners() -> ListenersGuard {
    LISTENERS.lock().unwrap_or_else(|e| e.into_inner())
}

/// In a process just forked, from the fork handler, with the lock held across the fork: every
/// signal gets its default action back (see the module doc). Atomic stores only: no allocation,
/// no lock (async-signal-safe).
pub(crate) fn forked(listeners: &Listeners) {
    for (idle, _) in listeners.signals.values() {
        idle.store(true, Ordering::SeqCst);
    }
}

/// How many live streams of the process catch `signal`.
pub(crate) fn streams_catching(signal: i32) -> usize {
    listeners()
        .signals
        .get(&signal)
        .map_or(0, |&(_, count)| count)
}

/// A stream of the signals it was created for.
pub struct Signals {
    /// Its signals' counts and pipe, dropped once `Signals::drop` took the pipe out of epoll.
    hook: Hook,
    reg: Registration,
    queued: VecDeque<i32>,
}

/// A stream's part in signal-hook: its signals counted in [`LISTENERS`] and its pipe's actions,
/// made and unmade under [`LISTENERS`]'s lock (see the module doc). The first count of a signal
/// registers its conditional default action, before any stream's pipe action for it:
/// signal-hook runs a signal's actions in registration order, so a handler reads the flag
/// before it writes to a pipe, and a stream that got the signal and was dropped at once (its
/// flag back to `true`) can never have the same handler run go on to the default action.
struct Hook {
    /// Sorted, without duplicates.
    signals: Box<[i32]>,
    /// Per signal (as `signals`): a delivery from the kernel came since the last read.
    kernel: Box<[Arc<AtomicBool>]>,
    /// The actions that set `kernel`, registered before the pipe's; unregistered in
    /// `Hook::drop`, under the lock.
    origins: Vec<signal_hook_registry::SigId>,
    /// The process whose counts hold this stream (see [`Listeners::owner`]).
    owner: u32,
    /// Dropped in `Hook::drop`, under the lock.
    pipe: ManuallyDrop<PipeSignals>,
}

impl Hook {
    fn new(signals: &[i32]) -> io::Result<Hook> {
        let mut signals = signals.to_vec();
        signals.sort_unstable();
        signals.dedup();
        let mut listeners = listeners();
        listeners.count(&signals);
        let kernel: Box<[Arc<AtomicBool>]> = signals.iter().map(|_| Arc::default()).collect();
        let mut origins = Vec::with_capacity(signals.len());
        let mut registered = Ok(());
        for (&signal, flag) in signals.iter().zip(kernel.iter()) {
            let flag = flag.clone();
            // SAFETY: the action reads the siginfo's `si_code` and stores an atomic: no
            // allocation, no lock (async-signal-safe). `Signals::new` refused the forbidden
            // signals, which `register_sigaction` panics on.
            let action = unsafe {
                signal_hook_registry::register_sigaction(signal, move |info: &libc::siginfo_t| {
                    if info.si_code == libc::SI_KERNEL {
                        flag.store(true, Ordering::SeqCst);
                    }
                })
            };
            match action {
                Ok(id) => origins.push(id),
                Err(e) => {
                    registered = Err(e);
                    break;
                }
            }
        }
        match registered.and_then(|()| PipeSignals::new(signals.iter().copied())) {
            Ok(pipe) => {
                // A kernel's signal between the origin actions and the pipe's set a flag with no
                // pipe byte to read it: left, it would be a later signal's origin.
                for flag in kernel.iter() {
                    flag.store(false, Ordering::SeqCst);
                }
                // Caught from now on, once the pipe's actions are there to catch them: a signal
                // that came before (the default still on) did what it does with no stream.
                listeners.arm(&signals);
                Ok(Hook {
                    signals: signals.into_boxed_slice(),
                    kernel,
                    origins,
                    owner: listeners.owner,
                    pipe: ManuallyDrop::new(pipe),
                })
            }
            Err(e) => {
                for id in origins {
                    signal_hook_registry::unregister(id);
                }
                listeners.uncount(&signals);
                Err(e)
            }
        }
    }

    /// Who sent `signal`, just read from the pipe: the kernel if a delivery of it since the
    /// last read was the kernel's (the record is taken).
    fn origin(&self, signal: i32) -> Origin {
        let from_kernel = self
            .signals
            .binary_search(&signal)
            .is_ok_and(|i| self.kernel[i].swap(false, Ordering::SeqCst));
        if from_kernel {
            Origin::Kernel
        } else {
            Origin::Other
        }
    }
}

impl Drop for Hook {
    /// Uncounts first, so a signal from then on gets its default, then unregisters the pipe's
    /// actions.
    fn drop(&mut self) {
        let mut listeners = listeners();
        if listeners.owner == self.owner {
            listeners.uncount(&self.signals);
        }
        // SAFETY: dropped once, here, and never used again.
        unsafe { ManuallyDrop::drop(&mut self.pipe) };
        for id in self.origins.drain(..) {
            signal_hook_registry::unregister(id);
        }
    }
}

impl Listeners {
    /// One more stream is to catch `signals`: the first registers the signal's conditional
    /// default (on: the stream's pipe action is not registered yet). [`arm`](Self::arm) turns the
    /// defaults off once it is; until then a signal does what it does with no stream, rather
    /// than be swallowed by a default turned off with no pipe to write to.
    fn count(&mut self, signals: &[i32]) {
        for &signal in signals {
            let (_, count) = self.signals.entry(signal).or_insert_with(|| {
                if signal == SIGHUP {
                    record_start();
                }
                let idle = Arc::new(AtomicBool::new(true));
                // A signal signal-hook has no default for (a real-time one) cannot get this
                // action: once no stream catches it, it stays swallowed.
                let _ = signal_hook::flag::register_conditional_default(signal, idle.clone());
                (idle, 0)
            });
            *count += 1;
        }
    }

    /// The stream counted for `signals` catches them now: their defaults are off.
    fn arm(&self, signals: &[i32]) {
        for signal in signals {
            if let Some((idle, _)) = self.signals.get(signal) {
                idle.store(false, Ordering::SeqCst);
            }
        }
    }

    /// One stream less catches `signals`.
    fn uncount(&mut self, signals: &[i32]) {
        for signal in signals {
            if let Some((idle, count)) = self.signals.get_mut(signal) {
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
        let mut hook = Hook::new(signals)?;
        with_core("nodus::signal::Signals::new", |core| {
            // Unref'd by default (Node's rule).
            let reg = Registration::new(core, &mut *hook.pipe, false)?;
            Ok(Signals {
                hook,
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
        self.poll_recv_from(cx).map(|(signal, _)| signal)
    }

    /// The next signal, and who sent it (see [`Origin`]).
    pub async fn recv_from(&mut self) -> (i32, Origin) {
        poll_fn(|cx| self.poll_recv_from(cx)).await
    }

    /// Polls for the next signal and who sent it.
    pub fn poll_recv_from(&mut self, cx: &mut Context<'_>) -> Poll<(i32, Origin)> {
        loop {
            if let Some(sig) = self.queued.pop_front() {
                return Poll::Ready((sig, self.hook.origin(sig)));
            }
            if poll_proceed(cx).is_pending() {
                return Poll::Pending;
            }
            let state = self.reg.state();
            if state.ready.get() & READABLE == 0 {
                state.readers.register(cx.waker());
                return Poll::Pending;
            }
            self.queued.extend(self.hook.pipe.pending());
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
        self.reg.deregister(&mut *self.hook.pipe);
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::thread::JoinHandleExt;
    use std::sync::atomic::AtomicBool;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::process::alone::{alone, exit_code};

    #[test]
    fn every_standard_signal_has_one_name_read_back_by_by_name() {
        let mut seen = std::collections::HashSet::new();
        for n in 1..=31 {
            let named = name(n);
            assert!(named.starts_with("SIG") && named.len() > 3, "{n}: {named}");
            assert!(seen.insert(named), "{n}: {named} names two signals");
            assert_eq!(by_name(named), Some(n), "{named}");
            assert_eq!(
                by_name(&named[3..].to_ascii_lowercase()),
                Some(n),
                "{named}"
            );
        }
        assert_eq!((name(16), name(30)), ("SIGSTKFLT", "SIGPWR"));
        assert_eq!(by_name("stkflt"), Some(libc::SIGSTKFLT));
        assert_eq!(by_name("SigPwr"), Some(libc::SIGPWR));
        assert_eq!(by_name("SIGIOT"), Some(libc::SIGABRT));
        assert_eq!(by_name("poll"), Some(libc::SIGIO));
        for not in ["", "SIG", "SIGSIGINT", "TERM2", "SIGRTMIN", "15"] {
            assert_eq!(by_name(not), None, "{not:?}");
        }
        assert_eq!(
            (name(0), name(32), name(-1)),
            ("signal", "signal", "signal")
        );
    }

    /// A terminal whose other side closed is hung up (`EIO`); a live one and a pipe are not.
    #[test]
    fn tty_hung_up_tells_a_hung_up_terminal_from_a_live_one_or_none() {
        use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
        let (mut master, mut slave) = (-1, -1);
        // SAFETY: `openpty` writes the two fds; the null pointers ask for no name nor settings.
        let opened = unsafe {
            libc::openpty(
                &raw mut master,
                &raw mut slave,
                std::ptr::null_mut(),
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        assert_eq!(opened, 0, "{}", io::Error::last_os_error());
        // SAFETY: `openpty` opened both, owned by nothing else.
        let (master, slave) =
            unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
        let (pipe, _writer) = std::io::pipe().unwrap();
        assert!(!tty_hung_up(slave.as_raw_fd()));
        assert!(!tty_hung_up(pipe.as_raw_fd()));
        drop(master);
        assert!(tty_hung_up(slave.as_raw_fd()));
    }

    /// Sends this thread `signal` as the kernel would (`si_code` `SI_KERNEL`: a terminal's
    /// hangup; a thread may give any `si_code` to a signal to itself, `rt_tgsigqueueinfo`).
    fn raise_as_kernel(signal: i32) {
        // SAFETY: a zeroed siginfo_t is valid; its first three fields are set below.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        info.si_signo = signal;
        info.si_code = libc::SI_KERNEL;
        // SAFETY: `info` lives across the call, which reads it only.
        let sent = unsafe {
            libc::syscall(
                libc::SYS_rt_tgsigqueueinfo,
                libc::getpid(),
                libc::gettid(),
                signal,
                &raw const info,
            )
        };
        assert_eq!(sent, 0, "{}", io::Error::last_os_error());
    }

    /// `recv_from` says a signal the kernel sent (a hangup's SIGHUP) from one `kill` sent, and
    /// one read of a signal delivered twice (merged in the pipe) is the kernel's if either was.
    #[test]
    fn recv_from_tells_the_kernels_signal_from_a_processs() {
        if !alone("signal::tests::recv_from_tells_the_kernels_signal_from_a_processs") {
            return;
        }
        let rt = crate::Runtime::new();
        rt.block_on(async {
            let mut signals = Signals::new(&[SIGHUP, SIGUSR2]).unwrap();
            let next = async |signals: &mut Signals| {
                crate::time::timeout(Duration::from_secs(10), signals.recv_from())
                    .await
                    .expect("a signal within 10 s")
            };
            // A process's signal, sent to this thread (`tgkill`: `SI_TKILL`), so that it is
            // handled before the call returns: a `kill` of the process may be taken by another
            // thread, late on a loaded host, after the stream is gone (its default then ends
            // the process).
            let kill = |signal: i32| {
                // SAFETY: plain syscalls.
                let sent = unsafe {
                    libc::syscall(libc::SYS_tgkill, libc::getpid(), libc::gettid(), signal)
                };
                assert_eq!(sent, 0, "{}", io::Error::last_os_error());
            };
            kill(SIGHUP);
            assert_eq!(next(&mut signals).await, (SIGHUP, Origin::Other));
            raise_as_kernel(SIGHUP);
            assert_eq!(next(&mut signals).await, (SIGHUP, Origin::Kernel));
            // The record was taken with the read.
            kill(SIGHUP);
            assert_eq!(next(&mut signals).await, (SIGHUP, Origin::Other));
            // Per signal: SIGUSR2 from a process while SIGHUP's is the kernel's.
            raise_as_kernel(SIGHUP);
            kill(SIGUSR2);
            let mut got = vec![next(&mut signals).await, next(&mut signals).await];
            got.sort_unstable_by_key(|&(signal, _)| signal);
            assert_eq!(got, [(SIGHUP, Origin::Kernel), (SIGUSR2, Origin::Other)]);
            // Two deliveries before a read: one signal, the kernel's.
            raise_as_kernel(SIGHUP);
            kill(SIGHUP);
            assert_eq!(next(&mut signals).await, (SIGHUP, Origin::Kernel));
        });
    }

    /// Forks a process that runs `check` (a code for each failure, 0 when it passed) and
    /// `_exit`s with its code; returns that code (or the wait status, SIGKILLed after 10 s).
    fn in_forked_process(check: fn() -> i32) -> Result<i32, libc::c_int> {
        // SAFETY: the forked process runs `check` (nodus code the test chose; the locks nodus's
        // other threads may hold are taken around the fork) and `_exit`s, never returning into
        // the harness.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let code = std::panic::catch_unwind(check).unwrap_or(99);
            // SAFETY: ends the forked process without running this one's exit handlers.
            unsafe { libc::_exit(code) };
        }
        assert!(pid > 0, "fork: {}", io::Error::last_os_error());
        exit_code(pid, Duration::from_secs(10))
    }

    /// In a process forked without `exec`, the parent's streams are not counted (what they caught
    /// gets its default action), one of its own is, and a copy of the parent's dropped there
    /// does not uncount it.
    #[test]
    fn a_forked_process_counts_its_own_streams_only() {
        if !alone("signal::tests::a_forked_process_counts_its_own_streams_only") {
            return;
        }
        let parents = Hook::new(&[SIGUSR1]).unwrap();
        assert_eq!(streams_catching(SIGUSR1), 1);
        static PARENTS: Mutex<Option<Hook>> = Mutex::new(None);
        *PARENTS.lock().unwrap() = Some(parents);
        let code = in_forked_process(|| {
            if streams_catching(SIGUSR1) != 0 {
                return 1;
            }
            let idle = |l: &Listeners| l.signals.get(&SIGUSR1).map(|(i, _)| i.clone());
            if !idle(&listeners()).is_some_and(|i| i.load(Ordering::SeqCst)) {
                return 2;
            }
            let own = Hook::new(&[SIGUSR1]).unwrap();
            if streams_catching(SIGUSR1) != 1 {
                return 3;
            }
            drop(PARENTS.lock().unwrap().take());
            if streams_catching(SIGUSR1) != 1 {
                return 4;
            }
            drop(own);
            if streams_catching(SIGUSR1) != 0 {
                return 5;
            }
            0
        });
        assert_eq!(
            code,
            Ok(0),
            "1: the parent's stream counted, 2: SIGUSR1 not back to its default, 3: its own not \
             counted, 4: the parent's copy uncounted its own, 5: its own not uncounted"
        );
        // The parent's counts are its own still.
        assert_eq!(streams_catching(SIGUSR1), 1);
        drop(PARENTS.lock().unwrap().take());
        assert_eq!(streams_catching(SIGUSR1), 0);
    }

    /// While one thread registers a stream with signal-hook (held there by a signal handler of
    /// signal-hook's running on a third thread, whose end the registration waits for), a fork
    /// waits for it: the forked process does not find signal-hook's registry locked, or its
    /// handler's read count copied for good, and registers a stream of its own.
    #[test]
    fn a_fork_waits_for_a_stream_registering_on_another_thread() {
        if !alone("signal::tests::a_fork_waits_for_a_stream_registering_on_another_thread") {
            return;
        }
        static IN_HANDLER: AtomicBool = AtomicBool::new(false);
        static RELEASE: AtomicBool = AtomicBool::new(false);
        let bounded = |done: &dyn Fn() -> bool| {
            let limit = Instant::now() + Duration::from_secs(5);
            while !done() && Instant::now() < limit {
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        // SIGUSR1's conditional default is registered now: the stream below only registers its
        // pipe's action.
        let first = Hook::new(&[SIGUSR1]).unwrap();
        // SAFETY: the action uses atomics and the monotonic clock only (async-signal-safe) and
        // spins until released (20 s at most, should the test fail on its way: longer than any
        // wait of this process's before its fork).
        let action = unsafe {
            signal_hook::low_level::register(SIGUSR2, || {
                IN_HANDLER.store(true, Ordering::SeqCst);
                let limit = Instant::now() + Duration::from_secs(20);
                while !RELEASE.load(Ordering::SeqCst) && Instant::now() < limit {
                    std::hint::spin_loop();
                }
            })
        }
        .unwrap();
        let handling = std::thread::spawn(|| {
            while !RELEASE.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        // SAFETY: signals a live thread of this process (joined below).
        unsafe { libc::pthread_kill(handling.as_pthread_t(), SIGUSR2) };
        bounded(&|| IN_HANDLER.load(Ordering::SeqCst));
        assert!(IN_HANDLER.load(Ordering::SeqCst), "no handler run");
        let registering = std::thread::spawn(|| drop(Hook::new(&[SIGUSR1]).unwrap()));
        // Inside its registration: holding the lock, waiting for the handler.
        bounded(&|| LISTENERS.try_lock().is_err());
        std::thread::sleep(Duration::from_millis(100));
        let before = crate::atfork::tests::TAKING[3].load(Ordering::SeqCst);
        let releasing = std::thread::spawn(move || {
            // Once the fork has begun to take the lock (and waits there).
            let taking = || crate::atfork::tests::TAKING[3].load(Ordering::SeqCst) > before;
            let limit = Instant::now() + Duration::from_secs(10);
            while !taking() && Instant::now() < limit {
                std::thread::sleep(Duration::from_millis(1));
            }
            std::thread::sleep(Duration::from_millis(100));
            RELEASE.store(true, Ordering::SeqCst);
        });
        let code = in_forked_process(|| {
            drop(Hook::new(&[SIGUSR1, SIGUSR2]).unwrap());
            0
        });
        for thread in [releasing, registering, handling] {
            thread.join().unwrap();
        }
        signal_hook::low_level::unregister(action);
        drop(first);
        assert_eq!(code, Ok(0), "the forked process's registration hung");
    }
}
