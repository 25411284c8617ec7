//! One segment file and what is known of it: its index entries, offsets and latest time, noted
//! batch by batch as it is written or walked; the walk from its start that cuts it at the first
//! batch that fails (recovery); its index file, loaded when consistent and written when the
//! segment is sealed; the seek to an offset's floor entry.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::format::{index_path, log_path, BatchHeader, Entry, SegmentError, ENTRY, HEADER, INDEX_INTERVAL};

/// One segment file and what is known of it.
pub(super) struct Segment {
    pub(super) base: u64,
    pub(super) path: PathBuf,
    /// Open while it is the tail (appends, syncs); a sealed segment is opened for each read, so
    /// a partition holds one descriptor however many segments it has.
    pub(super) file: Option<Arc<File>>,
    /// The bytes of the block holding the end, kept while the tail is written directly (a
    /// direct write writes them again in front of its batches).
    pub(super) block: Option<Vec<u8>>,
    /// The file holds zeros past `size` (a direct write's padding; cut when sealed).
    pub(super) padded: bool,
    pub(super) size: u64,
    /// The offset after its last event.
    pub(super) next: u64,
    /// Its latest time (the time index's last value).
    pub(super) max_ts: i64,
    pub(super) index: Vec<Entry>,
    /// Bytes written since the last index entry.
    pub(super) since_entry: u64,
}

impl Segment {
    pub(super) fn create(dir: &Path, base: u64) -> Result<Segment, SegmentError> {
        let path = log_path(dir, base);
        let file = OpenOptions::new().read(true).write(true).create_new(true).open(&path)?;
        Ok(Segment {
            base,
            path,
            file: Some(Arc::new(file)),
            block: Some(Vec::new()),
            padded: false,
            size: 0,
            next: base,
            max_ts: i64::MIN,
            index: Vec::new(),
            since_entry: 0,
        })
    }

    pub(super) fn reader(&self) -> io::Result<Arc<File>> {
        match &self.file {
            Some(f) => Ok(f.clone()),
            None => Ok(Arc::new(File::open(&self.path)?)),
        }
    }

    /// Lets go of its descriptor (and the end's block kept with it).
    pub(super) fn close(&mut self) {
        self.file = None;
        self.block = None;
    }

    pub(super) fn open_file(&self) -> &File {
        self.file.as_deref().expect("a segment being recovered or appended to is open")
    }

    pub(super) fn note(&mut self, h: &BatchHeader, pos: u64) {
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
    pub(super) fn scan(&mut self, gaps: bool) -> Result<(), SegmentError> {
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
        self.block = None;
        if cut {
            file.set_len(pos)?;
            file.sync_all()?;
        }
        Ok(())
    }

    /// Loads a sealed segment's index file, if it is consistent with the segment.
    pub(super) fn load_index(&mut self, dir: &Path, next: u64) -> Result<bool, SegmentError> {
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

    pub(super) fn write_index(&self, dir: &Path) -> Result<(), SegmentError> {
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
    pub(super) fn seek(&self, offset: u64) -> u64 {
        let rel = offset.saturating_sub(self.base);
        let i = self.index.partition_point(|e| u64::from(e.rel) <= rel);
        self.index.get(i.saturating_sub(1)).map_or(0, |e| u64::from(e.pos))
    }

    pub(super) fn info(&self) -> SegmentInfo {
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
