//! Heap allocations per publish, stage by stage, counted by a global allocator (issue 11:
//! "allocation-free ingest" is shown with this, before and after). Not a timing: each stage runs
//! 1,000 times and the count per run is printed. Also the per-event cost of appending to the
//! segment log (`storage::segment`) beside a RocksDB put of the same frame, as the embedded log
//! does today (time per event, 10,000 appends of one event, durability os: no fsync).
//!
//!   cargo bench --bench allocations

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use evmesh::adaptor::cloudevents::parse_structured;
use evmesh::http::{parse_head, Limits, Status};
use std::hint::black_box;

struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// A 1 KiB structured event, as loadgen posts it.
fn event() -> String {
    let data = "x".repeat(1024 - 230);
    format!(
        r#"{{"specversion":"1.0","id":"t0000000000000000","source":"/loadgen","type":"com.example.load","time":"2026-11-30T12:00:00Z","datacontenttype":"text/plain","partitionkey":"k-1","data":"{data}"}}"#
    )
}

const HEAD: &[u8] = b"POST /events/publish?topic=orders HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n\
Content-Type: application/cloudevents+json\r\nContent-Length: 1024\r\nConnection: keep-alive\r\n\r\n";

/// Allocations per call of `f`, over 1,000 calls after one warm-up.
fn per_call(mut f: impl FnMut()) -> f64 {
    f();
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    for _ in 0..1000 {
        f();
    }
    (ALLOCATIONS.load(Ordering::Relaxed) - before) as f64 / 1000.0
}

fn main() {
    let body = event();
    let limits = Limits::default();
    println!("allocations per 1 KiB structured publish, by stage:");
    let head = per_call(|| match parse_head(black_box(HEAD), &limits) {
        Ok(Status::Complete(h)) => {
            black_box(h.len);
        }
        other => panic!("{other:?}"),
    });
    println!("  HTTP head parse             {head:6.1}");
    let parse = per_call(|| {
        black_box(parse_structured("orders", black_box(body.as_bytes())).unwrap());
    });
    println!("  CloudEvent -> frame         {parse:6.1}");
    let dir = std::env::temp_dir().join(format!("evmesh-bench-alloc-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut log = evmesh::storage::segment::PartitionLog::open(&dir.join("seg"), 1 << 30).unwrap();
    let frame = parse_structured("orders", body.as_bytes()).unwrap();
    let seg = per_call(|| {
        let mut one = [frame.clone()];
        black_box(log.append(&mut one, 1).unwrap());
    });
    println!("  segment log append          {seg:6.1}   (the frame's clone counted: 1)");

    // Time per appended event: the segment log against a RocksDB put with its WAL.
    let n = 10_000;
    let t = Instant::now();
    for _ in 0..n {
        let mut one = [frame.clone()];
        log.append(&mut one, 1).unwrap();
    }
    let seg_us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
    let db = rocksdb::DB::open_default(dir.join("rocks")).unwrap();
    let t = Instant::now();
    for i in 0..n as u64 {
        db.put(i.to_be_bytes(), frame.as_bytes()).unwrap();
    }
    let rocks_us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
    println!("append of one 1 KiB event, durability os: segment log {seg_us:.2} µs, RocksDB put {rocks_us:.2} µs");
    drop(db);
    let _ = std::fs::remove_dir_all(&dir);
}
