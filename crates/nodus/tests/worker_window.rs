//! A nodus cluster worker's handoff window is the one its `queryServer` told the primary, for the
//! life of that listener: a `set_handoff_window` after the `listen` (a wider one) neither changes
//! what the listener queues for the application (twice its window; beyond, a batch is refused)
//! nor what the primary was told. The primary would otherwise hand this worker as many
//! connections as it was told and find the worker holding more fds than it asked for.
//!
//! The worker is this test binary run again ([`ROLE`]), with a channel whose other end this test
//! holds and plays the primary on (no board: a taken batch is answered with `took`). Bounded:
//! every wait has a deadline, and the worker exits at the end of its channel.

mod common;

use std::os::fd::OwnedFd;
use std::rc::Rc;
use std::time::Duration;

use nodus::cluster::Worker;
use nodus::ipc::Channel;
use serde_json::{Value, json};

/// Set in the worker this binary starts from itself.
const ROLE: &str = "NODUS_TEST_WORKER_ROLE";
const NAME: &str = "a_listener_keeps_the_handoff_window_it_was_opened_with";
/// The window the worker listens with: its listener queues at most twice this.
const WINDOW: usize = 4;

/// The worker: listens with a window of [`WINDOW`], then widens its window to the most and says
/// so (`{"widened": true}`); never accepts, so what it takes stays queued; exits at the drain.
fn worker() -> ! {
    let port: u16 = std::env::var("PORT").unwrap().parse().unwrap();
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let code = nodus::Runtime::new().block_on(async move {
        let worker = Worker::get().unwrap().expect("started as a cluster worker");
        worker.set_handoff_window(WINDOW);
        let listener = worker.listen(addr).await.expect("listen");
        worker.set_handoff_window(usize::MAX);
        worker.channel().send(&json!({ "widened": true })).unwrap();
        worker.drain_requested().await;
        drop(listener);
        worker.flush(Duration::from_secs(5)).await;
        0
    });
    std::process::exit(code);
}

/// The next internal message from the worker that is not a `load` report.
async fn internal(ch: &Channel) -> Value {
    loop {
        let msg = nodus::timeout(Duration::from_secs(15), ch.recv_internal())
            .await
            .expect("the worker says something")
            .expect("the channel is open");
        let v: Value = serde_json::from_str(msg.json()).unwrap();
        if v["act"] != "load" {
            return v;
        }
    }
}

/// `n` connections accepted on `listener`, their client ends kept open by the caller.
fn connections(
    listener: &std::net::TcpListener,
    n: usize,
) -> (Vec<std::net::TcpStream>, Vec<Rc<OwnedFd>>) {
    (0..n)
        .map(|_| {
            let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            let (server, _) = listener.accept().unwrap();
            (client, Rc::new(OwnedFd::from(server)))
        })
        .unzip()
}

#[test]
fn a_listener_keeps_the_handoff_window_it_was_opened_with() {
    if std::env::var(ROLE).as_deref() == Ok("worker") {
        worker();
    }
    nodus::Runtime::new().block_on(async {
        nodus::timeout(Duration::from_secs(60), primary())
            .await
            .expect("test timed out");
    });
}

async fn primary() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let key = format!("127.0.0.1:{port}:4:undefined:0");
    let mut child = common::spawn_test_worker(NAME, ROLE, port);
    let ch = child.channel.take().unwrap();
    assert_eq!(internal(&ch).await["act"], "online");
    let query = internal(&ch).await;
    assert_eq!(query["act"], "queryServer", "{query}");
    assert_eq!(query["window"], json!(WINDOW), "the window told: {query}");
    ch.send(
        &json!({"cmd": "NODE_CLUSTER", "errno": null, "key": key, "ack": query["seq"],
        "data": null, "sockname": {"address": "127.0.0.1", "family": "IPv4", "port": port},
        "seq": 0}),
    )
    .unwrap();
    assert_eq!(internal(&ch).await["act"], "listening");
    let widened = nodus::timeout(Duration::from_secs(15), ch.recv())
        .await
        .expect("the worker reports")
        .expect("the channel is open")
        .expect("a message");
    assert_eq!(widened.json(), r#"{"widened":true}"#);

    // Twice the window fills the listener's queue; one more is refused, as it would be had the
    // worker never widened its window.
    let peers = |n: usize| json!(vec!["127.0.0.1:1"; n]);
    let (_clients, fds) = connections(&listener, 2 * WINDOW);
    ch.send_fds(
        &json!({"cmd": "NODE_NODUS", "act": "newconns", "key": key, "seq": 20,
        "peers": peers(2 * WINDOW)}),
        fds,
    )
    .unwrap();
    let took = internal(&ch).await;
    assert_eq!(
        (&took["act"], &took["ack"]),
        (&json!("took"), &json!(20)),
        "{took}"
    );
    let (_more, fds) = connections(&listener, 1);
    ch.send_fds(
        &json!({"cmd": "NODE_NODUS", "act": "newconns", "key": key, "seq": 21,
        "peers": peers(1)}),
        fds,
    )
    .unwrap();
    let refused = internal(&ch).await;
    assert_eq!(
        (&refused["act"], &refused["ack"]),
        (&json!("refused"), &json!(21)),
        "past twice the window the listener was opened with: {refused}"
    );

    ch.send(&json!({"cmd": "NODE_CLUSTER", "act": "disconnect", "seq": 3, "drainMs": 1000}))
        .unwrap();
    let status = nodus::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("the worker exits")
        .unwrap();
    assert_eq!(status.code(), Some(0));
}
