//! A nodus cluster worker facing a primary that answers badly (a stock Node primary, a buggy
//! one, or one with intent): `queryServer` answers with errnos of every type and size, with the
//! wrong key or none, with a handle that is not a listener, twice, or to a `seq` never sent;
//! `newconn` without an fd, with an fd that is not a socket, for a key never asked; `newconns`
//! with fewer fds than peers or peers that do not parse; unknown and ill-typed messages; a drain
//! deadline as long as a `u64` allows. The worker must answer each exactly (`accepted`,
//! `refused`), report every refusal as a clear error, close every fd it cannot use, and serve
//! the one good connection.
//!
//! The worker is this test binary run again ([`ROLE`]), with a channel whose other end this test
//! holds and plays the primary on; it reports what its `listen` calls returned as application
//! messages. Bounded: every wait has a deadline, and the worker exits at the end of its channel.

mod common;

use std::io::Read;
use std::os::fd::OwnedFd;
use std::rc::Rc;
use std::time::Duration;

use nodus::cluster::Worker;
use nodus::ipc::{Channel, SendHandle};
use serde_json::{Value, json};

use common::pipes::{pipe, write_end_closed};

/// Set in the worker this binary starts from itself.
const ROLE: &str = "NODUS_TEST_WORKER_ROLE";
const NAME: &str =
    "a_worker_facing_a_hostile_primary_answers_exactly_and_closes_what_it_cannot_use";

/// The worker: asks to listen on 127.0.0.1:`PORT` until the primary grants it, reporting each
/// refusal (`{"refused": error}`) and then `{"listening": round_robin}`; answers `hi` on every
/// connection; at the drain reports the deadline it was given (`{"drain_ms": ms}`) and exits.
fn worker() -> ! {
    let port: u16 = std::env::var("PORT").unwrap().parse().unwrap();
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let code = nodus::Runtime::new().block_on(async move {
        let worker = Worker::get().unwrap().expect("started as a cluster worker");
        let report = |v: Value| {
            worker.channel().send(&v).unwrap();
        };
        let listener = loop {
            match worker.listen(addr).await {
                Ok(l) => break l,
                Err(e) => report(json!({ "refused": e.to_string() })),
            }
        };
        report(json!({ "listening": listener.is_round_robin() }));
        let serving = nodus::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let _ = stream.write_all(b"hi\n").await;
            }
        });
        let drain = worker.drain_requested().await;
        serving.abort();
        report(json!({ "drain_ms": drain.as_millis().to_string() }));
        worker.flush(Duration::from_secs(5)).await;
        0
    });
    std::process::exit(code);
}

/// The next internal message from the worker (at most 15 s: a `listen` waits 10 s).
async fn internal(ch: &Channel) -> Value {
    let msg = nodus::timeout(Duration::from_secs(15), ch.recv_internal())
        .await
        .expect("the worker says something")
        .expect("the channel is open");
    serde_json::from_str(msg.json()).unwrap()
}

/// The worker's next `queryServer` (after the `close` a refused `listen` sends for its key).
async fn query(ch: &Channel, key: &str) -> Value {
    loop {
        let v = internal(ch).await;
        if v["act"] == "queryServer" {
            return v;
        }
        assert_eq!(
            (&v["act"], &v["key"]),
            (&json!("close"), &json!(key)),
            "{v}"
        );
    }
}

/// The worker's next report.
async fn report(ch: &Channel) -> Value {
    let msg = nodus::timeout(Duration::from_secs(15), ch.recv())
        .await
        .expect("the worker reports")
        .expect("the channel is open")
        .expect("a message, not an error");
    serde_json::from_str(msg.json()).unwrap()
}

/// A connection accepted on `listener` (its client end returned too).
fn connection(listener: &std::net::TcpListener) -> (std::net::TcpStream, OwnedFd) {
    let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let (server, _) = listener.accept().unwrap();
    (client, server.into())
}

#[test]
fn a_worker_facing_a_hostile_primary_answers_exactly_and_closes_what_it_cannot_use() {
    if std::env::var(ROLE).as_deref() == Ok("worker") {
        worker();
    }
    nodus::Runtime::new().block_on(async {
        nodus::timeout(Duration::from_secs(120), hostile_primary())
            .await
            .expect("test timed out");
    });
}

async fn hostile_primary() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let key = format!("127.0.0.1:{port}:4:undefined:0");
    let mut child = common::spawn_test_worker(NAME, ROLE, port);
    let ch = child.channel.take().unwrap();
    let online = internal(&ch).await;
    assert_eq!(
        (&online["act"], &online["nodus"]),
        (&json!("online"), &json!(1))
    );

    // Each `queryServer` answered badly; the worker reports the error its `listen` returned.
    let refused =
        |why: &str| format!("the cluster primary cannot listen on 127.0.0.1:{port}: {why}");
    let (pipe_r, pipe_w) = pipe();
    let mut pipe_w = Some(pipe_w);
    let cases: Vec<(Value, String)> = vec![
        (json!(i64::MIN), refused("error -9223372036854775808")),
        (json!(-2_147_483_649i64), refused("error -2147483649")),
        (json!(i64::MAX), refused("error 9223372036854775807")),
        (json!(2), refused("error 2")),
        (json!(-1.5), refused("error -1.5")),
        (json!("EADDRINUSE"), refused("error \"EADDRINUSE\"")),
        (json!([-98]), refused("error [-98]")),
        (json!(-98), refused("Address already in use (os error 98)")),
    ];
    for (errno, want) in &cases {
        let q = query(&ch, &key).await;
        let reply = json!({"cmd": "NODE_CLUSTER", "errno": errno, "key": key, "ack": q["seq"], "data": null, "seq": 0});
        ch.send(&reply).unwrap();
        // The same answer again, and one to a query never made: nothing to answer.
        ch.send(&reply).unwrap();
        ch.send(
            &json!({"cmd": "NODE_CLUSTER", "errno": null, "key": key, "ack": 99_999, "seq": 0}),
        )
        .unwrap();
        assert_eq!(report(&ch).await, json!({ "refused": want }));
    }
    // The wrong key, no key, and a listener that is not one.
    for case in ["wrong key", "no key", "not a listener"] {
        let q = query(&ch, &key).await;
        let seq = &q["seq"];
        match case {
            "wrong key" => ch.send(&json!({"cmd": "NODE_CLUSTER", "errno": null, "key": "other", "ack": seq, "seq": 0})),
            "no key" => ch.send(&json!({"cmd": "NODE_CLUSTER", "errno": null, "ack": seq, "seq": 0})),
            _ => ch.send_handle(
                &json!({"cmd": "NODE_CLUSTER", "errno": null, "key": key, "ack": seq, "seq": 0}),
                SendHandle::fd(pipe_w.take().unwrap()),
            ),
        }
        .unwrap();
        let r = report(&ch).await;
        let text = r["refused"].as_str().unwrap_or_else(|| panic!("{r}"));
        let ok = match case {
            "wrong key" => {
                text == format!(
                    "the cluster primary answered queryServer for 127.0.0.1:{port} with the key \
                     other, not {key}"
                )
            }
            "no key" => text == refused("no key in the reply"),
            _ => {
                text.starts_with("nodus::net::TcpListener::from_owned_fd: fd ")
                    && text.contains(" is not a listening TCP socket (")
            }
        };
        assert!(ok, "{case}: {text:?}");
    }
    // Granted (round-robin: no fd).
    let q = query(&ch, &key).await;
    ch.send(
        &json!({"cmd": "NODE_CLUSTER", "errno": null, "key": key, "ack": q["seq"], "data": null,
        "sockname": {"address": "127.0.0.1", "family": "IPv4", "port": port}, "seq": 0}),
    )
    .unwrap();
    assert_eq!(internal(&ch).await["act"], "listening");
    assert_eq!(report(&ch).await, json!({ "listening": true }));

    // Messages it has no use for, or cannot parse: ignored (no answer, no crash).
    for text in [
        json!({"cmd": "NODE_CLUSTER", "act": "frobnicate", "seq": 1}),
        json!({"cmd": "NODE_NODUS", "act": "frobnicate"}),
        json!({"cmd": "NODE_CLUSTER", "act": 5}),
        json!({"cmd": "NODE_CLUSTER", "act": "newconn", "key": key, "seq": "x"}),
        json!({"cmd": "NODE_CLUSTER", "act": "disconnect", "drainMs": "soon"}),
        json!({"cmd": "NODE_NODUS", "act": "stats_reply", "id": 77, "text": "never asked"}),
        json!({"cmd": "NODE_NODUS", "act": "board"}),
        json!({"cmd": "NODE_NODUS", "act": "newconns", "key": key}),
    ] {
        ch.send(&text).unwrap();
    }
    // Handed connections that cannot be taken: refused, their fds closed.
    let (r1, w1) = pipe();
    let (r2, w2) = pipe();
    let (r3, w3) = pipe();
    let (mut stranger, stranger_fd) = connection(&listener);
    ch.send(&json!({"cmd": "NODE_CLUSTER", "act": "newconn", "key": key, "seq": 10}))
        .unwrap();
    ch.send_handle(
        &json!({"cmd": "NODE_CLUSTER", "act": "newconn", "key": key, "seq": 11}),
        SendHandle::fd(w1),
    )
    .unwrap();
    ch.send_handle(
        &json!({"cmd": "NODE_CLUSTER", "act": "newconn", "key": "never:asked", "seq": 12}),
        SendHandle::fd(stranger_fd),
    )
    .unwrap();
    let peers = json!(["127.0.0.1:1", "127.0.0.1:2"]);
    ch.send_fds(
        &json!({"cmd": "NODE_NODUS", "act": "newconns", "key": key, "seq": 13, "peers": peers}),
        vec![Rc::new(w2)],
    )
    .unwrap();
    ch.send_fds(
        &json!({"cmd": "NODE_NODUS", "act": "newconns", "key": key, "seq": 14, "peers": ["nope"]}),
        vec![Rc::new(w3)],
    )
    .unwrap();
    // And one it takes.
    let (mut client, server_fd) = connection(&listener);
    ch.send_handle(
        &json!({"cmd": "NODE_CLUSTER", "act": "newconn", "key": key, "seq": 15}),
        SendHandle::fd(server_fd),
    )
    .unwrap();
    let mut answers = Vec::new();
    for _ in 0..5 {
        let v = internal(&ch).await;
        answers.push(match v["act"].as_str() {
            Some("refused") => json!({"refused": v["ack"]}),
            _ => json!({"ack": v["ack"], "accepted": v["accepted"]}),
        });
    }
    assert_eq!(
        answers,
        [
            json!({"ack": 10, "accepted": false}),
            json!({"ack": 11, "accepted": false}),
            json!({"ack": 12, "accepted": false}),
            json!({"refused": 13}),
            json!({"ack": 15, "accepted": true}),
        ]
    );
    let greeting = nodus::pool::offload_io(move || {
        let mut buf = [0u8; 3];
        client.read_exact(&mut buf).map(|()| buf)
    })
    .await
    .unwrap()
    .unwrap();
    assert_eq!(&greeting, b"hi\n");
    let closed = nodus::pool::offload_io(move || stranger.read(&mut [0u8; 1]))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(closed, 0, "the connection for a key never asked was closed");

    // A drain deadline as long as a u64 allows, as given.
    ch.send(&json!({"cmd": "NODE_CLUSTER", "act": "disconnect", "seq": 3, "drainMs": u64::MAX}))
        .unwrap();
    assert_eq!(
        report(&ch).await,
        json!({ "drain_ms": u64::MAX.to_string() })
    );
    let status = nodus::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("the worker exits")
        .unwrap();
    assert_eq!(status.code(), Some(0));
    for (name, r) in [
        ("listener", &pipe_r),
        ("newconn", &r1),
        ("newconns", &r2),
        ("bad newconns", &r3),
    ] {
        assert!(write_end_closed(r), "the {name} pipe is still open");
    }
}
