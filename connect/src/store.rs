//! The connectors' own offsets (RocksDB in `--data-dir`): each source's committed position
//! (`pos/<name>`), and what sinks keep to write exactly once (`sink/<name>/...`). Every write
//! is synced before it returns: a position stored is a position kept across kill -9.

use std::path::Path;
use std::sync::Arc;

use crate::spi::Position;

/// The store, shared by every connector.
#[derive(Clone)]
pub struct Store {
    db: Arc<rocksdb::DB>,
}

/// A store failure (the disk); the connector that met it retries.
#[derive(Debug, thiserror::Error)]
#[error("offsets store: {0}")]
pub struct StoreError(String);

impl StoreError {
    pub fn from_io(path: &Path, e: std::io::Error) -> Self {
        StoreError(format!("{}: {e}", path.display()))
    }
}

impl From<rocksdb::Error> for StoreError {
    fn from(e: rocksdb::Error) -> Self {
        StoreError(e.to_string())
    }
}

impl Store {
    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        let mut o = rocksdb::Options::default();
        o.create_if_missing(true);
        o.set_max_open_files(64);
        o.set_keep_log_file_num(2);
        let db = rocksdb::DB::open(&o, dir.join("offsets"))?;
        Ok(Store { db: Arc::new(db) })
    }

    fn synced() -> rocksdb::WriteOptions {
        let mut w = rocksdb::WriteOptions::default();
        w.set_sync(true);
        w
    }

    /// Source `name`'s committed position.
    pub fn position(&self, name: &str) -> Result<Option<Position>, StoreError> {
        let v = self.db.get(format!("pos/{name}"))?;
        v.map(|v| serde_json::from_slice(&v).map_err(|e| StoreError(format!("position of {name}: {e}")))).transpose()
    }

    /// Stores source `name`'s position (synced); `None` forgets it (the source starts over).
    pub fn set_position(&self, name: &str, position: Option<&Position>) -> Result<(), StoreError> {
        let key = format!("pos/{name}");
        match position {
            Some(p) => self.db.put_opt(key, serde_json::to_vec(p).expect("JSON serializes"), &Self::synced())?,
            None => self.db.delete_opt(key, &Self::synced())?,
        }
        Ok(())
    }

    /// Sink `name`'s own keys.
    pub fn scoped(&self, name: &str) -> Scoped {
        Scoped { store: self.clone(), prefix: format!("sink/{name}/") }
    }
}

/// The keys of one sink (under `sink/<name>/`).
#[derive(Clone)]
pub struct Scoped {
    store: Store,
    prefix: String,
}

impl Scoped {
    fn key(&self, k: &[u8]) -> Vec<u8> {
        [self.prefix.as_bytes(), k].concat()
    }

    pub fn get(&self, k: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.store.db.get(self.key(k))?)
    }

    pub fn contains(&self, k: &[u8]) -> Result<bool, StoreError> {
        Ok(self.store.db.get_pinned(self.key(k))?.is_some())
    }

    /// Writes these keys (a `None` value deletes) in one synced batch.
    pub fn write(&self, kvs: &[(Vec<u8>, Option<Vec<u8>>)]) -> Result<(), StoreError> {
        let mut b = rocksdb::WriteBatch::default();
        for (k, v) in kvs {
            match v {
                Some(v) => b.put(self.key(k), v),
                None => b.delete(self.key(k)),
            }
        }
        Ok(self.store.db.write_opt(b, &Store::synced())?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_and_sink_keys_survive_a_reopen() {
        let dir = std::env::temp_dir().join(format!("evmesh-connect-store-{}", fastrand::u64(..)));
        {
            let s = Store::open(&dir).unwrap();
            assert_eq!(s.position("a").unwrap(), None);
            s.set_position("a", Some(&serde_json::json!({"inode": 7, "offset": 42}))).unwrap();
            s.scoped("k").write(&[(b"seen".to_vec(), Some(b"1".to_vec()))]).unwrap();
        }
        let s = Store::open(&dir).unwrap();
        assert_eq!(s.position("a").unwrap(), Some(serde_json::json!({"inode": 7, "offset": 42})));
        assert!(s.scoped("k").contains(b"seen").unwrap());
        assert!(!s.scoped("other").contains(b"seen").unwrap(), "sinks' keys are their own");
        s.set_position("a", None).unwrap();
        assert_eq!(s.position("a").unwrap(), None);
        drop(s);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
