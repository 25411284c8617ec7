//! CloudEvents over WebSocket, the publishing side (SPEC "Other protocols"): `GET
//! /events/ws?publish=T` (with subprotocol `cloudevents.json` when the client asks for it), one
//! structured event per text message, each answered in order with
//! `{"type":"published","id":ID,"partition":P,"offset":"O"}` or
//! `{"type":"error","id":ID,"status":S,"detail":D}` (the statuses `POST /events/publish`
//! would answer).
//!
//! The same path as `POST /events/publish`: the messages one read brought (at most
//! [`MAX_ROUND`] of them, `max_body_bytes` of events in all) are a round. Each message is
//! checked as a publish of its own (parsed from its own bytes; the rate limits, the transformer
//! and the routes with the budgets of one request), the ACL, quotas and backlog once a round;
//! those that pass are stored together, with one append per partition, and the answers go out
//! in one write. A round that stopped at its budget is followed by the next without a read.
//!
//! Budgets: a message is at most the smaller of `ws_max_message_bytes` and `max_body_bytes`
//! (1009 past it); the connection buffers at most one message and a read (16 KiB) more; a round
//! is bounded in events and bytes, and the next read waits until its answers are written (a
//! publisher that does not read its answers is dropped after `write_timeout`); `idle_timeout`
//! without a frame closes with 1001; a binary message is refused with 1003 (the binding carries
//! structured events as text); an expired credential, one the keys no longer verify, or an ACL
//! that no longer allows PUBLISH closes with 1008 (checked each round, pings included).

use std::borrow::Cow;
use std::rc::Rc;

use frame_codec::Frame;
use smallvec::SmallVec;

use super::gate::{shed, Gate, Quotaed};
use super::responses::ws_upgrade;
use super::traced::{Headers, Publishing};
use super::{pipeline, Traffic};
use crate::adaptor::cloudevents;
use crate::governance::acl::{Action, Kind};
use crate::governance::identity::Principal;
use crate::governance::Caller;
use crate::model::PartitionId;
use crate::server::conn::{flush, read_at_most, ConnLimits, ReadOutcome};
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

    /// The publishing session of a connection [`Traffic::ws_publish`] upgraded ([`session`]).
    pub(super) fn publish_session(
        &self,
        caller: Caller,
        stream: Stream,
        buf: Vec<u8>,
        limits: ConnLimits,
        spec: Box<PublishSpec>,
    ) -> impl std::future::Future<Output = ()> {
        session(self.shared(), caller, stream, buf, limits, spec)
    }

    /// The publisher of a delivery session, for its `publish` messages ([`SessionPublisher`]).
    pub(super) fn session_publisher(
        &self,
        caller: &mut Option<Caller>,
        principal: &Option<String>,
        tenant: &Option<String>,
        credential: (Option<i64>, Option<Credential>),
    ) -> crate::push::Publisher {
        SessionPublisher::boxed(self.shared(), caller, principal, tenant, credential)
    }
}

/// One message's answer, written as it is decided. `topic`: the topic a route moved the event
/// to, as the caller names it (as `POST /events/publish` says it).
fn answer(out: &mut Vec<u8>, id: Option<&str>, result: Result<(Option<&str>, u32, u64), (u16, &str)>) {
    let id = serde_json::Value::from(id);
    let text = match result {
        Ok((None, p, o)) => format!(r#"{{"type":"published","id":{id},"partition":{p},"offset":"{o}"}}"#),
        Ok((Some(t), p, o)) => {
            let t = serde_json::Value::from(t);
            format!(r#"{{"type":"published","id":{id},"partition":{p},"offset":"{o}","topic":{t}}}"#)
        }
        Err((status, detail)) => {
            let detail = serde_json::Value::from(detail);
            format!(r#"{{"type":"error","id":{id},"status":{status},"detail":{detail}}}"#)
        }
    };
    encode_frame(OpCode::Text, true, text.as_bytes(), out);
}

/// The status and detail of a refusal as the HTTP endpoint words it.
pub(super) fn refusal(r: &Response) -> (u16, String) {
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
async fn session(
    traffic: Rc<Traffic>,
    mut caller: Caller,
    mut stream: Stream,
    mut buf: Vec<u8>,
    limits: ConnLimits,
    spec: Box<PublishSpec>,
) {
    let shared = traffic.shard.shared.clone();
    let max_body = shared.config.limits.max_body_bytes;
    let max_message = limits.ws_max_message.min(max_body);
    let who = Rc::new(Principal {
        name: spec.principal.clone().unwrap_or_else(|| "anonymous".into()),
        tenant: spec.tenant.clone(),
        expires_us: spec.expires_us,
    });
    let mut reader = MessageReader::new(max_message);
    let mut out = Vec::new();
    let mut generation = shared.governance.generation();
    // When the last whole frame arrived: `idle_timeout` after it the session ends, however
    // many bytes of an unfinished frame trickle in meanwhile.
    let mut last_frame = std::time::Instant::now();
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
        if consumed > 0 {
            last_frame = std::time::Instant::now();
        }
        // A round that stopped at its budget leaves whole messages behind: the next round takes
        // them without waiting for more bytes.
        let full = texts.len() == MAX_ROUND || bytes >= max_body;
        // The credential, every round (pings too keep a session alive): expired, or no longer
        // verified by the keys, closes it.
        let now = crate::model::clock::now_micros();
        let snap = traffic.view.current(&shared.governance);
        let revoked = snap.generation != generation
            && spec.credential.as_ref().is_some_and(|c| snap.keys.verify(&c.0, now).is_err());
        generation = snap.generation;
        if spec.expires_us.is_some_and(|e| e <= now) || revoked {
            close = Some(CloseCode::POLICY);
        } else if !texts.is_empty() {
            let mut gate = Gate { traffic: &traffic, snap, caller: &mut caller, who: &who, token: None };
            // The ACL first, before any parsing: a publisher it no longer allows is closed.
            if gate.allow(Action::Publish, Kind::Topic, &spec.local).is_err() {
                close = Some(CloseCode::POLICY);
            } else {
                round(&traffic, &mut gate, &spec.topic, &texts, &mut out).await;
            }
        }
        if let Some(code) = close {
            return crate::server::ws::close(stream, &mut out, code, limits.write_timeout).await;
        }
        if !flush(&mut stream, &mut out, limits.write_timeout).await {
            return;
        }
        if full {
            crate::task::yield_now().await;
            continue;
        }
        // What is buffered here is less than one whole frame (a round takes every whole one),
        // so the buffer stays under a message, its frame header and a read.
        let quiet = limits.idle_timeout.saturating_sub(last_frame.elapsed());
        match read_at_most(&mut stream, &mut buf, quiet, READ_ROOM).await {
            ReadOutcome::Data => {}
            ReadOutcome::Closed => return,
            ReadOutcome::TimedOut => {
                return crate::server::ws::close(stream, &mut out, CloseCode::GOING_AWAY, limits.write_timeout).await
            }
        }
    }
}

/// Where a message's first copy goes in the round's groups (group, position), or its refusal.
type Placing = Result<(usize, usize), (u16, String)>;

/// Where a message of a round was stored: (the topic a route moved it to, as the caller names
/// it; partition; offset), or its refusal (status, detail).
pub(super) type Outcome = Result<(Option<String>, u32, u64), (u16, String)>;

/// Bytes one read takes at most.
const READ_ROOM: usize = 16 * 1024;

/// Publishes one round's messages and writes their answers, in order. Each message is checked as
/// a publish of its own (its parse, the rate limits, the transformer and the routes, each with
/// the budgets of one request); those that pass are stored together.
async fn round<T: AsRef<str>>(traffic: &Traffic, gate: &mut Gate<'_>, topic: &str, texts: &[T], out: &mut Vec<u8>) {
    let now = crate::model::clock::now_micros();
    // Over the memory limit nothing is parsed (as `POST /events/publish` answers 503 first).
    let shed = traffic.shard.shared.memory.shed_now().then(|| refusal(&super::gate::shed()));
    let mut ids = SmallVec::<[Option<String>; 8]>::new();
    let parsed: Vec<Parsed> = texts
        .iter()
        .map(|t| {
            let t = t.as_ref();
            if let Some(r) = &shed {
                ids.push(loose_id(t));
                return Err(r.clone());
            }
            match cloudevents::parse_structured_text(topic, t) {
                Ok(mut f) => {
                    f.set_timestamp(now);
                    ids.push(f.body().attr_str("id").map(str::to_owned));
                    Ok((f, t.len()))
                }
                Err(e) => {
                    ids.push(loose_id(t));
                    Err((400, e.to_string()))
                }
            }
        })
        .collect();
    let outcomes = store_round(traffic, gate, topic, parsed).await;
    for (id, result) in ids.iter().zip(&outcomes) {
        let result = result.as_ref().map(|(t, p, o)| (t.as_deref(), *p, *o)).map_err(|(s, d)| (*s, d.as_str()));
        answer(out, id.as_deref(), result);
    }
}

/// A message of a round: its event as a frame (publish time set) and the bytes it came in, or
/// why it could not be read.
pub(super) type Parsed = Result<(Frame, usize), (u16, String)>;

/// Stores one round of messages to `topic` (its stored name, checked and allowed), whatever
/// protocol they came in: each is checked as a publish of its own (the rate limits, the
/// transformer and the routes, each with the budgets of one request; the quotas and backlog
/// once); those that pass are stored together, one append per partition. Their outcomes, in
/// order.
pub(super) async fn store_round(
    traffic: &Traffic,
    gate: &mut Gate<'_>,
    topic: &str,
    parsed: Vec<Parsed>,
) -> Vec<Outcome> {
    let m = traffic.shard.shared.metrics.shard(traffic.shard.id);
    m.publish_requests.add(parsed.len() as u64);
    // Per message: where its first copy goes (group, position) or its refusal.
    let mut each: SmallVec<[Placing; 8]> = SmallVec::new();
    let mut groups: pipeline::Groups<'_, Frame> = SmallVec::new();
    let shared_refusal = gate.quota(Quotaed::Topic, topic).and_then(|()| gate.backlog()).err().map(|r| refusal(&r));
    let bytes = parsed.iter().map(|p| p.as_ref().map_or(0, |(_, n)| *n)).sum();
    let mut traced = Publishing::new(topic, bytes);
    for p in parsed {
        let (mut f, len) = match p {
            Ok(p) => p,
            Err(r) => {
                each.push(Err(r));
                continue;
            }
        };
        traced.begin(each.len(), &mut f, Headers::default());
        if let Some(r) = &shared_refusal {
            each.push(Err(r.clone()));
            continue;
        }
        if let Err(r) = gate.limit(topic, 1, len as u64) {
            each.push(Err(refusal(&r)));
            continue;
        }
        let routed = match traffic.transform_and_route(&gate.snap, topic, vec![f]) {
            Ok(r) => r,
            Err(r) => {
                each.push(Err(refusal(&r)));
                continue;
            }
        };
        // Merged into the round's groups (by destination topic), remembering the first copy.
        let (g0, at0) = routed.first.as_ref().map_or((0, 0), |f| f[0]);
        let mut first = None;
        for (k, (dest, frames)) in routed.groups.into_iter().enumerate() {
            let g = match groups.iter().position(|(n, _)| *n == dest) {
                Some(g) => g,
                None => {
                    groups.push((dest, Vec::new()));
                    groups.len() - 1
                }
            };
            if k == g0 {
                first = Some((g, groups[g].1.len() + at0));
            }
            groups[g].1.extend(frames);
        }
        each.push(Ok(first.expect("the first copy's group is among the groups")));
    }
    traced.storing();
    let stored: Result<pipeline::Groups<'_, (PartitionId, u64)>, (u16, String)> = if groups.is_empty() {
        Ok(SmallVec::new())
    } else {
        traffic.store_routed(groups).await.map_err(|r| refusal(&r))
    };
    if let Ok(stored) = &stored {
        traced.stored(|i| {
            let (g, at) = *each[i].as_ref().ok()?;
            let (p, o) = stored[g].1[at];
            Some((p.0, o))
        });
    }
    let mut published = 0;
    let outcomes: Vec<Outcome> = each
        .into_iter()
        .map(|placed| {
            let result = match (placed, &stored) {
                (Err(r), _) => Err(r),
                (Ok(_), Err(r)) => Err(r.clone()),
                (Ok((g, at)), Ok(stored)) => {
                    let (t, placed) = &stored[g];
                    let (p, o) = placed[at];
                    published += 1;
                    let moved = (t.as_ref() != topic).then(|| gate.local(t)).flatten().map(str::to_owned);
                    Ok((moved, p.0, o))
                }
            };
            if result.is_err() {
                m.publish_errors.inc();
            }
            result
        })
        .collect();
    m.events_published.add(published);
    gate.tenant_count(|s| &s.published, published);
    outcomes
}

/// A WebSocket session's `{"type":"publish","topic":T,"event":{...}}` messages (SPEC: on any
/// session): each is a round of one event to its topic, as the session's caller, answered as
/// `GET /events/ws?publish=T` answers (`published` or `error`, never a close: the session is
/// there for something else). The topic is checked and allowed per message.
pub(super) struct SessionPublisher {
    traffic: Rc<Traffic>,
    caller: Caller,
    who: Rc<Principal>,
    /// The credential the session was opened with: once the keys no longer verify it (or it
    /// expires), its publish messages are refused with 401. (Boxed: a session opened without
    /// one, under `auth = none`, holds a pointer.)
    credential: Option<Box<Credential>>,
    /// The policy generation it was last verified under: verified again only after a change
    /// (a JWT's signature costs far more than a publish).
    verified: u64,
}

impl SessionPublisher {
    /// The publisher of a session opened by `principal` (of `tenant`, its credential expiring
    /// at `expires_us`), holding the connection's caller from now on.
    fn boxed(
        traffic: Rc<Traffic>,
        caller: &mut Option<Caller>,
        principal: &Option<String>,
        tenant: &Option<String>,
        (expires_us, credential): (Option<i64>, Option<Credential>),
    ) -> crate::push::Publisher {
        let who = match (principal, tenant, expires_us) {
            // `auth = none`: the thread's one anonymous principal, not one per idle session.
            (None, None, None) => crate::governance::anonymous(),
            _ => {
                let name = principal.clone().unwrap_or_else(|| "anonymous".into());
                Rc::new(Principal { name, tenant: tenant.clone(), expires_us })
            }
        };
        let verified = traffic.shard.shared.governance.generation();
        Box::new(SessionPublisher {
            verified,
            traffic,
            caller: caller.take().expect("one session per connection"),
            who,
            credential: credential.map(Box::new),
        })
    }

    async fn publish_one(&mut self, text: &str, out: &mut Vec<u8>) {
        #[derive(serde::Deserialize)]
        struct PublishMessage<'a> {
            #[serde(borrow)]
            topic: Option<Cow<'a, str>>,
            #[serde(borrow)]
            event: Option<&'a serde_json::value::RawValue>,
        }
        let (topic, event) = match serde_json::from_str::<PublishMessage>(text) {
            Ok(PublishMessage { topic: Some(t), event: Some(e) }) => (t, e.get()),
            Ok(PublishMessage { event, .. }) => {
                let detail = "a publish message names its \"topic\" and carries the event as \"event\"";
                return answer(out, event.and_then(|e| loose_id(e.get())).as_deref(), Err((400, detail)));
            }
            Err(e) => return answer(out, None, Err((400, &format!("malformed publish message: {e}")))),
        };
        let shared = &self.traffic.shard.shared;
        // A session's messages may be larger than a request body may (`ws_max_message_bytes`):
        // an event is held to what `POST /events/publish` takes.
        if event.len() > shared.config.limits.max_body_bytes {
            let detail = "the event is larger than max_body_bytes";
            return answer(out, None, Err((413, detail)));
        }
        let snap = self.traffic.view.current(&shared.governance);
        let now = crate::model::clock::now_micros();
        let revoked = snap.generation != self.verified
            && self.credential.as_ref().is_some_and(|c| snap.keys.verify(&c.0, now).is_err());
        if !revoked {
            self.verified = snap.generation;
        }
        if revoked || self.who.expires_us.is_some_and(|e| e <= now) {
            let detail = "the session's credential expired or is no longer valid";
            return answer(out, loose_id(event).as_deref(), Err((401, detail)));
        }
        let mut gate = Gate { traffic: &self.traffic, snap, caller: &mut self.caller, who: &self.who, token: None };
        let stored = match self.traffic.topic_named(&mut gate, topic, Action::Publish, None) {
            Ok(t) => t.into_owned(),
            Err(r) => {
                let (status, detail) = refusal(&r);
                return answer(out, loose_id(event).as_deref(), Err((status, &detail)));
            }
        };
        round(&self.traffic, &mut gate, &stored, &[event], out).await;
    }
}

impl crate::push::Publish for SessionPublisher {
    fn publish<'a>(
        &'a mut self,
        text: &'a str,
        out: &'a mut Vec<u8>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + 'a>> {
        Box::pin(self.publish_one(text, out))
    }
}
