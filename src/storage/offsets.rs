//! Subscription offsets, owned by evmesh: one entry per `topic#subscription#partition` (plus
//! `#client` for the per-client offsets of `BROADCAST` and `MULTICAST`), in the `offsets.N`
//! family of the shard that owns the partition. The value is the committed offset (the lowest
//! unacknowledged one), a big-endian u64. Names are `[A-Za-z0-9._-]`, so `#` never occurs inside
//! one and a prefix scan by `topic#subscription#` finds exactly that subscription's entries.

use rocksdb::DB;

use super::db::offsets_cf;
use super::StorageError;
use crate::shard::{PartitionId, ShardId};

/// The key of one committed offset.
pub fn key(topic: &str, subscription: &str, partition: PartitionId, client: &str) -> Vec<u8> {
    let mut k = format!("{topic}#{subscription}#{}", partition.0);
    if !client.is_empty() {
        k.push('#');
        k.push_str(client);
    }
    k.into_bytes()
}

fn cf(db: &DB, shard: ShardId) -> &rocksdb::ColumnFamily {
    db.cf_handle(&offsets_cf(shard.index())).expect("every shard's offsets family is opened")
}

pub fn get(db: &DB, shard: ShardId, key: &[u8]) -> Result<Option<u64>, StorageError> {
    Ok(db.get_pinned_cf(cf(db, shard), key)?.and_then(|v| v.as_ref().try_into().ok().map(u64::from_be_bytes)))
}

pub fn put(db: &DB, shard: ShardId, key: &[u8], offset: u64) -> Result<(), StorageError> {
    Ok(db.put_cf(cf(db, shard), key, offset.to_be_bytes())?)
}

/// One stored offset of a subscription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committed {
    pub partition: u32,
    /// Empty for the subscription's own (`LOAD_BALANCE`) offsets.
    pub client: String,
    pub offset: u64,
}

fn prefix(topic: &str, subscription: &str) -> Vec<u8> {
    format!("{topic}#{subscription}#").into_bytes()
}

/// Every offset of a subscription stored by `shard`.
pub fn list(db: &DB, shard: ShardId, topic: &str, subscription: &str) -> Result<Vec<Committed>, StorageError> {
    let pre = prefix(topic, subscription);
    let mut out = Vec::new();
    for item in db.prefix_iterator_cf(cf(db, shard), &pre) {
        let (k, v) = item?;
        let Some(rest) = k.strip_prefix(pre.as_slice()) else { break };
        let rest = String::from_utf8_lossy(rest);
        let (p, client) = rest.split_once('#').unwrap_or((&rest, ""));
        let (Ok(partition), Ok(bytes)) = (p.parse(), <[u8; 8]>::try_from(v.as_ref())) else { continue };
        out.push(Committed { partition, client: client.to_owned(), offset: u64::from_be_bytes(bytes) });
    }
    Ok(out)
}

/// Forgets a removed subscription's offsets kept by `shard`.
pub fn delete_all(db: &DB, shard: ShardId, topic: &str, subscription: &str) -> Result<(), StorageError> {
    let pre = prefix(topic, subscription);
    let mut end = pre.clone();
    *end.last_mut().expect("prefix ends with #") += 1;
    Ok(db.delete_range_cf(cf(db, shard), &pre, &end)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_list_and_delete_by_subscription() {
        let dir = super::super::suite::TempDir::new("offsets");
        let db = crate::storage::db::open(&dir.0, 1).unwrap();
        let s = ShardId(0);
        put(&db, s, &key("orders", "a", PartitionId(0), ""), 5).unwrap();
        put(&db, s, &key("orders", "a", PartitionId(1), "c1"), 7).unwrap();
        put(&db, s, &key("orders", "ab", PartitionId(0), ""), 9).unwrap();
        assert_eq!(key("orders", "a", PartitionId(1), "c1"), b"orders#a#1#c1");
        let got = list(&db, s, "orders", "a").unwrap();
        assert_eq!(
            got,
            vec![
                Committed { partition: 0, client: String::new(), offset: 5 },
                Committed { partition: 1, client: "c1".into(), offset: 7 },
            ]
        );
        delete_all(&db, s, "orders", "a").unwrap();
        assert!(list(&db, s, "orders", "a").unwrap().is_empty());
        assert_eq!(get(&db, s, &key("orders", "ab", PartitionId(0), "")).unwrap(), Some(9), "a prefix of another name");
    }
}
