//! The ingress pipeline's last steps, after the ACL and the limits: the topic's transformer,
//! then the router. A publish to a topic with neither takes none of this (two map lookups).
//! Both work on frame bodies, never through JSON: data keeps its bytes unless a template
//! replaces it, and a routed copy is the same event under another topic.

use std::borrow::Cow;

use frame_codec::{Frame, FrameBody};
use smallvec::SmallVec;

use super::Traffic;
use crate::governance::Snapshot;
use crate::http::{problem, StatusCode};
use crate::server::Response;

/// What the copies routes make of one request may take, in multiples of `max_body_bytes`.
const COPIES_PER_REQUEST: usize = 4;

/// Destination topics and what goes to each: inline for the common single topic.
pub(super) type Groups<'t, T> = SmallVec<[(Cow<'t, str>, Vec<T>); 1]>;

/// The events of one publish as they will be stored: by destination topic, in request order
/// within each; `first[i]` is where event `i`'s first copy is (group, position), for the answer
/// (`None`: event `i` is at (0, i), nothing was routed).
pub(super) struct Routed<'t> {
    pub groups: Groups<'t, Frame>,
    pub first: Option<Vec<(usize, usize)>>,
}

impl Routed<'_> {
    /// The events published (before routing's copies).
    pub fn events(&self) -> usize {
        self.first.as_ref().map_or_else(|| self.groups[0].1.len(), Vec::len)
    }
}

fn encode(f: &Frame, kind: frame_codec::DataKind, body: &FrameBody) -> Frame {
    let mut header = f.header();
    header.data_kind = kind;
    Frame::encode(&header, body).expect("a body of a request's size encodes")
}

impl Traffic {
    /// Applies `topic`'s transformer and routes to `frames`: 400 if a transformed event is not
    /// a valid CloudEvent, if what the templates build passes `max_body_bytes`, if the routed
    /// copies pass [`COPIES_PER_REQUEST`] times that, or if a route's condition cannot be
    /// decided within CESQL's budget.
    pub(super) fn transform_and_route<'t>(
        &self,
        snap: &Snapshot,
        topic: &'t str,
        mut frames: Vec<Frame>,
    ) -> Result<Routed<'t>, Response> {
        let max_body = self.shard.shared.config.limits.max_body_bytes;
        let metrics = self.shard.shared.metrics.shard(self.shard.id);
        if let Some(t) = snap.transformers.get(topic) {
            let mut budget = max_body;
            for f in &mut frames {
                let mut body = f.to_body();
                let kind = t.apply(&mut body, f.header().data_kind, &mut budget).map_err(|m| {
                    let detail = format!("the transformer of {topic} made an invalid event: {m}");
                    problem(StatusCode::BAD_REQUEST, &detail)
                })?;
                *f = encode(f, kind, &body);
            }
            metrics.events_transformed.add(frames.len() as u64);
        }
        let n = frames.len();
        if !snap.router.routes(topic) {
            return Ok(Routed { groups: smallvec::smallvec![(Cow::Borrowed(topic), frames)], first: None });
        }
        let mut copies_left = COPIES_PER_REQUEST * max_body;
        let mut groups: Groups<'t, Frame> = SmallVec::new();
        let mut first = Vec::with_capacity(n);
        let group = |groups: &mut Groups<'t, Frame>, t: &str| match groups.iter().position(|(n, _)| n == t) {
            Some(g) => g,
            None => {
                groups.push((Cow::Owned(t.to_owned()), Vec::new()));
                groups.len() - 1
            }
        };
        for f in frames {
            let dest = snap.router.destinations(topic, f.body()).map_err(|route| {
                let detail = format!("route {route}'s condition could not be decided within its budget for this event");
                problem(StatusCode::BAD_REQUEST, &detail)
            })?;
            let mut placed = None;
            for t in dest.topics.iter().filter(|t| *t != topic) {
                copies_left = copies_left.checked_sub(f.as_bytes().len()).ok_or_else(|| {
                    let detail = format!("routed, this request's events would take over {COPIES_PER_REQUEST} times max_body_bytes; send smaller batches");
                    problem(StatusCode::BAD_REQUEST, &detail)
                })?;
                let mut body = f.to_body();
                body.topic.clone_from(t);
                let g = group(&mut groups, t);
                placed.get_or_insert((g, groups[g].1.len()));
                groups[g].1.push(encode(&f, f.header().data_kind, &body));
            }
            // The answer names where the event is in the topic it was published to, if it is.
            if dest.topics.iter().any(|t| t == topic) {
                let g = match groups.iter().position(|(n, _)| n == topic) {
                    Some(g) => g,
                    None => {
                        groups.push((Cow::Borrowed(topic), Vec::new()));
                        groups.len() - 1
                    }
                };
                placed = Some((g, groups[g].1.len()));
                groups[g].1.push(f);
            }
            // Routes always end somewhere (a route has targets); an event is never dropped quietly.
            first.push(placed.ok_or_else(|| problem(StatusCode::BAD_REQUEST, "routes left the event nowhere"))?);
        }
        let copies = groups.iter().filter(|(t, _)| t != topic).map(|(_, f)| f.len() as u64).sum();
        metrics.events_routed.add(copies);
        Ok(Routed { groups, first: Some(first) })
    }
}
