//! Topics on the admin listener: the listing with each partition's offsets, explicit creation,
//! the stored events of a partition, the dead letters of `<topic>.dlq` and their replay, and
//! (storage = kafka) learning the topics another instance made. Reads go to the logs and
//! metadata directly; creating a topic and replaying go to the owning shard through the mailbox.

use std::cell::Cell;

use frame_codec::Frame;
use serde::Deserialize;

use super::common::{log_of, read_events};
use crate::adaptor::cloudevents::write_structured;
use crate::http::{problem, StatusCode};
use crate::ingress::storage_problem;
use crate::model::placement::{meta_owner, owner};
use crate::model::{valid_topic, PartitionId, MAX_PARTITIONS};
use crate::server::{Request, Response};
use crate::shard::mailbox::{Overflow, Sender};
use crate::shard::message::{EnsureReply, ShardMessage};
use crate::shard::shared::Shared;
use crate::storage::{meta, Storage, StorageError, TopicMeta};
use crate::subscription::filter;

/// Stored events one admin answer carries at most (about: the event that crosses it is kept);
/// listings are paged with `from=`.
const RESPONSE_BYTES: usize = 4 << 20;

/// Topics another instance made that one `GET /admin/topics` learns at most (storage = kafka).
const LEARN_PER_LIST: usize = 256;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TopicSpec {
    partitions: u32,
    #[serde(default)]
    retention_ms: Option<u64>,
    #[serde(default)]
    retention_bytes: Option<u64>,
}

/// `GET /admin/topics`: every topic with its partitions' start and end offsets and its retention.
pub(super) fn topics(shared: &Shared) -> Response {
    let list = match meta::list(&shared.db) {
        Ok(l) => l,
        Err(e) => return storage_problem(&e),
    };
    let mut out = Vec::new();
    for (name, m) in list {
        let mut parts = Vec::new();
        for p in (0..m.partitions).map(PartitionId) {
            match log_of(shared, &name, p).bounds(&name, p) {
                Ok(b) => {
                    parts.push(serde_json::json!({"partition": p.0, "start_offset": b.start, "end_offset": b.end}))
                }
                Err(e) => return storage_problem(&e),
            }
        }
        out.push(serde_json::json!({
            "topic": name,
            "partitions": parts,
            "retention_ms": m.retention_ms,
            "retention_bytes": m.retention_bytes,
        }));
    }
    Response::json(StatusCode::OK, serde_json::to_vec(&out).expect("json"))
}

/// `PUT /admin/topics/{topic}`: 201 created, 200 when it exists (with its settings).
pub(super) async fn create_topic(shared: &Shared, topic: &str, body: &[u8]) -> Response {
    if !valid_topic(topic) {
        return problem(StatusCode::BAD_REQUEST, "topic names are [A-Za-z0-9._-]{1,249}");
    }
    if crate::model::topic::is_lite(topic) {
        let detail = "agent.*, client.* and session.* are lite topics: created by their first event, one partition";
        return problem(StatusCode::BAD_REQUEST, detail);
    }
    let spec: TopicSpec = match serde_json::from_slice(body) {
        Ok(s) => s,
        Err(e) => return problem(StatusCode::BAD_REQUEST, &format!("expected {{\"partitions\": N}}: {e}")),
    };
    if spec.partitions == 0 || spec.partitions > MAX_PARTITIONS {
        return problem(StatusCode::BAD_REQUEST, &format!("partitions must be 1..={MAX_PARTITIONS}"));
    }
    let spec = TopicMeta {
        partitions: spec.partitions,
        retention_ms: spec.retention_ms,
        retention_bytes: spec.retention_bytes,
    };
    match ensure(shared, topic, spec).await {
        Ok((m, created)) => {
            let status = if created { StatusCode(201) } else { StatusCode::OK };
            let body = serde_json::json!({"topic": topic, "partitions": m.partitions, "retention_ms": m.retention_ms, "retention_bytes": m.retention_bytes});
            Response::json(status, serde_json::to_vec(&body).expect("json"))
        }
        Err(e) => storage_problem(&e),
    }
}

/// A tenant's `topics` quota, before its administrator creates `stored` (`<tenant>.<name>`): 429
/// when the tenant has its quota (an existing topic is not a new one).
pub(super) fn within_topics_quota(shared: &Shared, t: &str, stored: &str) -> Result<(), Response> {
    let snap = shared.governance.snapshot();
    let Some(max) = snap.quotas.get(t).and_then(|q| q.topics) else { return Ok(()) };
    let db = &shared.db;
    let counted = match meta::get(db, stored) {
        Ok(Some(_)) => Ok(0),
        Ok(None) => meta::count_topics(db, &format!("{t}."), max as usize),
        Err(e) => Err(e),
    };
    match counted {
        Ok(n) if n as u64 >= max => Err(problem(
            StatusCode::TOO_MANY_REQUESTS,
            &format!("tenant {t} has its quota of {max} topics; remove one or ask for more"),
        )
        .with_header("retry-after", "60")),
        Ok(_) => Ok(()),
        Err(e) => Err(storage_problem(&e)),
    }
}

/// Storage = kafka: a topic another instance made (the broker has it) and this one has not
/// met yet is learned before an admin read of it, with the broker's partition count. What
/// cannot be learned now (no such topic, the broker away) reads as it is here.
pub(super) async fn learn(shared: &Shared, topic: &str) {
    if !shared.clustered_log() || crate::model::topic::is_lite(topic) || !valid_topic(topic) {
        return;
    }
    if !matches!(meta::get(&shared.db, topic), Ok(None)) {
        return;
    }
    let to = meta_owner(topic, shared.config.shards);
    let asked = ShardMessage::learn_topic(topic.to_owned());
    let _ = shared.mailboxes.ask(Sender::Admin, to, asked, Overflow::Shed).await;
}

/// [`learn`] for `topic` and its dead-letter topic.
pub(super) async fn learn_dlq(shared: &Shared, topic: &str) {
    learn(shared, topic).await;
    learn(shared, &format!("{topic}.dlq")).await;
}

/// Storage = kafka with a `kafka.topic_prefix`: every topic the broker has under it (so
/// evmesh's: made by another instance, or for evmesh by a Kafka tool), learned ([`learn`])
/// before `GET /admin/topics` lists them, at most [`LEARN_PER_LIST`] new ones per list (each is
/// a round trip to the broker; the next list learns more). Without a prefix nothing tells
/// evmesh's topics from other applications', and the list shows the topics this instance has
/// met (a read of one by name learns it).
pub(super) async fn learn_all(shared: &Shared) {
    if let Some(k) = shared.remote.clone().filter(|k| !k.topic_prefix().is_empty()) {
        // One metadata request, made from a thread of its own: the admin loop never blocks.
        let (tx, rx) = futures::channel::oneshot::channel();
        let spawned = std::thread::Builder::new().name("evmesh-admin-topics".into()).spawn(move || {
            let _ = tx.send(k.topics());
        });
        let topics = match spawned {
            Ok(_) => match rx.await {
                Ok(Ok(t)) => t,
                _ => return,
            },
            Err(_) => return,
        };
        let db = &shared.db;
        let new = topics.into_iter().filter(|(t, n)| n.is_some() && matches!(meta::get(db, t), Ok(None)));
        for (topic, _) in new.take(LEARN_PER_LIST) {
            learn(shared, &topic).await;
        }
    }
}

async fn ensure(shared: &Shared, topic: &str, spec: TopicMeta) -> EnsureReply {
    let to = meta_owner(topic, shared.config.shards);
    let asked = ShardMessage::ensure_topic(topic.to_owned(), Some(spec), false);
    shared.mailboxes.ask(Sender::Admin, to, asked, Overflow::Shed).await
}

/// The settings of `topic` and of `<topic>.dlq`; 404 when the topic does not exist.
fn dlq_of(shared: &Shared, topic: &str) -> Result<(TopicMeta, Option<TopicMeta>), Response> {
    let db = &shared.db;
    match (meta::get(db, topic), meta::get(db, &format!("{topic}.dlq"))) {
        (Ok(Some(t)), Ok(d)) => Ok((t, d)),
        (Ok(None), _) => Err(problem(StatusCode::NOT_FOUND, &format!("no topic {topic}"))),
        (Err(e), _) | (_, Err(e)) => Err(storage_problem(&e)),
    }
}

/// `GET /admin/dlq/{topic}[?max=N]`: the dead letters not replayed yet, per partition of
/// `<topic>.dlq` at most `max` (100 by default, at most 1000), as
/// `[{"partition": P, "offset": O, "event": {...}}]`.
pub(super) async fn dead_letters(shared: &Shared, topic: &str, req: &Request<'_>) -> Response {
    let max = match req.query("max").map(|v| v.parse::<usize>()) {
        None => 100,
        Some(Ok(n)) if (1..=1000).contains(&n) => n,
        Some(_) => return problem(StatusCode::BAD_REQUEST, "max must be 1..=1000"),
    };
    let dlq = match dlq_of(shared, topic) {
        Ok((_, None)) => return Response::json(StatusCode::OK, "[]"),
        Ok((_, Some(d))) => d,
        Err(r) => return r,
    };
    let name = format!("{topic}.dlq");
    let mut out = vec![b'['];
    for p in (0..dlq.partitions).map(PartitionId) {
        let room = RESPONSE_BYTES.saturating_sub(out.len());
        if room == 0 {
            break; // bounded like every answer; replaying (or a smaller max) shows the rest
        }
        let read = match meta::dlq_replayed(&shared.db, topic, p.0) {
            Ok(from) => read_events(shared, (&name, p), from, (max, room)).await,
            Err(e) => Err(e),
        };
        let frames = match read {
            Ok(f) => f,
            Err(e) => return storage_problem(&e),
        };
        for f in frames {
            if out.len() > 1 {
                out.push(b',');
            }
            out.extend_from_slice(
                format!("{{\"partition\":{},\"offset\":{},\"event\":", p.0, f.header().offset).as_bytes(),
            );
            write_structured(&f, &[], &mut out);
            out.push(b'}');
        }
    }
    out.push(b']');
    Response::json(StatusCode::OK, out)
}

/// `POST /admin/dlq/{topic}/replay`: publishes every dead letter not replayed yet back to
/// `topic` (without the `emdlq*` extensions; to its original partition unless it has a
/// `partitionkey`), then marks it replayed. The dead letters stay in `<topic>.dlq`. One replay
/// at a time (`replaying`), so none replays an event twice: 409 while one runs.
pub(super) async fn replay(shared: &Shared, replaying: &Cell<bool>, topic: &str) -> Response {
    if replaying.replace(true) {
        return problem(StatusCode::CONFLICT, "a replay is already running");
    }
    let r = replay_all(shared, topic).await;
    replaying.set(false);
    match r {
        Ok(n) => Response::json(StatusCode::OK, serde_json::json!({"topic": topic, "replayed": n}).to_string()),
        Err(Ok(resp)) => resp,
        Err(Err(e)) => storage_problem(&e),
    }
}

async fn replay_all(shared: &Shared, topic: &str) -> Result<u64, Result<Response, StorageError>> {
    let (source, dlq) = match dlq_of(shared, topic) {
        Ok((_, None)) => return Ok(0),
        Ok((s, Some(d))) => (s, d),
        Err(r) => return Err(Ok(r)),
    };
    let name = format!("{topic}.dlq");
    let shards = shared.config.shards;
    let mut replayed = 0;
    for dp in (0..dlq.partitions).map(PartitionId) {
        loop {
            let from = meta::dlq_replayed(&shared.db, topic, dp.0).map_err(Err)?;
            let frames = read_events(shared, (&name, dp), from, (256, RESPONSE_BYTES)).await.map_err(Err)?;
            let Some(last) = frames.last().map(|f| f.header().offset) else { break };
            let mut by_partition: Vec<(PartitionId, Vec<frame_codec::Frame>)> = Vec::new();
            for f in &frames {
                let mut body = f.to_body();
                let original = body.attributes.iter().find_map(|a| match (&*a.name, &a.value) {
                    ("emdlqpartition", frame_codec::AttrValue::Int(p)) => u32::try_from(*p).ok(),
                    _ => None,
                });
                body.topic = topic.to_owned();
                body.attributes.retain(|a| !a.name.starts_with("emdlq"));
                let mut frame = frame_codec::Frame::encode(&f.header(), &body)
                    .map_err(|e| Err(StorageError::Engine(e.to_string())))?;
                frame.set_timestamp(crate::model::clock::now_micros());
                let p = crate::model::placement::partition_of(&frame, source.partitions)
                    .unwrap_or(PartitionId(original.filter(|&p| p < source.partitions).unwrap_or(0)));
                match by_partition.iter_mut().find(|(q, _)| *q == p) {
                    Some((_, v)) => v.push(frame),
                    None => by_partition.push((p, vec![frame])),
                }
            }
            for (p, frames) in by_partition {
                let n = frames.len() as u64;
                let asked = ShardMessage::append(p, frames);
                let to = owner(topic, p, shards);
                shared.mailboxes.ask(Sender::Admin, to, asked, Overflow::Shed).await.map_err(Err)?;
                replayed += n;
            }
            meta::set_dlq_replayed(&shared.db, topic, dp.0, last + 1).map_err(Err)?;
        }
    }
    Ok(replayed)
}

/// `GET /admin/topics/{topic}/partitions/{p}/events[?from=O&max=N&filter=CESQL]`: stored events
/// from offset `from` (0), at most `max` (100, capped at 1000), as
/// `[{"offset": O, "event": {...}}]`; with `filter`, only those of the `max` read that the CESQL
/// expression matches. `evmesh-next-offset` says where the next page starts (the console's
/// live tail asks from there).
pub(super) async fn events(shared: &Shared, topic: &str, partition: &str, req: &Request<'_>) -> Response {
    // A lite topic (the operator's name for it): its one partition, stored under `:name`.
    let lite = crate::model::topic::is_lite(topic).then(|| crate::model::StoredTopic::lite(topic));
    let topic = lite.as_deref().unwrap_or(topic);
    let m = match meta::get(&shared.db, topic) {
        _ if lite.is_some() => TopicMeta { partitions: 1, retention_ms: None, retention_bytes: None },
        Ok(Some(m)) => m,
        Ok(None) => return problem(StatusCode::NOT_FOUND, &format!("no topic {topic}")),
        Err(e) => return storage_problem(&e),
    };
    let Some(p) = PartitionId::checked(partition, m.partitions) else {
        return problem(StatusCode::NOT_FOUND, &format!("topic {topic} has partitions 0..{}", m.partitions));
    };
    let num = |name: &str, default: u64| -> Result<u64, Response> {
        match req.query(name) {
            None => Ok(default),
            Some(v) => {
                v.parse().map_err(|_| problem(StatusCode::BAD_REQUEST, &format!("{name} must be a whole number")))
            }
        }
    };
    let (from, max) = match (num("from", 0), num("max", 100)) {
        (Ok(f), Ok(m)) => (f, m.min(1000) as usize),
        (Err(r), _) | (_, Err(r)) => return r,
    };
    let asked = req.target().split_once('?').is_some_and(|(_, q)| q.split('&').any(|kv| kv.starts_with("filter=")));
    let filters = match req.query("filter").map(|sql| filter::compile(Some(&serde_json::json!([{ "sql": sql }])))) {
        None if asked => return problem(StatusCode::BAD_REQUEST, "filter is not percent-encoded UTF-8"),
        None => Vec::new(),
        Some(Ok(f)) => f,
        Some(Err(e)) => return problem(StatusCode::BAD_REQUEST, &e.to_string()),
    };
    let frames = match read_events(shared, (topic, p), from, (max, RESPONSE_BYTES)).await {
        Ok(f) => f,
        Err(e) => return storage_problem(&e),
    };
    let (matching, next, exhausted) = filtered(&filters, &frames, from);
    let mut out = Vec::with_capacity(frames.len() * 1200 + 2);
    out.push(b'[');
    for f in matching {
        if out.len() > 1 {
            out.push(b',');
        }
        out.extend_from_slice(format!("{{\"offset\":{},\"event\":", f.header().offset).as_bytes());
        write_structured(f, &[], &mut out);
        out.push(b'}');
    }
    out.push(b']');
    let r = Response::json(StatusCode::OK, out).with_header("evmesh-next-offset", next.to_string());
    if exhausted {
        r.with_header("evmesh-filter-exhausted", "1")
    } else {
        r
    }
}

/// How much CESQL one listing may evaluate, in events' budgets: a costly expression over a
/// thousand events is cut short (and the page ends there) instead of holding the admin thread
/// for seconds.
const FILTER_BUDGETS_PER_REQUEST: u64 = 4;

/// The frames `filters` match (all, with none), where the next page starts, and whether the
/// request's CESQL budget ran out first (the page then ends at the first event not evaluated;
/// at least one event is always evaluated, so paging always moves on). An event over its own
/// budget does not match, as for a subscription.
fn filtered<'f>(filters: &[filter::Filter], frames: &'f [Frame], from: u64) -> (Vec<&'f Frame>, u64, bool) {
    use crate::subscription::cesql::{Budget, Verdict};
    let per = Budget::PER_EVENT;
    let (mut steps, mut bytes) = (per.steps * FILTER_BUDGETS_PER_REQUEST, per.bytes * FILTER_BUDGETS_PER_REQUEST);
    let mut out = Vec::new();
    let mut next = from;
    for (i, f) in frames.iter().enumerate() {
        if i > 0 && (steps == 0 || bytes == 0) {
            return (out, next, true);
        }
        let mut budget = Budget { steps: per.steps.min(steps), bytes: per.bytes.min(bytes), exhausted: false };
        let (s0, b0) = (budget.steps, budget.bytes);
        let passes = filters.iter().all(|flt| flt.verdict(f.body(), &mut budget) == Verdict::Match);
        steps -= s0 - budget.steps;
        bytes -= b0 - budget.bytes;
        if budget.exhausted && i > 0 && (s0 < per.steps || b0 < per.bytes) {
            // Cut short by what the request had left, not by its own cost: evaluated next time.
            return (out, next, true);
        }
        if passes {
            out.push(f);
        }
        next = f.header().offset + 1;
    }
    (out, next, false)
}
