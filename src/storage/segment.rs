//! A partition's events as a log of segment files: the format, appends, reads by offset and by
//! time, crash recovery and retention (issue 11's segment log, first step: it is not yet the
//! broker's log; `EmbeddedLog` still keeps events in RocksDB).
//!
//! A partition is a directory of segments, each named by its first offset in 20 digits:
//! `00000000000000000000.log` holds record batches back to back; `<base>.index` is written when
//! the segment is sealed (a newer one started). A record batch is what one append writes, with
//! one `write`:
//!
//! | bytes  | field (little-endian)                                                  |
//! |--------|------------------------------------------------------------------------|
//! | 0..4   | magic `EMSB`                                                           |
//! | 4..8   | CRC-32C of bytes 8..64 (the header is trusted before its length)      |
//! | 8..12  | total length, header included, a multiple of 8                         |
//! | 12..16 | CRC-32C of the body                                                    |
//! | 16..24 | base offset                                                            |
//! | 24..32 | publish time, µs since the Unix epoch (never below an earlier batch's) |
//! | 32..40 | latest timestamp of its frames (at least the publish time)             |
//! | 40..44 | frame count (at least 1)                                               |
//! | 44..64 | zero                                                                   |
//!
//! The body is each frame as `length u32 | 0u32 | frame bytes`, padded to 8: a batch starts
//! 8-aligned, so does every frame in it (and the rkyv body 40 bytes into a frame).
//!
//! An index entry is `offset - base u32 | position u32 | time i64` (16 bytes), one for the first
//! batch and then one per [`INDEX_INTERVAL`] bytes: a read seeks to the floor entry and walks
//! batch headers from there; a read by time takes the first batch whose latest time reaches it.
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

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use frame_codec::Frame;

pub const MAGIC: [u8; 4] = *b"EMSB";
pub const HEADER: usize = 64;
const ENTRY: usize = 16;
/// Bytes of batches between two index entries.
pub const INDEX_INTERVAL: u64 = 4096;

/// A segment log's failures.
#[derive(Debug, thiserror::Error)]
pub enum SegmentError {
    #[error("segment log: {0}")]
    Io(#[from] io::Error),
    #[error("segment log {path}: {reason}")]
    Corrupt { path: String, reason: String },
}

/// A batch header, read and checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct BatchHeader {
    total_len: u32,
    body_crc: u32,
    base: u64,
    publish_us: i64,
    max_ts: i64,
    count: u32,
}

impl BatchHeader {
    fn write(&self, out: &mut [u8]) {
        out[..4].copy_from_slice(&MAGIC);
        out[8..12].copy_from_slice(&self.total_len.to_le_bytes());
        out[12..16].copy_from_slice(&self.body_crc.to_le_bytes());
        out[16..24].copy_from_slice(&self.base.to_le_bytes());
        out[24..32].copy_from_slice(&self.publish_us.to_le_bytes());
        out[32..40].copy_from_slice(&self.max_ts.to_le_bytes());
        out[40..44].copy_from_slice(&self.count.to_le_bytes());
        out[44..HEADER].fill(0);
        let crc = crc32c::crc32c(&out[8..HEADER]);
        out[4..8].copy_from_slice(&crc.to_le_bytes());
    }

    /// The header in `b`, if it is one: the magic, the header CRC, a sane length.
    fn read(b: &[u8]) -> Option<BatchHeader> {
        let b = b.get(..HEADER)?;
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        if b[..4] != MAGIC || u32_at(4) != crc32c::crc32c(&b[8..HEADER]) {
            return None;
        }
        let h = BatchHeader {
            total_len: u32_at(8),
            body_crc: u32_at(12),
            base: u64_at(16),
            publish_us: u64_at(24) as i64,
            max_ts: u64_at(32) as i64,
            count: u32_at(40),
        };
        let sane = h.total_len as usize >= HEADER + 8 && h.total_len % 8 == 0 && h.count >= 1;
        sane.then_some(h)
    }
}

fn padded(n: usize) -> usize {
    n.div_ceil(8) * 8
}

/// Encodes `frames` (offsets already stamped) as one batch into `out`.
fn encode(frames: &[Frame], base: u64, publish_us: i64, out: &mut Vec<u8>) -> BatchHeader {
    out.clear();
    out.resize(HEADER, 0);
    let mut max_ts = publish_us;
    for f in frames {
        let bytes = f.as_bytes();
        out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(bytes);
        out.resize(padded(out.len()), 0);
        max_ts = max_ts.max(f.header().timestamp_us);
    }
    let h = BatchHeader {
        total_len: out.len() as u32,
        body_crc: crc32c::crc32c(&out[HEADER..]),
        base,
        publish_us,
        max_ts,
        count: frames.len() as u32,
    };
    h.write(&mut out[..HEADER]);
    h
}

/// The frames of a batch body (checked by its CRC), from offset `from` on.
fn frames_of(body: &[u8], h: &BatchHeader, from: u64, path: &Path) -> Result<Vec<Frame>, SegmentError> {
    let corrupt = |reason: String| SegmentError::Corrupt { path: path.display().to_string(), reason };
    let mut out = Vec::new();
    let mut at = 0;
    for i in 0..u64::from(h.count) {
        let len = body.get(at..at + 4).map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize);
        let Some(bytes) = len.and_then(|len| body.get(at + 8..at + 8 + len)) else {
            return Err(corrupt(format!("batch at offset {} is cut short", h.base)));
        };
        if h.base + i >= from {
            out.push(Frame::decode(bytes).map_err(|e| corrupt(format!("offset {}: {e}", h.base + i)))?);
        }
        at = padded(at + 8 + bytes.len());
    }
    Ok(out)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    rel: u32,
    pos: u32,
    ts: i64,
}

/// One segment file and what is known of it.
struct Segment {
    base: u64,
    path: PathBuf,
    file: File,
    size: u64,
    /// The offset after its last event.
    next: u64,
    /// Its latest time (the time index's last value).
    max_ts: i64,
    index: Vec<Entry>,
    /// Bytes written since the last index entry.
    since_entry: u64,
}

fn log_path(dir: &Path, base: u64) -> PathBuf {
    dir.join(format!("{base:020}.log"))
}

fn index_path(dir: &Path, base: u64) -> PathBuf {
    dir.join(format!("{base:020}.index"))
}

impl Segment {
    fn create(dir: &Path, base: u64) -> Result<Segment, SegmentError> {
        let path = log_path(dir, base);
        let file = OpenOptions::new().read(true).write(true).create_new(true).open(&path)?;
        Ok(Segment { base, path, file, size: 0, next: base, max_ts: i64::MIN, index: Vec::new(), since_entry: 0 })
    }

    fn note(&mut self, h: &BatchHeader, pos: u64) {
        if self.index.is_empty() || self.since_entry >= INDEX_INTERVAL {
            let rel = u32::try_from(h.base - self.base).expect("a segment holds under 2^32 events");
            self.index.push(Entry { rel, pos: pos as u32, ts: h.max_ts.max(self.max_ts) });
            self.since_entry = 0;
        }
        self.since_entry += u64::from(h.total_len);
        self.next = h.base + u64::from(h.count);
        self.max_ts = self.max_ts.max(h.max_ts);
    }

    /// Walks the batches from the start, checking each one whole, and cuts the file at the first
    /// that fails: what follows the last whole batch was never acknowledged.
    fn scan(&mut self) -> Result<(), SegmentError> {
        let len = self.file.metadata()?.len();
        let (mut pos, mut expected) = (0u64, self.base);
        let mut head = [0u8; HEADER];
        self.index.clear();
        self.since_entry = 0;
        let cut = loop {
            if pos + HEADER as u64 > len {
                break pos < len;
            }
            self.file.read_exact_at(&mut head, pos)?;
            let Some(h) = BatchHeader::read(&head) else { break true };
            if h.base != expected || pos + u64::from(h.total_len) > len {
                break true;
            }
            let mut body = vec![0u8; h.total_len as usize - HEADER];
            self.file.read_exact_at(&mut body, pos + HEADER as u64)?;
            if crc32c::crc32c(&body) != h.body_crc {
                break true;
            }
            self.note(&h, pos);
            expected = self.next;
            pos += u64::from(h.total_len);
        };
        self.size = pos;
        if cut {
            self.file.set_len(pos)?;
            self.file.sync_all()?;
        }
        Ok(())
    }

    /// Loads a sealed segment's index file, if it is consistent with the segment.
    fn load_index(&mut self, dir: &Path, next: u64) -> Result<bool, SegmentError> {
        let Ok(bytes) = std::fs::read(index_path(dir, self.base)) else { return Ok(false) };
        if bytes.is_empty() || bytes.len() % ENTRY != 0 {
            return Ok(false);
        }
        let entries: Vec<Entry> = bytes
            .chunks_exact(ENTRY)
            .map(|e| Entry {
                rel: u32::from_le_bytes(e[..4].try_into().expect("4")),
                pos: u32::from_le_bytes(e[4..8].try_into().expect("4")),
                ts: i64::from_le_bytes(e[8..16].try_into().expect("8")),
            })
            .collect();
        let ordered = entries.windows(2).all(|w| w[0].rel < w[1].rel && w[0].pos < w[1].pos && w[0].ts <= w[1].ts);
        let fits = entries[0].pos == 0 && entries.last().is_some_and(|e| u64::from(e.pos) < self.size);
        if !ordered || !fits || self.base + u64::from(entries.last().expect("not empty").rel) >= next {
            return Ok(false);
        }
        self.max_ts = entries.last().expect("not empty").ts;
        self.index = entries;
        self.next = next;
        // The latest time is past the last entry's when batches follow it.
        let last = self.index.last().copied().expect("not empty");
        let mut pos = u64::from(last.pos);
        let mut head = [0u8; HEADER];
        while pos + (HEADER as u64) <= self.size {
            self.file.read_exact_at(&mut head, pos)?;
            let Some(h) = BatchHeader::read(&head) else { return Ok(false) };
            self.max_ts = self.max_ts.max(h.max_ts);
            pos += u64::from(h.total_len);
        }
        Ok(true)
    }

    fn write_index(&self, dir: &Path) -> Result<(), SegmentError> {
        let mut out = Vec::with_capacity(self.index.len() * ENTRY);
        for e in &self.index {
            out.extend_from_slice(&e.rel.to_le_bytes());
            out.extend_from_slice(&e.pos.to_le_bytes());
            out.extend_from_slice(&e.ts.to_le_bytes());
        }
        std::fs::write(index_path(dir, self.base), out)?;
        Ok(())
    }

    /// The position of the batch holding `offset`'s floor index entry.
    fn seek(&self, offset: u64) -> u64 {
        let rel = offset.saturating_sub(self.base);
        let i = self.index.partition_point(|e| u64::from(e.rel) <= rel);
        self.index.get(i.saturating_sub(1)).map_or(0, |e| u64::from(e.pos))
    }
}

/// Facts of one segment, for retention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentInfo {
    pub base: u64,
    pub next: u64,
    pub bytes: u64,
    pub max_ts: i64,
}

/// One partition's segment log.
pub struct PartitionLog {
    dir: PathBuf,
    segments: Vec<Segment>,
    max_segment_bytes: u64,
    /// The latest publish time written (batches' times never go back).
    last_publish: i64,
    buf: Vec<u8>,
}

impl PartitionLog {
    /// Opens (or creates) the log in `dir`, recovering its last segment.
    pub fn open(dir: &Path, max_segment_bytes: u64) -> Result<PartitionLog, SegmentError> {
        std::fs::create_dir_all(dir)?;
        let mut bases: Vec<u64> = std::fs::read_dir(dir)?
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let stem = name.strip_suffix(".log")?;
                (stem.len() == 20).then(|| stem.parse().ok()).flatten()
            })
            .collect();
        bases.sort_unstable();
        let mut segments = Vec::with_capacity(bases.len().max(1));
        for (i, &base) in bases.iter().enumerate() {
            let path = log_path(dir, base);
            let file = OpenOptions::new().read(true).write(true).open(&path)?;
            let size = file.metadata()?.len();
            let mut s =
                Segment { base, path, file, size, next: base, max_ts: i64::MIN, index: Vec::new(), since_entry: 0 };
            let next = bases.get(i + 1).copied();
            // The tail, and the segment sealed last (a crash may have come right after the roll),
            // are checked batch by batch; an older one is trusted when its index file is
            // consistent, and checked the same way when not.
            let recent = i + 2 >= bases.len();
            let trusted = !recent && s.load_index(dir, next.expect("not the tail"))?;
            if !trusted {
                s.scan()?;
            }
            let Some(next) = next else {
                segments.push(s);
                break;
            };
            if s.next != next {
                // Cut short (or it lost its end): what followed it was never whole either. As
                // Kafka does, the later segments go and this one is the tail.
                for &later in &bases[i + 1..] {
                    std::fs::remove_file(log_path(dir, later))?;
                    let _ = std::fs::remove_file(index_path(dir, later));
                }
                let _ = std::fs::remove_file(index_path(dir, base));
                segments.push(s);
                break;
            }
            if !trusted {
                s.write_index(dir)?;
            }
            segments.push(s);
        }
        if segments.is_empty() {
            segments.push(Segment::create(dir, 0)?);
        }
        let last_publish = segments.last().map_or(i64::MIN, |s| s.max_ts);
        Ok(PartitionLog { dir: dir.to_owned(), segments, max_segment_bytes, last_publish, buf: Vec::new() })
    }

    fn tail(&mut self) -> &mut Segment {
        self.segments.last_mut().expect("a log always has a segment")
    }

    /// The first offset kept and the next one to be written.
    pub fn bounds(&self) -> (u64, u64) {
        let first = self.segments.first().expect("a segment").base;
        (first, self.segments.last().expect("a segment").next)
    }

    /// Appends `frames` as one batch with one `write`, stamping their offsets; returns the first.
    /// `publish_us` is the batch's time (raised to the last batch's if the clock went back).
    pub fn append(&mut self, frames: &mut [Frame], publish_us: i64) -> Result<u64, SegmentError> {
        let base = self.bounds().1;
        if frames.is_empty() {
            return Ok(base);
        }
        for (i, f) in frames.iter_mut().enumerate() {
            f.set_offset(base + i as u64);
        }
        let publish_us = publish_us.max(self.last_publish);
        let mut buf = std::mem::take(&mut self.buf);
        let h = encode(frames, base, publish_us, &mut buf);
        let (max, tail_size) = (self.max_segment_bytes, self.tail().size);
        if tail_size > 0 && tail_size + buf.len() as u64 > max {
            self.roll()?;
        }
        let written = {
            let tail = self.tail();
            let pos = tail.size;
            let r = tail.file.write_all_at(&buf, pos);
            if r.is_ok() {
                tail.note(&h, pos);
                tail.size += buf.len() as u64;
            }
            r
        };
        self.buf = buf;
        written?;
        self.last_publish = publish_us;
        Ok(base)
    }

    /// Seals the tail (its index written) and starts the next segment.
    fn roll(&mut self) -> Result<(), SegmentError> {
        let (dir, next) = (self.dir.clone(), self.bounds().1);
        self.tail().write_index(&dir)?;
        self.segments.push(Segment::create(&dir, next)?);
        Ok(())
    }

    /// Makes what was appended durable (durability `fsync`).
    pub fn sync(&self) -> Result<(), SegmentError> {
        self.segments.last().expect("a segment").file.sync_data()?;
        Ok(())
    }

    /// Up to `max` events from offset `from` (or the first kept, if later), stopping after the
    /// one that reaches `max_bytes`.
    pub fn read(&self, from: u64, max: usize, max_bytes: usize) -> Result<Vec<Frame>, SegmentError> {
        let (first, end) = self.bounds();
        let from = from.max(first);
        let mut out = Vec::new();
        let mut bytes = 0;
        let start = self.segments.partition_point(|s| s.base <= from).saturating_sub(1);
        let mut head = [0u8; HEADER];
        for s in &self.segments[start..] {
            let mut pos = s.seek(from);
            while pos < s.size && out.len() < max && bytes < max_bytes && from < end {
                s.file.read_exact_at(&mut head, pos)?;
                let h = BatchHeader::read(&head).ok_or_else(|| SegmentError::Corrupt {
                    path: s.path.display().to_string(),
                    reason: format!("no batch header at byte {pos}"),
                })?;
                if h.base + u64::from(h.count) > from {
                    let mut body = vec![0u8; h.total_len as usize - HEADER];
                    s.file.read_exact_at(&mut body, pos + HEADER as u64)?;
                    if crc32c::crc32c(&body) != h.body_crc {
                        let reason = format!("batch at offset {} fails its CRC", h.base);
                        return Err(SegmentError::Corrupt { path: s.path.display().to_string(), reason });
                    }
                    for f in frames_of(&body, &h, from.max(h.base), &s.path)? {
                        if out.len() >= max || bytes >= max_bytes {
                            break;
                        }
                        let (o, n) = (f.header().offset, f.as_bytes().len());
                        if o >= from {
                            bytes += n;
                            out.push(f);
                        }
                    }
                }
                pos += u64::from(h.total_len);
            }
            if out.len() >= max || bytes >= max_bytes {
                break;
            }
        }
        Ok(out)
    }

    /// The first offset whose batch was published at or after `ts_us` (the next offset if none).
    pub fn offset_for_time(&self, ts_us: i64) -> Result<u64, SegmentError> {
        let Some(s) = self.segments.iter().find(|s| s.max_ts >= ts_us) else { return Ok(self.bounds().1) };
        // The last entry before the time, then batch by batch.
        let i = s.index.partition_point(|e| e.ts < ts_us);
        let mut pos = s.index.get(i.saturating_sub(1)).map_or(0, |e| u64::from(e.pos));
        let mut head = [0u8; HEADER];
        while pos < s.size {
            s.file.read_exact_at(&mut head, pos)?;
            let Some(h) = BatchHeader::read(&head) else { break };
            if h.max_ts >= ts_us {
                return Ok(h.base);
            }
            pos += u64::from(h.total_len);
        }
        Ok(s.next)
    }

    /// Every segment, oldest first.
    pub fn segments(&self) -> Vec<SegmentInfo> {
        self.segments
            .iter()
            .map(|s| SegmentInfo { base: s.base, next: s.next, bytes: s.size, max_ts: s.max_ts })
            .collect()
    }

    /// Deletes the oldest sealed segments while `expired` says so (never the tail); how many.
    pub fn retain(&mut self, mut expired: impl FnMut(&SegmentInfo) -> bool) -> Result<usize, SegmentError> {
        let mut gone = 0;
        while self.segments.len() > 1 {
            let s = &self.segments[0];
            let info = SegmentInfo { base: s.base, next: s.next, bytes: s.size, max_ts: s.max_ts };
            if !expired(&info) {
                break;
            }
            let s = self.segments.remove(0);
            std::fs::remove_file(&s.path)?;
            let _ = std::fs::remove_file(index_path(&self.dir, s.base));
            gone += 1;
        }
        Ok(gone)
    }
}

#[cfg(test)]
mod tests;
