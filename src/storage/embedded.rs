//! The embedded log: each partition a segment log (`segment`, `partitions`), appended to by its
//! owner shard; lite topics in the shard's RocksDB column family `log.N` (`lite`).
//!
//! Appends made in the same turn of a shard's event loop are staged and then written together:
//! one `write` per partition for everything staged in the turn (and one RocksDB write for the
//! lite topics' records). While the core has time, an append to a segment log with nothing else
//! staged is written at once ([`EmbeddedLog::write_at_once`]).
//!
//! Lite topics (stored names starting with `:`, see `model::StoredTopic`) are many (one per
//! session), small and short-lived, so they stay rows of RocksDB rather than segment files: the
//! rows' layout, the next-offset cache (at most [`LITE_CACHE`] lite topics per shard) and the
//! expiry are in `lite`.
//!
//! Durability: `os` writes each turn's batches to the OS (survives a process crash); `fsync` also
//! asks the [`Syncer`] thread (`syncer`) to sync the files written (and the WAL, for
//! lite topics) and resolves only after it, so many appends share one fsync (group commit) and
//! the shard never waits on the disk; `memory` writes segments like `os` (the page cache is as
//! cheap as a buffer of our own) and skips the WAL for lite topics.

mod lite;
mod syncer;

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::task::Waker;

use frame_codec::Frame;
use rocksdb::DB;

use super::db::log_cf;
use super::partitions::{PartitionLogs, Slot};
use super::segment::{PartitionLog, Prepared, SegmentError, Written};
use super::tier::Tier;
use super::{Bounds, Durability, Storage, StorageError, TopicMeta};
use crate::model::{PartitionId, ShardId, TopicMap};
pub use lite::{end_of, read_from, LITE_CACHE};
use lite::{topic_is_lite, LiteRows};
use syncer::poisoned_error;
pub use syncer::Syncer;

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
    /// Partitions with staged appends (the lite topics' records are staged in [`LiteRows`]).
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
    logs: Arc<PartitionLogs>,
    /// The partitions this handle used, by key prefix: no lookup in the process-wide set per
    /// append.
    slots: RefCell<TopicMap<Box<str>, Vec<Option<Slot>>>>,
    durability: Durability,
    syncer: Option<Syncer>,
    /// The lite topics' rows, and the next offsets cached of them.
    lite: LiteRows,
    pending: RefCell<Pending>,
    /// Segments are written with O_DIRECT through the shard's io_uring (`segment::direct`):
    /// flushes take turns (one write per partition in flight), and the buffers are kept.
    direct: bool,
    writing: futures::lock::Mutex<()>,
    buffers: RefCell<Vec<Vec<u8>>>,
}

/// Direct writes a flush has in flight at once: each holds a descriptor beyond the
/// partitions' share (`config::fds` reserves them per shard).
const DIRECT_WINDOW: usize = 4;

/// Direct-write buffers a shard keeps for its next flushes, and the largest kept.
const KEPT_BUFFERS: usize = 4;
const KEPT_BUFFER_BYTES: usize = 4 << 20;

impl Inner {
    async fn flush(self: Rc<Self>) {
        // Behind every task already woken, so appends made meanwhile join this batch.
        crate::task::yield_now().await;
        // A direct flush waits for the one before it to have written: appends made meanwhile
        // join this one.
        let turn = if self.direct { Some(self.writing.lock().await) } else { None };
        let (staged, flush) = {
            let mut p = self.pending.borrow_mut();
            p.scheduled = false;
            (std::mem::take(&mut p.staged), std::mem::take(&mut p.flush))
        };
        let flush = Unanswered { flush, parts: staged.len() };
        let fsync = self.durability == Durability::Fsync;
        // The lite topics' batch is written before anything is awaited: an append staged
        // while segment writes are in flight must not see its topic's cached end forgotten by a
        // failure of this batch (it would hand out that offset again).
        let (mut wal, mut lite_result) = (false, Ok(()));
        if let Some(batch) = self.lite.take_staged() {
            lite_result = self.lite.write(batch, self.durability);
            wal = fsync && lite_result.is_ok();
        }
        // Each staged partition: one write. Nothing awaited between staging and here, so every
        // append staged is in these batches.
        let now = crate::model::clock::now_micros();
        let mut written = Vec::new();
        let mut parts = Vec::with_capacity(staged.len());
        if self.direct {
            self.write_direct(&staged, now, &mut parts, fsync.then_some(&mut written)).await;
        } else {
            for slot in staged {
                let mut g = slot.lock().unwrap_or_else(|e| e.into_inner());
                let log = g.as_mut().expect("a staged partition is open");
                let result = log.commit(now).map(|w| written.extend(w.into_iter().filter(|_| fsync)));
                let result = result.map_err(|e| self.failed(e));
                self.logs.after_write(log);
                parts.push(result);
            }
        }
        drop(turn);
        // One sync for all of it (durability fsync), on the helper thread.
        let synced = match &self.syncer {
            Some(s) if wal || !written.is_empty() => s.sync(written, wal).await,
            _ => Ok(()),
        };
        let with_sync = |r: Result<(), StorageError>| r.and_then(|()| synced.clone());
        let parts = parts.into_iter().map(with_sync).collect();
        flush.flush.answer(Outcome { parts, lite: with_sync(lite_result) });
    }

    fn failed(&self, e: SegmentError) -> StorageError {
        self.logs.note(&e);
        StorageError::from(e)
    }

    /// Writes each staged partition with one direct write; a partition's outcome in `parts`,
    /// what they wrote to in `written` (wanted for a sync only: each holds a descriptor).
    ///
    /// Every partition's write is laid out before the first one is awaited, so appends made
    /// while they are in flight are staged behind them (and written by the next flush, whose
    /// appends they are); [`DIRECT_WINDOW`] of them are in flight at once, each on a
    /// descriptor of its own.
    async fn write_direct(
        &self,
        staged: &[Slot],
        now: i64,
        parts: &mut Vec<Result<(), StorageError>>,
        mut written: Option<&mut Vec<Written>>,
    ) {
        let mut writes = Vec::new();
        for (i, slot) in staged.iter().enumerate() {
            let mut g = slot.lock().unwrap_or_else(|e| e.into_inner());
            let log = g.as_mut().expect("a staged partition is open");
            let buf = self.buffers.borrow_mut().pop().unwrap_or_default();
            parts.push(match log.prepare_direct(now, buf, written.is_some()) {
                Ok(Prepared::Committed(w)) => {
                    if let Some(out) = written.as_deref_mut() {
                        out.extend(w);
                    }
                    Ok(())
                }
                Ok(Prepared::Direct(w)) => {
                    writes.push((i, w));
                    Ok(())
                }
                Err(e) => Err(self.failed(e)),
            });
            self.logs.after_write(log);
        }
        let mut writes = writes.into_iter().peekable();
        while writes.peek().is_some() {
            let window: Vec<_> = writes.by_ref().take(DIRECT_WINDOW).collect();
            let done = futures::future::join_all(window.into_iter().map(|(i, mut w)| {
                let file = {
                    let mut g = staged[i].lock().unwrap_or_else(|e| e.into_inner());
                    g.as_mut().expect("a staged partition is open").lend_direct()
                };
                async move {
                    let result = match file.and_then(monoio::fs::File::from_std) {
                        Ok(file) => {
                            let region = monoio::buf::IoBuf::slice(std::mem::take(&mut w.buf), w.range.clone());
                            let (result, region) = file.write_all_at(region, w.pos).await;
                            w.buf = region.into_inner();
                            result
                        }
                        Err(e) => Err(e),
                    };
                    (i, w, result)
                }
            }))
            .await;
            for (i, w, result) in done {
                let mut g = staged[i].lock().unwrap_or_else(|e| e.into_inner());
                let log = g.as_mut().expect("a staged partition is open");
                let (outcome, buf) = log.complete_direct(w, result);
                match outcome {
                    Ok(w) => {
                        if let Some(out) = written.as_deref_mut() {
                            out.extend(w);
                        }
                    }
                    Err(e) => parts[i] = Err(self.failed(e)),
                }
                self.logs.after_write(log);
                let mut kept = self.buffers.borrow_mut();
                if kept.len() < KEPT_BUFFERS && buf.capacity() <= KEPT_BUFFER_BYTES {
                    kept.push(buf);
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
            logs,
            slots: RefCell::new(TopicMap::default()),
            durability,
            syncer,
            lite: LiteRows::new(db, log_cf(shard.index()), lite_ttl),
            pending: RefCell::new(Pending::default()),
            direct: false,
            writing: futures::lock::Mutex::new(()),
            buffers: RefCell::new(Vec::new()),
        };
        EmbeddedLog { inner: Rc::new(inner) }
    }

    /// Writes this shard's segments with O_DIRECT through its io_uring (`segment::direct`);
    /// only for a shard whose runtime is io_uring, and never for Kafka's local copy.
    pub fn with_direct_writes(mut self) -> Self {
        Rc::get_mut(&mut self.inner).expect("set before the log is shared").direct = true;
        self
    }

    /// Tests: the next `n` writes of the lite topics' rows fail as a full device would.
    #[cfg(test)]
    pub(super) fn fail_lite_writes(&self, n: u32) {
        self.inner.lite.failing_writes.set(n);
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
            return self.inner.lite.average_record_bytes(topic, partition);
        }
        self.with_log((topic, partition), |log| {
            let (bytes, events) = log.size();
            Ok(bytes / events.max(1))
        })
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

    /// A partition's events from `from`: planned under the partition's mutex and read after it
    /// is let go; below the local start, from the tier's bucket (bytes not at hand yet:
    /// `tier::FETCHING`, the reader asks again).
    fn read_segments(
        &self,
        (topic, partition): (&str, PartitionId),
        from: u64,
        (max, max_bytes): (usize, usize),
    ) -> Result<Vec<Frame>, StorageError> {
        let tier = self.inner.logs.tier();
        let below = |log: &PartitionLog| {
            let from = from.max(log.bounds().0);
            (tier.is_some() && from < log.local_start()).then_some(from)
        };
        let plan =
            self.with_log((topic, partition), |log| Ok(below(log).ok_or_else(|| log.plan_read(from, max, max_bytes))))?;
        let from_tier = match plan {
            Ok(from) => Some(from),
            Err(plan) => {
                let got = plan.read(max, max_bytes)?;
                if !got.is_empty() || tier.is_none() {
                    return Ok(got);
                }
                // A local copy deleted since the plan (its upload confirmed): the bucket has it.
                self.with_log((topic, partition), |log| Ok(below(log)))?
            }
        };
        match (from_tier, tier) {
            (Some(from), Some(t)) => t.read((topic, partition.0), from, (max, max_bytes)),
            _ => Ok(Vec::new()),
        }
    }

    /// The next offset `partition` will get, counting appends not yet written: readers of a
    /// partition this shard owns use it to know they are caught up without touching the log.
    pub fn next_offset_of(&self, topic: &str, partition: PartitionId) -> Result<u64, StorageError> {
        if !topic_is_lite(topic) {
            return self.with_log((topic, partition), |log| Ok(log.next_offset()));
        }
        self.inner.lite.next_offset(topic, partition)
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
        self.inner.lite.expire(now_ms, ttl_ms, keep)
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

    /// Whether an append just staged is written at once rather than by the turn's flush: while
    /// the core has time ([`crate::task::has_time`]), nothing else is staged (an append
    /// waiting for a flush is never written, or failed, by another's write), and the write is
    /// one `pwrite` to the page cache (`os`, `memory`). The answer then goes out before the
    /// next connection's request is read, as it would without a batch; under load the batch
    /// saves a write per append, and an `fsync` or direct write is always shared.
    fn write_at_once(&self) -> bool {
        let inner = &self.inner;
        let quiet = || {
            let p = inner.pending.borrow();
            !p.scheduled && p.staged.is_empty()
        };
        !inner.direct && inner.durability != Durability::Fsync && quiet() && crate::task::has_time()
    }

    /// Stages an append to a partition's segment log; resolves once this turn's flush wrote it
    /// (or at once: [`EmbeddedLog::write_at_once`]).
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
            let log = g.as_mut().expect("opened by lock");
            let first = log.stage(frames);
            if self.write_at_once() {
                let result = log.commit(crate::model::clock::now_micros()).map_err(|e| self.inner.failed(e));
                self.inner.logs.after_write(log);
                return result.map(|_| first);
            }
            first
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
fn retain_segments(
    log: &mut PartitionLog,
    meta: &TopicMeta,
    (tier, topic, partition): (Option<&Arc<Tier>>, &str, PartitionId),
    now_us: i64,
) -> Result<u64, StorageError> {
    let (start, end) = log.bounds();
    if end.saturating_sub(start) <= 1 {
        return Ok(0);
    }
    let mut cut = start;
    if let Some(budget) = meta.retention_bytes {
        let (mut bytes, mut events) = log.size();
        // The average over the whole partition: the bucket's segments not on disk too.
        if let Some(m) = tier.and_then(|t| t.manifest(topic, partition.0)) {
            let here = log.segments().first().map_or(end, |s| s.base);
            for s in m.segments.iter().filter(|s| s.next <= here) {
                bytes += s.bytes;
                events += s.next - s.base;
            }
        }
        let average = (bytes / events.max(1)).max(1);
        cut = cut.max(end.saturating_sub((budget / average).max(1)));
    }
    if let Some(ms) = meta.retention_ms {
        cut = cut.max(time_cut(log, tier, (topic, partition), now_us - (ms as i64) * 1000)?);
    }
    Ok(log.set_start(cut.min(end - 1))?)
}

/// The first offset kept whose event's time is at or after `ts_us`: in the tier's bucket by its
/// segments' newest times (a whole segment's start), else from the local time index.
fn time_cut(
    log: &PartitionLog,
    tier: Option<&Arc<Tier>>,
    (topic, partition): (&str, PartitionId),
    ts_us: i64,
) -> Result<u64, StorageError> {
    let (first, _) = log.bounds();
    if first < log.local_start() {
        if let Some(o) = tier.and_then(|t| t.offset_for_time(topic, partition.0, ts_us)) {
            return Ok(o.max(first).min(log.local_start()));
        }
    }
    Ok(log.offset_for_time(ts_us)?)
}

impl Storage for EmbeddedLog {
    async fn append(&self, topic: &str, partition: PartitionId, frames: &mut [Frame]) -> Result<u64, StorageError> {
        if !topic_is_lite(topic) {
            return self.append_segment((topic, partition), frames).await;
        }
        self.refuse_if_poisoned()?;
        let first = self.inner.lite.stage(topic, partition, frames)?;
        let flush = {
            let mut p = self.inner.pending.borrow_mut();
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
            return self.read_segments((topic, partition), from, (max, max_bytes));
        }
        self.inner.lite.read(topic, partition, from, max, max_bytes)
    }

    fn bounds(&self, topic: &str, partition: PartitionId) -> Result<Bounds, StorageError> {
        if !topic_is_lite(topic) {
            return self.with_log((topic, partition), |log| {
                let (start, end) = log.bounds();
                Ok(Bounds { start, end })
            });
        }
        self.inner.lite.bounds(topic, partition)
    }

    /// From the segments' time index (events' own times); a lite topic by binary search.
    fn offset_for_time(&self, topic: &str, partition: PartitionId, micros: i64) -> Result<u64, StorageError> {
        if !topic_is_lite(topic) {
            let tier = self.inner.logs.tier();
            return self.with_log((topic, partition), |log| time_cut(log, tier, (topic, partition), micros));
        }
        super::offset_by_search(self, topic, partition, micros)
    }

    /// Bounded work per call, whatever the partition's size (a segment log's by
    /// `retain_segments`, a lite topic's by `LiteRows::enforce_retention`). The newest record
    /// always stays.
    fn enforce_retention(
        &self,
        topic: &str,
        meta: &TopicMeta,
        partition: PartitionId,
        now_us: i64,
    ) -> Result<u64, StorageError> {
        if meta.retention_ms.is_none() && meta.retention_bytes.is_none() {
            return Ok(0);
        }
        if !topic_is_lite(topic) {
            let tier = self.inner.logs.tier();
            return self
                .with_log((topic, partition), |log| retain_segments(log, meta, (tier, topic, partition), now_us));
        }
        self.inner.lite.enforce_retention(topic, meta, partition, now_us)
    }
}

// Last in the file: the layering check reads nothing after a `#[cfg(test)]`.
/// A sync round's types, for the storage suite's stand-in rounds.
#[cfg(test)]
pub(super) use syncer::{SyncError, SyncTicket};
