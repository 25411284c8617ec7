//! The cluster seam as the runtime starts it (`crate::cluster::Cluster`; SPEC, "Many
//! instances"): [`Single`] on the embedded log, whose membership a heartbeat thread feeds;
//! [`kafka::KafkaCluster`] with `storage = kafka`, which owns the heartbeats, the claims, the
//! replicated definitions and offsets, the forwarded replies and the threads that apply them
//! ([`appliers`]).

#[cfg(feature = "kafka")]
mod appliers;
#[cfg(feature = "kafka")]
pub mod kafka;
#[cfg(feature = "kafka")]
mod reader;

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::error::StartError;
use crate::cluster::{Cluster, Single};
use crate::shard::shared::Shared;

/// The Kafka connection, with `storage = kafka`.
#[cfg(feature = "kafka")]
pub(super) type Log = Option<Arc<crate::storage::kafka::KafkaBackend>>;
#[cfg(not(feature = "kafka"))]
pub(super) type Log = Option<std::convert::Infallible>;

/// The implementation [`start`] starts once `Shared` exists (none for [`Single`]).
#[cfg(feature = "kafka")]
pub(super) type ToStart = Option<Arc<kafka::KafkaCluster>>;
#[cfg(not(feature = "kafka"))]
pub(super) type ToStart = Option<std::convert::Infallible>;

/// The seam for this configuration: [`kafka::KafkaCluster`] over the Kafka connection, else
/// [`Single`].
pub(super) fn seam(config: &crate::config::Config, log: &Log) -> (Arc<dyn Cluster>, ToStart) {
    #[cfg(feature = "kafka")]
    if let Some(log) = log {
        let k = Arc::new(kafka::KafkaCluster::new(log.clone(), config));
        return (k.clone(), Some(k));
    }
    let _ = log;
    let single = Single::new(config.instance_id.clone(), config.advertised_url.clone(), config.instance_timeout);
    (Arc::new(single), None)
}

/// Heartbeats every `heartbeat_ms`: through Kafka to every instance (`storage = kafka`, with
/// the appliers of what the others write), or straight into this instance's own view (the
/// embedded log: a cluster of one).
pub(super) fn start(shared: &Arc<Shared>, to_start: ToStart) -> Result<(), StartError> {
    #[cfg(feature = "kafka")]
    if let Some(k) = to_start {
        return k.start(shared);
    }
    let _ = to_start;
    let mut load = crate::cluster::LoadSampler::new(Instant::now(), crate::sys::process_cpu_us(), 0);
    let (every, shared) = (shared.config.heartbeat, shared.clone());
    std::thread::Builder::new().name("evmesh-heartbeat".into()).spawn(move || loop {
        let hb = heartbeat_of(&shared, &mut load);
        shared.cluster.membership().heard(hb, Duration::ZERO, Instant::now());
        std::thread::sleep(every);
    })?;
    Ok(())
}

/// This instance's heartbeat: who it is, where clients reach it, its load (see `cluster`).
pub(super) fn heartbeat_of(shared: &Shared, load: &mut crate::cluster::LoadSampler) -> crate::cluster::Heartbeat {
    let m = &shared.metrics;
    let now = Instant::now();
    let (bytes_per_second, cpu_percent) = load.sample(now, crate::sys::process_cpu_us(), m.total(|s| &s.bytes_stored));
    crate::cluster::Heartbeat {
        instance_id: shared.config.instance_id.clone(),
        advertised_url: shared.config.advertised_url.clone(),
        sessions: m.total(|s| &s.connections_open),
        bytes_per_second,
        cpu_percent,
        sent_ms: crate::model::clock::now_micros() / 1000,
    }
}
