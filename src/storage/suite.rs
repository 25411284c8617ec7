//! The storage test suite: what every backend must do, run against the embedded engine (each
//! durability) on a real RocksDB in a temporary directory, and the same tests against the Kafka
//! and RocketMQ backends on the real brokers `scripts/test.sh` starts (EVMESH_TEST_KAFKA,
//! EVMESH_TEST_ROCKETMQ). Reopening and corruption are the embedded engine's own tests (a remote
//! log's restart is an integration test).

use std::path::PathBuf;

use frame_codec::{AttrValue, Attribute, DataKind, Frame, FrameBody, FrameHeader};

use std::sync::Arc;

use super::embedded::{EmbeddedLog, SyncError, SyncTicket, Syncer};
use super::partitions::PartitionLogs;
#[cfg(any(feature = "kafka", feature = "rocketmq"))]
use super::remote::{Remote, RemoteLog, TopicAsk};
use super::{db, Bounds, Durability, Log, Storage, TopicMeta};
use crate::model::{PartitionId, ShardId};

/// The lite-topic TTL the suite's logs run with.
const HOUR: std::time::Duration = std::time::Duration::from_secs(3600);

pub(super) struct TempDir(pub(super) PathBuf);

impl TempDir {
    pub(super) fn new(name: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("evmesh-storage-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    monoio::RuntimeBuilder::<monoio::LegacyDriver>::new().build().expect("runtime").block_on(f)
}

fn frame(topic: &str, id: &str, ts: i64, data_len: usize) -> Frame {
    let body = FrameBody {
        topic: topic.into(),
        attributes: vec![Attribute { name: "id".into(), value: AttrValue::Str(id.into()) }],
        data: vec![b'x'; data_len],
    };
    let mut f = Frame::encode(&FrameHeader::event(DataKind::Text), &body).unwrap();
    f.set_timestamp(ts);
    f
}

fn ids(frames: &[Frame]) -> Vec<String> {
    frames.iter().map(|f| f.body().attr_str("id").unwrap().to_owned()).collect()
}

/// The segment logs of a data directory, with small segments so retention and rolls are seen.
fn logs(dir: &TempDir, mirror: bool) -> Arc<PartitionLogs> {
    Arc::new(PartitionLogs::new(db::segments_dir(&dir.0), 64 << 10, mirror, 1024))
}

fn log(dir: &TempDir, durability: Durability) -> EmbeddedLog {
    let db = db::open(&dir.0, 2).unwrap();
    let syncer = (durability == Durability::Fsync).then(|| Syncer::start(db.clone()).unwrap());
    EmbeddedLog::new(db, logs(dir, false), ShardId(0), durability, syncer, HOUR)
}

fn append(log: &impl Storage, topic: &str, p: u32, frames: Vec<Frame>) -> u64 {
    let mut frames = frames;
    block_on(log.append(topic, PartitionId(p), &mut frames)).unwrap()
}

/// Every backend the suite runs against.
#[derive(Debug, Clone, Copy)]
enum Backend {
    Embedded(Durability),
    #[cfg(feature = "kafka")]
    Kafka,
    #[cfg(feature = "rocketmq")]
    RocketMq,
}

/// The backends a plain `cargo test` runs against; the Kafka backend runs the same checks in
/// the `on_kafka` tests below, which need a broker.
const ALL: &[Backend] =
    &[Backend::Embedded(Durability::Memory), Backend::Embedded(Durability::Os), Backend::Embedded(Durability::Fsync)];

/// A log of `backend` in `dir`, and the names to use for `topics` (unique per run on Kafka,
/// whose broker the whole suite shares; each created with 4 partitions).
fn open(dir: &TempDir, backend: Backend, topics: &[&str]) -> (Log, Vec<String>) {
    match backend {
        Backend::Embedded(d) => (Log::Embedded(log(dir, d)), topics.iter().map(|t| t.to_string()).collect()),
        #[cfg(feature = "kafka")]
        Backend::Kafka => {
            let brokers = std::env::var("EVMESH_TEST_KAFKA")
                .expect("EVMESH_TEST_KAFKA names the test Kafka broker; scripts/test.sh installs and starts one");
            let settings = super::KafkaSettings {
                brokers,
                replication_factor: 1,
                acks: "all".into(),
                compression: "none".into(),
                topic_prefix: String::new(),
                properties: Vec::new(),
                topic_refresh: std::time::Duration::from_secs(10),
            };
            remote(dir, super::kafka::KafkaBackend::connect(settings).unwrap(), topics)
        }
        #[cfg(feature = "rocketmq")]
        Backend::RocketMq => {
            let namesrv = std::env::var("EVMESH_TEST_ROCKETMQ").expect(
                "EVMESH_TEST_ROCKETMQ names the test RocketMQ name server; scripts/test.sh installs and starts one",
            );
            let settings = super::RocketMqSettings {
                namesrv,
                topic_prefix: String::new(),
                send_timeout: std::time::Duration::from_secs(3),
                topic_refresh: std::time::Duration::from_secs(10),
            };
            remote(dir, super::rocketmq::RocketMqBackend::connect(settings).unwrap(), topics)
        }
    }
}

/// A log over `remote`, its `topics` made there under names unique to this run, 4 partitions each.
#[cfg(any(feature = "kafka", feature = "rocketmq"))]
fn remote(dir: &TempDir, remote: Arc<dyn Remote>, topics: &[&str]) -> (Log, Vec<String>) {
    let stamp = format!("{}-{}", std::process::id(), crate::model::clock::now_micros());
    let names: Vec<String> = topics.iter().map(|t| format!("suite-{stamp}-{t}")).collect();
    for n in &names {
        block_on(remote.ensure_topic(n, TopicAsk::Create { partitions: 4, exact: true })).unwrap();
    }
    let db = db::open(&dir.0, 2).unwrap();
    let segments = logs(dir, true);
    let local = EmbeddedLog::new(db.clone(), segments.clone(), ShardId(0), Durability::Memory, None, HOUR);
    let lite = EmbeddedLog::new(db, segments, ShardId(0), Durability::Os, None, HOUR);
    (Log::Remote(RemoteLog::new(remote, local, lite)), names)
}

#[test]
fn offsets_are_dense_per_partition_and_stamped() {
    for &backend in ALL {
        dense_and_stamped(backend);
    }
}

fn dense_and_stamped(backend: Backend) {
    let dir = TempDir::new(&format!("dense-{backend:?}"));
    let (log, names) = open(&dir, backend, &["t", "tt"]);
    let (t, tt) = (names[0].as_str(), names[1].as_str());
    assert_eq!(append(&log, t, 0, vec![frame(t, "a", 1, 10), frame(t, "b", 2, 10)]), 0);
    assert_eq!(append(&log, t, 0, vec![frame(t, "c", 3, 10)]), 2);
    assert_eq!(append(&log, t, 1, vec![frame(t, "z", 3, 10)]), 0, "partitions are independent");
    // A topic whose name extends another's must not see its events.
    assert_eq!(append(&log, tt, 0, vec![frame(tt, "y", 3, 10)]), 0);
    let got = log.read(t, PartitionId(0), 0, 100, usize::MAX).unwrap();
    assert_eq!(ids(&got), ["a", "b", "c"], "{backend:?}");
    let offsets: Vec<u64> = got.iter().map(|f| f.header().offset).collect();
    assert_eq!(offsets, [0, 1, 2]);
    assert!(got.iter().all(|f| f.header().partition == 0));
    assert_eq!(ids(&log.read(t, PartitionId(0), 1, 1, usize::MAX).unwrap()), ["b"]);
    // The byte budget stops a read after the frame that reaches it, never before the first.
    assert_eq!(ids(&log.read(t, PartitionId(0), 0, 100, 1).unwrap()), ["a"]);
    let one = got[0].as_bytes().len();
    assert_eq!(log.read(t, PartitionId(0), 0, 100, one + 1).unwrap().len(), 2);
    assert!(log.read(t, PartitionId(0), 3, 10, usize::MAX).unwrap().is_empty());
    assert_eq!(log.bounds(t, PartitionId(0)).unwrap(), Bounds { start: 0, end: 3 });
    assert_eq!(log.bounds("nope", PartitionId(0)).unwrap(), Bounds { start: 0, end: 0 });
}

#[test]
fn a_reopened_log_continues_where_it_ended() {
    let dir = TempDir::new("reopen");
    {
        let log = log(&dir, Durability::Os);
        append(&log, "t", 3, (0..5).map(|i| frame("t", &i.to_string(), 1, 10)).collect());
    }
    let log = log(&dir, Durability::Os);
    assert_eq!(append(&log, "t", 3, vec![frame("t", "5", 1, 10)]), 5);
    assert_eq!(ids(&log.read("t", PartitionId(3), 0, 100, usize::MAX).unwrap()), ["0", "1", "2", "3", "4", "5"]);
}

#[test]
fn retention_by_size_and_age_keeps_the_newest() {
    for &backend in ALL {
        retention_keeps_the_newest(backend);
    }
}

fn retention_keeps_the_newest(backend: Backend) {
    let dir = TempDir::new(&format!("retention-{backend:?}"));
    let (log, names) = open(&dir, backend, &["t"]);
    let t = names[0].as_str();
    let size = frame(t, "0", 0, 100).as_bytes().len() as u64;
    append(&log, t, 0, (0..10).map(|i| frame(t, &i.to_string(), i * 1000, 100)).collect());
    // Room for three events: the oldest seven go.
    let by_size = TopicMeta { partitions: 1, retention_ms: None, retention_bytes: Some(3 * size + size / 2) };
    assert_eq!(log.enforce_retention(t, &by_size, PartitionId(0), 0).unwrap(), 7);
    assert_eq!(ids(&log.read(t, PartitionId(0), 0, 100, usize::MAX).unwrap()), ["7", "8", "9"]);
    assert_eq!(log.bounds(t, PartitionId(0)).unwrap(), Bounds { start: 7, end: 10 });
    // Events older than 1 ms at now = 9 ms: the ones at 8 and 9 ms survive.
    let by_age = TopicMeta { partitions: 1, retention_ms: Some(1), retention_bytes: None };
    log.enforce_retention(t, &by_age, PartitionId(0), 9_000).unwrap();
    assert_eq!(ids(&log.read(t, PartitionId(0), 0, 100, usize::MAX).unwrap()), ["8", "9"]);
    // Everything expired: the newest event still stays, so the end offset survives a restart.
    log.enforce_retention(t, &by_age, PartitionId(0), 1_000_000).unwrap();
    assert_eq!(ids(&log.read(t, PartitionId(0), 0, 100, usize::MAX).unwrap()), ["9"]);
    assert_eq!(append(&log, t, 0, vec![frame(t, "10", 0, 1)]), 10);
    // No limits: nothing is touched.
    let none = TopicMeta { partitions: 1, retention_ms: None, retention_bytes: None };
    assert_eq!(log.enforce_retention(t, &none, PartitionId(0), i64::MAX).unwrap(), 0);
}

#[test]
fn a_corrupt_record_is_reported_not_trusted() {
    let dir = TempDir::new("corrupt");
    let log = log(&dir, Durability::Os);
    append(&log, "t", 0, vec![frame("t", "a", 1, 10)]);
    append(&log, "t", 0, vec![frame("t", "b", 1, 10)]);
    // A bit flips in the second batch's body (after the crash recovery that would cut it).
    let file = logs(&dir, false).dir("t", PartitionId(0)).join(format!("{:020}.log", 0));
    let mut bytes = std::fs::read(&file).unwrap();
    let last = bytes.len() - 20;
    bytes[last] ^= 1;
    std::fs::write(&file, bytes).unwrap();
    assert_eq!(ids(&log.read("t", PartitionId(0), 0, 1, usize::MAX).unwrap()), ["a"], "the batch before is whole");
    match log.read("t", PartitionId(0), 0, 10, usize::MAX) {
        Err(super::StorageError::Engine(m)) if m.contains("fails its CRC") => {}
        other => panic!("{other:?}"),
    }
}

/// Lite topics (many, small, short-lived) stay rows of RocksDB; every other topic is a
/// directory of segment files.
#[test]
fn lite_topics_are_rows_and_other_topics_are_segment_files() {
    let dir = TempDir::new("where");
    let log = log(&dir, Durability::Os);
    append(&log, "t", 1, vec![frame("t", "a", 1, 10)]);
    append(&log, ":lite", 0, vec![frame(":lite", "b", 1, 10)]);
    assert!(logs(&dir, false).dir("t", PartitionId(1)).join(format!("{:020}.log", 0)).exists());
    assert!(!logs(&dir, false).dir(":lite", PartitionId(0)).exists());
    assert_eq!(ids(&log.read(":lite", PartitionId(0), 0, 10, usize::MAX).unwrap()), ["b"]);
    assert_eq!(ids(&log.read("t", PartitionId(1), 0, 10, usize::MAX).unwrap()), ["a"]);
}

/// A data directory written when events were rows of RocksDB is refused, with what to do.
#[test]
fn a_data_dir_of_the_rocksdb_log_is_refused_with_a_clear_message() {
    let dir = TempDir::new("old-layout");
    drop(db::open(&dir.0, 2).unwrap());
    {
        // What the earlier layout left: the shard count, no log layout.
        let db = db::open(&dir.0, 2).unwrap();
        db.delete_cf(db.cf_handle(db::META).unwrap(), b"layout/log").unwrap();
    }
    let Err(err) = db::open(&dir.0, 2) else { panic!("a data dir of the old layout was opened") };
    let err = err.to_string();
    assert!(err.contains("kept events in RocksDB") && err.contains("new data_dir"), "{err}");
}

/// Appends issued in the same turn of the event loop share one write; each still gets its own
/// dense offsets in call order, and all of them are durable when their futures resolve.
#[test]
fn concurrent_appends_share_a_write_and_keep_dense_offsets() {
    for &backend in ALL.iter().filter(|b| !matches!(b, Backend::Embedded(Durability::Memory))) {
        concurrent_appends(backend);
    }
}

fn concurrent_appends(backend: Backend) {
    let dir = TempDir::new(&format!("concurrent-{backend:?}"));
    let (log, names) = open(&dir, backend, &["t"]);
    let t = names[0].as_str();
    let firsts = block_on(async {
        let jobs = (0..50u64).map(|i| {
            let mut frames: Vec<Frame> = (0..=i % 3).map(|k| frame(t, &format!("{i}.{k}"), 1, 10)).collect();
            let log = &log;
            async move { log.append(t, PartitionId(0), &mut frames).await.unwrap() }
        });
        futures::future::join_all(jobs).await
    });
    let mut expected = 0;
    for (i, first) in firsts.iter().enumerate() {
        assert_eq!(*first, expected, "append {i}");
        expected += i as u64 % 3 + 1;
    }
    let got = ids(&log.read(t, PartitionId(0), 0, 1000, usize::MAX).unwrap());
    let want: Vec<String> = (0..50u64).flat_map(|i| (0..=i % 3).map(move |k| format!("{i}.{k}"))).collect();
    assert_eq!(got, want, "{backend:?}");
}

/// The same checks on the Kafka backend (its local copy is what reads see).
#[cfg(feature = "kafka")]
mod on_kafka {
    use super::*;

    #[test]
    #[ignore = "needs a Kafka-protocol broker at EVMESH_TEST_KAFKA (scripts/test.sh starts one)"]
    fn offsets_are_dense_per_partition_and_stamped() {
        dense_and_stamped(Backend::Kafka);
    }

    #[test]
    #[ignore = "needs a Kafka-protocol broker at EVMESH_TEST_KAFKA (scripts/test.sh starts one)"]
    fn retention_by_size_and_age_keeps_the_newest() {
        retention_keeps_the_newest(Backend::Kafka);
    }

    #[test]
    #[ignore = "needs a Kafka-protocol broker at EVMESH_TEST_KAFKA (scripts/test.sh starts one)"]
    fn concurrent_appends_share_a_write_and_keep_dense_offsets() {
        concurrent_appends(Backend::Kafka);
    }
}

#[cfg(feature = "rocketmq")]
mod on_rocketmq {
    use super::*;

    #[test]
    #[ignore = "needs a RocketMQ name server at EVMESH_TEST_ROCKETMQ (scripts/test.sh starts one)"]
    fn offsets_are_dense_per_partition_and_stamped() {
        dense_and_stamped(Backend::RocketMq);
    }

    #[test]
    #[ignore = "needs a RocketMQ name server at EVMESH_TEST_ROCKETMQ (scripts/test.sh starts one)"]
    fn retention_by_size_and_age_keeps_the_newest() {
        retention_keeps_the_newest(Backend::RocketMq);
    }

    #[test]
    #[ignore = "needs a RocketMQ name server at EVMESH_TEST_ROCKETMQ (scripts/test.sh starts one)"]
    fn concurrent_appends_share_a_write_and_keep_dense_offsets() {
        concurrent_appends(Backend::RocketMq);
    }
}

/// Reads by time: the first event at or after a time, from the segments' time index (and by
/// binary search on a lite topic), the end past the last.
#[test]
fn offsets_are_found_by_time() {
    for &backend in ALL {
        let dir = TempDir::new(&format!("by-time-{backend:?}"));
        let (log, names) = open(&dir, backend, &["t"]);
        for t in [names[0].as_str(), ":lite"] {
            for i in 0..10 {
                append(&log, t, 0, vec![frame(t, &i.to_string(), i * 1000, 10), frame(t, "b", i * 1000 + 500, 10)]);
            }
            let at = |us| log.offset_for_time(t, PartitionId(0), us).unwrap();
            assert_eq!(at(i64::MIN), 0, "{t}");
            assert_eq!(at(3_000), 6, "{t}");
            assert_eq!(at(3_001), 7, "{t}");
            assert_eq!(at(9_500), 19, "{t}");
            assert_eq!(at(9_501), 20, "{t}: after the last, the end");
        }
    }
}

type Dirs = std::collections::HashSet<PathBuf>;

/// A sync whose device fails the first time it is asked, then syncs.
fn fails_once(db: &rocksdb::DB, waiting: &[SyncTicket], dirs: &mut Dirs) -> Result<(), SyncError> {
    static FAILED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !FAILED.swap(true, std::sync::atomic::Ordering::SeqCst) {
        return Err(SyncError::Lost("fsync: Input/output error (os error 5)".into()));
    }
    Syncer::sync_all(db, waiting, dirs)
}

/// A sync that cannot open a directory the first time (out of descriptors), then syncs.
fn no_descriptor_once(db: &rocksdb::DB, waiting: &[SyncTicket], dirs: &mut Dirs) -> Result<(), SyncError> {
    static FAILED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !FAILED.swap(true, std::sync::atomic::Ordering::SeqCst) {
        return Err(SyncError::Transient(super::StorageError::Engine("opening segments: Too many open files".into())));
    }
    Syncer::sync_all(db, waiting, dirs)
}

/// Running out of descriptors for a moment fails that round's appends and nothing after.
#[test]
fn a_directory_that_cannot_be_opened_fails_only_its_round() {
    let dir = TempDir::new("fsync-transient");
    let db = db::open(&dir.0, 2).unwrap();
    let syncer = Syncer::start_with(db.clone(), no_descriptor_once).unwrap();
    let log = EmbeddedLog::new(db, logs(&dir, false), ShardId(0), Durability::Fsync, Some(syncer.clone()), HOUR);
    let try_append = |id: &str| block_on(log.append("t", PartitionId(0), &mut [frame("t", id, 1, 10)]));
    assert!(try_append("a").unwrap_err().to_string().contains("Too many open files"));
    assert_eq!(try_append("b"), Ok(1));
    assert!(syncer.failure().is_none());
}

/// After one failed fsync nothing more is acknowledged (Linux may have dropped the dirty pages
/// of the failed batch, so a later sync of the same file succeeding would prove nothing), and
/// the syncer says why; a restart reads back only what the log holds.
#[test]
fn a_failed_fsync_fails_every_later_append() {
    let dir = TempDir::new("fsync-fail");
    let db = db::open(&dir.0, 2).unwrap();
    let syncer = Syncer::start_with(db.clone(), fails_once).unwrap();
    let log = EmbeddedLog::new(db, logs(&dir, false), ShardId(0), Durability::Fsync, Some(syncer.clone()), HOUR);
    let try_append = |id: &str| block_on(log.append("t", PartitionId(0), &mut [frame("t", id, 1, 10)]));
    let first = try_append("a").unwrap_err();
    assert!(first.to_string().contains("Input/output error"), "{first}");
    for id in ["b", "c"] {
        let later = try_append(id).unwrap_err();
        assert!(later.to_string().contains("restart evmesh"), "{later}");
    }
    // Refused before they were written: only the event of the failed round is in the log (its
    // offset was taken), and nothing after it.
    assert_eq!(log.bounds("t", PartitionId(0)).unwrap(), Bounds { start: 0, end: 1 });
    assert!(syncer.failure().is_some_and(|why| why.contains("Input/output error")));
    assert!(block_on(syncer.sync_wal()).is_err(), "the WAL is not synced either");
}

/// A log whose segments are written with O_DIRECT (durability os), and its segment logs.
fn direct_log(dir: &TempDir) -> (std::rc::Rc<EmbeddedLog>, Arc<PartitionLogs>) {
    let db = db::open(&dir.0, 2).unwrap();
    let segments = logs(dir, false);
    let log = EmbeddedLog::new(db, segments.clone(), ShardId(0), Durability::Os, None, HOUR).with_direct_writes();
    (std::rc::Rc::new(log), segments)
}

/// Runs `f` on an io_uring runtime (direct writes go through its ring).
fn on_uring<F: std::future::Future>(f: F) -> F::Output {
    monoio::RuntimeBuilder::<monoio::IoUringDriver>::new().build().expect("io_uring").block_on(f)
}

/// Direct writes (O_DIRECT through io_uring) of a turn that staged more partitions than are
/// written at once: every write is laid out before the first is awaited, so an append made
/// while they are in flight is staged behind its partition's write and answered by its own
/// flush. Here that partition's write fails (its segment file removed, so no descriptor can be
/// opened for it): the append behind it fails too, never answered as stored.
#[test]
fn an_append_made_during_a_direct_flush_is_answered_by_its_own() {
    let dir = TempDir::new("direct-windows");
    let (log, segments) = direct_log(&dir);
    on_uring(async {
        let append = |p: u32, id: String| {
            let log = log.clone();
            monoio::spawn(async move { log.append("w", PartitionId(p), &mut [frame("w", &id, 1, 100)]).await })
        };
        let first: Vec<_> = (0..12).map(|p| append(p, format!("a{p}"))).collect();
        let writing = |p: u32| {
            segments.with("w", PartitionId(p), |l| Ok(l.next_offset() > l.bounds().1 && !l.is_staged())).unwrap()
        };
        while !writing(0) {
            crate::task::yield_now().await;
        }
        // The first partitions' writes are in flight, the last one's is laid out and waits.
        assert!(writing(11));
        std::fs::remove_file(segments.dir("w", PartitionId(11)).join(format!("{:020}.log", 0))).unwrap();
        let behind = append(11, "x".into()).await;
        let results: Vec<_> = futures::future::join_all(first).await;
        for (p, r) in results.iter().enumerate().take(11) {
            assert_eq!(r.as_ref().ok(), Some(&0), "partition {p}");
        }
        assert!(results[11].is_err(), "its write could not be made");
        let behind = behind.expect_err("staged behind the failed write: not stored");
        assert!(behind.to_string().contains("an earlier write"), "{behind}");
    });
    assert_eq!(ids(&log.read("w", PartitionId(3), 0, 10, usize::MAX).unwrap()), ["a3"]);
}

/// A failed write of the lite topics' rows forgets their cached ends (the offsets it handed
/// out are not in the log). With direct writes a flush awaits the segments' writes: an append
/// staged meanwhile holds an offset past the failed batch, and forgetting its topic's end
/// after that let the next append take it again and overwrite an acknowledged event. The
/// lite batch is written before anything is awaited: every acknowledged event stays, each at
/// its own offset, in append order.
#[test]
fn a_failed_lite_write_never_hands_out_an_offset_twice() {
    let dir = TempDir::new("direct-lite-fail");
    let (log, segments) = direct_log(&dir);
    on_uring(async {
        let append = |topic: &'static str, ids: &[&str]| {
            let (log, mut frames) = (log.clone(), ids.iter().map(|id| frame(topic, id, 1, 10)).collect::<Vec<_>>());
            monoio::spawn(async move { log.append(topic, PartitionId(0), &mut frames).await })
        };
        let writing =
            |topic| segments.with(topic, PartitionId(0), |l| Ok(l.next_offset() > l.bounds().1 && !l.is_staged()));
        log.fail_lite_writes(1);
        let (a, s1) = (append(":lite", &["a"]), append("s1", &["s1"]));
        while !writing("s1").unwrap() {
            crate::task::yield_now().await;
        }
        // While s1's direct write is in flight: b, and a segment write its flush will await.
        let (b, s2) = (append(":lite", &["b"]), append("s2", &["s2"]));
        assert!(a.await.is_err(), "its batch failed");
        let c = append(":lite", &["c1", "c2"]);
        let (b, c) = (b.await.expect("b stored"), c.await.expect("c stored"));
        assert_eq!((s1.await, s2.await), (Ok(0), Ok(0)));
        assert_eq!(c, b + 1, "offsets in append order");
    });
    let stored = ids(&log.read(":lite", PartitionId(0), 0, 10, usize::MAX).unwrap());
    assert_eq!(stored, ["b", "c1", "c2"], "every acknowledged event, each at its own offset");
}

/// While the core has time an append (os durability) is written at once: its future is ready
/// at its first poll, before any other task ran. Under load it waits for the turn's flush,
/// which appends made meanwhile join.
#[test]
fn an_append_is_written_at_once_while_the_core_has_time_and_batched_under_load() {
    use crate::task::tests::{busy_windows, idle_window};
    let dir = TempDir::new("at-once");
    let log = log(&dir, Durability::Os);
    block_on(async {
        idle_window();
        let mut a = [frame("t", "a", 1, 10)];
        let mut first = std::pin::pin!(log.append("t", PartitionId(0), &mut a));
        assert_eq!(futures::poll!(first.as_mut()), std::task::Poll::Ready(Ok(0)), "written at once");
        busy_windows().await;
        let (mut b, mut c) = ([frame("t", "b", 1, 10)], [frame("t", "c", 1, 10)]);
        let mut second = std::pin::pin!(log.append("t", PartitionId(0), &mut b));
        assert!(futures::poll!(second.as_mut()).is_pending(), "under load: staged for the flush");
        let third = log.append("t", PartitionId(0), &mut c);
        assert_eq!(futures::join!(second, third), (Ok(1), Ok(2)));
    });
    assert_eq!(ids(&log.read("t", PartitionId(0), 0, 10, usize::MAX).unwrap()), ["a", "b", "c"]);
}

/// A write made at once that fails (the partition's directory gone when its segment rolls)
/// fails its append, and its offset is handed out again: no gap, nothing answered as stored.
#[test]
fn a_failed_write_at_once_fails_its_append_and_leaves_no_gap() {
    use crate::task::tests::idle_window;
    let dir = TempDir::new("at-once-fail");
    let segments = logs(&dir, false);
    let log = EmbeddedLog::new(db::open(&dir.0, 2).unwrap(), segments.clone(), ShardId(0), Durability::Os, None, HOUR);
    // Each event over half a segment (64 KiB): the second rolls to a new file.
    let big = |id: &str| vec![frame("t", id, 1, 40 << 10)];
    block_on(async {
        idle_window();
        assert_eq!(log.append("t", PartitionId(0), &mut big("a")).await, Ok(0));
        std::fs::remove_dir_all(segments.dir("t", PartitionId(0))).unwrap();
        let mut b = big("b");
        let failed = futures::poll!(std::pin::pin!(log.append("t", PartitionId(0), &mut b)));
        assert!(matches!(failed, std::task::Poll::Ready(Err(_))), "failed at once: {failed:?}");
    });
    assert_eq!(log.bounds("t", PartitionId(0)).unwrap(), Bounds { start: 0, end: 1 });
    assert_eq!(log.next_offset_of("t", PartitionId(0)).unwrap(), 1, "b's offset is handed out again");
}
