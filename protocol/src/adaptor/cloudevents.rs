//! CloudEvents 1.0.2: the HTTP protocol binding (structured, binary and batched content modes)
//! and the JSON event format, both directions.
//!
//! Parsing keeps every member as its JSON text so `data` is stored byte for byte: a flat event
//! without escapes by one span-keeping pass (`flat.rs`), anything else by serde_json over the
//! borrowed body (each member a `RawValue`). Measured (benches/cloudevents.rs, perf/RESULTS.md):
//! for one ~350 B event with nested `data` (serde_json's path) this whole parse + validate +
//! encode costs about what simd-json's parse alone does; on a 100-event batch simd-json parses
//! 2.5x faster. simd-json still does not serve batches: its values carry no source spans, so
//! `data` would have to be re-serialized (object order, number spelling and escapes could
//! change) and the byte-faithful read-back promised to SDK users would be lost. The flat pass
//! takes 21% off a flat 1 KiB event and off a batch of ten; nested `data` still goes through
//! serde_json.

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;
use std::hash::Hash;

use base64::Engine as _;
use frame_codec::{
    ArchivedAttrValue, AttrValue, AttrValueOf, AttrValueRef, Attribute, AttributeOf, AttributeRef, Bytes, DataKind,
    Frame, FrameBody, FrameBodyRef, FrameHeader, Slice, Text,
};
use serde::de::{Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use smallvec::SmallVec;

use super::rfc3339;

/// Why a request does not carry valid CloudEvents. Each maps to one HTTP status.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CeError {
    /// Malformed or invalid event: 400.
    #[error("{0}")]
    Invalid(String),
    /// Content type that names no CloudEvents mode we support: 415.
    #[error("{0}")]
    UnsupportedMedia(String),
}

fn invalid(msg: impl Into<String>) -> CeError {
    CeError::Invalid(msg.into())
}

/// How the request body is to be read, decided from its content type and headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Structured mode: the body is one JSON event (`application/cloudevents+json`).
    Structured,
    /// Batched mode: the body is a JSON array of events (`application/cloudevents-batch+json`).
    Batch,
    /// Binary mode: attributes in `ce-*` headers, the body is the data.
    Binary,
}

/// The attributes every CloudEvent must carry, and the context attributes that must be strings.
const REQUIRED: [&str; 4] = ["specversion", "id", "source", "type"];
const STRING_ATTRS: [&str; 8] =
    ["specversion", "id", "source", "type", "datacontenttype", "dataschema", "subject", "time"];

/// Picks the content mode from the media type and whether a `ce-specversion` header is present.
pub fn mode(content_type: Option<&[u8]>, has_ce_specversion: bool) -> Result<Mode, CeError> {
    // The media type as nearly every publisher sends it: one comparison.
    if content_type == Some(b"application/cloudevents+json") {
        return Ok(Mode::Structured);
    }
    let media = content_type.map_or(&b""[..], |ct| ct.split(|&b| b == b';').next().unwrap_or(b"").trim_ascii());
    // Compared without a lowercased copy: this runs on every publish.
    let is = |m: &[u8]| media.eq_ignore_ascii_case(m);
    let starts = |m: &[u8]| media.get(..m.len()).is_some_and(|p| p.eq_ignore_ascii_case(m));
    match media {
        _ if is(b"application/cloudevents+json") => Ok(Mode::Structured),
        _ if is(b"application/cloudevents-batch+json") => Ok(Mode::Batch),
        _ if starts(b"application/cloudevents") => Err(CeError::UnsupportedMedia(format!(
            "event format {} is not supported; use application/cloudevents+json",
            String::from_utf8_lossy(media).to_ascii_lowercase()
        ))),
        _ if has_ce_specversion => Ok(Mode::Binary),
        _ => Err(CeError::UnsupportedMedia(
            "not a CloudEvent: send application/cloudevents+json, application/cloudevents-batch+json, or binary mode with ce-* headers".into(),
        )),
    }
}

/// Most attributes one event may carry (context attributes and extensions together). Real
/// events carry a dozen; the cap keeps every per-attribute cost downstream (lookups by name in
/// filters, rendering, storage) bounded per event.
pub const MAX_ATTRIBUTES: usize = 1024;

fn too_many_attributes() -> CeError {
    invalid(format!("an event carries at most {MAX_ATTRIBUTES} attributes"))
}

/// The first item equal to an earlier one, in linear time on any input: a pairwise scan while
/// there are few (no allocation on the common path of a dozen attributes), a hash set beyond.
fn first_duplicate<'a, T, K: Hash + Eq + ?Sized + 'a>(items: &'a [T], key: impl Fn(&'a T) -> &'a K) -> Option<&'a T> {
    const SCAN: usize = 16;
    if items.len() <= SCAN {
        return items.iter().enumerate().find(|&(i, a)| items[..i].iter().any(|b| key(b) == key(a))).map(|(_, a)| a);
    }
    let mut seen = HashSet::with_capacity(items.len());
    items.iter().find(|&a| !seen.insert(key(a)))
}

/// Whether `name` is one of CloudEvents' context attributes (not an extension).
pub fn is_context_attribute(name: &str) -> bool {
    STRING_ATTRS.contains(&name)
}

/// Whether `name` may name an attribute: `[a-z0-9]+`.
pub fn check_name(name: &str) -> Result<(), CeError> {
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()) {
        return Err(invalid(format!("attribute name {name:?} is not [a-z0-9]+")));
    }
    Ok(())
}

/// The string value of an attribute, owned or borrowed alike.
fn str_value<S: AsRef<str>>(a: &AttributeOf<S>) -> Option<&str> {
    match &a.value {
        AttrValueOf::Str(s) => Some(s.as_ref()),
        _ => None,
    }
}

/// Checks the rules shared by every mode once the attributes are collected (owned attributes,
/// or ones borrowed from the request).
pub fn check_event<S: AsRef<str>>(attrs: &[AttributeOf<S>]) -> Result<(), CeError> {
    if attrs.len() > MAX_ATTRIBUTES {
        return Err(too_many_attributes());
    }
    if let Some(a) = first_duplicate(attrs, |a| a.name.as_ref()) {
        return Err(invalid(format!("attribute {} appears twice", a.name.as_ref())));
    }
    // `data` is the event's data member in the JSON format: an attribute of that name would
    // render as a second one (binary mode refuses `ce-data` with its own message first).
    if attrs.iter().any(|a| a.name.as_ref() == "data") {
        return Err(invalid("no attribute may be named data"));
    }
    for req in REQUIRED {
        match attrs.iter().find(|a| a.name.as_ref() == req) {
            Some(a) if str_value(a).is_some_and(|s| !s.is_empty()) => {}
            Some(_) => return Err(invalid(format!("attribute {req} must be a non-empty string"))),
            None => return Err(invalid(format!("required attribute {req} is missing"))),
        }
    }
    for a in attrs {
        match (a.name.as_ref(), str_value(a)) {
            ("specversion", Some(v)) if v != "1.0" => {
                return Err(invalid(format!("specversion {v:?} is not supported (1.0 is)")));
            }
            ("time", Some(t)) if !rfc3339::is_valid(t) => {
                return Err(invalid(format!("time {t:?} is not an RFC 3339 timestamp")));
            }
            ("dataschema", Some(u)) if !is_absolute_uri(u) => {
                return Err(invalid(format!("dataschema {u:?} is not an absolute URI")));
            }
            ("datacontenttype", Some("")) => {
                return Err(invalid("datacontenttype must not be empty"));
            }
            // It becomes a Content-Type header (binary mode, the Kafka binding): no CR, LF or
            // other control character may split or bend the message it heads.
            ("datacontenttype", Some(s)) if s.chars().any(char::is_control) => {
                return Err(invalid("datacontenttype must not contain control characters"));
            }
            (n, None) if STRING_ATTRS.contains(&n) => {
                return Err(invalid(format!("attribute {n} must be a string")));
            }
            _ => {}
        }
    }
    Ok(())
}

fn is_absolute_uri(s: &str) -> bool {
    let Some(colon) = s.find(':') else { return false };
    let scheme = &s[..colon];
    !scheme.is_empty()
        && scheme.as_bytes()[0].is_ascii_alphabetic()
        && scheme.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'))
        && !s.bytes().any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
}

/// Members a JSON object holds without a heap allocation for the list (a CloudEvent has about
/// ten).
const INLINE_MEMBERS: usize = super::flat::INLINE;

/// A JSON object as an ordered list of (key, raw value), duplicate keys kept for the caller.
/// Keys are borrowed from the text unless they carry escapes.
struct Members<'a>(super::flat::Spans<'a>);

/// An object key, borrowed when the text allows (serde's own `Cow<str>` always copies).
struct Key<'a>(Cow<'a, str>);

impl<'de> serde::Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a member name")
            }
            fn visit_borrowed_str<E: serde::de::Error>(self, s: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(s)))
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(s.to_owned())))
            }
        }
        d.deserialize_str(V)
    }
}

impl<'de> serde::Deserialize<'de> for Members<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a CloudEvent JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, m: A) -> Result<Self::Value, A::Error> {
                Members::from_map(m)
            }
        }
        d.deserialize_map(V)
    }
}

impl<'de> Members<'de> {
    fn from_map<A: MapAccess<'de>>(mut m: A) -> Result<Self, A::Error> {
        let mut v = SmallVec::new();
        while let Some(Key(k)) = m.next_key::<Key<'de>>()? {
            let raw: &'de RawValue = m.next_value()?;
            v.push((k, raw.get()));
        }
        Ok(Members(v))
    }
}

/// Whether the string values of a member list may carry escapes: those of the flat pass
/// ([`super::flat`]) carry none, so they are not looked for again.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Escapes {
    None,
    Maybe,
}

/// A JSON string's value (`text` is the string token, quotes included): borrowed unless it
/// carries escapes.
fn json_string(text: &str, escapes: Escapes) -> Result<Text<'_>, CeError> {
    let inner = &text[1..text.len() - 1];
    if escapes == Escapes::None || memchr::memchr(b'\\', inner.as_bytes()).is_none() {
        return Ok(Text(Cow::Borrowed(inner)));
    }
    Ok(Text(Cow::Owned(serde_json::from_str::<String>(text).map_err(json_err)?)))
}

/// A JSON array of events, each built into its frame as the parser reaches it: the batch's
/// text is scanned once (a first pass splitting it into raw elements would scan it twice).
/// Why an element was refused is kept in `refused` (serde's error type only carries text).
struct Batch<'t> {
    topic: &'t str,
    refused: &'t std::cell::Cell<Option<CeError>>,
}

impl<'de> serde::de::DeserializeSeed<'de> for Batch<'_> {
    type Value = Vec<Frame>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Vec<Frame>, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Batch<'_> {
    type Value = Vec<Frame>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON array of CloudEvents")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Vec<Frame>, A::Error> {
        let mut frames = Vec::with_capacity(s.size_hint().unwrap_or(16));
        loop {
            let element = Element { topic: self.topic, index: frames.len(), refused: self.refused };
            match s.next_element_seed(element)? {
                Some(f) => frames.push(f),
                None => return Ok(frames),
            }
        }
    }
}

/// One element of a [`Batch`]: an object, made into a frame.
struct Element<'t> {
    topic: &'t str,
    index: usize,
    refused: &'t std::cell::Cell<Option<CeError>>,
}

impl Element<'_> {
    fn refuse<E: serde::de::Error>(&self, e: CeError) -> E {
        self.refused.set(Some(in_element(self.index, e)));
        E::custom("refused")
    }

    fn not_an_object<E: serde::de::Error>(&self) -> E {
        self.refused.set(Some(invalid(format!("batch element {} is not a JSON object", self.index))));
        E::custom("refused")
    }
}

impl<'de> serde::de::DeserializeSeed<'de> for Element<'_> {
    type Value = Frame;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Frame, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Element<'_> {
    type Value = Frame;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a CloudEvent JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, m: A) -> Result<Frame, A::Error> {
        let mut members = Members::from_map(m)?;
        members_frame(self.topic, &mut members.0, Escapes::Maybe, &[]).map_err(|e| self.refuse(e))
    }

    // Anything but an object.
    fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<Frame, E> {
        Err(self.not_an_object())
    }
    fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<Frame, E> {
        Err(self.not_an_object())
    }
    fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<Frame, E> {
        Err(self.not_an_object())
    }
    fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<Frame, E> {
        Err(self.not_an_object())
    }
    fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<Frame, E> {
        Err(self.not_an_object())
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<Frame, E> {
        Err(self.not_an_object())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<Frame, A::Error> {
        Err(self.not_an_object())
    }
}

/// Why element `index` of a batch was refused.
fn in_element(index: usize, e: CeError) -> CeError {
    match e {
        CeError::Invalid(m) => invalid(format!("batch element {index}: {m}")),
        other => other,
    }
}

fn json_err(e: serde_json::Error) -> CeError {
    invalid(format!("malformed JSON: {e}"))
}

/// Builds the frame for one structured-mode event (a JSON object, as raw text), from the text
/// itself: no allocation but the frame for an event of up to 16 members without escapes.
fn structured_frame(topic: &str, json: &str) -> Result<Frame, CeError> {
    structured_frame_with(topic, json, &[])
}

fn structured_frame_with(topic: &str, json: &str, extra: &[(&str, &str)]) -> Result<Frame, CeError> {
    let mut flat = super::flat::Spans::new();
    if super::flat::members(json, &mut flat) {
        return members_frame(topic, &mut flat, Escapes::None, extra);
    }
    let mut members: Members<'_> = serde_json::from_str(json).map_err(json_err)?;
    members_frame(topic, &mut members.0, Escapes::Maybe, extra)
}

/// [`parse_structured`] with `extra` string extensions after the event's own (one the event
/// carries itself is left out), in one encoding. Their names are the caller's to have checked
/// ([`check_name`], not a context attribute).
pub fn parse_structured_with(topic: &str, body: &[u8], extra: &[(&str, &str)]) -> Result<Frame, CeError> {
    let text = simdutf8::basic::from_utf8(body).map_err(|_| invalid("body is not UTF-8"))?;
    if !text.trim_start().starts_with('{') {
        return Err(invalid("a structured-mode event must be a JSON object"));
    }
    structured_frame_with(topic, text, extra)
}

/// The `subject` of a structured-mode event (`None` without one), read without building it.
pub fn subject_of(body: &[u8]) -> Result<Option<String>, CeError> {
    let text = simdutf8::basic::from_utf8(body).map_err(|_| invalid("body is not UTF-8"))?;
    let mut members = super::flat::Spans::new();
    let mut escapes = Escapes::None;
    if !super::flat::members(text, &mut members) {
        members = serde_json::from_str::<Members<'_>>(text).map_err(json_err)?.0;
        escapes = Escapes::Maybe;
    }
    for (key, text) in members {
        if key == "subject" {
            return match text.as_bytes().first() {
                Some(b'"') => Ok(Some(json_string(text, escapes)?.0.into_owned())),
                _ => Err(invalid("attribute subject must be a string")),
            };
        }
    }
    Ok(None)
}

/// The frame for one event's members (their names are taken from the list; `escapes`: whether
/// its strings may hold any), and `extra` extensions (see [`parse_structured_with`]).
fn members_frame<'a>(
    topic: &str,
    members: &mut super::flat::Spans<'a>,
    escapes: Escapes,
    extra: &[(&str, &str)],
) -> Result<Frame, CeError> {
    let mut attributes: SmallVec<[AttributeRef<'_>; INLINE_MEMBERS]> = SmallVec::new();
    let mut data: Option<(DataKind, Cow<'_, [u8]>)> = None;
    for (key, text) in members.iter_mut() {
        let (key, text): (Cow<'a, str>, &'a str) = (std::mem::take(key), *text);
        if key == "data" || key == "data_base64" {
            if data.is_some() {
                return Err(invalid("an event carries at most one of data and data_base64"));
            }
            if text == "null" {
                continue;
            }
            data = Some(if key == "data" {
                (DataKind::Json, Cow::Borrowed(text.as_bytes()))
            } else {
                let s: Cow<str> = serde_json::from_str(text).map_err(|_| invalid("data_base64 must be a string"))?;
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(s.as_bytes())
                    .map_err(|e| invalid(format!("data_base64 is not base64: {e}")))?;
                (DataKind::Binary, Cow::Owned(bytes))
            });
            continue;
        }
        check_name(&key)?;
        if attributes.len() == MAX_ATTRIBUTES {
            return Err(too_many_attributes());
        }
        let value = match text.as_bytes()[0] {
            b'"' => AttrValueRef::Str(json_string(text, escapes)?),
            b't' => AttrValueRef::Bool(true),
            b'f' => AttrValueRef::Bool(false),
            b'n' => continue, // null: the attribute is absent
            b'-' | b'0'..=b'9' => {
                let n: i64 = text.parse().map_err(|_| invalid(format!("attribute {key}: numbers must be integers")))?;
                if i32::try_from(n).is_err() {
                    return Err(invalid(format!("attribute {key}: integer out of the 32-bit range")));
                }
                AttrValueRef::Int(n)
            }
            _ => return Err(invalid(format!("attribute {key} must be a string, integer or boolean"))),
        };
        attributes.push(AttributeRef { name: Text(key), value });
    }
    for (name, value) in extra {
        if !attributes.iter().any(|a| a.name.as_ref() == *name) {
            attributes.push(AttributeRef { name: Text::from(*name), value: AttrValueRef::Str(Text::from(*value)) });
        }
    }
    check_event(&attributes)?;
    let (kind, data) = data.unwrap_or((DataKind::None, Cow::Borrowed(&[])));
    let body = FrameBodyRef { topic: Text::from(topic), attributes: Slice(&attributes), data: Bytes(data) };
    Frame::encode_ref(&FrameHeader::event(kind), &body).map_err(|e| invalid(e.to_string()))
}

fn encode(topic: &str, kind: DataKind, attributes: Vec<Attribute>, data: Vec<u8>) -> Result<Frame, CeError> {
    let body = FrameBody { topic: topic.to_owned(), attributes, data };
    Frame::encode(&FrameHeader::event(kind), &body).map_err(|e| invalid(e.to_string()))
}

/// Parses a structured-mode body (one event).
pub fn parse_structured(topic: &str, body: &[u8]) -> Result<Frame, CeError> {
    parse_structured_text(topic, simdutf8::basic::from_utf8(body).map_err(|_| invalid("body is not UTF-8"))?)
}

/// [`parse_structured`] of text already known to be UTF-8 (a WebSocket text message).
pub fn parse_structured_text(topic: &str, text: &str) -> Result<Frame, CeError> {
    if !text.trim_start().starts_with('{') {
        return Err(invalid("a structured-mode event must be a JSON object"));
    }
    structured_frame(topic, text)
}

/// Parses a batched-mode body (a JSON array of events); all are valid or none is accepted.
pub fn parse_batch(topic: &str, body: &[u8]) -> Result<Vec<Frame>, CeError> {
    let text = simdutf8::basic::from_utf8(body).map_err(|_| invalid("body is not UTF-8"))?;
    if let Some(frames) = super::flat::array(text, |mut spans| members_frame(topic, &mut spans, Escapes::None, &[])) {
        return frames.into_iter().enumerate().map(|(i, f)| f.map_err(|e| in_element(i, e))).collect();
    }
    let refused = std::cell::Cell::new(None);
    let mut de = serde_json::Deserializer::from_str(text);
    let parsed = serde::de::DeserializeSeed::deserialize(Batch { topic, refused: &refused }, &mut de)
        .and_then(|frames| de.end().map(|()| frames));
    parsed.map_err(|e| refused.take().unwrap_or_else(|| json_err(e)))
}

/// Decodes a binary-mode header value (CloudEvents HTTP binding section 3.1.3.2) as leniently
/// as the binding lets a receiver, so that no sender's attribute is refused for its encoding:
/// - bytes that are not UTF-8 are ISO-8859-1, one character each (what Python's `http.client`
///   sends for a `str` header: the Python SDK 1.x sends attribute values unencoded);
/// - `%` HEXDIG HEXDIG is the byte it names; any other `%` is itself (`"50%"`, `"%zz"`);
/// - a value whose percent-decoding is not UTF-8 was not percent-encoded by its sender: it is
///   taken as received.
pub fn header_value(v: &[u8]) -> String {
    let text: Cow<'_, str> = match std::str::from_utf8(v) {
        Ok(s) => Cow::Borrowed(s),
        Err(_) => Cow::Owned(v.iter().map(|&b| char::from(b)).collect()),
    };
    if !text.contains('%') {
        return text.into_owned();
    }
    let out = super::percent_decode(text.as_bytes(), false);
    String::from_utf8(out).unwrap_or_else(|_| text.into_owned())
}

/// Whether `bytes` are one JSON text, and so can be stored as JSON data and written verbatim
/// into a structured event. UTF-8 is checked first: serde_json skips the bytes of strings it
/// ignores without checking them, so `from_slice::<IgnoredAny>` alone lets invalid UTF-8
/// through, and the event would render as JSON that no client can read (and as a WebSocket
/// text frame a client must close the connection on).
pub(crate) fn is_json(bytes: &[u8]) -> bool {
    std::str::from_utf8(bytes).is_ok_and(|s| serde_json::from_str::<serde::de::IgnoredAny>(s).is_ok())
}

pub(crate) fn is_json_media(ct: &str) -> bool {
    let m = ct.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    m == "application/json" || m == "text/json" || m.ends_with("+json")
}

pub(crate) fn is_text_media(ct: &str) -> bool {
    let m = ct.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    m.starts_with("text/") || m == "application/xml" || m.ends_with("+xml")
}

/// Parses a binary-mode request: attributes from `ce-*` headers, data from the body.
pub fn parse_binary<'h>(
    topic: &str,
    headers: impl Iterator<Item = (&'h str, &'h [u8])>,
    content_type: Option<&[u8]>,
    body: &[u8],
) -> Result<Frame, CeError> {
    let mut attributes: Vec<Attribute> = Vec::with_capacity(12);
    for (name, value) in headers {
        let Some(attr) = name.get(..3).filter(|p| p.eq_ignore_ascii_case("ce-")).map(|_| &name[3..]) else {
            continue;
        };
        let attr = attr.to_ascii_lowercase();
        check_name(&attr)?;
        if attr == "datacontenttype" || attr == "data" || attr == "data_base64" {
            return Err(invalid(format!("ce-{attr} is not allowed in binary mode")));
        }
        if attributes.len() == MAX_ATTRIBUTES {
            return Err(too_many_attributes());
        }
        attributes.push(Attribute { name: attr, value: AttrValue::Str(header_value(value)) });
    }
    let ct = match content_type {
        Some(ct) => Some(std::str::from_utf8(ct).map_err(|_| invalid("Content-Type is not ASCII"))?.to_owned()),
        None => None,
    };
    if let Some(ct) = &ct {
        attributes.push(Attribute { name: "datacontenttype".into(), value: AttrValue::Str(ct.clone()) });
    }
    check_event(&attributes)?;
    let kind = match &ct {
        _ if body.is_empty() => DataKind::None,
        Some(ct) if is_json_media(ct) && is_json(body) => DataKind::Json,
        Some(ct) if is_text_media(ct) && simdutf8::basic::from_utf8(body).is_ok() => DataKind::Text,
        _ => DataKind::Binary,
    };
    encode(topic, kind, attributes, body.to_vec())
}

/// Extra attributes a delivery adds to the stored event (the `em*` extensions).
pub type Extensions<'a> = &'a [(&'a str, AttrValue)];

fn push_json_str(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let esc: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0..=0x1f => {
                out.extend_from_slice(&bytes[start..i]);
                out.extend_from_slice(format!("\\u{b:04x}").as_bytes());
                start = i + 1;
                continue;
            }
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        out.extend_from_slice(esc);
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

fn push_value(out: &mut Vec<u8>, v: &AttrValue) {
    match v {
        AttrValue::Str(s) => push_json_str(out, s),
        AttrValue::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
        AttrValue::Int(n) => out.extend_from_slice(n.to_string().as_bytes()),
    }
}

/// Writes a stored frame as one structured-mode JSON CloudEvent, with `extra` attributes added.
pub fn write_structured(frame: &Frame, extra: Extensions<'_>, out: &mut Vec<u8>) {
    write_structured_without(frame, extra, &[], out)
}

/// [`write_structured`] without the stored attributes named in `skip` (ones the writer puts
/// elsewhere, whose stored values must not stand beside its own).
pub fn write_structured_without(frame: &Frame, extra: Extensions<'_>, skip: &[&str], out: &mut Vec<u8>) {
    let body = frame.body();
    out.push(b'{');
    let mut first = true;
    let mut sep = |out: &mut Vec<u8>| {
        if !first {
            out.push(b',');
        }
        first = false;
    };
    for a in body.attributes.iter() {
        if skip.contains(&a.name.as_str()) {
            continue;
        }
        sep(out);
        push_json_str(out, a.name.as_str());
        out.push(b':');
        match &a.value {
            ArchivedAttrValue::Str(s) => push_json_str(out, s.as_str()),
            ArchivedAttrValue::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
            ArchivedAttrValue::Int(n) => out.extend_from_slice(n.to_native().to_string().as_bytes()),
        }
    }
    for (name, value) in extra {
        sep(out);
        push_json_str(out, name);
        out.push(b':');
        push_value(out, value);
    }
    let data = body.data.as_slice();
    match frame.header().data_kind {
        DataKind::None => {}
        DataKind::Json => {
            sep(out);
            out.extend_from_slice(b"\"data\":");
            out.extend_from_slice(data);
        }
        DataKind::Text => {
            sep(out);
            out.extend_from_slice(b"\"data\":");
            push_json_str(out, &String::from_utf8_lossy(data));
        }
        DataKind::Binary => {
            sep(out);
            out.extend_from_slice(b"\"data_base64\":\"");
            let mut s = String::new();
            base64::engine::general_purpose::STANDARD.encode_string(data, &mut s);
            out.extend_from_slice(s.as_bytes());
            out.push(b'"');
        }
    }
    out.push(b'}');
}

/// Percent-encodes a binary-mode header value (CloudEvents HTTP binding section 3.1.3.2): space,
/// `"`, `%` and everything outside printable ASCII, the UTF-8 bytes one by one.
fn percent_encode(v: &str, out: &mut String) {
    use std::fmt::Write;
    for &b in v.as_bytes() {
        if (0x21..=0x7e).contains(&b) && b != b'"' && b != b'%' {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
}

/// A stored frame as a binary-mode HTTP message: the `ce-*` headers, the `Content-Type` (its
/// `datacontenttype`; `application/json` for JSON data without one) and the body (the data).
pub fn write_binary(frame: &Frame) -> (Vec<(String, String)>, Option<String>, Vec<u8>) {
    let body = frame.body();
    let mut headers = Vec::with_capacity(body.attributes.len());
    let mut content_type = None;
    for a in body.attributes.iter() {
        let mut value = String::new();
        match &a.value {
            ArchivedAttrValue::Str(s) if a.name.as_str() == "datacontenttype" => {
                content_type = Some(s.as_str().to_owned());
                continue;
            }
            ArchivedAttrValue::Str(s) => percent_encode(s.as_str(), &mut value),
            ArchivedAttrValue::Bool(b) => value.push_str(if *b { "true" } else { "false" }),
            ArchivedAttrValue::Int(n) => value.push_str(&n.to_native().to_string()),
        }
        headers.push((format!("ce-{}", a.name.as_str()), value));
    }
    let kind = frame.header().data_kind;
    if content_type.is_none() && kind == DataKind::Json {
        content_type = Some("application/json".to_owned());
    }
    let data = if kind == DataKind::None { Vec::new() } else { body.data.as_slice().to_vec() };
    (headers, content_type, data)
}

/// A webhook sink's push (SPEC, "Other protocols"): the event in binary mode with the delivery's
/// `em*` extensions (a publisher's own of those names dropped), `X-Em-Timestamp` and, with a
/// secret, `X-Em-Signature`. Any 2xx is done.
pub struct BinaryPush {
    /// The sink's HMAC key: with one, each push carries `X-Em-Signature` (see
    /// [`webhook::signature`](super::webhook::signature)); without, it is unsigned.
    pub secret: Option<String>,
}

impl super::PushWire for BinaryPush {
    fn request(&self, frame: &Frame, d: &super::PushContext<'_>) -> (Vec<(String, String)>, Vec<u8>) {
        let h = frame.header();
        let (mut headers, content_type, body) = write_binary(frame);
        let ours = ["ce-emdeliveryid", "ce-empartition", "ce-emoffset", "ce-emattempt"];
        headers.retain(|(n, _)| !ours.contains(&n.as_str()));
        headers.push(("ce-emdeliveryid".into(), d.delivery_id.to_owned()));
        headers.push(("ce-empartition".into(), h.partition.to_string()));
        headers.push(("ce-emoffset".into(), h.offset.to_string()));
        headers.push(("ce-emattempt".into(), d.attempt.to_string()));
        if let Some(ct) = content_type {
            headers.push(("content-type".into(), ct));
        }
        let timestamp = d.now_s.to_string();
        if let Some(key) = &self.secret {
            let sig = super::webhook::signature(key.as_bytes(), "POST", d.target, &timestamp, &body);
            headers.push(("x-em-signature".into(), sig));
        }
        headers.push(("x-em-timestamp".into(), timestamp));
        (headers, body)
    }

    fn verdict(&self, _body: &[u8]) -> super::Verdict {
        super::Verdict::Done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_binary_push_carries_the_deliverys_extensions_once_and_is_signed() {
        use super::super::{PushContext, PushWire};
        let ev = r#"{"specversion":"1.0","id":"1","source":"/s","type":"t","emattempt":99,"data":{"a":1}}"#;
        let mut f = parse_structured("t", ev.as_bytes()).unwrap();
        f.set_partition(2);
        f.set_offset(7);
        let d = PushContext { delivery_id: "2:7:3", attempt: 3, target: "/in?x=1", now_s: 1_796_000_000 };
        let (headers, body) = BinaryPush { secret: Some("k".into()) }.request(&f, &d);
        let get = |n: &str| headers.iter().filter(|(k, _)| k == n).map(|(_, v)| v.as_str()).collect::<Vec<_>>();
        assert_eq!(get("ce-emattempt"), ["3"], "the delivery's, once");
        assert_eq!((get("ce-empartition"), get("ce-emoffset")), (vec!["2"], vec!["7"]));
        assert_eq!(body, br#"{"a":1}"#);
        let want = super::super::webhook::signature(b"k", "POST", "/in?x=1", "1796000000", &body);
        assert_eq!(get("x-em-signature"), [want.as_str()]);
        assert!(BinaryPush { secret: None }.request(&f, &d).0.iter().all(|(k, _)| k != "x-em-signature"));
    }

    const EV: &str =
        r#"{"specversion":"1.0","id":"1","source":"/s","type":"t","amount":5,"vip":true,"data":{"a":[1,2]}}"#;

    fn render(f: &Frame) -> String {
        let mut out = Vec::new();
        write_structured(f, &[], &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn a_content_type_that_would_split_a_header_is_refused() {
        let ev = r#"{"specversion":"1.0","id":"1","source":"/s","type":"t","datacontenttype":"text/plain\r\nset-cookie: x=1"}"#;
        assert!(matches!(parse_structured("t", ev.as_bytes()), Err(CeError::Invalid(m)) if m.contains("control")));
    }

    #[test]
    fn binary_rendering_round_trips_through_the_binary_parser() {
        let ev = r#"{"specversion":"1.0","id":"1","source":"/s p","type":"t","note":"caf\u00e9 \"100%\"","n":7,"ok":true,"datacontenttype":"application/json","data":{"a":1}}"#;
        let f = parse_structured("t", ev.as_bytes()).unwrap();
        let (headers, ct, body) = write_binary(&f);
        assert_eq!(ct.as_deref(), Some("application/json"));
        assert_eq!(body, br#"{"a":1}"#);
        let note = headers.iter().find(|(n, _)| n == "ce-note").map(|(_, v)| v.as_str());
        assert_eq!(note, Some("caf%C3%A9%20%22100%25%22"));
        let pairs = headers.iter().map(|(n, v)| (n.as_str(), v.as_bytes()));
        let back = parse_binary("t", pairs, ct.as_deref().map(str::as_bytes), &body).unwrap();
        assert_eq!(back.body().attr_str("note"), Some("café \"100%\""));
        assert_eq!(back.body().attr_str("source"), Some("/s p"));
        assert_eq!(back.header().data_kind, DataKind::Json);
    }

    /// Values are borrowed from the request unless escaped, and an event past the members kept
    /// inline spills to the heap: either way each attribute is what a JSON parser reads.
    #[test]
    fn borrowed_and_unescaped_values_read_as_a_json_parser_reads_them() {
        let mut ev = serde_json::json!({"specversion":"1.0","id":"a\\b","source":"/\u{e9}\n\t\"q\"","type":"plain"});
        for i in 0..20 {
            ev[format!("x{i}")] = serde_json::json!(format!("v{i}\\{}", "\u{1F600}".repeat(i % 3)));
        }
        let text = ev.to_string();
        let f = parse_structured("t", text.as_bytes()).unwrap();
        for (k, v) in ev.as_object().unwrap() {
            assert_eq!(f.body().attr_str(k), v.as_str(), "{k}");
        }
        assert_eq!(f.body().attributes.len(), 24);
    }

    #[test]
    fn structured_round_trips_verbatim() {
        let f = parse_structured("t", EV.as_bytes()).unwrap();
        assert_eq!(render(&f), EV);
    }

    #[test]
    fn structured_rejects_bad_events() {
        let cases = [
            (r#"{"id":"1","source":"/s","type":"t"}"#, "specversion"),
            (r#"{"specversion":"0.3","id":"1","source":"/s","type":"t"}"#, "not supported"),
            (r#"{"specversion":"1.0","source":"/s","type":"t"}"#, "id"),
            (r#"{"specversion":"1.0","id":"","source":"/s","type":"t"}"#, "non-empty"),
            (r#"{"specversion":"1.0","id":"1","source":"/s","type":"t","Bad":"x"}"#, "[a-z0-9]+"),
            (r#"{"specversion":"1.0","id":"1","source":"/s","type":"t","data":1,"data_base64":"AA=="}"#, "at most one"),
            (r#"{"specversion":"1.0","id":"1","source":"/s","type":"t","data_base64":"!!"}"#, "base64"),
            (r#"{"specversion":"1.0","id":"1","source":"/s","type":"t","time":"yesterday"}"#, "RFC 3339"),
            (r#"{"specversion":"1.0","id":"1","source":"/s","type":"t","x":1.5}"#, "integers"),
            (r#"{"specversion":"1.0","id":"1","source":"/s","type":"t","x":{}}"#, "string, integer or boolean"),
            (r#"{"specversion":"1.0","id":1,"source":"/s","type":"t"}"#, "non-empty string"),
            (r#"{"specversion":"1.0","id":"1","id":"2","source":"/s","type":"t"}"#, "twice"),
            (r#"{"specversion":"1.0","id":"1","source":"/s","type":"t""#, "malformed JSON"),
            (r#"[1]"#, "JSON object"),
        ];
        for (body, want) in cases {
            match parse_structured("t", body.as_bytes()) {
                Err(CeError::Invalid(m)) => assert!(m.contains(want), "{body}: {m}"),
                other => panic!("{body}: {other:?}"),
            }
        }
    }

    #[test]
    fn binary_mode_percent_decodes_and_keeps_bytes() {
        let headers: Vec<(&str, &[u8])> = vec![
            ("ce-specversion", b"1.0"),
            ("CE-ID", b"42"),
            ("ce-source", b"/a%20b"),
            ("ce-type", b"t.%E2%82%AC"),
            ("host", b"x"),
        ];
        let f = parse_binary("t", headers.into_iter(), Some(b"text/plain"), b"hi \"there\"").unwrap();
        assert_eq!(f.body().attr_str("source"), Some("/a b"));
        assert_eq!(f.body().attr_str("type"), Some("t.\u{20ac}"));
        assert_eq!(f.header().data_kind, DataKind::Text);
        assert_eq!(
            render(&f),
            r#"{"specversion":"1.0","id":"42","source":"/a b","type":"t.€","datacontenttype":"text/plain","data":"hi \"there\""}"#
        );
        let headers: Vec<(&str, &[u8])> =
            vec![("ce-specversion", b"1.0"), ("ce-id", b"1"), ("ce-source", b"s"), ("ce-type", b"t")];
        let f = parse_binary("t", headers.into_iter(), Some(b"application/octet-stream"), &[0, 255]).unwrap();
        assert!(render(&f).ends_with(r#""data_base64":"AP8="}"#));
    }

    #[test]
    fn binary_mode_rejects_bad_headers() {
        let bad: [&[(&str, &[u8])]; 3] = [
            &[("ce-specversion", b"1.0"), ("ce-id", b"1"), ("ce-source", b"s")],
            &[("ce-specversion", b"1.0"), ("ce-id", b""), ("ce-source", b"s"), ("ce-type", b"%zz")],
            &[("ce-specversion", b"1.0"), ("ce-id", b"1"), ("ce-source", b"s"), ("ce-type", b"t"), ("ce-a_b", b"x")],
        ];
        for h in bad {
            assert!(matches!(parse_binary("t", h.iter().copied(), None, b""), Err(CeError::Invalid(_))), "{h:?}");
        }
    }

    /// A name whose comparisons are counted, to measure the duplicate check's work.
    struct Counted<'c>(String, &'c std::cell::Cell<u64>);

    impl PartialEq for Counted<'_> {
        fn eq(&self, o: &Self) -> bool {
            self.1.set(self.1.get() + 1);
            self.0 == o.0
        }
    }
    impl Eq for Counted<'_> {}
    impl Hash for Counted<'_> {
        fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
            self.0.hash(h);
        }
    }

    fn with_extensions(n: usize, name: impl Fn(usize) -> String) -> String {
        let mut ev = String::from(r#"{"specversion":"1.0","id":"1","source":"/s","type":"t""#);
        for i in 0..n {
            ev.push_str(&format!(r#","{}":"v""#, name(i)));
        }
        ev.push('}');
        ev
    }

    /// Regression (hostile suite, issue 8): one event with 80,000 extension attributes kept its
    /// shard busy 10.8 s in a pairwise duplicate check.
    #[test]
    fn regression_80000_attributes_duplicate_check_is_linear() {
        let eqs = std::cell::Cell::new(0);
        let mut names: Vec<Counted> = (0..80_000).map(|i| Counted(format!("x{i}"), &eqs)).collect();
        names.push(Counted("x0".into(), &eqs));
        let dup = first_duplicate(&names, |c| c).expect("the repeated name is found");
        assert_eq!(dup.0, "x0");
        // A pairwise scan would compare ~3.2e9 times; a set compares about once per collision.
        assert!(eqs.get() < 2 * names.len() as u64, "{} comparisons for {} names", eqs.get(), names.len());
        let eqs_small = std::cell::Cell::new(0);
        let few: Vec<Counted> = ["a", "b", "c", "b"].iter().map(|n| Counted(n.to_string(), &eqs_small)).collect();
        assert_eq!(first_duplicate(&few, |c| c).map(|c| c.0.as_str()), Some("b"));

        // The whole event: refused at the attribute cap, before any per-attribute check.
        let body = with_extensions(80_000, |i| format!("x{i}"));
        match parse_structured("t", body.as_bytes()) {
            Err(CeError::Invalid(m)) => assert!(m.contains("at most 1024 attributes"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn attribute_cap_and_duplicates_on_every_mode() {
        // 4 required + 1020 extensions = the cap exactly.
        let at_cap = with_extensions(MAX_ATTRIBUTES - 4, |i| format!("x{i}"));
        assert_eq!(parse_structured("t", at_cap.as_bytes()).unwrap().body().attributes.len(), MAX_ATTRIBUTES);
        let over = with_extensions(MAX_ATTRIBUTES - 3, |i| format!("x{i}"));
        assert!(matches!(parse_structured("t", over.as_bytes()), Err(CeError::Invalid(m)) if m.contains("at most")));
        let batch = format!("[{EV},{over}]");
        assert!(matches!(parse_batch("t", batch.as_bytes()), Err(CeError::Invalid(m)) if m.contains("at most")));
        // A duplicate among many (the hash-set path) and among few (the scan).
        let dup_late = with_extensions(1000, |i| if i == 999 { "x3".into() } else { format!("x{i}") });
        assert!(
            matches!(parse_structured("t", dup_late.as_bytes()), Err(CeError::Invalid(m)) if m.contains("x3 appears twice"))
        );
        let batch = format!("[{EV},{dup_late}]");
        assert!(matches!(parse_batch("t", batch.as_bytes()), Err(CeError::Invalid(m)) if m.contains("appears twice")));

        let names: Vec<String> = (0..MAX_ATTRIBUTES).map(|i| format!("ce-x{i}")).collect();
        let base: [(&str, &[u8]); 4] =
            [("ce-specversion", b"1.0"), ("ce-id", b"1"), ("ce-source", b"s"), ("ce-type", b"t")];
        let headers = base.iter().copied().chain(names.iter().map(|n| (n.as_str(), &b"v"[..])));
        assert!(matches!(parse_binary("t", headers, None, b""), Err(CeError::Invalid(m)) if m.contains("at most")));
        let headers = base.iter().copied().chain(names[..100].iter().map(|n| (n.as_str(), &b"v"[..])));
        assert_eq!(parse_binary("t", headers, None, b"").unwrap().body().attributes.len(), 104);
        let headers = base
            .iter()
            .copied()
            .chain(names[..100].iter().map(|n| (n.as_str(), &b"v"[..])))
            .chain([("CE-X7", &b"w"[..])]);
        assert!(
            matches!(parse_binary("t", headers, None, b""), Err(CeError::Invalid(m)) if m.contains("x7 appears twice"))
        );
        let headers = base.iter().copied().chain([("ce-id", &b"2"[..])]);
        assert!(
            matches!(parse_binary("t", headers, None, b""), Err(CeError::Invalid(m)) if m.contains("id appears twice"))
        );
    }

    #[test]
    fn batch_is_all_or_nothing() {
        let body = format!("[{EV},{EV}]");
        assert_eq!(parse_batch("t", body.as_bytes()).unwrap().len(), 2);
        let body = format!(r#"[{EV},{{"specversion":"1.0"}}]"#);
        match parse_batch("t", body.as_bytes()) {
            Err(CeError::Invalid(m)) => assert!(m.starts_with("batch element 1"), "{m}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(parse_batch("t", b"[]").unwrap().len(), 0);
        // The same through the flat pass (no nested data): the element is named alike.
        let flat = r#"{"specversion":"1.0","id":"1","source":"/s","type":"t","data":"x"}"#;
        assert_eq!(parse_batch("t", format!("[{flat},{flat}]").as_bytes()).unwrap().len(), 2);
        match parse_batch("t", format!(r#"[{flat},{flat},{{"specversion":"1.0"}}]"#).as_bytes()) {
            Err(CeError::Invalid(m)) => assert!(m.starts_with("batch element 2: "), "{m}"),
            other => panic!("{other:?}"),
        }
        for (body, says) in [
            (format!("[{EV},3]"), "batch element 1 is not a JSON object"),
            (format!(r#"[{EV},"x"]"#), "batch element 1 is not a JSON object"),
            (format!("[{EV},[{EV}]]"), "batch element 1 is not a JSON object"),
            (format!("[{EV},null]"), "batch element 1 is not a JSON object"),
            (format!("[{EV}] [{EV}]"), "malformed JSON"),
            (format!("[{EV},{EV}"), "malformed JSON"),
            (EV.to_string(), "malformed JSON"),
            (format!(r#"[{EV},{{"id":1,"id":2}}]"#), "batch element 1: "),
        ] {
            match parse_batch("t", body.as_bytes()) {
                Err(CeError::Invalid(m)) => assert!(m.starts_with(says), "{body}: {m}"),
                other => panic!("{body}: {other:?}"),
            }
        }
        // One pass over the batch builds the same frames as each element parsed alone.
        let second = EV.replace(r#""id":"1""#, r#""id":"2","ext":"a\"b""#);
        let frames = parse_batch("t", format!(" [ {EV} , {second} ] ").as_bytes()).unwrap();
        for (f, alone) in frames.iter().zip([EV, second.as_str()]) {
            assert_eq!(f.as_bytes(), parse_structured("t", alone.as_bytes()).unwrap().as_bytes());
        }
    }

    #[test]
    fn mode_selection() {
        assert_eq!(mode(Some(b"application/cloudevents+json; charset=utf-8"), false), Ok(Mode::Structured));
        assert_eq!(mode(Some(b"Application/CloudEvents-Batch+JSON"), false), Ok(Mode::Batch));
        assert_eq!(mode(Some(b"application/json"), true), Ok(Mode::Binary));
        assert!(matches!(mode(Some(b"application/cloudevents+avro"), false), Err(CeError::UnsupportedMedia(_))));
        assert!(matches!(mode(Some(b"application/json"), false), Err(CeError::UnsupportedMedia(_))));
    }

    /// Found by the `cloudevent_binary` fuzz target: `u8::from_str_radix` accepts a leading
    /// sign, so `%+5` in a `ce-` header decoded to the byte 5. A `%` without two hex digits
    /// after it is now literal (issue 12: the Python SDK 1.x sends values unencoded).
    #[test]
    fn percent_decoding_takes_a_sign_in_place_of_a_hex_digit_literally() {
        for literal in ["100%+5", "%-1", "%+", "%g0", "%0", "%", "50%", "a%2"] {
            assert_eq!(header_value(literal.as_bytes()), literal);
        }
        assert_eq!(header_value(b"100%25 %C3%A9%2b%2B"), "100% \u{e9}++");
    }

    /// What the Python SDK 1.x sends through `requests` for the subject `s 1 é%`: the `é` as
    /// its ISO-8859-1 byte, nothing percent-encoded.
    #[test]
    fn header_values_that_are_not_utf8_are_iso_8859_1() {
        assert_eq!(header_value(b"s 1 \xe9%"), "s 1 \u{e9}%");
        assert_eq!(header_value(b"\xff\xe9t\xe9 %41"), "\u{ff}\u{e9}t\u{e9} A");
        // Percent-decoding that would not be UTF-8: the value was never percent-encoded.
        assert_eq!(header_value(b"%E9t%E9"), "%E9t%E9");
        assert_eq!(header_value("ünï %C3%A9".as_bytes()), "ünï é");
        let headers: Vec<(&str, &[u8])> = vec![
            ("ce-specversion", b"1.0"),
            ("ce-id", b"1"),
            ("ce-source", b"/s"),
            ("ce-type", b"t"),
            ("ce-subject", b"s 1 \xe9%"),
        ];
        let f = parse_binary("t", headers.into_iter(), None, b"x").unwrap();
        assert_eq!(f.body().attr_str("subject"), Some("s 1 \u{e9}%"));
    }

    /// The subject is read alike from the flat pass (no escapes) and from serde_json (an escape
    /// anywhere in the event sends it there, and the subject's own escapes are decoded).
    #[test]
    fn the_subject_is_read_with_or_without_escapes() {
        let plain = br#"{"specversion":"1.0","id":"1","subject":"a/b","data":"x"}"#;
        assert_eq!(subject_of(plain).unwrap().as_deref(), Some("a/b"));
        let elsewhere = br#"{"specversion":"1.0","id":"\u0031","subject":"a/b"}"#;
        assert_eq!(subject_of(elsewhere).unwrap().as_deref(), Some("a/b"));
        let own = br#"{"subject":"a\/b\u00e9"}"#;
        assert_eq!(subject_of(own).unwrap().as_deref(), Some("a/bé"));
        assert_eq!(subject_of(br#"{"id":"1"}"#).unwrap(), None);
        assert!(subject_of(br#"{"subject":1}"#).is_err());
    }

    /// An attribute's escapes are decoded when serde_json took the event, and the flat pass's
    /// strings are taken as they are.
    #[test]
    fn attribute_strings_are_decoded_only_where_they_may_hold_escapes() {
        let value_of = |json: &str| {
            let frame = parse_structured("t", json.as_bytes()).unwrap();
            frame.body().attr_str("source").map(str::to_owned)
        };
        let event = |source: &str| format!(r#"{{"specversion":"1.0","id":"1","type":"t","source":"{source}"}}"#);
        assert_eq!(value_of(&event("/a/b")).as_deref(), Some("/a/b"));
        assert_eq!(value_of(&event(r"\/a\u002fb")).as_deref(), Some("/a/b"));
    }
}
