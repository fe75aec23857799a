//! The reactor: mio's `Poll`, a slab of registered sources, and readiness dispatch.
//!
//! mio is edge-triggered, so readiness is remembered per source (`IoState::ready`) until the
//! owner sees `WouldBlock` and clears it. Dispatching an event sets the bits and wakes the
//! waiting tasks (each wake queues a microtask; the drain after the dispatch polls them).
//!
//! Invariants: token 0 is the cross-thread waker; a source's token is its slab key + 1 and stays
//! valid until it is deregistered; the loop thread is the only one touching `IoState`.

use std::cell::{Cell, RefCell};
use std::io;
use std::rc::Rc;
use std::task::Waker;
use std::time::Duration;

use mio::{Events, Interest, Poll, Token};
use slab::Slab;

pub(crate) const WAKER_TOKEN: usize = 0;
pub(crate) const READABLE: u8 = 0b0001;
pub(crate) const WRITABLE: u8 = 0b0010;
/// The peer closed its write side (EOF/hang-up): sticky, never cleared by a `WouldBlock`, so a
/// reader that stopped after a short read still sees the EOF.
pub(crate) const READ_CLOSED: u8 = 0b0100;
/// The peer stopped reading or the socket failed: sticky like `READ_CLOSED`.
pub(crate) const WRITE_CLOSED: u8 = 0b1000;

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
        };
        Ok((reactor, waker))
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.sources.borrow().is_empty()
    }

    /// Registers `source` for reading and writing; it starts out as ready for both (the first
    /// attempt finds out).
    pub(crate) fn register(&self, source: &mut impl mio::event::Source) -> io::Result<Rc<IoState>> {
        let mut sources = self.sources.borrow_mut();
        let entry = sources.vacant_entry();
        let token = entry.key() + 1;
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

    /// Deregisters `source`; returns its wakers for the caller to drop outside any borrow.
    pub(crate) fn deregister(
        &self,
        source: &mut impl mio::event::Source,
        state: &IoState,
    ) -> [Option<Waker>; 2] {
        let _ = self.poll.borrow().registry().deregister(source);
        self.sources.borrow_mut().try_remove(state.token - 1);
        [state.read_waker.take(), state.write_waker.take()]
    }

    pub(crate) fn take_event_buffer(&self) -> Vec<(usize, u8)> {
        let mut b = self.buffer.take();
        b.clear();
        b
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

    /// Marks a source ready and wakes its waiters.
    pub(crate) fn dispatch(&self, token: usize, bits: u8) {
        let state = self.sources.borrow().get(token - 1).cloned();
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
