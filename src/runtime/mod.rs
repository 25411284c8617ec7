//! Starting and stopping the broker: open storage, build the mailboxes, bind every listener, then
//! spawn one named, pinned thread per shard (each its own monoio runtime) and the admin thread.
//!
//! Everything shared between threads is built here, before any shard starts, and is immutable or
//! atomic afterwards ([`Shared`]).

use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::admin::metrics::Metrics;
use crate::admin::Admin;
use crate::config::{Config, IoDriver};
use crate::ingress::Traffic;
use crate::server::conn::{serve, ConnLimits};
use crate::server::listen::bind_shared;
use crate::server::{ConnGuard, Handler};
use crate::shard::core::Shard;
use crate::shard::mailbox::Mailboxes;
use crate::shard::ShardId;
use crate::storage::embedded::Syncer;
use crate::storage::{db, Durability, StorageError};
#[cfg(feature = "kafka")]
use crate::{
    config::StorageKind,
    shard::mailbox::Sender,
    shard::message::{Mirrored, ShardMessage},
    storage::kafka::{Follow, KafkaBackend},
    storage::Storage,
};

/// What every thread can see: built before the shards start, never replaced.
pub struct Shared {
    pub config: Config,
    pub mailboxes: Mailboxes,
    pub db: Arc<rocksdb::DB>,
    pub syncer: Option<Syncer>,
    pub metrics: Metrics,
    /// Shards that accept connections; `/readyz` is 200 when it equals the shard count.
    pub ready: AtomicUsize,
    /// With `storage = kafka`: the connection every shard produces through.
    #[cfg(feature = "kafka")]
    pub kafka: Option<Arc<crate::storage::kafka::KafkaBackend>>,
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("storage: {0}")]
    Storage(#[from] StorageError),
    #[error("{0}")]
    Io(#[from] io::Error),
}

/// Microseconds since the Unix epoch.
pub fn now_micros() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_micros() as i64).unwrap_or(0)
}

/// The driver a shard will really use.
pub fn resolve_driver(d: IoDriver) -> IoDriver {
    match d {
        IoDriver::Auto if monoio::utils::detect_uring() => IoDriver::Uring,
        IoDriver::Auto => IoDriver::Epoll,
        other => other,
    }
}

fn block_on<F: std::future::Future>(driver: IoDriver, fut: F) -> io::Result<F::Output> {
    Ok(match driver {
        IoDriver::Uring => monoio::RuntimeBuilder::<monoio::IoUringDriver>::new().enable_timer().build()?.block_on(fut),
        IoDriver::Epoll | IoDriver::Auto => {
            monoio::RuntimeBuilder::<monoio::LegacyDriver>::new().enable_timer().build()?.block_on(fut)
        }
    })
}

fn conn_limits(c: &Config) -> ConnLimits {
    ConnLimits {
        http: c.limits,
        header_read_timeout: c.header_read_timeout,
        idle_timeout: c.idle_timeout,
        write_timeout: c.write_timeout,
        ws_max_message: c.ws_max_message,
        delivery_linger: c.delivery_linger,
    }
}

async fn accept_loop<H: Handler + 'static>(
    listener: monoio::net::TcpListener,
    handler: Rc<H>,
    limits: ConnLimits,
    shard: Option<Rc<Shard>>,
) {
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                // Out of descriptors or a transient error: back off instead of spinning.
                eprintln!("evmesh: accept: {e}");
                monoio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        if let Some(shard) = &shard {
            let m = shard.shared.metrics.shard(shard.id);
            if shard.connections.get() >= shard.shared.config.max_connections {
                m.connections_rejected.inc();
                drop(stream);
                continue;
            }
            m.connections_accepted.inc();
            m.connections_open.inc();
            shard.connections.set(shard.connections.get() + 1);
        }
        let _ = stream.set_nodelay(true);
        let handler = handler.clone();
        let guard = match &shard {
            Some(shard) => {
                let shard = shard.clone();
                ConnGuard::new(move || {
                    shard.connections.set(shard.connections.get() - 1);
                    shard.shared.metrics.shard(shard.id).connections_open.sub(1);
                })
            }
            None => ConnGuard::uncounted(),
        };
        monoio::spawn(async move { serve(stream, &*handler, limits, guard).await });
    }
}

/// The addresses and driver a started broker serves with.
#[derive(Debug, Clone, Copy)]
pub struct Started {
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    pub driver: IoDriver,
}

#[cfg(feature = "kafka")]
/// Checks every known topic on the broker, follows each partition from the end of its local
/// copy, and starts the tail, which hands fetched records to their owner's mailbox.
fn start_kafka(shared: &Arc<Shared>, kafka: &Arc<KafkaBackend>) -> Result<(), StartError> {
    let shards = shared.config.shards;
    let mut known = Vec::new();
    for (topic, m) in crate::storage::meta::list(&shared.db)? {
        let mut ends = Vec::new();
        for p in (0..m.partitions).map(crate::shard::PartitionId) {
            let owner = crate::shard::owner(&topic, p, shards);
            let local = crate::storage::embedded::EmbeddedLog::new(shared.db.clone(), owner, Durability::Memory, None);
            ends.push(local.bounds(&topic, p)?.end);
        }
        known.push((topic, m.partitions, ends));
    }
    // The broker may be away right now: check the topics and start following them from a
    // thread of their own, retrying, so the shards serve (and answer 503) meanwhile.
    let k = kafka.clone();
    std::thread::Builder::new().name("evmesh-kafka-start".into()).spawn(move || {
        for (topic, partitions, ends) in known {
            let mut wait = Duration::from_millis(100);
            let checked = loop {
                match futures::executor::block_on(k.ensure_topic(&topic, partitions)) {
                    Ok(()) => break true,
                    Err(e @ StorageError::Conflict { .. }) => {
                        eprintln!("evmesh: kafka: {topic} is not followed: {e}");
                        break false;
                    }
                    Err(e) => {
                        eprintln!("evmesh: kafka: checking {topic}: {e}; retrying in {wait:?}");
                        std::thread::sleep(wait);
                        wait = (wait * 2).min(Duration::from_secs(10));
                    }
                }
            };
            if !checked {
                continue;
            }
            for (p, from) in ends.into_iter().enumerate() {
                k.follow(Follow { topic: topic.clone(), partition: p as u32, from });
            }
        }
    })?;
    let to = shared.clone();
    kafka.start_tail(move |(partition, frames)| {
        let Some(topic) = frames.first().map(|f| f.body().topic.as_str().to_owned()) else { return };
        let owner = crate::shard::owner(&topic, partition, shards);
        let mut msg = ShardMessage::Mirror(Box::new(Mirrored { partition, frames }));
        // Never dropped: the local copy must not get a hole. Wait for room instead.
        while let Err(back) = to.mailboxes.send(Sender::Admin, owner, msg) {
            msg = back;
            std::thread::sleep(Duration::from_millis(1));
        }
    })?;
    Ok(())
}

/// Starts every thread and returns once all shards accept connections.
pub fn start(config: Config) -> Result<(Started, Arc<Shared>), StartError> {
    let shards = config.shards;
    let db = db::open(&config.data_dir, shards)?;
    let syncer = if config.durability == Durability::Fsync { Some(Syncer::start(db.clone())?) } else { None };
    let traffic = bind_shared(config.listen, shards)?;
    let admin = bind_shared(config.admin_listen, 1)?.remove(0);
    let started = Started {
        listen: traffic[0].local_addr()?,
        admin_listen: admin.local_addr()?,
        driver: resolve_driver(config.io_driver),
    };
    #[cfg(feature = "kafka")]
    let kafka = match &config.storage {
        StorageKind::Kafka(settings) => Some(KafkaBackend::connect(settings.clone())?),
        StorageKind::Embedded => None,
    };
    let shared = Arc::new(Shared {
        mailboxes: Mailboxes::new(shards, config.mailbox_capacity),
        metrics: Metrics::new(shards),
        ready: AtomicUsize::new(0),
        #[cfg(feature = "kafka")]
        kafka,
        db,
        syncer,
        config,
    });
    #[cfg(feature = "kafka")]
    if let Some(k) = &shared.kafka {
        start_kafka(&shared, k)?;
    }
    let cores = core_affinity::get_core_ids().unwrap_or_default();
    for (i, listener) in traffic.into_iter().enumerate() {
        let shared = shared.clone();
        let core = if cores.is_empty() { None } else { Some(cores[i % cores.len()]) };
        let driver = started.driver;
        std::thread::Builder::new().name(format!("evmesh-shard-{i}")).spawn(move || {
            if let Some(core) = core {
                core_affinity::set_for_current(core);
            }
            let run = async move {
                let id = ShardId(i as u16);
                let shard = Rc::new(Shard::new(id, shared.clone()));
                let listener = match monoio::net::TcpListener::from_std(listener) {
                    Ok(l) => l,
                    Err(e) => {
                        eprintln!("evmesh: shard {i}: listener: {e}");
                        std::process::exit(1);
                    }
                };
                monoio::spawn(shard.clone().pump());
                monoio::spawn(shard.clone().retention_loop());
                monoio::spawn(shard.clone().delivery_timers());
                let limits = conn_limits(&shared.config);
                shared.ready.fetch_add(1, Ordering::AcqRel);
                accept_loop(listener, Rc::new(Traffic { shard: shard.clone() }), limits, Some(shard)).await
            };
            if let Err(e) = block_on(driver, run) {
                eprintln!("evmesh: shard {i}: cannot start the {driver:?} driver: {e}");
                std::process::exit(1);
            }
        })?;
    }
    {
        let shared = shared.clone();
        std::thread::Builder::new().name("evmesh-admin".into()).spawn(move || {
            let run = async move {
                let listener = monoio::net::TcpListener::from_std(admin).expect("admin listener");
                let limits = conn_limits(&shared.config);
                accept_loop(listener, Rc::new(Admin { shared, replaying: Default::default() }), limits, None).await
            };
            if let Err(e) = block_on(IoDriver::Epoll, run) {
                eprintln!("evmesh: admin thread: {e}");
                std::process::exit(1);
            }
        })?;
    }
    while shared.ready.load(Ordering::Acquire) < shards {
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok((started, shared))
}
