//! The vocabulary every layer shares, at the bottom of the crate: ids ([`ShardId`],
//! [`PartitionId`]), topics as stored ([`StoredTopic`]) and where their partitions live
//! ([`placement`]), the delivery vocabulary ([`delivery`]), what became of a reply
//! ([`ReplyOutcome`]) and the wall clock ([`clock`]).
//!
//! It imports nothing from the rest of the crate, so storage, configuration, governance and the
//! delivery machine name these types without reaching up into the shard that uses them.

pub mod clock;
pub mod delivery;
pub mod ids;
pub mod placement;
pub mod reply;
pub mod topic;

pub use ids::{PartitionId, ShardId, MAX_PARTITIONS};
pub use reply::ReplyOutcome;
pub use topic::{valid_topic, StoredTopic, TopicMap};
