//! Topic metadata in the `meta` column family: `topic/<name>` -> JSON [`TopicMeta`].
//!
//! Written only by a topic's meta-owner shard (which serializes creation); read by anyone.

use rocksdb::{IteratorMode, DB};

use super::db::META;
use super::{StorageError, TopicMeta};

fn key(topic: &str) -> Vec<u8> {
    let mut k = b"topic/".to_vec();
    k.extend_from_slice(topic.as_bytes());
    k
}

pub fn get(db: &DB, topic: &str) -> Result<Option<TopicMeta>, StorageError> {
    let cf = db.cf_handle(META).expect("meta family exists");
    match db.get_cf(cf, key(topic))? {
        None => Ok(None),
        Some(v) => serde_json::from_slice(&v)
            .map(Some)
            .map_err(|e| StorageError::Engine(format!("topic {topic} metadata: {e}"))),
    }
}

/// Stores a new topic durably (synced: creation is rare and must survive power loss).
pub fn put(db: &DB, topic: &str, meta: &TopicMeta) -> Result<(), StorageError> {
    let cf = db.cf_handle(META).expect("meta family exists");
    let mut wo = rocksdb::WriteOptions::default();
    wo.set_sync(true);
    let v = serde_json::to_vec(meta).expect("TopicMeta serializes");
    db.put_cf_opt(cf, key(topic), v, &wo)?;
    Ok(())
}

/// Every topic, sorted by name.
pub fn list(db: &DB) -> Result<Vec<(String, TopicMeta)>, StorageError> {
    let cf = db.cf_handle(META).expect("meta family exists");
    let mut out = Vec::new();
    for item in db.iterator_cf(cf, IteratorMode::From(b"topic/", rocksdb::Direction::Forward)) {
        let (k, v) = item?;
        let Some(name) = k.strip_prefix(b"topic/") else { break };
        let meta = serde_json::from_slice(&v).map_err(|e| StorageError::Engine(format!("topic metadata: {e}")))?;
        out.push((String::from_utf8_lossy(name).into_owned(), meta));
    }
    Ok(out)
}
