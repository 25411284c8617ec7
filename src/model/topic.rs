//! Topic names: which a client may use, and how a name is stored.
//!
//! Lite topics (RocketMQ's RIP-83) are light per-entity topics a client names `agent.<id>`,
//! `client.<id>` or `session.<id>`, created implicitly, each one partition (0) with its own dense
//! offsets, expiring after `lite_topic_ttl_ms` without traffic. They are stored under the scoped
//! name with a `:` in front ([`LITE_MARK`], a byte no topic name has, so nothing collides) and
//! multiplexed onto the partitions of a parent topic per kind (see
//! [`placement`](super::placement)). They have no metadata row and no slot of `max_topics`.
//!
//! A tenant's names are scoped as `<tenant>.<name>` (tenant names have no dots). [`StoredTopic`]
//! is the one place that knows both rules.

use std::borrow::Cow;

/// Topic names starting with this are the broker's own (Kafka topics evmesh writes for itself):
/// no client may publish to or subscribe to one.
pub const RESERVED_PREFIX: &str = "__evmesh.";

/// The kinds of lite topic, as the first word of the name a client writes.
pub const LITE_KINDS: [&str; 3] = ["agent", "client", "session"];

/// The first byte of a stored lite topic's name.
pub const LITE_MARK: u8 = b':';

/// A map keyed by topic names and looked up for every event (a shard's topic settings, the
/// embedded log's partitions): foldhash, at about a quarter of SipHash's cost for a name's
/// few dozen bytes. Its keys are topics the shard resolved or opened, not any name a client
/// sends (a lookup of a name that is not there inserts nothing), and its seed is random per
/// process and per map, so the names a client may create cannot be chosen to collide.
pub type TopicMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// Whether `name` is a valid topic name: `[A-Za-z0-9._-]{1,249}`.
pub fn valid_topic(name: &str) -> bool {
    (1..=249).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && !name.starts_with(RESERVED_PREFIX)
}

/// Whether a topic name as the client wrote it (no tenant) names a lite topic.
pub fn is_lite(local: &str) -> bool {
    LITE_KINDS.iter().any(|k| local.strip_prefix(k).is_some_and(|rest| rest.starts_with('.') && rest.len() > 1))
}

/// A topic's name as stored: `[<tenant>.]<name>`, or `:[<tenant>.]<kind>.<id>` for a lite topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoredTopic<'a>(&'a str);

impl<'a> StoredTopic<'a> {
    /// A stored name, as storage and the shards pass it.
    pub fn new(stored: &'a str) -> Self {
        StoredTopic(stored)
    }

    /// `name` of `tenant`, scoped (`<tenant>.<name>`); as it is without a tenant.
    pub fn scope(tenant: Option<&str>, name: &'a str) -> Cow<'a, str> {
        match tenant {
            None => Cow::Borrowed(name),
            Some(t) => Cow::Owned(format!("{t}.{name}")),
        }
    }

    /// The stored name of the lite topic whose scoped (tenant-prefixed) name is `scoped`.
    pub fn lite(scoped: &str) -> String {
        format!("{}{scoped}", LITE_MARK as char)
    }

    pub fn as_str(self) -> &'a str {
        self.0
    }

    /// Whether this is a lite topic.
    pub fn is_lite(self) -> bool {
        self.0.as_bytes().first() == Some(&LITE_MARK)
    }

    /// The scoped name: without the lite mark.
    pub fn scoped(self) -> &'a str {
        self.0.strip_prefix(LITE_MARK as char).unwrap_or(self.0)
    }

    /// A lite topic's tenant (if any) and its name as the client wrote it (`<kind>.<id>`).
    pub fn lite_parts(self) -> (Option<&'a str>, &'a str) {
        let scoped = self.scoped();
        match is_lite(scoped) {
            true => (None, scoped),
            false => scoped.split_once('.').map_or((None, scoped), |(t, rest)| (Some(t), rest)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What makes a [`TopicMap`] safe to key by names clients create: each map hashes with its
    /// own random seed, so no set of names collides in every map (a fixed-seed hasher would
    /// fail this).
    #[test]
    fn topic_maps_hash_with_their_own_random_seeds() {
        use std::hash::BuildHasher;
        let (a, b) = (TopicMap::<String, ()>::default(), TopicMap::<String, ()>::default());
        let names = ["orders", "orders.v1", "a", ""];
        assert!(names.iter().any(|n| a.hasher().hash_one(n) != b.hasher().hash_one(n)));
        assert!(names.iter().all(|n| a.hasher().hash_one(n) == a.hasher().hash_one(n)));
    }

    #[test]
    fn topic_names() {
        assert!(valid_topic("orders.v1_A-9"));
        assert!(valid_topic(&"a".repeat(249)));
        assert!(!valid_topic(&"a".repeat(250)));
        assert!(!valid_topic(""));
        assert!(!valid_topic("a/b"));
        assert!(!valid_topic("a b"));
        // The broker's own Kafka topics (heartbeats, offsets) are no client's.
        assert!(!valid_topic("__evmesh.instances"));
        assert!(valid_topic("__evmesh") && valid_topic("_evmesh.x"));
    }

    #[test]
    fn lite_names_are_marked_and_scoped_once() {
        let stored = StoredTopic::lite(&StoredTopic::scope(Some("acme"), "session.s1"));
        assert_eq!(stored, ":acme.session.s1");
        let t = StoredTopic::new(&stored);
        assert!(t.is_lite());
        assert_eq!(t.scoped(), "acme.session.s1");
        assert_eq!(t.lite_parts(), (Some("acme"), "session.s1"));
        assert_eq!(StoredTopic::new(":agent.a").lite_parts(), (None, "agent.a"));
        assert!(!StoredTopic::new("orders").is_lite());
        assert!(is_lite("client.c") && !is_lite("client.") && !is_lite("clients.c"));
    }
}
