//! The embedded log: each partition a segment log (`segment`, `partitions`), appended to by its
//! owner shard; lite topics in the shard's RocksDB column family `log.N`.
//!
//! Appends made in the same turn of a shard's event loop are staged and then written together:
//! one `write` per partition for everything staged in the turn (and one RocksDB write for the
//! lite topics' records).
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
//! Durability: `os` writes each turn's batches to the OS (survives a process crash); `fsync` also
//! asks the [`Syncer`] thread to sync the files written (and the WAL, for lite topics) and
//! resolves only after it, so many appends share one fsync (group commit) and the shard never
//! waits on the disk; `memory` writes segments like `os` (the page cache is as cheap as a
//! buffer of our own) and skips the WAL for lite topics.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;
use std::task::Waker;

use frame_codec::Frame;
use futures::channel::oneshot;
use rocksdb::{ReadOptions, WriteBatch, WriteOptions, DB};

use super::db::log_cf;
use super::partitions::{PartitionLogs, Slot};
use super::segment::{PartitionLog, Written};
use super::{Bounds, Durability, Storage, StorageError, TopicMeta};
use crate::model::{PartitionId, ShardId};

pub(super) fn prefix(topic: &str, partition: PartitionId) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + topic.len() + 12);
    k.push(topic.len() as u8);
    k.extend_from_slice(topic.as_bytes());
    k.extend_from_slice(&partition.0.to_be_bytes());
    k
}

pub(super) fn key(prefix: &[u8], offset: u64) -> Vec<u8> {
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
/// `max_bytes`: what [`Storage::read`] does, for a reader without a log handle of its own (a
/// session follower reading its owner's family from another thread).
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

/// What a sync round does ([`Syncer::sync_all`], or a test's stand-in).
pub(super) type SyncFn = fn(&DB, &[SyncTicket], &mut HashSet<PathBuf>) -> Result<(), SyncError>;

/// Why a sync round failed.
pub(super) enum SyncError {
    /// Nothing was lost (a directory could not be opened); a later round retries.
    Transient(StorageError),
    /// The device refused a sync: what it held may be gone (this poisons the syncer).
    Lost(String),
}

fn poisoned_error(why: &str) -> StorageError {
    StorageError::Engine(format!("an earlier {why}; restart evmesh to recover"))
}

/// What one flush asks the [`Syncer`] to make durable.
pub(super) struct SyncTicket {
    files: Vec<Written>,
    wal: bool,
    done: oneshot::Sender<Result<(), StorageError>>,
}

/// The helper thread that syncs segment files and the WAL for `fsync` durability. Requests that
/// arrive while a sync runs are answered together by the next one: each file once, the WAL
/// once.
///
/// A failed sync poisons it for the life of the process: Linux reports a write-back error to
/// one `fsync` and may drop the dirty pages, so a later sync of the same file can succeed while
/// an earlier batch in the middle of it is gone; recovery would then cut the segment at that
/// hole and lose the batches acknowledged after it. So after the first failure every sync
/// fails and no append is written any more (they get 503: nothing new becomes readable),
/// `/readyz` says why, and a restart recovers from what is on disk. Not being able to open a
/// directory (out of descriptors) loses nothing: that round fails, and the directory is synced
/// by a later one before it answers.
#[derive(Clone)]
pub struct Syncer {
    tx: crossbeam_channel::Sender<SyncTicket>,
    failed: Arc<std::sync::OnceLock<String>>,
}

impl Syncer {
    pub fn start(db: Arc<DB>) -> std::io::Result<Syncer> {
        Self::start_with(db, Self::sync_all)
    }

    /// [`Syncer::start`] with `sync` doing the work (a test makes it fail).
    pub(super) fn start_with(db: Arc<DB>, sync: SyncFn) -> std::io::Result<Syncer> {
        let (tx, rx) = crossbeam_channel::unbounded::<SyncTicket>();
        let failed = Arc::new(std::sync::OnceLock::<String>::new());
        let poisoned = failed.clone();
        std::thread::Builder::new().name("evmesh-fsync".into()).spawn(move || {
            // New directories whose entries are not synced yet (a round that could not open
            // one leaves it here for the next).
            let mut dirs = HashSet::new();
            while let Ok(first) = rx.recv() {
                let mut waiting = vec![first];
                waiting.extend(rx.try_iter());
                let result = match poisoned.get() {
                    Some(why) => Err(poisoned_error(why)),
                    None => match sync(&db, &waiting, &mut dirs) {
                        Ok(()) => Ok(()),
                        Err(SyncError::Transient(e)) => Err(e),
                        Err(SyncError::Lost(e)) => {
                            let _ = poisoned.set(e.clone());
                            Err(StorageError::Engine(e))
                        }
                    },
                };
                for t in waiting {
                    let _ = t.done.send(result.clone());
                }
            }
        })?;
        Ok(Syncer { tx, failed })
    }

    /// The first sync failure, if one happened (nothing has been durable since).
    pub fn failure(&self) -> Option<&str> {
        self.failed.get().map(String::as_str)
    }

    /// The sync of one round: new directories' entries, each file written once, the WAL.
    pub(super) fn sync_all(db: &DB, waiting: &[SyncTicket], dirs: &mut HashSet<PathBuf>) -> Result<(), SyncError> {
        let lost = |e: std::io::Error| SyncError::Lost(format!("fsync: {e}"));
        // A new segment: its directory entry, and those of the directories above it up to
        // `segments/` (a partition's first segment created them).
        for w in waiting.iter().flat_map(|t| &t.files) {
            dirs.extend(w.created_in.iter().flat_map(|d| d.ancestors().take(3)).map(Path::to_path_buf));
        }
        while let Some(dir) = dirs.iter().next().cloned() {
            let d = std::fs::File::open(&dir)
                .map_err(|e| SyncError::Transient(StorageError::Engine(format!("opening {}: {e}", dir.display()))))?;
            d.sync_all().map_err(lost)?;
            dirs.remove(&dir);
        }
        // A set: a group may hold many partitions' files (one each, however many tickets name it).
        let mut synced: HashSet<*const std::fs::File> = HashSet::new();
        for w in waiting.iter().flat_map(|t| &t.files) {
            if synced.insert(Arc::as_ptr(&w.file)) {
                w.file.sync_data().map_err(lost)?;
            }
        }
        if waiting.iter().any(|t| t.wal) {
            db.flush_wal(true).map_err(|e| SyncError::Lost(format!("WAL sync: {}", e.into_string())))?;
        }
        Ok(())
    }

    /// Resolves once the WAL (metadata, offsets, lite topics) is on the device.
    pub async fn sync_wal(&self) -> Result<(), StorageError> {
        self.sync(Vec::new(), true).await
    }

    /// Resolves once `files` (and the WAL, with `wal`) are on the device.
    async fn sync(&self, files: Vec<Written>, wal: bool) -> Result<(), StorageError> {
        let (done, rx) = oneshot::channel();
        let ticket = SyncTicket { files, wal, done };
        self.tx.send(ticket).map_err(|_| StorageError::Unavailable("fsync thread stopped"))?;
        rx.await.map_err(|_| StorageError::Unavailable("fsync thread stopped"))?
    }
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
fn topic_is_lite(topic: &str) -> bool {
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

/// What one flush did, shared by every append it carries (one allocation per flush, not a
/// channel per append): the outcome of each staged partition, by its place in
/// [`Pending::staged`], and of the lite topics' batch.
#[derive(Default)]
struct Flush {
    outcome: RefCell<Option<Outcome>>,
    waiting: RefCell<Vec<Waker>>,
}

struct Outcome {
    parts: Vec<Result<(), StorageError>>,
    lite: Result<(), StorageError>,
}

/// Which part of a flush an append waits for.
#[derive(Clone, Copy)]
enum Part {
    Staged(usize),
    Lite,
}

impl Flush {
    fn answer(&self, outcome: Outcome) {
        *self.outcome.borrow_mut() = Some(outcome);
        for w in self.waiting.take() {
            w.wake();
        }
    }

    /// Resolves with `part`'s result once the flush answered.
    async fn done(&self, part: Part) -> Result<(), StorageError> {
        std::future::poll_fn(|cx| match &*self.outcome.borrow() {
            Some(o) => std::task::Poll::Ready(match part {
                Part::Staged(i) => o.parts[i].clone(),
                Part::Lite => o.lite.clone(),
            }),
            None => {
                let mut w = self.waiting.borrow_mut();
                if !w.iter().any(|w| w.will_wake(cx.waker())) {
                    w.push(cx.waker().clone());
                }
                std::task::Poll::Pending
            }
        })
        .await
    }
}

/// Answers a flush that ends without answering (its task dropped at shutdown): its appends
/// fail rather than wait forever.
struct Unanswered {
    flush: Rc<Flush>,
    parts: usize,
}

impl Drop for Unanswered {
    fn drop(&mut self) {
        if self.flush.outcome.borrow().is_none() {
            let gone = || Err(StorageError::Unavailable("log writer stopped"));
            self.flush.answer(Outcome { parts: (0..self.parts).map(|_| gone()).collect(), lite: gone() });
        }
    }
}

/// Appends waiting for the next write of this shard.
#[derive(Default)]
struct Pending {
    /// Lite topics' records, and how many appends wait for them.
    batch: WriteBatch,
    lite: usize,
    /// Partitions with staged appends.
    staged: Vec<Slot>,
    /// What the appends staged so far wait on.
    flush: Rc<Flush>,
    /// A flush task is queued.
    scheduled: bool,
}

/// One shard's handle on the embedded log.
///
/// Appends made in the same turn of the shard's event loop are written together: the first
/// append queues a flush task behind every task already woken, each append stages its frames
/// (in its partition's batch, or the lite topics' RocksDB batch), and the flush writes each
/// staged partition with one `write` and answers them all. Offsets are taken when the frames
/// are staged, so they stay dense and in call order.
pub struct EmbeddedLog {
    inner: Rc<Inner>,
}

struct Inner {
    db: Arc<DB>,
    logs: Arc<PartitionLogs>,
    /// The partitions this handle used, by key prefix: no lookup in the process-wide set per
    /// append.
    slots: RefCell<HashMap<Box<str>, Vec<Option<Slot>>>>,
    cf: String,
    durability: Durability,
    syncer: Option<Syncer>,
    /// Next offset per owned partition (keyed by its key prefix), loaded from the log on first
    /// use after a start.
    parts: RefCell<HashMap<Rc<[u8]>, PartState>>,
    /// The lite topics in `parts` (the same keys), oldest cached first.
    lite_cached: RefCell<std::collections::VecDeque<Rc<[u8]>>>,
    /// `lite_topic_ttl_ms`: the index of last traffic is rewritten when it moved by 1/16 of it.
    lite_ttl_ms: u64,
    pending: RefCell<Pending>,
}

impl Inner {
    fn cf(&self) -> &rocksdb::ColumnFamily {
        self.db.cf_handle(&self.cf).expect("log family opened at start")
    }

    async fn flush(self: Rc<Self>) {
        // Behind every task already woken, so appends made meanwhile join this batch.
        crate::task::yield_now().await;
        let (batch, lite, staged, flush) = {
            let mut p = self.pending.borrow_mut();
            p.scheduled = false;
            let lite = std::mem::take(&mut p.lite);
            (std::mem::take(&mut p.batch), lite, std::mem::take(&mut p.staged), std::mem::take(&mut p.flush))
        };
        let flush = Unanswered { flush, parts: staged.len() };
        let fsync = self.durability == Durability::Fsync;
        // Each staged partition: one write. Nothing awaited between staging and here, so every
        // append staged is in these batches.
        let now = crate::model::clock::now_micros();
        let mut written = Vec::new();
        let mut parts = Vec::with_capacity(staged.len());
        for slot in staged {
            let mut g = slot.lock().unwrap_or_else(|e| e.into_inner());
            let log = g.as_mut().expect("a staged partition is open");
            let result = log.commit(now).map(|w| written.extend(w.into_iter().filter(|_| fsync))).map_err(|e| {
                self.logs.note(&e);
                StorageError::from(e)
            });
            self.logs.after_write(log);
            parts.push(result);
        }
        let mut wal = false;
        let mut lite_result = Ok(());
        if lite > 0 {
            lite_result = self.write_lite(batch);
            wal = fsync && lite_result.is_ok();
        }
        // One sync for all of it (durability fsync), on the helper thread.
        let synced = match &self.syncer {
            Some(s) if wal || !written.is_empty() => s.sync(written, wal).await,
            _ => Ok(()),
        };
        let with_sync = |r: Result<(), StorageError>| r.and_then(|()| synced.clone());
        let parts = parts.into_iter().map(with_sync).collect();
        flush.flush.answer(Outcome { parts, lite: with_sync(lite_result) });
    }

    /// Writes the lite topics' records of a turn.
    fn write_lite(&self, batch: WriteBatch) -> Result<(), StorageError> {
        let mut wo = WriteOptions::default();
        wo.disable_wal(self.durability == Durability::Memory);
        let result = self.db.write_opt(batch, &wo).map_err(StorageError::from);
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
}

impl Inner {
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
}

impl EmbeddedLog {
    pub fn new(
        db: Arc<DB>,
        logs: Arc<PartitionLogs>,
        shard: ShardId,
        durability: Durability,
        syncer: Option<Syncer>,
        lite_ttl: std::time::Duration,
    ) -> Self {
        let inner = Inner {
            db,
            logs,
            slots: RefCell::new(HashMap::new()),
            cf: log_cf(shard.index()),
            durability,
            syncer,
            parts: RefCell::new(HashMap::new()),
            lite_cached: RefCell::new(std::collections::VecDeque::new()),
            lite_ttl_ms: lite_ttl.as_millis() as u64,
            pending: RefCell::new(Pending::default()),
        };
        EmbeddedLog { inner: Rc::new(inner) }
    }

    fn cf(&self) -> &rocksdb::ColumnFamily {
        self.inner.cf()
    }

    /// A (not lite) partition's slot, cached by this handle.
    fn slot(&self, topic: &str, partition: PartitionId) -> Slot {
        let p = partition.0 as usize;
        if let Some(Some(s)) = self.inner.slots.borrow().get(topic).and_then(|v| v.get(p)) {
            return s.clone();
        }
        let slot = self.inner.logs.slot(topic, partition);
        let mut slots = self.inner.slots.borrow_mut();
        let v = slots.entry(topic.into()).or_default();
        if v.len() <= p {
            v.resize(p + 1, None);
        }
        v[p] = Some(slot.clone());
        slot
    }

    /// Runs `f` on a (not lite) partition's segment log, opening it on first use.
    fn with_log<R>(
        &self,
        (topic, partition): (&str, PartitionId),
        f: impl FnOnce(&mut PartitionLog) -> Result<R, StorageError>,
    ) -> Result<R, StorageError> {
        let slot = self.slot(topic, partition);
        let mut g = self.inner.logs.lock(&slot, topic, partition)?;
        f(g.as_mut().expect("opened by lock"))
    }

    /// The average size of a partition's events (its segments' bytes over their events; for a
    /// lite topic, of its newest 64 records): bounded work whatever the partition's size; 0 for
    /// an empty partition.
    pub fn average_record_bytes(&self, topic: &str, partition: PartitionId) -> Result<u64, StorageError> {
        if topic_is_lite(topic) {
            return self.sampled_record_bytes(&prefix(topic, partition));
        }
        self.with_log((topic, partition), |log| {
            let (bytes, events) = log.size();
            Ok(bytes / events.max(1))
        })
    }

    fn sampled_record_bytes(&self, pre: &[u8]) -> Result<u64, StorageError> {
        const SAMPLE: u64 = 64;
        let mut ro = ReadOptions::default();
        ro.set_iterate_lower_bound(pre.to_vec());
        ro.set_iterate_upper_bound(upper_bound(pre));
        let mut it = self.inner.db.raw_iterator_cf_opt(self.cf(), ro);
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
        let mut it = self.inner.db.raw_iterator_cf_opt(self.cf(), ro);
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

    /// Stores frames that already carry their offsets (a mirror of another log, the Kafka
    /// backend's local copy; not lite topics): those at or past the partition's end, in order,
    /// with gaps allowed when `contiguous` is false. Returns how many leading frames were
    /// skipped as already stored; with `contiguous`, nothing is written unless the first frame
    /// is exactly at the end. Written at once, never synced: the log it mirrors is the durable
    /// one.
    pub fn put_mirrored(
        &self,
        topic: &str,
        partition: PartitionId,
        frames: &[Frame],
        contiguous: bool,
    ) -> Result<Option<usize>, StorageError> {
        self.with_log((topic, partition), |log| {
            let next = log.next_offset();
            let skip = frames.iter().take_while(|f| f.header().offset < next).count();
            let rest = &frames[skip..];
            let Some(first) = rest.first() else { return Ok(Some(skip)) };
            if contiguous && first.header().offset != next {
                return Ok(None);
            }
            log.write_at(rest, crate::model::clock::now_micros())?;
            Ok(Some(skip))
        })
    }

    /// The next offset `partition` will get, counting appends not yet written: readers of a
    /// partition this shard owns use it to know they are caught up without touching the log.
    pub fn next_offset_of(&self, topic: &str, partition: PartitionId) -> Result<u64, StorageError> {
        if !topic_is_lite(topic) {
            return self.with_log((topic, partition), |log| Ok(log.next_offset()));
        }
        self.next_offset(&prefix(topic, partition))
    }

    fn next_offset(&self, pre: &[u8]) -> Result<u64, StorageError> {
        Ok(self.part_state(pre)?.0.next)
    }

    /// A partition's cached state, read from the log (and a lite topic's index) on a miss; and
    /// whether it was cached already.
    fn part_state(&self, pre: &[u8]) -> Result<(PartState, bool), StorageError> {
        if let Some(s) = self.inner.parts.borrow().get(pre) {
            return Ok((*s, true));
        }
        let next = self.scan_bounds(pre)?.end;
        let mut touched_ms = 0;
        let key: Rc<[u8]> = pre.into();
        if is_lite(pre) {
            if let Some(v) = self.inner.db.get_cf(self.cf(), lite_seen_key(lite_name(pre)))? {
                touched_ms = v.get(..8).map_or(0, |b| u64::from_be_bytes(b.try_into().expect("8 bytes")));
            }
            self.inner.lite_cached.borrow_mut().push_back(key.clone());
        }
        let state = PartState { next, touched_ms, hot: false };
        self.inner.parts.borrow_mut().insert(key, state);
        Ok((state, false))
    }

    /// Deletes the lite topics without traffic for `ttl_ms` (a little more: the index lags by up
    /// to 1/16 of it), at most `LITE_EXPIRE_BATCH` a call (the caller calls again, yielding in
    /// between, while a call expired that many), with their events and index rows. Topics
    /// `keep` names (one with a follower) and topics with appends not yet written stay. Returns
    /// the names of those that went.
    pub fn expire_lite(
        &self,
        now_ms: u64,
        ttl_ms: u64,
        keep: impl Fn(&str) -> bool,
    ) -> Result<Vec<String>, StorageError> {
        let cutoff = now_ms.saturating_sub(ttl_ms + ttl_ms / 16);
        let cf = self.cf();
        let mut ro = ReadOptions::default();
        ro.set_iterate_upper_bound(lite_time_key(cutoff, b""));
        let mut it = self.inner.db.raw_iterator_cf_opt(cf, ro);
        it.seek(lite_time_key(0, b""));
        let mut batch = WriteBatch::default();
        let mut gone = Vec::new();
        let busy = self.inner.pending.borrow().lite > 0;
        let mut looked = 0;
        while it.valid() && gone.len() < LITE_EXPIRE_BATCH && looked < 4 * LITE_EXPIRE_BATCH {
            looked += 1;
            let k = it.key().expect("valid");
            let (ms, name) = (u64::from_be_bytes(k[2..10].try_into().expect("8 bytes")), &k[10..]);
            let seen = self.inner.db.get_cf(cf, lite_seen_key(name))?;
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
            let pending = busy && self.inner.parts.borrow().contains_key(&pre[..]);
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
        self.inner.db.write(batch)?;
        let mut parts = self.inner.parts.borrow_mut();
        for pre in &gone {
            parts.remove(&pre[..]);
        }
        self.inner.lite_cached.borrow_mut().retain(|p| parts.contains_key(p));
        Ok(gone.iter().map(|pre| String::from_utf8_lossy(lite_name(pre)).into_owned()).collect())
    }
}

impl EmbeddedLog {
    /// After a failed sync nothing more is written: what cannot be acknowledged must not become
    /// readable either (consumers would get every retry of it).
    fn refuse_if_poisoned(&self) -> Result<(), StorageError> {
        match self.inner.syncer.as_ref().and_then(Syncer::failure) {
            Some(why) => Err(poisoned_error(why)),
            None => Ok(()),
        }
    }

    /// Queues this turn's flush task, if the turn's first append.
    fn schedule(&self, p: &mut Pending) {
        if !p.scheduled {
            p.scheduled = true;
            monoio::spawn(self.inner.clone().flush());
        }
    }

    /// Stages an append to a partition's segment log; resolves once this turn's flush wrote it.
    async fn append_segment(
        &self,
        (topic, partition): (&str, PartitionId),
        frames: &mut [Frame],
    ) -> Result<u64, StorageError> {
        self.refuse_if_poisoned()?;
        let slot = self.slot(topic, partition);
        let first = {
            let mut g = self.inner.logs.lock(&slot, topic, partition)?;
            for f in frames.iter_mut() {
                f.set_partition(partition.0);
            }
            g.as_mut().expect("opened by lock").stage(frames)
        };
        let (flush, part) = {
            let mut p = self.inner.pending.borrow_mut();
            let i = match p.staged.iter().position(|s| Arc::ptr_eq(s, &slot)) {
                Some(i) => i,
                None => {
                    p.staged.push(slot);
                    p.staged.len() - 1
                }
            };
            self.schedule(&mut p);
            (p.flush.clone(), Part::Staged(i))
        };
        flush.done(part).await?;
        Ok(first)
    }
}

/// Retention on a segment log: the first offset kept moves to where the limits put it (the
/// size limit from the partition's average event size, the age limit from the time index);
/// whole segments below it are deleted. The newest event always stays.
fn retain_segments(log: &mut PartitionLog, meta: &TopicMeta, now_us: i64) -> Result<u64, StorageError> {
    let (start, end) = log.bounds();
    if end.saturating_sub(start) <= 1 {
        return Ok(0);
    }
    let mut cut = start;
    if let Some(budget) = meta.retention_bytes {
        let (bytes, events) = log.size();
        let average = (bytes / events.max(1)).max(1);
        cut = cut.max(end.saturating_sub((budget / average).max(1)));
    }
    if let Some(ms) = meta.retention_ms {
        cut = cut.max(log.offset_for_time(now_us - (ms as i64) * 1000)?);
    }
    Ok(log.set_start(cut.min(end - 1))?)
}

impl Storage for EmbeddedLog {
    async fn append(&self, topic: &str, partition: PartitionId, frames: &mut [Frame]) -> Result<u64, StorageError> {
        if !topic_is_lite(topic) {
            return self.append_segment((topic, partition), frames).await;
        }
        self.refuse_if_poisoned()?;
        let pre = prefix(topic, partition);
        let (state, cached) = self.part_state(&pre)?;
        let first = state.next;
        let flush = {
            let cf = self.cf();
            let mut p = self.inner.pending.borrow_mut();
            for (i, f) in frames.iter_mut().enumerate() {
                let offset = first + i as u64;
                f.set_offset(offset);
                f.set_partition(partition.0);
                p.batch.put_cf(cf, key(&pre, offset), f.as_bytes());
            }
            if let Some(s) = self.inner.parts.borrow_mut().get_mut(pre.as_slice()) {
                s.next = first + frames.len() as u64;
                // A second append while cached: worth a second chance at eviction (a topic
                // written once and left idle is not).
                s.hot |= cached;
                if is_lite(&pre) {
                    // The index of last traffic, when it moved by over 1/16 of the TTL.
                    let now = crate::model::clock::now_ms();
                    if now.saturating_sub(s.touched_ms) > self.inner.lite_ttl_ms / 16 {
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
            self.schedule(&mut p);
            p.flush.clone()
        };
        flush.done(Part::Lite).await?;
        Ok(first)
    }

    fn read(
        &self,
        topic: &str,
        partition: PartitionId,
        from: u64,
        max: usize,
        max_bytes: usize,
    ) -> Result<Vec<Frame>, StorageError> {
        if !topic_is_lite(topic) {
            // Planned under the partition's mutex, read after it is let go.
            let plan = self.with_log((topic, partition), |log| Ok(log.plan_read(from, max, max_bytes)))?;
            return Ok(plan.read(max, max_bytes)?);
        }
        read_from(&self.inner.db, self.cf(), topic, partition, (from, max, max_bytes))
    }

    fn bounds(&self, topic: &str, partition: PartitionId) -> Result<Bounds, StorageError> {
        if !topic_is_lite(topic) {
            return self.with_log((topic, partition), |log| {
                let (start, end) = log.bounds();
                Ok(Bounds { start, end })
            });
        }
        self.scan_bounds(&prefix(topic, partition))
    }

    /// From the segments' time index (events' own times); a lite topic by binary search.
    fn offset_for_time(&self, topic: &str, partition: PartitionId, micros: i64) -> Result<u64, StorageError> {
        if !topic_is_lite(topic) {
            return self.with_log((topic, partition), |log| Ok(log.offset_for_time(micros)?));
        }
        super::offset_by_search(self, topic, partition, micros)
    }

    /// Bounded work per call, whatever the partition's size: the size limit is applied from the
    /// average size of the newest 64 records (hence "about" in the setting's doc), and the age
    /// limit walks forward from the oldest record, at most `RETENTION_SCAN` records per call
    /// (the next call continues). The newest record always stays.
    fn enforce_retention(
        &self,
        topic: &str,
        meta: &TopicMeta,
        partition: PartitionId,
        now_us: i64,
    ) -> Result<u64, StorageError> {
        const RETENTION_SCAN: u64 = 100_000;
        if meta.retention_ms.is_none() && meta.retention_bytes.is_none() {
            return Ok(0);
        }
        if !topic_is_lite(topic) {
            return self.with_log((topic, partition), |log| retain_segments(log, meta, now_us));
        }
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
            let mut it = self.inner.db.raw_iterator_cf_opt(self.cf(), ro);
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
        self.inner.db.delete_range_cf(self.cf(), key(&pre, 0), key(&pre, cut))?;
        Ok(cut - b.start)
    }
}
