//! What the cluster thread reads from evmesh's own Kafka topics, applied here: definitions,
//! claims, replicated offsets and forwarded replies. What may wait for the shards runs on a
//! thread of its own (`evmesh-definitions`, `evmesh-replies`) with a runtime of its own
//! (`runtime::applier`); the cluster thread, which heartbeats, never waits.

use std::time::Instant;

use super::kafka::KafkaCluster;
use crate::runtime::applier::announce;
use crate::shard::mailbox::{Overflow, Sender};
use crate::shard::shared::Shared;

/// A record of the definitions topic.
pub(super) struct Defined {
    /// The subscription's stored name.
    pub name: String,
    /// Its definition (JSON), or `None`: removed.
    pub definition: Option<Vec<u8>>,
}

/// An offset record of the claims topic: what instance `by` stored under `key` (an
/// `storage::offsets` key), `None` once deleted; `next` is the position after it.
pub(super) struct Replicated {
    pub key: String,
    pub value: Option<Vec<u8>>,
    pub by: String,
    pub next: u64,
}

/// A record of the replies topic for this instance: its headers and value.
pub(super) struct Forwarded {
    pub headers: Vec<(String, Vec<u8>)>,
    pub value: Vec<u8>,
}

/// A subscription defined (or removed, `None`) at some instance, read from Kafka, applied
/// here as the traffic API would (its topic ensured, then the definition through the owner of
/// its name; a removal closes the sessions attached here). A definition that differs from the
/// one here is logged and left (the one here stays). Runs on `evmesh-definitions`, waiting for
/// the shards' answers.
pub(super) async fn apply_definition(shared: &Shared, name: &str, json: Option<&[u8]>) {
    use crate::model::placement::meta_owner;
    use crate::shard::message::{InterestChange, ShardMessage, SubOutcome, SubRequest};
    let shards = shared.config.shards;
    let def = match json.map(serde_json::from_slice::<crate::subscription::definition::Definition>) {
        None => None,
        Some(Ok(d)) if d.subscription == name && !d.pushed() && crate::model::valid_topic(&d.topic) => Some(d),
        Some(_) => {
            return crate::log::warn(
                "cluster",
                &format!("kafka cluster: the definition of {name} is not one; ignored"),
                &[],
            )
        }
    };
    let outcome = match def {
        Some(def) => {
            let asked = ShardMessage::ensure_topic(def.topic.clone(), None, false);
            let to = meta_owner(&def.topic, shards);
            if let Err(e) = shared.mailboxes.ask(Sender::Admin, to, asked, Overflow::Wait).await {
                return crate::log::warn(
                    "cluster",
                    &format!("kafka cluster: subscription {name} not applied: its topic: {e}"),
                    &[],
                );
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
        Ok(other) => {
            crate::log::warn("cluster", &format!("kafka cluster: subscription {name} not applied here: {other:?}"), &[])
        }
        Err(e) => {
            crate::log::warn("cluster", &format!("kafka cluster: subscription {name} not applied here: {e}"), &[])
        }
    }
}

/// What the cluster thread hands the `evmesh-definitions` thread, which may wait for the shards
/// (the cluster thread, which heartbeats, never does), in the order read.
pub(super) enum ClusterWork {
    Define(Defined),
    /// Another instance claimed the subscription of this stored name from this one.
    HomeMoved(String),
}

/// A record of the claims' log read (`cluster::homes`): a claim taken from this instance
/// closes its sessions of the subscription; one that came too late for a key this instance
/// holds is answered by claiming it again, replacing itself, so the last record of the key
/// in the log (all a compacted log keeps) names the holder.
pub(super) fn claim_read(
    (shared, cluster): (&Shared, &KafkaCluster),
    key: String,
    value: Option<&[u8]>,
    work: &std::sync::mpsc::Sender<ClusterWork>,
) {
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
    let now = !cluster.homes.reading_history();
    let elsewhere = to.as_ref().is_some_and(|to| to != me);
    match cluster.homes.claimed(key.clone(), claim, Instant::now()) {
        Read::Taken { was } if now && elsewhere => {
            match key.strip_prefix("sub/") {
                Some(name) if was.as_ref() == Some(me) => {
                    let _ = work.send(ClusterWork::HomeMoved(name.to_owned()));
                }
                Some(_) => {}
                // An agent or a lite topic another instance claimed: whatever of it is here
                // (held by a claim, or taken unclaimed) moves there; unless this instance's
                // own later claim is on its way (it decides, when read).
                None if !cluster.homes.pending_of(&key, me) => lite_or_agent_moved(shared, &key),
                None => {}
            }
        }
        Read::Lost { holder, epoch } if now && holder == *me => {
            cluster.put_claim(&key, Some(&Claim { instance: me.clone(), epoch }), "recorded again");
        }
        // This instance's claim came too late: another instance's stands.
        Read::Lost { .. } if now && !elsewhere && to.is_some() => lite_or_agent_moved(shared, &key),
        _ => {}
    }
}

/// Another instance is the home of agent or lite topic `key` (`cluster::homes`): what this
/// instance has of it goes (see [`agent_moved`]; a lite topic's subscriber is closed, 1012).
fn lite_or_agent_moved(shared: &Shared, key: &str) {
    if let Some(agent) = key.strip_prefix("agent/") {
        agent_moved(shared, agent);
    } else if let Some(topic) = key.strip_prefix("lite/") {
        shared.watchers.moved(topic);
    }
}

/// A record header: name and value.
type Header<'a> = (&'a str, &'a [u8]);

/// Bytes of forwarded replies waiting for the replies thread, at most (past it one is
/// dropped: its sender answers 503 after its wait).
const REPLIES_QUEUED: usize = 64 << 20;

/// A record of the replies topic (`cluster::replies`): for this instance (others' values are
/// not copied), a reply goes to the replies thread, an outcome to the forward that waits.
pub(super) fn forwarded(
    cluster: &KafkaCluster,
    (key, headers, value): (&str, &[Header<'_>], &[u8]),
    (replies, queued): (&std::sync::mpsc::Sender<Forwarded>, &std::sync::atomic::AtomicUsize),
) {
    use crate::cluster::replies::{decode_outcome, FORWARD, KIND};
    use std::sync::atomic::Ordering;
    if key != cluster.me {
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
            let r = Forwarded { headers, value: value.to_vec() };
            if let Err(back) = replies.send(r) {
                queued.fetch_sub(back.0.value.len(), Ordering::Relaxed);
            }
        }
        Some(b"outcome") => {
            let n = header(FORWARD).and_then(|v| std::str::from_utf8(v).ok()).and_then(|v| v.parse().ok());
            if let (Some(n), Some(o)) = (n, decode_outcome(value)) {
                cluster.forwards.answer(n, o);
            }
        }
        _ => {}
    }
}

/// A reply another instance forwarded here: handed to the shard its correlation id names,
/// exactly as a reply made here (tenant, ACL, deadline), and the outcome written back.
pub(super) async fn take_forwarded_reply(shared: &Shared, cluster: &KafkaCluster, r: Forwarded) {
    use crate::cluster::replies::{
        encode_outcome, instance_tag, FORWARD, FROM, KIND, PRINCIPAL, REPLIES_TOPIC, TENANT,
    };
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
    let headers: [(&str, &[u8]); 2] = [(KIND, b"outcome"), (FORWARD, n.as_bytes())];
    if let Err(e) = cluster.log.put_record(REPLIES_TOPIC, from.as_bytes(), Some(&encode_outcome(&outcome)), &headers) {
        crate::log::warn("cluster", &format!("the outcome of a reply from {from} not sent back: {e}"), &[]);
    }
}

/// Another instance claimed subscription `name` from this one (it was thought dead, or two
/// choices crossed): every shard closes its sessions of it (`InterestChange::HomeMoved`).
pub(super) async fn home_moved(shared: &Shared, name: &str) {
    let Ok(Some(def)) = crate::storage::meta::get_subscription(&shared.db, name) else { return };
    crate::log::warn(
        "cluster",
        &format!("another instance is the home of subscription {name} now: closing its sessions here"),
        &[],
    );
    announce(shared, name, &def.topic, crate::shard::message::InterestChange::HomeMoved).await;
}

/// Another instance claimed agent `stored` (its stored id) from this one: it is forgotten
/// here (its registration, as an evmesh or a remote A2A agent) and its WebSocket closed
/// (1012, "home moved"; the turns routed to it end with an error event), so it registers and
/// attaches again at its new home. Its sessions here are that attachment's: their clients are
/// sent to the new home, which does not know them (404: they open new ones). Nothing here
/// waits for the shards.
fn agent_moved(shared: &Shared, stored: &str) {
    let (tenant, agent) = match stored.split_once('/') {
        Some((t, a)) => (Some(t), a),
        None => (None, stored),
    };
    let topic = crate::shard::calls::agent_topic(tenant, agent);
    let attached = shared.watchers.is_followed(&topic);
    if shared.agents.deregister(stored) | shared.remotes.remove(stored) | attached {
        crate::log::warn(
            "cluster",
            &format!("another instance is the home of agent {stored} now: forgetting it here"),
            &[],
        );
    }
    shared.watchers.moved(&topic);
}

/// An offset record of the claims' log (`cluster::homes`, "Offsets"): applied to this
/// instance's copy when the subscription's claim, at that point of the log, names its writer
/// and the writer is another instance (this one's own are stored already), once: `read` is the
/// position after the last record applied, kept with it, so a restart skips what it applied.
pub(super) fn apply_offset(shared: &Shared, cluster: &KafkaCluster, r: Replicated, read: &mut u64) {
    use crate::storage::offsets;
    if r.next <= *read || r.by == shared.config.instance_id {
        return;
    }
    let Some((topic, subscription, partition, _)) = offsets::parse_key(&r.key) else { return };
    if !cluster.homes.names(&crate::cluster::homes::subscription_key(subscription), &r.by) {
        return;
    }
    if r.value.as_deref().is_some_and(|v| offsets::Stored::decode(v).is_none()) {
        return;
    }
    let shard = crate::model::placement::owner(topic, partition, shared.config.shards);
    match offsets::apply_replicated(&shared.db, shard, r.key.as_bytes(), r.value.as_deref(), r.next) {
        Ok(()) => *read = r.next,
        Err(e) => crate::log::warn(
            "cluster",
            &format!("kafka cluster: offset {} of {subscription} not applied: {e}", r.key),
            &[],
        ),
    }
}
