//! A worker's board: one page of memory a nodus primary shares with one nodus worker (a `memfd`
//! sent over the channel), where the worker posts what the primary would otherwise need a
//! message for: which connection batches it has taken, how many it refused, and (for `least`)
//! its open connections; and where the two agree on who owns a batch the worker was slow to
//! take (the primary takes it back once it has waited its handoff deadline for the worker's
//! loop).
//!
//! Why: under round-robin a `took` message per loop turn cost the worker a `sendmsg` and the
//! primary a wake-up and two `recvmsg` for every few connections. A store to shared memory costs
//! neither, and the primary reads the board whenever it runs anyway (every accept wake-up, a
//! short release timer, a worker's exit). The board also outlives the worker: after a crash the
//! primary still reads exactly which batches the worker had taken.
//!
//! Invariants:
//! - Every field only grows except `open` and `loop_hold`. The worker writes all but `settled_below`, which both
//!   ends move, each only forward and only by compare-and-swap.
//! - `settled_below`: every batch below it is settled, taken by the worker or taken back by the
//!   primary, once and for good. Batches reach the worker in `seq` order, so a worker holding
//!   batch `seq` finds it at most `seq` unless the primary took it back. The worker claims batch
//!   `seq` ([`Board::claim`]) by moving it from a value at most `seq` to `seq + 1`, after the
//!   batch's fds are in its fd table; the primary takes back every batch below `end`
//!   ([`Board::take_back_below`]) by moving it from `v < end` to `end`: batches below `v` were
//!   the worker's, those in `v..end` are the primary's again. One swap wins: a batch is never
//!   both served by the worker and handed on. A worker that loses closes its copies of the fds
//!   (never `shutdown`: the connection is another worker's) and posts `seen_below`.
//! - A primary that reads (`Acquire`) `settled_below > seq` for a batch it has not taken back may
//!   drop its own reference to it: the worker holds the connection (or refused it, see next).
//! - A refusal is counted in `refused` before any later `settled_below` store, and the `refused`
//!   message naming the batch is sent after it: a primary that sees more refusals than it has
//!   handled releases nothing until those messages arrive (the refused batch must go to another
//!   worker, from the primary's references). A refused batch does not move `settled_below`.
//! - `seen_below` is past every batch the worker has refused or found taken back: once it reaches
//!   the end of a take-back, the worker's loop has run again since.
//! - The page is mapped `MAP_SHARED` from a `memfd` of exactly [`Board::LEN`] bytes; a board
//!   that is too small is refused when opened, never read out of bounds.
//! - `loop_hold` is the worker loop's hold (`watchdog::HoldMirror`: a callback and the drain
//!   after it), stored by the loop thread as it opens and closes: its start (`nodus::clock` ns,
//!   the primary's clock too), or 1 while it holds nothing. 0: no loop mirrors to it (a build
//!   before it, measurements compiled out, or the mirror was dropped). Round-robin pipelines connections to a worker
//!   only while its loop is in no long hold (`primary::balance`).
//! - The layout ([`Page`]: its fields, their order, offsets and meanings) is version 1, the
//!   `board: 1` a worker's `queryServer` carries; the two ends may be different builds (a
//!   rolling reload runs the binary on disk under the primary that started), so a field is
//!   never changed nor moved. A field may be appended, its 0 (the fresh page's) meaning that
//!   the other end does not write it: an end of an older build neither reads nor writes it.
//!   A layout that changes takes another number: a primary sends a board only of the version
//!   a worker asked for, and a worker asks only for one it knows, so an end that does not know
//!   the other's number goes without a board (`took` and `load` messages), never misreads one.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

/// The shared page's layout, version 1 (`board: 1`): fixed, whatever build either end is.
#[repr(C)]
struct Page {
    settled_below: AtomicU64,
    refused: AtomicU64,
    seen_below: AtomicU64,
    /// Non-zero once the worker counts its connections (the primary asked for load reports).
    counting: AtomicU64,
    open: AtomicU64,
    accepted: AtomicU64,
    /// Appended: the worker loop's hold (see the module docs).
    loop_hold: AtomicU64,
}

/// What a worker's board says of its loop's hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LoopHold {
    /// The worker does not say (an older build, or measurements compiled out).
    Unknown,
    /// Its loop holds nothing: it waits for events, or is between two callbacks.
    None,
    /// Its loop has been in one callback and its drain since this time (`nodus::clock` ns).
    Since(u64),
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

    /// Worker: claims batch `seq` (its fds are in this process's fd table). `false`: the primary
    /// took it back first (the worker was too slow); the worker closes its copies of the fds,
    /// without `shutdown`, and says so with [`Board::post_seen`].
    pub fn claim(&self, seq: u64) -> bool {
        let word = &self.page().settled_below;
        let mut settled = word.load(Ordering::Acquire);
        loop {
            if settled > seq {
                return false;
            }
            match word.compare_exchange_weak(settled, seq + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return true,
                Err(now) => settled = now,
            }
        }
    }

    /// Worker: batch `seq` was refused or found taken back (after the `refused` count, if any).
    pub fn post_seen(&self, seq: u64) {
        self.page()
            .seen_below
            .fetch_max(seq.saturating_add(1), Ordering::Release);
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

    /// Worker: the word its loop's holds are mirrored to (`watchdog::HoldMirror`).
    pub fn hold_word(&self) -> &AtomicU64 {
        &self.page().loop_hold
    }

    /// Primary: the worker loop's hold, as its loop last stored it.
    pub fn loop_hold(&self) -> LoopHold {
        match self.page().loop_hold.load(Ordering::Acquire) {
            0 => LoopHold::Unknown,
            crate::watchdog::MIRROR_NO_HOLD => LoopHold::None,
            since => LoopHold::Since(since),
        }
    }

    /// Primary: every batch below the returned `seq` may be released, or `None` while a refusal
    /// the worker posted has not been handled yet (`refusals_handled` counts the `refused`
    /// messages the primary has handled; the refused batch must go elsewhere first). `refused` is
    /// read after `settled_below`, so every refusal of a batch below it is counted. Batches the
    /// primary took back are its own again (no longer pending): this says nothing of them.
    pub fn releasable_below(&self, refusals_handled: u64) -> Option<u64> {
        let p = self.page();
        let below = p.settled_below.load(Ordering::Acquire);
        (p.refused.load(Ordering::Acquire) == refusals_handled).then_some(below)
    }

    /// Primary, once the worker's channel has ended: every batch below the returned `seq` was
    /// taken or taken back (the refusal gate of [`Board::releasable_below`] no longer applies).
    pub fn settled_below(&self) -> u64 {
        self.page().settled_below.load(Ordering::Acquire)
    }

    /// Primary: takes back every batch below `end` the worker has not claimed. Returns where the
    /// worker's claims ended: batches below it are the worker's (taken, or refused), those from
    /// it to `end` are the primary's again (none when it is `end` or more).
    pub fn take_back_below(&self, end: u64) -> u64 {
        let word = &self.page().settled_below;
        let mut settled = word.load(Ordering::Acquire);
        loop {
            if settled >= end {
                return settled;
            }
            match word.compare_exchange_weak(settled, end, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return settled,
                Err(now) => settled = now,
            }
        }
    }

    /// Primary: the worker has seen (refused or found taken back) every batch below this.
    pub fn seen_below(&self) -> u64 {
        self.page().seen_below.load(Ordering::Acquire)
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
    use std::sync::atomic::AtomicBool;

    use super::*;

    #[test]
    fn what_a_worker_posts_the_primary_reads_through_the_shared_file() {
        let (primary, fd) = Board::create().unwrap();
        let worker = Board::open(fd).unwrap();
        assert_eq!(primary.releasable_below(0), Some(0));
        assert_eq!(primary.load(), None);
        assert!(worker.claim(0));
        assert!(worker.claim(4));
        worker.post_load(7, 40);
        assert_eq!(primary.releasable_below(0), Some(5));
        assert_eq!(primary.load(), Some((7, 40)));
        drop(worker);
        // The primary's end outlives the worker's.
        assert_eq!(primary.releasable_below(0), Some(5));
    }

    /// A worker's loop mirrors its holds on its board: the primary's end sees the hold the
    /// loop is in while it runs a task, none while it waits for a timer, and "not mirrored"
    /// once the mirror is dropped (with measurements compiled out there is nothing to mirror:
    /// 0 stays).
    #[test]
    fn a_worker_loop_s_holds_show_on_the_primary_s_end() {
        let (primary, fd) = Board::create().unwrap();
        let elsewhere = fd.try_clone().unwrap();
        let worker = Board::open(fd).unwrap();
        assert_eq!(primary.loop_hold(), LoopHold::Unknown);
        if !cfg!(feature = "measure") {
            crate::Runtime::new().block_on(async {
                // SAFETY: `worker` outlives the mirror, which is none anyway.
                let mirror = unsafe { crate::watchdog::HoldMirror::start(worker.hold_word()) };
                assert!(mirror.is_none());
            });
            assert_eq!(primary.loop_hold(), LoopHold::Unknown);
            return;
        }
        let waiting = AtomicBool::new(false);
        std::thread::scope(|scope| {
            // The primary's look from another thread while the loop sleeps.
            let idle_seen = scope.spawn(|| {
                let primary = Board::open(elsewhere).unwrap();
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
                while std::time::Instant::now() < deadline {
                    if waiting.load(Ordering::Acquire) && primary.loop_hold() == LoopHold::None {
                        return true;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                false
            });
            crate::Runtime::new().block_on(async {
                // SAFETY: `worker` outlives the mirror, dropped in this block.
                let mirror = unsafe { crate::watchdog::HoldMirror::start(worker.hold_word()) };
                let LoopHold::Since(first) = primary.loop_hold() else {
                    panic!(
                        "in a task's poll, the loop holds: {:?}",
                        primary.loop_hold()
                    );
                };
                assert!(first >= 2 && first <= crate::clock::now_ns());
                waiting.store(true, Ordering::Release);
                while !idle_seen.is_finished() {
                    crate::time::sleep(std::time::Duration::from_millis(5)).await;
                }
                let LoopHold::Since(later) = primary.loop_hold() else {
                    panic!("after the sleep, a new hold: {:?}", primary.loop_hold());
                };
                assert!(later > first, "the hold after the sleep began later");
                drop(mirror);
                assert_eq!(primary.loop_hold(), LoopHold::Unknown, "no longer mirrored");
                crate::time::sleep(std::time::Duration::from_millis(5)).await;
                assert_eq!(
                    primary.loop_hold(),
                    LoopHold::Unknown,
                    "nothing stored since"
                );
            });
            assert!(
                idle_seen.join().unwrap(),
                "the loop waiting showed as no hold"
            );
        });
    }

    #[test]
    fn nothing_is_released_while_a_posted_refusal_is_unhandled() {
        let (primary, fd) = Board::create().unwrap();
        let worker = Board::open(fd).unwrap();
        assert!(worker.claim(1));
        // Batch 2 refused, batch 3 taken: until the primary has handled the `refused` message
        // for batch 2, releasing "below 4" would drop the references batch 2 still needs.
        worker.post_refusal();
        assert!(worker.claim(3));
        assert_eq!(primary.releasable_below(0), None);
        assert_eq!(primary.releasable_below(1), Some(4));
        // Once the channel has ended, the gate no longer holds anything back.
        assert_eq!(primary.settled_below(), 4);
    }

    #[test]
    fn a_batch_taken_back_cannot_be_claimed_and_one_claimed_cannot_be_taken_back() {
        let (primary, fd) = Board::create().unwrap();
        let worker = Board::open(fd).unwrap();
        assert!(worker.claim(2));
        // Batches 5 and 7 were handed; the worker took neither in time.
        assert_eq!(primary.take_back_below(8), 3, "below 3: the worker's");
        assert!(!worker.claim(5));
        worker.post_seen(5);
        assert_eq!(primary.seen_below(), 6);
        assert!(!worker.claim(7));
        worker.post_seen(7);
        assert_eq!(primary.seen_below(), 8);
        // The next batch is the worker's to take, and then it cannot be taken back.
        assert!(worker.claim(9));
        assert_eq!(primary.take_back_below(10), 10, "nothing to take back");
        assert_eq!(primary.settled_below(), 10);
    }

    /// The worker claims batches in `seq` order as they are "sent" while the primary takes back
    /// below what it has sent, on two threads through two mappings of one board: every batch
    /// ends with exactly one owner, the worker's claim or the primary's take-back (from the mark
    /// it returned to the end it asked), and the marks never go back. Most batches are contested
    /// (taken back right after they are sent, as the worker reaches for them); the last ones are
    /// left to the worker.
    /// Whether the two sides both won somewhere is up to the scheduler (on a loaded machine the
    /// worker's thread may not run while the primary sends): a run where one side always won
    /// tested nothing, and is tried again, a few times at most.
    #[test]
    fn a_batch_is_claimed_or_taken_back_never_both_nor_neither() {
        let contested = (0..8).any(|_| claims_race_taking_back());
        assert!(contested, "in 8 runs, one side always won: nothing tested");
    }

    /// One run of the race above, its invariants asserted; whether both sides won batches.
    fn claims_race_taking_back() -> bool {
        const BATCHES: usize = 2_000_000;
        const UNCONTESTED: usize = 1000;
        let (primary, fd) = Board::create().unwrap();
        let sent = AtomicU64::new(0);
        let started = AtomicBool::new(false);
        let claimed: Vec<AtomicBool> = (0..BATCHES).map(|_| AtomicBool::new(false)).collect();
        let mut taken_back = vec![false; BATCHES];
        let mut went_back = None;
        std::thread::scope(|s| {
            s.spawn(|| {
                let worker = Board::open(fd).unwrap();
                started.store(true, Ordering::Release);
                let mut next = 0;
                while next < BATCHES {
                    let upto = sent.load(Ordering::Acquire) as usize;
                    for (seq, claimed) in claimed.iter().enumerate().take(upto).skip(next) {
                        if worker.claim(seq as u64) {
                            claimed.store(true, Ordering::Relaxed);
                        } else {
                            worker.post_seen(seq as u64);
                        }
                    }
                    next = upto;
                    std::hint::spin_loop();
                }
            });
            while !started.load(Ordering::Acquire) {
                std::hint::spin_loop();
            }
            let mut last_mark = 0;
            for seq in 0..BATCHES {
                sent.store(seq as u64 + 1, Ordering::Release);
                if seq % 5 != 0 && seq < BATCHES - UNCONTESTED {
                    let end = seq as u64 + 1;
                    let mark = primary.take_back_below(end);
                    if mark < last_mark {
                        went_back = Some((last_mark, mark));
                        // The worker goes through the rest and ends.
                        sent.store(BATCHES as u64, Ordering::Release);
                        break;
                    }
                    last_mark = end.max(mark);
                    for t in &mut taken_back[mark.min(end) as usize..end as usize] {
                        *t = true;
                    }
                }
            }
        });
        assert_eq!(went_back, None, "the mark went back (from, to)");
        let mut last_taken_back = None;
        for (seq, (c, t)) in claimed.iter().zip(&taken_back).enumerate() {
            let c = c.load(Ordering::Relaxed);
            assert!(c != *t, "batch {seq}: claimed {c}, taken back {t}");
            if *t {
                last_taken_back = Some(seq);
            }
        }
        let Some(last_taken_back) = last_taken_back else {
            return false; // the worker always won
        };
        // The worker has seen every batch it lost.
        assert_eq!(primary.seen_below(), last_taken_back as u64 + 1);
        // Unless the primary always won.
        taken_back[..BATCHES - UNCONTESTED].contains(&false)
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
