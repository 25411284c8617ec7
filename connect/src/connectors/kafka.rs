//! The Kafka connectors: any Kafka topic in or out (not evmesh's own log: these are a
//! client's, as Kafka Connect's are), with rdkafka.
//!
//! * **Source** (`brokers`, `topic` required; `start` = `earliest` | `latest`,
//!   `[config.properties]` for librdkafka): every partition the topic has when the connector
//!   opens is read with `assign()` from the stored position (`{"partitions": {"<p>": <next
//!   offset>}}`), else from `start`; no consumer group, nothing committed to Kafka (the
//!   position is the runtime's, stored after evmesh's 202). A record in the CloudEvents Kafka
//!   binding is that event (binary mode: `ce_*` headers, `content-type`; structured:
//!   `content-type: application/cloudevents+json`); any other becomes the `data` of an event
//!   with `id = "<topic>-<partition>-<offset>"` (the same on every re-read), `source =
//!   "kafka:<topic>"`, `type = "evmesh.connect.kafka.record"` and the record's key, if UTF-8,
//!   as `partitionkey` (so evmesh keeps a key's order). Partitions added while it runs are
//!   read after a restart.
//! * **Sink** (`brokers`, `topic` required; `[config.properties]`): each event is produced in
//!   the binary binding (`ce_*` headers, `content-type`, key = `partitionkey`, value = the
//!   data), with `acks=all` and the idempotent producer; a batch is done when Kafka
//!   acknowledged every record. A record Kafka refuses for itself (too large) goes to the
//!   dead-letter topic; anything else is retried. Kafka consumers dedupe on `ce_id` and
//!   `ce_source` (a crash between Kafka's ack and evmesh's sends the event again).
//!
//! rdkafka's calls block: they run with `block_in_place` on the runtime's worker threads.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use cloudevents::event::ExtensionValue;
use cloudevents::{Event, EventBuilder, EventBuilderV10};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, ProducerContext, ThreadedProducer};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use serde_json::json;
use tokio::sync::oneshot;

use super::{binding, key, only_keys, undelivered, with_position};
use crate::spi::{ConnectError, Position, Sink, SinkError, Source, SourceRecord};

/// How long the lag probe waits for a partition's watermarks: it runs in the poll loop, so a
/// broker that does not answer holds the loop (and a pause) at most this long per probe.
const LAG_WAIT: Duration = Duration::from_secs(1);

/// The group id librdkafka wants even for `assign()`: never joined, never committed to.
const NO_GROUP: &str = "evmesh-connect-assign-only";

/// `brokers`, `topic` and `properties`, as both connectors take them.
struct Common {
    client: ClientConfig,
    topic: String,
}

fn common(config: &toml::Table) -> Result<Common, ConnectError> {
    let brokers = key(config, "brokers", toml::Value::as_str, "host:port[,host:port...]")?
        .ok_or_else(|| ConnectError::Fatal("config.brokers: the Kafka bootstrap servers are required".into()))?;
    let topic = key(config, "topic", toml::Value::as_str, "a Kafka topic")?
        .filter(|t| !t.is_empty())
        .ok_or_else(|| ConnectError::Fatal("config.topic: the Kafka topic is required".into()))?;
    let mut client = ClientConfig::new();
    client.set("bootstrap.servers", brokers);
    if let Some(t) = key(config, "properties", toml::Value::as_table, "a table of librdkafka settings")? {
        for (k, v) in t {
            let v = match v {
                toml::Value::String(s) => s.clone(),
                toml::Value::Integer(n) => n.to_string(),
                toml::Value::Boolean(b) => b.to_string(),
                toml::Value::Float(f) => f.to_string(),
                _ => return Err(ConnectError::Fatal(format!("config.properties.{k}: a string, number or boolean"))),
            };
            client.set(k, v);
        }
    }
    Ok(Common { client, topic: topic.to_owned() })
}

fn transient(what: &str, e: KafkaError) -> ConnectError {
    ConnectError::Transient(format!("kafka {what}: {e}"))
}

/// The Kafka source (see the module doc).
pub struct KafkaSource {
    common: Common,
    latest: bool,
    consumer: Option<BaseConsumer>,
    /// The next offset of each partition read.
    next: BTreeMap<i32, i64>,
    /// The partitions assigned.
    partitions: Vec<i32>,
}

impl KafkaSource {
    pub fn new(config: &toml::Table) -> Result<KafkaSource, ConnectError> {
        only_keys(config, &["brokers", "topic", "start", "properties"])?;
        let latest = match key(config, "start", toml::Value::as_str, "earliest or latest")? {
            None | Some("earliest") => false,
            Some("latest") => true,
            Some(s) => return Err(ConnectError::Fatal(format!("config.start {s:?}: earliest or latest"))),
        };
        Ok(KafkaSource {
            common: common(config)?,
            latest,
            consumer: None,
            next: BTreeMap::new(),
            partitions: Vec::new(),
        })
    }

    /// The next offset of each partition, as a position.
    fn position(&self) -> Position {
        json!({ "partitions": self.next.iter().map(|(p, o)| (p.to_string(), json!(o))).collect::<serde_json::Map<_, _>>() })
    }

    /// A record as an event (see the module doc).
    fn event(&self, m: &BorrowedMessage<'_>) -> Option<Event> {
        let headers: Vec<(&str, &[u8])> =
            m.headers().map(|h| h.iter().map(|h| (h.key, h.value.unwrap_or(&[]))).collect()).unwrap_or_default();
        let header =
            |name: &str| headers.iter().find(|(k, _)| *k == name).and_then(|(_, v)| std::str::from_utf8(v).ok());
        let value = m.payload().unwrap_or(&[]);
        let ct = header("content-type");
        if ct.is_some_and(|c| c.starts_with("application/cloudevents+json")) {
            if let Ok(e) = serde_json::from_slice::<Event>(value) {
                return Some(e);
            }
        }
        if header("ce_specversion").is_some() {
            let attributes =
                headers.iter().filter_map(|(k, v)| Some((k.strip_prefix("ce_")?, std::str::from_utf8(v).ok()?)));
            if let Ok(e) = binding::from_binary("ce_", attributes, ct, value) {
                return Some(e);
            }
        }
        let id = format!("{}-{}-{}", self.common.topic, m.partition(), m.offset());
        let mut b = EventBuilderV10::new()
            .id(id)
            .source(format!("kafka:{}", self.common.topic))
            .ty("evmesh.connect.kafka.record");
        if let Some(k) = m.key().and_then(|k| std::str::from_utf8(k).ok()) {
            b = b.extension("partitionkey", k);
        }
        binding::with_plain_data(b, ct, value).build().ok()
    }
}

#[async_trait]
impl Source for KafkaSource {
    async fn open(&mut self, from: Option<Position>) -> Result<(), ConnectError> {
        self.consumer = None;
        let mut cc = self.common.client.clone();
        if cc.get("auto.offset.reset").is_none() {
            // A stored offset out of range (retention, a topic made again): from the oldest
            // record kept, never silently past what is still there.
            cc.set("auto.offset.reset", "earliest");
        }
        cc.set("group.id", NO_GROUP)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "false");
        let consumer: BaseConsumer = cc.create().map_err(|e| ConnectError::Fatal(format!("kafka consumer: {e}")))?;
        let topic = self.common.topic.clone();
        let md = tokio::task::block_in_place(|| consumer.fetch_metadata(Some(&topic), Duration::from_secs(10)))
            .map_err(|e| transient("metadata", e))?;
        let partitions: Vec<i32> = md
            .topics()
            .iter()
            .filter(|t| t.name() == topic && t.error().is_none())
            .flat_map(|t| t.partitions().iter().map(|p| p.id()))
            .collect();
        if partitions.is_empty() {
            return Err(ConnectError::Transient(format!("kafka topic {topic}: not there (yet)")));
        }
        let stored: BTreeMap<i32, i64> = from
            .as_ref()
            .and_then(|p| p.get("partitions")?.as_object().cloned())
            .map(|m| m.iter().filter_map(|(k, v)| Some((k.parse().ok()?, v.as_i64()?))).collect())
            .unwrap_or_default();
        let mut list = TopicPartitionList::new();
        let mut next = stored.clone();
        for p in &partitions {
            let at = match stored.get(p) {
                Some(o) => Offset::Offset(*o),
                // `latest` is the end as it is now, made a position: records written while the
                // connector is paused or restarting are read, not skipped by a later "end".
                None if self.latest => {
                    let (_, high) =
                        tokio::task::block_in_place(|| consumer.fetch_watermarks(&topic, *p, Duration::from_secs(10)))
                            .map_err(|e| transient("watermarks", e))?;
                    next.insert(*p, high);
                    Offset::Offset(high)
                }
                None => Offset::Beginning,
            };
            list.add_partition_offset(&topic, *p, at).map_err(|e| transient("assign", e))?;
        }
        consumer.assign(&list).map_err(|e| transient("assign", e))?;
        (self.next, self.partitions) = (next, partitions);
        self.consumer = Some(consumer);
        Ok(())
    }

    async fn poll(&mut self, max: usize, wait: Duration) -> Result<Vec<SourceRecord>, ConnectError> {
        let Some(consumer) = self.consumer.take() else { return Ok(Vec::new()) };
        let mut out = Vec::new();
        let mut failed = None;
        tokio::task::block_in_place(|| {
            let mut wait = wait;
            while out.len() < max {
                match consumer.poll(wait) {
                    None => break,
                    Some(Err(e)) => {
                        failed = Some(transient("fetch", e));
                        break;
                    }
                    Some(Ok(m)) => {
                        self.next.insert(m.partition(), m.offset() + 1);
                        let position = self.position();
                        if let Some(event) = self.event(&m) {
                            let at = json!({ "partition": m.partition(), "offset": m.offset() });
                            out.push(SourceRecord { event: with_position(event, &at), position });
                        }
                    }
                }
                wait = Duration::ZERO;
            }
        });
        self.consumer = Some(consumer);
        match (failed, out.is_empty()) {
            (Some(e), true) => Err(e),
            _ => Ok(out),
        }
    }

    async fn start_position(&mut self) -> Option<Position> {
        self.latest.then(|| self.position())
    }

    async fn lag(&mut self) -> Option<serde_json::Value> {
        // Each partition's high watermark past the next offset to read (its low one when none
        // was read yet).
        let consumer = self.consumer.as_ref()?;
        let topic = &self.common.topic;
        let mut records = 0;
        for p in &self.partitions {
            let (low, high) = tokio::task::block_in_place(|| consumer.fetch_watermarks(topic, *p, LAG_WAIT)).ok()?;
            records += (high - self.next.get(p).copied().unwrap_or(low)).max(0);
        }
        Some(json!({ "records": records }))
    }

    async fn close(&mut self) {
        self.consumer = None;
    }
}

type Acked = Result<(), (bool, String)>;

/// Hands each delivery report to the put that waits for it: `(too large, why)` on failure.
struct Reports;

impl ClientContext for Reports {}

impl ProducerContext for Reports {
    type DeliveryOpaque = Box<oneshot::Sender<Acked>>;

    fn delivery(&self, result: &DeliveryResult<'_>, waiter: Self::DeliveryOpaque) {
        let r = match result {
            Ok(_) => Ok(()),
            Err((e, _)) => Err((too_large(e), e.to_string())),
        };
        let _ = waiter.send(r);
    }
}

fn too_large(e: &KafkaError) -> bool {
    matches!(e.rdkafka_error_code(), Some(RDKafkaErrorCode::MessageSizeTooLarge))
}

/// The Kafka sink (see the module doc).
pub struct KafkaSink {
    common: Common,
    producer: Option<ThreadedProducer<Reports>>,
}

impl KafkaSink {
    pub fn new(config: &toml::Table) -> Result<KafkaSink, ConnectError> {
        only_keys(config, &["brokers", "topic", "properties"])?;
        Ok(KafkaSink { common: common(config)?, producer: None })
    }
}

#[async_trait]
impl Sink for KafkaSink {
    async fn open(&mut self) -> Result<(), ConnectError> {
        let mut pc = self.common.client.clone();
        pc.set("acks", "all").set("enable.idempotence", "true");
        if pc.get("message.timeout.ms").is_none() {
            pc.set("message.timeout.ms", "10000");
        }
        let p = pc.create_with_context(Reports).map_err(|e| ConnectError::Fatal(format!("kafka producer: {e}")))?;
        self.producer = Some(p);
        Ok(())
    }

    async fn put(&mut self, events: &[Event]) -> Result<(), SinkError> {
        if self.producer.is_none() {
            self.open().await?;
        }
        let put = self.put_with(events).await;
        if let Err(SinkError::Failed(_)) = &put {
            // After a timed-out batch the idempotent producer may be fenced for good
            // (ProducerFenced): the next try gets a new producer.
            self.producer = None;
        }
        put
    }

    async fn flush(&mut self) -> Result<(), ConnectError> {
        Ok(())
    }

    async fn close(&mut self) {
        self.producer = None;
    }
}

impl KafkaSink {
    /// Produces `events` and waits for every report.
    async fn put_with(&self, events: &[Event]) -> Result<(), SinkError> {
        let producer = self.producer.as_ref().ok_or_else(|| ConnectError::Transient("not open".into()))?;
        let mut waiting = Vec::with_capacity(events.len());
        for (i, e) in events.iter().enumerate() {
            let e = undelivered(e);
            let b = binding::to_binary(&e);
            let mut headers = OwnedHeaders::new();
            for (name, v) in &b.attributes {
                headers = headers.insert(Header { key: &format!("ce_{name}"), value: Some(v) });
            }
            if let Some(ct) = &b.content_type {
                headers = headers.insert(Header { key: "content-type", value: Some(ct) });
            }
            let value = b.data;
            let key = match e.extension("partitionkey") {
                Some(ExtensionValue::String(k)) => Some(k.clone()),
                _ => None,
            };
            let (tx, rx) = oneshot::channel();
            let mut rec = BaseRecord::<String, [u8], _>::with_opaque_to(&self.common.topic, Box::new(tx))
                .payload(&value[..])
                .headers(headers);
            if let Some(k) = &key {
                rec = rec.key(k);
            }
            if let Err((err, _)) = producer.send(rec) {
                // Those before it are on their way: all their reports waited for first.
                let before = all_acked(waiting).await;
                if too_large(&err) {
                    before?;
                    return Err(SinkError::Refused { index: i, reason: format!("kafka: {err}") });
                }
                before?;
                return Err(transient("produce", err).into());
            }
            waiting.push((i, rx));
        }
        all_acked(waiting).await
    }
}

/// Waits for every record's report (none left in flight), then gives the first failure.
async fn all_acked(waiting: Vec<(usize, oneshot::Receiver<Acked>)>) -> Result<(), SinkError> {
    let mut first = Ok(());
    for w in waiting {
        let r = acked(w).await;
        if first.is_ok() {
            first = r;
        }
    }
    first
}

/// Waits for one record's report.
async fn acked((i, rx): (usize, oneshot::Receiver<Acked>)) -> Result<(), SinkError> {
    match rx.await {
        Ok(Ok(())) => Ok(()),
        Ok(Err((true, why))) => Err(SinkError::Refused { index: i, reason: format!("kafka: {why}") }),
        Ok(Err((false, why))) => Err(ConnectError::Transient(format!("kafka: {why}")).into()),
        Err(_) => Err(ConnectError::Transient("kafka: the producer went away".into()).into()),
    }
}
