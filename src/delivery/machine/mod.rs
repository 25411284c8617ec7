//! Acknowledged delivery as a state machine with no I/O: the partition owner's rules for who
//! gets which event, what is in flight, when it is redelivered or dead-lettered, and what the
//! committed offset is.
//!
//! Inputs are method calls (a session attached, left or sent credit; acks and nacks; events were
//! appended; the clock ticked; a dead letter was written). Each takes the time `now` and a
//! [`Source`] to read the log through, and pushes its consequences as [`Effect`]s (deliver
//! these events to that session, store this position, dead-letter that event, continue later);
//! the shard executes them (`super`, in order: a position is stored before the deliveries it
//! records are sent). Nothing here touches a socket, a mailbox, a clock or the disk, so every
//! rule is unit-tested (`tests.rs`) with an in-memory log.
//!
//! Per consumer (the subscription, or one client of it) and partition (`Part`): `next` (the next
//! offset to read), the in-flight deliveries, the redeliveries waiting for their backoff, the
//! dead letters being written. The committed offset is the lowest of those (or `next`).
//!
//! Rules:
//! * A partition is held by one session of its consumer at a time: sessions sorted by
//!   [`SessionRef`](crate::model::delivery::SessionRef), partition `p` goes to session `p % n`. Every shard sees the same sessions,
//!   so the assignment agrees across owners without a coordinator; it changes when sessions
//!   come and go (a leaving session's unacknowledged events go to the new holder at once).
//! * Sticky order: a partition's redeliveries go out before any newer event of it.
//! * A pushed subscription (a webhook `sink`, a classic group's push URLs) has at most one
//!   event of a partition in flight (or being dead-lettered), so with sticky order its
//!   partitions reach the receiver in offset order even when a delivery fails.
//! * Flow control: a session holds at most its window of unacknowledged events from this shard
//!   (`session_window`, or what its `credit` said) and at most `window_bytes` of them (at least
//!   one event), and a partition at most `PART_INFLIGHT`. A full window pauses delivery; the log
//!   is read only as far as there is room.
//! * Attempts: every delivery counts, also one whose session ended before an ack. Unacked
//!   after `ackTimeoutMs`, nacked, or left by its session: redelivered after the backoff (base,
//!   2x, 4x, 8x, 16x, plus up to 20% jitter; at once after a session left); after `maxAttempts`
//!   dead-lettered, then counted as done.
//! * Requests (request-reply, frame kind `Request`, deadline in the header's `sequence`) are
//!   never redelivered or dead-lettered, whatever the subscription says: one past its deadline
//!   is skipped at dispatch (counted in [`Machine::expired`]); one in flight is settled when its
//!   ack deadline (`ackTimeoutMs`, as for any event) passes, it is nacked, or its session
//!   leaves; one found among the redeliveries after a restart is settled when read.
//!
//! The files: `consumers.rs`, the [`Machine`] and its consumers' lives (sessions attaching,
//! leaving, sending credit); `acks.rs`, acks, nacks and dead letters; `timers.rs`, ack
//! deadlines, due redeliveries and the backoff; `pump.rs`, what goes out to a session;
//! `state.rs`, a consumer's sessions and partitions; `effect.rs`, the [`Effect`]s and when a
//! position is stored; `source.rs`, the log as the machine reads it ([`Source`]).

mod acks;
mod consumers;
mod effect;
mod pump;
mod source;
mod state;
mod timers;
mod traced;

pub use crate::config::MAX_WINDOW;
pub use consumers::Machine;
pub use effect::{Effect, ACK_TIMEOUT, NACK, REJECTED};
pub use source::{expired, Source};

// What the tests (`use super::*`) name besides the public items above.
#[cfg(test)]
use {
    crate::model::delivery::{AckKind, ConsumerKey, SessionRef},
    crate::storage::offsets::Stored,
    crate::subscription::definition::Definition,
    frame_codec::{Frame, FrameKind},
    state::{InFlight, InFlights, Part, Retry},
    std::collections::HashMap,
    std::rc::Rc,
    std::sync::Arc,
    std::time::{Duration, Instant},
    timers::Jitter,
};

#[cfg(test)]
mod tests;
