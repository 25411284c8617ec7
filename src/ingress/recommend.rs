//! `GET /session/recommend?subscription=S|sessionId=X|clientId=C` (SPEC, "Many instances"):
//! where a client should attach, `{"instanceUrl": U, "instanceId": I}`. A subscription's home
//! is chosen among the live instances and recorded (`cluster::homes`, sticky while it lives)
//! once the subscription exists; a client's is chosen, not recorded (asking records nothing a
//! caller only names); an agent streaming session's (`<A>:<uuid>`) is its agent's, any
//! other session id's its session pub/sub topic's (claimed by the first publish stored). Asking
//! needs what attaching needs (SUBSCRIBE on the subscription or `topic:session.<sid>`,
//! REQUEST on the agent). On the embedded log every answer is this instance.

use super::gate::Gate;
use super::Traffic;
use crate::cluster::homes::{agent_key, client_key, subscription_key};
use crate::governance::acl::{Action, Kind};
use crate::http::{problem, StatusCode};
use crate::server::{Request, Response};

impl Traffic {
    /// `GET /session/recommend`.
    pub(super) fn recommend(&self, gate: &mut Gate<'_>, req: &Request<'_>) -> Response {
        let asked: Vec<(&str, String)> = ["subscription", "sessionId", "clientId"]
            .into_iter()
            .filter_map(|k| req.query(k).map(|v| (k, v.into_owned())))
            .collect();
        let [(what, name)] = asked.as_slice() else {
            return problem(StatusCode::BAD_REQUEST, "name exactly one of ?subscription=, ?sessionId=, ?clientId=");
        };
        let shared = &self.shard.shared;
        let answer = |id: &str, url: &str| {
            let body = serde_json::json!({"instanceUrl": url, "instanceId": id});
            Response::json(StatusCode::OK, body.to_string())
        };
        let (key, record) = match *what {
            "subscription" => {
                if let Err(r) = gate.allow(Action::Subscribe, Kind::Subscription, name) {
                    return r;
                }
                match gate.scoped(name) {
                    Ok(stored) => {
                        let exists = matches!(crate::storage::meta::get_subscription(&shared.db, &stored), Ok(Some(_)));
                        (subscription_key(&stored), exists)
                    }
                    Err(r) => return r,
                }
            }
            "clientId" if super::call::valid_id(name) => match gate.scoped(name) {
                Ok(stored) => (client_key(&stored), false),
                Err(r) => return r,
            },
            "clientId" => return problem(StatusCode::BAD_REQUEST, "client ids are [A-Za-z0-9._-]{1,100}"),
            // An agent streaming session's (`<A>:<uuid>`) is its agent's; any other's (a
            // session pub/sub topic's) its lite topic's.
            _ => {
                let (stored, local) = match super::session::session_topic(gate, name) {
                    Ok(t) => t,
                    Err(r) => return r,
                };
                match super::call::agent_of(name) {
                    Ok(agent) => match gate.allow(Action::Request, Kind::Agent, agent) {
                        Ok(()) => (agent_key(&Self::stored_agent(gate, agent)), false),
                        Err(r) => return r,
                    },
                    Err(_) => match gate.allow(Action::Subscribe, Kind::Topic, &local) {
                        Ok(()) => (super::session::lite_home(&stored).0, false),
                        Err(r) => return r,
                    },
                }
            }
        };
        match shared.cluster.home(&key, record) {
            Some(h) => answer(&h.id, &h.url),
            None => problem(StatusCode::SERVICE_UNAVAILABLE, "no live instance is known yet; try again")
                .with_header("retry-after", "1"),
        }
    }
}
