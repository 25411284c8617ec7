//! The CloudEvents RocketMQ binding, binary content mode (apache/rocketmq-externals'
//! `rocketmq-cloudevents-binding/rocketmq-transport-binding.md`, as cloudevents/sdk-java's
//! `rocketmq` module writes and reads it): frames to RocketMQ messages and back. Pure code, no
//! client library types.
//!
//! A message is: user properties `CE_<attribute>` for every context attribute and extension,
//! with `datacontenttype` as `CE_contenttype`; keys (`KEYS`) = `partitionkey` when the event
//! has one (and no byte 0x01 or 0x02); body = the data bytes, or one NUL byte when they are
//! empty (RocketMQ refuses empty bodies; the Java SDK writes the same), said by `evmesh_empty`. So a RocketMQ consumer with a CloudEvents mapping reads
//! evmesh's topics, and evmesh reads events such producers write. No tag is set.
//!
//! The mapping is the Kafka binding's (`super::kafka`) with RocketMQ's names: evmesh's own
//! properties (`evmesh_types`, `evmesh_data`, `evmesh_ts`, `evmesh_deadline`) mean what they
//! mean there, and a message is held to the same rules. One more is RocketMQ's own: property
//! values cannot hold the bytes 0x01 and 0x02 (its separators) nor be blank, so an attribute
//! whose value does is carried as a JSON string literal and named in `evmesh_escaped`
//! (`name,name`). RocketMQ keeps properties in a map, not in order: attributes read back come
//! in the order `specversion`, `id`, `source`, `type`, then by name.

use frame_codec::Frame;

use super::cloudevents::CeError;
use super::kafka::{from_record, to_record};

/// A RocketMQ message's parts, as the storage backend hands them to the client library.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Message {
    /// The message keys (`KEYS`): the event's `partitionkey`, if it has one.
    pub keys: Option<String>,
    /// User properties: `CE_<attribute>` in attribute order (`datacontenttype` as
    /// `CE_contenttype`), then evmesh's own `evmesh_*`.
    pub properties: Vec<(String, String)>,
    /// The body: the event data, or one NUL byte when there is none.
    pub body: Vec<u8>,
}

const ESCAPED: &str = "evmesh_escaped";
const EMPTY: &str = "evmesh_empty";
const CONTENT_TYPE: &str = "CE_contenttype";

/// What RocketMQ separates properties with (and so cannot carry inside one).
fn separator(c: char) -> bool {
    c == '\u{1}' || c == '\u{2}'
}

/// Whether RocketMQ cannot carry `v` as a property value as it is (blank ones it refuses).
fn needs_escape(v: &str) -> bool {
    v.trim().is_empty() || v.contains(separator)
}

fn invalid(m: impl Into<String>) -> CeError {
    CeError::Invalid(m.into())
}

/// The message for a stored frame.
pub fn to_message(frame: &Frame) -> Message {
    let r = to_record(frame);
    let mut properties = Vec::with_capacity(r.headers.len() + 1);
    let mut escaped = String::new();
    for (name, value) in r.headers {
        // Every value the Kafka binding writes is UTF-8 text (attributes are strings, typed
        // ones rendered; its own headers are ASCII).
        let mut value = String::from_utf8(value).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
        let name = match name.as_str() {
            "content-type" => CONTENT_TYPE.to_owned(),
            // W3C Trace Context's own headers are the Kafka binding's; here the attributes are.
            "traceparent" | "tracestate" => continue,
            n => match n.strip_prefix("ce_") {
                Some(attr) => format!("CE_{attr}"),
                None => n.to_owned(),
            },
        };
        if needs_escape(&value) {
            escaped.push_str(if escaped.is_empty() { "" } else { "," });
            escaped.push_str(&name);
            value = serde_json::Value::String(value).to_string();
        }
        properties.push((name, value));
    }
    if !escaped.is_empty() {
        properties.push((ESCAPED.to_owned(), escaped));
    }
    // A key with RocketMQ's separators would write properties of its own (a transaction or
    // delay flag): such an event goes without KEYS (`CE_partitionkey` carries it, escaped).
    let keys = r.key.map(|k| String::from_utf8_lossy(&k).into_owned()).filter(|k| !k.contains(separator));
    // RocketMQ refuses empty bodies: one NUL byte, and `evmesh_empty` says it stands for none.
    let body = if r.value.is_empty() {
        properties.push((EMPTY.to_owned(), "1".to_owned()));
        vec![0]
    } else {
        r.value
    };
    Message { keys, properties, body }
}

/// The frame for a message read from `topic`, at queue `partition` and queue offset `offset`.
/// `Err` for a message that is not a CloudEvent in binary mode (no `CE_specversion`, ...).
pub fn from_message(
    topic: &str,
    partition: u32,
    offset: u64,
    keys: Option<&str>,
    properties: &[(&str, &str)],
    body: &[u8],
    born_ms: i64,
) -> Result<Frame, CeError> {
    let escaped = properties.iter().find(|(n, _)| *n == ESCAPED).map_or("", |(_, v)| *v);
    let rank = |n: &str| ["CE_specversion", "CE_id", "CE_source", "CE_type"].iter().position(|r| *r == n).unwrap_or(4);
    let mut properties = properties.to_vec();
    properties.sort_by(|a, b| (rank(a.0), a.0).cmp(&(rank(b.0), b.0)));
    let mut headers: Vec<(String, Vec<u8>)> = Vec::with_capacity(properties.len());
    for (name, value) in &properties {
        let header = if *name == CONTENT_TYPE {
            "content-type".to_owned()
        } else if let Some(attr) = name.strip_prefix("CE_") {
            format!("ce_{attr}")
        } else if name.starts_with("evmesh_") {
            (*name).to_owned()
        } else {
            continue; // RocketMQ's own (KEYS, UNIQ_KEY, ...) and other producers' properties
        };
        let value = match escaped.split(',').any(|e| e == *name) {
            true => serde_json::from_str::<String>(value).map_err(|_| invalid(format!("{name} is not escaped")))?,
            false => (*value).to_owned(),
        };
        headers.push((header, value.into_bytes()));
    }
    let headers: Vec<(&str, &[u8])> = headers.iter().map(|(n, v)| (n.as_str(), v.as_slice())).collect();
    // RocketMQ's KEYS are space-separated; a partition key is one of them, the first.
    let key = keys.and_then(|k| k.split(' ').find(|k| !k.is_empty())).map(str::as_bytes);
    // An empty body is written as one NUL byte: by evmesh, which says so in `evmesh_empty`, and
    // by the Java SDK for an event without data, which does not say (nor what its data is).
    let empty = properties.iter().any(|(n, _)| *n == EMPTY);
    let told = headers.iter().any(|(n, _)| *n == "evmesh_data");
    let body = if body == [0] && (empty || !told) { &[][..] } else { body };
    from_record(topic, partition, offset, key, &headers, body, born_ms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adaptor::cloudevents::{parse_structured, write_structured};

    fn round_trip(json: &str) -> (Message, Frame, Frame) {
        let mut f = parse_structured("t", json.as_bytes()).unwrap();
        f.set_timestamp(1_700_000_000_123_456);
        let m = to_message(&f);
        let props: Vec<(&str, &str)> = m.properties.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        let back = from_message("t", 3, 42, m.keys.as_deref(), &props, &m.body, 1_700_000_000_123).unwrap();
        (m, f, back)
    }

    /// The event as JSON (attribute order aside: RocketMQ keeps none).
    fn structured(f: &Frame) -> serde_json::Value {
        let mut out = Vec::new();
        write_structured(f, &[], &mut out);
        serde_json::from_slice(&out).unwrap()
    }

    #[test]
    fn frames_survive_the_binding_faithfully() {
        for json in [
            r#"{"specversion":"1.0","id":"a","source":"/s","type":"t","partitionkey":"k1","flag":true,"n":7,"datacontenttype":"application/json","data":{"x": [1, 2]}}"#,
            r#"{"specversion":"1.0","id":"b","source":"/s","type":"t","datacontenttype":"text/plain","data":"hi"}"#,
            r#"{"specversion":"1.0","id":"c","source":"/s","type":"t","data_base64":"AA=="}"#,
            r#"{"specversion":"1.0","id":"d","source":"/s","type":"t"}"#,
            r#"{"specversion":"1.0","id":"e","source":"/s","type":"t","subject":"a\u0001b\u0002c","traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}"#,
            r#"{"specversion":"1.0","id":"f","source":"/s","type":"t","empty":"","blank":"  "}"#,
            // Empty data is not no data (nor one NUL byte), and a NUL byte is data.
            r#"{"specversion":"1.0","id":"g","source":"/s","type":"t","data_base64":""}"#,
            r#"{"specversion":"1.0","id":"h","source":"/s","type":"t","data_base64":"AA=="}"#,
            // A key with RocketMQ's separators would write a property of its own.
            r#"{"specversion":"1.0","id":"i","source":"/s","type":"t","partitionkey":"k\u0002TRAN_MSG\u0001true"}"#,
        ] {
            let (m, f, back) = round_trip(json);
            assert_eq!(structured(&back), structured(&f), "{json}");
            assert_eq!(back.header().timestamp_us, f.header().timestamp_us);
            assert_eq!((back.header().partition, back.header().offset), (3, 42));
            assert!(!m.body.is_empty(), "RocketMQ refuses empty bodies");
            assert!(m.properties.iter().all(|(_, v)| !needs_escape(v)), "{m:?}");
            assert!(m.keys.as_deref().is_none_or(|k| !k.contains(separator)), "{m:?}");
        }
        let (m, ..) = round_trip(
            r#"{"specversion":"1.0","id":"a","source":"/s","type":"t","partitionkey":"k1","datacontenttype":"application/json","data":1}"#,
        );
        assert_eq!(m.keys.as_deref(), Some("k1"), "the keys are the partitionkey");
        let has = |n: &str, v: &str| m.properties.iter().any(|(pn, pv)| pn == n && pv == v);
        assert!(has("CE_contenttype", "application/json") && has("CE_id", "a") && has("CE_specversion", "1.0"));
        assert!(!m.properties.iter().any(|(n, _)| n == "CE_datacontenttype" || n.starts_with("ce_")));
        assert_eq!(m.body, b"1");
    }

    /// What cloudevents/sdk-java's RocketMQ writer produces: `CE_` attributes, `CE_contenttype`,
    /// a NUL body for an event without data, RocketMQ's own properties beside them.
    #[test]
    fn messages_of_the_java_sdk_are_read() {
        let props = [
            ("CE_specversion", "1.0"),
            ("CE_id", "j1"),
            ("CE_source", "/java"),
            ("CE_type", "t"),
            ("UNIQ_KEY", "7F000001"),
            ("KEYS", "order-9 other"),
            ("WAIT", "true"),
        ];
        let f = from_message("t", 1, 5, Some("order-9 other"), &props, &[0], 1_000).unwrap();
        assert_eq!(f.header().data_kind, frame_codec::DataKind::None);
        assert_eq!(f.body().attr_str("partitionkey"), Some("order-9"));
        assert_eq!(f.header().timestamp_us, 1_000_000);
        assert_eq!(f.body().attributes.len(), 5, "RocketMQ's own properties are not attributes");
        let mut with_data = props.to_vec();
        with_data.push(("CE_contenttype", "text/plain"));
        let f = from_message("t", 1, 6, None, &with_data, b"hi", 1_000).unwrap();
        assert_eq!(f.header().data_kind, frame_codec::DataKind::Text);
        assert_eq!(f.body().attr_str("datacontenttype"), Some("text/plain"));
        assert!(from_message("t", 0, 0, None, &[("CE_id", "x")], b"x", 0).is_err(), "no CloudEvent");
        let bad = [("CE_subject", "\"x"), ("evmesh_escaped", "CE_subject")];
        let mut bad_escape = props.to_vec();
        bad_escape.extend_from_slice(&bad);
        assert!(from_message("t", 0, 0, None, &bad_escape, b"x", 0).is_err(), "an escaped value must be JSON");
    }
}
