//! The connector SPI: what a source or a sink implements. The runtime (`crate::task`) does
//! everything else: batching, publishing and consuming through evmesh, retries with backoff,
//! the dead-letter topic, the offsets store, pause and restart.
//!
//! * A [`Source`] is asked for records ([`Source::poll`]); each carries the [`Position`] just
//!   after it. The runtime publishes them, and only once evmesh answered 202 does it store the
//!   position of the last one (in the same step, before anything else is polled) and tell the
//!   source ([`Source::commit`]). A crash between the 202 and the store publishes the records
//!   again, with the same CloudEvents `id`s: a source must make its ids stable across re-reads
//!   (consumers dedupe on `id` and `source`).
//! * A [`Sink`] is handed events ([`Sink::put`], then [`Sink::flush`]); the runtime acks them to
//!   evmesh only after both succeeded, so a sink's position (its subscription's offsets, kept
//!   by evmesh) moves only after the external write did. A sink that writes with the event's
//!   `id` and `source` as an idempotency key is exactly-once across crashes.

use std::time::Duration;

use async_trait::async_trait;
use cloudevents::Event;

/// Where a source is in its external system (a file's inode and byte offset, a table's last
/// value): JSON, opaque to the runtime, kept in the offsets store and shown by the admin API.
pub type Position = serde_json::Value;

/// One record of a source: the event to publish and the position just after it.
#[derive(Debug, Clone)]
pub struct SourceRecord {
    pub event: Event,
    pub position: Position,
}

/// Why a connector call failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// Trying again later may succeed (the far side away, a timeout): the runtime backs off and
    /// retries, counting `retried`.
    #[error("{0}")]
    Transient(String),
    /// The connector cannot go on as configured (a bad path, a refused login): it is marked
    /// failed, with this reason, until restarted.
    #[error("{0}")]
    Fatal(String),
}

/// Why a sink did not take a batch.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// The event at `index` will never be taken (a poison record): those before it were
    /// written, those after it not tried. It goes to the dead-letter topic and the stream
    /// continues.
    #[error("event {index} refused: {reason}")]
    Refused { index: usize, reason: String },
    /// Nothing of the batch can be counted as written; the runtime tries it again.
    #[error(transparent)]
    Failed(#[from] ConnectError),
}

/// Reads an external system into events.
#[async_trait]
pub trait Source: Send {
    /// Opens the source at `from` (the last committed position; `None`: from its start).
    async fn open(&mut self, from: Option<Position>) -> Result<(), ConnectError>;

    /// Where it started, when it opened from no position and that start is not stable (a
    /// `latest` made a position): the runtime stores it at once, so a restart before the first
    /// batch starts from the same place.
    async fn start_position(&mut self) -> Option<Position> {
        None
    }

    /// At most `max` records, waiting at most `wait` for the first (none: an empty batch).
    async fn poll(&mut self, max: usize, wait: Duration) -> Result<Vec<SourceRecord>, ConnectError>;

    /// Everything up to `position` is stored in evmesh and the position in the offsets store.
    async fn commit(&mut self, _position: &Position) -> Result<(), ConnectError> {
        Ok(())
    }

    /// What the external system has past the last record polled, in the source's unit
    /// (`{"records": n}` or `{"bytes": n}`); `None` when it cannot tell (a push source). Asked
    /// at most every few seconds.
    async fn lag(&mut self) -> Option<serde_json::Value> {
        None
    }

    /// The connector stops (a pause, a restart, the process ending).
    async fn close(&mut self) {}
}

/// Writes events to an external system.
#[async_trait]
pub trait Sink: Send {
    /// Opens the sink (recovering whatever a crash left half-done).
    async fn open(&mut self) -> Result<(), ConnectError>;

    /// Writes `events`, in order.
    async fn put(&mut self, events: &[Event]) -> Result<(), SinkError>;

    /// Makes what `put` wrote durable; the runtime acks the events to evmesh after this.
    async fn flush(&mut self) -> Result<(), ConnectError>;

    /// The connector stops.
    async fn close(&mut self) {}
}
