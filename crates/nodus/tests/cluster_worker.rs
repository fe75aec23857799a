//! A nodus worker's answers to its primary, the primary played by hand over the channel: a
//! snapshot request answered with the loop's snapshot, and a probe (`text: "probe"`, what a
//! primary sends to learn whether the loop runs) answered without one.
//!
//! The worker is this test binary run again ([`ROLE`]) with a channel whose other end the test
//! holds; it is killed by pid and reaped at the end, and dies with its channel otherwise.

use std::time::Duration;

use nodus::cluster::Worker;
use nodus::ipc::{Channel, ChannelOptions};
use nodus::process::{Command, Stdio};
use serde_json::{Value, json};

/// Set in the worker this binary starts from itself.
const ROLE: &str = "NODUS_TEST_WORKER_ROLE";
const TEST: &str = "a_probe_is_answered_without_a_snapshot_and_a_snapshot_request_with_one";

/// The worker: says `online` (`Worker::get`) and serves its primary's requests until its
/// channel ends.
fn worker() -> ! {
    nodus::Runtime::new().block_on(async move {
        let _worker = Worker::get().unwrap().expect("started as a cluster worker");
        nodus::sleep(Duration::from_secs(60)).await;
    });
    std::process::exit(0);
}

/// The next internal message from the worker whose `act` is `act`, within 20 s.
async fn next_act(channel: &Channel, act: &str) -> Value {
    let wait = async {
        loop {
            let msg = channel
                .recv_internal()
                .await
                .expect("the worker's channel is open");
            let v: Value = serde_json::from_str(msg.json()).unwrap();
            if v["act"] == act {
                return v;
            }
        }
    };
    nodus::timeout(Duration::from_secs(20), wait)
        .await
        .unwrap_or_else(|_| panic!("no {act:?} from the worker"))
}

#[test]
fn a_probe_is_answered_without_a_snapshot_and_a_snapshot_request_with_one() {
    if std::env::var(ROLE).as_deref() == Ok("worker") {
        worker();
    }
    nodus::Runtime::new().block_on(async {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([TEST, "--exact", "--nocapture"])
            .env(ROLE, "worker")
            .env("NODE_UNIQUE_ID", "1")
            .env("NODUS_PRIMARY", "1")
            .stdout(Stdio::Null)
            .ipc(ChannelOptions::default())
            .spawn()
            .unwrap();
        let channel = child.channel.take().expect("spawned with a channel");
        let online = next_act(&channel, "online").await;
        assert_eq!(online["nodus"], 1, "{online}");
        channel
            .send(
                &json!({"cmd": "NODE_NODUS", "act": "snapshot_request", "id": 1, "text": "probe"}),
            )
            .unwrap();
        channel
            .send(&json!({"cmd": "NODE_NODUS", "act": "snapshot_request", "id": 2}))
            .unwrap();
        let probe = next_act(&channel, "snapshot").await;
        let full = next_act(&channel, "snapshot").await;
        child.kill(libc::SIGKILL).unwrap();
        child.wait().await.unwrap();
        assert_eq!(probe["id"], 1, "{probe}");
        assert!(
            probe.get("snapshot").is_none(),
            "a probe got a snapshot: {probe}"
        );
        assert_eq!(full["id"], 2, "{full}");
        assert!(full["snapshot"].is_object(), "{full}");
    });
}
