//! Acknowledged delivery, the partition owner's half: who gets which event, what is in flight,
//! when it is redelivered or dead-lettered, and the committed offsets.
//!
//! A *consumer* ([`ConsumerKey`]) owns a set of offsets: the subscription itself for
//! `LOAD_BALANCE`, one client of it for `BROADCAST` and `MULTICAST`. Its *sessions* (WebSocket,
//! SSE or long-poll; they live on the shard that accepted them) are announced to every shard,
//! and each shard serves the partitions of the topic it owns: the log is local, the offsets are
//! in its own `offsets.N` family, and the only thing that crosses cores is a [`Delivery`] with
//! the frames by handle (and acks coming back).
//!
//! Per consumer and partition (`Part`): `next` (the next offset to read), the in-flight
//! deliveries, the redeliveries waiting for their backoff, the dead letters being appended. The
//! committed offset is the lowest of those (or `next`): it only moves forward, and it is stored
//! whenever it moves.
//!
//! Rules:
//! * A partition is held by one session of its consumer at a time: sessions sorted by
//!   [`SessionRef`], partition `p` goes to session `p % n`. Every shard sees the same sessions,
//!   so the assignment agrees across owners without a coordinator; it changes when sessions
//!   come and go (a leaving session's unacknowledged events go to the new holder at once).
//! * Sticky order: a partition's redeliveries go out before any newer event of it.
//! * Flow control: a session holds at most its window of unacknowledged events from this shard
//!   (`session_window`, or what its `credit` said), and a partition at most `PART_INFLIGHT`.
//!   A full window pauses delivery; nothing queues without bound.
//! * Unacknowledged after `ackTimeoutMs`, or nacked: redelivered after the backoff (base, 2x,
//!   4x, 8x, 16x, plus up to 20% jitter); after `maxAttempts` appended to `<topic>.dlq` with the
//!   reason as `emdlq*` extensions, then counted as done on the source.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use frame_codec::{AttrValue, Attribute, Frame};
use futures::channel::oneshot;

use crate::shard::core::Shard;
use crate::shard::mailbox::Sender;
use crate::shard::message::{
    AckKind, Acks, ConsumerKey, Delivery, SessionChange, SessionEvent, SessionRef, ShardMessage,
};
use crate::shard::partitioner::partition_for_key;
use crate::shard::{owned_partitions, owner, PartitionId, ShardId};
use crate::storage::{meta, offsets, Storage, StorageError};
use crate::subscription::definition::{Definition, Mode, Start};
use crate::subscription::filter::{self, matches_all, Filter};

/// The largest window a session may ask for.
pub const MAX_WINDOW: u32 = 4096;
/// Unacknowledged events per consumer and partition, whatever the windows say.
const PART_INFLIGHT: usize = 4096;
/// Events read from the log at once when catching up.
const READ_BATCH: usize = 256;
/// Events one pump of a partition may read (a selective filter can skip many per delivery);
/// past it the pump continues in a task of its own, so the core serves others meanwhile.
const SCAN_BUDGET: usize = 4096;
/// How often ack timeouts and due redeliveries are checked.
const TICK: Duration = Duration::from_millis(20);

/// A subscription's definition with its filters compiled once.
type SharedDef = (Rc<Definition>, Rc<Vec<Filter>>);

/// This shard's consumers of the partitions it owns.
#[derive(Default)]
pub struct Dispatcher {
    /// Keyed by `Rc` so the per-append walk over a topic's consumers copies no strings.
    consumers: RefCell<HashMap<Rc<ConsumerKey>, Consumer>>,
    /// Each subscription's definition and compiled filters, shared by all its consumers here
    /// (thousands of BROADCAST clients must not hold a copy each).
    defs: RefCell<HashMap<String, SharedDef>>,
    next_gen: Cell<u64>,
    rng: Cell<u64>,
}

struct Consumer {
    /// Tells this incarnation from a later one of the same key (dead-letter tasks finish late).
    gen: u64,
    def: Rc<Definition>,
    filters: Rc<Vec<Filter>>,
    /// Offsets are stored (false for clients without a `clientId`).
    persist: bool,
    /// Sorted by `at`.
    sessions: Vec<Sess>,
    parts: Parts,
}

struct Sess {
    at: SessionRef,
    window: u32,
    /// Its unacknowledged events from this shard.
    inflight: u32,
    /// Their stored size: with `session_window_bytes` this bounds what a session that does not
    /// read can pin (its queue holds their renderings), and how far a new consumer reads ahead.
    bytes: usize,
    /// `MULTICAST`: the session's own filters.
    filters: Vec<Filter>,
}

impl Sess {
    /// Puts offset `o` in flight to this session.
    fn take(&mut self, part: &mut Part, o: u64, attempt: u16, f: &Frame, deadline: Instant) {
        let bytes = f.as_bytes().len() as u32;
        part.inflight.insert(o, InFlight { attempt, session: self.at, bytes });
        part.deadlines.push_back((deadline, o, attempt));
        self.inflight += 1;
        self.bytes += bytes as usize;
    }

    /// Gives back the room an in-flight event took.
    fn release(&mut self, f: &InFlight) {
        self.inflight = self.inflight.saturating_sub(1);
        self.bytes = self.bytes.saturating_sub(f.bytes as usize);
    }
}

struct InFlight {
    attempt: u16,
    session: SessionRef,
    /// The event's stored size, counted against its session's byte window.
    bytes: u32,
}

struct Retry {
    /// Attempts made so far.
    attempt: u16,
    due: Instant,
}

#[derive(Default)]
struct Part {
    next: u64,
    inflight: BTreeMap<u64, InFlight>,
    /// Ack deadlines in delivery order (so in deadline order: one timeout per consumer); entries
    /// whose delivery was settled meanwhile are skipped and compacted away.
    deadlines: VecDeque<(Instant, u64, u16)>,
    retry: BTreeMap<u64, Retry>,
    /// Being appended to the dead-letter topic, with the attempts made.
    dead: BTreeMap<u64, u16>,
    /// What was last stored (`None`: nothing yet, or a consumer whose offsets are not kept).
    stored: Option<offsets::Stored>,
    /// Stopped because its session's window was full: an ack elsewhere may unblock it.
    stalled: bool,
}

/// A consumer's partitions on this shard: a handful, so a small vector (a `BTreeMap` node
/// would reserve room for eleven `Part`s per consumer, kilobytes per idle session).
#[derive(Default)]
struct Parts(Vec<(u32, Part)>);

impl Parts {
    fn insert(&mut self, p: u32, part: Part) {
        match self.0.iter_mut().find(|(q, _)| *q == p) {
            Some(slot) => slot.1 = part,
            None => self.0.push((p, part)),
        }
    }

    fn get_mut(&mut self, p: &u32) -> Option<&mut Part> {
        self.0.iter_mut().find(|(q, _)| q == p).map(|(_, part)| part)
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn keys(&self) -> impl Iterator<Item = &u32> {
        self.0.iter().map(|(p, _)| p)
    }

    fn iter(&self) -> impl Iterator<Item = (&u32, &Part)> {
        self.0.iter().map(|(p, part)| (p, part))
    }

    fn iter_mut(&mut self) -> impl Iterator<Item = (&u32, &mut Part)> {
        self.0.iter_mut().map(|(p, part)| (&*p, part))
    }
}

impl Part {
    fn committed(&self) -> u64 {
        let firsts =
            [self.inflight.keys().next().copied(), self.retry.keys().next().copied(), self.dead.keys().next().copied()];
        firsts.into_iter().flatten().fold(self.next, u64::min)
    }

    /// What to store: the committed offset, how far delivery got, and the attempts made for
    /// every delivered offset not settled yet (in flight, waiting to be redelivered, or being
    /// dead-lettered), so a disconnect or a restart does not reset `emattempt`.
    fn snapshot(&self) -> offsets::Stored {
        let mut attempts: Vec<(u64, u16)> = self.inflight.iter().map(|(&o, f)| (o, f.attempt)).collect();
        attempts.extend(self.retry.iter().map(|(&o, r)| (o, r.attempt)));
        attempts.extend(self.dead.iter().map(|(&o, &a)| (o, a)));
        attempts.sort_unstable();
        offsets::Stored { committed: self.committed(), next: self.next, seen_ms: offsets::now_ms(), attempts }
    }

    /// A partition resumed from what was stored: every delivered, unsettled offset is due for
    /// redelivery at once, counting the attempts already made.
    fn restored(st: &offsets::Stored, persist: bool) -> Part {
        let now = Instant::now();
        let next = st.next.max(st.committed);
        let retry = st
            .attempts
            .iter()
            .filter(|(o, _)| (st.committed..next).contains(o))
            .map(|&(o, attempt)| (o, Retry { attempt, due: now }))
            .collect();
        Part { next, retry, stored: persist.then(|| st.clone()), ..Part::default() }
    }
}

/// The delivery id clients ack with: `partition:offset:attempt`.
pub fn delivery_id(partition: u32, offset: u64, attempt: u16) -> String {
    format!("{partition}:{offset}:{attempt}")
}

/// The partition and offset a delivery id names.
pub fn parse_delivery_id(id: &str) -> Option<(u32, u64)> {
    let mut it = id.split(':');
    let p = it.next()?.parse().ok()?;
    let o = it.next()?.parse().ok()?;
    match (it.next(), it.next()) {
        (Some(a), None) if a.parse::<u16>().is_ok() => Some((p, o)),
        (None, _) => Some((p, o)),
        _ => None,
    }
}

/// The most delivery ids one ack message or request may name: more than any consumer can have
/// in flight from one request's worth of sessions, few enough that settling them is bounded.
pub const MAX_ACK_IDS: usize = 10_000;

/// Delivery ids grouped by partition, each partition's offsets sorted and deduplicated (so
/// settling them is linear); `Err` names the first id that is not one, or says there are more
/// than [`MAX_ACK_IDS`].
pub fn group_ids<'a>(ids: impl IntoIterator<Item = &'a str>) -> Result<BTreeMap<u32, Vec<u64>>, String> {
    let mut by: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    for (n, id) in ids.into_iter().enumerate() {
        if n == MAX_ACK_IDS {
            return Err(format!("at most {MAX_ACK_IDS} delivery ids per ack"));
        }
        let (p, o) =
            parse_delivery_id(id).ok_or_else(|| format!("{id:?} is not a delivery id (partition:offset:attempt)"))?;
        by.entry(p).or_default().push(o);
    }
    for offsets in by.values_mut() {
        offsets.sort_unstable();
        offsets.dedup();
    }
    Ok(by)
}

impl Dispatcher {
    /// Redelivery backoff after `attempt` attempts: base * 2^(attempt-1), at most 16x, + <= 20%.
    fn backoff(&self, base: Duration, attempt: u16) -> Duration {
        let d = base * (1u32 << u32::from(attempt.clamp(1, 5) - 1));
        // xorshift64*: jitter needs no cryptography, only spread.
        let mut x = self.rng.get();
        if x == 0 {
            x = crate::runtime::now_micros() as u64 | 1;
        }
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng.set(x);
        let jitter = (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64;
        d + d.mul_f64(0.2 * jitter)
    }
}

fn engine(e: frame_codec::FrameError) -> StorageError {
    StorageError::Engine(e.to_string())
}

impl Shard {
    /// Tells every shard (this one too) about a session of acknowledged delivery.
    pub fn announce_session(self: &Rc<Self>, event: SessionEvent) {
        for s in 0..self.shared.config.shards {
            let to = ShardId(s as u16);
            if to == self.id {
                continue;
            }
            let copy = SessionEvent {
                consumer: event.consumer.clone(),
                topic: event.topic.clone(),
                session: event.session,
                change: event.change.clone(),
            };
            self.send_control(to, ShardMessage::Session(Box::new(copy)));
        }
        self.session_event(event);
    }

    /// Sends acks to the owners of their partitions (this shard's own are settled at once) on
    /// the control lane, so they are never lost. Ids naming a partition the topic does not have
    /// are refused here, before any state or message: `Err` says which. With `confirm`, returns
    /// what resolves once each owner has applied them.
    pub fn route_acks(
        self: &Rc<Self>,
        consumer: &ConsumerKey,
        topic: &str,
        by: BTreeMap<u32, Vec<u64>>,
        kind: AckKind,
        confirm: bool,
    ) -> Result<Vec<oneshot::Receiver<()>>, String> {
        let partitions = self.partitions_of(topic).unwrap_or(0);
        if let Some((&p, _)) = by.range(partitions..).next() {
            self.shared.metrics.shard(self.id).acks_rejected.inc();
            return Err(format!("delivery ids name partition {p}; topic {topic} has {partitions}"));
        }
        let mut applied = Vec::new();
        for (p, offsets) in by {
            let partition = PartitionId(p);
            let done = confirm.then(|| {
                let (tx, rx) = oneshot::channel();
                applied.push(rx);
                tx
            });
            let acks = Acks { consumer: consumer.clone(), partition, offsets, kind, applied: done };
            let to = owner(topic, partition, self.shared.config.shards);
            if to == self.id {
                self.acks(acks);
            } else {
                self.send_control(to, ShardMessage::Ack(Box::new(acks)));
            }
        }
        Ok(applied)
    }

    /// A session attached, left, or changed its window.
    pub fn session_event(self: &Rc<Self>, e: SessionEvent) {
        let key = e.consumer;
        match e.change {
            SessionChange::Attach { window, filters, persist } => {
                if let Err(err) = self.ensure_consumer(&key, persist) {
                    eprintln!("evmesh: {}: cannot serve {}: {err}", self.id, key.subscription);
                    return;
                }
                let filters = filters
                    .and_then(|j| serde_json::from_str(&j).ok())
                    .and_then(|j: serde_json::Value| filter::compile(Some(&j)).ok())
                    .unwrap_or_default();
                let mut cs = self.delivery.consumers.borrow_mut();
                let Some(c) = cs.get_mut(&key) else { return };
                let sess = Sess { at: e.session, window: window.min(MAX_WINDOW), inflight: 0, bytes: 0, filters };
                match c.sessions.binary_search_by(|s| s.at.cmp(&e.session)) {
                    Ok(i) => c.sessions[i] = sess,
                    Err(i) => c.sessions.insert(i, sess),
                }
            }
            SessionChange::Detach => {
                let mut cs = self.delivery.consumers.borrow_mut();
                let Some(c) = cs.get_mut(&key) else { return };
                c.sessions.retain(|s| s.at != e.session);
                let now = Instant::now();
                let max = c.def.max_attempts;
                // A delivery whose session ended before an ack was an attempt all the same: the
                // next one counts on from it, and the last one dead-letters the event.
                let mut exhausted = Vec::new();
                for (&p, part) in c.parts.iter_mut() {
                    let gone: Vec<(u64, u16)> = part
                        .inflight
                        .iter()
                        .filter(|(_, f)| f.session == e.session)
                        .map(|(&o, f)| (o, f.attempt))
                        .collect();
                    for (o, attempt) in gone {
                        part.inflight.remove(&o);
                        if u32::from(attempt) >= max {
                            part.dead.insert(o, attempt);
                            exhausted.push((p, o, attempt));
                        } else {
                            part.retry.insert(o, Retry { attempt, due: now });
                        }
                    }
                }
                if !exhausted.is_empty() {
                    let (k, gen) = (Rc::new(key.clone()), c.gen);
                    for (p, o, attempt) in exhausted {
                        self.dead_letter(k.clone(), gen, p, o, attempt, "ack-timeout");
                    }
                }
                if c.sessions.is_empty() {
                    // Nobody left to deliver to: the stored offsets are all that must remain.
                    let mut c = cs.remove(&key).expect("just looked up");
                    for (&p, part) in c.parts.iter_mut() {
                        part.stored = None; // written in any case: it records when it was last seen
                        self.save(c.persist, &c.def.topic, &key, p, part);
                    }
                    return;
                }
            }
            SessionChange::Window(n) => {
                let mut cs = self.delivery.consumers.borrow_mut();
                let Some(c) = cs.get_mut(&key) else { return };
                if let Some(s) = c.sessions.iter_mut().find(|s| s.at == e.session) {
                    s.window = n.min(MAX_WINDOW);
                }
            }
        }
        self.pump_all(&key);
    }

    /// Creates the consumer's state for the partitions this shard owns, if it has none yet.
    fn ensure_consumer(&self, key: &ConsumerKey, persist: bool) -> Result<(), StorageError> {
        if self.delivery.consumers.borrow().contains_key(key) {
            return Ok(());
        }
        let db = &self.shared.db;
        let cached = self.delivery.defs.borrow().get(&key.subscription).cloned();
        let (def, filters) = match cached {
            Some(d) => d,
            None => {
                let Some(def) = meta::get_subscription(db, &key.subscription)? else {
                    return Err(StorageError::Unavailable("subscription removed"));
                };
                let filters = Rc::new(def.compile_stored());
                let d = (Rc::new(def), filters);
                self.delivery.defs.borrow_mut().insert(key.subscription.clone(), d.clone());
                d
            }
        };
        let Some(topic) = meta::get(db, &def.topic)? else { return Err(StorageError::Unavailable("no such topic")) };
        let mut parts = Parts::default();
        for p in owned_partitions(&def.topic, topic.partitions, self.id, self.shared.config.shards) {
            let st = self.start_offset(&def, key, p, persist)?;
            parts.insert(p.0, Part::restored(&st, persist));
        }
        if parts.is_empty() {
            return Ok(()); // no partition of the topic lives here: nothing to keep for it
        }
        let gen = self.delivery.next_gen.get() + 1;
        self.delivery.next_gen.set(gen);
        let c = Consumer { gen, def, filters, persist, sessions: Vec::new(), parts };
        self.delivery.consumers.borrow_mut().insert(Rc::new(key.clone()), c);
        Ok(())
    }

    /// Where a consumer reads a partition from: what is stored for it (position and attempts
    /// made), else the subscription's `start` (stored at once, so the start does not move on a
    /// restart).
    fn start_offset(
        &self,
        def: &Definition,
        key: &ConsumerKey,
        p: PartitionId,
        persist: bool,
    ) -> Result<offsets::Stored, StorageError> {
        let db = &self.shared.db;
        let k = offsets::key(&def.topic, &key.subscription, p, &key.client);
        if persist {
            if let Some(st) = offsets::get(db, self.id, &k)? {
                return Ok(st);
            }
        }
        let b = self.log.bounds(&def.topic, p)?;
        let o = match &def.start {
            Start::Named(n) if n == "earliest" => b.start,
            // A LOAD_BALANCE subscription keeps what was published since it was created.
            Start::Named(_) if def.mode == Mode::LoadBalance && def.created_us > 0 => {
                self.first_at(&def.topic, p, b, def.created_us)?
            }
            Start::Named(_) => b.end,
            Start::Offset { offset } => (*offset).clamp(b.start, b.end),
            Start::Time { time } => {
                self.first_at(&def.topic, p, b, crate::adaptor::rfc3339_micros(time).unwrap_or(0))?
            }
        };
        let st = offsets::Stored::at(o);
        if persist {
            offsets::put(db, self.id, &k, &st)?;
        }
        Ok(st)
    }

    /// The first offset in `b` published at or after `micros` (binary search over the log;
    /// publish times follow offsets within a partition, up to clock steps between cores).
    fn first_at(
        &self,
        topic: &str,
        p: PartitionId,
        b: crate::storage::Bounds,
        micros: i64,
    ) -> Result<u64, StorageError> {
        let (mut lo, mut hi) = (b.start, b.end);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.log.read(topic, p, mid, 1, usize::MAX)?.first() {
                Some(f) if f.header().timestamp_us < micros => lo = f.header().offset + 1,
                Some(_) => hi = mid,
                None => hi = mid,
            }
        }
        Ok(lo)
    }

    /// Stores a consumer's position of `p` (committed offset and attempts) if it changed.
    /// Runs before deliveries are sent, so an attempt is on record before a client can see it.
    fn save(&self, persist: bool, topic: &str, key: &ConsumerKey, p: u32, part: &mut Part) {
        if !persist {
            return;
        }
        let snap = part.snapshot();
        let same = part
            .stored
            .as_ref()
            .is_some_and(|st| st.committed == snap.committed && st.next == snap.next && st.attempts == snap.attempts);
        if same {
            return;
        }
        let k = offsets::key(topic, &key.subscription, PartitionId(p), &key.client);
        match offsets::put(&self.shared.db, self.id, &k, &snap) {
            Ok(()) => part.stored = Some(snap),
            Err(e) => eprintln!("evmesh: {}: storing the offset of {}: {e}", self.id, key.subscription),
        }
    }

    fn pump_all(self: &Rc<Self>, key: &ConsumerKey) {
        let parts: Vec<u32> = match self.delivery.consumers.borrow().get(key) {
            Some(c) => c.parts.keys().copied().collect(),
            None => return,
        };
        for p in parts {
            self.pump_part(key, p, None);
        }
    }

    /// Newly stored events of a partition this shard owns: every consumer of the topic gets
    /// them, straight from `frames` when it is caught up (no log read).
    pub fn deliver_new(self: &Rc<Self>, topic: &str, frames: &Arc<[Frame]>) {
        let Some(p) = frames.first().map(|f| f.header().partition) else { return };
        let keys: Vec<Rc<ConsumerKey>> = self
            .delivery
            .consumers
            .borrow()
            .iter()
            .filter(|(_, c)| c.def.topic == topic && !c.sessions.is_empty())
            .map(|(k, _)| k.clone())
            .collect();
        for k in keys {
            self.pump_part(&k, p, Some(frames));
        }
    }

    /// Sends a consumer's partition what its holder has room for: due redeliveries first, then
    /// new events (from `fresh` when it continues exactly where the consumer is, else the log).
    fn pump_part(self: &Rc<Self>, key: &ConsumerKey, p: u32, fresh: Option<&Arc<[Frame]>>) {
        let now = Instant::now();
        let mut read: Vec<Frame> = Vec::new();
        let mut read_attempts: Vec<u16> = Vec::new();
        let mut pick: Vec<u32> = Vec::new();
        let mut more = false;
        // Offsets whose attempts ran out while no session held them (a disconnect, a restart).
        let mut exhausted: Vec<(u64, u16)> = Vec::new();
        let (target, gen) = {
            let mut cs = self.delivery.consumers.borrow_mut();
            let Some(c) = cs.get_mut(key) else { return };
            if c.sessions.is_empty() {
                return;
            }
            let (gen, max) = (c.gen, c.def.max_attempts);
            let holder = p as usize % c.sessions.len();
            let timeout = Duration::from_millis(c.def.ack_timeout_ms);
            let def = c.def.clone();
            let topic = def.topic.as_str();
            let end = self.log.next_offset_of(topic, PartitionId(p)).ok();
            let Consumer { parts, sessions, filters, persist, .. } = c;
            let Some(part) = parts.get_mut(&p) else { return };
            let sess = &mut sessions[holder];
            part.stalled = false;
            let wanted = |f: &Frame, s: &Sess| matches_all(filters, f.body()) && matches_all(&s.filters, f.body());
            let mut scanned = 0;
            let window_bytes = self.shared.config.session_window_bytes;
            loop {
                let room_s = sess.window.saturating_sub(sess.inflight) as usize;
                let room = room_s.min(PART_INFLIGHT.saturating_sub(part.inflight.len() + part.dead.len()));
                // At least one event may always be in flight, however large.
                let full_bytes = sess.inflight > 0 && sess.bytes >= window_bytes;
                if room == 0 || full_bytes {
                    part.stalled = room_s == 0 || full_bytes;
                    break;
                }
                let bytes_room = window_bytes.saturating_sub(sess.bytes).max(1);
                if let Some((&o, &Retry { attempt: made, due })) = part.retry.first_key_value() {
                    if u32::from(made) >= max {
                        part.retry.remove(&o);
                        part.dead.insert(o, made);
                        exhausted.push((o, made));
                        continue;
                    }
                    if due > now || end.is_none_or(|e| o >= e) {
                        // Newer events wait behind a redelivery (sticky order); so does one not
                        // readable yet (the Kafka backend's local copy refilling after a crash).
                        break;
                    }
                    let attempt = made.saturating_add(1);
                    let Ok(mut got) = self.log.read(topic, PartitionId(p), o, 1, usize::MAX) else {
                        // Unreadable for now: it stays first in line, tried again next tick.
                        break;
                    };
                    part.retry.remove(&o);
                    if let Some(f) = got.pop().filter(|f| f.header().offset == o) {
                        sess.take(part, o, attempt, &f, now + timeout);
                        read.push(f);
                        read_attempts.push(attempt);
                    } // else: gone by retention, nothing left to redeliver
                    continue;
                }
                if end.is_some_and(|e| part.next >= e) {
                    break;
                }
                let from_fresh =
                    fresh.filter(|fr| fr.first().is_some_and(|f| f.header().offset == part.next) && read.is_empty());
                if let Some(fr) = from_fresh {
                    let mut taken = 0;
                    for (i, f) in fr.iter().enumerate() {
                        if taken == room || (sess.inflight > 0 && sess.bytes >= window_bytes) {
                            break;
                        }
                        let o = f.header().offset;
                        part.next = o + 1;
                        if wanted(f, sess) {
                            sess.take(part, o, 1, f, now + timeout);
                            pick.push(i as u32);
                            taken += 1;
                        }
                    }
                    continue;
                }
                if !pick.is_empty() {
                    break; // the fresh batch went out; anything after it is read next time
                }
                if scanned >= SCAN_BUDGET {
                    more = true; // a selective filter over a long backlog: continue in a new task
                    break;
                }
                // Read ahead lazily: no more events, and no more bytes, than the session has room
                // for (a new consumer of large events does not pull hundreds into memory).
                let got = self
                    .log
                    .read(topic, PartitionId(p), part.next, room.min(READ_BATCH), bytes_room)
                    .unwrap_or_default();
                if got.is_empty() {
                    break;
                }
                scanned += got.len();
                for f in got {
                    if sess.inflight > 0 && sess.bytes >= window_bytes {
                        break; // read but not taken: read again when there is room
                    }
                    let o = f.header().offset;
                    part.next = o + 1;
                    if wanted(&f, sess) {
                        sess.take(part, o, 1, &f, now + timeout);
                        read.push(f);
                        read_attempts.push(1);
                    }
                }
            }
            self.save(*persist, topic, key, p, part);
            (sess.at, gen)
        };
        if !exhausted.is_empty() {
            let key = Rc::new(key.clone());
            for (o, attempts) in exhausted {
                self.dead_letter(key.clone(), gen, p, o, attempts, "ack-timeout");
            }
        }
        let m = self.shared.metrics.shard(self.id);
        m.redeliveries.add(read_attempts.iter().filter(|&&a| a > 1).count() as u64);
        if !read.is_empty() {
            let d = Delivery {
                subscription: key.subscription.clone(),
                session: Some(target.id),
                frames: read.into(),
                pick: None,
                attempts: read_attempts,
            };
            self.send_delivery(target.shard, d);
        }
        if let (false, Some(fr)) = (pick.is_empty(), fresh) {
            let attempts = vec![1; pick.len()];
            let subscription = key.subscription.clone();
            let d = Delivery { subscription, session: Some(target.id), frames: fr.clone(), pick: Some(pick), attempts };
            self.send_delivery(target.shard, d);
        }
        if more {
            // Bounded work per turn: let other tasks of this core run, then go on reading.
            let (me, key) = (self.clone(), key.clone());
            monoio::spawn(async move {
                monoio::time::sleep(Duration::ZERO).await;
                me.pump_part(&key, p, None);
            });
        }
    }

    fn send_delivery(&self, to: ShardId, d: Delivery) {
        if to == self.id {
            self.deliver_here(&d);
        } else if self.shared.mailboxes.send(Sender::Shard(self.id), to, ShardMessage::Deliver(Box::new(d))).is_err() {
            // In flight all the same: the ack timeout redelivers them.
            self.shared.metrics.shard(self.id).deliveries_dropped.inc();
        }
    }

    /// Acks or nacks from a consumer for a partition this shard owns; answers `applied` (the
    /// 200 of `POST /events/ack` waits for it) once they took effect.
    pub fn acks(self: &Rc<Self>, mut a: Acks) {
        let applied = a.applied.take();
        self.apply_acks(a);
        if let Some(done) = applied {
            let _ = done.send(());
        }
    }

    fn apply_acks(self: &Rc<Self>, a: Acks) {
        let p = a.partition.0;
        let now = Instant::now();
        let mut dead = Vec::new();
        let mut unblocked = vec![p];
        {
            let mut cs = self.delivery.consumers.borrow_mut();
            let Some(c) = cs.get_mut(&a.consumer) else {
                drop(cs);
                return self.settle_detached(&a);
            };
            let gen = c.gen;
            let (base, max) = (self.shared.config.redelivery_backoff, c.def.max_attempts);
            let Consumer { parts, sessions, persist, def, .. } = &mut *c;
            let Some(part) = parts.get_mut(&p) else { return };
            let mut settle = |o: u64, part: &mut Part| -> Option<InFlight> {
                let f = part.inflight.remove(&o)?;
                if let Some(s) = sessions.iter_mut().find(|s| s.at == f.session) {
                    s.release(&f);
                }
                Some(f)
            };
            match a.kind {
                AckKind::Ack => {
                    for &o in &a.offsets {
                        settle(o, part);
                        part.retry.remove(&o);
                    }
                }
                // Only what was delivered can be confirmed: an id past that is ignored.
                AckKind::UpTo if a.offsets.iter().any(|&o| o >= part.next) => {}
                AckKind::UpTo => {
                    let upto = a.offsets.iter().copied().max().unwrap_or(0);
                    let done: Vec<u64> = part.inflight.range(..=upto).map(|(&o, _)| o).collect();
                    for o in done {
                        settle(o, part);
                    }
                    part.retry = part.retry.split_off(&upto.saturating_add(1));
                }
                AckKind::Nack => {
                    for &o in &a.offsets {
                        let Some(f) = settle(o, part) else { continue };
                        if u32::from(f.attempt) >= max {
                            part.dead.insert(o, f.attempt);
                            dead.push((o, f.attempt));
                        } else {
                            part.retry.insert(
                                o,
                                Retry { attempt: f.attempt, due: now + self.delivery.backoff(base, f.attempt) },
                            );
                        }
                    }
                }
            }
            self.shared.metrics.shard(self.id).acks.add(a.offsets.len() as u64);
            compact(part);
            self.save(*persist, &def.topic, &a.consumer, p, part);
            unblocked.extend(parts.iter().filter(|(&q, x)| q != p && x.stalled).map(|(&q, _)| q));
            for (o, attempt) in dead.drain(..) {
                self.dead_letter(Rc::new(a.consumer.clone()), gen, p, o, attempt, "nack");
            }
        }
        for q in unblocked {
            self.pump_part(&a.consumer, q, None);
        }
    }

    /// Acks for a consumer with no session here (its last one left before they arrived, or an
    /// SSE client resumes after its old stream ended): they settle what is stored. Only what
    /// was delivered (below the stored `next`) can have been received, so an id naming
    /// anything else changes nothing and keeps nothing. Nacks change nothing (the event is
    /// redelivered anyway).
    fn settle_detached(&self, a: &Acks) {
        if a.kind == AckKind::Nack || a.consumer.client.starts_with('~') {
            return;
        }
        self.settle_stored(&a.consumer, a.partition, |st| match a.kind {
            AckKind::UpTo => match a.offsets.last() {
                Some(&upto) if upto < st.next => st.attempts.retain(|&(o, _)| o > upto),
                _ => {}
            },
            // `offsets` is sorted (`group_ids`): linear in the ids and the stored attempts.
            _ => st.attempts.retain(|(o, _)| a.offsets.binary_search(o).is_err()),
        });
    }

    /// Changes the stored position of a consumer that has no state here, then recomputes its
    /// committed offset (the lowest delivered-but-unsettled offset, else `next`).
    fn settle_stored(&self, consumer: &ConsumerKey, p: PartitionId, change: impl FnOnce(&mut offsets::Stored)) {
        let db = &self.shared.db;
        let Ok(Some(def)) = meta::get_subscription(db, &consumer.subscription) else { return };
        let k = offsets::key(&def.topic, &consumer.subscription, p, &consumer.client);
        let Ok(Some(mut st)) = offsets::get(db, self.id, &k) else { return };
        let before = st.clone();
        change(&mut st);
        st.committed = st.attempts.first().map_or(st.next, |&(o, _)| o).max(st.committed);
        if st != before {
            st.seen_ms = offsets::now_ms();
            if let Err(e) = offsets::put(db, self.id, &k, &st) {
                eprintln!("evmesh: {}: storing the offset of {}: {e}", self.id, consumer.subscription);
            }
        }
    }

    /// Appends an event that ran out of attempts to `<topic>.dlq`, then settles it on the
    /// source (or, if the append failed, schedules it again).
    fn dead_letter(
        self: &Rc<Self>,
        key: Rc<ConsumerKey>,
        gen: u64,
        p: u32,
        o: u64,
        attempts: u16,
        reason: &'static str,
    ) {
        let me = self.clone();
        monoio::spawn(async move {
            let r = me.append_dead(&key, p, o, attempts, reason).await;
            if let Err(e) = &r {
                eprintln!("evmesh: {}: dead-lettering {}@{p}:{o} failed, retrying: {e}", me.id, key.subscription);
            } else {
                me.shared.metrics.shard(me.id).dead_lettered.inc();
            }
            {
                let mut cs = me.delivery.consumers.borrow_mut();
                let Some(c) = cs.get_mut(&key).filter(|c| c.gen == gen) else {
                    drop(cs);
                    // Its sessions left meanwhile: settle what was stored for it, so the event
                    // is not dead-lettered again when the consumer comes back.
                    if r.is_ok() {
                        me.settle_stored(&key, PartitionId(p), |st| st.attempts.retain(|&(x, _)| x != o));
                    }
                    return;
                };
                let Some(part) = c.parts.get_mut(&p) else { return };
                part.dead.remove(&o);
                if r.is_err() {
                    let due = Instant::now() + me.delivery.backoff(me.shared.config.redelivery_backoff, 5);
                    part.retry.insert(o, Retry { attempt: attempts.saturating_sub(1), due });
                }
                me.save(c.persist, &c.def.topic, &key, p, part);
            }
            me.pump_part(&key, p, None);
        });
    }

    async fn append_dead(
        self: &Rc<Self>,
        key: &ConsumerKey,
        p: u32,
        o: u64,
        attempts: u16,
        reason: &str,
    ) -> Result<(), StorageError> {
        let here = self.delivery.consumers.borrow().get(key).map(|c| c.def.topic.clone());
        let topic = match here {
            Some(t) => t,
            // Its last session left meanwhile: the event is dead-lettered all the same.
            None => match meta::get_subscription(&self.shared.db, &key.subscription)? {
                Some(def) => def.topic,
                None => return Ok(()), // the subscription was removed: nothing to keep
            },
        };
        let Some(f) = self.log.read(&topic, PartitionId(p), o, 1, usize::MAX)?.pop().filter(|f| f.header().offset == o)
        else {
            return Ok(()); // gone by retention
        };
        let mut body = f.to_body();
        let dlq = format!("{topic}.dlq");
        body.topic = dlq.clone();
        body.attributes.retain(|a| !a.name.starts_with("emdlq"));
        let ext = [
            ("emdlqreason", AttrValue::Str(reason.to_owned())),
            ("emdlqsubscription", AttrValue::Str(key.subscription.clone())),
            ("emdlqclient", AttrValue::Str(key.client.clone())),
            ("emdlqtopic", AttrValue::Str(topic.clone())),
            ("emdlqpartition", AttrValue::Int(i64::from(p))),
            ("emdlqoffset", AttrValue::Str(o.to_string())),
            ("emdlqattempts", AttrValue::Int(i64::from(attempts))),
        ];
        for (name, value) in ext {
            if name == "emdlqclient" && key.client.is_empty() {
                continue;
            }
            body.attributes.push(Attribute { name: name.to_owned(), value });
        }
        let mut frame = Frame::encode(&f.header(), &body).map_err(engine)?;
        frame.set_timestamp(crate::runtime::now_micros());
        let (m, _) = self.topic(&dlq, None, true).await?;
        let partition = match frame.body().attr_str("partitionkey") {
            Some(k) => partition_for_key(k.as_bytes(), m.partitions),
            None => self.local_partition(&dlq, &m),
        };
        self.append(&dlq, partition, vec![frame]).await.map(|_| ())
    }

    /// Expires unacknowledged deliveries and sends due redeliveries, forever.
    pub async fn delivery_timers(self: Rc<Self>) {
        loop {
            monoio::time::sleep(TICK).await;
            let now = Instant::now();
            let mut work: Vec<(Rc<ConsumerKey>, u32)> = Vec::new();
            let mut dead: Vec<(Rc<ConsumerKey>, u64, u32, u64, u16)> = Vec::new();
            {
                let mut cs = self.delivery.consumers.borrow_mut();
                let base = self.shared.config.redelivery_backoff;
                for (key, c) in cs.iter_mut() {
                    let max = c.def.max_attempts;
                    let Consumer { parts, sessions, gen, .. } = c;
                    for (&p, part) in parts.iter_mut() {
                        let mut expired = false;
                        while let Some(&(deadline, o, attempt)) = part.deadlines.front() {
                            let live = part.inflight.get(&o).is_some_and(|f| f.attempt == attempt);
                            if live && deadline > now {
                                break;
                            }
                            part.deadlines.pop_front();
                            if !live {
                                continue;
                            }
                            let f = part.inflight.remove(&o).expect("live");
                            if let Some(s) = sessions.iter_mut().find(|s| s.at == f.session) {
                                s.release(&f);
                            }
                            expired = true;
                            if u32::from(attempt) >= max {
                                part.dead.insert(o, attempt);
                                dead.push((key.clone(), *gen, p, o, attempt));
                            } else {
                                part.retry
                                    .insert(o, Retry { attempt, due: now + self.delivery.backoff(base, attempt) });
                            }
                        }
                        let due = part.retry.first_key_value().is_some_and(|(_, r)| r.due <= now);
                        if expired || due {
                            work.push((key.clone(), p));
                        }
                    }
                }
            }
            for (key, gen, p, o, attempt) in dead {
                self.dead_letter(key, gen, p, o, attempt, "ack-timeout");
            }
            for (key, p) in work {
                self.pump_part(&key, p, None);
            }
        }
    }

    /// Forgets the stored offsets of clients not seen for `client_offset_ttl_ms` (those with a
    /// session attached are seen now, and kept). Bounded work per pass.
    pub fn expire_clients(&self) {
        let Some(ttl) = self.shared.config.client_offset_ttl else { return };
        let before = offsets::now_ms().saturating_sub(ttl.as_millis() as u64);
        let db = &self.shared.db;
        let keys = match offsets::expired_clients(db, self.id, before, 10_000) {
            Ok(k) => k,
            Err(e) => return eprintln!("evmesh: {}: listing client offsets: {e}", self.id),
        };
        let consumers = self.delivery.consumers.borrow();
        for k in keys {
            let text = String::from_utf8_lossy(&k);
            let mut parts = text.splitn(4, '#');
            let (Some(_topic), Some(subscription), Some(_p), Some(client)) =
                (parts.next(), parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            let live = ConsumerKey { subscription: subscription.to_owned(), client: client.to_owned() };
            if consumers.contains_key(&live) {
                continue;
            }
            if let Err(e) = offsets::delete(db, self.id, &k) {
                eprintln!("evmesh: {}: expiring client offsets: {e}", self.id);
            }
        }
    }

    /// A subscription was removed: its consumers here end and their offsets are forgotten.
    pub fn forget_subscription(&self, subscription: &str, topic: &str) {
        self.delivery.consumers.borrow_mut().retain(|k, _| k.subscription != subscription);
        self.delivery.defs.borrow_mut().remove(subscription);
        if let Err(e) = offsets::delete_all(&self.shared.db, self.id, topic, subscription) {
            eprintln!("evmesh: {}: forgetting offsets of {subscription}: {e}", self.id);
        }
    }
}

/// Drops settled entries from the front of the deadline queue, and rebuilds it when settled
/// entries behind the front outnumber the live ones (out-of-order acks), so it stays bounded.
fn compact(part: &mut Part) {
    while let Some(&(_, o, a)) = part.deadlines.front() {
        if part.inflight.get(&o).is_some_and(|f| f.attempt == a) {
            break;
        }
        part.deadlines.pop_front();
    }
    if part.deadlines.len() > 2 * part.inflight.len() + 64 {
        let inflight = &part.inflight;
        part.deadlines.retain(|&(_, o, a)| inflight.get(&o).is_some_and(|f| f.attempt == a));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delivery_ids_round_trip_and_reject_garbage() {
        assert_eq!(parse_delivery_id(&delivery_id(3, 42, 2)), Some((3, 42)));
        assert_eq!(parse_delivery_id("3:42"), Some((3, 42)));
        for bad in ["", "3", "x:1:1", "3:-1:1", "3:1:1:1", "3:1:x"] {
            assert_eq!(parse_delivery_id(bad), None, "{bad}");
        }
        let by = group_ids(["0:1:1", "1:5:1", "0:2:3"]).unwrap();
        assert_eq!(by, BTreeMap::from([(0, vec![1, 2]), (1, vec![5])]));
        assert!(group_ids(["0:1:1", "nope"]).unwrap_err().contains("nope"));
    }

    #[test]
    fn backoff_doubles_to_sixteen_times_with_bounded_jitter() {
        let d = Dispatcher::default();
        let base = Duration::from_millis(1000);
        for (attempt, times) in [(1u16, 1u32), (2, 2), (3, 4), (4, 8), (5, 16), (9, 16)] {
            for _ in 0..50 {
                let b = d.backoff(base, attempt);
                assert!(b >= base * times && b <= (base * times).mul_f64(1.2), "attempt {attempt}: {b:?}");
            }
        }
    }

    #[test]
    fn committed_is_the_lowest_unsettled_offset() {
        let mut part = Part { next: 10, ..Part::default() };
        assert_eq!(part.committed(), 10);
        let s = SessionRef { shard: ShardId(0), id: 1 };
        part.inflight.insert(7, InFlight { attempt: 1, session: s, bytes: 10 });
        part.retry.insert(5, Retry { attempt: 1, due: Instant::now() });
        assert_eq!(part.committed(), 5);
        part.retry.clear();
        part.dead.insert(6, 3);
        assert_eq!(part.committed(), 6);
    }
}
