//! What the machine asks the shard to do ([`Effect`]), why an event is dead-lettered, and when
//! a partition's position is to be stored (`persist`, pushing an [`Effect::Persist`]).

use std::rc::Rc;
use std::sync::Arc;

use frame_codec::Frame;

use super::state::Part;
use crate::model::delivery::{ConsumerKey, SessionRef};
use crate::storage::offsets::Stored;

/// What the shard must do.
#[derive(Debug)]
pub enum Effect {
    /// Send events to a session: `frames` (all, or the indexes in `pick`), each with its attempt.
    Deliver { to: SessionRef, subscription: String, frames: Arc<[Frame]>, pick: Option<Vec<u32>>, attempts: Vec<u16> },
    /// Store a consumer's position in a partition (before any `Deliver` after it is sent).
    Persist { key: Rc<ConsumerKey>, topic: String, partition: u32, stored: Stored },
    /// Append an event to the dead-letter topic, then report with
    /// [`Machine::dead_lettered`](super::Machine::dead_lettered).
    DeadLetter { key: Rc<ConsumerKey>, gen: u64, partition: u32, offset: u64, attempts: u16, reason: &'static str },
    /// More to read than one turn may: call [`Machine::pump`](super::Machine::pump) again soon.
    Continue { key: Rc<ConsumerKey>, partition: u32 },
}

impl Effect {
    pub(super) fn dead_letter(
        key: &Rc<ConsumerKey>,
        gen: u64,
        partition: u32,
        offset: u64,
        attempts: u16,
        reason: &'static str,
    ) -> Effect {
        Effect::DeadLetter { key: key.clone(), gen, partition, offset, attempts, reason }
    }
}

/// Why an event is dead-lettered.
pub const ACK_TIMEOUT: &str = "ack-timeout";
pub const NACK: &str = "nack";
pub const REJECTED: &str = "rejected";

/// Milliseconds since the Unix epoch, for the stored "last seen": the one clock reading the
/// machine takes itself (it is a label on stored data, never a decision).
pub(super) fn now_ms() -> u64 {
    crate::model::clock::now_ms()
}

/// Pushes a `Persist` if the position of `p` changed since it was last stored.
pub(super) fn persist(
    key: &Rc<ConsumerKey>,
    topic: &str,
    keep: bool,
    p: u32,
    part: &mut Part,
    seen_ms: u64,
    out: &mut Vec<Effect>,
) {
    if !keep {
        return;
    }
    let snap = part.snapshot(seen_ms);
    let same = part
        .stored
        .as_ref()
        .is_some_and(|st| st.committed == snap.committed && st.next == snap.next && st.attempts == snap.attempts);
    if same {
        return;
    }
    match &mut part.stored {
        Some(st) => (**st).clone_from(&snap),
        None => part.stored = Some(Box::new(snap.clone())),
    }
    out.push(Effect::Persist { key: key.clone(), topic: topic.to_owned(), partition: p, stored: snap });
}
