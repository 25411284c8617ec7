//! The Kafka backend: Kafka as the durable, replicated log, and the connection to it that the
//! cluster's topics also ride on (membership below; it moves behind a cluster seam of its own).
//!
//! * **Writes**: the owner shard of a partition produces its events (CloudEvents Kafka binding,
//!   binary mode: `adaptor::kafka`) with librdkafka's own producer thread; each record's
//!   delivery report comes back to the waiting shard task through a oneshot channel, so no
//!   core blocks on Kafka, and the 202 waits for the broker's ack (`acks=all` by default).
//! * **Reads**: each shard keeps a local copy of the partitions it owns in the embedded log's
//!   segment logs (lite topics in its `log.N` family, without WAL): Kafka is the durable copy. The owner
//!   writes its own acknowledged events through at once; one tail thread reads every followed
//!   partition with `assign()` at the copy's end and hands fetched batches to the owner shard
//!   through its mailbox (records of other producers, and whatever the copy lost in a crash).
//!   Delivery reads the copy at offsets evmesh owns (RocksDB), so restarts replay from Kafka.
//! * **Membership**: one thread writes this instance's heartbeat to the one-partition topic
//!   `__evmesh.instances` and reads everyone's back, with the home claims and the homes'
//!   offsets of `__evmesh.homes` and the definitions of `__evmesh.subscriptions`
//!   (`crate::cluster`).
//! * **No group semantics**: librdkafka wants a `group.id` even for `assign()`; a fixed one is
//!   set, `subscribe()` is never called and nothing is ever committed to Kafka.
//!
//! Nothing of rdkafka leaves this module.

use std::collections::HashMap;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use frame_codec::Frame;
use futures::channel::oneshot;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::message::{DeliveryResult, Header, Headers, OwnedHeaders};
use rdkafka::producer::{BaseRecord, ProducerContext, ThreadedProducer};
use rdkafka::{ClientContext, Message, Offset, TopicPartitionList};

use super::embedded::EmbeddedLog;
use super::{Bounds, KafkaSettings, Storage, StorageError, TopicMeta};
use crate::cluster::homes::HOMES_TOPIC;
use crate::cluster::replies::REPLIES_TOPIC;
use crate::cluster::{Heartbeat, INSTANCES_TOPIC, SUBSCRIPTIONS_TOPIC};
use crate::model::PartitionId;

/// The consumer group id librdkafka insists on; never joined, never committed to.
pub const ASSIGN_ONLY_GROUP: &str = "evmesh-assign-only-never-joined";

/// Heartbeats read back from before an instance starts (to know at once who lives).
const CATCH_UP: i64 = 4096;

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

/// What a topic job (`KafkaBackend::ensure_topic`) asks of the broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopicAsk {
    /// Create the topic with this many partitions; an existing one is taken with the count it
    /// has (`exact`: unless that differs, a conflict).
    Create { partitions: u32, exact: bool },
    /// Only say how many partitions the topic has (never create it).
    Describe,
}

/// The topic as the broker has it: its partition count, and whether this job created it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KafkaTopic {
    pub partitions: u32,
    pub created: bool,
}

/// A topic to create (or look up) on the broker.
struct TopicJob {
    topic: String,
    ask: TopicAsk,
    /// Topic configs set when it is created (`retention.ms`, ...).
    config: &'static [(&'static str, &'static str)],
    reply: oneshot::Sender<Result<KafkaTopic, StorageError>>,
}

/// A partition the tail thread starts following at `from`.
pub struct Follow {
    pub topic: String,
    pub partition: u32,
    pub from: u64,
}

/// Takes a record of the replies topic: key, headers, value.
pub type ReplyFeed = dyn FnMut(&str, &[(&str, &[u8])], &[u8]) + Send;

/// Takes a claim record: its key and value.
pub type ClaimFeed = dyn Fn(String, Option<&[u8]>) + Send;

/// What the cluster thread hands on as it reads the cluster topics (`crate::cluster`).
pub struct Feeds {
    /// A heartbeat, and how old it was when read (zero once caught up).
    pub heard: Box<dyn Fn(Heartbeat, Duration) + Send>,
    /// A home claim: (key, value: `cluster::homes::Claim`), or its release (`None`: the
    /// subscription is gone).
    pub claimed: Box<ClaimFeed>,
    /// An offset a home stored, read in the claims' log (`cluster::homes`) after them.
    pub offset: Box<dyn FnMut(Replicated) + Send>,
    /// A record of the replies topic (`cluster::replies`), read from its end at start: its
    /// key, headers and value, borrowed (the value copied only by the instance it is for).
    pub forwarded: Box<ReplyFeed>,
    /// Called once the claims written before this instance started are read.
    pub caught_up: Box<dyn FnOnce() + Send>,
    /// `true` when the cluster thread stood still past two heartbeats, and at least 500 ms (a
    /// paused process, whose clock jumped past the others' heartbeats): the
    /// view may be stale; `false` once it read the heartbeats and claims to their end again.
    pub stale: Box<dyn Fn(bool) + Send>,
    /// A subscription's definition, or its removal.
    pub defined: Box<dyn Fn(Defined) + Send>,
}

/// A record of the definitions topic.
pub struct Defined {
    /// The subscription's stored name.
    pub name: String,
    /// Its definition (JSON), or `None`: removed.
    pub definition: Option<Vec<u8>>,
}

/// An offset record of the claims topic: what instance `by` stored under `key` (an
/// `storage::offsets` key), `None` once deleted; `next` is the position after it.
pub struct Replicated {
    pub key: String,
    pub value: Option<Vec<u8>>,
    pub by: String,
    pub next: u64,
}

/// A record of the replies topic: its key (the instance it is for), headers and value.
pub struct Forwarded {
    pub key: String,
    pub headers: Vec<(String, Vec<u8>)>,
    pub value: Vec<u8>,
}

/// Offset records' keys in the claims topic start with this (claims' with `sub/`).
const OFFSET_KEY: &str = "off/";
/// The header naming the instance that wrote an offset record.
const BY_HEADER: &str = "evmesh-by";

/// Records read by the tail thread, for the owner of their partition (`topic` is in the frames).
pub type Fetched = (PartitionId, Vec<Frame>);

/// The connection to Kafka, shared by every shard.
pub struct KafkaBackend {
    settings: KafkaSettings,
    producer: ThreadedProducer<Reports>,
    topics: mpsc::Sender<TopicJob>,
    follow: mpsc::Sender<Follow>,
    follow_rx: std::sync::Mutex<Option<mpsc::Receiver<Follow>>>,
}

fn engine(what: &str, e: impl std::fmt::Display) -> StorageError {
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

    /// `kafka.topic_prefix`: what tells evmesh's topics from others' on the broker.
    pub fn topic_prefix(&self) -> &str {
        &self.settings.topic_prefix
    }

    /// `kafka.topic_refresh_ms`.
    pub fn topic_refresh(&self) -> Duration {
        self.settings.topic_refresh
    }

    /// The Kafka topic behind an evmesh topic.
    fn kafka_topic(&self, topic: &str) -> String {
        format!("{}{topic}", self.settings.topic_prefix)
    }

    /// Creates the topic, or looks up the one the broker has (`TopicAsk`): a topic is the
    /// broker's, with the broker's partition count, whichever instance made it.
    pub async fn ensure_topic(&self, topic: &str, ask: TopicAsk) -> Result<KafkaTopic, StorageError> {
        self.ensure_topic_with(topic, ask, &[]).await
    }

    /// [`KafkaBackend::ensure_topic`] with topic configs for its creation.
    async fn ensure_topic_with(
        &self,
        topic: &str,
        ask: TopicAsk,
        config: &'static [(&'static str, &'static str)],
    ) -> Result<KafkaTopic, StorageError> {
        let (reply, rx) = oneshot::channel();
        self.topics
            .send(TopicJob { topic: self.kafka_topic(topic), ask, config, reply })
            .map_err(|_| StorageError::Unavailable("kafka admin thread stopped"))?;
        rx.await.map_err(|_| StorageError::Unavailable("kafka admin thread stopped"))?
    }

    /// Every evmesh topic the broker has under this instance's prefix (evmesh's own `__evmesh.`
    /// topics and names evmesh does not take left out), with its partition count (`None`: there,
    /// but not described now: an error on it, no partitions yet): one metadata request.
    pub fn topics(&self) -> Result<Vec<(String, Option<u32>)>, StorageError> {
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

    /// Starts following a partition from `from` (the local copy's end).
    pub fn follow(&self, f: Follow) {
        let _ = self.follow.send(Follow { topic: self.kafka_topic(&f.topic), ..f });
    }

    /// Starts the tail thread; `deliver` hands a fetched batch to the partition's owner and
    /// must not drop it (it may block this thread while the owner's mailbox is full).
    pub fn start_tail(&self, deliver: impl Fn(Fetched) + Send + 'static) -> Result<(), StorageError> {
        let Some(rx) = self.follow_rx.lock().expect("not poisoned").take() else { return Ok(()) };
        let consumer = self.assign_only_consumer()?;
        let prefix = self.settings.topic_prefix.clone();
        std::thread::Builder::new()
            .name("evmesh-kafka-tail".into())
            .spawn(move || tail(consumer, rx, &prefix, deliver))
            .map_err(|e| engine("tail thread", e))?;
        Ok(())
    }

    /// Starts the cluster's heartbeats (`crate::cluster`) on a thread of their own: `beat()`
    /// is written to the instances topic every `every`; what the cluster topics hold is handed
    /// to `feeds` as it is read.
    pub fn start_membership(
        self: &Arc<Self>,
        every: Duration,
        beat: impl FnMut() -> Heartbeat + Send + 'static,
        feeds: Feeds,
    ) -> Result<(), StorageError> {
        let consumer = self.assign_only_consumer()?;
        let me = self.clone();
        std::thread::Builder::new()
            .name("evmesh-kafka-cluster".into())
            .spawn(move || me.membership(&consumer, every, beat, feeds))
            .map_err(|e| engine("cluster thread", e))?;
        Ok(())
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

    /// Records a claim of the home of `key` (`cluster::homes::Claim`, encoded), or that `key`
    /// has no home any more (`None`: its subscription was removed): read back by every
    /// instance's cluster thread, in log order.
    pub fn claim_home(&self, key: &str, claim: Option<&[u8]>) -> Result<(), StorageError> {
        self.put_keyed(HOMES_TOPIC, key, claim, None)
    }

    /// Records what instance `by` stored under offset key `key` (`None`: deleted), in the
    /// claims' log, where every instance reads it in order with the claims
    /// (`cluster::homes`, "Offsets").
    pub fn put_offset(&self, key: &str, value: Option<&[u8]>, by: &str) -> Result<(), StorageError> {
        self.put_keyed(HOMES_TOPIC, &format!("{OFFSET_KEY}{key}"), value, Some(by))
    }

    /// Records subscription `name`'s definition (JSON), or its removal (`None`, a tombstone),
    /// for every instance to apply, in log order.
    pub fn put_definition(&self, name: &str, definition: Option<&[u8]>) -> Result<(), StorageError> {
        self.put_keyed(SUBSCRIPTIONS_TOPIC, name, definition, None)
    }

    /// A record of the replies topic (`cluster::replies`) for instance `to`, not waited for.
    pub fn put_reply(&self, to: &str, headers: &[(&str, &[u8])], value: &[u8]) -> Result<(), StorageError> {
        let (tx, _) = oneshot::channel();
        let topic = self.kafka_topic(REPLIES_TOPIC);
        let mut h = OwnedHeaders::new_with_capacity(headers.len());
        for (key, v) in headers {
            h = h.insert(Header { key, value: Some(*v) });
        }
        let rec = BaseRecord::<[u8], [u8], _>::with_opaque_to(&topic, Box::new(tx))
            .partition(0)
            .key(to.as_bytes())
            .payload(value)
            .headers(h);
        self.producer.send(rec).map_err(|(e, _)| engine("reply record", e))
    }

    /// One keyed record to partition 0 of one of evmesh's own topics, not waited for;
    /// `by`: the writer, in a header.
    fn put_keyed(&self, topic: &str, key: &str, value: Option<&[u8]>, by: Option<&str>) -> Result<(), StorageError> {
        let (tx, _) = oneshot::channel();
        let topic = self.kafka_topic(topic);
        let rec = BaseRecord::<[u8], [u8], _>::with_opaque_to(&topic, Box::new(tx)).partition(0).key(key.as_bytes());
        let rec = match value {
            Some(v) => rec.payload(v),
            None => rec,
        };
        let rec = match by {
            Some(by) => rec.headers(OwnedHeaders::new().insert(Header { key: BY_HEADER, value: Some(by) })),
            None => rec,
        };
        self.producer.send(rec).map_err(|(e, _)| engine("cluster record", e))
    }

    /// The cluster thread: makes the topics (retrying while the broker is away), reads the
    /// home claims and the definitions from their start and the heartbeats from the last
    /// [`CATCH_UP`] before now (to know the live instances at once, dating those by their
    /// senders' clocks), then heartbeats and reads on.
    fn membership(&self, consumer: &BaseConsumer, every: Duration, mut beat: impl FnMut() -> Heartbeat, feeds: Feeds) {
        let Feeds { heard, claimed, caught_up, stale, defined, mut offset, mut forwarded } = feeds;
        let topic = self.kafka_topic(INSTANCES_TOPIC);
        let homes = self.kafka_topic(HOMES_TOPIC);
        let definitions = self.kafka_topic(SUBSCRIPTIONS_TOPIC);
        let replies = self.kafka_topic(REPLIES_TOPIC);
        let mut wait = Duration::from_millis(100);
        let retry = |what: &str, e: &dyn std::fmt::Display, wait: &mut Duration| {
            eprintln!("evmesh: kafka cluster: {what}: {e}; retrying in {wait:?}");
            std::thread::sleep(*wait);
            *wait = (*wait * 2).min(Duration::from_secs(5));
        };
        // Heartbeats and forwarded replies are of no use an hour on: Kafka may drop them.
        let config = &[("retention.ms", "3600000")];
        for t in [INSTANCES_TOPIC, REPLIES_TOPIC] {
            while let Err(e) = futures::executor::block_on(self.ensure_topic_with(
                t,
                TopicAsk::Create { partitions: 1, exact: true },
                config,
            )) {
                retry(&format!("creating {t}"), &e, &mut wait);
            }
        }
        // A home claim counts until replaced: compacted (the last claim of each key kept).
        let config = &[("cleanup.policy", "compact")];
        for t in [HOMES_TOPIC, SUBSCRIPTIONS_TOPIC] {
            while let Err(e) = futures::executor::block_on(self.ensure_topic_with(
                t,
                TopicAsk::Create { partitions: 1, exact: true },
                config,
            )) {
                retry(&format!("creating {t}"), &e, &mut wait);
            }
        }
        let watermarks = |t: &str| consumer.fetch_watermarks(t, 0, Duration::from_secs(5));
        // Replies from the end as it is now (a fixed offset: `Offset::End` is resolved at the
        // first fetch, which may come after a reply for this instance was written).
        let (caught_up_at, homes_end, replies_end) = loop {
            match watermarks(&topic).and_then(|(low, high)| {
                Ok(((low.max(high - CATCH_UP), high), watermarks(&homes)?.1, watermarks(&replies)?.1))
            }) {
                Ok(x) => break x,
                Err(e) => retry("reading the cluster topics' offsets", &e, &mut wait),
            }
        };
        loop {
            let mut from = TopicPartitionList::new();
            let assigned = from
                .add_partition_offset(&topic, 0, Offset::Offset(caught_up_at.0))
                .and_then(|()| from.add_partition_offset(&homes, 0, Offset::Beginning))
                .and_then(|()| from.add_partition_offset(&definitions, 0, Offset::Beginning))
                .and_then(|()| from.add_partition_offset(&replies, 0, Offset::Offset(replies_end)))
                .and_then(|()| consumer.assign(&from));
            match assigned {
                Ok(()) => break,
                Err(e) => retry("following the cluster topics", &e, &mut wait),
            }
        }
        // Homes are answered once the claims up to `homes_end` are read (`cluster::homes`): by a
        // record's offset, or the consumer's position when nothing more comes (a compacted
        // topic's end need not be a record's).
        let mut caught_up = Some(caught_up);
        let mut homes_read = |next: i64| {
            if next >= homes_end {
                if let Some(done) = caught_up.take() {
                    done();
                }
            }
        };
        homes_read(0);
        let position = |c: &BaseConsumer| {
            let p = c.position().ok()?;
            p.find_partition(&homes, 0)?.offset().to_raw()
        };
        let mut logged = std::time::Instant::now() - Duration::from_secs(60);
        let mut log = |what: &str, e: &dyn std::fmt::Display| {
            if logged.elapsed() > Duration::from_secs(10) {
                eprintln!("evmesh: kafka cluster: {what}: {e}");
                logged = std::time::Instant::now();
            }
        };
        let mut next = std::time::Instant::now();
        // After a stall: the ends of the heartbeats and the claims to read before the view
        // counts again (read so far: the next offsets).
        let mut resync: Option<[(i64, i64); 2]> = None;
        let mut turned = std::time::Instant::now();
        loop {
            let now = std::time::Instant::now();
            if now.duration_since(turned) > (every * 2).max(Duration::from_millis(500)) {
                if let (Ok((_, i)), Ok((_, h))) = (watermarks(&topic), watermarks(&homes)) {
                    eprintln!(
                        "evmesh: kafka cluster: stood still for {:?}; reading the cluster's view again",
                        now.duration_since(turned)
                    );
                    stale(true);
                    resync = Some([(i, 0), (h, 0)]);
                }
            }
            turned = std::time::Instant::now();
            if let Some(ends) = &mut resync {
                if let Ok(p) = consumer.position() {
                    for (t, (_, read)) in [&topic, &homes].into_iter().zip(ends.iter_mut()) {
                        if let Some(o) = p.find_partition(t, 0).and_then(|e| e.offset().to_raw()) {
                            *read = (*read).max(o);
                        }
                    }
                }
                if ends.iter().all(|(end, read)| read >= end) {
                    stale(false);
                    resync = None;
                }
            }
            if now >= next {
                let hb = beat();
                let payload = serde_json::to_vec(&hb).expect("a heartbeat serializes");
                let (tx, _) = oneshot::channel();
                let rec = BaseRecord::<[u8], [u8], _>::with_opaque_to(&topic, Box::new(tx))
                    .partition(0)
                    .key(hb.instance_id.as_bytes())
                    .payload(&payload[..]);
                if let Err((e, _)) = self.producer.send(rec) {
                    log("sending a heartbeat", &e);
                }
                next = (next + every).max(now);
            }
            let wait = next.saturating_duration_since(std::time::Instant::now()).min(Duration::from_millis(100));
            match consumer.poll(wait) {
                Some(Ok(m)) if m.topic() == homes => {
                    let text = |b: Option<&[u8]>| b.and_then(|b| std::str::from_utf8(b).ok()).map(str::to_owned);
                    match text(m.key()) {
                        Some(key) if key.starts_with(OFFSET_KEY) => {
                            let by = m
                                .headers()
                                .and_then(|h| h.iter().find(|h| h.key == BY_HEADER).and_then(|h| text(h.value)));
                            if let Some(by) = by {
                                let key = key[OFFSET_KEY.len()..].to_owned();
                                let value = m.payload().map(<[u8]>::to_vec);
                                offset(Replicated { key, value, by, next: m.offset() as u64 + 1 });
                            }
                        }
                        Some(key) => claimed(key, m.payload()),
                        None => {}
                    }
                    homes_read(m.offset() + 1);
                }
                Some(Ok(m)) if m.topic() == replies => {
                    let Some(key) = m.key().and_then(|k| std::str::from_utf8(k).ok()) else { continue };
                    let headers: Vec<(&str, &[u8])> = m
                        .headers()
                        .map(|h| h.iter().map(|h| (h.key, h.value.unwrap_or(&[]))).collect())
                        .unwrap_or_default();
                    forwarded(key, &headers, m.payload().unwrap_or(&[]));
                }
                Some(Ok(m)) if m.topic() == definitions => {
                    if let Some(name) = m.key().and_then(|k| std::str::from_utf8(k).ok()) {
                        defined(Defined { name: name.to_owned(), definition: m.payload().map(<[u8]>::to_vec) });
                    }
                }
                None => {
                    if let Some(next) = position(consumer) {
                        homes_read(next);
                    }
                }
                Some(Ok(m)) => {
                    let Some(hb) = m.payload().and_then(Heartbeat::parse) else { continue };
                    let age = match m.offset() < caught_up_at.1 {
                        true => (crate::model::clock::now_micros() / 1000).saturating_sub(hb.sent_ms),
                        false => 0,
                    };
                    heard(hb, Duration::from_millis(age.max(0) as u64));
                }
                Some(Err(e)) => {
                    log("reading heartbeats", &e);
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
    }

    /// Sends one frame; the receiver resolves with its partition and offset once the broker
    /// acknowledged it (or with why it could not).
    fn produce(
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

fn create_topic(
    admin: &AdminClient<DefaultClientContext>,
    job: &TopicJob,
    rf: i32,
    prefix: &str,
) -> Result<KafkaTopic, StorageError> {
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
                n => Ok(KafkaTopic { partitions: n, created: false }),
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
        Some(Ok(_)) => Ok(KafkaTopic { partitions, created: true }),
        Some(Err((_, RDKafkaErrorCode::TopicAlreadyExists))) => match existing()? {
            0 => Err(StorageError::Unavailable("kafka: the topic exists and has no partitions yet")),
            n if exact && n != partitions => Err(StorageError::Conflict { topic: named.to_owned(), existing: n }),
            n => Ok(KafkaTopic { partitions: n, created: false }),
        },
        Some(Err((_, code))) => Err(engine("create topic", code)),
        None => Err(engine("create topic", "no result")),
    }
}

/// The tail thread: reads every followed partition and hands batches to their owners.
fn tail(consumer: BaseConsumer, follow: mpsc::Receiver<Follow>, prefix: &str, deliver: impl Fn(Fetched)) {
    let mut batch: Vec<(String, PartitionId, Vec<Frame>)> = Vec::new();
    let mut logged = std::time::Instant::now() - Duration::from_secs(60);
    let mut followed = Followed::default();
    let (mut retry, mut failed): (Vec<Follow>, u32) = (Vec::new(), 0);
    loop {
        let (mut added, mut new) = (TopicPartitionList::new(), Vec::new());
        for f in std::mem::take(&mut retry).into_iter().chain(std::iter::from_fn(|| follow.try_recv().ok())) {
            if followed.first(&f) {
                let _ = added.add_partition_offset(&f.topic, f.partition as i32, Offset::Offset(f.from as i64));
                new.push(f);
            }
        }
        let now = std::time::Instant::now();
        if added.count() > 0 {
            match consumer.incremental_assign(&added) {
                Ok(()) => failed = 0,
                Err(e) => {
                    // Not followed yet: asked for again on the next turns (20 ms apart) until it
                    // is (whoever asked counts on it: it is never asked for again), said now
                    // and then.
                    failed += 1;
                    if failed % 500 == 1 {
                        eprintln!("evmesh: kafka tail: assign: {e}; trying again");
                    }
                    for f in new {
                        followed.forget(&f);
                        retry.push(f);
                    }
                }
            }
        }
        let mut fetched = 0;
        while fetched < 1024 {
            match consumer.poll(Duration::from_millis(if fetched == 0 { 20 } else { 0 })) {
                Some(Ok(m)) => {
                    fetched += 1;
                    let (p, o) = (m.partition() as u32, m.offset() as u64);
                    match followed.fetched(m.topic(), p, o, now) {
                        Gap::None => {}
                        // Past a gap being checked: fetched again after the missing offsets.
                        Gap::Drop => continue,
                        Gap::Recheck(from) => {
                            let at = Offset::Offset(from as i64);
                            if let Err(e) = consumer.seek(m.topic(), p as i32, at, Duration::ZERO) {
                                eprintln!("evmesh: kafka tail: {}/{p}: reading again from {from}: {e}", m.topic());
                            }
                            continue;
                        }
                    }
                    let headers: Vec<(&str, &[u8])> = m
                        .headers()
                        .map(|h| h.iter().map(|h| (h.key, h.value.unwrap_or(&[]))).collect())
                        .unwrap_or_default();
                    let ts = m.timestamp().to_millis().unwrap_or(0);
                    // Only followed topics arrive, and those all carry the prefix.
                    let Some(topic) = m.topic().strip_prefix(prefix) else { continue };
                    let value = m.payload().unwrap_or(&[]);
                    match crate::adaptor::kafka::from_record(topic, p, o, m.key(), &headers, value, ts) {
                        Ok(f) => match batch.iter_mut().find(|b| b.0 == topic && b.1 .0 == p) {
                            Some(b) => b.2.push(f),
                            None => batch.push((topic.to_owned(), PartitionId(p), vec![f])),
                        },
                        Err(e) => eprintln!("evmesh: kafka tail: {}/{p}@{o} skipped: {e}", m.topic()),
                    }
                }
                Some(Err(e)) => {
                    // Broker away: librdkafka reconnects by itself; say so now and then, and do
                    // not spin on the errors meanwhile.
                    if logged.elapsed() > Duration::from_secs(10) {
                        eprintln!("evmesh: kafka tail: {e}");
                        logged = std::time::Instant::now();
                    }
                    std::thread::sleep(Duration::from_millis(50));
                    break;
                }
                None => break,
            }
        }
        for (_, p, frames) in batch.drain(..) {
            deliver((p, frames));
        }
    }
}

/// The partitions the tail follows, and the next offset expected of each.
///
/// A partition asked for again (two shards made its topic at once, or a definition from
/// another instance named it too) is followed already: assigning it again would fail the whole
/// assignment it is in (librdkafka: `_INVALID_ARG`), new partitions with it.
///
/// A fetch that skips offsets is read again from the first missing one for up to
/// [`GAP_RECHECK`] before the gap is taken as the log's own (compaction, transaction markers):
/// a broker may answer a fetch with records past ones it has assigned offsets to and not yet
/// made readable (seen with tansu under concurrent producers), and the local copy, which
/// delivery reads, must not skip what Kafka holds.
#[derive(Default)]
struct Followed(HashMap<String, HashMap<u32, Expected>>);

#[derive(Clone, Copy)]
struct Expected {
    next: u64,
    /// When records past `next` were first fetched (a gap being checked), and when the
    /// partition was last read again from `next`.
    gap_since: Option<(std::time::Instant, std::time::Instant)>,
}

/// How often a gap being checked is read again.
const GAP_RESEEK: Duration = Duration::from_millis(20);

/// How long a fetched gap is read again before it is taken as the log's.
const GAP_RECHECK: Duration = Duration::from_millis(500);

/// What to do with a fetched record.
#[derive(Debug, PartialEq, Eq)]
enum Gap {
    /// Take it.
    None,
    /// Drop it: the partition is being read again from before it.
    Drop,
    /// Drop it and read the partition again from this offset.
    Recheck(u64),
}

impl Followed {
    /// Whether `f` is a partition not followed yet (now it is, from `f.from`).
    fn first(&mut self, f: &Follow) -> bool {
        match self.0.entry(f.topic.clone()).or_default().entry(f.partition) {
            std::collections::hash_map::Entry::Occupied(_) => false,
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(Expected { next: f.from, gap_since: None });
                true
            }
        }
    }

    /// `f`'s partition is not followed after all (its assignment failed).
    fn forget(&mut self, f: &Follow) {
        if let Some(t) = self.0.get_mut(&f.topic) {
            t.remove(&f.partition);
        }
    }

    /// A record at `offset` of `topic`/`partition` was fetched at `now`.
    fn fetched(&mut self, topic: &str, partition: u32, offset: u64, now: std::time::Instant) -> Gap {
        // (By the name borrowed: no allocation per record.)
        let Some(e) = self.0.get_mut(topic).and_then(|t| t.get_mut(&partition)) else { return Gap::None };
        if offset < e.next {
            return Gap::None; // read again after a recheck, or the owner skips it as stored
        }
        if offset > e.next {
            let Some((since, sought)) = e.gap_since else {
                e.gap_since = Some((now, now));
                return Gap::Recheck(e.next);
            };
            if now.saturating_duration_since(since) < GAP_RECHECK {
                if now.saturating_duration_since(sought) < GAP_RESEEK {
                    return Gap::Drop;
                }
                e.gap_since = Some((since, now));
                return Gap::Recheck(e.next);
            }
            eprintln!("evmesh: kafka tail: {topic}/{partition}: offsets {}..{offset} are not in the log", e.next);
        }
        *e = Expected { next: offset + 1, gap_since: None };
        Gap::None
    }
}

/// One shard's log on Kafka: produce to Kafka, read the local copy.
pub struct KafkaLog {
    backend: Arc<KafkaBackend>,
    /// The local copy of the partitions this shard owns.
    pub mirror: EmbeddedLog,
    /// The lite topics this shard owns: this instance's own, never written to Kafka (the
    /// sessions and agents they serve are served at their home instance only), so kept as the
    /// embedded log keeps them, with the configured durability.
    pub lite: EmbeddedLog,
}

impl KafkaLog {
    pub fn new(backend: Arc<KafkaBackend>, mirror: EmbeddedLog, lite: EmbeddedLog) -> Self {
        KafkaLog { backend, mirror, lite }
    }

    /// Appends and reports whether the frames are in the local copy already (else the tail
    /// brings them, after records of other producers that came first).
    pub async fn append_mirrored(
        &self,
        topic: &str,
        partition: PartitionId,
        frames: &mut [Frame],
    ) -> Result<(u64, bool), StorageError> {
        let waits: Vec<oneshot::Receiver<Report>> =
            frames.iter().map(|f| self.backend.produce(topic, partition, f)).collect::<Result<_, _>>()?;
        for (f, rx) in frames.iter_mut().zip(waits) {
            let (p, o) = rx
                .await
                .map_err(|_| StorageError::Unavailable("kafka producer stopped"))?
                .map_err(|e| engine("delivery", e))?;
            f.set_partition(p as u32);
            f.set_offset(o as u64);
        }
        let first = frames.first().map_or(0, |f| f.header().offset);
        let contiguous = frames.windows(2).all(|w| w[1].header().offset == w[0].header().offset + 1);
        let mirrored = contiguous && matches!(self.mirror.put_mirrored(topic, partition, frames, true)?, Some(0));
        Ok((first, mirrored))
    }
}

impl Storage for KafkaLog {
    async fn append(&self, topic: &str, partition: PartitionId, frames: &mut [Frame]) -> Result<u64, StorageError> {
        self.append_mirrored(topic, partition, frames).await.map(|(first, _)| first)
    }

    fn read(
        &self,
        topic: &str,
        partition: PartitionId,
        from: u64,
        max: usize,
        max_bytes: usize,
    ) -> Result<Vec<Frame>, StorageError> {
        self.mirror.read(topic, partition, from, max, max_bytes)
    }

    fn bounds(&self, topic: &str, partition: PartitionId) -> Result<Bounds, StorageError> {
        self.mirror.bounds(topic, partition)
    }

    /// Kafka keeps its own retention; this bounds the local copy.
    fn enforce_retention(
        &self,
        topic: &str,
        meta: &TopicMeta,
        partition: PartitionId,
        now_us: i64,
    ) -> Result<u64, StorageError> {
        self.mirror.enforce_retention(topic, meta, partition, now_us)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fetch_that_skips_offsets_is_read_again_before_the_gap_is_taken() {
        let mut followed = Followed::default();
        let t0 = std::time::Instant::now();
        assert!(followed.first(&Follow { topic: "t".into(), partition: 0, from: 5 }));
        assert_eq!(followed.fetched("t", 0, 5, t0), Gap::None);
        // 6 and 7 skipped: read again from 6 while the gap is young.
        assert_eq!(followed.fetched("t", 0, 8, t0), Gap::Recheck(6));
        assert_eq!(followed.fetched("t", 0, 9, t0), Gap::Drop, "read again already");
        assert_eq!(followed.fetched("t", 0, 8, t0 + GAP_RESEEK), Gap::Recheck(6), "and again");
        // They came: taken in order.
        assert_eq!(followed.fetched("t", 0, 6, t0 + GAP_RECHECK / 2), Gap::None);
        assert_eq!(followed.fetched("t", 0, 7, t0 + GAP_RECHECK / 2), Gap::None);
        assert_eq!(followed.fetched("t", 0, 8, t0 + GAP_RECHECK / 2), Gap::None);
        // A gap that stays is the log's own once checked for long enough.
        assert_eq!(followed.fetched("t", 0, 12, t0), Gap::Recheck(9));
        assert_eq!(followed.fetched("t", 0, 12, t0 + GAP_RECHECK), Gap::None, "taken as the log's");
        assert_eq!(followed.fetched("t", 0, 13, t0 + GAP_RECHECK), Gap::None);
        // Records before the next expected (read again) are handed on; unknown partitions too.
        assert_eq!(followed.fetched("t", 0, 10, t0), Gap::None);
        assert_eq!(followed.fetched("u", 0, 99, t0), Gap::None);
    }

    #[test]
    fn a_partition_is_followed_once_whoever_asks_again() {
        let mut followed = Followed::default();
        let f = |topic: &str, partition, from| Follow { topic: topic.into(), partition, from };
        assert!(followed.first(&f("t", 0, 0)));
        assert!(followed.first(&f("t", 1, 0)));
        assert!(!followed.first(&f("t", 0, 7)), "followed already, from wherever");
        assert!(followed.first(&f("u", 0, 0)));
    }
}
