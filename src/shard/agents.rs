//! Agents of agent streaming calls (Mode 1), as they registered: process-wide, so a session
//! opened on any shard can pick one. An agent is routed to only while it is registered, says it
//! is ready, and heart-beats (within `agent_heartbeat_timeout_ms`). A mutex: registrations and
//! heartbeats are per agent every few seconds, not per event.

use std::collections::HashMap;
use std::sync::Mutex;

/// The registry's id of agent `agent` of `tenant`: `<tenant>/<agent>` (a slash is in neither
/// a tenant's name nor an agent id, so no two tenants' ids meet), or the id itself.
pub fn stored_id(tenant: Option<&str>, agent: &str) -> String {
    match tenant {
        Some(t) => format!("{t}/{agent}"),
        None => agent.to_owned(),
    }
}

/// One registered agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Agent {
    pub ready: bool,
    /// Its last registration or heartbeat, ms since the epoch.
    pub beat_ms: u64,
    /// Its principal's tenant (sessions of a tenant are routed to its agents only).
    pub tenant: Option<std::sync::Arc<str>>,
}

impl Agent {
    /// Whether sessions may be routed to it at `now_ms`.
    pub fn routable(&self, now_ms: u64, timeout_ms: u64) -> bool {
        self.ready && now_ms.saturating_sub(self.beat_ms) <= timeout_ms
    }
}

/// Why a registration was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full;

/// The registered agents, by stored (tenant-scoped) id.
pub struct Agents {
    map: Mutex<HashMap<String, Agent>>,
    max: usize,
    /// Agents silent for this long are forgotten (ten heartbeat timeouts).
    forget_ms: u64,
}

impl Agents {
    pub fn new(max: usize, timeout_ms: u64) -> Agents {
        Agents { map: Mutex::new(HashMap::new()), max, forget_ms: timeout_ms.saturating_mul(10) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Agent>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers (or registers again) `id`; `Ok(true)` when it is new. Agents silent past
    /// the forget time are dropped first; `Err(Full)` at `max_agents`.
    pub fn register(&self, id: &str, tenant: Option<&str>, ready: bool, now_ms: u64) -> Result<bool, Full> {
        let mut map = self.lock();
        if let Some(a) = map.get_mut(id) {
            a.ready = ready;
            a.beat_ms = now_ms;
            return Ok(false);
        }
        if map.len() >= self.max {
            let forget = self.forget_ms;
            map.retain(|_, a| now_ms.saturating_sub(a.beat_ms) <= forget);
            if map.len() >= self.max {
                return Err(Full);
            }
        }
        map.insert(id.to_owned(), Agent { ready, beat_ms: now_ms, tenant: tenant.map(Into::into) });
        Ok(true)
    }

    /// A heartbeat of `id` (with its readiness, if it says): the agent as it is now, `None` for
    /// an agent not registered (or forgotten).
    pub fn heartbeat(&self, id: &str, ready: Option<bool>, now_ms: u64) -> Option<Agent> {
        let mut map = self.lock();
        let a = map.get_mut(id)?;
        a.beat_ms = now_ms;
        if let Some(r) = ready {
            a.ready = r;
        }
        Some(a.clone())
    }

    /// Whether `id` (stored) is routed to at `now_ms`.
    pub fn routable(&self, id: &str, now_ms: u64, timeout_ms: u64) -> bool {
        self.lock().get(id).is_some_and(|a| a.routable(now_ms, timeout_ms))
    }

    /// The routable agent of `tenant` that `usable` accepts with the least `load` (ties: the
    /// first by id), as its stored id.
    pub fn pick(
        &self,
        tenant: Option<&str>,
        (now_ms, timeout_ms): (u64, u64),
        mut usable: impl FnMut(&str) -> bool,
        load: impl Fn(&str) -> usize,
    ) -> Option<String> {
        // The registry's lock only to list them: `usable` asks the ACL, `load` another lock.
        let mut candidates: Vec<String> = self
            .lock()
            .iter()
            .filter(|(_, a)| a.tenant.as_deref() == tenant && a.routable(now_ms, timeout_ms))
            .map(|(id, _)| id.clone())
            .collect();
        candidates.sort();
        candidates.retain(|id| usable(id));
        candidates.into_iter().min_by_key(|id| load(id))
    }

    /// Whether `id` (stored) is registered and was heard from within `within_ms` of `now_ms`.
    pub fn heard(&self, id: &str, now_ms: u64, within_ms: u64) -> bool {
        self.lock().get(id).is_some_and(|a| now_ms.saturating_sub(a.beat_ms) <= within_ms)
    }

    pub fn deregister(&self, id: &str) -> bool {
        self.lock().remove(id).is_some()
    }

    /// Every agent (stored id, state), sorted by id.
    pub fn list(&self) -> Vec<(String, Agent)> {
        let mut all: Vec<(String, Agent)> = self.lock().iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routable_only_while_ready_and_fresh_and_bounded() {
        let agents = Agents::new(2, 1000);
        assert_eq!(agents.register("a", None, true, 0), Ok(true));
        assert_eq!(agents.register("a", None, true, 10), Ok(false));
        let a = agents.heartbeat("a", None, 500).unwrap();
        assert!(a.routable(1500, 1000) && !a.routable(1501, 1000));
        assert!(!agents.heartbeat("a", Some(false), 600).unwrap().routable(600, 1000));
        assert_eq!(agents.heartbeat("b", None, 600), None);
        assert_eq!(agents.register("b", None, true, 600), Ok(true));
        assert_eq!(agents.register("c", None, true, 700), Err(Full));
        // Once silent for ten timeouts, an agent makes room.
        assert_eq!(agents.register("c", None, true, 600 + 10_001), Ok(true));
        assert!(agents.deregister("c") && !agents.deregister("c"));
        // A session goes to the least loaded routable agent of its tenant.
        let agents = Agents::new(10, 1000);
        for (id, tenant) in [("x", None), ("y", None), ("t/z", Some("t"))] {
            agents.register(id, tenant, true, 0).unwrap();
        }
        let load = |id: &str| usize::from(id == "x");
        assert_eq!(agents.pick(None, (0, 1000), |_| true, load).as_deref(), Some("y"));
        assert_eq!(agents.pick(None, (0, 1000), |id| id != "y", load).as_deref(), Some("x"));
        assert_eq!(agents.pick(Some("t"), (0, 1000), |_| true, load).as_deref(), Some("t/z"));
        assert_eq!(agents.pick(None, (5000, 1000), |_| true, load), None);
    }
}
