//! The admin listener: health, readiness, Prometheus metrics, topics and stored events.
//!
//! Runs on its own thread (not a shard), so a scrape or an event dump never competes with a
//! shard's traffic. It reads the log and metadata directly (reads never mutate a shard's state)
//! and asks the owning shard, through the mailbox, for anything that writes.

mod common;
mod observe;
mod topics;

use std::sync::Arc;

use crate::governance::acl::{Action, Kind as AclKind, RuleSpec};
use crate::governance::identity::{AuthError, Principal};
use crate::governance::limits::{LimitSpec, Quota};
use crate::governance::AuthMode;
use crate::http::{problem, Method, StatusCode};
use crate::ingress::storage_problem;
use crate::server::{Handler, Request, Response};
use crate::shard::shared::Shared;
use crate::storage::meta;
use crate::storage::meta::Policy;

pub use observe::measure_backlog;

pub struct Admin {
    pub shared: Arc<Shared>,
    /// Failed authentications per source address (throttled past a few, as on the traffic
    /// listener: verification is the costly part of a bad request, and this is one thread).
    pub failures: std::cell::RefCell<crate::governance::Failures>,
    /// A DLQ replay is running (one at a time, so none replays an event twice).
    pub replaying: std::cell::Cell<bool>,
}

/// A policy entry as the admin API shows it: its spec, with its key under `field`.
fn shown(spec: &impl serde::Serialize, field: &str, key: &str) -> serde_json::Value {
    let mut v = serde_json::to_value(spec).expect("a policy spec serializes");
    v[field] = key.into();
    v
}

/// The answer to `GET` on a policy kind: every entry (`key` absent, in the order given), or the
/// one whose `field` is `key` (404 naming `what`).
fn policy_answer(all: Vec<serde_json::Value>, field: &str, key: Option<&str>, what: &str) -> Response {
    let one = |k: &str| all.iter().find(|v| v[field] == k);
    match key {
        None => Response::json(StatusCode::OK, serde_json::to_vec(&all).expect("json")),
        Some(k) => match one(k) {
            Some(v) => Response::json(StatusCode::OK, serde_json::to_vec(v).expect("json")),
            None => problem(StatusCode::NOT_FOUND, &format!("no {what} {k}")),
        },
    }
}

/// Who may use the admin API, and how they proved it.
enum Access {
    /// Nobody is asked (`auth = none`, no `admin_token`).
    Open,
    /// The `admin_token`.
    Token,
    /// A principal the ACL allows ADMIN on `admin`.
    Principal(Principal),
}

impl Access {
    fn principal(&self) -> Option<&Principal> {
        match self {
            Access::Principal(p) => Some(p),
            _ => None,
        }
    }
}

impl Handler for Admin {
    /// The client's address, and who its certificate names (mutual TLS).
    type Conn = (Option<std::net::IpAddr>, Option<Principal>);

    fn connect(&self, peer: crate::server::conn::Peer) -> Self::Conn {
        (peer.addr.map(|p| p.ip()), peer.cert.and_then(|c| Some(Principal::certified(c.principal?, c.expires_us))))
    }

    async fn handle(&self, conn: &mut Self::Conn, req: Request<'_>) -> Response {
        let (peer, cert) = conn;
        let path = req.path();
        let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        // Health, readiness and metrics stay open (probes and scrapers); the rest is the admin API.
        if segs.first() == Some(&"admin") {
            let write = req.method() != Method::Get && req.method() != Method::Head;
            let access = match self.access(&req, *peer, cert.as_ref()) {
                Ok(a) => a,
                Err(r) => return r,
            };
            // A tenant's administrator sees and touches only its tenant's names; the ACL (global:
            // its rules name principals of every tenant) is for administrators without a tenant.
            let tenant = access.principal().and_then(|p| p.tenant.clone());
            let r = match tenant {
                Some(t) => self.tenant_admin(&req, &segs, &t).await,
                None => self.admin(&req, &segs).await,
            };
            if write {
                let g = &self.shared.governance;
                let who = match &access {
                    Access::Principal(_) => None,
                    Access::Token => Some("admin_token"),
                    Access::Open => Some("-"),
                };
                let action = format!("{} {path}", req.head.method_str(req.buf));
                g.audit(access.principal(), &action, "admin", &r.status.0.to_string(), who.map(str::to_owned), *peer);
            }
            return r;
        }
        self.admin(&req, &segs).await
    }

    /// The admin listener never answers 101; a connection handed here is simply dropped.
    fn upgraded(
        &self,
        _: Self::Conn,
        _: crate::server::Upgrade,
        _: crate::server::Stream,
        _: Vec<u8>,
        _: crate::server::conn::ConnLimits,
        _: crate::server::ConnGuard,
    ) {
    }
}

/// `openapi/evmesh.yaml`, served at `GET /openapi.yaml`.
const OPENAPI: &str = include_str!("../../openapi/evmesh.yaml");

impl Admin {
    /// Whether the request may use the admin API: the `admin_token`, or a principal with
    /// ADMIN on `admin`. With neither configured (no token, no rule that grants ADMIN) it is
    /// open on a loopback admin listener and closed (403) on any other.
    /// A verified client certificate stands for its principal when no bearer token is sent.
    fn access(
        &self,
        req: &Request<'_>,
        peer: Option<std::net::IpAddr>,
        cert: Option<&Principal>,
    ) -> Result<Access, Response> {
        let g = &self.shared.governance;
        let token = req.header("authorization").and_then(|v| {
            let scheme = v.get(..7)?;
            scheme.eq_ignore_ascii_case(b"bearer ").then(|| v[7..].trim_ascii())
        });
        let auth_on = g.config.mode != AuthMode::None;
        let now = std::time::Instant::now();
        if let Some(secs) = token.and_then(|_| self.failures.borrow().throttled(peer, now)) {
            return Err(problem(
                StatusCode::TOO_MANY_REQUESTS,
                "too many failed authentications from this address; retry later",
            )
            .with_header("retry-after", secs.to_string()));
        }
        let unauthenticated = |e: AuthError| {
            if e != AuthError::Missing {
                self.failures.borrow_mut().failed(peer, now);
            }
            g.audit(None, "ADMIN", "admin", "unauthenticated", Some(e.to_string()), peer);
            let challenge = match e {
                AuthError::Missing => r#"Bearer realm="evmesh-admin""#.to_owned(),
                _ => r#"Bearer realm="evmesh-admin", error="invalid_token""#.to_owned(),
            };
            problem(StatusCode::UNAUTHORIZED, &e.to_string()).with_header("www-authenticate", &challenge)
        };
        // A bearer token, when sent, says who the caller is; else a verified client certificate.
        // (Only while some rule grants ADMIN: otherwise no certificate can be an administrator,
        // and the listener is open or closed as if none was shown.)
        let certified = cert.filter(|c| {
            auth_on
                && c.expires_us.is_none_or(|e| crate::model::clock::now_micros() < e)
                && g.snapshot().acl.grants_admin()
        });
        let who = match (token, certified) {
            (Some(t), _) if g.is_admin_token(t) => return Ok(Access::Token),
            (Some(t), _) if auth_on => {
                Some(g.snapshot().keys.verify(t, crate::model::clock::now_micros()).map_err(unauthenticated)?)
            }
            (None, Some(c)) => Some(c.clone()),
            _ => None,
        };
        if let Some(who) = who {
            return match g.snapshot().acl.decide(&who.name, AclKind::Admin, "", Action::Admin) {
                (true, _) => Ok(Access::Principal(who)),
                (false, rule) => {
                    g.audit(Some(&who), "ADMIN", "admin", "denied", rule.map(|r| format!("rule {r}")), peer);
                    Err(problem(StatusCode::FORBIDDEN, &format!("{} may not ADMIN admin", who.name)))
                }
            };
        }
        match token {
            Some(_) => Err(unauthenticated(AuthError::UnknownToken)),
            None if g.has_admin_token() || (auth_on && g.snapshot().acl.grants_admin()) => {
                Err(unauthenticated(AuthError::Missing))
            }
            // Neither an admin token nor an ADMIN principal exists: open on a loopback admin
            // listener; on any other nothing of /admin/* (stored events included) is served.
            None if !self.shared.config.admin_listen.ip().is_loopback() => {
                g.audit(None, "ADMIN", "admin", "denied", Some("no admin credentials configured".into()), peer);
                Err(problem(
                    StatusCode::FORBIDDEN,
                    "the admin API needs admin_token or an ADMIN principal when admin_listen is not loopback",
                ))
            }
            None => Ok(Access::Open),
        }
    }

    async fn admin(&self, req: &Request<'_>, segs: &[&str]) -> Response {
        let path = req.path();
        match (req.method(), segs) {
            (Method::Get, ["healthz"]) => Response::json(StatusCode::OK, r#"{"status":"ok"}"#),
            // The contract of both listeners, open like the probes (it holds no secret).
            (Method::Get, ["openapi.yaml"]) => Response::new(StatusCode::OK, "application/yaml", OPENAPI),
            (Method::Get, ["readyz"]) => observe::readyz(&self.shared),
            (Method::Get, ["metrics"]) => observe::metrics(&self.shared),
            (Method::Get, ["admin", "topics"]) => {
                topics::learn_all(&self.shared).await;
                topics::topics(&self.shared)
            }
            (Method::Get, ["admin", "subscriptions"]) => observe::subscriptions(&self.shared),
            (Method::Get, ["admin", "agents"]) => observe::agents(&self.shared),
            (Method::Get, ["admin", "cluster"]) => observe::cluster(&self.shared),
            (Method::Put, ["admin", "topics", t]) => topics::create_topic(&self.shared, t, req.body).await,
            (Method::Get, ["admin", "topics", t, "partitions", p, "events"]) => {
                topics::learn(&self.shared, t).await;
                topics::events(&self.shared, t, p, req)
            }
            (Method::Get, ["admin", "dlq", t]) => {
                topics::learn_dlq(&self.shared, t).await;
                topics::dead_letters(&self.shared, t, req)
            }
            (Method::Post, ["admin", "dlq", t, "replay"]) => {
                topics::learn_dlq(&self.shared, t).await;
                topics::replay(&self.shared, &self.replaying, t).await
            }
            (Method::Get, ["admin", "acl"]) => self.acl_rules(None),
            (Method::Get, ["admin", "acl", id]) => self.acl_rules(Some(id)),
            (Method::Put, ["admin", "acl", id]) => self.put_acl(id, req.body),
            (Method::Delete, ["admin", "acl", id]) => self.delete_acl(id),
            (Method::Get, ["admin", "limits"]) => self.limits(None),
            (Method::Get, ["admin", "limits", id]) => self.limits(Some(id)),
            (Method::Put, ["admin", "limits", id]) => self.put_limit(id, req.body),
            (Method::Delete, ["admin", "limits", id]) => self.delete_limit(id),
            (Method::Get, ["admin", "quotas"]) => self.quotas(None),
            (Method::Get, ["admin", "quotas", t]) => self.quotas(Some(t)),
            (Method::Put, ["admin", "quotas", t]) => self.put_quota(t, req.body),
            (Method::Delete, ["admin", "quotas", t]) => self.delete_quota(t),
            (Method::Get, ["admin", "transformers"]) => self.transformers(None),
            (Method::Get, ["admin", "transformers", t]) => self.transformers(Some(t)),
            (Method::Put, ["admin", "transformers", t]) => self.put_transformer(t, req.body),
            (Method::Delete, ["admin", "transformers", t]) => self.delete_transformer(t),
            (Method::Get, ["admin", "routes"]) => self.routes(None),
            (Method::Get, ["admin", "routes", id]) => self.routes(Some(id)),
            (Method::Put, ["admin", "routes", id]) => self.put_route(id, req.body),
            (Method::Delete, ["admin", "routes", id]) => self.delete_route(id),
            _ => problem(StatusCode::NOT_FOUND, &format!("no admin route for {} {path}", req.head.method_str(req.buf))),
        }
    }

    /// The admin API for an administrator of tenant `t`: topics, subscriptions, stored events and
    /// dead letters of its namespace, under the names it uses; nothing else.
    async fn tenant_admin(&self, req: &Request<'_>, segs: &[&str], t: &str) -> Response {
        let stored = |name: &str| format!("{t}.{name}");
        let local = |v: &mut serde_json::Value, key: &str| {
            if let Some(n) = v[key].as_str().and_then(|n| n.strip_prefix(t)).and_then(|n| n.strip_prefix('.')) {
                v[key] = n.to_owned().into();
                true
            } else {
                false
            }
        };
        let scoped_list = |r: Response, keys: &[&str]| -> Response {
            if r.status != StatusCode::OK {
                return r;
            }
            let Ok(serde_json::Value::Array(items)) = serde_json::from_slice(&r.body) else { return r };
            let mine: Vec<serde_json::Value> =
                items.into_iter().filter_map(|mut v| keys.iter().all(|k| local(&mut v, k)).then_some(v)).collect();
            Response::json(StatusCode::OK, serde_json::to_vec(&mine).expect("json"))
        };
        let one = |r: Response| -> Response {
            if r.status.0 >= 300 {
                return r;
            }
            match serde_json::from_slice::<serde_json::Value>(&r.body) {
                Ok(mut v) if v.get("topic").is_some() => {
                    local(&mut v, "topic");
                    Response::json(r.status, serde_json::to_vec(&v).expect("json"))
                }
                _ => r,
            }
        };
        match (req.method(), segs) {
            (Method::Get, ["admin", "topics"]) => {
                topics::learn_all(&self.shared).await;
                scoped_list(topics::topics(&self.shared), &["topic"])
            }
            (Method::Get, ["admin", "subscriptions"]) => scoped_list(observe::subscriptions(&self.shared), &["subscription", "topic"]),
            (Method::Put, ["admin", "topics", name]) => {
                // The tenant's topics quota holds here too (an existing topic is not a new one).
                if let Err(r) = topics::within_topics_quota(&self.shared, t, &stored(name)) {
                    return r;
                }
                one(topics::create_topic(&self.shared, &stored(name), req.body).await)
            }
            (Method::Get, ["admin", "topics", name, "partitions", p, "events"]) => {
                topics::learn(&self.shared, &stored(name)).await;
                topics::events(&self.shared, &stored(name), p, req)
            }
            (Method::Get, ["admin", "dlq", name]) => {
                topics::learn_dlq(&self.shared, &stored(name)).await;
                topics::dead_letters(&self.shared, &stored(name), req)
            }
            (Method::Post, ["admin", "dlq", name, "replay"]) => {
                topics::learn_dlq(&self.shared, &stored(name)).await;
                topics::replay(&self.shared, &self.replaying, &stored(name)).await
            }
            _ => problem(
                StatusCode::FORBIDDEN,
                &format!(
                    "an administrator of tenant {t} manages its topics, subscriptions and dead letters only (the ACL and \
                     the limits govern every tenant)"
                ),
            ),
        }
    }

    /// `GET /admin/acl`: every rule in decision order (`source`: `config` or `api`);
    /// `GET /admin/acl/{id}`: one.
    fn acl_rules(&self, id: Option<&str>) -> Response {
        let g = &self.shared.governance;
        let snap = g.snapshot();
        let all = snap.acl.rules().iter().map(|r| {
            let mut v = shown(&r.spec, "id", &r.id);
            v["source"] = if g.is_config_rule(&r.id) { "config" } else { "api" }.into();
            v
        });
        policy_answer(all.collect(), "id", id, "acl rule")
    }

    /// Stores a policy entry, then puts it in force (`set`): 201 new, 200 replaced, with the
    /// entry as `GET` shows it.
    fn store_policy(
        &self,
        kind: Policy,
        field: &str,
        key: &str,
        spec: &impl serde::Serialize,
        existed: bool,
        set: impl FnOnce(),
    ) -> Response {
        if let Err(e) = meta::put_policy(&self.shared.db, kind, key, spec) {
            return storage_problem(&e);
        }
        set();
        let status = if existed { StatusCode::OK } else { StatusCode(201) };
        Response::json(status, serde_json::to_vec(&shown(spec, field, key)).expect("json"))
    }

    /// Removes a policy entry (404 naming `what` unless it `exists`): from the store, then out
    /// of force (`unset`).
    fn remove_policy(
        &self,
        kind: Policy,
        field: &str,
        key: &str,
        what: &str,
        exists: bool,
        unset: impl FnOnce(),
    ) -> Response {
        if !exists {
            return problem(StatusCode::NOT_FOUND, &format!("no {what} {key}"));
        }
        if let Err(e) = meta::delete_policy(&self.shared.db, kind, key) {
            return storage_problem(&e);
        }
        unset();
        let mut v = serde_json::json!({"removed": true});
        v[field] = key.into();
        Response::json(StatusCode::OK, v.to_string())
    }

    /// `PUT /admin/acl/{id}`: 201 new, 200 replaced; stored, then in force on every shard.
    fn put_acl(&self, id: &str, body: &[u8]) -> Response {
        let g = &self.shared.governance;
        let spec: RuleSpec = match serde_json::from_slice(body) {
            Ok(s) => s,
            Err(e) => {
                return problem(
                    StatusCode::BAD_REQUEST,
                    &format!("expected {{\"principal\", \"resource\", \"actions\", \"effect\", \"priority\"}}: {e}"),
                )
            }
        };
        let rule = match crate::governance::acl::Rule::new(id, spec.clone()) {
            Ok(r) => r,
            Err(m) => return problem(StatusCode::BAD_REQUEST, &m),
        };
        if g.is_config_rule(id) {
            return problem(StatusCode::CONFLICT, &format!("acl rule {id} comes from the config file"));
        }
        let existed = g.snapshot().acl.rules().iter().any(|r| r.id == id);
        self.store_policy(Policy::Acl, "id", id, &spec, existed, || g.set_rule(id, Some(rule)))
    }

    /// `GET /admin/limits`: every rate limit, by id, with `id`; `GET /admin/limits/{id}`: one.
    fn limits(&self, id: Option<&str>) -> Response {
        let snap = self.shared.governance.snapshot();
        let all = snap.limits.all().iter().map(|l| shown(&l.spec, "id", &l.id)).collect();
        policy_answer(all, "id", id, "limit")
    }

    /// `PUT /admin/limits/{id}`: 201 new, 200 replaced; stored, then in force on every shard.
    fn put_limit(&self, id: &str, body: &[u8]) -> Response {
        let g = &self.shared.governance;
        let spec: LimitSpec = match serde_json::from_slice(body) {
            Ok(s) => s,
            Err(e) => {
                return problem(
                    StatusCode::BAD_REQUEST,
                    &format!("expected {{\"scope\", \"eventsPerSecond\", \"bytesPerSecond\", \"burst\"}}: {e}"),
                )
            }
        };
        let limit = match crate::governance::limits::Limit::new(id, spec.clone()) {
            Ok(l) => l,
            Err(m) => return problem(StatusCode::BAD_REQUEST, &m),
        };
        let existed = g.snapshot().limits.all().iter().any(|l| l.id == id);
        self.store_policy(Policy::Limit, "id", id, &spec, existed, || g.set_limit(id, Some(limit)))
    }

    /// `GET /admin/quotas`: every tenant's quotas, with `tenant`; `GET /admin/quotas/{t}`: one.
    fn quotas(&self, tenant: Option<&str>) -> Response {
        let snap = self.shared.governance.snapshot();
        let mut all: Vec<_> = snap.quotas.iter().collect();
        all.sort_by_key(|(t, _)| t.as_str());
        let all = all.into_iter().map(|(t, q)| shown(q, "tenant", t)).collect();
        policy_answer(all, "tenant", tenant, "quotas for tenant")
    }

    /// `PUT /admin/quotas/{tenant}`: 201 new, 200 replaced; in force at once.
    fn put_quota(&self, tenant: &str, body: &[u8]) -> Response {
        let g = &self.shared.governance;
        if !crate::governance::identity::valid_tenant(tenant) {
            return problem(StatusCode::BAD_REQUEST, crate::governance::identity::TENANT_RULE);
        }
        let quota: Quota = match serde_json::from_slice(body) {
            Ok(q) => q,
            Err(e) => {
                return problem(
                    StatusCode::BAD_REQUEST,
                    &format!("expected {{\"connections\", \"topics\", \"subscriptions\", \"backlogBytes\"}}: {e}"),
                )
            }
        };
        let existed = g.snapshot().quotas.contains_key(tenant);
        self.store_policy(Policy::Quota, "tenant", tenant, &quota, existed, || g.set_quota(tenant, Some(quota.clone())))
    }

    /// `DELETE /admin/quotas/{tenant}`: 200 removed, 404 unknown.
    fn delete_quota(&self, tenant: &str) -> Response {
        let g = &self.shared.governance;
        let exists = g.snapshot().quotas.contains_key(tenant);
        self.remove_policy(Policy::Quota, "tenant", tenant, "quotas for tenant", exists, || g.set_quota(tenant, None))
    }

    /// `GET /admin/transformers`: every topic's transformer, with `topic`; `.../{topic}`: one.
    fn transformers(&self, topic: Option<&str>) -> Response {
        let snap = self.shared.governance.snapshot();
        let mut all: Vec<_> = snap.transformers.values().collect();
        all.sort_by_key(|t| t.topic.as_str());
        let all = all.into_iter().map(|t| shown(&t.spec, "topic", &t.topic)).collect();
        policy_answer(all, "topic", topic, "transformer for topic")
    }

    /// `PUT /admin/transformers/{topic}`: 201 new, 200 replaced; stored, then in force on every
    /// shard for the next publish.
    fn put_transformer(&self, topic: &str, body: &[u8]) -> Response {
        use crate::governance::transform::{TransformSpec, Transformer};
        let g = &self.shared.governance;
        if !crate::model::valid_topic(topic) {
            return problem(StatusCode::BAD_REQUEST, "topic names are [A-Za-z0-9._-]{1,249}");
        }
        if crate::model::topic::is_lite(topic) {
            return problem(StatusCode::BAD_REQUEST, "lite topics (agent.*, client.*, session.*) have no transformers");
        }
        let spec: TransformSpec = match serde_json::from_slice(body) {
            Ok(s) => s,
            Err(e) => {
                let expected = r#"{"set", "remove", "rename", "variables", "data"}"#;
                return problem(StatusCode::BAD_REQUEST, &format!("expected {expected}: {e}"));
            }
        };
        let t = match Transformer::new(topic, spec.clone()) {
            Ok(t) => t,
            Err(m) => return problem(StatusCode::BAD_REQUEST, &m),
        };
        let existed = g.snapshot().transformers.contains_key(topic);
        self.store_policy(Policy::Transformer, "topic", topic, &spec, existed, || g.set_transformer(topic, Some(t)))
    }

    /// `DELETE /admin/transformers/{topic}`: 200 removed, 404 unknown.
    fn delete_transformer(&self, topic: &str) -> Response {
        let g = &self.shared.governance;
        let exists = g.snapshot().transformers.contains_key(topic);
        self.remove_policy(Policy::Transformer, "topic", topic, "transformer for topic", exists, || {
            g.set_transformer(topic, None)
        })
    }

    /// `GET /admin/routes`: every route, by id, with `id`; `GET /admin/routes/{id}`: one.
    fn routes(&self, id: Option<&str>) -> Response {
        let snap = self.shared.governance.snapshot();
        let all = snap.router.all().iter().map(|r| shown(&r.spec, "id", &r.id)).collect();
        policy_answer(all, "id", id, "route")
    }

    /// `PUT /admin/routes/{id}`: 201 new, 200 replaced, 400 for a route that is malformed or
    /// would loop (or fan out too far) with the routes in force; stored, then in force.
    fn put_route(&self, id: &str, body: &[u8]) -> Response {
        use crate::governance::route::{Route, RouteSpec};
        let g = &self.shared.governance;
        if id.is_empty() || id.len() > 128 {
            return problem(StatusCode::BAD_REQUEST, "route ids are 1 to 128 characters");
        }
        let spec: RouteSpec = match serde_json::from_slice(body) {
            Ok(s) => s,
            Err(e) => {
                let expected = r#"{"topic", "condition", "targets", "mode": "copy" | "move"}"#;
                return problem(StatusCode::BAD_REQUEST, &format!("expected {expected}: {e}"));
            }
        };
        if let Some(t) = std::iter::once(&spec.topic).chain(&spec.targets).find(|t| !crate::model::valid_topic(t)) {
            return problem(StatusCode::BAD_REQUEST, &format!("{t:?}: topic names are [A-Za-z0-9._-]{{1,249}}"));
        }
        if let Some(t) = std::iter::once(&spec.topic).chain(&spec.targets).find(|t| crate::model::topic::is_lite(t)) {
            return problem(
                StatusCode::BAD_REQUEST,
                &format!("{t:?} is a lite topic: routes neither start nor end there"),
            );
        }
        let snap = g.snapshot();
        let existed = snap.router.all().iter().any(|r| r.id == id);
        // Checked against the routes in force (the admin thread is the only one changing them).
        let router = match Route::new(id, spec.clone()).and_then(|r| snap.router.with(id, Some(r))) {
            Ok(r) => r,
            Err(m) => return problem(StatusCode::BAD_REQUEST, &m),
        };
        self.store_policy(Policy::Route, "id", id, &spec, existed, || g.set_router(router))
    }

    /// `DELETE /admin/routes/{id}`: 200 removed, 404 unknown.
    fn delete_route(&self, id: &str) -> Response {
        let g = &self.shared.governance;
        let snap = g.snapshot();
        let exists = snap.router.all().iter().any(|r| r.id == id);
        self.remove_policy(Policy::Route, "id", id, "route", exists, || {
            g.set_router(snap.router.with(id, None).expect("removing a route cannot add a loop"))
        })
    }

    /// `DELETE /admin/limits/{id}`: 200 removed, 404 unknown.
    fn delete_limit(&self, id: &str) -> Response {
        let g = &self.shared.governance;
        let exists = g.snapshot().limits.all().iter().any(|l| l.id == id);
        self.remove_policy(Policy::Limit, "id", id, "limit", exists, || g.set_limit(id, None))
    }

    /// `DELETE /admin/acl/{id}`: 200 removed, 404 unknown.
    fn delete_acl(&self, id: &str) -> Response {
        let g = &self.shared.governance;
        if g.is_config_rule(id) {
            return problem(StatusCode::CONFLICT, &format!("acl rule {id} comes from the config file"));
        }
        let exists = g.snapshot().acl.rules().iter().any(|r| r.id == id);
        self.remove_policy(Policy::Acl, "id", id, "acl rule", exists, || g.set_rule(id, None))
    }
}
