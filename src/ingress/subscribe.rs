//! The subscription endpoints: `POST /events/subscribe` (a subscription made, its topic with
//! it, its home named in the answer) and `POST /events/unsubscribe` (removed, its attached
//! sessions closed).

use super::gate::{Gate, Quotaed};
use super::responses::storage_problem;
use super::Traffic;
use crate::governance::acl::{Action, Kind};
use crate::http::{problem, StatusCode};
use crate::model::topic::is_lite;
use crate::server::Response;
use crate::shard::message::{InterestChange, SubOutcome, SubRequest};
use crate::subscription::definition::Definition;

impl Traffic {
    /// `POST /events/subscribe`: 201 created, 200 the same definition exists, 409 another one
    /// does, 400 invalid. The topic is created with the defaults if it does not exist yet, so
    /// subscribers may come before publishers.
    pub(super) async fn subscribe(&self, gate: &mut Gate<'_>, body: &[u8]) -> Response {
        let mut def = match Definition::parse(body) {
            Ok(d) => d,
            Err(m) => return problem(StatusCode::BAD_REQUEST, &m),
        };
        if is_lite(&def.topic) {
            let detail =
                "agent.*, client.* and session.* are lite topics, read with GET /session/subscribe/{sessionId} \
                          (or by agents over /agent/ws), not through subscriptions";
            return problem(StatusCode::BAD_REQUEST, detail);
        }
        // A subscription reads its topic: it needs SUBSCRIBE on both.
        if let Err(r) = gate
            .allow(Action::Subscribe, Kind::Subscription, &def.subscription)
            .and_then(|()| gate.allow(Action::Subscribe, Kind::Topic, &def.topic))
        {
            return r;
        }
        def.created_us = crate::model::clock::now_micros();
        // Answered with the names the client used; stored in its tenant's namespace.
        let mut shown = def.shown();
        match (gate.scoped(&def.subscription), gate.scoped(&def.topic)) {
            (Ok(s), Ok(t)) => (def.subscription, def.topic) = (s.into_owned(), t.into_owned()),
            (Err(r), _) | (_, Err(r)) => return r,
        }
        // Where its sessions attach: its home, recorded once it exists (this instance while none
        // is known live yet).
        // (A pushed subscription, a sink's or a classic group's, stays here: no home recorded.)
        let key = crate::cluster::homes::subscription_key(&def.subscription);
        let pushed = def.pushed();
        let json = |shown: &mut serde_json::Value| {
            let home = (!pushed).then(|| self.shard.shared.cluster.home(&key, true)).flatten();
            shown["instanceUrl"] =
                home.map_or_else(|| self.shard.shared.config.advertised_url.clone(), |h| h.url).into();
            shown.to_string()
        };
        if let Err(r) =
            gate.quota(Quotaed::Topic, &def.topic).and_then(|()| gate.quota(Quotaed::Subscription, &def.subscription))
        {
            return r;
        }
        if let Err(e) = self.shard.topic(&def.topic, None, false).await {
            return storage_problem(&e);
        }
        let replica = def.clone();
        match self.shard.subscription(SubRequest::Create(def)).await {
            Ok(SubOutcome::Created) => {
                self.shard.shared.cluster.replicate_definition(&replica.subscription, Some(&replica));
                Response::json(StatusCode(201), json(&mut shown))
            }
            Ok(SubOutcome::Unchanged) => Response::json(StatusCode::OK, json(&mut shown)),
            Ok(SubOutcome::Limit) => problem(
                StatusCode::CONFLICT,
                &format!("max_subscriptions ({}) subscriptions exist", self.shard.shared.config.max_subscriptions),
            ),
            Ok(_) => {
                problem(StatusCode::CONFLICT, "a different subscription of that name exists; unsubscribe it first")
            }
            Err(e) => storage_problem(&e),
        }
    }

    /// `POST /events/unsubscribe` `{"subscription": S}`: 200 removed, 404 unknown.
    pub(super) async fn unsubscribe(&self, gate: &mut Gate<'_>, body: &[u8]) -> Response {
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Unsubscribe {
            subscription: String,
        }
        let name = match serde_json::from_slice::<Unsubscribe>(body) {
            Ok(u) => u.subscription,
            Err(e) => return problem(StatusCode::BAD_REQUEST, &format!("expected {{\"subscription\": S}}: {e}")),
        };
        let local = name;
        let name = match gate.allow(Action::Subscribe, Kind::Subscription, &local).and_then(|()| gate.scoped(&local)) {
            Ok(s) => s.into_owned(),
            Err(r) => return r,
        };
        let (topic, pushed) = match crate::storage::meta::get_subscription(&self.shard.shared.db, &name) {
            Ok(d) => d.map(|d| (d.topic.clone(), d.pushed())).unwrap_or_default(),
            Err(e) => return storage_problem(&e),
        };
        match self.shard.subscription(SubRequest::Remove(name.clone())).await {
            Ok(SubOutcome::Removed) => {
                if !pushed {
                    self.shard.shared.cluster.replicate_definition(&name, None);
                }
                // Attached sessions, on whatever shard, are closed cleanly (1000).
                self.shard.announce(&name, &topic, InterestChange::Removed);
                Response::json(StatusCode::OK, serde_json::json!({"subscription": local, "removed": true}).to_string())
            }
            Ok(_) => problem(StatusCode::NOT_FOUND, &format!("no subscription {local}")),
            Err(e) => storage_problem(&e),
        }
    }
}
