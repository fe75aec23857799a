//! 200 concurrent children leave the process's thread count unchanged: exits are observed
//! through pidfds on the reactor, not a thread (or a `waitpid` loop) per child. Alone in its test
//! binary, so no other test's threads come and go while it counts.

mod common;

use common::bounded;
use nodus::process::{Command, Stdio};

fn threads() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("Threads:")).unwrap();
    line[8..].trim().parse().unwrap()
}

#[test]
fn two_hundred_concurrent_children_add_no_threads() {
    bounded(async {
        // Let the runtime's own threads (if any) start first.
        let _warm = Command::new("true").spawn().unwrap().wait().await.unwrap();
        let before = threads();
        let children: Vec<_> = (0..200)
            .map(|i| {
                Command::new("sh")
                    .args(["-c", &format!("sleep 0.2; exit {}", i % 50)])
                    .stdin(Stdio::Null)
                    .stdout(Stdio::Null)
                    .stderr(Stdio::Null)
                    .spawn()
                    .unwrap()
            })
            .collect();
        assert_eq!(threads(), before, "no thread per child");
        for (i, c) in children.iter().enumerate() {
            assert_eq!(c.wait().await.unwrap().code(), Some((i % 50) as i32));
        }
        assert_eq!(threads(), before);
    });
}
