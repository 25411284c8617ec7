//! The store step of a publish: the request parsed to frames (the CloudEvents HTTP modes), and
//! frames appended to their partitions (keyed ones to their murmur2 partition wherever it
//! lives, unkeyed ones to one this shard owns; a batch split per partition and the parts
//! appended concurrently, the 202 waiting for all of them), per destination topic once the
//! routes ran. A lite topic's home is settled before anything is stored there. Also `POST
//! /events/publish`, the endpoint whose path (`adaptor.rs`, `Traffic::publish_with`) ends here.

use frame_codec::Frame;
use futures::future::join_all;
use smallvec::SmallVec;

use super::gate::Gate;
use super::homes::{SETTLE_POLL, SETTLE_WAIT};
use super::responses::storage_problem;
use super::{adaptor, pipeline, session, Traffic};
use crate::adaptor::cloudevents::{self, CeError, Mode};
use crate::model::placement::partition_of;
use crate::model::{PartitionId, StoredTopic};
use crate::server::{Request, Response};
use crate::storage::StorageError;

impl Traffic {
    /// `POST /events/publish?topic=T`: CloudEvents over HTTP, through the one ingress path.
    pub(super) async fn publish(&self, gate: &mut Gate<'_>, req: &Request<'_>) -> Response {
        self.publish_with(&adaptor::CloudEventsHttp::default(), gate, req).await
    }

    /// With Kafka, before lite topic `stored` is stored here: its home claimed for this
    /// instance and the claim read back (at most [`SETTLE_WAIT`]; an agent's topic is claimed
    /// by the agent's registration instead). Of two instances that each took a new session
    /// topic at once, the one whose claim lost stores nothing (503: the publisher's retry is
    /// sent to the other), so no acknowledged event stays where nobody reads it.
    pub(super) async fn lite_settled(&self, stored: &str) -> Result<(), StorageError> {
        if !self.clustered() {
            return Ok(());
        }
        let shared = &self.shard.shared;
        let (key, claimed_here) = session::lite_home(stored);
        if !claimed_here {
            return Ok(());
        }
        let me = &shared.config.instance_id;
        if shared.cluster.claimed_here(&key) {
            return Ok(());
        }
        if shared.cluster.homes().lite_claims() >= crate::cluster::homes::MAX_LITE_CLAIMS {
            return Err(StorageError::Unavailable(
                "the cluster serves as many session topics as it may; try again later",
            ));
        }
        shared.cluster.claim_here(&key);
        let until = std::time::Instant::now() + SETTLE_WAIT;
        loop {
            if shared.cluster.claimed_here(&key) {
                return Ok(());
            }
            if shared.cluster.home(&key, false).is_some_and(|h| h.claimed && h.id != *me) {
                return Err(StorageError::Unavailable("another instance is this session's home now; try again"));
            }
            if std::time::Instant::now() >= until {
                return Err(StorageError::Unavailable("this instance is taking the session over; try again"));
            }
            monoio::time::sleep(SETTLE_POLL).await;
        }
    }

    /// Stores routed events, per destination topic: where each landed (in request order).
    /// Every destination must exist (or be created) before anything is stored, so a route to a
    /// topic that cannot be had refuses the request whole (a storage failure between the
    /// groups can still leave part of it stored: the 503 says so, see docs/src/governance.md).
    pub(super) async fn store_routed<'t>(
        &self,
        groups: pipeline::Groups<'t, Frame>,
    ) -> Result<pipeline::Groups<'t, (PartitionId, u64)>, Response> {
        if groups.len() > 1 {
            for (t, _) in &groups {
                self.shard.topic(t, None, false).await.map_err(|e| storage_problem(&e))?;
            }
        }
        let mut stored = SmallVec::new();
        for (t, frames) in groups {
            let placed = self.store(&t, frames).await.map_err(|e| storage_problem(&e))?;
            stored.push((t, placed));
        }
        Ok(stored)
    }

    /// The request's events as frames, and whether it was a batch.
    pub(super) fn parse(&self, req: &Request<'_>, topic: &str) -> Result<(Vec<Frame>, bool), CeError> {
        let ct = req.header("content-type");
        let has_specversion = req.header("ce-specversion").is_some();
        let mut frames = match cloudevents::mode(ct, has_specversion)? {
            Mode::Structured => (vec![cloudevents::parse_structured(topic, req.body)?], false),
            Mode::Batch => (cloudevents::parse_batch(topic, req.body)?, true),
            Mode::Binary => (vec![cloudevents::parse_binary(topic, req.headers(), ct, req.body)?], false),
        };
        let now = crate::model::clock::now_micros();
        for f in &mut frames.0 {
            f.set_timestamp(now);
        }
        Ok(frames)
    }

    /// Stores frames and returns (partition, offset) per frame, in request order.
    pub(super) async fn store(
        &self,
        topic: &str,
        mut frames: Vec<Frame>,
    ) -> Result<Vec<(PartitionId, u64)>, StorageError> {
        if frames.is_empty() {
            return Ok(Vec::new());
        }
        let (meta, _) = self.shard.topic(topic, None, false).await?;
        let bytes: u64 = frames.iter().map(|f| f.as_bytes().len() as u64).sum();
        let stored = || self.shard.shared.metrics.shard(self.shard.id).bytes_stored.add(bytes);
        let pick = |f: &Frame, local: PartitionId| partition_of(f, meta.partitions).unwrap_or(local);
        let local = self.shard.local_partition(topic, &meta);
        // The common case, one event (or a batch for one partition), without the regrouping.
        let first = pick(&frames[0], local);
        if frames.iter().all(|f| pick(f, local) == first) {
            let n = frames.len() as u64;
            if StoredTopic::new(topic).is_lite() {
                self.lite_settled(topic).await?;
            }
            let offset = self.shard.append(topic, first, std::mem::take(&mut frames)).await?;
            stored();
            return Ok((0..n).map(|i| (first, offset + i)).collect());
        }
        // Group by partition, remembering each frame's place in the request.
        let mut groups: Vec<(PartitionId, Vec<usize>, Vec<Frame>)> = Vec::new();
        for (i, f) in frames.into_iter().enumerate() {
            let p = pick(&f, local);
            match groups.iter_mut().find(|g| g.0 == p) {
                Some(g) => {
                    g.1.push(i);
                    g.2.push(f);
                }
                None => groups.push((p, vec![i], vec![f])),
            }
        }
        let total: usize = groups.iter().map(|g| g.1.len()).sum();
        let mut placed = vec![(PartitionId(0), 0u64); total];
        let mut jobs = Vec::with_capacity(groups.len());
        let mut slots = Vec::with_capacity(groups.len());
        for (p, idx, fs) in groups {
            slots.push((p, idx));
            jobs.push(self.shard.append(topic, p, fs));
        }
        for ((p, idx), r) in slots.into_iter().zip(join_all(jobs).await) {
            let first = r?;
            for (k, i) in idx.into_iter().enumerate() {
                placed[i] = (p, first + k as u64);
            }
        }
        stored();
        Ok(placed)
    }
}
