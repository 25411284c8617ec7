//! Reads of a partition's log: by offset, planned under the partition's mutex ([`ReadPlan`])
//! and done without it, and by time, from the segments' time index and their batches' times.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use frame_codec::Frame;

use super::format::{decode, frames_of, BatchHeader, SegmentError, HEADER, INDEX_INTERVAL, MAX_BATCH_BYTES};
use super::log::PartitionLog;

/// Batches a read by time opens at most.
pub const TIME_SCAN: usize = 4096;

/// A read of a partition's log planned under its mutex ([`PartitionLog::plan_read`]) and done
/// without it. It sees the log as it was when planned: the bytes below each segment's planned
/// size never change (appends, and a write retried after a failed one, only write past them;
/// a direct write writes the end's block again, with the same bytes below the size).
pub struct ReadPlan {
    from: u64,
    pub(super) segments: Vec<Planned>,
}

/// One segment of a [`ReadPlan`]: the tail's open file, or a sealed segment's path.
pub(super) struct Planned {
    path: PathBuf,
    file: Option<Arc<File>>,
    /// Where the read starts in it, and its size when planned.
    pos: u64,
    size: u64,
}

impl ReadPlan {
    /// Up to `max` events, stopping after the one that reaches `max_bytes`. A sealed segment
    /// that retention deleted since the plan was made ends the read with what it found before.
    pub fn read(&self, max: usize, max_bytes: usize) -> Result<Vec<Frame>, SegmentError> {
        let from = self.from;
        let mut out = Vec::new();
        let mut bytes = 0;
        let mut head = [0u8; HEADER];
        for s in &self.segments {
            let file = match &s.file {
                Some(f) => f.clone(),
                None => match File::open(&s.path) {
                    Ok(f) => Arc::new(f),
                    Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                    Err(e) => return Err(e.into()),
                },
            };
            let mut pos = s.pos;
            while pos < s.size && out.len() < max && bytes < max_bytes {
                file.read_exact_at(&mut head, pos)?;
                let h = BatchHeader::read(&head).ok_or_else(|| SegmentError::Corrupt {
                    path: s.path.display().to_string(),
                    reason: format!("no batch header at byte {pos}"),
                })?;
                if h.base + u64::from(h.count) > from {
                    let body = PartitionLog::body(&file, &h, pos, &s.path)?;
                    frames_of(&body, &h, from.max(h.base), &s.path, |o, b| {
                        if out.len() >= max || bytes >= max_bytes {
                            return Ok(false);
                        }
                        bytes += b.len();
                        out.push(decode(o, b, &s.path)?);
                        Ok(true)
                    })?;
                }
                pos += u64::from(h.total_len);
            }
            if out.len() >= max || bytes >= max_bytes {
                break;
            }
        }
        Ok(out)
    }
}

impl PartitionLog {
    /// Up to `max` events from offset `from` (or the first kept, if later), stopping after the
    /// one that reaches `max_bytes`.
    pub fn read(&self, from: u64, max: usize, max_bytes: usize) -> Result<Vec<Frame>, SegmentError> {
        self.plan_read(from, max, max_bytes).read(max, max_bytes)
    }

    /// What a read from `from` of up to `max_bytes` needs of this log, to be done by
    /// [`ReadPlan::read`] after the partition's mutex is let go: another thread's read (the
    /// admin API's, a backlog measurement) then never holds the owner's appends behind its I/O.
    /// Enough segments for `max` events and `max_bytes` are taken: the events' bytes, what the
    /// file adds to each (at most a batch header, a length and padding, for an event alone in
    /// its batch), what a read skips to reach `from` (up to an index interval and a batch) and
    /// a last whole batch.
    pub fn plan_read(&self, from: u64, max: usize, max_bytes: usize) -> ReadPlan {
        let (first, end) = self.bounds();
        let from = from.max(first);
        let room = max_bytes
            .saturating_add(max.saturating_mul(HEADER + 16))
            .saturating_add(2 * MAX_BATCH_BYTES + INDEX_INTERVAL as usize + HEADER) as u64;
        let mut segments = Vec::new();
        let mut planned = 0u64;
        let start = self.segments.partition_point(|s| s.base <= from).saturating_sub(1);
        for s in self.segments[start..].iter().filter(|s| s.size > 0) {
            if from >= end || planned >= room {
                break;
            }
            let pos = if segments.is_empty() { s.seek(from) } else { 0 };
            planned += s.size - pos;
            segments.push(Planned { path: s.path.clone(), file: s.file.clone(), pos, size: s.size });
        }
        ReadPlan { from, segments }
    }

    /// A batch's body, checked against its CRC.
    fn body(file: &File, h: &BatchHeader, pos: u64, path: &Path) -> Result<Vec<u8>, SegmentError> {
        let mut body = vec![0u8; h.total_len as usize - HEADER];
        file.read_exact_at(&mut body, pos + HEADER as u64)?;
        if crc32c::crc32c(&body) != h.body_crc {
            let reason = format!("batch at offset {} fails its CRC", h.base);
            return Err(SegmentError::Corrupt { path: path.display().to_string(), reason });
        }
        Ok(body)
    }

    /// The first offset kept whose event's time is at or after `ts_us` (the next offset if
    /// none). Batches whose latest time is earlier are skipped by the time index and their
    /// headers; in the others, each event's own time decides. At most [`TIME_SCAN`] batches are
    /// opened: past that, the offset reached is returned (retention then keeps more, and its
    /// next pass goes on from there).
    pub fn offset_for_time(&self, ts_us: i64) -> Result<u64, SegmentError> {
        let (first, end) = self.bounds();
        let mut opened = 0;
        let mut head = [0u8; HEADER];
        for s in self.segments.iter().filter(|s| s.next > first && s.max_ts >= ts_us) {
            let file = s.reader()?;
            // The last entry before the time, then batch by batch.
            let i = s.index.partition_point(|e| e.ts < ts_us);
            let mut pos = s.index.get(i.saturating_sub(1)).map_or(0, |e| u64::from(e.pos));
            while pos < s.size {
                file.read_exact_at(&mut head, pos)?;
                let Some(h) = BatchHeader::read(&head) else { break };
                if h.max_ts >= ts_us && h.base + u64::from(h.count) > first {
                    if opened == TIME_SCAN {
                        return Ok(h.base.max(first));
                    }
                    opened += 1;
                    let body = Self::body(&file, &h, pos, &s.path)?;
                    let mut hit = None;
                    frames_of(&body, &h, first.max(h.base), &s.path, |o, b| {
                        let t = frame_codec::FrameHeader::read(b).map_err(|e| SegmentError::Corrupt {
                            path: s.path.display().to_string(),
                            reason: format!("offset {o}: {e}"),
                        })?;
                        hit = (t.timestamp_us >= ts_us).then_some(o);
                        Ok(hit.is_none())
                    })?;
                    if let Some(o) = hit {
                        return Ok(o);
                    }
                }
                pos += u64::from(h.total_len);
            }
        }
        Ok(end)
    }
}

/// What [`read_detached`] read: the events, and where it stopped for bytes not at hand.
pub struct Detached {
    pub frames: Vec<Frame>,
    /// The position whose bytes `at` did not have (`None`: the read ended for another reason:
    /// `max`, `max_bytes` or the segment's end).
    pub wanted: Option<u64>,
}

/// Where a read of `offset` starts in a sealed segment based at `base`: its floor entry's
/// position, by a binary search over the segment's `entries` index entries, each read by
/// `entry(i)` (its 16 bytes; `None` when not at hand, and then so is the answer). Only the
/// entries searched are touched: an index kept elsewhere is never copied whole.
pub fn index_floor(
    entries: usize,
    mut entry: impl FnMut(usize) -> Option<[u8; 16]>,
    base: u64,
    offset: u64,
) -> Option<u64> {
    let rel = offset.saturating_sub(base);
    let field = |e: &[u8; 16], at: usize| u64::from(u32::from_le_bytes(e[at..at + 4].try_into().expect("4")));
    // The first entry past `rel`; the one before it is the floor.
    let (mut lo, mut hi) = (0, entries);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if field(&entry(mid)?, 0) <= rel {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    match lo {
        0 => Some(0),
        i => Some(field(&entry(i - 1)?, 4)),
    }
}

/// A sealed segment kept elsewhere (a tier's object), read as [`ReadPlan::read`] reads a local
/// one, walking from `start` (where [`index_floor`] says `from`'s batch is, or 0): `at(pos,
/// len)` gives its bytes `pos..pos + len` when they are at hand (`None` when not: the read
/// stops there and says where); `size` is its length. Every batch read is checked against its
/// CRC.
pub fn read_detached(
    at: &mut dyn FnMut(u64, usize) -> Option<Vec<u8>>,
    (size, start): (u64, u64),
    (from, max, max_bytes): (u64, usize, usize),
    name: &Path,
) -> Result<Detached, SegmentError> {
    let corrupt = |reason: String| SegmentError::Corrupt { path: name.display().to_string(), reason };
    let mut pos = start;
    let (mut out, mut bytes) = (Vec::new(), 0);
    while pos < size && out.len() < max && bytes < max_bytes {
        let Some(head) = at(pos, HEADER) else { return Ok(Detached { frames: out, wanted: Some(pos) }) };
        let h = BatchHeader::read(&head).ok_or_else(|| corrupt(format!("no batch header at byte {pos}")))?;
        if h.base + u64::from(h.count) > from {
            let Some(all) = at(pos, h.total_len as usize) else {
                return Ok(Detached { frames: out, wanted: Some(pos) });
            };
            let body = &all[HEADER..];
            if crc32c::crc32c(body) != h.body_crc {
                return Err(corrupt(format!("batch at offset {} fails its CRC", h.base)));
            }
            frames_of(body, &h, from.max(h.base), name, |o, b| {
                if out.len() >= max || bytes >= max_bytes {
                    return Ok(false);
                }
                bytes += b.len();
                out.push(decode(o, b, name)?);
                Ok(true)
            })?;
        }
        pos += u64::from(h.total_len);
    }
    Ok(Detached { frames: out, wanted: None })
}
