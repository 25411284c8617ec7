//! Acknowledged delivery as a state machine with no I/O: the partition owner's rules for who
//! gets which event, what is in flight, when it is redelivered or dead-lettered, and what the
//! committed offset is.
//!
//! Inputs are method calls (a session attached, left or sent credit; acks and nacks; events were
//! appended; the clock ticked; a dead letter was written). Each takes the time `now` and a
//! [`Source`] to read the log through, and pushes its consequences as [`Effect`]s (deliver
//! these events to that session, store this position, dead-letter that event, continue later);
//! the shard executes them (`super`, in order: a position is stored before the deliveries it
//! records are sent). Nothing here touches a socket, a mailbox, a clock or the disk, so every
//! rule is unit-tested below with an in-memory log.
//!
//! Per consumer (the subscription, or one client of it) and partition (`Part`): `next` (the next
//! offset to read), the in-flight deliveries, the redeliveries waiting for their backoff, the
//! dead letters being written. The committed offset is the lowest of those (or `next`).
//!
//! Rules:
//! * A partition is held by one session of its consumer at a time: sessions sorted by
//!   [`SessionRef`], partition `p` goes to session `p % n`. Every shard sees the same sessions,
//!   so the assignment agrees across owners without a coordinator; it changes when sessions
//!   come and go (a leaving session's unacknowledged events go to the new holder at once).
//! * Sticky order: a partition's redeliveries go out before any newer event of it.
//! * A pushed subscription (a webhook `sink`, a classic group's push URLs) has at most one
//!   event of a partition in flight (or being dead-lettered), so with sticky order its
//!   partitions reach the receiver in offset order even when a delivery fails.
//! * Flow control: a session holds at most its window of unacknowledged events from this shard
//!   (`session_window`, or what its `credit` said) and at most `window_bytes` of them (at least
//!   one event), and a partition at most `PART_INFLIGHT`. A full window pauses delivery; the log
//!   is read only as far as there is room.
//! * Attempts: every delivery counts, also one whose session ended before an ack. Unacked
//!   after `ackTimeoutMs`, nacked, or left by its session: redelivered after the backoff (base,
//!   2x, 4x, 8x, 16x, plus up to 20% jitter; at once after a session left); after `maxAttempts`
//!   dead-lettered, then counted as done.
//! * Requests (request-reply, frame kind `Request`, deadline in the header's `sequence`) are
//!   never redelivered or dead-lettered, whatever the subscription says: one past its deadline
//!   is skipped at dispatch (counted in [`Machine::expired`]); one in flight is settled when its
//!   ack deadline (`ackTimeoutMs`, as for any event) passes, it is nacked, or its session
//!   leaves; one found among the redeliveries after a restart is settled when read.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use frame_codec::{Frame, FrameKind};

use crate::model::delivery::{AckKind, ConsumerKey, SessionRef};
use crate::storage::offsets::Stored;
use crate::subscription::definition::Definition;
use crate::subscription::filter::{matches_all, Filter};

pub use crate::config::MAX_WINDOW;
/// Unacknowledged events per consumer and partition, whatever the windows say.
const PART_INFLIGHT: usize = 4096;
/// Events read from the log at once when catching up.
const READ_BATCH: usize = 256;
/// Events one pump of a partition may read (a selective filter can skip many per delivery);
/// past it the pump asks to continue later ([`Effect::Continue`]).
const SCAN_BUDGET: usize = 4096;

/// The log, as the machine reads it.
pub trait Source {
    /// The next offset of a partition (what is readable), `None` if it cannot be told now.
    fn end(&self, topic: &str, partition: u32) -> Option<u64>;
    /// Up to `max` events from `from`, stopping after the one that reaches `max_bytes`;
    /// `None` if the log cannot be read now.
    fn read(&self, topic: &str, partition: u32, from: u64, max: usize, max_bytes: usize) -> Option<Vec<Frame>>;
    /// The wall clock, µs since the Unix epoch: what request deadlines are compared with.
    fn wall_us(&self) -> i64 {
        crate::model::clock::now_micros()
    }
}

/// A request's deadline (µs since the epoch), `None` for any other frame.
fn request_deadline(f: &Frame) -> Option<i64> {
    let h = f.header();
    (h.kind == FrameKind::Request).then_some(h.sequence as i64)
}

/// Whether `f` is a request whose deadline passed.
pub fn expired(f: &Frame, wall_us: i64) -> bool {
    request_deadline(f).is_some_and(|d| d <= wall_us)
}

/// What the shard must do.
#[derive(Debug)]
pub enum Effect {
    /// Send events to a session: `frames` (all, or the indexes in `pick`), each with its attempt.
    Deliver { to: SessionRef, subscription: String, frames: Arc<[Frame]>, pick: Option<Vec<u32>>, attempts: Vec<u16> },
    /// Store a consumer's position in a partition (before any `Deliver` after it is sent).
    Persist { key: Rc<ConsumerKey>, topic: String, partition: u32, stored: Stored },
    /// Append an event to the dead-letter topic, then report with
    /// [`Machine::dead_lettered`].
    DeadLetter { key: Rc<ConsumerKey>, gen: u64, partition: u32, offset: u64, attempts: u16, reason: &'static str },
    /// More to read than one turn may: call [`Machine::pump`] again soon.
    Continue { key: Rc<ConsumerKey>, partition: u32 },
}

impl Effect {
    fn dead_letter(
        key: &Rc<ConsumerKey>,
        gen: u64,
        partition: u32,
        offset: u64,
        attempts: u16,
        reason: &'static str,
    ) -> Effect {
        Effect::DeadLetter { key: key.clone(), gen, partition, offset, attempts, reason }
    }
}

/// Why an event is dead-lettered.
pub const ACK_TIMEOUT: &str = "ack-timeout";
pub const NACK: &str = "nack";
pub const REJECTED: &str = "rejected";

struct Consumer {
    /// Tells this incarnation from a later one of the same key (dead letters finish late).
    gen: u64,
    def: Rc<Definition>,
    filters: Rc<Vec<Filter>>,
    /// Positions are stored (false for clients without a `clientId`).
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
    /// Their stored size: bounds what a session that does not read can pin, and how far a new
    /// consumer reads ahead.
    bytes: usize,
    /// `MULTICAST`: the session's own filters.
    filters: Vec<Filter>,
}

impl Sess {
    /// Puts offset `o` in flight to this session until `deadline` (the ack deadline, for a
    /// request too: the deadline queue stays in delivery order, so one timer per consumer).
    fn take(&mut self, part: &mut Part, o: u64, attempt: u16, f: &Frame, deadline: Instant) {
        let bytes = f.as_bytes().len() as u32;
        let rpc = request_deadline(f).is_some();
        part.inflight.insert(o, InFlight { attempt, session: self.at, bytes, rpc });
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
    /// A request: settled, never retried, when its delivery fails.
    rpc: bool,
}

#[derive(Clone, Copy)]
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
    /// What was last stored (`None`: nothing yet, or a consumer whose positions are not kept).
    stored: Option<Stored>,
    /// Stopped because its session's window was full: an ack elsewhere may unblock it.
    stalled: bool,
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
    fn snapshot(&self, seen_ms: u64) -> Stored {
        let mut attempts: Vec<(u64, u16)> = self.inflight.iter().map(|(&o, f)| (o, f.attempt)).collect();
        attempts.extend(self.retry.iter().map(|(&o, r)| (o, r.attempt)));
        attempts.extend(self.dead.iter().map(|(&o, &a)| (o, a)));
        attempts.sort_unstable();
        Stored { committed: self.committed(), next: self.next, seen_ms, attempts }
    }

    /// A partition resumed from what was stored: every delivered, unsettled offset is due for
    /// redelivery at once, counting the attempts already made.
    fn restored(st: &Stored, persist: bool, now: Instant) -> Part {
        let next = st.next.max(st.committed);
        let retry = st
            .attempts
            .iter()
            .filter(|(o, _)| (st.committed..next).contains(o))
            .map(|&(o, attempt)| (o, Retry { attempt, due: now }))
            .collect();
        Part { next, retry, stored: persist.then(|| st.clone()), ..Part::default() }
    }

    /// An event of this partition failed (timed out, nacked, or its session left): due again
    /// at `due`, or dead-lettered if that was its last attempt. Returns `true` for the latter.
    fn failed(&mut self, o: u64, attempt: u16, max: u32, due: Instant) -> bool {
        if u32::from(attempt) >= max {
            self.dead.insert(o, attempt);
            true
        } else {
            self.retry.insert(o, Retry { attempt, due });
            false
        }
    }
}

/// A consumer's partitions on this shard: a handful, so a small vector (a `BTreeMap` node
/// would reserve room for eleven `Part`s per consumer, kilobytes per idle session).
#[derive(Default)]
struct Parts(Vec<(u32, Part)>);

impl Parts {
    fn get_mut(&mut self, p: u32) -> Option<&mut Part> {
        self.0.iter_mut().find(|(q, _)| *q == p).map(|(_, part)| part)
    }

    fn keys(&self) -> impl Iterator<Item = u32> + '_ {
        self.0.iter().map(|(p, _)| *p)
    }
}

/// This shard's consumers of the partitions it owns.
pub struct Machine {
    /// Keyed by `Rc` so the per-append walk over a topic's consumers copies no strings.
    consumers: HashMap<Rc<ConsumerKey>, Consumer>,
    next_gen: u64,
    rng: u64,
    /// `session_window_bytes`.
    window_bytes: usize,
    /// `redelivery_backoff_ms`.
    backoff_base: Duration,
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
    fn rc(&self, key: &ConsumerKey) -> Option<Rc<ConsumerKey>> {
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
            Err(i) => c.sessions.insert(i, sess),
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
                part.inflight.iter().filter(|(_, f)| f.session == at).map(|(&o, f)| (o, f.attempt, f.rpc)).collect();
            for (o, attempt, rpc) in gone {
                part.inflight.remove(&o);
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

    /// Acks, nacks or an up-to ack of partition `p`; `offsets` sorted. Returns `false` if the
    /// consumer has no state here (the shard then settles what is stored).
    #[allow(clippy::too_many_arguments)]
    pub fn ack(
        &mut self,
        key: &ConsumerKey,
        p: u32,
        offsets: &[u64],
        kind: AckKind,
        now: Instant,
        src: &impl Source,
        out: &mut Vec<Effect>,
    ) -> bool {
        let Some(rc) = self.rc(key) else { return false };
        let mut jitter = Jitter(&mut self.rng);
        let base = self.backoff_base;
        let c = self.consumers.get_mut(key).expect("just found");
        let (gen, max) = (c.gen, c.def.max_attempts);
        let Consumer { parts, sessions, persist: keep, def, .. } = c;
        let Some(part) = parts.get_mut(p) else { return true };
        let mut settle = |o: u64, part: &mut Part| -> Option<InFlight> {
            let f = part.inflight.remove(&o)?;
            if let Some(s) = sessions.iter_mut().find(|s| s.at == f.session) {
                s.release(&f);
            }
            Some(f)
        };
        match kind {
            AckKind::Ack => {
                for &o in offsets {
                    settle(o, part);
                    part.retry.remove(&o);
                }
            }
            // Only what was delivered can be confirmed: an id past that is ignored.
            AckKind::UpTo if offsets.iter().any(|&o| o >= part.next) => {}
            AckKind::UpTo => {
                let upto = offsets.iter().copied().max().unwrap_or(0);
                let done: Vec<u64> = part.inflight.range(..=upto).map(|(&o, _)| o).collect();
                for o in done {
                    settle(o, part);
                }
                part.retry = part.retry.split_off(&upto.saturating_add(1));
            }
            // Handed back unattempted (a webhook session holding its sink): due again after the
            // wait, its attempt not counted, so the next delivery carries the same number.
            AckKind::Release(ms) => {
                let due = now + Duration::from_millis(u64::from(ms));
                for &o in offsets {
                    let Some(f) = settle(o, part) else { continue };
                    if !f.rpc {
                        part.retry.insert(o, Retry { attempt: f.attempt.saturating_sub(1), due });
                    }
                }
            }
            // Refused for good (a classic subscriber's retCode 3): dead-lettered now.
            AckKind::Reject => {
                for &o in offsets {
                    let Some(f) = settle(o, part) else { continue };
                    if !f.rpc && part.failed(o, f.attempt, 0, now) {
                        out.push(Effect::dead_letter(&rc, gen, p, o, f.attempt, REJECTED));
                    }
                }
            }
            AckKind::Nack | AckKind::Defer(_) => {
                // A deferral (a webhook sink's `Retry-After`) is a failed attempt all the same,
                // tried again no sooner than it asked.
                let asked = match kind {
                    AckKind::Defer(ms) => Duration::from_millis(u64::from(ms)),
                    _ => Duration::ZERO,
                };
                for &o in offsets {
                    let Some(f) = settle(o, part) else { continue };
                    let due = now + jitter.backoff(base, f.attempt).max(asked);
                    if !f.rpc && part.failed(o, f.attempt, max, due) {
                        out.push(Effect::dead_letter(&rc, gen, p, o, f.attempt, NACK));
                    }
                }
            }
        }
        compact(part);
        persist(&rc, &def.topic, *keep, p, part, now_ms(), out);
        let mut unblocked = vec![p];
        unblocked.extend(parts.0.iter().filter(|(q, x)| *q != p && x.stalled).map(|(q, _)| *q));
        for q in unblocked {
            self.pump(key, q, None, now, src, out);
        }
        true
    }

    /// Newly stored events of a partition this shard owns: every consumer of the topic gets
    /// them, straight from `frames` when it is caught up (no log read).
    pub fn appended(
        &mut self,
        topic: &str,
        frames: &Arc<[Frame]>,
        now: Instant,
        src: &impl Source,
        out: &mut Vec<Effect>,
    ) {
        let Some(p) = frames.first().map(|f| f.header().partition) else { return };
        for k in self.consumers_of(topic) {
            self.pump(&k, p, Some(frames), now, src, out);
        }
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

    /// Expires unacknowledged deliveries past their deadline and sends due redeliveries.
    pub fn tick(&mut self, now: Instant, src: &impl Source, out: &mut Vec<Effect>) {
        let mut work: Vec<(Rc<ConsumerKey>, u32)> = Vec::new();
        let base = self.backoff_base;
        let mut jitter = Jitter(&mut self.rng);
        for (key, c) in self.consumers.iter_mut() {
            let max = c.def.max_attempts;
            let Consumer { parts, sessions, gen, .. } = c;
            for (p, part) in parts.0.iter_mut() {
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
                    if !f.rpc && part.failed(o, attempt, max, now + jitter.backoff(base, attempt)) {
                        out.push(Effect::dead_letter(key, *gen, *p, o, attempt, ACK_TIMEOUT));
                    }
                }
                let due = part.retry.first_key_value().is_some_and(|(_, r)| r.due <= now);
                if expired || due {
                    work.push((key.clone(), *p));
                }
            }
        }
        for (key, p) in work {
            self.pump(&key, p, None, now, src, out);
        }
    }

    /// A dead letter was written (`ok`) or could not be (it is tried again after the longest
    /// backoff). Returns `false` if that consumer incarnation is gone (the shard then settles
    /// what is stored).
    #[allow(clippy::too_many_arguments)]
    pub fn dead_lettered(
        &mut self,
        key: &ConsumerKey,
        gen: u64,
        p: u32,
        o: u64,
        attempts: u16,
        ok: bool,
        now: Instant,
        src: &impl Source,
        out: &mut Vec<Effect>,
    ) -> bool {
        let due = now + Jitter(&mut self.rng).backoff(self.backoff_base, 5);
        let Some(rc) = self.rc(key) else { return false };
        let c = self.consumers.get_mut(key).expect("just found");
        if c.gen != gen {
            return false;
        }
        let Some(part) = c.parts.get_mut(p) else { return true };
        part.dead.remove(&o);
        if !ok {
            part.retry.insert(o, Retry { attempt: attempts.saturating_sub(1), due });
        }
        persist(&rc, &c.def.topic, c.persist, p, part, now_ms(), out);
        self.pump(key, p, None, now, src, out);
        true
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

    /// Sends a consumer's partition what its holder has room for: due redeliveries first, then
    /// new events (from `fresh` when it continues exactly where the consumer is, else the log).
    pub fn pump(
        &mut self,
        key: &ConsumerKey,
        p: u32,
        fresh: Option<&Arc<[Frame]>>,
        now: Instant,
        src: &impl Source,
        out: &mut Vec<Effect>,
    ) {
        let window_bytes = self.window_bytes;
        let Some(rc) = self.rc(key) else { return };
        let c = self.consumers.get_mut(key).expect("just found");
        if c.sessions.is_empty() {
            return;
        }
        let (gen, max) = (c.gen, c.def.max_attempts);
        let holder = p as usize % c.sessions.len();
        let timeout = Duration::from_millis(c.def.ack_timeout_ms);
        let def = c.def.clone();
        let topic = def.topic.as_str();
        // A webhook (a sink, classic push URLs) gets a partition's events one at a time (its
        // order kept across failures: a redelivery waiting for its backoff holds the partition).
        let part_max = if def.pushed() { 1 } else { PART_INFLIGHT };
        let end = src.end(topic, p);
        let wall = src.wall_us();
        let mut skipped = 0;
        let Consumer { parts, sessions, filters, persist: keep, .. } = c;
        let Some(part) = parts.get_mut(p) else { return };
        let sess = &mut sessions[holder];
        part.stalled = false;
        let wanted = |f: &Frame, s: &Sess| matches_all(filters, f.body()) && matches_all(&s.filters, f.body());
        let (mut read, mut read_attempts, mut pick) = (Vec::new(), Vec::new(), Vec::new());
        let mut dead = Vec::new();
        let mut scanned = 0;
        let mut more = false;
        loop {
            let room_s = sess.window.saturating_sub(sess.inflight) as usize;
            let room = room_s.min(part_max.saturating_sub(part.inflight.len() + part.dead.len()));
            // At least one event may always be in flight, however large.
            let full_bytes = sess.inflight > 0 && sess.bytes >= window_bytes;
            if room == 0 || full_bytes {
                part.stalled = room_s == 0 || full_bytes;
                break;
            }
            let bytes_room = window_bytes.saturating_sub(sess.bytes).max(1);
            if let Some((&o, &Retry { attempt: made, due })) = part.retry.first_key_value() {
                let spent = u32::from(made) >= max;
                if (!spent && due > now) || end.is_none_or(|e| o >= e) {
                    // Newer events wait behind a redelivery (sticky order); so does one not
                    // readable yet (the Kafka backend's local copy refilling after a crash):
                    // what it is (a request?) and its dead letter need the event.
                    break;
                }
                let Some(mut got) = src.read(topic, p, o, 1, usize::MAX) else {
                    break; // unreadable for now: it stays first in line, tried again next tick
                };
                part.retry.remove(&o);
                match got.pop().filter(|f| f.header().offset == o) {
                    // A request is never redelivered nor dead-lettered (only a restart puts
                    // one here): settled.
                    Some(f) if request_deadline(&f).is_some() => {}
                    // Its attempts ran out while no session held it (a disconnect, a restart).
                    Some(_) if spent => {
                        part.dead.insert(o, made);
                        dead.push((o, made));
                    }
                    Some(f) => {
                        let attempt = made.saturating_add(1);
                        sess.take(part, o, attempt, &f, now + timeout);
                        read.push(f);
                        read_attempts.push(attempt);
                    }
                    None => {} // gone by retention, nothing left to redeliver
                }
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
                    if expired(f, wall) {
                        skipped += 1;
                    } else if wanted(f, sess) {
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
                more = true; // a selective filter over a long backlog: continue later
                break;
            }
            // Read ahead lazily: no more events, and no more bytes, than the session has room
            // for (a new consumer of large events does not pull hundreds into memory).
            let got = src.read(topic, p, part.next, room.min(READ_BATCH), bytes_room).unwrap_or_default();
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
                if expired(&f, wall) {
                    skipped += 1;
                } else if wanted(&f, sess) {
                    sess.take(part, o, 1, &f, now + timeout);
                    read.push(f);
                    read_attempts.push(1);
                }
            }
        }
        let to = sess.at;
        self.expired += skipped;
        persist(&rc, topic, *keep, p, part, now_ms(), out);
        for (o, attempts) in dead {
            out.push(Effect::dead_letter(&rc, gen, p, o, attempts, ACK_TIMEOUT));
        }
        if !read.is_empty() {
            let subscription = key.subscription.clone();
            out.push(Effect::Deliver { to, subscription, frames: read.into(), pick: None, attempts: read_attempts });
        }
        if let (false, Some(fr)) = (pick.is_empty(), fresh) {
            let attempts = vec![1; pick.len()];
            let subscription = key.subscription.clone();
            out.push(Effect::Deliver { to, subscription, frames: fr.clone(), pick: Some(pick), attempts });
        }
        if more {
            out.push(Effect::Continue { key: rc, partition: p });
        }
    }
}

/// Milliseconds since the Unix epoch, for the stored "last seen": the one clock reading the
/// machine takes itself (it is a label on stored data, never a decision).
fn now_ms() -> u64 {
    crate::model::clock::now_ms()
}

/// Pushes a `Persist` if the position of `p` changed since it was last stored.
fn persist(
    key: &Rc<ConsumerKey>,
    topic: &str,
    keep: bool,
    p: u32,
    part: &mut Part,
    seen_ms: u64,
    out: &mut Vec<Effect>,
) {
    if !keep {
        return;
    }
    let snap = part.snapshot(seen_ms);
    let same = part
        .stored
        .as_ref()
        .is_some_and(|st| st.committed == snap.committed && st.next == snap.next && st.attempts == snap.attempts);
    if same {
        return;
    }
    part.stored = Some(snap.clone());
    out.push(Effect::Persist { key: key.clone(), topic: topic.to_owned(), partition: p, stored: snap });
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

/// The jitter source: xorshift64* (jitter needs no cryptography, only spread).
struct Jitter<'a>(&'a mut u64);

impl Jitter<'_> {
    /// Redelivery backoff after `attempt` attempts: base * 2^(attempt-1), at most 16x, + <= 20%.
    fn backoff(&mut self, base: Duration, attempt: u16) -> Duration {
        let d = base * (1u32 << u32::from(attempt.clamp(1, 5) - 1));
        let mut x = *self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        *self.0 = x;
        let jitter = (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64;
        d + d.mul_f64(0.2 * jitter)
    }
}

#[cfg(test)]
mod tests;
