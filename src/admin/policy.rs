//! The admin API's policies: ACL rules, rate limits, tenants' quotas, topics' transformers and
//! routes, each under `/admin/{kind}[/{key}]` with `GET` (every entry, or one), `PUT` and
//! `DELETE`. One generic implementation of the four serves the five kinds; what tells the kinds
//! apart is each one's [`PolicyKind`]: its URL segment, the field its key shows under, how a
//! body is parsed and checked, and how an entry goes into and out of force through
//! `crate::governance`. An entry is stored (`storage::meta`) before it is put in force, and taken
//! out of the store before it is taken out of force.

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::governance::acl::{Rule, RuleSpec};
use crate::governance::identity::{valid_tenant, TENANT_RULE};
use crate::governance::limits::{Limit, LimitSpec, Quota};
use crate::governance::route::{Route, RouteSpec, Router};
use crate::governance::transform::{TransformSpec, Transformer};
use crate::governance::{Governance, Snapshot};
use crate::http::{problem, StatusCode};
use crate::ingress::storage_problem;
use crate::model::topic::is_lite;
use crate::model::valid_topic;
use crate::server::Response;
use crate::shard::shared::Shared;
use crate::storage::meta::{self, Policy};

/// What a request asks of one policy kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Op<'a> {
    /// `GET /admin/{kind}`: every entry.
    List,
    /// `GET /admin/{kind}/{key}`: one entry.
    Get(&'a str),
    /// `PUT /admin/{kind}/{key}`, the entry as the body: 201 new, 200 replaced.
    Put(&'a str, &'a [u8]),
    /// `DELETE /admin/{kind}/{key}`: 200 removed, 404 unknown.
    Delete(&'a str),
}

/// A policy kind's answer to an [`Op`].
pub(super) type Answer = fn(&Shared, Op<'_>) -> Response;

/// The policy kinds, by URL segment.
const KINDS: [(&str, Answer); 5] = [
    (AclRules::SEGMENT, answer::<AclRules>),
    (Limits::SEGMENT, answer::<Limits>),
    (Quotas::SEGMENT, answer::<Quotas>),
    (Transformers::SEGMENT, answer::<Transformers>),
    (Routes::SEGMENT, answer::<Routes>),
];

/// The policy kind served under `/admin/{segment}`, if one is.
pub(super) fn kind(segment: &str) -> Option<Answer> {
    KINDS.iter().find(|(s, _)| *s == segment).map(|&(_, a)| a)
}

/// One kind of policy, as the admin API serves it.
trait PolicyKind {
    /// The URL segment: `/admin/{SEGMENT}[/{key}]`.
    const SEGMENT: &'static str;
    /// Where its entries are stored.
    const STORED: Policy;
    /// The JSON field an entry shows its key under (`id`, `tenant`, `topic`).
    const FIELD: &'static str;
    /// What one entry is called in a 404 (`no {WHAT} {key}`).
    const WHAT: &'static str;
    /// The fields a `PUT` body has, named in the 400 when it does not parse.
    const EXPECTED: &'static str;
    /// A `PUT`'s body, as stored and shown.
    type Spec: Serialize + DeserializeOwned + Clone;
    /// What a spec becomes to be put in force.
    type InForce;

    /// Every entry in force, as `GET` shows them (the spec with its key under [`Self::FIELD`]),
    /// in the order shown.
    fn entries(g: &Governance, snap: &Snapshot) -> Vec<serde_json::Value>;
    /// Whether entry `key` is in force.
    fn exists(snap: &Snapshot, key: &str) -> bool;
    /// Why `key` cannot name an entry (400), checked before the body is read.
    fn check_key(_key: &str) -> Result<(), String> {
        Ok(())
    }
    /// What `spec` puts in force as `key`, checked against the policy in force; or why not (400).
    fn build(snap: &Snapshot, key: &str, spec: Self::Spec) -> Result<Self::InForce, String>;
    /// Why entry `key` cannot be changed through the API (409): asked once a `PUT`'s entry is
    /// built, and before a `DELETE` looks the entry up.
    fn locked(_g: &Governance, _key: &str) -> Option<String> {
        None
    }
    /// Puts `entry` in force (on every shard) as `key`.
    fn set(g: &Governance, key: &str, entry: Self::InForce);
    /// Takes `key` out of force, `snap` being the policy it was found in.
    fn unset(g: &Governance, snap: &Snapshot, key: &str);
}

/// The generic answer: `op` on policy kind `K`.
fn answer<K: PolicyKind>(shared: &Shared, op: Op<'_>) -> Response {
    match op {
        Op::List => get::<K>(shared, None),
        Op::Get(key) => get::<K>(shared, Some(key)),
        Op::Put(key, body) => put::<K>(shared, key, body),
        Op::Delete(key) => delete::<K>(shared, key),
    }
}

/// A policy entry as the admin API shows it: its spec, with its key under `field`.
fn shown(spec: &impl Serialize, field: &str, key: &str) -> serde_json::Value {
    let mut v = serde_json::to_value(spec).expect("a policy spec serializes");
    v[field] = key.into();
    v
}

/// `GET`: every entry (`key` absent, in the order [`PolicyKind::entries`] gives), or the one
/// whose key is `key` (404).
fn get<K: PolicyKind>(shared: &Shared, key: Option<&str>) -> Response {
    let g = &shared.governance;
    let all = K::entries(g, &g.snapshot());
    let one = |k: &str| all.iter().find(|v| v[K::FIELD] == k);
    match key {
        None => Response::json(StatusCode::OK, serde_json::to_vec(&all).expect("json")),
        Some(k) => match one(k) {
            Some(v) => Response::json(StatusCode::OK, serde_json::to_vec(v).expect("json")),
            None => problem(StatusCode::NOT_FOUND, &format!("no {} {k}", K::WHAT)),
        },
    }
}

/// `PUT`: the key checked, the body parsed and built, stored, then put in force: 201 new, 200
/// replaced, with the entry as `GET` shows it.
fn put<K: PolicyKind>(shared: &Shared, key: &str, body: &[u8]) -> Response {
    let g = &shared.governance;
    if let Err(m) = K::check_key(key) {
        return problem(StatusCode::BAD_REQUEST, &m);
    }
    let spec: K::Spec = match serde_json::from_slice(body) {
        Ok(s) => s,
        Err(e) => return problem(StatusCode::BAD_REQUEST, &format!("expected {}: {e}", K::EXPECTED)),
    };
    // Checked against the policy in force (the admin thread is the only one changing it).
    let snap = g.snapshot();
    let entry = match K::build(&snap, key, spec.clone()) {
        Ok(e) => e,
        Err(m) => return problem(StatusCode::BAD_REQUEST, &m),
    };
    if let Some(why) = K::locked(g, key) {
        return problem(StatusCode::CONFLICT, &why);
    }
    let existed = K::exists(&snap, key);
    if let Err(e) = meta::put_policy(&shared.db, K::STORED, key, &spec) {
        return storage_problem(&e);
    }
    K::set(g, key, entry);
    let status = if existed { StatusCode::OK } else { StatusCode(201) };
    Response::json(status, serde_json::to_vec(&shown(&spec, K::FIELD, key)).expect("json"))
}

/// `DELETE`: 404 unless the entry is in force; removed from the store, then out of force.
fn delete<K: PolicyKind>(shared: &Shared, key: &str) -> Response {
    let g = &shared.governance;
    if let Some(why) = K::locked(g, key) {
        return problem(StatusCode::CONFLICT, &why);
    }
    let snap = g.snapshot();
    if !K::exists(&snap, key) {
        return problem(StatusCode::NOT_FOUND, &format!("no {} {key}", K::WHAT));
    }
    if let Err(e) = meta::delete_policy(&shared.db, K::STORED, key) {
        return storage_problem(&e);
    }
    K::unset(g, &snap, key);
    let mut v = serde_json::json!({"removed": true});
    v[K::FIELD] = key.into();
    Response::json(StatusCode::OK, v.to_string())
}

/// `/admin/acl`: the ACL's rules in decision order, each with `source` (`config` or `api`); the
/// config file's rules cannot be replaced or removed here (409).
struct AclRules;

impl PolicyKind for AclRules {
    const SEGMENT: &'static str = "acl";
    const STORED: Policy = Policy::Acl;
    const FIELD: &'static str = "id";
    const WHAT: &'static str = "acl rule";
    const EXPECTED: &'static str = r#"{"principal", "resource", "actions", "effect", "priority"}"#;
    type Spec = RuleSpec;
    type InForce = Rule;

    fn entries(g: &Governance, snap: &Snapshot) -> Vec<serde_json::Value> {
        let all = snap.acl.rules().iter().map(|r| {
            let mut v = shown(&r.spec, "id", &r.id);
            v["source"] = if g.is_config_rule(&r.id) { "config" } else { "api" }.into();
            v
        });
        all.collect()
    }
    fn exists(snap: &Snapshot, id: &str) -> bool {
        snap.acl.rules().iter().any(|r| r.id == id)
    }
    fn build(_: &Snapshot, id: &str, spec: RuleSpec) -> Result<Rule, String> {
        Rule::new(id, spec)
    }
    fn locked(g: &Governance, id: &str) -> Option<String> {
        g.is_config_rule(id).then(|| format!("acl rule {id} comes from the config file"))
    }
    fn set(g: &Governance, id: &str, rule: Rule) {
        g.set_rule(id, Some(rule))
    }
    fn unset(g: &Governance, _: &Snapshot, id: &str) {
        g.set_rule(id, None)
    }
}

/// `/admin/limits`: the rate limits, by id.
struct Limits;

impl PolicyKind for Limits {
    const SEGMENT: &'static str = "limits";
    const STORED: Policy = Policy::Limit;
    const FIELD: &'static str = "id";
    const WHAT: &'static str = "limit";
    const EXPECTED: &'static str = r#"{"scope", "eventsPerSecond", "bytesPerSecond", "burst"}"#;
    type Spec = LimitSpec;
    type InForce = Limit;

    fn entries(_: &Governance, snap: &Snapshot) -> Vec<serde_json::Value> {
        snap.limits.all().iter().map(|l| shown(&l.spec, "id", &l.id)).collect()
    }
    fn exists(snap: &Snapshot, id: &str) -> bool {
        snap.limits.all().iter().any(|l| l.id == id)
    }
    fn build(_: &Snapshot, id: &str, spec: LimitSpec) -> Result<Limit, String> {
        Limit::new(id, spec)
    }
    fn set(g: &Governance, id: &str, limit: Limit) {
        g.set_limit(id, Some(limit))
    }
    fn unset(g: &Governance, _: &Snapshot, id: &str) {
        g.set_limit(id, None)
    }
}

/// `/admin/quotas`: each tenant's quotas, by tenant (in force at once).
struct Quotas;

impl PolicyKind for Quotas {
    const SEGMENT: &'static str = "quotas";
    const STORED: Policy = Policy::Quota;
    const FIELD: &'static str = "tenant";
    const WHAT: &'static str = "quotas for tenant";
    const EXPECTED: &'static str = r#"{"connections", "topics", "subscriptions", "backlogBytes"}"#;
    type Spec = Quota;
    type InForce = Quota;

    fn entries(_: &Governance, snap: &Snapshot) -> Vec<serde_json::Value> {
        let mut all: Vec<_> = snap.quotas.iter().collect();
        all.sort_by_key(|(t, _)| t.as_str());
        all.into_iter().map(|(t, q)| shown(q, "tenant", t)).collect()
    }
    fn exists(snap: &Snapshot, tenant: &str) -> bool {
        snap.quotas.contains_key(tenant)
    }
    fn check_key(tenant: &str) -> Result<(), String> {
        if valid_tenant(tenant) {
            Ok(())
        } else {
            Err(TENANT_RULE.to_owned())
        }
    }
    fn build(_: &Snapshot, _: &str, quota: Quota) -> Result<Quota, String> {
        Ok(quota)
    }
    fn set(g: &Governance, tenant: &str, quota: Quota) {
        g.set_quota(tenant, Some(quota))
    }
    fn unset(g: &Governance, _: &Snapshot, tenant: &str) {
        g.set_quota(tenant, None)
    }
}

/// `/admin/transformers`: each topic's transformer, by topic (in force on every shard for the
/// next publish).
struct Transformers;

impl PolicyKind for Transformers {
    const SEGMENT: &'static str = "transformers";
    const STORED: Policy = Policy::Transformer;
    const FIELD: &'static str = "topic";
    const WHAT: &'static str = "transformer for topic";
    const EXPECTED: &'static str = r#"{"set", "remove", "rename", "variables", "data"}"#;
    type Spec = TransformSpec;
    type InForce = Transformer;

    fn entries(_: &Governance, snap: &Snapshot) -> Vec<serde_json::Value> {
        let mut all: Vec<_> = snap.transformers.values().collect();
        all.sort_by_key(|t| t.topic.as_str());
        all.into_iter().map(|t| shown(&t.spec, "topic", &t.topic)).collect()
    }
    fn exists(snap: &Snapshot, topic: &str) -> bool {
        snap.transformers.contains_key(topic)
    }
    fn check_key(topic: &str) -> Result<(), String> {
        if !valid_topic(topic) {
            return Err("topic names are [A-Za-z0-9._-]{1,249}".to_owned());
        }
        if is_lite(topic) {
            return Err("lite topics (agent.*, client.*, session.*) have no transformers".to_owned());
        }
        Ok(())
    }
    fn build(_: &Snapshot, topic: &str, spec: TransformSpec) -> Result<Transformer, String> {
        Transformer::new(topic, spec)
    }
    fn set(g: &Governance, topic: &str, t: Transformer) {
        g.set_transformer(topic, Some(t))
    }
    fn unset(g: &Governance, _: &Snapshot, topic: &str) {
        g.set_transformer(topic, None)
    }
}

/// `/admin/routes`: the routes, by id. A route that is malformed, or would loop (or fan out too
/// far) with the routes in force, is refused (400); what is put in force is the whole router.
struct Routes;

impl PolicyKind for Routes {
    const SEGMENT: &'static str = "routes";
    const STORED: Policy = Policy::Route;
    const FIELD: &'static str = "id";
    const WHAT: &'static str = "route";
    const EXPECTED: &'static str = r#"{"topic", "condition", "targets", "mode": "copy" | "move"}"#;
    type Spec = RouteSpec;
    type InForce = Router;

    fn entries(_: &Governance, snap: &Snapshot) -> Vec<serde_json::Value> {
        snap.router.all().iter().map(|r| shown(&r.spec, "id", &r.id)).collect()
    }
    fn exists(snap: &Snapshot, id: &str) -> bool {
        snap.router.all().iter().any(|r| r.id == id)
    }
    fn check_key(id: &str) -> Result<(), String> {
        if id.is_empty() || id.len() > 128 {
            return Err("route ids are 1 to 128 characters".to_owned());
        }
        Ok(())
    }
    fn build(snap: &Snapshot, id: &str, spec: RouteSpec) -> Result<Router, String> {
        if let Some(t) = std::iter::once(&spec.topic).chain(&spec.targets).find(|t| !valid_topic(t)) {
            return Err(format!("{t:?}: topic names are [A-Za-z0-9._-]{{1,249}}"));
        }
        if let Some(t) = std::iter::once(&spec.topic).chain(&spec.targets).find(|t| is_lite(t)) {
            return Err(format!("{t:?} is a lite topic: routes neither start nor end there"));
        }
        Route::new(id, spec).and_then(|r| snap.router.with(id, Some(r)))
    }
    fn set(g: &Governance, _: &str, router: Router) {
        g.set_router(router)
    }
    fn unset(g: &Governance, snap: &Snapshot, id: &str) {
        g.set_router(snap.router.with(id, None).expect("removing a route cannot add a loop"))
    }
}
