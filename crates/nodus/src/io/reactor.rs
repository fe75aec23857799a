//! The reactor: mio's `Poll`, a slab of registered sources, and readiness dispatch.
//!
//! mio is edge-triggered, so readiness is remembered per source (`IoState::ready`) until the
//! owner sees `WouldBlock` and clears it. Dispatching an event sets the bits and wakes the
//! waiting tasks (each wake queues a microtask; the drain after the dispatch polls them).
//!
//! Invariants:
//! - Token 0 is the cross-thread waker. A source's token is its slab key + 1 in the low half and
//!   a generation (a counter of this reactor's registrations) in the high half, so it names one
//!   registration, never a later one that reuses the key: an event still in a batch for a source
//!   deregistered meanwhile (by a callback of the same batch, which may register another source
//!   under the same key; or before the next poll phase, for a batch `block_on` returned in the
//!   middle of, whose rest is dispatched then) is dropped at dispatch, as is one from any stale
//!   epoll registration. Without this, such an event would hand the new owner the old one's
//!   sticky `READ_CLOSED`/`WRITE_CLOSED` bits, and its reader would spin on an "EOF" that never
//!   comes. The generation wraps (after 2^32 registrations on a 64-bit target, 2^16 on a 32-bit
//!   one): an event meets a later registration's token only if it outlived that many
//!   registrations, which the events of a batch do not, and no owner leaves a stale registration
//!   (short of an fd swapped under an `AsyncFd` through `get_mut`, which its docs forbid).
//! - Every source leaves epoll (`EPOLL_CTL_DEL`) while its fd is still open, before it is closed:
//!   closing alone removes an epoll registration only when the fd was the last reference to its
//!   open file (a `dup`, a child that inherited it, an fd sent over IPC keep it registered, with
//!   nothing left to remove it by). A [`Registration`] reaches its own loop through a weak
//!   reference, so this holds wherever its owner is dropped: on its loop, outside any loop (after
//!   `block_on` returned), or while another loop runs on the thread. Once the loop itself is gone
//!   there is nothing to do: its epoll instance was closed with it. Owners are `!Send` (the
//!   `Rc`s here), so all of this happens on the loop's thread.
//! - The loop thread is the only one touching `IoState`.

use std::cell::{Cell, RefCell};
use std::io;
use std::rc::{Rc, Weak};
use std::task::Waker;
use std::time::Duration;

use mio::{Events, Interest, Poll, Token};
use slab::Slab;

use crate::rt::core::Core;

pub(crate) const WAKER_TOKEN: usize = 0;
pub(crate) const READABLE: u8 = 0b0001;
pub(crate) const WRITABLE: u8 = 0b0010;
/// The peer closed its write side (EOF/hang-up): sticky, never cleared by a `WouldBlock`, so a
/// reader that stopped after a short read still sees the EOF.
pub(crate) const READ_CLOSED: u8 = 0b0100;
/// The peer stopped reading or the socket failed: sticky like `READ_CLOSED`.
pub(crate) const WRITE_CLOSED: u8 = 0b1000;

/// Bits of a token that hold the slab key + 1; the rest hold the registration's generation.
const KEY_BITS: u32 = usize::BITS / 2;
const KEY_MASK: usize = (1 << KEY_BITS) - 1;

/// The slab key a source token names.
fn key_of(token: usize) -> usize {
    (token & KEY_MASK).wrapping_sub(1)
}

/// The readiness and waiters of one registered source.
pub(crate) struct IoState {
    pub(crate) ready: Cell<u8>,
    pub(crate) read_waker: Cell<Option<Waker>>,
    pub(crate) write_waker: Cell<Option<Waker>>,
    pub(crate) refd: Cell<bool>,
    pub(crate) token: usize,
}

pub(crate) struct Reactor {
    poll: RefCell<Poll>,
    events: RefCell<Events>,
    buffer: Cell<Vec<(usize, u8)>>,
    sources: RefCell<Slab<Rc<IoState>>>,
    /// Registrations made so far: the high half of the next token.
    generation: Cell<usize>,
}

impl Reactor {
    /// The reactor and the waker other threads use to interrupt its poll.
    pub(crate) fn new() -> io::Result<(Reactor, mio::Waker)> {
        let poll = Poll::new()?;
        let waker = mio::Waker::new(poll.registry(), Token(WAKER_TOKEN))?;
        let reactor = Reactor {
            poll: RefCell::new(poll),
            events: RefCell::new(Events::with_capacity(1024)),
            buffer: Cell::new(Vec::with_capacity(1024)),
            sources: RefCell::new(Slab::new()),
            generation: Cell::new(0),
        };
        Ok((reactor, waker))
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.sources.borrow().is_empty()
    }

    /// Registers `source` for reading and writing; it starts out as ready for both (the first
    /// attempt finds out). Its token is new: no earlier registration had it.
    pub(crate) fn register(&self, source: &mut impl mio::event::Source) -> io::Result<Rc<IoState>> {
        let mut sources = self.sources.borrow_mut();
        let entry = sources.vacant_entry();
        if entry.key() + 1 > KEY_MASK {
            return Err(io::Error::other(
                "too many sources registered with one loop",
            ));
        }
        let generation = self.generation.get().wrapping_add(1) & (usize::MAX >> KEY_BITS);
        self.generation.set(generation);
        let token = (generation << KEY_BITS) | (entry.key() + 1);
        self.poll.borrow().registry().register(
            source,
            Token(token),
            Interest::READABLE | Interest::WRITABLE,
        )?;
        let state = Rc::new(IoState {
            ready: Cell::new(READABLE | WRITABLE),
            read_waker: Cell::new(None),
            write_waker: Cell::new(None),
            refd: Cell::new(true),
            token,
        });
        entry.insert(state.clone());
        Ok(state)
    }

    /// Deregisters `source` (its fd still open: see the module invariants); returns its wakers
    /// for the caller to drop outside any borrow. Removes the slab entry only if it is still
    /// this registration's.
    pub(crate) fn deregister(
        &self,
        source: &mut impl mio::event::Source,
        state: &IoState,
    ) -> [Option<Waker>; 2] {
        let _ = self.poll.borrow().registry().deregister(source);
        let removed = {
            let mut sources = self.sources.borrow_mut();
            let key = key_of(state.token);
            match sources.get(key) {
                Some(s) if s.token == state.token => Some(sources.remove(key)),
                _ => None,
            }
        };
        drop(removed);
        [state.read_waker.take(), state.write_waker.take()]
    }

    /// Sources registered now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.sources.borrow().len()
    }

    /// The epoll instance's fd (its registrations are listed in `/proc/self/fdinfo/<fd>`).
    #[cfg(test)]
    pub(crate) fn epoll_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.poll.borrow().as_raw_fd()
    }

    /// The event buffer, holding the events a poll phase cut short left undispatched (they are
    /// dispatched first: see `rt/phases.rs`).
    pub(crate) fn take_event_buffer(&self) -> Vec<(usize, u8)> {
        self.buffer.take()
    }

    pub(crate) fn return_event_buffer(&self, b: Vec<(usize, u8)>) {
        self.buffer.set(b);
    }

    /// Waits for readiness (at most `timeout`; `None` = forever) and appends `(token, bits)`.
    pub(crate) fn poll(
        &self,
        timeout: Option<Duration>,
        out: &mut Vec<(usize, u8)>,
    ) -> io::Result<()> {
        let mut events = self.events.borrow_mut();
        match self.poll.borrow_mut().poll(&mut events, timeout) {
            Ok(()) => {}
            // A signal: report nothing and let the loop come round again.
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(()),
            Err(e) => return Err(e),
        }
        for event in events.iter() {
            let mut bits = 0;
            if event.is_readable() || event.is_error() {
                bits |= READABLE;
            }
            if event.is_read_closed() {
                bits |= READABLE | READ_CLOSED;
            }
            if event.is_writable() || event.is_error() {
                bits |= WRITABLE;
            }
            if event.is_write_closed() {
                bits |= WRITABLE | WRITE_CLOSED;
            }
            out.push((event.token().0, bits));
        }
        Ok(())
    }

    /// Marks a source ready and wakes its waiters. An event for a registration that is gone
    /// (deregistered earlier in this batch, its key perhaps reused since) is dropped.
    pub(crate) fn dispatch(&self, token: usize, bits: u8) {
        let state = self
            .sources
            .borrow()
            .get(key_of(token))
            .filter(|s| s.token == token)
            .cloned();
        let Some(state) = state else { return };
        state.ready.set(state.ready.get() | bits);
        if bits & READABLE != 0
            && let Some(w) = state.read_waker.take()
        {
            w.wake();
        }
        if bits & WRITABLE != 0
            && let Some(w) = state.write_waker.take()
        {
            w.wake();
        }
    }

    /// Every stored waker (shutdown).
    pub(crate) fn take_wakers(&self) -> Vec<Waker> {
        let sources: Vec<Rc<IoState>> = self
            .sources
            .borrow()
            .iter()
            .map(|(_, s)| s.clone())
            .collect();
        sources
            .iter()
            .flat_map(|s| [s.read_waker.take(), s.write_waker.take()])
            .flatten()
            .collect()
    }
}

/// One source's registration with the loop it was registered on, reachable from wherever its
/// owner is dropped (see the module invariants). The owner deregisters it
/// ([`Registration::deregister`]) before closing its fd.
pub(crate) struct Registration {
    state: Rc<IoState>,
    core: Weak<Core>,
    /// Deregistered already: a second `EPOLL_CTL_DEL` could name an fd number reused since.
    gone: Cell<bool>,
}

impl Registration {
    /// Registers `source` with `core`'s reactor; a `refd` one counts as an active handle.
    pub(crate) fn new(
        core: &Core,
        source: &mut impl mio::event::Source,
        refd: bool,
    ) -> io::Result<Registration> {
        let state = core.reactor.register(source)?;
        state.refd.set(refd);
        if refd {
            core.ref_handle();
        }
        Ok(Registration {
            state,
            core: core.me.clone(),
            gone: Cell::new(false),
        })
    }

    pub(crate) fn state(&self) -> &IoState {
        &self.state
    }

    /// Whether this registration keeps its loop alive; a change is counted in that loop's refs
    /// (whichever loop, if any, is current).
    pub(crate) fn set_ref(&self, on: bool) {
        if self.gone.get() || self.state.refd.replace(on) == on {
            return;
        }
        if let Some(core) = self.core.upgrade() {
            if on {
                core.ref_handle();
            } else {
                core.unref_handle();
            }
        }
    }

    /// Queues `callback` for its loop's close phase, whichever loop is current; dropped unrun if
    /// that loop is gone.
    pub(crate) fn close_callback(
        &self,
        callback: Box<dyn FnOnce()>,
        location: &'static std::panic::Location<'static>,
    ) {
        match self.core.upgrade() {
            Some(core) => core.queue_close(callback, location),
            None => drop(callback),
        }
    }

    /// Takes `source` (whose fd must still be open) out of its loop's epoll set and slab and stops
    /// counting it as a handle. Nothing to do once the loop is gone. Idempotent.
    pub(crate) fn deregister(&self, source: &mut impl mio::event::Source) {
        if self.gone.replace(true) {
            return;
        }
        let Some(core) = self.core.upgrade() else {
            return;
        };
        if self.state.refd.replace(false) {
            core.unref_handle();
        }
        let wakers = core.reactor.deregister(source, &self.state);
        // Waker drops may run task code: after every borrow, with the core still held.
        drop(wakers);
        drop(core);
    }
}
