//! The gate every traffic request passes: who the caller is (authentication: the bearer
//! credential, 401, the failed-authentication throttle, the tenant's connection quota), then
//! per request a [`Gate`] to ask through: the ACL (403), the tenant's namespace, the rate
//! limits (429), the topic and subscription quotas, the backlog quota, and the topic a request
//! names. Also [`shed`], the 503 of new work while the process is over its memory limit.

use std::borrow::Cow;
use std::rc::Rc;

use super::responses::storage_problem;
use super::Traffic;
use crate::governance::acl::{Action, Kind};
use crate::governance::identity::{AuthError, Keys, Principal};
use crate::governance::{Caller, TenantStats};
use crate::http::{problem, StatusCode};
use crate::model::topic::is_lite;
use crate::model::{valid_topic, StoredTopic};
use crate::server::{Request, Response};

/// The bearer credential of a request: `Authorization: Bearer T`, or for the sessions a browser
/// opens (WebSocket, SSE; no headers of its own there) `?access_token=T`.
pub(super) fn credential<'a>(req: &Request<'a>, browser: bool) -> Option<Cow<'a, [u8]>> {
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
pub(super) fn unauthorized(e: &AuthError) -> Response {
    let challenge = match e {
        AuthError::Missing => r#"Bearer realm="evmesh""#.to_owned(),
        e => format!(
            r#"Bearer realm="evmesh", error="invalid_token", error_description="{}""#,
            e.to_string().replace('"', "'")
        ),
    };
    problem(StatusCode::UNAUTHORIZED, &e.to_string()).with_header("www-authenticate", &challenge)
}

/// New work refused while the process is over `memory_limit_bytes`.
pub(super) fn shed() -> Response {
    problem(StatusCode::SERVICE_UNAVAILABLE, "the broker is over its memory limit; retry later")
        .with_header("retry-after", "1")
}

/// What a tenant's quotas count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Quotaed {
    Topic,
    Subscription,
}

/// What one request may do: the caller's connection state and who it proved to be.
pub(super) struct Gate<'a> {
    pub(super) traffic: &'a Traffic,
    /// The policy this request is decided under (taken once per request).
    pub(super) snap: Rc<crate::governance::Snapshot>,
    pub(super) caller: &'a mut Caller,
    pub(super) who: &'a Rc<Principal>,
    /// The credential it proved that with (sessions re-check it when the keys change).
    pub(super) token: Option<&'a [u8]>,
}

impl Gate<'_> {
    /// Whether the caller may do `action` to `kind:name`: 403 (and an audit line) if not.
    pub(super) fn allow(&mut self, action: Action, kind: Kind, name: &str) -> Result<(), Response> {
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
    pub(super) fn scoped<'n>(&self, name: &'n str) -> Result<Cow<'n, str>, Response> {
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
    pub(super) fn local<'n>(&self, stored: &'n str) -> Option<&'n str> {
        match &self.who.tenant {
            Some(t) => stored.strip_prefix(t.as_str()).and_then(|n| n.strip_prefix('.')),
            None => Some(stored),
        }
    }

    /// Adds `n` to one of the principal's tenant's counters (nothing without a tenant).
    pub(super) fn tenant_count(&self, counter: impl Fn(&TenantStats) -> &std::sync::atomic::AtomicU64, n: u64) {
        if let Some((_, s)) = self.caller.stats() {
            counter(s).fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Takes `events` events of `bytes` bytes for `topic` (its stored name) from every rate
    /// limit of the principal, its tenant and the topic: 429 with `Retry-After` if one is out.
    pub(super) fn limit(&self, topic: &str, events: u64, bytes: u64) -> Result<(), Response> {
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
                // (The log's own rate limit keeps a flood of refusals to a few lines a second.)
                crate::log::info(
                    "limits",
                    "refused by a rate limit",
                    &[("limit", &l.id), ("scope", &l.scope), ("principal", &self.who.name), ("topic", &topic)],
                );
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
    pub(super) fn quota(&self, what: Quotaed, stored: &str) -> Result<(), Response> {
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
    pub(super) fn backlog(&self) -> Result<(), Response> {
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
    pub(super) fn principal(&self) -> Option<String> {
        let g = &self.traffic.shard.shared.governance;
        (g.config.mode != crate::governance::AuthMode::None).then(|| self.who.name.clone())
    }
}

impl Traffic {
    /// Who the request comes from: 401 without valid credentials (429 for an address that
    /// failed too often lately).
    pub(super) fn authenticate(
        &self,
        caller: &mut Caller,
        snap: &crate::governance::Snapshot,
        path: &str,
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
                    None => caller.forget_tenant(),
                }
                Ok(who)
            }
            Err(e) => {
                if e != AuthError::Missing {
                    self.failures.borrow_mut().failed(caller.peer, now);
                }
                g.audit(None, "AUTHENTICATE", path, "unauthenticated", Some(e.to_string()), caller.peer);
                self.shard.shared.metrics.shard(self.shard.id).refused(401);
                Err(unauthorized(&e))
            }
        }
    }

    /// Keeps the tenant's metrics counters on the connection, and counts the connection against
    /// the tenant's `connections` quota (once): 429 when the tenant has that many open.
    pub(super) fn tenant_connection(
        &self,
        caller: &mut Caller,
        snap: &crate::governance::Snapshot,
        tenant: &str,
    ) -> Result<(), Response> {
        let g = &self.shard.shared.governance;
        let side = caller.tenant_side();
        if side.stats.as_ref().is_none_or(|(t, _)| **t != *tenant) {
            side.stats = Some((tenant.into(), g.tenant_stats(tenant)));
        }
        if snap.quotas.is_empty() || side.slot.as_ref().is_some_and(|(t, _)| t == tenant) {
            return Ok(());
        }
        let Some(max) = snap.quotas.get(tenant).and_then(|q| q.connections) else { return Ok(()) };
        side.slot = None;
        match g.connect_tenant(tenant, max) {
            Some(slot) => {
                side.slot = Some((tenant.to_owned(), slot));
                Ok(())
            }
            None => {
                if let Some((_, s)) = &side.stats {
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

    /// The `?topic=` of a request, checked, allowed for `action` and in the caller's namespace.
    pub(super) fn topic_param<'r>(
        &self,
        gate: &mut Gate<'_>,
        req: &Request<'r>,
        action: Action,
    ) -> Result<Cow<'r, str>, Response> {
        self.topic_query(gate, req, "topic", action)
    }

    /// The topic a query parameter names, checked as [`Traffic::topic_param`] does.
    pub(super) fn topic_query<'r>(
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
    pub(super) fn topic_named<'r>(
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
}
