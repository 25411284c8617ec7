//! The FrameAdaptor SPI: what one protocol does at the edge of the broker. An adaptor turns its
//! request into frames (never through another protocol's message: each protocol's conversion is
//! its own module in `evmesh_protocol::adaptor`) and words the ingress's refusals in the
//! protocol's own shape. Everything between is one ingress path per kind of destination, the
//! same for every protocol:
//!
//! * a publish to a topic ([`Publish`], [`Traffic::publish_with`]: CloudEvents over HTTP,
//!   classic MeshMessage sends): the topic's checks and the ACL, the rate limits, the quotas and
//!   backlog, the transformer, the routes and storage;
//! * a turn of an agent session (Mode 1) on the agent's lite topic `agent.<A>`, which only the
//!   broker writes ([`Traffic::admit_turn`] then [`Traffic::turn_with`]: the native
//!   `POST /session/stream/{sid}`, A2A's `SendMessage`): REQUEST on `agent:<A>`, the agent
//!   routable and attached, the lite topic's rate limits, one turn at a time per session, storage.
//!
//! Adding a protocol is one module implementing [`FrameAdaptor`] (and [`Publish`] if it
//! publishes; its pure conversions in the protocol crate) and a route (`router.rs`) whose
//! endpoint calls the path with it. `frame -> wire` is the protocol crate's too: for push delivery
//! `adaptor::PushWire` (CloudEvents' binary mode, MeshMessage's push form, driven by the webhook
//! transport), for A2A the task rendering of a turn's chunks (`adaptor::a2a`).

use std::borrow::Cow;
use std::sync::Arc;

use frame_codec::Frame;
use smallvec::SmallVec;

use super::gate::{shed, Gate, Quotaed};
use super::responses::storage_problem;
use super::traced::{Headers, Publishing};
use super::Traffic;
use crate::adaptor::cloudevents::{self, CeError, Mode};
use crate::governance::acl::Action;
use crate::http::{problem, StatusCode};
use crate::server::{Request, Response};
use crate::shard::calls::{Call, End};

/// Where one published event was stored: its partition and offset, and the topic (as the
/// caller names it) when a route moved it elsewhere.
pub(super) struct Placed {
    pub partition: u32,
    pub offset: u64,
    pub moved_to: Option<String>,
}

/// Why a publish was not taken.
pub(super) enum Refusal {
    /// The adaptor's own answer, already in the protocol's shape (it could not read the request).
    Answered(Response),
    /// The ingress's refusal, a problem (status + detail) for the adaptor to word.
    Problem(Response),
    /// A turn of the session is in progress (a 409 problem): a protocol may say so in its own
    /// words (A2A: the context is busy).
    Busy(Response),
}

impl From<Response> for Refusal {
    fn from(problem: Response) -> Refusal {
        Refusal::Problem(problem)
    }
}

/// Where a request's frames go: the topic (its stored name) and, for a turn, the agent
/// session's id and the turn's number.
pub(super) struct To<'a> {
    pub topic: &'a str,
    pub turn: Option<(&'a str, u64)>,
}

/// One protocol at the edge: its request as frames, and the ingress's refusals in its shape.
pub(super) trait FrameAdaptor {
    /// The request's events as frames for `to`, each a valid CloudEvent. The ingress stamps
    /// their publish time.
    fn frames(&self, to: &To<'_>, req: &Request<'_>) -> Result<Vec<Frame>, Refusal>;
    /// The answer to a request the ingress refused with `problem` (a problem+json response:
    /// its status, detail and headers).
    fn refused(&self, problem: Response) -> Response;
    /// The bytes the rate limits count: the body, unless one request carries several
    /// publishes (a classic batch's messages each count their own) or the protocol's envelope
    /// is not what is sent on (an A2A message's prompt).
    fn bytes(&self, req: &Request<'_>) -> u64 {
        req.body.len() as u64
    }
}

/// A protocol's publish to a topic: which topic, and the answer once it is stored.
pub(super) trait Publish: FrameAdaptor {
    /// The topic the publish names, as the caller names it (checked by the ingress).
    fn topic<'r>(&self, req: &Request<'r>) -> Result<Cow<'r, str>, Refusal>;
    /// The answer to a publish whose events were stored at `placed`, in request order.
    fn accepted(&self, placed: &[Placed]) -> Response;
}

/// CloudEvents over HTTP (`POST /events/publish?topic=T`, the HTTP binding's three modes):
/// answered 202 with where each event went, refused with problem+json. One per request: it
/// remembers whether the body was a batch (the answer's shape) from reading it.
#[derive(Default)]
pub(super) struct CloudEventsHttp {
    batch: std::cell::Cell<bool>,
}

impl FrameAdaptor for CloudEventsHttp {
    fn frames(&self, to: &To<'_>, req: &Request<'_>) -> Result<Vec<Frame>, Refusal> {
        let topic = to.topic;
        let ct = req.header("content-type");
        let parsed = match cloudevents::mode(ct, req.header("ce-specversion").is_some()) {
            Ok(Mode::Structured) => cloudevents::parse_structured(topic, req.body).map(|f| vec![f]),
            Ok(Mode::Batch) => {
                self.batch.set(true);
                cloudevents::parse_batch(topic, req.body)
            }
            Ok(Mode::Binary) => cloudevents::parse_binary(topic, req.headers(), ct, req.body).map(|f| vec![f]),
            Err(e) => Err(e),
        };
        parsed.map_err(|e| match e {
            CeError::Invalid(m) => problem(StatusCode::BAD_REQUEST, &m).into(),
            CeError::UnsupportedMedia(m) => problem(StatusCode::UNSUPPORTED_MEDIA_TYPE, &m).into(),
        })
    }

    fn refused(&self, problem: Response) -> Response {
        problem
    }
}

impl Publish for CloudEventsHttp {
    fn topic<'r>(&self, req: &Request<'r>) -> Result<Cow<'r, str>, Refusal> {
        req.query("topic").ok_or_else(|| problem(StatusCode::BAD_REQUEST, "missing ?topic=").into())
    }

    fn accepted(&self, placed: &[Placed]) -> Response {
        let batch = self.batch.get();
        let mut body = Vec::with_capacity(40 * placed.len() + 16);
        if batch {
            body.extend_from_slice(b"{\"results\":[");
        }
        let mut num = crate::http::Decimal::new();
        for (i, p) in placed.iter().enumerate() {
            if i > 0 {
                body.push(b',');
            }
            body.extend_from_slice(b"{\"partition\":");
            body.extend_from_slice(num.u64(u64::from(p.partition)));
            body.extend_from_slice(b",\"offset\":");
            body.extend_from_slice(num.u64(p.offset));
            if let Some(t) = &p.moved_to {
                body.extend_from_slice(b",\"topic\":");
                serde_json::to_writer(&mut body, t).expect("a string serializes");
            }
            body.push(b'}');
        }
        if batch {
            body.extend_from_slice(b"]}");
        }
        Response::json(StatusCode::ACCEPTED, body)
    }
}

impl Traffic {
    /// A publish in `adaptor`'s protocol, through the one ingress path.
    pub(super) async fn publish_with<A: Publish>(
        &self,
        adaptor: &A,
        gate: &mut Gate<'_>,
        req: &Request<'_>,
    ) -> Response {
        match self.ingest(adaptor, gate, req).await {
            Ok(answer) => answer,
            Err(Refusal::Answered(answer)) => answer,
            Err(Refusal::Problem(problem) | Refusal::Busy(problem)) => adaptor.refused(problem),
        }
    }

    /// [`Traffic::publish_with`]'s path: the adaptor's answer, or why it was refused.
    pub(super) async fn ingest<A: Publish>(
        &self,
        adaptor: &A,
        gate: &mut Gate<'_>,
        req: &Request<'_>,
    ) -> Result<Response, Refusal> {
        if self.shard.shared.memory.shed_now() {
            return Err(shed().into());
        }
        let named = adaptor.topic(req)?;
        let topic = self.topic_named(gate, named, Action::Publish, Some(req))?;
        let frames = adaptor.frames(&To { topic: &topic, turn: None }, req)?;
        let sent = (req.body.len(), adaptor.bytes(req), Headers::of(req));
        let placed = self.publish_frames(gate, &topic, frames, sent).await?;
        Ok(adaptor.accepted(&placed))
    }

    /// The one ingress path's part after the adaptor: `frames` for `topic` (its stored name,
    /// checked and allowed), `sent` = (the request's bytes, what the rate limits count, its
    /// trace headers). Publish time, trace, rate limits, quotas and backlog, transformer,
    /// routes, storage; where each event was stored, in order.
    pub(super) async fn publish_frames(
        &self,
        gate: &mut Gate<'_>,
        topic: &str,
        mut frames: Vec<Frame>,
        (body_len, counted, headers): (usize, u64, Headers<'_>),
    ) -> Result<SmallVec<[Placed; 1]>, Refusal> {
        let now = crate::task::clock::wall_micros();
        let mut traced = Publishing::new(topic, body_len);
        for (i, f) in frames.iter_mut().enumerate() {
            f.set_timestamp(now);
            traced.begin(i, f, headers);
        }
        // Rate limits count what was parsed: a refused or malformed request takes nothing.
        gate.limit(topic, frames.len() as u64, counted)?;
        gate.quota(Quotaed::Topic, topic).and_then(|()| gate.backlog())?;
        // Then the topic's transformer and routes: where each event is stored, and as what.
        let routed = self.transform_and_route(&gate.snap, topic, frames)?;
        let (n, first) = (routed.events(), routed.first);
        traced.storing();
        let stored = self.store_routed(routed.groups).await?;
        let m = self.shard.shared.metrics.shard(self.shard.id);
        m.events_published.add(n as u64);
        gate.tenant_count(|s| &s.published, n as u64);
        let placed: SmallVec<[Placed; 1]> = (0..n)
            .map(|i| {
                let (g, at) = first.as_ref().map_or((0, i), |f| f[i]);
                let (t, placed) = &stored[g];
                let (p, o) = placed[at];
                // A route moved it: the answer says where to (if it is the caller's to see).
                let moved_to = (**t != *topic).then(|| gate.local(t)).flatten().map(str::to_owned);
                Placed { partition: p.0, offset: o, moved_to }
            })
            .collect();
        traced.stored(|i| Some((placed[i].partition, placed[i].offset)));
        Ok(placed)
    }

    /// Whether a turn for `agent` (as the caller names it, REQUEST on `agent:<A>` allowed) may
    /// start, before anything is made for it: the broker not shedding, the agent routable and
    /// attached, the lite topic's rate limits. Its lite topic's stored name.
    pub(super) fn admit_turn<A: FrameAdaptor>(
        &self,
        adaptor: &A,
        gate: &mut Gate<'_>,
        req: &Request<'_>,
        agent: &str,
    ) -> Result<String, Refusal> {
        if self.shard.shared.memory.shed_now() {
            return Err(shed().into());
        }
        if !self.routable(&Self::stored_agent(gate, agent)) {
            return Err(unavailable(&format!("agent {agent} is not registered, ready and heart-beating")).into());
        }
        let topic = Self::agent_topic(gate, agent);
        if self.shard.shared.watchers.follower(&topic).is_none() {
            return Err(not_attached(agent).into());
        }
        gate.limit(&topic, 1, adaptor.bytes(req))?;
        Ok(topic)
    }

    /// The next turn of `call` (`agent`'s, admitted by [`Traffic::admit_turn`] to `topic`): started (409
    /// while one is in progress), its frames routed to the agent's attachment and stored. Its
    /// number; a turn that could not be sent is ended.
    pub(super) async fn turn_with<A: FrameAdaptor>(
        &self,
        adaptor: &A,
        call: &Arc<Call>,
        (agent, topic): (&str, &str),
        req: &Request<'_>,
    ) -> Result<u64, Refusal> {
        let calls = &self.shard.shared.calls;
        let now = crate::model::clock::now_ms;
        let turn = calls.start_turn(call, now()).map_err(|m| Refusal::Busy(problem(StatusCode::CONFLICT, m)))?;
        let mut frames = match adaptor.frames(&To { topic, turn: Some((&call.sid, turn)) }, req) {
            Ok(f) => f,
            Err(r) => {
                calls.end_turn(call, End::Failed, now());
                return Err(r);
            }
        };
        let (mut traced, headers) = (Publishing::of("turn", topic, req.body.len()), Headers::of(req));
        for (i, f) in frames.iter_mut().enumerate() {
            traced.begin(i, f, headers);
        }
        // After the turn is in progress: the attachment it goes to ends it if it closes (see
        // `Calls::agent_gone`); one that closed before is seen here.
        match self.shard.shared.watchers.follower(topic) {
            Some(gen) => calls.route(call, turn, gen),
            None => {
                calls.end_turn(call, End::AgentGone, now());
                return Err(not_attached(agent).into());
            }
        }
        traced.storing();
        match self.store(topic, frames).await {
            Ok(placed) => traced.stored(|i| placed.get(i).map(|(p, o)| (p.0, *o))),
            Err(e) => {
                calls.end_turn(call, End::Failed, now());
                return Err(storage_problem(&e).into());
            }
        }
        Ok(turn)
    }
}

/// 503 for an agent whose WebSocket is not attached.
fn not_attached(agent: &str) -> Response {
    unavailable(&format!("agent {agent} is not attached (GET /agent/ws)"))
}

/// 503: not now (an agent not routable or not attached), try again in a second.
pub(super) fn unavailable(detail: &str) -> Response {
    problem(StatusCode::SERVICE_UNAVAILABLE, detail).with_header("retry-after", "1")
}
