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
use super::message::{ReplyMessage, ShardMessage};
use super::requests::{Correlation, Replier};
use super::sessions::Sessions;
use crate::model::placement::{owned_partitions, owner};
use crate::model::{PartitionId, ReplyOutcome, ShardId, TopicMap};
use crate::shard::shared::Shared;
use crate::storage::embedded::EmbeddedLog;
use crate::storage::{meta, Durability, Log, Storage, StorageError, TopicMeta};
use crate::subscription::definition::Definition;
use crate::subscription::filter::Filter;
use crate::task::{Gate, Place};

/// A topic as one shard knows it.
pub(super) struct KnownTopic {
    pub(super) meta: TopicMeta,
    /// The partitions of the topic this shard owns.
    pub(super) mine: Rc<[PartitionId]>,
}

/// A shard that wants a subscription's events from this shard's partitions.
pub(super) struct Interested {
    pub(super) subscription: String,
    pub(super) shard: ShardId,
    /// The subscription's filters, compiled once when the interest arrived.
    pub(super) filters: Rc<Vec<Filter>>,
}

pub struct Shard {
    pub id: ShardId,
    pub shared: Arc<Shared>,
    pub log: Log,
    /// Topic settings this shard has seen, with the partitions it owns; a topic's count only
    /// ever grows (with Kafka), and this cache never lowers one.
    pub(super) topics: RefCell<TopicMap<String, KnownTopic>>,
    /// As meta owner: topics being created or looked up on the broker now, each with the
    /// asks waiting for it to end (a second ask for a topic waits for the first, [`Making`]),
    /// and what the broker answered for names it could not give, until when (a name it does not
    /// have for [`ABSENT_FOR`], a failed ask for [`FAILED_FOR`]): what a client naming topics
    /// at random can make this shard ask of Kafka.
    pub(super) making: RefCell<HashMap<String, Vec<futures::channel::oneshot::Sender<()>>>>,
    pub(super) absent: RefCell<HashMap<String, (std::time::Instant, StorageError)>>,
    /// Round-robin cursor over this shard's own partitions for unkeyed events.
    pub(super) cursor: Cell<usize>,
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
    pub(super) interest: RefCell<HashMap<String, Rc<Vec<Rc<Interested>>>>>,
    /// Acknowledged delivery from the partitions this shard owns (`crate::delivery`).
    pub delivery: crate::delivery::Dispatcher,
    /// Per destination shard, control messages its full control ring could not take yet, in
    /// order; a task per non-empty outbox retries them (`send_control`).
    pub(super) outbox: RefCell<Vec<VecDeque<ShardMessage>>>,
    pub(super) flushing: RefCell<Vec<bool>>,
    /// Per topic: its fan-outs of stored events pass one at a time, in append order (they
    /// may yield half-way). At most one small entry per topic.
    pub(super) fanning: RefCell<HashMap<String, Rc<Gate>>>,
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
pub(super) const LITE_META: TopicMeta = TopicMeta { partitions: 1, retention_ms: None, retention_bytes: None };

/// Control messages waiting in one outbox past which acks are refused (503) or a session's
/// reader waits: what a client floods us with is held at its socket, not here.
pub const OUTBOX_HIGH: usize = 1024;

impl Shard {
    pub fn new(id: ShardId, shared: Arc<Shared>) -> Self {
        let shards = shared.config.shards;
        let delivery = crate::delivery::Dispatcher::new(&shared.config);
        let ttl = shared.config.lite_topic_ttl;
        let embedded = || {
            let log = EmbeddedLog::new(
                shared.db.clone(),
                shared.logs.clone(),
                id,
                shared.config.durability,
                shared.syncer.clone(),
                ttl,
            );
            if shared.direct_writes {
                log.with_direct_writes()
            } else {
                log
            }
        };
        let log = match &shared.remote {
            None => Log::Embedded(embedded()),
            // The local copy needs no WAL: the remote system is the durable log, the tail
            // refills the copy.
            Some(r) => {
                let local = EmbeddedLog::new(shared.db.clone(), shared.logs.clone(), id, Durability::Memory, None, ttl);
                Log::Remote(crate::storage::remote::RemoteLog::new(r.clone(), local, embedded()))
            }
        };
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
            topics: RefCell::new(TopicMap::default()),
            making: RefCell::default(),
            absent: RefCell::default(),
            cursor: Cell::new(0),
            connections: Cell::new(0),
            definition_waits: Cell::new(0),
            opens_elsewhere: Cell::new(0),
            sessions: Sessions::new(id),
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

    pub(super) fn shards(&self) -> usize {
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
            Err(e) => {
                crate::log::warn("shard", &format!("{}: local copy of {topic}/{}: {e}", self.id, m.partition.0), &[])
            }
        }
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
                let by = crate::cluster::OnBehalf {
                    principal: replier.principal.as_deref(),
                    tenant: replier.tenant.as_deref(),
                };
                self.shared.cluster.forward_reply(id.instance, frame, by).await
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
                                self.shared.cluster.release_home(&crate::cluster::homes::lite_key(name));
                            }
                            if n < 1_000 {
                                break;
                            }
                        }
                        Err(e) => {
                            crate::log::warn("shard", &format!("{}: expiring lite topics: {e}", self.id), &[]);
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
                        crate::log::warn("shard", &format!("{}: retention of {name}/{}: {e}", self.id, p.0), &[]);
                    }
                }
            }
        }
    }
}
