//! Classic EventMesh HTTP (MeshMessage): what EventMesh's classic Java and Go SDKs send (form
//! POSTs dispatched on a `code` header) straight to frames, and frames back to its push form.
//! Pure: bytes in, frames and answers out.
//!
//! Followed from apache/eventmesh at 2527428 (`RequestCode`, `ProtocolKey`, `EventMeshRetCode`,
//! `ClientRetCode`, `SendAsyncMessageProcessor`, `SendMessageRequestBody`,
//! `SendMessageBatchRequestBody`, `MeshMessageProtocolAdaptor`, `AsyncHTTPPushRequest`) and its
//! Java SDK's `EventMeshMessageProducer`:
//! - header names are lowercase (the runtime looks them up by exact key); `idc`, `sys` and a
//!   numeric `pid` are required of a send (retCode 6 without them);
//! - a send's form carries `topic`, `content`, `bizseqno`, `uniqueid`, `producergroup` (required,
//!   retCode 7; the group is accepted and ignored), `ttl` (ms; required by a sync send), `tag`,
//!   `extFields` (a JSON object of strings, each an extension);
//! - every answer is HTTP 200 with `{"retCode","retMsg","resTime"}`.
//!
//! A message becomes a CloudEvent as EventMesh's own adaptor makes it: `id` = `bizseqno`,
//! `source` = `/`, `type` = `eventmeshmessage`, `subject` = the topic, `content` as text data,
//! and `bizseqno`, `uniqueid`, `ttl`, `tag` and the `extFields` as extensions. So a CloudEvents
//! subscriber reads it as a CloudEvent, and a MeshMessage subscriber gets `content` back.

use std::borrow::Cow;

use frame_codec::{ArchivedAttrValue, AttrValue, Attribute, DataKind, Frame, FrameBody, FrameHeader};

use super::cloudevents;

/// `RequestCode`: what a request asks for.
pub mod code {
    /// A send that waits for its reply (request-reply, `ttl` its timeout).
    pub const SEND_SYNC: u16 = 101;
    /// A batch (`batchId`, `size`, `producerGroup`, `contents`).
    pub const BATCH: u16 = 102;
    /// A send.
    pub const SEND_ASYNC: u16 = 104;
    /// A push to a subscriber's `url` (asynchronous subscriptions).
    pub const PUSH_ASYNC: u16 = 105;
    /// A push to a subscriber's `url` (synchronous subscriptions).
    pub const PUSH_SYNC: u16 = 106;
    /// One message of a batch (`msg` instead of `content`).
    pub const BATCH_V2: u16 = 107;
    /// A client's heartbeat: answered with success once its headers check out.
    pub const HEARTBEAT: u16 = 203;
    /// A subscribe: push a consumer group's topics to a `url`.
    pub const SUBSCRIBE: u16 = 206;
    /// An unsubscribe: stop pushing a group's topics to a `url`.
    pub const UNSUBSCRIBE: u16 = 207;
    /// A reply to a sync send.
    pub const REPLY: u16 = 301;
}

/// `EventMeshRetCode`: the `retCode` of an answer.
pub mod ret {
    /// Success.
    pub const SUCCESS: u16 = 0;
    /// Overloaded, try later (the broker's 503).
    pub const OVERLOAD: u16 = 1;
    /// The `code` header is missing, not a number, or names no request served here (or the
    /// request is not a POST).
    pub const REQUEST_CODE_INVALID: u16 = 2;
    /// A sync send could not be sent.
    pub const SEND_SYNC_ERR: u16 = 3;
    /// A sync send's reply did not come (the `ttl` passed, or the requester left).
    pub const WAITING_REPLY_ERR: u16 = 4;
    /// A required header is missing or invalid (`idc`, `sys`, a numeric `pid`, `protocoltype`).
    pub const HEADER_ERR: u16 = 6;
    /// The form or JSON body is malformed, misses a field, or carries an invalid event.
    pub const BODY_ERR: u16 = 7;
    /// The message is larger than the broker accepts (the broker's 413).
    pub const BODY_SIZE_ERR: u16 = 8;
    /// A send could not be accepted or stored.
    pub const SEND_ASYNC_ERR: u16 = 15;
    /// A reply (code 301) could not be delivered to its requester.
    pub const REPLY_ERR: u16 = 16;
    /// Any other failure inside the broker.
    pub const RUNTIME_ERR: u16 = 18;
    /// A subscribe or unsubscribe could not be applied.
    pub const SUBSCRIBE_ERR: u16 = 19;
    /// Not authenticated or not permitted (the broker's 401 and 403).
    pub const ACL_ERR: u16 = 22;
    /// A rate or quota limit was hit (the broker's 429).
    pub const OVER_LIMIT: u16 = 23;
}

/// A refused classic request: its `retCode` and `retMsg`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The `retCode` to answer with, one of [`ret`].
    pub ret: u16,
    /// The `retMsg`: what is wrong, in EventMesh's wording (`eventMesh protocol[body] error: ...`).
    pub msg: String,
}

fn refused(ret: u16, msg: impl Into<String>) -> Refused {
    Refused { ret, msg: msg.into() }
}

/// The `retCode` for a refusal the broker words as an HTTP status (its limits, ACL, storage).
pub fn ret_for_status(status: u16, sync: bool) -> u16 {
    match status {
        401 | 403 => ret::ACL_ERR,
        413 => ret::BODY_SIZE_ERR,
        429 => ret::OVER_LIMIT,
        409 => ret::SEND_ASYNC_ERR,
        400..=499 => ret::BODY_ERR,
        503 => ret::OVERLOAD,
        _ if sync => ret::SEND_SYNC_ERR,
        _ => ret::SEND_ASYNC_ERR,
    }
}

/// The answer envelope: `{"retCode":N,"retMsg":M,"resTime":T}` (`T` in ms since the epoch).
pub fn answer(ret: u16, msg: &str, res_time_ms: i64) -> Vec<u8> {
    let msg = serde_json::Value::from(msg);
    format!(r#"{{"retCode":{ret},"retMsg":{msg},"resTime":{res_time_ms}}}"#).into_bytes()
}

/// Form fields a classic request may carry (the largest, a send, has under 20).
pub const MAX_FIELDS: usize = 64;

/// An `application/x-www-form-urlencoded` body (or query string): its fields in order, `+` a
/// space and `%XX` a byte (a `%` without two hex digits is itself), a field without `=` empty.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Form {
    fields: Vec<(String, String)>,
}

impl Form {
    /// Parses `body`; `Err` if a name or value is not UTF-8 once decoded, or past
    /// [`MAX_FIELDS`] fields (each field is two allocations: a body of `a&a&...` must not turn
    /// one megabyte into fifty).
    pub fn parse(body: &[u8]) -> Result<Form, Refused> {
        let mut fields = Vec::new();
        for pair in body.split(|&b| b == b'&').filter(|p| !p.is_empty()) {
            if fields.len() == MAX_FIELDS {
                return Err(refused(
                    ret::BODY_ERR,
                    format!("a classic request carries at most {MAX_FIELDS} form fields"),
                ));
            }
            let (k, v) = match pair.iter().position(|&b| b == b'=') {
                Some(i) => (&pair[..i], &pair[i + 1..]),
                None => (pair, &pair[..0]),
            };
            fields.push((decode(k)?, decode(v)?));
        }
        Ok(Form { fields })
    }

    /// A JSON object of strings read as a form (EventMesh's `/eventmesh/...` routes take either),
    /// at most [`MAX_FIELDS`] of them.
    pub fn from_json(body: &[u8]) -> Result<Form, Refused> {
        let text = std::str::from_utf8(body).map_err(|_| refused(ret::BODY_ERR, "the body is not UTF-8"))?;
        let fields = bounded(text, Bounded::<(String, String)>::new(MAX_FIELDS)).map_err(|e| {
            refused(ret::BODY_ERR, format!("a JSON body is an object of at most {MAX_FIELDS} strings: {e}"))
        })?;
        Ok(Form { fields })
    }

    /// The first value of `name` (names are case-sensitive, as EventMesh reads them).
    pub fn get(&self, name: &str) -> Option<&str> {
        self.fields.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    /// The value of `name` if present and not blank.
    fn nonblank(&self, name: &str) -> Option<&str> {
        self.get(name).filter(|v| !v.trim().is_empty())
    }
}

fn decode(raw: &[u8]) -> Result<String, Refused> {
    let out = super::percent_decode(raw, true);
    String::from_utf8(out).map_err(|_| refused(ret::BODY_ERR, "a form field is not UTF-8"))
}

/// The client headers every send must carry (`SendAsyncMessageProcessor`): `idc`, `sys` and a
/// numeric `pid`. `header` looks a header up by name.
pub fn check_client<'h>(header: impl Fn(&str) -> Option<&'h [u8]>) -> Result<(), Refused> {
    let blank = |name: &str| header(name).is_none_or(|v| v.trim_ascii().is_empty());
    for name in ["idc", "pid", "sys"] {
        if blank(name) {
            return Err(refused(ret::HEADER_ERR, format!("eventMesh protocol[header] error: {name} is missing")));
        }
    }
    if !header("pid").is_some_and(|p| p.iter().all(u8::is_ascii_digit)) {
        return Err(refused(ret::HEADER_ERR, "eventMesh protocol[header] error: pid must be numeric"));
    }
    Ok(())
}

/// Whether the request's `protocoltype` is one this adaptor reads (`eventmeshmessage`, or none:
/// the classic SDKs always send it, curl users may not).
pub fn check_protocol_type(protocol_type: Option<&[u8]>) -> Result<(), Refused> {
    match protocol_type.map(<[u8]>::trim_ascii) {
        None | Some(b"" | b"eventmeshmessage") => Ok(()),
        Some(other) => Err(refused(
            ret::HEADER_ERR,
            format!(
                "eventMesh protocol[header] error: protocoltype {:?} is not served here (eventmeshmessage is; CloudEvents go to POST /events/publish)",
                String::from_utf8_lossy(other)
            ),
        )),
    }
}

/// One message of a send, as its form (or a batch's element) carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message<'f> {
    /// The topic as the sender named it; also the event's `subject`.
    pub topic: &'f str,
    /// The message body, stored as the event's text data (may be empty).
    pub content: &'f str,
    /// The business sequence number: the event's `id`, and kept as an extension.
    pub bizseqno: &'f str,
    /// The message's unique id, kept as an extension.
    pub uniqueid: &'f str,
    /// Time to live in milliseconds, as sent (a sync send's reply timeout, required there),
    /// kept as an extension.
    pub ttl: Option<&'f str>,
    /// An optional tag, kept as an extension.
    pub tag: Option<&'f str>,
    /// `extFields`, each an extension attribute.
    pub ext: Vec<(String, String)>,
}

impl<'f> Message<'f> {
    /// The message of a send's form (104, or 101 with `sync`: `ttl` required, a number of ms).
    pub fn from_form(form: &'f Form, sync: bool) -> Result<Message<'f>, Refused> {
        let body_err = |what: &str| refused(ret::BODY_ERR, format!("eventMesh protocol[body] error: {what}"));
        let required = |name: &str| form.nonblank(name).ok_or_else(|| body_err(&format!("{name} is missing")));
        let topic = required("topic")?;
        let bizseqno = required("bizseqno")?;
        let uniqueid = required("uniqueid")?;
        required("producergroup")?;
        let content = form.get("content").ok_or_else(|| body_err("content is missing"))?;
        let ttl = form.nonblank("ttl");
        if sync && !ttl.is_some_and(|t| t.parse::<u32>().is_ok_and(|t| t > 0)) {
            return Err(body_err("a sync send needs ttl, its timeout in milliseconds"));
        }
        let ext = match form.nonblank("extFields") {
            Some(json) => {
                bounded(json, Bounded::<(String, String)>::new(cloudevents::MAX_ATTRIBUTES)).map_err(|e| {
                    let max = cloudevents::MAX_ATTRIBUTES;
                    body_err(&format!("extFields is not a JSON object of at most {max} strings: {e}"))
                })?
            }
            None => Vec::new(),
        };
        Ok(Message { topic, content, bizseqno, uniqueid, ttl, tag: form.nonblank("tag"), ext })
    }

    /// The message as a frame for `topic` (its stored name); `Err` if an extension is not a
    /// valid CloudEvents attribute.
    pub fn to_frame(&self, topic: &str) -> Result<Frame, Refused> {
        let s = |name: &str, v: &str| Attribute { name: name.into(), value: AttrValue::Str(v.into()) };
        let mut attributes = vec![
            s("specversion", "1.0"),
            s("id", self.bizseqno),
            s("source", "/"),
            s("type", MESSAGE_TYPE),
            s("subject", self.topic),
            s("datacontenttype", TEXT),
            s("bizseqno", self.bizseqno),
            s("uniqueid", self.uniqueid),
        ];
        attributes.extend(self.ttl.map(|t| s("ttl", t)));
        attributes.extend(self.tag.map(|t| s("tag", t)));
        for (k, v) in &self.ext {
            attributes.push(s(k, v));
        }
        let invalid = |m: String| refused(ret::BODY_ERR, format!("eventMesh protocol[body] error: {m}"));
        for a in &attributes[8..] {
            cloudevents::check_name(&a.name).map_err(|e| invalid(format!("extFields: {e}")))?;
        }
        cloudevents::check_event(&attributes).map_err(|e| invalid(e.to_string()))?;
        let body = FrameBody { topic: topic.to_owned(), attributes, data: self.content.as_bytes().to_vec() };
        let kind = if self.content.is_empty() { DataKind::None } else { DataKind::Text };
        Frame::encode(&FrameHeader::event(kind), &body).map_err(|e| invalid(e.to_string()))
    }
}

/// The `retMsg` of a sync send's success: the reply as the Java SDK reads it
/// (`SendMessageResponseBody.ReplyMessage`): `{"topic":T,"body":B,"properties":{...}}`, `B` the
/// reply's data as text and `properties` its extensions as strings.
pub fn reply_message(topic: &str, reply: &Frame) -> String {
    let body = reply.body();
    let properties = extensions(reply);
    // The data as text: a JSON string's value, any other JSON as its text, text as it is.
    let data = match reply.header().data_kind {
        DataKind::Json => serde_json::from_slice::<String>(&body.data).ok(),
        _ => None,
    };
    let data = data.unwrap_or_else(|| String::from_utf8_lossy(&body.data).into_owned());
    serde_json::json!({"topic": topic, "body": data, "properties": properties}).to_string()
}

/// The CloudEvents `type` of a message sent over the classic protocol (as EventMesh names it).
pub const MESSAGE_TYPE: &str = "eventmeshmessage";
const TEXT: &str = "text/plain;charset=utf-8";

/// One element of a 102 batch's `contents` (`BatchMessageEntity`).
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct BatchEntity {
    biz_seq_no: Option<String>,
    topic: Option<String>,
    msg: Option<String>,
    tag: Option<String>,
    ttl: Option<String>,
}

/// A JSON array (of `T`) or object (of `(String, String)` entries) read into a `Vec` of at
/// most `max` items: past it the parse stops, so a megabyte of `{}` is never collected.
struct Bounded<T> {
    max: usize,
    _of: std::marker::PhantomData<T>,
}

impl<T> Bounded<T> {
    fn new(max: usize) -> Self {
        Bounded { max, _of: std::marker::PhantomData }
    }
}

fn bounded<'de, T>(json: &'de str, seed: Bounded<T>) -> Result<Vec<T>, serde_json::Error>
where
    Bounded<T>: serde::de::DeserializeSeed<'de, Value = Vec<T>>,
{
    let mut de = serde_json::Deserializer::from_str(json);
    let v = serde::de::DeserializeSeed::deserialize(seed, &mut de)?;
    de.end()?;
    Ok(v)
}

/// An array's items, at most `max` (a refusal past it, before the rest is read).
struct Items<T>(usize, std::marker::PhantomData<T>);

impl<'de, T: serde::Deserialize<'de>> serde::de::Visitor<'de> for Items<T> {
    type Value = Vec<T>;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "an array of at most {} items", self.0)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::new();
        while let Some(item) = seq.next_element()? {
            if out.len() == self.0 {
                return Err(serde::de::Error::custom(format!("more than {} items", self.0)));
            }
            out.push(item);
        }
        Ok(out)
    }
}

/// Array items: a batch's `contents`, a subscribe's `topic`.
macro_rules! bounded_items {
    ($($t:ty),*) => {$(
        impl<'de> serde::de::DeserializeSeed<'de> for Bounded<$t> {
            type Value = Vec<$t>;
            fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
                d.deserialize_seq(Items(self.max, std::marker::PhantomData))
            }
        }
    )*};
}
bounded_items!(BatchEntity, SubscriptionItem, String);

/// `extFields`: an object's entries, in order (a key given twice is refused by the event check).
impl<'de> serde::de::DeserializeSeed<'de> for Bounded<(String, String)> {
    type Value = Vec<(String, String)>;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        struct Entries(usize);
        impl<'de> serde::de::Visitor<'de> for Entries {
            type Value = Vec<(String, String)>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "an object of at most {} strings", self.0)
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some(entry) = map.next_entry::<String, String>()? {
                    if out.len() == self.0 {
                        return Err(serde::de::Error::custom(format!("more than {} entries", self.0)));
                    }
                    out.push(entry);
                }
                Ok(out)
            }
        }
        d.deserialize_map(Entries(self.max))
    }
}

/// The messages of a 102 batch's form: `batchId`, `producerGroup` and `contents` (a JSON array
/// of `{"bizSeqNo","topic","msg","tag","ttl"}`), at most `max` of them. Each message's
/// `uniqueid` is its `bizSeqNo` (the batch carries none).
pub fn batch(form: &Form, max: usize) -> Result<Vec<(String, Form)>, Refused> {
    let body_err = |what: String| refused(ret::BODY_ERR, format!("eventMesh protocol[body] error: {what}"));
    for name in ["batchId", "producerGroup"] {
        form.nonblank(name).ok_or_else(|| body_err(format!("{name} is missing")))?;
    }
    let contents = form.get("contents").ok_or_else(|| body_err("contents is missing".into()))?;
    let entities = bounded(contents, Bounded::<BatchEntity>::new(max))
        .map_err(|e| body_err(format!("contents is not a JSON array of at most {max} messages: {e}")))?;
    if entities.is_empty() {
        return Err(body_err(format!("a batch carries 1 to {max} messages, not {}", entities.len())));
    }
    entities
        .into_iter()
        .enumerate()
        .map(|(i, e)| {
            let Some(topic) = e.topic.filter(|t| !t.trim().is_empty()) else {
                return Err(body_err(format!("message {i} of the batch names no topic")));
            };
            let seq = e.biz_seq_no.unwrap_or_default();
            let mut fields = vec![
                ("topic".to_owned(), topic.clone()),
                ("content".to_owned(), e.msg.unwrap_or_default()),
                ("bizseqno".to_owned(), seq.clone()),
                ("uniqueid".to_owned(), seq),
                ("producergroup".to_owned(), "batch".to_owned()),
            ];
            fields.extend(e.tag.map(|t| ("tag".to_owned(), t)));
            fields.extend(e.ttl.map(|t| ("ttl".to_owned(), t)));
            Ok((topic, Form { fields }))
        })
        .collect()
}

/// Topics one subscribe or unsubscribe may name.
pub const MAX_SUBSCRIBE_TOPICS: usize = 16;

/// One topic of a subscribe (`SubscriptionItem`): `mode` `CLUSTERING` (the default) or
/// `BROADCASTING`, `type` `ASYNC` (the default, pushed with code 105) or `SYNC` (106).
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct SubscriptionItem {
    /// The topic subscribed to.
    pub topic: String,
    /// `CLUSTERING` (each event to one of the group's URLs) or `BROADCASTING` (each event to
    /// every URL); `None` is clustering.
    #[serde(default)]
    pub mode: Option<String>,
    /// `ASYNC` or `SYNC` (JSON `type`): which push code the subscriber gets; `None` is async.
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
}

impl SubscriptionItem {
    /// Whether the mode is `BROADCASTING`: every URL of the group gets every event.
    pub fn broadcasting(&self) -> bool {
        self.mode.as_deref() == Some("BROADCASTING")
    }

    /// Whether the type is `SYNC`: pushed with code 106 rather than 105.
    pub fn sync(&self) -> bool {
        self.kind.as_deref() == Some("SYNC")
    }
}

/// A subscribe (206, `/eventmesh/subscribe/local`) or an unsubscribe (207,
/// `/eventmesh/unsubscribe/local`, whose topics are plain names).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscribe {
    /// The subscriber's URL, where events are pushed (trimmed, not blank).
    pub url: String,
    /// The `consumerGroup` (trimmed, not blank): URLs of one group share its subscriptions.
    pub group: String,
    /// The topics, one to [`MAX_SUBSCRIBE_TOPICS`] (an unsubscribe's with only their names).
    pub items: Vec<SubscriptionItem>,
}

/// Checks what a subscribe or unsubscribe names, whichever form it came in.
fn subscribe_checked(
    url: Option<&str>,
    group: Option<&str>,
    items: Vec<SubscriptionItem>,
) -> Result<Subscribe, Refused> {
    let body_err = |what: &str| refused(ret::BODY_ERR, format!("eventMesh protocol[body] error: {what}"));
    let url = url.filter(|u| !u.trim().is_empty()).ok_or_else(|| body_err("url is missing"))?;
    let group = group.filter(|g| !g.trim().is_empty()).ok_or_else(|| body_err("consumerGroup is missing"))?;
    if items.is_empty() {
        return Err(body_err("topic names no topic"));
    }
    for i in &items {
        if i.topic.trim().is_empty() {
            return Err(body_err("a topic is blank"));
        }
        if !matches!(i.mode.as_deref(), None | Some("CLUSTERING" | "BROADCASTING")) {
            return Err(body_err("mode is CLUSTERING or BROADCASTING"));
        }
        if !matches!(i.kind.as_deref(), None | Some("ASYNC" | "SYNC")) {
            return Err(body_err("type is ASYNC or SYNC"));
        }
    }
    Ok(Subscribe { url: url.trim().to_owned(), group: group.trim().to_owned(), items })
}

/// The topics of a subscribe (`[{"topic","mode","type"}]`) or an unsubscribe (`["T"]`) as JSON.
fn subscription_items(json: &str, unsubscribe: bool) -> Result<Vec<SubscriptionItem>, serde_json::Error> {
    let max = MAX_SUBSCRIBE_TOPICS;
    if unsubscribe {
        let names = bounded(json, Bounded::<String>::new(max))?;
        Ok(names.into_iter().map(|topic| SubscriptionItem { topic, mode: None, kind: None }).collect())
    } else {
        bounded(json, Bounded::<SubscriptionItem>::new(max))
    }
}

/// A 206 (or, `unsubscribe`, 207) form: `url`, `consumerGroup` and `topic`, a JSON array of at
/// most [`MAX_SUBSCRIBE_TOPICS`] items.
pub fn subscribe(form: &Form, unsubscribe: bool) -> Result<Subscribe, Refused> {
    let topics = form.get("topic").unwrap_or("[]");
    let items = subscription_items(topics, unsubscribe).map_err(|e| {
        refused(ret::BODY_ERR, format!("eventMesh protocol[body] error: topic is not a JSON array of at most {MAX_SUBSCRIBE_TOPICS} topics: {e}"))
    })?;
    subscribe_checked(form.get("url"), form.get("consumerGroup"), items)
}

/// The JSON body of `/eventmesh/subscribe/local` (or `unsubscribe/local`):
/// `{"url","consumerGroup","topic":[...]}`.
pub fn subscribe_json(body: &[u8], unsubscribe: bool) -> Result<Subscribe, Refused> {
    let bad = |e: &dyn std::fmt::Display| {
        refused(
            ret::BODY_ERR,
            format!("eventMesh protocol[body] error: expected {{\"url\",\"consumerGroup\",\"topic\":[...]}}: {e}"),
        )
    };
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Body<'a> {
        #[serde(default)]
        url: Option<String>,
        #[serde(default)]
        consumer_group: Option<String>,
        #[serde(default, borrow)]
        topic: Option<&'a serde_json::value::RawValue>,
    }
    let b: Body<'_> = serde_json::from_slice(body).map_err(|e| bad(&e))?;
    let items = match b.topic {
        Some(raw) => subscription_items(raw.get(), unsubscribe).map_err(|e| bad(&e))?,
        None => Vec::new(),
    };
    subscribe_checked(b.url.as_deref(), b.consumer_group.as_deref(), items)
}

/// A 301 reply's form as a send's: `origtopic` (the request's topic) is its topic and
/// `producergroup` may be absent; the request's `emcorrelationid` comes in `extFields` (a push
/// of the request carried it there).
pub fn reply(form: &Form) -> Form {
    let mut fields = form.fields.clone();
    if form.get("topic").is_none() {
        fields.push(("topic".into(), form.get("origtopic").unwrap_or("reply").to_owned()));
    }
    if form.nonblank("producergroup").is_none() {
        fields.push(("producergroup".into(), "reply".into()));
    }
    Form { fields }
}

/// A 107 message's form as a send's: `msg` is its `content`, and its `uniqueid` its `bizseqno`.
pub fn batch_v2(form: &Form) -> Form {
    let mut fields = form.fields.clone();
    if form.get("content").is_none() {
        if let Some(msg) = form.get("msg") {
            fields.push(("content".into(), msg.to_owned()));
        }
    }
    if form.get("uniqueid").is_none() {
        if let Some(seq) = form.get("bizseqno") {
            fields.push(("uniqueid".into(), seq.to_owned()));
        }
    }
    Form { fields }
}

/// The form body of a push of `frame` to a classic subscriber (`AsyncHTTPPushRequest`):
/// `content` (a classic message's content as sent; any other event as a structured CloudEvent,
/// as EventMesh pushes CloudEvents), `bizseqno`, `uniqueId`, `randomNo` (the push's own id,
/// the same on every attempt), `topic` and `extFields` (every extension, as strings).
pub fn push_form(frame: &Frame, topic: &str, random_no: &str) -> Vec<u8> {
    let body = frame.body();
    let classic = body.attr_str("type") == Some(MESSAGE_TYPE) && body.attr_str("bizseqno").is_some();
    let content: Cow<'_, str> = if classic {
        String::from_utf8_lossy(&body.data)
    } else {
        let mut out = Vec::new();
        cloudevents::write_structured(frame, &[], &mut out);
        Cow::Owned(String::from_utf8(out).expect("a structured event is UTF-8"))
    };
    let id = body.attr_str("id").unwrap_or_default();
    let ext = extensions(frame);
    let mut out = Vec::new();
    let fields = [
        ("content", content.as_ref()),
        ("bizseqno", body.attr_str("bizseqno").unwrap_or(id)),
        ("uniqueId", body.attr_str("uniqueid").unwrap_or(id)),
        ("randomNo", random_no),
        ("topic", topic),
    ];
    for (k, v) in fields {
        push_field(&mut out, k, v);
    }
    push_field(&mut out, "extFields", &ext.to_string());
    out
}

/// A classic subscriber's push (EventMesh's `AsyncHTTPPushRequest`): code 105 (106 for
/// `type: SYNC`) and the form of [`push_form`] (`randomNo` the same on every attempt of an
/// event). The answer's `{"retCode": N}` (`ClientRetCode`): 0 and 1 are done, 3 is refused for
/// good, 2 and 5 (and anything unreadable) are to be tried again.
pub struct PushForm {
    /// The topic as the subscriber named it.
    pub topic: String,
    /// Whether the subscription is `type: SYNC`: pushed with code 106 rather than 105.
    pub sync: bool,
}

impl super::PushWire for PushForm {
    fn request(&self, frame: &Frame, _d: &super::PushContext<'_>) -> (Vec<(String, String)>, Vec<u8>) {
        let h = frame.header();
        let code = if self.sync { "106" } else { "105" };
        let body = push_form(frame, &self.topic, &format!("{}{:012}", h.partition, h.offset));
        let headers = [
            ("code", code),
            ("language", "JAVA"),
            ("version", "1.0"),
            ("eventmeshcluster", "evmesh"),
            ("eventmeshenv", "evmesh"),
            ("eventmeshidc", "evmesh"),
            ("content-type", "application/x-www-form-urlencoded; charset=UTF-8"),
        ];
        (headers.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect(), body)
    }

    fn verdict(&self, body: &[u8]) -> super::Verdict {
        let code = serde_json::from_slice::<serde_json::Value>(body).ok().and_then(|v| v.get("retCode")?.as_i64());
        match code {
            Some(0 | 1) => super::Verdict::Done,
            Some(3) => super::Verdict::Refused,
            _ => super::Verdict::Retry,
        }
    }
}

/// A frame's extension attributes (everything but CloudEvents' context attributes) as a JSON
/// object of strings: the classic protocol's `extFields` and a reply's `properties`.
fn extensions(frame: &Frame) -> serde_json::Value {
    let mut ext = serde_json::Map::new();
    for a in frame.body().attributes.iter().filter(|a| !cloudevents::is_context_attribute(a.name.as_str())) {
        let value = match &a.value {
            ArchivedAttrValue::Str(s) => s.to_string(),
            ArchivedAttrValue::Bool(b) => b.to_string(),
            ArchivedAttrValue::Int(n) => n.to_native().to_string(),
        };
        ext.insert(a.name.to_string(), serde_json::Value::String(value));
    }
    serde_json::Value::Object(ext)
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

fn push_field(out: &mut Vec<u8>, name: &str, value: &str) {
    if !out.is_empty() {
        out.push(b'&');
    }
    for (i, part) in [name, value].into_iter().enumerate() {
        if i == 1 {
            out.push(b'=');
        }
        for &b in part.as_bytes() {
            match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'*' => out.push(b),
                b' ' => out.push(b'+'),
                _ => out.extend_from_slice(&[b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form(s: &str) -> Form {
        Form::parse(s.as_bytes()).unwrap()
    }

    /// The body EventMesh's Java SDK forms for a publish (`EventMeshMessageProducer`, Apache
    /// `UrlEncodedFormEntity`: `+` for a space, `%XX` for the rest, a null `ttl` as a bare key).
    const SDK_PUBLISH: &str = "producergroup=DefaultProducerGroup&topic=TEST-TOPIC-HTTP-ASYNC&content=%7B%22a%22%3A%22x+y%22%7D&ttl&bizseqno=764553018247542903411&uniqueid=283617203713462437451";

    #[test]
    fn a_java_sdk_publish_becomes_the_cloudevent_eventmesh_makes_of_it() {
        let f = form(SDK_PUBLISH);
        assert_eq!(f.get("content"), Some(r#"{"a":"x y"}"#));
        assert_eq!(f.get("ttl"), Some(""));
        let m = Message::from_form(&f, false).unwrap();
        assert_eq!((m.ttl, m.tag), (None, None));
        let frame = m.to_frame("TEST-TOPIC-HTTP-ASYNC").unwrap();
        let mut out = Vec::new();
        cloudevents::write_structured(&frame, &[], &mut out);
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"specversion": "1.0", "id": "764553018247542903411", "source": "/",
                "type": "eventmeshmessage", "subject": "TEST-TOPIC-HTTP-ASYNC",
                "datacontenttype": "text/plain;charset=utf-8", "bizseqno": "764553018247542903411",
                "uniqueid": "283617203713462437451", "data": "{\"a\":\"x y\"}"})
        );
    }

    #[test]
    fn sends_missing_what_eventmesh_requires_are_refused_with_its_codes() {
        let header = |pid: &'static [u8]| {
            move |name: &str| match name {
                "idc" => Some(&b"idc"[..]),
                "sys" => Some(&b"1234"[..]),
                "pid" => Some(pid),
                _ => None,
            }
        };
        assert!(check_client(header(b"4242")).is_ok());
        assert_eq!(check_client(header(b"42a")).unwrap_err().ret, ret::HEADER_ERR);
        assert_eq!(check_client(header(b" ")).unwrap_err().ret, ret::HEADER_ERR);
        assert_eq!(check_client(|_| None).unwrap_err().ret, ret::HEADER_ERR);
        for drop in ["topic", "bizseqno", "uniqueid", "producergroup", "content"] {
            let f = form(&SDK_PUBLISH.split('&').filter(|p| !p.starts_with(drop)).collect::<Vec<_>>().join("&"));
            let e = Message::from_form(&f, false).unwrap_err();
            assert_eq!(e.ret, ret::BODY_ERR, "{drop}");
            assert!(e.msg.contains(drop), "{drop}: {}", e.msg);
        }
        // A sync send needs its timeout.
        assert_eq!(Message::from_form(&form(SDK_PUBLISH), true).unwrap_err().ret, ret::BODY_ERR);
        let sync = form(&SDK_PUBLISH.replace("&ttl&", "&ttl=4000&"));
        assert_eq!(Message::from_form(&sync, true).unwrap().ttl, Some("4000"));
        // extFields: a JSON object of strings whose keys are attribute names.
        let ext = |json: &str| form(&format!("{SDK_PUBLISH}&extFields={json}"));
        let good = ext(r#"{"region":"eu","k2":"v"}"#);
        let frame = Message::from_form(&good, false).unwrap().to_frame("t").unwrap();
        assert_eq!(frame.body().attr_str("region"), Some("eu"));
        assert_eq!(Message::from_form(&ext("[1]"), false).unwrap_err().ret, ret::BODY_ERR);
        let bad_name = ext(r#"{"Bad-Name":"v"}"#);
        assert_eq!(Message::from_form(&bad_name, false).unwrap().to_frame("t").unwrap_err().ret, ret::BODY_ERR);
        assert_eq!(check_protocol_type(Some(b"cloudevents")).unwrap_err().ret, ret::HEADER_ERR);
        assert!(check_protocol_type(Some(b"eventmeshmessage")).is_ok() && check_protocol_type(None).is_ok());
    }

    #[test]
    fn batches_become_sends() {
        let contents = r#"[{"bizSeqNo":"1","topic":"a","msg":"m1","ttl":"4000"},{"bizSeqNo":"2","topic":"b","msg":"m2","tag":"t"}]"#;
        let f = Form {
            fields: vec![
                ("batchId".into(), "b1".into()),
                ("producerGroup".into(), "g".into()),
                ("contents".into(), contents.into()),
            ],
        };
        let msgs = batch(&f, 10).unwrap();
        assert_eq!(msgs.len(), 2);
        let m = Message::from_form(&msgs[1].1, false).unwrap();
        assert_eq!((m.topic, m.content, m.uniqueid, m.tag), ("b", "m2", "2", Some("t")));
        assert_eq!(batch(&f, 1).unwrap_err().ret, ret::BODY_ERR);
        let v2 = batch_v2(&form("bizseqno=9&topic=a&msg=hello&producergroup=g"));
        let m = Message::from_form(&v2, false).unwrap();
        assert_eq!((m.content, m.uniqueid), ("hello", "9"));
    }

    #[test]
    fn a_push_carries_content_as_sent_and_every_extension() {
        let f = form(&format!("{SDK_PUBLISH}&extFields=%7B%22region%22%3A%22eu%22%7D&tag=t1"));
        let frame = Message::from_form(&f, false).unwrap().to_frame("T").unwrap();
        let pushed = Form::parse(&push_form(&frame, "T", "17000001234")).unwrap();
        assert_eq!(pushed.get("content"), Some(r#"{"a":"x y"}"#));
        assert_eq!(pushed.get("uniqueId"), Some("283617203713462437451"));
        assert_eq!((pushed.get("randomNo"), pushed.get("topic")), (Some("17000001234"), Some("T")));
        let ext: serde_json::Value = serde_json::from_str(pushed.get("extFields").unwrap()).unwrap();
        assert_eq!(ext["region"], "eu");
        assert_eq!(ext["tag"], "t1");
        assert!(ext.get("id").is_none() && ext.get("subject").is_none(), "{ext}");
        // A CloudEvent published over HTTP is pushed as a structured CloudEvent.
        let ce =
            cloudevents::parse_structured("T", br#"{"specversion":"1.0","id":"c1","source":"/s","type":"t","n":3}"#)
                .unwrap();
        let pushed = Form::parse(&push_form(&ce, "T", "1")).unwrap();
        let content: serde_json::Value = serde_json::from_str(pushed.get("content").unwrap()).unwrap();
        assert_eq!(content["id"], "c1");
        assert_eq!((pushed.get("bizseqno"), pushed.get("uniqueId")), (Some("c1"), Some("c1")));
        assert_eq!(serde_json::from_str::<serde_json::Value>(pushed.get("extFields").unwrap()).unwrap()["n"], "3");
    }

    /// Hostile: a body of empty and bare fields is refused past the cap, not collected.
    #[test]
    fn a_form_of_many_tiny_fields_is_refused() {
        let body = "a&".repeat(100_000);
        assert_eq!(Form::parse(body.as_bytes()).unwrap_err().ret, ret::BODY_ERR);
        assert_eq!(Form::parse("&&&&".repeat(100_000).as_bytes()).unwrap(), Form::default());
        assert!(Form::parse("a=1&".repeat(MAX_FIELDS).as_bytes()).is_ok());
        let json: Vec<String> = (0..=MAX_FIELDS).map(|i| format!("\"k{i}\":\"v\"")).collect();
        assert_eq!(Form::from_json(format!("{{{}}}", json.join(",")).as_bytes()).unwrap_err().ret, ret::BODY_ERR);
        let f = Form::from_json(br#"{"topic":"t","content":"c"}"#).unwrap();
        assert_eq!((f.get("topic"), f.get("content")), (Some("t"), Some("c")));
        assert!(Form::from_json(br#"{"topic":1}"#).is_err() && Form::from_json(b"[]").is_err());
        // JSON inside the form is bounded the same way: a batch's contents and extFields stop
        // at their caps instead of collecting a megabyte of empty items first.
        let contents = format!("[{}{{}}]", "{},".repeat(100_000));
        let f = Form {
            fields: vec![
                ("batchId".into(), "b".into()),
                ("producerGroup".into(), "g".into()),
                ("contents".into(), contents),
            ],
        };
        assert!(batch(&f, 10).unwrap_err().msg.contains("at most 10"));
        let ext: Vec<String> = (0..2000).map(|i| format!("\"k{i}\":\"v\"")).collect();
        let f = form(&format!("{SDK_PUBLISH}&extFields={{{}}}", ext.join(",")));
        assert!(Message::from_form(&f, false).unwrap_err().msg.contains("at most 1024"));
    }

    /// Found by the sync-send test: a reply's JSON string data went out with its quotes.
    #[test]
    fn a_reply_message_carries_the_data_as_text() {
        let reply = |data: &str| {
            let e = format!(r#"{{"specversion":"1.0","id":"r","source":"/s","type":"t","k":"v","data":{data}}}"#);
            cloudevents::parse_structured("rpc", e.as_bytes()).unwrap()
        };
        let m: serde_json::Value = serde_json::from_str(&reply_message("rpc", &reply(r#""noon""#))).unwrap();
        assert_eq!(m, serde_json::json!({"topic": "rpc", "body": "noon", "properties": {"k": "v"}}));
        let m: serde_json::Value = serde_json::from_str(&reply_message("rpc", &reply(r#"{"a":1}"#))).unwrap();
        assert_eq!(m["body"], r#"{"a":1}"#);
    }

    #[test]
    fn answers_are_the_classic_envelope() {
        let a: serde_json::Value = serde_json::from_slice(&answer(7, "bad \"x\"", 1700)).unwrap();
        assert_eq!(a, serde_json::json!({"retCode": 7, "retMsg": "bad \"x\"", "resTime": 1700}));
        assert_eq!((ret_for_status(403, false), ret_for_status(429, true), ret_for_status(503, true)), (22, 23, 1));
        assert_eq!((ret_for_status(500, true), ret_for_status(500, false), ret_for_status(409, false)), (3, 15, 15));
    }

    /// As `EventMeshHttpConsumer` forms them (Jackson's JSON of `SubscriptionItem`s in the
    /// form field `topic`, `consumerGroup` in camelCase; unsubscribe: topic names).
    #[test]
    fn subscribes_are_read_as_the_java_sdk_forms_them_and_bounded() {
        let body = b"topic=%5B%7B%22topic%22%3A%22orders%22%2C%22mode%22%3A%22CLUSTERING%22%2C%22type%22%3A%22ASYNC%22%7D%5D&url=http%3A%2F%2F127.0.0.1%3A8088%2Fsub&consumerGroup=DefaultConsumerGroup";
        let s = subscribe(&Form::parse(body).unwrap(), false).unwrap();
        assert_eq!((s.url.as_str(), s.group.as_str()), ("http://127.0.0.1:8088/sub", "DefaultConsumerGroup"));
        assert_eq!(s.items.len(), 1);
        assert!(!s.items[0].broadcasting() && !s.items[0].sync() && s.items[0].topic == "orders");
        let u = subscribe(&Form::parse(b"topic=%5B%22a%22%2C%22b%22%5D&url=u&consumerGroup=g").unwrap(), true).unwrap();
        assert_eq!(u.items.iter().map(|i| i.topic.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        let j = subscribe_json(
            br#"{"url":"http://h/x","consumerGroup":"g","topic":[{"topic":"t","mode":"BROADCASTING","type":"SYNC"}]}"#,
            false,
        )
        .unwrap();
        assert!(j.items[0].broadcasting() && j.items[0].sync());
        let many = format!("[{}]", vec![r#"{"topic":"t"}"#; MAX_SUBSCRIBE_TOPICS + 1].join(","));
        for (form, want) in [
            (format!("topic={many}&url=u&consumerGroup=g"), "at most 16"),
            ("topic=[]&url=u&consumerGroup=g".to_owned(), "names no topic"),
            (r#"topic=[{"topic":"t"}]&consumerGroup=g"#.to_owned(), "url is missing"),
            (r#"topic=[{"topic":"t"}]&url=u"#.to_owned(), "consumerGroup is missing"),
            (r#"topic=[{"topic":"t","mode":"clustering"}]&url=u&consumerGroup=g"#.to_owned(), "mode is"),
            (r#"topic=[{"topic":"t","type":"LATER"}]&url=u&consumerGroup=g"#.to_owned(), "type is"),
            (r#"topic=[{"topic":" "}]&url=u&consumerGroup=g"#.to_owned(), "blank"),
            ("topic={}&url=u&consumerGroup=g".to_owned(), "JSON array"),
        ] {
            let form = Form::parse(form.as_bytes()).unwrap();
            let e = subscribe(&form, false).unwrap_err();
            assert!(e.ret == ret::BODY_ERR && e.msg.contains(want), "{want}: {e:?}");
        }
        assert!(subscribe_json(b"{\"url\":1}", false).unwrap_err().msg.contains("expected"));
    }

    #[test]
    fn a_classic_push_is_code_105_or_106_and_its_ret_code_decides() {
        use super::super::{PushContext, PushWire, Verdict};
        let mut f = Message::from_form(
            &Form::parse(b"topic=t&content=hi&bizseqno=b1&uniqueid=u1&producergroup=g").unwrap(),
            false,
        )
        .unwrap()
        .to_frame("t")
        .unwrap();
        f.set_partition(1);
        f.set_offset(5);
        let d = PushContext { delivery_id: "1:5:2", attempt: 2, target: "/", now_s: 0 };
        let (headers, body) = PushForm { topic: "t".into(), sync: true }.request(&f, &d);
        assert!(headers.contains(&("code".into(), "106".into())), "{headers:?}");
        let form = Form::parse(&body).unwrap();
        assert_eq!((form.get("content"), form.get("randomNo")), (Some("hi"), Some("1000000000005")));
        let w = PushForm { topic: "t".into(), sync: false };
        for (answer, want) in [
            (&br#"{"retCode":0}"#[..], Verdict::Done),
            (br#"{"retCode":1}"#, Verdict::Done),
            (br#"{"retCode":3}"#, Verdict::Refused),
            (br#"{"retCode":2}"#, Verdict::Retry),
            (br#"{"retCode":"1"}"#, Verdict::Retry),
            (b"", Verdict::Retry),
        ] {
            assert_eq!(w.verdict(answer), want, "{}", String::from_utf8_lossy(answer));
        }
    }
}
