//! The MQTT connectors (MQTT 5, with rumqttc): the IoT edge in and out.
//!
//! * **Source** (`broker` = `host:port` and `topics` = topic filters required; `client_id`
//!   = `evmesh-connect-<name>`, `username`, `password`, `source` = `mqtt://<broker>`, `type` =
//!   `evmesh.connect.mqtt.message`, `keep_alive_secs` = 30, `session_expiry_secs` = 86400,
//!   `receive_maximum` = 1000, `max_message_bytes` = 1 MiB): subscribes at QoS 1 in a session the broker keeps while the
//!   connector is away (clean start off), and acknowledges (PUBACK) a message only once it is in
//!   evmesh and committed: a message is never lost by a crash, the broker sends it again. A
//!   message in the CloudEvents MQTT binding is that event (binary mode: the attributes as user
//!   properties, the data's type as the content type; structured: content type
//!   `application/cloudevents+json`), so its duplicates carry its producer's id. Any other
//!   becomes the `data` of an event with `subject` and `partitionkey` = the message's topic
//!   (evmesh keeps each topic's order) and an id the connector makes: MQTT messages have no
//!   identity, so a message the broker sends again after a crash (or after a PUBACK lost with
//!   the connection) is published again with a new id. A resent message the connector still
//!   holds (same packet id, not yet acknowledged), or one committed while the connection was
//!   down, is not published twice; an acknowledgement is sent only in the session its message
//!   came in (a new session's packet ids are other messages'). It subscribes on every connect
//!   (a session can outlive its subscriptions); a grant below QoS 1 or a refused login fails
//!   the connector. The position shown is the count of messages committed; the session is the
//!   broker's. `max_message_bytes` is announced as the client's maximum packet size: the broker
//!   does not send a larger message to it (MQTT 5 drops it for this client), so one message
//!   cannot stall the source by breaking its connection over and over, and at most
//!   `receive_maximum` x `max_message_bytes` is held.
//! * **Sink** (`broker`, `topic` required; `client_id`, `username`, `password`, `mode` =
//!   `binary` | `structured`, `retain` = false, `keep_alive_secs`, `ack_timeout_ms` = 10 s):
//!   publishes each event at QoS 1 (binary mode: attributes as user properties, without the
//!   delivery's extensions); a batch is done when the broker acknowledged every message. A
//!   message over the broker's maximum packet size, or one it refuses for itself (PUBACK
//!   `payload format invalid`), goes to the dead-letter topic; `not authorized` and `topic
//!   name invalid` stop the connector (they are the configuration's); anything else is
//!   retried on a new connection. MQTT consumers dedupe on the `id` and `source` properties.
//!
//! TLS and MQTT 3.1.1 are not offered: the broker must speak MQTT 5 on a plain listener. A
//! broker limit it does not announce (mosquitto's `message_size_limit`, unlike
//! `max_packet_size`) makes rumqttc drop the connection on the refusal, so such a message is
//! retried, not dead-lettered.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::Ordering;
use std::time::Duration;

use async_trait::async_trait;
use cloudevents::{AttributesReader, Event, EventBuilder, EventBuilderV10};
use rumqttc::v5::mqttbytes::v5::{PubAckReason, Publish, PublishProperties};
use rumqttc::v5::mqttbytes::QoS;
use serde_json::json;

mod connection;

use connection::{common, Common, Connection, Note};

use super::{binding, key, only_keys, undelivered, with_position};
use crate::spi::{ConnectError, Position, Sink, SinkError, Source, SourceRecord};

/// The MQTT source (see the module doc).
pub struct MqttSource {
    common: Common,
    filters: Vec<String>,
    source: String,
    ty: String,
    session_expiry: u32,
    receive_maximum: u16,
    /// The largest packet taken (announced in CONNECT: the broker does not send one larger).
    max_message: u32,
    conn: Option<Connection>,
    /// The broker's session the notes are in now.
    session: u64,
    /// Messages published or being published, not committed yet, in the order received: by
    /// number, with the session they came in.
    held: VecDeque<(u64, Publish, u64)>,
    /// Packet ids of `held` (a message sent again, `dup`, is one held already).
    holding: HashSet<u16>,
    /// Packet ids of messages committed while the connection was down: acknowledged when the
    /// broker sends them again in the same session, not published twice.
    owed: HashSet<u16>,
    refused: Option<String>,
    /// Messages committed before this open, and numbered since.
    committed: u64,
    numbered: u64,
    /// This open's own, in the ids it makes.
    nonce: u64,
    down: Option<String>,
}

impl MqttSource {
    pub fn new(config: &toml::Table, name: &str) -> Result<MqttSource, ConnectError> {
        only_keys(
            config,
            &[
                "broker",
                "topics",
                "client_id",
                "username",
                "password",
                "source",
                "type",
                "keep_alive_secs",
                "session_expiry_secs",
                "receive_maximum",
                "max_message_bytes",
            ],
        )?;
        let common = common(config, name)?;
        let filters: Vec<String> = key(config, "topics", toml::Value::as_array, "an array of topic filters")?
            .ok_or_else(|| ConnectError::Fatal("config.topics: the topic filters to subscribe to are required".into()))?
            .iter()
            .map(|t| t.as_str().filter(|t| !t.is_empty()).map(str::to_owned))
            .collect::<Option<_>>()
            .filter(|f: &Vec<String>| !f.is_empty())
            .ok_or_else(|| ConnectError::Fatal("config.topics: non-empty topic filters".into()))?;
        let source = key(config, "source", toml::Value::as_str, "a URI-reference")?
            .map_or_else(|| format!("mqtt://{}:{}", common.host, common.port), str::to_owned);
        let ty =
            key(config, "type", toml::Value::as_str, "a string")?.unwrap_or("evmesh.connect.mqtt.message").to_owned();
        let session_expiry = key(config, "session_expiry_secs", toml::Value::as_integer, "seconds")?.unwrap_or(86400);
        let receive_maximum = key(config, "receive_maximum", toml::Value::as_integer, "1 to 1000")?.unwrap_or(1000);
        let (Ok(session_expiry), Ok(receive_maximum)) = (u32::try_from(session_expiry), u16::try_from(receive_maximum))
        else {
            return Err(ConnectError::Fatal("config.session_expiry_secs or receive_maximum: out of range".into()));
        };
        // Each message held is at most one acknowledgement queued: well within the requests.
        if !(1..=1000).contains(&receive_maximum) {
            return Err(ConnectError::Fatal("config.receive_maximum: 1 to 1000".into()));
        }
        let max_message = key(config, "max_message_bytes", toml::Value::as_integer, "bytes")?.unwrap_or(1 << 20);
        let max_message = u32::try_from(max_message)
            .ok()
            .filter(|m| (1024..=16 << 20).contains(m))
            .ok_or_else(|| ConnectError::Fatal("config.max_message_bytes: 1 KiB to 16 MiB".into()))?;
        Ok(MqttSource {
            common,
            filters,
            source,
            ty,
            session_expiry,
            receive_maximum,
            max_message,
            conn: None,
            session: 0,
            held: VecDeque::new(),
            holding: HashSet::new(),
            owed: HashSet::new(),
            refused: None,
            committed: 0,
            numbered: 0,
            nonce: 0,
            down: None,
        })
    }

    /// A message as an event (see the module doc); `n`: its number in this open.
    fn event(&self, p: &Publish, n: u64) -> Event {
        let props = p.properties.as_ref();
        let ct = props.and_then(|p| p.content_type.as_deref());
        if ct.is_some_and(|c| c.starts_with("application/cloudevents+json")) {
            if let Ok(e) = serde_json::from_slice::<Event>(&p.payload) {
                return e;
            }
        }
        if let Some(props) = props.filter(|p| p.user_properties.iter().any(|(k, _)| k == "specversion")) {
            let attributes = props.user_properties.iter().map(|(k, v)| (k.as_str(), v.as_str()));
            if let Ok(e) = binding::from_binary("", attributes, ct, &p.payload) {
                return e;
            }
        }
        let topic = String::from_utf8_lossy(&p.topic).into_owned();
        let b = EventBuilderV10::new()
            .id(format!("mqtt-{:016x}-{n}", self.nonce))
            .source(self.source.as_str())
            .ty(self.ty.as_str())
            .subject(topic.as_str())
            .extension("partitionkey", topic);
        binding::with_plain_data(b, ct, &p.payload).build().expect("id, source and type are set")
    }

    /// Acknowledges every held message numbered below `n`, in order: now if the connection is
    /// up in its session, when the broker sends it again if down (same session), never if the
    /// session is gone (the broker forgot it).
    fn ack_below(&mut self, n: u64) -> Result<(), ConnectError> {
        let Some(conn) = &self.conn else { return Ok(()) };
        while let Some((m, p, session)) = self.held.front() {
            if *m >= n {
                break;
            }
            if conn.live.load(Ordering::SeqCst) == *session {
                // Taken off only once queued: a full queue leaves it (and the order) for later.
                conn.client.try_ack(p).map_err(|e| ConnectError::Transient(format!("mqtt ack: {e}")))?;
            } else if *session == self.session {
                self.owed.insert(p.pkid);
            }
            self.holding.remove(&p.pkid);
            self.held.pop_front();
        }
        Ok(())
    }

    /// Takes one note of the connection; a new message is numbered and added to `out`.
    fn note(&mut self, note: Note, out: &mut Vec<SourceRecord>) {
        match note {
            Note::Up { session, .. } => {
                self.down = None;
                if session != self.session {
                    // Another session: the broker forgot what it sent; nothing of it is owed.
                    (self.session, self.holding, self.owed) = (session, HashSet::new(), HashSet::new());
                }
            }
            Note::Down(why) => self.down = Some(why),
            Note::Refused(why) => self.refused = Some(why),
            Note::Publish(p) => {
                let acked = p.qos != QoS::AtMostOnce;
                if acked && p.dup {
                    if self.owed.contains(&p.pkid) {
                        // Committed already: its acknowledgement was lost with a connection.
                        // Sent only while the connection is up in this session (else it stays
                        // owed, for the next resend).
                        if let Some(conn) = &self.conn {
                            if conn.live.load(Ordering::SeqCst) == self.session && conn.client.try_ack(&p).is_ok() {
                                self.owed.remove(&p.pkid);
                            }
                        }
                        return;
                    }
                    if self.holding.contains(&p.pkid) {
                        return; // held already: being published
                    }
                }
                let n = self.numbered;
                self.numbered += 1;
                let event = self.event(&p, n);
                if acked {
                    self.holding.insert(p.pkid);
                    self.held.push_back((n, p, self.session));
                }
                let position = json!({ "committed": self.committed + n + 1 });
                out.push(SourceRecord { event: with_position(event, &position), position });
            }
            Note::Sent(_) | Note::Acked(..) => {}
        }
    }
}

#[async_trait]
impl Source for MqttSource {
    async fn open(&mut self, from: Option<Position>) -> Result<(), ConnectError> {
        self.close().await;
        self.committed = from.as_ref().and_then(|p| p.get("committed")?.as_u64()).unwrap_or(0);
        (self.numbered, self.nonce, self.down, self.refused, self.session) = (0, fastrand::u64(..), None, None, 0);
        let mut o = self.common.options();
        o.set_clean_start(false)
            .set_session_expiry_interval(Some(self.session_expiry))
            .set_manual_acks(true)
            .set_receive_maximum(Some(self.receive_maximum))
            .set_max_packet_size(Some(self.max_message));
        let notes = usize::from(self.receive_maximum) + 64;
        self.conn = Some(Connection::open(o, self.filters.clone(), notes));
        Ok(())
    }

    async fn poll(&mut self, max: usize, wait: Duration) -> Result<Vec<SourceRecord>, ConnectError> {
        let mut out = Vec::new();
        let until = tokio::time::Instant::now() + wait;
        while out.len() < max {
            let Some(conn) = &mut self.conn else { break };
            let note = match conn.notes.try_recv() {
                Ok(n) => n,
                Err(_) if !out.is_empty() => break,
                Err(_) => match tokio::time::timeout_at(until, conn.notes.recv()).await {
                    Ok(Some(n)) => n,
                    _ => break,
                },
            };
            self.note(note, &mut out);
        }
        match (&self.refused, &self.down, out.is_empty()) {
            (Some(why), _, _) => Err(ConnectError::Fatal(why.clone())),
            (_, Some(why), true) => Err(ConnectError::Transient(why.clone())),
            _ => Ok(out),
        }
    }

    async fn commit(&mut self, position: &Position) -> Result<(), ConnectError> {
        let Some(committed) = position.get("committed").and_then(|c| c.as_u64()) else { return Ok(()) };
        self.ack_below(committed.saturating_sub(self.committed))
    }

    async fn close(&mut self) {
        // The acknowledgements queued go out before the DISCONNECT; the messages not
        // acknowledged stay with the broker's session, sent again on the next open.
        if let Some(c) = self.conn.take() {
            c.close().await;
        }
        self.held.clear();
        self.holding.clear();
        self.owed.clear();
    }
}

/// The MQTT sink (see the module doc).
pub struct MqttSink {
    common: Common,
    topic: String,
    structured: bool,
    retain: bool,
    ack_timeout: Duration,
    conn: Option<Connection>,
    max_packet: Option<u32>,
    /// Events of the batch being put that the broker acknowledged (a retry skips them).
    done: HashSet<(String, String)>,
}

impl MqttSink {
    pub fn new(config: &toml::Table, name: &str) -> Result<MqttSink, ConnectError> {
        only_keys(
            config,
            &[
                "broker",
                "topic",
                "client_id",
                "username",
                "password",
                "mode",
                "retain",
                "keep_alive_secs",
                "ack_timeout_ms",
            ],
        )?;
        let common = common(config, name)?;
        let topic = key(config, "topic", toml::Value::as_str, "an MQTT topic")?
            .filter(|t| !t.is_empty() && !t.contains(['+', '#']))
            .ok_or_else(|| ConnectError::Fatal("config.topic: the MQTT topic (no wildcards) is required".into()))?
            .to_owned();
        let structured = match key(config, "mode", toml::Value::as_str, "binary or structured")? {
            None | Some("binary") => false,
            Some("structured") => true,
            Some(m) => return Err(ConnectError::Fatal(format!("config.mode {m:?}: binary or structured"))),
        };
        let retain = key(config, "retain", toml::Value::as_bool, "true or false")?.unwrap_or(false);
        let ms = key(config, "ack_timeout_ms", toml::Value::as_integer, "milliseconds")?.unwrap_or(10_000);
        if !(100..=600_000).contains(&ms) {
            return Err(ConnectError::Fatal("config.ack_timeout_ms: 100 to 600000".into()));
        }
        let ack_timeout = Duration::from_millis(ms as u64);
        Ok(MqttSink {
            common,
            topic,
            structured,
            retain,
            ack_timeout,
            conn: None,
            max_packet: None,
            done: HashSet::new(),
        })
    }

    /// Connects if not connected, waiting for the broker's answer.
    async fn connected(&mut self) -> Result<(), ConnectError> {
        if self.conn.is_some() {
            return Ok(());
        }
        let mut o = self.common.options();
        o.set_clean_start(true);
        let mut conn = Connection::open(o, Vec::new(), 256);
        match tokio::time::timeout(self.ack_timeout, conn.notes.recv()).await {
            Ok(Some(Note::Up { max_packet, .. })) => {
                self.max_packet = max_packet;
                self.conn = Some(conn);
                Ok(())
            }
            Ok(Some(Note::Down(why))) => Err(ConnectError::Transient(why)),
            Ok(Some(Note::Refused(why))) => Err(ConnectError::Fatal(why)),
            _ => Err(ConnectError::Transient("mqtt: no answer to CONNECT".into())),
        }
    }

    async fn put_with(&mut self, events: &[Event]) -> Result<(), SinkError> {
        // What happened while idle: a connection lost (and perhaps found again) is a new one
        // now, rather than a batch published into it and failed.
        let mut lost = false;
        while let Some(note) = self.conn.as_mut().and_then(|c| c.notes.try_recv().ok()) {
            match note {
                Note::Down(_) => lost = true,
                Note::Refused(why) => return Err(ConnectError::Fatal(why).into()),
                Note::Up { max_packet, .. } => (self.max_packet, lost) = (max_packet, false),
                _ => {}
            }
        }
        if lost {
            self.conn = None;
        }
        self.connected().await?;
        let conn = self.conn.as_mut().expect("connected");
        // The events published, in order; packet id -> index once sent.
        let mut published = VecDeque::new();
        let mut by_pkid = HashMap::new();
        let mut refused = None;
        for (i, e) in events.iter().enumerate() {
            let e = undelivered(e);
            if self.done.contains(&(e.source().to_string(), e.id().to_owned())) {
                continue;
            }
            let (payload, props, size) = message(self.structured, &self.topic, &e);
            if self.max_packet.is_some_and(|m| size > m as usize) {
                refused = Some((i, format!("mqtt: {size} bytes is over the broker's maximum packet size")));
                break;
            }
            conn.client
                .publish_with_properties(self.topic.clone(), QoS::AtLeastOnce, self.retain, payload, props)
                .await
                .map_err(|e| ConnectError::Transient(format!("mqtt publish: {e}")))?;
            published.push_back((i, (e.source().to_string(), e.id().to_owned())));
        }
        let mut waiting = published.len();
        let until = tokio::time::Instant::now() + self.ack_timeout;
        while waiting > 0 {
            let note = match tokio::time::timeout_at(until, conn.notes.recv()).await {
                Ok(Some(n)) => n,
                Ok(None) | Err(_) => return Err(ConnectError::Transient("mqtt: no PUBACK in time".into()).into()),
            };
            match note {
                Note::Sent(pkid) => {
                    if let Some(sent) = published.pop_front() {
                        by_pkid.insert(pkid, sent);
                    }
                }
                Note::Acked(pkid, reason) => {
                    let Some((i, key)) = by_pkid.remove(&pkid) else { continue };
                    waiting -= 1;
                    match reason {
                        PubAckReason::Success | PubAckReason::NoMatchingSubscribers => {
                            self.done.insert(key);
                        }
                        PubAckReason::PayloadFormatInvalid => {
                            if refused.as_ref().is_none_or(|(r, _)| i < *r) {
                                refused = Some((i, format!("mqtt: the broker refused it ({reason:?})")));
                            }
                        }
                        PubAckReason::NotAuthorized | PubAckReason::TopicNameInvalid => {
                            return Err(ConnectError::Fatal(format!("mqtt topic {}: {reason:?}", self.topic)).into());
                        }
                        other => {
                            return Err(ConnectError::Transient(format!("mqtt: PUBACK {other:?}")).into());
                        }
                    }
                }
                Note::Down(why) => return Err(ConnectError::Transient(why).into()),
                Note::Refused(why) => return Err(ConnectError::Fatal(why).into()),
                Note::Up { .. } | Note::Publish(_) => {}
            }
        }
        match refused {
            Some((index, reason)) => Err(SinkError::Refused { index, reason }),
            None => Ok(()),
        }
    }
}

/// `event` as a message: its payload and properties, and a size it is surely not over.
fn message(structured: bool, topic: &str, event: &Event) -> (Vec<u8>, PublishProperties, usize) {
    let mut props = PublishProperties::default();
    let payload = if structured {
        props.content_type = Some("application/cloudevents+json".into());
        serde_json::to_vec(event).expect("an event serializes")
    } else {
        let b = binding::to_binary(event);
        props.content_type = b.content_type;
        props.user_properties = b.attributes;
        b.data
    };
    let props_len: usize = props.user_properties.iter().map(|(k, v)| k.len() + v.len() + 5).sum::<usize>()
        + props.content_type.as_ref().map_or(0, |c| c.len() + 3);
    let size = payload.len() + props_len + topic.len() + 32;
    (payload, props, size)
}

#[async_trait]
impl Sink for MqttSink {
    async fn open(&mut self) -> Result<(), ConnectError> {
        self.conn = None;
        self.done.clear();
        self.connected().await
    }

    async fn put(&mut self, events: &[Event]) -> Result<(), SinkError> {
        let put = self.put_with(events).await;
        if let Err(SinkError::Failed(_)) = &put {
            // Whatever the connection still had queued is dropped with it: the retry publishes
            // afresh on a new one (skipping what was acknowledged).
            self.conn = None;
        }
        put
    }

    async fn flush(&mut self) -> Result<(), ConnectError> {
        self.done.clear();
        Ok(())
    }

    async fn close(&mut self) {
        if let Some(c) = self.conn.take() {
            c.close().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(s: &str) -> toml::Table {
        s.parse().unwrap()
    }

    fn refused(r: Result<impl Sized, ConnectError>) -> String {
        match r {
            Err(ConnectError::Fatal(e)) => e,
            Err(e) => panic!("not fatal: {e}"),
            Ok(_) => panic!("taken"),
        }
    }

    #[test]
    fn a_mistake_in_the_config_names_its_key() {
        let ok = "broker = \"127.0.0.1:1883\"\ntopics = [\"a/#\"]";
        let s = MqttSource::new(&table(ok), "in").unwrap();
        assert_eq!(
            (s.common.client_id.as_str(), s.common.port, s.source.as_str()),
            ("evmesh-connect-in", 1883, "mqtt://127.0.0.1:1883")
        );
        assert!(refused(MqttSource::new(&table("broker = \"h\"\ntopics = [\"a\"]"), "in")).starts_with("config.broker"));
        assert!(refused(MqttSource::new(&table("broker = \"h:1\"\ntopics = []"), "in")).starts_with("config.topics"));
        assert!(refused(MqttSource::new(&table("broker = \"h:1\"\ntopics = [\"a\"]\nreceive_maximum = 0"), "in"))
            .starts_with("config.receive_maximum"));
        assert!(refused(MqttSink::new(&table("broker = \"h:1\"\ntopic = \"a/#\""), "out")).starts_with("config.topic"));
        assert!(refused(MqttSink::new(&table("broker = \"h:1\"\ntopic = \"a\"\nmode = \"x\""), "out"))
            .starts_with("config.mode"));
        assert!(refused(MqttSink::new(&table("broker = \"h:1\"\ntopic = \"a\"\npassword = \"p\""), "out"))
            .starts_with("config.password"));
        assert!(
            refused(MqttSink::new(&table("broker = \"h:1\"\ntopic = \"a\"\nqos = 2"), "out")).starts_with("config.qos")
        );
    }

    #[test]
    fn a_message_is_sized_at_least_as_its_packet() {
        let e: Event = serde_json::from_value(
            json!({"specversion": "1.0", "id": "1", "source": "/s", "type": "t", "data": {"a": "x".repeat(100)}}),
        )
        .unwrap();
        let (payload, props, size) = message(false, "out/t", &e);
        // PUBLISH: fixed header (<= 5), topic (2 + len), packet id (2), properties (<= 4 + each).
        let props_len: usize = props.user_properties.iter().map(|(k, v)| 1 + 2 + k.len() + 2 + v.len()).sum::<usize>()
            + props.content_type.map_or(0, |c| 1 + 2 + c.len());
        assert!(size >= 5 + 2 + "out/t".len() + 2 + 4 + props_len + payload.len(), "{size}");
    }
}
