//! The ingress pipeline's last steps, after the ACL and the limits: the topic's transformer,
//! then the router. A publish to a topic with neither takes none of this (one map lookup each).

use frame_codec::Frame;

use super::Traffic;
use crate::adaptor::cloudevents;
use crate::governance::Snapshot;
use crate::http::{problem, StatusCode};
use crate::server::Response;

/// The events of one publish as they will be stored: by destination topic, in request order
/// within each; `first[i]` is where event `i`'s first copy is (group, position), for the answer.
pub(super) struct Routed {
    pub groups: Vec<(String, Vec<Frame>)>,
    pub first: Vec<(usize, usize)>,
}

/// `frame` as a structured CloudEvent stored in `topic` (checked as any published event is).
fn reencode(frame: &Frame, topic: &str, json: &mut Vec<u8>) -> Result<Frame, cloudevents::CeError> {
    json.clear();
    cloudevents::write_structured(frame, &[], json);
    let mut f = cloudevents::parse_structured(topic, json)?;
    f.set_timestamp(crate::clock::now_micros());
    Ok(f)
}

impl Traffic {
    /// Applies `topic`'s transformer and routes to `frames` (400 if a transformed event is not
    /// a valid CloudEvent, or its data outgrows `max_body_bytes`).
    pub(super) fn transform_and_route(
        &self,
        snap: &Snapshot,
        topic: &str,
        mut frames: Vec<Frame>,
    ) -> Result<Routed, Response> {
        let mut json = Vec::new();
        if let Some(t) = snap.transformers.get(topic) {
            let budget = self.shard.shared.config.limits.max_body_bytes;
            for f in &mut frames {
                json.clear();
                cloudevents::write_structured(f, &[], &mut json);
                let mut event: serde_json::Map<String, serde_json::Value> =
                    serde_json::from_slice(&json).expect("write_structured writes a JSON object");
                t.apply(&mut event, budget).map_err(|m| problem(StatusCode::BAD_REQUEST, &m))?;
                json.clear();
                serde_json::to_writer(&mut json, &event).expect("a JSON object serializes");
                let invalid = |e: cloudevents::CeError| {
                    let why = match e {
                        cloudevents::CeError::Invalid(m) | cloudevents::CeError::UnsupportedMedia(m) => m,
                    };
                    problem(
                        StatusCode::BAD_REQUEST,
                        &format!("the transformer of {topic} made an invalid CloudEvent: {why}"),
                    )
                };
                *f = cloudevents::parse_structured(topic, &json).map_err(invalid)?;
                f.set_timestamp(crate::clock::now_micros());
            }
        }
        let n = frames.len();
        if !snap.router.routes(topic) {
            return Ok(Routed { groups: vec![(topic.to_owned(), frames)], first: (0..n).map(|i| (0, i)).collect() });
        }
        let mut groups: Vec<(String, Vec<Frame>)> = Vec::new();
        let mut first = Vec::with_capacity(n);
        let group = |groups: &mut Vec<(String, Vec<Frame>)>, t: &str| match groups.iter().position(|(n, _)| n == t) {
            Some(g) => g,
            None => {
                groups.push((t.to_owned(), Vec::new()));
                groups.len() - 1
            }
        };
        for f in frames {
            let dest = snap.router.destinations(topic, f.body());
            let mut placed = None;
            for t in dest.topics.iter().filter(|t| *t != topic) {
                let copy = reencode(&f, t, &mut json).map_err(|_| {
                    problem(
                        StatusCode::BAD_REQUEST,
                        &format!("the event cannot be stored in {t}, where a route sends it"),
                    )
                })?;
                let g = group(&mut groups, t);
                placed.get_or_insert((g, groups[g].1.len()));
                groups[g].1.push(copy);
            }
            // The answer names where the event is in the topic it was published to, if it is.
            if dest.topics.iter().any(|t| t == topic) {
                let g = group(&mut groups, topic);
                placed = Some((g, groups[g].1.len()));
                groups[g].1.push(f);
            }
            // Routes always end somewhere (a route has targets); an event is never dropped quietly.
            first.push(placed.ok_or_else(|| problem(StatusCode::BAD_REQUEST, "routes left the event nowhere"))?);
        }
        Ok(Routed { groups, first })
    }
}
