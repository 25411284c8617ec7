//! What several fuzz targets share: the fixed event CESQL and filters are evaluated against, and
//! an allocator that measures how much heap an evaluation holds at its peak.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use frame_codec::{AttrValue, Attribute, DataKind, Frame, FrameBody, FrameHeader};

/// Bytes of the long attribute `big` of [`event`]: room for the fuzzer to make evaluations
/// produce strings large against a small budget.
pub const BIG: usize = 4096;

/// A stored event: the usual context attributes, integer and boolean extensions, one long
/// string attribute (`big`) and one with LIKE metacharacters (`subject`).
pub fn event() -> &'static Frame {
    static EVENT: OnceLock<Frame> = OnceLock::new();
    EVENT.get_or_init(|| {
        let s = |n: &str, v: &str| Attribute { name: n.into(), value: AttrValue::Str(v.into()) };
        let body = FrameBody {
            topic: "fuzz".into(),
            attributes: vec![
                s("specversion", "1.0"),
                s("id", "1"),
                s("source", "/sensors/7"),
                s("type", "com.example.reading"),
                s("subject", "a%b_c\\d"),
                s("time", "2026-12-01T08:00:00Z"),
                Attribute { name: "n".into(), value: AttrValue::Int(-7) },
                Attribute { name: "max".into(), value: AttrValue::Int(i64::from(i32::MAX)) },
                Attribute { name: "b".into(), value: AttrValue::Bool(true) },
                s("big", &"ab".repeat(BIG / 2)),
                s("empty", ""),
            ],
            data: b"{\"x\":1}".to_vec(),
        };
        Frame::encode(&FrameHeader::event(DataKind::Json), &body).expect("the fixed event encodes")
    })
}

/// The system allocator, counting the bytes live and the most live since [`Counting::reset`].
pub struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

impl Counting {
    /// Starts a measurement: the peak becomes what is live now.
    pub fn reset() -> usize {
        let live = LIVE.load(Ordering::Relaxed);
        PEAK.store(live, Ordering::Relaxed);
        live
    }

    /// The most bytes live since the last [`Counting::reset`].
    pub fn peak() -> usize {
        PEAK.load(Ordering::Relaxed)
    }

    fn grew(by: usize) {
        let live = LIVE.fetch_add(by, Ordering::Relaxed) + by;
        PEAK.fetch_max(live, Ordering::Relaxed);
    }
}

// SAFETY: every call is passed to the system allocator unchanged; the counters only observe.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc` is the system allocator's.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            Counting::grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc`/`realloc` above, with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract for `realloc` is the system allocator's.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            Counting::grew(new_size);
        }
        p
    }
}
