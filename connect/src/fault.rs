//! Fault injection for the tests: with `EVMESH_CONNECT_TEST_FAULT=<point>:<n>` the process
//! aborts, as kill -9 would (nothing flushed, nothing closed), the `n`-th time it reaches
//! `point`. The points are the windows a crash must not lose or duplicate anything in:
//!
//! * `source-published`: a batch is in evmesh (202), its position not stored yet;
//! * `sink-flushed`: a batch is written and flushed, not acked yet;
//! * `file-sink-synced`: the file sink's lines are synced, their keys not stored yet;
//! * `file-sink-torn`: the file sink wrote half of a batch's bytes (a torn last line).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// Aborts the process if the configured fault is this point's, this time.
pub fn at(point: &str) {
    at_with(point, || {});
}

/// [`at`], running `before` just before it aborts (to leave a torn write behind).
pub fn at_with(point: &str, before: impl FnOnce()) {
    static FAULT: OnceLock<Option<(String, u64)>> = OnceLock::new();
    static HITS: AtomicU64 = AtomicU64::new(0);
    let fault = FAULT.get_or_init(|| {
        let v = std::env::var("EVMESH_CONNECT_TEST_FAULT").ok()?;
        let (p, n) = v.rsplit_once(':')?;
        Some((p.to_owned(), n.parse().ok()?))
    });
    if let Some((p, n)) = fault {
        if p == point && HITS.fetch_add(1, Ordering::Relaxed) + 1 == *n {
            before();
            eprintln!("evmesh-connect: EVMESH_CONNECT_TEST_FAULT: aborting at {point}");
            std::process::abort();
        }
    }
}
