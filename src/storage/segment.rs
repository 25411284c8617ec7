//! A partition's events as a log of segment files: the format, appends, reads by offset and by
//! time, crash recovery and retention. The embedded log keeps every topic's events here (lite
//! topics excepted, see `embedded`), and so does the Kafka backend's local copy.
//!
//! A partition is a directory of segments, each named by its first offset in 20 digits:
//! `00000000000000000000.log` holds record batches back to back; `<base>.index` is written when
//! the segment is sealed (a newer one started). A record batch is what one append writes, with
//! one `write`; its layout and the index's are in `format`.
//!
//! The parts: `format` (the bytes: a batch's header and body, index entries, file names, the
//! batch being built), `file` (one segment file: the walk that checks and cuts it, its index),
//! `log` ([`PartitionLog`]: opening and recovery, staged appends and their commit, rolls,
//! retention) and `read` ([`ReadPlan`], reads by offset planned under the partition's mutex and
//! done without it; reads by time).
//!
//! Recovery after a crash (`PartitionLog::open`) walks the last segment, and the one sealed just
//! before it, from their start and cuts at the first batch that is short, has a wrong magic or
//! header CRC, runs past the end, does not start at the offset expected, or whose body CRC
//! fails: a torn tail is cut, never served. A segment cut short drops the segments after it (as
//! Kafka does). Their indexes are rebuilt; an older sealed segment's index file is used when it
//! is consistent, and the segment walked the same way when not. Retention deletes whole sealed
//! segments.
//!
//! What was taken from where: the batch-as-the-unit, the 20-digit names, the sparse offset index
//! every 4 KiB and the time index that only increases from Kafka (`DefaultRecordBatch`,
//! `OffsetIndex`, `TimeIndex`, `LogSegment.recover`); the separate header CRC, checked before
//! the length is trusted, and stopping at a zero-filled header from Redpanda (`parser.cc`);
//! one combined 16-byte entry for offset and time from Iggy's index. Added here: the 8-byte
//! alignment of batches and frames (frames are read where they lie), the magic (a zero header,
//! or a batch whose header CRC happens to be 0, is never mistaken for a batch) and the
//! expected-offset check (stale bytes past a cut are not resurrected). Indexes are not
//! preallocated (Kafka's zero-filled preallocated indexes are read back as corrupt after a crash).

mod direct;
mod file;
mod format;
mod log;
mod read;

pub use direct::{DirectWrite, Prepared, BLOCK};
pub use file::SegmentInfo;
pub use format::{SegmentError, HEADER, INDEX_INTERVAL, MAGIC, MAX_BATCH_BYTES};

/// A sealed segment's files in a partition's directory: its events and its index.
pub fn files(dir: &std::path::Path, base: u64) -> (std::path::PathBuf, std::path::PathBuf) {
    (format::log_path(dir, base), format::index_path(dir, base))
}
pub use log::{PartitionLog, Written};
pub use read::{index_floor, read_detached, Detached, ReadPlan, TIME_SCAN};

// The tests' names, last in the file: the layering check reads nothing after a `#[cfg(test)]`.
#[cfg(test)]
use format::{index_path, log_path, padded, BatchHeader};
#[cfg(test)]
use frame_codec::Frame;
#[cfg(test)]
use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

#[cfg(test)]
mod direct_tests;
#[cfg(test)]
mod tests;
