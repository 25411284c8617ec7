//! Ingress governance: who a request comes from (`identity`), what it may do (`acl`), and the
//! record of refusals and admin changes (`audit`).
//!
//! One [`Governance`] per process, in `Shared`. What can change while the broker runs (the
//! token or JWKS file, the ACL) lives in an immutable [`Snapshot`] swapped whole under a
//! generation counter: a shard's [`View`] compares one atomic per request and takes the new
//! snapshot only after a change, so reading the policy never contends across cores. Per
//! connection a [`Caller`] caches the last credential it verified and the last permission it
//! checked, so a keep-alive publisher pays for neither twice.

pub mod acl;
pub mod audit;
pub mod identity;
pub mod limits;
pub mod route;
pub mod transform;

use std::cell::RefCell;
use std::net::IpAddr;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use acl::{Acl, Action, Kind, Rule, RuleSpec};
use identity::{AuthError, Keys, Principal};
use limits::{Limit, LimitSpec, Limits, Quota};

/// `auth`: how callers prove who they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthMode {
    /// Nobody is asked; everything is allowed (only while both listeners are loopback).
    None,
    /// Static tokens (`auth_tokens_file`).
    Token,
    /// JSON Web Tokens verified with the keys of `jwt_jwks_file`.
    Jwt,
}

/// The validated governance keys of the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthConfig {
    pub mode: AuthMode,
    pub tokens_file: Option<PathBuf>,
    pub jwks_file: Option<PathBuf>,
    pub audience: Option<String>,
    pub issuer: Option<String>,
    pub leeway_ms: u64,
    pub admin_token: Option<String>,
    /// The config file's ACL rules, `(id, rule)`: read-only at run time.
    pub acl: Vec<(String, RuleSpec)>,
    pub audit_log: PathBuf,
    pub audit_max_per_second: u32,
    pub audit_max_bytes: u64,
}

/// The stored transformers (by topic) and routes (by id), as read at start.
pub type StoredPipeline = (Vec<(String, transform::TransformSpec)>, Vec<(String, route::RouteSpec)>);

/// What the policy is at one moment (cloned per shard: its parts are shared).
#[derive(Clone)]
pub struct Snapshot {
    pub generation: u64,
    pub keys: Arc<Keys>,
    pub acl: Arc<Acl>,
    pub limits: Arc<Limits>,
    /// Each tenant's quotas.
    pub quotas: Arc<std::collections::HashMap<String, Quota>>,
    /// The transformer of each topic that has one (by stored name).
    pub transformers: Arc<std::collections::HashMap<String, Arc<transform::Transformer>>>,
    pub router: Arc<route::Router>,
}

/// A file's identity and version, to notice a replacement or an edit.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp {
    modified: Option<std::time::SystemTime>,
    len: u64,
    inode: u64,
}

fn stamp(path: &PathBuf) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some(Stamp { modified: m.modified().ok(), len: m.len(), inode: m.ino() })
}

pub struct Governance {
    pub config: AuthConfig,
    admin_token: Option<[u8; 32]>,
    config_rules: Vec<Rule>,
    /// The admin API's rules, as stored.
    stored_rules: Mutex<Vec<Rule>>,
    /// Nanoseconds of the rate limits' clock count from here.
    epoch: Instant,
    current: RwLock<Arc<Snapshot>>,
    generation: AtomicU64,
    key_file: Mutex<Option<Stamp>>,
    /// Key files re-read after a change, and those that failed (the old keys stayed).
    pub key_reloads: AtomicU64,
    pub key_reloads_failed: AtomicU64,
    pub audit: audit::Audit,
    /// Per-tenant counters for the metrics, at most [`TENANT_SERIES`] tenants (then `_other`).
    tenants: Mutex<Vec<Arc<TenantStats>>>,
    /// Open connections per tenant, for tenants with a `connections` quota.
    connections: Mutex<std::collections::HashMap<String, Arc<std::sync::atomic::AtomicU64>>>,
    /// Unacknowledged bytes per tenant with a `backlogBytes` quota, as last measured.
    backlog: RwLock<Arc<std::collections::HashMap<String, u64>>>,
}

/// Tenants with series of their own in the metrics; the rest share `tenant="_other"`.
pub const TENANT_SERIES: usize = 64;

/// What the metrics count per tenant.
#[derive(Debug, Default)]
pub struct TenantStats {
    pub tenant: String,
    pub published: AtomicU64,
    /// Requests refused with 403 (denied), 429 (a rate limit or a quota).
    pub denied: AtomicU64,
    pub limited: AtomicU64,
}

/// One connection counted against its tenant's `connections` quota, until dropped.
#[derive(Debug)]
pub struct ConnSlot(Arc<std::sync::atomic::AtomicU64>);

impl Drop for ConnSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Governance {
    /// Loads the key file and builds the ACL from the config's rules and `stored` (the admin
    /// API's, from the metadata).
    pub fn new(
        config: AuthConfig,
        stored: Vec<(String, RuleSpec)>,
        stored_limits: Vec<(String, LimitSpec)>,
        stored_quotas: Vec<(String, Quota)>,
        stored_pipeline: StoredPipeline,
        audit: audit::Audit,
    ) -> Result<Governance, String> {
        let config_rules = config
            .acl
            .iter()
            .map(|(id, spec)| Rule::new(id, spec.clone()).map_err(|e| format!("acl rule {id}: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        // A stored rule that no longer parses (written by a newer version) is skipped, loudly.
        let stored: Vec<Rule> = stored
            .into_iter()
            .filter(|(id, _)| {
                let shadowed = config_rules.iter().any(|r| r.id == *id);
                if shadowed {
                    crate::log::warn(
                        "auth",
                        &format!("acl rule {id} is now defined in the config file; its stored copy is not used"),
                        &[],
                    );
                }
                !shadowed
            })
            .filter_map(|(id, spec)| match Rule::new(&id, spec) {
                Ok(r) => Some(r),
                Err(e) => {
                    crate::log::warn("auth", &format!("ignoring stored acl rule {id}: {e}"), &[]);
                    None
                }
            })
            .collect();
        let file = Governance::key_path(&config).cloned();
        let key_stamp = file.as_ref().and_then(stamp);
        let keys = Arc::new(Governance::load_keys(&config)?);
        let acl = Arc::new(Acl::new(config_rules.iter().chain(&stored).cloned().collect()));
        let admin_token = config.admin_token.as_deref().map(|t| identity::sha256(t.as_bytes()));
        let limits = stored_limits
            .into_iter()
            .filter_map(|(id, spec)| match Limit::new(&id, spec) {
                Ok(l) => Some(Arc::new(l)),
                Err(e) => {
                    crate::log::warn("auth", &format!("ignoring stored limit {id}: {e}"), &[]);
                    None
                }
            })
            .collect();
        let limits = Arc::new(Limits::new(limits));
        let (stored_transformers, stored_routes) = stored_pipeline;
        let transformers = stored_transformers
            .into_iter()
            .filter_map(|(topic, spec)| match transform::Transformer::new(&topic, spec) {
                Ok(t) => Some((topic, Arc::new(t))),
                Err(e) => {
                    crate::log::warn("auth", &format!("ignoring stored transformer of {topic}: {e}"), &[]);
                    None
                }
            })
            .collect();
        // Routes are checked as a set, one at a time: one that would now loop is left out.
        let mut router = route::Router::default();
        for (id, spec) in stored_routes {
            match route::Route::new(&id, spec).and_then(|r| router.with(&id, Some(r))) {
                Ok(next) => router = next,
                Err(e) => crate::log::warn("auth", &format!("ignoring stored route {id}: {e}"), &[]),
            }
        }
        Ok(Governance {
            config,
            admin_token,
            config_rules,
            stored_rules: Mutex::new(stored),
            epoch: Instant::now(),
            current: RwLock::new(Arc::new(Snapshot {
                generation: 1,
                keys,
                acl,
                limits,
                quotas: Arc::new(stored_quotas.into_iter().collect()),
                transformers: Arc::new(transformers),
                router: Arc::new(router),
            })),
            generation: AtomicU64::new(1),
            key_file: Mutex::new(key_stamp),
            key_reloads: AtomicU64::new(0),
            key_reloads_failed: AtomicU64::new(0),
            audit,
            tenants: Mutex::new(Vec::new()),
            connections: Mutex::new(std::collections::HashMap::new()),
            backlog: RwLock::new(Arc::default()),
        })
    }

    fn key_path(config: &AuthConfig) -> Option<&PathBuf> {
        match config.mode {
            AuthMode::None => None,
            AuthMode::Token => config.tokens_file.as_ref(),
            AuthMode::Jwt => config.jwks_file.as_ref(),
        }
    }

    fn load_keys(config: &AuthConfig) -> Result<Keys, String> {
        let read = |p: &PathBuf| std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()));
        match (config.mode, Governance::key_path(config)) {
            (AuthMode::None, _) => Ok(Keys::None),
            (AuthMode::Token, Some(p)) => Keys::parse_tokens(&read(p)?).map_err(|e| format!("{}: {e}", p.display())),
            (AuthMode::Jwt, Some(p)) => {
                Keys::parse_jwks(&read(p)?, config.audience.clone(), config.issuer.clone(), config.leeway_ms)
                    .map_err(|e| format!("{}: {e}", p.display()))
            }
            (_, None) => Err("auth needs its key file".into()),
        }
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.current.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Installs a snapshot built from the current one by `change`.
    fn publish(&self, change: impl FnOnce(&Snapshot) -> Snapshot) {
        let mut cur = self.current.write().unwrap_or_else(|e| e.into_inner());
        let mut next = change(&cur);
        next.generation = cur.generation + 1;
        let g = next.generation;
        *cur = Arc::new(next);
        self.generation.store(g, Ordering::Release);
    }

    /// Re-reads the key file if it changed since it was last read (rotation without a
    /// restart). A file that no longer parses keeps the old keys in force; the error says why.
    pub fn reload_keys_if_changed(&self) -> Result<bool, String> {
        let Some(path) = Governance::key_path(&self.config) else { return Ok(false) };
        let now = stamp(path);
        let mut seen = self.key_file.lock().unwrap_or_else(|e| e.into_inner());
        if *seen == now {
            return Ok(false);
        }
        *seen = now;
        let keys = match Governance::load_keys(&self.config) {
            Ok(k) => Arc::new(k),
            Err(e) => {
                self.key_reloads_failed.fetch_add(1, Ordering::Relaxed);
                return Err(e);
            }
        };
        self.publish(|cur| Snapshot { generation: 0, keys, ..cur.clone() });
        self.key_reloads.fetch_add(1, Ordering::Relaxed);
        Ok(true)
    }

    /// Whether `id` is one of the config file's rules (which the admin API cannot change).
    pub fn is_config_rule(&self, id: &str) -> bool {
        self.config_rules.iter().any(|r| r.id == id)
    }

    /// Replaces (`Some`) or removes (`None`) one of the admin API's rules in force.
    pub fn set_rule(&self, id: &str, rule: Option<Rule>) {
        let mut stored = self.stored_rules.lock().unwrap_or_else(|e| e.into_inner());
        stored.retain(|r| r.id != id);
        stored.extend(rule);
        let acl = Arc::new(Acl::new(self.config_rules.iter().chain(stored.iter()).cloned().collect()));
        self.publish(|cur| Snapshot { generation: 0, acl, ..cur.clone() });
    }

    /// Replaces (`Some`) or removes (`None`) one rate limit. The others keep their buckets (a
    /// limit that is replaced starts full).
    pub fn set_limit(&self, id: &str, limit: Option<Limit>) {
        self.publish(|cur| {
            let mut all: Vec<Arc<Limit>> = cur.limits.all().iter().filter(|l| l.id != id).cloned().collect();
            all.extend(limit.map(Arc::new));
            Snapshot { generation: 0, limits: Arc::new(Limits::new(all)), ..cur.clone() }
        });
    }

    /// Sets (`Some`) or removes (`None`) a tenant's quotas.
    pub fn set_quota(&self, tenant: &str, quota: Option<Quota>) {
        self.publish(|cur| {
            let mut quotas = (*cur.quotas).clone();
            match quota {
                Some(q) => quotas.insert(tenant.to_owned(), q),
                None => quotas.remove(tenant),
            };
            Snapshot { generation: 0, quotas: Arc::new(quotas), ..cur.clone() }
        });
    }

    /// Each tenant with a `backlogBytes` quota, and its backlog when last measured.
    pub fn backlog(&self) -> Arc<std::collections::HashMap<String, u64>> {
        self.backlog.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Puts a new measure of the backlogs in force (`runtime`'s measuring thread).
    pub fn set_backlog(&self, measured: Vec<(String, u64)>) {
        *self.backlog.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(measured.into_iter().collect());
    }

    /// Sets (`Some`) or removes (`None`) the transformer of `topic`.
    pub fn set_transformer(&self, topic: &str, t: Option<transform::Transformer>) {
        self.publish(|cur| {
            let mut all = (*cur.transformers).clone();
            match t {
                Some(t) => all.insert(topic.to_owned(), Arc::new(t)),
                None => all.remove(topic),
            };
            Snapshot { generation: 0, transformers: Arc::new(all), ..cur.clone() }
        });
    }

    /// Puts in force the router [`route::Router::with`] made from the one in force (the admin
    /// thread checks, stores, then sets: nothing else changes routes in between).
    pub fn set_router(&self, router: route::Router) {
        let router = Arc::new(router);
        self.publish(|cur| Snapshot { generation: 0, router, ..cur.clone() });
    }

    /// The metrics' counters of `tenant` (once per connection: the caller keeps them).
    pub fn tenant_stats(&self, tenant: &str) -> Arc<TenantStats> {
        let mut all = self.tenants.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = all.iter().find(|t| t.tenant == tenant) {
            return t.clone();
        }
        let name = if all.len() < TENANT_SERIES { tenant } else { "_other" };
        if let Some(t) = all.iter().find(|t| t.tenant == name) {
            return t.clone();
        }
        let t = Arc::new(TenantStats { tenant: name.to_owned(), ..TenantStats::default() });
        all.push(t.clone());
        t
    }

    /// Every tenant's counters, for the metrics.
    pub fn tenants(&self) -> Vec<Arc<TenantStats>> {
        self.tenants.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Counts a connection of `tenant` against its `connections` quota: `None` when the tenant
    /// has that many already.
    pub fn connect_tenant(&self, tenant: &str, max: u64) -> Option<ConnSlot> {
        let count =
            self.connections.lock().unwrap_or_else(|e| e.into_inner()).entry(tenant.to_owned()).or_default().clone();
        count.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| (n < max).then_some(n + 1)).ok()?;
        Some(ConnSlot(count))
    }

    /// Open connections of each tenant with a `connections` quota.
    pub fn tenant_connections(&self) -> Vec<(String, u64)> {
        let all = self.connections.lock().unwrap_or_else(|e| e.into_inner());
        let mut v: Vec<(String, u64)> = all.iter().map(|(t, n)| (t.clone(), n.load(Ordering::Relaxed))).collect();
        v.sort();
        v
    }

    /// The rate limits' clock: nanoseconds since this process started.
    pub fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// Whether `token` is the admin token.
    pub fn is_admin_token(&self, token: &[u8]) -> bool {
        self.admin_token.is_some_and(|h| h == identity::sha256(token))
    }

    pub fn has_admin_token(&self) -> bool {
        self.admin_token.is_some()
    }

    /// Writes one record to the audit log.
    pub fn audit(
        &self,
        who: Option<&Principal>,
        action: &str,
        resource: &str,
        outcome: &str,
        detail: Option<String>,
        peer: Option<IpAddr>,
    ) {
        self.audit.record(audit::Record {
            time: crate::adaptor::rfc3339_from_micros(crate::model::clock::now_micros()),
            principal: who.map_or_else(|| "-".to_owned(), |p| p.name.clone()),
            tenant: who.and_then(|p| p.tenant.clone()),
            action: action.to_owned(),
            resource: resource.to_owned(),
            outcome: outcome.to_owned(),
            detail,
            peer: peer.map(|p| p.to_string()),
        });
    }
}

/// A shard's copy of the current snapshot.
pub struct View {
    local: RefCell<Rc<Snapshot>>,
}

impl View {
    pub fn new(g: &Governance) -> View {
        View { local: RefCell::new(Rc::new(Snapshot::clone(&g.snapshot()))) }
    }

    /// The snapshot in force: one atomic load, plus a lock only right after a change (the
    /// shard's own `Rc`, so no reference count is shared between cores per request).
    pub fn current(&self, g: &Governance) -> Rc<Snapshot> {
        if self.local.borrow().generation != g.generation() {
            *self.local.borrow_mut() = Rc::new(Snapshot::clone(&g.snapshot()));
        }
        self.local.borrow().clone()
    }
}

/// A shard's view of policy changes for its long-lived sessions: one ticker per shard
/// `observe`s the generation, and a session waits in [`Changes::after`] instead of polling on a
/// timer of its own (100,000 sessions would otherwise mean 100,000 timers a second).
#[derive(Default)]
pub struct Changes {
    seen: std::cell::Cell<u64>,
    /// Each waiting session's waker slot; a session that ends drops its slot.
    waiters: RefCell<Vec<std::rc::Weak<std::cell::Cell<Option<std::task::Waker>>>>>,
    /// Live slots after the last pruning: the list is pruned again at twice that (at least 512).
    live: std::cell::Cell<usize>,
}

impl Changes {
    /// The generation this shard has seen last.
    pub fn seen(&self) -> u64 {
        self.seen.get()
    }

    /// Records `generation`; wakes every waiter if it changed.
    pub fn observe(&self, generation: u64) {
        if generation != self.seen.get() {
            self.seen.set(generation);
            for w in std::mem::take(&mut *self.waiters.borrow_mut()) {
                if let Some(waker) = w.upgrade().and_then(|slot| slot.take()) {
                    waker.wake();
                }
            }
        }
    }

    /// Resolves once the shard has seen a generation other than `seen`.
    pub async fn after(&self, seen: u64) {
        let slot: Rc<std::cell::Cell<Option<std::task::Waker>>> = Rc::default();
        let mut listed = false;
        std::future::poll_fn(|cx| {
            if self.seen.get() != seen {
                return std::task::Poll::Ready(());
            }
            slot.set(Some(cx.waker().clone()));
            if !listed {
                listed = true;
                let mut waiters = self.waiters.borrow_mut();
                if waiters.len() >= self.live.get().max(256) * 2 {
                    waiters.retain(|w| w.strong_count() > 0);
                    self.live.set(waiters.len());
                }
                waiters.push(Rc::downgrade(&slot));
            }
            std::task::Poll::Pending
        })
        .await
    }

    #[cfg(test)]
    fn listed(&self) -> usize {
        self.waiters.borrow().len()
    }
}

/// The anonymous principal of `auth = none`.
pub fn anonymous() -> Rc<Principal> {
    thread_local! {
        static ANON: Rc<Principal> = Rc::new(Principal { name: "anonymous".into(), tenant: None, expires_us: None });
    }
    ANON.with(Rc::clone)
}

/// A permission decided once: under which generation, for whom, what.
type Grant = (u64, Rc<Principal>, Action, Kind, Box<str>);

/// One connection's caller: its address and what it proved and was allowed last. What a
/// connection that proves nothing (`auth = none`) never uses is boxed: every idle session
/// holds its caller (its publish messages go through it).
#[derive(Default)]
pub struct Caller {
    pub peer: Option<IpAddr>,
    /// Who the connection's client certificate names (mutual TLS): the principal of its
    /// requests that carry no bearer token.
    cert: Option<Rc<Principal>>,
    proven: Option<Box<Proven>>,
    tenant: Option<Box<TenantSide>>,
}

/// What a connection proved with a bearer token, and its last grant.
#[derive(Default)]
struct Proven {
    token: Vec<u8>,
    who: Option<(u64, Rc<Principal>)>,
    /// The last grant: generation, who (a connection may prove several principals: a
    /// certificate and bearer tokens), action, resource.
    allowed: Option<Grant>,
}

/// What a connection holds of its principal's tenant.
#[derive(Default)]
pub struct TenantSide {
    /// The metrics' counters of the tenant, by its name.
    pub stats: Option<(Box<str>, Arc<TenantStats>)>,
    /// This connection, counted against its tenant's `connections` quota.
    pub slot: Option<(String, ConnSlot)>,
}

impl Caller {
    pub fn new(peer: Option<IpAddr>, cert: Option<Principal>) -> Caller {
        Caller { peer, cert: cert.map(Rc::new), ..Caller::default() }
    }

    /// The metrics' counters of its principal's tenant, by its name.
    pub fn stats(&self) -> Option<&(Box<str>, Arc<TenantStats>)> {
        self.tenant.as_deref()?.stats.as_ref()
    }

    /// What it holds of its principal's tenant, to change.
    pub fn tenant_side(&mut self) -> &mut TenantSide {
        self.tenant.get_or_insert_default()
    }

    /// Lets go of its tenant's counters and connection slot.
    pub fn forget_tenant(&mut self) {
        self.tenant = None;
    }

    /// Whether `token` is the one this connection proved under the snapshot in force (no
    /// verification needed).
    pub fn verified(&self, snap: &Snapshot, token: Option<&[u8]>) -> bool {
        match token {
            Some(t) => matches!(self.proven.as_deref(),
                Some(Proven { who: Some((g, _)), token, .. }) if *g == snap.generation && token == t),
            None => {
                self.cert.as_ref().is_some_and(|c| c.expires_us.is_none_or(|e| crate::model::clock::now_micros() < e))
            }
        }
    }

    /// Who `token` proves at `now_us`, verified once per connection and token (again after the
    /// keys changed, or once it expired).
    pub fn authenticate(
        &mut self,
        snap: &Snapshot,
        token: Option<&[u8]>,
        now_us: impl Fn() -> i64,
    ) -> Result<Rc<Principal>, AuthError> {
        if matches!(*snap.keys, Keys::None) {
            return Ok(anonymous());
        }
        let Some(token) = token else {
            // A bearer token, when there is one, says who the caller is; else its certificate.
            return match &self.cert {
                Some(c) if c.expires_us.is_some_and(|e| now_us() >= e) => Err(AuthError::Expired),
                Some(c) => Ok(c.clone()),
                None => Err(AuthError::Missing),
            };
        };
        let proven = self.proven.get_or_insert_default();
        if let Some((g, who)) = &proven.who {
            if *g == snap.generation && proven.token == token {
                if who.expires_us.is_some_and(|e| now_us() >= e) {
                    return Err(AuthError::Expired);
                }
                return Ok(who.clone());
            }
        }
        proven.who = None;
        proven.allowed = None;
        let who = Rc::new(snap.keys.verify(token, now_us())?);
        proven.token.clear();
        proven.token.extend_from_slice(token);
        proven.who = Some((snap.generation, who.clone()));
        Ok(who)
    }

    /// Whether `who` may do `action` to `kind:name`: `Err` carries the deciding rule, if any.
    pub fn authorize(
        &mut self,
        snap: &Snapshot,
        who: &Rc<Principal>,
        action: Action,
        kind: Kind,
        name: &str,
    ) -> Result<(), Option<String>> {
        if matches!(*snap.keys, Keys::None) {
            return Ok(());
        }
        if let Some((g, p, a, k, n)) = self.proven.as_deref().and_then(|p| p.allowed.as_ref()) {
            if *g == snap.generation && Rc::ptr_eq(p, who) && *a == action && *k == kind && **n == *name {
                return Ok(());
            }
        }
        match snap.acl.decide(&who.name, kind, name, action) {
            (true, _) => {
                let grant = (snap.generation, who.clone(), action, kind, name.into());
                self.proven.get_or_insert_default().allowed = Some(grant);
                Ok(())
            }
            (false, rule) => Err(rule.map(str::to_owned)),
        }
    }
}

/// Failed authentications per source address, on one shard: past [`FAILURES`] within
/// [`FAILURE_WINDOW`], the address is answered 429 until the window ends (verification is the
/// costly part of a bad request; guessing must be slow).
#[derive(Default)]
pub struct Failures {
    by_peer: std::collections::HashMap<IpAddr, (u32, Instant)>,
}

pub const FAILURES: u32 = 20;
pub const FAILURE_WINDOW: Duration = Duration::from_secs(10);
/// Addresses tracked at most per shard; beyond, the oldest windows are forgotten.
const FAILURE_PEERS: usize = 16_384;

/// The address failures are counted under: IPv4 as it is, IPv6 by its /64 (one host usually
/// has a whole /64 to rotate through).
fn source(peer: IpAddr) -> IpAddr {
    match peer {
        IpAddr::V4(_) => peer,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(std::net::Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))),
        },
    }
}

impl Failures {
    /// `Some(seconds)` to wait if `peer` is throttled now.
    pub fn throttled(&self, peer: Option<IpAddr>, now: Instant) -> Option<u64> {
        let (n, since) = self.by_peer.get(&source(peer?))?;
        let left = FAILURE_WINDOW.saturating_sub(now.duration_since(*since));
        (*n >= FAILURES && !left.is_zero()).then(|| left.as_secs().max(1))
    }

    pub fn failed(&mut self, peer: Option<IpAddr>, now: Instant) {
        let Some(peer) = peer.map(source) else { return };
        if self.by_peer.len() >= FAILURE_PEERS && !self.by_peer.contains_key(&peer) {
            // Forget ended windows, then addresses not throttled, then (all throttled) half of
            // them: bounded memory, and a flood of new addresses does not free the throttled.
            self.by_peer.retain(|_, (_, since)| now.duration_since(*since) < FAILURE_WINDOW);
            if self.by_peer.len() >= FAILURE_PEERS {
                self.by_peer.retain(|_, (n, _)| *n >= FAILURES);
            }
            if self.by_peer.len() >= FAILURE_PEERS {
                let drop: Vec<IpAddr> = self.by_peer.keys().step_by(2).copied().collect();
                for k in drop {
                    self.by_peer.remove(&k);
                }
            }
        }
        let e = self.by_peer.entry(peer).or_insert((0, now));
        if now.duration_since(e.1) >= FAILURE_WINDOW {
            *e = (0, now);
        }
        e.0 += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::Changes;

    #[test]
    fn a_change_wakes_waiters_and_ended_ones_do_not_pile_up() {
        futures::executor::block_on(async {
            let c = Changes::default();
            c.observe(1);
            let mut waiting = Box::pin(c.after(1));
            assert!(futures::poll!(&mut waiting).is_pending());
            c.observe(1);
            assert!(futures::poll!(&mut waiting).is_pending(), "no change, no wake");
            // Sessions that come and go while nothing changes leave a bounded list behind.
            for _ in 0..10_000 {
                let mut ended = Box::pin(c.after(1));
                assert!(futures::poll!(&mut ended).is_pending());
            }
            assert!(c.listed() <= 512, "{} slots listed", c.listed());
            c.observe(2);
            assert!(futures::poll!(&mut waiting).is_ready());
            assert_eq!(c.listed(), 0);
        });
    }
}
