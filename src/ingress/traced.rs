//! Trace context at ingress (SPEC "Observability"): the `traceparent` and `tracestate` a
//! request carries as HTTP headers are put on each of its events that carries none (an
//! event's own is never overwritten: it names the trace the event started in), so that every
//! delivery carries it on. With tracing on, each sampled event gets a `publish` span (a
//! child of its context) and a `store` span under it; an event that starts a trace here gets
//! a `traceparent` naming its publish span, so its deliveries join that trace.
//!
//! What a request's headers add to its events is bounded: a `traceparent` as the 55
//! characters it parses to, a `tracestate` of W3C's shape and size, nothing past an event's
//! attribute limit, and no more bytes in all than the request brought.

use std::borrow::Cow;

use frame_codec::{AttrValue, Attribute, AttributeRef, Frame};

use crate::adaptor::cloudevents::MAX_ATTRIBUTES;

use crate::trace::{self, Kind, Span, TraceParent};

/// A request's trace context headers, as sent: a `traceparent` that parses (written back in
/// its 55 characters, never as sent) and a `tracestate` of W3C's shape (else none).
#[derive(Default, Clone, Copy)]
pub(super) struct Headers<'a> {
    pub parent: Option<TraceParent>,
    pub state: Option<&'a str>,
}

impl<'a> Headers<'a> {
    pub(super) fn of(req: &crate::server::Request<'a>) -> Headers<'a> {
        let text = |name| req.header(name).and_then(|v| std::str::from_utf8(v).ok());
        let parent = text("traceparent").and_then(TraceParent::parse);
        Headers { parent, state: parent.and(text("tracestate")).filter(|s| trace::valid_tracestate(s)) }
    }
}

/// Puts `extra` attributes after `f`'s own (an event that did not carry the request's
/// context): the frame re-archived from where it lies, nothing deserialized.
fn with_attributes(f: &mut Frame, extra: Vec<Attribute>) {
    if extra.is_empty() {
        return;
    }
    let refs: Vec<AttributeRef<'_>> = extra.iter().map(Attribute::borrowed).collect();
    if let Ok(g) = f.with_attributes(&refs) {
        *f = g;
    }
}

/// Event `f`, published to `topic` with request headers `h`: the headers' context put on it if
/// it has none (while `room`, the bytes a request may add, lasts, and the event has room for two
/// more attributes), and, if this trace is recorded, its publish span begun (not yet ended).
fn begin(op: &'static str, topic: &str, f: &mut Frame, h: Headers<'_>, room: &mut usize) -> Option<Span> {
    let body = f.body();
    let own = body.attr("traceparent").is_some();
    let fits = body.attributes.len() + 2 <= MAX_ATTRIBUTES;
    let mut extra = Vec::new();
    let mut add = |extra: &mut Vec<Attribute>, name: &str, value: String| {
        let cost = name.len() + value.len();
        if fits && *room >= cost {
            *room -= cost;
            extra.push(Attribute { name: name.into(), value: AttrValue::Str(value) });
        }
    };
    if let (false, Some(p)) = (own, h.parent) {
        add(&mut extra, "traceparent", p.format());
        if let (Some(s), None) = (h.state, body.attr("tracestate")) {
            add(&mut extra, "tracestate", s.to_owned());
        }
    }
    if !trace::on() {
        with_attributes(f, extra);
        return None;
    }
    let parent = match own {
        true => body.attr_str("traceparent").and_then(TraceParent::parse),
        false => h.parent,
    };
    if !trace::sampled(parent.as_ref()) {
        with_attributes(f, extra);
        return None;
    }
    let (trace_id, parent_id) = parent.map_or_else(|| (trace::trace_id(), None), |p| (p.trace_id, Some(p.span_id)));
    let span = Span::messaging(trace_id, parent_id, Kind::Producer, op, topic, trace::now_ns())
        .event(body.attr_str("id").unwrap_or_default(), body.attr_str("type").unwrap_or_default());
    // A trace started here: the event names its publish span (unless it carries a value of
    // its own that is no valid traceparent, which stays as it is).
    if parent.is_none() && !own {
        add(&mut extra, "traceparent", span.context().format());
    }
    with_attributes(f, extra);
    Some(span)
}

/// A publish's recorded spans, by event (its index in the request): ended with where each
/// event was stored by [`Publishing::stored`], or as failed if the publish was refused or
/// failed before (when dropped).
pub(super) struct Publishing<'t> {
    /// The operation: `publish`, `request` (ended at its reply) or `turn`.
    op: &'static str,
    topic: &'t str,
    spans: Vec<(usize, Span)>,
    store_start_ns: u64,
    /// What trace context may still add to the request's events, in bytes: as much as the
    /// request itself (a batch of tiny events under one header stores at most about twice
    /// what was sent, however long its `tracestate`).
    room: usize,
}

impl<'t> Publishing<'t> {
    /// The publish of a request of `bytes` to `topic`.
    pub(super) fn new(topic: &'t str, bytes: usize) -> Self {
        Self::of("publish", topic, bytes)
    }

    /// `new`, for another operation than a publish.
    pub(super) fn of(op: &'static str, topic: &'t str, bytes: usize) -> Self {
        Publishing { op, topic, spans: Vec::new(), store_start_ns: 0, room: bytes.max(128) }
    }

    /// Event `event` of the publish: the headers' context put on it if it has none, and, if
    /// its trace is recorded, its publish span begun.
    pub(super) fn begin(&mut self, event: usize, f: &mut Frame, h: Headers<'_>) {
        if let Some(s) = begin(self.op, self.topic, f, h, &mut self.room) {
            self.spans.push((event, s));
        }
    }

    /// The store begins now.
    pub(super) fn storing(&mut self) {
        if !self.spans.is_empty() {
            self.store_start_ns = trace::now_ns();
        }
    }

    /// Each event is stored where `placed` says (`None`: it was refused): its store span (from
    /// [`Publishing::storing`]), then its publish span, ended.
    pub(super) fn stored(self, placed: impl Fn(usize) -> Option<(u32, u64)>) {
        for span in self.stored_open(placed) {
            span.end(None);
        }
    }

    /// [`Publishing::stored`], but the operation's spans are handed back open, for the caller
    /// to end (a request's, at its reply).
    pub(super) fn stored_open(mut self, placed: impl Fn(usize) -> Option<(u32, u64)>) -> Vec<Span> {
        let mut open = Vec::new();
        for (i, span) in std::mem::take(&mut self.spans) {
            let Some((p, o)) = placed(i) else {
                span.end(Some(Cow::Borrowed("refused")));
                continue;
            };
            let start = self.store_start_ns.max(span.start_ns);
            Span::messaging(span.trace_id, Some(span.span_id), Kind::Internal, "store", self.topic, start)
                .stored_at(p, o)
                .end(None);
            open.push(span.stored_at(p, o));
        }
        open
    }
}

impl Drop for Publishing<'_> {
    fn drop(&mut self) {
        for (_, span) in self.spans.drain(..) {
            span.end(Some(Cow::Borrowed("refused or not stored")));
        }
    }
}
