//! Request-reply over HTTP: `POST /events/request` stores a request like a publish and waits
//! on this shard for its reply; `POST /events/reply` (and a WebSocket session's `reply` frame,
//! `push::ws`) hands a reply to the shard its correlation id names.
//!
//! A request is the event as sent, with `emcorrelationid`, `emreplyto` and `emexpiry` set
//! (values a client put there are replaced), stored as a frame of kind `Request` whose header
//! `sequence` holds the deadline: delivery drops it at dispatch after that and never
//! redelivers or dead-letters it (`delivery::machine`). Only the wait races the client's
//! disconnect, never the store: a request is stored whole or not at all.

use frame_codec::{AttrValue, AttrValueOf, Attribute, Frame, FrameKind};
use futures::future::{select, Either};

use super::gate::{shed, Gate, Quotaed};
use super::responses::storage_problem;
use super::traced::{Headers, Publishing};
use super::Traffic;
use crate::adaptor::cloudevents::{self, CeError};
use crate::adaptor::rfc3339_from_micros;
use crate::governance::acl::Action;
use crate::http::{problem, StatusCode};
use crate::model::ReplyOutcome;
use crate::server::{Request, Response};
use crate::shard::requests::{Correlation, Refusal, Replier};
use crate::trace::{self, Kind, Span, TraceParent};

/// A reply, joined to its request's trace (`context`: the request's span when it is recorded,
/// else the context the request carried): a reply without a `traceparent` of its own is
/// handed to the requester with that one, and a recorded request gets a `reply` span.
fn joined(reply: Frame, context: Option<TraceParent>, topic: &str) -> Frame {
    let Some(ctx) = context else { return reply };
    if ctx.sampled() && crate::trace::on() {
        let span = Span::messaging(ctx.trace_id, Some(ctx.span_id), Kind::Internal, "reply", topic, trace::now_ns());
        span.event(reply.body().attr_str("id").unwrap_or_default(), reply.body().attr_str("type").unwrap_or_default())
            .end(None);
    }
    if reply.body().attr("traceparent").is_some() {
        return reply;
    }
    let value = ctx.format();
    let extra =
        [frame_codec::AttributeRef { name: "traceparent".into(), value: AttrValueOf::Str(value.as_str().into()) }];
    reply.with_attributes(&extra).unwrap_or(reply)
}

/// The attributes evmesh sets on a request.
const REQUEST_ATTRIBUTES: [&str; 3] = ["emcorrelationid", "emreplyto", "emexpiry"];

/// How a request's wait ended.
pub(super) enum Waited {
    Reply(Frame),
    /// No reply by the deadline (the request's correlation id).
    TimedOut(String),
    /// The requester closed its connection.
    Gone,
}

/// What a request to be waited for holds: the bytes the rate limits count, the bytes its
/// connection holds while it waits (the shard's `max_pending_request_bytes`), its trace headers.
pub(super) struct Asker<'h> {
    pub bytes: usize,
    pub held: usize,
    pub headers: Headers<'h>,
}

/// Counts a request as waiting while it lives.
struct Waiting<'a>(&'a crate::metrics::Counter);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.sub(1);
    }
}

/// Whether the requester asked for the reply in binary mode: an `Accept` none of whose ranges
/// (with a `q` above 0) covers `application/cloudevents+json` (`*/*`, `application/*`,
/// `application/*+json`, the type itself). Without `Accept`, structured mode.
fn wants_binary(accept: Option<&[u8]>) -> bool {
    let Some(accept) = accept.and_then(|a| std::str::from_utf8(a).ok()) else { return false };
    !accept.split(',').any(|range| {
        let mut params = range.split(';');
        let media = params.next().unwrap_or("").trim();
        let refused = params
            .any(|p| p.trim().strip_prefix("q=").is_some_and(|q| q.trim().parse::<f32>().is_ok_and(|q| q <= 0.0)));
        let covers = ["*/*", "application/*", "application/*+json", "application/cloudevents+json"]
            .iter()
            .any(|m| media.eq_ignore_ascii_case(m));
        covers && !refused
    })
}

/// The reply as the requester gets it: 200 with a structured-mode event, or binary mode.
fn answer(reply: &Frame, binary: bool) -> Response {
    if !binary {
        let mut body = Vec::with_capacity(reply.as_bytes().len() + 64);
        cloudevents::write_structured(reply, &[], &mut body);
        return Response::new(StatusCode::OK, "application/cloudevents+json", body);
    }
    let (headers, content_type, body) = cloudevents::write_binary(reply);
    let mut r = Response::new(StatusCode::OK, content_type.unwrap_or_default(), body);
    r.headers.extend(headers.into_iter().map(|(n, v)| (n.into(), v)));
    r
}

/// The request frame: `event` with the three request attributes set, kind `Request`, the
/// deadline in `sequence`.
fn request_frame(event: Frame, id: &Correlation, reply_to: &str, deadline_us: i64) -> Frame {
    let mut body = event.to_body();
    body.attributes.retain(|a| !REQUEST_ATTRIBUTES.contains(&a.name.as_str()));
    let values = [id.to_string(), reply_to.to_owned(), rfc3339_from_micros(deadline_us)];
    for (name, value) in REQUEST_ATTRIBUTES.iter().zip(values) {
        body.attributes.push(Attribute { name: (*name).to_owned(), value: AttrValue::Str(value) });
    }
    let mut header = event.header();
    header.kind = FrameKind::Request;
    header.sequence = deadline_us as u64;
    Frame::encode(&header, &body).expect("a request of a request's size encodes")
}

impl Traffic {
    /// `POST /events/request?topic=T&timeoutMs=N`: 200 with the reply, 504 at the deadline.
    pub(super) async fn request(&self, gate: &mut Gate<'_>, req: &Request<'_>) -> Response {
        if self.shard.shared.memory.shed_now() {
            return shed();
        }
        let topic = match self.topic_param(gate, req, Action::Request) {
            Ok(t) => t,
            Err(r) => return r,
        };
        let cap = self.shard.shared.config.max_request_timeout;
        let timeout = match req.query("timeoutMs").map(|v| v.parse::<u64>()) {
            None => std::time::Duration::from_secs(30).min(cap),
            Some(Ok(ms)) if ms > 0 => std::time::Duration::from_millis(ms).min(cap),
            Some(_) => {
                return problem(StatusCode::BAD_REQUEST, "timeoutMs must be a whole number of milliseconds, at least 1")
            }
        };
        let event = match self.parse(req, &topic) {
            Ok((_, true)) => {
                return problem(StatusCode::BAD_REQUEST, "a request is one event; a batch cannot wait for one reply")
            }
            Ok((mut f, false)) => f.pop().expect("one event"),
            Err(CeError::Invalid(m)) => return problem(StatusCode::BAD_REQUEST, &m),
            Err(CeError::UnsupportedMedia(m)) => return problem(StatusCode::UNSUPPORTED_MEDIA_TYPE, &m),
        };
        let id_timeout = timeout.as_millis();
        match self.send_and_wait(gate, req, &topic, event, timeout).await {
            Ok(Waited::Reply(reply)) => answer(&reply, wants_binary(req.header("accept"))),
            Ok(Waited::TimedOut(id)) => {
                problem(StatusCode(504), &format!("no reply to request {id} within {id_timeout} ms"))
            }
            // Nobody reads this answer; the connection ends with it, so nothing pipelined
            // behind the request runs for a client that left.
            Ok(Waited::Gone) => {
                problem(StatusCode(499), "the requester closed the connection").with_header("connection", "close")
            }
            Err(r) => r,
        }
    }

    /// Stores `event` as a request to `topic` (its stored name) and waits for its reply until
    /// `timeout` or the requester's disconnect: the rate limits, quotas, transformer and routes
    /// as for a publish, and the shard's bounds on waiting requests (429). `Err` is a refusal.
    pub(super) async fn send_and_wait(
        &self,
        gate: &mut Gate<'_>,
        req: &Request<'_>,
        topic: &str,
        event: Frame,
        timeout: std::time::Duration,
    ) -> Result<Waited, Response> {
        // What the waiting connection holds: its buffered request, the decoded body of a chunked
        // one (counted for both kinds, so over rather than under), and then the reply.
        let asker = Asker { bytes: req.body.len(), held: req.buf.len() + req.body.len(), headers: Headers::of(req) };
        self.ask_and_wait(gate, asker, topic, event, timeout, req.peer_gone()).await
    }

    /// [`Traffic::send_and_wait`] for any protocol: `asker` says what the request holds, and
    /// `gone` resolves once its requester is gone.
    pub(super) async fn ask_and_wait(
        &self,
        gate: &mut Gate<'_>,
        asker: Asker<'_>,
        topic: &str,
        mut event: Frame,
        timeout: std::time::Duration,
        gone: impl std::future::Future<Output = ()>,
    ) -> Result<Waited, Response> {
        let own = event.body().attributes.iter().filter(|a| REQUEST_ATTRIBUTES.contains(&a.name.as_str())).count();
        if event.body().attributes.len() - own + REQUEST_ATTRIBUTES.len() > cloudevents::MAX_ATTRIBUTES {
            let detail = format!(
                "a request carries at most {} attributes of its own (evmesh adds emcorrelationid, emreplyto, emexpiry)",
                cloudevents::MAX_ATTRIBUTES - REQUEST_ATTRIBUTES.len()
            );
            return Err(problem(StatusCode::BAD_REQUEST, &detail));
        }
        let mut traced = Publishing::of("request", topic, asker.bytes);
        traced.begin(0, &mut event, asker.headers);
        gate.limit(topic, 1, asker.bytes as u64)?;
        gate.quota(Quotaed::Topic, topic).and_then(|()| gate.backlog())?;
        let deadline_us = crate::model::clock::now_micros().saturating_add(timeout.as_micros() as i64);
        let metrics = self.shard.shared.metrics.shard(self.shard.id);
        let tenant = gate.who.tenant.as_deref();
        let mut pending = match self.shard.requests.wait(topic, tenant, asker.held, deadline_us) {
            Ok(p) => p,
            Err(refusal) => {
                metrics.refused(429);
                let detail = match refusal {
                    Refusal::Full => "this shard has max_pending_requests requests waiting for replies",
                    Refusal::Bytes => "the requests waiting for replies on this shard hold max_pending_request_bytes",
                };
                return Err(problem(StatusCode::TOO_MANY_REQUESTS, &format!("{detail}; retry later"))
                    .with_header("retry-after", "1"));
            }
        };
        metrics.requests_pending.inc();
        let _waiting = Waiting(&metrics.requests_pending);
        let reply_to = format!("{}/events/reply", self.shard.shared.config.advertised_url);
        // The parsed event goes (by value) into the frame, and is freed before the wait.
        let frame = request_frame(event, &pending.id, &reply_to, deadline_us);
        let context = frame.body().attr_str("traceparent").and_then(TraceParent::parse);
        let routed = self.transform_and_route(&gate.snap, topic, vec![frame])?;
        traced.storing();
        let stored = self.store_routed(routed.groups).await?;
        // The request's span stays open until its reply, its timeout or its requester's leaving.
        let mut span = traced.stored_open(|_| Some((stored[0].1[0].0 .0, stored[0].1[0].1))).pop();
        metrics.events_published.inc();
        gate.tenant_count(|s| &s.published, 1);
        // Stored: now only the wait, which the requester's disconnect ends.
        let left = deadline_us.saturating_sub(crate::model::clock::now_micros()).max(0) as u64;
        let timer = Box::pin(monoio::time::sleep(std::time::Duration::from_micros(left)));
        let gone = std::pin::pin!(gone);
        let id = pending.id.to_string();
        let waited = match select(&mut pending.reply, select(timer, gone)).await {
            Either::Left((Ok(reply), _)) => {
                metrics.requests[0].inc();
                Waited::Reply(joined(reply, span.as_ref().map(Span::context).or(context), topic))
            }
            Either::Left((Err(_), _)) | Either::Right((Either::Left(_), _)) => {
                metrics.requests[1].inc();
                Waited::TimedOut(id)
            }
            Either::Right((Either::Right(_), _)) => {
                metrics.requests[2].inc();
                Waited::Gone
            }
        };
        if let Some(s) = span.take() {
            s.end(match waited {
                Waited::Reply(_) => None,
                Waited::TimedOut(_) => Some("no reply in time".into()),
                Waited::Gone => Some("the requester left".into()),
            });
        }
        Ok(waited)
    }

    /// `POST /events/reply`: a CloudEvent (structured or binary) carrying `emcorrelationid`.
    /// 202 when a requester waited for it, 404 when none does (unknown, late, answered).
    pub(super) async fn reply(&self, gate: &mut Gate<'_>, req: &Request<'_>) -> Response {
        let frame = match self.parse(req, "") {
            Ok((_, true)) => return problem(StatusCode::BAD_REQUEST, "a reply is one event, not a batch"),
            Ok((mut f, false)) => f.pop().expect("one event"),
            Err(CeError::Invalid(m)) => return problem(StatusCode::BAD_REQUEST, &m),
            Err(CeError::UnsupportedMedia(m)) => return problem(StatusCode::UNSUPPORTED_MEDIA_TYPE, &m),
        };
        let replier = Replier { principal: gate.principal(), tenant: gate.who.tenant.clone(), agent: None };
        let outcome = match self.shard.send_reply(frame, replier).await {
            Ok(o) => o,
            Err(e) => return storage_problem(&e),
        };
        if let ReplyOutcome::Denied { topic, rule } = &outcome {
            let g = &self.shard.shared.governance;
            let detail = rule.as_ref().map(|r| format!("rule {r}"));
            g.audit(Some(gate.who), "REPLY", &format!("topic:{topic}"), "denied", detail, gate.caller.peer);
        }
        match outcome.status(&gate.who.name) {
            (202, _) => Response::json(StatusCode::ACCEPTED, r#"{"delivered":true}"#),
            (status, detail) => {
                if status == 403 {
                    self.shard.shared.metrics.shard(self.shard.id).refused(403);
                }
                problem(StatusCode(status), &detail)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::wants_binary;

    #[test]
    fn accept_chooses_the_reply_mode() {
        for structured in [
            None,
            Some("*/*"),
            Some("application/cloudevents+json"),
            Some("text/html, application/*;q=0.1"),
            Some("application/json, application/*+json"),
        ] {
            assert!(!wants_binary(structured.map(str::as_bytes)), "{structured:?}");
        }
        for binary in ["application/json", "text/plain", "application/octet-stream;q=1", "application/json, */*;q=0"] {
            assert!(wants_binary(Some(binary.as_bytes())), "{binary}");
        }
    }
}
