//! EventMesh's classic TCP protocol, the frames as apache/eventmesh's Java codec writes and
//! reads them: `eventmesh-common/src/main/java/org/apache/eventmesh/common/protocol/tcp/`
//! (`codec/Codec.java`, `Command.java`, `Header.java`), read at commit
//! 2527428788cb8af6104db600dffea5746fb5479f.
//!
//! A frame:
//!
//! | bytes      | field                                                                   |
//! |------------|-------------------------------------------------------------------------|
//! | 0..9       | `EventMesh`                                                             |
//! | 9..13      | the version, `0000`                                                     |
//! | 13..17     | the package length, big-endian: 13 + header length + body length (the two length fields are not counted) |
//! | 17..21     | the header length, big-endian                                           |
//! | 21..       | the header (JSON), then the body                                        |
//!
//! The Java decoder is Netty's `LengthFieldBasedFrameDecoder(4 MiB, 13, 4, -9, 0)`: a whole
//! frame is the package length + 8 bytes, at most 4 MiB ([`MAX_FRAME`]); it then checks the
//! magic and version and closes the connection on anything it cannot read. This decoder checks
//! the magic as soon as its bytes are there (a stream that is not EventMesh's is refused before
//! any length is believed). The Java encoder refuses a package length over 4 MiB; [`encode`]
//! refuses a frame over [`MAX_FRAME`], what the Java decoder takes.
//!
//! The header is Jackson's JSON of `Header` (non-null fields): `cmd` (the command's name),
//! `code`, `desc`, `seq`, `properties`, and `command` (the same name again: Jackson writes the
//! `getCommand()` getter too, and ignores it when reading). Bodies stay bytes here: what a body
//! is (a user agent, a subscription, a CloudEvent or an EventMeshMessage in JSON) depends on
//! the command and the header's `protocoltype` property, which the bridge reads.

use frame_codec::{AttrValue, Attribute, DataKind, Frame, FrameBody, FrameHeader};
use serde_json::{Map, Value};
use std::borrow::Cow;

use super::cloudevents::{self, Extensions};

/// The magic every frame starts with.
pub const MAGIC: &[u8; 9] = b"EventMesh";
/// The version after it (the only one there is).
pub const VERSION: &[u8; 4] = b"0000";
/// The magic and version.
pub const PREFIX: usize = 13;
/// The magic, the version and the two length fields.
pub const FIXED: usize = 21;
/// The largest frame, whole (the Java decoder's `FRAME_MAX_LENGTH`).
pub const MAX_FRAME: usize = 4 << 20;

/// Why bytes are not an EventMesh TCP frame (the Java server closes the connection on each).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Not `EventMesh0000` in front.
    #[error("not an EventMesh TCP frame (magic or version)")]
    Magic,
    /// A whole frame past [`MAX_FRAME`] bytes.
    #[error("a frame of {0} bytes, past the 4 MiB limit")]
    TooLong(i64),
    /// A package length that leaves no room for the length fields.
    #[error("a frame of {0} bytes cannot hold its two length fields")]
    TooShort(i64),
    /// A header length past the frame (or negative).
    #[error("a header of {header} bytes in a frame of {frame}")]
    HeaderLength {
        /// The header length the frame says.
        header: i32,
        /// The whole frame's length.
        frame: i64,
    },
    /// A header that is not JSON, or whose `cmd` is not a command.
    #[error("header: {0}")]
    Header(String),
}

macro_rules! commands {
    ($($name:ident = $value:literal $text:literal,)*) => {
        /// The commands (`Command.java`), by their byte value.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Command { $(#[doc = $text] $name = $value,)* }

        impl Command {
            /// The name the JSON header carries.
            pub fn name(self) -> &'static str {
                match self { $(Command::$name => $text,)* }
            }

            /// By the name the JSON header carries.
            pub fn from_name(s: &str) -> Option<Command> {
                match s { $($text => Some(Command::$name),)* _ => None }
            }

            /// By value (what Jackson also takes for an enum: its ordinal, the same here).
            pub fn from_value(v: u64) -> Option<Command> {
                match v { $($value => Some(Command::$name),)* _ => None }
            }
        }
    };
}

commands! {
    HeartbeatRequest = 0 "HEARTBEAT_REQUEST",
    HeartbeatResponse = 1 "HEARTBEAT_RESPONSE",
    HelloRequest = 2 "HELLO_REQUEST",
    HelloResponse = 3 "HELLO_RESPONSE",
    ClientGoodbyeRequest = 4 "CLIENT_GOODBYE_REQUEST",
    ClientGoodbyeResponse = 5 "CLIENT_GOODBYE_RESPONSE",
    ServerGoodbyeRequest = 6 "SERVER_GOODBYE_REQUEST",
    ServerGoodbyeResponse = 7 "SERVER_GOODBYE_RESPONSE",
    SubscribeRequest = 8 "SUBSCRIBE_REQUEST",
    SubscribeResponse = 9 "SUBSCRIBE_RESPONSE",
    UnsubscribeRequest = 10 "UNSUBSCRIBE_REQUEST",
    UnsubscribeResponse = 11 "UNSUBSCRIBE_RESPONSE",
    ListenRequest = 12 "LISTEN_REQUEST",
    ListenResponse = 13 "LISTEN_RESPONSE",
    RequestToServer = 14 "REQUEST_TO_SERVER",
    RequestToClient = 15 "REQUEST_TO_CLIENT",
    RequestToClientAck = 16 "REQUEST_TO_CLIENT_ACK",
    ResponseToServer = 17 "RESPONSE_TO_SERVER",
    ResponseToClient = 18 "RESPONSE_TO_CLIENT",
    ResponseToClientAck = 19 "RESPONSE_TO_CLIENT_ACK",
    AsyncMessageToServer = 20 "ASYNC_MESSAGE_TO_SERVER",
    AsyncMessageToServerAck = 21 "ASYNC_MESSAGE_TO_SERVER_ACK",
    AsyncMessageToClient = 22 "ASYNC_MESSAGE_TO_CLIENT",
    AsyncMessageToClientAck = 23 "ASYNC_MESSAGE_TO_CLIENT_ACK",
    BroadcastMessageToServer = 24 "BROADCAST_MESSAGE_TO_SERVER",
    BroadcastMessageToServerAck = 25 "BROADCAST_MESSAGE_TO_SERVER_ACK",
    BroadcastMessageToClient = 26 "BROADCAST_MESSAGE_TO_CLIENT",
    BroadcastMessageToClientAck = 27 "BROADCAST_MESSAGE_TO_CLIENT_ACK",
    SysLogToLogserver = 28 "SYS_LOG_TO_LOGSERVER",
    TraceLogToLogserver = 29 "TRACE_LOG_TO_LOGSERVER",
    RedirectToClient = 30 "REDIRECT_TO_CLIENT",
    RegisterRequest = 31 "REGISTER_REQUEST",
    RegisterResponse = 32 "REGISTER_RESPONSE",
    UnregisterRequest = 33 "UNREGISTER_REQUEST",
    UnregisterResponse = 34 "UNREGISTER_RESPONSE",
    RecommendRequest = 35 "RECOMMEND_REQUEST",
    RecommendResponse = 36 "RECOMMEND_RESPONSE",
}

/// A package's header (`Header.java`).
#[derive(Debug, Clone, PartialEq)]
pub struct Header {
    /// What the package is.
    pub cmd: Command,
    /// `OPStatus`: 0 success, 1 fail, 2 aclFail, 3 tpsOverload.
    pub code: i32,
    /// What the code means, in words.
    pub desc: Option<String>,
    /// The sequence number an answer repeats.
    pub seq: Option<String>,
    /// The package's properties (`protocoltype`, `protocolversion`, ...).
    pub properties: Map<String, Value>,
}

impl Header {
    /// A header with no properties.
    pub fn new(cmd: Command, code: i32, desc: Option<&str>, seq: Option<&str>) -> Header {
        Header { cmd, code, desc: desc.map(str::to_owned), seq: seq.map(str::to_owned), properties: Map::new() }
    }

    /// The JSON the Java encoder writes: the fields in `Header`'s order, nulls left out, then
    /// `command` (properties in key order: Java's `HashMap` has no order of its own).
    pub fn to_json(&self) -> Vec<u8> {
        let s = |v: &str| Value::String(v.to_owned()).to_string();
        let mut out = format!("{{\"cmd\":{},\"code\":{}", s(self.cmd.name()), self.code);
        if let Some(d) = &self.desc {
            out.push_str(&format!(",\"desc\":{}", s(d)));
        }
        if let Some(q) = &self.seq {
            out.push_str(&format!(",\"seq\":{}", s(q)));
        }
        out.push_str(&format!(",\"properties\":{}", Value::Object(self.properties.clone())));
        out.push_str(&format!(",\"command\":{}}}", s(self.cmd.name())));
        out.into_bytes()
    }

    /// A header as Jackson reads one: unknown fields ignored, `cmd` by name or value.
    pub fn from_json(bytes: &[u8]) -> Result<Header, FrameError> {
        let bad = |why: &str| FrameError::Header(why.to_owned());
        let v: Value = serde_json::from_slice(bytes).map_err(|e| FrameError::Header(e.to_string()))?;
        let o = v.as_object().ok_or_else(|| bad("not a JSON object"))?;
        let cmd = match o.get("cmd") {
            Some(Value::String(name)) => Command::from_name(name),
            Some(Value::Number(n)) => n.as_u64().and_then(Command::from_value),
            _ => None,
        }
        .ok_or_else(|| bad("no known cmd"))?;
        let text = |k: &str| match o.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(Value::Number(n)) => Ok(Some(n.to_string())),
            Some(_) => Err(FrameError::Header(format!("{k} is not a string"))),
        };
        let code = match o.get("code") {
            None | Some(Value::Null) => 0,
            Some(c) => c.as_i64().and_then(|c| i32::try_from(c).ok()).ok_or_else(|| bad("code is not an int"))?,
        };
        let properties = match o.get("properties") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(p)) => p.clone(),
            Some(_) => return Err(bad("properties is not an object")),
        };
        Ok(Header { cmd, code, desc: text("desc")?, seq: text("seq")?, properties })
    }
}

/// A package: its header (a frame with a header length of 0 has none, and then no body either,
/// as the Java decoder reads it) and its body's bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct Package {
    /// Its header, if the frame has one.
    pub header: Option<Header>,
    /// Its body's bytes.
    pub body: Vec<u8>,
}

/// The first package of `buf`, and the bytes it took; `Ok(None)`: not all there yet.
pub fn decode(buf: &[u8]) -> Result<Option<(Package, usize)>, FrameError> {
    let magic = [&MAGIC[..], &VERSION[..]].concat();
    let seen = buf.len().min(PREFIX);
    if buf[..seen] != magic[..seen] {
        return Err(FrameError::Magic);
    }
    if buf.len() < PREFIX + 4 {
        return Ok(None);
    }
    let be = |at: usize| i32::from_be_bytes(buf[at..at + 4].try_into().expect("4 bytes"));
    let frame = i64::from(be(PREFIX)) + 8;
    if frame < FIXED as i64 {
        return Err(FrameError::TooShort(frame));
    }
    if frame > MAX_FRAME as i64 {
        return Err(FrameError::TooLong(frame));
    }
    let frame_len = frame as usize;
    if buf.len() < frame_len {
        return Ok(None);
    }
    let header_len = be(PREFIX + 4);
    if header_len < 0 || FIXED as i64 + i64::from(header_len) > frame {
        return Err(FrameError::HeaderLength { header: header_len, frame });
    }
    let body_at = FIXED + header_len as usize;
    let pkg = match header_len {
        0 => Package { header: None, body: Vec::new() },
        _ => Package { header: Some(Header::from_json(&buf[FIXED..body_at])?), body: buf[body_at..frame_len].to_vec() },
    };
    Ok(Some((pkg, frame_len)))
}

/// The frame of a package, as the Java encoder writes it; a frame past [`MAX_FRAME`] is refused.
pub fn encode(header: &Header, body: &[u8]) -> Result<Vec<u8>, FrameError> {
    let h = header.to_json();
    let total = FIXED + h.len() + body.len();
    if total > MAX_FRAME {
        return Err(FrameError::TooLong(total as i64));
    }
    let mut out = Vec::with_capacity(total);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(VERSION);
    out.extend_from_slice(&((PREFIX + h.len() + body.len()) as i32).to_be_bytes());
    out.extend_from_slice(&(h.len() as i32).to_be_bytes());
    out.extend_from_slice(&h);
    out.extend_from_slice(body);
    Ok(out)
}

/// `OPStatus.SUCCESS`.
pub const SUCCESS: i32 = 0;
/// `OPStatus.FAIL`: every refusal (the Java server sends no other code).
pub const FAIL: i32 = 1;

/// The longest `desc` an answer carries (a longer one is cut, on a character boundary).
pub const MAX_DESC: usize = 1024;
/// The longest `seq` an answer echoes (the Java SDK's are 10 characters; a longer one is left
/// out of the answer).
pub const MAX_SEQ: usize = 1024;

/// An answer package: `cmd` with `code`, `desc` and the request's `seq`, no body. Bounded
/// whatever the request carried: `desc` cut to [`MAX_DESC`] bytes, a `seq` past [`MAX_SEQ`]
/// not echoed.
pub fn answer(cmd: Command, code: i32, desc: &str, seq: Option<&str>) -> Vec<u8> {
    let mut end = desc.len().min(MAX_DESC);
    while !desc.is_char_boundary(end) {
        end -= 1;
    }
    let seq = seq.filter(|s| s.len() <= MAX_SEQ);
    encode(&Header::new(cmd, code, Some(&desc[..end]), seq), b"").expect("an answer of bounded parts is small")
}

/// The answer command of a request (`TcpDispatcher`'s mapping): the same command for one that
/// has none.
pub fn answer_to(cmd: Command) -> Command {
    match cmd {
        Command::HelloRequest => Command::HelloResponse,
        Command::RecommendRequest => Command::RecommendResponse,
        Command::HeartbeatRequest => Command::HeartbeatResponse,
        Command::SubscribeRequest => Command::SubscribeResponse,
        Command::UnsubscribeRequest => Command::UnsubscribeResponse,
        Command::ListenRequest => Command::ListenResponse,
        Command::ClientGoodbyeRequest => Command::ClientGoodbyeResponse,
        Command::RequestToServer => Command::ResponseToClient,
        Command::AsyncMessageToServer => Command::AsyncMessageToServerAck,
        Command::BroadcastMessageToServer => Command::BroadcastMessageToServerAck,
        other => other,
    }
}

/// A HELLO's body (`UserAgent.java`). `host` and `port` are the socket's, whatever it says.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(default)]
pub struct UserAgent {
    /// The client's environment (reported, not used).
    pub env: Option<String>,
    /// The application's id (reported, not used).
    pub subsystem: Option<String>,
    /// The client's working directory (reported, not used).
    pub path: Option<String>,
    /// The client's process id (reported, not used).
    pub pid: i64,
    /// The SDK's version (required, as Java requires it).
    pub version: Option<String>,
    /// The user's name (not used: the credential decides who the client is).
    pub username: Option<String>,
    /// The credential, when `token` is empty.
    pub password: Option<String>,
    /// The credential (a token of `auth = token`, or a JWT).
    pub token: Option<String>,
    /// The client's data centre (reported, not used).
    pub idc: Option<String>,
    /// The client's group: it names the group's subscriptions (no MQ group is made).
    pub group: Option<String>,
    /// `pub` or `sub`.
    pub purpose: Option<String>,
}

/// A client that publishes (`pub`) or one that subscribes (`sub`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// `pub`.
    Pub,
    /// `sub`: may LISTEN.
    Sub,
}

impl UserAgent {
    /// Reads and checks a HELLO's body as `HelloProcessor` does: a version, the purpose `pub`
    /// or `sub`, a group (here also a valid name: it names the group's subscriptions).
    pub fn parse(body: &[u8]) -> Result<(UserAgent, Purpose), String> {
        let ua: UserAgent = serde_json::from_slice(body).map_err(|e| format!("client info is not a UserAgent: {e}"))?;
        if ua.version.is_none() {
            return Err("client version cannot be null".into());
        }
        let purpose = match ua.purpose.as_deref() {
            Some("pub") => Purpose::Pub,
            Some("sub") => Purpose::Sub,
            _ => return Err("client purpose config is error (pub or sub)".into()),
        };
        match ua.group.as_deref().map(str::trim) {
            None | Some("") => return Err("client group cannot be null".into()),
            Some(g) if g.len() > 200 || !g.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)) => {
                return Err("client group is [A-Za-z0-9._-]{1,200}".into())
            }
            Some(_) => {}
        }
        Ok((ua, purpose))
    }

    /// The credential it carries: `token`, else `password` (`username` names nobody: the
    /// credential decides who the client is).
    pub fn credential(&self) -> Option<&str> {
        [&self.token, &self.password].into_iter().flatten().map(String::as_str).find(|c| !c.is_empty())
    }
}

/// Topics one SUBSCRIBE may name.
pub const MAX_TOPICS: usize = 16;

/// One topic of a SUBSCRIBE (`SubscriptionItem`): its mode and type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscribed {
    /// The topic as the client names it.
    pub topic: String,
    /// `BROADCASTING`: every client gets every event; else `CLUSTERING`: each event to one
    /// client of the group.
    pub broadcasting: bool,
    /// `SYNC`: events are pushed as `REQUEST_TO_CLIENT` (the client answers them).
    pub sync: bool,
}

/// A SUBSCRIBE's body: `{"topicList":[{"topic":T,"mode":"CLUSTERING"|"BROADCASTING","type":"SYNC"|"ASYNC"}]}`,
/// one to [`MAX_TOPICS`] topics. Java binds the enums by name (`valueOf`); so does this.
pub fn subscription(body: &[u8]) -> Result<Vec<Subscribed>, String> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Body {
        topic_list: Option<Vec<Item>>,
    }
    #[derive(serde::Deserialize)]
    struct Item {
        topic: Option<String>,
        mode: Option<String>,
        #[serde(rename = "type")]
        kind: Option<String>,
    }
    let b: Body = serde_json::from_slice(body).map_err(|e| format!("subscriptionInfo is not a Subscription: {e}"))?;
    let items = b.topic_list.unwrap_or_default();
    if items.is_empty() || items.len() > MAX_TOPICS {
        return Err(format!("topicList names 1 to {MAX_TOPICS} topics"));
    }
    items
        .into_iter()
        .map(|i| {
            let topic = i.topic.filter(|t| !t.is_empty()).ok_or("a topicList item names its topic")?;
            let broadcasting = match i.mode.as_deref() {
                None | Some("CLUSTERING") => false,
                Some("BROADCASTING") => true,
                Some(m) => return Err(format!("mode {m:?}: CLUSTERING or BROADCASTING")),
            };
            let sync = match i.kind.as_deref() {
                None | Some("ASYNC") => false,
                Some("SYNC") => true,
                Some(t) => return Err(format!("type {t:?}: SYNC or ASYNC")),
            };
            Ok(Subscribed { topic, broadcasting, sync })
        })
        .collect()
}

/// The header property naming a message body's protocol.
pub const PROTOCOL_TYPE: &str = "protocoltype";
/// `protocoltype`: a structured-mode CloudEvent in JSON.
pub const CLOUDEVENTS: &str = "cloudevents";
/// `protocoltype`: an `EventMeshMessage` in JSON (the default when none is named).
pub const EVENTMESH_MESSAGE: &str = "eventmeshmessage";

/// A message a client sends (ASYNC_MESSAGE_TO_SERVER, BROADCAST_MESSAGE_TO_SERVER,
/// REQUEST_TO_SERVER, RESPONSE_TO_SERVER), read as far as its topic: the rest becomes a frame
/// once the ingress knows the topic's stored name ([`Message::to_frame`]).
#[derive(Debug)]
pub enum Message<'b> {
    /// A structured-mode CloudEvent; its topic is its `subject` (empty without one: a reply
    /// needs none).
    /// (`topic`: the event's `subject`; `json`: the body.)
    #[allow(missing_docs)]
    CloudEvent { topic: String, json: &'b [u8] },
    /// An `EventMeshMessage` (`{"topic","body","properties","headers"}`).
    Mesh(MeshMessage),
}

/// `EventMeshMessage.java`.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
pub struct MeshMessage {
    /// The topic.
    pub topic: Option<String>,
    /// The data, as text.
    pub body: Option<String>,
    /// Extensions.
    pub properties: Map<String, Value>,
    /// `datacontenttype` is read from here.
    pub headers: Map<String, Value>,
}

impl<'b> Message<'b> {
    /// Reads a message's body by its header's `protocoltype` (`eventmeshmessage` when none
    /// is named, as the Java server defaults). `openmessage` is refused: the Java server
    /// converts none (its adaptor returns no event).
    pub fn parse(header: &Header, body: &'b [u8]) -> Result<Message<'b>, String> {
        match header.properties.get(PROTOCOL_TYPE).and_then(Value::as_str).unwrap_or(EVENTMESH_MESSAGE) {
            CLOUDEVENTS => {
                let subject = cloudevents::subject_of(body).map_err(|e| format!("not a CloudEvent in JSON: {e}"))?;
                let topic = subject.unwrap_or_default();
                Ok(Message::CloudEvent { topic, json: body })
            }
            EVENTMESH_MESSAGE => {
                let m: MeshMessage =
                    serde_json::from_slice(body).map_err(|e| format!("not an EventMeshMessage in JSON: {e}"))?;
                if m.topic.as_deref().is_none_or(str::is_empty) {
                    return Err("an EventMeshMessage names its topic".into());
                }
                Ok(Message::Mesh(m))
            }
            "openmessage" => Err("openmessage bodies are not supported (EventMesh converts none either)".into()),
            other => Err(format!("Cannot find the Protocol adaptor: {other}")),
        }
    }

    /// The topic as the client names it (empty: none).
    pub fn topic(&self) -> &str {
        match self {
            Message::CloudEvent { topic, .. } => topic,
            Message::Mesh(m) => m.topic.as_deref().unwrap_or_default(),
        }
    }

    /// The message as a frame for `topic` (its stored name). Every header property becomes an
    /// extension (as the Java resolvers make them), then, for an EventMeshMessage, its own
    /// properties; an EventMeshMessage's `id` is the package's `seq`.
    pub fn to_frame(&self, header: &Header, topic: &str) -> Result<Frame, String> {
        let text = |v: &Value| match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let own = match self {
            Message::Mesh(m) => m.properties.len(),
            Message::CloudEvent { .. } => 0,
        };
        // Before any work: the properties become attributes, at most MAX_ATTRIBUTES of them.
        if header.properties.len() + own > cloudevents::MAX_ATTRIBUTES {
            return Err(format!("a message carries at most {} properties", cloudevents::MAX_ATTRIBUTES));
        }
        // Properties are extensions: none may name a context attribute or `data`.
        for k in header.properties.keys().chain(
            match self {
                Message::Mesh(m) => Some(m.properties.keys()),
                Message::CloudEvent { .. } => None,
            }
            .into_iter()
            .flatten(),
        ) {
            if cloudevents::is_context_attribute(k) || k == "specversion" || k == "data" {
                return Err(format!("property {k} names a CloudEvents attribute, not an extension"));
            }
            cloudevents::check_name(k).map_err(|e| format!("Abnormal propKey: {e}"))?;
        }
        match self {
            Message::CloudEvent { json, .. } => {
                // The header's properties as extensions, in the same encoding (the event's own
                // attributes of the same name win; the whole is checked as any event is).
                let props: Vec<(&str, Cow<'_, str>)> = header
                    .properties
                    .iter()
                    .map(|(k, v)| match v {
                        Value::String(s) => (k.as_str(), Cow::Borrowed(s.as_str())),
                        other => (k.as_str(), Cow::Owned(other.to_string())),
                    })
                    .collect();
                let extra: Vec<(&str, &str)> = props.iter().map(|(k, v)| (*k, v.as_ref())).collect();
                cloudevents::parse_structured_with(topic, json, &extra).map_err(|e| e.to_string())
            }
            Message::Mesh(m) => {
                let id = header.seq.as_deref().filter(|s| !s.is_empty()).ok_or("a message's seq is its id")?;
                let s = |name: &str, v: &str| Attribute { name: name.into(), value: AttrValue::Str(v.into()) };
                let mut attributes = vec![
                    s("specversion", "1.0"),
                    s("id", id),
                    s("source", "/"),
                    s("type", MESH_TYPE),
                    s("subject", self.topic()),
                ];
                if let Some(ct) = m.headers.get("datacontenttype").map(text) {
                    attributes.push(s("datacontenttype", &ct));
                }
                // The message's own properties over the header's (a map: one of each name).
                let mut props: std::collections::BTreeMap<&str, String> = std::collections::BTreeMap::new();
                for (k, v) in header.properties.iter().chain(&m.properties) {
                    props.insert(k.as_str(), text(v));
                }
                attributes.extend(props.into_iter().map(|(k, v)| s(k, &v)));
                cloudevents::check_event(&attributes).map_err(|e| e.to_string())?;
                let data = m.body.clone().unwrap_or_default().into_bytes();
                let kind = if data.is_empty() { DataKind::None } else { DataKind::Text };
                let body = FrameBody { topic: topic.to_owned(), attributes, data };
                Frame::encode(&FrameHeader::event(kind), &body).map_err(|e| e.to_string())
            }
        }
    }
}

/// The CloudEvents `type` of an EventMeshMessage (as EventMesh's resolver names it).
pub const MESH_TYPE: &str = "eventmeshmessage";

/// A stored event as a package to a client: `cmd` with `seq` and the `protocoltype` property,
/// and the event in the protocol its publisher used (its `protocoltype` extension, as the Java
/// server chooses): an EventMeshMessage, or a structured-mode CloudEvent with `extra` among
/// its extensions. `None` for an event past the 4 MiB frame.
pub fn push(frame: &Frame, extra: Extensions<'_>, cmd: Command, seq: &str, code: i32) -> Option<Vec<u8>> {
    let mesh = frame.body().attr_str(PROTOCOL_TYPE) == Some(EVENTMESH_MESSAGE);
    let mut header = Header::new(cmd, code, None, Some(seq));
    let kind = if mesh { EVENTMESH_MESSAGE } else { CLOUDEVENTS };
    header.properties.insert(PROTOCOL_TYPE.into(), Value::String(kind.into()));
    let h = header.to_json();
    let mut out = Vec::with_capacity(FIXED + h.len() + frame.as_bytes().len() + 256);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(VERSION);
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&(h.len() as i32).to_be_bytes());
    out.extend_from_slice(&h);
    match mesh {
        true => mesh_json(frame, extra, &mut out),
        false => cloudevents::write_structured(frame, extra, &mut out),
    }
    if out.len() > MAX_FRAME {
        return None;
    }
    let length = (out.len() - 8) as i32;
    out[PREFIX..PREFIX + 4].copy_from_slice(&length.to_be_bytes());
    Some(out)
}

/// An event as the EventMeshMessage the meshmessage resolver makes of it: `topic` its subject
/// (else its topic), `body` its data as text, `properties` every extension (and `extra`) as a
/// string, `headers` its `datacontenttype`.
fn mesh_json(frame: &Frame, extra: Extensions<'_>, out: &mut Vec<u8>) {
    let body = frame.body();
    let mut properties = Map::new();
    for a in body.attributes.iter() {
        let name = a.name.as_str();
        if cloudevents::is_context_attribute(name) || name == "specversion" {
            continue;
        }
        let v = match &a.value {
            frame_codec::ArchivedAttrValue::Str(s) => s.as_str().to_owned(),
            frame_codec::ArchivedAttrValue::Bool(b) => b.to_string(),
            frame_codec::ArchivedAttrValue::Int(n) => n.to_native().to_string(),
        };
        properties.insert(name.to_owned(), Value::String(v));
    }
    for (name, v) in extra {
        let v = match v {
            AttrValue::Str(s) => s.clone(),
            AttrValue::Bool(b) => b.to_string(),
            AttrValue::Int(n) => n.to_string(),
        };
        properties.insert((*name).to_owned(), Value::String(v));
    }
    let mut m = Map::new();
    let topic = body.attr_str("subject").unwrap_or(body.topic.as_str());
    m.insert("topic".into(), Value::String(topic.to_owned()));
    m.insert("body".into(), Value::String(String::from_utf8_lossy(body.data.as_slice()).into_owned()));
    m.insert("properties".into(), Value::Object(properties));
    if let Some(ct) = body.attr_str("datacontenttype") {
        let mut h = Map::new();
        h.insert("datacontenttype".into(), Value::String(ct.to_owned()));
        m.insert("headers".into(), Value::Object(h));
    }
    serde_json::to_writer(out, &Value::Object(m)).expect("a JSON value writes");
}

/// REDIRECT_TO_CLIENT's body (`RedirectInfo`): where the client should connect instead.
pub fn redirect(ip: &str, port: u16) -> Vec<u8> {
    let body = serde_json::json!({"ip": ip, "port": port}).to_string();
    encode(&Header::new(Command::RedirectToClient, SUCCESS, None, None), body.as_bytes()).expect("a redirect is small")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A frame laid out by hand from `Codec.Encoder.encode`: magic, version, the package length
    /// (13 + header + body), the header length, the header, the body.
    fn java_frame(header: &str, body: &str) -> Vec<u8> {
        let mut f = b"EventMesh0000".to_vec();
        f.extend_from_slice(&((13 + header.len() + body.len()) as u32).to_be_bytes());
        f.extend_from_slice(&(header.len() as u32).to_be_bytes());
        f.extend_from_slice(header.as_bytes());
        f.extend_from_slice(body.as_bytes());
        f
    }

    #[test]
    fn frames_are_byte_for_byte_the_java_codecs() {
        // `new Header(HEARTBEAT_REQUEST, 0, null, "1")`: desc left out (NON_NULL), then the
        // empty properties, then the `command` getter.
        let hb = Header::new(Command::HeartbeatRequest, 0, None, Some("1"));
        let json = r#"{"cmd":"HEARTBEAT_REQUEST","code":0,"seq":"1","properties":{},"command":"HEARTBEAT_REQUEST"}"#;
        let golden = java_frame(json, "");
        assert_eq!(&golden[..21], b"EventMesh0000\x00\x00\x00\x69\x00\x00\x00\x5c");
        assert_eq!(encode(&hb, b"").unwrap(), golden);
        assert_eq!(decode(&golden).unwrap(), Some((Package { header: Some(hb), body: vec![] }, golden.len())));
        // A publish with a CloudEvent body and its protocol properties.
        let mut publish = Header::new(Command::AsyncMessageToServer, 0, None, Some("7"));
        publish.properties.insert("protocoltype".into(), "cloudevents".into());
        let body = r#"{"specversion":"1.0","id":"a","source":"s","type":"t"}"#;
        let json = r#"{"cmd":"ASYNC_MESSAGE_TO_SERVER","code":0,"seq":"7","properties":{"protocoltype":"cloudevents"},"command":"ASYNC_MESSAGE_TO_SERVER"}"#;
        let golden = java_frame(json, body);
        assert_eq!(encode(&publish, body.as_bytes()).unwrap(), golden);
        let (pkg, used) = decode(&golden).unwrap().unwrap();
        assert_eq!((pkg.header.unwrap(), pkg.body, used), (publish, body.as_bytes().to_vec(), golden.len()));
    }

    #[test]
    fn decoding_waits_for_whole_frames_and_refuses_what_java_closes_on() {
        let f = java_frame(r#"{"cmd":"HELLO_REQUEST","code":0,"seq":"9"}"#, r#"{"subsystem":"5023"}"#);
        for cut in 0..f.len() {
            assert_eq!(decode(&f[..cut]).unwrap(), None, "{cut} bytes");
        }
        let mut two = f.clone();
        two.extend_from_slice(&f);
        let (first, used) = decode(&two).unwrap().unwrap();
        assert_eq!((first.header.unwrap().cmd, used), (Command::HelloRequest, f.len()));
        // Another protocol's bytes are refused at once, before any length.
        assert_eq!(decode(b"GET / HTTP/1.1\r\n"), Err(FrameError::Magic));
        assert_eq!(decode(b"EventMesh0001"), Err(FrameError::Magic));
        // A length past 4 MiB, or one that cannot hold its own fields.
        let mut long = b"EventMesh0000".to_vec();
        long.extend_from_slice(&((4 << 20) as u32).to_be_bytes());
        assert_eq!(decode(&long), Err(FrameError::TooLong((4 << 20) + 8)));
        let mut neg = b"EventMesh0000".to_vec();
        neg.extend_from_slice(&(-1i32).to_be_bytes());
        assert_eq!(decode(&neg), Err(FrameError::TooShort(7)));
        // A header length past the frame; a header that is not JSON or has no known cmd.
        let mut past = java_frame("{}", "");
        past[17..21].copy_from_slice(&100u32.to_be_bytes());
        assert!(matches!(decode(&past), Err(FrameError::HeaderLength { header: 100, .. })));
        assert!(matches!(decode(&java_frame("not json", "")), Err(FrameError::Header(_))));
        assert!(matches!(decode(&java_frame(r#"{"cmd":"NOPE"}"#, "")), Err(FrameError::Header(_))));
        // Jackson also takes a command by value, and leaves unknown fields.
        let (pkg, _) = decode(&java_frame(r#"{"cmd":20,"x":1}"#, "b")).unwrap().unwrap();
        assert_eq!((pkg.header.unwrap().cmd, pkg.body), (Command::AsyncMessageToServer, b"b".to_vec()));
        // No header: no body either (as the Java decoder reads it).
        let (pkg, _) = decode(&java_frame("", "ignored")).unwrap().unwrap();
        assert_eq!(pkg, Package { header: None, body: vec![] });
        // The encoder refuses a frame the decoder would refuse.
        let big = vec![b'x'; MAX_FRAME];
        assert!(matches!(
            encode(&Header::new(Command::AsyncMessageToServer, 0, None, None), &big),
            Err(FrameError::TooLong(_))
        ));
    }

    #[test]
    fn every_command_keeps_its_name_and_value() {
        for v in 0..=36u64 {
            let c = Command::from_value(v).unwrap();
            assert_eq!((Command::from_name(c.name()), c as u64), (Some(c), v));
        }
        assert_eq!(Command::from_value(37), None);
    }

    #[test]
    fn messages_become_frames_with_their_properties_as_extensions() {
        let mut h = Header::new(Command::AsyncMessageToServer, 0, None, Some("42"));
        for (k, v) in [("protocoltype", "cloudevents"), ("protocoldesc", "tcp"), ("shop", "header")] {
            h.properties.insert(k.into(), Value::String(v.into()));
        }
        let ce = br#"{"specversion":"1.0","id":"e1","source":"/s","type":"t","subject":"orders","shop":"event","data":{"n":1}}"#;
        let m = Message::parse(&h, ce).unwrap();
        assert_eq!(m.topic(), "orders");
        let f = m.to_frame(&h, "stored.orders").unwrap();
        assert_eq!(f.body().topic.as_str(), "stored.orders");
        assert_eq!(f.body().attr_str("protocoltype"), Some("cloudevents"));
        assert_eq!(f.body().attr_str("shop"), Some("event"), "the event's own attribute wins");
        // An EventMeshMessage: its seq is its id, its own properties over the header's.
        h.properties.insert("protocoltype".into(), Value::String("eventmeshmessage".into()));
        let body = br#"{"topic":"orders","body":"hi","properties":{"shop":"message"},"headers":{"datacontenttype":"text/plain"}}"#;
        let f = Message::parse(&h, body).unwrap().to_frame(&h, "orders").unwrap();
        assert_eq!(f.body().attr_str("id"), Some("42"));
        assert_eq!(f.body().attr_str("shop"), Some("message"));
        assert_eq!(f.body().attr_str("subject"), Some("orders"));
        assert_eq!(f.body().data.as_slice(), b"hi");
        // Pushed back in the form its publisher used.
        let pkg = push(&f, &[], Command::AsyncMessageToClient, "0/0:1:1", SUCCESS).unwrap();
        let (p, _) = decode(&pkg).unwrap().unwrap();
        assert_eq!(p.header.unwrap().properties[PROTOCOL_TYPE], "eventmeshmessage");
        let back: Value = serde_json::from_slice(&p.body).unwrap();
        assert_eq!(back["body"], "hi");
        assert_eq!(back["properties"]["shop"], "message");
        // A property naming a context attribute, or past the cap, is refused.
        h.properties.insert("datacontenttype".into(), Value::String("a\r\nb".into()));
        assert!(Message::parse(&h, body)
            .unwrap()
            .to_frame(&h, "orders")
            .unwrap_err()
            .contains("CloudEvents attribute"));
    }

    #[test]
    fn answers_are_bounded_whatever_the_request_carried() {
        let long = "\u{7f}".repeat(700_000);
        let a = answer(Command::SubscribeResponse, FAIL, &format!("{long:?}"), Some(&long));
        assert!(a.len() < 4096, "{}", a.len());
        let (p, _) = decode(&a).unwrap().unwrap();
        assert!(p.header.unwrap().seq.is_none());
    }
}
