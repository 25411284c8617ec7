//! The request-head parser and chunked scanner on arbitrary bytes: never panic, and a complete
//! head never claims more bytes than it was given.
#![no_main]

use evmesh::http::{decode_chunked, parse_head, scan_chunked, BodyKind, Limits, Status};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = Limits { max_header_bytes: 4096, max_headers: 32, max_body_bytes: 65536 };
    if let Ok(Status::Complete(head)) = parse_head(data, &limits) {
        assert!(head.len <= data.len());
        for (name, _) in head.headers(data) {
            assert!(!name.is_empty());
        }
        if head.body == BodyKind::Chunked {
            let rest = &data[head.len..];
            if let Ok(Status::Complete(end)) = scan_chunked(rest, limits.max_body_bytes) {
                assert!(end.consumed <= rest.len());
                let mut out = Vec::new();
                decode_chunked(rest, &end, &mut out);
                assert_eq!(out.len(), end.data_len);
            }
        }
    }
});
