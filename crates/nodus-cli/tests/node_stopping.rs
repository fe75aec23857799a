//! A `nodus run --node` worker's `process.send()` payload is kept in the event log only up to
//! 64 KiB: past that, its size alone.
//!
//! Node is needed: under `CI` a missing one fails the tests, elsewhere they are skipped. Every
//! primary is started in its own process group, and the whole group is killed by PID when the
//! test ends.

mod common;

use std::process::Command;
use std::time::Duration;

use common::cluster::{assert_exit, count, wait_events};
use common::{NODUS, have};
use nodus_testkit::tmp::TempDir;
use rustix::process::Signal;

/// A Node app that sends a message of `BIG` bytes of JSON and a small one once it listens.
const APP_SENDING: &str = r#"
require('http').createServer((q, r) => r.end('ok\n')).listen(+process.env.PORT, '127.0.0.1', () => {
  process.send({ big: 'x'.repeat(+process.env.BIG - 10) });
  process.send({ small: 1 });
});
"#;

/// The event log keeps a worker's `process.send()` payload up to 64 KiB of JSON: a larger one is
/// its size and `"truncated": true`, without the JSON; a small one has both.
#[test]
fn with_node_the_event_log_keeps_a_message_payload_up_to_64_kib() {
    if !have("node") {
        return;
    }
    for (big, kept) in [(64 * 1024, true), (64 * 1024 + 1, false), (5 << 20, false)] {
        let dir = TempDir::new("node-messages");
        std::fs::write(dir.path().join("app.js"), APP_SENDING).unwrap();
        let log = dir.path().join("events.jsonl");
        let addr = nodus_testkit::net::free_addr();
        let mut primary = common::cluster::spawn(
            Command::new(NODUS)
                .args(["run", "--node", "-w", "1"])
                .args(["--events", log.to_str().unwrap()])
                .args(["--", "node"])
                .arg(dir.path().join("app.js"))
                .env("PORT", addr.port().to_string())
                .env("BIG", big.to_string())
                .env("RUST_LOG", "info"),
        );
        let evs = wait_events(&log, |e| count(e, "message") == 2);
        let messages: Vec<_> = evs.iter().filter(|e| e["event"] == "message").collect();
        let (large, small) = (messages[0], messages[1]);
        assert_eq!(large["bytes"], big, "{big}");
        if kept {
            assert_eq!(large["json"].as_str().map(str::len), Some(big), "{big}");
            assert!(large.get("truncated").is_none(), "{big}");
        } else {
            assert!(large.get("json").is_none(), "{big}");
            assert_eq!(large["truncated"], true, "{big}");
        }
        assert_eq!(small["json"], r#"{"small":1}"#);
        assert_eq!(small["bytes"], 11);
        assert!(small.get("truncated").is_none());
        let longest = std::fs::read_to_string(&log)
            .unwrap()
            .lines()
            .map(str::len)
            .max()
            .unwrap();
        assert!(longest < 64 * 1024 + 512, "a line of {longest} bytes");
        primary.signal(Signal::TERM);
        assert_exit(&mut primary, Duration::from_secs(30), 0);
    }
}
