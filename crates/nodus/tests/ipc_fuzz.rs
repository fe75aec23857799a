//! Hostile input against the IPC channel, seeded (a small PRNG in `common::rng`: a failing seed
//! reproduces) and hand-made: the frame decoder fed valid, malformed and oversized lines split at
//! every byte boundary; a 100 MiB line without a newline, to the decoder and through a channel;
//! random frames carrying random fds (too many, too few, with no frame or in the middle of one)
//! checked against a model of the rules `ipc/channel.rs` states, with every fd accounted for;
//! more fds in one `sendmsg` than a read takes (`MSG_CTRUNC`); fds whose frame never ends; JSON
//! nested far deeper than serde's recursion limit. Every case asserts the exact events, not only
//! that nothing panicked. The fd tests count the process's fds, so they run one at a time.

mod common;

use std::io::IoSlice;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use common::bounded_for;
use common::ipc::{Raw, with_raw};
use common::pipes::{pipe, write_end_closed};
use common::rng::Rng;
use nodus::ipc::framing::{Decoder, FrameError};
use nodus::ipc::{ChannelOptions, DEFAULT_MAX_FRAME, IpcError, Message};
use nodus_testkit::fds::open_fds;
use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
use serde_json::Value;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

// ---------------------------------------------------------------------------------------------
// The decoder.

/// The cap of the decoder tests.
const CAP: usize = 512;

/// What one line must decode to.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Want {
    Frame(String),
    Malformed,
    TooLarge,
}

/// A random string: ASCII, JSON's special characters, control characters, non-BMP and the
/// line and paragraph separators JavaScript once could not hold in a string literal.
fn text(rng: &mut Rng) -> String {
    const SPECIAL: &[char] = &[
        '"', '\\', '/', '\n', '\r', '\t', '\u{0}', '\u{1f}', '\u{7f}', '\u{2028}', '\u{2029}', 'é',
        '€', '𝄞', '\u{feff}',
    ];
    (0..rng.below(12))
        .map(|_| {
            if rng.chance(1, 3) {
                *rng.pick(SPECIAL)
            } else {
                char::from(b' ' + rng.below(95) as u8)
            }
        })
        .collect()
}

/// A random JSON value at most `depth` containers deep.
fn value(rng: &mut Rng, depth: usize) -> Value {
    let leaf = depth == 0 || rng.chance(1, 2);
    match rng.below(if leaf { 5 } else { 7 }) {
        0 => Value::Null,
        1 => Value::Bool(rng.chance(1, 2)),
        2 => Value::from(rng.next() as i64),
        3 => {
            let f = f64::from_bits(rng.next());
            if f.is_finite() {
                Value::from(f)
            } else {
                Value::from(rng.below(1000) as f64 / 8.0)
            }
        }
        4 => Value::String(text(rng)),
        5 => Value::Array((0..rng.below(4)).map(|_| value(rng, depth - 1)).collect()),
        _ => Value::Object(
            (0..rng.below(4))
                .map(|_| (text(rng), value(rng, depth - 1)))
                .collect(),
        ),
    }
}

/// A compact container (array or object) of at most `max` bytes, as Node writes one.
fn container(rng: &mut Rng, max: usize) -> String {
    loop {
        let v = match value(rng, 3) {
            v @ (Value::Array(_) | Value::Object(_)) => v,
            v => Value::Array(vec![v]),
        };
        let s = serde_json::to_string(&v).unwrap();
        if s.len() <= max {
            return s;
        }
    }
}

/// One line (without its `\n`) and what it must decode to.
fn line(rng: &mut Rng) -> (Vec<u8>, Want) {
    let valid = |s: String| (s.clone().into_bytes(), Want::Frame(s));
    match rng.below(10) {
        0..=2 => valid(container(rng, CAP)),
        // Nested past serde's recursion limit (128): a raw frame has none, as Node has none.
        3 => {
            let depth = rng.range(129, CAP / 2);
            valid(format!("{}{}", "[".repeat(depth), "]".repeat(depth)))
        }
        // What JSON.stringify writes for a lone surrogate: valid JSON, not valid Unicode.
        4 => valid(r#"{"s":"\ud800x\udfff"}"#.to_owned()),
        // Invalid UTF-8 in a string: a stray byte, an overlong form, an encoded surrogate.
        5 => {
            let bad: &[u8] =
                rng.pick::<&[u8]>(&[b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf8\x88"]);
            let mut s = b"[\"ab".to_vec();
            s.extend_from_slice(bad);
            s.extend_from_slice(b"\"]");
            (s, Want::Malformed)
        }
        // A container cut short.
        6 => {
            let mut s = container(rng, CAP).into_bytes();
            s.pop();
            (s, Want::Malformed)
        }
        // A raw control character in a string (never `\n`, the frame separator).
        7 => {
            let mut c = rng.below(0x20) as u8;
            if c == b'\n' {
                c = 0;
            }
            (vec![b'"', b'a', c, b'"'], Want::Malformed)
        }
        // Nothing, only blanks, two values, a bare word, JavaScript that is not JSON.
        8 => {
            let s: &str =
                rng.pick::<&str>(&["", "   ", "1 2", "{} x", "nul", "NaN", "{'a':1}", "[1,]"]);
            (s.as_bytes().to_vec(), Want::Malformed)
        }
        // Over the cap: any bytes but `\n`.
        _ => {
            let len = rng.range(CAP + 1, 3 * CAP);
            let s = (0..len)
                .map(|_| match rng.next() as u8 {
                    b'\n' => b' ',
                    b => b,
                })
                .collect();
            (s, Want::TooLarge)
        }
    }
}

/// A stream of `n` random lines and what it must decode to.
fn stream(rng: &mut Rng, n: usize) -> (Vec<u8>, Vec<Want>) {
    let mut wire = Vec::new();
    let mut want = Vec::new();
    for _ in 0..n {
        let (bytes, w) = line(rng);
        wire.extend_from_slice(&bytes);
        wire.push(b'\n');
        want.push(w);
    }
    (wire, want)
}

/// Decodes `wire` pushed in the pieces `cuts` marks, checking the memory bound after each.
fn decode(wire: &[u8], cuts: &[usize]) -> Vec<Want> {
    let mut d = Decoder::new(CAP);
    let mut got = Vec::new();
    for w in cuts.windows(2) {
        d.push(&wire[w[0]..w[1]]);
        loop {
            match d.next_frame() {
                Ok(Some(frame)) => got.push(Want::Frame(frame.get().to_owned())),
                Ok(None) => break,
                Err(FrameError::Malformed { .. }) => got.push(Want::Malformed),
                Err(FrameError::TooLarge { len, max }) => {
                    assert_eq!(max, CAP);
                    assert!(len > CAP, "{len} bytes are not over the cap");
                    got.push(Want::TooLarge);
                }
            }
        }
        assert!(d.buffered() <= CAP, "{} bytes held back", d.buffered());
    }
    assert_eq!(d.buffered(), 0);
    assert!(d.at_frame_start());
    got
}

#[test]
fn a_hostile_stream_decodes_to_the_same_frames_and_errors_however_it_is_split() {
    for seed in 0..6 {
        let mut rng = Rng::new(seed);
        let (wire, want) = stream(&mut rng, 12);
        let len = wire.len();
        assert_eq!(decode(&wire, &[0, len]), want, "seed {seed}, one piece");
        for at in 0..=len {
            assert_eq!(
                decode(&wire, &[0, at, len]),
                want,
                "seed {seed}, split at {at}"
            );
        }
        let bytes: Vec<usize> = (0..=len).collect();
        assert_eq!(decode(&wire, &bytes), want, "seed {seed}, byte by byte");
        for _ in 0..50 {
            let cuts = rng.cuts(len, 2 * CAP);
            assert_eq!(decode(&wire, &cuts), want, "seed {seed}, cuts {cuts:?}");
        }
    }
}

#[test]
fn a_100_mib_line_without_a_newline_is_refused_once_and_never_held() {
    const CHUNK: usize = 64 * 1024;
    let mut d = Decoder::new(DEFAULT_MAX_FRAME);
    let chunk = vec![b'a'; CHUNK];
    d.push(b"\"");
    let mut errors = Vec::new();
    for _ in 0..(100 << 20) / CHUNK {
        d.push(&chunk);
        loop {
            match d.next_frame() {
                Ok(None) => break,
                Ok(Some(f)) => panic!("a frame from an unfinished line: {}", f.get().len()),
                Err(e) => errors.push(e),
            }
        }
        assert!(
            d.buffered() <= DEFAULT_MAX_FRAME,
            "{} bytes held",
            d.buffered()
        );
        if !errors.is_empty() {
            assert_eq!(d.buffered(), 0, "the rest of an oversized line is not kept");
            assert!(!d.at_frame_start());
        }
    }
    // Reported as soon as it passed the cap (with its 256th chunk of 64 KiB), and only then.
    assert_eq!(
        errors,
        [FrameError::TooLarge {
            len: DEFAULT_MAX_FRAME + 1,
            max: DEFAULT_MAX_FRAME
        }]
    );
    d.push(b"aaa\"\n{\"after\":1}\n");
    assert_eq!(d.next_frame().unwrap().unwrap().get(), r#"{"after":1}"#);
    assert!(d.next_frame().unwrap().is_none());
    assert!(d.at_frame_start());
}

#[test]
fn a_100_mib_line_through_a_channel_is_one_error_and_the_next_message_arrives() {
    let _serial = serial();
    bounded_for(Duration::from_secs(120), async {
        let (ch, raw) = with_raw(ChannelOptions::default());
        let writer = nodus::spawn(async move {
            let chunk = vec![b'x'; 1 << 20];
            raw.write(b"{\"big\":\"").await;
            for _ in 0..100 {
                raw.write(&chunk).await;
            }
            raw.write(b"\"}\n\"after\"\n").await;
            raw
        });
        match ch.recv().await {
            Some(Err(IpcError::Frame(FrameError::TooLarge { len, max }))) => {
                assert_eq!(max, DEFAULT_MAX_FRAME);
                // Seen at the first read that took it past the cap (a read is 64 KiB at most).
                assert!(len > max && len <= max + 64 * 1024, "{len}");
            }
            other => panic!("expected the oversized frame's error, got {other:?}"),
        }
        assert_eq!(ch.recv().await.unwrap().unwrap().json(), r#""after""#);
        assert!(ch.is_connected(), "the channel stays open");
        let _raw = writer.await.unwrap();
    });
}

// ---------------------------------------------------------------------------------------------
// Fds.

/// One `sendmsg` of `bytes` with up to 253 fds (the kernel's `SCM_MAX_FD`).
fn send_many(raw: &Raw, bytes: &[u8], fds: &[BorrowedFd<'_>]) {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(253))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    assert!(control.push(SendAncillaryMessage::ScmRights(fds)));
    let iov = [IoSlice::new(bytes)];
    let n = rustix::net::sendmsg(raw.sock.as_fd(), &iov, &mut control, SendFlags::empty()).unwrap();
    assert_eq!(n, bytes.len());
}

/// An event as the model predicts it: a message (its JSON and how many handles came with it),
/// an fd-mismatch error or a malformed frame.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Event {
    Msg(String, usize),
    Fds { expected: usize, received: usize },
    Malformed,
}

fn event(item: Option<Result<Message, IpcError>>) -> Event {
    match item {
        Some(Ok(mut m)) => Event::Msg(m.json().to_owned(), m.take_handles().len()),
        Some(Err(IpcError::UnexpectedFds { expected, received })) => {
            Event::Fds { expected, received }
        }
        Some(Err(IpcError::Frame(FrameError::Malformed { .. }))) => Event::Malformed,
        other => panic!("unexpected event {other:?}"),
    }
}

/// What the raw peer sends in one step of the model.
#[derive(Debug)]
enum Step {
    /// A plain message in 1 to 3 writes, no fd.
    Plain,
    /// A `NODE_HANDLE` frame with this many fds in its one write.
    Handle(usize),
    /// A `NODE_NODUS_FDS` frame announcing `count` fds and carrying `sent`.
    Fds { count: usize, sent: usize },
    /// A plain message with fds.
    Stray(usize),
    /// A plain message whose second write carries fds (the first was read before).
    Middle(usize),
    /// A malformed line with fds.
    Bad(usize),
}

fn step(rng: &mut Rng) -> Step {
    match rng.below(6) {
        0 => Step::Plain,
        1 => Step::Handle(*rng.pick(&[0, 1, 1, 1, 2, 3])),
        2 => Step::Fds {
            count: rng.below(5),
            sent: rng.below(5),
        },
        3 => Step::Stray(rng.range(1, 3)),
        4 => Step::Middle(rng.range(1, 3)),
        _ => Step::Bad(rng.below(3)),
    }
}

/// Sends `steps` from the raw peer and returns the events the channel must deliver and the
/// replies it must write (the ACK or NACK of each `NODE_HANDLE`), keeping the read end of every
/// fd sent in `read_ends`. Fds go only in a write made once the channel has read everything
/// before it, so which bytes a read brings with them is fixed (see `ipc/fdpass.rs`).
async fn play(
    rng: &mut Rng,
    raw: &Raw,
    steps: &[Step],
    read_ends: &mut Vec<OwnedFd>,
) -> (Vec<Event>, Vec<&'static str>) {
    let mut events = Vec::new();
    let mut replies = Vec::new();
    for (n, s) in steps.iter().enumerate() {
        let body = format!("{{\"n\":{n}}}");
        let mut fds = |k: usize| -> Vec<OwnedFd> {
            (0..k)
                .map(|_| {
                    let (r, w) = pipe();
                    read_ends.push(r);
                    w
                })
                .collect()
        };
        let (frame, with_fds, at) = match *s {
            Step::Plain => {
                let frame = format!("{body}\n").into_bytes();
                for w in rng.cuts(frame.len(), 4).windows(2) {
                    raw.send_now(&frame[w[0]..w[1]], &[]);
                }
                events.push(Event::Msg(body, 0));
                continue;
            }
            Step::Handle(k) => {
                let frame =
                    format!("{{\"cmd\":\"NODE_HANDLE\",\"type\":\"net.Native\",\"msg\":{body}}}\n");
                match k {
                    1 => events.push(Event::Msg(body, 1)),
                    0 => {}
                    _ => events.push(Event::Fds {
                        expected: 1,
                        received: k,
                    }),
                }
                replies.push(if k == 1 { "ACK" } else { "NACK" });
                (frame, fds(k), 0)
            }
            Step::Fds { count, sent } => {
                let frame =
                    format!("{{\"cmd\":\"NODE_NODUS_FDS\",\"count\":{count},\"msg\":{body}}}\n");
                if sent > 0 && sent != count {
                    events.push(Event::Fds {
                        expected: count,
                        received: sent,
                    });
                }
                events.push(Event::Msg(body, if sent == count { sent } else { 0 }));
                (frame, fds(sent), 0)
            }
            Step::Stray(k) | Step::Middle(k) => {
                events.push(Event::Fds {
                    expected: 0,
                    received: k,
                });
                events.push(Event::Msg(body.clone(), 0));
                let at = if matches!(s, Step::Middle(_)) { 3 } else { 0 };
                (format!("{body}\n"), fds(k), at)
            }
            Step::Bad(k) => {
                events.push(Event::Malformed);
                (format!("{{\"n\":{n},oops}}\n"), fds(k), 0)
            }
        };
        let frame = frame.as_bytes();
        raw.all_read().await;
        if at > 0 {
            raw.send_now(&frame[..at], &[]);
            raw.all_read().await;
        }
        let borrowed: Vec<BorrowedFd<'_>> = with_fds.iter().map(|f| f.as_fd()).collect();
        raw.send_now(&frame[at..], &borrowed);
    }
    (events, replies)
}

#[test]
fn random_frames_with_random_fds_match_the_model_and_every_fd_is_closed_or_delivered() {
    let _serial = serial();
    for seed in 0..25 {
        bounded_for(Duration::from_secs(30), async {
            let mut rng = Rng::new(seed);
            let (ch, mut raw) = with_raw(ChannelOptions::default());
            let before = open_fds();
            let steps: Vec<Step> = (0..rng.range(10, 40)).map(|_| step(&mut rng)).collect();
            let mut read_ends = Vec::new();
            let (want, replies) = play(&mut rng, &raw, &steps, &mut read_ends).await;
            let mut got = Vec::new();
            for _ in 0..want.len() {
                got.push(event(ch.recv().await));
            }
            assert_eq!(got, want, "seed {seed}: {steps:?}");
            for reply in replies {
                let (frame, fds) = raw.frame().await;
                assert_eq!(
                    frame,
                    format!("{{\"cmd\":\"NODE_HANDLE_{reply}\"}}"),
                    "seed {seed}"
                );
                assert!(fds.is_empty());
            }
            // Nothing else came: a sentinel is next.
            raw.send_now(b"\"end\"\n", &[]);
            assert_eq!(event(ch.recv().await), Event::Msg("\"end\"".into(), 0));
            // Every fd sent was closed, or delivered and closed with its message.
            let open = read_ends.iter().filter(|r| !write_end_closed(r)).count();
            assert_eq!(open, 0, "seed {seed}: fds left open of {}", read_ends.len());
            drop(read_ends);
            assert_eq!(open_fds(), before, "seed {seed}");
            assert!(ch.is_connected());
        });
    }
}

#[test]
fn more_fds_than_one_read_takes_keep_the_first_64_and_the_rest_are_closed() {
    let _serial = serial();
    bounded_for(Duration::from_secs(30), async {
        let (ch, mut raw) = with_raw(ChannelOptions::default());
        let before = open_fds();
        let (read_ends, write_ends): (Vec<OwnedFd>, Vec<OwnedFd>) =
            (0..100).map(|_| pipe()).unzip();
        let borrowed: Vec<BorrowedFd<'_>> = write_ends.iter().map(|f| f.as_fd()).collect();

        // A burst of 100 in one sendmsg: the kernel installs 64 (MSG_CTRUNC) and closes the
        // rest; the message goes through with the first 64, in order.
        send_many(
            &raw,
            b"{\"cmd\":\"NODE_NODUS_FDS\",\"count\":100,\"msg\":\"burst\"}\n",
            &borrowed,
        );
        let mut m = ch.recv().await.unwrap().unwrap();
        assert_eq!(m.json(), r#""burst""#);
        let handles = m.take_handles();
        assert_eq!(handles.len(), 64);
        for (h, w) in handles.iter().zip(&write_ends) {
            let (a, b) = (rustix::fs::fstat(h).unwrap(), rustix::fs::fstat(w).unwrap());
            assert_eq!(
                (a.st_dev, a.st_ino),
                (b.st_dev, b.st_ino),
                "in the order sent"
            );
        }
        // A handle frame with 100: the 64 that arrived are closed, reported, and it is NACKed.
        send_many(
            &raw,
            b"{\"cmd\":\"NODE_HANDLE\",\"type\":\"net.Native\",\"msg\":1}\n",
            &borrowed,
        );
        assert_eq!(raw.frame().await.0, r#"{"cmd":"NODE_HANDLE_NACK"}"#);
        assert_eq!(
            event(ch.recv().await),
            Event::Fds {
                expected: 1,
                received: 64
            }
        );
        drop(borrowed);
        drop((write_ends, handles, m));
        assert!(read_ends.iter().all(write_end_closed), "an fd left open");
        drop(read_ends);
        assert_eq!(open_fds(), before);
    });
}

#[test]
fn the_fds_of_a_frame_the_peer_never_finishes_are_closed_when_the_channel_ends() {
    let _serial = serial();
    bounded_for(Duration::from_secs(30), async {
        let (ch, raw) = with_raw(ChannelOptions::default());
        let before = open_fds();
        let (r, w) = pipe();
        raw.send_now(
            b"{\"cmd\":\"NODE_HANDLE\",\"type\":\"net.Native\",\"msg\":",
            &[w.as_fd()],
        );
        drop(w);
        raw.all_read().await;
        assert!(
            !write_end_closed(&r),
            "held for its frame while the frame may still end"
        );
        drop(raw);
        assert!(
            ch.recv().await.is_none(),
            "the channel ends at EOF, with no event"
        );
        assert!(
            write_end_closed(&r),
            "the fd of the unfinished frame was closed"
        );
        drop(r);
        assert_eq!(
            open_fds(),
            before - 2,
            "the channel's socket is closed too (and the peer's)"
        );
    });
}

#[test]
fn json_nested_past_serdes_limit_is_delivered_as_node_would_and_parsing_it_is_an_error() {
    let _serial = serial();
    bounded_for(Duration::from_secs(30), async {
        let (ch, mut raw) = with_raw(ChannelOptions::default());
        let (r, w) = pipe();
        let depth = 100_000;
        let deep = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        let frame = format!("{{\"cmd\":\"NODE_HANDLE\",\"type\":\"net.Native\",\"msg\":{deep}}}\n");
        raw.send_now(frame.as_bytes(), &[w.as_fd()]);
        drop(w);
        assert_eq!(raw.frame().await.0, r#"{"cmd":"NODE_HANDLE_ACK"}"#);
        let mut m = ch.recv().await.unwrap().unwrap();
        assert_eq!(m.json(), deep);
        let err = m.deserialize::<Value>().unwrap_err();
        assert!(
            err.to_string().contains("recursion limit exceeded"),
            "{err}"
        );
        drop(m.take_handle().unwrap());
        assert!(write_end_closed(&r));
        // An internal frame nested as deep in a field nodus does not read is handled as usual.
        raw.write(format!("{{\"cmd\":\"NODE_X\",\"junk\":{deep}}}\n").as_bytes())
            .await;
        let m = ch.recv_internal().await.unwrap();
        assert!(m.json().starts_with(r#"{"cmd":"NODE_X","junk":[[["#));
    });
}

#[test]
fn a_peer_that_asks_and_never_reads_gets_a_bounded_number_of_answers() {
    let _serial = serial();
    bounded_for(Duration::from_secs(60), async {
        let (ch, mut raw) = with_raw(ChannelOptions::default());
        // 100 000 frames the channel answers itself (a socket query, a handle without its fd),
        // from a peer that reads none of the answers.
        let mut burst = Vec::new();
        for _ in 0..50_000 {
            burst.extend_from_slice(b"{\"cmd\":\"NODE_SOCKET_GET_COUNT\",\"key\":\"k\"}\n");
            burst.extend_from_slice(
                b"{\"cmd\":\"NODE_HANDLE\",\"type\":\"net.Native\",\"msg\":1}\n",
            );
        }
        raw.write(&burst).await;
        raw.all_read().await;
        let queued = ch.queued_bytes();
        assert!(
            queued <= 1024 * 50,
            "{queued} bytes of answers wait for the peer"
        );
        // What it can read is what the socket held and the 1024 answers queued.
        let mut answers = 0;
        while let Ok((frame, _)) = nodus::timeout(Duration::from_millis(300), raw.frame()).await {
            assert!(frame.contains("NODE_SOCKET_COUNT") || frame.contains("NODE_HANDLE_NACK"));
            answers += 1;
        }
        assert!(
            answers < 10_000,
            "{answers} answers of 100000 were kept for the peer"
        );
        // Once it reads, it is answered again.
        raw.write(b"{\"cmd\":\"NODE_SOCKET_GET_COUNT\",\"key\":\"again\"}\n")
            .await;
        assert_eq!(
            raw.frame().await.0,
            r#"{"cmd":"NODE_SOCKET_COUNT","key":"again","count":0}"#
        );
        assert!(ch.is_connected());
    });
}
