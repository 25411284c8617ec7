//! Replies across instances: a reply that arrives at one instance for a request waiting at
//! another is forwarded through Kafka, the only system instances share.
//!
//! A correlation id names its instance (`shard::requests::Correlation`: [`instance_tag`] of
//! the instance id). The instance a reply arrives at finds the live instance with that tag,
//! writes the reply to the evmesh-owned topic [`REPLIES_TOPIC`] (key = that instance's id;
//! headers: [`KIND`] = `reply`, [`FROM`], [`FORWARD`] = a number of the sender's, the
//! replier's [`PRINCIPAL`] and [`TENANT`]; value = the reply frame) and waits for the answer:
//! a record back to it ([`KIND`] = `outcome`, [`FORWARD`], value = [`encode_outcome`]). The
//! requester's instance hands the reply to its shard exactly as a local reply (tenant, ACL,
//! deadline), so the replier learns what became of it as if it had replied there.
//!
//! Every instance reads the topic from its end when it starts (a forwarded reply matters for
//! the seconds its request waits; the topic keeps an hour) and takes the records keyed with its
//! id. Whoever can write the topic can reply as any principal: like every `__evmesh.` topic, it
//! needs Kafka ACLs that let only evmesh instances write it.

use std::collections::HashMap;
use std::sync::Mutex;

use futures::channel::oneshot;
use serde_json::json;

use crate::model::ReplyOutcome;

/// The evmesh-owned Kafka topic of forwarded replies and their outcomes (one partition, an
/// hour's retention; after `kafka.topic_prefix`).
pub const REPLIES_TOPIC: &str = "__evmesh.replies";

/// Record headers.
pub const KIND: &str = "evmesh-kind";
pub const FROM: &str = "evmesh-from";
pub const FORWARD: &str = "evmesh-forward";
pub const PRINCIPAL: &str = "evmesh-principal";
pub const TENANT: &str = "evmesh-tenant";

/// Replies forwarded by one instance and waiting for their outcome, at most: past it a reply
/// is answered 503 at once (each waits at most [`WAIT`]).
const MAX_WAITING: usize = 16_384;

/// How long a forwarded reply waits for its outcome.
pub const WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The instance part of correlation ids: FNV-1a (64 bits) of the instance id. Stable across
/// versions: another instance finds the requester's by it.
pub fn instance_tag(id: &str) -> u64 {
    id.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// The replies this instance forwarded, waiting for their outcome. Numbers start at random, so
/// an outcome meant for a forward of this instance's previous run matches none of this one's.
pub struct Forwards {
    waiting: Mutex<(u64, HashMap<u64, oneshot::Sender<ReplyOutcome>>)>,
}

impl Default for Forwards {
    fn default() -> Self {
        use std::hash::BuildHasher;
        let start = std::collections::hash_map::RandomState::new().hash_one(0u8) >> 1;
        Forwards { waiting: Mutex::new((start, HashMap::new())) }
    }
}

/// A forwarded reply waiting for its outcome: its number, and where the outcome comes. Its
/// place in [`Forwards`] is given up when it is dropped, however the wait ended (answered,
/// timed out, or its replier gone).
pub struct Forward<'a> {
    table: &'a Forwards,
    pub n: u64,
    pub outcome: oneshot::Receiver<ReplyOutcome>,
}

impl Drop for Forward<'_> {
    fn drop(&mut self) {
        self.table.close(self.n);
    }
}

impl Forwards {
    /// A place for a reply about to be forwarded; `None` when `MAX_WAITING` wait already.
    pub fn open(&self) -> Option<Forward<'_>> {
        let mut w = self.waiting.lock().expect("not poisoned");
        if w.1.len() >= MAX_WAITING {
            return None;
        }
        w.0 += 1;
        let (n, (tx, outcome)) = (w.0, oneshot::channel());
        w.1.insert(n, tx);
        Some(Forward { table: self, n, outcome })
    }

    /// The outcome of forward `n` came (once; an unknown or finished `n` is ignored).
    pub fn answer(&self, n: u64, outcome: ReplyOutcome) {
        if let Some(tx) = self.waiting.lock().expect("not poisoned").1.remove(&n) {
            let _ = tx.send(outcome);
        }
    }

    /// Forward `n` stopped waiting (answered or not).
    fn close(&self, n: u64) {
        self.waiting.lock().expect("not poisoned").1.remove(&n);
    }
}

/// An outcome as the requester's instance writes it back.
pub fn encode_outcome(o: &ReplyOutcome) -> Vec<u8> {
    let v = match o {
        ReplyOutcome::Delivered => json!({"outcome": "delivered"}),
        ReplyOutcome::Unknown => json!({"outcome": "unknown"}),
        ReplyOutcome::Late => json!({"outcome": "late"}),
        ReplyOutcome::MissingId => json!({"outcome": "missing"}),
        ReplyOutcome::Unreachable => json!({"outcome": "unreachable"}),
        ReplyOutcome::Denied { topic, rule } => json!({"outcome": "denied", "topic": topic, "rule": rule}),
    };
    v.to_string().into_bytes()
}

/// An outcome read back; `None` for anything else.
pub fn decode_outcome(v: &[u8]) -> Option<ReplyOutcome> {
    let v: serde_json::Value = serde_json::from_slice(v).ok()?;
    Some(match v["outcome"].as_str()? {
        "delivered" => ReplyOutcome::Delivered,
        "unknown" => ReplyOutcome::Unknown,
        "late" => ReplyOutcome::Late,
        "missing" => ReplyOutcome::MissingId,
        "unreachable" => ReplyOutcome::Unreachable,
        "denied" => {
            ReplyOutcome::Denied { topic: v["topic"].as_str()?.to_owned(), rule: v["rule"].as_str().map(str::to_owned) }
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_round_trip() {
        for o in [
            ReplyOutcome::Delivered,
            ReplyOutcome::Unknown,
            ReplyOutcome::Late,
            ReplyOutcome::MissingId,
            ReplyOutcome::Unreachable,
            ReplyOutcome::Denied { topic: "t".into(), rule: Some("r1".into()) },
            ReplyOutcome::Denied { topic: "t".into(), rule: None },
        ] {
            assert_eq!(decode_outcome(&encode_outcome(&o)), Some(o));
        }
        assert_eq!(decode_outcome(b"{}"), None);
        assert_eq!(decode_outcome(br#"{"outcome":"denied"}"#), None);
    }

    #[test]
    fn forwards_are_answered_once_and_bounded() {
        let f = Forwards::default();
        let mut first = f.open().unwrap();
        f.answer(first.n, ReplyOutcome::Delivered);
        f.answer(first.n, ReplyOutcome::Unknown);
        assert_eq!(first.outcome.try_recv().unwrap(), Some(ReplyOutcome::Delivered));
        let second = f.open().unwrap();
        assert_ne!(first.n, second.n);
        drop((first, second));
        let held: Vec<_> = (0..MAX_WAITING).map(|_| f.open().unwrap()).collect();
        assert!(f.open().is_none(), "bounded");
        // A wait that ends unanswered (its replier gone) gives its place up.
        drop(held);
        assert!(f.waiting.lock().unwrap().1.is_empty());
        assert!(f.open().is_some());
        assert_eq!(instance_tag("evmesh-1"), instance_tag("evmesh-1"));
        assert_ne!(instance_tag("a"), instance_tag("b"));
    }
}
