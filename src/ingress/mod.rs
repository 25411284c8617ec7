//! The traffic listener's requests: adaptor -> route -> append, producing frames from HTTP.
//!
//! Runs on the shard that accepted the connection. Unkeyed events go to a partition this shard
//! owns; keyed ones to their murmur2 partition, wherever it lives. A batch is split per
//! partition and the parts are appended concurrently; the 202 waits for all of them.

mod a2a;
mod adaptor;
mod agent;
mod call;
mod meshmessage;
mod pipeline;
mod recommend;
mod request;
mod session;
mod ws_publish;

use std::borrow::Cow;
use std::cell::RefCell;
use std::rc::Rc;

use frame_codec::Frame;
use futures::future::join_all;
use smallvec::SmallVec;

use crate::adaptor::cloudevents::{self, CeError, Mode};
use crate::delivery::group_ids;
use crate::governance::acl::{Action, Kind};
use crate::governance::identity::{AuthError, Keys, Principal};
use crate::governance::{Caller, Failures, TenantStats, View};
use crate::http::{problem, Method, StatusCode};
use crate::model::delivery::{AckKind, ConsumerKey};
use crate::model::placement::partition_of;
use crate::model::topic::is_lite;
use crate::model::{valid_topic, PartitionId, StoredTopic};
use crate::server::conn::{ConnGuard, ConnLimits, Peer};
use crate::server::upgrade::Credential;
use crate::server::{Handler, Request, Response, SessionSpec, Upgrade};
use crate::shard::core::{Shard, OUTBOX_HIGH};
use crate::shard::mailbox::{Overflow, Sender, CROSS_CORE_DEADLINE};
use crate::shard::message::{InterestChange, PollRequest, ShardMessage, SubOutcome, SubRequest};
use crate::storage::StorageError;
use crate::subscription::definition::{Definition, Mode as SubMode};
use crate::subscription::filter::compile;
use crate::ws::{check_upgrade, HandshakeError};

/// The traffic listener's handler on one shard.
pub struct Traffic {
    pub shard: Rc<Shard>,
    /// This shard's copy of the governance snapshot.
    view: View,
    /// Failed authentications per source address (throttled past a few).
    failures: RefCell<Failures>,
    /// Itself, for the sessions it hands a connection to: they share the shard's handler
    /// (one snapshot copy per shard, not one per session).
    me: std::rc::Weak<Traffic>,
}

/// The bearer credential of a request: `Authorization: Bearer T`, or for the sessions a browser
/// opens (WebSocket, SSE; no headers of its own there) `?access_token=T`.
fn credential<'a>(req: &Request<'a>, browser: bool) -> Option<Cow<'a, [u8]>> {
    if let Some(v) = req.header("authorization") {
        let scheme = v.get(..7)?;
        return scheme.eq_ignore_ascii_case(b"bearer ").then(|| Cow::Borrowed(v[7..].trim_ascii()));
    }
    if !browser {
        return None;
    }
    match req.query("access_token")? {
        Cow::Borrowed(s) => Some(Cow::Borrowed(s.as_bytes())),
        Cow::Owned(s) => Some(Cow::Owned(s.into_bytes())),
    }
}

/// 401, with the challenge RFC 6750 asks for.
fn unauthorized(e: &AuthError) -> Response {
    let challenge = match e {
        AuthError::Missing => r#"Bearer realm="evmesh""#.to_owned(),
        e => format!(
            r#"Bearer realm="evmesh", error="invalid_token", error_description="{}""#,
            e.to_string().replace('"', "'")
        ),
    };
    problem(StatusCode::UNAUTHORIZED, &e.to_string()).with_header("www-authenticate", &challenge)
}

/// Maps a storage failure to the status a client sees.
pub fn storage_problem(e: &StorageError) -> Response {
    match e {
        StorageError::Conflict { .. } | StorageError::Limit(_) => problem(StatusCode::CONFLICT, &e.to_string()),
        StorageError::NoTopic(_) => problem(StatusCode::NOT_FOUND, &e.to_string()),
        StorageError::Corrupt { .. } => problem(StatusCode::INTERNAL, &e.to_string()),
        StorageError::Engine(_) | StorageError::Unavailable(_) => {
            problem(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()).with_header("retry-after", "1")
        }
    }
}

/// New work refused while the process is over `memory_limit_bytes`.
fn shed() -> Response {
    problem(StatusCode::SERVICE_UNAVAILABLE, "the broker is over its memory limit; retry later")
        .with_header("retry-after", "1")
}

/// Answers a WebSocket upgrade request: 101 with the handshake headers, or the refusal.
fn ws_upgrade(req: &Request<'_>, upgrade: Upgrade) -> Response {
    match check_upgrade(req.head, req.buf) {
        Ok((accept, cloudevents)) => {
            let mut headers = vec![
                ("upgrade", "websocket".to_string()),
                ("connection", "Upgrade".to_string()),
                ("sec-websocket-accept", accept),
            ];
            if cloudevents {
                headers.push(("sec-websocket-protocol", "cloudevents.json".to_string()));
            }
            Response::switching(upgrade, headers)
        }
        Err(HandshakeError::Version) => {
            problem(StatusCode(426), &HandshakeError::Version.to_string()).with_header("sec-websocket-version", "13")
        }
        Err(e) => problem(StatusCode::BAD_REQUEST, &e.to_string()),
    }
}

impl Handler for Traffic {
    type Conn = Caller;

    fn connect(&self, peer: Peer) -> Caller {
        Caller::new(
            peer.addr.map(|p| p.ip()),
            peer.cert.and_then(|c| Some(Principal::certified(c.principal?, c.expires_us))),
        )
    }
    fn upgraded(
        &self,
        caller: Caller,
        upgrade: Upgrade,
        stream: crate::server::Stream,
        buf: Vec<u8>,
        limits: ConnLimits,
        guard: ConnGuard,
    ) {
        let shard = self.shard.clone();
        if let Upgrade::WsPublish(spec) = upgrade {
            // The publisher's requests go through the caller's limits: the session owns it.
            let session = ws_publish::session(self.shared(), caller, stream, buf, limits, spec);
            monoio::spawn(async move {
                Box::pin(session).await;
                drop(guard);
            });
            return;
        }
        // The caller (its tenant's connection slot) is held as long as the session, like the
        // connection's own count: by a WebSocket session's publisher (its `publish` messages go
        // through the caller's limits), by the guard otherwise.
        let mut caller = Some(caller);
        let mut publisher = |principal: &Option<String>,
                             tenant: &Option<String>,
                             expires_us,
                             credential: &Option<_>| {
            let credential = Option::clone(credential);
            ws_publish::SessionPublisher::boxed(self.shared(), &mut caller, principal, tenant, (expires_us, credential))
        };
        let session: std::pin::Pin<Box<dyn std::future::Future<Output = ()>>> = match upgrade {
            Upgrade::WsEcho => Box::pin(crate::server::ws::echo(stream, buf, limits)),
            Upgrade::WsDeliver(spec) => {
                let p = publisher(&spec.principal, &spec.tenant, spec.expires_us, &spec.credential);
                Box::pin(crate::push::ws::session(shard, stream, buf, limits, spec, p))
            }
            Upgrade::Sse(spec) => Box::pin(crate::push::sse::session(shard, stream, buf, spec)),
            Upgrade::FollowWs(spec) => {
                let p = publisher(&spec.principal, &spec.tenant, spec.expires_us, &spec.credential);
                Box::pin(crate::push::follow::websocket(shard, stream, buf, limits, spec, p))
            }
            Upgrade::FollowSse(spec) => Box::pin(crate::push::follow::sse(shard, stream, buf, spec)),
            Upgrade::TurnSse(spec) => Box::pin(crate::push::turn::sse(shard, stream, buf, spec)),
            Upgrade::A2aSse(spec) => Box::pin(crate::push::a2a::sse(shard, stream, buf, spec)),
            Upgrade::A2aRelay(spec) => Box::pin(crate::push::a2a::relay(shard, stream, buf, spec)),
            Upgrade::WsPublish(_) => unreachable!("served above"),
        };
        let guard = (guard, caller);
        monoio::spawn(async move {
            session.await;
            drop(guard);
        });
    }

    fn refused(&self, status: StatusCode) {
        self.shard.shared.metrics.shard(self.shard.id).refused(status.0);
    }

    fn heavy(&self, cost: std::time::Duration) {
        self.shard.shared.metrics.shard(self.shard.id).heavy(cost);
    }

    async fn handle(&self, caller: &mut Caller, req: Request<'_>) -> Response {
        // CORS: a page of an allowed origin may read the answers (and is told so before it
        // sends, on a preflight); every other caller gets exactly what it got before.
        let allowed = cors_origin(&self.shard.shared.config.cors_allowed_origins, req.header("origin"));
        let Some(origin) = allowed else { return self.route(caller, req).await };
        if req.method() == Method::Options && req.header("access-control-request-method").is_some() {
            return preflight(origin, req.header("access-control-request-headers"));
        }
        self.route(caller, req)
            .await
            .with_header("access-control-allow-origin", &origin)
            .with_header("vary", "origin")
            .with_header("access-control-expose-headers", "retry-after, www-authenticate, location, content-type")
    }
}

/// The `Access-Control-Allow-Origin` for a request's `Origin`, when `allowed` lets it in.
fn cors_origin(allowed: &[String], origin: Option<&[u8]>) -> Option<String> {
    if allowed.is_empty() {
        return None;
    }
    let origin = std::str::from_utf8(origin?).ok()?.trim();
    if allowed.iter().any(|a| a == "*") {
        return Some("*".to_owned());
    }
    allowed.iter().any(|a| a.eq_ignore_ascii_case(origin)).then(|| origin.to_owned())
}

/// A CORS preflight's answer: the methods the traffic listener serves and the headers the
/// page asked for (only header-name characters, at most 2 KiB: anything else is not echoed).
fn preflight(origin: String, asked: Option<&[u8]>) -> Response {
    let headers = asked
        .filter(|h| h.len() <= 2048 && h.iter().all(|&b| b.is_ascii_alphanumeric() || b"-_, ".contains(&b)))
        .and_then(|h| std::str::from_utf8(h).ok())
        .unwrap_or("authorization, content-type");
    Response::empty(StatusCode(204))
        .with_header("access-control-allow-origin", &origin)
        .with_header("vary", "origin")
        .with_header("access-control-allow-methods", "GET, POST, PUT, DELETE")
        .with_header("access-control-allow-headers", headers)
        .with_header("access-control-max-age", "600")
}

impl Traffic {
    async fn route(&self, caller: &mut Caller, req: Request<'_>) -> Response {
        let path = req.path();
        let session = path.strip_prefix("/session/").and_then(|rest| rest.split_once('/'));
        let ours = matches!(
            path,
            "/events/publish"
                | "/events/request"
                | "/events/reply"
                | "/events/subscribe"
                | "/events/unsubscribe"
                | "/events/ws"
                | "/events/sse"
                | "/events/poll"
                | "/events/ack"
                | "/ws/echo"
        ) || matches!(
            session,
            Some(("publish" | "subscribe" | "stream" | "chunk" | "end-turn" | "cancel" | "close", _))
        ) || matches!(
            path,
            "/agent/register"
                | "/agent/heartbeat"
                | "/agent/deregister"
                | "/agent/ws"
                | "/session/open"
                | "/session/recommend"
        ) || path.starts_with("/a2a/");
        // Classic EventMesh HTTP: its own paths, or any other path with a `code` header (its
        // SDKs post to `/`).
        let classic = !ours && (path.starts_with("/eventmesh/") || req.header("code").is_some());
        if !ours && !classic {
            return problem(StatusCode::NOT_FOUND, &format!("no route for {path}"));
        }
        let browser = matches!(path, "/events/ws" | "/events/sse" | "/ws/echo" | "/agent/ws")
            || path.starts_with("/session/subscribe/")
            || path.starts_with("/session/stream/");
        let token = credential(&req, browser);
        let snap = self.view.current(&self.shard.shared.governance);
        let who = match self.authenticate(caller, &snap, &req, token.as_deref()) {
            Ok(who) => who,
            Err(r) => return r,
        };
        let mut gate = Gate { traffic: self, snap, caller, who: &who, token: token.as_deref() };
        if classic {
            // Counted as publishes; a classic refusal is an HTTP 200 whose retCode is not 0.
            let started = std::time::Instant::now();
            let m = self.shard.shared.metrics.shard(self.shard.id);
            m.publish_requests.inc();
            let r = Box::pin(self.meshmessage(&mut gate, &req)).await;
            if r.status.0 != 200 || !r.body.starts_with(br#"{"retCode":0,"#) {
                m.publish_errors.inc();
            }
            m.publish_latency.record_us(started.elapsed().as_micros() as u64);
            return r;
        }
        if let Some(rest) = path.strip_prefix("/a2a/") {
            return Box::pin(self.a2a(&mut gate, &req, rest)).await;
        }
        if path == "/agent/ws" {
            return match req.method() {
                Method::Get => self.agent_ws(&mut gate, &req),
                _ => problem(StatusCode::METHOD_NOT_ALLOWED, "use GET").with_header("allow", "GET"),
            };
        }
        if path == "/session/recommend" {
            return match req.method() {
                Method::Get => self.recommend(&mut gate, &req),
                _ => problem(StatusCode::METHOD_NOT_ALLOWED, "use GET").with_header("allow", "GET"),
            };
        }
        if path == "/session/open" {
            return match req.method() {
                Method::Post => Box::pin(self.session_open(&mut gate, &req)).await,
                _ => problem(StatusCode::METHOD_NOT_ALLOWED, "use POST").with_header("allow", "POST"),
            };
        }
        if let Some(what) = path.strip_prefix("/agent/") {
            return match req.method() {
                Method::Post => self.agent(&mut gate, what, &req),
                _ => problem(StatusCode::METHOD_NOT_ALLOWED, "use POST").with_header("allow", "POST"),
            };
        }
        if let Some((what, sid)) = session {
            return match (req.method(), what) {
                (Method::Post, "publish") => Box::pin(self.session_publish(&mut gate, &req, sid)).await,
                (Method::Get, "subscribe") => self.session_subscribe(&mut gate, &req, sid),
                (Method::Post, "stream") => Box::pin(self.session_turn(&mut gate, &req, sid)).await,
                (Method::Get, "stream") => self.session_resume(&mut gate, &req, sid),
                (Method::Post, "chunk") => self.session_chunk(&mut gate, &req, sid),
                (Method::Post, "end-turn" | "cancel" | "close") => {
                    Box::pin(self.session_control(&mut gate, &req, what, sid)).await
                }
                (_, "stream") => {
                    problem(StatusCode::METHOD_NOT_ALLOWED, "use POST or GET").with_header("allow", "POST, GET")
                }
                (_, "subscribe") => problem(StatusCode::METHOD_NOT_ALLOWED, "use GET").with_header("allow", "GET"),
                _ => problem(StatusCode::METHOD_NOT_ALLOWED, "use POST").with_header("allow", "POST"),
            };
        }
        match (req.method(), path) {
            (Method::Post, "/events/publish") => {
                let started = std::time::Instant::now();
                let m = self.shard.shared.metrics.shard(self.shard.id);
                m.publish_requests.inc();
                let r = self.publish(&mut gate, &req).await;
                if r.status.0 >= 400 {
                    m.publish_errors.inc();
                }
                m.publish_latency.record_us(started.elapsed().as_micros() as u64);
                r
            }
            // Boxed: a waiting request's state is large, and every connection's future would
            // otherwise reserve room for it (idle sessions keep what their connection took).
            (Method::Post, "/events/request") => Box::pin(self.request(&mut gate, &req)).await,
            (Method::Post, "/events/reply") => Box::pin(self.reply(&mut gate, &req)).await,
            (_, "/events/publish" | "/events/request" | "/events/reply") => {
                problem(StatusCode::METHOD_NOT_ALLOWED, "use POST").with_header("allow", "POST")
            }
            (Method::Post, "/events/subscribe") => self.subscribe(&mut gate, req.body).await,
            (Method::Post, "/events/unsubscribe") => self.unsubscribe(&mut gate, req.body).await,
            (_, "/events/subscribe" | "/events/unsubscribe") => {
                problem(StatusCode::METHOD_NOT_ALLOWED, "use POST").with_header("allow", "POST")
            }
            (Method::Get, "/ws/echo") if self.shard.shared.config.ws_echo_endpoint => ws_upgrade(&req, Upgrade::WsEcho),
            (Method::Get, "/events/ws") if req.query("publish").is_some() => self.ws_publish(&mut gate, &req),
            (Method::Get, "/events/ws") => match self.session_spec(&mut gate, &req).await {
                Ok(spec) => ws_upgrade(&req, Upgrade::WsDeliver(Box::new(spec))),
                Err(r) => r,
            },
            (Method::Get, "/events/sse") => match self.session_spec(&mut gate, &req).await {
                Ok(spec) if !spec.acked => problem(StatusCode::BAD_REQUEST, "ack=none is for WebSocket sessions"),
                Ok(spec) => Response::streaming(Upgrade::Sse(Box::new(spec)), "text/event-stream"),
                Err(r) => r,
            },
            (Method::Get, "/events/poll") => self.poll(&mut gate, &req).await,
            (Method::Post, "/events/ack") => self.ack(&mut gate, req.body, req.query(REDIRECTED).is_some()).await,
            (_, "/events/ws" | "/events/sse" | "/events/poll") => {
                problem(StatusCode::METHOD_NOT_ALLOWED, "use GET").with_header("allow", "GET")
            }
            (_, "/events/ack") => problem(StatusCode::METHOD_NOT_ALLOWED, "use POST").with_header("allow", "POST"),
            (_, path) => problem(StatusCode::NOT_FOUND, &format!("no route for {path}")),
        }
    }
}

/// How long a session, poll or ack waits for this instance's claim of its subscription to be
/// read back, and how often it looks.
const SETTLE_WAIT: std::time::Duration = std::time::Duration::from_secs(3);
const SETTLE_POLL: std::time::Duration = std::time::Duration::from_millis(5);

/// Requests per shard waiting for a definition still on its way (see `Traffic::defined`).
const MAX_DEFINITION_WAITS: usize = 64;

/// Gives a slot of a count back when dropped.
fn scopeguard_dec(count: &std::cell::Cell<usize>) -> impl Drop + '_ {
    struct Slot<'a>(&'a std::cell::Cell<usize>);
    impl Drop for Slot<'_> {
        fn drop(&mut self) {
            self.0.set(self.0.get() - 1);
        }
    }
    Slot(count)
}

/// Where an agent's or a lite topic's key is served (see [`Traffic::placed`]).
enum Placed {
    /// Here; `claim`: no claim names this instance yet.
    Here { claim: bool },
    /// At the home instance of this URL.
    There(String),
}

/// Marks a request sent on by [`to_home`]: served where it arrives, never sent on again (two
/// instances whose views of the home differ for a moment would send it back and forth); for an
/// agent or a lite topic, unless a live instance's claim names another home.
const REDIRECTED: &str = "evmeshRedirected";

/// 307 to the same request at `home` (the method and body kept, as 307 says), before any
/// upgrade: `target` is the path and query.
fn to_home(home: &str, target: &str) -> Response {
    let detail = format!("this is served by its home instance {home}");
    let sep = if target.contains('?') { '&' } else { '?' };
    problem(StatusCode(307), &detail).with_header("location", format!("{home}{target}{sep}{REDIRECTED}=1"))
}

/// What a tenant's quotas count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Quotaed {
    Topic,
    Subscription,
}

/// What one request may do: the caller's connection state and who it proved to be.
struct Gate<'a> {
    traffic: &'a Traffic,
    /// The policy this request is decided under (taken once per request).
    snap: Rc<crate::governance::Snapshot>,
    caller: &'a mut Caller,
    who: &'a Rc<Principal>,
    /// The credential it proved that with (sessions re-check it when the keys change).
    token: Option<&'a [u8]>,
}

impl Gate<'_> {
    /// Whether the caller may do `action` to `kind:name`: 403 (and an audit line) if not.
    fn allow(&mut self, action: Action, kind: Kind, name: &str) -> Result<(), Response> {
        let t = self.traffic;
        let g = &t.shard.shared.governance;
        match self.caller.authorize(&self.snap, self.who, action, kind, name) {
            Ok(()) => Ok(()),
            Err(rule) => {
                let resource = format!("{}{name}", kind.prefix());
                let detail = rule.map(|r| format!("rule {r}"));
                g.audit(Some(self.who), action.name(), &resource, "denied", detail, self.caller.peer);
                t.shard.shared.metrics.shard(t.shard.id).refused(403);
                self.tenant_count(|s| &s.denied, 1);
                Err(problem(StatusCode::FORBIDDEN, &format!("{} may not {} {resource}", self.who.name, action.name())))
            }
        }
    }

    /// The stored name of a topic or subscription the caller names: its tenant's namespace
    /// (`tenant.name`), or the name itself for a principal without a tenant. 400 when the
    /// stored name would be over the 249 characters of a topic name.
    fn scoped<'n>(&self, name: &'n str) -> Result<Cow<'n, str>, Response> {
        match &self.who.tenant {
            None => Ok(Cow::Borrowed(name)),
            Some(t) => {
                let stored = format!("{t}.{name}");
                if !valid_topic(&stored) {
                    return Err(problem(
                        StatusCode::BAD_REQUEST,
                        &format!("names of tenant {t} are at most {} characters", 248 - t.len()),
                    ));
                }
                Ok(Cow::Owned(stored))
            }
        }
    }

    /// A stored name as the principal uses it (without its tenant's prefix); `None` for a
    /// name outside its tenant, which it must not learn.
    fn local<'n>(&self, stored: &'n str) -> Option<&'n str> {
        match &self.who.tenant {
            Some(t) => stored.strip_prefix(t.as_str()).and_then(|n| n.strip_prefix('.')),
            None => Some(stored),
        }
    }

    /// Adds `n` to one of the principal's tenant's counters (nothing without a tenant).
    fn tenant_count(&self, counter: impl Fn(&TenantStats) -> &std::sync::atomic::AtomicU64, n: u64) {
        if let Some((_, s)) = &self.caller.stats {
            counter(s).fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Takes `events` events of `bytes` bytes for `topic` (its stored name) from every rate
    /// limit of the principal, its tenant and the topic: 429 with `Retry-After` if one is out.
    fn limit(&self, topic: &str, events: u64, bytes: u64) -> Result<(), Response> {
        let t = self.traffic;
        let g = &t.shard.shared.governance;
        if self.snap.limits.is_empty() {
            return Ok(());
        }
        let tenant = self.who.tenant.as_deref();
        match self.snap.limits.take(&self.who.name, tenant, topic, events, bytes, g.now_ns()) {
            Ok(()) => Ok(()),
            Err(l) => {
                t.shard.shared.metrics.shard(t.shard.id).refused(429);
                self.tenant_count(|s| &s.limited, 1);
                let secs = l.retry_after.as_secs() + u64::from(l.retry_after.subsec_nanos() > 0);
                Err(problem(
                    StatusCode::TOO_MANY_REQUESTS,
                    &format!("over rate limit {} ({}); retry in {} ms", l.id, l.scope, l.retry_after.as_millis()),
                )
                .with_header("retry-after", secs.max(1).to_string()))
            }
        }
    }

    /// A tenant's quota of topics or subscriptions, checked before a request that would create
    /// `stored` (nothing is counted when it exists): 429 once the tenant has that many.
    fn quota(&self, what: Quotaed, stored: &str) -> Result<(), Response> {
        let Some(tenant) = self.who.tenant.as_deref() else { return Ok(()) };
        let t = self.traffic;
        let Some(q) = self.snap.quotas.get(tenant) else { return Ok(()) };
        let db = &t.shard.shared.db;
        let prefix = format!("{tenant}.");
        let (max, counted) = match what {
            Quotaed::Topic => {
                let Some(max) = q.topics else { return Ok(()) };
                if t.shard.partitions_of(stored).is_some() {
                    return Ok(());
                }
                (max, crate::storage::meta::count_topics(db, &prefix, max as usize))
            }
            Quotaed::Subscription => {
                let Some(max) = q.subscriptions else { return Ok(()) };
                match crate::storage::meta::get_subscription(db, stored) {
                    Ok(Some(_)) => return Ok(()),
                    Ok(None) => {}
                    Err(e) => return Err(storage_problem(&e)),
                }
                (max, crate::storage::meta::count_subscriptions(db, &prefix, max as usize))
            }
        };
        match counted {
            Ok(n) if (n as u64) < max => Ok(()),
            Ok(_) => {
                t.shard.shared.metrics.shard(t.shard.id).refused(429);
                self.tenant_count(|s| &s.limited, 1);
                let what = if what == Quotaed::Topic { "topics" } else { "subscriptions" };
                Err(problem(
                    StatusCode::TOO_MANY_REQUESTS,
                    &format!("tenant {tenant} has its quota of {max} {what}; remove one or ask for more"),
                )
                .with_header("retry-after", "60"))
            }
            Err(e) => Err(storage_problem(&e)),
        }
    }

    /// 429 while the tenant's backlog (what its subscriptions have not acknowledged, measured
    /// every 2 s) is at its `backlogBytes` quota: producers wait for consumers to catch up.
    fn backlog(&self) -> Result<(), Response> {
        let Some(tenant) = self.who.tenant.as_deref() else { return Ok(()) };
        let Some(max) = self.snap.quotas.get(tenant).and_then(|q| q.backlog_bytes) else { return Ok(()) };
        let t = self.traffic;
        let backlog = t.shard.shared.governance.backlog().get(tenant).copied().unwrap_or(0);
        if backlog < max {
            return Ok(());
        }
        t.shard.shared.metrics.shard(t.shard.id).refused(429);
        self.tenant_count(|s| &s.limited, 1);
        Err(problem(
            StatusCode::TOO_MANY_REQUESTS,
            &format!(
                "tenant {tenant} has {backlog} bytes not yet acknowledged by its subscriptions, its backlogBytes \
                 quota is {max}; publish again once consumers catch up"
            ),
        )
        .with_header("retry-after", "2"))
    }

    /// The principal's name for a session's record (`None` with `auth = none`).
    fn principal(&self) -> Option<String> {
        let g = &self.traffic.shard.shared.governance;
        (g.config.mode != crate::governance::AuthMode::None).then(|| self.who.name.clone())
    }
}

impl Traffic {
    pub fn new(shard: Rc<Shard>) -> Rc<Traffic> {
        let view = View::new(&shard.shared.governance);
        Rc::new_cyclic(|me| Traffic { shard, view, failures: RefCell::new(Failures::default()), me: me.clone() })
    }

    /// This handler, shared.
    fn shared(&self) -> Rc<Traffic> {
        self.me.upgrade().expect("a handler is used through its Rc")
    }

    /// Who the request comes from: 401 without valid credentials (429 for an address that
    /// failed too often lately).
    fn authenticate(
        &self,
        caller: &mut Caller,
        snap: &crate::governance::Snapshot,
        req: &Request<'_>,
        token: Option<&[u8]>,
    ) -> Result<Rc<Principal>, Response> {
        let g = &self.shard.shared.governance;
        if matches!(*snap.keys, Keys::None) {
            return Ok(crate::governance::anonymous());
        }
        let now = std::time::Instant::now();
        // An address that failed too often waits before anything is verified for it again; a
        // connection that already proved its token goes on (one bad client behind a NAT must
        // not shut out the others).
        let throttled = || self.failures.borrow().throttled(caller.peer, now);
        if let Some(secs) = (!caller.verified(snap, token)).then(throttled).flatten() {
            self.shard.shared.metrics.shard(self.shard.id).refused(429);
            return Err(problem(
                StatusCode::TOO_MANY_REQUESTS,
                "too many failed authentications from this address; retry later",
            )
            .with_header("retry-after", secs.to_string()));
        }
        match caller.authenticate(snap, token, crate::model::clock::now_micros) {
            Ok(who) => {
                match who.tenant.as_deref() {
                    Some(t) => self.tenant_connection(caller, snap, t)?,
                    // A connection may prove a tenant's token, then speak by a certificate
                    // without one: nothing of that tenant's stays counted on it.
                    None => (caller.stats, caller.slot) = (None, None),
                }
                Ok(who)
            }
            Err(e) => {
                if e != AuthError::Missing {
                    self.failures.borrow_mut().failed(caller.peer, now);
                }
                g.audit(None, "AUTHENTICATE", req.path(), "unauthenticated", Some(e.to_string()), caller.peer);
                self.shard.shared.metrics.shard(self.shard.id).refused(401);
                Err(unauthorized(&e))
            }
        }
    }

    /// Keeps the tenant's metrics counters on the connection, and counts the connection against
    /// the tenant's `connections` quota (once): 429 when the tenant has that many open.
    fn tenant_connection(
        &self,
        caller: &mut Caller,
        snap: &crate::governance::Snapshot,
        tenant: &str,
    ) -> Result<(), Response> {
        let g = &self.shard.shared.governance;
        if caller.stats.as_ref().is_none_or(|(t, _)| **t != *tenant) {
            caller.stats = Some((tenant.into(), g.tenant_stats(tenant)));
        }
        if snap.quotas.is_empty() || caller.slot.as_ref().is_some_and(|(t, _)| t == tenant) {
            return Ok(());
        }
        let Some(max) = snap.quotas.get(tenant).and_then(|q| q.connections) else { return Ok(()) };
        caller.slot = None;
        match g.connect_tenant(tenant, max) {
            Some(slot) => {
                caller.slot = Some((tenant.to_owned(), slot));
                Ok(())
            }
            None => {
                if let Some((_, s)) = &caller.stats {
                    s.limited.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                self.shard.shared.metrics.shard(self.shard.id).refused(429);
                Err(problem(
                    StatusCode::TOO_MANY_REQUESTS,
                    &format!("tenant {tenant} has its quota of {max} connections open"),
                )
                .with_header("retry-after", "1"))
            }
        }
    }

    /// Subscription `stored`'s definition. A request another instance sent here (`redirected`:
    /// it knew the subscription) waits up to [`SETTLE_WAIT`] for the definition to come
    /// through Kafka, so a subscription made a moment ago there is not a 404 here. Any client
    /// can mark a request so: at most [`MAX_DEFINITION_WAITS`] wait per shard, others are
    /// answered at once.
    async fn defined(&self, stored: &str, redirected: bool) -> Result<Option<Definition>, StorageError> {
        let db = &self.shard.shared.db;
        let def = crate::storage::meta::get_subscription(db, stored)?;
        let waits = &self.shard.definition_waits;
        let embedded = matches!(self.shard.shared.config.storage, crate::config::StorageKind::Embedded);
        if def.is_some() || !redirected || embedded || waits.get() >= MAX_DEFINITION_WAITS {
            return Ok(def);
        }
        waits.set(waits.get() + 1);
        let _waiting = scopeguard_dec(waits);
        let until = std::time::Instant::now() + SETTLE_WAIT;
        while std::time::Instant::now() < until {
            monoio::time::sleep(SETTLE_POLL * 4).await;
            if let Some(def) = crate::storage::meta::get_subscription(db, stored)? {
                return Ok(Some(def));
            }
        }
        Ok(None)
    }

    /// With instances over Kafka: the URL of the home of subscription key `key`
    /// (`cluster::homes`) when that is another instance (its sessions, polls and acks are
    /// served there only). `None` on the embedded log, at the home, or while no live instance
    /// is known (then served here); 503 while this instance has not read the claims written
    /// before it started. A choice not claimed yet is claimed; when this instance has just
    /// claimed itself, it waits until its claim is read back (up to [`SETTLE_WAIT`], then
    /// 503): the offsets the previous home stored are read by then, and of two instances that
    /// claimed at once the one that lost sends the request on.
    async fn home_elsewhere(&self, key: &str) -> Result<Option<String>, Response> {
        let shared = &self.shard.shared;
        if matches!(shared.config.storage, crate::config::StorageKind::Embedded) {
            return Ok(None);
        }
        let until = std::time::Instant::now() + SETTLE_WAIT;
        let me = &shared.config.instance_id;
        let mut polled = 0u32;
        loop {
            // Waiting for this instance's own claim: the cheap look most times, the whole
            // answer (another claim may have come first) every 20th.
            polled += 1;
            if polled % 20 != 1 && !shared.homes.claimed_by(key, me) && std::time::Instant::now() < until {
                monoio::time::sleep(SETTLE_POLL).await;
                continue;
            }
            let Some(home) = shared.home(key, true) else {
                // Starting: the claims (and the offsets with them) are not read yet. Served
                // here only once they are, or while no instance is known live (Kafka away).
                if !shared.homes.is_caught_up() {
                    return Err(problem(StatusCode::SERVICE_UNAVAILABLE, "this instance is starting; try again")
                        .with_header("retry-after", "1"));
                }
                return Ok(None);
            };
            if home.id != *me && home.url != shared.config.advertised_url {
                return Ok(Some(home.url));
            }
            if home.settled {
                return Ok(None);
            }
            if std::time::Instant::now() >= until {
                return Err(problem(StatusCode::SERVICE_UNAVAILABLE, "this instance is taking the subscription over")
                    .with_header("retry-after", "1"));
            }
            monoio::time::sleep(SETTLE_POLL).await;
        }
    }

    /// Serves the request here if this instance is the home of subscription key `key` (see
    /// [`Traffic::home_elsewhere`]), or if another instance sent it here already (never sent
    /// on twice); else the 307 to the home.
    async fn at_home(&self, key: &str, req: &Request<'_>) -> Result<(), Response> {
        match self.home_elsewhere(key).await? {
            Some(home) if req.query(REDIRECTED).is_none() => Err(to_home(&home, req.head.target(req.buf))),
            _ => Ok(()),
        }
    }

    /// The session a delivery request asks for: `?subscription=S` (404 if unknown), then
    /// `ack=none` (live fan-out, BROADCAST only, WebSocket only), `clientId=C` (per-client
    /// offsets of BROADCAST and MULTICAST) and, for MULTICAST, the session's own filters:
    /// `filters=<JSON array of Subscriptions API filters>` and/or `sql=<CESQL>`.
    async fn session_spec(&self, gate: &mut Gate<'_>, req: &Request<'_>) -> Result<SessionSpec, Response> {
        if self.shard.shared.memory.shed_now() {
            return Err(shed());
        }
        let bad = |m: &str| problem(StatusCode::BAD_REQUEST, m);
        let name = req.query("subscription").ok_or_else(|| bad("missing ?subscription="))?;
        gate.allow(Action::Subscribe, Kind::Subscription, &name)?;
        let stored = gate.scoped(&name)?;
        let def = match self.defined(&stored, req.query(REDIRECTED).is_some()).await {
            Ok(Some(d)) => d,
            Ok(None) => return Err(problem(StatusCode::NOT_FOUND, &format!("no subscription {name}"))),
            Err(e) => return Err(storage_problem(&e)),
        };
        if def.pushed() {
            let detail = format!("subscription {name} is pushed by the broker; sessions cannot attach to it");
            return Err(problem(StatusCode::CONFLICT, &detail));
        }
        // Sent here by another instance: served here, once this instance's claim is settled
        // if it chose itself (never sent on again).
        self.at_home(&crate::cluster::homes::subscription_key(&stored), req).await?;
        let acked = match req.query("ack").as_deref() {
            None => true,
            Some("none") => false,
            Some(other) => return Err(bad(&format!("ack={other}: the only choice is ack=none"))),
        };
        if !acked && def.mode != SubMode::Broadcast {
            return Err(bad("ack=none is live fan-out to BROADCAST subscriptions; this one needs acks"));
        }
        let client = req.query("clientId").map(|c| c.into_owned());
        if client.as_deref().is_some_and(|c| !valid_topic(c)) {
            return Err(bad("clientId must be [A-Za-z0-9._-]{1,249}"));
        }
        if let (Some(c), true) = (&client, def.mode != SubMode::LoadBalance) {
            self.check_client_cap(&def, c).map_err(|e| storage_problem(&e))?;
        }
        let mut filters: Vec<serde_json::Value> = match req.query("filters") {
            None => Vec::new(),
            Some(f) => match serde_json::from_str(&f) {
                Ok(serde_json::Value::Array(items)) => items,
                _ => return Err(bad("filters must be a JSON array of Subscriptions API filters")),
            },
        };
        if let Some(sql) = req.query("sql") {
            filters.push(serde_json::json!({ "sql": sql }));
        }
        let filters = if filters.is_empty() {
            None
        } else if def.mode != SubMode::Multicast {
            return Err(bad("per-session filters are for MULTICAST subscriptions"));
        } else {
            let json = serde_json::Value::Array(filters);
            compile(Some(&json)).map_err(|e| bad(&e.to_string()))?;
            Some(json.to_string())
        };
        let last_event_id = req.header("last-event-id").and_then(|v| std::str::from_utf8(v).ok()).map(str::to_owned);
        let window = match req.query("credit") {
            None => None,
            Some(n) => match n.parse::<u32>() {
                Ok(n) if n <= crate::config::MAX_WINDOW && acked => Some(n),
                Ok(_) if !acked => {
                    return Err(bad("credit=N is the window of acknowledged sessions; ack=none has none"))
                }
                _ => return Err(bad(&format!("credit={n}: the window is 0..={}", crate::config::MAX_WINDOW))),
            },
        };
        Ok(SessionSpec {
            subscription: def.subscription,
            topic: def.topic,
            acked,
            per_client: def.mode != SubMode::LoadBalance,
            client,
            filters,
            last_event_id,
            window,
            principal: gate.principal(),
            credential: gate.principal().and(gate.token.map(|t| Credential(t.to_vec()))),
            tenant: gate.who.tenant.clone(),
            expires_us: gate.who.expires_us,
        })
    }

    /// A `clientId` new to a per-client subscription is refused once `max_clients_per_subscription`
    /// clients have offsets stored (partition 0's entries, on its owner, count them).
    fn check_client_cap(&self, def: &Definition, client: &str) -> Result<(), StorageError> {
        use crate::storage::offsets;
        let shared = &self.shard.shared;
        let (p0, cap) = (PartitionId(0), shared.config.max_clients_per_subscription);
        let home = crate::model::placement::owner(&def.topic, p0, shared.config.shards);
        if offsets::get(&shared.db, home, &offsets::key(&def.topic, &def.subscription, p0, client))?.is_some() {
            return Ok(());
        }
        if offsets::clients(&shared.db, home, &def.topic, &def.subscription, p0, cap)? >= cap {
            return Err(StorageError::Limit(format!(
                "max_clients_per_subscription ({cap}) clients of {} have offsets; reuse a clientId or wait for client_offset_ttl_ms",
                def.subscription
            )));
        }
        Ok(())
    }

    /// `GET /events/poll?subscription=S&max=N&waitMs=W`: 200 with a batch of events, or 204
    /// when none arrived within `waitMs`.
    async fn poll(&self, gate: &mut Gate<'_>, req: &Request<'_>) -> Response {
        let spec = match self.session_spec(gate, req).await {
            Ok(s) => s,
            Err(r) => return r,
        };
        if !spec.acked {
            return problem(StatusCode::BAD_REQUEST, "ack=none is for WebSocket sessions");
        }
        if spec.per_client && spec.client.is_none() {
            return problem(StatusCode::BAD_REQUEST, "polling a BROADCAST or MULTICAST subscription needs ?clientId=");
        }
        let number = |name: &str, default: u64, max: u64| match req.query(name) {
            None => Ok(default),
            Some(v) => {
                v.parse::<u64>().ok().filter(|n| (1..=max).contains(n) || (name == "waitMs" && *n == 0)).ok_or_else(
                    || problem(StatusCode::BAD_REQUEST, &format!("{name} must be a whole number up to {max}")),
                )
            }
        };
        let (max, wait) = match (number("max", 100, 1000), number("waitMs", 1000, 60_000)) {
            (Ok(m), Ok(w)) => (m as usize, std::time::Duration::from_millis(w)),
            (Err(r), _) | (_, Err(r)) => return r,
        };
        let home = crate::push::poll::home(&spec, self.shard.shared.config.shards);
        let events: Vec<Vec<u8>> = if home == self.shard.id {
            let events = crate::push::poll::session(&self.shard, &spec).poll(max, wait).await;
            events.iter().map(|e| e.to_vec()).collect()
        } else {
            let (reply, rx) = futures::channel::oneshot::channel();
            let asked = (ShardMessage::Poll(Box::new(PollRequest { spec, max, wait, reply })), rx);
            // The poll's own wait, and then the deadline of any request.
            let deadline = wait + CROSS_CORE_DEADLINE;
            let from = Sender::Shard(self.shard.id);
            match self.shard.shared.mailboxes.ask_within(from, home, asked, Overflow::Shed, deadline).await {
                Ok(events) => events,
                Err(e) => return storage_problem(&e),
            }
        };
        if events.is_empty() {
            return Response::empty(StatusCode(204));
        }
        let mut body = Vec::with_capacity(events.iter().map(|e| e.len() + 1).sum::<usize>() + 2);
        body.push(b'[');
        for (i, e) in events.iter().enumerate() {
            if i > 0 {
                body.push(b',');
            }
            body.extend_from_slice(e);
        }
        body.push(b']');
        Response::new(StatusCode::OK, "application/cloudevents-batch+json", body)
    }

    /// `POST /events/ack` `{"subscription": S, "ids": [...], "clientId"?: C, "nack"?: bool}`.
    /// Answers once every owner applied the acks, so a request made after the 200 (a
    /// reconnect, say) never sees an acknowledged event again.
    async fn ack(&self, gate: &mut Gate<'_>, body: &[u8], redirected: bool) -> Response {
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields, rename_all = "camelCase")]
        struct AckBody {
            subscription: String,
            ids: Vec<String>,
            #[serde(default)]
            client_id: Option<String>,
            #[serde(default)]
            nack: bool,
        }
        let a = match serde_json::from_slice::<AckBody>(body) {
            Ok(a) => a,
            Err(e) => {
                return problem(
                    StatusCode::BAD_REQUEST,
                    &format!("expected {{\"subscription\": S, \"ids\": [...]}}: {e}"),
                )
            }
        };
        let stored = match gate
            .allow(Action::Subscribe, Kind::Subscription, &a.subscription)
            .and_then(|()| gate.scoped(&a.subscription))
        {
            Ok(s) => s,
            Err(r) => return r,
        };
        let def = match self.defined(&stored, redirected).await {
            Ok(Some(d)) => d,
            Ok(None) => return problem(StatusCode::NOT_FOUND, &format!("no subscription {}", a.subscription)),
            Err(e) => return storage_problem(&e),
        };
        if def.pushed() {
            let detail = format!("subscription {} is pushed by the broker, acked by the answers", a.subscription);
            return problem(StatusCode::CONFLICT, &detail);
        }
        match self.home_elsewhere(&crate::cluster::homes::subscription_key(&stored)).await {
            Ok(Some(home)) if !redirected => return to_home(&home, "/events/ack"),
            Ok(_) => {}
            Err(r) => return r,
        }
        let client = match (def.mode, a.client_id) {
            (SubMode::LoadBalance, _) => String::new(),
            (_, Some(c)) if valid_topic(&c) => c,
            _ => {
                return problem(
                    StatusCode::BAD_REQUEST,
                    "acks of a BROADCAST or MULTICAST subscription need a clientId",
                )
            }
        };
        let by = match group_ids(a.ids.iter().map(String::as_str)) {
            Ok(by) => by,
            Err(m) => return problem(StatusCode::BAD_REQUEST, &m),
        };
        let consumer = ConsumerKey { subscription: def.subscription, client };
        let kind = if a.nack { AckKind::Nack } else { AckKind::Ack };
        let unavailable = |m| storage_problem(&StorageError::Unavailable(m));
        if self.shard.outbox_len() >= OUTBOX_HIGH {
            return unavailable("too many acks waiting for their owners");
        }
        let applied = match self.shard.route_acks(&consumer, &def.topic, by, kind, true) {
            Ok(applied) => applied,
            Err(m) => return problem(StatusCode::BAD_REQUEST, &m),
        };
        for done in applied {
            match monoio::time::timeout(CROSS_CORE_DEADLINE, done).await {
                Ok(Ok(())) => {}
                _ => return unavailable("an owning shard did not apply the acks in time"),
            }
        }
        Response::json(StatusCode::OK, serde_json::json!({ "acked": a.ids.len() }).to_string())
    }

    /// `POST /events/subscribe`: 201 created, 200 the same definition exists, 409 another one
    /// does, 400 invalid. The topic is created with the defaults if it does not exist yet, so
    /// subscribers may come before publishers.
    async fn subscribe(&self, gate: &mut Gate<'_>, body: &[u8]) -> Response {
        let mut def = match Definition::parse(body) {
            Ok(d) => d,
            Err(m) => return problem(StatusCode::BAD_REQUEST, &m),
        };
        if is_lite(&def.topic) {
            let detail =
                "agent.*, client.* and session.* are lite topics, read with GET /session/subscribe/{sessionId} \
                          (or by agents over /agent/ws), not through subscriptions";
            return problem(StatusCode::BAD_REQUEST, detail);
        }
        // A subscription reads its topic: it needs SUBSCRIBE on both.
        if let Err(r) = gate
            .allow(Action::Subscribe, Kind::Subscription, &def.subscription)
            .and_then(|()| gate.allow(Action::Subscribe, Kind::Topic, &def.topic))
        {
            return r;
        }
        def.created_us = crate::model::clock::now_micros();
        // Answered with the names the client used; stored in its tenant's namespace.
        let mut shown = def.shown();
        match (gate.scoped(&def.subscription), gate.scoped(&def.topic)) {
            (Ok(s), Ok(t)) => (def.subscription, def.topic) = (s.into_owned(), t.into_owned()),
            (Err(r), _) | (_, Err(r)) => return r,
        }
        // Where its sessions attach: its home, recorded once it exists (this instance while none
        // is known live yet).
        // (A pushed subscription, a sink's or a classic group's, stays here: no home recorded.)
        let key = crate::cluster::homes::subscription_key(&def.subscription);
        let pushed = def.pushed();
        let json = |shown: &mut serde_json::Value| {
            let home = (!pushed).then(|| self.shard.shared.home(&key, true)).flatten();
            shown["instanceUrl"] =
                home.map_or_else(|| self.shard.shared.config.advertised_url.clone(), |h| h.url).into();
            shown.to_string()
        };
        if let Err(r) =
            gate.quota(Quotaed::Topic, &def.topic).and_then(|()| gate.quota(Quotaed::Subscription, &def.subscription))
        {
            return r;
        }
        if let Err(e) = self.shard.topic(&def.topic, None, false).await {
            return storage_problem(&e);
        }
        let replica = def.clone();
        match self.shard.subscription(SubRequest::Create(def)).await {
            Ok(SubOutcome::Created) => {
                self.shard.shared.replicate_definition(&replica.subscription, Some(&replica));
                Response::json(StatusCode(201), json(&mut shown))
            }
            Ok(SubOutcome::Unchanged) => Response::json(StatusCode::OK, json(&mut shown)),
            Ok(SubOutcome::Limit) => problem(
                StatusCode::CONFLICT,
                &format!("max_subscriptions ({}) subscriptions exist", self.shard.shared.config.max_subscriptions),
            ),
            Ok(_) => {
                problem(StatusCode::CONFLICT, "a different subscription of that name exists; unsubscribe it first")
            }
            Err(e) => storage_problem(&e),
        }
    }

    /// `POST /events/unsubscribe` `{"subscription": S}`: 200 removed, 404 unknown.
    async fn unsubscribe(&self, gate: &mut Gate<'_>, body: &[u8]) -> Response {
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Unsubscribe {
            subscription: String,
        }
        let name = match serde_json::from_slice::<Unsubscribe>(body) {
            Ok(u) => u.subscription,
            Err(e) => return problem(StatusCode::BAD_REQUEST, &format!("expected {{\"subscription\": S}}: {e}")),
        };
        let local = name;
        let name = match gate.allow(Action::Subscribe, Kind::Subscription, &local).and_then(|()| gate.scoped(&local)) {
            Ok(s) => s.into_owned(),
            Err(r) => return r,
        };
        let (topic, pushed) = match crate::storage::meta::get_subscription(&self.shard.shared.db, &name) {
            Ok(d) => d.map(|d| (d.topic.clone(), d.pushed())).unwrap_or_default(),
            Err(e) => return storage_problem(&e),
        };
        match self.shard.subscription(SubRequest::Remove(name.clone())).await {
            Ok(SubOutcome::Removed) => {
                if !pushed {
                    self.shard.shared.replicate_definition(&name, None);
                }
                // Attached sessions, on whatever shard, are closed cleanly (1000).
                self.shard.announce(&name, &topic, InterestChange::Removed);
                Response::json(StatusCode::OK, serde_json::json!({"subscription": local, "removed": true}).to_string())
            }
            Ok(_) => problem(StatusCode::NOT_FOUND, &format!("no subscription {local}")),
            Err(e) => storage_problem(&e),
        }
    }

    /// `POST /events/publish?topic=T`: CloudEvents over HTTP, through the one ingress path.
    async fn publish(&self, gate: &mut Gate<'_>, req: &Request<'_>) -> Response {
        self.publish_with(&adaptor::CloudEventsHttp::default(), gate, req).await
    }

    /// The `?topic=` of a request, checked, allowed for `action` and in the caller's namespace.
    fn topic_param<'r>(
        &self,
        gate: &mut Gate<'_>,
        req: &Request<'r>,
        action: Action,
    ) -> Result<Cow<'r, str>, Response> {
        self.topic_query(gate, req, "topic", action)
    }

    /// The topic a query parameter names, checked as [`Traffic::topic_param`] does.
    fn topic_query<'r>(
        &self,
        gate: &mut Gate<'_>,
        req: &Request<'r>,
        param: &str,
        action: Action,
    ) -> Result<Cow<'r, str>, Response> {
        let Some(topic) = req.query(param) else {
            return Err(problem(StatusCode::BAD_REQUEST, &format!("missing ?{param}=")));
        };
        self.topic_named(gate, topic, action, Some(req))
    }

    /// A topic as the caller names it, checked as [`Traffic::topic_param`] does: its stored name.
    /// A lite topic is served at its home only (with Kafka): elsewhere an HTTP request `at` is
    /// answered 307 there, anything else (a WebSocket message) 409 naming it.
    fn topic_named<'r>(
        &self,
        gate: &mut Gate<'_>,
        topic: Cow<'r, str>,
        action: Action,
        at: Option<&Request<'_>>,
    ) -> Result<Cow<'r, str>, Response> {
        if !valid_topic(&topic) {
            return Err(problem(StatusCode::BAD_REQUEST, "topic names are [A-Za-z0-9._-]{1,249}"));
        }
        gate.allow(action, Kind::Topic, &topic)?;
        if topic.starts_with("agent.") {
            // What an agent's WebSocket receives is the broker's to write (turns and notices of
            // sessions the caller may not have): nobody publishes there.
            return Err(problem(
                StatusCode::FORBIDDEN,
                "agent.* lite topics carry agents' turns, written by the broker (POST /session/stream/{sid})",
            ));
        }
        if !is_lite(&topic) {
            return Ok(match gate.scoped(&topic)? {
                Cow::Owned(t) => Cow::Owned(t),
                Cow::Borrowed(_) => topic,
            });
        }
        let stored = StoredTopic::lite(&gate.scoped(&topic)?);
        self.lite_served_here(&stored, at, || format!("lite topic {topic}"))?;
        Ok(Cow::Owned(stored))
    }

    /// Whether instances share Kafka: only then is anything served at a home elsewhere.
    fn clustered(&self) -> bool {
        !matches!(self.shard.shared.config.storage, crate::config::StorageKind::Embedded)
    }

    /// [`Traffic::served_here`] for lite topic `stored` (a choice nobody claimed stays here
    /// while the topic is followed here). Nothing is looked up on the embedded log.
    fn lite_served_here(
        &self,
        stored: &str,
        at: Option<&Request<'_>>,
        what: impl FnOnce() -> String,
    ) -> Result<(), Response> {
        if !self.clustered() {
            return Ok(());
        }
        let here = self.shard.shared.watchers.is_followed(stored);
        self.served_here(&session::lite_home(stored).0, (at, here), what).map(|_| ())
    }

    /// With Kafka: whether an agent's or a lite topic's `key` (`cluster::homes`) is served
    /// here: `Ok(claim)`, `claim` saying no claim names this instance yet (its caller claims
    /// it once it served the request: `Shared::claim_here`); else the 307 to its home for an
    /// HTTP request `at`, or a 409 naming `what` (a WebSocket message). A live claim of
    /// another instance always sends the request on; a choice nobody claimed does unless
    /// another instance sent the request here (`evmeshRedirected`): then this one takes it.
    /// Never waits: these keys carry no offsets to catch up on, and two racing first choices
    /// are settled by the claims' log (the loser forgets, `runtime::claim_read`). Nothing is
    /// recorded here: a caller that is sent on leaves no claim behind.
    fn served_here(
        &self,
        key: &str,
        (at, serving): (Option<&Request<'_>>, bool),
        what: impl FnOnce() -> String,
    ) -> Result<bool, Response> {
        let redirected = at.is_some_and(|r| r.query(REDIRECTED).is_some());
        match self.placed(key, redirected || serving)? {
            Placed::Here { claim } => Ok(claim),
            Placed::There(url) => Err(match at {
                Some(req) => to_home(&url, req.head.target(req.buf)),
                None => problem(StatusCode::CONFLICT, &format!("{} is served by its home instance {url}", what())),
            }),
        }
    }

    /// Where `key` is served, as [`Traffic::served_here`] says (`kept`: a choice nobody
    /// claimed stays here, the request being sent here by another instance, or this instance
    /// serving the key already: an agent registered or attached here, a lite topic followed
    /// here); 503 while this instance is starting, or knows no live instance (Kafka away:
    /// what it took then, it could not tell the others).
    fn placed(&self, key: &str, kept: bool) -> Result<Placed, Response> {
        let shared = &self.shard.shared;
        if !self.clustered() {
            return Ok(Placed::Here { claim: false });
        }
        let Some(home) = shared.home(key, false) else {
            let detail = match shared.homes.is_caught_up() {
                false => "this instance is starting; try again",
                true => "no live instance is known (Kafka away?); try again",
            };
            return Err(problem(StatusCode::SERVICE_UNAVAILABLE, detail).with_header("retry-after", "1"));
        };
        if home.id == shared.config.instance_id {
            return Ok(Placed::Here { claim: !home.claimed });
        }
        if !home.claimed && kept {
            return Ok(Placed::Here { claim: true });
        }
        Ok(Placed::There(home.url))
    }

    /// With Kafka, before lite topic `stored` is stored here: its home claimed for this
    /// instance and the claim read back (at most [`SETTLE_WAIT`]; an agent's topic is claimed
    /// by the agent's registration instead). Of two instances that each took a new session
    /// topic at once, the one whose claim lost stores nothing (503: the publisher's retry is
    /// sent to the other), so no acknowledged event stays where nobody reads it.
    async fn lite_settled(&self, stored: &str) -> Result<(), StorageError> {
        if !self.clustered() {
            return Ok(());
        }
        let shared = &self.shard.shared;
        let (key, claimed_here) = session::lite_home(stored);
        if !claimed_here {
            return Ok(());
        }
        let me = &shared.config.instance_id;
        if shared.homes.claimed_by(&key, me) {
            return Ok(());
        }
        if shared.homes.lite_claims() >= crate::cluster::homes::MAX_LITE_CLAIMS {
            return Err(StorageError::Unavailable(
                "the cluster serves as many session topics as it may; try again later",
            ));
        }
        shared.claim_here(&key);
        let until = std::time::Instant::now() + SETTLE_WAIT;
        loop {
            if shared.homes.claimed_by(&key, me) {
                return Ok(());
            }
            if shared.home(&key, false).is_some_and(|h| h.claimed && h.id != *me) {
                return Err(StorageError::Unavailable("another instance is this session's home now; try again"));
            }
            if std::time::Instant::now() >= until {
                return Err(StorageError::Unavailable("this instance is taking the session over; try again"));
            }
            monoio::time::sleep(SETTLE_POLL).await;
        }
    }

    /// Stores routed events, per destination topic: where each landed (in request order).
    /// Every destination must exist (or be created) before anything is stored, so a route to a
    /// topic that cannot be had refuses the request whole (a storage failure between the
    /// groups can still leave part of it stored: the 503 says so, see docs/src/governance.md).
    async fn store_routed<'t>(
        &self,
        groups: pipeline::Groups<'t, Frame>,
    ) -> Result<pipeline::Groups<'t, (PartitionId, u64)>, Response> {
        if groups.len() > 1 {
            for (t, _) in &groups {
                self.shard.topic(t, None, false).await.map_err(|e| storage_problem(&e))?;
            }
        }
        let mut stored = SmallVec::new();
        for (t, frames) in groups {
            let placed = self.store(&t, frames).await.map_err(|e| storage_problem(&e))?;
            stored.push((t, placed));
        }
        Ok(stored)
    }

    /// The request's events as frames, and whether it was a batch.
    fn parse(&self, req: &Request<'_>, topic: &str) -> Result<(Vec<Frame>, bool), CeError> {
        let ct = req.header("content-type");
        let has_specversion = req.header("ce-specversion").is_some();
        let mut frames = match cloudevents::mode(ct, has_specversion)? {
            Mode::Structured => (vec![cloudevents::parse_structured(topic, req.body)?], false),
            Mode::Batch => (cloudevents::parse_batch(topic, req.body)?, true),
            Mode::Binary => (vec![cloudevents::parse_binary(topic, req.headers(), ct, req.body)?], false),
        };
        let now = crate::model::clock::now_micros();
        for f in &mut frames.0 {
            f.set_timestamp(now);
        }
        Ok(frames)
    }

    /// Stores frames and returns (partition, offset) per frame, in request order.
    async fn store(&self, topic: &str, mut frames: Vec<Frame>) -> Result<Vec<(PartitionId, u64)>, StorageError> {
        if frames.is_empty() {
            return Ok(Vec::new());
        }
        let (meta, _) = self.shard.topic(topic, None, false).await?;
        let bytes: u64 = frames.iter().map(|f| f.as_bytes().len() as u64).sum();
        let stored = || self.shard.shared.metrics.shard(self.shard.id).bytes_stored.add(bytes);
        let pick = |f: &Frame, local: PartitionId| partition_of(f, meta.partitions).unwrap_or(local);
        let local = self.shard.local_partition(topic, &meta);
        // The common case, one event (or a batch for one partition), without the regrouping.
        let first = pick(&frames[0], local);
        if frames.iter().all(|f| pick(f, local) == first) {
            let n = frames.len() as u64;
            if StoredTopic::new(topic).is_lite() {
                self.lite_settled(topic).await?;
            }
            let offset = self.shard.append(topic, first, std::mem::take(&mut frames)).await?;
            stored();
            return Ok((0..n).map(|i| (first, offset + i)).collect());
        }
        // Group by partition, remembering each frame's place in the request.
        let mut groups: Vec<(PartitionId, Vec<usize>, Vec<Frame>)> = Vec::new();
        for (i, f) in frames.into_iter().enumerate() {
            let p = pick(&f, local);
            match groups.iter_mut().find(|g| g.0 == p) {
                Some(g) => {
                    g.1.push(i);
                    g.2.push(f);
                }
                None => groups.push((p, vec![i], vec![f])),
            }
        }
        let total: usize = groups.iter().map(|g| g.1.len()).sum();
        let mut placed = vec![(PartitionId(0), 0u64); total];
        let mut jobs = Vec::with_capacity(groups.len());
        let mut slots = Vec::with_capacity(groups.len());
        for (p, idx, fs) in groups {
            slots.push((p, idx));
            jobs.push(self.shard.append(topic, p, fs));
        }
        for ((p, idx), r) in slots.into_iter().zip(join_all(jobs).await) {
            let first = r?;
            for (k, i) in idx.into_iter().enumerate() {
                placed[i] = (p, first + k as u64);
            }
        }
        stored();
        Ok(placed)
    }
}
