//! The only types that cross from one core to another.
//!
//! Every variant carries its reply path (a oneshot sender). Dropping a message without answering
//! drops the sender, which the waiting side sees as `Canceled` and turns into a 503: so a message
//! lost in shutdown fails its request instead of hanging it. Frames travel by handle: a `Vec` of
//! `Frame`s moves three words, never the payload bytes.

use frame_codec::Frame;
use futures::channel::oneshot;

use super::PartitionId;
use crate::storage::{StorageError, TopicMeta};
use crate::subscription::definition::Definition;

/// Appended frames get offsets `first..first + n`.
pub type AppendReply = Result<u64, StorageError>;

/// The topic's settings and whether this request created it.
pub type EnsureReply = Result<(TopicMeta, bool), StorageError>;

/// The body of [`ShardMessage::EnsureTopic`], boxed: topic creation is rare, ring slots are not.
#[derive(Debug)]
pub struct TopicRequest {
    pub topic: String,
    pub spec: Option<TopicMeta>,
}

/// A change to a subscription, decided by the owner shard of its name.
#[derive(Debug)]
pub enum SubRequest {
    Create(Definition),
    Remove(String),
}

/// What the owner shard did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubOutcome {
    Created,
    /// The same definition existed already.
    Unchanged,
    /// Another definition exists under that name; nothing changed.
    Conflict,
    Removed,
    /// No subscription of that name.
    Unknown,
}

pub type SubReply = Result<SubOutcome, StorageError>;

/// A request from one shard (or the admin thread) to another.
#[non_exhaustive]
pub enum ShardMessage {
    /// Append `frames` (all of one topic, non-empty) to `partition`, which the receiver owns.
    /// Answered once the frames are stored at the configured durability.
    /// On drop: the publisher gets 503, nothing was stored.
    Append { partition: PartitionId, frames: Vec<Frame>, reply: oneshot::Sender<AppendReply> },
    /// Return the topic's metadata, creating it first if needed; sent to the topic's meta owner,
    /// which serializes creation so concurrent first publishes agree.
    /// `spec: None` means "auto-create with the defaults"; `Some(meta)` is an explicit create
    /// that conflicts with an existing topic of other settings. The reply says whether it was
    /// created now.
    /// On drop: the caller gets 503, nothing was created.
    EnsureTopic { request: Box<TopicRequest>, reply: oneshot::Sender<EnsureReply> },
    /// Create or remove a subscription; sent to the owner shard of the subscription's name
    /// (`meta_owner`), which serializes changes so concurrent requests agree.
    /// On drop: the caller gets 503, nothing changed.
    Subscription { request: Box<SubRequest>, reply: oneshot::Sender<SubReply> },
}

impl ShardMessage {
    pub fn append(partition: PartitionId, frames: Vec<Frame>) -> (Self, oneshot::Receiver<AppendReply>) {
        let (reply, rx) = oneshot::channel();
        (ShardMessage::Append { partition, frames, reply }, rx)
    }

    pub fn ensure_topic(topic: String, spec: Option<TopicMeta>) -> (Self, oneshot::Receiver<EnsureReply>) {
        let (reply, rx) = oneshot::channel();
        (ShardMessage::EnsureTopic { request: Box::new(TopicRequest { topic, spec }), reply }, rx)
    }
}

impl ShardMessage {
    pub fn subscription(request: SubRequest) -> (Self, oneshot::Receiver<SubReply>) {
        let (reply, rx) = oneshot::channel();
        (ShardMessage::Subscription { request: Box::new(request), reply }, rx)
    }
}

// Messages sit in fixed-size ring slots: keep them small.
const _: () = assert!(std::mem::size_of::<ShardMessage>() <= 64);
