//! Shards: the state each core owns, and the only way cores talk to each other.
//!
//! Which shard owns a partition is data (`crate::model::placement`). A shard's state is touched
//! only by that shard's thread; other cores reach it through the bounded [`mailbox`] with a
//! [`message::ShardMessage`].

pub mod agents;
pub mod calls;
pub mod core;
pub mod delivery;
pub mod fanout;
pub mod mailbox;
pub mod message;
pub mod requests;
pub mod sessions;
pub mod shared;
pub mod tasks;
pub mod topics;
pub mod watch;
