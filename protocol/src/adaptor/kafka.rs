//! The CloudEvents Kafka protocol binding, binary content mode: frames to Kafka records and
//! back. Pure code, no client library types.
//!
//! A record is: key = `partitionkey` (when the event has one); headers `ce_<attribute>` for
//! every context attribute and extension, in the event's attribute order, with
//! `datacontenttype` as `content-type`; value = the data bytes. So any Kafka consumer with a
//! CloudEvents SDK reads evmesh's topics, and evmesh reads events such producers write.
//!
//! What only evmesh needs rides in headers of its own prefix, `evmesh_`: `evmesh_types`
//! (attributes that are JSON booleans or integers, which Kafka headers cannot type:
//! `name=b,name=i`), `evmesh_data` (how the data renders: `none|json|text|binary`),
//! `evmesh_ts` (publish time in µs), `evmesh_deadline` (a request of request-reply: its
//! deadline in µs, so it stays a request, never redelivered, wherever it is read back).
//! Records without them are typed as the HTTP binary mode
//! types a body: by media type. A record is held to the rules the HTTP binding applies to an
//! event (`cloudevents::check_event`, 32-bit integers, at most `MAX_ATTRIBUTES` attributes);
//! one that fails them is no CloudEvent, and the Kafka tail skips it with a log line.

use frame_codec::{AttrValue, Attribute, DataKind, Frame, FrameBody, FrameHeader};

use super::cloudevents::{check_event, is_json, is_json_media, is_text_media, CeError, MAX_ATTRIBUTES};
use super::tracecontext::{valid_tracestate, TraceParent};

/// A Kafka record's parts, as the storage backend hands them to the client library.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Record {
    /// The record key: the event's `partitionkey`, if it has one.
    pub key: Option<Vec<u8>>,
    /// The record headers: `ce_<attribute>` in attribute order (`datacontenttype` as
    /// `content-type`), then evmesh's own `evmesh_*`.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The record value: the event data (empty when there is none).
    pub value: Vec<u8>,
    /// Milliseconds since the epoch (the record's CreateTime).
    pub timestamp_ms: i64,
}

const TYPES: &str = "evmesh_types";
const DATA: &str = "evmesh_data";
const TS: &str = "evmesh_ts";
const DEADLINE: &str = "evmesh_deadline";

fn invalid(m: impl Into<String>) -> CeError {
    CeError::Invalid(m.into())
}

/// The record for a stored frame.
pub fn to_record(frame: &Frame) -> Record {
    let h = frame.header();
    let body = frame.body();
    let mut headers = Vec::with_capacity(body.attributes.len() + 3);
    let mut types = String::new();
    let mut key = None;
    for a in body.attributes.iter() {
        let name = a.name.as_str();
        let value = match &a.value {
            frame_codec::ArchivedAttrValue::Str(s) => s.as_str().as_bytes().to_vec(),
            frame_codec::ArchivedAttrValue::Bool(b) => {
                types.push_str(&format!("{}{name}=b", if types.is_empty() { "" } else { "," }));
                b.to_string().into_bytes()
            }
            frame_codec::ArchivedAttrValue::Int(n) => {
                types.push_str(&format!("{}{name}=i", if types.is_empty() { "" } else { "," }));
                i64::from(*n).to_string().into_bytes()
            }
        };
        if name == "partitionkey" {
            key = Some(value.clone());
        }
        if name == "traceparent" || name == "tracestate" {
            // W3C Trace Context's own header too, which Kafka clients' tracing reads.
            headers.push((name.to_owned(), value.clone()));
        }
        if name == "datacontenttype" {
            headers.push(("content-type".to_owned(), value));
        } else {
            headers.push((format!("ce_{name}"), value));
        }
    }
    if !types.is_empty() {
        headers.push((TYPES.to_owned(), types.into_bytes()));
    }
    let data = match h.data_kind {
        DataKind::None => "none",
        DataKind::Json => "json",
        DataKind::Text => "text",
        DataKind::Binary => "binary",
    };
    headers.push((DATA.to_owned(), data.as_bytes().to_vec()));
    headers.push((TS.to_owned(), h.timestamp_us.to_string().into_bytes()));
    if h.kind == frame_codec::FrameKind::Request {
        headers.push((DEADLINE.to_owned(), (h.sequence as i64).to_string().into_bytes()));
    }
    Record { key, headers, value: body.data.as_slice().to_vec(), timestamp_ms: h.timestamp_us.div_euclid(1000) }
}

/// The frame for a record read from `topic`, at `partition` and `offset`. `Err` for a record
/// that is not a CloudEvent in binary mode (no `ce_specversion`, `ce_id`, ...).
pub fn from_record(
    topic: &str,
    partition: u32,
    offset: u64,
    key: Option<&[u8]>,
    headers: &[(&str, &[u8])],
    value: &[u8],
    timestamp_ms: i64,
) -> Result<Frame, CeError> {
    let text = |v: &[u8]| String::from_utf8(v.to_vec()).map_err(|_| invalid("a header value is not UTF-8"));
    let header = |name: &str| headers.iter().find(|(n, _)| *n == name).map(|(_, v)| *v);
    let types = header(TYPES).map(text).transpose()?.unwrap_or_default();
    let type_of = |name: &str| {
        types.split(',').find_map(|t| t.split_once('=').filter(|(n, _)| *n == name).map(|(_, k)| k.to_owned()))
    };
    let mut attributes: Vec<Attribute> = Vec::with_capacity(headers.len());
    for (name, v) in headers {
        let attr = if name.eq_ignore_ascii_case("content-type") {
            "datacontenttype".to_owned()
        } else if let Some(a) = name.strip_prefix("ce_") {
            a.to_ascii_lowercase()
        } else {
            continue;
        };
        if attr.is_empty() || !attr.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()) {
            return Err(invalid(format!("header {name} is not a CloudEvents attribute")));
        }
        if attributes.iter().any(|a| a.name == attr) {
            continue;
        }
        // Bounds the duplicate scan above (quadratic) as the HTTP binding bounds an event.
        if attributes.len() == MAX_ATTRIBUTES {
            return Err(invalid(format!("an event carries at most {MAX_ATTRIBUTES} attributes")));
        }
        let s = text(v)?;
        let value = match type_of(&attr).as_deref() {
            Some("b") => AttrValue::Bool(s == "true"),
            Some("i") => {
                let n: i64 = s.parse().map_err(|_| invalid(format!("{attr} is not an integer")))?;
                // CloudEvents integers are 32-bit, as the JSON format checks.
                i32::try_from(n).map_err(|_| invalid(format!("{attr}: integer out of the 32-bit range")))?;
                AttrValue::Int(n)
            }
            _ => AttrValue::Str(s),
        };
        attributes.push(Attribute { name: attr, value });
    }
    // A producer that traces with W3C's header only: its context is the event's (a value
    // that is no traceparent, or no tracestate worth keeping, is left out, not the record).
    let w3c = |name: &str| header(name).and_then(|v| std::str::from_utf8(v).ok());
    let has = |attributes: &[Attribute], name: &str| attributes.iter().any(|a| a.name == name);
    if let (Some(tp), false) = (w3c("traceparent").and_then(TraceParent::parse), has(&attributes, "traceparent")) {
        if attributes.len() + 2 <= MAX_ATTRIBUTES {
            attributes.push(Attribute { name: "traceparent".into(), value: AttrValue::Str(tp.format()) });
            if let (Some(ts), false) =
                (w3c("tracestate").filter(|s| valid_tracestate(s)), has(&attributes, "tracestate"))
            {
                attributes.push(Attribute { name: "tracestate".into(), value: AttrValue::Str(ts.to_owned()) });
            }
        }
    }
    if let (Some(k), false) = (key, attributes.iter().any(|a| a.name == "partitionkey")) {
        attributes.push(Attribute { name: "partitionkey".into(), value: AttrValue::Str(text(k)?) });
    }
    for req in ["specversion", "id", "source", "type"] {
        if !attributes.iter().any(|a| a.name == req) {
            return Err(invalid(format!("not a binary-mode CloudEvent: no ce_{req}")));
        }
    }
    // Any producer can write to the topic: its event is held to the rules the HTTP ingress
    // applies (specversion, time, dataschema, string-typed context attributes...), so what
    // subscribers receive is always a valid CloudEvent.
    check_event(&attributes)?;
    let ct = attributes.iter().find(|a| a.name == "datacontenttype").and_then(|a| match &a.value {
        AttrValue::Str(s) => Some(s.clone()),
        _ => None,
    });
    let data_kind = match header(DATA) {
        Some(b"none") => DataKind::None,
        Some(b"json") => DataKind::Json,
        Some(b"text") => DataKind::Text,
        Some(b"binary") => DataKind::Binary,
        _ if value.is_empty() => DataKind::None,
        _ => match &ct {
            Some(ct) if is_json_media(ct) && is_json(value) => DataKind::Json,
            Some(ct) if is_text_media(ct) && std::str::from_utf8(value).is_ok() => DataKind::Text,
            _ => DataKind::Binary,
        },
    };
    // Whatever a foreign producer wrote, the stored frame must render: JSON data must parse.
    let data_kind = match data_kind {
        DataKind::Json if !is_json(value) => DataKind::Binary,
        DataKind::Text if std::str::from_utf8(value).is_err() => DataKind::Binary,
        k => k,
    };
    let ts =
        header(TS).and_then(|v| std::str::from_utf8(v).ok()?.parse().ok()).unwrap_or(timestamp_ms.saturating_mul(1000));
    let body = FrameBody { topic: topic.to_owned(), attributes, data: value.to_vec() };
    let mut fh = FrameHeader::event(data_kind);
    if let Some(d) = header(DEADLINE).and_then(|v| std::str::from_utf8(v).ok()?.parse::<i64>().ok()) {
        fh.kind = frame_codec::FrameKind::Request;
        fh.sequence = d as u64;
    }
    let mut frame = Frame::encode(&fh, &body).map_err(|e| invalid(e.to_string()))?;
    frame.set_partition(partition);
    frame.set_offset(offset);
    frame.set_timestamp(ts);
    Ok(frame)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adaptor::cloudevents::{parse_structured, write_structured};

    fn round_trip(json: &str) -> (Record, Frame, Frame) {
        let mut f = parse_structured("t", json.as_bytes()).unwrap();
        f.set_timestamp(1_700_000_000_123_456);
        let r = to_record(&f);
        let headers: Vec<(&str, &[u8])> = r.headers.iter().map(|(n, v)| (n.as_str(), v.as_slice())).collect();
        let back = from_record("t", 3, 42, r.key.as_deref(), &headers, &r.value, r.timestamp_ms).unwrap();
        (r, f, back)
    }

    #[test]
    fn frames_survive_the_binary_binding_faithfully() {
        for json in [
            r#"{"specversion":"1.0","id":"a","source":"/s","type":"t","partitionkey":"k1","flag":true,"n":7,"datacontenttype":"application/json","data":{"x": [1, 2]}}"#,
            r#"{"specversion":"1.0","id":"b","source":"/s","type":"t","datacontenttype":"text/plain","data":"hi"}"#,
            r#"{"specversion":"1.0","id":"c","source":"/s","type":"t","data_base64":"AAEC"}"#,
            r#"{"specversion":"1.0","id":"d","source":"/s","type":"t"}"#,
        ] {
            let (r, f, back) = round_trip(json);
            let (mut a, mut b) = (Vec::new(), Vec::new());
            write_structured(&f, &[], &mut a);
            write_structured(&back, &[], &mut b);
            assert_eq!(String::from_utf8(b).unwrap(), String::from_utf8(a).unwrap(), "{json}");
            assert_eq!(back.header().timestamp_us, f.header().timestamp_us);
            assert_eq!((back.header().partition, back.header().offset), (3, 42));
            assert!(r.headers.iter().any(|(n, v)| n == "ce_id" && !v.is_empty()));
        }
        let (r, ..) = round_trip(
            r#"{"specversion":"1.0","id":"a","source":"/s","type":"t","partitionkey":"k1","datacontenttype":"application/json","data":1}"#,
        );
        assert_eq!(r.key.as_deref(), Some(&b"k1"[..]), "the key is the partitionkey");
        assert!(r.headers.iter().any(|(n, v)| n == "content-type" && v == b"application/json"));
        assert_eq!(r.value, b"1");
    }

    #[test]
    fn trace_context_travels_as_the_w3c_header_too() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let (r, _, back) = round_trip(&format!(
            r#"{{"specversion":"1.0","id":"a","source":"/s","type":"t","traceparent":"{tp}","tracestate":"k=v"}}"#
        ));
        for name in ["traceparent", "ce_traceparent"] {
            assert!(r.headers.iter().any(|(n, v)| n == name && v == tp.as_bytes()), "{name}");
        }
        assert!(r.headers.iter().any(|(n, v)| n == "tracestate" && v == b"k=v"));
        assert_eq!(back.body().attr_str("traceparent"), Some(tp));
        assert_eq!(back.body().attributes.iter().filter(|a| a.name.as_str() == "traceparent").count(), 1);
        // A producer that sets only W3C's header: the event carries its context.
        let h: Vec<(&str, &[u8])> = vec![
            ("ce_specversion", b"1.0"),
            ("ce_id", b"x"),
            ("ce_source", b"/other"),
            ("ce_type", b"t"),
            ("traceparent", tp.as_bytes()),
        ];
        let f = from_record("t", 0, 0, None, &h, b"", 0).unwrap();
        assert_eq!(f.body().attr_str("traceparent"), Some(tp));
        // One that is not a traceparent (or not UTF-8) is left out, and the record kept.
        for bad in [&b"not-a-traceparent"[..], b"\xff\xfe"] {
            let mut h = h.clone();
            h[4] = ("traceparent", bad);
            let f = from_record("t", 0, 0, None, &h, b"", 0).unwrap();
            assert_eq!(f.body().attr_str("traceparent"), None);
        }
    }

    #[test]
    fn a_request_stays_a_request_with_its_deadline() {
        let f = parse_structured("t", br#"{"specversion":"1.0","id":"q","source":"/s","type":"t"}"#).unwrap();
        let mut h = f.header();
        (h.kind, h.sequence) = (frame_codec::FrameKind::Request, 1_800_000_000_000_000);
        let f = Frame::encode(&h, &f.to_body()).unwrap();
        let r = to_record(&f);
        let headers: Vec<(&str, &[u8])> = r.headers.iter().map(|(n, v)| (n.as_str(), v.as_slice())).collect();
        let back = from_record("t", 0, 1, None, &headers, &r.value, r.timestamp_ms).unwrap();
        assert_eq!((back.header().kind, back.header().sequence), (frame_codec::FrameKind::Request, h.sequence));
        let (_, _, event) = round_trip(r#"{"specversion":"1.0","id":"e","source":"/s","type":"t"}"#);
        assert_eq!(event.header().kind, frame_codec::FrameKind::Event);
    }

    #[test]
    fn records_of_other_producers_are_typed_by_media_type() {
        let h = |ct: &'static str| -> Vec<(&'static str, &'static [u8])> {
            vec![
                ("ce_specversion", b"1.0"),
                ("ce_id", b"x"),
                ("ce_source", b"/other"),
                ("ce_type", b"t"),
                ("content-type", ct.as_bytes()),
            ]
        };
        let kind = |ct, v: &[u8]| from_record("t", 0, 0, None, &h(ct), v, 5).unwrap().header().data_kind;
        assert_eq!(kind("application/json", b"{\"a\":1}"), DataKind::Json);
        assert_eq!(kind("application/json", b"{not json"), DataKind::Binary);
        assert_eq!(kind("text/plain", b"hello"), DataKind::Text);
        assert_eq!(kind("application/octet-stream", b"\x00\x01"), DataKind::Binary);
        let f = from_record("t", 0, 9, Some(b"key"), &h("text/plain"), b"x", 5).unwrap();
        assert_eq!(f.body().attr_str("partitionkey"), Some("key"), "the key becomes partitionkey");
        assert_eq!(f.header().timestamp_us, 5000);
        let not_ce: Vec<(&str, &[u8])> = vec![("ce_id", b"x")];
        assert!(from_record("t", 0, 0, None, &not_ce, b"", 0).is_err());
    }

    fn foreign<'a>(extra: &[(&'a str, &'a [u8])]) -> Vec<(&'a str, &'a [u8])> {
        let mut h: Vec<(&str, &[u8])> =
            vec![("ce_specversion", b"1.0"), ("ce_id", b"x"), ("ce_source", b"/other"), ("ce_type", b"t")];
        h.extend_from_slice(extra);
        h
    }

    /// Found by the `kafka_binding` fuzz target: a record from another producer was only
    /// checked for the four required attributes, so an invalid `ce_time` (or `ce_specversion`
    /// 2.0, or a `ce_dataschema` that is no URI) reached subscribers as an event the HTTP
    /// ingress would have refused. Such records are skipped now, like records that are no
    /// CloudEvent at all.
    #[test]
    fn foreign_records_with_invalid_attributes_are_refused() {
        for bad in
            [("ce_time", &b"2026-12-01T08ecversion:1.0"[..]), ("ce_dataschema", b"not a uri"), ("ce_subject", b"")]
        {
            let mut h = foreign(&[]);
            h.push(bad);
            let r = from_record("t", 0, 0, None, &h, b"", 0);
            if bad.0 == "ce_subject" {
                assert!(r.is_ok(), "an empty extension is fine");
            } else {
                assert!(matches!(r, Err(CeError::Invalid(_))), "{bad:?}");
            }
        }
        let h = foreign(&[("evmesh_types", b"specversion=b")]);
        let h: Vec<_> =
            h.into_iter().map(|(n, v)| if n == "ce_specversion" { (n, &b"true"[..]) } else { (n, v) }).collect();
        assert!(from_record("t", 0, 0, None, &h, b"", 0).is_err(), "specversion must be a string");
        let h = foreign(&[("ce_n", b"4294967296"), ("evmesh_types", b"n=i")]);
        assert!(from_record("t", 0, 0, None, &h, b"", 0).is_err(), "integers are 32-bit");
        let h = foreign(&[("ce_n", b"-2147483648"), ("evmesh_types", b"n=i")]);
        assert!(from_record("t", 0, 0, None, &h, b"", 0).is_ok());
    }

    /// Found by the `kafka_binding` fuzz target: a JSON value with invalid UTF-8 inside a
    /// string passed serde_json's check and was stored as JSON data, rendering as an event
    /// that is not JSON.
    #[test]
    fn foreign_json_value_with_invalid_utf8_is_binary() {
        for data in [&b""[..], b"json"] {
            let mut h = foreign(&[("content-type", b"application/json")]);
            if !data.is_empty() {
                h.push(("evmesh_data", data));
            }
            let f = from_record("t", 0, 0, None, &h, b"\"\xff\"", 0).unwrap();
            assert_eq!(f.header().data_kind, DataKind::Binary, "evmesh_data {data:?}");
        }
    }

    /// A record's timestamp is any i64 a producer set: converting it to microseconds saturates
    /// instead of overflowing (a panic in a debug build, a wrapped time in a release one).
    #[test]
    fn extreme_record_timestamps_saturate() {
        let f = from_record("t", 0, 0, None, &foreign(&[]), b"", i64::MAX).unwrap();
        assert_eq!(f.header().timestamp_us, i64::MAX);
        let f = from_record("t", 0, 0, None, &foreign(&[]), b"", i64::MIN).unwrap();
        assert_eq!(f.header().timestamp_us, i64::MIN);
    }

    /// An attribute header repeated a million times costs a bounded duplicate scan: past
    /// [`MAX_ATTRIBUTES`] distinct ones the record is refused.
    #[test]
    fn records_with_too_many_attributes_are_refused() {
        let names: Vec<String> = (0..MAX_ATTRIBUTES + 1).map(|i| format!("ce_x{i}")).collect();
        let mut h = foreign(&[]);
        h.extend(names.iter().map(|n| (n.as_str(), &b"v"[..])));
        assert!(matches!(from_record("t", 0, 0, None, &h, b"", 0), Err(CeError::Invalid(m)) if m.contains("at most")));
    }

    /// Found by the `kafka_binding` fuzz target: a `ce_data` header became an attribute named
    /// `data`, rendered beside the event's real data as a second data member.
    #[test]
    fn a_ce_data_header_is_refused() {
        let h = foreign(&[("ce_data", b"jsov")]);
        assert!(matches!(from_record("t", 0, 0, None, &h, b"\x00", 0), Err(CeError::Invalid(m)) if m.contains("data")));
    }
}
