//! What the admin API's parts share: the log of a partition, read from the admin thread.

use crate::model::placement::owner;
use crate::model::PartitionId;
use crate::shard::shared::Shared;
use crate::storage::embedded::EmbeddedLog;

/// Partition `p` of `topic`'s log, as its owning shard keeps it (the admin thread only reads
/// through it; anything that writes goes to the owner through the mailbox).
pub(super) fn log_of(shared: &Shared, topic: &str, p: PartitionId) -> EmbeddedLog {
    let s = owner(topic, p, shared.config.shards);
    EmbeddedLog::new(
        shared.db.clone(),
        shared.logs.clone(),
        s,
        shared.config.durability,
        None,
        shared.config.lite_topic_ttl,
    )
}
