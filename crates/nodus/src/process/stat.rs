//! A process's `/proc/PID/stat`: the fields nodus reads from it (its name, state, parent and
//! process group).
//!
//! Invariants:
//! - The name (`comm`) is the text between the first `(` and the *last* `)`: a name may hold
//!   spaces and parentheses, so the fields after it are split from that last `)` on.
//! - A process that is gone, or a line that does not parse, is `None`, never a guess.

/// What `/proc/PID/stat` says of one process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stat {
    /// `comm`: its name, at most 15 bytes (lossy UTF-8).
    pub name: String,
    /// Its state letter: `R` running or runnable, `S`/`D` asleep, `T` stopped by a signal, `t`
    /// stopped by a tracer, `Z` a zombie, `X`/`x` dead.
    pub state: u8,
    pub parent: i32,
    pub group: i32,
}

impl Stat {
    /// It runs nothing until continued (`SIGSTOP` or another stop signal, or a debugger).
    pub fn is_stopped(&self) -> bool {
        matches!(self.state, b'T' | b't')
    }

    /// It has exited (a zombie not yet reaped, or dead).
    pub fn has_exited(&self) -> bool {
        matches!(self.state, b'Z' | b'X' | b'x')
    }
}

/// `/proc/PID/stat` of `pid`, if it exists and parses.
pub(crate) fn read(pid: i32) -> Option<Stat> {
    parse(&std::fs::read(format!("/proc/{pid}/stat")).ok()?)
}

/// `PID (COMM) STATE PPID PGRP ...`.
fn parse(stat: &[u8]) -> Option<Stat> {
    let open = stat.iter().position(|&b| b == b'(')?;
    let close = stat.iter().rposition(|&b| b == b')')?;
    let name = String::from_utf8_lossy(stat.get(open + 1..close)?).into_owned();
    let mut fields = stat.get(close + 2..)?.split(|&b| b == b' ');
    let state = match fields.next()? {
        [letter] => *letter,
        _ => return None,
    };
    let mut number = || -> Option<i32> { std::str::from_utf8(fields.next()?).ok()?.parse().ok() };
    let parent = number()?;
    let group = number()?;
    Some(Stat {
        name,
        state,
        parent,
        group,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_with_spaces_and_parentheses_is_read_to_its_last_parenthesis() {
        let stat = parse(b"4242 (a (b) c) T 1 4242 4242 0 -1 4194560 ...").unwrap();
        assert_eq!(
            stat,
            Stat {
                name: "a (b) c".into(),
                state: b'T',
                parent: 1,
                group: 4242
            }
        );
        assert!(stat.is_stopped());
        assert!(!stat.has_exited());
    }

    #[test]
    fn a_line_that_does_not_parse_is_none() {
        for bad in [
            &b""[..],
            b"12 (x",
            b"12 (x) ",
            b"12 (x) RS 1 2",
            b"12 (x) R one 2",
            b"12 (x) R 1",
        ] {
            assert_eq!(parse(bad), None, "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn this_process_is_read_with_its_parent() {
        let me = read(std::process::id() as i32).expect("our own stat");
        assert!(!me.is_stopped() && !me.has_exited(), "{me:?}");
        assert_eq!(me.parent as u32, std::os::unix::process::parent_id());
        assert_eq!(read(i32::MAX), None, "no such process");
    }

    /// A child stopped by `SIGSTOP` reads as stopped until `SIGCONT`, then as a zombie once
    /// killed and before its reap.
    #[test]
    fn a_stopped_child_reads_stopped_until_continued() {
        use rustix::process::{Pid, Signal, kill_process};
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep runs");
        let pid = child.id() as i32;
        let _kill = nodus_testkit::tree::KillOnDrop(vec![pid]);
        let target = Pid::from_raw(pid).unwrap();
        let wait_for = |what: &str, done: &dyn Fn(&Stat) -> bool| {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            loop {
                let stat = read(pid).expect("the child until its reap");
                if done(&stat) {
                    return;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "never {what}: {stat:?}"
                );
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        };
        assert_eq!(read(pid).map(|s| s.parent), Some(std::process::id() as i32));
        kill_process(target, Signal::STOP).unwrap();
        wait_for("stopped", &|s| s.is_stopped());
        kill_process(target, Signal::CONT).unwrap();
        wait_for("continued", &|s| !s.is_stopped());
        kill_process(target, Signal::KILL).unwrap();
        wait_for("exited", &|s| s.has_exited());
        child.wait().unwrap();
    }
}
