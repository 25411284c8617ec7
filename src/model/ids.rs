//! Shard and partition ids.

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_ids_from_outside_are_checked() {
        assert_eq!(PartitionId::checked("2", 3), Some(PartitionId(2)));
        assert_eq!(PartitionId::checked("3", 3), None);
        assert_eq!(PartitionId::checked("-1", 3), None);
        assert_eq!(PartitionId::checked("x", 3), None);
    }
}
