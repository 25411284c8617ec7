//! The request-head parser and chunked scanner on arbitrary bytes: never panic, a complete head
//! never claims more bytes than it was given, and the chunked scanner gives the same answer fed
//! in two pieces as in one, doing work linear in its input.
#![no_main]

use evmesh_protocol::http::{parse_head, BodyKind, ChunkedLimits, ChunkedScanner, Limits, Status};
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
            let chunked = ChunkedLimits::for_request(&limits, head.len);
            let mut whole = ChunkedScanner::new(chunked);
            let mut out = Vec::new();
            let answer = whole.scan(rest, &mut out);
            if let Ok(Status::Complete(end)) = answer {
                assert!(end.consumed <= rest.len());
                assert_eq!(out.len(), end.data_len);
            }
            let mut split = ChunkedScanner::new(chunked);
            let mut split_out = Vec::new();
            let _ = split.scan(&rest[..rest.len() / 2], &mut split_out);
            assert_eq!(split.scan(rest, &mut split_out), answer);
            assert_eq!(split_out, out);
            assert!(split.bytes_examined() <= 5 * rest.len() + 16);
        }
    }
});
