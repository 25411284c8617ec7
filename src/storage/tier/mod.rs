//! Tiered storage of the embedded log: sealed segments (with their indexes) copied to an S3
//! bucket, a manifest per partition saying which, and reads of the history below the local
//! start from there.
//!
//! [`Tier`] is the process's one handle: the bucket (`object_store`'s S3 client, on a tokio
//! runtime of its own, one worker: thread `evmesh-tier`), the manifests (loaded at start, then
//! kept by the uploads), and the read cache (`cache`). The shards never wait on the bucket:
//!
//! * **Uploads** are the runtime's task on the tier's runtime (`runtime::tier`): it hands each
//!   partition's sealed segments to [`Tier::upload`], which creates their objects (never
//!   overwriting: `If-None-Match: *`), then a new generation of the manifest; only then is the
//!   local copy allowed to go (`PartitionLog::drop_uploaded`, by `local_retention_*`).
//! * **Reads** below the local start ([`Tier::read`]) are served from the cache; a chunk not
//!   there is fetched in the background (with the next few: read-ahead) and the read answers
//!   [`FETCHING`] at once (a shard's delivery tries again shortly); the admin API's reads wait.
//!
//! The objects' keys and the manifest are in `manifest`.

mod cache;
mod manifest;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use frame_codec::Frame;
use futures::TryStreamExt;
use object_store::aws::{AmazonS3, AmazonS3Builder, S3ConditionalPut};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};

use super::segment::{read_detached, SegmentInfo};
use super::{StorageError, TopicMeta};
use cache::{Cache, Look, CHUNK};
pub use manifest::{dir_name, Keys, Manifest, TieredSegment, TopicRecord};

/// What a read of tiered history answers while the bytes it needs are being fetched: the
/// caller asks again (a shard's delivery, shortly) or waits ([`Tier::read`] with a wait).
pub const FETCHING: &str = "tiered history is being fetched from the bucket";

/// What a read of tiered history answers while the bucket cannot be read (a fetch of what it
/// needs failed within the last second): the reader asks again later.
pub const UNREACHABLE: &str = "the bucket holding this tiered history cannot be read now";

/// Chunks fetched ahead of the one a read stopped at (and of the last one it read).
const READ_AHEAD: u64 = 4;
/// Fetches in flight at once, at most.
const MAX_FETCHES: usize = 16;

/// `tier.s3.*` and the local retention, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierSettings {
    pub bucket: String,
    /// Empty: AWS's endpoint for the region.
    pub endpoint: String,
    pub region: String,
    /// No leading or trailing `/`; may be empty.
    pub prefix: String,
    pub upload_interval: Duration,
    pub cache_bytes: u64,
    pub local_retention_bytes: Option<u64>,
    pub local_retention_ms: Option<u64>,
}

/// Counters for `/metrics`.
#[derive(Default)]
pub struct TierMetrics {
    pub uploaded_segments: AtomicU64,
    pub uploaded_bytes: AtomicU64,
    pub upload_failures: AtomicU64,
    pub conflicts: AtomicU64,
    pub fetched_bytes: AtomicU64,
    pub fetch_failures: AtomicU64,
    pub local_deleted: AtomicU64,
    pub tiered_deleted: AtomicU64,
}

/// How a manifest generation's write went.
enum Committed {
    Done,
    /// Our own earlier write of it was there (its answer lost): taken as the manifest.
    Adopted,
    /// Another writer's: the partition's uploads stop.
    Conflict,
}

/// How a create-only put went.
enum Created {
    /// Made now.
    New,
    /// There already, with these very bytes (an earlier attempt whose answer was lost).
    Same,
    /// There already with other bytes: someone else's; not overwritten.
    Other,
}

/// A fetch in flight: its outcome goes to the cache once, and a fetch dropped before it
/// finished (its task cancelled at shutdown, or panicking) counts as failed, so its chunk is
/// never waited for forever.
struct Fetch {
    tier: Arc<Tier>,
    key: Option<cache::ChunkKey>,
}

impl Fetch {
    fn done(mut self, got: Result<Bytes, String>) {
        let k = self.key.take().expect("done once");
        let m = &self.tier.metrics;
        match &got {
            Ok(b) => m.fetched_bytes.fetch_add(b.len() as u64, Ordering::Relaxed),
            Err(e) => {
                crate::log::warn("tier", &format!("reading {} from the bucket: {e}", k.0), &[]);
                m.fetch_failures.fetch_add(1, Ordering::Relaxed)
            }
        };
        self.tier.cache.lock().unwrap_or_else(|e| e.into_inner()).fetched(k, got);
    }
}

impl Drop for Fetch {
    fn drop(&mut self) {
        if let Some(k) = self.key.take() {
            let failed = Err("the fetch ended unfinished".to_owned());
            self.tier.cache.lock().unwrap_or_else(|e| e.into_inner()).fetched(k, failed);
        }
    }
}

/// The process's handle on the bucket.
pub struct Tier {
    settings: TierSettings,
    rt: tokio::runtime::Runtime,
    store: Arc<AmazonS3>,
    manifests: Mutex<HashMap<PartKey, Arc<Manifest>>>,
    /// Partitions whose objects or manifest someone else wrote: not uploaded to again by this
    /// process (their local copies stay).
    conflicted: Mutex<HashSet<PartKey>>,
    /// Topics whose record this process has written (or found).
    recorded: Mutex<HashSet<Box<str>>>,
    /// Partitions whose manifest was looked for in the bucket (at start, or before their first
    /// upload).
    checked: Mutex<HashSet<PartKey>>,
    /// This process, as the writer of the manifests it writes (random).
    writer: u64,
    cache: Mutex<Cache>,
    pub metrics: TierMetrics,
}

/// A partition: its topic and number.
type PartKey = (Box<str>, u32);

fn key(topic: &str, partition: u32) -> PartKey {
    (topic.into(), partition)
}

fn s3_error(e: object_store::Error) -> String {
    e.to_string()
}

impl Tier {
    /// The bucket's client and the runtime it runs on; nothing asked of the bucket yet.
    pub fn new(settings: TierSettings) -> Result<Arc<Tier>, String> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("evmesh-tier")
            .enable_all()
            .build()
            .map_err(|e| format!("the tier's runtime: {e}"))?;
        let retry = object_store::RetryConfig {
            backoff: object_store::BackoffConfig {
                init_backoff: Duration::from_millis(100),
                max_backoff: Duration::from_secs(2),
                base: 2.0,
            },
            max_retries: 2,
            retry_timeout: Duration::from_secs(10),
        };
        let options = object_store::ClientOptions::new()
            .with_timeout(Duration::from_secs(60))
            .with_connect_timeout(Duration::from_secs(5))
            .with_allow_http(settings.endpoint.starts_with("http://"));
        let mut b = AmazonS3Builder::from_env()
            .with_bucket_name(&settings.bucket)
            .with_region(&settings.region)
            .with_conditional_put(S3ConditionalPut::ETagMatch)
            .with_retry(retry)
            .with_client_options(options);
        if !settings.endpoint.is_empty() {
            b = b.with_endpoint(&settings.endpoint).with_virtual_hosted_style_request(false);
        }
        let store = Arc::new(b.build().map_err(|e| format!("tier.s3: {e}"))?);
        Ok(Arc::new(Tier {
            cache: Mutex::new(Cache::new(settings.cache_bytes)),
            settings,
            rt,
            store,
            manifests: Mutex::default(),
            conflicted: Mutex::default(),
            recorded: Mutex::default(),
            checked: Mutex::default(),
            writer: {
                use std::hash::{BuildHasher, Hasher};
                let mut h = std::collections::hash_map::RandomState::new().build_hasher();
                h.write_i64(crate::model::clock::now_micros());
                h.write_u32(std::process::id());
                h.finish()
            },
            metrics: TierMetrics::default(),
        }))
    }

    pub fn settings(&self) -> &TierSettings {
        &self.settings
    }

    /// Runs `f` on the tier's runtime (the uploads).
    pub fn spawn(&self, f: impl std::future::Future<Output = ()> + Send + 'static) {
        self.rt.spawn(f);
    }

    /// Waits for `f` on the tier's runtime (from a thread that is not the tier's).
    pub fn block_on<T>(&self, f: impl std::future::Future<Output = T>) -> T {
        self.rt.block_on(f)
    }

    fn path(&self, key: &str) -> Path {
        Path::from(key)
    }

    /// Reads the bucket's topics and their partitions' manifests (at start, before any shard
    /// runs): the topics, for the caller to make those it does not have. A record that is not
    /// one (or names no valid topic) is skipped; an unreadable manifest stops that partition's
    /// uploads (its objects are never overwritten).
    pub async fn load(&self) -> Result<Vec<TopicRecord>, String> {
        let topics = Path::from(manifest::join(&self.settings.prefix, "topics"));
        let listed: Vec<_> = self.store.list(Some(&topics)).try_collect().await.map_err(s3_error)?;
        let mut out = Vec::new();
        for o in listed.iter().filter(|o| o.location.as_ref().ends_with(".json")) {
            let bytes = self.store.get(&o.location).await.map_err(s3_error)?.bytes().await.map_err(s3_error)?;
            let record = serde_json::from_slice::<TopicRecord>(&bytes).ok().filter(|r| {
                crate::model::valid_topic(&r.name) && (1..=crate::model::MAX_PARTITIONS).contains(&r.meta.partitions)
            });
            let Some(record) = record else {
                crate::log::warn("tier", &format!("{}: not a topic record, skipped", o.location), &[]);
                continue;
            };
            for p in 0..record.meta.partitions {
                if let Some(m) = self.latest(&record.name, p).await? {
                    self.manifests.lock().unwrap_or_else(|e| e.into_inner()).insert(key(&record.name, p), Arc::new(m));
                }
                self.checked.lock().unwrap_or_else(|e| e.into_inner()).insert(key(&record.name, p));
            }
            self.recorded.lock().unwrap_or_else(|e| e.into_inner()).insert(record.name.as_str().into());
            out.push(record);
        }
        Ok(out)
    }

    /// A partition's newest manifest generation in the bucket (one that does not parse stops
    /// the partition's uploads: `None`).
    async fn latest(&self, topic: &str, partition: u32) -> Result<Option<Manifest>, String> {
        let keys = Keys::new(&self.settings.prefix, topic, partition);
        let listed: Vec<_> =
            self.store.list(Some(&self.path(&keys.manifests()))).try_collect().await.map_err(s3_error)?;
        let Some(newest) = listed.iter().map(|o| &o.location).filter(|l| l.as_ref().ends_with(".json")).max() else {
            return Ok(None);
        };
        let bytes = self.store.get(newest).await.map_err(s3_error)?.bytes().await.map_err(s3_error)?;
        match serde_json::from_slice::<Manifest>(&bytes) {
            Ok(m) if m.topic == topic && m.partition == partition => Ok(Some(m)),
            Ok(_) => {
                self.conflict(topic, partition, &format!("{newest} names another partition"));
                Ok(None)
            }
            Err(e) => {
                self.conflict(topic, partition, &format!("{newest} is not a manifest ({e})"));
                Ok(None)
            }
        }
    }

    /// What the bucket holds of a partition (`None`: nothing).
    pub fn manifest(&self, topic: &str, partition: u32) -> Option<Arc<Manifest>> {
        self.manifests.lock().unwrap_or_else(|e| e.into_inner()).get(&key(topic, partition)).cloned()
    }

    /// Creates `path` with `bytes` unless an object is there already (`If-None-Match: *`);
    /// one found there is ours only if its ETag is our bytes' MD5 (a single-part upload's).
    async fn create(&self, path: &str, bytes: Bytes) -> Result<Created, String> {
        let path = self.path(path);
        let opts = PutOptions { mode: PutMode::Create, ..PutOptions::default() };
        match self.store.put_opts(&path, PutPayload::from_bytes(bytes.clone()), opts).await {
            Ok(_) => Ok(Created::New),
            Err(object_store::Error::AlreadyExists { .. }) => {
                let there = self.store.head(&path).await.map_err(s3_error)?;
                use md5::Digest;
                let ours: String = md5::Md5::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect();
                let same = there.e_tag.as_deref().map(|e| e.trim_matches('"')) == Some(ours.as_str());
                Ok(if same { Created::Same } else { Created::Other })
            }
            Err(e) => Err(s3_error(e)),
        }
    }

    /// Writes `m` as a new generation (with this process as its writer); the one before the
    /// previous is deleted behind it. A generation found there already is ours when its writer
    /// is this process (an answer lost on the way: it is taken as the manifest, and the pass
    /// ends), another's otherwise (a conflict).
    async fn commit(&self, keys: &Keys, m: &mut Manifest) -> Result<Committed, String> {
        m.writer = self.writer;
        let json = serde_json::to_vec(&*m).map_err(|e| e.to_string())?;
        let path = keys.manifest(m.generation);
        if let Created::Other = self.create(&path, json.into()).await? {
            let bytes = self.store.get(&self.path(&path)).await.map_err(s3_error)?.bytes().await.map_err(s3_error)?;
            return Ok(match serde_json::from_slice::<Manifest>(&bytes) {
                Ok(there) if there.writer == self.writer => {
                    self.set_manifest(there);
                    Committed::Adopted
                }
                _ => {
                    let why = format!("{path} was written by another writer (another instance on the same prefix?)");
                    self.conflict(&m.topic, m.partition, &why);
                    Committed::Conflict
                }
            });
        }
        if m.generation >= 2 {
            let _ = self.store.delete(&self.path(&keys.manifest(m.generation - 2))).await;
        }
        self.set_manifest(m.clone());
        Ok(Committed::Done)
    }

    fn set_manifest(&self, m: Manifest) {
        self.manifests.lock().unwrap_or_else(|e| e.into_inner()).insert(key(&m.topic, m.partition), Arc::new(m));
    }

    /// Stops a partition's uploads for the life of the process (its local copies stay).
    fn conflict(&self, topic: &str, partition: u32, why: &str) {
        self.metrics.conflicts.fetch_add(1, Ordering::Relaxed);
        self.conflicted.lock().unwrap_or_else(|e| e.into_inner()).insert(key(topic, partition));
        let line = format!(
            "{topic}/{partition}: {why}: nothing there is overwritten; this partition is not uploaded any more \
             and its local copies stay"
        );
        crate::log::warn("tier", &line, &[]);
    }

    /// Uploads a partition's sealed segments (`dir`'s files, oldest first) that the bucket does
    /// not hold, each followed by a new manifest generation, and deletes from the bucket what
    /// the topic's retention passed (`start`, its first offset kept). Returns the manifest
    /// after it (`None`: the bucket holds nothing of the partition). An error leaves the
    /// manifest as the bucket has it: the next pass goes on from there.
    pub async fn upload(
        &self,
        (topic, partition, meta): (&str, u32, TopicMeta),
        dir: &std::path::Path,
        sealed: &[SegmentInfo],
        start: u64,
    ) -> Result<Option<Arc<Manifest>>, String> {
        if self.conflicted.lock().unwrap_or_else(|e| e.into_inner()).contains(&key(topic, partition)) {
            return Ok(None);
        }
        let keys = Keys::new(&self.settings.prefix, topic, partition);
        let mut m = match self.manifest(topic, partition) {
            Some(m) => (*m).clone(),
            None => self.first_manifest(topic, partition).await?,
        };
        if self.conflicted.lock().unwrap_or_else(|e| e.into_inner()).contains(&key(topic, partition)) {
            return Ok(None);
        }
        let gone = m.drain_below(start);
        let moved = !gone.is_empty() || (start > m.start && m.generation > 0);
        m.start = m.start.max(start);
        if moved {
            m.generation += 1;
            if !matches!(self.commit(&keys, &mut m).await?, Committed::Done) {
                return Ok(self.manifest(topic, partition));
            }
        }
        for g in gone {
            let _ = self.store.delete(&self.path(&keys.segment(g.base))).await;
            let _ = self.store.delete(&self.path(&keys.index(g.base))).await;
            self.metrics.tiered_deleted.fetch_add(1, Ordering::Relaxed);
        }
        for s in sealed {
            let wanted = if m.segments.is_empty() { s.next > m.start } else { s.base >= m.end() };
            if !wanted {
                continue;
            }
            if !m.segments.is_empty() && s.base != m.end() {
                let line =
                    format!("{topic}/{partition}: segment {} does not follow the bucket's end {}", s.base, m.end());
                return Err(line);
            }
            let (log, index) = super::segment::files(dir, s.base);
            let read = |p: std::path::PathBuf| async move {
                tokio::task::spawn_blocking(move || std::fs::read(p)).await.map_err(|e| e.to_string())
            };
            let (bytes, index_bytes) = match (read(log).await?, read(index).await?) {
                (Ok(b), Ok(i)) => (Bytes::from(b), Bytes::from(i)),
                // Retention deleted it meanwhile.
                (Err(e), _) | (_, Err(e)) if e.kind() == std::io::ErrorKind::NotFound => break,
                (Err(e), _) | (_, Err(e)) => return Err(format!("{topic}/{partition} segment {}: {e}", s.base)),
            };
            if bytes.len() as u64 != s.bytes {
                return Err(format!(
                    "{topic}/{partition} segment {}: {} bytes, {} known",
                    s.base,
                    bytes.len(),
                    s.bytes
                ));
            }
            self.record_topic(topic, meta).await?;
            for (path, b) in [(keys.segment(s.base), bytes.clone()), (keys.index(s.base), index_bytes.clone())] {
                if let Created::Other = self.create(&path, b).await? {
                    self.conflict(topic, partition, &format!("{path} is in the bucket already with other bytes"));
                    return Ok(self.manifest(topic, partition));
                }
            }
            m.segments.push(TieredSegment {
                base: s.base,
                next: s.next,
                bytes: s.bytes,
                max_ts: s.max_ts,
                index_bytes: index_bytes.len() as u64,
            });
            m.generation += 1;
            if !matches!(self.commit(&keys, &mut m).await?, Committed::Done) {
                return Ok(self.manifest(topic, partition));
            }
            self.metrics.uploaded_segments.fetch_add(1, Ordering::Relaxed);
            self.metrics.uploaded_bytes.fetch_add(s.bytes + index_bytes.len() as u64, Ordering::Relaxed);
        }
        Ok(self.manifest(topic, partition))
    }

    /// The manifest a partition's first upload of this process starts from: the bucket's,
    /// when one was not loaded at start (a record missing or written meanwhile), so no
    /// generation is ever written twice; a new one otherwise.
    async fn first_manifest(&self, topic: &str, partition: u32) -> Result<Manifest, String> {
        let k = key(topic, partition);
        if !self.checked.lock().unwrap_or_else(|e| e.into_inner()).contains(&k) {
            if let Some(m) = self.latest(topic, partition).await? {
                self.set_manifest(m.clone());
                self.checked.lock().unwrap_or_else(|e| e.into_inner()).insert(k);
                return Ok(m);
            }
            self.checked.lock().unwrap_or_else(|e| e.into_inner()).insert(k);
        }
        Ok(Manifest::new(topic, partition))
    }

    /// Writes the topic's record once (an instance starting on an empty disk makes its topics
    /// from these); one there already is kept.
    async fn record_topic(&self, topic: &str, meta: TopicMeta) -> Result<(), String> {
        if self.recorded.lock().unwrap_or_else(|e| e.into_inner()).contains(topic) {
            return Ok(());
        }
        let record = TopicRecord { name: topic.to_owned(), meta };
        let path = manifest::join(&self.settings.prefix, &format!("topics/{}.json", dir_name(topic)));
        self.create(&path, serde_json::to_vec(&record).map_err(|e| e.to_string())?.into()).await?;
        self.recorded.lock().unwrap_or_else(|e| e.into_inner()).insert(topic.into());
        Ok(())
    }

    /// The first offset at or after which events of `ts_us` or later may be, from the bucket's
    /// segments' newest times (a whole segment's start: what is before it in that segment is
    /// older, what it skips is older); `None` when the bucket holds nothing that recent.
    pub fn offset_for_time(&self, topic: &str, partition: u32, ts_us: i64) -> Option<u64> {
        let m = self.manifest(topic, partition)?;
        let s = m.segments.iter().find(|s| s.max_ts >= ts_us)?;
        Some(s.base.max(m.start))
    }

    /// Up to `max` events from `from` (stopping after the one that reaches `max_bytes`, and
    /// at the end of the bucket's segment holding `from`); empty when the bucket does not hold
    /// `from`. Bytes not in the cache are fetched (with read-ahead) and the read answers
    /// [`FETCHING`] at once: the reader asks again.
    pub fn read(
        self: &Arc<Self>,
        (topic, partition): (&str, u32),
        from: u64,
        (max, max_bytes): (usize, usize),
    ) -> Result<Vec<Frame>, StorageError> {
        let Some(m) = self.manifest(topic, partition) else { return Ok(Vec::new()) };
        let from = from.max(m.start);
        let Some(s) = m.holding(from).copied() else { return Ok(Vec::new()) };
        let keys = Keys::new(&self.settings.prefix, topic, partition);
        let (log, index): (Arc<str>, Arc<str>) = (keys.segment(s.base).into(), keys.index(s.base).into());
        let start = self.index_floor(&index, s.index_bytes, s.base, from)?;
        let mut last = 0;
        let mut missing = None;
        let mut failed = None;
        let mut at = |pos: u64, len: usize| {
            let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            match cache.range(&log, pos, len) {
                Look::Here(b) => {
                    last = pos + len as u64;
                    Some(b)
                }
                Look::Missing(c) => {
                    missing = Some(c);
                    None
                }
                Look::Failed(why) => {
                    failed = Some(why);
                    None
                }
            }
        };
        let name = std::path::PathBuf::from(log.as_ref());
        let read = read_detached(&mut at, (s.bytes, start), (from, max, max_bytes), &name)
            .map_err(|e| StorageError::Engine(e.to_string()))?;
        // Read ahead of where this read stopped, or of the last chunk it read.
        let ahead = missing.unwrap_or(last.div_ceil(CHUNK));
        self.fetch(&log, s.bytes, ahead..ahead + READ_AHEAD);
        match (read.frames.is_empty(), failed, missing) {
            (true, Some(_), _) => Err(StorageError::Unavailable(UNREACHABLE)),
            (true, None, Some(_)) => Err(StorageError::Unavailable(FETCHING)),
            _ => Ok(read.frames),
        }
    }

    /// Where a read of `offset` starts in the segment whose index object (of `size` bytes) is
    /// `index`: a binary search over its entries in the cache, nothing copied but the entries
    /// looked at. An entry not cached: its chunk is fetched, [`FETCHING`].
    fn index_floor(self: &Arc<Self>, index: &Arc<str>, size: u64, base: u64, offset: u64) -> Result<u64, StorageError> {
        let mut missing = Ok(());
        let floor = {
            let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            let entry = |i: usize| match cache.entry(index, i as u64 * 16) {
                Ok(e) => Some(e),
                Err(look) => {
                    missing = Err(look);
                    None
                }
            };
            super::segment::index_floor((size / 16) as usize, entry, base, offset)
        };
        match (floor, missing) {
            (Some(pos), _) => Ok(pos),
            (None, Err(Look::Missing(c))) => {
                self.fetch(index, size, c..c + 1);
                Err(StorageError::Unavailable(FETCHING))
            }
            (None, _) => Err(StorageError::Unavailable(UNREACHABLE)),
        }
    }

    /// Fetches the chunks `chunks` of `object` (of `size` bytes) not cached nor on their way,
    /// [`MAX_FETCHES`] in flight at most.
    fn fetch(self: &Arc<Self>, object: &Arc<str>, size: u64, chunks: std::ops::Range<u64>) {
        let mut wanted = Vec::new();
        {
            let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            for c in chunks.take_while(|c| c * CHUNK < size) {
                let k = (object.clone(), c);
                if !cache.has(&k) && cache.inflight.len() < MAX_FETCHES {
                    cache.inflight.insert(k.clone());
                    wanted.push(k);
                }
            }
        }
        // Spawned with the cache let go: a task dropped unstarted (at shutdown) takes it.
        for k in wanted {
            let c = k.1;
            let guard = Fetch { tier: self.clone(), key: Some(k) };
            self.rt.spawn(async move {
                let k = guard.key.clone().expect("set until done");
                let range = c * CHUNK..((c + 1) * CHUNK).min(size);
                let got = guard.tier.store.get_range(&guard.tier.path(&k.0), range).await.map_err(s3_error);
                guard.done(got);
            });
        }
    }

    /// The tier's lines of `/metrics`.
    pub fn render(&self, out: &mut String) {
        let m = &self.metrics;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let held = self.cache.lock().unwrap_or_else(|e| e.into_inner()).held();
        for (name, kind, help, v) in [
            (
                "evmesh_tier_uploaded_segments_total",
                "counter",
                "Sealed segments uploaded to the bucket",
                load(&m.uploaded_segments),
            ),
            (
                "evmesh_tier_uploaded_bytes_total",
                "counter",
                "Bytes of segments and indexes uploaded",
                load(&m.uploaded_bytes),
            ),
            (
                "evmesh_tier_upload_failures_total",
                "counter",
                "Upload passes that failed (retried; local copies kept)",
                load(&m.upload_failures),
            ),
            (
                "evmesh_tier_conflicts_total",
                "counter",
                "Objects found in the bucket with other bytes: not overwritten, that partition's uploads stopped",
                load(&m.conflicts),
            ),
            (
                "evmesh_tier_fetched_bytes_total",
                "counter",
                "Bytes of tiered history read back from the bucket",
                load(&m.fetched_bytes),
            ),
            (
                "evmesh_tier_fetch_failures_total",
                "counter",
                "Reads from the bucket that failed",
                load(&m.fetch_failures),
            ),
            (
                "evmesh_tier_local_deleted_total",
                "counter",
                "Local segment copies deleted after their upload was confirmed",
                load(&m.local_deleted),
            ),
            (
                "evmesh_tier_deleted_total",
                "counter",
                "Segments deleted from the bucket by the topic's retention",
                load(&m.tiered_deleted),
            ),
            (
                "evmesh_tier_cache_bytes",
                "gauge",
                "Bytes of tiered history held in memory (tier.s3.cache_bytes at most)",
                held,
            ),
        ] {
            out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}\n"));
        }
    }
}
