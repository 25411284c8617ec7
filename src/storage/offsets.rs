//! Subscription offsets, owned by evmesh: one entry per `topic#subscription#partition` (plus
//! `#client` for the per-client offsets of `BROADCAST` and `MULTICAST`), in the `offsets.N`
//! family of the shard that owns the partition. The value ([`Stored`]) is the committed offset
//! (the lowest unacknowledged one), how far delivery got, when the consumer was last seen, and
//! the attempts made for every delivered but unsettled offset, so `emattempt` survives
//! disconnects and restarts. Names are `[A-Za-z0-9._-]`, so `#` never occurs inside one and a
//! prefix scan by `topic#subscription#` finds exactly that subscription's entries.

use rocksdb::DB;

use super::db::offsets_cf;
use super::StorageError;
use crate::model::{PartitionId, ShardId};

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

/// What is kept per consumer and partition.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stored {
    /// The lowest offset not settled: delivery resumes here.
    pub committed: u64,
    /// The next offset never delivered (`>= committed`): offsets in between that are not in
    /// `attempts` were settled.
    pub next: u64,
    /// When the consumer was last active, ms since the epoch (client offsets expire by it).
    pub seen_ms: u64,
    /// `(offset, deliveries made)` of every delivered, unsettled offset, ascending.
    pub attempts: Vec<(u64, u16)>,
}

/// Format tag of a [`Stored`] value; a value of exactly 8 bytes is the first format (the
/// committed offset alone).
const V2: u8 = 2;

impl Stored {
    /// Just a position, nothing delivered past it.
    pub fn at(offset: u64) -> Stored {
        Stored { committed: offset, next: offset, seen_ms: now_ms(), attempts: Vec::new() }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(27 + 10 * self.attempts.len());
        v.push(V2);
        v.extend_from_slice(&self.committed.to_be_bytes());
        v.extend_from_slice(&self.next.to_be_bytes());
        v.extend_from_slice(&self.seen_ms.to_be_bytes());
        v.extend_from_slice(&(self.attempts.len() as u16).to_be_bytes());
        for (o, a) in &self.attempts {
            v.extend_from_slice(&o.to_be_bytes());
            v.extend_from_slice(&a.to_be_bytes());
        }
        v
    }

    /// `None` for a value that is neither format (never written by evmesh).
    pub fn decode(v: &[u8]) -> Option<Stored> {
        if let Ok(b) = <[u8; 8]>::try_from(v) {
            let o = u64::from_be_bytes(b);
            return Some(Stored { committed: o, next: o, seen_ms: 0, attempts: Vec::new() });
        }
        let (&tag, rest) = v.split_first()?;
        if tag != V2 || rest.len() < 26 {
            return None;
        }
        let u64_at = |i: usize| u64::from_be_bytes(rest[i..i + 8].try_into().expect("8 bytes"));
        let n = u16::from_be_bytes([rest[24], rest[25]]) as usize;
        let list = &rest[26..];
        if list.len() != n * 10 {
            return None;
        }
        let attempts = list
            .chunks_exact(10)
            .map(|c| (u64::from_be_bytes(c[..8].try_into().expect("8")), u16::from_be_bytes([c[8], c[9]])))
            .collect();
        Some(Stored { committed: u64_at(0), next: u64_at(8), seen_ms: u64_at(16), attempts })
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

pub fn get(db: &DB, shard: ShardId, key: &[u8]) -> Result<Option<Stored>, StorageError> {
    Ok(db.get_pinned_cf(cf(db, shard), key)?.and_then(|v| Stored::decode(&v)))
}

pub fn put(db: &DB, shard: ShardId, key: &[u8], value: &Stored) -> Result<(), StorageError> {
    put_encoded(db, shard, key, &value.encode())
}

/// [`put`] of a value already encoded ([`Stored::encode`]).
pub fn put_encoded(db: &DB, shard: ShardId, key: &[u8], value: &[u8]) -> Result<(), StorageError> {
    Ok(db.put_cf(cf(db, shard), key, value)?)
}

pub fn delete(db: &DB, shard: ShardId, key: &[u8]) -> Result<(), StorageError> {
    Ok(db.delete_cf(cf(db, shard), key)?)
}

/// Where this instance's copy of the offsets other instances wrote to Kafka is up to (the
/// next record of the claims topic to apply; `cluster::homes`), kept with them.
const REPLICATED_KEY: &[u8] = b"cluster/offsets-read";

/// The position [`apply_replicated`] last kept (0: none yet).
pub fn replicated_position(db: &DB) -> Result<u64, StorageError> {
    let meta = db.cf_handle(super::db::META).expect("meta family exists");
    Ok(db.get_cf(meta, REPLICATED_KEY)?.and_then(|v| <[u8; 8]>::try_from(&v[..]).ok()).map_or(0, u64::from_be_bytes))
}

/// Writes an offset another instance stored (`None`: deleted) and the position after the
/// record it came in, atomically: a restart resumes after it, so an older record is never
/// applied over what this instance wrote since.
pub fn apply_replicated(
    db: &DB,
    shard: ShardId,
    key: &[u8],
    value: Option<&[u8]>,
    next: u64,
) -> Result<(), StorageError> {
    let mut batch = rocksdb::WriteBatch::default();
    match value {
        Some(v) => batch.put_cf(cf(db, shard), key, v),
        None => batch.delete_cf(cf(db, shard), key),
    }
    batch.put_cf(db.cf_handle(super::db::META).expect("meta family exists"), REPLICATED_KEY, next.to_be_bytes());
    Ok(db.write(batch)?)
}

/// The parts of an offset key: (topic, subscription, partition, client); `None` for a key
/// evmesh does not write.
pub fn parse_key(key: &str) -> Option<(&str, &str, PartitionId, &str)> {
    let mut parts = key.splitn(4, '#');
    let (topic, subscription, partition) = (parts.next()?, parts.next()?, parts.next()?);
    let valid = |n: &str| crate::model::valid_topic(n);
    let client = match parts.next() {
        None => "",
        Some(c) if valid(c) => c,
        Some(_) => return None,
    };
    let partition = partition.parse().ok().filter(|p: &u32| partition == p.to_string())?;
    (valid(topic) && valid(subscription)).then_some((topic, subscription, PartitionId(partition), client))
}

/// One stored offset of a subscription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committed {
    pub partition: u32,
    /// Empty for the subscription's own (`LOAD_BALANCE`) offsets.
    pub client: String,
    pub offset: u64,
    /// When the consumer was last active, ms since the epoch (0: not recorded).
    pub seen_ms: u64,
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
        let (Ok(partition), Some(st)) = (p.parse(), Stored::decode(&v)) else { continue };
        out.push(Committed { partition, client: client.to_owned(), offset: st.committed, seen_ms: st.seen_ms });
    }
    Ok(out)
}

/// How many clients of a subscription have offsets of `partition` stored by `shard`; counting
/// stops at `limit` (a cap check is bounded work).
pub fn clients(
    db: &DB,
    shard: ShardId,
    topic: &str,
    subscription: &str,
    partition: PartitionId,
    limit: usize,
) -> Result<usize, StorageError> {
    let pre = format!("{topic}#{subscription}#{}#", partition.0).into_bytes();
    let mut n = 0;
    for item in db.prefix_iterator_cf(cf(db, shard), &pre) {
        let (k, _) = item?;
        if !k.starts_with(&pre) || n >= limit {
            break;
        }
        n += 1;
    }
    Ok(n)
}

/// What one expiry sweep found (keys) and where the next goes on (`None`: start over).
pub type Sweep = (Vec<Vec<u8>>, Option<Vec<u8>>);

/// Per-client entries kept by `shard` whose consumer was last seen before `before_ms`, as
/// keys, looking at no more than `max_scan` entries from `from` on (a sweep is bounded work,
/// however many clients there are). Returns them and where the next sweep goes on (`None`:
/// the end was reached, start over).
pub fn expired_clients(
    db: &DB,
    shard: ShardId,
    from: &[u8],
    before_ms: u64,
    max_scan: usize,
) -> Result<Sweep, StorageError> {
    let mut out = Vec::new();
    let mode = rocksdb::IteratorMode::From(from, rocksdb::Direction::Forward);
    for (seen, item) in db.iterator_cf(cf(db, shard), mode).enumerate() {
        let (k, v) = item?;
        if seen == max_scan {
            return Ok((out, Some(k.to_vec())));
        }
        // topic#subscription#partition#client: only per-client entries have three '#'.
        if k.iter().filter(|&&b| b == b'#').count() != 3 {
            continue;
        }
        if Stored::decode(&v).is_some_and(|st| st.seen_ms < before_ms) {
            out.push(k.to_vec());
        }
    }
    Ok((out, None))
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
    fn replicated_offsets_are_applied_with_their_position_and_keys_are_parsed() {
        let dir = super::super::suite::TempDir::new("replicated");
        let db = crate::storage::db::open(&dir.0, 2).unwrap();
        assert_eq!(replicated_position(&db).unwrap(), 0, "none applied yet");
        let k = key("orders", "audit", PartitionId(3), "c1");
        let v = Stored { attempts: vec![(7, 2)], ..Stored::at(7) };
        apply_replicated(&db, ShardId(1), &k, Some(&v.encode()), 42).unwrap();
        assert_eq!((get(&db, ShardId(1), &k).unwrap(), replicated_position(&db).unwrap()), (Some(v), 42));
        apply_replicated(&db, ShardId(1), &k, None, 43).unwrap();
        assert_eq!((get(&db, ShardId(1), &k).unwrap(), replicated_position(&db).unwrap()), (None, 43));
        assert_eq!(parse_key("orders#audit#3#c1"), Some(("orders", "audit", PartitionId(3), "c1")));
        assert_eq!(parse_key("orders#audit#0"), Some(("orders", "audit", PartitionId(0), "")));
        for bad in ["orders#audit", "orders#audit#x", "orders#audit#01", "orders#a b#0", "#a#0", "o#a#0#", "o#a#0#c#d"]
        {
            assert_eq!(parse_key(bad), None, "{bad}");
        }
    }

    #[test]
    fn keys_list_and_delete_by_subscription() {
        let dir = super::super::suite::TempDir::new("offsets");
        let db = crate::storage::db::open(&dir.0, 1).unwrap();
        let s = ShardId(0);
        put(&db, s, &key("orders", "a", PartitionId(0), ""), &Stored { seen_ms: 1, ..Stored::at(5) }).unwrap();
        put(&db, s, &key("orders", "a", PartitionId(1), "c1"), &Stored { seen_ms: 2, ..Stored::at(7) }).unwrap();
        put(&db, s, &key("orders", "ab", PartitionId(0), ""), &Stored::at(9)).unwrap();
        assert_eq!(key("orders", "a", PartitionId(1), "c1"), b"orders#a#1#c1");
        let got = list(&db, s, "orders", "a").unwrap();
        assert_eq!(
            got,
            vec![
                Committed { partition: 0, client: String::new(), offset: 5, seen_ms: 1 },
                Committed { partition: 1, client: "c1".into(), offset: 7, seen_ms: 2 },
            ]
        );
        delete_all(&db, s, "orders", "a").unwrap();
        assert!(list(&db, s, "orders", "a").unwrap().is_empty());
        let other = get(&db, s, &key("orders", "ab", PartitionId(0), "")).unwrap().unwrap();
        assert_eq!(other.committed, 9, "a prefix of another name");
        assert_eq!(expired_clients(&db, s, b"", u64::MAX, 10).unwrap(), (Vec::new(), None), "no client entries left");
        put(&db, s, &key("orders", "x", PartitionId(0), "old"), &Stored { seen_ms: 10, ..Stored::at(1) }).unwrap();
        put(&db, s, &key("orders", "x", PartitionId(0), "new"), &Stored { seen_ms: 30, ..Stored::at(1) }).unwrap();
        assert_eq!(expired_clients(&db, s, b"", 20, 10).unwrap(), (vec![b"orders#x#0#old".to_vec()], None));
        // A sweep looks at no more than it is allowed to, and says where to go on.
        // (orders#ab#0 is no client's; #new sorts before #old.)
        let (first, next) = expired_clients(&db, s, b"", 20, 1).unwrap();
        assert_eq!((first.len(), next.clone()), (0, Some(b"orders#x#0#new".to_vec())), "one entry looked at");
        let (second, next) = expired_clients(&db, s, &next.unwrap(), 20, 1).unwrap();
        assert_eq!((second.len(), next.clone()), (0, Some(b"orders#x#0#old".to_vec())));
        let (third, end) = expired_clients(&db, s, &next.unwrap(), 20, 1).unwrap();
        assert_eq!((third, end), (vec![b"orders#x#0#old".to_vec()], None), "the end: start over");
    }

    #[test]
    fn stored_values_round_trip_and_read_the_first_format() {
        let st = Stored { committed: 3, next: 9, seen_ms: 77, attempts: vec![(3, 2), (5, 1), (8, 6)] };
        assert_eq!(Stored::decode(&st.encode()), Some(st));
        let old = Stored::decode(&42u64.to_be_bytes()).unwrap();
        assert_eq!((old.committed, old.next, old.attempts.len()), (42, 42, 0));
        assert_eq!(Stored::decode(b"garbage"), None);
        let mut truncated = Stored { attempts: vec![(1, 1)], ..Stored::at(1) }.encode();
        truncated.pop();
        assert_eq!(Stored::decode(&truncated), None);
    }
}
