//! Agents of agent streaming calls (Mode 1): `POST /agent/register`, `/agent/heartbeat`,
//! `/agent/deregister` with `{"agentId": A, "ready"?: bool}`. An agent needs SUBSCRIBE on
//! `topic:agent.<A>` (the lite topic its turns arrive on). With Kafka they are served at the
//! agent's home instance (`cluster::homes`), which a registration claims: 307 elsewhere.

use super::gate::Gate;
use super::Traffic;
use crate::governance::acl::{Action, Kind};
use crate::http::{problem, StatusCode};
use crate::server::{Request, Response};

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct AgentBody {
    agent_id: String,
    #[serde(default)]
    ready: Option<bool>,
    /// A remote A2A server this agent is (register only): the gateway calls it.
    #[serde(default)]
    a2a_url: Option<String>,
}

impl Traffic {
    /// The agent a request names, checked and allowed: (its stored id, as named).
    fn agent_of(&self, gate: &mut Gate<'_>, body: &[u8]) -> Result<(String, AgentBody), Response> {
        let a: AgentBody = serde_json::from_slice(body).map_err(|e| {
            problem(StatusCode::BAD_REQUEST, &format!("expected {{\"agentId\": A, \"ready\"?: bool}}: {e}"))
        })?;
        let valid = (1..=100).contains(&a.agent_id.len())
            && a.agent_id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if !valid {
            return Err(problem(StatusCode::BAD_REQUEST, "agent ids are [A-Za-z0-9._-]{1,100}"));
        }
        gate.allow(Action::Subscribe, Kind::Topic, &format!("agent.{}", a.agent_id))?;
        let stored = crate::shard::agents::stored_id(gate.who.tenant.as_deref(), &a.agent_id);
        Ok((stored, a))
    }

    /// `POST /agent/register|heartbeat|deregister`.
    pub(super) fn agent(&self, gate: &mut Gate<'_>, what: &str, req: &Request<'_>) -> Response {
        let (stored, a) = match self.agent_of(gate, req.body) {
            Ok(x) => x,
            Err(r) => return r,
        };
        let claim = match self.at_agent_home(gate, &a.agent_id, req) {
            Ok(claim) => claim,
            Err(r) => return r,
        };
        // Counted as traffic of the agent's lite topic (each one may write a claim of its home).
        if let Err(r) = gate.limit(&Self::agent_topic(gate, &a.agent_id), 1, req.body.len() as u64) {
            return r;
        }
        let home = crate::cluster::homes::agent_key(&stored);
        // Served: a registration or heartbeat here claims the agent's home (once), so whatever
        // names the agent is sent here; a refused one leaves no claim.
        let claimed = |r: Response| {
            if claim && r.status.0 < 300 && what != "deregister" {
                self.shard.shared.cluster.claim_here(&home);
            }
            r
        };
        let agents = &self.shard.shared.agents;
        let now = crate::model::clock::now_ms();
        let timeout = self.shard.shared.config.agent_heartbeat_timeout.as_millis() as u64;
        let answer = |status: u16, ready: bool, routable: bool| {
            let body = serde_json::json!({"agentId": a.agent_id, "ready": ready, "routable": routable});
            Response::json(StatusCode(status), body.to_string())
        };
        if let (Some(url), "register") = (&a.a2a_url, what) {
            let ok = url.len() <= 2048 && crate::server::client::Url::parse(url).is_ok();
            if !ok {
                return problem(
                    StatusCode::BAD_REQUEST,
                    "a2aUrl must be an http:// or https:// URL of at most 2048 bytes",
                );
            }
            return claimed(match self.shard.shared.remotes.register(&stored, url) {
                Ok(new) => {
                    let body = serde_json::json!({"agentId": a.agent_id, "a2aUrl": url, "routable": true});
                    Response::json(StatusCode(if new { 201 } else { 200 }), body.to_string())
                }
                Err(_) => problem(
                    StatusCode::TOO_MANY_REQUESTS,
                    &format!("max_agents ({}) remote agents are registered", self.shard.shared.config.max_agents),
                )
                .with_header("retry-after", "10"),
            });
        }
        if what == "deregister" && self.shard.shared.remotes.remove(&stored) {
            self.shard.shared.cluster.release_home(&home);
            return answer(200, false, false);
        }
        claimed(match what {
            "register" => match agents.register(&stored, gate.who.tenant.as_deref(), a.ready.unwrap_or(true), now) {
                Ok(new) => answer(if new { 201 } else { 200 }, a.ready.unwrap_or(true), a.ready.unwrap_or(true)),
                Err(_) => problem(
                    StatusCode::TOO_MANY_REQUESTS,
                    &format!("max_agents ({}) agents are registered", self.shard.shared.config.max_agents),
                )
                .with_header("retry-after", "10"),
            },
            "heartbeat" => match agents.heartbeat(&stored, a.ready, now) {
                Some(state) => answer(200, state.ready, state.routable(now, timeout)),
                None => problem(StatusCode::NOT_FOUND, &format!("agent {} is not registered", a.agent_id)),
            },
            _ => match agents.deregister(&stored) {
                true => {
                    self.shard.shared.cluster.release_home(&home);
                    answer(200, false, false)
                }
                false => problem(StatusCode::NOT_FOUND, &format!("agent {} is not registered", a.agent_id)),
            },
        })
    }
}
