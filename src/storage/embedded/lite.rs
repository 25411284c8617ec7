//! The lite topics' storage: rows of the shard's RocksDB column family `log.N`, with the
//! next-offset cache, the index of last traffic and the expiry it drives; and the reads of those
//! rows for a reader without a log handle of its own ([`read_from`], [`end_of`]).
//!
//! Lite topics (stored names starting with `:`, see `model::StoredTopic`) are many (one per
//! session), small and short-lived: a directory and a descriptor each would cost more than the
//! events, so they stay rows of RocksDB. Key: `[topic length u8][topic][partition u32
//! BE][offset u64 BE]`, so one lite topic is one contiguous, offset-ordered key range; value: the
//! whole frame, offset stamped in. Two index rows under the impossible topic length 0: `[0]['s'][name]` -> the
//! last traffic (ms, BE) and `[0]['t'][ms BE][name]` -> empty, so expiry walks the oldest first.
//! The rows are rewritten only when the time moved by over 1/16 of the TTL. An idle lite topic
//! holds no memory: at most [`LITE_CACHE`] of them keep their next offset cached per shard (a
//! miss costs one seek).
//!
//! Appends are staged in one RocksDB batch per turn, written by the embedded log's flush
//! ([`LiteRows::write`]): without the WAL for `memory` durability.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::sync::Arc;

use frame_codec::Frame;
use rocksdb::{ReadOptions, WriteBatch, WriteOptions, DB};

use crate::model::PartitionId;
use crate::storage::{Bounds, Durability, StorageError, TopicMeta};

fn prefix(topic: &str, partition: PartitionId) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + topic.len() + 12);
    k.push(topic.len() as u8);
    k.extend_from_slice(topic.as_bytes());
    k.extend_from_slice(&partition.0.to_be_bytes());
    k
}

fn key(prefix: &[u8], offset: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(prefix.len() + 8);
    k.extend_from_slice(prefix);
    k.extend_from_slice(&offset.to_be_bytes());
    k
}

fn offset_of(key: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&key[key.len() - 8..]);
    u64::from_be_bytes(b)
}

/// The first key after every key of the partition.
fn upper_bound(prefix: &[u8]) -> Vec<u8> {
    key(prefix, u64::MAX)
}

/// Up to `max` events of a partition from offset `from`, stopping after the one that reaches
/// `max_bytes`: what [`Storage::read`](crate::storage::Storage::read) does, for a reader without
/// a log handle of its own (a session follower reading its owner's family from another thread).
pub fn read_from(
    db: &DB,
    cf: &rocksdb::ColumnFamily,
    topic: &str,
    partition: PartitionId,
    (from, max, max_bytes): (u64, usize, usize),
) -> Result<Vec<Frame>, StorageError> {
    let pre = prefix(topic, partition);
    let mut ro = ReadOptions::default();
    ro.set_iterate_upper_bound(upper_bound(&pre));
    let mut it = db.raw_iterator_cf_opt(cf, ro);
    it.seek(key(&pre, from));
    let mut out = Vec::new();
    let mut bytes = 0usize;
    while it.valid() && out.len() < max && bytes < max_bytes {
        let (k, v) = (it.key().expect("valid"), it.value().expect("valid"));
        let frame = Frame::decode(v).map_err(|e| StorageError::Corrupt {
            topic: topic.to_owned(),
            partition: partition.0,
            offset: offset_of(k),
            reason: e.to_string(),
        })?;
        bytes += v.len();
        out.push(frame);
        it.next();
    }
    it.status()?;
    Ok(out)
}

/// The offset the next event of a one-partition (lite) topic will get, as written so far: for
/// a reader that starts at the end, without a log handle of its own.
pub fn end_of(db: &DB, cf: &rocksdb::ColumnFamily, topic: &str) -> Result<u64, StorageError> {
    let pre = prefix(topic, PartitionId(0));
    let mut ro = ReadOptions::default();
    ro.set_iterate_lower_bound(pre.clone());
    ro.set_iterate_upper_bound(upper_bound(&pre));
    let mut it = db.raw_iterator_cf_opt(cf, ro);
    it.seek_to_last();
    let end = it.key().map_or(0, |k| offset_of(k) + 1);
    it.status()?;
    Ok(end)
}

#[derive(Debug, Clone, Copy)]
struct PartState {
    next: u64,
    /// Lite topics: the last traffic written to the index (ms since the epoch; 0 = none).
    touched_ms: u64,
    /// Lite topics: appended to since the eviction clock last passed (a second chance).
    hot: bool,
}

/// Lite topics whose next offset a shard keeps cached. Past it the clock evicts: the oldest
/// cached goes unless it was appended to since, then it gets a second chance at the back.
pub const LITE_CACHE: usize = 16_384;
/// Lite topics expired per shard and pass at most (the next pass continues).
const LITE_EXPIRE_BATCH: usize = 1_000;

fn is_lite(pre: &[u8]) -> bool {
    pre.get(1) == Some(&crate::model::topic::LITE_MARK)
}

/// What [`is_lite`] says of the topic's prefix, from its name.
pub(super) fn topic_is_lite(topic: &str) -> bool {
    crate::model::StoredTopic::new(topic).is_lite()
}

/// The name part of a lite topic's partition prefix.
fn lite_name(pre: &[u8]) -> &[u8] {
    &pre[1..1 + pre[0] as usize]
}

fn lite_seen_key(name: &[u8]) -> Vec<u8> {
    [&[0u8, b's'][..], name].concat()
}

fn lite_time_key(ms: u64, name: &[u8]) -> Vec<u8> {
    [&[0u8, b't'][..], &ms.to_be_bytes()[..], name].concat()
}

/// The lite topics' records staged in this turn, for the next flush.
#[derive(Default)]
struct Pending {
    /// Their records, and how many appends wait for them.
    batch: WriteBatch,
    lite: usize,
}

/// One shard's lite topics: their rows in the shard's family, and what the shard keeps of them.
pub(super) struct LiteRows {
    db: Arc<DB>,
    cf: String,
    /// Next offset per lite topic's partition (keyed by its key prefix), loaded from the log on
    /// first use after a start.
    parts: RefCell<HashMap<Rc<[u8]>, PartState>>,
    /// The lite topics in `parts` (the same keys), oldest cached first.
    lite_cached: RefCell<VecDeque<Rc<[u8]>>>,
    /// `lite_topic_ttl_ms`: the index of last traffic is rewritten when it moved by 1/16 of it.
    lite_ttl_ms: u64,
    pending: RefCell<Pending>,
    /// Tests: the next writes that fail as a device would.
    #[cfg(test)]
    pub(super) failing_writes: std::cell::Cell<u32>,
}

impl LiteRows {
    /// The lite topics in `db`'s family `cf`.
    pub(super) fn new(db: Arc<DB>, cf: String, lite_ttl: std::time::Duration) -> Self {
        LiteRows {
            db,
            cf,
            parts: RefCell::new(HashMap::new()),
            lite_cached: RefCell::new(VecDeque::new()),
            lite_ttl_ms: lite_ttl.as_millis() as u64,
            pending: RefCell::new(Pending::default()),
            #[cfg(test)]
            failing_writes: std::cell::Cell::new(0),
        }
    }

    fn cf(&self) -> &rocksdb::ColumnFamily {
        self.db.cf_handle(&self.cf).expect("log family opened at start")
    }

    /// Stamps `frames` with a lite topic's next offsets (and `partition`) and stages them, with
    /// the index of last traffic when it moved, for the next [`LiteRows::write`]; returns the
    /// first offset.
    pub(super) fn stage(&self, topic: &str, partition: PartitionId, frames: &mut [Frame]) -> Result<u64, StorageError> {
        let pre = prefix(topic, partition);
        let (state, cached) = self.part_state(&pre)?;
        let first = state.next;
        let cf = self.cf();
        let mut p = self.pending.borrow_mut();
        for (i, f) in frames.iter_mut().enumerate() {
            let offset = first + i as u64;
            f.set_offset(offset);
            f.set_partition(partition.0);
            p.batch.put_cf(cf, key(&pre, offset), f.as_bytes());
        }
        if let Some(s) = self.parts.borrow_mut().get_mut(pre.as_slice()) {
            s.next = first + frames.len() as u64;
            // A second append while cached: worth a second chance at eviction (a topic
            // written once and left idle is not).
            s.hot |= cached;
            if is_lite(&pre) {
                // The index of last traffic, when it moved by over 1/16 of the TTL.
                let now = crate::model::clock::now_ms();
                if now.saturating_sub(s.touched_ms) > self.lite_ttl_ms / 16 {
                    let name = lite_name(&pre);
                    if s.touched_ms != 0 {
                        p.batch.delete_cf(cf, lite_time_key(s.touched_ms, name));
                    }
                    p.batch.put_cf(cf, lite_seen_key(name), now.to_be_bytes());
                    p.batch.put_cf(cf, lite_time_key(now, name), b"");
                    s.touched_ms = now;
                }
            }
        }
        p.lite += 1;
        Ok(first)
    }

    /// Takes the batch staged since the last call, if an append waits for it. A flush without
    /// lite appends keeps the batch (a new one per flush was two calls into RocksDB and an
    /// allocation); rows a failed stage left in it are dropped.
    pub(super) fn take_staged(&self) -> Option<WriteBatch> {
        let mut p = self.pending.borrow_mut();
        let lite = std::mem::take(&mut p.lite);
        if lite == 0 {
            if !p.batch.is_empty() {
                p.batch.clear();
            }
            return None;
        }
        Some(std::mem::take(&mut p.batch))
    }

    /// Writes the lite topics' records of a turn (without the WAL for `memory` durability).
    pub(super) fn write(&self, batch: WriteBatch, durability: Durability) -> Result<(), StorageError> {
        let mut wo = WriteOptions::default();
        wo.disable_wal(durability == Durability::Memory);
        let result = match self.injected_failure() {
            Some(e) => Err(e),
            None => self.db.write_opt(batch, &wo).map_err(StorageError::from),
        };
        if result.is_ok() {
            // Written, and nothing is pending (no await since the batch was taken): a dropped
            // entry is read back from the log exactly.
            self.evict_lite();
        } else {
            // Offsets were handed out for records that are not in the log. Forget every lite
            // topic's end (they are re-read from the log). No append was queued since the batch
            // was taken (no await between), so none holds an offset past the gap.
            debug_assert_eq!(self.pending.borrow().lite, 0);
            self.parts.borrow_mut().clear();
            self.lite_cached.borrow_mut().clear();
        }
        result
    }

    #[cfg(not(test))]
    fn injected_failure(&self) -> Option<StorageError> {
        None
    }

    /// Tests: a write fails as a full device would, while `failing_writes` counts down.
    #[cfg(test)]
    fn injected_failure(&self) -> Option<StorageError> {
        let n = self.failing_writes.get();
        self.failing_writes.set(n.saturating_sub(1));
        (n > 0).then(|| StorageError::Engine("IO error: No space left on device".into()))
    }

    /// Drops the oldest cached lite topics past [`LITE_CACHE`]. Only when nothing is pending:
    /// an entry with offsets handed out but not written must stay.
    fn evict_lite(&self) {
        let mut order = self.lite_cached.borrow_mut();
        if order.len() <= LITE_CACHE || self.pending.borrow().lite > 0 {
            return;
        }
        let mut parts = self.parts.borrow_mut();
        // Every entry is passed at most twice (once to clear `hot`, once to evict).
        let mut turns = 2 * order.len();
        while order.len() > LITE_CACHE && turns > 0 {
            turns -= 1;
            let Some(pre) = order.pop_front() else { break };
            match parts.get_mut(&pre) {
                Some(s) if s.hot => {
                    s.hot = false;
                    order.push_back(pre);
                }
                _ => {
                    parts.remove(&pre);
                }
            }
        }
    }

    /// Up to `max` events from `from`, stopping after the one that reaches `max_bytes`.
    pub(super) fn read(
        &self,
        topic: &str,
        partition: PartitionId,
        from: u64,
        max: usize,
        max_bytes: usize,
    ) -> Result<Vec<Frame>, StorageError> {
        read_from(&self.db, self.cf(), topic, partition, (from, max, max_bytes))
    }

    /// The first offset kept and the next one written.
    pub(super) fn bounds(&self, topic: &str, partition: PartitionId) -> Result<Bounds, StorageError> {
        self.scan_bounds(&prefix(topic, partition))
    }

    /// The average size of the partition's newest 64 records: bounded work whatever the
    /// partition's size; 0 for an empty partition.
    pub(super) fn average_record_bytes(&self, topic: &str, partition: PartitionId) -> Result<u64, StorageError> {
        self.sampled_record_bytes(&prefix(topic, partition))
    }

    fn sampled_record_bytes(&self, pre: &[u8]) -> Result<u64, StorageError> {
        const SAMPLE: u64 = 64;
        let mut ro = ReadOptions::default();
        ro.set_iterate_lower_bound(pre.to_vec());
        ro.set_iterate_upper_bound(upper_bound(pre));
        let mut it = self.db.raw_iterator_cf_opt(self.cf(), ro);
        it.seek_to_last();
        let (mut n, mut bytes) = (0u64, 0u64);
        while it.valid() && n < SAMPLE {
            bytes += it.value().map_or(0, |v| v.len() as u64);
            n += 1;
            it.prev();
        }
        it.status()?;
        Ok(bytes / n.max(1))
    }

    fn scan_bounds(&self, pre: &[u8]) -> Result<Bounds, StorageError> {
        let mut ro = ReadOptions::default();
        ro.set_iterate_lower_bound(pre.to_vec());
        ro.set_iterate_upper_bound(upper_bound(pre));
        let mut it = self.db.raw_iterator_cf_opt(self.cf(), ro);
        it.seek_to_last();
        if !it.valid() {
            it.status()?;
            return Ok(Bounds::default());
        }
        let end = offset_of(it.key().expect("valid iterator has a key")) + 1;
        it.seek_to_first();
        let start = it.key().map(offset_of).unwrap_or(end);
        it.status()?;
        Ok(Bounds { start, end })
    }

    /// The next offset `partition` will get, counting appends not yet written.
    pub(super) fn next_offset(&self, topic: &str, partition: PartitionId) -> Result<u64, StorageError> {
        Ok(self.part_state(&prefix(topic, partition))?.0.next)
    }

    /// A partition's cached state, read from the log (and a lite topic's index) on a miss; and
    /// whether it was cached already.
    fn part_state(&self, pre: &[u8]) -> Result<(PartState, bool), StorageError> {
        if let Some(s) = self.parts.borrow().get(pre) {
            return Ok((*s, true));
        }
        let next = self.scan_bounds(pre)?.end;
        let mut touched_ms = 0;
        let key: Rc<[u8]> = pre.into();
        if is_lite(pre) {
            if let Some(v) = self.db.get_cf(self.cf(), lite_seen_key(lite_name(pre)))? {
                touched_ms = v.get(..8).map_or(0, |b| u64::from_be_bytes(b.try_into().expect("8 bytes")));
            }
            self.lite_cached.borrow_mut().push_back(key.clone());
        }
        let state = PartState { next, touched_ms, hot: false };
        self.parts.borrow_mut().insert(key, state);
        Ok((state, false))
    }

    /// What `EmbeddedLog::expire_lite` does (its doc says how).
    pub(super) fn expire(
        &self,
        now_ms: u64,
        ttl_ms: u64,
        keep: impl Fn(&str) -> bool,
    ) -> Result<Vec<String>, StorageError> {
        let cutoff = now_ms.saturating_sub(ttl_ms + ttl_ms / 16);
        let cf = self.cf();
        let mut ro = ReadOptions::default();
        ro.set_iterate_upper_bound(lite_time_key(cutoff, b""));
        let mut it = self.db.raw_iterator_cf_opt(cf, ro);
        it.seek(lite_time_key(0, b""));
        let mut batch = WriteBatch::default();
        let mut gone = Vec::new();
        let busy = self.pending.borrow().lite > 0;
        let mut looked = 0;
        while it.valid() && gone.len() < LITE_EXPIRE_BATCH && looked < 4 * LITE_EXPIRE_BATCH {
            looked += 1;
            let k = it.key().expect("valid");
            let (ms, name) = (u64::from_be_bytes(k[2..10].try_into().expect("8 bytes")), &k[10..]);
            let seen = self.db.get_cf(cf, lite_seen_key(name))?;
            if seen.as_deref() != Some(&ms.to_be_bytes()[..]) {
                // A row the topic's later traffic replaced (or an expiry left): only it goes.
                batch.delete_cf(cf, k);
                it.next();
                continue;
            }
            let mut pre = vec![name.len() as u8];
            pre.extend_from_slice(name);
            pre.extend_from_slice(&0u32.to_be_bytes());
            // Followed, or maybe in the batch being written: it stays (its rows too).
            let pending = busy && self.parts.borrow().contains_key(&pre[..]);
            if pending || std::str::from_utf8(name).is_ok_and(&keep) {
                it.next();
                continue;
            }
            batch.delete_cf(cf, k);
            batch.delete_range_cf(cf, key(&pre, 0), upper_bound(&pre));
            batch.delete_cf(cf, lite_seen_key(name));
            gone.push(pre);
            it.next();
        }
        it.status()?;
        drop(it);
        self.db.write(batch)?;
        let mut parts = self.parts.borrow_mut();
        for pre in &gone {
            parts.remove(&pre[..]);
        }
        self.lite_cached.borrow_mut().retain(|p| parts.contains_key(p));
        Ok(gone.iter().map(|pre| String::from_utf8_lossy(lite_name(pre)).into_owned()).collect())
    }

    /// Retention on a lite topic. Bounded work per call, whatever the partition's size: the
    /// size limit is applied from the average size of the newest 64 records (hence "about" in
    /// the setting's doc), and the age limit walks forward from the oldest record, at most
    /// `RETENTION_SCAN` records per call (the next call continues). The newest record always
    /// stays.
    pub(super) fn enforce_retention(
        &self,
        topic: &str,
        meta: &TopicMeta,
        partition: PartitionId,
        now_us: i64,
    ) -> Result<u64, StorageError> {
        const RETENTION_SCAN: u64 = 100_000;
        let pre = prefix(topic, partition);
        let b = self.scan_bounds(&pre)?;
        if b.end.saturating_sub(b.start) <= 1 {
            return Ok(0);
        }
        let newest = b.end - 1;
        let mut cut = b.start;
        if let Some(budget) = meta.retention_bytes {
            let average = self.sampled_record_bytes(&pre)?.max(1);
            let keep = (budget / average).max(1);
            cut = cut.max(b.end.saturating_sub(keep));
        }
        if let Some(ms) = meta.retention_ms {
            let oldest_allowed = now_us - (ms as i64) * 1000;
            let mut ro = ReadOptions::default();
            ro.set_iterate_upper_bound(upper_bound(&pre));
            let mut it = self.db.raw_iterator_cf_opt(self.cf(), ro);
            it.seek(key(&pre, cut));
            let mut scanned = 0;
            while it.valid() && scanned < RETENTION_SCAN {
                let (k, v) = (it.key().expect("valid"), it.value().expect("valid"));
                let offset = offset_of(k);
                let expired =
                    frame_codec::FrameHeader::read(v).map(|h| h.timestamp_us < oldest_allowed).unwrap_or(false);
                if offset >= newest || !expired {
                    break;
                }
                cut = offset + 1;
                scanned += 1;
                it.next();
            }
            it.status()?;
        }
        let cut = cut.min(newest);
        if cut <= b.start {
            return Ok(0);
        }
        self.db.delete_range_cf(self.cf(), key(&pre, 0), key(&pre, cut))?;
        Ok(cut - b.start)
    }
}
