//! Round-trip properties, golden bytes per frame version, and rejection of foreign garbage.

use frame_codec::{
    AttrValue, Attribute, AttributeRef, Bytes, DataKind, Frame, FrameBody, FrameBodyRef, FrameError, FrameHeader,
    FrameKind, Slice, Text,
};
use proptest::prelude::*;

fn sample() -> (FrameHeader, FrameBody) {
    let header = FrameHeader {
        kind: FrameKind::Event,
        data_kind: DataKind::Json,
        partition: 3,
        offset: 42,
        timestamp_us: 1_764_500_000_000_000,
        sequence: 7,
    };
    let attr = |n: &str, v: AttrValue| Attribute { name: n.into(), value: v };
    let body = FrameBody {
        topic: "orders".into(),
        attributes: vec![
            attr("specversion", AttrValue::Str("1.0".into())),
            attr("id", AttrValue::Str("evt-1".into())),
            attr("source", AttrValue::Str("/shop".into())),
            attr("type", AttrValue::Str("com.shop.order".into())),
            attr("amount", AttrValue::Int(120)),
            attr("vip", AttrValue::Bool(true)),
        ],
        data: br#"{"sku":"A-1","qty":2}"#.to_vec(),
    };
    (header, body)
}

/// Resolved when the test runs (cargo sets the variable then too): a test binary reused from a
/// build in another checkout must read this checkout's files.
fn golden_path(name: &str) -> std::path::PathBuf {
    let dir =
        std::env::var_os("CARGO_MANIFEST_DIR").map_or(env!("CARGO_MANIFEST_DIR").into(), std::path::PathBuf::from);
    dir.join("tests/golden").join(name)
}

/// A layout drift must fail here, not corrupt stored logs. Regenerate only for a new frame
/// version (EVMESH_BLESS=1), never to make this pass.
#[test]
fn golden_v1_event_bytes_are_stable() {
    let (h, b) = sample();
    golden("v1-event.bin", h, b);
}

/// A request of request-reply: kind `Request`, its deadline (µs) in `sequence`, the request
/// attributes beside the event's. Same layout as v1 events; its own golden bytes.
#[test]
fn golden_v1_request_bytes_are_stable() {
    let (mut h, mut b) = sample();
    h.kind = FrameKind::Request;
    h.sequence = 1_764_500_030_000_000;
    let attr = |n: &str, v: &str| Attribute { name: n.into(), value: AttrValue::Str(v.into()) };
    b.attributes.push(attr("emcorrelationid", "1.0.1.2a.3.00000000deadbeef"));
    b.attributes.push(attr("emreplyto", "http://127.0.0.1:8080/events/reply"));
    b.attributes.push(attr("emexpiry", "2025-11-30T10:53:50Z"));
    golden("v1-request.bin", h, b);
}

/// Checks `frame` against the golden file `name` (written with EVMESH_BLESS=1, for a new kind
/// or version only) and that the file decodes back to `h` and `b`.
fn golden(name: &str, h: FrameHeader, b: FrameBody) {
    let frame = Frame::encode(&h, &b).unwrap();
    let path = golden_path(name);
    if std::env::var_os("EVMESH_BLESS").is_some() {
        std::fs::write(&path, frame.as_bytes()).unwrap();
    }
    let bytes = std::fs::read(&path).expect("golden file present");
    assert_eq!(frame.as_bytes(), &bytes[..], "{name}: layout changed");
    let decoded = Frame::decode(&bytes).unwrap();
    assert_eq!(decoded.header(), h);
    assert_eq!(decoded.to_body(), b);
}

/// The streaming kinds (Mode 1 agent calls): a `stream-request` with its prompt and a
/// `stream-chunk` with its sequence number in the header as in `emseq`.
#[test]
fn golden_v1_stream_request_and_chunk_bytes_are_stable() {
    let attr = |n: &str, v: AttrValue| Attribute { name: n.into(), value: v };
    let base = |id: &str| {
        vec![
            attr("specversion", AttrValue::Str("1.0".into())),
            attr("id", AttrValue::Str(id.into())),
            attr("source", AttrValue::Str("/client".into())),
            attr("type", AttrValue::Str("evmesh.stream".into())),
        ]
    };
    let header = |kind, data_kind, sequence| FrameHeader {
        kind,
        data_kind,
        partition: 0,
        offset: 7,
        timestamp_us: 1_764_500_000_000_000,
        sequence,
    };
    let mut attributes = base("turn-1");
    attributes.push(attr("emsessionid", AttrValue::Str("agent-1:0b7e2c9e".into())));
    attributes.push(attr("emreplyto", AttrValue::Str("http://127.0.0.1:8080/session/chunk/agent-1:0b7e2c9e".into())));
    attributes.push(attr("emmodel", AttrValue::Str("small".into())));
    attributes.push(attr("emconversation", AttrValue::Str("c-9".into())));
    let body = FrameBody { topic: ":agent.agent-1".into(), attributes, data: b"Tell me a story".to_vec() };
    golden("v1-stream-request.bin", header(FrameKind::StreamRequest, DataKind::Text, 0), body);
    let mut attributes = base("chunk-3");
    attributes.push(attr("emsessionid", AttrValue::Str("agent-1:0b7e2c9e".into())));
    attributes.push(attr("emseq", AttrValue::Int(3)));
    attributes.push(attr("emdone", AttrValue::Bool(false)));
    attributes.push(attr("emchunktype", AttrValue::Str("token".into())));
    let body = FrameBody { topic: ":session.agent-1:0b7e2c9e".into(), attributes, data: b"Once".to_vec() };
    golden("v1-stream-chunk.bin", header(FrameKind::StreamChunk, DataKind::Text, 3), body);
}

#[test]
fn setters_stamp_header_in_place() {
    let (h, b) = sample();
    let mut f = Frame::encode(&h, &b).unwrap();
    f.set_offset(9_000_000_001);
    f.set_partition(11);
    f.set_timestamp(-5);
    let back = Frame::decode(f.as_bytes()).unwrap();
    assert_eq!(back.header().offset, 9_000_000_001);
    assert_eq!(back.header().partition, 11);
    assert_eq!(back.header().timestamp_us, -5);
    assert_eq!(back.to_body(), b);
}

#[test]
fn garbage_is_rejected_not_trusted() {
    let (h, b) = sample();
    let good = Frame::encode(&h, &b).unwrap().as_bytes().to_vec();
    assert_eq!(Frame::decode(&good[..10]).unwrap_err(), FrameError::Short(10));
    let mut bad = good.clone();
    bad[0] = b'X';
    assert_eq!(Frame::decode(&bad).unwrap_err(), FrameError::Magic);
    let mut bad = good.clone();
    bad[4] = 9;
    assert_eq!(Frame::decode(&bad).unwrap_err(), FrameError::Version(9));
    let mut bad = good.clone();
    bad[5] = 77;
    assert_eq!(Frame::decode(&bad).unwrap_err(), FrameError::Kind(77));
    assert!(matches!(Frame::decode(&good[..good.len() - 1]), Err(FrameError::BodyLength { .. })));
    // Corrupt the body's root (relative pointers and lengths live at the end).
    let mut bad = good.clone();
    let n = bad.len();
    for byte in &mut bad[n - 16..] {
        *byte = 0xff;
    }
    assert!(matches!(Frame::decode(&bad), Err(FrameError::Body(_))));
}

fn attr_value() -> impl Strategy<Value = AttrValue> {
    prop_oneof![
        ".{0,40}".prop_map(AttrValue::Str),
        any::<bool>().prop_map(AttrValue::Bool),
        any::<i64>().prop_map(AttrValue::Int),
    ]
}

fn body() -> impl Strategy<Value = FrameBody> {
    (
        "[A-Za-z0-9._-]{1,64}",
        prop::collection::vec(("[a-z0-9]{1,20}", attr_value()), 0..12),
        prop::collection::vec(any::<u8>(), 0..2048),
    )
        .prop_map(|(topic, attrs, data)| FrameBody {
            topic,
            attributes: attrs.into_iter().map(|(name, value)| Attribute { name, value }).collect(),
            data,
        })
}

fn header() -> impl Strategy<Value = FrameHeader> {
    (
        prop_oneof![
            Just(FrameKind::Event),
            Just(FrameKind::Request),
            Just(FrameKind::Reply),
            Just(FrameKind::StreamRequest),
            Just(FrameKind::StreamChunk)
        ],
        prop_oneof![Just(DataKind::None), Just(DataKind::Json), Just(DataKind::Text), Just(DataKind::Binary)],
        any::<u32>(),
        any::<u64>(),
        any::<i64>(),
        any::<u64>(),
    )
        .prop_map(|(kind, data_kind, partition, offset, timestamp_us, sequence)| FrameHeader {
            kind,
            data_kind,
            partition,
            offset,
            timestamp_us,
            sequence,
        })
}

/// The borrowed view of an owned body, as the adaptors build it from request bytes.
fn borrowed(b: &FrameBody) -> (Vec<AttributeRef<'_>>, Bytes<'_>) {
    let attrs = b.attributes.iter().map(Attribute::borrowed).collect();
    (attrs, Bytes(std::borrow::Cow::Borrowed(&b.data)))
}

proptest! {
    /// A body encoded from borrowed parts is byte for byte the owned body's frame: the frame
    /// reads it back as an owned body, trusting it (`Frame::body` does not validate).
    #[test]
    fn a_borrowed_body_encodes_to_the_owned_bodys_bytes(h in header(), b in body()) {
        let (attrs, data) = borrowed(&b);
        let r = FrameBodyRef { topic: Text::from(b.topic.as_str()), attributes: Slice(&attrs), data };
        let f = Frame::encode_ref(&h, &r).unwrap();
        let owned = Frame::encode(&h, &b).unwrap();
        prop_assert_eq!(f.as_bytes(), owned.as_bytes());
        prop_assert_eq!(Frame::decode(f.as_bytes()).unwrap().to_body(), b);
    }

    /// Attributes added to a stored frame give the frame the owned body with them makes.
    #[test]
    fn attributes_added_in_place_are_the_owned_bodys_with_them(h in header(), b in body(), extra in body()) {
        let f = Frame::encode(&h, &b).unwrap();
        let (more, _) = borrowed(&extra);
        let added = f.with_attributes(&more).unwrap();
        let mut want = b.clone();
        want.attributes.extend(extra.attributes.iter().cloned());
        let owned = Frame::encode(&h, &want).unwrap();
        prop_assert_eq!(added.as_bytes(), owned.as_bytes());
    }

    #[test]
    fn encode_decode_round_trips(h in header(), b in body()) {
        let f = Frame::encode(&h, &b).unwrap();
        let back = Frame::decode(f.as_bytes()).unwrap();
        prop_assert_eq!(back.header(), h);
        prop_assert_eq!(back.to_body(), b);
    }

    #[test]
    fn decode_never_panics_on_mutations(h in header(), b in body(), pos in any::<prop::sample::Index>(), byte in any::<u8>()) {
        let mut bytes = Frame::encode(&h, &b).unwrap().as_bytes().to_vec();
        let i = pos.index(bytes.len());
        bytes[i] = byte;
        let _ = Frame::decode(&bytes);
    }
}
