//! The session registry: every open session by its stored key ([`Calls`]), how many each
//! agent has, and a session's life (opened, touched, closed, expired, its agent gone). What
//! happens within a session, its turns and their chunks, is `turn.rs`'s half of [`Calls`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::read::End;
use super::session::{lock, Call, State};

#[derive(Default)]
struct Table {
    map: HashMap<String, Arc<Call>>,
    /// Open sessions per stored agent id (an agent is picked by fewest).
    per_agent: HashMap<String, usize>,
}

/// Every open session, by stored (tenant-scoped) session id.
pub struct Calls {
    table: Mutex<Table>,
    max: usize,
    /// Frame bytes held by every turn log.
    pub(super) held: Arc<AtomicUsize>,
    pub chunks: AtomicU64,
    pub dropped: AtomicU64,
    pub expired: AtomicU64,
}

/// Why a session was not opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full;

impl Calls {
    pub fn new(max: usize) -> Calls {
        Calls {
            table: Mutex::default(),
            max,
            held: Arc::default(),
            chunks: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            expired: AtomicU64::new(0),
        }
    }

    /// Open sessions.
    pub fn len(&self) -> usize {
        lock(&self.table).map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Open sessions of `agent` (stored id).
    pub fn sessions_of(&self, agent: &str) -> usize {
        lock(&self.table).per_agent.get(agent).copied().unwrap_or(0)
    }

    /// Opens session `sid` of `agent` (stored id) under `key` (its stored id); `Err(Full)` at
    /// `max_sessions`.
    pub fn open(
        &self,
        key: String,
        (agent, sid): (String, String),
        principal: Option<String>,
        now_ms: u64,
    ) -> Result<Arc<Call>, Full> {
        let mut t = lock(&self.table);
        if t.map.len() >= self.max {
            return Err(Full);
        }
        *t.per_agent.entry(agent.clone()).or_default() += 1;
        let state = Mutex::new(State::default());
        let last_ms = AtomicU64::new(now_ms);
        let call = Arc::new(Call { agent, principal, sid, state, last_ms, held: self.held.clone() });
        t.map.insert(key, call.clone());
        Ok(call)
    }

    pub fn get(&self, key: &str) -> Option<Arc<Call>> {
        lock(&self.table).map.get(key).cloned()
    }

    fn remove(&self, key: &str) -> Option<Arc<Call>> {
        let mut t = lock(&self.table);
        let call = t.map.remove(key)?;
        if let Some(n) = t.per_agent.get_mut(&call.agent) {
            *n -= 1;
            if *n == 0 {
                t.per_agent.remove(&call.agent);
            }
        }
        Some(call)
    }

    /// Marks `call` used now (idle sessions expire).
    pub fn touch(&self, call: &Call, now_ms: u64) {
        call.last_ms.store(now_ms, Ordering::Relaxed);
    }

    /// Closes session `key`: ends its turn. The session, if it was open (its log goes with
    /// the last reader).
    pub fn close(&self, key: &str, why: End, now_ms: u64) -> Option<Arc<Call>> {
        let call = self.remove(key)?;
        // Counted before the turn's end is seen (a client that read it reads the count too).
        if why == End::Expired {
            self.expired.fetch_add(1, Ordering::Relaxed);
        }
        let mut s = lock(&call.state);
        self.end_locked(&call, &mut s, why, now_ms);
        s.closed = true;
        drop(s);
        Some(call)
    }

    /// Closes the sessions idle for `ttl_ms` (nothing streamed, sent or asked). Returns them
    /// (stored id, session).
    pub fn expire(&self, now_ms: u64, ttl_ms: u64) -> Vec<(String, Arc<Call>)> {
        // Under the table's lock (every core's chunks and streams take it) only atomic loads,
        // and only the idle sessions' keys copied.
        let idle = |c: &Arc<Call>| now_ms.saturating_sub(c.last_ms.load(Ordering::Relaxed)) > ttl_ms;
        let keys: Vec<String> = lock(&self.table).map.iter().filter(|(_, c)| idle(c)).map(|(k, _)| k.clone()).collect();
        keys.into_iter().filter_map(|k| self.close(&k, End::Expired, now_ms).map(|c| (k, c))).collect()
    }

    /// `agent` (stored id) closed its attachment `gen`: each turn in progress routed to it ends
    /// with an error.
    pub fn agent_gone(&self, agent: &str, gen: u64, now_ms: u64) -> usize {
        let calls: Vec<Arc<Call>> = lock(&self.table).map.values().filter(|c| c.agent == agent).cloned().collect();
        calls
            .iter()
            .filter(|c| {
                let mut s = lock(&c.state);
                s.routed == gen && self.end_locked(c, &mut s, End::AgentGone, now_ms)
            })
            .count()
    }

    /// Bytes every turn log holds now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }
}
