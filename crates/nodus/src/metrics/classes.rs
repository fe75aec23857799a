//! Task classes: the bounded table of task names that per-name measurements are kept for.
//!
//! Invariants: at most [`MAX_CLASSES`] entries; the first [`BUILTIN`] are fixed and name the
//! loop's own callback kinds; once the table is full every new name maps to [`OTHER`], and so
//! does a name longer than [`wire::NAME`](super::wire::NAME) bytes at any time (a primary refuses
//! a snapshot that carries one). A name is looked up once, at spawn (or at scheduling, for
//! callbacks); polls carry the index.
//!
//! Names are `&'static str` on purpose: a task name is a class (`http:static`), never a
//! per-connection value, and the type makes the unbounded case impossible to write by accident.

// With the `measure` feature off (the overhead benchmark only) this is compiled but not used.
#![cfg_attr(not(feature = "measure"), allow(dead_code))]

/// Index into the class table.
pub(crate) type ClassId = u16;

pub(crate) const MAX_CLASSES: usize = 64;

pub(crate) const MAIN: ClassId = 0;
pub(crate) const TIMER: ClassId = 1;
pub(crate) const IMMEDIATE: ClassId = 2;
pub(crate) const IO: ClassId = 3;
pub(crate) const CLOSE: ClassId = 4;
pub(crate) const HOOK: ClassId = 5;
pub(crate) const PENDING: ClassId = 6;
pub(crate) const REMOTE: ClassId = 7;
pub(crate) const OTHER: ClassId = 8;
const BUILTIN: [&str; 10] = [
    "main",
    "timer",
    "immediate",
    "io",
    "close",
    "hook",
    "pending",
    "remote",
    "other",
    "task",
];

/// The name table of one loop.
pub(crate) struct Classes {
    names: Vec<&'static str>,
    /// The last name looked up (by address) and its class: tasks are spawned in runs of one name.
    last: (*const u8, usize, ClassId),
}

impl Classes {
    pub(crate) fn new() -> Classes {
        let mut names = Vec::with_capacity(MAX_CLASSES);
        names.extend_from_slice(&BUILTIN);
        Classes {
            names,
            last: (std::ptr::null(), 0, OTHER),
        }
    }

    /// The class of `name`, registering it if there is room and it is not too long to report.
    pub(crate) fn id_of(&mut self, name: &'static str) -> ClassId {
        let (ptr, len, id) = self.last;
        if ptr == name.as_ptr() && len == name.len() {
            return id;
        }
        let id = match self.names.iter().position(|n| *n == name) {
            Some(i) => i as ClassId,
            None if name.len() > super::wire::NAME => OTHER,
            None if self.names.len() < MAX_CLASSES => {
                self.names.push(name);
                (self.names.len() - 1) as ClassId
            }
            None => OTHER,
        };
        self.last = (name.as_ptr(), name.len(), id);
        id
    }

    pub(crate) fn len(&self) -> usize {
        self.names.len()
    }

    pub(crate) fn name(&self, id: ClassId) -> &'static str {
        self.names[id as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_bounded() {
        let mut c = Classes::new();
        assert_eq!(c.id_of("timer"), TIMER);
        let a = c.id_of("http:static");
        assert_eq!(c.id_of("http:static"), a);
        let leaked: Vec<&'static str> = (0..100)
            .map(|i| &*Box::leak(format!("n{i}").into_boxed_str()))
            .collect();
        for n in &leaked {
            c.id_of(n);
        }
        assert_eq!(c.len(), MAX_CLASSES);
        assert_eq!(c.id_of(leaked[99]), OTHER);
        assert_eq!(c.name(a), "http:static");
    }

    #[test]
    fn a_name_too_long_to_report_is_other_and_takes_no_entry() {
        let mut c = Classes::new();
        let long: &'static str =
            Box::leak("x".repeat(crate::metrics::wire::NAME + 1).into_boxed_str());
        let before = c.len();
        assert_eq!(c.id_of(long), OTHER);
        assert_eq!(c.len(), before);
        let longest: &'static str =
            Box::leak("y".repeat(crate::metrics::wire::NAME).into_boxed_str());
        assert_ne!(c.id_of(longest), OTHER);
    }
}
