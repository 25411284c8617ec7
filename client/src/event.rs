//! CloudEvents on the wire, in the HTTP binding's content modes (structured JSON, binary
//! `ce-*` headers, batch), for the `cloudevents-sdk` crate's [`Event`].

use cloudevents::event::{AttributeValue, Data};
use cloudevents::{AttributesReader, Event};

use crate::error::{Error, Result};

/// How a single event goes over HTTP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ContentMode {
    /// The whole event as JSON, `application/cloudevents+json` (the default).
    #[default]
    Structured,
    /// Attributes as `ce-*` headers, `data` as the body with its own content type.
    Binary,
}

/// The structured-mode JSON of `event`.
pub fn to_json(event: &Event) -> Result<Vec<u8>> {
    serde_json::to_vec(event).map_err(|e| Error::Config(format!("event does not serialize: {e}")))
}

/// An event from its structured-mode JSON.
pub fn from_json(bytes: &[u8]) -> Result<Event> {
    serde_json::from_slice(bytes).map_err(|e| Error::Protocol(format!("not a structured CloudEvent: {e}")))
}

/// The headers and body of `event` in binary mode. Header values are percent-encoded as the
/// HTTP binding asks (space, `"`, `%` and anything outside printable ASCII).
pub fn to_binary(event: &Event) -> (Vec<(String, String)>, Vec<u8>) {
    let mut headers = Vec::new();
    for (name, value) in event.iter() {
        if name == "datacontenttype" {
            continue;
        }
        let text = match value {
            AttributeValue::SpecVersion(v) => v.to_string(),
            other => other.to_string(),
        };
        headers.push((format!("ce-{name}"), percent_encode(&text)));
    }
    let (content_type, body) = match event.data() {
        None => (None, Vec::new()),
        Some(Data::Json(v)) => (Some("application/json"), serde_json::to_vec(v).unwrap_or_default()),
        Some(Data::String(s)) => (Some("text/plain; charset=utf-8"), s.clone().into_bytes()),
        Some(Data::Binary(b)) => (Some("application/octet-stream"), b.clone()),
    };
    if let Some(ct) = event.datacontenttype().or(content_type) {
        headers.push(("content-type".to_owned(), ct.to_owned()));
    }
    (headers, body)
}

fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if (0x21..=0x7e).contains(&b) && b != b'"' && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A string extension of `event`, whatever type it was carried as.
pub(crate) fn extension(event: &Event, name: &str) -> Option<String> {
    event.extension(name).map(|v| v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use cloudevents::{EventBuilder, EventBuilderV10};

    #[test]
    fn binary_mode_puts_attributes_in_percent_encoded_headers() {
        let ev = EventBuilderV10::new()
            .id("a-1")
            .source("/s")
            .ty("t")
            .subject("caf\u{e9} \"x\" 100%")
            .extension("partitionkey", "k")
            .data("application/json", serde_json::json!({"a": 1}))
            .build()
            .unwrap();
        let (headers, body) = to_binary(&ev);
        let h = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.as_str());
        assert_eq!(h("ce-id"), Some("a-1"));
        assert_eq!(h("ce-specversion"), Some("1.0"));
        assert_eq!(h("ce-subject"), Some("caf%C3%A9%20%22x%22%20100%25"));
        assert_eq!(h("ce-partitionkey"), Some("k"));
        assert_eq!(h("content-type"), Some("application/json"));
        assert_eq!(h("ce-datacontenttype"), None);
        assert_eq!(body, br#"{"a":1}"#);
    }

    #[test]
    fn structured_json_round_trips_with_extensions() {
        let json = br#"{"specversion":"1.0","id":"x","source":"/s","type":"t","emoffset":"7","empartition":2,"data":{"k":true}}"#;
        let ev = from_json(json).unwrap();
        assert_eq!(extension(&ev, "emoffset").as_deref(), Some("7"));
        assert_eq!(extension(&ev, "empartition").as_deref(), Some("2"));
        let back: serde_json::Value = serde_json::from_slice(&to_json(&ev).unwrap()).unwrap();
        assert_eq!(back["data"]["k"], true);
        assert!(from_json(b"{}").is_err());
    }
}
