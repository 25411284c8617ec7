//! `GET /session/recommend?subscription=S|sessionId=X|clientId=C` (SPEC, "Many instances"):
//! where a client should attach, `{"instanceUrl": U, "instanceId": I}`. A subscription's home
//! is chosen among the live instances and recorded (`cluster::homes`, sticky while it lives)
//! once the subscription exists; a client's is chosen, not recorded (nothing a caller names
//! grows the homes topic); an agent streaming session lives where it was opened, so it is this
//! instance when the session is here (and the caller's), else unknown here (404). On the
//! embedded log every answer is this instance.

use super::{Gate, Traffic};
use crate::cluster::homes::{client_key, subscription_key};
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
            _ => {
                let key = crate::shard::calls::session_key(gate.who.tenant.as_deref(), name);
                let principal = gate.principal();
                return match shared.calls.get(&key).filter(|c| c.principal == principal) {
                    Some(_) => answer(&shared.config.instance_id, &shared.config.advertised_url),
                    None => problem(StatusCode::NOT_FOUND, &format!("no session {name} here")),
                };
            }
        };
        match shared.home(&key, record) {
            Some(h) => answer(&h.id, &h.url),
            None => problem(StatusCode::SERVICE_UNAVAILABLE, "no live instance is known yet; try again")
                .with_header("retry-after", "1"),
        }
    }
}
