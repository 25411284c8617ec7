//! A remote log's start (`storage = kafka | rocketmq`, `storage::remote`): the connection, the
//! topics known here reconciled with the broker's every `topic_refresh_ms` (made there, or
//! grown there), and the tail, which hands what it reads to the partitions' owners. The
//! cluster seam is `super::cluster`.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::applier::{announce, applier};
use super::error::StartError;
use crate::config::{Config, StorageKind};
use crate::shard::message::{Mirrored, ShardMessage};
use crate::shard::shared::{Shared, MIRROR_FAN_OUTS_HIGH};
use crate::storage::remote::{Remote, TopicAsk};
use crate::storage::Durability;

/// The remote log of this configuration, if its storage is one (the Kafka connection is made
/// before, as the cluster seam shares it).
pub(super) fn connect(config: &Config, kafka: &super::cluster::Log) -> Result<Option<Arc<dyn Remote>>, StartError> {
    #[cfg(feature = "kafka")]
    if let Some(k) = kafka {
        return Ok(Some(k.clone()));
    }
    let _ = kafka;
    match &config.storage {
        #[cfg(feature = "rocketmq")]
        StorageKind::RocketMq(settings) => {
            Ok(Some(crate::storage::rocketmq::RocketMqBackend::connect(settings.clone())? as Arc<dyn Remote>))
        }
        StorageKind::Embedded => Ok(None),
        // Kafka is connected before (above); a backend this build lacks is refused by the
        // configuration's check already.
        #[allow(unreachable_patterns)]
        other => {
            let why = format!("storage = {}: not connected in this build", other.name());
            Err(StartError::Storage(crate::storage::StorageError::Engine(why)))
        }
    }
}

/// Checks every known topic on the broker and starts the tail, which hands fetched records to
/// their owner's mailbox. Topics are followed as sessions here need them
/// (`Shared::follow_topic`), each partition from the end of its local copy.
pub(super) fn start(shared: &Arc<Shared>, remote: &Arc<dyn Remote>) -> Result<(), StartError> {
    let shards = shared.config.shards;
    // The broker may be away right now: the topics are checked from a thread of their own,
    // so the shards serve (and answer 503) meanwhile.
    let (k, to, system) = (remote.clone(), shared.clone(), remote.system());
    std::thread::Builder::new().name(format!("evmesh-{system}-topics")).spawn(move || {
        applier("remote-topics", async move {
            let mut warned = std::collections::HashSet::new();
            loop {
                match k.topics() {
                    Ok(on_broker) => reconcile_topics(&to, &*k, &on_broker.into_iter().collect(), &mut warned).await,
                    Err(e) => crate::log::warn("storage", &format!("{system}: reading the broker's topics: {e}"), &[]),
                }
                std::thread::sleep(k.topic_refresh());
            }
        })
    })?;
    let to = shared.clone();
    remote.start_tail(Box::new(move |(partition, frames)| {
        let Some(topic) = frames.first().map(|f| f.body().topic.as_str().to_owned()) else { return };
        let bytes: usize = frames.iter().map(|f| f.as_bytes().len()).sum();
        to.tail_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        let owner = crate::model::placement::owner(&topic, partition, shards);
        let msg = ShardMessage::Mirror(Box::new(Mirrored { partition, frames }));
        // Nor faster than the owner fans them out (its fan-outs yield, so they may queue).
        while to.mirror_fan_outs[owner.index()].load(Ordering::Relaxed) >= MIRROR_FAN_OUTS_HIGH {
            std::thread::sleep(Duration::from_millis(1));
        }
        // Never dropped: the local copy must not get a hole. Wait for room instead.
        to.mailboxes.post_from_thread(owner, msg);
    }))?;
    Ok(())
}

/// At start and every `topic_refresh_ms`: every topic known here
/// against what the broker has (`on_broker`, one metadata request): a count grown there is
/// taken ([`grow_topic`]), a topic missing there is made there (a new Kafka cluster, or one
/// made here while the broker was away), a lower count there is logged once and left.
async fn reconcile_topics(
    shared: &Shared,
    k: &dyn Remote,
    on_broker: &std::collections::HashMap<String, Option<u32>>,
    warned: &mut std::collections::HashSet<String>,
) {
    let known = match crate::storage::meta::list(&shared.db) {
        Ok(known) => known,
        Err(e) => {
            return crate::log::warn("storage", &format!("{}: the topics known here not read: {e}", k.system()), &[])
        }
    };
    for (topic, m) in known {
        let there = match on_broker.get(&topic) {
            Some(&Some(n)) => n,
            // There, but not described now (an error on it): left for the next read.
            Some(None) => continue,
            None => {
                let ask = TopicAsk::Create { partitions: m.partitions, exact: false };
                match k.ensure_topic(&topic, ask).await {
                    Ok(t) => {
                        warned.remove(&format!("make {topic}"));
                        t.partitions
                    }
                    // Tried again at the next read; said once.
                    Err(e) => {
                        if warned.insert(format!("make {topic}")) {
                            crate::log::warn(
                                "storage",
                                &format!(
                                    "{}: {topic} is not on the broker and could not be made there: {e}",
                                    k.system()
                                ),
                                &[],
                            );
                        }
                        continue;
                    }
                }
            }
        };
        if there > crate::model::MAX_PARTITIONS {
            if warned.insert(topic.clone()) {
                crate::log::warn(
                    "storage",
                    &format!(
                        "{}: topic {topic} has {there} partitions on the broker; evmesh serves at most {}: kept at {}",
                        k.system(),
                        crate::model::MAX_PARTITIONS,
                        m.partitions
                    ),
                    &[],
                );
            }
        } else if there > m.partitions {
            grow_topic(shared, k.system(), &topic, m, there).await;
        } else if there < m.partitions && warned.insert(topic.clone()) {
            crate::log::warn("storage", &format!("{}: {topic} has {there} partitions on the broker and {} here (a topic made again?); kept as it is here", k.system(),
                m.partitions), &[]);
        }
    }
}

/// `topic` has `to` partitions on the broker, more than `m` says (an
/// operator's `kafka-topics --alter`). Every consumer the topic's subscriptions have gets a
/// start of 0 in each new partition (all of it was written after they began), before and again
/// after the metadata takes the new count (never a lower one), so one made meanwhile gets it
/// too; a followed topic's new partitions are followed, and every shard closes the topic's
/// sessions (1012) so their consumers are made again over every partition
/// (`Shard::topic_grew`). Keys map to other partitions from then on, as for Kafka's own
/// producers. (A count past `MAX_PARTITIONS` never gets here: `reconcile_topics` logs it.)
async fn grow_topic(shared: &Shared, system: &str, topic: &str, mut m: crate::storage::TopicMeta, to: u32) {
    let from = m.partitions;
    crate::log::warn(
        "storage",
        &format!("{system}: topic {topic} grew from {from} to {to} partitions on the broker"),
        &[],
    );
    start_new_partitions(shared, topic, from, to);
    m.partitions = to;
    if let Err(e) = crate::storage::meta::put(&shared.db, topic, &m) {
        return crate::log::warn(
            "storage",
            &format!("{system}: {topic}: its new partition count not stored: {e}"),
            &[],
        );
    }
    start_new_partitions(shared, topic, from, to);
    if let (Some(s), Durability::Fsync) = (&shared.syncer, shared.config.durability) {
        if let Err(e) = s.sync_wal().await {
            crate::log::warn("storage", &format!("{system}: {topic}: its new partition count not synced: {e}"), &[]);
        }
    }
    shared.follow_grown(topic, from, to);
    announce(shared, "", topic, crate::shard::message::InterestChange::TopicGrew).await;
}

/// [`grow_topic`]'s starts: each consumer of `topic`'s subscriptions (every one has a position
/// in partition 0, stored as it was made) with none in a partition of `from..to` starts it at 0.
fn start_new_partitions(shared: &Shared, topic: &str, from: u32, to: u32) {
    use crate::model::{placement::owner, PartitionId};
    use crate::storage::offsets;
    let (db, shards) = (&shared.db, shared.config.shards);
    let subscriptions = crate::storage::meta::list_subscriptions(db).unwrap_or_default();
    for def in subscriptions.iter().filter(|d| d.topic == topic) {
        let first = owner(topic, PartitionId(0), shards);
        let consumers = offsets::list(db, first, topic, &def.subscription).unwrap_or_default();
        for c in consumers.iter().filter(|c| c.partition == 0) {
            for p in (from..to).map(PartitionId) {
                let (key, at) = (offsets::key(topic, &def.subscription, p, &c.client), owner(topic, p, shards));
                if matches!(offsets::get(db, at, &key), Ok(None)) {
                    if let Err(e) = offsets::put(db, at, &key, &offsets::Stored::at(0)) {
                        crate::log::warn(
                            "storage",
                            &format!("{topic}: the start of {} in partition {}: {e}", def.subscription, p.0),
                            &[],
                        );
                    }
                }
            }
        }
    }
}
