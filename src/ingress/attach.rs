//! A delivery session attached to a subscription: `GET /events/ws?subscription=S` (a
//! WebSocket) and `GET /events/sse?subscription=S` (server-sent events) upgrade into the
//! `push` session the [`SessionSpec`] describes; `GET /events/poll` (`poll.rs`) reads through
//! the same spec. The spec is checked here: the subscription (at its home), `ack=none`,
//! `clientId`, the session's own filters, `credit`.

use super::gate::{shed, Gate};
use super::homes::REDIRECTED;
use super::responses::{storage_problem, ws_upgrade};
use super::Traffic;
use crate::governance::acl::{Action, Kind};
use crate::http::{problem, StatusCode};
use crate::model::{valid_topic, PartitionId};
use crate::server::upgrade::Credential;
use crate::server::{Request, Response, SessionSpec, Upgrade};
use crate::storage::StorageError;
use crate::subscription::definition::{Definition, Mode as SubMode};
use crate::subscription::filter::compile;

impl Traffic {
    /// `GET /events/ws?subscription=S`: 101 into a delivery session, or the refusal.
    pub(super) async fn events_ws(&self, gate: &mut Gate<'_>, req: &Request<'_>) -> Response {
        match self.session_spec(gate, req).await {
            Ok(spec) => ws_upgrade(req, Upgrade::WsDeliver(Box::new(spec))),
            Err(r) => r,
        }
    }

    /// `GET /events/sse?subscription=S`: a server-sent events session, or the refusal.
    pub(super) async fn events_sse(&self, gate: &mut Gate<'_>, req: &Request<'_>) -> Response {
        match self.session_spec(gate, req).await {
            Ok(spec) if !spec.acked => problem(StatusCode::BAD_REQUEST, "ack=none is for WebSocket sessions"),
            Ok(spec) => Response::streaming(Upgrade::Sse(Box::new(spec)), "text/event-stream"),
            Err(r) => r,
        }
    }

    /// The session a delivery request asks for: `?subscription=S` (404 if unknown), then
    /// `ack=none` (live fan-out, BROADCAST only, WebSocket only), `clientId=C` (per-client
    /// offsets of BROADCAST and MULTICAST) and, for MULTICAST, the session's own filters:
    /// `filters=<JSON array of Subscriptions API filters>` and/or `sql=<CESQL>`.
    pub(super) async fn session_spec(&self, gate: &mut Gate<'_>, req: &Request<'_>) -> Result<SessionSpec, Response> {
        if self.shard.shared.memory.shed_now() {
            return Err(shed());
        }
        let bad = |m: &str| problem(StatusCode::BAD_REQUEST, m);
        let name = req.query("subscription").ok_or_else(|| bad("missing ?subscription="))?;
        gate.allow(Action::Subscribe, Kind::Subscription, &name)?;
        let stored = gate.scoped(&name)?;
        let def = match self.defined(&stored, req.query(REDIRECTED).is_some()).await {
            Ok(Some(d)) => d,
            Ok(None) => return Err(problem(StatusCode::NOT_FOUND, &format!("no subscription {name}"))),
            Err(e) => return Err(storage_problem(&e)),
        };
        if def.pushed() {
            let detail = format!("subscription {name} is pushed by the broker; sessions cannot attach to it");
            return Err(problem(StatusCode::CONFLICT, &detail));
        }
        // Sent here by another instance: served here, once this instance's claim is settled
        // if it chose itself (never sent on again).
        self.at_home(&crate::cluster::homes::subscription_key(&stored), req).await?;
        let acked = match req.query("ack").as_deref() {
            None => true,
            Some("none") => false,
            Some(other) => return Err(bad(&format!("ack={other}: the only choice is ack=none"))),
        };
        if !acked && def.mode != SubMode::Broadcast {
            return Err(bad("ack=none is live fan-out to BROADCAST subscriptions; this one needs acks"));
        }
        let client = req.query("clientId").map(|c| c.into_owned());
        if client.as_deref().is_some_and(|c| !valid_topic(c)) {
            return Err(bad("clientId must be [A-Za-z0-9._-]{1,249}"));
        }
        if let (Some(c), true) = (&client, def.mode != SubMode::LoadBalance) {
            self.check_client_cap(&def, c).map_err(|e| storage_problem(&e))?;
        }
        let mut filters: Vec<serde_json::Value> = match req.query("filters") {
            None => Vec::new(),
            Some(f) => match serde_json::from_str(&f) {
                Ok(serde_json::Value::Array(items)) => items,
                _ => return Err(bad("filters must be a JSON array of Subscriptions API filters")),
            },
        };
        if let Some(sql) = req.query("sql") {
            filters.push(serde_json::json!({ "sql": sql }));
        }
        let filters = if filters.is_empty() {
            None
        } else if def.mode != SubMode::Multicast {
            return Err(bad("per-session filters are for MULTICAST subscriptions"));
        } else {
            let json = serde_json::Value::Array(filters);
            compile(Some(&json)).map_err(|e| bad(&e.to_string()))?;
            Some(json.to_string())
        };
        let last_event_id = req.header("last-event-id").and_then(|v| std::str::from_utf8(v).ok()).map(str::to_owned);
        let window = match req.query("credit") {
            None => None,
            Some(n) => match n.parse::<u32>() {
                Ok(n) if n <= crate::config::MAX_WINDOW && acked => Some(n),
                Ok(_) if !acked => {
                    return Err(bad("credit=N is the window of acknowledged sessions; ack=none has none"))
                }
                _ => return Err(bad(&format!("credit={n}: the window is 0..={}", crate::config::MAX_WINDOW))),
            },
        };
        Ok(SessionSpec {
            subscription: def.subscription,
            topic: def.topic,
            acked,
            per_client: def.mode != SubMode::LoadBalance,
            client,
            filters,
            last_event_id,
            window,
            principal: gate.principal(),
            credential: gate.principal().and(gate.token.map(|t| Credential(t.to_vec()))),
            tenant: gate.who.tenant.clone(),
            expires_us: gate.who.expires_us,
        })
    }

    /// A `clientId` new to a per-client subscription is refused once `max_clients_per_subscription`
    /// clients have offsets stored (partition 0's entries, on its owner, count them).
    pub(super) fn check_client_cap(&self, def: &Definition, client: &str) -> Result<(), StorageError> {
        use crate::storage::offsets;
        let shared = &self.shard.shared;
        let (p0, cap) = (PartitionId(0), shared.config.max_clients_per_subscription);
        let home = crate::model::placement::owner(&def.topic, p0, shared.config.shards);
        if offsets::get(&shared.db, home, &offsets::key(&def.topic, &def.subscription, p0, client))?.is_some() {
            return Ok(());
        }
        if offsets::clients(&shared.db, home, &def.topic, &def.subscription, p0, cap)? >= cap {
            return Err(StorageError::Limit(format!(
                "max_clients_per_subscription ({cap}) clients of {} have offsets; reuse a clientId or wait for client_offset_ttl_ms",
                def.subscription
            )));
        }
        Ok(())
    }
}
