//! Metadata in the `meta` column family: `topic/<name>` -> JSON [`TopicMeta`],
//! `sub/<name>` -> JSON subscription [`Definition`], and `dlq/<topic>/<partition>` -> how far the
//! dead letters of that partition of `<topic>.dlq` were replayed, `acl/<id>` -> an ACL rule and
//! `limit/<id>` -> a rate limit and `quota/<tenant>` -> a tenant's quotas, of the admin API.
//!
//! Topics and subscriptions are written only by the owner shard of the name (which serializes
//! creation), replay marks only by the admin thread; read by anyone.

use rocksdb::{IteratorMode, DB};

use super::db::META;
use super::{StorageError, TopicMeta};
use crate::subscription::definition::Definition;

fn key(topic: &str) -> Vec<u8> {
    let mut k = b"topic/".to_vec();
    k.extend_from_slice(topic.as_bytes());
    k
}

fn get_json<T: serde::de::DeserializeOwned>(db: &DB, key: &[u8]) -> Result<Option<T>, StorageError> {
    let cf = db.cf_handle(META).expect("meta family exists");
    match db.get_cf(cf, key)? {
        None => Ok(None),
        Some(v) => serde_json::from_slice(&v)
            .map(Some)
            .map_err(|e| StorageError::Engine(format!("metadata {}: {e}", String::from_utf8_lossy(key)))),
    }
}

/// Every value under `prefix`, in key order, with the key's remainder.
fn list_json<T: serde::de::DeserializeOwned>(db: &DB, prefix: &[u8]) -> Result<Vec<(String, T)>, StorageError> {
    let cf = db.cf_handle(META).expect("meta family exists");
    let mut out = Vec::new();
    for item in db.iterator_cf(cf, IteratorMode::From(prefix, rocksdb::Direction::Forward)) {
        let (k, v) = item?;
        let Some(name) = k.strip_prefix(prefix) else { break };
        let value = serde_json::from_slice(&v).map_err(|e| StorageError::Engine(format!("metadata: {e}")))?;
        out.push((String::from_utf8_lossy(name).into_owned(), value));
    }
    Ok(out)
}

pub fn get(db: &DB, topic: &str) -> Result<Option<TopicMeta>, StorageError> {
    get_json(db, &key(topic))
}

/// Stores a new topic in the WAL (as durable as `os`; with `fsync` durability the caller then
/// waits for the syncer, so no core ever blocks on the disk).
pub fn put(db: &DB, topic: &str, meta: &TopicMeta) -> Result<(), StorageError> {
    let cf = db.cf_handle(META).expect("meta family exists");
    let v = serde_json::to_vec(meta).expect("TopicMeta serializes");
    db.put_cf(cf, key(topic), v)?;
    Ok(())
}

/// Every topic, sorted by name.
pub fn list(db: &DB) -> Result<Vec<(String, TopicMeta)>, StorageError> {
    list_json(db, b"topic/")
}

fn sub_key(name: &str) -> Vec<u8> {
    let mut k = b"sub/".to_vec();
    k.extend_from_slice(name.as_bytes());
    k
}

pub fn get_subscription(db: &DB, name: &str) -> Result<Option<Definition>, StorageError> {
    get_json(db, &sub_key(name))
}

/// Stores a subscription (WAL durability, as [`put`]).
pub fn put_subscription(db: &DB, def: &Definition) -> Result<(), StorageError> {
    let cf = db.cf_handle(META).expect("meta family exists");
    let v = serde_json::to_vec(def).expect("Definition serializes");
    db.put_cf(cf, sub_key(&def.subscription), v)?;
    Ok(())
}

pub fn delete_subscription(db: &DB, name: &str) -> Result<(), StorageError> {
    let cf = db.cf_handle(META).expect("meta family exists");
    db.delete_cf(cf, sub_key(name))?;
    Ok(())
}

/// Every subscription, sorted by name.
pub fn list_subscriptions(db: &DB) -> Result<Vec<Definition>, StorageError> {
    Ok(list_json(db, b"sub/")?.into_iter().map(|(_, d)| d).collect())
}

fn dlq_key(topic: &str, partition: u32) -> Vec<u8> {
    format!("dlq/{topic}/{partition}").into_bytes()
}

/// The first dead letter of `partition` of `<topic>.dlq` not replayed yet.
pub fn dlq_replayed(db: &DB, topic: &str, partition: u32) -> Result<u64, StorageError> {
    Ok(get_json(db, &dlq_key(topic, partition))?.unwrap_or(0))
}

pub fn set_dlq_replayed(db: &DB, topic: &str, partition: u32, next: u64) -> Result<(), StorageError> {
    let cf = db.cf_handle(META).expect("meta family exists");
    Ok(db.put_cf(cf, dlq_key(topic, partition), next.to_string())?)
}

/// What the admin API stores besides topics and subscriptions, each kind under its own
/// prefix, keyed by id (a tenant for quotas); the values' JSON is the governance layer's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// `acl/<id>`: an ACL rule.
    Acl,
    /// `limit/<id>`: a rate limit.
    Limit,
    /// `quota/<tenant>`: a tenant's quotas.
    Quota,
    /// `transformer/<topic>`: a topic's transformer.
    Transformer,
    /// `route/<id>`: a route.
    Route,
    /// `push/<subscription> <url>`: a classic subscriber's push URL (`push::webhook`).
    Push,
}

impl Policy {
    fn key(self, id: &str) -> Vec<u8> {
        let prefix = match self {
            Policy::Acl => "acl/",
            Policy::Limit => "limit/",
            Policy::Quota => "quota/",
            Policy::Transformer => "transformer/",
            Policy::Route => "route/",
            Policy::Push => "push/",
        };
        format!("{prefix}{id}").into_bytes()
    }
}

/// Every entry of one kind, `(id, value)` in id order.
pub fn list_policy<T: serde::de::DeserializeOwned>(db: &DB, kind: Policy) -> Result<Vec<(String, T)>, StorageError> {
    list_json(db, &kind.key(""))
}

/// One entry, if stored.
pub fn get_policy<T: serde::de::DeserializeOwned>(db: &DB, kind: Policy, id: &str) -> Result<Option<T>, StorageError> {
    let cf = db.cf_handle(META).expect("meta family exists");
    match db.get_cf(cf, kind.key(id))? {
        Some(v) => Ok(serde_json::from_slice(&v).ok()),
        None => Ok(None),
    }
}

/// The entries of one kind whose ids start with `prefix` (a classic subscription's push URLs:
/// `"<subscription> "`), read from their place in the family, not by walking the kind.
pub fn list_policy_under<T: serde::de::DeserializeOwned>(
    db: &DB,
    kind: Policy,
    prefix: &str,
) -> Result<Vec<(String, T)>, StorageError> {
    let mut found = list_json(db, &kind.key(prefix))?;
    for (id, _) in found.iter_mut() {
        id.insert_str(0, prefix);
    }
    Ok(found)
}

/// Stores one entry (WAL durability).
pub fn put_policy<T: serde::Serialize>(db: &DB, kind: Policy, id: &str, value: &T) -> Result<(), StorageError> {
    let cf = db.cf_handle(META).expect("meta family exists");
    let v = serde_json::to_vec(value).expect("a policy entry serializes");
    Ok(db.put_cf(cf, kind.key(id), v)?)
}

pub fn delete_policy(db: &DB, kind: Policy, id: &str) -> Result<(), StorageError> {
    let cf = db.cf_handle(META).expect("meta family exists");
    Ok(db.delete_cf(cf, kind.key(id))?)
}

/// How many keys under `prefix` pass `keep`, counting at most `max` (a quota check stops as
/// soon as the answer is known).
fn count_keys(db: &DB, prefix: &[u8], max: usize, keep: impl Fn(&[u8]) -> bool) -> Result<usize, StorageError> {
    let cf = db.cf_handle(META).expect("meta family exists");
    let mut n = 0;
    for item in db.iterator_cf(cf, IteratorMode::From(prefix, rocksdb::Direction::Forward)) {
        let (k, _) = item?;
        let Some(name) = k.strip_prefix(prefix) else { break };
        if keep(name) {
            n += 1;
            if n >= max {
                break;
            }
        }
    }
    Ok(n)
}

/// Topics whose names start with `prefix` (dead-letter topics not counted), at most `max`.
pub fn count_topics(db: &DB, prefix: &str, max: usize) -> Result<usize, StorageError> {
    count_keys(db, format!("topic/{prefix}").as_bytes(), max, |name| !name.ends_with(b".dlq"))
}

/// Subscriptions whose names start with `prefix`, at most `max`.
pub fn count_subscriptions(db: &DB, prefix: &str, max: usize) -> Result<usize, StorageError> {
    count_keys(db, format!("sub/{prefix}").as_bytes(), max, |_| true)
}
