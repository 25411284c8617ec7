//! The Kafka cluster's thread (`evmesh-kafka-cluster`): makes evmesh's own topics, heartbeats
//! every `heartbeat_ms` and reads the four topics, handing each record to what applies it
//! (`super::appliers`; the definitions and the forwarded replies to threads of their own, which
//! wait for the shards: this one never does).

use std::sync::atomic::AtomicUsize;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use super::appliers::{self, ClusterWork, Defined, Forwarded, Replicated};
use super::heartbeat_of;
use super::kafka::KafkaCluster;
use crate::cluster::homes::{BY_HEADER, HOMES_TOPIC, OFFSET_KEY};
use crate::cluster::replies::REPLIES_TOPIC;
use crate::cluster::{Heartbeat, LoadSampler, INSTANCES_TOPIC, SUBSCRIPTIONS_TOPIC};
use crate::runtime::applier::applier;
use crate::runtime::StartError;
use crate::shard::shared::Shared;
use crate::storage::kafka::{OwnRecord, OwnTopics, Start};

/// Heartbeats read back from before an instance starts (to know at once who lives).
const CATCH_UP: i64 = 4096;

/// Topic configs of the heartbeats and forwarded replies, of no use an hour on.
const HOUR: &[(&str, &str)] = &[("retention.ms", "3600000")];
/// Topic configs of the claims and definitions: a claim counts until replaced (the last
/// record of each key kept).
const COMPACTED: &[(&str, &str)] = &[("cleanup.policy", "compact")];

impl KafkaCluster {
    /// Starts the heartbeats and the appliers: the cluster thread, and the threads that apply
    /// what it reads and wait for the shards.
    pub(in crate::runtime) fn start(self: &Arc<Self>, shared: &Arc<Shared>) -> Result<(), StartError> {
        // Definitions are applied on a thread of their own (it waits for the shards), so a slow
        // apply never holds up the heartbeats; in log order, this instance's own records too:
        // the log's order is the one every instance agrees on (skipping its own, an instance
        // whose create followed another's removal in the log would apply only the removal).
        // Unbounded: what it holds is read from compacted topics (bounded by them), and a
        // full queue would stop the heartbeats.
        let (work, apply) = mpsc::channel::<ClusterWork>();
        let to = shared.clone();
        std::thread::Builder::new().name("evmesh-definitions".into()).spawn(move || {
            applier("definitions", async move {
                for w in apply {
                    match w {
                        ClusterWork::Define(r) => {
                            appliers::apply_definition(&to, &r.name, r.definition.as_deref()).await
                        }
                        ClusterWork::HomeMoved(name) => appliers::home_moved(&to, &name).await,
                    }
                }
            })
        })?;
        // Replies are handed to the shards on a thread of their own (it waits for them), at
        // most `appliers::REPLIES_QUEUED` bytes of them waiting.
        let (replies, rx) = mpsc::channel::<Forwarded>();
        let queued = Arc::new(AtomicUsize::new(0));
        let (to, me, taken) = (shared.clone(), self.clone(), queued.clone());
        std::thread::Builder::new().name("evmesh-replies".into()).spawn(move || {
            applier("replies", async move {
                for r in rx {
                    taken.fetch_sub(r.value.len(), std::sync::atomic::Ordering::Relaxed);
                    appliers::take_forwarded_reply(&to, &me, r).await;
                }
            })
        })?;
        let topics = self.log.own_topics()?;
        let read = crate::storage::offsets::replicated_position(&shared.db).unwrap_or(0);
        let (me, shared) = (self.clone(), shared.clone());
        let mut load = LoadSampler::new(Instant::now(), crate::sys::process_cpu_us(), 0);
        std::thread::Builder::new().name("evmesh-kafka-cluster".into()).spawn(move || {
            let beat = || heartbeat_of(&shared, &mut load);
            me.run(&shared, &topics, beat, Readers { work, replies, queued, read })
        })?;
        Ok(())
    }

    /// The cluster thread: makes the topics (retrying while the broker is away), reads the
    /// home claims and the definitions from their start and the heartbeats from the last
    /// [`CATCH_UP`] before now (to know the live instances at once, dating those by their
    /// senders' clocks), then heartbeats and reads on.
    fn run(&self, shared: &Shared, topics: &OwnTopics, mut beat: impl FnMut() -> Heartbeat, mut to: Readers) -> ! {
        let every = shared.config.heartbeat;
        let mut wait = Duration::from_millis(100);
        let retry = |what: &str, e: &dyn std::fmt::Display, wait: &mut Duration| {
            crate::log::warn("cluster", &format!("kafka cluster: {what}: {e}; retrying in {wait:?}"), &[]);
            std::thread::sleep(*wait);
            *wait = (*wait * 2).min(Duration::from_secs(5));
        };
        let made = [
            (INSTANCES_TOPIC, HOUR),
            (REPLIES_TOPIC, HOUR),
            (HOMES_TOPIC, COMPACTED),
            (SUBSCRIPTIONS_TOPIC, COMPACTED),
        ];
        for (t, config) in made {
            while let Err(e) = self.log.ensure_own_topic(t, config) {
                retry(&format!("creating {t}"), &e, &mut wait);
            }
        }
        // Replies from the end as it is now (a fixed offset: `Offset::End` is resolved at the
        // first fetch, which may come after a reply for this instance was written).
        let (caught_up_at, homes_end, replies_end) = loop {
            match topics.ends(INSTANCES_TOPIC).and_then(|(low, high)| {
                Ok(((low.max(high - CATCH_UP), high), topics.ends(HOMES_TOPIC)?.1, topics.ends(REPLIES_TOPIC)?.1))
            }) {
                Ok(x) => break x,
                Err(e) => retry("reading the cluster topics' offsets", &e, &mut wait),
            }
        };
        let from = [
            (INSTANCES_TOPIC, Start::At(caught_up_at.0)),
            (HOMES_TOPIC, Start::Beginning),
            (SUBSCRIPTIONS_TOPIC, Start::Beginning),
            (REPLIES_TOPIC, Start::At(replies_end)),
        ];
        while let Err(e) = topics.read(&from) {
            retry("following the cluster topics", &e, &mut wait);
        }
        // Homes are answered once the claims up to `homes_end` are read (`cluster::homes`): by a
        // record's offset, or the consumer's position when nothing more comes (a compacted
        // topic's end need not be a record's).
        let mut caught_up = false;
        let mut homes_read = |next: i64| {
            if next >= homes_end && !std::mem::replace(&mut caught_up, true) {
                self.homes.caught_up();
            }
        };
        homes_read(0);
        let mut logged = Instant::now() - Duration::from_secs(60);
        let mut log = |what: &str, e: &dyn std::fmt::Display| {
            if logged.elapsed() > Duration::from_secs(10) {
                crate::log::warn("cluster", &format!("kafka cluster: {what}: {e}"), &[]);
                logged = Instant::now();
            }
        };
        let mut next = Instant::now();
        // After a stall: the ends of the heartbeats and the claims to read before the view
        // counts again (read so far: the next offsets).
        let mut resync: Option<[(i64, i64); 2]> = None;
        let mut turned = Instant::now();
        // The live instances last seen, to log those that join and those that leave.
        let mut members: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
        loop {
            let now = Instant::now();
            // Stood still past two heartbeats, and at least 500 ms (a paused process, whose
            // clock jumped past the others' heartbeats): the view may be stale until the
            // heartbeats and claims are read to their end again.
            if now.duration_since(turned) > (every * 2).max(Duration::from_millis(500)) {
                if let (Ok((_, i)), Ok((_, h))) = (topics.ends(INSTANCES_TOPIC), topics.ends(HOMES_TOPIC)) {
                    crate::log::warn(
                        "cluster",
                        &format!(
                            "kafka cluster: stood still for {:?}; reading the cluster's view again",
                            now.duration_since(turned)
                        ),
                        &[],
                    );
                    self.homes.stale(true);
                    resync = Some([(i, 0), (h, 0)]);
                }
            }
            turned = Instant::now();
            if let Some(ends) = &mut resync {
                for (t, (_, read)) in [INSTANCES_TOPIC, HOMES_TOPIC].into_iter().zip(ends.iter_mut()) {
                    if let Some(o) = topics.position(t) {
                        *read = (*read).max(o);
                    }
                }
                if ends.iter().all(|(end, read)| read >= end) {
                    self.homes.stale(false);
                    resync = None;
                }
            }
            if now >= next {
                let hb = beat();
                let payload = serde_json::to_vec(&hb).expect("a heartbeat serializes");
                if let Err(e) = self.log.put_record(INSTANCES_TOPIC, hb.instance_id.as_bytes(), Some(&payload), &[]) {
                    log("sending a heartbeat", &e);
                }
                next = (next + every).max(now);
                let live: std::collections::BTreeSet<String> =
                    self.membership.live(now).into_iter().map(|m| m.heartbeat.instance_id).collect();
                for joined in live.difference(&members) {
                    crate::log::info("cluster", "instance joined", &[("instance", joined)]);
                }
                for left in members.difference(&live) {
                    crate::log::warn(
                        "cluster",
                        "instance left (not heard from within instance_timeout)",
                        &[("instance", left)],
                    );
                }
                members = live;
            }
            let wait = next.saturating_duration_since(Instant::now()).min(Duration::from_millis(100));
            match topics.poll(wait, |r| self.take(shared, r, caught_up_at.1, (&mut to, &mut homes_read))) {
                Ok(true) => {}
                Ok(false) => {
                    if let Some(next) = topics.position(HOMES_TOPIC) {
                        homes_read(next);
                    }
                }
                Err(e) => {
                    log("reading the cluster topics", &e);
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
    }

    /// One record of the cluster topics, handed to what applies it. Heartbeats before
    /// `caught_up_at` are dated by their senders' clocks.
    fn take(
        &self,
        shared: &Shared,
        r: OwnRecord<'_>,
        caught_up_at: i64,
        (to, homes_read): (&mut Readers, &mut impl FnMut(i64)),
    ) {
        let text = |b: Option<&[u8]>| b.and_then(|b| std::str::from_utf8(b).ok()).map(str::to_owned);
        match r.topic {
            HOMES_TOPIC => {
                match text(r.key) {
                    Some(key) if key.starts_with(OFFSET_KEY) => {
                        let by = r.headers.iter().find(|(k, _)| *k == BY_HEADER).and_then(|(_, v)| text(Some(v)));
                        if let Some(by) = by {
                            let key = key[OFFSET_KEY.len()..].to_owned();
                            let value = r.value.map(<[u8]>::to_vec);
                            let offset = Replicated { key, value, by, next: r.offset as u64 + 1 };
                            appliers::apply_offset(shared, self, offset, &mut to.read);
                        }
                    }
                    Some(key) => appliers::claim_read((shared, self), key, r.value, &to.work),
                    None => {}
                }
                homes_read(r.offset + 1);
            }
            REPLIES_TOPIC => {
                let Some(key) = r.key.and_then(|k| std::str::from_utf8(k).ok()) else { return };
                appliers::forwarded(self, (key, &r.headers, r.value.unwrap_or(&[])), (&to.replies, &to.queued));
            }
            SUBSCRIPTIONS_TOPIC => {
                if let Some(name) = text(r.key) {
                    let _ =
                        to.work.send(ClusterWork::Define(Defined { name, definition: r.value.map(<[u8]>::to_vec) }));
                }
            }
            _ => {
                let Some(hb) = r.value.and_then(Heartbeat::parse) else { return };
                let age = match r.offset < caught_up_at {
                    true => crate::model::clock::now_ms().saturating_sub(hb.sent_ms.max(0) as u64),
                    false => 0,
                };
                self.membership.heard(hb, Duration::from_millis(age), Instant::now());
            }
        }
    }
}

/// Where the cluster thread hands what it read: the definitions' and the replies' threads, and
/// the position after the last replicated offset applied.
struct Readers {
    work: mpsc::Sender<ClusterWork>,
    replies: mpsc::Sender<Forwarded>,
    queued: Arc<AtomicUsize>,
    read: u64,
}
