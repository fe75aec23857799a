//! Task notes at poll boundaries: `nodus::task::set_note` / `clear_note` publish to the
//! watchdog's `LoopSlot` at once, and a task that ends a poll with a note keeps it for its next
//! polls.
//!
//! Invariants:
//! - A note names the poll it was set in (the slot tags it with that poll's sequence). One set
//!   in a task's poll and not cleared by its end is kept here, by task key with the task's id,
//!   and published again right after each later `begin_poll` of that task
//!   (`begin_task_note`), until the task clears it or its future is dropped. Outside a task (the
//!   `block_on` future, a callback, a closure) a note lasts until the poll returns.
//! - A poll pays for notes only when there are some: one load at a task poll's begin while no
//!   task keeps a note, one at its end. Setting one is a copy of its dynamic text (at most 64
//!   bytes, a word at a time) into the slot and two stores for its static prefix (the slot's
//!   `begin` and `end` never touch it); a note set and cleared in one poll of a task that kept
//!   none (an HTTP handler that answers at once) costs nothing more at the poll's end.
//! - Without the `measure` feature there is no watchdog and notes do nothing.

#[cfg(feature = "measure")]
use crate::watchdog::Note;

use super::Meter;

/// `Meter::note_state`: the task under way came in with a note it kept.
#[cfg(feature = "measure")]
pub(super) const NOTE_KEPT: u8 = 1;
/// `Meter::note_state`: its poll changed the note it keeps (set one, or cleared the kept one).
#[cfg(feature = "measure")]
pub(super) const NOTE_DIRTY: u8 = 2;

impl Meter {
    /// `nodus::task::set_note_prefixed` on this loop's thread: names the poll in progress.
    #[inline(always)]
    pub(crate) fn set_note(&self, prefix: &'static str, text: &str) {
        #[cfg(feature = "measure")]
        {
            self.slot.set_note(prefix, text);
            self.note_state.set(self.note_state.get() | NOTE_DIRTY);
        }
        #[cfg(not(feature = "measure"))]
        let _ = (prefix, text);
    }

    /// `nodus::task::clear_note` on this loop's thread.
    #[inline(always)]
    pub(crate) fn clear_note(&self) {
        #[cfg(feature = "measure")]
        {
            self.slot.clear_note();
            // Set and cleared in one poll of a task that kept none: nothing to keep or forget.
            let state = self.note_state.get();
            self.note_state.set(if state & NOTE_KEPT != 0 {
                NOTE_KEPT | NOTE_DIRTY
            } else {
                0
            });
        }
    }

    /// The poll of the task `key` (`id`) began (after `begin_poll`): publishes the note it kept.
    /// (`note_state` is 0 here, unless a note was set outside a task since the last task poll:
    /// that poll's end then finds no note of its own and keeps or forgets nothing.)
    #[inline]
    pub(crate) fn begin_task_note(&self, key: usize, id: u64) {
        #[cfg(feature = "measure")]
        if self.kept_notes.get() != 0 {
            self.republish_note(key, id);
        }
        #[cfg(not(feature = "measure"))]
        let _ = (key, id);
    }

    #[cfg(feature = "measure")]
    #[cold]
    fn republish_note(&self, key: usize, id: u64) {
        let kept = self.notes.borrow().get(key).copied();
        self.note_state.set(match kept {
            Some((kept_id, note)) if kept_id == id => {
                self.slot.republish_note(&note);
                NOTE_KEPT
            }
            _ => 0,
        });
    }

    /// The task poll that just returned had a note (kept, or set): `take_note_change` is due.
    #[inline]
    pub(crate) fn note_state_set(&self) -> bool {
        #[cfg(feature = "measure")]
        {
            self.note_state.get() != 0
        }
        #[cfg(not(feature = "measure"))]
        false
    }

    /// Resets the note state for the next task poll; whether the poll that returned changed
    /// what note its task keeps (it set one, or cleared the one it kept): `end_task_note` is due.
    pub(crate) fn take_note_change(&self) -> bool {
        #[cfg(feature = "measure")]
        {
            self.note_state.replace(0) & NOTE_DIRTY != 0
        }
        #[cfg(not(feature = "measure"))]
        false
    }

    /// The poll of the task `key` (`id`) that changed its note returned: the task keeps the
    /// note it ended with for its next polls, or has none. `alive`: its future was not dropped
    /// in the poll (a completed task keeps nothing).
    #[cold]
    pub(crate) fn end_task_note(&self, key: usize, id: u64, alive: bool) {
        #[cfg(feature = "measure")]
        {
            match self.slot.poll_note() {
                Some((note, true)) if alive => {
                    let mut notes = self.notes.borrow_mut();
                    if notes.len() <= key {
                        notes.resize(key + 1, (0, Note::default()));
                    }
                    if notes[key].0 != id {
                        self.kept_notes.set(self.kept_notes.get() + 1);
                    }
                    notes[key] = (id, note);
                }
                _ => self.task_note_dropped(key, id),
            }
        }
        #[cfg(not(feature = "measure"))]
        let _ = (key, id, alive);
    }

    /// The future of the task `key` (`id`) was dropped, or its note cleared: it keeps none.
    #[inline]
    pub(crate) fn task_note_dropped(&self, key: usize, id: u64) {
        #[cfg(feature = "measure")]
        if self.kept_notes.get() != 0
            && let Some(kept) = self.notes.borrow_mut().get_mut(key)
            && kept.0 == id
        {
            *kept = (0, Note::default());
            self.kept_notes.set(self.kept_notes.get() - 1);
        }
        #[cfg(not(feature = "measure"))]
        let _ = (key, id);
    }
}
