//! Opening the one RocksDB instance: its column families and their names.
//!
//! One `meta` family (topics, subscriptions, DLQ replay marks), and per shard `log.N` (the lite
//! topics owned by shard N) and `offsets.N` (subscription offsets). Names come only from this
//! module, and so does where the segment logs are (`segments_dir`).

use std::path::Path;
use std::sync::Arc;

use rocksdb::{ColumnFamilyDescriptor, Options, DB};

use super::StorageError;

pub const META: &str = "meta";

/// Files RocksDB keeps open at most unless the descriptor budget gives it less
/// (`config::fds::fd_budget`): bounded, so the connection caps can leave it room.
pub const MAX_OPEN_FILES: i32 = 512;

pub fn log_cf(shard: usize) -> String {
    format!("log.{shard}")
}

pub fn offsets_cf(shard: usize) -> String {
    format!("offsets.{shard}")
}

const SHARDS_KEY: &[u8] = b"layout/shards";
/// Where events are: absent in a data directory written before the segment log (events in
/// RocksDB), which this version does not read.
const LOG_KEY: &[u8] = b"layout/log";
const LOG_SEGMENTS: &[u8] = b"segments-1";

/// The directory of the partitions' segment logs, in the data directory.
pub fn segments_dir(data_dir: &Path) -> std::path::PathBuf {
    data_dir.join("segments")
}

/// Opens (creating if needed) the database under `dir` for `shards` shards.
///
/// The shard count decides which family holds a partition; a data directory written with another
/// count is refused rather than silently misread.
pub fn open(dir: &Path, shards: usize) -> Result<Arc<DB>, StorageError> {
    open_with(dir, shards, MAX_OPEN_FILES)
}

/// [`open`] with RocksDB keeping at most `max_open_files` files open (its table cache; the
/// WAL, manifest and lock file come on top).
pub fn open_with(dir: &Path, shards: usize, max_open_files: i32) -> Result<Arc<DB>, StorageError> {
    std::fs::create_dir_all(dir).map_err(|e| StorageError::Engine(format!("{}: {e}", dir.display())))?;
    let mut opts = Options::default();
    opts.create_if_missing(true);
    opts.create_missing_column_families(true);
    opts.set_max_background_jobs(2);
    opts.increase_parallelism(2);
    opts.set_keep_log_file_num(4);
    opts.set_max_open_files(max_open_files.max(16));
    let mut cf_opts = Options::default();
    cf_opts.set_write_buffer_size(64 << 20);
    cf_opts.set_compression_type(rocksdb::DBCompressionType::Lz4);
    let mut names = vec![META.to_string()];
    for s in 0..shards {
        names.push(log_cf(s));
        names.push(offsets_cf(s));
    }
    let existing = DB::list_cf(&opts, dir).unwrap_or_default();
    for name in existing {
        if name != "default" && !names.contains(&name) {
            names.push(name);
        }
    }
    let cfs = names.iter().map(|n| ColumnFamilyDescriptor::new(n, cf_opts.clone()));
    let db = DB::open_cf_descriptors(&opts, dir, cfs)?;
    let meta = db.cf_handle(META).expect("meta family was just opened");
    let fresh = db.get_cf(meta, SHARDS_KEY)?.is_none();
    match db.get_cf(meta, SHARDS_KEY)? {
        Some(v) if v != shards.to_string().as_bytes() => {
            return Err(StorageError::Engine(format!(
                "{} was written with shards = {}; start with that shard count (re-sharding an existing data directory is not supported yet)",
                dir.display(),
                String::from_utf8_lossy(&v)
            )));
        }
        Some(_) => {}
        None => db.put_cf(meta, SHARDS_KEY, shards.to_string())?,
    }
    match db.get_cf(meta, LOG_KEY)? {
        Some(v) if v == LOG_SEGMENTS => {}
        Some(v) => {
            return Err(StorageError::Engine(format!(
                "{} keeps its events in a layout this version does not know ({}); start with a new data_dir",
                dir.display(),
                String::from_utf8_lossy(&v)
            )));
        }
        None if fresh => db.put_cf(meta, LOG_KEY, LOG_SEGMENTS)?,
        None => {
            return Err(StorageError::Engine(format!(
                "{} was written by an evmesh that kept events in RocksDB; this version keeps them in segment files and does not read that layout: start with a new data_dir (no version with the old layout was released, so there is no converter)",
                dir.display()
            )));
        }
    }
    Ok(Arc::new(db))
}
