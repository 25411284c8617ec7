//! CloudEvents over WebSocket, the publishing side (SPEC "Other protocols"): `GET
//! /events/ws?publish=T` (with subprotocol `cloudevents.json` when the client asks for it), one
//! structured event per text message, each answered in order with
//! `{"type":"published","id":ID,"partition":P,"offset":"O"}` or
//! `{"type":"error","id":ID,"status":S,"detail":D}` (the statuses `POST /events/publish`
//! would answer).
//!
//! The same path as `POST /events/publish`: the messages one read brought (at most
//! [`MAX_ROUND`] of them, `max_body_bytes` of events in all) are parsed from their own bytes,
//! pass the caller's rate limits, quotas and backlog, the topic's transformer and routes
//! together, and are stored with one append per partition; their answers go out in one write.
//!
//! Budgets: a message is at most the smaller of `ws_max_message_bytes` and `max_body_bytes`
//! (1009 past it); a round is bounded in events and bytes, and the next read waits until its
//! answers are written (a publisher that does not read its answers is dropped after
//! `write_timeout`); `idle_timeout` without a message closes with 1001; a binary message is
//! refused with 1003 (the binding carries structured events as text); an expired credential, or
//! one the keys no longer verify, closes with 1008 at the next message.

use std::rc::Rc;

use frame_codec::Frame;
use smallvec::SmallVec;

use super::{shed, ws_upgrade, Gate, Quotaed, Traffic};
use crate::adaptor::cloudevents;
use crate::governance::acl::{Action, Kind};
use crate::governance::identity::Principal;
use crate::governance::Caller;
use crate::server::conn::{flush, read_more, ConnLimits, ReadOutcome};
use crate::server::upgrade::{Credential, PublishSpec};
use crate::server::{Request, Response, Stream, Upgrade};
use crate::ws::{encode_frame, CloseCode, Message, MessageReader, OpCode};

/// Messages taken in one round at most.
pub const MAX_ROUND: usize = 256;

impl Traffic {
    /// `GET /events/ws?publish=T`: 101 into a publishing session, or what a publish to `T` would
    /// be refused with (400, 401, 403, 503).
    pub(super) fn ws_publish(&self, gate: &mut Gate<'_>, req: &Request<'_>) -> Response {
        if self.shard.shared.memory.shed_now() {
            return shed();
        }
        let topic = match self.topic_query(gate, req, "publish", Action::Publish) {
            Ok(t) => t.into_owned(),
            Err(r) => return r,
        };
        let spec = PublishSpec {
            topic,
            local: req.query("publish").unwrap_or_default().into_owned(),
            principal: gate.principal(),
            tenant: gate.who.tenant.clone(),
            credential: gate.principal().and(gate.token.map(|t| Credential(t.to_vec()))),
            expires_us: gate.who.expires_us,
        };
        ws_upgrade(req, Upgrade::WsPublish(Box::new(spec)))
    }
}

/// One message's answer, written as it is decided.
fn answer(out: &mut Vec<u8>, id: Option<&str>, result: Result<(u32, u64), (u16, &str)>) {
    let id = serde_json::Value::from(id);
    let text = match result {
        Ok((p, o)) => format!(r#"{{"type":"published","id":{id},"partition":{p},"offset":"{o}"}}"#),
        Err((status, detail)) => {
            let detail = serde_json::Value::from(detail);
            format!(r#"{{"type":"error","id":{id},"status":{status},"detail":{detail}}}"#)
        }
    };
    encode_frame(OpCode::Text, true, text.as_bytes(), out);
}

/// The status and detail of a refusal as the HTTP endpoint words it.
fn refusal(r: &Response) -> (u16, String) {
    let detail = serde_json::from_slice::<serde_json::Value>(&r.body)
        .ok()
        .and_then(|v| v["detail"].as_str().map(str::to_owned))
        .unwrap_or_default();
    (r.status.0, detail)
}

/// The `id` of a message that is not a valid event, if it has one, for its error answer.
fn loose_id(text: &str) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Id {
        id: Option<String>,
    }
    serde_json::from_str::<Id>(text).ok().and_then(|i| i.id)
}

/// Serves a publisher until it closes, goes idle, or breaks a rule.
pub(super) async fn session(
    traffic: Traffic,
    mut caller: Caller,
    mut stream: Stream,
    mut buf: Vec<u8>,
    limits: ConnLimits,
    spec: Box<PublishSpec>,
) {
    let shared = traffic.shard.shared.clone();
    let max_body = shared.config.limits.max_body_bytes;
    let who = Rc::new(Principal {
        name: spec.principal.clone().unwrap_or_else(|| "anonymous".into()),
        tenant: spec.tenant.clone(),
        expires_us: spec.expires_us,
    });
    let mut reader = MessageReader::new(limits.ws_max_message.min(max_body));
    let mut out = Vec::new();
    let mut generation = shared.governance.generation();
    loop {
        // The round: every complete message already read, within its budgets.
        let mut texts: SmallVec<[String; 8]> = SmallVec::new();
        let (mut bytes, mut consumed) = (0, 0);
        let mut close = None;
        while texts.len() < MAX_ROUND && bytes < max_body {
            let (msg, used) = match reader.read(&mut buf[consumed..]) {
                Ok(r) => r,
                Err(e) => {
                    close = Some(e.code);
                    break;
                }
            };
            consumed += used;
            match msg {
                None => break,
                Some(Message::Text(t)) => {
                    bytes += t.len();
                    texts.push(t);
                }
                Some(Message::Binary(_)) => {
                    close = Some(CloseCode::UNSUPPORTED);
                    break;
                }
                Some(Message::Ping(p)) => encode_frame(OpCode::Pong, true, &p, &mut out),
                Some(Message::Pong(_)) => {}
                Some(Message::Close(code, _)) => {
                    close = Some(code.map_or(CloseCode::NORMAL, CloseCode));
                    break;
                }
            }
        }
        // Once per round: the messages taken leave the buffer together.
        buf.drain(..consumed);
        if !texts.is_empty() {
            let now = crate::clock::now_micros();
            let expired = spec.expires_us.is_some_and(|e| e <= now);
            let snap = traffic.view.current(&shared.governance);
            // The keys changed since the last check: the credential must still verify.
            let revoked = snap.generation != generation
                && spec.credential.as_ref().is_some_and(|c| snap.keys.verify(&c.0, now).is_err());
            generation = snap.generation;
            if expired || revoked {
                close = Some(CloseCode::POLICY);
            } else {
                let mut gate = Gate { traffic: &traffic, snap, caller: &mut caller, who: &who, token: None };
                round(&traffic, &mut gate, &spec, &texts, &mut out).await;
            }
        }
        if let Some(code) = close {
            return crate::server::ws::close(stream, &mut out, code, limits.write_timeout).await;
        }
        if !flush(&mut stream, &mut out, limits.write_timeout).await {
            return;
        }
        match read_more(&mut stream, &mut buf, limits.idle_timeout).await {
            ReadOutcome::Data => {}
            ReadOutcome::Closed => return,
            ReadOutcome::TimedOut => {
                return crate::server::ws::close(stream, &mut out, CloseCode::GOING_AWAY, limits.write_timeout).await
            }
        }
    }
}

/// Publishes one round's messages and writes their answers, in order.
async fn round(traffic: &Traffic, gate: &mut Gate<'_>, spec: &PublishSpec, texts: &[String], out: &mut Vec<u8>) {
    let shared = &traffic.shard.shared;
    let m = shared.metrics.shard(traffic.shard.id);
    m.publish_requests.add(texts.len() as u64);
    let now = crate::clock::now_micros();
    // Each message parsed on its own: a bad one is answered (400), the others go on. Per
    // message: its id, and the parse error if it has one.
    let mut parsed: SmallVec<[(Option<String>, Option<String>); 8]> = SmallVec::new();
    let mut frames = Vec::with_capacity(texts.len());
    for t in texts {
        match cloudevents::parse_structured_text(&spec.topic, t) {
            Ok(mut f) => {
                f.set_timestamp(now);
                parsed.push((f.body().attr_str("id").map(str::to_owned), None));
                frames.push(f);
            }
            Err(e) => parsed.push((loose_id(t), Some(e.to_string()))),
        }
    }
    let stored = publish(traffic, gate, spec, frames, texts.iter().map(String::len).sum()).await;
    let mut placed = match &stored {
        Ok(p) => p.iter(),
        Err(_) => [].iter(),
    };
    for (id, invalid) in &parsed {
        let result = match (invalid, &stored) {
            (Some(detail), _) => Err((400, detail.as_str())),
            (None, Err((status, detail))) => Err((*status, detail.as_str())),
            (None, Ok(_)) => Ok(*placed.next().expect("one placement per stored event")),
        };
        if result.is_err() {
            m.publish_errors.inc();
        }
        answer(out, id.as_deref(), result);
    }
}

/// The checks and the store of `POST /events/publish`, for a round's valid events: where each
/// landed (partition, offset), or the one refusal for all of them.
async fn publish(
    traffic: &Traffic,
    gate: &mut Gate<'_>,
    spec: &PublishSpec,
    frames: Vec<Frame>,
    bytes: usize,
) -> Result<Vec<(u32, u64)>, (u16, String)> {
    if frames.is_empty() {
        return Ok(Vec::new());
    }
    if traffic.shard.shared.memory.shed_now() {
        return Err(refusal(&shed()));
    }
    let topic = spec.topic.as_str();
    gate.allow(Action::Publish, Kind::Topic, &spec.local).map_err(|r| refusal(&r))?;
    gate.limit(topic, frames.len() as u64, bytes as u64).map_err(|r| refusal(&r))?;
    gate.quota(Quotaed::Topic, topic).and_then(|()| gate.backlog()).map_err(|r| refusal(&r))?;
    let n = frames.len();
    let routed = traffic.transform_and_route(&gate.snap, topic, frames).map_err(|r| refusal(&r))?;
    let first = routed.first;
    let stored = traffic.store_routed(routed.groups).await.map_err(|r| refusal(&r))?;
    let m = traffic.shard.shared.metrics.shard(traffic.shard.id);
    m.events_published.add(n as u64);
    gate.tenant_count(|s| &s.published, n as u64);
    Ok((0..n)
        .map(|i| {
            let (g, at) = first.as_ref().map_or((0, i), |f| f[i]);
            let (p, o) = stored[g].1[at];
            (p.0, o)
        })
        .collect())
}
