//! Rate limits: token buckets of events per second and bytes per second, per principal, per
//! tenant and per topic, shared by every shard.
//!
//! Each bucket is one atomic "theoretical arrival time" (the generic cell rate algorithm): a
//! request of cost `c` moves it to `max(tat, now) + c * interval` and is allowed if that is at
//! most `burst * interval` ahead of now. No lock, no refill task; a request that is refused
//! learns exactly when it would fit (`Retry-After`). Only limited scopes pay anything: with no
//! limit for a principal, tenant or topic, checking costs three failed map lookups (none at all
//! when no limit exists).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A limit as written (`PUT /admin/limits/{id}`), kept to be listed back exactly.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LimitSpec {
    /// `principal:P`, `tenant:T` or `topic:T` (a topic's stored name: `tenant.name` in a tenant).
    pub scope: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub events_per_second: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_per_second: Option<u64>,
    /// Events the bucket holds (default: one second's worth); with only `bytesPerSecond`, the
    /// bytes it holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u64>,
}

/// A tenant's quotas (`PUT /admin/quotas/{tenant}`); a missing one is not limited.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Quota {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connections: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topics: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subscriptions: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backlog_bytes: Option<u64>,
}

/// One token bucket.
#[derive(Debug)]
pub struct Bucket {
    /// Nanoseconds one unit (an event, a byte) takes at the rate.
    interval_ns: f64,
    /// The units it holds.
    capacity: u64,
    /// The theoretical arrival time, ns since the process's epoch.
    tat: AtomicU64,
}

impl Bucket {
    fn new(per_second: u64, capacity: u64) -> Bucket {
        Bucket { interval_ns: 1e9 / per_second as f64, capacity: capacity.max(1), tat: AtomicU64::new(0) }
    }

    fn cost_ns(&self, units: u64) -> u64 {
        (units as f64 * self.interval_ns) as u64
    }

    /// Takes `units` at `now_ns`, or says how long until they would fit. A request larger
    /// than the bucket (a big batch) passes only when the bucket is full, and is charged in
    /// full: what follows waits until the rate has paid for it.
    fn take(&self, units: u64, now_ns: u64) -> Result<(), Duration> {
        let inc = self.cost_ns(units);
        let tolerance = (self.capacity as f64 * self.interval_ns) as u64;
        let mut tat = self.tat.load(Ordering::Relaxed);
        loop {
            let next = tat.max(now_ns) + inc;
            if inc > tolerance && tat > now_ns {
                return Err(Duration::from_nanos(tat - now_ns));
            }
            if inc <= tolerance && next - now_ns > tolerance {
                return Err(Duration::from_nanos(next - now_ns - tolerance));
            }
            match self.tat.compare_exchange_weak(tat, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return Ok(()),
                Err(t) => tat = t,
            }
        }
    }

    /// Gives back what [`Bucket::take`] took for a request another bucket then refused.
    fn give_back(&self, units: u64) {
        let inc = self.cost_ns(units);
        let _ = self.tat.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| Some(t.saturating_sub(inc)));
    }
}

/// A checked limit and its buckets.
#[derive(Debug)]
pub struct Limit {
    pub id: String,
    pub spec: LimitSpec,
    events: Option<Bucket>,
    bytes: Option<Bucket>,
}

/// What a scope names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scope {
    Principal,
    Tenant,
    Topic,
}

fn parse_scope(scope: &str) -> Result<(Scope, &str), String> {
    let (kind, name) = scope.split_once(':').ok_or("scope must be principal:P, tenant:T or topic:T")?;
    let kind = match kind {
        "principal" if !name.is_empty() && name.len() <= 256 => Scope::Principal,
        "tenant" if super::identity::valid_tenant(name) => Scope::Tenant,
        "topic" if crate::model::valid_topic(name) => Scope::Topic,
        "principal" | "tenant" | "topic" => return Err(format!("{scope:?} does not name a valid {kind}")),
        _ => return Err("scope must be principal:P, tenant:T or topic:T".into()),
    };
    Ok((kind, name))
}

impl Limit {
    pub fn new(id: &str, spec: LimitSpec) -> Result<Limit, String> {
        if !super::acl::valid_id(id) {
            return Err("limit ids are [A-Za-z0-9._:-]{1,128}".into());
        }
        parse_scope(&spec.scope)?;
        let positive = |v: Option<u64>, name: &str| match v {
            Some(0) => Err(format!("{name} must be at least 1")),
            _ => Ok(()),
        };
        positive(spec.events_per_second, "eventsPerSecond")?;
        positive(spec.bytes_per_second, "bytesPerSecond")?;
        positive(spec.burst, "burst")?;
        if spec.events_per_second.is_none() && spec.bytes_per_second.is_none() {
            return Err("a limit needs eventsPerSecond, bytesPerSecond or both".into());
        }
        let events = spec.events_per_second.map(|r| Bucket::new(r, spec.burst.unwrap_or(r)));
        let bytes_capacity = |r: u64| if events.is_none() { spec.burst.unwrap_or(r) } else { r };
        let bytes = spec.bytes_per_second.map(|r| Bucket::new(r, bytes_capacity(r)));
        Ok(Limit { id: id.to_owned(), spec, events, bytes })
    }

    /// Takes `events` and `bytes` from both buckets, or neither.
    fn take(&self, events: u64, bytes: u64, now_ns: u64) -> Result<(), Duration> {
        if let Some(b) = &self.events {
            b.take(events, now_ns)?;
        }
        if let Some(b) = &self.bytes {
            if let Err(wait) = b.take(bytes, now_ns) {
                if let Some(e) = &self.events {
                    e.give_back(events);
                }
                return Err(wait);
            }
        }
        Ok(())
    }
}

/// Every limit in force, by what it limits.
#[derive(Debug, Default)]
pub struct Limits {
    all: Vec<Arc<Limit>>,
    principals: HashMap<String, Vec<Arc<Limit>>>,
    tenants: HashMap<String, Vec<Arc<Limit>>>,
    topics: HashMap<String, Vec<Arc<Limit>>>,
}

/// A request over a limit: which one, and when to retry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limited {
    pub id: String,
    pub scope: String,
    pub retry_after: Duration,
}

impl Limits {
    pub fn new(limits: Vec<Arc<Limit>>) -> Limits {
        let mut out = Limits::default();
        for l in &limits {
            let (kind, name) = parse_scope(&l.spec.scope).expect("checked by Limit::new");
            let map = match kind {
                Scope::Principal => &mut out.principals,
                Scope::Tenant => &mut out.tenants,
                Scope::Topic => &mut out.topics,
            };
            map.entry(name.to_owned()).or_default().push(l.clone());
        }
        out.all = limits;
        out.all.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }

    pub fn all(&self) -> &[Arc<Limit>] {
        &self.all
    }

    pub fn is_empty(&self) -> bool {
        self.all.is_empty()
    }

    /// Takes a request of `events` events and `bytes` bytes from every limit that applies to
    /// it, or from none of them.
    pub fn take(
        &self,
        principal: &str,
        tenant: Option<&str>,
        topic: &str,
        events: u64,
        bytes: u64,
        now_ns: u64,
    ) -> Result<(), Limited> {
        if self.all.is_empty() {
            return Ok(());
        }
        let applying = || {
            self.principals
                .get(principal)
                .into_iter()
                .chain(tenant.and_then(|t| self.tenants.get(t)))
                .chain(self.topics.get(topic))
                .flatten()
        };
        for (k, l) in applying().enumerate() {
            if let Err(retry_after) = l.take(events, bytes, now_ns) {
                // Give back what the limits before this one took (no allocation per request).
                for t in applying().take(k) {
                    t.events.iter().for_each(|b| b.give_back(events));
                    t.bytes.iter().for_each(|b| b.give_back(bytes));
                }
                return Err(Limited { id: l.id.clone(), scope: l.spec.scope.clone(), retry_after });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(scope: &str, eps: Option<u64>, bps: Option<u64>, burst: Option<u64>) -> Arc<Limit> {
        let spec = LimitSpec { scope: scope.into(), events_per_second: eps, bytes_per_second: bps, burst };
        Arc::new(Limit::new("l", spec).unwrap())
    }

    const S: u64 = 1_000_000_000;

    #[test]
    fn a_bucket_allows_its_burst_then_its_rate() {
        let ls = Limits::new(vec![limit("principal:p", Some(10), None, Some(5))]);
        let t0 = 100 * S;
        for _ in 0..5 {
            ls.take("p", None, "t", 1, 0, t0).unwrap();
        }
        let e = ls.take("p", None, "t", 1, 0, t0).unwrap_err();
        assert_eq!(e.retry_after, Duration::from_millis(100), "one event per 100 ms");
        ls.take("p", None, "t", 1, 0, t0 + S / 10).unwrap();
        assert!(ls.take("p", None, "t", 1, 0, t0 + S / 10).is_err());
        // Others are not limited.
        ls.take("q", None, "t", 1000, 0, t0).unwrap();
    }

    #[test]
    fn bytes_and_events_are_taken_together_or_not_at_all() {
        let ls = Limits::new(vec![limit("tenant:acme", Some(100), Some(1000), None)]);
        let t0 = 100 * S;
        ls.take("p", Some("acme"), "t", 1, 1000, t0).unwrap();
        // The bytes bucket is empty: refused, and the event is given back.
        assert!(ls.take("p", Some("acme"), "t", 1, 10, t0).is_err());
        for _ in 0..99 {
            ls.take("p", Some("acme"), "t", 1, 0, t0).unwrap();
        }
        assert!(ls.take("p", Some("acme"), "t", 1, 0, t0).is_err(), "100 events: the burst");
    }

    #[test]
    fn every_applying_limit_must_allow() {
        let ls =
            Limits::new(vec![limit("topic:hot", Some(1), None, None), limit("principal:p", Some(100), None, None)]);
        let t0 = 100 * S;
        ls.take("p", None, "hot", 1, 0, t0).unwrap();
        let e = ls.take("p", None, "hot", 1, 0, t0).unwrap_err();
        assert_eq!(e.scope, "topic:hot");
        // The principal's bucket got its event back: 99 more to another topic.
        for _ in 0..99 {
            ls.take("p", None, "cold", 1, 0, t0).unwrap();
        }
        assert!(ls.take("p", None, "cold", 1, 0, t0).is_err());
    }

    #[test]
    fn a_request_larger_than_the_bucket_passes_when_it_is_full_and_is_paid_for() {
        let ls = Limits::new(vec![limit("principal:p", Some(10), None, None)]);
        let t0 = 100 * S;
        // A batch of 50 against a bucket of 10: it passes, then five seconds are owed.
        ls.take("p", None, "t", 50, 0, t0).unwrap();
        let e = ls.take("p", None, "t", 1, 0, t0 + S).unwrap_err();
        assert_eq!(e.retry_after, Duration::from_millis(3100));
        assert!(ls.take("p", None, "t", 50, 0, t0 + 4 * S).is_err(), "the next big one waits too");
        ls.take("p", None, "t", 50, 0, t0 + 5 * S).unwrap();
    }

    #[test]
    fn bad_limits_are_named() {
        let err = |scope: &str, eps, bps, burst| {
            let spec = LimitSpec { scope: scope.into(), events_per_second: eps, bytes_per_second: bps, burst };
            Limit::new("x", spec).unwrap_err()
        };
        assert!(err("user:p", Some(1), None, None).contains("scope"));
        assert!(err("tenant:a.b", Some(1), None, None).contains("tenant"));
        assert!(err("topic:", Some(1), None, None).contains("topic"));
        assert!(err("principal:p", None, None, None).contains("needs"));
        assert!(err("principal:p", Some(0), None, None).contains("eventsPerSecond"));
    }
}
