//! The response-head parser of the broker's own HTTP client (what a webhook sink or a remote
//! agent answers) on arbitrary bytes: never panic, a complete head never claims more bytes than
//! it was given and its header positions lie inside it, and every prefix of the input parses
//! `Partial` or exactly as the whole input does (a network may split an answer anywhere).
#![no_main]

use evmesh_protocol::http::client::{parse_response_head, ResponseBody};
use evmesh_protocol::http::Status;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let whole = parse_response_head(data, 4096, 32, false);
    let head_len = match &whole {
        Ok(Status::Complete(h)) => {
            assert!(h.len <= data.len());
            assert!((100..=599).contains(&h.status));
            for p in &h.headers {
                assert!(
                    p.name.0 < p.name.1
                        && p.name.1 as usize <= h.len
                        && p.value.0 <= p.value.1
                        && p.value.1 as usize <= h.len
                );
            }
            if h.body == ResponseBody::UntilClose {
                assert!(!h.keep_alive, "a body framed by the close cannot leave the connection open");
            }
            h.len
        }
        _ => data.len(),
    };
    let cuts: Vec<usize> =
        if data.len() <= 256 { (0..data.len()).collect() } else { (0..32).map(|i| i * data.len() / 32).collect() };
    for k in cuts.into_iter().chain([head_len.saturating_sub(1)]).filter(|&k| k < data.len()) {
        match (&whole, parse_response_head(&data[..k], 4096, 32, false)) {
            (_, Ok(Status::Partial)) => assert!(k < head_len || whole.is_err(), "a complete head parsed Partial"),
            (Ok(Status::Complete(h)), p) => {
                assert!(k >= h.len, "prefix {k} of a {}-byte head answered {p:?}", h.len);
                assert_eq!(&p, &whole);
            }
            (Ok(Status::Partial), p) => panic!("a prefix of a partial head answered {p:?}"),
            (Err(_), Ok(Status::Complete(h))) => assert!(h.len <= k),
            (Err(_), Err(_)) => {}
        }
    }
});
