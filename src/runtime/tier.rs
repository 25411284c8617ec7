//! Tiered storage's side of the runtime: the bucket read at start (its topics made here, its
//! manifests loaded before any partition opens), and the upload task on the tier's runtime:
//! every `tier.s3.upload_interval_ms`, each partition's sealed segments not in the bucket are
//! uploaded (`storage::tier::Tier::upload`), then the local copies `local_retention_*` lets go
//! of are deleted, only ever those the bucket's manifest holds.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::StartError;
use crate::model::PartitionId;
use crate::shard::shared::Shared;
use crate::storage::meta;
use crate::storage::tier::{Tier, TierSettings};

/// How long the bucket may be unreachable at start before evmesh gives up.
const START_PATIENCE: Duration = Duration::from_secs(30);
/// The longest wait between failed upload passes.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// The bucket's client, its manifests loaded and its topics made in `db` (those this instance
/// does not have: a restart with an empty disk).
pub fn open(settings: &TierSettings, db: &rocksdb::DB) -> Result<Arc<Tier>, StartError> {
    let tier = Tier::new(settings.clone()).map_err(|e| StartError::Tier(e.clone()))?;
    let since = Instant::now();
    let topics = loop {
        match tier.block_on(tier.load()) {
            Ok(t) => break t,
            Err(e) if since.elapsed() < START_PATIENCE => {
                let line = format!("bucket {} not read yet (retrying): {e}", settings.bucket);
                crate::log::warn("tier", &line, &[]);
                std::thread::sleep(Duration::from_secs(1));
            }
            Err(e) => return Err(StartError::Tier(format!("bucket {}: {e}", settings.bucket))),
        }
    };
    for t in topics {
        if meta::get(db, &t.name)?.is_none() {
            crate::log::info("tier", &format!("topic {} made from the bucket's record", t.name), &[]);
            meta::put(db, &t.name, &t.meta)?;
        }
    }
    Ok(tier)
}

/// Starts the upload task.
pub fn start(shared: &Arc<Shared>, tier: &Arc<Tier>) {
    let (shared, t) = (shared.clone(), tier.clone());
    tier.spawn(async move {
        let interval = t.settings().upload_interval;
        let mut failed = 0u32;
        loop {
            let wait = match failed {
                0 => interval,
                n => (interval * 2u32.saturating_pow(n.min(8))).min(MAX_BACKOFF.max(interval)),
            };
            tokio::time::sleep(wait).await;
            match pass(&shared, &t).await {
                Ok(()) => failed = 0,
                Err(e) => {
                    failed += 1;
                    t.metrics.upload_failures.fetch_add(1, Ordering::Relaxed);
                    crate::log::warn("tier", &format!("upload pass failed (local copies kept, retried): {e}"), &[]);
                }
            }
        }
    });
}

/// One pass over every partition; the first error, after trying them all.
async fn pass(shared: &Shared, tier: &Tier) -> Result<(), String> {
    let settings = tier.settings();
    let topics = meta::list(&shared.db).map_err(|e| e.to_string())?;
    let mut first_error = None;
    for (topic, m) in topics {
        for p in (0..m.partitions).map(PartitionId) {
            // A partition never written on this disk has nothing to upload (and is not opened:
            // no files, no descriptor for it).
            if !shared.logs.dir(&topic, p).exists() {
                continue;
            }
            let found = shared.logs.with(&topic, p, |log| Ok((log.sealed(), log.bounds().0)));
            let ((dir, sealed), start) = match found {
                Ok(f) => f,
                Err(e) => {
                    first_error.get_or_insert(format!("{topic}/{}: {e}", p.0));
                    continue;
                }
            };
            let manifest = match tier.upload((&topic, p.0, m), &dir, &sealed, start).await {
                Ok(Some(manifest)) => manifest,
                Ok(None) => continue,
                Err(e) => {
                    first_error.get_or_insert(e);
                    continue;
                }
            };
            let older = settings.local_retention_ms.map(|ms| crate::model::clock::now_micros() - ms as i64 * 1000);
            let dropped = shared.logs.with(&topic, p, |log| {
                log.set_floor(manifest.first());
                Ok(log.drop_uploaded(|s| manifest.holds(s), settings.local_retention_bytes, older)?)
            });
            match dropped {
                Ok(n) => tier.metrics.local_deleted.fetch_add(n as u64, Ordering::Relaxed),
                Err(e) => {
                    first_error.get_or_insert(format!("{topic}/{}: {e}", p.0));
                    continue;
                }
            };
        }
    }
    first_error.map_or(Ok(()), Err)
}
