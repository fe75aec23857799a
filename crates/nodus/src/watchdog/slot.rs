//! `LoopSlot`: a loop's published "what am I running since when" record, read by the watchdog
//! thread, and the loop's side of the busy/idle count that lets the watchdog park.
//!
//! The record has two levels. The *hold* is a macrotask callback and the drain after it (or a
//! drain alone): the loop has not left it since `hold_ns`, however many task polls and closures
//! ran in it. The *poll* is the task poll, callback or closure that began last in that hold. A
//! stall is a hold longer than the threshold (DESIGN.md section 3); the polls name what held it.
//!
//! The slot is a seqlock: `begin` makes the sequence odd, writes the record, then makes it even
//! with a release store; the watchdog (`read`) keeps a record only if the sequence was even and
//! unchanged around its loads. The loop never waits and never makes a syscall: a slot update is a
//! handful of plain stores on x86-64.
//!
//! Invariants:
//! - `begin`, `begin_in_hold`, `end`, `end_hold`, `enter_idle` and `leave_idle` run on the loop
//!   thread (the single writer) and never allocate, lock or make a syscall, except `leave_idle`
//!   unparking a parked watchdog (once per idle period).
//! - `hold_ns == 0` means the loop holds nothing (`begin` stores at least 1). The first `begin`
//!   after that opens a hold: it writes `hold_ns`, `hold_seq` (its own sequence) and the opener's
//!   name and location inside its seqlock window; later `begin`s leave them alone. `end_hold`
//!   (the drain returned, or the loop stopped running) closes it with one store. A closure after
//!   the first of its batch is inside a hold already and skips the check (`begin_in_hold`): a
//!   chained closure pays nothing for holds. Every `begin` adds 2 to the sequence, so a hold has
//!   run `(seq - hold_seq) / 2 + 1` polls: counting them costs the loop nothing.
//! - `start_ns == 0` means no poll is in progress (between two polls of a hold, or no hold).
//! - A hold that lasted at least the threshold leaves its end time and poll count in
//!   `long_end_ns` / `long_end_polls`, tagged with its `hold_seq` in `long_end_seq` (stored last,
//!   with release): the watchdog, seeing that hold over, reads the exact end instead of its own
//!   later tick. A later long hold overwrites them; a reader that finds another hold's sequence
//!   keeps its own estimate.
//! - A registered slot counts once in `ACTIVITY` while not idle; `flags` (`IDLE` | `REGISTERED`)
//!   records which, so the count stays balanced through `enter_idle`/`leave_idle` and `drop`.
//! - The name and location pointers always come from a `&'static str` and a
//!   `&'static Location<'static>`, which is what makes `read`'s `unsafe` sound.
//! - The stall counts by class (`count_stall`) are the watchdog's: it alone writes them, when it
//!   sees a stall end, under the `RING` lock, under which the loop's snapshot reads them with
//!   the ring buffer's entries (a stall shown ended by the watchdog is counted).
//! - A task's note (`nodus::task::set_note`) is a `&'static str` prefix, published by pointer as
//!   names are, and a dynamic text, which no pointer could share soundly: it is copied into the
//!   slot's own words. Both are written under a second seqlock (`note_seq`), tagged with the
//!   sequence of the poll they were set in (`note_tag`): the note names that poll only, and a
//!   `begin` leaves it alone (a poll that set no note has another sequence). `set_note` writes it during
//!   a poll, `republish_note` right after `begin` for a task that kept one from an earlier poll;
//!   `clear_note` is one store (`NOTE_CLEARED` in `note_len`). Neither waits, allocates nor makes
//!   a syscall, and `begin` and `end` do not touch the note: a poll without one pays nothing.
//! - A hold mirror (`mirror_holds`, a cluster worker's board) gets the same hold as `hold_ns`,
//!   in the same store sequence, from the loop thread only: its start when it opens, "none"
//!   when it closes, 0 ("not mirrored") when it is unset. The caller of `mirror_holds` keeps the
//!   word valid until it unsets it.

use std::panic::Location;
use std::sync::Arc;
use std::sync::atomic::{AtomicPtr, AtomicU8, AtomicU64, AtomicUsize, Ordering, fence};
use std::time::Duration;

use super::note::{self, NOTE_MAX, NOTE_WORDS, Note};
use super::{ACTIVITY, PARKED, StallClass, StallCounts, WATCHDOG, freeze, wake_parked_watchdog};

/// Thresholds below this are raised to it: shorter polls are the slow-poll log's business.
const MIN_THRESHOLD_NS: u64 = 10_000_000;
/// Attempts at a consistent slot read before giving up until the next tick.
const READ_RETRIES: u32 = 64;
/// In `note_len`: the note was cleared in the poll that set it.
const NOTE_CLEARED: u64 = 1 << 63;

/// A loop's published "what am I running since when" record, read by the watchdog thread.
#[repr(align(64))]
pub(crate) struct LoopSlot {
    pub(super) loop_id: u64,
    pub(super) tid: i32,
    pub(super) threshold_ns: u64,
    /// Seqlock sequence: odd while `begin` writes the fields below.
    seq: AtomicU64,
    task_id: AtomicU64,
    name_ptr: AtomicPtr<u8>,
    name_len: AtomicUsize,
    location: AtomicPtr<Location<'static>>,
    /// Poll start (`now_ns`), 0 when no poll is in progress.
    start_ns: AtomicU64,
    /// Start of the hold in progress (`now_ns`), 0 when the loop holds nothing.
    hold_ns: AtomicU64,
    /// The sequence the hold's first `begin` left, and that poll's name and location.
    hold_seq: AtomicU64,
    opener_ptr: AtomicPtr<u8>,
    opener_len: AtomicUsize,
    opener_location: AtomicPtr<Location<'static>>,
    /// End time and poll count of the latest hold that lasted at least `threshold_ns`, and that
    /// hold's `hold_seq`.
    long_end_ns: AtomicU64,
    long_end_polls: AtomicU64,
    long_end_seq: AtomicU64,
    /// `IDLE` | `REGISTERED`, written by the loop thread only (plain loads and stores). The slot
    /// counts in `ACTIVITY` while registered and not idle.
    pub(super) flags: AtomicU8,
    /// The note's seqlock sequence: odd while `set_note` or `republish_note` writes the fields
    /// below (`clear_note` sets a bit of `note_len` alone).
    note_seq: AtomicU64,
    /// The `seq` of the poll the note was set in: it names that poll only.
    note_tag: AtomicU64,
    /// The note's text length in bytes, with `NOTE_CLEARED` once cleared.
    note_len: AtomicU64,
    /// The note's static prefix (from a `&'static str`), and its text's bytes.
    note_prefix_ptr: AtomicPtr<u8>,
    note_prefix_len: AtomicUsize,
    note_words: [AtomicU64; NOTE_WORDS],
    /// Stalls of this loop the watchdog has seen end, by final class (`StallClass` as index):
    /// written by the watchdog under the `RING` lock, read by the loop's snapshot under it.
    stalls: [AtomicU64; StallClass::ALL.len()],
    /// Where the hold's start is mirrored for another process (a cluster worker's board: see
    /// [`LoopSlot::mirror_holds`]), null for nowhere. Written and used by the loop thread only.
    mirror: AtomicPtr<AtomicU64>,
}

/// In a hold mirror: the loop holds nothing (idle, or between two holds). 0 there means no loop
/// publishes to it, and a hold's start is at least 2.
pub(crate) const MIRROR_NO_HOLD: u64 = 1;

pub(super) const IDLE: u8 = 1;
pub(super) const REGISTERED: u8 = 2;

/// A consistent read of a slot.
pub(super) enum SlotRead {
    /// The loop holds nothing.
    Idle,
    Held(HoldView),
    /// The loop was writing the slot at every attempt (it was preempted mid-`begin`).
    Torn,
}

/// A hold in progress and the poll that began last in it.
#[derive(Clone, Copy)]
pub(super) struct HoldView {
    /// The (even) sequence the latest `begin` left: identifies the latest poll.
    pub(super) seq: u64,
    pub(super) task_id: u64,
    pub(super) name: &'static str,
    pub(super) location: &'static Location<'static>,
    /// The latest poll's start, 0 if it has returned (the loop is between two polls).
    pub(super) start_ns: u64,
    /// The sequence the hold's first `begin` left: identifies the hold.
    pub(super) hold_seq: u64,
    pub(super) hold_ns: u64,
    /// The poll or callback that opened the hold.
    pub(super) opener: &'static str,
    pub(super) opener_location: &'static Location<'static>,
    /// The note of the latest poll (set in it and not cleared), empty if none.
    pub(super) note: Note,
}

impl HoldView {
    /// Polls begun in the hold so far.
    pub(super) fn polls(&self) -> u64 {
        polls_between(self.hold_seq, self.seq)
    }
}

/// Polls begun from the one that left `hold_seq` to the one that left `seq`, both included.
fn polls_between(hold_seq: u64, seq: u64) -> u64 {
    seq.wrapping_sub(hold_seq) / 2 + 1
}

impl LoopSlot {
    /// Called on the loop thread at loop creation; records the loop thread's tid. A threshold below
    /// 10 ms is raised to 10 ms (shorter slow polls are the slow-poll log's business).
    pub(crate) fn new(loop_id: u64, threshold: Duration) -> Arc<LoopSlot> {
        let threshold_ns = u64::try_from(threshold.as_nanos()).unwrap_or(u64::MAX);
        let here = std::ptr::from_ref(Location::caller()).cast_mut();
        Arc::new(LoopSlot {
            loop_id,
            tid: rustix::thread::gettid().as_raw_pid(),
            threshold_ns: threshold_ns.max(MIN_THRESHOLD_NS),
            seq: AtomicU64::new(0),
            task_id: AtomicU64::new(0),
            name_ptr: AtomicPtr::new("".as_ptr().cast_mut()),
            name_len: AtomicUsize::new(0),
            location: AtomicPtr::new(here),
            start_ns: AtomicU64::new(0),
            hold_ns: AtomicU64::new(0),
            hold_seq: AtomicU64::new(0),
            opener_ptr: AtomicPtr::new("".as_ptr().cast_mut()),
            opener_len: AtomicUsize::new(0),
            opener_location: AtomicPtr::new(here),
            long_end_ns: AtomicU64::new(0),
            long_end_polls: AtomicU64::new(0),
            long_end_seq: AtomicU64::new(u64::MAX),
            flags: AtomicU8::new(0),
            note_seq: AtomicU64::new(0),
            note_tag: AtomicU64::new(u64::MAX),
            note_len: AtomicU64::new(0),
            note_prefix_ptr: AtomicPtr::new("".as_ptr().cast_mut()),
            note_prefix_len: AtomicUsize::new(0),
            note_words: Default::default(),
            stalls: Default::default(),
            mirror: AtomicPtr::new(std::ptr::null_mut()),
        })
    }

    /// Loop thread, at the start of every task poll, macrotask callback or closure; the first
    /// since the loop last left a drain also opens a hold, at the same `start_ns`.
    #[inline]
    pub(crate) fn begin(
        &self,
        task_id: u64,
        name: &'static str,
        location: &'static Location<'static>,
        start_ns: u64,
    ) {
        self.write(task_id, name, location, start_ns, true);
    }

    /// `begin` for a caller that knows a hold is open (a closure after the first of its batch):
    /// one load and branch fewer, on the path a chained closure takes.
    #[inline]
    pub(crate) fn begin_in_hold(
        &self,
        task_id: u64,
        name: &'static str,
        location: &'static Location<'static>,
        start_ns: u64,
    ) {
        debug_assert_ne!(self.hold_ns.load(Ordering::Relaxed), 0, "no hold open");
        self.write(task_id, name, location, start_ns, false);
    }

    #[inline(always)]
    fn write(
        &self,
        task_id: u64,
        name: &'static str,
        location: &'static Location<'static>,
        start_ns: u64,
        may_open: bool,
    ) {
        // Single writer: the loop thread, so relaxed loads of our own last stores are exact.
        let seq = self.seq.load(Ordering::Relaxed);
        self.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        // Orders the odd sequence before the field stores (pairs with the reader's acquire fence).
        fence(Ordering::Release);
        let name_ptr = name.as_ptr().cast_mut();
        let location = std::ptr::from_ref(location).cast_mut();
        self.task_id.store(task_id, Ordering::Relaxed);
        self.name_ptr.store(name_ptr, Ordering::Relaxed);
        self.name_len.store(name.len(), Ordering::Relaxed);
        self.location.store(location, Ordering::Relaxed);
        self.start_ns.store(start_ns.max(1), Ordering::Relaxed);
        if may_open && self.hold_ns.load(Ordering::Relaxed) == 0 {
            self.hold_seq.store(seq.wrapping_add(2), Ordering::Relaxed);
            self.opener_ptr.store(name_ptr, Ordering::Relaxed);
            self.opener_len.store(name.len(), Ordering::Relaxed);
            self.opener_location.store(location, Ordering::Relaxed);
            self.hold_ns.store(start_ns.max(1), Ordering::Relaxed);
            self.mirror_store(start_ns.max(MIRROR_NO_HOLD + 1));
        }
        self.seq.store(seq.wrapping_add(2), Ordering::Release);
    }

    /// Loop thread: `value` to the hold mirror, if there is one.
    #[inline(always)]
    fn mirror_store(&self, value: u64) {
        let mirror = self.mirror.load(Ordering::Relaxed);
        if !mirror.is_null() {
            // SAFETY: a non-null mirror was set by `mirror_holds`, whose caller keeps the word
            // valid until it sets another or null; both happen on this thread, the only one
            // that stores through it.
            unsafe { (*mirror).store(value, Ordering::Release) };
        }
    }

    /// Loop thread: from now on, the start of each hold (`nodus::clock` ns, at least 2) is
    /// stored to `*word` as it opens and [`MIRROR_NO_HOLD`] as it closes; null stops it. The word
    /// mirrored to before gets 0: no loop mirrors to it. A cluster worker mirrors its loop's
    /// holds on its board, where the primary sees whether the loop is in a long one
    /// (`cluster::board`).
    ///
    /// # Safety
    /// `word` is null or valid for atomic stores until this is called again on the loop thread
    /// (the only one that uses it), with another word or null.
    pub(crate) unsafe fn mirror_holds(&self, word: *const AtomicU64) {
        self.mirror_store(0);
        self.mirror.store(word.cast_mut(), Ordering::Relaxed);
        let now = match self.hold_ns.load(Ordering::Relaxed) {
            0 => MIRROR_NO_HOLD,
            held => held.max(MIRROR_NO_HOLD + 1),
        };
        self.mirror_store(now);
    }

    /// Loop thread, when that poll/callback returns (the hold goes on until `end_hold`).
    #[inline]
    pub(crate) fn end(&self) {
        // One field, so no seqlock round: a reader sees either the poll or "none in progress".
        self.start_ns.store(0, Ordering::Release);
    }

    /// Loop thread: the loop left the drain (or stopped running) at `end_ns`, closing the hold
    /// in progress if there is one. `end_ns` is `None` when the time is unknown (the loop is
    /// unwinding): the watchdog then keeps its own estimate.
    #[inline]
    pub(crate) fn end_hold(&self, end_ns: Option<u64>) {
        // Single writer: relaxed loads of our own last stores are exact.
        let hold_ns = self.hold_ns.load(Ordering::Relaxed);
        if hold_ns == 0 {
            return;
        }
        if let Some(end_ns) = end_ns
            && end_ns.saturating_sub(hold_ns) >= self.threshold_ns
        {
            self.record_long_end(end_ns);
        }
        self.start_ns.store(0, Ordering::Relaxed);
        // One field: a reader sees either the hold or "nothing held".
        self.hold_ns.store(0, Ordering::Release);
        self.mirror_store(MIRROR_NO_HOLD);
    }

    #[cold]
    fn record_long_end(&self, end_ns: u64) {
        let hold_seq = self.hold_seq.load(Ordering::Relaxed);
        let polls = polls_between(hold_seq, self.seq.load(Ordering::Relaxed));
        // Invalidate first, so a reader never pairs the new end with the previous long hold.
        self.long_end_seq.store(u64::MAX, Ordering::Relaxed);
        fence(Ordering::Release);
        self.long_end_ns.store(end_ns, Ordering::Relaxed);
        self.long_end_polls.store(polls, Ordering::Relaxed);
        self.long_end_seq.store(hold_seq, Ordering::Release);
    }

    /// Watchdog: the end time and poll count of the hold with `hold_seq`, if it lasted at least
    /// the threshold and no later long hold has overwritten them.
    pub(super) fn long_end(&self, hold_seq: u64) -> Option<(u64, u64)> {
        if self.long_end_seq.load(Ordering::Acquire) != hold_seq {
            return None;
        }
        let end_ns = self.long_end_ns.load(Ordering::Relaxed);
        let polls = self.long_end_polls.load(Ordering::Relaxed);
        // Orders the loads before the re-check (pairs with `record_long_end`'s fence).
        fence(Ordering::Acquire);
        (self.long_end_seq.load(Ordering::Relaxed) == hold_seq).then_some((end_ns, polls))
    }

    /// Loop thread: the `hold_seq` of the hold in progress (the `HoldView::hold_seq` the watchdog
    /// reads for it), if there is one.
    pub(crate) fn current_hold(&self) -> Option<u64> {
        // Single writer: relaxed loads of our own last stores are exact.
        (self.hold_ns.load(Ordering::Relaxed) != 0).then(|| self.hold_seq.load(Ordering::Relaxed))
    }

    /// Watchdog, holding the `RING` lock: one more stall of this loop ended, of `class`.
    pub(super) fn count_stall(&self, class: StallClass) {
        self.stalls[class as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Holding the `RING` lock: the stalls of this loop the watchdog has seen end, by class.
    pub(super) fn stall_counts(&self) -> StallCounts {
        let mut counts = StallCounts::default();
        for class in StallClass::ALL {
            *counts.get_mut(class) = self.stalls[class as usize].load(Ordering::Relaxed);
        }
        counts
    }

    /// Loop thread, during a poll: the note `prefix` + `text` (the text cut so that both fit in
    /// `NOTE_MAX` bytes, at a char boundary) names it from now until it returns, sets another or
    /// clears it.
    #[inline(always)]
    pub(crate) fn set_note(&self, prefix: &'static str, text: &str) {
        let text = note::fit(prefix, text).as_bytes();
        self.write_note(prefix, text.len(), |words| {
            note::pack(text, |i, word| words[i].store(word, Ordering::Relaxed));
        });
    }

    /// Loop thread, right after `begin`: a task's note kept from an earlier poll names this one.
    pub(crate) fn republish_note(&self, note: &Note) {
        let len = usize::from(note.len);
        self.write_note(note.prefix, len, |words| {
            for (to, &word) in words.iter().zip(&note.words[..len.div_ceil(8)]) {
                to.store(word, Ordering::Relaxed);
            }
        });
    }

    /// One write of the note under its seqlock: `fill` stores the words of its `len` bytes.
    #[inline(always)]
    fn write_note(
        &self,
        prefix: &'static str,
        len: usize,
        fill: impl FnOnce(&[AtomicU64; NOTE_WORDS]),
    ) {
        // Single writer: relaxed loads of our own last stores are exact.
        let note_seq = self.note_seq.load(Ordering::Relaxed);
        self.note_seq
            .store(note_seq.wrapping_add(1), Ordering::Relaxed);
        // Orders the odd sequence before the field stores (pairs with the reader's acquire fence).
        fence(Ordering::Release);
        fill(&self.note_words);
        self.note_prefix_ptr
            .store(prefix.as_ptr().cast_mut(), Ordering::Relaxed);
        self.note_prefix_len.store(prefix.len(), Ordering::Relaxed);
        self.note_len.store(len as u64, Ordering::Relaxed);
        self.note_tag
            .store(self.seq.load(Ordering::Relaxed), Ordering::Relaxed);
        self.note_seq
            .store(note_seq.wrapping_add(2), Ordering::Release);
    }

    /// Loop thread: the poll in progress no longer has a note (it stays readable to
    /// `poll_note`, for the slow-poll log of this poll).
    #[inline(always)]
    pub(crate) fn clear_note(&self) {
        // One field: a reader sees the note or none, whatever else it read with it.
        let len = self.note_len.load(Ordering::Relaxed);
        self.note_len.store(len | NOTE_CLEARED, Ordering::Relaxed);
    }

    /// Loop thread, for a slow poll's log line only (cold): how long the process was stopped or
    /// frozen while a poll ran from `start` to `end` (`freeze::stopped_during`; it may wait a
    /// little for a watchdog resumed with the process to record the stop).
    pub(crate) fn stopped_during(&self, start: u64, end: u64) -> u64 {
        let watched = self.flags.load(Ordering::Relaxed) & REGISTERED != 0
            && matches!(WATCHDOG.get(), Some(Some(_)));
        freeze::stopped_during(start, end, watched)
    }

    /// Loop thread: the latest note set in the poll in progress (or the one that just returned,
    /// before the next `begin`), and whether it is still set (not cleared since).
    pub(crate) fn poll_note(&self) -> Option<(Note, bool)> {
        // Single writer: relaxed loads of our own last stores are exact.
        if self.note_tag.load(Ordering::Relaxed) != self.seq.load(Ordering::Relaxed) {
            return None;
        }
        let len = self.note_len.load(Ordering::Relaxed);
        let prefix_ptr = self.note_prefix_ptr.load(Ordering::Relaxed);
        let prefix_len = self.note_prefix_len.load(Ordering::Relaxed);
        let note = Note {
            // SAFETY: this thread stored the pair, from one `&'static str` (`write_note`).
            prefix: unsafe {
                std::str::from_utf8_unchecked(std::slice::from_raw_parts(prefix_ptr, prefix_len))
            },
            words: std::array::from_fn(|i| self.note_words[i].load(Ordering::Relaxed)),
            len: (len & !NOTE_CLEARED) as u8,
        };
        (!note.is_empty()).then_some((note, len & NOTE_CLEARED == 0))
    }

    /// Watchdog: the note of the poll that left sequence `seq`, if it set one and has not
    /// cleared it (empty if none, or if the loop kept rewriting it through every attempt).
    fn read_note(&self, seq: u64) -> Note {
        for _ in 0..READ_RETRIES {
            let note_seq = self.note_seq.load(Ordering::Acquire);
            if note_seq & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let tag = self.note_tag.load(Ordering::Relaxed);
            let len = self.note_len.load(Ordering::Relaxed);
            let prefix_ptr = self.note_prefix_ptr.load(Ordering::Relaxed);
            let prefix_len = self.note_prefix_len.load(Ordering::Relaxed);
            let words = std::array::from_fn(|i| self.note_words[i].load(Ordering::Relaxed));
            // Orders the loads before the re-check (pairs with `write_note`'s release fence).
            fence(Ordering::Acquire);
            if self.note_seq.load(Ordering::Relaxed) != note_seq {
                continue;
            }
            if tag != seq || len & NOTE_CLEARED != 0 {
                return Note::default();
            }
            // SAFETY: the note's sequence was even and unchanged around the loads, so no
            // `write_note` overlapped them and the pointer/length pair comes from one call (or
            // from `new`), where it was a `&'static str`: valid UTF-8, never freed, published by
            // the release store of `note_seq` acquired above.
            let prefix = unsafe {
                std::str::from_utf8_unchecked(std::slice::from_raw_parts(prefix_ptr, prefix_len))
            };
            return Note {
                prefix,
                words,
                len: len.min(NOTE_MAX as u64) as u8,
            };
        }
        Note::default()
    }

    /// Loop thread, just before blocking in epoll with a non-zero timeout. (A registered loop that
    /// is neither idle nor running keeps the watchdog ticking every 10 ms.)
    #[inline]
    pub(crate) fn enter_idle(&self) {
        let flags = self.flags.load(Ordering::Relaxed);
        if flags & IDLE == 0 {
            self.flags.store(flags | IDLE, Ordering::Relaxed);
            if flags & REGISTERED != 0 {
                ACTIVITY.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }

    /// Loop thread, just after that epoll returns. One atomic RMW unless the watchdog is parked.
    #[inline]
    pub(crate) fn leave_idle(&self) {
        let flags = self.flags.load(Ordering::Relaxed);
        if flags & IDLE != 0 {
            self.flags.store(flags & !IDLE, Ordering::Relaxed);
            // The count and the parked bit share a word, so the watchdog's "park if nobody is
            // busy" CAS and this increment are totally ordered: one of the two sees the other.
            if flags & REGISTERED != 0 && ACTIVITY.fetch_add(1, Ordering::AcqRel) & PARKED != 0 {
                wake_parked_watchdog();
            }
        }
    }

    pub(super) fn read(&self) -> SlotRead {
        for _ in 0..READ_RETRIES {
            let seq = self.seq.load(Ordering::Acquire);
            if seq & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let task_id = self.task_id.load(Ordering::Relaxed);
            let name_ptr = self.name_ptr.load(Ordering::Relaxed);
            let name_len = self.name_len.load(Ordering::Relaxed);
            let location = self.location.load(Ordering::Relaxed);
            let start_ns = self.start_ns.load(Ordering::Relaxed);
            let hold_ns = self.hold_ns.load(Ordering::Relaxed);
            let hold_seq = self.hold_seq.load(Ordering::Relaxed);
            let opener_ptr = self.opener_ptr.load(Ordering::Relaxed);
            let opener_len = self.opener_len.load(Ordering::Relaxed);
            let opener_location = self.opener_location.load(Ordering::Relaxed);
            // Orders the field loads before the re-check (pairs with `begin`'s release fence).
            fence(Ordering::Acquire);
            if self.seq.load(Ordering::Relaxed) != seq {
                continue;
            }
            if hold_ns == 0 {
                return SlotRead::Idle;
            }
            // SAFETY: the sequence was even and unchanged around the loads, so no `begin` overlapped
            // them and each pointer/length pair and location comes from one `begin` call (or from
            // `new`). There they were a `&'static str` and a `&'static Location<'static>`: valid
            // UTF-8, never freed, and published by the release store of `seq` we acquired above.
            let (name, location, opener, opener_location) = unsafe {
                (
                    std::str::from_utf8_unchecked(std::slice::from_raw_parts(name_ptr, name_len)),
                    &*location,
                    std::str::from_utf8_unchecked(std::slice::from_raw_parts(
                        opener_ptr, opener_len,
                    )),
                    &*opener_location,
                )
            };
            return SlotRead::Held(HoldView {
                seq,
                task_id,
                name,
                location,
                start_ns,
                hold_seq,
                hold_ns,
                opener,
                opener_location,
                note: self.read_note(seq),
            });
        }
        SlotRead::Torn
    }
}

impl Drop for LoopSlot {
    fn drop(&mut self) {
        if *self.flags.get_mut() == REGISTERED {
            ACTIVITY.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::now_ns;
    use crate::watchdog::tests::{ID_BASE, MS, serial};
    use std::sync::atomic::AtomicBool;
    use std::thread;

    #[test]
    fn seqlock_reads_are_consistent() {
        let _serial = serial();
        // A writer flips between two records as fast as it can; every read must be one of them.
        static A: &str = "alpha";
        static B: &str = "a-much-longer-name";
        let la: &'static Location<'static> = Location::caller();
        let lb: &'static Location<'static> = Location::caller();
        let slot = LoopSlot::new(ID_BASE + 6, Duration::from_millis(100));
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (slot, stop) = (slot.clone(), stop.clone());
            thread::spawn(move || {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    if i.is_multiple_of(2) {
                        slot.begin(2, A, la, i);
                    } else {
                        slot.begin(3, B, lb, i);
                    }
                    if i.is_multiple_of(7) {
                        slot.end();
                    }
                    if i.is_multiple_of(13) {
                        slot.end_hold(Some(i));
                    }
                }
            })
        };
        let (mut polls, mut idles) = (0, 0);
        // 200 ms of reads, longer (10 s at most) until the writer, maybe starved of a CPU on a
        // loaded machine, has written a record.
        let deadline = now_ns() + 200 * MS;
        let give_up = now_ns() + 10_000 * MS;
        while now_ns() < deadline || (polls == 0 && now_ns() < give_up) {
            match slot.read() {
                SlotRead::Held(v) => {
                    polls += 1;
                    // A poll in progress started at its own `i`; the hold at its opener's.
                    let ok = (v.task_id == 2
                        && v.name == A
                        && std::ptr::eq(v.location, la)
                        && (v.start_ns == 0 || v.start_ns % 2 == 0))
                        || (v.task_id == 3
                            && v.name == B
                            && std::ptr::eq(v.location, lb)
                            && (v.start_ns == 0 || v.start_ns % 2 == 1));
                    assert!(ok, "torn read: {} {} {}", v.task_id, v.name, v.start_ns);
                    let opener_ok = (v.opener == A && std::ptr::eq(v.opener_location, la))
                        || (v.opener == B && std::ptr::eq(v.opener_location, lb));
                    let opener_even = v.opener == A;
                    assert!(
                        opener_ok && (v.hold_ns % 2 == 0) == opener_even,
                        "torn hold: {} {}",
                        v.opener,
                        v.hold_ns
                    );
                    assert!(v.polls() >= 1 && v.polls() <= 13, "{} polls", v.polls());
                }
                SlotRead::Idle => idles += 1,
                SlotRead::Torn => {}
            }
        }
        stop.store(true, Ordering::Relaxed);
        writer.join().unwrap();
        assert!(polls > 0, "{polls} polls, {idles} idle reads");
    }

    #[test]
    fn note_reads_are_consistent_and_name_their_own_poll() {
        let _serial = serial();
        // Task 2 notes "GET /a" (one word), task 3 a note of four words; each note is set after
        // its poll's `begin`, sometimes cleared. A read is the latest poll's own note or none.
        static A: &str = "alpha";
        static B: &str = "beta";
        let long = "/b".repeat(14);
        let at: &'static Location<'static> = Location::caller();
        let slot = LoopSlot::new(ID_BASE + 7, Duration::from_millis(100));
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (slot, stop, long) = (slot.clone(), stop.clone(), long.clone());
            thread::spawn(move || {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    if i.is_multiple_of(2) {
                        slot.begin(2, A, at, i);
                        slot.set_note("GET ", "/a");
                    } else {
                        slot.begin(3, B, at, i);
                        slot.set_note("POST ", &long);
                    }
                    if i.is_multiple_of(5) {
                        slot.clear_note();
                    }
                    if i.is_multiple_of(11) {
                        slot.begin(4, B, at, i);
                    }
                    if i.is_multiple_of(13) {
                        slot.end_hold(Some(i));
                    }
                }
            })
        };
        let want_b = format!("POST {long}");
        let (mut noted, mut reads) = (0, 0);
        let deadline = now_ns() + 200 * MS;
        let give_up = now_ns() + 10_000 * MS;
        while now_ns() < deadline || (noted == 0 && now_ns() < give_up) {
            if let SlotRead::Held(v) = slot.read() {
                reads += 1;
                let note = v.note.render();
                let ok = match v.task_id {
                    2 => note.is_empty() || note == "GET /a",
                    3 => note.is_empty() || note == want_b,
                    _ => note.is_empty(),
                };
                assert!(ok, "task {} read with note {note:?}", v.task_id);
                if !note.is_empty() {
                    noted += 1;
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
        writer.join().unwrap();
        assert!(noted > 0, "{noted} noted reads of {reads}");
    }
}
