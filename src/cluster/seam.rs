//! The cluster seam: everything the rest of the broker asks of "the other instances", behind
//! one trait ([`Cluster`]), so a shard, the ingress and the admin API never know whether there
//! are any. Two implementations:
//!
//! * [`Single`]: the embedded log, a cluster of one. Every key's home is this instance;
//!   nothing is replicated, nothing is forwarded.
//! * `runtime::cluster::kafka::KafkaCluster`: many instances over one Kafka cluster. It owns
//!   the membership (heartbeats), the home claims, the replicated definitions and offsets, the
//!   forwarded replies and the threads that apply what it reads (SPEC, "Many instances"). It
//!   lives in `runtime`, above the shards, because its appliers talk to them.
//!
//! The view both read and keep ([`Membership`], [`Homes`]) is in this module's siblings,
//! pure and unit-tested.

use std::time::Duration;

use futures::future::LocalBoxFuture;

use super::homes::Homes;
use super::Membership;
use crate::model::ReplyOutcome;
use crate::subscription::definition::Definition;

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

/// Who made a reply that is forwarded to another instance (checked there as if made there).
#[derive(Debug, Clone)]
pub struct OnBehalf<'a> {
    pub principal: Option<&'a str>,
    pub tenant: Option<&'a str>,
}

/// What the broker asks of the other instances (see the module doc).
pub trait Cluster: Send + Sync {
    /// This instance's id (`instance_id`).
    fn instance_id(&self) -> &str;

    /// The instances this one knows to be live (itself alone on the embedded log).
    fn membership(&self) -> &Membership;

    /// The home claims read back (none on the embedded log).
    fn homes(&self) -> &Homes;

    /// Whether a claim of this instance's own for `key` has been read back (and the claims
    /// are read to their end, the view not stale).
    fn claimed_here(&self, key: &str) -> bool {
        self.homes().claimed_by(key, self.instance_id())
    }

    /// The home instance of `key` (`cluster::homes`): the claimed one while it is live, else
    /// the weighted rendezvous choice among the live instances, recorded as a claim if
    /// `record`. `None` while no instance is known live or the claims are not read yet (just
    /// started, or Kafka away for longer than `instance_timeout_ms`).
    fn home(&self, key: &str, record: bool) -> Option<HomeInstance>;

    /// Claims `key` for this instance unless a live instance's claim, or a choice on its way,
    /// names it already (an agent
    /// registered or heard from here, a session topic stored to here). One claim per key on
    /// its way, however often asked.
    fn claim_here(&self, key: &str);

    /// Releases the claim of `key` if this instance holds it (a deregistered agent, an expired
    /// session topic), so no claim of it stays behind.
    fn release_home(&self, key: &str);

    /// Tells every instance that subscription `name` is now `def` (or removed, `None`), so
    /// each can serve it. Pushed subscriptions (a webhook sink, a classic group) stay on the
    /// instance that made them: their webhook sessions would otherwise push from every
    /// instance.
    fn replicate_definition(&self, name: &str, def: Option<&Definition>);

    /// Whether offsets this instance stores go to the other instances too.
    fn replicates_offsets(&self) -> bool;

    /// An offset this instance stored under `key` (an `storage::offsets` key; `None`:
    /// deleted), for the other instances (`cluster::homes`, "Offsets").
    fn replicate_offset(&self, key: &str, value: Option<&[u8]>) -> Result<(), String>;

    /// A reply for a request waiting at the instance tagged `tag` (`cluster::replies`): sent
    /// there, and its outcome there awaited (at most `replies::WAIT`). `Unknown` when no live
    /// instance has that tag.
    fn forward_reply(&self, tag: u64, frame: frame_codec::Frame, by: OnBehalf<'_>) -> LocalBoxFuture<'_, ReplyOutcome>;
}

/// The embedded log: a cluster of one (see the module doc). Its membership is fed by the
/// runtime's heartbeat thread, so `GET /admin/cluster` shows this instance as Kafka's would.
pub struct Single {
    me: String,
    url: String,
    membership: Membership,
    homes: Homes,
}

impl Single {
    pub fn new(instance_id: String, advertised_url: String, instance_timeout: Duration) -> Self {
        let membership = Membership::new(instance_id.clone(), instance_timeout);
        Single { me: instance_id, url: advertised_url, membership, homes: Homes::default() }
    }
}

impl Cluster for Single {
    fn instance_id(&self) -> &str {
        &self.me
    }

    fn membership(&self) -> &Membership {
        &self.membership
    }

    fn homes(&self) -> &Homes {
        &self.homes
    }

    fn home(&self, _key: &str, _record: bool) -> Option<HomeInstance> {
        Some(HomeInstance { id: self.me.clone(), url: self.url.clone(), settled: true, claimed: true })
    }

    fn claim_here(&self, _key: &str) {}

    fn release_home(&self, _key: &str) {}

    fn replicate_definition(&self, _name: &str, _def: Option<&Definition>) {}

    fn replicates_offsets(&self) -> bool {
        false
    }

    fn replicate_offset(&self, _key: &str, _value: Option<&[u8]>) -> Result<(), String> {
        Ok(())
    }

    fn forward_reply(
        &self,
        _tag: u64,
        _frame: frame_codec::Frame,
        _by: OnBehalf<'_>,
    ) -> LocalBoxFuture<'_, ReplyOutcome> {
        Box::pin(std::future::ready(ReplyOutcome::Unknown))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_of_one_is_the_home_of_everything_and_forwards_nothing() {
        let one = Single::new("a".into(), "http://a:1".into(), Duration::from_secs(5));
        let home = one.home("sub/x", true).expect("always a home");
        assert_eq!((home.id.as_str(), home.url.as_str(), home.settled, home.claimed), ("a", "http://a:1", true, true));
        one.claim_here("lite/t");
        assert!(!one.claimed_here("lite/t"), "no claims are kept on the embedded log");
        assert!(!one.replicates_offsets());
        assert_eq!(one.membership().live(std::time::Instant::now()), vec![], "until its heartbeat thread runs");
    }
}
