//! The cluster's appliers, as the runtime starts them (SPEC, "Many instances"): this
//! instance's heartbeat, and what the cluster thread reads from evmesh's own Kafka topics
//! applied here (definitions, claims, replicated offsets, forwarded replies), each on a thread
//! of its own with a runtime of its own (`applier`) when it waits for the shards; and the Kafka
//! log's start (the topics reconciled with the broker's, the tail). The view they feed is
//! `crate::cluster`; the records are read and written by `storage::kafka`.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::error::StartError;
use crate::shard::mailbox::{Overflow, Sender};
use crate::shard::shared::Shared;
#[cfg(feature = "kafka")]
use crate::{
    shard::message::{Mirrored, ShardMessage},
    shard::shared::MIRROR_FAN_OUTS_HIGH,
    storage::kafka::KafkaBackend,
    storage::Durability,
};

/// Runs one of the cluster's appliers (a thread of its own that waits for the shards' answers)
/// on a runtime of its own, whose timer bounds those waits (`Mailboxes::ask`).
#[cfg(feature = "kafka")]
fn applier(what: &str, run: impl std::future::Future<Output = ()>) {
    let runtime = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new().enable_timer().build();
    if let Err(e) = runtime.map(|mut r| r.block_on(run)) {
        eprintln!("evmesh: the {what} thread could not start its runtime: {e}");
    }
}

#[cfg(feature = "kafka")]
/// Checks every known topic on the broker and starts the tail, which hands fetched records to
/// their owner's mailbox. Topics are followed as sessions here need them
/// (`Shared::follow_topic`), each partition from the end of its local copy.
pub(super) fn start_kafka(shared: &Arc<Shared>, kafka: &Arc<KafkaBackend>) -> Result<(), StartError> {
    let shards = shared.config.shards;
    // The broker may be away right now: the topics are checked from a thread of their own,
    // so the shards serve (and answer 503) meanwhile.
    let (k, to) = (kafka.clone(), shared.clone());
    std::thread::Builder::new().name("evmesh-kafka-topics".into()).spawn(move || {
        applier("kafka-topics", async move {
            let mut warned = std::collections::HashSet::new();
            loop {
                match k.topics() {
                    Ok(on_broker) => reconcile_topics(&to, &k, &on_broker.into_iter().collect(), &mut warned).await,
                    Err(e) => eprintln!("evmesh: kafka: reading the broker's topics: {e}"),
                }
                std::thread::sleep(k.topic_refresh());
            }
        })
    })?;
    let to = shared.clone();
    kafka.start_tail(move |(partition, frames)| {
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
    })?;
    Ok(())
}

/// Storage = kafka, at start and every `kafka.topic_refresh_ms`: every topic known here
/// against what the broker has (`on_broker`, one metadata request): a count grown there is
/// taken ([`grow_topic`]), a topic missing there is made there (a new Kafka cluster, or one
/// made here while the broker was away), a lower count there is logged once and left.
#[cfg(feature = "kafka")]
async fn reconcile_topics(
    shared: &Shared,
    k: &KafkaBackend,
    on_broker: &std::collections::HashMap<String, Option<u32>>,
    warned: &mut std::collections::HashSet<String>,
) {
    use crate::storage::kafka::TopicAsk;
    let known = match crate::storage::meta::list(&shared.db) {
        Ok(known) => known,
        Err(e) => return eprintln!("evmesh: kafka: the topics known here not read: {e}"),
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
                            eprintln!("evmesh: kafka: {topic} is not on the broker and could not be made there: {e}");
                        }
                        continue;
                    }
                }
            }
        };
        if there > crate::model::MAX_PARTITIONS {
            if warned.insert(topic.clone()) {
                eprintln!(
                    "evmesh: kafka: topic {topic} has {there} partitions on the broker; evmesh serves at most {}: kept at {}",
                    crate::model::MAX_PARTITIONS,
                    m.partitions
                );
            }
        } else if there > m.partitions {
            grow_topic(shared, &topic, m, there).await;
        } else if there < m.partitions && warned.insert(topic.clone()) {
            eprintln!(
                "evmesh: kafka: {topic} has {there} partitions on the broker and {} here (a topic made again?); kept as it is here",
                m.partitions
            );
        }
    }
}

/// Storage = kafka: `topic` has `to` partitions on the broker, more than `m` says (an
/// operator's `kafka-topics --alter`). Every consumer the topic's subscriptions have gets a
/// start of 0 in each new partition (all of it was written after they began), before and again
/// after the metadata takes the new count (never a lower one), so one made meanwhile gets it
/// too; a followed topic's new partitions are followed, and every shard closes the topic's
/// sessions (1012) so their consumers are made again over every partition
/// (`Shard::topic_grew`). Keys map to other partitions from then on, as for Kafka's own
/// producers. (A count past `MAX_PARTITIONS` never gets here: `reconcile_topics` logs it.)
#[cfg(feature = "kafka")]
async fn grow_topic(shared: &Shared, topic: &str, mut m: crate::storage::TopicMeta, to: u32) {
    let from = m.partitions;
    eprintln!("evmesh: kafka: topic {topic} grew from {from} to {to} partitions on the broker");
    start_new_partitions(shared, topic, from, to);
    m.partitions = to;
    if let Err(e) = crate::storage::meta::put(&shared.db, topic, &m) {
        return eprintln!("evmesh: kafka: {topic}: its new partition count not stored: {e}");
    }
    start_new_partitions(shared, topic, from, to);
    if let (Some(s), Durability::Fsync) = (&shared.syncer, shared.config.durability) {
        if let Err(e) = s.sync_wal().await {
            eprintln!("evmesh: kafka: {topic}: its new partition count not synced: {e}");
        }
    }
    shared.follow_grown(topic, from, to);
    announce(shared, "", topic, crate::shard::message::InterestChange::TopicGrew).await;
}

/// [`grow_topic`]'s starts: each consumer of `topic`'s subscriptions (every one has a position
/// in partition 0, stored as it was made) with none in a partition of `from..to` starts it at 0.
#[cfg(feature = "kafka")]
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
                        eprintln!(
                            "evmesh: kafka: {topic}: the start of {} in partition {}: {e}",
                            def.subscription, p.0
                        );
                    }
                }
            }
        }
    }
}
/// This instance's heartbeat: who it is, where clients reach it, its load (see `cluster`).
fn heartbeat_of(shared: &Shared, load: &mut crate::cluster::LoadSampler) -> crate::cluster::Heartbeat {
    let m = &shared.metrics;
    let now = Instant::now();
    let (bytes_per_second, cpu_percent) = load.sample(now, crate::sys::process_cpu_us(), m.total(|s| &s.bytes_stored));
    crate::cluster::Heartbeat {
        instance_id: shared.config.instance_id.clone(),
        advertised_url: shared.config.advertised_url.clone(),
        sessions: m.total(|s| &s.connections_open),
        bytes_per_second,
        cpu_percent,
        sent_ms: crate::model::clock::now_micros() / 1000,
    }
}

/// A subscription defined (or removed, `None`) at some instance, read from Kafka, applied
/// here as the traffic API would (its topic ensured, then the definition through the owner of
/// its name; a removal closes the sessions attached here). A definition that differs from the
/// one here is logged and left (the one here stays). Runs on the cluster thread, waiting for
/// the shards' answers.
async fn apply_definition(shared: &Shared, name: &str, json: Option<&[u8]>) {
    use crate::model::placement::meta_owner;
    use crate::shard::message::{InterestChange, ShardMessage, SubOutcome, SubRequest};
    let shards = shared.config.shards;
    let def = match json.map(serde_json::from_slice::<crate::subscription::definition::Definition>) {
        None => None,
        Some(Ok(d)) if d.subscription == name && !d.pushed() && crate::model::valid_topic(&d.topic) => Some(d),
        Some(_) => return eprintln!("evmesh: kafka cluster: the definition of {name} is not one; ignored"),
    };
    let outcome = match def {
        Some(def) => {
            let asked = ShardMessage::ensure_topic(def.topic.clone(), None, false);
            let to = meta_owner(&def.topic, shards);
            if let Err(e) = shared.mailboxes.ask(Sender::Admin, to, asked, Overflow::Wait).await {
                return eprintln!("evmesh: kafka cluster: subscription {name} not applied: its topic: {e}");
            }
            let asked = ShardMessage::subscription(SubRequest::Create(def));
            shared.mailboxes.ask(Sender::Admin, meta_owner(name, shards), asked, Overflow::Wait).await
        }
        None => {
            let topic = match crate::storage::meta::get_subscription(&shared.db, name) {
                Ok(Some(d)) if !d.pushed() => d.topic,
                _ => return,
            };
            let asked = ShardMessage::subscription(SubRequest::Remove(name.to_owned()));
            let outcome = shared.mailboxes.ask(Sender::Admin, meta_owner(name, shards), asked, Overflow::Wait).await;
            if matches!(outcome, Ok(SubOutcome::Removed)) {
                // Sessions attached here, on whatever shard, are closed cleanly (1000).
                announce(shared, name, &topic, InterestChange::Removed).await;
            }
            outcome
        }
    };
    match outcome {
        Ok(SubOutcome::Created | SubOutcome::Unchanged | SubOutcome::Removed | SubOutcome::Unknown) => {}
        Ok(other) => eprintln!("evmesh: kafka cluster: subscription {name} not applied here: {other:?}"),
        Err(e) => eprintln!("evmesh: kafka cluster: subscription {name} not applied here: {e}"),
    }
}

/// What the cluster thread hands the `evmesh-definitions` thread, which may wait for the shards
/// (the cluster thread, which heartbeats, never does), in the order read.
#[cfg(feature = "kafka")]
enum ClusterWork {
    Define(crate::storage::kafka::Defined),
    /// Another instance claimed the subscription of this stored name from this one.
    HomeMoved(String),
}

/// `Shard::announce` from a thread of the runtime: tells every shard of
/// a change to subscription `name` (of `topic`), waiting while a mailbox is full.
async fn announce(shared: &Shared, name: &str, topic: &str, change: crate::shard::message::InterestChange) {
    use crate::shard::message::{Interest, ShardMessage};
    let shards = shared.config.shards;
    for s in 0..shards {
        let shard = crate::model::placement::meta_owner(name, shards);
        let i = Interest { subscription: name.to_owned(), topic: topic.to_owned(), shard, change };
        let msg = ShardMessage::Interest(Box::new(i));
        // Waiting never gives up: nothing to handle.
        let _ = shared.mailboxes.post(Sender::Admin, crate::model::ShardId(s as u16), msg, Overflow::Wait).await;
    }
}

/// A record of the claims' log read (`cluster::homes`): a claim taken from this instance
/// closes its sessions of the subscription; one that came too late for a key this instance
/// holds is answered by claiming it again, replacing itself, so the last record of the key
/// in the log (all a compacted log keeps) names the holder.
#[cfg(feature = "kafka")]
fn claim_read(shared: &Shared, key: String, value: Option<&[u8]>, work: &std::sync::mpsc::Sender<ClusterWork>) {
    use crate::cluster::homes::{Claim, Read};
    let me = &shared.config.instance_id;
    let claim = match value.map(Claim::decode) {
        Some(None) => return,
        Some(Some(c)) => Some(c),
        None => None,
    };
    let to = claim.as_ref().map(|c| c.instance.clone());
    // Records read while catching up are history: nothing attached here yet to close, and a
    // lost claim of then was answered then.
    let now = !shared.homes.reading_history();
    let elsewhere = to.as_ref().is_some_and(|to| to != me);
    match shared.homes.claimed(key.clone(), claim, Instant::now()) {
        Read::Taken { was } if now && elsewhere => {
            match key.strip_prefix("sub/") {
                Some(name) if was.as_ref() == Some(me) => {
                    let _ = work.send(ClusterWork::HomeMoved(name.to_owned()));
                }
                Some(_) => {}
                // An agent or a lite topic another instance claimed: whatever of it is here
                // (held by a claim, or taken unclaimed) moves there; unless this instance's
                // own later claim is on its way (it decides, when read).
                None if !shared.homes.pending_of(&key, me) => lite_or_agent_moved(shared, &key),
                None => {}
            }
        }
        Read::Lost { holder, epoch } if now && holder == *me => {
            let again = Claim { instance: me.clone(), epoch };
            if let Some(Err(e)) = shared.kafka.as_ref().map(|k| k.claim_home(&key, Some(&again.encode()))) {
                eprintln!("evmesh: the home of {key} not recorded again: {e}");
            }
        }
        // This instance's claim came too late: another instance's stands.
        Read::Lost { .. } if now && !elsewhere && to.is_some() => lite_or_agent_moved(shared, &key),
        _ => {}
    }
}

/// Another instance is the home of agent or lite topic `key` (`cluster::homes`): what this
/// instance has of it goes (see [`agent_moved`]; a lite topic's subscriber is closed, 1012).
#[cfg(feature = "kafka")]
fn lite_or_agent_moved(shared: &Shared, key: &str) {
    if let Some(agent) = key.strip_prefix("agent/") {
        agent_moved(shared, agent);
    } else if let Some(topic) = key.strip_prefix("lite/") {
        shared.watchers.moved(topic);
    }
}

/// A record header: name and value.
#[cfg(feature = "kafka")]
type Header<'a> = (&'a str, &'a [u8]);

/// Bytes of forwarded replies waiting for the replies thread, at most (past it one is
/// dropped: its sender answers 503 after its wait).
#[cfg(feature = "kafka")]
const REPLIES_QUEUED: usize = 64 << 20;

/// A record of the replies topic (`cluster::replies`): for this instance (others' values are
/// not copied), a reply goes to the replies thread, an outcome to the forward that waits.
#[cfg(feature = "kafka")]
fn forwarded(
    shared: &Shared,
    (key, headers, value): (&str, &[Header<'_>], &[u8]),
    (replies, queued): (&std::sync::mpsc::Sender<crate::storage::kafka::Forwarded>, &std::sync::atomic::AtomicUsize),
) {
    use crate::cluster::replies::{decode_outcome, FORWARD, KIND};
    use std::sync::atomic::Ordering;
    if key != shared.config.instance_id {
        return;
    }
    let header = |name: &str| headers.iter().find(|(k, _)| *k == name).map(|(_, v)| *v);
    match header(KIND) {
        Some(b"reply") => {
            if queued.fetch_add(value.len(), Ordering::Relaxed) + value.len() > REPLIES_QUEUED {
                queued.fetch_sub(value.len(), Ordering::Relaxed);
                return;
            }
            let headers = headers.iter().map(|(k, v)| ((*k).to_owned(), v.to_vec())).collect();
            let r = crate::storage::kafka::Forwarded { key: key.to_owned(), headers, value: value.to_vec() };
            if let Err(back) = replies.send(r) {
                queued.fetch_sub(back.0.value.len(), Ordering::Relaxed);
            }
        }
        Some(b"outcome") => {
            let n = header(FORWARD).and_then(|v| std::str::from_utf8(v).ok()).and_then(|v| v.parse().ok());
            if let (Some(n), Some(o)) = (n, decode_outcome(value)) {
                shared.forwards.answer(n, o);
            }
        }
        _ => {}
    }
}

/// A reply another instance forwarded here: handed to the shard its correlation id names,
/// exactly as a reply made here (tenant, ACL, deadline), and the outcome written back.
#[cfg(feature = "kafka")]
async fn take_forwarded_reply(shared: &Shared, r: crate::storage::kafka::Forwarded) {
    use crate::cluster::replies::{encode_outcome, instance_tag, FORWARD, FROM, KIND, PRINCIPAL, TENANT};
    use crate::model::ReplyOutcome;
    use crate::shard::message::{ReplyMessage, ShardMessage};
    use crate::shard::requests::{Correlation, Replier};
    let text = |name: &str| {
        r.headers.iter().find(|(k, _)| k == name).and_then(|(_, v)| std::str::from_utf8(v).ok()).map(str::to_owned)
    };
    let (Some(from), Some(n)) = (text(FROM), text(FORWARD)) else { return };
    let frame = frame_codec::Frame::decode(&r.value).ok();
    let id = frame.as_ref().and_then(|f| f.body().attr_str("emcorrelationid").and_then(Correlation::parse));
    let me = instance_tag(&shared.config.instance_id);
    let outcome = match (frame, id) {
        (None, _) => ReplyOutcome::Unknown,
        (Some(_), None) => ReplyOutcome::MissingId,
        (Some(frame), Some(id)) if id.instance == me && id.shard.index() < shared.config.shards => {
            let replier = Replier { principal: text(PRINCIPAL), tenant: text(TENANT), agent: None };
            let (outcome, rx) = futures::channel::oneshot::channel();
            let asked = (ShardMessage::Reply(Box::new(ReplyMessage { id, frame, replier, outcome })), rx);
            shared.mailboxes.ask(Sender::Admin, id.shard, asked, Overflow::Wait).await.unwrap_or(ReplyOutcome::Unknown)
        }
        (Some(_), Some(_)) => ReplyOutcome::Unknown,
    };
    let Some(k) = &shared.kafka else { return };
    let headers: [(&str, &[u8]); 2] = [(KIND, b"outcome"), (FORWARD, n.as_bytes())];
    if let Err(e) = k.put_reply(&from, &headers, &encode_outcome(&outcome)) {
        eprintln!("evmesh: the outcome of a reply from {from} not sent back: {e}");
    }
}

/// Another instance claimed subscription `name` from this one (it was thought dead, or two
/// choices crossed): every shard closes its sessions of it (`InterestChange::HomeMoved`).
#[cfg(feature = "kafka")]
async fn home_moved(shared: &Shared, name: &str) {
    let Ok(Some(def)) = crate::storage::meta::get_subscription(&shared.db, name) else { return };
    eprintln!("evmesh: another instance is the home of subscription {name} now: closing its sessions here");
    announce(shared, name, &def.topic, crate::shard::message::InterestChange::HomeMoved).await;
}

/// Another instance claimed agent `stored` (its stored id) from this one: it is forgotten
/// here (its registration, as an evmesh or a remote A2A agent) and its WebSocket closed
/// (1012, "home moved"; the turns routed to it end with an error event), so it registers and
/// attaches again at its new home. Its sessions here are that attachment's: their clients are
/// sent to the new home, which does not know them (404: they open new ones). Nothing here
/// waits for the shards.
#[cfg(feature = "kafka")]
fn agent_moved(shared: &Shared, stored: &str) {
    let (tenant, agent) = match stored.split_once('/') {
        Some((t, a)) => (Some(t), a),
        None => (None, stored),
    };
    let topic = crate::shard::calls::agent_topic(tenant, agent);
    let attached = shared.watchers.is_followed(&topic);
    if shared.agents.deregister(stored) | shared.remotes.remove(stored) | attached {
        eprintln!("evmesh: another instance is the home of agent {stored} now: forgetting it here");
    }
    shared.watchers.moved(&topic);
}

/// An offset record of the claims' log (`cluster::homes`, "Offsets"): applied to this
/// instance's copy when the subscription's claim, at that point of the log, names its writer
/// and the writer is another instance (this one's own are stored already), once: `read` is the
/// position after the last record applied, kept with it, so a restart skips what it applied.
#[cfg(feature = "kafka")]
fn apply_offset(shared: &Shared, r: crate::storage::kafka::Replicated, read: &mut u64) {
    use crate::storage::offsets;
    if r.next <= *read || r.by == shared.config.instance_id {
        return;
    }
    let Some((topic, subscription, partition, _)) = offsets::parse_key(&r.key) else { return };
    if !shared.homes.names(&crate::cluster::homes::subscription_key(subscription), &r.by) {
        return;
    }
    if r.value.as_deref().is_some_and(|v| offsets::Stored::decode(v).is_none()) {
        return;
    }
    let shard = crate::model::placement::owner(topic, partition, shared.config.shards);
    match offsets::apply_replicated(&shared.db, shard, r.key.as_bytes(), r.value.as_deref(), r.next) {
        Ok(()) => *read = r.next,
        Err(e) => eprintln!("evmesh: kafka cluster: offset {} of {subscription} not applied: {e}", r.key),
    }
}

/// Heartbeats every `heartbeat_ms`: through Kafka to every instance (`storage = kafka`), or
/// straight into this instance's own view (the embedded log: a cluster of one).
pub(super) fn start_heartbeats(shared: &Arc<Shared>) -> Result<(), StartError> {
    let mut load = crate::cluster::LoadSampler::new(Instant::now(), crate::sys::process_cpu_us(), 0);
    let every = shared.config.heartbeat;
    #[cfg(feature = "kafka")]
    if let Some(k) = &shared.kafka {
        let to = shared.clone();
        let beat = move || heartbeat_of(&to, &mut load);
        let [a, b, c, d, e, f, g] = [0; 7].map(|_| shared.clone());
        // Definitions are applied on a thread of their own (it waits for the shards), so a slow
        // apply never holds up the heartbeats; in log order, this instance's own records too:
        // the log's order is the one every instance agrees on (skipping its own, an instance
        // whose create followed another's removal in the log would apply only the removal).
        // Unbounded: what it holds is read from compacted topics (bounded by them), and a
        // full queue would stop the heartbeats.
        let (defs, apply) = std::sync::mpsc::channel::<ClusterWork>();
        // (A runtime of its own: the shards' answers are awaited on its timer.)
        std::thread::Builder::new().name("evmesh-definitions".into()).spawn(move || {
            applier("definitions", async move {
                for w in apply {
                    match w {
                        ClusterWork::Define(r) => apply_definition(&d, &r.name, r.definition.as_deref()).await,
                        ClusterWork::HomeMoved(name) => home_moved(&d, &name).await,
                    }
                }
            })
        })?;
        let moved = defs.clone();
        let feeds = crate::storage::kafka::Feeds {
            heard: Box::new(move |hb, age| a.membership.heard(hb, age, Instant::now())),
            claimed: Box::new(move |key, value| claim_read(&b, key, value, &moved)),
            caught_up: Box::new(move || c.homes.caught_up()),
            stale: {
                let h = shared.clone();
                Box::new(move |stale| h.homes.stale(stale))
            },
            offset: {
                let mut read = crate::storage::offsets::replicated_position(&e.db).unwrap_or(0);
                Box::new(move |r| apply_offset(&e, r, &mut read))
            },
            forwarded: {
                // Replies are handed to the shards on a thread of their own (it waits for them),
                // at most `REPLIES_QUEUED` bytes of them waiting.
                let (tx, rx) = std::sync::mpsc::channel::<crate::storage::kafka::Forwarded>();
                let queued = Arc::new(std::sync::atomic::AtomicUsize::new(0));
                let taken = queued.clone();
                std::thread::Builder::new().name("evmesh-replies".into()).spawn(move || {
                    applier("replies", async move {
                        for r in rx {
                            taken.fetch_sub(r.value.len(), std::sync::atomic::Ordering::Relaxed);
                            take_forwarded_reply(&g, r).await;
                        }
                    })
                })?;
                Box::new(move |key, headers, value| forwarded(&f, (key, headers, value), (&tx, &queued)))
            },
            defined: Box::new(move |r| {
                let _ = defs.send(ClusterWork::Define(r));
            }),
        };
        k.start_membership(every, beat, feeds)?;
        return Ok(());
    }
    let shared = shared.clone();
    std::thread::Builder::new().name("evmesh-heartbeat".into()).spawn(move || loop {
        let hb = heartbeat_of(&shared, &mut load);
        shared.membership.heard(hb, Duration::ZERO, Instant::now());
        std::thread::sleep(every);
    })?;
    Ok(())
}
