//! Session pub/sub (Mode 2): the one subscriber of a session's lite topic `session.<sid>`, over
//! server-sent events or WebSocket. It gets everything from the head of the session (or after
//! the SSE `Last-Event-ID`), then each event as it is published, in order.
//!
//! The follower reads the lite topic straight from its owner's log (any thread may read it) in
//! bounded batches, hands each rendered event to the session's writer through a small bounded
//! queue (a subscriber that does not read holds at most that and one batch), and when it has
//! read everything waits on its doorbell (`shard::watch`), which the owner rings after each
//! append. One subscriber per session: the claim is process-wide, and released when the
//! session ends.

use std::rc::Rc;

use crate::queue;
use frame_codec::{AttrValue, Frame};

use super::{expired, Outbound};
use crate::model::PartitionId;
use crate::server::FollowSpec;
use crate::shard::core::Shard;
use crate::shard::watch::Claim;
use crate::storage::embedded::read_from;

/// Events read from the log at once.
const BATCH: usize = 64;
const BATCH_BYTES: usize = 1 << 20;
/// Rendered events waiting for the writer (each at most about 1.4 MiB: a 1 MiB body in base64).
const QUEUE: usize = 4;

/// An event as the follower sends it: the structured CloudEvent with `emoffset` (a string).
fn render(f: &Frame, sse: bool) -> Vec<u8> {
    let offset = f.header().offset;
    let mut json = Vec::with_capacity(f.as_bytes().len() + 32);
    crate::adaptor::cloudevents::write_structured(f, &[("emoffset", AttrValue::Str(offset.to_string()))], &mut json);
    let mut out = Vec::with_capacity(json.len() + 32);
    if sse {
        let mut event = format!("id: {offset}\ndata: ").into_bytes();
        event.extend_from_slice(&json);
        event.extend_from_slice(b"\n\n");
        crate::shard::sessions::chunk(&event, &mut out);
    } else {
        crate::ws::encode_frame(crate::ws::OpCode::Text, true, &json, &mut out);
    }
    out
}

/// Sends the lite topic from `spec.from` on, then follows it, until the session's queue closes
/// (its writer ended). Returns a reason when the log cannot be read.
async fn follow(
    shard: Rc<Shard>,
    claim: Claim,
    spec: FollowSpec,
    sse: bool,
    mut out: queue::Sender<Outbound>,
) -> &'static str {
    let shared = &shard.shared;
    let owner = crate::model::placement::owner(&spec.topic, PartitionId(0), shared.config.shards);
    let family = crate::storage::db::log_cf(owner.index());
    let mut next = spec.from;
    loop {
        if claim.watch.has_moved() {
            // Its home is another instance now (with Kafka): the client attaches there.
            let _ = out.send_past_bound(Outbound::Close(1012, "home moved"));
            return "";
        }
        // The owner's family, read from here (RocksDB reads are safe from any thread).
        let Some(cf) = shared.db.cf_handle(&family) else { return "the session's log cannot be read" };
        let frames = match read_from(&shared.db, cf, &spec.topic, PartitionId(0), (next, BATCH, BATCH_BYTES)) {
            Ok(f) => f,
            Err(e) => {
                crate::log::warn("delivery", &format!("{}: following {}: {e}", shard.id, spec.topic), &[]);
                return "the session's log cannot be read";
            }
        };
        if frames.is_empty() {
            claim.watch.rung().await;
            continue;
        }
        for f in frames {
            next = f.header().offset + 1;
            if spec.agent.is_some() && !for_the_agent(&shard, spec.tenant.as_deref(), &f) {
                continue;
            }
            if out.send(Outbound::Frame(Rc::new(render(&f, sse)))).await.is_err() {
                return "";
            }
        }
        // A subscriber replaying a long session must not hold the core.
        crate::task::yield_now().await;
    }
}

/// Whether an agent's follower sends `f`: a turn's request only while that turn is in progress
/// (marking it delivered: its chunks are taken from now on), anything else always.
fn for_the_agent(shard: &Shard, tenant: Option<&str>, f: &Frame) -> bool {
    if f.header().kind != frame_codec::FrameKind::StreamRequest {
        return true;
    }
    let body = f.body();
    let turn = match body.attr("emturn") {
        Some(frame_codec::ArchivedAttrValue::Int(t)) => u64::try_from(t.to_native()).unwrap_or(0),
        _ => 0,
    };
    let Some(sid) = body.attr_str("emsessionid") else { return false };
    shard.shared.calls.delivering(&crate::shard::calls::session_key(tenant, sid), turn)
}

/// A WebSocket follower, after the 101.
pub async fn websocket(
    shard: Rc<Shard>,
    stream: crate::server::Stream,
    buf: Vec<u8>,
    limits: crate::server::conn::ConnLimits,
    spec: Box<FollowSpec>,
    publisher: super::Publisher,
) {
    let (tx, events) = queue::channel(QUEUE);
    let claim = shard.shared.watchers.claim(&spec.topic);
    // An agent's attachment: its id and the claim's number.
    let agent = spec.agent.clone().zip(claim.as_ref().map(|c| c.watch.gen));
    let replier = crate::shard::requests::Replier {
        principal: spec.principal.clone(),
        tenant: spec.tenant.clone(),
        agent: agent.clone().map(Box::new),
    };
    let io = super::ws::Io { stream, buf, limits, events, live: None };
    let Some(claim) = claim else {
        // Another subscriber claimed it since the 101 was decided.
        let ends = Box::pin(async { Some("the session has another subscriber") });
        return super::ws::run(&shard, io, None, (replier, publisher), Some(ends)).await;
    };
    let expiry = expired(spec.expires_us);
    let follower = follow(shard.clone(), claim, *spec, false, tx);
    let ends = Box::pin(async move {
        match futures::future::select(Box::pin(follower), Box::pin(expiry)).await {
            futures::future::Either::Left((r, _)) => Some(r).filter(|r| !r.is_empty()),
            futures::future::Either::Right((r, _)) => Some(r),
        }
    });
    super::ws::run(&shard, io, None, (replier, publisher), Some(ends)).await;
    // The claim is released (with the session's futures): a turn started from now on sees the
    // agent gone; each one routed to this attachment ends with an error event.
    if let Some((agent, gen)) = agent {
        shard.shared.calls.agent_gone(&agent, gen, crate::model::clock::now_ms());
    }
}

/// A server-sent events follower, after the `200` head.
pub async fn sse(shard: Rc<Shard>, stream: crate::server::Stream, buf: Vec<u8>, spec: Box<FollowSpec>) {
    let (tx, events) = queue::channel(QUEUE);
    let Some(claim) = shard.shared.watchers.claim(&spec.topic) else {
        // Another subscriber claimed it since the 200 was decided: the stream ends empty.
        drop(tx);
        return super::sse::serve(stream, buf, events).await;
    };
    let expiry = expired(spec.expires_us);
    let follower = follow(shard.clone(), claim, *spec, true, tx);
    let serve = super::sse::serve(stream, buf, events);
    // An expired credential ends the stream as the follower's end does: the queue closes and
    // the writer ends the chunked body.
    let ending = futures::future::select(Box::pin(follower), Box::pin(expiry));
    let _ = futures::future::select(Box::pin(ending), Box::pin(serve)).await;
}
