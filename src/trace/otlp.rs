//! OTLP's trace export request (`ExportTraceServiceRequest`, opentelemetry-proto's
//! `collector/trace/v1`), written by hand in both encodings the protocol has: protobuf
//! ([`protobuf`]) and its JSON mapping ([`json`]). Only the fields evmesh sets are written;
//! the field numbers are the proto files'.

use super::{context::hex_into, Span, Value};

/// The resource every span of this process belongs to.
pub struct Resource<'a> {
    pub instance_id: &'a str,
    pub version: &'a str,
}

/// The instrumentation scope's name.
const SCOPE: &str = "evmesh";

// --- protobuf ---------------------------------------------------------------------------

fn varint(mut n: u64, out: &mut Vec<u8>) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

fn tag(field: u32, wire: u8, out: &mut Vec<u8>) {
    varint(u64::from(field) << 3 | u64::from(wire), out);
}

fn bytes_field(field: u32, b: &[u8], out: &mut Vec<u8>) {
    tag(field, 2, out);
    varint(b.len() as u64, out);
    out.extend_from_slice(b);
}

/// A length-delimited field whose content `f` writes.
fn nested(field: u32, out: &mut Vec<u8>, f: impl FnOnce(&mut Vec<u8>)) {
    let mut inner = Vec::new();
    f(&mut inner);
    bytes_field(field, &inner, out);
}

fn key_value(field: u32, key: &str, value: &Value, out: &mut Vec<u8>) {
    nested(field, out, |kv| {
        bytes_field(1, key.as_bytes(), kv);
        // AnyValue: string_value = 1, int_value = 3.
        nested(2, kv, |v| match value {
            Value::Str(s) => bytes_field(1, s.as_bytes(), v),
            Value::Int(n) => {
                tag(3, 0, v);
                varint(*n as u64, v);
            }
        });
    });
}

/// The request as protobuf (`content-type: application/x-protobuf`).
pub fn protobuf(resource: &Resource<'_>, spans: &[Span]) -> Vec<u8> {
    let mut out = Vec::with_capacity(128 + spans.len() * 256);
    // ExportTraceServiceRequest.resource_spans = 1
    nested(1, &mut out, |rs| {
        // ResourceSpans.resource = 1 { attributes = 1 }
        nested(1, rs, |r| {
            key_value(1, "service.name", &"evmesh".into(), r);
            key_value(1, "service.instance.id", &resource.instance_id.to_owned().into(), r);
            key_value(1, "service.version", &resource.version.to_owned().into(), r);
        });
        // ResourceSpans.scope_spans = 2 { scope = 1 { name = 1 }, spans = 2 }
        nested(2, rs, |ss| {
            nested(1, ss, |s| bytes_field(1, SCOPE.as_bytes(), s));
            for span in spans {
                nested(2, ss, |s| span_proto(span, s));
            }
        });
    });
    out
}

fn span_proto(span: &Span, s: &mut Vec<u8>) {
    bytes_field(1, &span.trace_id, s);
    bytes_field(2, &span.span_id, s);
    if let Some(p) = &span.parent {
        bytes_field(4, p, s);
    }
    bytes_field(5, span.name.as_bytes(), s);
    tag(6, 0, s);
    varint(span.kind as u64, s);
    // fixed64 start_time_unix_nano = 7, end_time_unix_nano = 8
    tag(7, 1, s);
    s.extend_from_slice(&span.start_ns.to_le_bytes());
    tag(8, 1, s);
    s.extend_from_slice(&span.end_ns.to_le_bytes());
    for (k, v) in &span.attrs {
        key_value(9, k, v, s);
    }
    // Status = 15 { message = 2, code = 3 (1 ok, 2 error) }
    nested(15, s, |st| match &span.error {
        Some(m) => {
            bytes_field(2, m.as_bytes(), st);
            tag(3, 0, st);
            varint(2, st);
        }
        None => {
            tag(3, 0, st);
            varint(1, st);
        }
    });
}

// --- JSON -------------------------------------------------------------------------------

fn json_str(s: &str, out: &mut String) {
    out.push_str(&serde_json::to_string(s).expect("a string serializes"));
}

fn json_kv(key: &str, value: &Value, out: &mut String) {
    out.push_str("{\"key\":");
    json_str(key, out);
    out.push_str(",\"value\":");
    match value {
        Value::Str(s) => {
            out.push_str("{\"stringValue\":");
            json_str(s, out);
            out.push('}');
        }
        // int64 is a string in the JSON mapping.
        Value::Int(n) => out.push_str(&format!("{{\"intValue\":\"{n}\"}}")),
    }
    out.push('}');
}

fn json_hex(key: &str, bytes: &[u8], out: &mut String) {
    out.push_str(&format!(",\"{key}\":\""));
    hex_into(bytes, out);
    out.push('"');
}

/// The request in OTLP's JSON mapping (`content-type: application/json`): ids as hex, enums
/// as numbers, 64-bit integers as strings.
pub fn json(resource: &Resource<'_>, spans: &[Span]) -> Vec<u8> {
    let mut out = String::with_capacity(256 + spans.len() * 512);
    out.push_str("{\"resourceSpans\":[{\"resource\":{\"attributes\":[");
    json_kv("service.name", &"evmesh".into(), &mut out);
    out.push(',');
    json_kv("service.instance.id", &resource.instance_id.to_owned().into(), &mut out);
    out.push(',');
    json_kv("service.version", &resource.version.to_owned().into(), &mut out);
    out.push_str("]},\"scopeSpans\":[{\"scope\":{\"name\":");
    json_str(SCOPE, &mut out);
    out.push_str("},\"spans\":[");
    for (i, span) in spans.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str("{\"name\":");
        json_str(&span.name, &mut out);
        json_hex("traceId", &span.trace_id, &mut out);
        json_hex("spanId", &span.span_id, &mut out);
        if let Some(p) = &span.parent {
            json_hex("parentSpanId", p, &mut out);
        }
        out.push_str(&format!(
            ",\"kind\":{},\"startTimeUnixNano\":\"{}\",\"endTimeUnixNano\":\"{}\",\"attributes\":[",
            span.kind as u8, span.start_ns, span.end_ns
        ));
        for (j, (k, v)) in span.attrs.iter().enumerate() {
            if j > 0 {
                out.push(',');
            }
            json_kv(k, v, &mut out);
        }
        out.push_str("],\"status\":");
        match &span.error {
            Some(m) => {
                out.push_str("{\"code\":2,\"message\":");
                json_str(m, &mut out);
                out.push('}');
            }
            None => out.push_str("{\"code\":1}"),
        }
        out.push('}');
    }
    out.push_str("]}]}]}");
    out.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::super::Kind;
    use super::*;

    fn span() -> Span {
        Span {
            trace_id: [1; 16],
            span_id: [2; 8],
            parent: Some([3; 8]),
            name: "publish orders".into(),
            kind: Kind::Producer,
            start_ns: 1_700_000_000_000_000_000,
            end_ns: 1_700_000_000_000_001_000,
            attrs: vec![("messaging.system", "evmesh".into()), ("messaging.evmesh.offset", Value::Int(7))],
            error: Some("nack".into()),
        }
    }

    #[test]
    fn json_is_the_protocol_mapping() {
        let r = Resource { instance_id: "i-1", version: "0.1.0" };
        let v: serde_json::Value = serde_json::from_slice(&json(&r, &[span()])).unwrap();
        let s = &v["resourceSpans"][0]["scopeSpans"][0]["spans"][0];
        assert_eq!(s["traceId"], "01".repeat(16));
        assert_eq!(s["spanId"], "02".repeat(8));
        assert_eq!(s["parentSpanId"], "03".repeat(8));
        assert_eq!(s["kind"], 4);
        assert_eq!(s["startTimeUnixNano"], "1700000000000000000");
        assert_eq!(s["attributes"][1]["value"]["intValue"], "7");
        assert_eq!(s["status"]["code"], 2);
        assert_eq!(v["resourceSpans"][0]["resource"]["attributes"][0]["value"]["stringValue"], "evmesh");
    }

    #[test]
    fn protobuf_starts_with_the_resource_spans_field() {
        let r = Resource { instance_id: "i-1", version: "0.1.0" };
        let b = protobuf(&r, &[span()]);
        assert_eq!(b[0], 0x0a, "field 1, length-delimited");
        // The ids appear as raw bytes, tagged 0x0a (trace_id) and 0x12 (span_id).
        let has = |needle: &[u8]| b.windows(needle.len()).any(|w| w == needle);
        assert!(has(&[&[0x0a, 16][..], &[1; 16]].concat()));
        assert!(has(&[&[0x12, 8][..], &[2; 8]].concat()));
        assert!(has(&[&[0x22, 8][..], &[3; 8]].concat()), "parent_span_id = 4");
    }
}
