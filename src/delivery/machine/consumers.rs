//! The [`Machine`] itself, this shard's consumers, and their lives: a consumer created from
//! what was stored, sessions attaching, leaving and sending credit, a subscription removed.
//! Its other inputs are in `acks.rs`, `timers.rs` and `pump.rs`.

use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

use super::effect::{now_ms, persist, Effect, ACK_TIMEOUT};
use super::source::Source;
use super::state::{Consumer, Part, Parts, Sess};
use crate::config::MAX_WINDOW;
use crate::model::delivery::{ConsumerKey, SessionRef};
use crate::storage::offsets::Stored;
use crate::subscription::definition::Definition;
use crate::subscription::filter::Filter;

/// This shard's consumers of the partitions it owns.
pub struct Machine {
    /// Keyed by `Rc` so the per-append walk over a topic's consumers copies no strings.
    pub(super) consumers: HashMap<Rc<ConsumerKey>, Consumer>,
    next_gen: u64,
    pub(super) rng: u64,
    /// `session_window_bytes`.
    pub(super) window_bytes: usize,
    /// `redelivery_backoff_ms`.
    pub(super) backoff_base: Duration,
    /// Requests skipped at dispatch because their deadline had passed; the shard takes the
    /// count for its metrics.
    pub expired: u64,
}

impl Machine {
    /// `seed` spreads the jitter (any non-zero value).
    pub fn new(window_bytes: usize, backoff_base: Duration, seed: u64) -> Machine {
        Machine { consumers: HashMap::new(), next_gen: 0, rng: seed | 1, window_bytes, backoff_base, expired: 0 }
    }

    /// The map's own handle of a key (cloning it copies no strings).
    pub(super) fn rc(&self, key: &ConsumerKey) -> Option<Rc<ConsumerKey>> {
        self.consumers.get_key_value(key).map(|(k, _)| k.clone())
    }

    /// Whether the consumer has state here (a session attached).
    pub fn contains(&self, key: &ConsumerKey) -> bool {
        self.consumers.contains_key(key)
    }

    /// Creates a consumer's state from what was stored for each partition this shard owns
    /// (or its start position). A consumer with no partition here keeps nothing.
    pub fn create(
        &mut self,
        key: &ConsumerKey,
        def: Rc<Definition>,
        filters: Rc<Vec<Filter>>,
        persist: bool,
        positions: Vec<(u32, Stored)>,
        now: Instant,
    ) {
        if positions.is_empty() || self.contains(key) {
            return;
        }
        self.next_gen += 1;
        let parts = Parts(positions.iter().map(|(p, st)| (*p, Part::restored(st, persist, now))).collect());
        let c = Consumer { gen: self.next_gen, def, filters, persist, sessions: Vec::new(), parts };
        self.consumers.insert(Rc::new(key.clone()), c);
    }

    /// A session attached with its window and (`MULTICAST`) its own filters.
    #[allow(clippy::too_many_arguments)]
    pub fn attach(
        &mut self,
        key: &ConsumerKey,
        at: SessionRef,
        window: u32,
        filters: Vec<Filter>,
        now: Instant,
        src: &impl Source,
        out: &mut Vec<Effect>,
    ) {
        let Some(c) = self.consumers.get_mut(key) else { return };
        let sess = Sess { at, window: window.min(MAX_WINDOW), inflight: 0, bytes: 0, filters };
        match c.sessions.binary_search_by(|s| s.at.cmp(&at)) {
            Ok(i) => c.sessions[i] = sess,
            Err(i) => {
                // Most consumers have one session: room for it alone, not for four.
                if c.sessions.capacity() == 0 {
                    c.sessions.reserve_exact(1);
                }
                c.sessions.insert(i, sess)
            }
        }
        self.pump_all(key, now, src, out);
    }

    /// A session left: its unacknowledged events were attempts all the same; they go to the
    /// consumer's other sessions at once, or are dead-lettered if that was their last attempt.
    /// The last session leaving drops the consumer's state here (its position is stored).
    pub fn detach(
        &mut self,
        key: &ConsumerKey,
        at: SessionRef,
        now: Instant,
        src: &impl Source,
        out: &mut Vec<Effect>,
    ) {
        let Some(rc) = self.rc(key) else { return };
        let c = self.consumers.get_mut(key).expect("just found");
        c.sessions.retain(|s| s.at != at);
        let max = c.def.max_attempts;
        for (p, part) in c.parts.0.iter_mut() {
            let gone: Vec<(u64, u16, bool)> =
                part.inflight.iter().filter(|(_, f)| f.session == at).map(|(o, f)| (o, f.attempt, f.rpc)).collect();
            for (o, attempt, rpc) in gone {
                if let Some(f) = part.inflight.remove(o) {
                    super::traced::settled((&f.trace, f.attempt), &c.def, *p, o, super::traced::Settled::SessionGone);
                }
                if !rpc && part.failed(o, attempt, max, now) {
                    out.push(Effect::dead_letter(&rc, c.gen, *p, o, attempt, ACK_TIMEOUT));
                }
            }
        }
        if c.sessions.is_empty() {
            let mut c = self.consumers.remove(key).expect("just found");
            for (p, part) in c.parts.0.iter_mut() {
                part.stored = None; // stored in any case: it records when the consumer was last seen
                persist(&rc, &c.def.topic, c.persist, *p, part, now_ms(), out);
            }
            return;
        }
        self.pump_all(key, now, src, out);
    }

    /// A session sent credit: its new window (0 pauses it).
    pub fn window(
        &mut self,
        key: &ConsumerKey,
        at: SessionRef,
        n: u32,
        now: Instant,
        src: &impl Source,
        out: &mut Vec<Effect>,
    ) {
        let Some(c) = self.consumers.get_mut(key) else { return };
        if let Some(s) = c.sessions.iter_mut().find(|s| s.at == at) {
            s.window = n.min(MAX_WINDOW);
        }
        self.pump_all(key, now, src, out);
    }

    /// The consumers of `topic` with a session: those [`Machine::appended`] pumps. The shard
    /// pumps them one by one itself, to yield between them (many consumers, costly filters).
    pub fn consumers_of(&self, topic: &str) -> Vec<Rc<ConsumerKey>> {
        self.consumers
            .iter()
            .filter(|(_, c)| c.def.topic == topic && !c.sessions.is_empty())
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Pumps every consumer of a topic's partition (its events became readable: tiered history
    /// fetched).
    pub fn wake(&mut self, topic: &str, p: u32, now: Instant, src: &impl Source, out: &mut Vec<Effect>) {
        for k in self.consumers_of(topic) {
            self.pump(&k, p, None, now, src, out);
        }
    }

    /// The subscription was removed: its consumers here end.
    pub fn forget(&mut self, subscription: &str) {
        self.consumers.retain(|k, _| k.subscription != subscription);
    }

    fn pump_all(&mut self, key: &ConsumerKey, now: Instant, src: &impl Source, out: &mut Vec<Effect>) {
        let parts: Vec<u32> = match self.consumers.get(key) {
            Some(c) => c.parts.keys().collect(),
            None => return,
        };
        for p in parts {
            self.pump(key, p, None, now, src, out);
        }
    }
}
