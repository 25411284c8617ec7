//! Agent streaming calls (Mode 1), the HTTP side.
//!
//! Clients: `POST /session/open` `{"clientId": C, "agentId"?: A}` (201 with the session id
//! `<A>:<uuid>`), `POST /session/stream/{sid}` (the body is the prompt: a turn starts, and the
//! answer is its chunks as server-sent events), `GET /session/stream/{sid}` (the current turn
//! again, after `Last-Event-ID`: how an `EventSource` reconnects), `POST
//! /session/end-turn|cancel|close/{sid}`. They need REQUEST on `agent:<A>`, and only the
//! principal that opened a session uses it.
//!
//! Agents: `GET /agent/ws?agentId=A` (their turns arrive there, from the lite topic
//! `agent.<A>`, as structured CloudEvents) and `POST /session/chunk/{sid}` (or a chunk frame on
//! that WebSocket). They need SUBSCRIBE on `topic:agent.<A>`, as for registering.

use frame_codec::{AttrValue, Attribute, DataKind, Frame, FrameBody, FrameHeader, FrameKind};

use super::adaptor::{unavailable, FrameAdaptor, Refusal, To};
use super::gate::{shed, Gate};
use super::homes::{scopeguard_dec, to_home, Placed, REDIRECTED};
use super::responses::{storage_problem, ws_upgrade};
use super::Traffic;
use crate::governance::acl::{Action, Kind};
use crate::http::{problem, StatusCode};
use crate::server::upgrade::Credential;
use crate::server::{FollowSpec, Request, Response, TurnSpec, Upgrade};
use crate::shard::calls::{session_key, Call, ChunkBody, End, Taken};

/// `POST /session/open` requests a shard makes at agents' home instances at once, at most
/// (past it, the caller is sent there: 307).
const MAX_OPENS_ELSEWHERE: usize = 64;

/// How long opening a session at the agent's home may take in all (then 503).
const OPEN_ELSEWHERE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Agent and client ids: `[A-Za-z0-9._-]{1,100}`.
pub(super) fn valid_id(id: &str) -> bool {
    (1..=100).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct OpenBody {
    client_id: String,
    #[serde(default)]
    agent_id: Option<String>,
}

/// The agent a session id names (`<agentId>:<uuid>`), or 400.
pub(super) fn agent_of(sid: &str) -> Result<&str, Response> {
    match sid.split_once(':') {
        Some((a, rest))
            if valid_id(a)
                && (1..=64).contains(&rest.len())
                && rest.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-') =>
        {
            Ok(a)
        }
        _ => Err(problem(StatusCode::BAD_REQUEST, "agent session ids are <agentId>:<uuid>")),
    }
}

/// A random (version 4) UUID: SipHash, keyed at random per process, of a counter.
pub(super) fn uuid_v4() -> String {
    use std::hash::{BuildHasher, Hasher};
    static KEYS: std::sync::OnceLock<std::collections::hash_map::RandomState> = std::sync::OnceLock::new();
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let keys = KEYS.get_or_init(std::collections::hash_map::RandomState::new);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let half = |i: u64| {
        let mut h = keys.build_hasher();
        h.write_u64(n);
        h.write_u64(i);
        h.write_i64(crate::model::clock::now_micros());
        h.finish()
    };
    let v = (u128::from(half(0)) << 64 | u128::from(half(1))) & !(0xF000u128 << 64) & !(0xC0u128 << 56);
    let v = v | (0x4000u128 << 64) | (0x80u128 << 56);
    let s = format!("{v:032x}");
    format!("{}-{}-{}-{}-{}", &s[..8], &s[8..12], &s[12..16], &s[16..20], &s[20..])
}

/// A turn in evmesh's own protocol (the FrameAdaptor SPI): the request's body is the prompt
/// (see [`turn_frame`]); refusals are problem+json.
struct SessionTurn<'a> {
    advertised: &'a str,
}

impl FrameAdaptor for SessionTurn<'_> {
    fn frames(&self, to: &To<'_>, req: &Request<'_>) -> Result<Vec<Frame>, Refusal> {
        let Some(turn) = to.turn else {
            return Err(problem(StatusCode(500), "a session's request is a turn").into());
        };
        Ok(vec![turn_frame(req, turn, to.topic, self.advertised)?])
    }

    fn refused(&self, problem: Response) -> Response {
        problem
    }
}

impl Traffic {
    /// The stored name of `agent.<A>` for the caller.
    pub(super) fn agent_topic(gate: &Gate<'_>, agent: &str) -> String {
        crate::shard::calls::agent_topic(gate.who.tenant.as_deref(), agent)
    }

    pub(super) fn stored_agent(gate: &Gate<'_>, agent: &str) -> String {
        crate::shard::agents::stored_id(gate.who.tenant.as_deref(), agent)
    }

    /// With Kafka an agent's registration, attachment, sessions and turns are all served at
    /// its home: `Ok(claim)` here (see `Traffic::served_here`: `claim`, no claim names this
    /// instance yet), else the 307 to it.
    pub(super) fn at_agent_home(&self, gate: &Gate<'_>, agent: &str, req: &Request<'_>) -> Result<bool, Response> {
        if !self.clustered() {
            return Ok(false);
        }
        let stored = Self::stored_agent(gate, agent);
        let key = crate::cluster::homes::agent_key(&stored);
        self.served_here(&key, (Some(req), self.serves_agent(gate, &stored, agent)), || format!("agent {agent}"))
    }

    /// Whether this instance serves agent `stored` (as named `agent`) already: registered here
    /// (heard from within ten heartbeat timeouts, as the registry keeps it), as a remote A2A
    /// agent, or attached here.
    fn serves_agent(&self, gate: &Gate<'_>, stored: &str, agent: &str) -> bool {
        let shared = &self.shard.shared;
        let forget = shared.config.agent_heartbeat_timeout.as_millis() as u64 * 10;
        shared.agents.heard(stored, crate::model::clock::now_ms(), forget)
            || shared.remotes.get(stored).is_some()
            || shared.watchers.is_followed(&Self::agent_topic(gate, agent))
    }

    pub(super) fn routable(&self, stored_agent: &str) -> bool {
        let timeout = self.shard.shared.config.agent_heartbeat_timeout.as_millis() as u64;
        self.shard.shared.agents.routable(stored_agent, crate::model::clock::now_ms(), timeout)
    }

    /// `POST /session/open`: the session's home is its agent's (with Kafka, a session for a
    /// named agent is opened there: asked elsewhere, this instance opens it there on the
    /// caller's behalf and answers what the home answered, its `instanceUrl` the home's);
    /// without an agent named, one of the agents attached here is picked.
    pub(super) async fn session_open(&self, gate: &mut Gate<'_>, req: &Request<'_>) -> Response {
        if self.shard.shared.memory.shed_now() {
            return shed();
        }
        let body = req.body;
        let b: OpenBody = match serde_json::from_slice(body) {
            Ok(b) => b,
            Err(e) => {
                return problem(StatusCode::BAD_REQUEST, &format!("expected {{\"clientId\": C, \"agentId\"?: A}}: {e}"))
            }
        };
        if !valid_id(&b.client_id) || b.agent_id.as_deref().is_some_and(|a| !valid_id(a)) {
            return problem(StatusCode::BAD_REQUEST, "client and agent ids are [A-Za-z0-9._-]{1,100}");
        }
        let shared = &self.shard.shared;
        let agent = match b.agent_id {
            Some(a) => {
                if let Err(r) = gate.allow(Action::Request, Kind::Agent, &a) {
                    return r;
                }
                if let Some(r) = Box::pin(self.opened_elsewhere(gate, req, &a)).await {
                    return r;
                }
                if !self.routable(&Self::stored_agent(gate, &a)) {
                    return unavailable(&format!("agent {a} is not registered, ready and heart-beating"));
                }
                a
            }
            None => {
                let now = crate::model::clock::now_ms();
                let timeout = shared.config.agent_heartbeat_timeout.as_millis() as u64;
                let tenant = gate.who.tenant.clone();
                let tenant = tenant.as_deref();
                let named = |stored: &str| match tenant {
                    Some(t) => stored[t.len() + 1..].to_owned(),
                    None => stored.to_owned(),
                };
                let (snap, who, caller) = (gate.snap.clone(), gate.who.clone(), &mut *gate.caller);
                let usable = |stored: &str| {
                    let a = named(stored);
                    shared.watchers.is_followed(&crate::shard::calls::agent_topic(tenant, &a))
                        && caller.authorize(&snap, &who, Action::Request, Kind::Agent, &a).is_ok()
                };
                match shared.agents.pick(tenant, (now, timeout), usable, |id| shared.calls.sessions_of(id)) {
                    Some(stored) => named(&stored),
                    None => return unavailable("no agent this caller may call is ready and attached"),
                }
            }
        };
        if let Err(r) = gate.limit(&Self::agent_topic(gate, &agent), 1, body.len() as u64) {
            return r;
        }
        let sid = format!("{agent}:{}", uuid_v4());
        let now = crate::model::clock::now_ms();
        let key = session_key(gate.who.tenant.as_deref(), &sid);
        let named = (Self::stored_agent(gate, &agent), sid.clone());
        if shared.calls.open(key, named, gate.principal(), now).is_err() {
            return problem(
                StatusCode::TOO_MANY_REQUESTS,
                &format!("max_sessions ({}) sessions are open", shared.config.max_sessions),
            )
            .with_header("retry-after", "10");
        }
        let body = serde_json::json!({
            "sessionId": sid,
            "agentId": agent,
            "clientId": b.client_id,
            "instanceUrl": shared.config.advertised_url,
        });
        Response::json(StatusCode(201), body.to_string())
    }

    /// With Kafka, a session of `agent` (as named) whose home is another instance: opened
    /// there for the caller ([`Traffic::open_at`]; at most `MAX_OPENS_ELSEWHERE` at once per
    /// shard, else, or when [`Traffic::may_open_at`] says no, the 307 there). `None`: served
    /// here.
    async fn opened_elsewhere(&self, gate: &mut Gate<'_>, req: &Request<'_>, agent: &str) -> Option<Response> {
        if !self.clustered() {
            return None;
        }
        let stored = Self::stored_agent(gate, agent);
        let kept = req.query(REDIRECTED).is_some() || self.serves_agent(gate, &stored, agent);
        let home = match self.placed(&crate::cluster::homes::agent_key(&stored), kept) {
            Ok(Placed::Here { .. }) => return None,
            Ok(Placed::There(home)) => home,
            Err(r) => return Some(r),
        };
        let opens = &self.shard.opens_elsewhere;
        if !self.may_open_at(&home, gate, req) || opens.get() >= MAX_OPENS_ELSEWHERE {
            return Some(to_home(&home, req.target()));
        }
        if let Err(r) = gate.limit(&Self::agent_topic(gate, agent), 1, req.body.len() as u64) {
            return Some(r);
        }
        opens.set(opens.get() + 1);
        let _slot = scopeguard_dec(opens);
        Some(self.open_at(&home, gate, req).await)
    }

    /// `POST /session/open` at `home`, the agent's home instance, for the caller (its
    /// credential goes along): its answer, or 503 if it gave none within
    /// [`OPEN_ELSEWHERE_WAIT`].
    async fn open_at(&self, home: &str, gate: &Gate<'_>, req: &Request<'_>) -> Response {
        let unreachable = |e: String| unavailable(&format!("the agent's home instance {home} did not answer: {e}"));
        match monoio::time::timeout(OPEN_ELSEWHERE_WAIT, self.open_at_now(home, gate, req)).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => unreachable(e),
            Err(_) => unreachable(format!("nothing within {OPEN_ELSEWHERE_WAIT:?}")),
        }
    }

    /// Whether this instance may open a session at `home` for the caller ([`Traffic::open_at`]):
    /// not for a request another instance sent here (two views a moment apart would send it
    /// back and forth), nor a caller whose credential cannot go along (a client certificate,
    /// a peer that asks for one), nor from https to plain http. The caller is sent there then.
    fn may_open_at(&self, home: &str, gate: &Gate<'_>, req: &Request<'_>) -> bool {
        let config = &self.shard.shared.config;
        let credential = gate.token.is_some() || config.auth.mode == crate::governance::AuthMode::None;
        let mutual = config.tls.as_ref().is_some_and(|t| t.client_ca.is_some());
        let downgrade = config.advertised_url.starts_with("https://") && !home.starts_with("https://");
        req.query(REDIRECTED).is_none() && credential && !mutual && !downgrade
    }

    /// [`Traffic::open_at`]'s exchange; `Err`: why there is no answer.
    async fn open_at_now(&self, home: &str, gate: &Gate<'_>, req: &Request<'_>) -> Result<Response, String> {
        use crate::server::client::{Pool, Url};
        let shared = &self.shard.shared;
        let url = Url::parse(&format!("{home}/session/open?{}=1", REDIRECTED))?;
        let timeout = shared.config.webhook_timeout;
        let addr = url.resolve(timeout).await.map_err(|e| e.to_string())?;
        let bearer = gate.token.map(|t| format!("Bearer {}", String::from_utf8_lossy(t)));
        let mut headers = vec![("content-type", "application/json")];
        if let Some(b) = &bearer {
            headers.push(("authorization", b));
        }
        let pool = Pool::new(0, 64 << 10, Some(shared.client_tls.clone()));
        let a = pool.send(&url, addr, "POST", &headers, req.body, timeout).await.map_err(|e| e.to_string())?;
        let kind = a.header("content-type").unwrap_or("application/json").to_owned();
        // What a client acts on (where to go, how to prove itself, when to retry) goes along.
        let along: Vec<(&'static str, String)> = ["location", "www-authenticate", "retry-after"]
            .into_iter()
            .filter_map(|name| a.header(name).map(|v| (name, v.to_owned())))
            .collect();
        let r = Response::new(StatusCode(a.status), kind, a.body);
        Ok(along.into_iter().fold(r, |r, (name, v)| r.with_header(name, v)))
    }

    /// The session a client names, checked (and served at its agent's home only): (its key,
    /// the session, its agent as named).
    fn client_call<'s>(
        &self,
        gate: &mut Gate<'_>,
        req: &Request<'_>,
        sid: &'s str,
    ) -> Result<(String, Arc<Call>, &'s str), Response> {
        let agent = agent_of(sid)?;
        gate.allow(Action::Request, Kind::Agent, agent)?;
        self.at_agent_home(gate, agent, req)?;
        let key = session_key(gate.who.tenant.as_deref(), sid);
        let call = self
            .shard
            .shared
            .calls
            .get(&key)
            .ok_or_else(|| problem(StatusCode::NOT_FOUND, &format!("no session {sid} (closed or expired?)")))?;
        if call.principal != gate.principal() {
            return Err(problem(StatusCode::FORBIDDEN, &format!("session {sid} is another principal's")));
        }
        Ok((key, call, agent))
    }

    /// `POST /session/stream/{sid}`: a turn; the answer streams its chunks.
    pub(super) async fn session_turn(&self, gate: &mut Gate<'_>, req: &Request<'_>, sid: &str) -> Response {
        let (key, call, agent) = match self.client_call(gate, req, sid) {
            Ok(c) => c,
            Err(r) => return r,
        };
        let adaptor = SessionTurn { advertised: &self.shard.shared.config.advertised_url };
        let turn = match self.admit_turn(&adaptor, gate, req, agent) {
            Ok(topic) => Box::pin(self.turn_with(&adaptor, &call, (agent, &topic), req)).await,
            Err(r) => Err(r),
        };
        match turn {
            Ok(turn) => {
                let spec = TurnSpec { key, after: None, turn: Some(turn), expires_us: gate.who.expires_us };
                Response::streaming(Upgrade::TurnSse(Box::new(spec)), "text/event-stream")
            }
            Err(Refusal::Answered(r) | Refusal::Problem(r) | Refusal::Busy(r)) => r,
        }
    }

    /// `GET /session/stream/{sid}[?turn=N]`: the current (or last) turn from after
    /// `Last-Event-ID`; 204 when there is nothing more, or turn N is over and gone (an
    /// `EventSource` stops reconnecting).
    pub(super) fn session_resume(&self, gate: &mut Gate<'_>, req: &Request<'_>, sid: &str) -> Response {
        let (key, call, _) = match self.client_call(gate, req, sid) {
            Ok(c) => c,
            Err(r) => return r,
        };
        let after = match req
            .header("last-event-id")
            .map(|v| std::str::from_utf8(v).ok().and_then(|s| s.trim().parse::<u64>().ok()))
        {
            None => None,
            Some(Some(id)) => Some(id),
            Some(None) => return problem(StatusCode::BAD_REQUEST, "Last-Event-ID of a turn is a chunk's seq"),
        };
        let turn = match req.query("turn").map(|t| t.parse::<u64>()) {
            None => None,
            Some(Ok(t)) => Some(t),
            Some(Err(_)) => return problem(StatusCode::BAD_REQUEST, "?turn= is a turn's number (a request's emturn)"),
        };
        if !self.shard.shared.calls.pending(&call, after, turn) {
            return Response::empty(StatusCode(204));
        }
        self.shard.shared.calls.touch(&call, crate::model::clock::now_ms());
        let spec = TurnSpec { key, after, turn, expires_us: gate.who.expires_us };
        Response::streaming(Upgrade::TurnSse(Box::new(spec)), "text/event-stream")
    }

    /// `POST /session/end-turn|cancel|close/{sid}`; the agent is told on its WebSocket.
    pub(super) async fn session_control(
        &self,
        gate: &mut Gate<'_>,
        req: &Request<'_>,
        what: &str,
        sid: &str,
    ) -> Response {
        let (key, call, agent) = match self.client_call(gate, req, sid) {
            Ok(c) => c,
            Err(r) => return r,
        };
        let calls = &self.shard.shared.calls;
        let now = crate::model::clock::now_ms();
        let (ended, answer) = match what {
            "end-turn" => (calls.end_turn(&call, End::EndTurn, now), r#""turn":"ended""#),
            "cancel" => (calls.end_turn(&call, End::Cancelled, now), r#""turn":"cancelled""#),
            _ => {
                calls.close(&key, End::Closed, now);
                (true, r#""closed":true"#)
            }
        };
        if !ended {
            return problem(StatusCode::CONFLICT, &format!("session {sid} has no turn in progress"));
        }
        let topic = Self::agent_topic(gate, agent);
        if self.shard.shared.watchers.is_followed(&topic) {
            let notice = control_frame(&call.sid, &topic, what);
            if let Err(e) = self.store(&topic, vec![notice]).await {
                crate::log::warn(
                    "agents",
                    &format!("{}: telling agent {agent} of {what} on {sid}: {e}", self.shard.id),
                    &[],
                );
            }
        }
        let body = format!(r#"{{"sessionId":{},{answer}}}"#, serde_json::Value::from(sid));
        Response::json(StatusCode::OK, body)
    }

    /// `POST /session/chunk/{sid}`: a chunk of the session's turn, from its agent.
    pub(super) fn session_chunk(&self, gate: &mut Gate<'_>, req: &Request<'_>, sid: &str) -> Response {
        let body = req.body;
        let agent = match agent_of(sid) {
            Ok(a) => a,
            Err(r) => return r,
        };
        if let Err(r) = gate.allow(Action::Subscribe, Kind::Topic, &format!("agent.{agent}")) {
            return r;
        }
        if let Err(r) = self.at_agent_home(gate, agent, req) {
            return r;
        }
        let parsed = ChunkBody::parse(body);
        let chunk = match parsed {
            Ok(ref c) if c.session_id.as_deref().is_some_and(|s| s != sid) => {
                return problem(StatusCode::BAD_REQUEST, "the chunk's sessionId is not the path's")
            }
            Ok(c) => c,
            Err(m) => return problem(StatusCode::BAD_REQUEST, &m),
        };
        let mut text = String::new();
        let c = match chunk.chunk(&mut text) {
            Ok(c) => c,
            Err(m) => return problem(StatusCode::BAD_REQUEST, &m),
        };
        if let Err(r) = gate.limit(&Self::agent_topic(gate, agent), 1, body.len() as u64) {
            return r;
        }
        if self.shard.shared.memory.shed_now() {
            return shed();
        }
        let key = session_key(gate.who.tenant.as_deref(), sid);
        let stored = Self::stored_agent(gate, agent);
        match self.shard.shared.calls.chunk(&key, (&stored, None), &c, crate::model::clock::now_ms()) {
            Ok(taken) => Response::json(StatusCode::OK, format!(r#"{{"duplicate":{}}}"#, taken == Taken::Duplicate)),
            Err(refused) => {
                let (status, detail) = refused.status();
                let r = problem(StatusCode(status), &detail);
                if status == 429 {
                    r.with_header("retry-after", "1")
                } else {
                    r
                }
            }
        }
    }

    /// `GET /agent/ws?agentId=A`: the agent's turns, from now on (409 while it is attached
    /// elsewhere).
    pub(super) fn agent_ws(&self, gate: &mut Gate<'_>, req: &Request<'_>) -> Response {
        if self.shard.shared.memory.shed_now() {
            return shed();
        }
        let agent = match req.query("agentId") {
            Some(a) if valid_id(&a) => a,
            _ => return problem(StatusCode::BAD_REQUEST, "?agentId=A, with A [A-Za-z0-9._-]{1,100}"),
        };
        if let Err(r) = gate.allow(Action::Subscribe, Kind::Topic, &format!("agent.{agent}")) {
            return r;
        }
        if let Err(r) = self.at_agent_home(gate, &agent, req) {
            return r;
        }
        let shared = &self.shard.shared;
        let topic = Self::agent_topic(gate, &agent);
        if shared.watchers.is_followed(&topic) {
            return problem(
                StatusCode::CONFLICT,
                &format!("agent {agent} is attached already (one connection at a time)"),
            );
        }
        // Turns sent before the agent attached are not its to answer: it starts at the end.
        let owner = crate::model::placement::owner(&topic, crate::model::PartitionId(0), shared.config.shards);
        let family = crate::storage::db::log_cf(owner.index());
        let from = match shared.db.cf_handle(&family).map(|cf| crate::storage::embedded::end_of(&shared.db, cf, &topic))
        {
            Some(Ok(end)) => end,
            Some(Err(e)) => return storage_problem(&e),
            None => return unavailable("the agent's log cannot be read"),
        };
        let spec = Box::new(FollowSpec {
            topic,
            from,
            principal: gate.principal(),
            tenant: gate.who.tenant.clone(),
            expires_us: gate.who.expires_us,
            credential: gate.principal().and(gate.token.map(|t| Credential(t.to_vec()))),
            agent: Some(Self::stored_agent(gate, &agent)),
        });
        ws_upgrade(req, Upgrade::FollowWs(spec))
    }
}

use std::sync::Arc;

fn base_attributes(id: String, source: String, kind: &str, sid: &str) -> Vec<Attribute> {
    let attr = |name: &str, value: String| Attribute { name: name.to_owned(), value: AttrValue::Str(value) };
    vec![
        attr("specversion", "1.0".into()),
        attr("id", id),
        attr("source", source),
        attr("type", kind.to_owned()),
        attr("emsessionid", sid.to_owned()),
    ]
}

/// A turn's `stream-request` frame: the body is the prompt (`?model=` and `?conversation=`
/// become `emmodel` and `emconversation`); `emturn` numbers the session's turns (from 1).
fn turn_frame(req: &Request<'_>, (sid, turn): (&str, u64), topic: &str, advertised: &str) -> Result<Frame, Response> {
    let mut attributes = base_attributes(uuid_v4(), format!("/session/{sid}"), "evmesh.stream.request", sid);
    let str_attr = |name: &str, value: String| Attribute { name: name.to_owned(), value: AttrValue::Str(value) };
    attributes.push(str_attr("emreplyto", format!("{advertised}/session/chunk/{sid}")));
    attributes.push(Attribute { name: "emturn".into(), value: AttrValue::Int(turn.min(i64::MAX as u64) as i64) });
    for (q, name) in [("model", "emmodel"), ("conversation", "emconversation")] {
        if let Some(v) = req.query(q) {
            if v.len() > 200 || v.chars().any(char::is_control) {
                return Err(problem(StatusCode::BAD_REQUEST, &format!("?{q}= is at most 200 printable bytes")));
            }
            attributes.push(str_attr(name, v.into_owned()));
        }
    }
    let content_type = req.header("content-type").and_then(|v| std::str::from_utf8(v).ok()).map(str::trim);
    let body = req.body;
    let data_kind = match content_type {
        _ if body.is_empty() => DataKind::None,
        Some(ct) if ct.contains("json") && serde_json::from_slice::<serde::de::IgnoredAny>(body).is_ok() => {
            DataKind::Json
        }
        _ if std::str::from_utf8(body).is_ok() => DataKind::Text,
        _ => DataKind::Binary,
    };
    if let Some(ct) = content_type.filter(|ct| !body.is_empty() && ct.len() <= 200 && !ct.chars().any(char::is_control))
    {
        attributes.push(str_attr("datacontenttype", ct.to_owned()));
    }
    let header = FrameHeader { kind: FrameKind::StreamRequest, ..FrameHeader::event(data_kind) };
    let body = FrameBody { topic: topic.to_owned(), attributes, data: body.to_vec() };
    Frame::encode(&header, &body).map_err(|e| problem(StatusCode::BAD_REQUEST, &e.to_string()))
}

/// A turn's `stream-request` frame whose prompt is `text` (an A2A message's).
pub(super) fn text_turn_frame(text: &str, (sid, turn): (&str, u64), topic: &str, advertised: &str) -> Frame {
    let mut attributes = base_attributes(uuid_v4(), format!("/session/{sid}"), "evmesh.stream.request", sid);
    attributes.push(Attribute {
        name: "emreplyto".into(),
        value: AttrValue::Str(format!("{advertised}/session/chunk/{sid}")),
    });
    attributes.push(Attribute { name: "emturn".into(), value: AttrValue::Int(turn.min(i64::MAX as u64) as i64) });
    let header = FrameHeader { kind: FrameKind::StreamRequest, ..FrameHeader::event(DataKind::Text) };
    let body = FrameBody { topic: topic.to_owned(), attributes, data: text.as_bytes().to_vec() };
    Frame::encode(&header, &body).expect("a text turn encodes")
}

/// What an agent is told of a client's `end-turn`, `cancel` or `close`: an event of type
/// `evmesh.stream.<what>` on its WebSocket.
pub(super) fn control_frame(sid: &str, topic: &str, what: &str) -> Frame {
    let attributes = base_attributes(uuid_v4(), format!("/session/{sid}"), &format!("evmesh.stream.{what}"), sid);
    let body = FrameBody { topic: topic.to_owned(), attributes, data: Vec::new() };
    Frame::encode(&FrameHeader::event(DataKind::None), &body).expect("a notice encodes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_ids_name_their_agent_and_uuids_are_version_4() {
        let u = uuid_v4();
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "4");
        assert!(matches!(&u[19..20], "8" | "9" | "a" | "b"));
        assert_ne!(uuid_v4(), u);
        assert_eq!(agent_of(&format!("echo-1:{u}")).ok(), Some("echo-1"));
        for bad in ["echo", ":x", "echo:", "ec ho:ab", "echo:zz"] {
            assert!(agent_of(bad).is_err(), "{bad}");
        }
    }
}
