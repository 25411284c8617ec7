//! Metadata in the `meta` column family: `topic/<name>` -> JSON [`TopicMeta`],
//! `sub/<name>` -> JSON subscription [`Definition`], and `dlq/<topic>/<partition>` -> how far the
//! dead letters of that partition of `<topic>.dlq` were replayed, and `acl/<id>` -> an ACL rule
//! of the admin API.
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

fn acl_key(id: &str) -> Vec<u8> {
    format!("acl/{id}").into_bytes()
}

/// The admin API's ACL rules, `(id, rule)` in id order (the rule's JSON is the governance
/// layer's business).
pub fn list_acl<T: serde::de::DeserializeOwned>(db: &DB) -> Result<Vec<(String, T)>, StorageError> {
    list_json(db, b"acl/")
}

/// Stores one ACL rule (WAL durability).
pub fn put_acl<T: serde::Serialize>(db: &DB, id: &str, rule: &T) -> Result<(), StorageError> {
    let cf = db.cf_handle(META).expect("meta family exists");
    let v = serde_json::to_vec(rule).expect("a rule serializes");
    Ok(db.put_cf(cf, acl_key(id), v)?)
}

pub fn delete_acl(db: &DB, id: &str) -> Result<(), StorageError> {
    let cf = db.cf_handle(META).expect("meta family exists");
    Ok(db.delete_cf(cf, acl_key(id))?)
}
