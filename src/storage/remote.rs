//! A log that lives in another system (Kafka, RocketMQ), behind one seam: evmesh produces to it,
//! makes and looks up its topics, and reads it back into a local copy that delivery reads.
//!
//! * **Writes**: the owner shard of a partition hands its frames to [`Remote::produce`] and
//!   waits for the offsets the other system gave them; the 202 waits for that system's ack.
//! * **Reads**: each shard keeps a local copy of the partitions it owns in the embedded log's
//!   segment logs ([`RemoteLog::mirror`]); the owner writes its own acknowledged events through
//!   at once, and the backend's tail thread reads every followed partition from the end of its
//!   copy and hands batches to the owner ([`Remote::start_tail`]): records of other producers,
//!   and whatever the copy lost in a crash. Delivery reads the copy at offsets evmesh owns
//!   (RocksDB), so a restart replays from the other system.
//! * **Lite topics** stay on this instance (`RemoteLog::lite`): the sessions and agents they
//!   serve are served at their home instance only.
//!
//! What each system's client is stays in its module (`kafka`, `rocketmq`); nothing of a client
//! crosses this seam. No group semantics cross it either: partitions are read by assignment at
//! offsets evmesh owns, and nothing is ever committed to the other system.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use frame_codec::Frame;

use super::embedded::EmbeddedLog;
use super::{Bounds, Storage, StorageError, TopicMeta};
use crate::model::PartitionId;

/// A future a backend answers with; it may borrow the backend.
pub type Answer<'a, T> = Pin<Box<dyn Future<Output = Result<T, StorageError>> + 'a>>;

/// What a topic request ([`Remote::ensure_topic`]) asks of the other system.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopicAsk {
    /// Create the topic with this many partitions; an existing one is taken with the count it
    /// has (`exact`: unless that differs, a conflict).
    Create { partitions: u32, exact: bool },
    /// Only say how many partitions the topic has (never create it).
    Describe,
}

/// The topic as the other system has it: its partition count, and whether this request made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteTopic {
    pub partitions: u32,
    pub created: bool,
}

/// A partition the tail starts following at `from` (the evmesh topic's name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Follow {
    pub topic: String,
    pub partition: u32,
    pub from: u64,
}

/// Records read by the tail, for the owner of their partition (`topic` is in the frames).
pub type Fetched = (PartitionId, Vec<Frame>);

/// Hands a fetched batch to its partition's owner; never drops it (it may block the tail's
/// thread while the owner's mailbox is full).
pub type Deliver = Box<dyn Fn(Fetched) + Send>;

/// The connection to the other system, shared by every shard.
pub trait Remote: Send + Sync {
    /// The system's name, for messages (`kafka`, `rocketmq`).
    fn system(&self) -> &'static str;

    /// What is put before every evmesh topic name there (what tells evmesh's topics from others').
    fn topic_prefix(&self) -> &str;

    /// How often the system's topics are read for partitions added there.
    fn topic_refresh(&self) -> Duration;

    /// Stores `frames` (all of `topic`) in `partition`, in order; resolves to each one's offset
    /// once the system acknowledged it (not always consecutive: other producers write too).
    fn produce<'a>(&'a self, topic: &'a str, partition: PartitionId, frames: &'a [Frame]) -> Answer<'a, Vec<u64>>;

    /// Creates the topic, or looks up the one the system has (`TopicAsk`): a topic is the
    /// system's, with its partition count, whichever instance (or tool) made it.
    fn ensure_topic<'a>(&'a self, topic: &'a str, ask: TopicAsk) -> Answer<'a, RemoteTopic>;

    /// Every evmesh topic the system has under the prefix, with its partition count (`None`:
    /// there, but not described now). Blocks the calling thread (never a shard's).
    fn topics(&self) -> Result<Vec<(String, Option<u32>)>, StorageError>;

    /// Starts following a partition from `from` (the local copy's end).
    fn follow(&self, f: Follow);

    /// Starts the tail, which reads every followed partition and hands batches to `deliver`.
    fn start_tail(&self, deliver: Deliver) -> Result<(), StorageError>;
}

/// One shard's log over a [`Remote`]: produce there, read the local copy.
pub struct RemoteLog {
    remote: Arc<dyn Remote>,
    /// The local copy of the partitions this shard owns.
    pub mirror: EmbeddedLog,
    /// The lite topics this shard owns: this instance's own, never written to the other system
    /// (the sessions and agents they serve are served at their home instance only), so kept as
    /// the embedded log keeps them, with the configured durability.
    pub lite: EmbeddedLog,
}

impl RemoteLog {
    pub fn new(remote: Arc<dyn Remote>, mirror: EmbeddedLog, lite: EmbeddedLog) -> Self {
        RemoteLog { remote, mirror, lite }
    }

    /// Appends and reports whether the frames are in the local copy already (else the tail
    /// brings them, after records of other producers that came first).
    pub async fn append_mirrored(
        &self,
        topic: &str,
        partition: PartitionId,
        frames: &mut [Frame],
    ) -> Result<(u64, bool), StorageError> {
        let offsets = self.remote.produce(topic, partition, frames).await?;
        if offsets.len() != frames.len() {
            let said = format!("{}: {} offsets for {} records", self.remote.system(), offsets.len(), frames.len());
            return Err(StorageError::Engine(said));
        }
        for (f, o) in frames.iter_mut().zip(offsets) {
            f.set_partition(partition.0);
            f.set_offset(o);
        }
        let first = frames.first().map_or(0, |f| f.header().offset);
        let contiguous = frames.windows(2).all(|w| w[1].header().offset == w[0].header().offset + 1);
        let mirrored = contiguous && matches!(self.mirror.put_mirrored(topic, partition, frames, true)?, Some(0));
        Ok((first, mirrored))
    }
}

impl Storage for RemoteLog {
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

    /// The other system keeps its own retention; this bounds the local copy.
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
