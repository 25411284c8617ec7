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
///
/// For a CloudEvents 1.0 event without binary data this writes the JSON itself (what the
/// `cloudevents-sdk` serializer writes, in another member order), so that a string with nothing
/// to escape (most `data`, every id) is copied, not escaped byte by byte: serde_json's
/// escaping loop was a fifth of a publisher's CPU for 1 KiB events. Anything else is
/// serialized by `cloudevents-sdk` itself.
pub fn to_json(event: &Event) -> Result<Vec<u8>> {
    let serde =
        |event: &Event| serde_json::to_vec(event).map_err(|e| Error::Config(format!("event does not serialize: {e}")));
    if event.specversion() != cloudevents::event::SpecVersion::V10 || matches!(event.data(), Some(Data::Binary(_))) {
        return serde(event);
    }
    let mut out = Vec::with_capacity(
        160 + event.data().map_or(0, |d| match d {
            Data::String(s) => s.len(),
            _ => 64,
        }),
    );
    out.extend_from_slice(br#"{"specversion":"1.0""#);
    for (name, value) in event.iter_attributes() {
        if name == "specversion" {
            continue;
        }
        out.push(b',');
        write_str(&mut out, name);
        out.push(b':');
        match value {
            // chrono's serde form (RFC 3339, `Z`), as the SDK writes it.
            AttributeValue::Time(t) => serde_json::to_writer(&mut out, t).map_err(|e| Error::Config(e.to_string()))?,
            AttributeValue::Boolean(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
            AttributeValue::Integer(i) => out.extend_from_slice(i.to_string().as_bytes()),
            other => write_str(&mut out, &other.to_string()),
        }
    }
    for (name, value) in event.iter_extensions() {
        out.push(b',');
        write_str(&mut out, name);
        out.push(b':');
        match value {
            cloudevents::event::ExtensionValue::String(s) => write_str(&mut out, s),
            other => out.extend_from_slice(other.to_string().as_bytes()),
        }
    }
    match event.data() {
        None => {}
        Some(Data::String(s)) => {
            out.extend_from_slice(br#","data":"#);
            write_str(&mut out, s);
        }
        Some(Data::Json(v)) => {
            out.extend_from_slice(br#","data":"#);
            serde_json::to_writer(&mut out, v).map_err(|e| Error::Config(e.to_string()))?;
        }
        Some(Data::Binary(_)) => return serde(event),
    }
    out.push(b'}');
    Ok(out)
}

/// `s` as a JSON string: copied when no byte needs an escape (checked eight bytes at a time),
/// else escaped by serde_json.
fn write_str(out: &mut Vec<u8>, s: &str) {
    if needs_escape(s.as_bytes()) {
        serde_json::to_writer(&mut *out, s).expect("a string serializes");
    } else {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    }
}

/// Whether `b` holds a control byte, `"` or `\\` (what JSON strings escape).
fn needs_escape(b: &[u8]) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let has_zero = |v: u64| v.wrapping_sub(ONES) & !v & HIGH != 0;
    let mut chunks = b.chunks_exact(8);
    for c in &mut chunks {
        let x = u64::from_le_bytes(c.try_into().expect("eight bytes"));
        // A byte under 0x20, or equal to '"' (0x22) or '\\' (0x5c).
        let below = x.wrapping_sub(ONES * 0x20) & !x & HIGH != 0;
        if below || has_zero(x ^ (ONES * 0x22)) || has_zero(x ^ (ONES * 0x5c)) {
            return true;
        }
    }
    chunks.remainder().iter().any(|&c| c < 0x20 || c == b'"' || c == b'\\')
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
    fn the_fast_writer_writes_what_the_sdk_reads_back() {
        let tricky = "tab\there \"quoted\" back\\slash \u{1} caf\u{e9} \u{7f} done";
        for data in ["plain text of some length, nothing to escape here at all", tricky, "", "1234567"] {
            let ev = EventBuilderV10::new()
                .id(data)
                .source("/s")
                .ty("t")
                .subject(tricky)
                .time("2024-05-06T07:08:09.123Z")
                .extension("partitionkey", data)
                .extension("n", 7i64)
                .extension("ok", true)
                .data("text/plain", data.to_owned())
                .build()
                .unwrap();
            let ours = to_json(&ev).unwrap();
            let theirs: serde_json::Value = serde_json::to_value(&ev).unwrap();
            assert_eq!(serde_json::from_slice::<serde_json::Value>(&ours).unwrap(), theirs, "{data:?}");
            assert_eq!(from_json(&ours).unwrap(), ev);
        }
        let json = EventBuilderV10::new()
            .id("j")
            .source("/s")
            .ty("t")
            .data("application/json", serde_json::json!({"a": [1, "x\"y"]}))
            .build()
            .unwrap();
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(&to_json(&json).unwrap()).unwrap(),
            serde_json::to_value(&json).unwrap()
        );
        let binary = EventBuilderV10::new()
            .id("b")
            .source("/s")
            .ty("t")
            .data("application/octet-stream", vec![0u8, 1, 2])
            .build()
            .unwrap();
        assert_eq!(from_json(&to_json(&binary).unwrap()).unwrap(), binary);
    }

    #[test]
    fn needs_escape_finds_every_byte_json_escapes_at_every_position() {
        for pos in 0..20 {
            for bad in [0u8, 0x1f, b'"', b'\\', b'\n'] {
                let mut s = vec![b'a'; 20];
                s[pos] = bad;
                assert!(needs_escape(&s), "{bad:#x} at {pos}");
            }
            let mut fine = vec![b'a'; 20];
            fine[pos] = 0x7f;
            assert!(!needs_escape(&fine), "DEL at {pos}");
            fine[pos] = 0xc3;
            assert!(!needs_escape(&fine));
            fine[pos] = b' ';
            assert!(!needs_escape(&fine));
        }
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
