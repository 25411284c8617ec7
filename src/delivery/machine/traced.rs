//! The spans of a traced delivery: `deliver <subscription>` from the moment the event is put
//! in flight to its settling, and under it the settling itself (`ack`, `nack`, ...). They
//! belong to the trace of the `traceparent` the stored event carries, as children of the
//! span it names (the publisher's), and only when that trace is sampled.
//!
//! This is the one output of the machine besides its effects: spans are observations (like
//! the clock reading in `effect::now_ms`), never decisions.

use std::borrow::Cow;

use frame_codec::Frame;

use crate::subscription::definition::Definition;
use crate::trace::{self, Kind, Span, TraceParent};

/// A traced delivery in flight (boxed in its `InFlight`; only sampled events carry one).
#[derive(Debug)]
pub(super) struct Flight {
    parent: TraceParent,
    start_ns: u64,
    event_id: String,
    event_type: String,
}

/// The flight of event `f`, if its trace is recorded.
pub(super) fn flight(f: &Frame) -> Option<Box<Flight>> {
    if !trace::on() {
        return None;
    }
    let body = f.body();
    let parent = TraceParent::parse(body.attr_str("traceparent")?).filter(TraceParent::sampled)?;
    Some(Box::new(Flight {
        parent,
        start_ns: trace::now_ns(),
        event_id: trace::truncated(body.attr_str("id").unwrap_or_default()),
        event_type: trace::truncated(body.attr_str("type").unwrap_or_default()),
    }))
}

/// How a delivery was settled: the settling operation's name, and the failure if it is one.
#[derive(Clone, Copy)]
pub(super) enum Settled {
    /// Acknowledged (`ack`), or a failed attempt the client said (`nack`, `reject`,
    /// `release`, `defer`).
    By(&'static str),
    /// No answer within the ack deadline.
    TimedOut,
    /// Its session ended first.
    SessionGone,
}

/// Ends the delivery spans of attempt `attempt` of offset `o` of partition `p` (its flight
/// `trace`), if it is traced.
pub(super) fn settled((trace, attempt): (&Option<Box<Flight>>, u16), def: &Definition, p: u32, o: u64, how: Settled) {
    let Some(fl) = trace else { return };
    let mut deliver = Span::messaging(
        fl.parent.trace_id,
        Some(fl.parent.span_id),
        Kind::Consumer,
        "deliver",
        &def.topic,
        fl.start_ns,
    )
    .event(&fl.event_id, &fl.event_type)
    .stored_at(p, o)
    .with("messaging.consumer.group.name", def.subscription.clone())
    .with("messaging.evmesh.attempt", u64::from(attempt));
    deliver.name = Cow::Owned(format!("deliver {}", def.subscription));
    let error = match how {
        Settled::By("ack") => None,
        Settled::By(op) => Some(Cow::Borrowed(op)),
        Settled::TimedOut => Some(Cow::Borrowed("ack-timeout")),
        Settled::SessionGone => Some(Cow::Borrowed("session closed")),
    };
    if let Settled::By(op) = how {
        let mut settle =
            Span::messaging(deliver.trace_id, Some(deliver.span_id), Kind::Internal, op, &def.topic, trace::now_ns())
                .with("messaging.consumer.group.name", def.subscription.clone())
                .stored_at(p, o);
        settle.name = Cow::Owned(format!("{op} {}", def.subscription));
        settle.end(None);
    }
    deliver.end(error);
}
