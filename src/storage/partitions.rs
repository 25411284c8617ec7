//! The process-wide set of open partition logs (`segment::PartitionLog`), one per partition,
//! opened (and recovered) on first use.
//!
//! A partition's log lives in `<data_dir>/segments/t.<topic>/<partition>/` (`h.<SHA-256 of the
//! name>` for a name over 240 bytes, which with the `t.` would pass the 255 bytes a file name
//! may have; the prefix also keeps the names `.` and `..` from meaning a directory).
//!
//! Descriptors are a budget: a partition's log holds one file open (its tail segment's) only
//! while it is in use, and at most `max_open` are open at once, process-wide. Past that, the
//! least recently used are closed (a clock sweep: a log written since the hand last passed
//! gets a second chance) and reopened on their next write, so the number of partitions is
//! bounded by the disk, not by the open-files limit. A read of a closed log opens its file
//! for that read alone.
//!
//! Its owner shard appends to it; any thread may read it (the admin API, backlog measurement).
//! Each log sits behind its own mutex: the owner takes it to stage and to commit, a reader for
//! one bounded read. Opening is done under the partition's own mutex, not the set's: a long
//! recovery scan holds up only users of that partition, and two threads never recover the same
//! files at once.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::segment::{PartitionLog, SegmentError};
use super::tier::Tier;
use super::StorageError;
use crate::model::PartitionId;

/// One partition's log, opened on first use.
pub type Slot = Arc<Mutex<Option<PartitionLog>>>;

/// Segment size unless configured: small enough that retention by whole segments is fine
/// grained on a small disk, large enough that rolls (an index write, a file create) are rare.
pub const DEFAULT_SEGMENT_BYTES: u64 = 64 << 20;

impl From<SegmentError> for StorageError {
    fn from(e: SegmentError) -> Self {
        StorageError::Engine(e.to_string())
    }
}

/// Logs one [`PartitionLogs::make_room`] looks at, at most.
const SWEEP_STEPS: usize = 512;

/// Every partition log of the process.
pub struct PartitionLogs {
    root: PathBuf,
    max_segment_bytes: u64,
    /// Kafka's local copy: offsets may skip (`PartitionLog::open_mirror`).
    mirror: bool,
    open: Mutex<HashMap<(Box<str>, u32), Slot>>,
    /// Tail files open now, and how many may be.
    files: Arc<AtomicUsize>,
    max_open: usize,
    /// Every slot in the order made, and where the clock sweep goes on.
    clock: Mutex<(Vec<Slot>, usize)>,
    /// When a partition's file last could not be opened for want of a descriptor (ms since
    /// the Unix epoch; 0: never): `/readyz` reports it.
    short_at: AtomicU64,
    /// The bucket the embedded log's sealed segments are tiered to (`tier.s3.*`).
    tier: Option<Arc<Tier>>,
}

impl PartitionLogs {
    /// `max_open`: the partitions' share of the descriptors (at least 1).
    pub fn new(root: PathBuf, max_segment_bytes: u64, mirror: bool, max_open: usize) -> PartitionLogs {
        PartitionLogs {
            root,
            max_segment_bytes,
            mirror,
            open: Mutex::new(HashMap::new()),
            files: Arc::default(),
            max_open: max_open.max(1),
            clock: Mutex::new((Vec::new(), 0)),
            short_at: AtomicU64::new(0),
            tier: None,
        }
    }

    /// Tiers the logs to `tier` (before they are shared): a log opened takes the bucket's
    /// history of its partition as its own (its floor; an empty one continues after it).
    pub fn with_tier(mut self, tier: Arc<Tier>) -> Self {
        self.tier = Some(tier);
        self
    }

    /// The bucket the logs are tiered to, if any.
    pub fn tier(&self) -> Option<&Arc<Tier>> {
        self.tier.as_ref()
    }

    /// Notes `e` if it says the process is out of descriptors (see [`PartitionLogs::short_at`]).
    pub fn note(&self, e: &SegmentError) {
        if e.out_of_descriptors() {
            self.short_at.store(crate::model::clock::now_ms().max(1), Ordering::Relaxed);
        }
    }

    /// When a partition's file last could not be opened for want of a descriptor (ms since
    /// the Unix epoch), if ever.
    pub fn short_at(&self) -> Option<u64> {
        Some(self.short_at.load(Ordering::Relaxed)).filter(|&t| t > 0)
    }

    /// Tail files open now.
    pub fn open_files(&self) -> usize {
        self.files.load(Ordering::Relaxed)
    }

    /// The partitions' share of the descriptors.
    pub fn max_open(&self) -> usize {
        self.max_open
    }

    /// Where a partition's segments are.
    pub fn dir(&self, topic: &str, partition: PartitionId) -> PathBuf {
        self.root.join(super::tier::dir_name(topic)).join(partition.0.to_string())
    }

    /// The partition's slot (not yet opened: [`PartitionLogs::lock`] opens it).
    pub fn slot(&self, topic: &str, partition: PartitionId) -> Slot {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.entry((topic.into(), partition.0))
            .or_insert_with(|| {
                let slot = Slot::default();
                self.clock.lock().unwrap_or_else(|e| e.into_inner()).0.push(slot.clone());
                slot
            })
            .clone()
    }

    /// Locks a partition's log, opening it first if this is its first use.
    pub fn lock<'a>(
        &self,
        slot: &'a Slot,
        topic: &str,
        partition: PartitionId,
    ) -> Result<MutexGuard<'a, Option<PartitionLog>>, StorageError> {
        let mut g = slot.lock().unwrap_or_else(|e| e.into_inner());
        if g.is_none() {
            let dir = self.dir(topic, partition);
            let log = if self.mirror {
                PartitionLog::open_mirror(&dir, self.max_segment_bytes)
            } else {
                PartitionLog::open(&dir, self.max_segment_bytes)
            };
            let engine = |e: SegmentError| {
                self.note(&e);
                StorageError::Engine(format!("{}: {e}", dir.display()))
            };
            let mut log = log.map_err(engine)?;
            if let Some(m) = self.tier.as_ref().and_then(|t| t.manifest(topic, partition.0)) {
                log.continue_at(m.end()).map_err(engine)?;
                log.set_floor(m.first());
            }
            log.count_files_in(self.files.clone());
            *g = Some(log);
        }
        // The caller may be about to open this log's file: room is made first. When nothing
        // else could be closed (every other log in use right now), this one lets go of its own.
        if self.files.load(Ordering::Relaxed) >= self.max_open {
            self.make_room(slot);
            if self.files.load(Ordering::Relaxed) >= self.max_open {
                g.as_mut().expect("opened above").close_file();
            }
        }
        Ok(g)
    }

    /// After a write through a slot locked without [`PartitionLogs::lock`] (a turn's flush):
    /// the log lets go of its file again if the partitions are over their share, so one turn
    /// that writes many partitions holds one of their files at a time.
    pub fn after_write(&self, log: &mut PartitionLog) {
        if self.files.load(Ordering::Relaxed) > self.max_open {
            log.close_file();
        }
    }

    /// Closes the files of the least recently used partitions until an eighth of the budget is
    /// free, or [`SWEEP_STEPS`] logs were looked at (the caller is a shard on its append path:
    /// bounded work; the hand goes on from there next time): a clock sweep, skipping `except`
    /// (held by the caller) and any log in use right now.
    fn make_room(&self, except: &Slot) {
        let low = self.max_open - self.max_open / 8 - 1;
        let mut clock = self.clock.lock().unwrap_or_else(|e| e.into_inner());
        let (slots, hand) = &mut *clock;
        let n = slots.len();
        for _ in 0..(2 * n).min(SWEEP_STEPS) {
            if self.files.load(Ordering::Relaxed) <= low {
                break;
            }
            *hand = (*hand + 1) % n;
            let slot = &slots[*hand];
            if Arc::ptr_eq(slot, except) {
                continue;
            }
            close_if_idle(slot);
        }
    }

    /// Runs `f` on a partition's log (opened if needed): for readers without a cached slot.
    pub fn with<R>(
        &self,
        topic: &str,
        partition: PartitionId,
        f: impl FnOnce(&mut PartitionLog) -> Result<R, StorageError>,
    ) -> Result<R, StorageError> {
        let slot = self.slot(topic, partition);
        let mut g = self.lock(&slot, topic, partition)?;
        f(g.as_mut().expect("opened by lock"))
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Closes the files of partitions not written since the last sweep (see
    /// [`PartitionLog::close_if_idle`]); a partition in use right now is skipped. Returns how
    /// many partitions keep a file open.
    pub fn sweep(&self) -> usize {
        let slots: Vec<Slot> = self.clock.lock().unwrap_or_else(|e| e.into_inner()).0.clone();
        slots.iter().filter(|slot| !close_if_idle(slot)).count()
    }
}

/// Closes the file of the log in `slot` unless it was written since the last look (a second
/// chance) or is in use right now; whether it holds no file now.
fn close_if_idle(slot: &Slot) -> bool {
    match slot.try_lock() {
        Ok(mut g) => g.as_mut().is_none_or(|log| !log.holds_file() || log.close_if_idle()),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(id: &str) -> frame_codec::Frame {
        use frame_codec::{AttrValue, Attribute, DataKind, FrameBody, FrameHeader};
        let attributes = vec![Attribute { name: "id".into(), value: AttrValue::Str(id.into()) }];
        let body = FrameBody { topic: "t".into(), attributes, data: b"x".to_vec() };
        frame_codec::Frame::encode(&FrameHeader::event(DataKind::Text), &body).unwrap()
    }

    /// Many more partitions than the descriptor share: each is written and read, and the open
    /// files never pass the share (plus the one in hand), the least recently used closed.
    #[test]
    fn partitions_beyond_the_descriptor_share_are_served_within_it() {
        let root = std::env::temp_dir().join(format!("evmesh-partitions-budget-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let logs = PartitionLogs::new(root.clone(), 1 << 20, false, 16);
        let mut most = 0;
        for round in 0..2u64 {
            for p in 0..200 {
                let n = logs.with("t", PartitionId(p), |log| Ok(log.append(&mut [frame(&format!("{round}-{p}"))], 1)?));
                assert_eq!(n.unwrap(), round, "partition {p}");
                most = most.max(logs.open_files());
            }
        }
        assert!(most <= 17, "{most} files open at once, over the share of 16");
        for p in 0..200 {
            let read = logs.with("t", PartitionId(p), |log| Ok(log.read(0, 10, usize::MAX)?)).unwrap();
            assert_eq!(read.len(), 2, "partition {p}");
        }
        assert!(logs.open_files() <= 17);
        drop(logs);
        let _ = std::fs::remove_dir_all(&root);
    }
}
