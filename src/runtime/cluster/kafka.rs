//! The Kafka implementation of the cluster seam (`crate::cluster::Cluster`; SPEC, "Many
//! instances"): heartbeats to `__evmesh.instances`, home claims and the homes' offsets in
//! `__evmesh.homes`, definitions in `__evmesh.subscriptions`, forwarded replies in
//! `__evmesh.replies`, all written and read through `storage::kafka` (the connection), all
//! meaning decided here and in the pure view (`crate::cluster`).
//!
//! One thread (`super::reader`) heartbeats and reads the four topics; what it reads is applied
//! by `super::appliers`, on threads of their own when that waits for the shards.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::LocalBoxFuture;

use crate::cluster::homes::{Claim, Homes, BY_HEADER, HOMES_TOPIC, OFFSET_KEY};
use crate::cluster::replies::{Forwards, REPLIES_TOPIC};
use crate::cluster::{Cluster, HomeInstance, Membership, OnBehalf, SUBSCRIPTIONS_TOPIC};
use crate::config::Config;
use crate::model::ReplyOutcome;
use crate::storage::kafka::KafkaBackend;
use crate::subscription::definition::Definition;

/// Many instances over one Kafka cluster: the view this instance keeps, and the connection
/// its records go through.
pub struct KafkaCluster {
    pub(super) log: Arc<KafkaBackend>,
    pub(super) me: String,
    url: String,
    timeout: Duration,
    pub(super) membership: Membership,
    pub(super) homes: Homes,
    pub(super) forwards: Forwards,
}

impl KafkaCluster {
    pub fn new(log: Arc<KafkaBackend>, config: &Config) -> Self {
        let (me, timeout) = (config.instance_id.clone(), config.instance_timeout);
        KafkaCluster {
            log,
            membership: Membership::new(me.clone(), timeout),
            me,
            url: config.advertised_url.clone(),
            timeout,
            homes: Homes::default(),
            forwards: Forwards::default(),
        }
    }

    /// Writes a claim of `key` (`None`: released), logging a failure (`what` was not done).
    pub(super) fn put_claim(&self, key: &str, claim: Option<&Claim>, what: &str) {
        let value = claim.map(Claim::encode);
        if let Err(e) = self.log.put_record(HOMES_TOPIC, key.as_bytes(), value.as_deref(), &[]) {
            crate::log::warn("cluster", &format!("the home of {key} not {what}: {e}"), &[]);
        }
    }
}

impl Cluster for KafkaCluster {
    fn instance_id(&self) -> &str {
        &self.me
    }

    fn membership(&self) -> &Membership {
        &self.membership
    }

    fn homes(&self) -> &Homes {
        &self.homes
    }

    fn home(&self, key: &str, record: bool) -> Option<HomeInstance> {
        let now = Instant::now();
        let me = &self.me;
        // The common case at a home (every attach, poll and ack of its subscriptions): its
        // own claim, and it is live. Answered without copying the view.
        if self.homes.claimed_by(key, me) && self.membership.is_live(me, now) {
            return Some(HomeInstance { id: me.clone(), url: self.url.clone(), settled: true, claimed: true });
        }
        let live = self.membership.live(now);
        let h = self.homes.home(key, &live, (now, self.timeout), record)?;
        let hb = &h.member.heartbeat;
        if h.record {
            self.put_claim(key, Some(&Claim { instance: hb.instance_id.clone(), epoch: h.epoch }), "recorded");
        }
        let settled = hb.instance_id != *me || self.homes.claimed_by(key, me);
        let (id, url) = (hb.instance_id.clone(), hb.advertised_url.clone());
        Some(HomeInstance { id, url, settled, claimed: h.claimed })
    }

    fn claim_here(&self, key: &str) {
        let me = &self.me;
        if self.homes.claimed_by(key, me) {
            return;
        }
        let now = Instant::now();
        let live = self.membership.live(now);
        // A live instance's claim (or one on its way) stands: taken only from the dead.
        if self.homes.home(key, &live, (now, self.timeout), false).is_some_and(|h| h.claimed) {
            return;
        }
        let mine: Vec<_> = live.into_iter().filter(|m| m.heartbeat.instance_id == *me).collect();
        let Some(h) = self.homes.home(key, &mine, (now, self.timeout), true) else { return };
        if h.record {
            self.put_claim(key, Some(&Claim { instance: me.clone(), epoch: h.epoch }), "recorded");
        }
    }

    fn release_home(&self, key: &str) {
        if self.homes.claimed_by(key, &self.me) {
            self.put_claim(key, None, "released");
        }
    }

    fn replicate_definition(&self, name: &str, def: Option<&Definition>) {
        if def.is_some_and(|d| d.pushed()) {
            return;
        }
        let json = def.map(|d| serde_json::to_vec(d).expect("a definition serializes"));
        if let Err(e) = self.log.put_record(SUBSCRIPTIONS_TOPIC, name.as_bytes(), json.as_deref(), &[]) {
            crate::log::warn("cluster", &format!("subscription {name} not told to the other instances: {e}"), &[]);
        }
        // Removed: its claim goes too, and with it any offset its home still writes.
        if def.is_none() {
            self.put_claim(&crate::cluster::homes::subscription_key(name), None, "released");
        }
    }

    fn replicates_offsets(&self) -> bool {
        true
    }

    fn replicate_offset(&self, key: &str, value: Option<&[u8]>) -> Result<(), String> {
        let key = format!("{OFFSET_KEY}{key}");
        let by = [(BY_HEADER, self.me.as_bytes())];
        self.log.put_record(HOMES_TOPIC, key.as_bytes(), value, &by).map_err(|e| e.to_string())
    }

    fn forward_reply(&self, tag: u64, frame: frame_codec::Frame, by: OnBehalf<'_>) -> LocalBoxFuture<'_, ReplyOutcome> {
        use crate::cluster::replies::{instance_tag, FORWARD, FROM, KIND, PRINCIPAL, TENANT, WAIT};
        let live = self.membership.live(Instant::now());
        let Some(to) = live.into_iter().find(|m| instance_tag(&m.heartbeat.instance_id) == tag) else {
            return Box::pin(std::future::ready(ReplyOutcome::Unknown));
        };
        let Some(mut forward) = self.forwards.open() else {
            return Box::pin(std::future::ready(ReplyOutcome::Unreachable));
        };
        let number = forward.n.to_string();
        let mut headers: Vec<(&str, &[u8])> =
            vec![(KIND, b"reply"), (FROM, self.me.as_bytes()), (FORWARD, number.as_bytes())];
        if let Some(p) = by.principal {
            headers.push((PRINCIPAL, p.as_bytes()));
        }
        if let Some(t) = by.tenant {
            headers.push((TENANT, t.as_bytes()));
        }
        let to = to.heartbeat.instance_id;
        let sent = self.log.put_record(REPLIES_TOPIC, to.as_bytes(), Some(frame.as_bytes()), &headers);
        // Copied into the producer's queue: not held while the outcome is awaited.
        drop(frame);
        Box::pin(async move {
            let outcome = match sent {
                Ok(()) => crate::server::deadline::within(WAIT, &mut forward.outcome).await.ok().and_then(Result::ok),
                Err(e) => {
                    crate::log::warn("cluster", &format!("a reply not forwarded to {to}: {e}"), &[]);
                    None
                }
            };
            outcome.unwrap_or(ReplyOutcome::Unreachable)
        })
    }
}
