//! Direct (O_DIRECT) segment writes: laid out, written and noted as the embedded log's io_uring
//! flush does it, with `pwrite` standing in for io_uring.

use super::tests::{frame, frames, ids, offsets};
use super::*;

/// A directory on a file system that takes O_DIRECT (tmpfs did not before Linux 6.6).
fn dir(name: &str) -> PathBuf {
    let name = format!("evmesh-direct-{name}-{}", std::process::id());
    let roots = [std::env::temp_dir(), PathBuf::from("/var/tmp"), PathBuf::from(env!("CARGO_MANIFEST_DIR"))];
    for root in roots {
        let d = root.join(&name);
        let _ = std::fs::remove_dir_all(&d);
        if std::fs::create_dir_all(&d).is_err() {
            continue;
        }
        let probe = d.join("probe");
        let direct = std::os::unix::fs::OpenOptionsExt::custom_flags(
            std::fs::OpenOptions::new().write(true).create(true),
            libc::O_DIRECT,
        )
        .open(&probe)
        .is_ok();
        let _ = std::fs::remove_file(&probe);
        if direct {
            return d;
        }
        let _ = std::fs::remove_dir_all(&d);
    }
    panic!("no directory here takes O_DIRECT (tried the temp dir, /var/tmp and the checkout)");
}

/// One turn: `fs` staged, laid out and written directly; the log's answer.
fn turn(log: &mut PartitionLog, fs: &mut [Frame], now: i64) -> Result<u64, SegmentError> {
    let first = log.stage(fs);
    match log.prepare_direct(now, Vec::new(), true)? {
        Prepared::Direct(w) => {
            assert_eq!(w.pos % BLOCK as u64, 0);
            assert_eq!((w.buf[w.range.clone()].as_ptr() as usize) % BLOCK, 0, "the buffer is aligned");
            assert_eq!(w.range.len() % BLOCK, 0);
            write(log, w)?;
        }
        Prepared::Committed(_) => panic!("written through the page cache"),
    }
    Ok(first)
}

/// What was staged, laid out for one direct write (with `sync`: keeping the file to sync).
fn prepared(log: &mut PartitionLog, now: i64, sync: bool) -> DirectWrite {
    match log.prepare_direct(now, Vec::new(), sync) {
        Ok(Prepared::Direct(w)) => w,
        _ => panic!("a direct write"),
    }
}

/// Writes a prepared write through a descriptor the log lends, and completes it.
fn write(log: &mut PartitionLog, w: DirectWrite) -> Result<(), SegmentError> {
    let result = w.write_blocking(log.lend_direct().unwrap());
    log.complete_direct(w, result).0.map(|written| assert!(written.is_some(), "prepared with sync"))
}

fn file_len(d: &Path, base: u64) -> u64 {
    std::fs::metadata(log_path(d, base)).unwrap().len()
}

/// Batches of every size, across block boundaries, read back in order; the file is whole
/// blocks with zeros past the end while it is the tail, and reopens cut to its batches.
#[test]
fn direct_turns_read_back_and_reopen_cut_to_their_batches() {
    let d = dir("rw");
    let tally = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut log = PartitionLog::open(&d, 1 << 20).unwrap();
    log.count_files_in(tally.clone());
    let mut expected = Vec::new();
    for (i, n) in [1usize, 3, 1, 7, 2, 1, 12].into_iter().enumerate() {
        let mut fs: Vec<Frame> = (0..n).map(|j| frame(&format!("t{i}-{j}"), 100 + 700 * j + 37 * i, 5)).collect();
        expected.extend(ids(&fs));
        assert_eq!(turn(&mut log, &mut fs, 10 + i as i64).unwrap(), (expected.len() - n) as u64);
        assert_eq!(ids(&log.read(0, 1000, usize::MAX).unwrap()), expected, "readable once written");
    }
    assert_eq!(tally.load(std::sync::atomic::Ordering::Relaxed), 1, "the tail's file");
    let size = log.segments.last().unwrap().size;
    let len = file_len(&d, 0);
    assert!(len > size && len % BLOCK as u64 == 0, "{len} bytes for {size}");
    let bytes = std::fs::read(log_path(&d, 0)).unwrap();
    assert!(bytes[size as usize..].iter().all(|&b| b == 0), "zeros past the end");
    log.close_file();
    assert_eq!(tally.load(std::sync::atomic::Ordering::Relaxed), 0);
    // Closed, its end's block is read back from the file for the next write.
    let mut last = frames("after-close", 2, 6);
    expected.extend(ids(&last));
    turn(&mut log, &mut last, 30).unwrap();
    drop(log);
    let log = PartitionLog::open(&d, 1 << 20).unwrap();
    assert_eq!(ids(&log.read(0, 1000, usize::MAX).unwrap()), expected);
    assert_eq!(file_len(&d, 0), log.segments.last().unwrap().size, "the padding is cut at open");
    let _ = std::fs::remove_dir_all(&d);
}

/// Sealed segments keep no padding (their index is checked against their length at open).
#[test]
fn a_sealed_segment_is_cut_to_its_batches() {
    let d = dir("roll");
    let mut log = PartitionLog::open(&d, 16 << 10).unwrap();
    for i in 0..40 {
        let mut fs: Vec<Frame> = (0..3).map(|j| frame(&format!("r{i}-{j}"), 600, 1)).collect();
        turn(&mut log, &mut fs, i).unwrap();
    }
    let segs = log.segments();
    assert!(segs.len() >= 3, "{segs:?}");
    for s in &segs[..segs.len() - 1] {
        assert_eq!(file_len(&d, s.base), s.bytes, "sealed {s:?}");
    }
    drop(log);
    let log = PartitionLog::open(&d, 16 << 10).unwrap();
    assert_eq!(offsets(&log.read(0, 1000, usize::MAX).unwrap()), (0..120).collect::<Vec<_>>());
    let _ = std::fs::remove_dir_all(&d);
}

/// Appends staged while a write is in flight take the offsets after it, and are invisible to
/// readers (as the write is) until written.
#[test]
fn appends_staged_during_a_write_follow_it() {
    let d = dir("inflight");
    let mut log = PartitionLog::open(&d, 1 << 20).unwrap();
    assert_eq!(log.stage(&mut frames("a", 3, 1)), 0);
    let tally = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    log.count_files_in(tally.clone());
    let w = prepared(&mut log, 1, true);
    assert_eq!(log.stage(&mut frames("b", 2, 1)), 3, "after the write in flight");
    assert_eq!(log.bounds(), (0, 0), "nothing readable yet");
    assert!(log.read(0, 10, usize::MAX).unwrap().is_empty());
    let lent = log.lend_direct().unwrap();
    assert_eq!(tally.load(std::sync::atomic::Ordering::Relaxed), 2, "the tail's file and the one lent");
    let result = w.write_blocking(lent);
    log.complete_direct(w, result).0.unwrap();
    assert_eq!(tally.load(std::sync::atomic::Ordering::Relaxed), 1, "given back");
    assert_eq!(log.bounds(), (0, 3));
    let w = prepared(&mut log, 2, true);
    write(&mut log, w).unwrap();
    assert_eq!(ids(&log.read(0, 10, usize::MAX).unwrap()), ["a0", "a1", "a2", "b0", "b1"]);
    let _ = std::fs::remove_dir_all(&d);
}

/// A failed write fails what was staged behind it too (its offsets would follow a hole); the
/// offsets are handed out again, and nothing of the failed turns is ever read.
#[test]
fn a_failed_write_fails_what_was_staged_behind_it() {
    let d = dir("failed");
    let mut log = PartitionLog::open(&d, 1 << 20).unwrap();
    turn(&mut log, &mut frames("ok", 2, 1), 1).unwrap();
    log.stage(&mut frames("lost", 2, 1));
    let w = prepared(&mut log, 2, false);
    assert_eq!(log.stage(&mut frames("behind", 1, 1)), 4);
    // Half of it reached the file before it failed: cut back to the end.
    let half = log.lend_direct().unwrap();
    std::os::unix::fs::FileExt::write_all_at(&half, &w.buf[w.range.start..w.range.start + BLOCK], w.pos).unwrap();
    assert!(file_len(&d, 0) > log.segments.last().unwrap().size);
    let (outcome, _) = log.complete_direct(w, Err(std::io::Error::from_raw_os_error(libc::EIO)));
    assert!(outcome.is_err());
    assert_eq!(file_len(&d, 0), log.segments.last().unwrap().size, "what the failed write left is cut");
    let err = log.prepare_direct(3, Vec::new(), false).err().expect("what was staged behind it fails");
    assert!(err.to_string().contains("an earlier write"), "{err}");
    assert_eq!(turn(&mut log, &mut frames("next", 1, 1), 4).unwrap(), 2, "the offsets are handed out again");
    assert_eq!(ids(&log.read(0, 10, usize::MAX).unwrap()), ["ok0", "ok1", "next0"]);
    drop(log);
    let log = PartitionLog::open(&d, 1 << 20).unwrap();
    assert_eq!(ids(&log.read(0, 10, usize::MAX).unwrap()), ["ok0", "ok1", "next0"]);
    let _ = std::fs::remove_dir_all(&d);
}

/// A write the file system refuses (EINVAL: O_DIRECT taken at the open, not at the write) is
/// done again through the page cache, and so are the log's writes from then on.
#[test]
fn a_write_refused_with_einval_goes_through_the_page_cache() {
    let d = dir("einval");
    let mut log = PartitionLog::open(&d, 1 << 20).unwrap();
    turn(&mut log, &mut frames("direct", 2, 1), 1).unwrap();
    log.stage(&mut frames("refused", 2, 1));
    let w = prepared(&mut log, 2, false);
    drop(log.lend_direct().unwrap());
    let (outcome, _) = log.complete_direct(w, Err(std::io::Error::from_raw_os_error(libc::EINVAL)));
    assert!(outcome.is_ok(), "written through the page cache");
    log.stage(&mut frames("after", 1, 1));
    assert!(matches!(log.prepare_direct(3, Vec::new(), false), Ok(Prepared::Committed(_))), "from then on");
    drop(log);
    let log = PartitionLog::open(&d, 1 << 20).unwrap();
    assert_eq!(ids(&log.read(0, 10, usize::MAX).unwrap()), ["direct0", "direct1", "refused0", "refused1", "after0"]);
    let _ = std::fs::remove_dir_all(&d);
}

/// A crash in the middle of a write that rewrites the end's block: only the first block of it
/// reached the file. What was written before stays (its bytes were written again, the same),
/// the torn batch is cut at reopen, and the next append takes its offset.
#[test]
fn a_write_torn_by_a_crash_keeps_what_was_written_before() {
    let d = dir("torn");
    let mut log = PartitionLog::open(&d, 1 << 20).unwrap();
    turn(&mut log, &mut frames("kept", 3, 1), 1).unwrap();
    let before = log.bounds().1;
    log.stage(&mut (0..4).map(|i| frame(&format!("torn{i}"), 3000, 1)).collect::<Vec<_>>());
    let mut w = prepared(&mut log, 2, false);
    assert!(w.range.len() > BLOCK, "the torn write spans blocks");
    w.range.end = w.range.start + BLOCK;
    w.write_blocking(log.lend_direct().unwrap()).unwrap();
    drop(log);
    let mut log = PartitionLog::open(&d, 1 << 20).unwrap();
    assert_eq!(ids(&log.read(0, 10, usize::MAX).unwrap()), ["kept0", "kept1", "kept2"]);
    assert_eq!(turn(&mut log, &mut frames("again", 1, 1), 3).unwrap(), before);
    let _ = std::fs::remove_dir_all(&d);
}
