//! Segment writes that bypass the page cache: what a turn staged is laid out in a block-aligned
//! buffer ([`PartitionLog::prepare_direct`]), written with `O_DIRECT` by the caller through
//! io_uring on a descriptor of its own ([`PartitionLog::lend_direct`]), then noted in the
//! segment once the device took it ([`PartitionLog::complete_direct`]).
//!
//! O_DIRECT wants the buffer, the file position and the length aligned to the device's block.
//! A write starts at the block holding the segment's end: that block's bytes already written
//! (kept in memory while the tail is open, `Segment::block`) are written again in front of the
//! new batches, and the last block is padded with zeros. The file is therefore longer than the
//! segment while it is the tail: a zero header follows the last batch, which recovery stops at
//! (and cuts), and sealing cuts the padding before the index is written.
//!
//! One write per partition is in flight at a time (the embedded log's flushes take turns), and
//! it is invisible until it completes: readers see `size` and `next` as they were. Appends
//! staged meanwhile take the offsets after it (`in_flight`). If it fails, what was staged
//! after it fails too (their offsets would follow a hole): the next prepare answers them with
//! the error, the file is cut back to the segment's end, and the offsets are handed out again.
//! A file system that refuses O_DIRECT, at the open or at the write (EINVAL), is written
//! through the page cache from then on.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::Arc;

use super::file::Segment;
use super::format::{BatchHeader, SegmentError};
use super::log::{PartitionLog, Written, WrittenTo};

/// The alignment of a direct write's buffer, position and length: the largest logical block
/// size of the devices this runs on (512 and 4096 are both its divisors).
pub const BLOCK: usize = 4096;

/// What [`PartitionLog::prepare_direct`] made of what was staged.
pub enum Prepared {
    /// Written already, through the page cache (nothing staged, or the file system refuses
    /// O_DIRECT: tmpfs before Linux 6.6, some network file systems); what a sync has to make
    /// durable.
    Committed(WrittenTo),
    /// To be written by the caller, then given to [`PartitionLog::complete_direct`].
    Direct(DirectWrite),
}

/// One direct write: `buf[range]` (block-aligned in memory, a whole number of blocks) goes to
/// `pos` (block-aligned) of the segment, through the descriptor [`PartitionLog::lend_direct`]
/// gives.
pub struct DirectWrite {
    pub buf: Vec<u8>,
    pub range: std::ops::Range<usize>,
    pub pos: u64,
    /// The segment written to, its size once written, the batches and where each starts.
    base: u64,
    end: u64,
    batches: Vec<(BatchHeader, u64)>,
    publish_us: i64,
    /// The tail's file, for the sync (durability fsync), and the directory of a segment
    /// created for this write.
    sync: Option<Arc<File>>,
    created_in: Option<PathBuf>,
}

impl DirectWrite {
    /// Events it carries.
    fn events(&self) -> u64 {
        self.batches.iter().map(|(h, _)| u64::from(h.count)).sum()
    }

    /// Writes it with `pwrite` on this thread, through `file` (tests).
    pub fn write_blocking(&self, file: File) -> io::Result<()> {
        file.write_all_at(&self.buf[self.range.clone()], self.pos)
    }
}

fn round_up(n: u64) -> u64 {
    n.div_ceil(BLOCK as u64) * BLOCK as u64
}

fn open_direct(path: &std::path::Path) -> io::Result<File> {
    OpenOptions::new().write(true).custom_flags(libc::O_DIRECT).open(path)
}

impl Segment {
    /// The bytes of the block holding the end (read from the file when not kept).
    fn last_block(&mut self) -> io::Result<&[u8]> {
        if self.block.is_none() {
            let start = self.size & !(BLOCK as u64 - 1);
            let mut b = vec![0u8; (self.size - start) as usize];
            self.open_file().read_exact_at(&mut b, start)?;
            self.block = Some(b);
        }
        Ok(self.block.as_deref().expect("just kept"))
    }

    /// Cuts the zeros a direct write left past the end (sealing, or after a failed write).
    pub(super) fn unpad(&mut self) -> io::Result<()> {
        if self.padded {
            match &self.file {
                Some(f) => f.set_len(self.size)?,
                None => OpenOptions::new().write(true).open(&self.path)?.set_len(self.size)?,
            }
            self.padded = false;
        }
        Ok(())
    }
}

impl PartitionLog {
    /// Lays out everything staged (each batch's header written, rolling to a new segment first
    /// when the tail would pass the segment size) in `buf` for one direct write; with `sync`,
    /// the write keeps the tail's file for the sync after it. A log whose file system refuses
    /// O_DIRECT is written through the page cache instead, now and from then on. After a direct
    /// write failed, everything staged since fails with its error.
    pub fn prepare_direct(&mut self, publish_us: i64, mut buf: Vec<u8>, sync: bool) -> Result<Prepared, SegmentError> {
        debug_assert!(!self.gaps && self.in_flight == 0, "one direct write at a time, not on a mirror");
        if let Some(reason) = self.doomed.take() {
            self.drop_staged();
            return Err(io::Error::other(reason).into());
        }
        if !self.is_staged() || self.direct_refused {
            return self.commit(publish_us).map(Prepared::Committed);
        }
        let publish_us = publish_us.max(self.last_publish);
        let total: u64 = self.staged.iter().filter(|b| b.count > 0).map(|b| b.buf.len() as u64).sum();
        if total > u64::from(u32::MAX) {
            self.drop_staged();
            let reason = format!("a turn's batches of {total} bytes (4 GiB at most)");
            return Err(SegmentError::Corrupt { path: self.dir.display().to_string(), reason });
        }
        let tail = self.segments.last().expect("a segment");
        if tail.size > 0 && tail.size + total > self.max_segment_bytes {
            if let Err(e) = self.roll(self.bounds().1) {
                self.drop_staged();
                return Err(e);
            }
        }
        match self.takes_direct() {
            Ok(true) => {}
            Ok(false) => return self.commit(publish_us).map(Prepared::Committed),
            Err(e) => {
                self.drop_staged();
                return Err(e.into());
            }
        }
        let mut batches = std::mem::take(&mut self.staged);
        let tail = self.segments.last_mut().expect("a segment");
        let size = tail.size;
        let pos = size & !(BLOCK as u64 - 1);
        let len = round_up(size - pos + total) as usize;
        let block = match tail.last_block() {
            Ok(b) => b,
            Err(e) => {
                self.staged = batches;
                self.drop_staged();
                return Err(e.into());
            }
        };
        buf.clear();
        buf.reserve(len + BLOCK);
        // Within the capacity reserved: the data never moves once the aligned start is known.
        let at = buf.as_ptr().align_offset(BLOCK);
        buf.resize(at, 0);
        buf.extend_from_slice(block);
        let mut laid = Vec::with_capacity(batches.len());
        let mut end = size;
        for b in batches.iter_mut().filter(|b| b.count > 0) {
            laid.push((b.finish(publish_us), end));
            end += b.buf.len() as u64;
            buf.extend_from_slice(&b.buf);
        }
        buf.resize(at + len, 0);
        let (base, sync) = (tail.base, if sync { tail.file.clone() } else { None });
        batches.truncate(1);
        // Its next frame sets its base (the offsets after this write's).
        batches[0].clear(end);
        self.staged = batches;
        self.busy = true;
        let created_in = std::mem::take(&mut self.created).then(|| self.dir.clone());
        let w = DirectWrite { buf, range: at..at + len, pos, base, end, batches: laid, publish_us, sync, created_in };
        self.in_flight = w.events();
        Ok(Prepared::Direct(w))
    }

    /// A descriptor of the tail opened with O_DIRECT, for the write in flight (counted with the
    /// log's descriptors until [`PartitionLog::complete_direct`]).
    pub fn lend_direct(&mut self) -> io::Result<File> {
        debug_assert!(self.in_flight > 0 && !self.lent, "lent once, to the write prepared");
        let file = open_direct(&self.segments.last().expect("a segment").path)?;
        self.lent = true;
        self.recount();
        Ok(file)
    }

    /// Notes a direct write's batches in the segment once `result` says the device has them;
    /// returns what a sync has to make durable (when prepared with `sync`), and the write's
    /// buffer for the next one. A write the file system refused (EINVAL) is done again through
    /// the page cache, and so are the log's writes from then on.
    pub fn complete_direct(
        &mut self,
        mut w: DirectWrite,
        mut result: io::Result<()>,
    ) -> (Result<Option<Written>, SegmentError>, Vec<u8>) {
        self.in_flight = 0;
        self.lent = false;
        self.recount();
        let staged = self.is_staged();
        let tail = self.segments.last_mut().expect("a segment");
        debug_assert_eq!(tail.base, w.base, "nothing rolls while a direct write is in flight");
        if result.as_ref().is_err_and(|e| e.raw_os_error() == Some(libc::EINVAL)) {
            self.direct_refused = true;
            tail.padded = true;
            result = match tail.file.as_deref() {
                Some(f) => f.write_all_at(&w.buf[w.range.clone()], w.pos),
                None => OpenOptions::new()
                    .write(true)
                    .open(&tail.path)
                    .and_then(|f| f.write_all_at(&w.buf[w.range.clone()], w.pos)),
            };
        }
        if let Err(e) = result {
            if staged {
                self.doomed = Some(format!("an earlier write of this partition failed: {e}"));
            }
            self.created |= w.created_in.is_some();
            // What the failed write left past the end goes: a later write ending on a block
            // boundary must not find a stale batch after it that recovery would take.
            tail.padded = true;
            let _ = tail.unpad();
            return (Err(e.into()), w.buf);
        }
        for &(h, pos) in &w.batches {
            tail.note(&h, pos);
        }
        tail.size = w.end;
        tail.padded = true;
        let kept = (w.end & !(BLOCK as u64 - 1)) - w.pos;
        let bytes = &w.buf[w.range.start + kept as usize..w.range.start + (w.end - w.pos) as usize];
        let block = tail.block.get_or_insert_with(Vec::new);
        block.clear();
        block.extend_from_slice(bytes);
        self.last_publish = w.publish_us;
        self.busy = true;
        let written = w.sync.take().map(|file| Written { file, created_in: w.created_in.take() });
        (Ok(written), std::mem::take(&mut w.buf))
    }

    /// Whether the tail's file system takes O_DIRECT (asked once: the log is written through
    /// the page cache from then on when not); the tail's file is open after it.
    fn takes_direct(&mut self) -> io::Result<bool> {
        let tail = self.segments.last_mut().expect("a segment");
        if tail.file.is_none() {
            tail.file = Some(Arc::new(OpenOptions::new().read(true).write(true).open(&tail.path)?));
            self.recount();
        }
        if !self.direct_known {
            let tail = self.segments.last().expect("a segment");
            match open_direct(&tail.path) {
                Ok(_) => self.direct_known = true,
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => self.direct_refused = true,
                Err(e) => return Err(e),
            }
        }
        Ok(!self.direct_refused)
    }

    /// Drops what is staged (its appends fail): the offsets are handed out again.
    fn drop_staged(&mut self) {
        self.staged.truncate(1);
        let end = self.bounds().1;
        self.staged[0].clear(end);
        self.recount();
    }
}
