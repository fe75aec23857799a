//! Messages a program has not read yet (`nodus::ipc`): the channel reads its socket whatever the
//! program does (Node's rule), so internal frames flow behind any number of unread user
//! messages and two peers that each flush before reading never wait for each other; unread
//! messages are kept up to a bound (a slow reader loses none below it), past which the oldest
//! are dropped, with one warning line and a count. Every test is bounded in time, and each wait
//! that hung while a full queue stopped the reading has a guard of its own ([`GUARD`]).

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::bounded;
use common::ipc::with_raw;
use nodus::ipc::{Channel, ChannelOptions, MAX_UNREAD_MESSAGES};
use nodus::net::TcpListener;
use serde_json::json;

/// A wait that must end: it used to hang.
const GUARD: Duration = Duration::from_secs(10);

/// Two connected channels.
fn pair() -> (Channel, Channel) {
    let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
    (
        Channel::from_fd(a.into(), ChannelOptions::default()).unwrap(),
        Channel::from_fd(b.into(), ChannelOptions::default()).unwrap(),
    )
}

/// A program that read one message, then only its internal ones (a cluster worker that called
/// `recv` once, Node's `process.once('message')`): 2000 unread user messages hold back neither
/// the internal message behind them (the primary's handoffs and `disconnect`) nor the ACK of a
/// handle it sent, and none of the 2000 is lost.
#[test]
fn internal_frames_flow_behind_unread_user_messages() {
    bounded(async {
        let (a, b) = pair();
        a.send(&json!({"config": 1})).unwrap();
        assert_eq!(b.recv().await.unwrap().unwrap().json(), r#"{"config":1}"#);
        for i in 0..2000 {
            a.send(&json!({ "tick": i })).unwrap();
        }
        a.send(&json!({"cmd": "NODE_PING", "n": 1})).unwrap();
        // `a` answers this handle after the 2000 ticks, which it has written already.
        b.send_handle(&"h", TcpListener::bind("127.0.0.1:0").unwrap())
            .unwrap();
        let ping = nodus::timeout(GUARD, b.recv_internal())
            .await
            .expect("an internal message behind 2000 unread user messages arrives")
            .unwrap();
        assert_eq!(ping.json(), r#"{"cmd":"NODE_PING","n":1}"#);
        nodus::timeout(GUARD, b.flush())
            .await
            .expect("the ACK behind 2000 unread user messages arrives")
            .unwrap();
        assert!(a.recv().await.unwrap().unwrap().handle().is_some());
        for i in 0..2000 {
            let m = b.recv().await.unwrap().unwrap();
            assert_eq!(m.json(), format!("{{\"tick\":{i}}}"));
        }
    });
}

/// Sends `n` messages of about 220 bytes, waiting for `flush` whenever `send` says to slow
/// down, then receives `n`.
async fn exchange(ch: &Channel, n: usize) {
    let pad = "x".repeat(200);
    for i in 0..n {
        if !ch.send(&json!({ "i": i, "pad": pad })).unwrap() {
            ch.flush().await.unwrap();
        }
    }
    ch.flush().await.unwrap();
    for i in 0..n {
        let v: serde_json::Value = ch.recv().await.unwrap().unwrap().deserialize().unwrap();
        assert_eq!(v["i"], i);
    }
}

/// Two peers that each say hello, wait for the other's, then send 3000 messages awaiting
/// `flush` as back-pressure before they read any (Node 20 completes the same exchange,
/// waiting for `send`'s callback): neither waits for the other to read.
#[test]
fn two_peers_that_flush_before_reading_do_not_wait_for_each_other() {
    bounded(async {
        let (a, b) = pair();
        a.send(&"hello").unwrap();
        b.send(&"hello").unwrap();
        assert_eq!(a.recv().await.unwrap().unwrap().json(), r#""hello""#);
        assert_eq!(b.recv().await.unwrap().unwrap().json(), r#""hello""#);
        let both = futures_util::future::join(exchange(&a, 3000), exchange(&b, 3000));
        nodus::timeout(GUARD, both)
            .await
            .expect("both exchanges complete");
    });
}

/// One read of 2000 coalesced frames (Node coalesces writes), before the program has called
/// `recv` and after: every message arrives, in order.
#[test]
fn a_read_of_thousands_of_frames_loses_none_whether_or_not_recv_was_called() {
    bounded(async {
        let (ch, raw) = with_raw(ChannelOptions::default());
        let batch = |from: usize| {
            let mut bytes = Vec::new();
            for i in from..from + 2000 {
                bytes.extend_from_slice(format!("{i}\n").as_bytes());
            }
            bytes
        };
        raw.send_now(&batch(0), &[]);
        raw.all_read().await;
        raw.send_now(&batch(2000), &[]);
        for i in 0..4000 {
            assert_eq!(ch.recv().await.unwrap().unwrap().json(), i.to_string());
        }
        assert_eq!(ch.dropped_unread(), 0);
    });
}

/// A reader that falls behind by 4000 messages (40 MiB): the channel reads all of them
/// meanwhile (what the peer writes never waits for the reader), and every one arrives, in order.
#[test]
fn a_reader_that_falls_behind_gets_every_message_below_the_bound() {
    bounded(async {
        let (ch, raw) = with_raw(ChannelOptions::default());
        raw.write(b"\"start\"\n").await;
        assert_eq!(ch.recv().await.unwrap().unwrap().json(), r#""start""#);
        let pad = "x".repeat(10 * 1024);
        let write = async {
            for n in 0..4000 {
                raw.write(format!("{{\"n\":{n},\"p\":\"{pad}\"}}\n").as_bytes())
                    .await;
            }
            raw.write(b"\"end\"\n").await;
            raw.all_read().await;
        };
        nodus::timeout(GUARD, write)
            .await
            .expect("the channel reads while nobody takes its messages");
        for n in 0..4000u64 {
            let v: serde_json::Value = ch.recv().await.unwrap().unwrap().deserialize().unwrap();
            assert_eq!(v["n"], n);
        }
        assert_eq!(ch.recv().await.unwrap().unwrap().json(), r#""end""#);
        assert_eq!(ch.dropped_unread(), 0);
    });
}

/// The `nodus::ipc` WARN lines logged on this thread.
#[derive(Clone, Default)]
struct Warnings(Arc<Mutex<Vec<String>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Warnings {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Text(String);
        impl tracing::field::Visit for Text {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0 = format!("{value:?}");
                }
            }
        }
        let meta = event.metadata();
        if meta.target() == "nodus::ipc" && *meta.level() == tracing::Level::WARN {
            let mut text = Text(String::new());
            event.record(&mut text);
            self.0.lock().unwrap().push(text.0);
        }
    }
}

/// A peer that floods a program that read once and no more: the channel keeps reading (an
/// internal message behind the flood arrives), keeps the newest `MAX_UNREAD_MESSAGES`, drops
/// the oldest past that, counts them and says so in one WARN line.
#[test]
fn a_flood_past_the_bound_drops_the_oldest_with_one_warning_and_a_count() {
    use tracing_subscriber::layer::SubscriberExt;
    let warnings = Warnings::default();
    let subscriber = tracing_subscriber::registry().with(warnings.clone());
    tracing::subscriber::with_default(subscriber, || {
        bounded(async {
            let (ch, raw) = with_raw(ChannelOptions::default());
            raw.write(b"\"start\"\n").await;
            assert_eq!(ch.recv().await.unwrap().unwrap().json(), r#""start""#);
            let n = MAX_UNREAD_MESSAGES + 1000;
            let mut bytes = Vec::new();
            for i in 0..n {
                bytes.extend_from_slice(format!("{i}\n").as_bytes());
            }
            raw.write(&bytes).await;
            raw.write(b"{\"cmd\":\"NODE_PING\"}\n").await;
            let ping = nodus::timeout(GUARD, ch.recv_internal())
                .await
                .expect("an internal message behind the flood arrives")
                .unwrap();
            assert_eq!(ping.json(), r#"{"cmd":"NODE_PING"}"#);
            assert_eq!(ch.dropped_unread(), 1000);
            for i in 1000..n {
                assert_eq!(ch.recv().await.unwrap().unwrap().json(), i.to_string());
            }
        });
    });
    let lines = warnings.0.lock().unwrap();
    assert_eq!(lines.len(), 1, "one WARN line for the burst: {lines:?}");
    assert!(lines[0].contains("dropping the oldest"), "{lines:?}");
}

/// Unread messages are bounded in bytes too (64 MiB), for a reader as for a program that
/// never read: of 13 messages of 5 MiB, the newest 12 are kept.
#[test]
fn unread_messages_are_bounded_in_bytes() {
    bounded(async {
        let (ch, raw) = with_raw(ChannelOptions::default());
        raw.write(b"\"start\"\n").await;
        assert_eq!(ch.recv().await.unwrap().unwrap().json(), r#""start""#);
        for n in 0..13 {
            let big = format!("[{n},\"{}\"]\n", "x".repeat(5 * 1024 * 1024));
            raw.write(big.as_bytes()).await;
        }
        raw.write(b"\"end\"\n").await;
        nodus::timeout(GUARD, raw.all_read())
            .await
            .expect("the channel reads while nobody takes its messages");
        assert_eq!(
            ch.dropped_unread(),
            1,
            "64 MiB of messages are kept at most"
        );
        for n in 1..13 {
            let v: serde_json::Value = ch.recv().await.unwrap().unwrap().deserialize().unwrap();
            assert_eq!(v[0], n, "the oldest went");
        }
        assert_eq!(ch.recv().await.unwrap().unwrap().json(), r#""end""#);
    });
}

/// Internal messages nobody takes with `recv_internal` are bounded in bytes as user messages
/// are (64 MiB), in a queue of their own: the oldest go first, and the user message after them
/// arrives.
#[test]
fn unread_internal_messages_are_bounded_in_bytes() {
    const MIB: usize = 1024 * 1024;
    bounded(async {
        let (ch, raw) = with_raw(ChannelOptions::default());
        let pad = "x".repeat(MIB);
        for n in 0..80 {
            raw.write(format!("{{\"cmd\":\"NODE_PAD\",\"n\":{n},\"pad\":\"{pad}\"}}\n").as_bytes())
                .await;
        }
        raw.write(b"{\"cmd\":\"NODE_LAST\"}\n\"end\"\n").await;
        // Every internal frame was handled before the user message after them.
        assert_eq!(ch.recv().await.unwrap().unwrap().json(), r#""end""#);
        let (mut kept, mut bytes, mut first) = (0, 0, None);
        loop {
            let m = ch.recv_internal().await.unwrap();
            if m.json() == r#"{"cmd":"NODE_LAST"}"# {
                break;
            }
            let v: serde_json::Value = m.deserialize().unwrap();
            first.get_or_insert(v["n"].as_u64().unwrap());
            kept += 1;
            bytes += m.json().len();
        }
        assert!(
            bytes <= 64 * MIB,
            "{kept} unread internal messages held {bytes} bytes"
        );
        assert!(first.unwrap() > 0, "the oldest are the ones dropped");
        assert_eq!(ch.dropped_unread(), 80 - kept);
    });
}
