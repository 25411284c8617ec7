//! The CloudEvents adaptor on arbitrary structured and batch bodies: never panic; whatever it
//! accepts renders back to JSON that parses again to the same event.
#![no_main]

use evmesh_protocol::adaptor::cloudevents::{parse_batch, parse_structured, write_structured};
use frame_codec::Frame;
use libfuzzer_sys::fuzz_target;

fn round_trips(frame: &Frame) {
    let mut out = Vec::new();
    write_structured(frame, &[], &mut out);
    let again = parse_structured("fuzz", &out).expect("rendered event parses");
    assert_eq!(again.to_body(), frame.to_body());
    assert_eq!(again.header().data_kind, frame.header().data_kind);
}

fuzz_target!(|data: &[u8]| {
    if let Ok(frame) = parse_structured("fuzz", data) {
        round_trips(&frame);
    }
    if let Ok(frames) = parse_batch("fuzz", data) {
        frames.iter().for_each(round_trips);
    }
});
