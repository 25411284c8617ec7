//! What every thread can see ([`Shared`]): built by `runtime` before any shard starts, never
//! replaced; immutable, atomic or behind a lock afterwards (the cluster's view, `membership`
//! and `homes`, and the Kafka followers are behind mutexes). Shards read it through their
//! `Rc<Shard>`; the admin thread and the cluster's threads read it directly.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::mailbox::Mailboxes;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::storage::embedded::Syncer;

/// A shard whose heartbeat is older than this is not ready: its core is blocked.
pub const STALLED_AFTER: Duration = Duration::from_secs(5);

/// Mirrored fan-outs a shard may have waiting before the Kafka tail waits (see
/// `Shared::mirror_fan_outs`).
pub const MIRROR_FAN_OUTS_HIGH: usize = 64;

/// What every thread can see: built before the shards start, never replaced.
pub struct Shared {
    pub config: Config,
    /// Identity, the ACL, the audit log.
    pub governance: crate::governance::Governance,
    pub mailboxes: Mailboxes,
    pub db: Arc<rocksdb::DB>,
    /// Every partition's segment log (the embedded log's events, or Kafka's local copy).
    pub logs: Arc<crate::storage::partitions::PartitionLogs>,
    pub syncer: Option<Syncer>,
    pub metrics: Metrics,
    /// Shards that accept connections; `/readyz` is 200 when it equals the shard count.
    pub ready: AtomicUsize,
    /// Per shard, when its event loop last ran its heartbeat task (ms since `epoch`); a shard
    /// whose beat is old is stalled (a blocked core), and `/readyz` says so.
    pub beats: Box<[Arc<AtomicU64>]>,
    /// Per shard: fan-outs of records mirrored from Kafka not done yet. The tail waits while
    /// a shard has [`MIRROR_FAN_OUTS_HIGH`] of them, as it waits for room in a full mailbox.
    pub mirror_fan_outs: Box<[AtomicUsize]>,
    /// Per shard: when its `accept` last found the process out of descriptors (ms since the
    /// Unix epoch; 0: never). `/readyz` reports a shard that could not for [`STALLED_AFTER`].
    pub descriptors_short: Box<[AtomicU64]>,
    /// How the open-files limit is shared out (`config::fds::fd_budget`), as printed at start.
    pub fds: crate::config::fds::FdBudget,
    pub epoch: Instant,
    /// Topics and subscriptions that exist, against `max_topics` / `max_subscriptions`
    /// (counted at start, then kept by the shards that create and remove them).
    pub topic_count: AtomicUsize,
    pub subscription_count: AtomicUsize,
    /// The process-wide memory budget (`memory_limit_bytes`) and what is in use.
    pub memory: Memory,
    /// Registered agents (agent streaming calls).
    pub agents: super::agents::Agents,
    /// Open sessions of agent streaming calls (Mode 1), with their turns' chunks.
    pub calls: super::calls::Calls,
    /// A2A tasks (the gateway's), running on those sessions.
    pub tasks: super::tasks::Tasks,
    /// Remote A2A agents, and which of their tasks are whose.
    pub remotes: super::tasks::Remotes,
    /// Lite topics with a follower (session pub/sub), woken by their owners after appends.
    pub watchers: Arc<super::watch::Watchers>,
    /// With `tls_cert`: the TLS sessions of both listeners (certificates reloaded on SIGHUP).
    pub tls: Option<Arc<crate::server::tls::TlsAcceptor>>,
    /// The broker's TLS client configuration (https webhook sinks).
    pub client_tls: Arc<rustls::ClientConfig>,
    /// The traffic and admin listeners' bound addresses (webhook sinks may not point there).
    pub listeners: [std::net::SocketAddr; 2],
    /// The instances this one knows to be live (itself alone on the embedded log).
    pub membership: crate::cluster::Membership,
    /// The home claims read back from Kafka (`cluster::homes`; none on the embedded log).
    pub homes: crate::cluster::homes::Homes,
    /// Replies forwarded to other instances, waiting for their outcome (`cluster::replies`).
    pub forwards: crate::cluster::replies::Forwards,
    /// With Kafka: the topics the tail follows (those sessions here read; [`Shared::follow_topic`]).
    pub followed: Mutex<std::collections::HashSet<String>>,
    /// With Kafka: bytes of records the tail read (`evmesh_kafka_tail_bytes_total`).
    pub tail_bytes: AtomicU64,
    /// With `storage = kafka`: the connection every shard produces through.
    #[cfg(feature = "kafka")]
    pub kafka: Option<Arc<crate::storage::kafka::KafkaBackend>>,
}

/// The process-wide memory budget. A watcher thread samples the resident set every 100 ms;
/// while it is over the limit the broker sheds new work (publishes and new sessions get 503
/// with `Retry-After`) instead of growing, until it is back under 90% of it.
pub struct Memory {
    pub limit: u64,
    pub resident: AtomicU64,
    pub shedding: std::sync::atomic::AtomicBool,
    /// Requests refused because of it.
    pub shed: AtomicU64,
}

impl Memory {
    pub fn new(limit: u64) -> Self {
        Memory { limit, resident: AtomicU64::new(0), shedding: Default::default(), shed: AtomicU64::new(0) }
    }

    /// Whether new work must be refused now (counts the refusal).
    pub fn shed_now(&self) -> bool {
        let shed = self.shedding.load(Ordering::Relaxed);
        if shed {
            self.shed.fetch_add(1, Ordering::Relaxed);
        }
        shed
    }

    /// Takes a reading of the resident set (the watcher thread calls this).
    pub fn sample(&self) {
        let Some(rss) = crate::sys::resident_bytes() else { return };
        self.resident.store(rss, Ordering::Relaxed);
        let was = self.shedding.load(Ordering::Relaxed);
        let now = if was { rss > self.limit / 10 * 9 } else { rss > self.limit };
        if now != was {
            self.shedding.store(now, Ordering::Relaxed);
            let (mb, limit) = (rss >> 20, self.limit >> 20);
            if now {
                eprintln!(
                    "evmesh: resident memory {mb} MiB is over memory_limit_bytes ({limit} MiB): shedding new work"
                );
            } else {
                eprintln!("evmesh: resident memory {mb} MiB is back under the limit ({limit} MiB)");
            }
        }
    }
}

/// A home instance: its id and the URL clients reach it at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HomeInstance {
    pub id: String,
    pub url: String,
    /// Its claim has been read back: false while this instance's own choice of itself is on
    /// its way through the claims' log, before which it must not serve the key (the offsets
    /// the last home stored come before the claim in that log, `cluster::homes`).
    pub settled: bool,
    /// A claim names it (not the choice alone, which the next claim may overrule).
    pub claimed: bool,
}

impl Shared {
    /// The home instance of `key` (`cluster::homes`): on the embedded log this instance; with
    /// Kafka the claimed one while it is live, else the weighted rendezvous choice among the
    /// live instances, recorded as a claim if `record`. `None` while no instance is known live
    /// or the claims are not read yet (just started, or Kafka away for longer than
    /// `instance_timeout_ms`).
    pub fn home(&self, key: &str, record: bool) -> Option<HomeInstance> {
        #[cfg(feature = "kafka")]
        if let Some(k) = &self.kafka {
            let now = Instant::now();
            let me = &self.config.instance_id;
            // The common case at a home (every attach, poll and ack of its subscriptions): its
            // own claim, and it is live. Answered without copying the view.
            if self.homes.claimed_by(key, me) && self.membership.is_live(me, now) {
                let url = self.config.advertised_url.clone();
                return Some(HomeInstance { id: me.clone(), url, settled: true, claimed: true });
            }
            let live = self.membership.live(now);
            let h = self.homes.home(key, &live, (now, self.config.instance_timeout), record)?;
            let hb = &h.member.heartbeat;
            if h.record {
                let claim = crate::cluster::homes::Claim { instance: hb.instance_id.clone(), epoch: h.epoch };
                if let Err(e) = k.claim_home(key, Some(&claim.encode())) {
                    eprintln!("evmesh: the home of {key} not recorded: {e}");
                }
            }
            let settled = hb.instance_id != *me || self.homes.claimed_by(key, me);
            let (id, url) = (hb.instance_id.clone(), hb.advertised_url.clone());
            return Some(HomeInstance { id, url, settled, claimed: h.claimed });
        }
        let (id, url) = (self.config.instance_id.clone(), self.config.advertised_url.clone());
        Some(HomeInstance { id, url, settled: true, claimed: true })
    }

    /// With Kafka: tells every instance that subscription `name` is now `def` (or removed,
    /// `None`), so each can serve it (`runtime::apply_definition`). Pushed subscriptions (a
    /// webhook sink, a classic group) stay on the instance that made them: their webhook
    /// sessions would otherwise push from every instance.
    pub fn replicate_definition(&self, name: &str, def: Option<&crate::subscription::definition::Definition>) {
        #[cfg(feature = "kafka")]
        if let Some(k) = &self.kafka {
            if def.is_some_and(|d| d.pushed()) {
                return;
            }
            let json = def.map(|d| serde_json::to_vec(d).expect("a definition serializes"));
            if let Err(e) = k.put_definition(name, json.as_deref()) {
                eprintln!("evmesh: subscription {name} not told to the other instances: {e}");
            }
            // Removed: its claim goes too, and with it any offset its home still writes.
            if def.is_none() {
                let key = crate::cluster::homes::subscription_key(name);
                if let Err(e) = k.claim_home(&key, None) {
                    eprintln!("evmesh: the home of {name} not released: {e}");
                }
            }
        }
        #[cfg(not(feature = "kafka"))]
        let _ = (name, def);
    }

    /// With Kafka: claims `key` for this instance unless a claim names it already (an agent
    /// registered or heard from here, a session topic stored to here: see `Traffic::served_here`,
    /// which says when). One claim per key on its way, however often asked.
    pub fn claim_here(&self, key: &str) {
        #[cfg(feature = "kafka")]
        if let Some(k) = &self.kafka {
            let me = &self.config.instance_id;
            if self.homes.claimed_by(key, me) {
                return;
            }
            let (now, timeout) = (Instant::now(), self.config.instance_timeout);
            let live = self.membership.live(now);
            // A live instance's claim (or one on its way) stands: taken only from the dead.
            if self.homes.home(key, &live, (now, timeout), false).is_some_and(|h| h.claimed) {
                return;
            }
            let mine: Vec<_> = live.into_iter().filter(|m| m.heartbeat.instance_id == *me).collect();
            let Some(h) = self.homes.home(key, &mine, (now, timeout), true) else { return };
            if h.record {
                let claim = crate::cluster::homes::Claim { instance: me.clone(), epoch: h.epoch };
                if let Err(e) = k.claim_home(key, Some(&claim.encode())) {
                    eprintln!("evmesh: the home of {key} not recorded: {e}");
                }
            }
        }
        #[cfg(not(feature = "kafka"))]
        let _ = key;
    }

    /// With Kafka: releases the claim of `key` if this instance holds it (a deregistered agent,
    /// an expired session pub/sub topic), so the homes topic keeps no claim of it.
    pub fn release_home(&self, key: &str) {
        #[cfg(feature = "kafka")]
        if let Some(k) = &self.kafka {
            if self.homes.claimed_by(key, &self.config.instance_id) {
                if let Err(e) = k.claim_home(key, None) {
                    eprintln!("evmesh: the home of {key} not released: {e}");
                }
            }
        }
        #[cfg(not(feature = "kafka"))]
        let _ = key;
    }

    /// With Kafka: releases the claims of agents this instance holds that it no longer serves
    /// (not registered here, or silent past ten heartbeat timeouts, as the registry forgets
    /// them), claimed at least that long ago: an agent that left without deregistering (or
    /// was lost with a restart) leaves no claim behind for good.
    pub fn sweep_agent_claims(&self) {
        #[cfg(feature = "kafka")]
        if self.kafka.is_some() {
            let forget = self.config.agent_heartbeat_timeout.saturating_mul(10);
            let Some(before) = Instant::now().checked_sub(forget) else { return };
            let now_ms = crate::model::clock::now_ms();
            for key in self.homes.held(&self.config.instance_id, "agent/", before) {
                let stored = &key["agent/".len()..];
                let served =
                    self.agents.heard(stored, now_ms, forget.as_millis() as u64) || self.remotes.get(stored).is_some();
                if !served {
                    self.release_home(&key);
                }
            }
        }
    }

    /// What cannot open files now: shards whose `accept`, and partitions whose file, found the
    /// process out of descriptors within [`STALLED_AFTER`], or this thread finding it so now.
    /// `None` when files open.
    pub fn descriptors_short(&self) -> Option<String> {
        let now = crate::model::clock::now_ms();
        let recent = |at: u64| at > 0 && now.saturating_sub(at) < STALLED_AFTER.as_millis() as u64;
        let shards: Vec<usize> = (0..self.descriptors_short.len())
            .filter(|&i| recent(self.descriptors_short[i].load(Ordering::Relaxed)))
            .collect();
        let partitions = self.logs.short_at().is_some_and(recent);
        let probe = std::fs::File::open("/dev/null").err().map(|e| e.to_string());
        if shards.is_empty() && !partitions && probe.is_none() {
            return None;
        }
        let mut why = Vec::new();
        if !shards.is_empty() {
            why.push(format!("shards {shards:?} could not accept a connection for want of a file descriptor"));
        }
        if partitions {
            why.push("a partition's file could not be opened for want of a file descriptor".to_owned());
        }
        if let Some(e) = probe {
            why.push(format!("no file can be opened now ({e})"));
        }
        Some(format!("{} (descriptors: {})", why.join("; "), self.fds))
    }

    /// Whether the log is shared with other instances (storage = kafka): a topic is then the
    /// broker's, whichever instance (or Kafka tool) made it.
    pub fn clustered_log(&self) -> bool {
        !matches!(self.config.storage, crate::config::StorageKind::Embedded)
    }

    /// With Kafka: `topic` grew from `from` partitions to `to`; a followed topic's new
    /// partitions are followed too, from the start of their local copies.
    pub fn follow_grown(&self, topic: &str, from: u32, to: u32) {
        #[cfg(feature = "kafka")]
        if let Some(k) = &self.kafka {
            if !self.followed.lock().expect("not poisoned").contains(topic) {
                return;
            }
            for p in (from..to).map(crate::model::PartitionId) {
                let at = self.local_end(topic, p).unwrap_or(0);
                k.follow(crate::storage::kafka::Follow { topic: topic.to_owned(), partition: p.0, from: at });
            }
        }
        #[cfg(not(feature = "kafka"))]
        let _ = (topic, from, to);
    }

    /// With Kafka: has the tail follow `topic`, each partition from the end of its local copy,
    /// from now on (once; an instance keeps following what it served). Called as a consumer of
    /// the topic is made here, a live session attaches, or a dead letter goes to it: an
    /// instance reads only the topics sessions here need (sessions are served at their
    /// subscription's home), not every topic of the cluster. Not following, the local copy
    /// stays where it was (a publish here is written through only where it continues it), and
    /// is caught up from Kafka when followed.
    pub fn follow_topic(&self, topic: &str) {
        #[cfg(feature = "kafka")]
        if let Some(k) = &self.kafka {
            {
                let mut followed = self.followed.lock().expect("not poisoned");
                if crate::model::StoredTopic::new(topic).is_lite() || followed.contains(topic) {
                    return;
                }
                followed.insert(topic.to_owned());
            }
            let partitions = match crate::storage::meta::get(&self.db, topic) {
                Ok(Some(m)) => m.partitions,
                _ => {
                    self.followed.lock().expect("not poisoned").remove(topic);
                    return;
                }
            };
            for p in (0..partitions).map(crate::model::PartitionId) {
                let from = self.local_end(topic, p).unwrap_or(0);
                k.follow(crate::storage::kafka::Follow { topic: topic.to_owned(), partition: p.0, from });
            }
        }
        #[cfg(not(feature = "kafka"))]
        let _ = topic;
    }

    /// The end of the local copy of a partition (what its owner wrote of it).
    pub fn local_end(&self, topic: &str, p: crate::model::PartitionId) -> Result<u64, crate::storage::StorageError> {
        let owner = crate::model::placement::owner(topic, p, self.config.shards);
        let local = crate::storage::embedded::EmbeddedLog::new(
            self.db.clone(),
            self.logs.clone(),
            owner,
            crate::storage::Durability::Memory,
            None,
            self.config.lite_topic_ttl,
        );
        Ok(crate::storage::Storage::bounds(&local, topic, p)?.end)
    }

    /// A reply for a request waiting at the instance tagged `tag` (`cluster::replies`): written
    /// to Kafka for it, and its outcome there awaited (at most `replies::WAIT`). `Unknown`
    /// when no live instance has that tag (or on the embedded log).
    pub async fn forward_reply(
        &self,
        tag: u64,
        frame: frame_codec::Frame,
        replier: super::requests::Replier,
    ) -> crate::model::ReplyOutcome {
        use crate::model::ReplyOutcome;
        #[cfg(feature = "kafka")]
        if let Some(k) = &self.kafka {
            use crate::cluster::replies::{instance_tag, FORWARD, FROM, KIND, PRINCIPAL, TENANT, WAIT};
            let live = self.membership.live(Instant::now());
            let Some(to) = live.iter().find(|m| instance_tag(&m.heartbeat.instance_id) == tag) else {
                return ReplyOutcome::Unknown;
            };
            let Some(mut forward) = self.forwards.open() else { return ReplyOutcome::Unreachable };
            let number = forward.n.to_string();
            let mut headers: Vec<(&str, &[u8])> =
                vec![(KIND, b"reply"), (FROM, self.config.instance_id.as_bytes()), (FORWARD, number.as_bytes())];
            if let Some(p) = &replier.principal {
                headers.push((PRINCIPAL, p.as_bytes()));
            }
            if let Some(t) = &replier.tenant {
                headers.push((TENANT, t.as_bytes()));
            }
            let sent = k.put_reply(&to.heartbeat.instance_id, &headers, frame.as_bytes());
            // Copied into the producer's queue: not held while the outcome is awaited.
            drop(frame);
            let outcome = match sent {
                Ok(()) => crate::server::deadline::within(WAIT, &mut forward.outcome).await.ok().and_then(Result::ok),
                Err(e) => {
                    eprintln!("evmesh: a reply not forwarded to {}: {e}", to.heartbeat.instance_id);
                    None
                }
            };
            return outcome.unwrap_or(ReplyOutcome::Unreachable);
        }
        let _ = (tag, frame, replier);
        ReplyOutcome::Unknown
    }

    /// Shards whose event loop has not run for `STALLED_AFTER` (or that never started).
    pub fn stalled_shards(&self) -> Vec<usize> {
        let now = self.epoch.elapsed().as_millis() as u64;
        let limit = STALLED_AFTER.as_millis() as u64;
        (0..self.beats.len()).filter(|&i| now.saturating_sub(self.beats[i].load(Ordering::Relaxed)) > limit).collect()
    }
}
