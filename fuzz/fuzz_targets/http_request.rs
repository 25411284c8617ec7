//! The request-head parser and chunked scanner on arbitrary bytes: never panic, a complete head
//! never claims more bytes than it was given, every prefix of the input gets `Partial` or the
//! whole input's answer (the network may split a request anywhere), and the chunked scanner
//! gives the same answer and the same data however its input is split, doing work linear in it.
#![no_main]

use evmesh_protocol::http::{parse_head, BodyKind, ChunkedLimits, ChunkedScanner, Limits, Status};
use libfuzzer_sys::fuzz_target;

/// Prefix lengths to replay: every one for short inputs, an even spread (plus the edges) else.
fn cuts(len: usize, also: usize) -> Vec<usize> {
    let mut v: Vec<usize> = if len <= 256 { (0..len).collect() } else { (0..32).map(|i| i * len / 32).collect() };
    v.extend([also.saturating_sub(1), also, len.saturating_sub(1)].into_iter().filter(|&k| k < len));
    v
}

fuzz_target!(|data: &[u8]| {
    let limits = Limits { max_header_bytes: 4096, max_headers: 32, max_body_bytes: 65536 };
    let whole = parse_head(data, &limits);
    let head_len = match &whole {
        Ok(Status::Complete(h)) => h.len,
        _ => data.len(),
    };
    for k in cuts(data.len(), head_len) {
        let part = parse_head(&data[..k], &limits);
        match (&whole, &part) {
            (_, Ok(Status::Partial)) => assert!(k < head_len || whole.is_err(), "a complete head parsed Partial"),
            (Ok(Status::Complete(h)), p) => {
                assert!(k >= h.len, "prefix {k} of a {}-byte head answered {p:?}", h.len);
                assert_eq!(p, &whole);
            }
            (w, p) => assert_eq!(p, w, "prefix {k} answered differently"),
        }
    }
    let Ok(Status::Complete(head)) = whole else { return };
    assert!(head.len <= data.len());
    for (name, _) in head.headers(data) {
        assert!(!name.is_empty());
    }
    if head.body != BodyKind::Chunked {
        return;
    }
    let rest = &data[head.len..];
    let chunked = ChunkedLimits::for_request(&limits, head.len);
    let mut whole = ChunkedScanner::new(chunked);
    let mut out = Vec::new();
    let answer = whole.scan(rest, &mut out);
    if let Ok(Status::Complete(end)) = answer {
        assert!(end.consumed <= rest.len());
        assert_eq!(out.len(), end.data_len);
    }
    assert!(whole.bytes_examined() <= 5 * rest.len() + 16);
    // As a connection feeds it: growing prefixes until the scanner stops saying Partial. Once
    // it has answered, the whole input must get the same answer and the same data.
    for step in [1, 2, 7, rest.len() / 2 + 1] {
        if step == 1 && rest.len() > 4096 {
            continue;
        }
        let mut split = ChunkedScanner::new(chunked);
        let mut split_out = Vec::new();
        let mut at = 0;
        let got = loop {
            at = (at + step).min(rest.len());
            match split.scan(&rest[..at], &mut split_out) {
                Ok(Status::Partial) if at < rest.len() => continue,
                r => break r,
            }
        };
        assert_eq!(got, answer, "fed {step} bytes at a time");
        if got.is_ok() {
            assert_eq!(split_out, out, "fed {step} bytes at a time");
        }
        assert!(split.bytes_examined() <= 5 * rest.len() + 16, "fed {step} bytes at a time");
    }
});
