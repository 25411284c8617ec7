//! [`PartitionLog`], one partition's segment log: opened (its last segments recovered, see
//! `file`), appends staged and committed (one `write` a batch, rolling to a new segment past the
//! segment size), a mirror's frames written at their own offsets, the tail's descriptor opened
//! and closed, and retention (whole sealed segments, and the first offset kept).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use frame_codec::Frame;

use super::file::{Segment, SegmentInfo};
use super::format::{index_path, log_path, start_path, BatchHeader, SegmentError, Staged, MAX_BATCH_BYTES};

/// One partition's segment log.
///
/// Appends are staged ([`PartitionLog::stage`]: offsets handed out, frames copied into the
/// batch being built) and written by [`PartitionLog::commit`], one `write` for everything staged
/// since the last commit: the embedded log commits once per turn of its shard's event loop.
/// Readers see committed events only.
pub struct PartitionLog {
    pub(super) dir: PathBuf,
    pub(super) segments: Vec<Segment>,
    pub(super) max_segment_bytes: u64,
    /// The latest publish time written (batches' times never go back).
    pub(super) last_publish: i64,
    /// The batches being built (one, unless the frames staged in a turn pass
    /// [`MAX_BATCH_BYTES`]).
    pub(super) staged: Vec<Staged>,
    /// A mirror of a log whose offsets may skip (the Kafka backend's local copy).
    pub(super) gaps: bool,
    /// The first offset kept (retention moves it; whole segments below it are deleted).
    start: u64,
    /// The first offset kept in a tier (`storage::tier`): offsets from it up to the first local
    /// segment are read from there. `None`: everything kept is local.
    floor: Option<u64>,
    /// A segment file was created since the last commit: its directory entry needs a sync too.
    pub(super) created: bool,
    /// Written to since the last [`PartitionLog::close_if_idle`].
    pub(super) busy: bool,
    /// The process-wide count of open tail descriptors this log's are counted in (the
    /// descriptor budget of `partitions::PartitionLogs`), and how many it counts there now.
    tally: Option<Arc<AtomicUsize>>,
    counted: usize,
    /// Events of the direct write in flight (`direct`): staged appends take the offsets after.
    pub(super) in_flight: u64,
    /// That write holds a descriptor of its own (`lend_direct`: counted too).
    pub(super) lent: bool,
    /// The file system took an O_DIRECT open (asked once).
    pub(super) direct_known: bool,
    /// Why what is staged fails at the next prepare (a direct write before it failed).
    pub(super) doomed: Option<String>,
    /// The file system refused O_DIRECT: written through the page cache.
    pub(super) direct_refused: bool,
}

impl Drop for PartitionLog {
    fn drop(&mut self) {
        if let Some(t) = &self.tally {
            t.fetch_sub(self.counted, Ordering::Relaxed);
        }
    }
}

/// What a commit wrote to: what a sync has to make durable.
pub struct Written {
    pub file: Arc<File>,
    /// The partition's directory, when the write went to a segment created since the last one.
    pub created_in: Option<PathBuf>,
}

/// What one commit wrote to: nearly always one file (two when it rolled a segment), so kept
/// without an allocation (a commit per publish while the core has time).
pub type WrittenTo = smallvec::SmallVec<[Written; 1]>;

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
                block: None,
                padded: false,
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
            s.close();
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
            floor: None,
            created: true,
            busy: false,
            tally: None,
            counted: 0,
            in_flight: 0,
            lent: false,
            direct_known: false,
            doomed: None,
            direct_refused: false,
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

    /// Brings the tally in line with the descriptors open now: the tail's file, and the one a
    /// direct write in flight holds.
    pub(super) fn recount(&mut self) {
        let tail = self.segments.last().expect("a segment");
        let open = usize::from(tail.file.is_some()) + usize::from(self.lent);
        if let (true, Some(t)) = (open != self.counted, &self.tally) {
            if open > self.counted {
                t.fetch_add(open - self.counted, Ordering::Relaxed);
            } else {
                t.fetch_sub(self.counted - open, Ordering::Relaxed);
            }
            self.counted = open;
        }
    }

    fn tail(&mut self) -> &mut Segment {
        self.segments.last_mut().expect("a log always has a segment")
    }

    /// The first offset kept (in a tier, or here) and the next one to be written (staged
    /// appends not counted).
    pub fn bounds(&self) -> (u64, u64) {
        let here = self.segments.first().expect("a segment").base;
        let first = self.floor.map_or(here, |f| f.min(here)).max(self.start);
        (first, self.segments.last().expect("a segment").next)
    }

    /// The first offset kept on this disk: reads below it go to the tier.
    pub fn local_start(&self) -> u64 {
        self.segments.first().expect("a segment").base.max(self.start)
    }

    /// Where the tier's copy of this partition starts (`None`: no tier holds any of it).
    pub fn set_floor(&mut self, floor: Option<u64>) {
        self.floor = floor;
    }

    /// A log that a tier holds history of up to `next` and that ends before it (found empty:
    /// a restart with an empty disk; or cut shorter by recovery than what was uploaded, after
    /// a power loss): every local segment goes (the tier has their events) and offsets go on
    /// from `next`, never handing out the tier's offsets again.
    pub fn continue_at(&mut self, next: u64) -> Result<(), SegmentError> {
        if self.bounds().1 >= next || self.is_staged() || self.in_flight > 0 {
            return Ok(());
        }
        self.roll(next)?;
        self.retain(|_| true)?;
        Ok(())
    }

    /// The directory and the sealed segments (every one but the tail), oldest first: what a
    /// tier uploads. Their bytes never change; retention may delete them.
    pub fn sealed(&self) -> (PathBuf, Vec<SegmentInfo>) {
        let n = self.segments.len() - 1;
        let sealed = self.segments[..n].iter().filter(|s| s.size > 0).map(Segment::info).collect();
        (self.dir.clone(), sealed)
    }

    /// Deletes the local copies of the oldest sealed segments a tier holds (`uploaded` says
    /// which: exactly this segment is in the bucket) while the local segments pass
    /// `keep_bytes` or the segment's newest event is older than `older_than_us`; never the
    /// tail. How many went. The floor must be set first: the offsets stay readable, from the
    /// tier.
    pub fn drop_uploaded(
        &mut self,
        uploaded: impl Fn(&SegmentInfo) -> bool,
        keep_bytes: Option<u64>,
        older_than_us: Option<i64>,
    ) -> Result<usize, SegmentError> {
        if self.floor.is_none() {
            return Ok(0);
        }
        let mut local: u64 = self.segments.iter().map(|s| s.size).sum();
        self.retain(|s| {
            let over = keep_bytes.is_some_and(|k| local > k) || older_than_us.is_some_and(|t| s.max_ts < t);
            let go = over && uploaded(s);
            if go {
                local -= s.bytes;
            }
            go
        })
    }

    /// The offset the next staged event will get.
    pub fn next_offset(&self) -> u64 {
        self.bounds().1 + self.in_flight + self.staged.iter().map(|b| u64::from(b.count)).sum::<u64>()
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
    pub fn commit(&mut self, publish_us: i64) -> Result<WrittenTo, SegmentError> {
        let publish_us = publish_us.max(self.last_publish);
        let mut batches = std::mem::take(&mut self.staged);
        let mut written = WrittenTo::new();
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
        // The end's block kept for direct writes would no longer be the file's.
        tail.block = None;
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
    pub(super) fn roll(&mut self, base: u64) -> Result<(), SegmentError> {
        let dir = self.dir.clone();
        if self.tail().size > 0 {
            self.tail().unpad()?;
            self.tail().write_index(&dir)?;
            // Sealed: its descriptor goes before the next segment's is taken (the next write
            // opens it again should that fail).
            self.tail().close();
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
        self.tail().close();
        self.recount();
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
