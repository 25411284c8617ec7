//! The Kafka backend: Kafka as the durable, replicated log behind the [`Remote`] seam (what a
//! remote log is, the local copy and the tail, is `storage::remote`'s), and the connection to it.
//!
//! * **Writes**: the owner shard of a partition produces its events (CloudEvents Kafka binding,
//!   binary mode: `adaptor::kafka`) with librdkafka's own producer thread; each record's
//!   delivery report comes back to the waiting shard task through a oneshot channel, so no
//!   core blocks on Kafka, and the 202 waits for the broker's ack (`acks=all` by default).
//! * **Reads**: one tail thread reads every followed partition with `assign()` at the local
//!   copy's end and hands fetched batches to the owner shard.
//! * **evmesh's own topics** (`__evmesh.*`, one partition each): [`KafkaBackend::put_record`]
//!   writes a keyed record and [`OwnTopics`] reads them back. What the records mean (heartbeats,
//!   home claims, definitions, forwarded replies) is the cluster seam's
//!   (`runtime::cluster::kafka`), not this module's.
//! * **No group semantics**: librdkafka wants a `group.id` even for `assign()`; a fixed one is
//!   set, `subscribe()` is never called and nothing is ever committed to Kafka.
//!
//! Nothing of rdkafka leaves this module.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use frame_codec::Frame;
use futures::channel::oneshot;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::BaseConsumer;
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::message::{DeliveryResult, Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, ProducerContext, ThreadedProducer};
use rdkafka::{ClientContext, Message};

mod own;
mod tail;

pub use own::{OwnRecord, OwnTopics, Start};

use super::remote::{Answer, Deliver, Follow, Remote, RemoteTopic, TopicAsk};
use super::{KafkaSettings, StorageError};
use crate::model::PartitionId;

/// The consumer group id librdkafka insists on; never joined, never committed to.
pub const ASSIGN_ONLY_GROUP: &str = "evmesh-assign-only-never-joined";

impl KafkaSettings {
    fn client(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.brokers);
        for (k, v) in &self.properties {
            c.set(k, v);
        }
        c
    }
}

type Report = Result<(i32, i64), String>;

/// Hands each delivery report to the shard task waiting for it.
struct Reports;

impl ClientContext for Reports {}

impl ProducerContext for Reports {
    type DeliveryOpaque = Box<oneshot::Sender<Report>>;

    fn delivery(&self, result: &DeliveryResult<'_>, waiter: Self::DeliveryOpaque) {
        let r = match result {
            Ok(m) => Ok((m.partition(), m.offset())),
            Err((e, _)) => Err(e.to_string()),
        };
        let _ = waiter.send(r);
    }
}

/// A topic to create (or look up) on the broker.
struct TopicJob {
    topic: String,
    ask: TopicAsk,
    /// Topic configs set when it is created (`retention.ms`, ...).
    config: &'static [(&'static str, &'static str)],
    reply: oneshot::Sender<Result<RemoteTopic, StorageError>>,
}

/// The connection to Kafka, shared by every shard.
pub struct KafkaBackend {
    settings: KafkaSettings,
    producer: ThreadedProducer<Reports>,
    topics: mpsc::Sender<TopicJob>,
    follow: mpsc::Sender<Follow>,
    follow_rx: std::sync::Mutex<Option<mpsc::Receiver<Follow>>>,
}

pub(super) fn engine(what: &str, e: impl std::fmt::Display) -> StorageError {
    StorageError::Engine(format!("kafka {what}: {e}"))
}

impl KafkaBackend {
    /// Connects the producer and starts the topic helper thread. The tail starts with
    /// [`KafkaBackend::start_tail`] once the shards' mailboxes exist.
    pub fn connect(settings: KafkaSettings) -> Result<Arc<KafkaBackend>, StorageError> {
        let mut pc = settings.client();
        pc.set("acks", &settings.acks).set("compression.type", &settings.compression);
        if !settings.properties.iter().any(|(k, _)| k == "message.timeout.ms") {
            pc.set("message.timeout.ms", "10000");
        }
        let producer: ThreadedProducer<Reports> = pc.create_with_context(Reports).map_err(|e| engine("producer", e))?;
        // Its metadata requests name one topic: one that does not exist must not be made by
        // them (a broker with auto.create.topics.enable would): looking up is not creating.
        let mut ac = settings.client();
        if !settings.properties.iter().any(|(k, _)| k == "allow.auto.create.topics") {
            ac.set("allow.auto.create.topics", "false");
        }
        let admin: AdminClient<DefaultClientContext> = ac.create().map_err(|e| engine("admin", e))?;
        let (topics, jobs) = mpsc::channel::<TopicJob>();
        let (rf, prefix) = (settings.replication_factor, settings.topic_prefix.clone());
        std::thread::Builder::new()
            .name("evmesh-kafka-admin".into())
            .spawn(move || {
                for job in jobs {
                    let r = create_topic(&admin, &job, rf, &prefix);
                    let _ = job.reply.send(r);
                }
            })
            .map_err(|e| engine("admin thread", e))?;
        let (follow, follow_rx) = mpsc::channel();
        Ok(Arc::new(KafkaBackend {
            settings,
            producer,
            topics,
            follow,
            follow_rx: std::sync::Mutex::new(Some(follow_rx)),
        }))
    }

    /// The Kafka topic behind an evmesh topic.
    fn kafka_topic(&self, topic: &str) -> String {
        format!("{}{topic}", self.settings.topic_prefix)
    }

    /// [`Remote::ensure_topic`] with topic configs for its creation.
    async fn ensure_topic_with(
        &self,
        topic: &str,
        ask: TopicAsk,
        config: &'static [(&'static str, &'static str)],
    ) -> Result<RemoteTopic, StorageError> {
        let (reply, rx) = oneshot::channel();
        self.topics
            .send(TopicJob { topic: self.kafka_topic(topic), ask, config, reply })
            .map_err(|_| StorageError::Unavailable("kafka admin thread stopped"))?;
        rx.await.map_err(|_| StorageError::Unavailable("kafka admin thread stopped"))?
    }

    /// A consumer for `assign()` only (see [`ASSIGN_ONLY_GROUP`]).
    fn assign_only_consumer(&self) -> Result<BaseConsumer, StorageError> {
        let mut cc = self.settings.client();
        cc.set("group.id", ASSIGN_ONLY_GROUP)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "false")
            .set("fetch.wait.max.ms", "10");
        cc.create().map_err(|e| engine("consumer", e))
    }

    /// Makes one of evmesh's own one-partition topics (`__evmesh.*`) with topic configs for
    /// its creation, or takes the one the broker has. Blocks the calling thread (the cluster
    /// thread's, which waits for nothing else).
    pub fn ensure_own_topic(
        &self,
        topic: &str,
        config: &'static [(&'static str, &'static str)],
    ) -> Result<RemoteTopic, StorageError> {
        let ask = TopicAsk::Create { partitions: 1, exact: true };
        futures::executor::block_on(self.ensure_topic_with(topic, ask, config))
    }

    /// A reader of evmesh's own topics (see [`OwnTopics`]).
    pub fn own_topics(&self) -> Result<OwnTopics, StorageError> {
        Ok(OwnTopics::new(self.assign_only_consumer()?, self.settings.topic_prefix.clone()))
    }

    /// One keyed record to partition 0 of one of evmesh's own topics (`value` `None`: a
    /// tombstone), not waited for: the producer's queue holds a copy.
    pub fn put_record(
        &self,
        topic: &str,
        key: &[u8],
        value: Option<&[u8]>,
        headers: &[(&str, &[u8])],
    ) -> Result<(), StorageError> {
        let (tx, _) = oneshot::channel();
        let topic = self.kafka_topic(topic);
        let rec = BaseRecord::<[u8], [u8], _>::with_opaque_to(&topic, Box::new(tx)).partition(0).key(key);
        let rec = match value {
            Some(v) => rec.payload(v),
            None => rec,
        };
        let rec = match headers {
            [] => rec,
            _ => {
                let mut h = OwnedHeaders::new_with_capacity(headers.len());
                for (key, v) in headers {
                    h = h.insert(Header { key, value: Some(*v) });
                }
                rec.headers(h)
            }
        };
        self.producer.send(rec).map_err(|(e, _)| engine("record", e))
    }

    /// Sends one frame; the receiver resolves with its partition and offset once the broker
    /// acknowledged it (or with why it could not).
    fn produce_one(
        &self,
        topic: &str,
        partition: PartitionId,
        frame: &Frame,
    ) -> Result<oneshot::Receiver<Report>, StorageError> {
        let r = crate::adaptor::kafka::to_record(frame);
        let mut headers = OwnedHeaders::new_with_capacity(r.headers.len());
        for (k, v) in &r.headers {
            headers = headers.insert(Header { key: k, value: Some(v) });
        }
        let (tx, rx) = oneshot::channel();
        let kafka_topic = self.kafka_topic(topic);
        let rec = BaseRecord::<[u8], [u8], _>::with_opaque_to(&kafka_topic, Box::new(tx))
            .partition(partition.0 as i32)
            .payload(&r.value[..])
            .headers(headers)
            .timestamp(r.timestamp_ms);
        let rec = match &r.key {
            Some(k) => rec.key(&k[..]),
            None => rec,
        };
        self.producer.send(rec).map_err(|(e, _)| engine("produce", e))?;
        Ok(rx)
    }
}

impl Remote for KafkaBackend {
    fn system(&self) -> &'static str {
        "kafka"
    }

    /// `kafka.topic_prefix`.
    fn topic_prefix(&self) -> &str {
        &self.settings.topic_prefix
    }

    /// `kafka.topic_refresh_ms`.
    fn topic_refresh(&self) -> Duration {
        self.settings.topic_refresh
    }

    /// One record per frame, all sent before the first report is awaited.
    fn produce<'a>(&'a self, topic: &'a str, partition: PartitionId, frames: &'a [Frame]) -> Answer<'a, Vec<u64>> {
        let waits: Result<Vec<oneshot::Receiver<Report>>, _> =
            frames.iter().map(|f| self.produce_one(topic, partition, f)).collect();
        Box::pin(async move {
            let mut offsets = Vec::with_capacity(frames.len());
            for rx in waits? {
                let (_, o) = rx
                    .await
                    .map_err(|_| StorageError::Unavailable("kafka producer stopped"))?
                    .map_err(|e| engine("delivery", e))?;
                offsets.push(o as u64);
            }
            Ok(offsets)
        })
    }

    fn ensure_topic<'a>(&'a self, topic: &'a str, ask: TopicAsk) -> Answer<'a, RemoteTopic> {
        Box::pin(self.ensure_topic_with(topic, ask, &[]))
    }

    /// Every evmesh topic the broker has under this instance's prefix (evmesh's own `__evmesh.`
    /// topics and names evmesh does not take left out), with its partition count (`None`: there,
    /// but not described now: an error on it, no partitions yet): one metadata request.
    fn topics(&self) -> Result<Vec<(String, Option<u32>)>, StorageError> {
        use rdkafka::producer::Producer;
        let md =
            self.producer.client().fetch_metadata(None, Duration::from_secs(10)).map_err(|e| engine("metadata", e))?;
        let prefix = &self.settings.topic_prefix;
        let described = |t: &rdkafka::metadata::MetadataTopic| {
            (t.error().is_none() && !t.partitions().is_empty()).then(|| t.partitions().len() as u32)
        };
        Ok(md
            .topics()
            .iter()
            .filter_map(|t| Some((t.name().strip_prefix(prefix.as_str())?.to_owned(), described(t))))
            .filter(|(name, _)| !name.starts_with("__evmesh.") && crate::model::valid_topic(name))
            .collect())
    }

    fn follow(&self, f: Follow) {
        let _ = self.follow.send(Follow { topic: self.kafka_topic(&f.topic), ..f });
    }

    fn start_tail(&self, deliver: Deliver) -> Result<(), StorageError> {
        let Some(rx) = self.follow_rx.lock().expect("not poisoned").take() else { return Ok(()) };
        let consumer = self.assign_only_consumer()?;
        let prefix = self.settings.topic_prefix.clone();
        std::thread::Builder::new()
            .name("evmesh-kafka-tail".into())
            .spawn(move || tail::tail(consumer, rx, &prefix, deliver))
            .map_err(|e| engine("tail thread", e))?;
        Ok(())
    }
}

fn create_topic(
    admin: &AdminClient<DefaultClientContext>,
    job: &TopicJob,
    rf: i32,
    prefix: &str,
) -> Result<RemoteTopic, StorageError> {
    let topic = job.topic.as_str();
    let named = topic.strip_prefix(prefix).unwrap_or(topic);
    // The broker's count of a topic (0: it does not have it). A topic it has that cannot be
    // described now (no leader yet, just made) is a 503, not an absent one.
    let existing = || -> Result<u32, StorageError> {
        let md =
            admin.inner().fetch_metadata(Some(topic), Duration::from_secs(10)).map_err(|e| engine("metadata", e))?;
        match md.topics().iter().find(|t| t.name() == topic) {
            None => Ok(0),
            Some(t) => match t.error() {
                None if !t.partitions().is_empty() => Ok(t.partitions().len() as u32),
                Some(e) if RDKafkaErrorCode::from(e) == RDKafkaErrorCode::UnknownTopicOrPartition => Ok(0),
                _ => Err(StorageError::Unavailable("kafka: the topic cannot be described now")),
            },
        }
    };
    let (partitions, exact) = match job.ask {
        TopicAsk::Describe => {
            return match existing()? {
                0 => Err(StorageError::NoTopic(named.to_owned())),
                n => Ok(RemoteTopic { partitions: n, created: false }),
            };
        }
        TopicAsk::Create { partitions, exact } => (partitions, exact),
    };
    let mut new = NewTopic::new(topic, partitions as i32, TopicReplication::Fixed(rf));
    for (k, v) in job.config {
        new = new.set(k, v);
    }
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let results =
        futures::executor::block_on(admin.create_topics([&new], &opts)).map_err(|e| engine("create topic", e))?;
    match results.into_iter().next() {
        Some(Ok(_)) => Ok(RemoteTopic { partitions, created: true }),
        Some(Err((_, RDKafkaErrorCode::TopicAlreadyExists))) => match existing()? {
            0 => Err(StorageError::Unavailable("kafka: the topic exists and has no partitions yet")),
            n if exact && n != partitions => Err(StorageError::Conflict { topic: named.to_owned(), existing: n }),
            n => Ok(RemoteTopic { partitions: n, created: false }),
        },
        Some(Err((_, code))) => Err(engine("create topic", code)),
        None => Err(engine("create topic", "no result")),
    }
}
