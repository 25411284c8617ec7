//! What every thread can see ([`Shared`]): built by `runtime` before any shard starts, never
//! replaced; immutable, atomic or behind a lock afterwards (the cluster seam's view and the
//! Kafka followers are behind mutexes). Shards read it through their
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
    /// The shards write their segments with O_DIRECT through io_uring (`direct_io` on, the
    /// shards run io_uring, the embedded log at durability `os` or `fsync`).
    pub direct_writes: bool,
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
    /// The other instances, if any (`crate::cluster::Cluster`): membership, homes, what is
    /// replicated to them and forwarded between them.
    pub cluster: Arc<dyn crate::cluster::Cluster>,
    /// With Kafka: the topics the tail follows (those sessions here read; [`Shared::follow_topic`]).
    pub followed: Mutex<std::collections::HashSet<String>>,
    /// With a remote log: bytes of records the tail read (`evmesh_kafka_tail_bytes_total`, its
    /// name from when Kafka was the only one).
    pub tail_bytes: AtomicU64,
    /// With a remote log (`storage = kafka | rocketmq`): the connection every shard produces
    /// through (with Kafka, the cluster's records go through it too, but only
    /// [`Shared::cluster`] writes those).
    pub remote: Option<Arc<dyn crate::storage::remote::Remote>>,
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
                crate::log::warn(
                    "shard",
                    &format!("resident memory {mb} MiB is over memory_limit_bytes ({limit} MiB): shedding new work"),
                    &[],
                );
            } else {
                crate::log::warn(
                    "shard",
                    &format!("resident memory {mb} MiB is back under the limit ({limit} MiB)"),
                    &[],
                );
            }
        }
    }
}

impl Shared {
    /// Releases the claims of agents this instance holds that it no longer serves (not
    /// registered here, or silent past ten heartbeat timeouts, as the registry forgets them),
    /// claimed at least that long ago: an agent that left without deregistering (or was lost
    /// with a restart) leaves no claim behind for good. (None are held on the embedded log.)
    pub fn sweep_agent_claims(&self) {
        let forget = self.config.agent_heartbeat_timeout.saturating_mul(10);
        let Some(before) = Instant::now().checked_sub(forget) else { return };
        let now_ms = crate::model::clock::now_ms();
        for key in self.cluster.homes().held(&self.config.instance_id, "agent/", before) {
            let stored = &key["agent/".len()..];
            let served =
                self.agents.heard(stored, now_ms, forget.as_millis() as u64) || self.remotes.get(stored).is_some();
            if !served {
                self.cluster.release_home(&key);
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

    /// Whether the log is another system's (storage = kafka | rocketmq): a topic is then the
    /// broker's, whichever instance (or tool) made it.
    pub fn clustered_log(&self) -> bool {
        self.config.storage.remote()
    }

    /// With Kafka: `topic` grew from `from` partitions to `to`; a followed topic's new
    /// partitions are followed too, from the start of their local copies.
    pub fn follow_grown(&self, topic: &str, from: u32, to: u32) {
        if let Some(k) = &self.remote {
            if !self.followed.lock().expect("not poisoned").contains(topic) {
                return;
            }
            for p in (from..to).map(crate::model::PartitionId) {
                let at = self.local_end(topic, p).unwrap_or(0);
                k.follow(crate::storage::remote::Follow { topic: topic.to_owned(), partition: p.0, from: at });
            }
        }
    }

    /// With Kafka: has the tail follow `topic`, each partition from the end of its local copy,
    /// from now on (once; an instance keeps following what it served). Called as a consumer of
    /// the topic is made here, a live session attaches, or a dead letter goes to it: an
    /// instance reads only the topics sessions here need (sessions are served at their
    /// subscription's home), not every topic of the cluster. Not following, the local copy
    /// stays where it was (a publish here is written through only where it continues it), and
    /// is caught up from Kafka when followed.
    pub fn follow_topic(&self, topic: &str) {
        if let Some(k) = &self.remote {
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
                k.follow(crate::storage::remote::Follow { topic: topic.to_owned(), partition: p.0, from });
            }
        }
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

    /// Shards whose event loop has not run for `STALLED_AFTER` (or that never started).
    pub fn stalled_shards(&self) -> Vec<usize> {
        let now = self.epoch.elapsed().as_millis() as u64;
        let limit = STALLED_AFTER.as_millis() as u64;
        (0..self.beats.len()).filter(|&i| now.saturating_sub(self.beats[i].load(Ordering::Relaxed)) > limit).collect()
    }
}
