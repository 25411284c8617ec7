//! The CloudEvents HTTP binding on arbitrary requests, as the ingress reads them: the head is
//! parsed, the content mode picked from `Content-Type` and `ce-specversion`, and the body read in
//! that mode (binary mode: attributes from `ce-*` headers). Never panic; each attribute of an
//! accepted binary-mode event is its `ce-*` header as `header_value` decodes it (leniently:
//! ISO-8859-1 bytes, literal `%`); every accepted event renders as structured JSON that parses
//! again to the same attributes and the same JSON.
#![no_main]

use evmesh_protocol::adaptor::cloudevents::{self, Mode};
use evmesh_protocol::http::{parse_head, Limits, Status};
use frame_codec::{DataKind, Frame};
use libfuzzer_sys::fuzz_target;

fn render(frame: &Frame) -> Vec<u8> {
    let mut out = Vec::new();
    cloudevents::write_structured(frame, &[], &mut out);
    out
}

/// The rendered event is one JSON text (by the grammar: serde_json's `Value` would also refuse
/// numbers beyond f64, which JSON allows), parses back to the same attributes and data, and
/// renders the same from then on.
fn renders(frame: &Frame) {
    let out = render(frame);
    let text = std::str::from_utf8(&out).expect("rendered event is UTF-8");
    serde_json::from_str::<serde::de::IgnoredAny>(text).expect("rendered event is JSON");
    let again = cloudevents::parse_structured("fuzz", &out).expect("rendered event parses");
    let (body, back) = (frame.to_body(), again.to_body());
    assert_eq!(back.attributes, body.attributes);
    match frame.header().data_kind {
        DataKind::Json => assert_eq!(back.data, body.data.trim_ascii(), "JSON data, up to surrounding whitespace"),
        DataKind::Text => assert_eq!(
            serde_json::from_slice::<String>(&back.data).ok().as_deref(),
            std::str::from_utf8(&body.data).ok()
        ),
        DataKind::Binary | DataKind::None => {
            assert_eq!(again.header().data_kind, frame.header().data_kind);
            assert_eq!(back.data, body.data);
        }
    }
    let out2 = render(&again);
    let third = cloudevents::parse_structured("fuzz", &out2).expect("parses");
    assert_eq!(render(&third), out2);
}

fuzz_target!(|data: &[u8]| {
    let Ok(Status::Complete(head)) = parse_head(data, &Limits::default()) else { return };
    let body = &data[head.len..];
    let ct = head.header(data, "content-type");
    let has_specversion = head.header(data, "ce-specversion").is_some();
    let frames = match cloudevents::mode(ct, has_specversion) {
        Ok(Mode::Structured) => cloudevents::parse_structured("fuzz", body).map(|f| vec![f]),
        Ok(Mode::Batch) => cloudevents::parse_batch("fuzz", body),
        Ok(Mode::Binary) => {
            let r = cloudevents::parse_binary("fuzz", head.headers(data), ct, body);
            if let Ok(f) = &r {
                for (name, value) in head.headers(data) {
                    if name.get(..3).is_some_and(|p| p.eq_ignore_ascii_case("ce-")) {
                        let attr = name[3..].to_ascii_lowercase();
                        let want = cloudevents::header_value(value);
                        assert_eq!(f.body().attr_str(&attr), Some(want.as_str()), "{name}");
                    }
                }
            }
            r.map(|f| vec![f])
        }
        Err(_) => return,
    };
    if let Ok(frames) = frames {
        frames.iter().for_each(renders);
    }
});
