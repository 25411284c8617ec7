//! The embedded log's fsync syncer: the helper thread that makes segment files and the RocksDB
//! WAL durable for `fsync` durability, group-committing the requests of many flushes into one
//! sync, and the poisoning that follows a failed one.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::channel::oneshot;
use rocksdb::DB;

use crate::storage::segment::Written;
use crate::storage::StorageError;

/// What a sync round does ([`Syncer::sync_all`], or a test's stand-in).
pub(in crate::storage) type SyncFn = fn(&DB, &[SyncTicket], &mut HashSet<PathBuf>) -> Result<(), SyncError>;

/// Why a sync round failed.
pub(in crate::storage) enum SyncError {
    /// Nothing was lost (a directory could not be opened); a later round retries.
    Transient(StorageError),
    /// The device refused a sync: what it held may be gone (this poisons the syncer).
    Lost(String),
}

/// What every sync, and every append, fails with once the syncer is poisoned.
pub(super) fn poisoned_error(why: &str) -> StorageError {
    StorageError::Engine(format!("an earlier {why}; restart evmesh to recover"))
}

/// What one flush asks the [`Syncer`] to make durable.
pub(in crate::storage) struct SyncTicket {
    files: Vec<Written>,
    wal: bool,
    done: oneshot::Sender<Result<(), StorageError>>,
}

/// The helper thread that syncs segment files and the WAL for `fsync` durability. Requests that
/// arrive while a sync runs are answered together by the next one: each file once, the WAL
/// once.
///
/// A failed sync poisons it for the life of the process: Linux reports a write-back error to
/// one `fsync` and may drop the dirty pages, so a later sync of the same file can succeed while
/// an earlier batch in the middle of it is gone; recovery would then cut the segment at that
/// hole and lose the batches acknowledged after it. So after the first failure every sync
/// fails and no append is written any more (they get 503: nothing new becomes readable),
/// `/readyz` says why, and a restart recovers from what is on disk. Not being able to open a
/// directory (out of descriptors) loses nothing: that round fails, and the directory is synced
/// by a later one before it answers.
#[derive(Clone)]
pub struct Syncer {
    tx: crossbeam_channel::Sender<SyncTicket>,
    failed: Arc<std::sync::OnceLock<String>>,
}

impl Syncer {
    pub fn start(db: Arc<DB>) -> std::io::Result<Syncer> {
        Self::start_with(db, Self::sync_all)
    }

    /// [`Syncer::start`] with `sync` doing the work (a test makes it fail).
    pub(in crate::storage) fn start_with(db: Arc<DB>, sync: SyncFn) -> std::io::Result<Syncer> {
        let (tx, rx) = crossbeam_channel::unbounded::<SyncTicket>();
        let failed = Arc::new(std::sync::OnceLock::<String>::new());
        let poisoned = failed.clone();
        std::thread::Builder::new().name("evmesh-fsync".into()).spawn(move || {
            // New directories whose entries are not synced yet (a round that could not open
            // one leaves it here for the next).
            let mut dirs = HashSet::new();
            while let Ok(first) = rx.recv() {
                let mut waiting = vec![first];
                waiting.extend(rx.try_iter());
                let result = match poisoned.get() {
                    Some(why) => Err(poisoned_error(why)),
                    None => match sync(&db, &waiting, &mut dirs) {
                        Ok(()) => Ok(()),
                        Err(SyncError::Transient(e)) => Err(e),
                        Err(SyncError::Lost(e)) => {
                            let _ = poisoned.set(e.clone());
                            Err(StorageError::Engine(e))
                        }
                    },
                };
                for t in waiting {
                    let _ = t.done.send(result.clone());
                }
            }
        })?;
        Ok(Syncer { tx, failed })
    }

    /// The first sync failure, if one happened (nothing has been durable since).
    pub fn failure(&self) -> Option<&str> {
        self.failed.get().map(String::as_str)
    }

    /// The sync of one round: new directories' entries, each file written once, the WAL.
    pub(in crate::storage) fn sync_all(
        db: &DB,
        waiting: &[SyncTicket],
        dirs: &mut HashSet<PathBuf>,
    ) -> Result<(), SyncError> {
        let lost = |e: std::io::Error| SyncError::Lost(format!("fsync: {e}"));
        // A new segment: its directory entry, and those of the directories above it up to
        // `segments/` (a partition's first segment created them).
        for w in waiting.iter().flat_map(|t| &t.files) {
            dirs.extend(w.created_in.iter().flat_map(|d| d.ancestors().take(3)).map(Path::to_path_buf));
        }
        while let Some(dir) = dirs.iter().next().cloned() {
            let d = std::fs::File::open(&dir)
                .map_err(|e| SyncError::Transient(StorageError::Engine(format!("opening {}: {e}", dir.display()))))?;
            d.sync_all().map_err(lost)?;
            dirs.remove(&dir);
        }
        // A set: a group may hold many partitions' files (one each, however many tickets name it).
        let mut synced: HashSet<*const std::fs::File> = HashSet::new();
        for w in waiting.iter().flat_map(|t| &t.files) {
            if synced.insert(Arc::as_ptr(&w.file)) {
                w.file.sync_data().map_err(lost)?;
            }
        }
        if waiting.iter().any(|t| t.wal) {
            db.flush_wal(true).map_err(|e| SyncError::Lost(format!("WAL sync: {}", e.into_string())))?;
        }
        Ok(())
    }

    /// Resolves once the WAL (metadata, offsets, lite topics) is on the device.
    pub async fn sync_wal(&self) -> Result<(), StorageError> {
        self.sync(Vec::new(), true).await
    }

    /// Resolves once `files` (and the WAL, with `wal`) are on the device.
    pub(super) async fn sync(&self, files: Vec<Written>, wal: bool) -> Result<(), StorageError> {
        let (done, rx) = oneshot::channel();
        let ticket = SyncTicket { files, wal, done };
        self.tx.send(ticket).map_err(|_| StorageError::Unavailable("fsync thread stopped"))?;
        rx.await.map_err(|_| StorageError::Unavailable("fsync thread stopped"))?
    }
}
