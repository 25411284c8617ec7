//! Shards: ids, who owns what, and the only way cores talk to each other.
//!
//! Ownership is data: [`owner`] is the one function that says which shard owns a partition, and
//! every caller goes through it. A shard's state is touched only by that shard's thread; other
//! cores reach it through the bounded [`mailbox`] with a [`message::ShardMessage`].

pub mod agents;
pub mod calls;
pub mod core;
pub mod delivery;
pub mod mailbox;
pub mod message;
pub mod partitioner;
pub mod pump;
pub mod requests;
pub mod sessions;
pub mod shared;
pub mod tasks;
pub mod watch;

use std::fmt;

/// Index of a shard (one pinned thread, one monoio runtime).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ShardId(pub u16);

impl ShardId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for ShardId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "shard-{}", self.0)
    }
}

/// A partition index within a topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PartitionId(pub u32);

impl PartitionId {
    /// Checks a partition number from outside (a URL, a request) against the topic's count.
    pub fn checked(raw: &str, partitions: u32) -> Option<PartitionId> {
        raw.parse::<u32>().ok().filter(|p| *p < partitions).map(PartitionId)
    }
}

/// The most partitions a topic may have.
pub const MAX_PARTITIONS: u32 = 4096;

/// Whether `name` is a valid topic name: `[A-Za-z0-9._-]{1,249}`.
pub fn valid_topic(name: &str) -> bool {
    (1..=249).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && !name.starts_with(crate::cluster::RESERVED_PREFIX)
}

/// FNV-1a: spreads topics over shards. Stable across versions: it decides where data lives.
fn topic_hash(topic: &str) -> u32 {
    topic.bytes().fold(0x811c_9dc5u32, |h, b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193))
}

/// Lite topics (RocketMQ's RIP-83): light per-entity topics a client names `agent.<id>`,
/// `client.<id>` or `session.<id>`, created implicitly, each one partition (0) with its own dense
/// offsets, expiring after `lite_topic_ttl_ms` without traffic. They are stored under the scoped
/// name with a `:` in front (a byte no topic name has, so nothing collides) and multiplexed onto
/// the partitions of a parent topic per kind, `lite.<kind>` with [`LITE_PARTITIONS`] partitions
/// (murmur2 of the name picks one, as Kafka's partitioner would): the shard owning that parent
/// partition owns the lite topic. They have no metadata row and no slot of `max_topics`.
pub const LITE_KINDS: [&str; 3] = ["agent", "client", "session"];

/// Partitions of each lite parent topic (placement: stable for a data directory).
pub const LITE_PARTITIONS: u32 = 64;

/// Whether a topic name as the client wrote it names a lite topic.
pub fn is_lite(local: &str) -> bool {
    LITE_KINDS.iter().any(|k| local.strip_prefix(k).is_some_and(|rest| rest.starts_with('.') && rest.len() > 1))
}

/// The stored name of a lite topic whose scoped (tenant-prefixed) name is `scoped`.
pub fn lite_stored(scoped: &str) -> String {
    format!(":{scoped}")
}

/// The parent topic and partition a stored lite topic is multiplexed onto.
fn lite_parent(stored: &str) -> (&'static str, PartitionId) {
    let name = &stored[1..];
    // `kind.id`, or `tenant.kind.id` (tenant names have no dots).
    let local = if is_lite(name) { name } else { name.split_once('.').map_or(name, |(_, rest)| rest) };
    let kind = LITE_KINDS
        .iter()
        .position(|k| local.starts_with(k) && local[k.len()..].starts_with('.'))
        .map_or("lite.session", |i| ["lite.agent", "lite.client", "lite.session"][i]);
    (kind, partitioner::partition_for_key(name.as_bytes(), LITE_PARTITIONS))
}

/// The shard that owns `partition` of `topic`. Consecutive partitions go to consecutive shards,
/// starting at a per-topic point, so every shard owns some partitions of any topic with at least
/// as many partitions as shards. A lite topic (stored name `:...`) is owned by the owner of its
/// parent partition.
pub fn owner(topic: &str, partition: PartitionId, shards: usize) -> ShardId {
    if topic.starts_with(':') {
        let (parent, p) = lite_parent(topic);
        return owner(parent, p, shards);
    }
    let start = topic_hash(topic) as usize % shards;
    ShardId(((start + partition.0 as usize) % shards) as u16)
}

/// The shard that holds a topic's metadata and serializes its creation: the owner of partition 0.
pub fn meta_owner(topic: &str, shards: usize) -> ShardId {
    owner(topic, PartitionId(0), shards)
}

/// The partitions of a `partitions`-partition topic that `shard` owns, in order.
pub fn owned_partitions(
    topic: &str,
    partitions: u32,
    shard: ShardId,
    shards: usize,
) -> impl Iterator<Item = PartitionId> + '_ {
    (0..partitions).map(PartitionId).filter(move |p| owner(topic, *p, shards) == shard)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shard_owns_a_partition_when_partitions_cover_shards() {
        for shards in 1..8 {
            for topic in ["a", "orders", "x.y-z_1"] {
                for s in 0..shards {
                    let n = owned_partitions(topic, shards as u32, ShardId(s as u16), shards).count();
                    assert_eq!(n, 1, "{topic} shard {s} of {shards}");
                }
            }
        }
    }

    #[test]
    fn topic_names() {
        assert!(valid_topic("orders.v1_A-9"));
        assert!(valid_topic(&"a".repeat(249)));
        assert!(!valid_topic(&"a".repeat(250)));
        assert!(!valid_topic(""));
        assert!(!valid_topic("a/b"));
        assert!(!valid_topic("a b"));
        // The broker's own Kafka topics (heartbeats, offsets) are no client's.
        assert!(!valid_topic("__evmesh.instances"));
        assert!(valid_topic("__evmesh") && valid_topic("_evmesh.x"));
    }

    #[test]
    fn partition_ids_from_outside_are_checked() {
        assert_eq!(PartitionId::checked("2", 3), Some(PartitionId(2)));
        assert_eq!(PartitionId::checked("3", 3), None);
        assert_eq!(PartitionId::checked("-1", 3), None);
        assert_eq!(PartitionId::checked("x", 3), None);
    }
}
