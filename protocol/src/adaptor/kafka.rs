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
//! `evmesh_ts` (publish time in µs). Records without them are typed as the HTTP binary mode
//! types a body: by media type.

use frame_codec::{AttrValue, Attribute, DataKind, Frame, FrameBody, FrameHeader};

use super::cloudevents::{is_json_media, is_text_media, CeError};

/// A Kafka record's parts, as the storage backend hands them to the client library.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Record {
    pub key: Option<Vec<u8>>,
    pub headers: Vec<(String, Vec<u8>)>,
    pub value: Vec<u8>,
    /// Milliseconds since the epoch (the record's CreateTime).
    pub timestamp_ms: i64,
}

const TYPES: &str = "evmesh_types";
const DATA: &str = "evmesh_data";
const TS: &str = "evmesh_ts";

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
        let s = text(v)?;
        let value = match type_of(&attr).as_deref() {
            Some("b") => AttrValue::Bool(s == "true"),
            Some("i") => AttrValue::Int(s.parse().map_err(|_| invalid(format!("{attr} is not an integer")))?),
            _ => AttrValue::Str(s),
        };
        attributes.push(Attribute { name: attr, value });
    }
    if let (Some(k), false) = (key, attributes.iter().any(|a| a.name == "partitionkey")) {
        attributes.push(Attribute { name: "partitionkey".into(), value: AttrValue::Str(text(k)?) });
    }
    for req in ["specversion", "id", "source", "type"] {
        if !attributes.iter().any(|a| a.name == req) {
            return Err(invalid(format!("not a binary-mode CloudEvent: no ce_{req}")));
        }
    }
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
            Some(ct) if is_json_media(ct) && serde_json::from_slice::<serde::de::IgnoredAny>(value).is_ok() => {
                DataKind::Json
            }
            Some(ct) if is_text_media(ct) && std::str::from_utf8(value).is_ok() => DataKind::Text,
            _ => DataKind::Binary,
        },
    };
    // Whatever a foreign producer wrote, the stored frame must render: JSON data must parse.
    let data_kind = match data_kind {
        DataKind::Json if serde_json::from_slice::<serde::de::IgnoredAny>(value).is_err() => DataKind::Binary,
        DataKind::Text if std::str::from_utf8(value).is_err() => DataKind::Binary,
        k => k,
    };
    let ts = header(TS).and_then(|v| std::str::from_utf8(v).ok()?.parse().ok()).unwrap_or(timestamp_ms * 1000);
    let body = FrameBody { topic: topic.to_owned(), attributes, data: value.to_vec() };
    let mut frame = Frame::encode(&FrameHeader::event(data_kind), &body).map_err(|e| invalid(e.to_string()))?;
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
}
