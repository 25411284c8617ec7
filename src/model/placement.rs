//! Where a topic's partitions live, and which partition an event goes to.
//!
//! Ownership is data: [`owner`] is the one function that says which shard owns a partition,
//! and every caller goes through it. [`partition_for_key`] is Kafka's default partitioner
//! (murmur2 of the key, made positive, modulo the partition count), so Kafka clients and evmesh
//! agree on where a `partitionkey` lands; [`partition_of`] is the one place an event's
//! `partitionkey` picks its partition.

use frame_codec::Frame;

use super::ids::{PartitionId, ShardId};
use super::topic::{StoredTopic, LITE_KINDS};

/// Partitions of each lite parent topic (placement: stable for a data directory).
pub const LITE_PARTITIONS: u32 = 64;

/// FNV-1a: spreads topics over shards. Stable across versions: it decides where data lives.
fn topic_hash(topic: &str) -> u32 {
    topic.bytes().fold(0x811c_9dc5u32, |h, b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193))
}

/// The parent topic (`lite.<kind>`, [`LITE_PARTITIONS`] partitions) and partition a stored
/// lite topic is multiplexed onto: murmur2 of the scoped name picks it, as Kafka's partitioner
/// would.
fn lite_parent(stored: StoredTopic<'_>) -> (&'static str, PartitionId) {
    let (_, local) = stored.lite_parts();
    let kind = LITE_KINDS
        .iter()
        .position(|k| local.starts_with(k) && local[k.len()..].starts_with('.'))
        .map_or("lite.session", |i| ["lite.agent", "lite.client", "lite.session"][i]);
    (kind, partition_for_key(stored.scoped().as_bytes(), LITE_PARTITIONS))
}

/// The shard that owns `partition` of `topic`. Consecutive partitions go to consecutive shards,
/// starting at a per-topic point, so every shard owns some partitions of any topic with at least
/// as many partitions as shards. A lite topic is owned by the owner of its parent partition.
pub fn owner(topic: &str, partition: PartitionId, shards: usize) -> ShardId {
    let stored = StoredTopic::new(topic);
    if stored.is_lite() {
        let (parent, p) = lite_parent(stored);
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

/// The partition `frame`'s `partitionkey` picks in a `partitions`-partition topic; `None`
/// without one (the caller's own choice then: round robin, or where it was before).
pub fn partition_of(frame: &Frame, partitions: u32) -> Option<PartitionId> {
    frame.body().attr_str("partitionkey").map(|key| partition_for_key(key.as_bytes(), partitions))
}

/// Kafka's murmur2 (`org.apache.kafka.common.utils.Utils.murmur2`).
pub fn murmur2(data: &[u8]) -> u32 {
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let mut h: u32 = 0x9747_b28c ^ data.len() as u32;
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    if rest.len() >= 3 {
        h ^= u32::from(rest[2]) << 16;
    }
    if rest.len() >= 2 {
        h ^= u32::from(rest[1]) << 8;
    }
    if !rest.is_empty() {
        h ^= u32::from(rest[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h
}

/// The partition Kafka's default partitioner picks for `key`.
pub fn partition_for_key(key: &[u8], partitions: u32) -> PartitionId {
    PartitionId((murmur2(key) & 0x7fff_ffff) % partitions)
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

    /// Vectors from Apache Kafka's `UtilsTest.testMurmur2`.
    #[test]
    fn matches_kafka_vectors() {
        let cases: [(&[u8], i32); 6] = [
            (b"21", -973_932_308),
            (b"foobar", -790_332_482),
            (b"a-little-bit-long-string", -985_981_536),
            (b"a-little-bit-longer-string", -1_486_304_829),
            (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58_897_971),
            (b"abc", 479_470_107),
        ];
        for (key, want) in cases {
            assert_eq!(murmur2(key) as i32, want, "{:?}", String::from_utf8_lossy(key));
        }
        assert_eq!(partition_for_key(b"foobar", 50), PartitionId(16));
    }
}
