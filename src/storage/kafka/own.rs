//! Reading evmesh's own one-partition topics (`__evmesh.*`): what they mean is the cluster
//! seam's (`runtime::cluster`); this is only how they are read, with `assign()` only.

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Headers;
use rdkafka::{Message, Offset, TopicPartitionList};

use super::engine;
use crate::storage::StorageError;

/// Where [`OwnTopics::read`] starts in a topic.
#[derive(Debug, Clone, Copy)]
pub enum Start {
    Beginning,
    At(i64),
}

/// A record of one of evmesh's own topics, borrowed from the consumer.
pub struct OwnRecord<'a> {
    /// The topic's evmesh name (without `kafka.topic_prefix`).
    pub topic: &'a str,
    pub offset: i64,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    pub headers: Vec<(&'a str, &'a [u8])>,
}

/// Reads evmesh's own one-partition topics (partition 0 of each) with `assign()` only.
pub struct OwnTopics {
    consumer: BaseConsumer,
    prefix: String,
}

impl OwnTopics {
    pub(super) fn new(consumer: BaseConsumer, prefix: String) -> Self {
        OwnTopics { consumer, prefix }
    }

    /// The topic's low and high watermarks (the first offset kept, the next to be written).
    pub fn ends(&self, topic: &str) -> Result<(i64, i64), StorageError> {
        let topic = format!("{}{topic}", self.prefix);
        self.consumer.fetch_watermarks(&topic, 0, Duration::from_secs(5)).map_err(|e| engine("watermarks", e))
    }

    /// Reads these topics from these points on (replacing what was read before).
    pub fn read(&self, from: &[(&str, Start)]) -> Result<(), StorageError> {
        let mut list = TopicPartitionList::new();
        for (topic, start) in from {
            let at = match start {
                Start::Beginning => Offset::Beginning,
                Start::At(o) => Offset::Offset(*o),
            };
            list.add_partition_offset(&format!("{}{topic}", self.prefix), 0, at).map_err(|e| engine("assign", e))?;
        }
        self.consumer.assign(&list).map_err(|e| engine("assign", e))
    }

    /// The next offset the consumer reads of `topic` (`None`: not known yet).
    pub fn position(&self, topic: &str) -> Option<i64> {
        let p = self.consumer.position().ok()?;
        p.find_partition(&format!("{}{topic}", self.prefix), 0)?.offset().to_raw()
    }

    /// Waits at most `wait` for the next record and hands it to `take`: `Ok(false)` when none
    /// came.
    pub fn poll(&self, wait: Duration, take: impl FnOnce(OwnRecord<'_>)) -> Result<bool, StorageError> {
        match self.consumer.poll(wait) {
            None => Ok(false),
            Some(Err(e)) => Err(engine("reading", e)),
            Some(Ok(m)) => {
                let headers = m
                    .headers()
                    .map(|h| h.iter().map(|h| (h.key, h.value.unwrap_or(&[]))).collect())
                    .unwrap_or_default();
                let topic = m.topic().strip_prefix(self.prefix.as_str()).unwrap_or(m.topic());
                take(OwnRecord { topic, offset: m.offset(), key: m.key(), value: m.payload(), headers });
                Ok(true)
            }
        }
    }
}
