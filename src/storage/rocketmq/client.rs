//! The client thread (`evmesh-rocketmq`): `rocketmq-client-rust` on a one-worker tokio runtime
//! of its own, answering the shards' and the tail's jobs, each in a task of its own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cheetah_string::CheetahString;
use frame_codec::Frame;
use rocketmq_client_rust::{
    ClientConfig, ClientInstanceHandle, ClientRuntime, ClientRuntimeConfig, DefaultMQAdminExt, DefaultMQProducer,
    RouteAdmin, TelemetryHandle, TopicAdmin,
};
use rocketmq_model::common::config::TopicConfig;
use rocketmq_model::common::message::message_queue::MessageQueue;
use rocketmq_model::common::message::message_single::Message;
use rocketmq_model::common::message::MessageTrait;
use rocketmq_model::result::{PullStatus, SendStatus};
use rocketmq_protocol::protocol::header::pull_message_request_header::PullMessageRequestHeader;
use rocketmq_runtime::{RuntimeConfig, RuntimeOwner};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};

use super::{engine, evmesh_topic, Ask, Job, Reply, ASSIGN_ONLY_GROUP};
use crate::storage::remote::{RemoteTopic, TopicAsk};
use crate::storage::{RocketMqSettings, StorageError};

/// RocketMQ's longest topic name.
pub(super) const TOPIC_MAX: usize = 127;

/// The most messages one pull asks for.
const PULL_MAX: i32 = 256;

/// The most messages, and body bytes, one send carries when appends queue up behind one
/// another (the broker takes 4 MiB).
const SEND_MAX: usize = 256;
const SEND_MAX_BYTES: usize = 1 << 20;

/// What one pull of a queue brought.
#[derive(Default)]
pub(super) struct Pulled {
    /// The messages at `from` on, as frames (those that are no CloudEvent left out, logged).
    pub frames: Vec<Frame>,
    /// Where the next pull starts.
    pub next: u64,
    /// `from` was below the queue's start (retention removed it): it starts at `next`.
    pub moved: bool,
}

/// A topic's queues in partition order: (broker name, queue id), and each broker's master.
struct Route {
    queues: Vec<(CheetahString, i32)>,
    masters: HashMap<CheetahString, CheetahString>,
}

/// One append waiting for its queue's sender.
struct Append {
    messages: Vec<evmesh_protocol::adaptor::rocketmq::Message>,
    reply: Reply<Vec<u64>>,
    queued: std::time::Instant,
}

/// What a message weighs in a send: its body and its properties.
fn message_bytes(m: &evmesh_protocol::adaptor::rocketmq::Message) -> usize {
    m.body.len() + m.properties.iter().map(|(k, v)| k.len() + v.len() + 2).sum::<usize>()
}

struct Client {
    settings: RocketMqSettings,
    producer: DefaultMQProducer,
    admin: DefaultMQAdminExt,
    reader: ClientInstanceHandle,
    routes: Mutex<HashMap<String, Arc<Route>>>,
    /// Each topic's partitions as first seen, grown by the queues added since: never reordered
    /// nor shortened, whatever a route says at one moment.
    layouts: Mutex<HashMap<String, Vec<(CheetahString, i32)>>>,
}

/// Starts the client thread; its producer, admin and reader are started before this returns.
pub(super) fn start(
    settings: RocketMqSettings,
    mut jobs: tokio::sync::mpsc::UnboundedReceiver<Job>,
) -> Result<(), StorageError> {
    let (started, wait) = std::sync::mpsc::channel::<Result<(), StorageError>>();
    std::thread::Builder::new()
        .name("evmesh-rocketmq".into())
        .spawn(move || {
            let config =
                RuntimeConfig { worker_threads: 1, thread_name: "evmesh-rocketmq-io".into(), ..Default::default() };
            let owner = match RuntimeOwner::plan(config).map_err(|e| engine("runtime", e)) {
                Ok(plan) => match plan.build() {
                    Ok(owner) => owner,
                    Err(e) => return drop(started.send(Err(engine("runtime", e)))),
                },
                Err(e) => return drop(started.send(Err(e))),
            };
            let context = owner.root_context().component("evmesh");
            owner.block_on(async move {
                // Boxed: the client's futures nest deeper than the compiler's layout limit.
                let client = match Box::pin(Client::start(settings, context)).await {
                    Ok(c) => Arc::new(c),
                    Err(e) => return drop(started.send(Err(e))),
                };
                let _ = started.send(Ok(()));
                // Appends to one queue are sent in the order the owner made them, by a task of
                // the queue's own; everything else runs at once.
                let mut queues: HashMap<(String, u32), UnboundedSender<Append>> = HashMap::new();
                while let Some(job) = jobs.recv().await {
                    let c = client.clone();
                    match job {
                        Job::Produce { topic, partition, messages, reply } => {
                            let key = (topic, partition);
                            let append = Append { messages, reply, queued: std::time::Instant::now() };
                            // A queue whose sender is gone (it never ends on its own) gets a new one.
                            let queue = queues.entry(key.clone()).or_insert_with(|| spawn_sender(&c, &key));
                            if let Err(again) = queue.send(append) {
                                let queue = spawn_sender(&c, &key);
                                let _ = queue.send(again.0);
                                queues.insert(key, queue);
                            }
                        }
                        Job::Ask(ask) => drop(tokio::spawn(Box::pin(async move { c.run(ask).await }))),
                    }
                }
            });
        })
        .map_err(|e| engine("client thread", e))?;
    wait.recv().map_err(|_| engine("client thread", "stopped while starting"))?
}

fn spawn_sender(client: &Arc<Client>, (topic, partition): &(String, u32)) -> UnboundedSender<Append> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(Box::pin(client.clone().sender(topic.clone(), *partition, rx)));
    tx
}

impl Client {
    async fn start(
        settings: RocketMqSettings,
        context: rocketmq_runtime::ChildServiceContext,
    ) -> Result<Client, StorageError> {
        let runtime: Arc<ClientRuntime> =
            ClientRuntime::try_new(context, ClientRuntimeConfig::default(), TelemetryHandle::noop())
                .map_err(|e| engine("client runtime", e))?;
        let timeout = settings.send_timeout.as_millis() as u64;
        let mut producer = DefaultMQProducer::builder(runtime.clone())
            .producer_group("evmesh-producer")
            .name_server_addr(settings.namesrv.as_str())
            .send_msg_timeout(timeout as u32)
            .retry_times_when_send_failed(0)
            .compress_msg_body_over_howmuch(u32::MAX)
            .build();
        producer.start().await.map_err(|e| engine("producer", e))?;
        let mut admin = DefaultMQAdminExt::new(runtime.clone());
        admin.set_namesrv_addr(settings.namesrv.as_str());
        admin.start().await.map_err(|e| engine("admin", e))?;
        let config = ClientConfig::builder()
            .namesrv_addr(settings.namesrv.as_str())
            .instance_name("evmesh-reader")
            .build()
            .map_err(|e| engine("reader", e))?;
        let reader = ClientInstanceHandle::get_or_create(&runtime, 1, config, None).map_err(|e| engine("reader", e))?;
        reader.start().await.map_err(|e| engine("reader", e))?;
        Ok(Client { settings, producer, admin, reader, routes: Mutex::default(), layouts: Mutex::default() })
    }

    /// Sends one queue's appends in order; those that queued up while a send was out go
    /// together in the next one (a batch), each answered with its own offsets. An append that
    /// waited its whole send timeout behind others (the broker away) is answered at once.
    async fn sender(self: Arc<Self>, topic: String, partition: u32, mut appends: UnboundedReceiver<Append>) {
        let size = |a: &Append| a.messages.iter().map(message_bytes).sum::<usize>();
        while let Some(first) = appends.recv().await {
            let (mut bytes, mut count) = (size(&first), first.messages.len());
            let mut batch = vec![first];
            while count < SEND_MAX && bytes < SEND_MAX_BYTES {
                let Ok(next) = appends.try_recv() else { break };
                count += next.messages.len();
                bytes += size(&next);
                batch.push(next);
            }
            let timeout = self.settings.send_timeout;
            let (late, batch): (Vec<Append>, Vec<Append>) =
                batch.into_iter().partition(|a| a.queued.elapsed() >= timeout);
            for a in late {
                let _ =
                    a.reply.send(Err(StorageError::Unavailable("rocketmq: the broker did not take the send in time")));
            }
            if batch.is_empty() {
                continue;
            }
            let sizes: Vec<usize> = batch.iter().map(|a| a.messages.len()).collect();
            let (messages, replies): (Vec<_>, Vec<_>) = batch.into_iter().map(|a| (a.messages, a.reply)).unzip();
            match self.produce(&topic, partition, messages.into_iter().flatten().collect()).await {
                Ok(offsets) => {
                    let mut offsets = offsets.into_iter();
                    for (reply, n) in replies.into_iter().zip(sizes) {
                        let _ = reply.send(Ok(offsets.by_ref().take(n).collect()));
                    }
                }
                Err(e) => {
                    for reply in replies {
                        let _ = reply.send(Err(e.clone()));
                    }
                }
            }
        }
    }

    async fn run(&self, ask: Ask) {
        fn send<T>(reply: Reply<T>, r: Result<T, StorageError>) {
            let _ = reply.send(r);
        }
        match ask {
            Ask::Ensure { topic, ask, reply } => send(reply, self.ensure(&topic, ask).await),
            Ask::Topics { reply } => send(reply, self.topics().await),
            Ask::Pull { topic, partition, from, reply } => send(reply, self.pull(&topic, partition, from).await),
        }
    }

    /// The topic's route (from the name server; `None`: no such topic), cached until a send
    /// or pull through it fails or the topics are read again.
    async fn route(&self, topic: &str, fresh: bool) -> Result<Option<Arc<Route>>, StorageError> {
        if !fresh {
            if let Some(r) = self.routes.lock().expect("not poisoned").get(topic) {
                return Ok(Some(r.clone()));
            }
        }
        let Some(data) =
            self.admin.examine_topic_route_info(topic.into()).await.map_err(|e| engine("topic route", e))?
        else {
            self.routes.lock().expect("not poisoned").remove(topic);
            return Ok(None);
        };
        let mut queue_datas = data.queue_datas.clone();
        queue_datas.sort_by(|a, b| a.broker_name.cmp(&b.broker_name));
        let now: Vec<(CheetahString, i32)> = queue_datas
            .iter()
            .flat_map(|q| (0..q.write_queue_nums as i32).map(move |id| (q.broker_name.clone(), id)))
            .collect();
        // A partition stays the queue it was: queues added are appended, and a broker missing
        // from the route now (away) keeps its partitions, answered 503 until it is back.
        let queues = {
            let mut layouts = self.layouts.lock().expect("not poisoned");
            let known = layouts.entry(topic.to_owned()).or_default();
            known.extend(now.iter().filter(|q| !known.contains(q)).cloned().collect::<Vec<_>>());
            known.clone()
        };
        let masters = data
            .broker_datas
            .iter()
            .filter_map(|b| Some((b.broker_name().clone(), b.broker_addrs().get(&0)?.clone())))
            .collect();
        if queues.is_empty() {
            return Ok(None);
        }
        let route = Arc::new(Route { queues, masters });
        self.routes.lock().expect("not poisoned").insert(topic.to_owned(), route.clone());
        Ok(Some(route))
    }

    /// The queue of `partition` and its broker's master address.
    async fn queue(&self, topic: &str, partition: u32) -> Result<(MessageQueue, CheetahString), StorageError> {
        for fresh in [false, true] {
            if let Some(route) = self.route(topic, fresh).await? {
                if let Some((broker, id)) = route.queues.get(partition as usize) {
                    if let Some(addr) = route.masters.get(broker) {
                        return Ok((MessageQueue::from_parts(topic, broker.clone(), *id), addr.clone()));
                    }
                }
            }
        }
        Err(StorageError::Unavailable("rocketmq: the topic's queue has no master broker now"))
    }

    async fn produce(
        &self,
        topic: &str,
        partition: u32,
        messages: Vec<evmesh_protocol::adaptor::rocketmq::Message>,
    ) -> Result<Vec<u64>, StorageError> {
        let (queue, _) = self.queue(topic, partition).await?;
        let n = messages.len();
        let mut built = Vec::with_capacity(n);
        for m in messages {
            let mut b = Message::builder().topic(topic).body(m.body);
            if let Some(k) = m.keys {
                b = b.key(k);
            }
            let mut msg = b.build().map_err(|e| engine("message", e))?;
            for (k, v) in m.properties {
                msg.put_user_property(CheetahString::from(k), CheetahString::from(v))
                    .map_err(|e| engine("message", e))?;
            }
            built.push(msg);
        }
        let timeout = self.settings.send_timeout.as_millis() as u64;
        let sent = match built.len() {
            1 => self.producer.send_to_queue_with_timeout(built.pop().expect("one"), queue, timeout).await,
            _ => self.producer.send_batch_to_queue_with_timeout(built, queue, timeout).await.map(Some),
        };
        let sent = match sent {
            Ok(Some(r)) => r,
            Ok(None) => return Err(engine("send", "no result")),
            Err(e) => {
                // The route may have moved (a broker away, the topic made again): read it again next time.
                self.routes.lock().expect("not poisoned").remove(topic);
                return Err(engine("send", e));
            }
        };
        // Anything but SEND_OK (a flush or slave timeout, no slave) is not stored as the broker
        // is set to store it: the client is told to retry (and dedupe on `id`).
        if sent.send_status != SendStatus::SendOk {
            return Err(engine("send", format!("the broker answered {:?}", sent.send_status)));
        }
        let first = sent.queue_offset;
        Ok((first..first + n as u64).collect())
    }

    async fn ensure(&self, topic: &str, ask: TopicAsk) -> Result<RemoteTopic, StorageError> {
        let existing = self.route(topic, true).await?.map(|r| r.queues.len() as u32);
        let partitions = match (ask, existing) {
            (TopicAsk::Describe, None) => return Err(StorageError::NoTopic(topic.to_owned())),
            (_, Some(n)) => {
                if let TopicAsk::Create { partitions, exact: true } = ask {
                    if partitions != n {
                        return Err(StorageError::Conflict { topic: topic.to_owned(), existing: n });
                    }
                }
                return Ok(RemoteTopic { partitions: n, created: false });
            }
            (TopicAsk::Create { partitions, .. }, None) => partitions,
        };
        let info = self.admin.examine_broker_cluster_info().await.map_err(|e| engine("cluster info", e))?;
        let master = info.broker_addr_table.as_ref().and_then(|brokers| {
            let mut names: Vec<_> = brokers.keys().collect();
            names.sort();
            names.into_iter().find_map(|n| brokers[n].broker_addrs().get(&0).cloned())
        });
        let Some(master) = master else {
            return Err(StorageError::Unavailable("rocketmq: no master broker is registered with the name server"));
        };
        let config = TopicConfig::with_queues(topic, partitions, partitions);
        self.admin.create_and_update_topic_config(master, config).await.map_err(|e| engine("create topic", e))?;
        // The broker registers the topic with the name servers before it answers.
        match self.route(topic, true).await? {
            Some(r) => Ok(RemoteTopic { partitions: r.queues.len() as u32, created: true }),
            None => Err(StorageError::Unavailable("rocketmq: the topic was made and has no route yet")),
        }
    }

    async fn topics(&self) -> Result<Vec<(String, Option<u32>)>, StorageError> {
        let list = self.admin.fetch_all_topic_list().await.map_err(|e| engine("topic list", e))?;
        let prefix = &self.settings.topic_prefix;
        let mut out = Vec::new();
        for name in list.topic_list.iter().filter_map(|t| evmesh_topic(prefix, t.as_str()).map(|e| (t, e))) {
            let (rmq, topic) = name;
            let count = match self.route(rmq.as_str(), true).await {
                Ok(Some(r)) => Some(r.queues.len() as u32),
                Ok(None) => continue,
                Err(_) => None,
            };
            out.push((topic, count));
        }
        Ok(out)
    }

    /// Pulls `topic`'s queue of `partition` from `from` on (an evmesh topic name).
    async fn pull(&self, topic: &str, partition: u32, from: u64) -> Result<Pulled, StorageError> {
        let rmq = super::rocketmq_topic(&self.settings.topic_prefix, topic);
        let (queue, addr) = self.queue(&rmq, partition).await?;
        let header = PullMessageRequestHeader {
            consumer_group: ASSIGN_ONLY_GROUP.into(),
            topic: rmq.as_str().into(),
            queue_id: queue.queue_id(),
            queue_offset: from as i64,
            max_msg_nums: PULL_MAX,
            // Subscription in the request (no heartbeat registered one), no commit, no suspend.
            sys_flag: 0x4,
            commit_offset: 0,
            suspend_timeout_millis: 0,
            sub_version: 0,
            subscription: Some("*".into()),
            expression_type: Some("TAG".into()),
            ..Default::default()
        };
        let out = self.reader.pull_outcome_from_broker(addr.as_str(), header, 5000).await.map_err(|e| {
            self.routes.lock().expect("not poisoned").remove(&rmq);
            engine("pull", e)
        })?;
        let mut pulled = Pulled::default();
        match out.pull_status() {
            PullStatus::Found => {}
            // Below the queue's start (retention): carry on at the start. Past its end (the
            // broker's store lost, the topic made again): stay, and say so; offsets are never
            // reused for other events.
            PullStatus::OffsetIllegal => {
                pulled.moved = from < out.min_offset();
                pulled.next = if pulled.moved { out.min_offset() } else { from };
                if from > out.max_offset() {
                    let said = format!(
                        "rocketmq tail: {rmq}/{partition}: at {from}, past the queue's end {}",
                        out.max_offset()
                    );
                    crate::log::warn("storage", &said, &[]);
                }
                return Ok(pulled);
            }
            // Nothing at `from` now, or a hole the broker steps over: never backwards.
            _ => {
                pulled.next = from.max(out.next_begin_offset());
                return Ok(pulled);
            }
        }
        let mut decoded = None;
        for m in out.messages().unwrap_or(&[]) {
            let offset = m.queue_offset as u64;
            let props: Vec<(&str, &str)> = m.properties().iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            let keys = m.properties().get("KEYS").map(|k| k.as_str());
            let body = m.body().unwrap_or_default();
            match evmesh_protocol::adaptor::rocketmq::from_message(
                topic,
                partition,
                offset,
                keys,
                &props,
                &body,
                m.born_timestamp,
            ) {
                Ok(f) => pulled.frames.push(f),
                Err(e) => {
                    crate::log::warn("storage", &format!("rocketmq tail: {rmq}/{partition}@{offset} skipped: {e}"), &[])
                }
            }
            decoded = Some(offset + 1);
        }
        // The next pull starts after the last message decoded (the rest of this answer comes
        // again); when none could be, past them, said.
        match decoded {
            Some(next) => pulled.next = next,
            None => {
                pulled.next = from.max(out.next_begin_offset());
                let said =
                    format!("rocketmq tail: {rmq}/{partition}: offsets {from}..{} could not be decoded", pulled.next);
                crate::log::warn("storage", &said, &[]);
            }
        }
        Ok(pulled)
    }
}
