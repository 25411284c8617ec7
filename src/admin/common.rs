//! What the admin API's parts share: the log of a partition, read from the admin thread.

use crate::model::placement::owner;
use crate::model::PartitionId;
use crate::shard::shared::Shared;
use crate::storage::embedded::EmbeddedLog;
use crate::storage::{Storage, StorageError};

/// How long an admin read waits for tiered history being fetched from the bucket.
const TIER_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

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

/// Up to `max` events of a partition from `from` (see `Storage::read`); history in the tier's
/// bucket not at hand yet is waited for, up to [`TIER_WAIT`], without holding the admin thread.
pub(super) async fn read_events(
    shared: &Shared,
    (topic, p): (&str, PartitionId),
    from: u64,
    (max, max_bytes): (usize, usize),
) -> Result<Vec<frame_codec::Frame>, StorageError> {
    let log = log_of(shared, topic, p);
    let deadline = std::time::Instant::now() + TIER_WAIT;
    loop {
        match log.read(topic, p, from, max, max_bytes) {
            Err(StorageError::Unavailable(crate::storage::tier::FETCHING)) if std::time::Instant::now() < deadline => {
                monoio::time::sleep(std::time::Duration::from_millis(10)).await
            }
            r => return r,
        }
    }
}
