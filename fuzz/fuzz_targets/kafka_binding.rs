//! The CloudEvents Kafka binding (binary content mode) on arbitrary records, as the Kafka tail
//! reads them from any producer. Never panic; a record it accepts becomes a frame that renders
//! as a valid structured CloudEvent (the same checks as the HTTP ingress), and the record evmesh
//! would write for that frame reads back as the same frame.
//!
//! Input, one record: a first line with the record's timestamp in ms (decimal; 0 if not a
//! number), a second line with the key (empty: no key), then `name:value` header lines up to
//! an empty line, then the value.
#![no_main]

use evmesh_protocol::adaptor::cloudevents::{parse_structured, write_structured};
use evmesh_protocol::adaptor::kafka::{from_record, to_record};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut lines = data.splitn(3, |&b| b == b'\n');
    let ts: i64 = std::str::from_utf8(lines.next().unwrap_or(b"")).ok().and_then(|s| s.parse().ok()).unwrap_or(0);
    let key = lines.next().filter(|k| !k.is_empty());
    let mut rest = lines.next().unwrap_or(b"");
    let mut headers: Vec<(&str, &[u8])> = Vec::new();
    while let Some(nl) = rest.iter().position(|&b| b == b'\n') {
        let line = &rest[..nl];
        rest = &rest[nl + 1..];
        if line.is_empty() {
            break;
        }
        let colon = line.iter().position(|&b| b == b':').unwrap_or(line.len());
        let Ok(name) = std::str::from_utf8(&line[..colon]) else { continue };
        headers.push((name, line.get(colon + 1..).unwrap_or(b"")));
    }
    let value = rest;

    let Ok(frame) = from_record("fuzz", 1, 7, key, &headers, value, ts) else { return };
    let mut json = Vec::new();
    write_structured(&frame, &[], &mut json);
    match parse_structured("fuzz", &json) {
        Ok(again) => assert_eq!(again.to_body().attributes, frame.to_body().attributes),
        Err(e) => panic!("accepted a record whose event is not valid: {e}: {}", String::from_utf8_lossy(&json)),
    }

    let record = to_record(&frame);
    let headers: Vec<(&str, &[u8])> = record.headers.iter().map(|(n, v)| (n.as_str(), v.as_slice())).collect();
    let back = from_record("fuzz", 1, 7, record.key.as_deref(), &headers, &record.value, record.timestamp_ms)
        .expect("evmesh's own record reads back");
    assert_eq!(back.to_body(), frame.to_body());
    assert_eq!(back.header(), frame.header());
});
