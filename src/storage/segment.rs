//! A partition's events as a log of segment files: the format, appends, reads by offset and by
//! time, crash recovery and retention. The embedded log keeps every topic's events here (lite
//! topics excepted, see `embedded`), and so does the Kafka backend's local copy.
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
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use frame_codec::Frame;

pub const MAGIC: [u8; 4] = *b"EMSB";
pub const HEADER: usize = 64;
const ENTRY: usize = 16;
/// Bytes of batches between two index entries.
pub const INDEX_INTERVAL: u64 = 4096;
/// A staged batch is closed at this size and the frames staged after it start another: reading
/// one event reads and checks its whole batch.
pub const MAX_BATCH_BYTES: usize = 1 << 20;
/// Batches a read by time opens at most.
pub const TIME_SCAN: usize = 4096;

/// A segment log's failures.
#[derive(Debug, thiserror::Error)]
pub enum SegmentError {
    #[error("segment log: {0}")]
    Io(#[from] io::Error),
    #[error("segment log {path}: {reason}")]
    Corrupt { path: String, reason: String },
}

impl SegmentError {
    /// Whether the process (or the system) is out of file descriptors.
    pub fn out_of_descriptors(&self) -> bool {
        matches!(self, SegmentError::Io(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)))
    }
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

/// A batch being built: room for its header, then its frames as they are added.
struct Staged {
    buf: Vec<u8>,
    base: u64,
    count: u32,
    max_ts: i64,
}

impl Staged {
    fn new() -> Staged {
        Staged { buf: vec![0; HEADER], base: 0, count: 0, max_ts: i64::MIN }
    }

    fn clear(&mut self, base: u64) {
        self.buf.truncate(HEADER);
        self.base = base;
        self.count = 0;
        self.max_ts = i64::MIN;
    }

    /// Adds `frames` (offsets already stamped) to the body.
    fn add(&mut self, frames: &[Frame]) {
        for f in frames {
            let bytes = f.as_bytes();
            self.buf.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
            self.buf.extend_from_slice(&[0; 4]);
            self.buf.extend_from_slice(bytes);
            self.buf.resize(padded(self.buf.len()), 0);
            self.max_ts = self.max_ts.max(f.header().timestamp_us);
        }
        self.count += frames.len() as u32;
    }

    /// Writes the header in front of the body: the batch is ready to be written.
    fn finish(&mut self, publish_us: i64) -> BatchHeader {
        let h = BatchHeader {
            total_len: self.buf.len() as u32,
            body_crc: crc32c::crc32c(&self.buf[HEADER..]),
            base: self.base,
            publish_us,
            max_ts: self.max_ts.max(publish_us),
            count: self.count,
        };
        h.write(&mut self.buf[..HEADER]);
        h
    }
}

/// Walks the frames of a batch body (checked by its CRC) from offset `from` on, handing each
/// one's offset and bytes to `each` until it says stop (`false`): what is not wanted is neither
/// decoded nor copied.
fn frames_of(
    body: &[u8],
    h: &BatchHeader,
    from: u64,
    path: &Path,
    mut each: impl FnMut(u64, &[u8]) -> Result<bool, SegmentError>,
) -> Result<(), SegmentError> {
    let corrupt = |reason: String| SegmentError::Corrupt { path: path.display().to_string(), reason };
    let mut at = 0;
    for i in 0..u64::from(h.count) {
        let len = body.get(at..at + 4).map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize);
        let Some(bytes) = len.and_then(|len| body.get(at + 8..at + 8 + len)) else {
            return Err(corrupt(format!("batch at offset {} is cut short", h.base)));
        };
        if h.base + i >= from && !each(h.base + i, bytes)? {
            break;
        }
        at = padded(at + 8 + bytes.len());
    }
    Ok(())
}

/// A stored frame, validated.
fn decode(offset: u64, bytes: &[u8], path: &Path) -> Result<Frame, SegmentError> {
    Frame::decode(bytes).map_err(|e| SegmentError::Corrupt {
        path: path.display().to_string(),
        reason: format!("offset {offset}: {e}"),
    })
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
    /// Open while it is the tail (appends, syncs); a sealed segment is opened for each read, so
    /// a partition holds one descriptor however many segments it has.
    file: Option<Arc<File>>,
    size: u64,
    /// The offset after its last event.
    next: u64,
    /// Its latest time (the time index's last value).
    max_ts: i64,
    index: Vec<Entry>,
    /// Bytes written since the last index entry.
    since_entry: u64,
}

/// A read of a partition's log planned under its mutex ([`PartitionLog::plan_read`]) and done
/// without it. It sees the log as it was when planned: the bytes below each segment's planned
/// size never change (appends, and a write retried after a failed one, only write past them).
pub struct ReadPlan {
    from: u64,
    segments: Vec<Planned>,
}

/// One segment of a [`ReadPlan`]: the tail's open file, or a sealed segment's path.
struct Planned {
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

fn log_path(dir: &Path, base: u64) -> PathBuf {
    dir.join(format!("{base:020}.log"))
}

fn index_path(dir: &Path, base: u64) -> PathBuf {
    dir.join(format!("{base:020}.index"))
}

/// The file holding the log's first offset kept, when retention moved it into a segment.
fn start_path(dir: &Path) -> PathBuf {
    dir.join("start")
}

impl Segment {
    fn create(dir: &Path, base: u64) -> Result<Segment, SegmentError> {
        let path = log_path(dir, base);
        let file = OpenOptions::new().read(true).write(true).create_new(true).open(&path)?;
        Ok(Segment {
            base,
            path,
            file: Some(Arc::new(file)),
            size: 0,
            next: base,
            max_ts: i64::MIN,
            index: Vec::new(),
            since_entry: 0,
        })
    }

    fn reader(&self) -> io::Result<Arc<File>> {
        match &self.file {
            Some(f) => Ok(f.clone()),
            None => Ok(Arc::new(File::open(&self.path)?)),
        }
    }

    fn open_file(&self) -> &File {
        self.file.as_deref().expect("a segment being recovered or appended to is open")
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
    /// that fails: what follows the last whole batch was never acknowledged. With `gaps` (a
    /// mirror of a log whose offsets may skip), a batch may start past the offset expected.
    fn scan(&mut self, gaps: bool) -> Result<(), SegmentError> {
        let file = self.file.clone().expect("open for recovery");
        let len = file.metadata()?.len();
        let (mut pos, mut expected) = (0u64, self.base);
        let mut head = [0u8; HEADER];
        self.index.clear();
        self.since_entry = 0;
        let cut = loop {
            if pos + HEADER as u64 > len {
                break pos < len;
            }
            file.read_exact_at(&mut head, pos)?;
            let Some(h) = BatchHeader::read(&head) else { break true };
            let in_order = if gaps { h.base >= expected } else { h.base == expected };
            if !in_order || pos + u64::from(h.total_len) > len {
                break true;
            }
            let mut body = vec![0u8; h.total_len as usize - HEADER];
            file.read_exact_at(&mut body, pos + HEADER as u64)?;
            if crc32c::crc32c(&body) != h.body_crc {
                break true;
            }
            self.note(&h, pos);
            expected = self.next;
            pos += u64::from(h.total_len);
        };
        self.size = pos;
        if cut {
            file.set_len(pos)?;
            file.sync_all()?;
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
            self.open_file().read_exact_at(&mut head, pos)?;
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

    fn info(&self) -> SegmentInfo {
        SegmentInfo { base: self.base, next: self.next, bytes: self.size, max_ts: self.max_ts }
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
///
/// Appends are staged ([`PartitionLog::stage`]: offsets handed out, frames copied into the
/// batch being built) and written by [`PartitionLog::commit`], one `write` for everything staged
/// since the last commit: the embedded log commits once per turn of its shard's event loop.
/// Readers see committed events only.
pub struct PartitionLog {
    dir: PathBuf,
    segments: Vec<Segment>,
    max_segment_bytes: u64,
    /// The latest publish time written (batches' times never go back).
    last_publish: i64,
    /// The batches being built (one, unless the frames staged in a turn pass
    /// [`MAX_BATCH_BYTES`]).
    staged: Vec<Staged>,
    /// A mirror of a log whose offsets may skip (the Kafka backend's local copy).
    gaps: bool,
    /// The first offset kept (retention moves it; whole segments below it are deleted).
    start: u64,
    /// A segment file was created since the last commit: its directory entry needs a sync too.
    created: bool,
    /// Written to since the last [`PartitionLog::close_if_idle`].
    busy: bool,
    /// The process-wide count of open tail files this log's is counted in (the descriptor
    /// budget of `partitions::PartitionLogs`), and whether it is counted there now.
    tally: Option<Arc<AtomicUsize>>,
    counted: bool,
}

impl Drop for PartitionLog {
    fn drop(&mut self) {
        if let (true, Some(t)) = (self.counted, &self.tally) {
            t.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// What a commit wrote to: what a sync has to make durable.
pub struct Written {
    pub file: Arc<File>,
    /// The partition's directory, when the write went to a segment created since the last one.
    pub created_in: Option<PathBuf>,
}

impl PartitionLog {
    /// Opens (or creates) the log in `dir`, recovering its last segment.
    pub fn open(dir: &Path, max_segment_bytes: u64) -> Result<PartitionLog, SegmentError> {
        Self::open_as(dir, max_segment_bytes, false)
    }

    /// Opens (or creates) a log whose batches carry offsets of another log: they only increase,
    /// and may skip (Kafka's compacted topics and transaction markers leave gaps). Written with
    /// [`PartitionLog::write_at`].
    pub fn open_mirror(dir: &Path, max_segment_bytes: u64) -> Result<PartitionLog, SegmentError> {
        Self::open_as(dir, max_segment_bytes, true)
    }

    fn open_as(dir: &Path, max_segment_bytes: u64, gaps: bool) -> Result<PartitionLog, SegmentError> {
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
            let mut s = Segment {
                base,
                path,
                file: Some(Arc::new(file)),
                size,
                next: base,
                max_ts: i64::MIN,
                index: Vec::new(),
                since_entry: 0,
            };
            let next = bases.get(i + 1).copied();
            // The tail, and the segment sealed last (a crash may have come right after the roll),
            // are checked batch by batch; an older one is trusted when its index file is
            // consistent, and checked the same way when not.
            let recent = i + 2 >= bases.len();
            let trusted = !recent && s.load_index(dir, next.expect("not the tail"))?;
            if !trusted {
                s.scan(gaps)?;
            }
            let Some(next) = next else {
                segments.push(s);
                break;
            };
            let whole = if gaps { s.next <= next } else { s.next == next };
            if !whole {
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
            s.file = None;
            segments.push(s);
        }
        if segments.is_empty() {
            segments.push(Segment::create(dir, 0)?);
        }
        let last_publish = segments.last().map_or(i64::MIN, |s| s.max_ts);
        let mut log = PartitionLog {
            dir: dir.to_owned(),
            segments,
            max_segment_bytes,
            last_publish,
            staged: vec![Staged::new()],
            gaps,
            start: 0,
            created: true,
            busy: false,
            tally: None,
            counted: false,
        };
        let saved = std::fs::read(start_path(dir)).ok().and_then(|b| Some(u64::from_le_bytes(b.try_into().ok()?)));
        log.start = saved.unwrap_or(0).min(log.bounds().1);
        Ok(log)
    }

    /// Counts this log's open tail file in `tally` from now on (kept true as the file is
    /// opened and closed).
    pub fn count_files_in(&mut self, tally: Arc<AtomicUsize>) {
        self.tally = Some(tally);
        self.recount();
    }

    /// Whether the tail's file is open (a descriptor held).
    pub fn holds_file(&self) -> bool {
        self.segments.last().is_some_and(|s| s.file.is_some())
    }

    /// Brings the tally in line with whether the tail's file is open now.
    fn recount(&mut self) {
        let open = self.holds_file();
        if let (true, Some(t)) = (open != self.counted, &self.tally) {
            if open {
                t.fetch_add(1, Ordering::Relaxed);
            } else {
                t.fetch_sub(1, Ordering::Relaxed);
            }
            self.counted = open;
        }
    }

    fn tail(&mut self) -> &mut Segment {
        self.segments.last_mut().expect("a log always has a segment")
    }

    /// The first offset kept and the next one to be written (staged appends not counted).
    pub fn bounds(&self) -> (u64, u64) {
        let first = self.segments.first().expect("a segment").base.max(self.start);
        (first, self.segments.last().expect("a segment").next)
    }

    /// The offset the next staged event will get.
    pub fn next_offset(&self) -> u64 {
        self.bounds().1 + self.staged.iter().map(|b| u64::from(b.count)).sum::<u64>()
    }

    /// Whether appends are staged and not yet committed.
    pub fn is_staged(&self) -> bool {
        self.staged.iter().any(|b| b.count > 0)
    }

    /// Appends `frames` as one batch with one `write`, stamping their offsets; returns the first.
    /// `publish_us` is the batch's time (raised to the last batch's if the clock went back).
    pub fn append(&mut self, frames: &mut [Frame], publish_us: i64) -> Result<u64, SegmentError> {
        let base = self.stage(frames);
        self.commit(publish_us)?;
        Ok(base)
    }

    /// Stamps `frames` with the next offsets and adds them to the batch the next
    /// [`PartitionLog::commit`] writes; returns the first offset.
    pub fn stage(&mut self, frames: &mut [Frame]) -> u64 {
        let base = self.next_offset();
        for (i, f) in frames.iter_mut().enumerate() {
            f.set_offset(base + i as u64);
        }
        for f in frames.iter() {
            self.stage_one(f);
        }
        base
    }

    /// Adds one frame (its offset stamped) to the batch being built, starting another when it
    /// would pass [`MAX_BATCH_BYTES`].
    fn stage_one(&mut self, f: &Frame) {
        let cur = self.staged.last_mut().expect("a batch is always being built");
        if cur.count > 0 && cur.buf.len() + 8 + f.as_bytes().len() > MAX_BATCH_BYTES {
            self.staged.push(Staged::new());
        }
        let cur = self.staged.last_mut().expect("a batch is always being built");
        if cur.count == 0 {
            cur.clear(f.header().offset);
        }
        cur.add(std::slice::from_ref(f));
    }

    /// Writes what was staged, each batch with one `write` (rolling to a new segment first when
    /// the tail would pass the segment size). Returns what was written to, for a sync. On an
    /// error the batches not written are dropped: their offsets are handed out again (batches
    /// written before the failing one stay: their appends fail, and their events are there).
    pub fn commit(&mut self, publish_us: i64) -> Result<Vec<Written>, SegmentError> {
        let publish_us = publish_us.max(self.last_publish);
        let mut batches = std::mem::take(&mut self.staged);
        let mut written: Vec<Written> = Vec::new();
        let mut result = Ok(());
        for b in batches.iter_mut().filter(|b| b.count > 0) {
            let h = b.finish(publish_us);
            match self.write_batch(&h, &b.buf) {
                Ok(w) if written.last().is_some_and(|l| Arc::ptr_eq(&l.file, &w.file) && w.created_in.is_none()) => {}
                Ok(w) => written.push(w),
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
            self.last_publish = publish_us;
        }
        batches.truncate(1);
        batches[0].clear(self.bounds().1);
        self.staged = batches;
        self.recount();
        result.map(|()| written)
    }

    fn write_batch(&mut self, h: &BatchHeader, buf: &[u8]) -> Result<Written, SegmentError> {
        if u32::try_from(buf.len()).is_err() {
            let reason = format!("a batch of {} bytes (4 GiB at most)", buf.len());
            return Err(SegmentError::Corrupt { path: self.dir.display().to_string(), reason });
        }
        let (max, tail) = (self.max_segment_bytes, self.segments.last().expect("a segment"));
        if tail.size > 0 && tail.size + buf.len() as u64 > max {
            self.roll(self.bounds().1)?;
        }
        // A mirror's batch past what a segment's 32-bit relative offsets reach (or past an
        // empty tail's name) starts a segment named by its own offset.
        let tail = self.segments.last().expect("a segment");
        if h.base - tail.base > u64::from(u32::MAX) || (tail.size == 0 && h.base != tail.base) {
            self.roll(h.base)?;
        }
        self.busy = true;
        let tail = self.tail();
        if tail.file.is_none() {
            tail.file = Some(Arc::new(OpenOptions::new().read(true).write(true).open(&tail.path)?));
        }
        let pos = tail.size;
        tail.open_file().write_all_at(buf, pos)?;
        tail.note(h, pos);
        tail.size += buf.len() as u64;
        let file = tail.file.clone().expect("the tail is open");
        let created_in = std::mem::take(&mut self.created).then(|| self.dir.clone());
        Ok(Written { file, created_in })
    }

    /// Stores frames that carry their offsets already (a mirror's): increasing, at or past the
    /// end, each run of consecutive offsets as one batch. Only a log opened with
    /// [`PartitionLog::open_mirror`] takes offsets past its end.
    pub fn write_at(&mut self, frames: &[Frame], publish_us: i64) -> Result<(), SegmentError> {
        debug_assert!(!self.is_staged(), "a mirror does not stage");
        let mut rest = frames;
        while let Some(first) = rest.first() {
            let base = first.header().offset;
            let end = self.bounds().1;
            if base < end || (base > end && !self.gaps) {
                let reason = format!("offset {base} written at end {end}");
                return Err(SegmentError::Corrupt { path: self.dir.display().to_string(), reason });
            }
            let run = 1 + rest.windows(2).take_while(|w| w[1].header().offset == w[0].header().offset + 1).count();
            for f in &rest[..run] {
                self.stage_one(f);
            }
            self.commit(publish_us)?;
            rest = &rest[run..];
        }
        Ok(())
    }

    /// Seals the tail (its index written) and starts the next segment at `base`; an empty tail
    /// is replaced instead (a mirror's first batch far past 0).
    fn roll(&mut self, base: u64) -> Result<(), SegmentError> {
        let dir = self.dir.clone();
        if self.tail().size > 0 {
            self.tail().write_index(&dir)?;
            // Sealed: its descriptor goes before the next segment's is taken (the next write
            // opens it again should that fail).
            self.tail().file = None;
        }
        // Made before the tail is dropped: a failure (out of descriptors, say) leaves the log
        // as it was, never without a segment.
        let next = Segment::create(&dir, base)?;
        if self.tail().size == 0 {
            let empty = self.segments.pop().expect("a segment");
            // Only a mirror replaces an empty tail (its next batch is far past it); an empty
            // file left behind if this fails reads back as an empty segment, harmless there.
            let _ = std::fs::remove_file(&empty.path);
        }
        self.segments.push(next);
        self.created = true;
        Ok(())
    }

    /// Makes what was appended durable (durability `fsync`).
    pub fn sync(&self) -> Result<(), SegmentError> {
        self.segments.last().expect("a segment").reader()?.sync_data()?;
        Ok(())
    }

    /// Closes the tail's file if nothing was written since the last call (the next write opens
    /// it again): descriptors stay with the partitions in use. Whether it is closed now.
    pub fn close_if_idle(&mut self) -> bool {
        if std::mem::take(&mut self.busy) {
            return false;
        }
        self.close_file();
        true
    }

    /// Closes the tail's file whatever its use: the next write (a commit of what is staged
    /// too) opens it again, a read opens it for that read. Readers that planned a read before
    /// keep their own handle.
    pub fn close_file(&mut self) {
        self.tail().file.take();
        self.recount();
    }

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

    /// Every segment, oldest first.
    pub fn segments(&self) -> Vec<SegmentInfo> {
        self.segments.iter().map(Segment::info).collect()
    }

    /// The bytes of its segments and the events in them, for an average event size.
    pub fn size(&self) -> (u64, u64) {
        let bytes = self.segments.iter().map(|s| s.size).sum();
        let first = self.segments.first().expect("a segment").base;
        (bytes, self.bounds().1 - first)
    }

    /// Deletes the oldest sealed segments while `expired` says so (never the tail); how many.
    pub fn retain(&mut self, mut expired: impl FnMut(&SegmentInfo) -> bool) -> Result<usize, SegmentError> {
        let mut gone = 0;
        while self.segments.len() > 1 && expired(&self.segments[0].info()) {
            let s = self.segments.remove(0);
            std::fs::remove_file(&s.path)?;
            let _ = std::fs::remove_file(index_path(&self.dir, s.base));
            gone += 1;
        }
        Ok(gone)
    }

    /// Moves the first offset kept up to `offset` (at most the end), saved beside the segments,
    /// and deletes the segments wholly below it. Returns how many events it dropped.
    pub fn set_start(&mut self, offset: u64) -> Result<u64, SegmentError> {
        let (first, end) = self.bounds();
        let offset = offset.min(end);
        if offset <= first {
            return Ok(0);
        }
        // Written whole, synced, then renamed over the old one and the rename synced: after a
        // crash the file says the old first offset or the new one, never less than was dropped.
        let tmp = self.dir.join("start.tmp");
        let mut f = File::create(&tmp)?;
        std::io::Write::write_all(&mut f, &offset.to_le_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, start_path(&self.dir))?;
        File::open(&self.dir)?.sync_all()?;
        self.start = offset;
        self.retain(|s| s.next <= offset)?;
        Ok(offset - first)
    }
}

#[cfg(test)]
mod tests;
