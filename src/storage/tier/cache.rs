//! History read back from the bucket: objects' bytes in aligned chunks of [`CHUNK`], at most
//! `cache_bytes` of them (the least recently used go first), with the fetches in flight and
//! those that failed lately (asked again after [`RETRY_AFTER`], not at every read).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

/// The unit of a fetch and of the cache.
pub const CHUNK: u64 = 1 << 20;
/// A fetch that failed is asked again after this long.
pub const RETRY_AFTER: Duration = Duration::from_secs(1);

/// Failed fetches remembered before the old ones are forgotten.
const MAX_FAILED: usize = 1024;

/// An object's chunk: its key and the chunk's number.
pub type ChunkKey = (Arc<str>, u64);

struct Kept {
    bytes: Bytes,
    used: u64,
}

/// What a look in the cache found for a range.
pub enum Look {
    Here(Vec<u8>),
    /// This chunk is not here (fetch it).
    Missing(u64),
    /// This chunk's fetch failed lately, why.
    Failed(String),
}

#[derive(Default)]
pub struct Cache {
    chunks: HashMap<ChunkKey, Kept>,
    bytes: u64,
    max: u64,
    tick: u64,
    pub inflight: HashSet<ChunkKey>,
    failed: HashMap<ChunkKey, (Instant, String)>,
}

impl Cache {
    pub fn new(max: u64) -> Cache {
        Cache { max, ..Cache::default() }
    }

    /// Bytes `pos..pos + len` of `object`, from its cached chunks.
    pub fn range(&mut self, object: &Arc<str>, pos: u64, len: usize) -> Look {
        let end = pos + len as u64;
        let mut out = Vec::with_capacity(len);
        for c in pos / CHUNK..end.div_ceil(CHUNK) {
            let key = (object.clone(), c);
            self.tick += 1;
            match self.chunks.get_mut(&key) {
                Some(k) => {
                    k.used = self.tick;
                    let from = pos.max(c * CHUNK) - c * CHUNK;
                    let to = (end.min((c + 1) * CHUNK) - c * CHUNK).min(k.bytes.len() as u64);
                    if from >= to {
                        return Look::Failed(format!("{object}: shorter than the manifest says"));
                    }
                    out.extend_from_slice(&k.bytes[from as usize..to as usize]);
                }
                None => match self.failed.get(&key) {
                    Some((at, why)) if at.elapsed() < RETRY_AFTER => return Look::Failed(why.clone()),
                    _ => return Look::Missing(c),
                },
            }
        }
        if out.len() < len {
            return Look::Failed(format!("{object}: shorter than the manifest says"));
        }
        Look::Here(out)
    }

    /// The 16 bytes at `pos`, a multiple of 16 (an index entry: entries never cross a chunk),
    /// without copying anything else.
    pub fn entry(&mut self, object: &Arc<str>, pos: u64) -> Result<[u8; 16], Look> {
        let c = pos / CHUNK;
        self.tick += 1;
        match self.chunks.get_mut(&(object.clone(), c)) {
            Some(k) => {
                k.used = self.tick;
                let at = (pos - c * CHUNK) as usize;
                let e = k.bytes.get(at..at + 16).ok_or_else(|| Look::Failed(format!("{object}: shorter than said")))?;
                Ok(e.try_into().expect("16 bytes"))
            }
            None => match self.failed.get(&(object.clone(), c)) {
                Some((at, why)) if at.elapsed() < RETRY_AFTER => Err(Look::Failed(why.clone())),
                _ => Err(Look::Missing(c)),
            },
        }
    }

    /// Whether a chunk is here or on its way.
    pub fn has(&self, key: &ChunkKey) -> bool {
        self.chunks.contains_key(key) || self.inflight.contains(key)
    }

    /// A fetch's outcome: the chunk kept (the least recently used going to make room), or
    /// why it failed.
    pub fn fetched(&mut self, key: ChunkKey, got: Result<Bytes, String>) {
        self.inflight.remove(&key);
        match got {
            Ok(bytes) => {
                self.failed.remove(&key);
                self.bytes += bytes.len() as u64;
                self.tick += 1;
                if let Some(old) = self.chunks.insert(key, Kept { bytes, used: self.tick }) {
                    self.bytes -= old.bytes.len() as u64;
                }
                while self.bytes > self.max {
                    let Some(oldest) = self.chunks.iter().min_by_key(|(_, k)| k.used).map(|(k, _)| k.clone()) else {
                        break;
                    };
                    let gone = self.chunks.remove(&oldest).expect("just found");
                    self.bytes -= gone.bytes.len() as u64;
                }
            }
            Err(why) => {
                // Failures are kept only while they hold a chunk back: the map stays small
                // whatever was asked for (objects deleted since, say).
                if self.failed.len() >= MAX_FAILED {
                    self.failed.retain(|_, (at, _)| at.elapsed() < RETRY_AFTER);
                }
                self.failed.insert(key, (Instant::now(), why));
            }
        }
    }

    /// Bytes held now.
    pub fn held(&self) -> u64 {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_span_chunks_and_the_least_recently_used_go_past_the_budget() {
        let mut c = Cache::new(2 * CHUNK);
        let o: Arc<str> = "o".into();
        let chunk = |n: u8| Ok(Bytes::from(vec![n; CHUNK as usize]));
        assert!(matches!(c.range(&o, 10, 5), Look::Missing(0)));
        c.fetched((o.clone(), 0), chunk(1));
        c.fetched((o.clone(), 1), chunk(2));
        match c.range(&o, CHUNK - 2, 4) {
            Look::Here(b) => assert_eq!(b, [1, 1, 2, 2]),
            _ => panic!("both chunks are here"),
        }
        // Chunk 0 used last: chunk 1 goes for chunk 2.
        assert!(matches!(c.range(&o, 0, 1), Look::Here(_)));
        c.fetched((o.clone(), 2), chunk(3));
        assert_eq!(c.held(), 2 * CHUNK);
        assert!(matches!(c.range(&o, CHUNK, 1), Look::Missing(1)));
        assert!(matches!(c.range(&o, 0, 1), Look::Here(_)));
        assert_eq!(c.entry(&o, 16).ok(), Some([1; 16]), "an index entry, read in place");
        assert!(matches!(c.entry(&o, 3 * CHUNK), Err(Look::Missing(3))));
        c.fetched((o.clone(), 5), Err("down".into()));
        assert!(matches!(c.range(&o, 5 * CHUNK, 1), Look::Failed(w) if w == "down"));
    }
}
