//! The delivery vocabulary: who owns a set of offsets, which session a delivery went to, and
//! what a client said of it. The pure delivery machine (`crate::delivery`) and the messages
//! between cores both speak it.

use super::ids::ShardId;

/// A session of acknowledged delivery, as the shards owning its partitions know it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SessionRef {
    pub shard: ShardId,
    pub id: u64,
}

/// Who owns a set of offsets: the subscription alone (`LOAD_BALANCE`), or one client of it
/// (`BROADCAST`, `MULTICAST`). Offsets are kept under `topic#subscription#partition[#client]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ConsumerKey {
    pub subscription: String,
    /// Empty for `LOAD_BALANCE`; the `clientId`, or a per-session name that is never stored.
    pub client: String,
}

/// What a client said of a delivered event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckKind {
    /// Processed: never delivered again.
    Ack,
    /// Failed: redelivered after the backoff (or dead-lettered after the last attempt).
    Nack,
    /// Every delivered offset up to and including the given one was received (SSE resume).
    UpTo,
    /// Failed, and not to be tried again for this many milliseconds (a webhook sink's
    /// `Retry-After`), nor before the backoff.
    Defer(u32),
    /// Given back without an attempt (a webhook session whose sink asked it to wait): due again
    /// after this many milliseconds, its attempt count as it was.
    Release(u32),
    /// Refused for good: dead-lettered at once, whatever attempts are left (a classic
    /// subscriber's `retCode` 3).
    Reject,
}
