//! The CloudEvents adaptor on arbitrary bodies: never panic; whatever it accepts renders back
//! to JSON that parses again to the same event.
#![no_main]

use evmesh_protocol::adaptor::cloudevents::{parse_batch, parse_structured, write_structured};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(frame) = parse_structured("fuzz", data) {
        let mut out = Vec::new();
        write_structured(&frame, &[], &mut out);
        let again = parse_structured("fuzz", &out).expect("rendered event parses");
        assert_eq!(again.to_body(), frame.to_body());
    }
    let _ = parse_batch("fuzz", data);
});
