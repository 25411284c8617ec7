//! A shard's topics and subscriptions: the settings it knows (cached, or made and looked up
//! on the topic's meta owner, or on the Kafka broker), and the subscription changes decided on
//! the owner of a subscription's name.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

use super::mailbox::Overflow;
use super::message::{EnsureReply, ShardMessage, SubOutcome, SubReply, SubRequest};
use crate::model::placement::{meta_owner, owned_partitions};
use crate::model::{PartitionId, StoredTopic};
use crate::storage::{meta, Durability, StorageError, TopicMeta};

use super::core::{KnownTopic, Shard, LITE_META};

/// How long a name the broker said it does not have is answered 404 without asking again.
const ABSENT_FOR: Duration = Duration::from_secs(2);
/// How long a lookup the broker could not answer (away, say) is answered so without asking
/// again.
const FAILED_FOR: Duration = Duration::from_secs(1);
/// Names remembered so at most (per shard).
const MAX_ABSENT: usize = 4096;
/// Topics a shard creates or looks up on the broker at once at most (asks waiting for one of
/// them not counted: they ask nothing).
const MAX_LOOKUPS: usize = 64;
/// How long an ask for a topic waits for another ask for it to end.
const TOPIC_WAIT: Duration = Duration::from_secs(30);

/// A topic being made (or looked up) on its meta owner: its entry in `Shard::making`, removed
/// on drop, however the ask ends (a caller dropped mid-way too), and its waiters woken.
struct Making<'a> {
    making: &'a RefCell<HashMap<String, Vec<futures::channel::oneshot::Sender<()>>>>,
    topic: &'a str,
}

impl<'a> Making<'a> {
    fn start(making: &'a RefCell<HashMap<String, Vec<futures::channel::oneshot::Sender<()>>>>, topic: &'a str) -> Self {
        making.borrow_mut().insert(topic.to_owned(), Vec::new());
        Making { making, topic }
    }
}

impl Drop for Making<'_> {
    fn drop(&mut self) {
        for waiter in self.making.borrow_mut().remove(self.topic).unwrap_or_default() {
            let _ = waiter.send(());
        }
    }
}

/// A slot of a cap (`max_topics`, `max_subscriptions`) claimed for what is being made: given
/// back on drop unless kept (it was stored), however the making ends.
struct Claim<'a> {
    count: &'a std::sync::atomic::AtomicUsize,
    kept: bool,
}

impl<'a> Claim<'a> {
    /// A slot, if fewer than `max` are taken.
    fn take(count: &'a std::sync::atomic::AtomicUsize, max: usize) -> Option<Self> {
        if count.fetch_add(1, std::sync::atomic::Ordering::AcqRel) >= max {
            count.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
            return None;
        }
        Some(Claim { count, kept: false })
    }

    fn keep(mut self) {
        self.kept = true;
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        if !self.kept {
            self.count.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
        }
    }
}

/// The partition count of a topic the broker has, if evmesh serves that many.
fn served(topic: &str, partitions: u32) -> Result<u32, StorageError> {
    if (1..=crate::model::MAX_PARTITIONS).contains(&partitions) {
        Ok(partitions)
    } else {
        Err(StorageError::Limit(format!(
            "topic {topic} has {partitions} partitions in Kafka; evmesh serves topics of 1 to {}",
            crate::model::MAX_PARTITIONS
        )))
    }
}

impl Shard {
    /// Creates or checks a topic; only the topic's meta owner runs this, and one ask per topic
    /// at a time, so creation is serial. `learn`: only take one the broker has (storage =
    /// kafka), never create one.
    pub(crate) async fn ensure_topic_local(
        &self,
        topic: &str,
        spec: Option<TopicMeta>,
        internal: bool,
        learn: bool,
    ) -> EnsureReply {
        // Another ask for this topic is at the broker: wait (at most TOPIC_WAIT) for it to
        // end, then see what it made.
        let waited = std::time::Instant::now();
        loop {
            let rx = match self.making.borrow_mut().get_mut(topic) {
                Some(waiting) => {
                    let (tx, rx) = futures::channel::oneshot::channel();
                    waiting.push(tx);
                    rx
                }
                None => break,
            };
            let left = TOPIC_WAIT.saturating_sub(waited.elapsed());
            if monoio::time::timeout(left, rx).await.is_err() {
                return Err(StorageError::Unavailable("the topic is still being made on the broker"));
            }
        }
        if let Some(existing) = meta::get(&self.shared.db, topic)? {
            return match spec {
                Some(s) if s != existing => {
                    Err(StorageError::Conflict { topic: topic.to_owned(), existing: existing.partitions })
                }
                _ => Ok((existing, false)),
            };
        }
        let c = &self.shared.config;
        // On the embedded log a topic named, not created, exists here or not at all; over Kafka
        // it may be the broker's already, and is looked up there.
        let may_create = internal || spec.is_some() || (!learn && c.auto_create_topics);
        if !may_create && !self.shared.clustered_log() {
            return Err(StorageError::NoTopic(topic.to_owned()));
        }
        // Ended however this ask ends, dropped mid-way included: its waiters go on.
        let _making = Making::start(&self.making, topic);
        self.make_topic(topic, spec, internal, may_create).await
    }

    /// [`Shard::ensure_topic_local`] for a topic not here: made (or, `may_create` false,
    /// only looked up on the broker), counted against `max_topics` unless `internal`.
    async fn make_topic(&self, topic: &str, spec: Option<TopicMeta>, internal: bool, may_create: bool) -> EnsureReply {
        let (db, c) = (&self.shared.db, &self.shared.config);
        let count = &self.shared.topic_count;
        let mut m = spec.unwrap_or(TopicMeta {
            partitions: c.default_partitions,
            retention_ms: c.retention_ms,
            retention_bytes: c.retention_bytes,
        });
        let full = || StorageError::Limit(format!("max_topics ({}) topics exist", c.max_topics));
        // A lookup goes first (a name the broker does not have is a 404, not a claim on
        // max_topics; nothing is asked once the cap is reached); a creation claims its slot
        // first (nothing is made past the cap).
        let mut known: Option<(u32, bool)> = None;
        if let (Some(k), false) = (&self.shared.remote, may_create) {
            if count.load(std::sync::atomic::Ordering::Acquire) >= c.max_topics {
                return Err(full());
            }
            known = Some((self.look_up(k.as_ref(), topic).await?, false));
        }
        // Meta owners of different topics create concurrently: a slot is claimed first, given
        // back unless the topic is stored, however this ask ends.
        let claim = Claim::take(count, if internal { usize::MAX } else { c.max_topics }).ok_or_else(full)?;
        if let (Some(k), None) = (&self.shared.remote, known) {
            // The topic is the broker's: created there first, or, made by another instance (or
            // a Kafka tool), taken with the count it has there; only an explicit create with
            // another count conflicts. Read once sessions here need it
            // (`Shared::follow_topic`), from its start: events other producers wrote to an
            // existing topic are delivered too.
            let ask = crate::storage::remote::TopicAsk::Create { partitions: m.partitions, exact: spec.is_some() };
            let t = k.ensure_topic(topic, ask).await?;
            known = Some((t.partitions, t.created));
        }
        let created = match known {
            Some((partitions, created)) => {
                m.partitions = served(topic, partitions)?;
                created
            }
            None => true,
        };
        meta::put(db, topic, &m)?;
        claim.keep();
        self.sync_metadata().await?;
        Ok((m, created))
    }

    /// Storage = kafka: the partition count the broker has for `topic`, which is not here.
    /// A name it does not have is remembered for [`ABSENT_FOR`], and at most
    /// [`MAX_LOOKUPS`] are asked at once per shard (503 past them): a client naming topics at
    /// random costs the broker a bounded number of requests.
    async fn look_up(&self, k: &dyn crate::storage::remote::Remote, topic: &str) -> Result<u32, StorageError> {
        let now = std::time::Instant::now();
        if let Some((_, e)) = self.absent.borrow().get(topic).filter(|(until, _)| *until > now) {
            return Err(e.clone());
        }
        if self.making.borrow().len() > MAX_LOOKUPS {
            return Err(StorageError::Unavailable("too many topics are being looked up on the broker"));
        }
        let answer = k.ensure_topic(topic, crate::storage::remote::TopicAsk::Describe).await;
        if let Err(e) = &answer {
            let now = std::time::Instant::now();
            let until = now + if matches!(e, StorageError::NoTopic(_)) { ABSENT_FOR } else { FAILED_FOR };
            let mut absent = self.absent.borrow_mut();
            if absent.len() >= MAX_ABSENT {
                absent.retain(|_, (until, _)| *until > now);
            }
            if absent.len() < MAX_ABSENT {
                absent.insert(topic.to_owned(), (until, e.clone()));
            }
        }
        answer.map(|t| t.partitions)
    }

    /// With `fsync` durability, waits until metadata just written is on the device.
    async fn sync_metadata(&self) -> Result<(), StorageError> {
        match &self.shared.syncer {
            Some(s) if self.shared.config.durability == Durability::Fsync => s.sync_wal().await,
            _ => Ok(()),
        }
    }

    /// Creates or removes a subscription; only the owner shard of its name runs this.
    pub(crate) async fn subscription_local(self: &Rc<Self>, request: SubRequest) -> SubReply {
        let db = &self.shared.db;
        let outcome = match request {
            SubRequest::Create(def) => match meta::get_subscription(db, &def.subscription)? {
                Some(existing) if existing.same_as(&def) => SubOutcome::Unchanged,
                Some(_) => SubOutcome::Conflict,
                None => {
                    let max = self.shared.config.max_subscriptions;
                    let Some(claim) = Claim::take(&self.shared.subscription_count, max) else {
                        return Ok(SubOutcome::Limit);
                    };
                    meta::put_subscription(db, &def)?;
                    claim.keep();
                    if let (Some(_), Some(start)) = (&def.sink, self.sink_starter.get()) {
                        start(self, def);
                    }
                    SubOutcome::Created
                }
            },
            SubRequest::Remove(name) => match meta::get_subscription(db, &name)? {
                None => SubOutcome::Unknown,
                Some(_) => {
                    meta::delete_subscription(db, &name)?;
                    // Its classic push URLs go with it.
                    let under = format!("{name} ");
                    for (id, _) in meta::list_policy_under::<serde_json::Value>(db, meta::Policy::Push, &under)? {
                        meta::delete_policy(db, meta::Policy::Push, &id)?;
                    }
                    self.shared.subscription_count.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
                    SubOutcome::Removed
                }
            },
        };
        if matches!(outcome, SubOutcome::Created | SubOutcome::Removed) {
            self.sync_metadata().await?;
        }
        Ok(outcome)
    }

    /// Creates or removes a subscription through the owner shard of its name.
    pub async fn subscription(self: &Rc<Self>, request: SubRequest) -> SubReply {
        let name = match &request {
            SubRequest::Create(d) => d.subscription.as_str(),
            SubRequest::Remove(n) => n.as_str(),
        };
        let owner = meta_owner(name, self.shards());
        // A subscription change (an unsubscribe above all) is control: never lost to a full ring.
        let local = |r| self.subscription_local(r);
        self.on_owner(owner, request, local, (ShardMessage::subscription, Overflow::Wait)).await
    }

    /// The topic's settings, creating it with the defaults (or `spec`) if it does not exist.
    /// `internal`: evmesh's own (a dead-letter topic), not subject to the client caps.
    pub async fn topic(self: &Rc<Self>, topic: &str, spec: Option<TopicMeta>, internal: bool) -> EnsureReply {
        if StoredTopic::new(topic).is_lite() {
            // A lite topic: one partition, no metadata row, created by its first append.
            return Ok((LITE_META, false));
        }
        if spec.is_none() {
            if let Some(known) = self.topics.borrow().get(topic) {
                return Ok((known.meta, false));
            }
        }
        let owner = meta_owner(topic, self.shards());
        let local = |spec| self.ensure_topic_local(topic, spec, internal, false);
        let remote = |spec| ShardMessage::ensure_topic(topic.to_owned(), spec, internal);
        let reply = self.on_owner(owner, spec, local, (remote, Overflow::Shed)).await;
        if let Ok((m, _)) = &reply {
            self.know_topic(topic, *m);
        }
        reply
    }

    /// Caches a topic's settings here. Never fewer partitions than cached: a topic only grows
    /// (storage = kafka, [`Shard::topic_grew`]), and an answer read before a growth may arrive
    /// after it.
    pub(super) fn know_topic(&self, topic: &str, m: TopicMeta) {
        let mut topics = self.topics.borrow_mut();
        if topics.get(topic).is_some_and(|k| k.meta.partitions > m.partitions) {
            return;
        }
        let mine = owned_partitions(topic, m.partitions, self.id, self.shards()).collect();
        topics.insert(topic.to_owned(), KnownTopic { meta: m, mine });
    }

    /// The partition count of an existing topic (this shard's cache, else the metadata); never
    /// creates one.
    pub fn partitions_of(&self, topic: &str) -> Option<u32> {
        if StoredTopic::new(topic).is_lite() {
            return Some(1);
        }
        if let Some(known) = self.topics.borrow().get(topic) {
            return Some(known.meta.partitions);
        }
        meta::get(&self.shared.db, topic).ok().flatten().map(|m| m.partitions)
    }

    /// The partition for an unkeyed event: one this shard owns if any, so no core hop is needed.
    /// `topic` must have been resolved with [`Shard::topic`] first.
    pub fn local_partition(&self, topic: &str, meta: &TopicMeta) -> PartitionId {
        let n = self.cursor.get();
        self.cursor.set(n.wrapping_add(1));
        let topics = self.topics.borrow();
        let mine: &[PartitionId] = topics.get(topic).map_or(&[][..], |known| &known.mine[..]);
        if mine.is_empty() {
            PartitionId((n % meta.partitions as usize) as u32)
        } else {
            mine[n % mine.len()]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An ask for a topic dropped mid-way (its caller gone: a WebSocket session closed while
    /// its publish waited for the broker) still ends its entry and wakes the asks waiting for
    /// it; before, the entry stayed and every later ask for the topic waited forever.
    #[test]
    fn a_dropped_ask_for_a_topic_ends_its_entry_and_wakes_its_waiters() {
        let making = RefCell::new(HashMap::new());
        let guard = Making::start(&making, "orders");
        let (tx, mut rx) = futures::channel::oneshot::channel();
        making.borrow_mut().get_mut("orders").unwrap().push(tx);
        assert_eq!(rx.try_recv(), Ok(None), "waiting while the ask runs");
        drop(guard);
        assert!(making.borrow().is_empty());
        assert_eq!(rx.try_recv(), Ok(Some(())), "woken");
    }

    /// A `max_topics` slot is given back unless the topic was stored, however the ask ends.
    #[test]
    fn a_topic_slot_is_given_back_unless_kept() {
        let count = std::sync::atomic::AtomicUsize::new(0);
        let load = || count.load(std::sync::atomic::Ordering::Relaxed);
        drop(Claim::take(&count, 2).unwrap());
        assert_eq!(load(), 0);
        Claim::take(&count, 2).unwrap().keep();
        let second = Claim::take(&count, 2).unwrap();
        assert!(Claim::take(&count, 2).is_none(), "the cap");
        assert_eq!(load(), 2);
        drop(second);
        assert_eq!(load(), 1);
    }
}
