//! Tracing: spans of evmesh's own work on an event (publish, store, deliver, ack, dead letter,
//! request, reply, turn), in the trace the event's `traceparent` names, handed to an exporter
//! thread (`runtime::otlp`) that sends them to an OpenTelemetry collector over OTLP/HTTP.
//!
//! Off (no `otlp_endpoint`), every entry point is one relaxed load of [`on`] and nothing else.
//! On, a span is a small value sent down a bounded queue ([`QUEUE`] spans); a full queue drops
//! the span and counts it ([`DROPPED`]): a shard never waits for the collector.
//!
//! Sampling is decided once, where a trace enters: parent-based (a `traceparent`'s sampled
//! flag is obeyed) and, for a trace evmesh starts, by `trace_sample_ratio`. What is delivered
//! or acked later follows the flag the stored event carries.

pub mod otlp;

use std::borrow::Cow;
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;

use crossbeam_channel::{Receiver, Sender, TrySendError};

pub use evmesh_protocol::adaptor::tracecontext::{self as context, valid_tracestate, TraceParent};

/// Spans waiting for the exporter at most; past that they are dropped and counted.
pub const QUEUE: usize = 16_384;

/// OpenTelemetry's span kinds (the numbers are the protocol's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Internal = 1,
    Server = 2,
    Client = 3,
    Producer = 4,
    Consumer = 5,
}

/// An attribute value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Str(Cow<'static, str>),
    Int(i64),
}

impl From<&'static str> for Value {
    fn from(s: &'static str) -> Value {
        Value::Str(Cow::Borrowed(s))
    }
}

impl From<String> for Value {
    fn from(s: String) -> Value {
        Value::Str(Cow::Owned(s))
    }
}

impl From<u64> for Value {
    fn from(n: u64) -> Value {
        Value::Int(n as i64)
    }
}

/// One finished span.
#[derive(Debug, Clone)]
pub struct Span {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    /// `None`: the trace's root.
    pub parent: Option<[u8; 8]>,
    pub name: Cow<'static, str>,
    pub kind: Kind,
    /// Nanoseconds since the Unix epoch.
    pub start_ns: u64,
    pub end_ns: u64,
    pub attrs: Vec<(&'static str, Value)>,
    /// The span failed, and why.
    pub error: Option<Cow<'static, str>>,
}

impl Span {
    /// A span of `operation` on `destination` (a topic, or a subscription), as OpenTelemetry's
    /// messaging conventions name it (`<operation> <destination>`), with their attributes.
    pub fn messaging(
        trace_id: [u8; 16],
        parent: Option<[u8; 8]>,
        kind: Kind,
        operation: &'static str,
        destination: &str,
        start_ns: u64,
    ) -> Span {
        Span {
            trace_id,
            span_id: span_id(),
            parent,
            name: Cow::Owned(format!("{operation} {destination}")),
            kind,
            start_ns,
            end_ns: start_ns,
            attrs: vec![
                ("messaging.system", "evmesh".into()),
                ("messaging.operation", operation.into()),
                ("messaging.operation.name", operation.into()),
                ("messaging.destination.name", destination.to_owned().into()),
            ],
            error: None,
        }
    }

    /// Adds an attribute.
    pub fn with(mut self, key: &'static str, value: impl Into<Value>) -> Span {
        self.attrs.push((key, value.into()));
        self
    }

    /// The event's CloudEvents `id` and `type`, as the messaging conventions name them (each
    /// at most [`MAX_VALUE`] bytes).
    pub fn event(self, id: &str, kind: &str) -> Span {
        let (id, kind) = (truncated(id), truncated(kind));
        self.with("cloudevents.event_id", id.clone())
            .with("messaging.message.id", id)
            .with("cloudevents.event_type", kind)
    }

    /// Where the event is stored.
    pub fn stored_at(self, partition: u32, offset: u64) -> Span {
        self.with("messaging.destination.partition.id", partition.to_string()).with("messaging.evmesh.offset", offset)
    }

    /// Ends the span now (and with `error`, failed) and hands it to the exporter.
    pub fn end(mut self, error: Option<Cow<'static, str>>) {
        self.end_ns = now_ns().max(self.start_ns);
        self.error = error;
        record(self);
    }

    /// The `traceparent` a child of this span carries (sampled).
    pub fn context(&self) -> TraceParent {
        TraceParent { trace_id: self.trace_id, span_id: self.span_id, flags: 1 }
    }
}

/// The longest string attribute value recorded, in bytes (longer ones are cut at a character
/// boundary, as OpenTelemetry's attribute value length limit does): what a span holds stays
/// small whatever a client names its events.
pub const MAX_VALUE: usize = 256;

/// `s`, cut to at most [`MAX_VALUE`] bytes.
pub fn truncated(s: &str) -> String {
    let mut end = s.len().min(MAX_VALUE);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

/// Spans handed to the exporter, dropped because its queue was full, and lost because the
/// collector could not be reached or refused them.
pub static EXPORTED: AtomicU64 = AtomicU64::new(0);
pub static DROPPED: AtomicU64 = AtomicU64::new(0);
pub static FAILED: AtomicU64 = AtomicU64::new(0);

static ON: AtomicBool = AtomicBool::new(false);
static QUEUE_TX: OnceLock<(Sender<Span>, f64)> = OnceLock::new();

/// Turns tracing on, sampling new traces at `ratio` (0.0-1.0): the exporter reads the spans
/// from the receiver. `None` if it was on already (once per process).
pub fn start(ratio: f64) -> Option<Receiver<Span>> {
    let (tx, rx) = crossbeam_channel::bounded(QUEUE);
    QUEUE_TX.set((tx, ratio.clamp(0.0, 1.0))).ok()?;
    ON.store(true, Relaxed);
    Some(rx)
}

/// Whether spans are recorded at all.
#[inline]
pub fn on() -> bool {
    ON.load(Relaxed)
}

/// Whether a trace with this parent (none: a new trace) is recorded: the parent's flag, or
/// for a new trace the sampling ratio.
pub fn sampled(parent: Option<&TraceParent>) -> bool {
    match (parent, QUEUE_TX.get()) {
        (_, None) => false,
        (Some(p), _) => p.sampled(),
        (None, Some((_, ratio))) => ((random() >> 11) as f64 / (1u64 << 53) as f64) < *ratio,
    }
}

/// Hands a finished span to the exporter; dropped (and counted) when its queue is full.
pub fn record(span: Span) {
    let Some((tx, _)) = QUEUE_TX.get() else { return };
    match tx.try_send(span) {
        Ok(()) => {}
        Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
            DROPPED.fetch_add(1, Relaxed);
        }
    }
}

thread_local! {
    static RNG: Cell<u64> = Cell::new({
        let local = 0u8;
        let seed = now_ns() ^ (&local as *const u8 as u64).rotate_left(32) ^ 0x9e37_79b9_7f4a_7c15;
        seed | 1
    });
}

/// xorshift64*: ids need to be unique, not secret.
fn random() -> u64 {
    RNG.with(|r| {
        let mut x = r.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        r.set(x);
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    })
}

/// A new span id (never all zeros).
pub fn span_id() -> [u8; 8] {
    loop {
        let id = random();
        if id != 0 {
            return id.to_be_bytes();
        }
    }
}

/// A new trace id (never all zeros).
pub fn trace_id() -> [u8; 16] {
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&span_id());
    id[8..].copy_from_slice(&random().to_be_bytes());
    id
}

/// Nanoseconds since the Unix epoch.
pub fn now_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_never_zero_and_do_not_repeat() {
        let mut seen = std::collections::HashSet::new();
        for _ in 0..10_000 {
            let id = span_id();
            assert_ne!(id, [0; 8]);
            assert!(seen.insert(id));
        }
        assert_ne!(trace_id(), trace_id());
    }
}
