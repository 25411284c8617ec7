//! The segment log's bytes: a record batch (its header, its frames in the body), the index
//! entries and the files' names; the batch being built for a write; the log's errors.
//!
//! A record batch is what one append writes, with one `write`:
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

use std::io;
use std::path::{Path, PathBuf};

use frame_codec::Frame;

pub const MAGIC: [u8; 4] = *b"EMSB";
pub const HEADER: usize = 64;
pub(super) const ENTRY: usize = 16;
/// Bytes of batches between two index entries.
pub const INDEX_INTERVAL: u64 = 4096;
/// A staged batch is closed at this size and the frames staged after it start another: reading
/// one event reads and checks its whole batch.
pub const MAX_BATCH_BYTES: usize = 1 << 20;

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
pub(super) struct BatchHeader {
    pub(super) total_len: u32,
    pub(super) body_crc: u32,
    pub(super) base: u64,
    pub(super) publish_us: i64,
    pub(super) max_ts: i64,
    pub(super) count: u32,
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
    pub(super) fn read(b: &[u8]) -> Option<BatchHeader> {
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

pub(super) fn padded(n: usize) -> usize {
    n.div_ceil(8) * 8
}

/// A batch being built: room for its header, then its frames as they are added.
pub(super) struct Staged {
    pub(super) buf: Vec<u8>,
    base: u64,
    pub(super) count: u32,
    max_ts: i64,
}

impl Staged {
    pub(super) fn new() -> Staged {
        Staged { buf: vec![0; HEADER], base: 0, count: 0, max_ts: i64::MIN }
    }

    pub(super) fn clear(&mut self, base: u64) {
        self.buf.truncate(HEADER);
        self.base = base;
        self.count = 0;
        self.max_ts = i64::MIN;
    }

    /// Adds `frames` (offsets already stamped) to the body.
    pub(super) fn add(&mut self, frames: &[Frame]) {
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
    pub(super) fn finish(&mut self, publish_us: i64) -> BatchHeader {
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
pub(super) fn frames_of(
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
pub(super) fn decode(offset: u64, bytes: &[u8], path: &Path) -> Result<Frame, SegmentError> {
    Frame::decode(bytes).map_err(|e| SegmentError::Corrupt {
        path: path.display().to_string(),
        reason: format!("offset {offset}: {e}"),
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Entry {
    pub(super) rel: u32,
    pub(super) pos: u32,
    pub(super) ts: i64,
}

pub(super) fn log_path(dir: &Path, base: u64) -> PathBuf {
    dir.join(format!("{base:020}.log"))
}

pub(super) fn index_path(dir: &Path, base: u64) -> PathBuf {
    dir.join(format!("{base:020}.index"))
}

/// The file holding the log's first offset kept, when retention moved it into a segment.
pub(super) fn start_path(dir: &Path) -> PathBuf {
    dir.join("start")
}
