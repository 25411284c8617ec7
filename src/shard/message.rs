//! The only types that cross from one core to another.
//!
//! Requests (`Append`, `EnsureTopic`, `Subscription`, `Poll`, `Reply`) carry their reply path (a
//! oneshot sender, see `mailbox::Asked`). Dropping one without answering drops the sender, which
//! the waiting side sees as `Canceled` and turns into a 503: so a request lost in shutdown fails
//! instead of hanging. The others (`Interest`, `Deliver`, `Session`, `Mirror`, `Ack`) are told,
//! not asked: nobody waits for an answer (an `Ack` may carry an `applied` signal). Frames
//! travel by handle: a `Vec` of `Frame`s moves three words, never the payload bytes.

use std::sync::Arc;

use frame_codec::Frame;
use futures::channel::oneshot;

use crate::model::delivery::{AckKind, ConsumerKey, SessionRef};
use crate::model::PartitionId;
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
    /// Created by evmesh itself (a dead-letter topic): not refused by `auto_create_topics` or
    /// `max_topics`, whose caps are for what clients name.
    pub internal: bool,
    /// Only learn a topic that exists elsewhere (storage = kafka: the broker's, made by another
    /// instance), never create one: an admin read.
    pub learn: bool,
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
    /// `max_subscriptions` are defined already; nothing changed.
    Limit,
    Removed,
    /// No subscription of that name.
    Unknown,
}

pub type SubReply = Result<SubOutcome, StorageError>;

/// Events for sessions on the receiving shard. `frames` is shared, never copied; `pick` lists
/// the indexes to deliver (`None`: all).
///
/// `session: None` is live fan-out to every `ack=none` session of the subscription there (sent
/// once per shard, however many sessions live there); `Some(id)` is acknowledged delivery to
/// that one session, with the attempt number of each picked frame in `attempts`.
#[derive(Debug)]
pub struct Delivery {
    pub subscription: String,
    pub session: Option<u64>,
    pub frames: Arc<[Frame]>,
    pub pick: Option<Vec<u32>>,
    pub attempts: Vec<u16>,
}

/// What changed about a subscription's sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InterestChange {
    /// `shard` has its first session of the subscription.
    Attach,
    /// `shard`'s last session of the subscription ended.
    Detach,
    /// The subscription was removed: every shard closes its sessions and forgets it.
    Removed,
    /// Another instance is its home now (`cluster::homes`): every shard closes its sessions
    /// (WebSocket 1012) and drops its consumers' state; what is stored stays (the new home's
    /// offsets come in over it).
    HomeMoved,
    /// Storage = kafka: the topic has more partitions now (`subscription` is empty): every shard
    /// takes the new count and closes the sessions of the topic's subscriptions (1012), whose
    /// consumers then read the new partitions too (`Shard::topic_grew`).
    TopicGrew,
    /// Its push registrations (classic subscribers' URLs) changed: each shard's webhook
    /// sessions of it look whether theirs is still there.
    Pushes,
}

/// A change of which shards want a subscription's events.
#[derive(Debug)]
pub struct Interest {
    pub subscription: String,
    pub topic: String,
    pub shard: crate::model::ShardId,
    pub change: InterestChange,
}

/// What changed about an acknowledged session.
#[derive(Debug, Clone)]
pub enum SessionChange {
    /// It attached, with its window and (`MULTICAST`) its own filters as JSON.
    Attach { window: u32, filters: Option<String>, persist: bool },
    /// It is gone: its unacknowledged events go to the consumer's other sessions at once.
    Detach,
    /// It sent credit: its new window.
    Window(u32),
}

/// A session change, sent by the session's shard to every shard.
#[derive(Debug)]
pub struct SessionEvent {
    pub consumer: ConsumerKey,
    pub topic: String,
    pub session: SessionRef,
    pub change: SessionChange,
}

/// Acknowledgements of a consumer for one partition, sent to the partition's owner.
#[derive(Debug)]
pub struct Acks {
    pub consumer: ConsumerKey,
    pub partition: PartitionId,
    pub offsets: Vec<u64>,
    pub kind: AckKind,
    /// Answered once the owner applied the acks (`POST /events/ack` answers 200 only then; a
    /// dropped sender means they were not applied).
    pub applied: Option<oneshot::Sender<()>>,
}

/// Records the Kafka tail fetched for a partition the receiver owns (offsets stamped).
#[derive(Debug)]
pub struct Mirrored {
    pub partition: PartitionId,
    pub frames: Vec<Frame>,
}

/// A long-poll forwarded to the consumer's home shard.
#[derive(Debug)]
pub struct PollRequest {
    pub spec: crate::server::SessionSpec,
    pub max: usize,
    pub wait: std::time::Duration,
    pub reply: oneshot::Sender<Result<Vec<Vec<u8>>, StorageError>>,
}

/// A reply to a request waiting on the receiver (its correlation id names that shard).
#[derive(Debug)]
pub struct ReplyMessage {
    pub id: super::requests::Correlation,
    pub frame: Frame,
    pub replier: super::requests::Replier,
    pub outcome: oneshot::Sender<Result<crate::model::ReplyOutcome, StorageError>>,
}

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
    /// The sender's shard has sessions of a subscription (or no longer has); sent to every
    /// shard, since any may own partitions of the topic. No reply.
    /// On drop: that shard's sessions get no events from the dropping shard's partitions.
    Interest(Box<Interest>),
    /// New events for the receiver's sessions of a subscription. No reply (at-most-once for
    /// `ack=none` sessions).
    /// On drop: those sessions miss these events.
    Deliver(Box<Delivery>),
    /// An acknowledged session attached, left or changed its window; sent to every shard, each
    /// of which serves the partitions of the topic it owns. No reply.
    /// On drop: that shard does not serve the session (it keeps its events for the others, or
    /// until the consumer attaches again).
    Session(Box<SessionEvent>),
    /// A long-poll request, sent to the consumer's home shard, where its one poll session lives
    /// (so polls on any connection see the same session). Replies with the events' JSON.
    /// On drop: the poller gets 503 and nothing was taken.
    Poll(Box<PollRequest>),
    /// Kafka backend: records fetched by the tail thread (sender: the admin row) for a partition
    /// the receiver owns, to store in its local copy and deliver. No reply.
    /// On drop: never dropped by the sender (it waits for room); lost only at shutdown.
    Mirror(Box<Mirrored>),
    /// Acks, nacks for the receiver's partition. No reply.
    /// On drop: those events are redelivered after their ack timeout (at-least-once holds).
    Ack(Box<Acks>),
    /// A reply for a requester waiting on the receiver; answered with what became of it.
    /// On drop: the replier gets 503 (the requester still waits, until its deadline).
    Reply(Box<ReplyMessage>),
}

impl ShardMessage {
    pub fn append(partition: PartitionId, frames: Vec<Frame>) -> (Self, oneshot::Receiver<AppendReply>) {
        let (reply, rx) = oneshot::channel();
        (ShardMessage::Append { partition, frames, reply }, rx)
    }

    pub fn ensure_topic(
        topic: String,
        spec: Option<TopicMeta>,
        internal: bool,
    ) -> (Self, oneshot::Receiver<EnsureReply>) {
        let (reply, rx) = oneshot::channel();
        let request = Box::new(TopicRequest { topic, spec, internal, learn: false });
        (ShardMessage::EnsureTopic { request, reply }, rx)
    }

    /// An [`ShardMessage::EnsureTopic`] that only learns a topic the broker has (storage =
    /// kafka) and never creates one; on the embedded log, the topic as it is here.
    pub fn learn_topic(topic: String) -> (Self, oneshot::Receiver<EnsureReply>) {
        let (reply, rx) = oneshot::channel();
        let request = Box::new(TopicRequest { topic, spec: None, internal: false, learn: true });
        (ShardMessage::EnsureTopic { request, reply }, rx)
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
