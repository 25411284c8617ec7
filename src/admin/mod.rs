//! The admin listener: health, readiness, Prometheus metrics, the cluster view, topics and
//! stored events, dead letters, and the policies (ACL rules, limits, quotas, transformers,
//! routes).
//!
//! Runs on its own thread (not a shard), so a scrape or an event dump never competes with a
//! shard's traffic. It reads the log and metadata directly (reads never mutate a shard's state)
//! and asks the owning shard, through the mailbox, for anything that writes.
//!
//! This file holds the [`Admin`] handler: who may use the admin API (`Admin::access`), the
//! one route table (`endpoint`) and what each route runs (`Admin::serve`), a tenant's
//! administrator's view of it (`Admin::tenant_admin`), and the audit of writes. What the
//! routes do is in `policy` (the five policy kinds, one generic implementation), `topics`
//! (topics, stored events, dead letters and replay) and `observe` (readiness, metrics, lag,
//! the cluster, agents and subscriptions listings, the tenants' backlog).

mod common;
mod console;
mod observe;
mod policy;
mod topics;

use std::sync::Arc;

use crate::governance::acl::{Action, Kind as AclKind};
use crate::governance::identity::{AuthError, Principal};
use crate::governance::AuthMode;
use crate::http::{problem, Method, StatusCode};
use crate::server::{Handler, Request, Response};
use crate::shard::shared::Shared;

pub use observe::measure_backlog;
use policy::Op;

/// The admin listener's handler: one, on the admin thread.
pub struct Admin {
    pub shared: Arc<Shared>,
    /// Failed authentications per source address (throttled past a few, as on the traffic
    /// listener: verification is the costly part of a bad request, and this is one thread).
    pub failures: std::cell::RefCell<crate::governance::Failures>,
    /// A DLQ replay is running (one at a time, so none replays an event twice).
    pub replaying: std::cell::Cell<bool>,
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
        // Health, readiness and metrics stay open (probes and scrapers); the rest is the admin API
        // and the console that uses it.
        if matches!(segs.first(), Some(&"admin" | &"console")) {
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

/// What a request to the admin listener asks for: one [`endpoint`] of the route table.
enum Endpoint<'a> {
    /// `GET /healthz`.
    Healthz,
    /// `GET /openapi.yaml`.
    OpenApi,
    /// `GET /readyz`.
    Readyz,
    /// `GET /metrics`.
    Metrics,
    /// `GET /admin/topics`.
    Topics,
    /// `GET /admin/subscriptions`.
    Subscriptions,
    /// `GET /admin/agents`.
    Agents,
    /// `GET /admin/cluster`.
    Cluster,
    /// `PUT /admin/topics/{topic}`.
    CreateTopic(&'a str),
    /// `GET /admin/topics/{topic}/partitions/{p}/events`.
    Events(&'a str, &'a str),
    /// `GET /admin/dlq/{topic}`.
    DeadLetters(&'a str),
    /// `POST /admin/dlq/{topic}/replay`.
    Replay(&'a str),
    /// `GET | PUT | DELETE /admin/{kind}[/{key}]` for a policy kind (`acl`, `limits`, `quotas`,
    /// `transformers`, `routes`).
    Policy(policy::Answer, Op<'a>),
    /// `GET /console[/{file}]`: the web console's page and its assets.
    Console(&'static console::Asset),
}

/// The admin listener's route table: the endpoint a method and path (its `/`-separated
/// segments) name, with `body` for a policy's `PUT`; `None` for none.
fn endpoint<'a>(method: Method, segs: &[&'a str], body: &'a [u8]) -> Option<Endpoint<'a>> {
    use Endpoint as E;
    Some(match (method, segs) {
        (Method::Get, ["healthz"]) => E::Healthz,
        // The contract of both listeners, open like the probes (it holds no secret).
        (Method::Get, ["openapi.yaml"]) => E::OpenApi,
        (Method::Get, ["readyz"]) => E::Readyz,
        (Method::Get, ["metrics"]) => E::Metrics,
        (Method::Get, ["admin", "topics"]) => E::Topics,
        (Method::Get, ["admin", "subscriptions"]) => E::Subscriptions,
        (Method::Get, ["admin", "agents"]) => E::Agents,
        (Method::Get, ["admin", "cluster"]) => E::Cluster,
        (Method::Put, ["admin", "topics", t]) => E::CreateTopic(t),
        (Method::Get, ["admin", "topics", t, "partitions", p, "events"]) => E::Events(t, p),
        (Method::Get, ["admin", "dlq", t]) => E::DeadLetters(t),
        (Method::Post, ["admin", "dlq", t, "replay"]) => E::Replay(t),
        (Method::Get, ["admin", kind]) => E::Policy(policy::kind(kind)?, Op::List),
        (Method::Get, ["admin", kind, key]) => E::Policy(policy::kind(kind)?, Op::Get(key)),
        (Method::Put, ["admin", kind, key]) => E::Policy(policy::kind(kind)?, Op::Put(key, body)),
        (Method::Delete, ["admin", kind, key]) => E::Policy(policy::kind(kind)?, Op::Delete(key)),
        (Method::Get, ["console"] | ["console", ""]) => E::Console(console::INDEX),
        (Method::Get, ["console", file]) => E::Console(console::asset(file)?),
        _ => return None,
    })
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
        let authorization = req.header("authorization");
        let basic = authorization.and_then(console::basic);
        let token = basic.as_deref().or_else(|| {
            authorization.and_then(|v| {
                let scheme = v.get(..7)?;
                scheme.eq_ignore_ascii_case(b"bearer ").then(|| v[7..].trim_ascii())
            })
        });
        // A browser sends a Basic credential it was given by itself, to any page's requests:
        // a write so authenticated must carry a header no cross-site page can set (without a
        // CORS preflight this listener never answers), which the console's script sends.
        let write = req.method() != Method::Get && req.method() != Method::Head;
        if basic.is_some() && write && req.header("x-evmesh-console").is_none() {
            return Err(problem(
                StatusCode::FORBIDDEN,
                "a write authenticated with Basic must carry x-evmesh-console (cross-site requests cannot)",
            ));
        }
        // The console's page is opened by a browser, which asks for a password only when told
        // `Basic` (the token is the password; the user name is not looked at).
        let scheme = if req.path().starts_with("/console") { "Basic" } else { "Bearer" };
        let auth_on = g.config.mode != AuthMode::None;
        let now = std::time::Instant::now();
        // The admin token is let in before the throttle: a stale tab or a broken script
        // failing from an address does not lock the administrator out of it.
        if token.is_some_and(|t| g.is_admin_token(t)) {
            return Ok(Access::Token);
        }
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
                AuthError::Missing => format!(r#"{scheme} realm="evmesh-admin""#),
                _ if scheme == "Basic" => format!(r#"{scheme} realm="evmesh-admin""#),
                _ => format!(r#"{scheme} realm="evmesh-admin", error="invalid_token""#),
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

    /// The admin API for an administrator without a tenant (and the open probes): the route
    /// table's endpoint, or 404.
    async fn admin(&self, req: &Request<'_>, segs: &[&str]) -> Response {
        match endpoint(req.method(), segs, req.body) {
            Some(e) => self.serve(req, e).await,
            None => problem(
                StatusCode::NOT_FOUND,
                &format!("no admin route for {} {}", req.head.method_str(req.buf), req.path()),
            ),
        }
    }

    /// Runs endpoint `e` (its topic names as stored).
    async fn serve(&self, req: &Request<'_>, e: Endpoint<'_>) -> Response {
        let shared: &Shared = &self.shared;
        match e {
            Endpoint::Healthz => Response::json(StatusCode::OK, r#"{"status":"ok"}"#),
            Endpoint::OpenApi => Response::new(StatusCode::OK, "application/yaml", OPENAPI),
            Endpoint::Readyz => observe::readyz(shared),
            Endpoint::Metrics => observe::metrics(shared),
            Endpoint::Topics => {
                topics::learn_all(shared).await;
                topics::topics(shared)
            }
            Endpoint::Subscriptions => observe::subscriptions(shared),
            Endpoint::Agents => observe::agents(shared),
            Endpoint::Cluster => observe::cluster(shared),
            Endpoint::CreateTopic(t) => topics::create_topic(shared, t, req.body).await,
            Endpoint::Events(t, p) => {
                topics::learn(shared, t).await;
                topics::events(shared, t, p, req).await
            }
            Endpoint::DeadLetters(t) => {
                topics::learn_dlq(shared, t).await;
                topics::dead_letters(shared, t, req).await
            }
            Endpoint::Replay(t) => {
                topics::learn_dlq(shared, t).await;
                topics::replay(shared, &self.replaying, t).await
            }
            Endpoint::Policy(answer, op) => answer(shared, op),
            Endpoint::Console(asset) => console::serve(asset),
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
        match endpoint(req.method(), segs, req.body) {
            Some(e @ Endpoint::Topics) => scoped_list(self.serve(req, e).await, &["topic"]),
            Some(e @ Endpoint::Subscriptions) => scoped_list(self.serve(req, e).await, &["subscription", "topic"]),
            Some(Endpoint::CreateTopic(name)) => {
                let name = stored(name);
                // The tenant's topics quota holds here too (an existing topic is not a new one).
                if let Err(r) = topics::within_topics_quota(&self.shared, t, &name) {
                    return r;
                }
                one(self.serve(req, Endpoint::CreateTopic(&name)).await)
            }
            Some(Endpoint::Events(name, p)) => {
                let name = stored(name);
                self.serve(req, Endpoint::Events(&name, p)).await
            }
            Some(Endpoint::DeadLetters(name)) => {
                let name = stored(name);
                self.serve(req, Endpoint::DeadLetters(&name)).await
            }
            Some(Endpoint::Replay(name)) => {
                let name = stored(name);
                self.serve(req, Endpoint::Replay(&name)).await
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(method: Method, path: &str) -> Option<Endpoint<'_>> {
        let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        endpoint(method, &segs, b"{}")
    }

    #[test]
    fn the_five_policy_kinds_route_to_their_list_get_put_and_delete() {
        for kind in ["acl", "limits", "quotas", "transformers", "routes"] {
            assert!(policy::kind(kind).is_some(), "{kind}");
            let list = format!("/admin/{kind}");
            assert!(matches!(route(Method::Get, &list), Some(Endpoint::Policy(_, Op::List))), "GET {list}");
            let one = &format!("/admin/{kind}/k");
            assert!(matches!(route(Method::Get, one), Some(Endpoint::Policy(_, Op::Get("k")))), "GET {one}");
            assert!(matches!(route(Method::Put, one), Some(Endpoint::Policy(_, Op::Put("k", b"{}")))), "PUT {one}");
            assert!(matches!(route(Method::Delete, one), Some(Endpoint::Policy(_, Op::Delete("k")))), "DELETE {one}");
            assert!(route(Method::Post, one).is_none(), "POST {one}");
        }
        for other in ["topics", "dlq", "cluster", "agents", "subscriptions", "acls", ""] {
            assert!(policy::kind(other).is_none(), "{other}");
        }
    }

    #[test]
    fn every_other_route_is_its_own_endpoint_and_nothing_else_routes() {
        use Endpoint as E;
        assert!(matches!(route(Method::Get, "/healthz"), Some(E::Healthz)));
        assert!(matches!(route(Method::Get, "/openapi.yaml"), Some(E::OpenApi)));
        assert!(matches!(route(Method::Get, "/readyz"), Some(E::Readyz)));
        assert!(matches!(route(Method::Get, "/metrics"), Some(E::Metrics)));
        assert!(matches!(route(Method::Get, "/admin/topics"), Some(E::Topics)));
        assert!(matches!(route(Method::Get, "/admin/subscriptions"), Some(E::Subscriptions)));
        assert!(matches!(route(Method::Get, "/admin/agents"), Some(E::Agents)));
        assert!(matches!(route(Method::Get, "/admin/cluster"), Some(E::Cluster)));
        assert!(matches!(route(Method::Put, "/admin/topics/t"), Some(E::CreateTopic("t"))));
        assert!(matches!(route(Method::Get, "/admin/topics/t/partitions/0/events"), Some(E::Events("t", "0"))));
        assert!(matches!(route(Method::Get, "/admin/dlq/t"), Some(E::DeadLetters("t"))));
        assert!(matches!(route(Method::Post, "/admin/dlq/t/replay"), Some(E::Replay("t"))));
        for (method, path) in [
            (Method::Head, "/healthz"),
            (Method::Get, "/admin/topics/t"),
            (Method::Delete, "/admin/topics/t"),
            (Method::Get, "/admin/dlq"),
            (Method::Get, "/admin/acl/a/b"),
            (Method::Delete, "/admin/acl"),
            (Method::Get, "/admin/nothing"),
            (Method::Get, "/nothing"),
        ] {
            assert!(route(method, path).is_none(), "{method:?} {path}");
        }
    }
}
