//! The RocketMQ backend: RocketMQ as the durable log behind the [`Remote`] seam (what a remote
//! log is, the local copy and the tail, is `storage::remote`'s), used purely as a log.
//!
//! * **Topics**: one RocketMQ topic per evmesh topic (`rocketmq.topic_prefix` + the name, with
//!   `.` as `|`: RocketMQ's names take no dots), its write queues as the partitions, in the
//!   order of their brokers' names then queue ids. A topic evmesh makes is made on the first
//!   master broker (by name) with one queue per partition; one an operator made over several
//!   brokers is taken with all its queues.
//! * **Writes**: the owner shard's frames go to their queue as messages in the CloudEvents
//!   RocketMQ binding (`adaptor::rocketmq`), one send per append (a batch when it carries
//!   several), and the 202 waits for the broker's answer: the queue offsets are the offsets.
//! * **Reads**: the tail thread pulls every followed queue at the local copy's end with plain
//!   pull requests: no consumer is registered, no heartbeat names a group, nothing is
//!   committed (`commitOffset` off). RocketMQ's pull request carries a group name; it is
//!   [`ASSIGN_ONLY_GROUP`], which is never subscribed, rebalanced or committed to.
//! * **The client** (`rocketmq-client-rust`) runs on a tokio runtime of its own, on one thread
//!   (`evmesh-rocketmq`); shards hand it jobs and await the answers through oneshot channels,
//!   so no core blocks on the broker.
//!
//! Nothing of the client leaves this module.

mod client;
mod tail;

use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use frame_codec::Frame;
use futures::channel::oneshot;

use super::remote::{Answer, Deliver, Follow, Remote, RemoteTopic, TopicAsk};
use super::{RocketMqSettings, StorageError};
use crate::model::PartitionId;

/// The most property bytes evmesh gives a message: RocketMQ's limit (32,767) less room for the
/// properties its client adds (`UNIQ_KEY`, `WAIT`, ...).
const PROPERTIES_MAX: usize = 32_767 - 512;

/// The group name RocketMQ's pull request carries; never subscribed, rebalanced or committed to.
pub const ASSIGN_ONLY_GROUP: &str = "evmesh-assign-only-never-joined";

/// The RocketMQ topic behind an evmesh topic (`.` is not in RocketMQ's names; `|` is, and not
/// in evmesh's).
pub fn rocketmq_topic(prefix: &str, topic: &str) -> String {
    format!("{prefix}{}", topic.replace('.', "|"))
}

/// The evmesh topic behind a RocketMQ topic under `prefix`, if it is one.
pub fn evmesh_topic(prefix: &str, name: &str) -> Option<String> {
    let t = name.strip_prefix(prefix)?.replace('|', ".");
    (crate::model::valid_topic(&t) && !t.starts_with("__evmesh.")).then_some(t)
}

/// What the client thread is asked to do.
enum Job {
    Produce {
        topic: String,
        partition: u32,
        messages: Vec<evmesh_protocol::adaptor::rocketmq::Message>,
        reply: Reply<Vec<u64>>,
    },
    /// Anything else, answered at once in a task of its own.
    Ask(Ask),
}

/// What the client thread answers besides appends.
enum Ask {
    Ensure { topic: String, ask: TopicAsk, reply: Reply<RemoteTopic> },
    Topics { reply: Reply<Vec<(String, Option<u32>)>> },
    Pull { topic: String, partition: u32, from: u64, reply: Reply<client::Pulled> },
}

type Reply<T> = oneshot::Sender<Result<T, StorageError>>;

pub(super) fn engine(what: &str, e: impl std::fmt::Display) -> StorageError {
    StorageError::Engine(format!("rocketmq {what}: {e}"))
}

/// The connection to RocketMQ, shared by every shard.
pub struct RocketMqBackend {
    settings: RocketMqSettings,
    jobs: tokio::sync::mpsc::UnboundedSender<Job>,
    follow: mpsc::Sender<Follow>,
    follow_rx: Mutex<Option<mpsc::Receiver<Follow>>>,
}

impl RocketMqBackend {
    /// Starts the client thread (its producer, admin and reader); the broker need not be up.
    pub fn connect(settings: RocketMqSettings) -> Result<Arc<RocketMqBackend>, StorageError> {
        let (jobs, rx) = tokio::sync::mpsc::unbounded_channel();
        client::start(settings.clone(), rx)?;
        let (follow, follow_rx) = mpsc::channel();
        Ok(Arc::new(RocketMqBackend { settings, jobs, follow, follow_rx: Mutex::new(Some(follow_rx)) }))
    }

    fn ask<T>(&self, job: impl FnOnce(Reply<T>) -> Job) -> oneshot::Receiver<Result<T, StorageError>> {
        let (reply, rx) = oneshot::channel();
        // A stopped client thread drops the reply: the receiver says so.
        let _ = self.jobs.send(job(reply));
        rx
    }

    fn topic(&self, topic: &str) -> String {
        rocketmq_topic(&self.settings.topic_prefix, topic)
    }
}

async fn answer<T>(rx: oneshot::Receiver<Result<T, StorageError>>) -> Result<T, StorageError> {
    rx.await.map_err(|_| StorageError::Unavailable("rocketmq client stopped"))?
}

impl Remote for RocketMqBackend {
    fn system(&self) -> &'static str {
        "rocketmq"
    }

    fn topic_prefix(&self) -> &str {
        &self.settings.topic_prefix
    }

    fn topic_refresh(&self) -> Duration {
        self.settings.topic_refresh
    }

    fn produce<'a>(&'a self, topic: &'a str, partition: PartitionId, frames: &'a [Frame]) -> Answer<'a, Vec<u64>> {
        let messages: Vec<_> = frames.iter().map(evmesh_protocol::adaptor::rocketmq::to_message).collect();
        // The broker stores at most 32 KiB of properties with a message (RocketMQ's own among
        // them): an event whose attributes are more is refused here, not in a batch it would fail.
        let properties = |m: &evmesh_protocol::adaptor::rocketmq::Message| {
            m.properties.iter().map(|(k, v)| k.len() + v.len() + 2).sum::<usize>()
                + m.keys.as_ref().map_or(0, |k| k.len() + 6)
        };
        if let Some(m) = messages.iter().find(|m| properties(m) > PROPERTIES_MAX) {
            let why = format!(
                "an event's attributes take {} bytes as RocketMQ properties; RocketMQ stores at most {PROPERTIES_MAX}",
                properties(m)
            );
            return Box::pin(async move { Err(StorageError::Limit(why)) });
        }
        let rx = self.ask(|reply| Job::Produce { topic: self.topic(topic), partition: partition.0, messages, reply });
        Box::pin(answer(rx))
    }

    fn ensure_topic<'a>(&'a self, topic: &'a str, ask: TopicAsk) -> Answer<'a, RemoteTopic> {
        let name = self.topic(topic);
        if name.len() > client::TOPIC_MAX {
            let why =
                format!("topic {topic}: its RocketMQ name {name} is longer than {} characters", client::TOPIC_MAX);
            return Box::pin(async move { Err(StorageError::Limit(why)) });
        }
        let rx = self.ask(|reply| Job::Ask(Ask::Ensure { topic: name, ask, reply }));
        Box::pin(async move {
            answer(rx).await.map_err(|e| match e {
                StorageError::NoTopic(_) => StorageError::NoTopic(topic.to_owned()),
                StorageError::Conflict { existing, .. } => StorageError::Conflict { topic: topic.to_owned(), existing },
                e => e,
            })
        })
    }

    fn topics(&self) -> Result<Vec<(String, Option<u32>)>, StorageError> {
        let rx = self.ask(|reply| Job::Ask(Ask::Topics { reply }));
        futures::executor::block_on(answer(rx))
    }

    fn follow(&self, f: Follow) {
        let _ = self.follow.send(f);
    }

    fn start_tail(&self, deliver: Deliver) -> Result<(), StorageError> {
        let Some(rx) = self.follow_rx.lock().expect("not poisoned").take() else { return Ok(()) };
        let jobs = self.jobs.clone();
        std::thread::Builder::new()
            .name("evmesh-rocketmq-tail".into())
            .spawn(move || tail::tail(jobs, rx, deliver))
            .map_err(|e| engine("tail thread", e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_names_map_both_ways() {
        assert_eq!(rocketmq_topic("", "orders.dlq"), "orders|dlq");
        assert_eq!(rocketmq_topic("p-", "acme.orders"), "p-acme|orders");
        assert_eq!(evmesh_topic("p-", "p-acme|orders").as_deref(), Some("acme.orders"));
        assert_eq!(evmesh_topic("p-", "q-acme"), None, "another prefix");
        assert_eq!(evmesh_topic("", "%RETRY%g"), None, "RocketMQ's own");
        assert_eq!(evmesh_topic("", "__evmesh|instances"), None, "evmesh's own");
    }
}
