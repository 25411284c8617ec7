//! The durable log behind evmesh, as a trait that knows no engine and no group semantics:
//! append frames to a partition and get offsets back, read from an offset, know where a
//! partition starts and ends, drop what retention allows.
//!
//! Each shard holds its own handle and only appends to partitions it owns; handles are not `Send`
//! and never block on a sync to disk (see `embedded::Syncer`). The embedded engine (segment
//! logs, with RocksDB for metadata, offsets and lite topics: `embedded`) is the default. The one
//! RocksDB handle is opened by the runtime and shared (`shard::shared::Shared::db`): besides the
//! shards' logs, session followers (`push::follow`) and agent calls (`ingress::call`) read lite
//! topics' rows through it directly, with `embedded::read_from` / `embedded::end_of`. A log in
//! another system is `remote`'s seam; what is Kafka's stays in `kafka`.

pub mod db;
pub mod embedded;
#[cfg(feature = "kafka")]
pub mod kafka;
pub mod meta;
pub mod offsets;
pub mod partitions;
pub mod remote;
#[cfg(feature = "rocketmq")]
pub mod rocketmq;
pub mod segment;
pub mod tier;

#[cfg(test)]
mod suite;

use std::future::Future;

use frame_codec::Frame;
use serde::{Deserialize, Serialize};

use crate::model::{PartitionId, StoredTopic};

/// How far an acknowledged append has gone before the 202.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// In memory only: lost if the process dies.
    Memory,
    /// Written to the OS (the write-ahead log): survives a process crash.
    Os,
    /// Synced to the device, group-committed: survives power loss.
    Fsync,
}

/// A topic's settings, fixed at creation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicMeta {
    pub partitions: u32,
    /// Drop events older than this (milliseconds); `None` keeps them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention_ms: Option<u64>,
    /// Keep at most about this many bytes per partition; `None` has no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention_bytes: Option<u64>,
}

/// Why storage could not do what was asked.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum StorageError {
    /// The engine failed (I/O, corruption); clients see 503.
    #[error("storage engine: {0}")]
    Engine(String),
    /// A stored record failed validation.
    #[error("corrupt record at {topic}/{partition}@{offset}: {reason}")]
    Corrupt { topic: String, partition: u32, offset: u64, reason: String },
    /// The topic exists with other settings; clients see 409.
    #[error("topic {topic} exists with {existing} partitions")]
    Conflict { topic: String, existing: u32 },
    /// The shard is overloaded or shutting down; clients see 503 and retry.
    #[error("shard unavailable: {0}")]
    Unavailable(&'static str),
    /// A configured cap on what clients may create (`max_topics`, ...); clients see 409.
    #[error("{0}")]
    Limit(String),
    /// The topic does not exist and `auto_create_topics` is off; clients see 404.
    #[error("no topic {0} (auto_create_topics is off: create it with PUT /admin/topics/{0})")]
    NoTopic(String),
}

impl From<rocksdb::Error> for StorageError {
    fn from(e: rocksdb::Error) -> Self {
        StorageError::Engine(e.into_string())
    }
}

/// Where a partition's log starts and ends: offsets `start..end` are readable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Bounds {
    pub start: u64,
    pub end: u64,
}

/// One shard's handle on the log.
pub trait Storage {
    /// Stamps consecutive offsets (and `partition`) into `frames`, all of `topic`, and stores
    /// them; resolves to the first offset once they are durable at the configured level.
    fn append(
        &self,
        topic: &str,
        partition: PartitionId,
        frames: &mut [Frame],
    ) -> impl Future<Output = Result<u64, StorageError>>;

    /// Up to `max` frames from `from` on (fewer at the end of the log), stopping after the
    /// frame that reaches `max_bytes` (at least one frame is returned when one exists): every
    /// read is bounded in memory, whatever the events' sizes.
    fn read(
        &self,
        topic: &str,
        partition: PartitionId,
        from: u64,
        max: usize,
        max_bytes: usize,
    ) -> Result<Vec<Frame>, StorageError>;

    /// Current start and end offsets.
    fn bounds(&self, topic: &str, partition: PartitionId) -> Result<Bounds, StorageError>;

    /// The first offset kept whose event was published at or after `micros` (the end if none).
    /// By default a binary search over reads (publish times follow offsets within a partition,
    /// up to clock steps between cores); a log with a time index answers from it.
    fn offset_for_time(&self, topic: &str, partition: PartitionId, micros: i64) -> Result<u64, StorageError> {
        offset_by_search(self, topic, partition, micros)
    }

    /// Drops what the topic's retention allows from a partition this shard owns.
    fn enforce_retention(
        &self,
        topic: &str,
        meta: &TopicMeta,
        partition: PartitionId,
        now_us: i64,
    ) -> Result<u64, StorageError>;
}

/// [`Storage::offset_for_time`] by binary search over one-event reads.
fn offset_by_search<S: Storage + ?Sized>(
    log: &S,
    topic: &str,
    partition: PartitionId,
    micros: i64,
) -> Result<u64, StorageError> {
    let b = log.bounds(topic, partition)?;
    let (mut lo, mut hi) = (b.start, b.end);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        match log.read(topic, partition, mid, 1, usize::MAX)?.first() {
            Some(f) if f.header().timestamp_us < micros => lo = f.header().offset + 1,
            _ => hi = mid,
        }
    }
    Ok(lo)
}

/// How evmesh reaches Kafka (from `[kafka]` in the configuration).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaSettings {
    pub brokers: String,
    pub replication_factor: i32,
    pub acks: String,
    pub compression: String,
    /// Put before every evmesh topic name to make its Kafka topic name, so several evmesh
    /// clusters (or test runs) can share one Kafka cluster.
    pub topic_prefix: String,
    /// librdkafka properties passed through (security, timeouts, ...), applied last.
    pub properties: Vec<(String, String)>,
    /// How often the broker's topics are read for partitions added there (`kafka-topics
    /// --alter`), which every instance then takes.
    pub topic_refresh: std::time::Duration,
}

/// How evmesh reaches RocketMQ (from `[rocketmq]` in the configuration).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RocketMqSettings {
    /// The name servers, `host:port;host:port`.
    pub namesrv: String,
    /// Put before every evmesh topic name to make its RocketMQ topic name.
    pub topic_prefix: String,
    /// How long a publish waits for the broker's answer.
    pub send_timeout: std::time::Duration,
    /// How often the topics' routes are read for queues added there.
    pub topic_refresh: std::time::Duration,
}

/// The log a shard uses: the embedded engine, or another system's (Kafka, RocketMQ) with a
/// local copy for reads.
pub enum Log {
    Embedded(embedded::EmbeddedLog),
    Remote(remote::RemoteLog),
}

impl Log {
    /// Where this shard's partitions are stored locally (a remote log's copy).
    pub fn local(&self) -> &embedded::EmbeddedLog {
        match self {
            Log::Embedded(l) => l,
            Log::Remote(r) => &r.mirror,
        }
    }

    /// Where this shard's lite topics are kept: over a remote log too, on this instance only (the
    /// sessions and agents they serve are served at their home instance only).
    pub fn lite(&self) -> &embedded::EmbeddedLog {
        match self {
            Log::Embedded(l) => l,
            Log::Remote(r) => &r.lite,
        }
    }

    /// The log that holds `topic`: [`Log::lite`] for a lite topic, else [`Log::local`].
    fn holding(&self, topic: &str) -> &embedded::EmbeddedLog {
        if StoredTopic::new(topic).is_lite() {
            self.lite()
        } else {
            self.local()
        }
    }

    /// Appends; also says whether the frames can be read locally now (over a remote log they
    /// may arrive later, through the tail, behind records of other producers).
    pub async fn append_mirrored(
        &self,
        topic: &str,
        partition: PartitionId,
        frames: &mut [Frame],
    ) -> Result<(u64, bool), StorageError> {
        match self {
            Log::Embedded(l) => l.append(topic, partition, frames).await.map(|first| (first, true)),
            Log::Remote(r) if StoredTopic::new(topic).is_lite() => {
                r.lite.append(topic, partition, frames).await.map(|first| (first, true))
            }
            Log::Remote(r) => r.append_mirrored(topic, partition, frames).await,
        }
    }

    /// The next offset of a partition this shard owns, as far as it can read it.
    pub fn next_offset_of(&self, topic: &str, partition: PartitionId) -> Result<u64, StorageError> {
        self.holding(topic).next_offset_of(topic, partition)
    }
}

impl Storage for Log {
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
        self.holding(topic).read(topic, partition, from, max, max_bytes)
    }

    fn bounds(&self, topic: &str, partition: PartitionId) -> Result<Bounds, StorageError> {
        self.holding(topic).bounds(topic, partition)
    }

    fn offset_for_time(&self, topic: &str, partition: PartitionId, micros: i64) -> Result<u64, StorageError> {
        self.holding(topic).offset_for_time(topic, partition, micros)
    }

    fn enforce_retention(
        &self,
        topic: &str,
        meta: &TopicMeta,
        partition: PartitionId,
        now_us: i64,
    ) -> Result<u64, StorageError> {
        self.holding(topic).enforce_retention(topic, meta, partition, now_us)
    }
}
