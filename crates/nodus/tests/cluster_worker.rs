//! A nodus worker's answers to its primary, the primary played by hand over the channel: a
//! snapshot request answered with the loop's snapshot, and a probe (`text: "probe"`, what a
//! primary sends to learn whether the loop runs) answered without one, also by a worker that
//! read one application message and leaves the next thousands unread.
//!
//! The worker is this test binary run again ([`ROLE`]) with a channel whose other end the test
//! holds; it is killed by pid and reaped at the end, and dies with its channel otherwise.

use std::time::Duration;

use nodus::cluster::Worker;
use nodus::ipc::{Channel, ChannelOptions};
use nodus::process::{Command, Stdio};
use serde_json::{Value, json};

/// Set in the worker this binary starts from itself: `worker`, or `reads-once`.
const ROLE: &str = "NODUS_TEST_WORKER_ROLE";

/// The worker: says `online` (`Worker::get`) and serves its primary's requests until its
/// channel ends. `reads_once`: it also reads one application message (Node's
/// `process.once('message')`), says so, and reads no more.
fn worker(reads_once: bool) -> ! {
    nodus::Runtime::new().block_on(async move {
        let worker = Worker::get().unwrap().expect("started as a cluster worker");
        if reads_once {
            let first = worker.channel().recv().await.unwrap().unwrap();
            worker.channel().send(&json!({ "got": first })).unwrap();
        }
        nodus::sleep(Duration::from_secs(60)).await;
    });
    std::process::exit(0);
}

/// Runs test `test` of this binary again as a worker in role `role`, with a channel.
fn spawn_worker(test: &str, role: &str) -> nodus::process::Child {
    Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture"])
        .env(ROLE, role)
        .env("NODE_UNIQUE_ID", "1")
        .env("NODUS_PRIMARY", "1")
        .stdout(Stdio::Null)
        .ipc(ChannelOptions::default())
        .spawn()
        .unwrap()
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
        worker(false);
    }
    nodus::Runtime::new().block_on(async {
        let mut child = spawn_worker(
            "a_probe_is_answered_without_a_snapshot_and_a_snapshot_request_with_one",
            "worker",
        );
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

/// A worker that read one application message and leaves the 2000 after it unread still hears
/// its primary: the snapshot request sent behind them is answered.
#[test]
fn a_worker_that_read_once_answers_its_primary_behind_thousands_of_unread_messages() {
    if std::env::var(ROLE).as_deref() == Ok("reads-once") {
        worker(true);
    }
    nodus::Runtime::new().block_on(async {
        let mut child = spawn_worker(
            "a_worker_that_read_once_answers_its_primary_behind_thousands_of_unread_messages",
            "reads-once",
        );
        let channel = child.channel.take().expect("spawned with a channel");
        next_act(&channel, "online").await;
        channel.send(&json!({"config": 1})).unwrap();
        let got = nodus::timeout(Duration::from_secs(20), channel.recv())
            .await
            .expect("the worker read its one message")
            .unwrap()
            .unwrap();
        assert_eq!(got.json(), r#"{"got":{"config":1}}"#);
        for i in 0..2000 {
            channel.send(&json!({ "tick": i })).unwrap();
        }
        channel
            .send(
                &json!({"cmd": "NODE_NODUS", "act": "snapshot_request", "id": 3, "text": "probe"}),
            )
            .unwrap();
        let probe = next_act(&channel, "snapshot").await;
        child.kill(libc::SIGKILL).unwrap();
        child.wait().await.unwrap();
        assert_eq!(probe["id"], 3, "{probe}");
    });
}
