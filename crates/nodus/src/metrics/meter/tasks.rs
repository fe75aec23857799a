//! Task-class counters: a task name's class, and spawns, drops, forced yields and panics per
//! class.
//!
//! Invariant: `class_of` grows the per-class statistics with the class table, so every `ClassId`
//! it returns indexes `LoopStats::classes` safely afterwards.

#[cfg(feature = "measure")]
use super::ClassStats;
use super::Meter;
use crate::metrics::classes::ClassId;

impl Meter {
    /// The class of a task name.
    pub(crate) fn class_of(&self, name: &'static str) -> ClassId {
        let id = self.classes.borrow_mut().id_of(name);
        #[cfg(feature = "measure")]
        {
            let mut s = self.stats.borrow_mut();
            if s.classes.len() <= id as usize {
                s.classes.resize(id as usize + 1, ClassStats::default());
            }
        }
        id
    }

    /// A task of `class` was spawned.
    #[inline]
    pub(crate) fn spawned(&self, class: ClassId) {
        #[cfg(feature = "measure")]
        {
            let mut s = self.stats.borrow_mut();
            s.tasks_spawned += 1;
            s.tasks_alive += 1;
            s.classes[class as usize].spawned += 1;
        }
        #[cfg(not(feature = "measure"))]
        let _ = class;
    }

    /// A task's future was dropped (completed or cancelled).
    #[inline]
    pub(crate) fn task_dropped(&self) {
        #[cfg(feature = "measure")]
        {
            let mut s = self.stats.borrow_mut();
            s.tasks_alive = s.tasks_alive.saturating_sub(1);
        }
    }

    /// A task of `class` ran out of cooperative budget and was made to yield.
    #[inline]
    pub(crate) fn forced_yield(&self, class: ClassId) {
        #[cfg(feature = "measure")]
        {
            let mut s = self.stats.borrow_mut();
            s.forced_yields += 1;
            s.classes[class as usize].forced_yields += 1;
        }
        #[cfg(not(feature = "measure"))]
        let _ = class;
    }

    /// A poll of a task of `class` panicked (caught at the task boundary, whether or not its
    /// `JoinHandle` is still held).
    #[inline]
    pub(crate) fn task_panicked(&self, class: ClassId) {
        #[cfg(feature = "measure")]
        {
            let mut s = self.stats.borrow_mut();
            s.task_panics += 1;
            s.classes[class as usize].panics += 1;
        }
        #[cfg(not(feature = "measure"))]
        let _ = class;
    }
}
