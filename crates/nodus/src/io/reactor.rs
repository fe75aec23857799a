//! The reactor: mio's `Poll`, the slots of registered sources, and readiness dispatch.
//!
//! mio is edge-triggered, so readiness is remembered per source (`IoState::ready`) until the
//! owner sees `WouldBlock` and clears it. Dispatching an event sets the bits and wakes the
//! waiting tasks (each wake queues a microtask; the drain after the dispatch polls them). An
//! owner may also have readiness given back later (`Registration::ready_after`: an accept's
//! back-off), by an unref'd timer of the source's own loop that dispatches it as an event under
//! the source's token: a source gone by then gets nothing.
//!
//! Invariants:
//! - A source is registered for readability only. Writability joins its interest the first
//!   time a write finds it full (`AsyncFd::clear_write_ready` → [`Registration::watch_writes`])
//!   and stays: before that, nothing waits for a write edge, and a Unix socket makes one each
//!   time its peer reads (a cluster primary's channel to each worker, once per handoff). A
//!   source starts out ready for both directions all the same: the first attempt finds out.
//! - Token 0 is the cross-thread waker. A source's token is its slot's key + 1 in the low half
//!   and a generation (the count of registrations in that slot) in the high half, so it names
//!   one registration, never a later one: no token is given twice. A slot whose generation
//!   reaches the highest the half holds (2^32 − 1 on a 64-bit target, 2^16 − 1 on a 32-bit one)
//!   is retired when that registration leaves: never reused, so a generation never wraps (a
//!   retired slot costs a few bytes; on a 32-bit target the 2^16 − 1 slots of a loop last for
//!   about 2^32 registrations, then registering fails). An event still in a batch for a source
//!   deregistered meanwhile (by a callback of the same batch, which may register other sources
//!   in the same slot, any number of them; or before the next poll phase, for a batch
//!   `block_on` returned in the middle of, whose rest is dispatched then) is dropped at
//!   dispatch, as is one from any stale epoll registration (an fd whose open file outlived its
//!   source). Without this, such an event would hand the new owner the old one's sticky
//!   `READ_CLOSED`/`WRITE_CLOSED` bits, and its reader would spin on an "EOF" that never comes.
//! - Every source leaves epoll (`EPOLL_CTL_DEL`) while its fd is still open, before it is closed:
//!   closing alone removes an epoll registration only when the fd was the last reference to its
//!   open file (a `dup`, a child that inherited it, an fd sent over IPC keep it registered, with
//!   nothing left to remove it by). A [`Registration`] reaches its own loop through a weak
//!   reference, so this holds wherever its owner is dropped: on its loop, outside any loop (after
//!   `block_on` returned), or while another loop runs on the thread. Once the loop itself is gone
//!   there is nothing to do: its epoll instance was closed with it. Owners are `!Send` (the
//!   `Rc`s here), so all of this happens on the loop's thread.
//! - Any number of tasks may wait on one direction of a source ([`Waiters`]): the first waker
//!   is stored inline (one waiter, the usual case, costs no allocation), more go to a list, and a
//!   waker that [`will_wake`](Waker::will_wake) the same task as one stored is not stored again.
//!   Readiness of a direction wakes and forgets every waiter of it: each re-tries, and those that
//!   find `WouldBlock` clear the readiness and register again. A waiter whose future was dropped
//!   meanwhile is woken once, spuriously, and forgotten then; until that edge it stays stored
//!   (nothing tells a waker's owner has gone), so the list holds at most one entry per task that
//!   waited since the direction was last ready.
//! - The loop thread is the only one touching `IoState`.

use std::cell::{Cell, RefCell};
use std::io;
use std::panic::Location;
use std::rc::{Rc, Weak};
use std::task::Waker;
use std::time::Duration;

use mio::{Events, Interest, Poll, Token};

use crate::rt::core::Core;

pub(crate) const WAKER_TOKEN: usize = 0;
pub(crate) const READABLE: u8 = 0b0001;
pub(crate) const WRITABLE: u8 = 0b0010;
/// The peer closed its write side (EOF/hang-up): sticky, never cleared by a `WouldBlock`, so a
/// reader that stopped after a short read still sees the EOF.
pub(crate) const READ_CLOSED: u8 = 0b0100;
/// The peer stopped reading or the socket failed: sticky like `READ_CLOSED`.
pub(crate) const WRITE_CLOSED: u8 = 0b1000;

/// Bits of a token that hold the slot's key + 1; the rest hold the registration's generation.
const KEY_BITS: u32 = usize::BITS / 2;
const KEY_MASK: usize = (1 << KEY_BITS) - 1;
/// A slot's last generation: the slot is retired once its registration leaves.
const LAST_GENERATION: usize = usize::MAX >> KEY_BITS;

/// The slot key a source token names.
fn key_of(token: usize) -> usize {
    (token & KEY_MASK).wrapping_sub(1)
}

/// One slot of [`Sources`].
struct Slot {
    /// The generation of the slot's latest registration (0: none yet).
    generation: usize,
    state: Option<Rc<IoState>>,
}

/// The registered sources by key: a slab whose slots count their registrations (see the module
/// invariants).
#[derive(Default)]
struct Sources {
    slots: Vec<Slot>,
    /// Empty slots to reuse, the latest freed last (none retired).
    free: Vec<usize>,
    /// Slots holding a source.
    live: usize,
}

impl Sources {
    /// The slot the next registration takes, and its token there; `None` when the loop has no
    /// slot left.
    fn next(&self) -> Option<(usize, usize)> {
        let (key, generation) = match self.free.last() {
            Some(&key) => (key, self.slots[key].generation + 1),
            None => (self.slots.len(), 1),
        };
        (key < KEY_MASK).then_some((key, (generation << KEY_BITS) | (key + 1)))
    }

    /// Puts `state` in the slot [`next`](Self::next) named, under its token.
    fn insert(&mut self, key: usize, state: Rc<IoState>) {
        if key == self.slots.len() {
            self.slots.push(Slot {
                generation: 0,
                state: None,
            });
        } else {
            debug_assert_eq!(self.free.last(), Some(&key));
            self.free.pop();
        }
        let slot = &mut self.slots[key];
        slot.generation = state.token >> KEY_BITS;
        slot.state = Some(state);
        self.live += 1;
    }

    /// The source registered under `token`, if it still is.
    fn get(&self, token: usize) -> Option<&Rc<IoState>> {
        let state = self.slots.get(key_of(token))?.state.as_ref()?;
        (state.token == token).then_some(state)
    }

    /// Takes out the source registered under `token`, if it still is; its slot is freed, or
    /// retired after its last generation.
    fn remove(&mut self, token: usize) -> Option<Rc<IoState>> {
        self.get(token)?;
        let key = key_of(token);
        let slot = &mut self.slots[key];
        let state = slot.state.take();
        self.live -= 1;
        if slot.generation < LAST_GENERATION {
            self.free.push(key);
        }
        state
    }
}

/// The tasks waiting for one direction of a source (see the module invariants): the first
/// inline, the others in a list allocated when a second task waits.
#[derive(Default)]
pub(crate) struct Waiters {
    first: Cell<Option<Waker>>,
    /// Empty while `first` is `None`.
    more: Cell<Vec<Waker>>,
}

impl Waiters {
    /// Stores `waker` unless one that wakes the same task is stored already.
    #[inline]
    pub(crate) fn register(&self, waker: &Waker) {
        match self.first.take() {
            None => self.first.set(Some(waker.clone())),
            Some(first) => {
                let same = first.will_wake(waker);
                self.first.set(Some(first));
                if !same {
                    self.register_more(waker);
                }
            }
        }
    }

    /// A second (or later) task waiting on this direction.
    #[inline(never)]
    fn register_more(&self, waker: &Waker) {
        let mut more = self.more.take();
        if !more.iter().any(|w| w.will_wake(waker)) {
            more.push(waker.clone());
        }
        self.more.set(more);
    }

    /// Wakes and forgets every waiter.
    #[inline]
    pub(crate) fn wake_all(&self) {
        let Some(first) = self.first.take() else {
            return;
        };
        first.wake();
        let more = self.more.take();
        if !more.is_empty() {
            self.wake_more(more);
        }
    }

    #[inline(never)]
    fn wake_more(&self, mut more: Vec<Waker>) {
        for w in more.drain(..) {
            w.wake();
        }
        // The list's allocation serves the next round, unless a wake registered a waiter
        // meanwhile (a waker that polls at once, not a nodus task's).
        let fresh = self.more.replace(more);
        if !fresh.is_empty() {
            self.more.set(fresh);
        }
    }

    /// Takes every waiter out, for the caller to drop outside any borrow.
    pub(crate) fn take(&self) -> Waiters {
        Waiters {
            first: Cell::new(self.first.take()),
            more: Cell::new(self.more.take()),
        }
    }

    /// The stored wakers.
    fn into_wakers(self) -> impl Iterator<Item = Waker> {
        self.first
            .into_inner()
            .into_iter()
            .chain(self.more.into_inner())
    }

    /// How many wakers are stored.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        let first = self.first.take();
        let more = self.more.take();
        let n = usize::from(first.is_some()) + more.len();
        self.first.set(first);
        self.more.set(more);
        n
    }
}

/// The readiness and waiters of one registered source.
pub(crate) struct IoState {
    pub(crate) ready: Cell<u8>,
    pub(crate) readers: Waiters,
    pub(crate) writers: Waiters,
    pub(crate) refd: Cell<bool>,
    pub(crate) token: usize,
    /// Writability is in its epoll interest ([`Registration::watch_writes`]).
    writes_watched: Cell<bool>,
    /// Adding writability to its interest failed (the last try: a later write that finds the
    /// source full tries again): a wait for it would never end.
    watch_failed: Cell<Option<io::ErrorKind>>,
}

impl IoState {
    /// Why a wait for writability cannot be served, if it cannot.
    pub(crate) fn write_watch_error(&self) -> Option<io::Error> {
        self.watch_failed.get().map(|kind| {
            io::Error::new(
                kind,
                "nodus: cannot watch this fd for writability (epoll_ctl failed)",
            )
        })
    }
}

pub(crate) struct Reactor {
    poll: RefCell<Poll>,
    events: RefCell<Events>,
    buffer: Cell<Vec<(usize, u8)>>,
    sources: RefCell<Sources>,
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
            sources: RefCell::new(Sources::default()),
        };
        Ok((reactor, waker))
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.sources.borrow().live == 0
    }

    /// Registers `source` for reading; it starts out as ready for reading and writing (the first
    /// attempt finds out), and is watched for writability once a write found it full
    /// ([`Registration::watch_writes`]). Its token is new: no earlier registration had it.
    pub(crate) fn register(&self, source: &mut impl mio::event::Source) -> io::Result<Rc<IoState>> {
        let mut sources = self.sources.borrow_mut();
        let Some((key, token)) = sources.next() else {
            return Err(io::Error::other(
                "too many sources registered with one loop",
            ));
        };
        self.poll
            .borrow()
            .registry()
            .register(source, Token(token), Interest::READABLE)?;
        let state = Rc::new(IoState {
            ready: Cell::new(READABLE | WRITABLE),
            readers: Waiters::default(),
            writers: Waiters::default(),
            refd: Cell::new(true),
            token,
            writes_watched: Cell::new(false),
            watch_failed: Cell::new(None),
        });
        sources.insert(key, state.clone());
        Ok(state)
    }

    /// Deregisters `source` (its fd still open: see the module invariants); returns its wakers
    /// for the caller to drop outside any borrow. Empties the slot only if it still holds this
    /// registration.
    pub(crate) fn deregister(
        &self,
        source: &mut impl mio::event::Source,
        state: &IoState,
    ) -> [Waiters; 2] {
        let _ = self.poll.borrow().registry().deregister(source);
        let removed = self.sources.borrow_mut().remove(state.token);
        drop(removed);
        [state.readers.take(), state.writers.take()]
    }

    /// As if `n` sources had been registered and deregistered since the last registration, each
    /// in the slot the next registration takes.
    #[cfg(test)]
    fn skip_registrations(&self, n: usize) {
        let mut sources = self.sources.borrow_mut();
        let Some((key, token)) = sources.next() else {
            return;
        };
        if key == sources.slots.len() {
            sources.slots.push(Slot {
                generation: 0,
                state: None,
            });
            sources.free.push(key);
        }
        let last = ((token >> KEY_BITS) - 1).saturating_add(n);
        if last >= LAST_GENERATION {
            sources.free.pop();
        }
        sources.slots[key].generation = last.min(LAST_GENERATION);
    }

    /// Sources registered now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.sources.borrow().live
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
    /// `true` when every source ready at the call was reported: no signal cut the wait short
    /// and the batch did not fill the buffer (the rest would come in the next one).
    pub(crate) fn poll(
        &self,
        timeout: Option<Duration>,
        out: &mut Vec<(usize, u8)>,
    ) -> io::Result<bool> {
        let mut events = self.events.borrow_mut();
        match self.poll.borrow_mut().poll(&mut events, timeout) {
            Ok(()) => {}
            // A signal: report nothing and let the loop come round again.
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(false),
            Err(e) => return Err(e),
        }
        let mut n = 0;
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
            n += 1;
        }
        Ok(n < events.capacity())
    }

    /// Marks a source ready and wakes its waiters. An event for a registration that is gone
    /// (deregistered earlier in this batch, its key perhaps reused since) is dropped.
    pub(crate) fn dispatch(&self, token: usize, bits: u8) {
        let state = self.sources.borrow().get(token).cloned();
        let Some(state) = state else { return };
        state.ready.set(state.ready.get() | bits);
        if bits & READABLE != 0 {
            state.readers.wake_all();
        }
        if bits & WRITABLE != 0 {
            state.writers.wake_all();
        }
    }

    /// Every stored waker (shutdown).
    pub(crate) fn take_wakers(&self) -> Vec<Waker> {
        let sources: Vec<Rc<IoState>> = self
            .sources
            .borrow()
            .slots
            .iter()
            .filter_map(|s| s.state.clone())
            .collect();
        sources
            .iter()
            .flat_map(|s| [s.readers.take(), s.writers.take()])
            .flat_map(Waiters::into_wakers)
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

    /// Has its loop mark the source ready for `bits` again, waking their waiters as an event
    /// would, `delay` ns from now (an unref'd timer of that loop; nothing if the source has left
    /// it by then, or the loop is gone).
    #[track_caller]
    pub(crate) fn ready_after(&self, bits: u8, delay: u64) {
        let Some(core) = self.core.upgrade() else {
            return;
        };
        if self.gone.get() {
            return;
        }
        let (token, weak) = (self.state.token, self.core.clone());
        let again = move || {
            if let Some(core) = weak.upgrade() {
                // A token is never given twice: a source gone meanwhile gets nothing.
                core.reactor.dispatch(token, bits);
            }
        };
        crate::time::run_later_unref(&core, delay, Box::new(again), Location::caller());
    }

    /// Adds writability to `source`'s epoll interest, once: a write found it full, and the
    /// writer waits for the edge. `EPOLL_CTL_MOD` polls the fd at once, so room made before it
    /// is reported too. Until then no write edge is asked for: a Unix socket's peer reading
    /// what was sent makes one every time (`unix_write_space`), and each would wake a sleeping
    /// loop for nothing (libuv, too, asks for `EPOLLOUT` only while a write waits). A failure
    /// is kept for the waiter ([`IoState::write_watch_error`]). Nothing to do once the loop is
    /// gone, or the source left it.
    pub(crate) fn watch_writes(&self, source: &mut impl mio::event::Source) {
        if self.gone.get() || self.state.writes_watched.get() {
            return;
        }
        let Some(core) = self.core.upgrade() else {
            return;
        };
        let watched = core.reactor.poll.borrow().registry().reregister(
            source,
            Token(self.state.token),
            Interest::READABLE | Interest::WRITABLE,
        );
        match watched {
            Ok(()) => {
                self.state.writes_watched.set(true);
                self.state.watch_failed.set(None);
            }
            Err(e) => self.state.watch_failed.set(Some(e.kind())),
        }
    }

    /// Queues `callback` for its loop's close phase, whichever loop is current; dropped unrun if
    /// that loop is gone.
    pub(crate) fn close_callback(
        &self,
        callback: Box<dyn FnOnce()>,
        location: &'static Location<'static>,
    ) {
        match self.core.upgrade() {
            Some(core) => core.queue_close(callback, location),
            None => drop(callback),
        }
    }

    /// Takes `source` (whose fd must still be open) out of its loop's epoll set and slots and stops
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

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    use mio::unix::SourceFd;

    use super::*;

    /// A peer reading what a Unix socket sent makes a write edge each time; a registered
    /// source asks for none until a write found it full, then gets the edge when room is made.
    #[test]
    fn write_edges_are_asked_for_only_once_a_write_found_the_source_full() {
        use std::io::{Read, Write};
        let (reactor, _waker) = Reactor::new().unwrap();
        let (mut a, mut peer) = UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        let a_fd = a.as_raw_fd();
        let state = reactor.register(&mut SourceFd(&a_fd)).unwrap();
        let mut events = Vec::new();
        let mut buf = [0u8; 65536];
        a.write_all(b"frame").unwrap();
        assert_eq!(peer.read(&mut buf).unwrap(), 5);
        reactor.poll(Some(Duration::ZERO), &mut events).unwrap();
        assert!(
            events.is_empty(),
            "a write edge nobody asked for: {events:?}"
        );

        let mut sent = 0;
        while let Ok(n) = a.write(&buf) {
            sent += n;
        }
        // What `Registration::watch_writes` does (it needs a running loop; every test that
        // writes more than a socket holds relies on it).
        reactor
            .poll
            .borrow()
            .registry()
            .reregister(
                &mut SourceFd(&a_fd),
                Token(state.token),
                Interest::READABLE | Interest::WRITABLE,
            )
            .unwrap();
        reactor.poll(Some(Duration::ZERO), &mut events).unwrap();
        assert!(events.is_empty(), "writable while full: {events:?}");
        let mut read = 0;
        while read < sent {
            read += peer.read(&mut buf).unwrap();
        }
        await_event(
            &reactor,
            state.token,
            WRITABLE,
            "no write edge once room was made",
        );
        drop(reactor.deregister(&mut SourceFd(&a_fd), &state));
    }

    /// Polls (up to 10 s) for an event of `token` with `bit`, and returns the events polled.
    fn await_event(reactor: &Reactor, token: usize, bit: u8, missing: &str) -> Vec<(usize, u8)> {
        let mut events = Vec::new();
        reactor
            .poll(Some(Duration::from_secs(10)), &mut events)
            .unwrap();
        assert!(
            events
                .iter()
                .any(|&(t, bits)| t == token && bits & bit != 0),
            "{missing}: {events:?}"
        );
        events
    }

    /// After as many registrations in one slot as there are generations (a wrap, were the slot
    /// reused), an event still held for the slot's old source (here A's hang-up, a sticky
    /// `READ_CLOSED`) must not reach the source registered then (B, whose peer is open).
    #[test]
    fn an_old_event_never_reaches_a_source_registered_after_a_generation_wrap() {
        let (reactor, _waker) = Reactor::new().unwrap();
        let (a, peer_a) = UnixStream::pair().unwrap();
        let (b, _peer_b) = UnixStream::pair().unwrap();
        let (a_fd, b_fd) = (a.as_raw_fd(), b.as_raw_fd());
        let a_state = reactor.register(&mut SourceFd(&a_fd)).unwrap();
        drop(peer_a);
        let events = await_event(
            &reactor,
            a_state.token,
            READ_CLOSED,
            "no hang-up event for A",
        );
        drop(reactor.deregister(&mut SourceFd(&a_fd), &a_state));

        reactor.skip_registrations(usize::MAX >> KEY_BITS);
        let b_state = reactor.register(&mut SourceFd(&b_fd)).unwrap();
        b_state.ready.set(0);
        for &(token, bits) in &events {
            reactor.dispatch(token, bits);
        }
        assert_ne!(b_state.token, a_state.token, "B was given A's token");
        assert_eq!(b_state.ready.get(), 0, "A's event reached B");
        assert_ne!(
            key_of(b_state.token),
            key_of(a_state.token),
            "a slot was reused after its last generation"
        );
        drop(reactor.deregister(&mut SourceFd(&b_fd), &b_state));
        assert_eq!(reactor.len(), 0);
        assert!(reactor.is_empty(), "a retired slot counts as a source");

        // A slot short of its last generation is reused, under a new token.
        let again = reactor.register(&mut SourceFd(&b_fd)).unwrap();
        assert_eq!(key_of(again.token), key_of(b_state.token));
        assert_ne!(again.token, b_state.token);
        drop(reactor.deregister(&mut SourceFd(&b_fd), &again));
    }
}
