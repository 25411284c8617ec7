//! The shard's side of acknowledged delivery: it builds each consumer's state from what is
//! stored, feeds the pure [`crate::delivery::machine`] its inputs (session changes, acks,
//! appends, the clock), executes the effects it returns, and settles what is stored for
//! consumers that have no state here. The routing of session changes and acks to the owning
//! shards is here too.

use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use frame_codec::{AttrValue, Attribute, Frame};
use futures::channel::oneshot;

use super::core::Shard;
use super::mailbox::Sender;
use super::message::{Acks, Delivery, SessionChange, SessionEvent, ShardMessage};
use crate::delivery::machine::{Effect, Machine, Source};
use crate::model::delivery::{AckKind, ConsumerKey};
use crate::model::placement::{owned_partitions, owner, partition_of};
use crate::model::{PartitionId, ShardId};
use crate::storage::{meta, offsets, tier, Log, Storage, StorageError};
use crate::subscription::definition::{Definition, Mode, Start};
use crate::subscription::filter;

/// Stored positions one client-expiry pass looks at (it goes on where it stopped next pass).
const EXPIRE_SCAN: usize = 10_000;

/// How often ack timeouts and due redeliveries are checked.
const TICK: Duration = Duration::from_millis(20);

/// With Kafka: how long stored offsets gather before they are written to the claims' log
/// (the last value of each key only). A takeover may repeat what was acked in the last one.
const REPLICATE_EVERY: Duration = Duration::from_millis(10);

/// How soon a partition whose read found tiered history being fetched is pumped again, and
/// one whose bucket could not be read.
const FETCH_POLL: Duration = Duration::from_millis(10);
const UNREACHABLE_POLL: Duration = Duration::from_secs(1);
/// How long dead-lettering waits for an event being fetched from the bucket before it fails
/// (and is retried).
const DEAD_LETTER_WAIT: Duration = Duration::from_secs(10);

/// The shard's log as the machine reads it, noting the partitions whose reads wait for
/// tiered history being fetched (pumped again shortly: nothing else would wake them).
struct LogSource<'a> {
    log: &'a Log,
    fetching: std::cell::RefCell<Vec<(String, u32, Duration)>>,
}

impl Source for LogSource<'_> {
    fn end(&self, topic: &str, partition: u32) -> Option<u64> {
        self.log.next_offset_of(topic, PartitionId(partition)).ok()
    }

    fn read(&self, topic: &str, partition: u32, from: u64, max: usize, max_bytes: usize) -> Option<Vec<Frame>> {
        match self.log.read(topic, PartitionId(partition), from, max, max_bytes) {
            Ok(got) => Some(got),
            Err(StorageError::Unavailable(why)) if why == tier::FETCHING || why == tier::UNREACHABLE => {
                let after = if why == tier::FETCHING { FETCH_POLL } else { UNREACHABLE_POLL };
                self.fetching.borrow_mut().push((topic.to_owned(), partition, after));
                None
            }
            Err(_) => None,
        }
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
        let (key, at) = (e.consumer, e.session);
        match e.change {
            SessionChange::Attach { window, filters, persist } => {
                if let Err(err) = self.ensure_consumer(&key, persist) {
                    crate::log::warn(
                        "delivery",
                        &format!("{}: cannot serve {}: {err}", self.id, key.subscription),
                        &[],
                    );
                    return;
                }
                let filters = filters
                    .and_then(|j| serde_json::from_str(&j).ok())
                    .and_then(|j: serde_json::Value| filter::compile(Some(&j)).ok())
                    .unwrap_or_default();
                self.run(|m, now, src, out| m.attach(&key, at, window, filters, now, src, out));
            }
            SessionChange::Detach => self.run(|m, now, src, out| m.detach(&key, at, now, src, out)),
            SessionChange::Window(n) => self.run(|m, now, src, out| m.window(&key, at, n, now, src, out)),
        }
    }

    /// Feeds the machine one input and executes the effects it returns. The machine is not
    /// borrowed while they run (a delivery to this shard's own sessions, say).
    fn run<R>(self: &Rc<Self>, input: impl FnOnce(&mut Machine, Instant, &LogSource<'_>, &mut Vec<Effect>) -> R) -> R {
        let mut out = Vec::new();
        let src = LogSource { log: &self.log, fetching: Default::default() };
        let r = {
            let mut m = self.delivery.machine.borrow_mut();
            let r = input(&mut m, Instant::now(), &src, &mut out);
            if m.expired > 0 {
                self.shared.metrics.shard(self.id).requests_expired.add(std::mem::take(&mut m.expired));
            }
            r
        };
        let fetching = src.fetching.take();
        self.execute(out);
        for (topic, p, after) in fetching {
            self.pump_after_fetch(topic, p, after);
        }
        r
    }

    /// Pumps a partition's consumers again `after`: its read found tiered history being
    /// fetched from the bucket, or the bucket unreachable (once per partition meanwhile).
    fn pump_after_fetch(self: &Rc<Self>, topic: String, p: u32, after: Duration) {
        if !self.delivery.fetching.borrow_mut().insert((topic.clone(), p)) {
            return;
        }
        let me = self.clone();
        monoio::spawn(async move {
            monoio::time::sleep(after).await;
            me.delivery.fetching.borrow_mut().remove(&(topic.clone(), p));
            me.run(|m, now, src, out| m.wake(&topic, p, now, src, out));
        });
    }

    /// Executes the machine's effects, in order.
    fn execute(self: &Rc<Self>, effects: Vec<Effect>) {
        for e in effects {
            match e {
                Effect::Persist { key, topic, partition, stored } => {
                    let k = offsets::key(&topic, &key.subscription, PartitionId(partition), &key.client);
                    let value = stored.encode();
                    if let Err(e) = offsets::put_encoded(&self.shared.db, self.id, &k, &value) {
                        crate::log::warn(
                            "delivery",
                            &format!("{}: storing the offset of {}: {e}", self.id, key.subscription),
                            &[],
                        );
                    }
                    if self.replicating()
                        && !self.delivery.defs.borrow().get(&key.subscription).is_some_and(|(d, _)| d.pushed())
                    {
                        self.replicate_offset(k, Some(value));
                    }
                }
                Effect::Deliver { to, subscription, frames, pick, attempts } => {
                    let m = self.shared.metrics.shard(self.id);
                    m.redeliveries.add(attempts.iter().filter(|&&a| a > 1).count() as u64);
                    let d = Delivery { subscription, session: Some(to.id), frames, pick, attempts };
                    self.send_delivery(to.shard, d);
                }
                Effect::DeadLetter { key, gen, partition, offset, attempts, reason } => {
                    self.dead_letter(key, gen, partition, offset, attempts, reason)
                }
                Effect::Continue { key, partition } => {
                    // Bounded work per turn: let other tasks of this core run, then go on.
                    let me = self.clone();
                    monoio::spawn(async move {
                        crate::task::yield_now().await;
                        me.run(|m, now, src, out| m.pump(&key, partition, None, now, src, out));
                    });
                }
            }
        }
    }

    /// Creates the consumer's state for the partitions this shard owns, if it has none yet,
    /// from what is stored for it (or its start position).
    fn ensure_consumer(self: &Rc<Self>, key: &ConsumerKey, persist: bool) -> Result<(), StorageError> {
        if self.delivery.machine.borrow().contains(key) {
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
        let mut positions = Vec::new();
        for p in owned_partitions(&def.topic, topic.partitions, self.id, self.shared.config.shards) {
            positions.push((p.0, self.start_offset(&def, key, p, persist)?));
        }
        let topic = def.topic.clone();
        self.delivery.machine.borrow_mut().create(key, def, filters, persist, positions, Instant::now());
        self.shared.follow_topic(&topic);
        Ok(())
    }

    /// Where a consumer reads a partition from: what is stored for it (position and attempts
    /// made), else the subscription's `start` (stored at once, so the start does not move on a
    /// restart).
    fn start_offset(
        self: &Rc<Self>,
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
                self.log.offset_for_time(&def.topic, p, def.created_us)?
            }
            Start::Named(_) => b.end,
            Start::Offset { offset } => (*offset).clamp(b.start, b.end),
            Start::Time { time } => {
                self.log.offset_for_time(&def.topic, p, crate::adaptor::rfc3339_micros(time).unwrap_or(0))?
            }
        };
        let st = offsets::Stored::at(o);
        if persist {
            offsets::put(db, self.id, &k, &st)?;
            // Where it starts is decided once, for a new home too ("latest" is now).
            if self.replicating() && !def.pushed() {
                self.replicate_offset(k, Some(st.encode()));
            }
        }
        Ok(st)
    }

    /// Newly stored events of a partition this shard owns, for its acked `consumers`: each gets
    /// them straight from `frames` when it is caught up (no log read). Consumers are many and
    /// their filters may each take a millisecond or two: this yields every `task::SLICE` of
    /// work (the caller keeps fan-outs in order, see `Shard::fan_out`).
    pub async fn deliver_new(
        self: &Rc<Self>,
        consumers: Vec<Rc<ConsumerKey>>,
        frames: &Arc<[Frame]>,
        slice: &mut crate::task::Slice,
    ) {
        let Some(p) = frames.first().map(|f| f.header().partition) else { return };
        for k in consumers {
            self.run(|m, now, src, out| m.pump(&k, p, Some(frames), now, src, out));
            slice.next().await;
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
        self.shared.metrics.shard(self.id).acks.add(a.offsets.len() as u64);
        let (p, kind) = (a.partition.0, a.kind);
        let here = self.run(|m, now, src, out| m.ack(&a.consumer, p, &a.offsets, kind, now, src, out));
        if !here {
            self.settle_detached(&a);
        }
    }

    /// Acks for a consumer with no session here (its last one left before they arrived, or an
    /// SSE client resumes after its old stream ended): they settle what is stored. Only what
    /// was delivered (below the stored `next`) can have been received, so an id naming
    /// anything else changes nothing and keeps nothing. Nacks change nothing (the event is
    /// redelivered anyway).
    fn settle_detached(self: &Rc<Self>, a: &Acks) {
        let settles = matches!(a.kind, AckKind::Ack | AckKind::UpTo);
        if !settles || a.consumer.client.starts_with('~') {
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
    fn settle_stored(
        self: &Rc<Self>,
        consumer: &ConsumerKey,
        p: PartitionId,
        change: impl FnOnce(&mut offsets::Stored),
    ) {
        let db = &self.shared.db;
        let Ok(Some(def)) = meta::get_subscription(db, &consumer.subscription) else { return };
        let k = offsets::key(&def.topic, &consumer.subscription, p, &consumer.client);
        let Ok(Some(mut st)) = offsets::get(db, self.id, &k) else { return };
        let before = st.clone();
        change(&mut st);
        st.committed = st.attempts.first().map_or(st.next, |&(o, _)| o).max(st.committed);
        if st != before {
            st.seen_ms = crate::model::clock::now_ms();
            let value = st.encode();
            if let Err(e) = offsets::put_encoded(db, self.id, &k, &value) {
                crate::log::warn(
                    "delivery",
                    &format!("{}: storing the offset of {}: {e}", self.id, consumer.subscription),
                    &[],
                );
            }
            if self.replicating() && !def.pushed() {
                self.replicate_offset(k, Some(value));
            }
        }
    }

    /// Appends an event that ran out of attempts to `<topic>.dlq`, then tells the machine
    /// (which settles it on the source, or schedules it again if the append failed).
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
                let what = format!("{}@{p}:{o}", key.subscription);
                crate::log::warn("dlq", "dead-lettering failed, retrying", &[("event", &what), ("error", e)]);
            } else {
                me.shared.metrics.shard(me.id).dead_lettered.inc();
            }
            let ok = r.is_ok();
            let here = me.run(|m, now, src, out| m.dead_lettered(&key, gen, p, o, attempts, ok, now, src, out));
            if !here && ok {
                // Its sessions left meanwhile: settle what was stored for it, so the event is
                // not dead-lettered again when the consumer comes back.
                me.settle_stored(&key, PartitionId(p), |st| st.attempts.retain(|&(x, _)| x != o));
            }
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
        // Also when its last session left meanwhile: the event is dead-lettered all the same.
        let cached = self.delivery.defs.borrow().get(&key.subscription).map(|(d, _)| d.topic.clone());
        let topic = match cached {
            Some(t) => t,
            None => match meta::get_subscription(&self.shared.db, &key.subscription)? {
                Some(def) => def.topic,
                None => return Ok(()), // the subscription was removed: nothing to keep
            },
        };
        // An event only in the tier's bucket is fetched first (waited for: this is its own task).
        let mut waited = Duration::ZERO;
        let read = loop {
            match self.log.read(&topic, PartitionId(p), o, 1, usize::MAX) {
                Err(StorageError::Unavailable(tier::FETCHING)) if waited < DEAD_LETTER_WAIT => {
                    monoio::time::sleep(FETCH_POLL).await;
                    waited += FETCH_POLL;
                }
                r => break r?,
            }
        };
        let Some(f) = read.into_iter().next().filter(|f| f.header().offset == o) else {
            return Ok(()); // gone by retention
        };
        if f.header().kind == frame_codec::FrameKind::Request {
            return Ok(()); // requests are never dead-lettered (the machine settles them first)
        }
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
        frame.set_timestamp(crate::model::clock::now_micros());
        let (m, _) = self.topic(&dlq, None, true).await?;
        // Its local copy is read (GET /admin/dlq, replays): followed where dead letters go.
        self.shared.follow_topic(&dlq);
        let partition = partition_of(&frame, m.partitions).unwrap_or_else(|| self.local_partition(&dlq, &m));
        // The stored event's own attributes (`f`, read in place), not the copy's.
        let stored = f.body();
        let context = stored.attr_str("traceparent").and_then(crate::trace::TraceParent::parse);
        let span = context.filter(|c| crate::trace::on() && c.sampled()).map(|c| {
            let kind = crate::trace::Kind::Producer;
            crate::trace::Span::messaging(
                c.trace_id,
                Some(c.span_id),
                kind,
                "dead-letter",
                &dlq,
                crate::trace::now_ns(),
            )
            .event(stored.attr_str("id").unwrap_or_default(), stored.attr_str("type").unwrap_or_default())
            .with("messaging.consumer.group.name", key.subscription.clone())
            .with("messaging.evmesh.reason", reason.to_owned())
            .with("messaging.evmesh.attempts", u64::from(attempts))
        });
        let appended = self.append(&dlq, partition, vec![frame]).await;
        let trace_id = context.map(|c| {
            let mut s = String::with_capacity(32);
            crate::trace::context::hex_into(&c.trace_id, &mut s);
            s
        });
        if appended.is_ok() {
            crate::log::warn(
                "dlq",
                "dead-lettered",
                &[
                    ("subscription", &key.subscription),
                    ("topic", &topic),
                    ("partition", &p),
                    ("offset", &o),
                    ("attempts", &attempts),
                    ("reason", &reason),
                    ("trace_id", &trace_id.as_deref().unwrap_or("-")),
                ],
            );
        }
        match (span, &appended) {
            (Some(s), Ok(at)) => s.stored_at(partition.0, *at).end(None),
            (Some(s), Err(e)) => s.end(Some(e.to_string().into())),
            (None, _) => {}
        }
        appended.map(|_| ())
    }

    /// Expires unacknowledged deliveries and sends due redeliveries, forever.
    pub async fn delivery_timers(self: Rc<Self>) {
        loop {
            monoio::time::sleep(TICK).await;
            self.run(|m, now, src, out| m.tick(now, src, out));
        }
    }

    /// Forgets the stored offsets of clients not seen for `client_offset_ttl_ms` (those with a
    /// session attached are seen now, and kept). Bounded work per pass.
    pub fn expire_clients(self: &Rc<Self>) {
        let Some(ttl) = self.shared.config.client_offset_ttl else { return };
        let before = crate::model::clock::now_ms().saturating_sub(ttl.as_millis() as u64);
        let db = &self.shared.db;
        let from = std::mem::take(&mut *self.delivery.expire_cursor.borrow_mut());
        let keys = match offsets::expired_clients(db, self.id, &from, before, EXPIRE_SCAN) {
            Ok((keys, next)) => {
                *self.delivery.expire_cursor.borrow_mut() = next.unwrap_or_default();
                keys
            }
            Err(e) => return crate::log::warn("delivery", &format!("{}: listing client offsets: {e}", self.id), &[]),
        };
        let machine = self.delivery.machine.borrow();
        for k in keys {
            let text = String::from_utf8_lossy(&k);
            let mut parts = text.splitn(4, '#');
            let (Some(_topic), Some(subscription), Some(_p), Some(client)) =
                (parts.next(), parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            let live = ConsumerKey { subscription: subscription.to_owned(), client: client.to_owned() };
            if machine.contains(&live) {
                continue;
            }
            // Over Kafka only the home expires clients (it sees their sessions; the others'
            // copies of its offsets go with its deletes).
            let home = self.replicating().then(|| {
                let key = crate::cluster::homes::subscription_key(subscription);
                self.shared.cluster.homes().names(&key, &self.shared.config.instance_id)
            });
            if home == Some(false) {
                continue;
            }
            if let Err(e) = offsets::delete(db, self.id, &k) {
                crate::log::warn("delivery", &format!("{}: expiring client offsets: {e}", self.id), &[]);
            }
            if home == Some(true) {
                self.replicate_offset(k, None);
            }
        }
    }

    /// Whether stored offsets go to the other instances too (`storage = kafka`).
    fn replicating(&self) -> bool {
        self.shared.cluster.replicates_offsets()
    }

    /// An offset this shard stored (`None`: deleted) goes to the other instances
    /// (`cluster::homes`, "Offsets"), gathered for [`REPLICATE_EVERY`].
    fn replicate_offset(self: &Rc<Self>, key: Vec<u8>, value: Option<Vec<u8>>) {
        if !self.replicating() {
            return;
        }
        let first = {
            let mut pending = self.delivery.replicate.borrow_mut();
            let first = pending.is_empty();
            pending.insert(key, value);
            first
        };
        if first {
            let me = self.clone();
            monoio::spawn(async move {
                monoio::time::sleep(REPLICATE_EVERY).await;
                let pending = std::mem::take(&mut *me.delivery.replicate.borrow_mut());
                let (mut failed, mut last) = (0, None);
                for (k, v) in pending {
                    let Ok(k) = String::from_utf8(k) else { continue };
                    if let Err(e) = me.shared.cluster.replicate_offset(&k, v.as_deref()) {
                        (failed, last) = (failed + 1, Some(e));
                    }
                }
                // One line a flush (Kafka away fails them all), not one per key.
                if let Some(e) = last {
                    crate::log::warn(
                        "delivery",
                        &format!("{}: {failed} offsets not written to kafka: {e}", me.id),
                        &[],
                    );
                }
            });
        }
    }

    /// A subscription was removed: its consumers here end and their offsets are forgotten.
    pub fn forget_subscription(self: &Rc<Self>, subscription: &str, topic: &str) {
        self.delivery.machine.borrow_mut().forget(subscription);
        self.delivery.defs.borrow_mut().remove(subscription);
        // Over Kafka its offset records are deleted from the claims' log too, so compaction
        // drops them (every instance that had a copy says so; readers take none: the claim
        // went with the subscription).
        if self.replicating() {
            match offsets::list(&self.shared.db, self.id, topic, subscription) {
                Ok(stored) => {
                    for c in stored {
                        let k = offsets::key(topic, subscription, PartitionId(c.partition), &c.client);
                        self.replicate_offset(k, None);
                    }
                }
                Err(e) => {
                    crate::log::warn("delivery", &format!("{}: listing offsets of {subscription}: {e}", self.id), &[])
                }
            }
        }
        if let Err(e) = offsets::delete_all(&self.shared.db, self.id, topic, subscription) {
            crate::log::warn("delivery", &format!("{}: forgetting offsets of {subscription}: {e}", self.id), &[]);
        }
    }
}
