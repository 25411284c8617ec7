//! Session pub/sub (Mode 2): `POST /session/publish/{sid}` appends to the session's lite topic
//! `session.<sid>`; `GET /session/subscribe/{sid}` (server-sent events, or a WebSocket upgrade)
//! is its one subscriber, from the head of the session on (`push::follow`). With Kafka both are
//! served at the session's home only (307 elsewhere), which the first publish stored there
//! claims (released when the lite topic expires there). The lite topic is that instance's own,
//! not written to Kafka.

use super::gate::{shed, Gate};
use super::responses::{storage_problem, ws_upgrade};
use super::Traffic;
use crate::adaptor::cloudevents::CeError;
use crate::governance::acl::{Action, Kind};
use crate::http::{problem, StatusCode};
use crate::server::upgrade::Credential;
use crate::server::{FollowSpec, Request, Response, Upgrade};

/// The stored name of session `sid`'s lite topic for the caller, and the name the ACL speaks
/// of (`session.<sid>`); 400 for a session id outside `[A-Za-z0-9._:-]{1,200}`.
pub(super) fn session_topic(gate: &Gate<'_>, sid: &str) -> Result<(String, String), Response> {
    let valid = (1..=200).contains(&sid.len())
        && sid.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b':'));
    if !valid {
        return Err(problem(StatusCode::BAD_REQUEST, "session ids are [A-Za-z0-9._:-]{1,200}"));
    }
    let local = format!("session.{sid}");
    let stored = match &gate.who.tenant {
        Some(t) => format!(":{t}.{local}"),
        None => format!(":{local}"),
    };
    if stored.len() > 250 {
        return Err(problem(StatusCode::BAD_REQUEST, "the session id is too long for this tenant"));
    }
    Ok((stored, local))
}

/// The home key of lite topic `stored` (`:[<tenant>.]<kind>.<id>`, see `model::StoredTopic`), and
/// whether this instance claims it once it stored to it: an agent's `agent.<A>` is served at
/// the agent's home (claimed by the agent's registration, not by the broker's writes); any
/// other lite topic (`session.<sid>`, `client.<id>`) at its own.
pub(super) fn lite_home(stored: &str) -> (String, bool) {
    let (tenant, local) = crate::model::StoredTopic::new(stored).lite_parts();
    match local.strip_prefix("agent.") {
        Some(a) => (crate::cluster::homes::agent_key(&crate::shard::agents::stored_id(tenant, a)), false),
        None => (crate::cluster::homes::lite_key(stored), true),
    }
}

impl Traffic {
    /// What both session endpoints check first: the memory budget, the session id, that the
    /// caller may do `action` to `topic:session.<sid>`, and that this instance is the
    /// session's home. Returns the stored name.
    fn session_gate(
        &self,
        gate: &mut Gate<'_>,
        req: &Request<'_>,
        sid: &str,
        action: Action,
    ) -> Result<String, Response> {
        if self.shard.shared.memory.shed_now() {
            return Err(shed());
        }
        let (stored, local) = session_topic(gate, sid)?;
        gate.allow(action, Kind::Topic, &local)?;
        self.lite_served_here(&stored, Some(req), || format!("session {sid}"))?;
        Ok(stored)
    }

    /// `POST /session/publish/{sid}`: 201 `{"partition":0,"offset":O}` once stored (a batch:
    /// `{"results":[...]}`).
    pub(super) async fn session_publish(&self, gate: &mut Gate<'_>, req: &Request<'_>, sid: &str) -> Response {
        let stored = match self.session_gate(gate, req, sid, Action::Publish) {
            Ok(t) => t,
            Err(r) => return r,
        };
        let (frames, batch) = match self.parse(req, &stored) {
            Ok(f) => f,
            Err(CeError::Invalid(m)) => return problem(StatusCode::BAD_REQUEST, &m),
            Err(CeError::UnsupportedMedia(m)) => return problem(StatusCode::UNSUPPORTED_MEDIA_TYPE, &m),
        };
        if let Err(r) = gate.limit(&stored, frames.len() as u64, req.body.len() as u64) {
            return r;
        }
        let n = frames.len() as u64;
        let placed = match self.store(&stored, frames).await {
            Ok(p) => p,
            Err(e) => return storage_problem(&e),
        };
        self.shard.shared.metrics.shard(self.shard.id).events_published.add(n);
        gate.tenant_count(|s| &s.published, n);
        // As a publish answers (partition first).
        let results: Vec<String> =
            placed.iter().map(|(p, o)| format!(r#"{{"partition":{},"offset":{o}}}"#, p.0)).collect();
        let body = match (batch, results.first()) {
            (false, Some(one)) => one.clone(),
            _ => format!(r#"{{"results":[{}]}}"#, results.join(",")),
        };
        Response::json(StatusCode(201), body)
    }

    /// `GET /session/subscribe/{sid}`: the session's events from its head (or after the SSE
    /// `Last-Event-ID`), then as they come; 409 while it has a subscriber.
    pub(super) fn session_subscribe(&self, gate: &mut Gate<'_>, req: &Request<'_>, sid: &str) -> Response {
        let stored = match self.session_gate(gate, req, sid, Action::Subscribe) {
            Ok(t) => t,
            Err(r) => return r,
        };
        if self.shard.shared.watchers.is_followed(&stored) {
            return problem(StatusCode::CONFLICT, &format!("session {sid} has a subscriber already (one at a time)"));
        }
        let from = match req
            .header("last-event-id")
            .map(|v| std::str::from_utf8(v).ok().and_then(|s| s.trim().parse::<u64>().ok()))
        {
            None => 0,
            Some(Some(id)) => id.saturating_add(1),
            Some(None) => return problem(StatusCode::BAD_REQUEST, "Last-Event-ID of a session stream is an offset"),
        };
        let spec = Box::new(FollowSpec {
            topic: stored,
            from,
            principal: gate.principal(),
            tenant: gate.who.tenant.clone(),
            expires_us: gate.who.expires_us,
            credential: gate.principal().and(gate.token.map(|t| Credential(t.to_vec()))),
            agent: None,
        });
        let websocket = req.header("upgrade").is_some_and(|v| v.eq_ignore_ascii_case(b"websocket"));
        if websocket {
            ws_upgrade(req, Upgrade::FollowWs(spec))
        } else {
            Response::streaming(Upgrade::FollowSse(spec), "text/event-stream")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::lite_home;

    /// An agent's lite topic is served at the agent's home (tenant-scoped as the registry names
    /// it, never claimed by a store); any other at its own, claimed by the store.
    #[test]
    fn lite_topics_have_their_own_homes_and_agents_topics_their_agents() {
        assert_eq!(lite_home(":agent.bot"), ("agent/bot".into(), false));
        assert_eq!(lite_home(":acme.agent.bot"), ("agent/acme/bot".into(), false));
        assert_eq!(lite_home(":session.bot:1f"), ("lite/:session.bot:1f".into(), true));
        assert_eq!(lite_home(":acme.session.agent.x"), ("lite/:acme.session.agent.x".into(), true));
        assert_eq!(lite_home(":acme.client.c-1"), ("lite/:acme.client.c-1".into(), true));
    }
}
