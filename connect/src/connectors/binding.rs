//! An event in a binary content mode, as every connector with headers or fields writes and
//! reads it: the context attributes as name-value pairs (HTTP's `ce-*` headers, Kafka's
//! `ce_*` headers, MQTT 5's user properties, a Redis stream entry's `ce_*` fields), the data's
//! media type beside them (`content-type`), the data as the body.

use cloudevents::event::{AttributesWriter, Data, ExtensionValue};
use cloudevents::{AttributesReader, Event, EventBuilder, EventBuilderV10};
use serde_json::Value;

/// An event in a binary content mode.
pub struct Binary {
    /// `specversion`, `id`, `source`, `type`, then those of `subject`, `time`, `dataschema`
    /// and the extensions the event has; names without the transport's prefix.
    pub attributes: Vec<(String, String)>,
    /// The data's media type (absent: the data's kind says it); `None` without data.
    pub content_type: Option<String>,
    pub data: Vec<u8>,
}

/// `event` in a binary content mode.
pub fn to_binary(event: &Event) -> Binary {
    let mut attributes = vec![
        ("specversion".to_owned(), "1.0".to_owned()),
        ("id".to_owned(), event.id().to_owned()),
        ("source".to_owned(), event.source().to_string()),
        ("type".to_owned(), event.ty().to_owned()),
    ];
    if let Some(s) = event.subject() {
        attributes.push(("subject".into(), s.to_owned()));
    }
    if let Some(t) = event.time() {
        attributes.push(("time".into(), t.to_rfc3339()));
    }
    if let Some(s) = event.dataschema() {
        attributes.push(("dataschema".into(), s.to_string()));
    }
    for (name, v) in event.iter_extensions() {
        let v = match v {
            ExtensionValue::String(s) => s.clone(),
            other => other.to_string(),
        };
        attributes.push((name.to_owned(), v));
    }
    let content_type = event.datacontenttype().map(str::to_owned).or(match event.data() {
        Some(Data::Json(_)) => Some("application/json".into()),
        Some(Data::String(_)) => Some("text/plain".into()),
        Some(Data::Binary(_)) => Some("application/octet-stream".into()),
        None => None,
    });
    let data = match event.data() {
        Some(Data::Binary(b)) => b.clone(),
        Some(Data::String(s)) => s.clone().into_bytes(),
        Some(Data::Json(v)) => serde_json::to_vec(v).expect("JSON serializes"),
        None => Vec::new(),
    };
    Binary { attributes, content_type, data }
}

/// The event of binary-mode `attributes` (names without the transport's `prefix`, which the
/// errors name), `content_type` and `data`: `specversion` 1.0 and a non-empty `id`, `source`
/// and `type` are required; JSON or text data must be that.
pub fn from_binary<'a>(
    prefix: &str,
    attributes: impl IntoIterator<Item = (&'a str, &'a str)>,
    content_type: Option<&str>,
    data: &[u8],
) -> Result<Event, String> {
    let attributes: Vec<(&str, &str)> = attributes.into_iter().collect();
    let get = |name: &str| attributes.iter().find(|(k, _)| *k == name).map(|(_, v)| *v);
    if get("specversion") != Some("1.0") {
        return Err(format!("{prefix}specversion: only 1.0"));
    }
    let need = |name: &str| get(name).filter(|v| !v.is_empty()).ok_or(format!("{prefix}{name} is required, not empty"));
    let mut b = EventBuilderV10::new().id(need("id")?).source(need("source")?).ty(need("type")?);
    if let Some(s) = get("subject") {
        b = b.subject(s);
    }
    if let Some(t) = get("time") {
        b = b.time(t);
    }
    for (name, v) in &attributes {
        if !matches!(*name, "specversion" | "id" | "source" | "type" | "subject" | "time" | "dataschema") {
            b = b.extension(name, *v);
        }
    }
    let media = content_type.map(|c| c.split(';').next().unwrap_or("").trim()).filter(|m| !m.is_empty());
    if !data.is_empty() || media.is_some() {
        let media = media.unwrap_or("application/octet-stream");
        b = if media == "application/json" || media.ends_with("+json") {
            let v: Value = serde_json::from_slice(data).map_err(|e| format!("{media} data that is not JSON: {e}"))?;
            b.data(media, v)
        } else if media.starts_with("text/") {
            b.data(media, String::from_utf8(data.to_vec()).map_err(|_| format!("{media} data that is not UTF-8"))?)
        } else {
            b.data(media, data.to_vec())
        };
    }
    let mut e = b.build().map_err(|e| e.to_string())?;
    if let Some(s) = get("dataschema") {
        let u: url::Url = s.parse().map_err(|e| format!("{prefix}dataschema: {e}"))?;
        e.set_dataschema(Some(u));
    }
    Ok(e)
}

/// `builder` with `data` as what it looks like: JSON, else text (of `content_type`, default
/// `text/plain`), else bytes; nothing when empty.
pub fn with_plain_data(builder: EventBuilderV10, content_type: Option<&str>, data: &[u8]) -> EventBuilderV10 {
    if data.is_empty() {
        return builder;
    }
    match (serde_json::from_slice::<Value>(data), std::str::from_utf8(data)) {
        (Ok(v), _) => builder.data("application/json", v),
        (_, Ok(text)) => builder.data(content_type.unwrap_or("text/plain"), text.to_owned()),
        _ => builder.data(content_type.unwrap_or("application/octet-stream"), data.to_vec()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_event_comes_back_from_its_binary_form() {
        let events: Vec<Event> = serde_json::from_value(json!([
            {"specversion": "1.0", "id": "1", "source": "/s", "type": "t", "subject": "x",
             "time": "2026-12-05T10:00:00Z", "dataschema": "http://schema/1", "ext": "v",
             "datacontenttype": "application/json", "data": {"a": [1, 2]}},
            {"specversion": "1.0", "id": "2", "source": "/s", "type": "t", "data": "text"},
            {"specversion": "1.0", "id": "3", "source": "/s", "type": "t", "data_base64": "AAEC"},
            {"specversion": "1.0", "id": "4", "source": "/s", "type": "t"},
        ]))
        .unwrap();
        for e in events {
            let b = to_binary(&e);
            let back = from_binary(
                "",
                b.attributes.iter().map(|(k, v)| (k.as_str(), v.as_str())),
                b.content_type.as_deref(),
                &b.data,
            )
            .unwrap();
            assert_eq!(serde_json::to_value(&back).unwrap(), serde_json::to_value(with_ct(&e)).unwrap());
        }
    }

    /// `e` with the content type its binary form names (absent, the data's kind says it).
    fn with_ct(e: &Event) -> Event {
        let mut e = e.clone();
        if let (None, Some(ct), Some(data)) = (e.datacontenttype(), to_binary(&e).content_type, e.data().cloned()) {
            e.set_data(ct, data);
        }
        e
    }

    #[test]
    fn a_binary_event_without_what_it_needs_is_refused_with_the_reason() {
        let base = [("specversion", "1.0"), ("id", "1"), ("source", "/s"), ("type", "t")];
        assert!(from_binary("ce_", base, None, b"").is_ok());
        let without = |name: &'static str| base.into_iter().filter(move |(k, _)| *k != name);
        assert_eq!(from_binary("ce_", without("id"), None, b"").unwrap_err(), "ce_id is required, not empty");
        assert_eq!(from_binary("ce_", without("specversion"), None, b"").unwrap_err(), "ce_specversion: only 1.0");
        let e = from_binary("ce_", base, Some("application/json"), b"{").unwrap_err();
        assert!(e.starts_with("application/json data that is not JSON"), "{e}");
        assert!(from_binary("ce_", base, Some("text/plain"), &[0xff]).is_err());
    }
}
