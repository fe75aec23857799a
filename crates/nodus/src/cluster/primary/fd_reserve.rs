//! The primary's fds kept in reserve, so that a connection flood that takes it to its open-files
//! limit cannot take the fds it needs for itself: a worker's spawn (a restart, a reload) and the
//! duplicate of a Node worker's handoff.
//!
//! Invariants:
//! - The reserve is [`RESERVE`] placeholder fds (unbound datagram sockets: no file system
//!   needed), opened at the start and held. What the accept task accepts therefore runs out
//!   (`EMFILE`) [`RESERVE`] fds below the limit, however many connections wait: with every fd
//!   held by connections waiting for a duplicate, or for a worker that cannot be started,
//!   nothing would ever free one (libuv keeps a spare fd for `accept` for the same reason).
//! - A spawn ([`FdReserve::make_room`], for the span of `Proc::spawn`) closes the placeholders
//!   and opens them again after it; a duplicate ([`FdReserve::dup`]) closes one only when it
//!   could not be made without. What could not be opened again (the worker's spawn keeps some:
//!   its channel, output pipes, notify socket, pidfd) leaves the reserve short.
//! - While the reserve is short the accept task accepts nothing ([`FdReserve::refill`], tried
//!   before each accept batch: no syscall while the reserve is full): connections wait in the
//!   kernel's backlog until fds are free again, the reserve first.
//! - A limit so low that the reserve cannot be filled, at the start or after a spawn (whose
//!   worker keeps some fds for its life), makes the reserve half of what it could take
//!   ([`FdReserve::target`]), said in a WARN line each time: the other half is left for connections and
//!   the admin listener, so such a primary still serves (one waiting for a reserve it could
//!   never fill accepted nothing, ever, with nothing open that could close).
//! - A spawn that fails for want of fds all the same (`EMFILE`, or `ENFILE`, the system's
//!   limit, which no reserve covers) is no crash of the worker: `supervise` tries it again
//!   without spending the restart budget.

use std::cell::{Cell, RefCell};
use std::io;
use std::os::fd::OwnedFd;

/// The fds the reserve holds: a worker's spawn opens at most 11 at once in the primary (its
/// channel's socket pair, two output pipes, the exec-failure pipe, `/dev/null` for its stdin,
/// its notify socket; then its pidfd and board), a plain program's workers one more per
/// listener passed; plus a Node handoff's duplicate and a margin.
pub(super) const RESERVE: usize = 16;

/// The placeholder fds (see the module docs), and how many it keeps.
pub(super) struct FdReserve(RefCell<Vec<OwnedFd>>, Cell<usize>);

impl FdReserve {
    /// A reserve of [`RESERVE`] placeholders, or of half the fds free if that is fewer.
    pub fn new() -> FdReserve {
        let reserve = FdReserve(
            RefCell::new(Vec::with_capacity(RESERVE)),
            Cell::new(RESERVE),
        );
        reserve.fill_or_shrink();
        reserve
    }

    /// Fills the reserve; if the limit does not let it, keeps half of what it got (see the
    /// module docs).
    fn fill_or_shrink(&self) {
        if self.refill() {
            return;
        }
        let got = self.held();
        let target = got / 2;
        self.1.set(target);
        self.0.borrow_mut().truncate(target);
        tracing::warn!(
            target: "nodus::cluster",
            "the open-files limit leaves the primary {got} fds for the {RESERVE} it keeps for its \
             own spawns: it keeps {target}, the rest for connections, and a restart may wait for \
             fds (raise the limit: LimitNOFILE=, ulimit -n)"
        );
    }

    /// How many placeholders the reserve keeps.
    pub fn target(&self) -> usize {
        self.1.get()
    }

    /// A cheap fd: an unbound datagram socket.
    fn open() -> Option<OwnedFd> {
        std::os::unix::net::UnixDatagram::unbound()
            .ok()
            .map(OwnedFd::from)
    }

    /// Opens placeholders until the reserve is full: whether it is (no syscall when it was).
    pub fn refill(&self) -> bool {
        let mut held = self.0.borrow_mut();
        while held.len() < self.1.get() {
            match FdReserve::open() {
                Some(fd) => held.push(fd),
                None => return false,
            }
        }
        true
    }

    /// How many placeholders are held.
    pub fn held(&self) -> usize {
        self.0.borrow().len()
    }

    /// Frees the reserve's fds for a spawn; they are taken again when the guard drops.
    pub fn make_room(&self) -> Room<'_> {
        self.0.borrow_mut().clear();
        Room(self)
    }

    /// A duplicate of `fd`. When the first try fails (out of fds: a dup of an open fd fails for
    /// nothing else) one placeholder is closed to make room; the reserve is refilled after.
    pub fn dup(&self, fd: &OwnedFd) -> io::Result<OwnedFd> {
        let copy = match fd.try_clone() {
            Ok(copy) => copy,
            Err(e) => {
                if self.0.borrow_mut().pop().is_none() {
                    return Err(e);
                }
                fd.try_clone()?
            }
        };
        self.refill();
        Ok(copy)
    }
}

/// The reserve's fds freed for a spawn ([`FdReserve::make_room`]); refilled on drop.
pub(super) struct Room<'a>(&'a FdReserve);

impl Drop for Room<'_> {
    fn drop(&mut self) {
        self.0.fill_or_shrink();
    }
}

#[cfg(test)]
mod tests {
    use super::{FdReserve, RESERVE};

    #[test]
    fn a_spawns_room_is_the_whole_reserve_and_is_taken_again_after() {
        let reserve = FdReserve::new();
        assert_eq!(reserve.held(), RESERVE);
        {
            let _room = reserve.make_room();
            assert_eq!(reserve.held(), 0);
        }
        assert_eq!(reserve.held(), RESERVE);
        assert!(reserve.refill());
    }
}
