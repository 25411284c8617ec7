//! Frame decoding on arbitrary bytes: never panic, and whatever validates round-trips.
#![no_main]

use frame_codec::Frame;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(frame) = Frame::decode(data) {
        let again = Frame::encode(&frame.header(), &frame.to_body()).expect("re-encode");
        let back = Frame::decode(again.as_bytes()).expect("re-decode");
        assert_eq!(back.to_body(), frame.to_body());
        assert_eq!(back.header(), frame.header());
    }
});
