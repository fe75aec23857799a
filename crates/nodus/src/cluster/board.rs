//! A worker's board: one page of memory a nodus primary shares with one nodus worker (a `memfd`
//! sent over the channel), where the worker posts what the primary would otherwise need a
//! message for: which connection batches it has taken, how many it refused, and (for `least`)
//! its open connections.
//!
//! Why: under round-robin a `took` message per loop turn cost the worker a `sendmsg` and the
//! primary a wake-up and two `recvmsg` for every few connections. A store to shared memory costs
//! neither, and the primary reads the board whenever it runs anyway (every accept wake-up, a
//! short release timer, a worker's exit). The board also outlives the worker: after a crash the
//! primary still reads exactly which batches the worker had taken.
//!
//! Invariants:
//! - The worker only writes, the primary only reads; every field only grows except `open`.
//! - `taken_below` is stored (`Release`) after the batch's fds are in the worker's fd table, so a
//!   primary that reads (`Acquire`) `taken_below > seq` may drop its own reference to batch `seq`:
//!   the worker holds the connection (or refused it, see next).
//! - A refusal is counted in `refused` before any later `taken_below` store, and the `refused`
//!   message naming the batch is sent after it: a primary that sees more refusals than it has
//!   handled releases nothing until those messages arrive (the refused batch must go to another
//!   worker, from the primary's references).
//! - The page is mapped `MAP_SHARED` from a `memfd` of exactly [`Board::LEN`] bytes; a board
//!   that is too small is refused when opened, never read out of bounds.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

/// The shared page's layout (both ends are the same build, or the primary sends no board).
#[repr(C)]
struct Page {
    taken_below: AtomicU64,
    refused: AtomicU64,
    /// Non-zero once the worker counts its connections (the primary asked for load reports).
    counting: AtomicU64,
    open: AtomicU64,
    accepted: AtomicU64,
}

/// One end of a board (the primary's or the worker's mapping).
pub(crate) struct Board {
    page: NonNull<Page>,
}

impl Board {
    /// Bytes of the shared file: one page.
    pub const LEN: usize = 4096;

    /// A new board (the primary's end) and the fd that gives it to a worker.
    pub fn create() -> io::Result<(Board, OwnedFd)> {
        let fd = rustix::fs::memfd_create(
            "nodus-board",
            rustix::fs::MemfdFlags::CLOEXEC | rustix::fs::MemfdFlags::ALLOW_SEALING,
        )?;
        rustix::fs::ftruncate(&fd, Self::LEN as u64)?;
        // A worker cannot shrink it under the primary's mapping (a read past the file's end
        // would be SIGBUS).
        rustix::fs::fcntl_add_seals(
            &fd,
            rustix::fs::SealFlags::SHRINK | rustix::fs::SealFlags::GROW,
        )?;
        let board = Board::map(&fd)?;
        Ok((board, fd))
    }

    /// The worker's end of a board a primary sent.
    ///
    /// # Errors
    /// `fd` is not a memfd of [`Board::LEN`] bytes sealed against shrinking (a mapping of a file
    /// that shrinks faults on access), or cannot be mapped.
    pub fn open(fd: OwnedFd) -> io::Result<Board> {
        let size = rustix::fs::fstat(&fd)?.st_size;
        if usize::try_from(size).ok() != Some(Self::LEN) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a cluster board must be {} bytes, got {size}", Self::LEN),
            ));
        }
        let sealed = rustix::fs::fcntl_get_seals(&fd)
            .is_ok_and(|seals| seals.contains(rustix::fs::SealFlags::SHRINK));
        if !sealed {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "a cluster board must be sealed against shrinking",
            ));
        }
        Board::map(&fd)
    }

    fn map(fd: &impl AsFd) -> io::Result<Board> {
        // SAFETY: a fresh shared mapping of a file of `LEN` bytes that cannot shrink (size and
        // seal set by `create`, checked by `open`); nothing else aliases it in this process, and
        // it is unmapped only in `Drop`.
        let ptr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                Self::LEN,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::SHARED,
                fd,
                0,
            )?
        };
        let page =
            NonNull::new(ptr.cast::<Page>()).ok_or_else(|| io::Error::other("mmap gave null"))?;
        Ok(Board { page })
    }

    fn page(&self) -> &Page {
        // SAFETY: the mapping is page-aligned, `LEN` bytes long (more than `Page`), lives as long
        // as `self`, and every field is an atomic, so a concurrent writer in the other process is
        // fine.
        unsafe { self.page.as_ref() }
    }

    /// Worker: every batch with a `seq` below `seq_end` is taken (or refused and counted).
    pub fn post_taken_below(&self, seq_end: u64) {
        self.page()
            .taken_below
            .fetch_max(seq_end, Ordering::Release);
    }

    /// Worker: one more batch refused (before its `refused` message is sent).
    pub fn post_refusal(&self) {
        self.page().refused.fetch_add(1, Ordering::Release);
    }

    /// Worker: its open connections and how many it accepted in total.
    pub fn post_load(&self, open: u64, accepted: u64) {
        let p = self.page();
        p.open.store(open, Ordering::Relaxed);
        p.accepted.store(accepted, Ordering::Relaxed);
        p.counting.store(1, Ordering::Release);
    }

    /// Primary: every batch below the returned `seq` may be released, or `None` while a refusal
    /// the worker posted has not been handled yet (`refusals_handled` counts the `refused`
    /// messages the primary has handled; the refused batch must go elsewhere first). `refused` is
    /// read after `taken_below`, so every refusal of a batch below it is counted.
    pub fn releasable_below(&self, refusals_handled: u64) -> Option<u64> {
        let p = self.page();
        let below = p.taken_below.load(Ordering::Acquire);
        (p.refused.load(Ordering::Acquire) == refusals_handled).then_some(below)
    }

    /// Primary, once the worker's channel has ended: every batch below the returned `seq` was
    /// taken (the refusal gate of [`Board::releasable_below`] no longer applies).
    pub fn taken_below(&self) -> u64 {
        self.page().taken_below.load(Ordering::Acquire)
    }

    /// Primary: the worker's (open, accepted in total), once it counts.
    pub fn load(&self) -> Option<(u64, u64)> {
        let p = self.page();
        (p.counting.load(Ordering::Acquire) != 0).then(|| {
            (
                p.open.load(Ordering::Relaxed),
                p.accepted.load(Ordering::Relaxed),
            )
        })
    }
}

impl Drop for Board {
    fn drop(&mut self) {
        // SAFETY: `page` is the start of a mapping of `LEN` bytes made in `map`, not used after
        // this (no reference outlives `&self`).
        let _ = unsafe { rustix::mm::munmap(self.page.as_ptr().cast(), Self::LEN) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_worker_posts_the_primary_reads_through_the_shared_file() {
        let (primary, fd) = Board::create().unwrap();
        let worker = Board::open(fd).unwrap();
        assert_eq!(primary.releasable_below(0), Some(0));
        assert_eq!(primary.load(), None);
        worker.post_taken_below(5);
        worker.post_taken_below(3); // never goes back
        worker.post_load(7, 40);
        assert_eq!(primary.releasable_below(0), Some(5));
        assert_eq!(primary.load(), Some((7, 40)));
        drop(worker);
        // The primary's end outlives the worker's.
        assert_eq!(primary.releasable_below(0), Some(5));
    }

    #[test]
    fn nothing_is_released_while_a_posted_refusal_is_unhandled() {
        let (primary, fd) = Board::create().unwrap();
        let worker = Board::open(fd).unwrap();
        worker.post_taken_below(2);
        // Batch 2 refused, batch 3 taken: until the primary has handled the `refused` message
        // for batch 2, releasing "below 4" would drop the references batch 2 still needs.
        worker.post_refusal();
        worker.post_taken_below(4);
        assert_eq!(primary.releasable_below(0), None);
        assert_eq!(primary.releasable_below(1), Some(4));
        // Once the channel has ended, the gate no longer holds anything back.
        assert_eq!(primary.taken_below(), 4);
    }

    #[test]
    fn a_board_of_the_wrong_size_is_refused() {
        let fd = rustix::fs::memfd_create("short", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&fd, 8).unwrap();
        let err = Board::open(fd).err().expect("refused");
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(err.to_string().contains("4096"), "{err}");
    }

    #[test]
    fn an_unsealed_board_is_refused() {
        let fd = rustix::fs::memfd_create("unsealed", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&fd, Board::LEN as u64).unwrap();
        let err = Board::open(fd).err().expect("refused");
        assert!(err.to_string().contains("sealed"), "{err}");
    }

    #[test]
    fn a_worker_cannot_shrink_the_primarys_board() {
        let (_primary, fd) = Board::create().unwrap();
        assert!(rustix::fs::ftruncate(&fd, 0).is_err());
    }
}
