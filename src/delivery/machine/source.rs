//! The log as the machine reads it ([`Source`]), and what a request's deadline says: the
//! machine's only view of stored events and of the wall clock.

use frame_codec::{Frame, FrameKind};

/// The log, as the machine reads it.
pub trait Source {
    /// The next offset of a partition (what is readable), `None` if it cannot be told now.
    fn end(&self, topic: &str, partition: u32) -> Option<u64>;
    /// Up to `max` events from `from`, stopping after the one that reaches `max_bytes`;
    /// `None` if the log cannot be read now.
    fn read(&self, topic: &str, partition: u32, from: u64, max: usize, max_bytes: usize) -> Option<Vec<Frame>>;
    /// The wall clock, µs since the Unix epoch: what request deadlines are compared with.
    fn wall_us(&self) -> i64 {
        crate::model::clock::now_micros()
    }
}

/// A request's deadline (µs since the epoch), `None` for any other frame.
pub(super) fn request_deadline(f: &Frame) -> Option<i64> {
    let h = f.header();
    (h.kind == FrameKind::Request).then_some(h.sequence as i64)
}

/// Whether `f` is a request whose deadline passed.
pub fn expired(f: &Frame, wall_us: i64) -> bool {
    request_deadline(f).is_some_and(|d| d <= wall_us)
}
