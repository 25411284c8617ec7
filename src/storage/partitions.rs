//! The process-wide set of open partition logs (`segment::PartitionLog`), one per partition,
//! opened (and recovered) on first use.
//!
//! A partition's log lives in `<data_dir>/segments/t.<topic>/<partition>/` (`h.<SHA-256 of the
//! name>` for a name over 240 bytes, which with the `t.` would pass the 255 bytes a file name
//! may have; the prefix also keeps the names `.` and `..` from meaning a directory).
//!
//! Its owner shard appends to it; any thread may read it (the admin API, backlog measurement).
//! Each log sits behind its own mutex: the owner takes it to stage and to commit, a reader for
//! one bounded read. Opening is done under the partition's own mutex, not the set's: a long
//! recovery scan holds up only users of that partition, and two threads never recover the same
//! files at once.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use super::segment::{PartitionLog, SegmentError};
use super::StorageError;
use crate::shard::PartitionId;

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

/// Every partition log of the process.
pub struct PartitionLogs {
    root: PathBuf,
    max_segment_bytes: u64,
    /// Kafka's local copy: offsets may skip (`PartitionLog::open_mirror`).
    mirror: bool,
    open: Mutex<HashMap<(Box<str>, u32), Slot>>,
}

impl PartitionLogs {
    pub fn new(root: PathBuf, max_segment_bytes: u64, mirror: bool) -> PartitionLogs {
        PartitionLogs { root, max_segment_bytes, mirror, open: Mutex::new(HashMap::new()) }
    }

    /// Where a partition's segments are.
    pub fn dir(&self, topic: &str, partition: PartitionId) -> PathBuf {
        let name = if topic.len() <= 240 {
            format!("t.{topic}")
        } else {
            use sha2::Digest;
            let d = sha2::Sha256::digest(topic.as_bytes());
            format!("h.{}", d.iter().map(|b| format!("{b:02x}")).collect::<String>())
        };
        self.root.join(name).join(partition.0.to_string())
    }

    /// The partition's slot (not yet opened: [`PartitionLogs::lock`] opens it).
    pub fn slot(&self, topic: &str, partition: PartitionId) -> Slot {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.entry((topic.into(), partition.0)).or_default().clone()
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
            *g = Some(log.map_err(|e| StorageError::Engine(format!("{}: {e}", dir.display())))?);
        }
        Ok(g)
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
        let slots: Vec<Slot> = self.open.lock().unwrap_or_else(|e| e.into_inner()).values().cloned().collect();
        let mut open = 0;
        for slot in slots {
            let Ok(mut g) = slot.try_lock() else {
                open += 1;
                continue;
            };
            if let Some(log) = g.as_mut() {
                open += usize::from(!log.close_if_idle());
            }
        }
        open
    }
}
