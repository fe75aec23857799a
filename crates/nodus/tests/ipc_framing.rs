//! The IPC frame decoder: a proptest round trip (any JSON values, encoded as Node writes them,
//! split into arbitrary chunks, decode to the same values in order) and the cap and malformed
//! cases. The fuzz target (`crates/nodus/fuzz`) feeds it arbitrary bytes.

use nodus::ipc::framing::{Decoder, FrameError, encode};
use proptest::prelude::*;
use serde_json::Value;

fn json_value() -> impl Strategy<Value = Value> {
    let text = prop::collection::vec(any::<char>(), 0..12).prop_map(String::from_iter);
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        text.clone().prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 32, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((text.clone(), inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

proptest! {
    #[test]
    fn frames_round_trip_through_any_chunking(
        values in prop::collection::vec(json_value(), 1..8),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..10),
    ) {
        let mut wire = Vec::new();
        let mut texts = Vec::new();
        for v in &values {
            let frame = encode(v).unwrap();
            prop_assert_eq!(frame.iter().filter(|&&b| b == b'\n').count(), 1);
            texts.push(String::from_utf8(frame[..frame.len() - 1].to_vec()).unwrap());
            wire.extend_from_slice(&frame);
        }
        let mut points: Vec<usize> = cuts.iter().map(|i| i.index(wire.len() + 1)).collect();
        points.push(0);
        points.push(wire.len());
        points.sort_unstable();
        let mut decoder = Decoder::new(1 << 20);
        let mut got = Vec::new();
        for w in points.windows(2) {
            decoder.push(&wire[w[0]..w[1]]);
            while let Some(frame) = decoder.next_frame().unwrap() {
                got.push(frame.get().to_owned());
            }
        }
        // The exact text, so object keys keep their order (floats are compared as written).
        prop_assert_eq!(got, texts);
        prop_assert_eq!(decoder.buffered(), 0);
    }

    #[test]
    fn arbitrary_bytes_never_panic_and_respect_the_cap(
        chunks in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..64), 0..16),
    ) {
        let mut decoder = Decoder::new(32);
        for c in &chunks {
            decoder.push(c);
            loop {
                match decoder.next_frame() {
                    Ok(Some(frame)) => prop_assert!(frame.get().len() <= 32),
                    Ok(None) => break,
                    // A bad frame is dropped; the decoder goes on after it.
                    Err(_) => {}
                }
            }
            prop_assert!(decoder.buffered() <= 32 + 64);
        }
    }

    #[test]
    fn a_bad_frame_never_costs_the_good_ones_after_it(
        garbage in prop::collection::vec(any::<u8>().prop_filter("no newline", |b| *b != b'\n'), 0..100),
        split in 0usize..200,
    ) {
        // Garbage (maybe over the cap, maybe valid JSON by chance) then two good frames, the
        // bytes pushed in two arbitrary pieces.
        let mut bytes = garbage.clone();
        bytes.extend_from_slice(b"\n\"a\"\n[1]\n");
        let split = split.min(bytes.len());
        let mut decoder = Decoder::new(32);
        let mut good = Vec::new();
        for piece in [&bytes[..split], &bytes[split..]] {
            decoder.push(piece);
            loop {
                match decoder.next_frame() {
                    Ok(Some(frame)) => good.push(frame.get().to_owned()),
                    Ok(None) => break,
                    Err(_) => {}
                }
            }
        }
        let tail = good.len().saturating_sub(2);
        prop_assert_eq!(&good[tail..], &["\"a\"".to_owned(), "[1]".to_owned()][..]);
        prop_assert_eq!(decoder.buffered(), 0);
    }
}

#[test]
fn a_partial_line_over_the_cap_is_refused_before_its_newline() {
    let mut d = Decoder::new(10);
    d.push(b"\"0123456789");
    assert_eq!(
        d.next_frame().unwrap_err(),
        FrameError::TooLarge { len: 11, max: 10 }
    );
    // The rest of that line is discarded as it arrives, however long, and reported no more;
    // the next line is a frame.
    d.push(&[b'7'; 100]);
    assert!(d.next_frame().unwrap().is_none());
    assert_eq!(d.buffered(), 0, "an oversized line is not kept");
    assert!(!d.at_frame_start(), "still inside the oversized line");
    d.push(b"\"\n1\n");
    assert_eq!(d.next_frame().unwrap().unwrap().get(), "1");
    assert!(d.at_frame_start());
}

#[test]
fn a_whole_line_over_the_cap_is_refused_and_the_next_one_read() {
    let mut d = Decoder::new(10);
    d.push(b"\"0123456789\"\n[2]\n");
    assert_eq!(
        d.next_frame().unwrap_err(),
        FrameError::TooLarge { len: 12, max: 10 }
    );
    assert_eq!(d.next_frame().unwrap().unwrap().get(), "[2]");
}

#[test]
fn empty_lines_and_garbage_are_malformed() {
    for bad in [&b"\n"[..], b"{\"a\":}\n", b"\xff\n", b"1 2\n", b"NaN\n"] {
        let mut d = Decoder::new(100);
        d.push(bad);
        assert!(
            matches!(d.next_frame(), Err(FrameError::Malformed { .. })),
            "{bad:?}"
        );
        // Only that line is lost.
        d.push(b"true\n");
        assert_eq!(d.next_frame().unwrap().unwrap().get(), "true", "{bad:?}");
    }
    let mut d = Decoder::new(100);
    d.push(b"{\"b\":1,\"a\":2}\n\"x\"\n");
    assert_eq!(d.next_frame().unwrap().unwrap().get(), r#"{"b":1,"a":2}"#);
    assert_eq!(d.next_frame().unwrap().unwrap().get(), r#""x""#);
    assert!(d.next_frame().unwrap().is_none());
}
