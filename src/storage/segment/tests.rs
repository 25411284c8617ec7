use super::*;
use frame_codec::{AttrValue, Attribute, DataKind, FrameBody, FrameHeader};

pub(super) fn frame(id: &str, data_len: usize, ts: i64) -> Frame {
    let attributes = vec![
        Attribute { name: "specversion".into(), value: AttrValue::Str("1.0".into()) },
        Attribute { name: "id".into(), value: AttrValue::Str(id.into()) },
    ];
    let body = FrameBody { topic: "t".into(), attributes, data: vec![b'x'; data_len] };
    let mut f = Frame::encode(&FrameHeader::event(DataKind::Text), &body).unwrap();
    f.set_timestamp(ts);
    f
}

pub(super) fn frames(prefix: &str, n: usize, ts: i64) -> Vec<Frame> {
    (0..n).map(|i| frame(&format!("{prefix}{i}"), 10 + i * 7, ts)).collect()
}

pub(super) fn ids(fs: &[Frame]) -> Vec<String> {
    fs.iter().map(|f| f.body().attr_str("id").unwrap().to_owned()).collect()
}

pub(super) fn offsets(fs: &[Frame]) -> Vec<u64> {
    fs.iter().map(|f| f.header().offset).collect()
}

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("evmesh-segment-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn batches_append_read_back_by_offset_and_stay_8_aligned() {
    let d = dir("rw");
    let mut log = PartitionLog::open(&d, 1 << 20).unwrap();
    assert_eq!(log.bounds(), (0, 0));
    assert_eq!(log.append(&mut frames("a", 1, 10), 10).unwrap(), 0);
    assert_eq!(log.append(&mut frames("b", 10, 20), 20).unwrap(), 1);
    assert_eq!(log.append(&mut frames("c", 1, 30), 30).unwrap(), 11);
    assert_eq!(log.bounds(), (0, 12));
    let all = log.read(0, 100, usize::MAX).unwrap();
    assert_eq!(offsets(&all), (0..12).collect::<Vec<_>>());
    assert_eq!(ids(&all)[1], "b0");
    // From the middle of a batch; at most `max`; stopping after the frame that reaches the bytes.
    assert_eq!(offsets(&log.read(5, 3, usize::MAX).unwrap()), [5, 6, 7]);
    assert_eq!(offsets(&log.read(5, 100, 1).unwrap()), [5]);
    assert!(log.read(12, 10, usize::MAX).unwrap().is_empty());
    // Every batch, and every frame in it, starts at a multiple of 8.
    let bytes = std::fs::read(d.join(format!("{:020}.log", 0))).unwrap();
    let mut pos = 0;
    while pos < bytes.len() {
        assert_eq!(pos % 8, 0);
        let h = BatchHeader::read(&bytes[pos..]).unwrap();
        let mut at = pos + HEADER;
        for _ in 0..h.count {
            assert_eq!(at % 8, 0);
            let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
            at = padded(at + 8 + len);
        }
        pos += h.total_len as usize;
    }
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn segments_roll_their_indexes_reload_and_a_bad_index_is_rebuilt() {
    let d = dir("roll");
    let mut log = PartitionLog::open(&d, 8 * 1024).unwrap();
    for i in 0..200 {
        log.append(&mut frames(&format!("e{i}-"), 1 + i % 3, 1000 + i as i64), 1000 + i as i64).unwrap();
    }
    let end = log.bounds().1;
    let segs = log.segments();
    assert!(segs.len() > 4, "{segs:?}");
    assert!(segs.windows(2).all(|w| w[0].next == w[1].base));
    let before = log.read(0, 10_000, usize::MAX).unwrap();
    assert_eq!(offsets(&before), (0..end).collect::<Vec<_>>());
    drop(log);
    // Reopened: the sealed segments' index files are used; one missing and one garbage are
    // rebuilt from the batch headers.
    std::fs::remove_file(index_path(&d, segs[1].base)).unwrap();
    std::fs::write(index_path(&d, segs[2].base), b"not an index").unwrap();
    let log = PartitionLog::open(&d, 8 * 1024).unwrap();
    assert_eq!(log.bounds(), (0, end));
    for from in [0, 1, segs[1].base, segs[2].base + 1, end - 1] {
        let got = log.read(from, 10_000, usize::MAX).unwrap();
        assert_eq!(offsets(&got), (from..end).collect::<Vec<_>>(), "from {from}");
    }
    assert!(std::fs::metadata(index_path(&d, segs[1].base)).unwrap().len() > 0, "written back");
    let _ = std::fs::remove_dir_all(&d);
}

/// A crash can leave any prefix of the last batch: opened again, the log holds exactly the
/// batches before it, serves nothing of it, and appends go on at its offset.
#[test]
fn a_torn_last_batch_is_cut_at_every_byte_never_served() {
    let d = dir("torn");
    let mut log = PartitionLog::open(&d, 1 << 20).unwrap();
    log.append(&mut frames("a", 2, 1), 1).unwrap();
    log.append(&mut frames("b", 3, 2), 2).unwrap();
    let last_at = std::fs::metadata(log_path(&d, 0)).unwrap().len();
    log.append(&mut frames("c", 4, 3), 3).unwrap();
    drop(log);
    let whole = std::fs::read(log_path(&d, 0)).unwrap();
    let cut_dir = dir("torn-cut");
    for cut in last_at as usize..whole.len() {
        let _ = std::fs::remove_dir_all(&cut_dir);
        std::fs::create_dir_all(&cut_dir).unwrap();
        std::fs::write(log_path(&cut_dir, 0), &whole[..cut]).unwrap();
        let mut log = PartitionLog::open(&cut_dir, 1 << 20).unwrap();
        assert_eq!(log.bounds(), (0, 5), "cut at {cut}");
        assert_eq!(ids(&log.read(0, 100, usize::MAX).unwrap()), ["a0", "a1", "b0", "b1", "b2"], "cut at {cut}");
        assert_eq!(std::fs::metadata(log_path(&cut_dir, 0)).unwrap().len(), last_at, "cut at {cut}");
        assert_eq!(log.append(&mut frames("d", 1, 4), 4).unwrap(), 5);
        assert_eq!(ids(&log.read(5, 10, usize::MAX).unwrap()), ["d0"]);
    }
    // A flipped bit anywhere in the last batch, header or body: cut as well.
    for at in [last_at as usize + 1, last_at as usize + 20, whole.len() - 3] {
        let _ = std::fs::remove_dir_all(&cut_dir);
        std::fs::create_dir_all(&cut_dir).unwrap();
        let mut bad = whole.clone();
        bad[at] ^= 0x10;
        std::fs::write(log_path(&cut_dir, 0), &bad).unwrap();
        assert_eq!(PartitionLog::open(&cut_dir, 1 << 20).unwrap().bounds(), (0, 5), "flip at {at}");
    }
    // A zero-filled tail (a preallocated file) and stale bytes of a batch at the wrong offset.
    for tail in [vec![0u8; 4096], whole[..last_at as usize].to_vec()] {
        let _ = std::fs::remove_dir_all(&cut_dir);
        std::fs::create_dir_all(&cut_dir).unwrap();
        let mut file = whole.clone();
        file.extend_from_slice(&tail);
        std::fs::write(log_path(&cut_dir, 0), &file).unwrap();
        let log = PartitionLog::open(&cut_dir, 1 << 20).unwrap();
        assert_eq!(log.bounds(), (0, 9));
        assert_eq!(std::fs::metadata(log_path(&cut_dir, 0)).unwrap().len(), whole.len() as u64);
    }
    let _ = std::fs::remove_dir_all(&cut_dir);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn reads_by_time_and_retention_by_whole_segments() {
    let d = dir("time");
    let mut log = PartitionLog::open(&d, 4 * 1024).unwrap();
    for i in 0..100i64 {
        log.append(&mut frames(&format!("t{i}-"), 2, i * 100), i * 100).unwrap();
    }
    // Batch i (offsets 2i, 2i+1) was published at 100 i.
    assert_eq!(log.offset_for_time(i64::MIN).unwrap(), 0);
    assert_eq!(log.offset_for_time(150).unwrap(), 4);
    assert_eq!(log.offset_for_time(5_000).unwrap(), 100);
    assert_eq!(log.offset_for_time(99_999).unwrap(), 200, "after the last: the end");
    // The clock going back does not make the time index go back.
    log.append(&mut frames("late", 1, 50), 50).unwrap();
    assert_eq!(log.offset_for_time(9_900).unwrap(), 198, "the late batch is not found before the last");
    assert_eq!(log.offset_for_time(9_901).unwrap(), 201);
    // Whole segments whose every event is older than 3,000 go; the tail never does.
    let gone = log.retain(|s| s.max_ts < 3_000).unwrap();
    assert!(gone > 0);
    let (first, end) = log.bounds();
    assert!(first > 0 && first <= 60, "{first}");
    assert_eq!(end, 201);
    assert_eq!(log.read(0, 1, usize::MAX).unwrap()[0].header().offset, first, "reads start at the first kept");
    let n = log.segments().len();
    assert_eq!(log.retain(|_| true).unwrap(), n - 1, "all but the tail");
    assert_eq!(log.segments().len(), 1);
    drop(log);
    let log = PartitionLog::open(&d, 4 * 1024).unwrap();
    assert_eq!(log.bounds().1, 201);
    let _ = std::fs::remove_dir_all(&d);
}

/// A read is planned under the partition's mutex and done after it: it sees the log as it was
/// when planned, whatever is appended meanwhile, and a sealed segment that retention deleted
/// meanwhile ends it with what came before (no error), while the log itself reads on.
#[test]
fn a_planned_read_sees_the_log_as_planned() {
    let d = dir("plan");
    let mut log = PartitionLog::open(&d, 4 * 1024).unwrap();
    for i in 0..20i64 {
        log.append(&mut frames(&format!("p{i}-"), 2, i), i).unwrap();
    }
    let (_, end) = log.bounds();
    let everything = log.plan_read(0, usize::MAX, usize::MAX);
    let from_ten = log.plan_read(10, usize::MAX, usize::MAX);
    log.append(&mut frames("later", 3, 99), 99).unwrap();
    assert_eq!(offsets(&everything.read(1_000, usize::MAX).unwrap()), (0..end).collect::<Vec<_>>());
    assert_eq!(offsets(&from_ten.read(1_000, usize::MAX).unwrap()), (10..end).collect::<Vec<_>>());
    assert_eq!(log.read(0, 1_000, usize::MAX).unwrap().len() as u64, end + 3, "the log itself has the new events");
    // Limits apply to the planned read as to a read under the mutex.
    let one = log.read(0, 1, usize::MAX).unwrap()[0].as_bytes().len();
    assert_eq!(offsets(&everything.read(3, usize::MAX).unwrap()), [0, 1, 2]);
    assert_eq!(offsets(&everything.read(1_000, one + 1).unwrap()), [0, 1]);
    // Retention deletes the planned sealed segments: the read ends there, without an error.
    assert!(log.segments().len() > 2);
    let n = log.segments().len();
    assert_eq!(log.retain(|_| true).unwrap(), n - 1);
    assert!(everything.read(1_000, usize::MAX).unwrap().is_empty());
    let first = log.bounds().0;
    assert_eq!(log.read(0, 1, usize::MAX).unwrap()[0].header().offset, first);
    let _ = std::fs::remove_dir_all(&d);
    // A plan takes the segments its byte budget needs (with room for a batch or two), not all.
    let d = dir("plan-budget");
    let mut log = PartitionLog::open(&d, 64 * 1024).unwrap();
    for i in 0..100 {
        log.append(&mut (0..4).map(|k| frame(&format!("big{i}-{k}"), 16 * 1024, i)).collect::<Vec<_>>(), i).unwrap();
    }
    let small = log.plan_read(0, 1, 1);
    assert!(small.segments.len() < log.segments().len() / 2, "{} of {}", small.segments.len(), log.segments().len());
    assert_eq!(offsets(&small.read(1_000, 1).unwrap()), [0]);
    let far = log.plan_read(300, 1, 1);
    assert_eq!(offsets(&far.read(1_000, 1).unwrap()), [300]);
    // Many small events, each alone in its batch: the plan has room for the file's bytes
    // around each of them, so a read for `max` of them is not cut short by its plan.
    let d = dir("plan-small");
    let mut log = PartitionLog::open(&d, 64 * 1024).unwrap();
    for i in 0..40_000 {
        log.append(&mut [frame(&format!("s{i}"), 0, i)], i).unwrap();
    }
    let one = log.read(0, 1, usize::MAX).unwrap()[0].as_bytes().len();
    let n = 35_000;
    assert_eq!(log.read(0, n, n * one).unwrap().len(), n);
    let _ = std::fs::remove_dir_all(&d);
}

mod prop {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

        /// Whatever prefix of its files a crash leaves (a cut anywhere in the last segment), the
        /// log opens to whole batches only, a prefix of what was appended, and appends go on.
        #[test]
        fn any_cut_of_the_last_segment_leaves_a_prefix_of_whole_batches(
            sizes in proptest::collection::vec(1usize..6, 1..30),
            cut in any::<proptest::sample::Index>(),
            roll in prop_oneof![Just(1u64 << 20), Just(2048u64)],
        ) {
            let d = dir(&format!("prop-{}", cut.index(1_000_000)));
            let mut log = PartitionLog::open(&d, roll).unwrap();
            let mut batches = Vec::new();
            for (b, &n) in sizes.iter().enumerate() {
                let base = log.append(&mut frames(&format!("b{b}-"), n, b as i64), b as i64).unwrap();
                batches.push((base, n as u64));
            }
            let end = log.bounds().1;
            let tail = log.segments().last().unwrap().base;
            drop(log);
            let path = log_path(&d, tail);
            let bytes = std::fs::read(&path).unwrap();
            let at = cut.index(bytes.len() + 1);
            std::fs::write(&path, &bytes[..at]).unwrap();
            let mut log = PartitionLog::open(&d, roll).unwrap();
            let (first, next) = log.bounds();
            prop_assert_eq!(first, 0);
            prop_assert!(next <= end);
            prop_assert!(next >= tail);
            prop_assert!(batches.iter().any(|&(base, n)| base == next || base + n == next), "{} is a batch boundary", next);
            let all = log.read(0, 1_000, usize::MAX).unwrap();
            prop_assert_eq!(offsets(&all), (0..next).collect::<Vec<_>>());
            prop_assert_eq!(log.append(&mut frames("after", 1, 99), 99).unwrap(), next);
            let _ = std::fs::remove_dir_all(&d);
        }
    }
}

/// A power loss may leave the segment sealed just before the tail short (its pages were never
/// written back): it is cut like a tail, and the segments after it go.
#[test]
fn a_sealed_segment_cut_short_becomes_the_tail_and_later_ones_go() {
    let d = dir("sealed-cut");
    let mut log = PartitionLog::open(&d, 2048).unwrap();
    for i in 0..40 {
        log.append(&mut frames(&format!("s{i}-"), 2, i), i).unwrap();
    }
    let segs = log.segments();
    assert!(segs.len() >= 3, "{segs:?}");
    drop(log);
    let victim = &segs[segs.len() - 2];
    let path = log_path(&d, victim.base);
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 5]).unwrap();
    let mut log = PartitionLog::open(&d, 2048).unwrap();
    let (first, end) = log.bounds();
    assert_eq!(first, 0);
    assert!(end > victim.base && end < victim.next, "{end} inside the cut segment {victim:?}");
    assert_eq!(log.segments().len(), segs.len() - 1, "the tail after it went");
    assert!(!log_path(&d, segs.last().unwrap().base).exists());
    assert_eq!(offsets(&log.read(0, 10_000, usize::MAX).unwrap()), (0..end).collect::<Vec<_>>());
    assert_eq!(log.append(&mut frames("after", 1, 99), 99).unwrap(), end);
    drop(log);
    assert_eq!(PartitionLog::open(&d, 2048).unwrap().bounds(), (0, end + 1), "and it opens again as it was left");
    let _ = std::fs::remove_dir_all(&d);
}

/// An idle partition lets go of its file and takes it again on the next write, staged appends
/// too (their commit opens it); the tally of open files follows.
#[test]
fn an_idle_tail_closes_its_file_and_the_next_write_reopens_it() {
    let d = dir("idle");
    let tally = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let open = || tally.load(std::sync::atomic::Ordering::Relaxed);
    let mut log = PartitionLog::open(&d, 1 << 20).unwrap();
    log.count_files_in(tally.clone());
    assert_eq!(open(), 1, "a new log holds its tail open");
    log.append(&mut frames("a", 2, 1), 1).unwrap();
    assert!(!log.close_if_idle(), "written since the last sweep");
    assert!(log.close_if_idle());
    assert!(log.segments.last().unwrap().file.is_none());
    assert_eq!(open(), 0);
    assert_eq!(offsets(&log.read(0, 10, usize::MAX).unwrap()), [0, 1], "reads open it themselves");
    assert_eq!(open(), 0, "a read's file is its own");
    log.stage(&mut frames("b", 1, 2));
    log.close_file();
    log.commit(2).unwrap();
    assert_eq!(open(), 1, "the commit opened it again");
    assert_eq!(log.append(&mut frames("c", 1, 3), 3).unwrap(), 3);
    drop(log);
    assert_eq!(open(), 0, "a dropped log is counted out");
    let log = PartitionLog::open(&d, 1 << 20).unwrap();
    assert_eq!(log.bounds(), (0, 4));
    let _ = std::fs::remove_dir_all(&d);
}

/// A mirror's offsets may start far past 0 and skip past what 32-bit relative offsets reach:
/// such a batch starts a segment named by its own offset (no panic), and all of it reads back,
/// also after a reopen.
#[test]
fn a_mirror_takes_offsets_far_apart() {
    let d = dir("mirror-far");
    let mut log = PartitionLog::open_mirror(&d, 1 << 20).unwrap();
    let at = |o: u64, id: &str| {
        let mut f = frame(id, 10, 1);
        f.set_offset(o);
        f
    };
    let far = 5u64 << 32;
    log.write_at(&[at(far, "a"), at(far + 1, "b")], 1).unwrap();
    log.write_at(&[at(far + 2, "c"), at(3 * far, "d")], 2).unwrap();
    assert_eq!(log.bounds().1, 3 * far + 1);
    assert_eq!(ids(&log.read(0, 10, usize::MAX).unwrap()), ["a", "b", "c", "d"]);
    assert_eq!(offsets(&log.read(far + 2, 10, usize::MAX).unwrap()), [far + 2, 3 * far]);
    drop(log);
    let log = PartitionLog::open_mirror(&d, 1 << 20).unwrap();
    assert_eq!(ids(&log.read(0, 10, usize::MAX).unwrap()), ["a", "b", "c", "d"]);
    let _ = std::fs::remove_dir_all(&d);
}

/// What one turn stages past [`MAX_BATCH_BYTES`] is written as several batches (a read of one
/// event reads one batch, not the turn's megabytes), with dense offsets.
#[test]
fn a_large_turn_is_cut_into_bounded_batches() {
    let d = dir("big-turn");
    let mut log = PartitionLog::open(&d, 64 << 20).unwrap();
    let mut big: Vec<Frame> = (0..40).map(|i| frame(&format!("g{i}"), 100 << 10, 1)).collect();
    assert_eq!(log.stage(&mut big), 0);
    assert_eq!(log.stage(&mut frames("s", 3, 1)), 40);
    assert!(log.staged.len() > 1);
    let written = log.commit(1).unwrap();
    assert_eq!(written.len(), 1, "one file to sync");
    assert_eq!(log.bounds(), (0, 43));
    let bytes = std::fs::read(d.join(format!("{:020}.log", 0))).unwrap();
    let mut pos = 0;
    let mut batches = 0;
    while pos < bytes.len() {
        let h = BatchHeader::read(&bytes[pos..]).unwrap();
        assert!(h.total_len as usize <= MAX_BATCH_BYTES + (100 << 10) + 256, "{}", h.total_len);
        pos += h.total_len as usize;
        batches += 1;
    }
    assert!(batches >= 4, "{batches} batches");
    assert_eq!(offsets(&log.read(0, 100, usize::MAX).unwrap()), (0..43).collect::<Vec<_>>());
    assert_eq!(ids(&log.read(20, 1, usize::MAX).unwrap()), ["g20"]);
    let _ = std::fs::remove_dir_all(&d);
}

/// A tier's side of the log: sealed segments' bytes read elsewhere give the events a local
/// read gives (stopping where bytes are not at hand, and saying where); local copies of
/// uploaded segments go while the floor keeps the offsets kept; an empty log a tier holds
/// history of continues after it.
#[test]
fn sealed_segments_read_detached_and_local_copies_dropped_behind_a_floor() {
    let d = dir("tier");
    let mut log = PartitionLog::open(&d, 4096).unwrap();
    for i in 0..40 {
        log.append(&mut frames(&format!("b{i}-"), 3, 100 + i), 100 + i).unwrap();
    }
    let (sdir, sealed) = log.sealed();
    assert!(sealed.len() >= 3, "{sealed:?}");
    assert_eq!(log.segments().len(), sealed.len() + 1, "every segment but the tail");
    let s = sealed[1];
    let (lp, ip) = files(&sdir, s.base);
    let (bytes, index) = (std::fs::read(lp).unwrap(), std::fs::read(ip).unwrap());
    let mut at = |pos: u64, len: usize| bytes.get(pos as usize..pos as usize + len).map(<[u8]>::to_vec);
    let from = s.base + 2;
    let entry = |i: usize| index.get(i * 16..i * 16 + 16).map(|e| e.try_into().unwrap());
    let start = index_floor(index.len() / 16, entry, s.base, from).unwrap();
    // The floor is the last entry at or before `from`, as the local log's seek finds it.
    let walked: Vec<(u64, u64)> = index
        .chunks(16)
        .map(|e| {
            (
                u64::from(u32::from_le_bytes(e[..4].try_into().unwrap())),
                u64::from(u32::from_le_bytes(e[4..8].try_into().unwrap())),
            )
        })
        .collect();
    let floor = walked.iter().take_while(|(rel, _)| s.base + rel <= from).last().map_or(0, |&(_, pos)| pos);
    assert_eq!(start, floor);
    assert_eq!(index_floor(index.len() / 16, |_| None, s.base, from), None, "entries not at hand");
    assert_eq!(index_floor(0, |_| None, s.base, from), Some(0), "no index: from the start");
    let got = read_detached(&mut at, (s.bytes, start), (from, 1000, usize::MAX), Path::new("x")).unwrap();
    assert_eq!(got.wanted, None);
    assert_eq!(offsets(&got.frames), (from..s.next).collect::<Vec<_>>());
    assert_eq!(ids(&got.frames), ids(&log.read(from, (s.next - from) as usize, usize::MAX).unwrap()));
    // Bytes past 100 are not at hand: the read stops at the batch there, and says so.
    let mut short = |pos: u64, len: usize| {
        bytes.get(pos as usize..pos as usize + len).filter(|_| pos + len as u64 <= 100).map(<[u8]>::to_vec)
    };
    let part = read_detached(&mut short, (s.bytes, 0), (s.base, 1000, usize::MAX), Path::new("x")).unwrap();
    assert!(part.wanted.is_some_and(|w| w < 100), "{:?}", part.wanted);
    // Nothing local goes without a floor; with one, uploaded segments go past the byte limit,
    // never the tail, and the bounds keep their start.
    let upto = |n: u64| move |s: &SegmentInfo| s.next <= n;
    assert_eq!(log.drop_uploaded(upto(sealed[1].next), Some(0), None).unwrap(), 0);
    log.set_floor(Some(0));
    assert_eq!(log.drop_uploaded(|_| false, Some(0), None).unwrap(), 0, "only what the tier holds goes");
    assert_eq!(log.drop_uploaded(upto(sealed[1].next), Some(0), None).unwrap(), 2);
    assert_eq!((log.bounds().0, log.local_start()), (0, sealed[2].base));
    assert_eq!(log.read(sealed[2].base, 1, usize::MAX).unwrap().len(), 1);
    // By age: segments whose newest event is older than the cut.
    let newest = log.segments()[0].max_ts;
    assert_eq!(log.drop_uploaded(upto(u64::MAX), None, Some(newest)).unwrap(), 0);
    assert_eq!(log.drop_uploaded(upto(u64::MAX), None, Some(newest + 1)).unwrap(), 1);
    let end = log.bounds().1;
    // A log ending before what the tier holds (cut by recovery after a power loss) keeps none
    // of its segments and goes on after the tier's end.
    log.continue_at(end - 1).unwrap();
    assert_eq!(log.bounds().1, end, "a log already past the tier's end is left alone");
    log.continue_at(end + 10).unwrap();
    assert_eq!((log.bounds(), log.segments().len()), ((0, end + 10), 1));
    assert_eq!(log.append(&mut frames("p", 1, 1), 1).unwrap(), end + 10);
    drop(log);
    let e = dir("tier-empty");
    let mut empty = PartitionLog::open(&e, 4096).unwrap();
    empty.continue_at(end).unwrap();
    empty.set_floor(Some(5));
    assert_eq!(empty.bounds(), (5, end));
    assert_eq!(empty.append(&mut frames("n", 1, 1), 1).unwrap(), end);
    let _ = std::fs::remove_dir_all(&d);
    let _ = std::fs::remove_dir_all(&e);
}
