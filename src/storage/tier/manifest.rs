//! What the bucket holds of a partition, and where: the manifest (its segments, oldest first,
//! and the first offset kept), one object per generation, and the objects' keys.
//!
//! Keys, under `tier.s3.prefix` (`P`):
//!
//! | key                                   | what                                              |
//! |---------------------------------------|---------------------------------------------------|
//! | `P/topics/<dir>.json`                 | a topic's name and settings (a new instance's topics) |
//! | `P/<dir>/<p>/<base 20 digits>.log`    | a sealed segment, byte for byte as on disk        |
//! | `P/<dir>/<p>/<base 20 digits>.index`  | its index file                                    |
//! | `P/<dir>/<p>/manifest/<gen 20 digits>.json` | the partition's manifest, generation `gen`  |
//!
//! `<dir>` is the partition directory's name on disk (`t.<topic>`, or `h.<SHA-256>` for a name
//! over 240 bytes). Every object is created with `If-None-Match: *` and never written again: a
//! manifest changes by a new generation (the highest is the manifest), so two writers never
//! overwrite each other; the older generations are deleted behind the new one.

use serde::{Deserialize, Serialize};

use crate::storage::TopicMeta;

/// A partition directory's name on disk, and its part of the bucket's keys.
pub fn dir_name(topic: &str) -> String {
    if topic.len() <= 240 {
        format!("t.{topic}")
    } else {
        use sha2::Digest;
        let d = sha2::Sha256::digest(topic.as_bytes());
        format!("h.{}", d.iter().map(|b| format!("{b:02x}")).collect::<String>())
    }
}

/// One sealed segment the bucket holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TieredSegment {
    pub base: u64,
    /// The offset after its last event.
    pub next: u64,
    pub bytes: u64,
    /// Its newest event's time (µs since the Unix epoch).
    pub max_ts: i64,
    pub index_bytes: u64,
}

/// A partition's manifest: the segments the bucket holds of it, contiguous, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub topic: String,
    pub partition: u32,
    pub generation: u64,
    /// Which process wrote it (random, per process): a generation found in the bucket with
    /// our writer is our own write whose answer was lost.
    #[serde(default)]
    pub writer: u64,
    /// The first offset kept (the topic's retention): segments wholly below it are deleted.
    pub start: u64,
    pub segments: Vec<TieredSegment>,
}

impl Manifest {
    pub fn new(topic: &str, partition: u32) -> Manifest {
        Manifest { topic: topic.to_owned(), partition, generation: 0, writer: 0, start: 0, segments: Vec::new() }
    }

    /// The first offset readable from the bucket.
    pub fn first(&self) -> Option<u64> {
        self.segments.first().map(|s| s.base.max(self.start))
    }

    /// The offset after the last one the bucket holds (its start when it holds none: the
    /// offsets retention passed are never handed out again).
    pub fn end(&self) -> u64 {
        self.segments.last().map_or(self.start, |s| s.next)
    }

    /// Whether the bucket holds exactly this segment (a local copy may then go).
    pub fn holds(&self, s: &crate::storage::segment::SegmentInfo) -> bool {
        let i = self.segments.partition_point(|t| t.base < s.base);
        self.segments.get(i).is_some_and(|t| t.base == s.base && t.next == s.next && t.bytes == s.bytes)
    }

    /// The segment holding `offset`, if the bucket holds it.
    pub fn holding(&self, offset: u64) -> Option<&TieredSegment> {
        let i = self.segments.partition_point(|s| s.next <= offset);
        self.segments.get(i).filter(|s| s.base <= offset)
    }

    /// Takes out the segments wholly below `start` (the topic's retention passed them).
    pub fn drain_below(&mut self, start: u64) -> Vec<TieredSegment> {
        let n = self.segments.partition_point(|s| s.next <= start);
        self.segments.drain(..n).collect()
    }
}

/// The keys of one partition's objects.
#[derive(Debug, Clone)]
pub struct Keys {
    part: String,
}

impl Keys {
    pub fn new(prefix: &str, topic: &str, partition: u32) -> Keys {
        Keys { part: join(prefix, &format!("{}/{partition}", dir_name(topic))) }
    }

    pub fn segment(&self, base: u64) -> String {
        format!("{}/{base:020}.log", self.part)
    }

    pub fn index(&self, base: u64) -> String {
        format!("{}/{base:020}.index", self.part)
    }

    pub fn manifests(&self) -> String {
        format!("{}/manifest/", self.part)
    }

    pub fn manifest(&self, generation: u64) -> String {
        format!("{}/manifest/{generation:020}.json", self.part)
    }
}

/// `prefix/rest`, or `rest` without a prefix.
pub fn join(prefix: &str, rest: &str) -> String {
    if prefix.is_empty() {
        rest.to_owned()
    } else {
        format!("{prefix}/{rest}")
    }
}

/// The record of a topic in the bucket (`P/topics/<dir>.json`): what an instance starting on
/// an empty disk makes its topics from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicRecord {
    pub name: String,
    pub meta: TopicMeta,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(base: u64, next: u64) -> TieredSegment {
        TieredSegment { base, next, bytes: 1, max_ts: 0, index_bytes: 0 }
    }

    #[test]
    fn a_manifest_finds_the_segment_holding_an_offset_and_drains_what_retention_passed() {
        let mut m = Manifest::new("t", 0);
        assert_eq!((m.first(), m.end(), m.holding(0)), (None, 0, None));
        m.start = 7;
        assert_eq!(m.end(), 7, "an emptied manifest still ends where retention left it");
        m.segments = vec![seg(10, 20), seg(20, 35), seg(35, 36)];
        assert_eq!((m.first(), m.end()), (Some(10), 36));
        assert_eq!(m.holding(9), None);
        assert_eq!(m.holding(10).map(|s| s.base), Some(10));
        assert_eq!(m.holding(34).map(|s| s.base), Some(20));
        assert_eq!(m.holding(35).map(|s| s.base), Some(35));
        assert_eq!(m.holding(36), None);
        let info = |base, next, bytes| crate::storage::segment::SegmentInfo { base, next, bytes, max_ts: 0 };
        assert!(m.holds(&info(20, 35, 1)));
        assert!(!m.holds(&info(20, 35, 2)) && !m.holds(&info(20, 34, 1)) && !m.holds(&info(0, 10, 1)));
        m.start = 25;
        assert_eq!(m.drain_below(25), vec![seg(10, 20)]);
        assert_eq!(m.first(), Some(25));
    }

    #[test]
    fn keys_name_a_partition_as_its_directory_on_disk() {
        let k = Keys::new("evmesh/prod", "orders", 3);
        assert_eq!(k.segment(42), "evmesh/prod/t.orders/3/00000000000000000042.log");
        assert_eq!(k.index(42), "evmesh/prod/t.orders/3/00000000000000000042.index");
        assert_eq!(k.manifest(7), "evmesh/prod/t.orders/3/manifest/00000000000000000007.json");
        assert_eq!(Keys::new("", "a", 0).manifests(), "t.a/0/manifest/");
        assert!(dir_name(&"x".repeat(241)).starts_with("h."));
    }
}
