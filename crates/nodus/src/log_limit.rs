//! One log line for a burst of the same trouble, then one summary line per window with how many
//! more there were: for what repeats as fast as it happens (a failed accept at the open-files
//! limit, a handoff refused by a worker at its limit, a file the server cannot open), where a line
//! each would flood the log with hundreds of lines a second and hide everything else.
//!
//! Invariants:
//! - The first occurrence in a quiet period is logged in full by the caller ([`LogLimit::first`]
//!   says so) and opens a window; every later one within it is counted, not logged. At the
//!   window's end the count, when not zero, goes out in one summary line (the caller's
//!   `summary`, with the last counted occurrence's detail) and a new window opens; a window that
//!   counted nothing closes, and the next occurrence is logged in full again. So a flood writes
//!   one line, then one line per window while it lasts, then nothing; nothing is lost from the
//!   count but what the process's exit cuts (a window still open).
//! - The windows are timed on the loop of the thread that opened them (a task with an unref'd
//!   sleep: it keeps no loop alive); [`Window`] is the same rule with the time given, what the
//!   tests drive.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

/// The window the callers use: one summary line per 10 s at most.
pub const WINDOW: Duration = Duration::from_secs(10);

/// The counting rule, without a clock: [`LogLimit`] calls [`Window::hit`] per occurrence and
/// [`Window::end`] at each window's end.
#[derive(Debug, Default)]
pub struct Window {
    open: bool,
    counted: u64,
}

impl Window {
    /// One occurrence: true when it opens a window (log it in full), false when it is counted.
    pub fn hit(&mut self) -> bool {
        if self.open {
            self.counted += 1;
            false
        } else {
            self.open = true;
            true
        }
    }

    /// The window's end: the occurrences it counted, when any (a new window opens: say them in
    /// one line), or `None` (the window closes: the next occurrence is logged in full).
    pub fn end(&mut self) -> Option<u64> {
        let counted = std::mem::take(&mut self.counted);
        self.open = counted > 0;
        self.open.then_some(counted)
    }
}

type Summary = Box<dyn Fn(u64, &str)>;

/// A [`Window`] timed on the current thread's loop, with the summary line it writes.
pub struct LogLimit {
    window: Duration,
    state: RefCell<(Window, String)>,
    summary: Summary,
}

impl LogLimit {
    /// `summary(count, last)` writes the line for `count` occurrences counted in one window,
    /// `last` the detail of the last of them (as given to [`first`](Self::first)).
    pub fn new(window: Duration, summary: impl Fn(u64, &str) + 'static) -> Rc<LogLimit> {
        Rc::new(LogLimit {
            window,
            state: RefCell::new((Window::default(), String::new())),
            summary: Box::new(summary),
        })
    }

    /// One occurrence, `detail` what a summary says of the last one: true when the caller logs
    /// it in full (it opened a window, timed from now on this thread's loop), false when it
    /// was counted for the window's summary. Call it on a nodus loop.
    pub fn first(self: &Rc<Self>, detail: impl FnOnce() -> String) -> bool {
        {
            let mut state = self.state.borrow_mut();
            if !state.0.hit() {
                state.1 = detail();
                return false;
            }
        }
        let this = self.clone();
        crate::task::spawn_named("log-limit", async move {
            loop {
                let mut sleep = crate::time::sleep(this.window);
                sleep.unref();
                sleep.await;
                let (counted, last) = {
                    let mut state = this.state.borrow_mut();
                    (state.0.end(), std::mem::take(&mut state.1))
                };
                match counted {
                    Some(n) => (this.summary)(n, &last),
                    None => return,
                }
            }
        })
        .detach();
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    #[test]
    fn a_burst_is_one_line_then_one_count_per_window() {
        let mut w = Window::default();
        assert!(w.hit(), "the first occurrence is logged");
        assert!(!w.hit());
        assert!(!w.hit());
        assert_eq!(w.end(), Some(2), "the window's summary counts the rest");
        assert!(!w.hit(), "still open after a window that counted");
        assert_eq!(w.end(), Some(1));
        assert_eq!(w.end(), None, "a quiet window closes");
        assert!(w.hit(), "after a quiet window, logged in full again");
        assert_eq!(w.end(), None);
    }

    #[test]
    fn the_summary_comes_at_the_windows_end_with_the_count_and_the_last_detail() {
        let lines: Rc<RefCell<Vec<(u64, String)>>> = Rc::default();
        let seen = lines.clone();
        let limit = LogLimit::new(Duration::from_millis(30), move |n, last| {
            seen.borrow_mut().push((n, last.to_owned()))
        });
        crate::Runtime::new().block_on(async {
            let logged: Vec<bool> = (0..300)
                .map(|i| limit.first(|| format!("try {i}")))
                .collect();
            assert_eq!(logged.iter().filter(|l| **l).count(), 1);
            assert!(logged[0]);
            // Generous: the first window ends after 30 ms, the second (quiet) one closes.
            crate::time::sleep(Duration::from_millis(500)).await;
            assert_eq!(*lines.borrow(), [(299, "try 299".to_owned())]);
            assert!(
                limit.first(|| "again".to_owned()),
                "a new burst logs in full"
            );
        });
    }
}
