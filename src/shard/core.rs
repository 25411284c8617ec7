//! One core's state ([`Shard`]): topics, routing (here or on the owner), appends and fan-out. The
//! pump that feeds it what other cores send is `runtime::pump`.
//!
//! `Shard` is `Rc`, never `Send`: connection tasks and the pump of one thread share it through
//! `Rc`/`Cell`/`RefCell`, and other cores reach it only with messages. Borrows of its `RefCell`s
//! are never held across an `.await`.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use frame_codec::Frame;

use super::mailbox::{answer, Asked, Overflow, Sender, CROSS_CORE_DEADLINE};
use super::message::{
    Delivery, EnsureReply, Interest, InterestChange, ReplyMessage, ShardMessage, SubOutcome, SubReply, SubRequest,
};
use super::requests::{Correlation, Replier};
use super::sessions::Sessions;
use crate::delivery::machine::expired;
use crate::model::placement::{meta_owner, owned_partitions, owner};
use crate::model::{PartitionId, ReplyOutcome, ShardId, StoredTopic};
use crate::shard::shared::Shared;
use crate::storage::embedded::EmbeddedLog;
use crate::storage::{meta, Durability, Log, Storage, StorageError, TopicMeta};
use crate::subscription::definition::Definition;
use crate::subscription::filter::{matches_all, Filter};
use crate::task::{Gate, Place};

/// A topic as one shard knows it.
struct KnownTopic {
    meta: TopicMeta,
    /// The partitions of the topic this shard owns.
    mine: Rc<[PartitionId]>,
}

/// How long a name the broker said it does not have is answered 404 without asking again.
const ABSENT_FOR: Duration = Duration::from_secs(2);
/// How long a lookup the broker could not answer (away, say) is answered so without asking
/// again.
const FAILED_FOR: Duration = Duration::from_secs(1);
/// Names remembered so at most (per shard).
const MAX_ABSENT: usize = 4096;
/// Topics a shard creates or looks up on the broker at once at most (asks waiting for one of
/// them not counted: they ask nothing).
const MAX_LOOKUPS: usize = 64;
/// How long an ask for a topic waits for another ask for it to end.
const TOPIC_WAIT: Duration = Duration::from_secs(30);

/// A topic being made (or looked up) on its meta owner: its entry in `Shard::making`, removed
/// on drop, however the ask ends (a caller dropped mid-way too), and its waiters woken.
struct Making<'a> {
    making: &'a RefCell<HashMap<String, Vec<futures::channel::oneshot::Sender<()>>>>,
    topic: &'a str,
}

impl<'a> Making<'a> {
    fn start(making: &'a RefCell<HashMap<String, Vec<futures::channel::oneshot::Sender<()>>>>, topic: &'a str) -> Self {
        making.borrow_mut().insert(topic.to_owned(), Vec::new());
        Making { making, topic }
    }
}

impl Drop for Making<'_> {
    fn drop(&mut self) {
        for waiter in self.making.borrow_mut().remove(self.topic).unwrap_or_default() {
            let _ = waiter.send(());
        }
    }
}

/// A slot of a cap (`max_topics`, `max_subscriptions`) claimed for what is being made: given
/// back on drop unless kept (it was stored), however the making ends.
struct Claim<'a> {
    count: &'a std::sync::atomic::AtomicUsize,
    kept: bool,
}

impl<'a> Claim<'a> {
    /// A slot, if fewer than `max` are taken.
    fn take(count: &'a std::sync::atomic::AtomicUsize, max: usize) -> Option<Self> {
        if count.fetch_add(1, std::sync::atomic::Ordering::AcqRel) >= max {
            count.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
            return None;
        }
        Some(Claim { count, kept: false })
    }

    fn keep(mut self) {
        self.kept = true;
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        if !self.kept {
            self.count.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
        }
    }
}

/// The partition count of a topic the broker has, if evmesh serves that many.
fn served(topic: &str, partitions: u32) -> Result<u32, StorageError> {
    if (1..=crate::model::MAX_PARTITIONS).contains(&partitions) {
        Ok(partitions)
    } else {
        Err(StorageError::Limit(format!(
            "topic {topic} has {partitions} partitions in Kafka; evmesh serves topics of 1 to {}",
            crate::model::MAX_PARTITIONS
        )))
    }
}

/// A shard that wants a subscription's events from this shard's partitions.
struct Interested {
    subscription: String,
    shard: ShardId,
    /// The subscription's filters, compiled once when the interest arrived.
    filters: Rc<Vec<Filter>>,
}

pub struct Shard {
    pub id: ShardId,
    pub shared: Arc<Shared>,
    pub log: Log,
    /// Topic settings this shard has seen, with the partitions it owns; a topic's count only
    /// ever grows (with Kafka), and this cache never lowers one.
    topics: RefCell<HashMap<String, KnownTopic>>,
    /// As meta owner: topics being created or looked up on the broker now, each with the
    /// asks waiting for it to end (a second ask for a topic waits for the first, [`Making`]),
    /// and what the broker answered for names it could not give, until when (a name it does not
    /// have for [`ABSENT_FOR`], a failed ask for [`FAILED_FOR`]): what a client naming topics
    /// at random can make this shard ask of Kafka.
    making: RefCell<HashMap<String, Vec<futures::channel::oneshot::Sender<()>>>>,
    absent: RefCell<HashMap<String, (std::time::Instant, StorageError)>>,
    /// Round-robin cursor over this shard's own partitions for unkeyed events.
    cursor: Cell<usize>,
    pub connections: Cell<usize>,
    /// Requests sent on by another instance waiting here for their subscription's definition
    /// (`ingress`: at most `MAX_DEFINITION_WAITS`; anyone can mark a request as sent on).
    pub definition_waits: Cell<usize>,
    /// `POST /session/open` requests this shard is making at an agent's home instance for
    /// their callers (`ingress::call`).
    pub opens_elsewhere: Cell<usize>,
    /// Sessions this shard accepted.
    pub sessions: Sessions,
    /// Per topic, the shards that want events of its partitions this shard owns.
    /// Per topic; shared with fan-outs in progress (changed copy-on-write).
    interest: RefCell<HashMap<String, Rc<Vec<Rc<Interested>>>>>,
    /// Acknowledged delivery from the partitions this shard owns (`crate::delivery`).
    pub delivery: crate::delivery::Dispatcher,
    /// Per destination shard, control messages its full control ring could not take yet, in
    /// order; a task per non-empty outbox retries them (`send_control`).
    outbox: RefCell<Vec<VecDeque<ShardMessage>>>,
    flushing: RefCell<Vec<bool>>,
    /// Per topic: its fan-outs of stored events pass one at a time, in append order (they
    /// may yield half-way). At most one small entry per topic.
    fanning: RefCell<HashMap<String, Rc<Gate>>>,
    /// Policy changes (keys, ACL) as this shard has seen them, for its sessions
    /// (`push::authority`, ticked by `push::watch_policy`).
    pub policy: crate::governance::Changes,
    /// Request-reply: the requests of this shard's connections waiting for their reply.
    pub requests: super::requests::Requests,
    /// Starts the webhook session of a subscription with a sink whose name this shard owns
    /// (`push::webhook::start`, set at start: push sits above the shard).
    pub sink_starter: Cell<Option<SinkStarter>>,
    /// Starts the push sessions of a subscription's classic push URLs homed here that are not
    /// running (`push::webhook::sync_pushes`, set at start).
    pub pushes_changed: Cell<Option<PushesChanged>>,
}

/// See [`Shard::pushes_changed`].
pub type PushesChanged = fn(&Rc<Shard>, &str);

/// See [`Shard::sink_starter`].
pub type SinkStarter = fn(&Rc<Shard>, Definition);

/// A lite topic's settings: one partition; it expires whole after `lite_topic_ttl_ms` idle.
const LITE_META: TopicMeta = TopicMeta { partitions: 1, retention_ms: None, retention_bytes: None };

/// Control messages waiting in one outbox past which acks are refused (503) or a session's
/// reader waits: what a client floods us with is held at its socket, not here.
pub const OUTBOX_HIGH: usize = 1024;

impl Shard {
    pub fn new(id: ShardId, shared: Arc<Shared>) -> Self {
        let shards = shared.config.shards;
        let delivery = crate::delivery::Dispatcher::new(&shared.config);
        let ttl = shared.config.lite_topic_ttl;
        let embedded = || {
            EmbeddedLog::new(
                shared.db.clone(),
                shared.logs.clone(),
                id,
                shared.config.durability,
                shared.syncer.clone(),
                ttl,
            )
        };
        #[cfg(feature = "kafka")]
        let log = match &shared.kafka {
            None => Log::Embedded(embedded()),
            // The local copy needs no WAL: Kafka is the durable log, the tail refills the copy.
            Some(k) => {
                let local = EmbeddedLog::new(shared.db.clone(), shared.logs.clone(), id, Durability::Memory, None, ttl);
                Log::Kafka(crate::storage::kafka::KafkaLog::new(k.clone(), local, embedded()))
            }
        };
        #[cfg(not(feature = "kafka"))]
        let log = Log::Embedded(embedded());
        let requests = super::requests::Requests::new(
            (crate::cluster::replies::instance_tag(&shared.config.instance_id), id),
            shared.config.max_pending_requests,
            shared.config.max_pending_request_bytes,
            &shared.governance,
        );
        Shard {
            id,
            shared,
            log,
            topics: RefCell::new(HashMap::new()),
            making: RefCell::default(),
            absent: RefCell::default(),
            cursor: Cell::new(0),
            connections: Cell::new(0),
            definition_waits: Cell::new(0),
            opens_elsewhere: Cell::new(0),
            sessions: Sessions::default(),
            interest: RefCell::new(HashMap::new()),
            delivery,
            outbox: RefCell::new((0..shards).map(|_| VecDeque::new()).collect()),
            flushing: RefCell::new(vec![false; shards]),
            fanning: RefCell::new(HashMap::new()),
            policy: crate::governance::Changes::default(),
            requests,
            sink_starter: Cell::new(None),
            pushes_changed: Cell::new(None),
        }
    }

    /// Asks shard `to` and awaits its answer ([`Mailboxes::ask`](super::mailbox::Mailboxes::ask)):
    /// `Shed` on the data lane (a full ring, a stopped shard or the deadline are `Unavailable`,
    /// 503); `Wait` on the control lane, through this shard's outbox (never dropped, in order).
    pub async fn ask<T>(self: &Rc<Self>, to: ShardId, asked: Asked<T>, overflow: Overflow) -> Result<T, StorageError> {
        match overflow {
            Overflow::Shed => self.shared.mailboxes.ask(Sender::Shard(self.id), to, asked, overflow).await,
            Overflow::Wait => {
                let (msg, rx) = asked;
                self.send_control(to, msg);
                answer(rx, CROSS_CORE_DEADLINE).await
            }
        }
    }

    /// Runs `local(arg)` when this shard is `owner`; else asks the owner (as `overflow` says)
    /// with the message `remote(arg)` makes. The one shape of "here or on its owner".
    pub async fn on_owner<A, T, F>(
        self: &Rc<Self>,
        owner: ShardId,
        arg: A,
        local: impl FnOnce(A) -> F,
        (remote, overflow): (impl FnOnce(A) -> Asked<T>, Overflow),
    ) -> Result<T, StorageError>
    where
        F: std::future::Future<Output = Result<T, StorageError>>,
    {
        if owner == self.id {
            local(arg).await
        } else {
            self.ask(owner, remote(arg), overflow).await
        }
    }

    /// Sends a control message to another shard. Never dropped: if its control ring is full it
    /// waits in this shard's outbox for that shard, in order, and a task retries it.
    pub fn send_control(self: &Rc<Self>, to: ShardId, msg: ShardMessage) {
        debug_assert_ne!(to, self.id, "local control messages are handled in place");
        {
            let mut outbox = self.outbox.borrow_mut();
            let queue = &mut outbox[to.index()];
            if queue.is_empty() {
                match self.shared.mailboxes.send_control(Sender::Shard(self.id), to, msg) {
                    Ok(()) => return,
                    Err(back) => queue.push_back(back),
                }
            } else {
                queue.push_back(msg);
            }
        }
        self.shared.metrics.shard(self.id).control_deferred.inc();
        let mut flushing = self.flushing.borrow_mut();
        if !flushing[to.index()] {
            flushing[to.index()] = true;
            monoio::spawn(self.clone().flush_outbox(to));
        }
    }

    /// Moves an outbox into its control ring as room appears.
    async fn flush_outbox(self: Rc<Self>, to: ShardId) {
        let mut wait = Duration::from_micros(20);
        loop {
            {
                let mut outbox = self.outbox.borrow_mut();
                let queue = &mut outbox[to.index()];
                while let Some(m) = queue.pop_front() {
                    if let Err(back) = self.shared.mailboxes.send_control(Sender::Shard(self.id), to, m) {
                        queue.push_front(back);
                        break;
                    }
                    wait = Duration::from_micros(20);
                }
                if queue.is_empty() {
                    self.flushing.borrow_mut()[to.index()] = false;
                    return;
                }
            }
            monoio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_millis(1));
        }
    }

    /// Control messages waiting in this shard's outboxes.
    pub fn outbox_len(&self) -> usize {
        self.outbox.borrow().iter().map(VecDeque::len).sum()
    }

    /// Waits until the outboxes are below [`OUTBOX_HIGH`]: a session's reader calls this before
    /// reading more acks, so a client that floods acks is slowed at its own socket.
    pub async fn control_room(&self) {
        let mut wait = Duration::from_micros(200);
        while self.outbox_len() >= OUTBOX_HIGH {
            monoio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_millis(10));
        }
    }

    fn shards(&self) -> usize {
        self.shared.config.shards
    }

    /// Appends to a partition this shard owns; says whether the frames are readable here now.
    pub(crate) async fn append_local(
        &self,
        partition: PartitionId,
        frames: &mut [Frame],
    ) -> Result<(u64, bool), StorageError> {
        let Some(first) = frames.first() else { return Err(StorageError::Unavailable("empty append")) };
        let topic = first.body().topic.as_str().to_owned();
        self.log.append_mirrored(&topic, partition, frames).await
    }

    /// Kafka backend: stores fetched records in the local copy (those not there yet) and
    /// delivers them.
    pub(crate) fn mirror_in(self: &Rc<Self>, m: crate::shard::message::Mirrored) {
        let Some(topic) = m.frames.first().map(|f| f.body().topic.as_str().to_owned()) else { return };
        match self.log.local().put_mirrored(&topic, m.partition, &m.frames, false) {
            Ok(Some(skip)) if skip < m.frames.len() => {
                let mut frames = m.frames;
                let (me, fresh) = (self.clone(), frames.split_off(skip));
                // The place in line is taken now, as the frames become readable, so a local
                // append after them fans out after them. The tail waits while too many wait.
                let place = self.fan_out_place(&topic);
                let pending = &self.shared.mirror_fan_outs[self.id.index()];
                pending.fetch_add(1, Ordering::Relaxed);
                monoio::spawn(async move {
                    me.fan_out(fresh, Some(place)).await;
                    me.shared.mirror_fan_outs[me.id.index()].fetch_sub(1, Ordering::Relaxed);
                });
            }
            Ok(_) => {}
            Err(e) => eprintln!("evmesh: {}: local copy of {topic}/{}: {e}", self.id, m.partition.0),
        }
    }

    /// Creates or checks a topic; only the topic's meta owner runs this, and one ask per topic
    /// at a time, so creation is serial. `learn`: only take one the broker has (storage =
    /// kafka), never create one.
    pub(crate) async fn ensure_topic_local(
        &self,
        topic: &str,
        spec: Option<TopicMeta>,
        internal: bool,
        learn: bool,
    ) -> EnsureReply {
        // Another ask for this topic is at the broker: wait (at most TOPIC_WAIT) for it to
        // end, then see what it made.
        let waited = std::time::Instant::now();
        loop {
            let rx = match self.making.borrow_mut().get_mut(topic) {
                Some(waiting) => {
                    let (tx, rx) = futures::channel::oneshot::channel();
                    waiting.push(tx);
                    rx
                }
                None => break,
            };
            let left = TOPIC_WAIT.saturating_sub(waited.elapsed());
            if monoio::time::timeout(left, rx).await.is_err() {
                return Err(StorageError::Unavailable("the topic is still being made on the broker"));
            }
        }
        if let Some(existing) = meta::get(&self.shared.db, topic)? {
            return match spec {
                Some(s) if s != existing => {
                    Err(StorageError::Conflict { topic: topic.to_owned(), existing: existing.partitions })
                }
                _ => Ok((existing, false)),
            };
        }
        let c = &self.shared.config;
        // On the embedded log a topic named, not created, exists here or not at all; over Kafka
        // it may be the broker's already, and is looked up there.
        let may_create = internal || spec.is_some() || (!learn && c.auto_create_topics);
        if !may_create && !self.shared.clustered_log() {
            return Err(StorageError::NoTopic(topic.to_owned()));
        }
        // Ended however this ask ends, dropped mid-way included: its waiters go on.
        let _making = Making::start(&self.making, topic);
        self.make_topic(topic, spec, internal, may_create).await
    }

    /// [`Shard::ensure_topic_local`] for a topic not here: made (or, `may_create` false,
    /// only looked up on the broker), counted against `max_topics` unless `internal`.
    async fn make_topic(&self, topic: &str, spec: Option<TopicMeta>, internal: bool, may_create: bool) -> EnsureReply {
        let (db, c) = (&self.shared.db, &self.shared.config);
        let count = &self.shared.topic_count;
        #[allow(unused_mut)]
        let mut m = spec.unwrap_or(TopicMeta {
            partitions: c.default_partitions,
            retention_ms: c.retention_ms,
            retention_bytes: c.retention_bytes,
        });
        let full = || StorageError::Limit(format!("max_topics ({}) topics exist", c.max_topics));
        // A lookup goes first (a name the broker does not have is a 404, not a claim on
        // max_topics; nothing is asked once the cap is reached); a creation claims its slot
        // first (nothing is made past the cap).
        #[allow(unused_mut)]
        let mut known: Option<(u32, bool)> = None;
        #[cfg(feature = "kafka")]
        if let (Some(k), false) = (&self.shared.kafka, may_create) {
            if count.load(std::sync::atomic::Ordering::Acquire) >= c.max_topics {
                return Err(full());
            }
            known = Some((self.look_up(k, topic).await?, false));
        }
        // Meta owners of different topics create concurrently: a slot is claimed first, given
        // back unless the topic is stored, however this ask ends.
        let claim = Claim::take(count, if internal { usize::MAX } else { c.max_topics }).ok_or_else(full)?;
        #[cfg(feature = "kafka")]
        if let (Some(k), None) = (&self.shared.kafka, known) {
            // The topic is the broker's: created there first, or, made by another instance (or
            // a Kafka tool), taken with the count it has there; only an explicit create with
            // another count conflicts. Read once sessions here need it
            // (`Shared::follow_topic`), from its start: events other producers wrote to an
            // existing topic are delivered too.
            let ask = crate::storage::kafka::TopicAsk::Create { partitions: m.partitions, exact: spec.is_some() };
            let t = k.ensure_topic(topic, ask).await?;
            known = Some((t.partitions, t.created));
        }
        let created = match known {
            Some((partitions, created)) => {
                m.partitions = served(topic, partitions)?;
                created
            }
            None => true,
        };
        meta::put(db, topic, &m)?;
        claim.keep();
        self.sync_metadata().await?;
        Ok((m, created))
    }

    /// Storage = kafka: the partition count the broker has for `topic`, which is not here.
    /// A name it does not have is remembered for [`ABSENT_FOR`], and at most
    /// [`MAX_LOOKUPS`] are asked at once per shard (503 past them): a client naming topics at
    /// random costs the broker a bounded number of requests.
    #[cfg(feature = "kafka")]
    async fn look_up(&self, k: &crate::storage::kafka::KafkaBackend, topic: &str) -> Result<u32, StorageError> {
        let now = std::time::Instant::now();
        if let Some((_, e)) = self.absent.borrow().get(topic).filter(|(until, _)| *until > now) {
            return Err(e.clone());
        }
        if self.making.borrow().len() > MAX_LOOKUPS {
            return Err(StorageError::Unavailable("too many topics are being looked up on the broker"));
        }
        let answer = k.ensure_topic(topic, crate::storage::kafka::TopicAsk::Describe).await;
        if let Err(e) = &answer {
            let now = std::time::Instant::now();
            let until = now + if matches!(e, StorageError::NoTopic(_)) { ABSENT_FOR } else { FAILED_FOR };
            let mut absent = self.absent.borrow_mut();
            if absent.len() >= MAX_ABSENT {
                absent.retain(|_, (until, _)| *until > now);
            }
            if absent.len() < MAX_ABSENT {
                absent.insert(topic.to_owned(), (until, e.clone()));
            }
        }
        answer.map(|t| t.partitions)
    }

    /// With `fsync` durability, waits until metadata just written is on the device.
    async fn sync_metadata(&self) -> Result<(), StorageError> {
        match &self.shared.syncer {
            Some(s) if self.shared.config.durability == Durability::Fsync => s.sync_wal().await,
            _ => Ok(()),
        }
    }

    /// Creates or removes a subscription; only the owner shard of its name runs this.
    pub(crate) async fn subscription_local(self: &Rc<Self>, request: SubRequest) -> SubReply {
        let db = &self.shared.db;
        let outcome = match request {
            SubRequest::Create(def) => match meta::get_subscription(db, &def.subscription)? {
                Some(existing) if existing.same_as(&def) => SubOutcome::Unchanged,
                Some(_) => SubOutcome::Conflict,
                None => {
                    let max = self.shared.config.max_subscriptions;
                    let Some(claim) = Claim::take(&self.shared.subscription_count, max) else {
                        return Ok(SubOutcome::Limit);
                    };
                    meta::put_subscription(db, &def)?;
                    claim.keep();
                    if let (Some(_), Some(start)) = (&def.sink, self.sink_starter.get()) {
                        start(self, def);
                    }
                    SubOutcome::Created
                }
            },
            SubRequest::Remove(name) => match meta::get_subscription(db, &name)? {
                None => SubOutcome::Unknown,
                Some(_) => {
                    meta::delete_subscription(db, &name)?;
                    // Its classic push URLs go with it.
                    let under = format!("{name} ");
                    for (id, _) in meta::list_policy_under::<serde_json::Value>(db, meta::Policy::Push, &under)? {
                        meta::delete_policy(db, meta::Policy::Push, &id)?;
                    }
                    self.shared.subscription_count.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
                    SubOutcome::Removed
                }
            },
        };
        if matches!(outcome, SubOutcome::Created | SubOutcome::Removed) {
            self.sync_metadata().await?;
        }
        Ok(outcome)
    }

    /// Creates or removes a subscription through the owner shard of its name.
    pub async fn subscription(self: &Rc<Self>, request: SubRequest) -> SubReply {
        let name = match &request {
            SubRequest::Create(d) => d.subscription.as_str(),
            SubRequest::Remove(n) => n.as_str(),
        };
        let owner = meta_owner(name, self.shards());
        // A subscription change (an unsubscribe above all) is control: never lost to a full ring.
        let local = |r| self.subscription_local(r);
        self.on_owner(owner, request, local, (ShardMessage::subscription, Overflow::Wait)).await
    }

    /// The topic's settings, creating it with the defaults (or `spec`) if it does not exist.
    /// `internal`: evmesh's own (a dead-letter topic), not subject to the client caps.
    pub async fn topic(self: &Rc<Self>, topic: &str, spec: Option<TopicMeta>, internal: bool) -> EnsureReply {
        if StoredTopic::new(topic).is_lite() {
            // A lite topic: one partition, no metadata row, created by its first append.
            return Ok((LITE_META, false));
        }
        if spec.is_none() {
            if let Some(known) = self.topics.borrow().get(topic) {
                return Ok((known.meta, false));
            }
        }
        let owner = meta_owner(topic, self.shards());
        let local = |spec| self.ensure_topic_local(topic, spec, internal, false);
        let remote = |spec| ShardMessage::ensure_topic(topic.to_owned(), spec, internal);
        let reply = self.on_owner(owner, spec, local, (remote, Overflow::Shed)).await;
        if let Ok((m, _)) = &reply {
            self.know_topic(topic, *m);
        }
        reply
    }

    /// Caches a topic's settings here. Never fewer partitions than cached: a topic only grows
    /// (storage = kafka, [`Shard::topic_grew`]), and an answer read before a growth may arrive
    /// after it.
    fn know_topic(&self, topic: &str, m: TopicMeta) {
        let mut topics = self.topics.borrow_mut();
        if topics.get(topic).is_some_and(|k| k.meta.partitions > m.partitions) {
            return;
        }
        let mine = owned_partitions(topic, m.partitions, self.id, self.shards()).collect();
        topics.insert(topic.to_owned(), KnownTopic { meta: m, mine });
    }

    /// Storage = kafka: `topic` has more partitions in Kafka than it had here (an operator's
    /// `kafka-topics --alter`), and its metadata says so now. The cache takes the new count;
    /// the topic's subscriptions drop their consumers' state here and their sessions are
    /// closed (WebSocket 1012, "topic grew"), as a Kafka consumer group rebalances: attached
    /// again, each consumer reads every partition (a new one from its start, see
    /// `runtime::grow_topic`). What was stored stays; unacknowledged events are redelivered.
    pub(super) fn topic_grew(self: &Rc<Self>, topic: &str) {
        let Ok(Some(m)) = meta::get(&self.shared.db, topic) else { return };
        if self.topics.borrow().contains_key(topic) {
            self.know_topic(topic, m);
        }
        let subs = meta::list_subscriptions(&self.shared.db).unwrap_or_default();
        for def in subs.iter().filter(|d| d.topic == topic) {
            self.delivery.machine.borrow_mut().forget(&def.subscription);
            self.delivery.defs.borrow_mut().remove(&def.subscription);
            self.sessions.close_all(&def.subscription, 1012, "topic grew");
        }
    }

    /// The partition count of an existing topic (this shard's cache, else the metadata); never
    /// creates one.
    pub fn partitions_of(&self, topic: &str) -> Option<u32> {
        if StoredTopic::new(topic).is_lite() {
            return Some(1);
        }
        if let Some(known) = self.topics.borrow().get(topic) {
            return Some(known.meta.partitions);
        }
        meta::get(&self.shared.db, topic).ok().flatten().map(|m| m.partitions)
    }

    /// The partition for an unkeyed event: one this shard owns if any, so no core hop is needed.
    /// `topic` must have been resolved with [`Shard::topic`] first.
    pub fn local_partition(&self, topic: &str, meta: &TopicMeta) -> PartitionId {
        let n = self.cursor.get();
        self.cursor.set(n.wrapping_add(1));
        let topics = self.topics.borrow();
        let mine: &[PartitionId] = topics.get(topic).map_or(&[][..], |known| &known.mine[..]);
        if mine.is_empty() {
            PartitionId((n % meta.partitions as usize) as u32)
        } else {
            mine[n % mine.len()]
        }
    }

    /// Appends `frames` to `partition`, here or on its owner. Returns the first offset.
    pub async fn append(
        self: &Rc<Self>,
        topic: &str,
        partition: PartitionId,
        frames: Vec<Frame>,
    ) -> Result<u64, StorageError> {
        let owner = owner(topic, partition, self.shards());
        let local = |mut frames: Vec<Frame>| async move {
            let (first, readable) = self.log.append_mirrored(topic, partition, &mut frames).await?;
            if readable {
                self.fan_out(frames, None).await;
            }
            Ok(first)
        };
        let remote = |frames| {
            self.shared.metrics.shard(self.id).cross_core.inc();
            ShardMessage::append(partition, frames)
        };
        self.on_owner(owner, frames, local, (remote, Overflow::Shed)).await
    }

    /// Hands a reply to a requester waiting on this shard (what `ShardMessage::Reply` does).
    pub fn fulfil(&self, id: Correlation, frame: Frame, replier: &Replier) -> ReplyOutcome {
        self.requests.fulfil(id, frame, replier, &self.shared.governance, crate::model::clock::now_micros())
    }

    /// Sends a reply to where its requester waits, as its `emcorrelationid` says: this shard,
    /// or one hop to the shard the id names (a full ring or no answer: 503). Replies that
    /// match nothing are counted.
    pub async fn send_reply(self: &Rc<Self>, frame: Frame, replier: Replier) -> Result<ReplyOutcome, StorageError> {
        let metrics = self.shared.metrics.shard(self.id);
        let Some(id) = frame.body().attr_str("emcorrelationid") else { return Ok(ReplyOutcome::MissingId) };
        let outcome = match Correlation::parse(id) {
            None => ReplyOutcome::Unknown,
            Some(id) if id.instance != self.requests.instance() => {
                metrics.replies_cross_instance.inc();
                self.shared.forward_reply(id.instance, frame, replier).await
            }
            Some(id) if id.shard == self.id => self.fulfil(id, frame, &replier),
            Some(id) if id.shard.index() >= self.shards() => ReplyOutcome::Unknown,
            Some(id) => {
                metrics.replies_cross_core.inc();
                let (outcome, rx) = futures::channel::oneshot::channel();
                let msg = ShardMessage::Reply(Box::new(ReplyMessage { id, frame, replier, outcome }));
                self.ask(id.shard, (msg, rx), Overflow::Shed).await?
            }
        };
        if matches!(outcome, ReplyOutcome::Unknown | ReplyOutcome::Late) {
            metrics.replies_unmatched.inc();
        }
        Ok(outcome)
    }

    /// Announces to every shard (this one included) that this shard's sessions of a
    /// subscription started, ended, or that the subscription is gone.
    pub fn announce(self: &Rc<Self>, subscription: &str, topic: &str, change: InterestChange) {
        for s in 0..self.shards() {
            let i = Interest { subscription: subscription.to_owned(), topic: topic.to_owned(), shard: self.id, change };
            let to = ShardId(s as u16);
            if to == self.id {
                self.interest_changed(i);
            } else {
                self.send_control(to, ShardMessage::Interest(Box::new(i)));
            }
        }
    }

    pub(crate) fn interest_changed(self: &Rc<Self>, i: Interest) {
        if i.change == InterestChange::TopicGrew {
            return self.topic_grew(&i.topic);
        }
        let mut interest = self.interest.borrow_mut();
        let list = Rc::make_mut(interest.entry(i.topic.clone()).or_default());
        match i.change {
            InterestChange::Attach => {
                let filters = match crate::storage::meta::get_subscription(&self.shared.db, &i.subscription) {
                    Ok(Some(def)) => def.compile_stored(),
                    _ => return,
                };
                list.retain(|x| !(x.subscription == i.subscription && x.shard == i.shard));
                list.push(Rc::new(Interested {
                    subscription: i.subscription,
                    shard: i.shard,
                    filters: Rc::new(filters),
                }));
            }
            InterestChange::Detach => list.retain(|x| !(x.subscription == i.subscription && x.shard == i.shard)),
            InterestChange::Removed => {
                list.retain(|x| x.subscription != i.subscription);
                drop(interest);
                self.forget_subscription(&i.subscription, &i.topic);
                self.sessions.close_all(&i.subscription, 1000, "");
            }
            InterestChange::TopicGrew => {}
            InterestChange::HomeMoved => {
                drop(interest);
                self.delivery.machine.borrow_mut().forget(&i.subscription);
                self.delivery.defs.borrow_mut().remove(&i.subscription);
                self.sessions.close_all(&i.subscription, 1012, "home moved");
            }
            InterestChange::Pushes => {
                drop(interest);
                self.sessions.recheck_webhooks(&i.subscription);
                if let Some(sync) = self.pushes_changed.get() {
                    sync(self, &i.subscription);
                }
            }
        }
    }

    /// Queues events to this shard's sessions, counting the deliveries.
    pub fn deliver_here(&self, d: &Delivery) {
        let n = self.sessions.deliver(d);
        self.shared.metrics.shard(self.id).deliveries.add(n);
    }

    /// Sends freshly stored events to their consumers: to every shard with `ack=none` sessions
    /// (once per shard, frames shared), and to acknowledged delivery. Yields every
    /// `task::SLICE` of work (a topic's subscriptions are client-made and many, each filter
    /// may take a millisecond or two), and a topic's fan-outs pass its gate one at a time, in
    /// the order their appends completed, so every session still gets a partition's events in
    /// offset order (other topics' fan-outs go on meanwhile).
    ///
    /// `place`: a place in the topic's line taken when the frames became readable (a spawned
    /// fan-out); `None` takes it now, before anything can yield.
    pub(crate) async fn fan_out(self: &Rc<Self>, frames: Vec<Frame>, place: Option<Place>) {
        let Some(first) = frames.first() else { return };
        if StoredTopic::new(first.body().topic.as_str()).is_lite() {
            // A lite topic has no subscriptions: only its follower, if any, reads it.
            self.shared.watchers.notify(first.body().topic.as_str());
            return;
        }
        // Acked consumers as of now: one attaching later starts from the log, which has these.
        let consumers = self.delivery.machine.borrow().consumers_of(first.body().topic.as_str());
        let live = self.interest.borrow().get(first.body().topic.as_str()).is_some_and(|l| !l.is_empty());
        if consumers.is_empty() && !live && place.is_none() {
            // Nobody to deliver to: no line to join.
            return;
        }
        let frames: Arc<[Frame]> = frames.into();
        // Borrowed from the frames, which this call keeps to the end: no copy of the name.
        let topic = frames[0].body().topic.as_str();
        let place = place.unwrap_or_else(|| self.fan_out_place(topic));
        place.enter().await;
        let mut slice = crate::task::Slice::start();
        self.deliver_new(consumers, &frames, &mut slice).await;
        let list = match self.interest.borrow().get(topic) {
            Some(l) if !l.is_empty() => l.clone(),
            _ => return,
        };
        // Requests past their deadline are dropped at dispatch, here too.
        let wall = crate::model::clock::now_micros();
        let requests = frames.iter().any(|f| f.header().kind == frame_codec::FrameKind::Request);
        for i in list.iter() {
            slice.next().await;
            let pick = if i.filters.is_empty() && !requests {
                None
            } else {
                let wanted = |f: &Frame| !expired(f, wall) && matches_all(&i.filters, f.body());
                let pick: Vec<u32> = (0..frames.len() as u32).filter(|&n| wanted(&frames[n as usize])).collect();
                if pick.is_empty() {
                    continue;
                }
                Some(pick)
            };
            let d = Delivery {
                subscription: i.subscription.clone(),
                session: None,
                frames: frames.clone(),
                pick,
                attempts: Vec::new(),
            };
            if i.shard == self.id {
                self.deliver_here(&d);
            } else if self
                .shared
                .mailboxes
                .send(Sender::Shard(self.id), i.shard, ShardMessage::Deliver(Box::new(d)))
                .is_err()
            {
                // ack=none sessions are at-most-once: a full mailbox drops, it never blocks.
                self.shared.metrics.shard(self.id).deliveries_dropped.inc();
            }
        }
    }

    /// The next place in line for fan-outs of `topic`.
    pub(super) fn fan_out_place(&self, topic: &str) -> Place {
        let mut gates = self.fanning.borrow_mut();
        match gates.get(topic) {
            Some(g) => Gate::join(g),
            None => Gate::join(gates.entry(topic.to_owned()).or_default()),
        }
    }

    /// Closes idle agent streaming sessions (`session_ttl_ms`), forever: shard 0's task, a
    /// few times per TTL.
    pub async fn calls_loop(self: Rc<Self>) {
        let ttl = self.shared.config.session_ttl;
        let every = (ttl / 8).clamp(std::time::Duration::from_millis(20), std::time::Duration::from_secs(5));
        loop {
            monoio::time::sleep(every).await;
            let now = crate::model::clock::now_ms();
            self.shared.calls.expire(now, ttl.as_millis() as u64);
            self.shared.tasks.expire(now, ttl.as_millis() as u64);
            if self.id.index() == 0 {
                self.shared.sweep_agent_claims();
            }
        }
    }

    /// Applies retention to every partition this shard owns, forever.
    pub async fn retention_loop(self: Rc<Self>) {
        let every = self.shared.config.retention_check;
        loop {
            monoio::time::sleep(every).await;
            self.expire_clients();
            {
                let log = self.log.lite();
                // In bounded calls, yielding in between: the core stays its clients'.
                let ttl = self.shared.config.lite_topic_ttl.as_millis() as u64;
                let followed = |name: &str| self.shared.watchers.is_followed(name);
                loop {
                    match log.expire_lite(crate::model::clock::now_ms(), ttl, followed) {
                        Ok(gone) => {
                            let n = gone.len() as u64;
                            self.shared.metrics.shard(self.id).lite_topics_expired.add(n);
                            // A session pub/sub topic's home is released with it.
                            for name in &gone {
                                self.shared.release_home(&crate::cluster::homes::lite_key(name));
                            }
                            if n < 1_000 {
                                break;
                            }
                        }
                        Err(e) => {
                            eprintln!("evmesh: {}: expiring lite topics: {e}", self.id);
                            break;
                        }
                    }
                    crate::task::yield_now().await;
                }
            }
            let Ok(topics) = meta::list(&self.shared.db) else { continue };
            let now = crate::model::clock::now_micros();
            for (name, m) in topics {
                for p in owned_partitions(&name, m.partitions, self.id, self.shards()) {
                    if let Err(e) = self.log.enforce_retention(&name, &m, p, now) {
                        eprintln!("evmesh: {}: retention of {name}/{}: {e}", self.id, p.0);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An ask for a topic dropped mid-way (its caller gone: a WebSocket session closed while
    /// its publish waited for the broker) still ends its entry and wakes the asks waiting for
    /// it; before, the entry stayed and every later ask for the topic waited forever.
    #[test]
    fn a_dropped_ask_for_a_topic_ends_its_entry_and_wakes_its_waiters() {
        let making = RefCell::new(HashMap::new());
        let guard = Making::start(&making, "orders");
        let (tx, mut rx) = futures::channel::oneshot::channel();
        making.borrow_mut().get_mut("orders").unwrap().push(tx);
        assert_eq!(rx.try_recv(), Ok(None), "waiting while the ask runs");
        drop(guard);
        assert!(making.borrow().is_empty());
        assert_eq!(rx.try_recv(), Ok(Some(())), "woken");
    }

    /// A `max_topics` slot is given back unless the topic was stored, however the ask ends.
    #[test]
    fn a_topic_slot_is_given_back_unless_kept() {
        let count = std::sync::atomic::AtomicUsize::new(0);
        let load = || count.load(std::sync::atomic::Ordering::Relaxed);
        drop(Claim::take(&count, 2).unwrap());
        assert_eq!(load(), 0);
        Claim::take(&count, 2).unwrap().keep();
        let second = Claim::take(&count, 2).unwrap();
        assert!(Claim::take(&count, 2).is_none(), "the cap");
        assert_eq!(load(), 2);
        drop(second);
        assert_eq!(load(), 1);
    }
}
