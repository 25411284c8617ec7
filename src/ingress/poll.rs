//! Long polling: `GET /events/poll?subscription=S&max=N&waitMs=W` (a batch of events, or 204)
//! and `POST /events/ack` (the acks, or nacks, of what a poll or a session delivered),
//! both served at the subscription's home.

use std::collections::BTreeMap;

use super::gate::Gate;
use super::homes::to_home;
use super::responses::storage_problem;
use super::Traffic;
use crate::delivery::group_ids;
use crate::governance::acl::{Action, Kind};
use crate::http::{problem, StatusCode};
use crate::model::delivery::{AckKind, ConsumerKey};
use crate::model::valid_topic;
use crate::server::{Request, Response};
use crate::shard::core::OUTBOX_HIGH;
use crate::shard::mailbox::{Overflow, Sender, CROSS_CORE_DEADLINE};
use crate::shard::message::{PollRequest, ShardMessage};
use crate::storage::StorageError;
use crate::subscription::definition::Mode as SubMode;

impl Traffic {
    /// `GET /events/poll?subscription=S&max=N&waitMs=W`: 200 with a batch of events, or 204
    /// when none arrived within `waitMs`.
    pub(super) async fn poll(&self, gate: &mut Gate<'_>, req: &Request<'_>) -> Response {
        let spec = match self.session_spec(gate, req).await {
            Ok(s) => s,
            Err(r) => return r,
        };
        if !spec.acked {
            return problem(StatusCode::BAD_REQUEST, "ack=none is for WebSocket sessions");
        }
        if spec.per_client && spec.client.is_none() {
            return problem(StatusCode::BAD_REQUEST, "polling a BROADCAST or MULTICAST subscription needs ?clientId=");
        }
        let number = |name: &str, default: u64, max: u64| match req.query(name) {
            None => Ok(default),
            Some(v) => {
                v.parse::<u64>().ok().filter(|n| (1..=max).contains(n) || (name == "waitMs" && *n == 0)).ok_or_else(
                    || problem(StatusCode::BAD_REQUEST, &format!("{name} must be a whole number up to {max}")),
                )
            }
        };
        let (max, wait) = match (number("max", 100, 1000), number("waitMs", 1000, 60_000)) {
            (Ok(m), Ok(w)) => (m as usize, std::time::Duration::from_millis(w)),
            (Err(r), _) | (_, Err(r)) => return r,
        };
        let home = crate::push::poll::home(&spec, self.shard.shared.config.shards);
        let events: Vec<Vec<u8>> = if home == self.shard.id {
            let events = crate::push::poll::session(&self.shard, &spec).poll(max, wait).await;
            events.iter().map(|e| e.to_vec()).collect()
        } else {
            let (reply, rx) = futures::channel::oneshot::channel();
            let asked = (ShardMessage::Poll(Box::new(PollRequest { spec, max, wait, reply })), rx);
            // The poll's own wait, and then the deadline of any request.
            let deadline = wait + CROSS_CORE_DEADLINE;
            let from = Sender::Shard(self.shard.id);
            match self.shard.shared.mailboxes.ask_within(from, home, asked, Overflow::Shed, deadline).await {
                Ok(events) => events,
                Err(e) => return storage_problem(&e),
            }
        };
        if events.is_empty() {
            return Response::empty(StatusCode(204));
        }
        let mut body = Vec::with_capacity(events.iter().map(|e| e.len() + 1).sum::<usize>() + 2);
        body.push(b'[');
        for (i, e) in events.iter().enumerate() {
            if i > 0 {
                body.push(b',');
            }
            body.extend_from_slice(e);
        }
        body.push(b']');
        Response::new(StatusCode::OK, "application/cloudevents-batch+json", body)
    }

    /// `POST /events/ack` `{"subscription": S, "ids": [...], "clientId"?: C, "nack"?: bool}`.
    /// Answers once every owner applied the acks, so a request made after the 200 (a
    /// reconnect, say) never sees an acknowledged event again.
    pub(super) async fn ack(&self, gate: &mut Gate<'_>, body: &[u8], redirected: bool) -> Response {
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields, rename_all = "camelCase")]
        struct AckBody {
            subscription: String,
            ids: Vec<String>,
            #[serde(default)]
            client_id: Option<String>,
            #[serde(default)]
            nack: bool,
        }
        let a = match serde_json::from_slice::<AckBody>(body) {
            Ok(a) => a,
            Err(e) => {
                return problem(
                    StatusCode::BAD_REQUEST,
                    &format!("expected {{\"subscription\": S, \"ids\": [...]}}: {e}"),
                )
            }
        };
        let stored = match gate
            .allow(Action::Subscribe, Kind::Subscription, &a.subscription)
            .and_then(|()| gate.scoped(&a.subscription))
        {
            Ok(s) => s,
            Err(r) => return r,
        };
        let def = match self.defined(&stored, redirected).await {
            Ok(Some(d)) => d,
            Ok(None) => return problem(StatusCode::NOT_FOUND, &format!("no subscription {}", a.subscription)),
            Err(e) => return storage_problem(&e),
        };
        if def.pushed() {
            let detail = format!("subscription {} is pushed by the broker, acked by the answers", a.subscription);
            return problem(StatusCode::CONFLICT, &detail);
        }
        match self.home_elsewhere(&crate::cluster::homes::subscription_key(&stored)).await {
            Ok(Some(home)) if !redirected => return to_home(&home, "/events/ack"),
            Ok(_) => {}
            Err(r) => return r,
        }
        // Checked whole first: every id well formed, at most `MAX_ACK_IDS`.
        let by = match group_ids(a.ids.iter().map(String::as_str)) {
            Ok(by) => by,
            Err(m) => return problem(StatusCode::BAD_REQUEST, &m),
        };
        let consumer = |client: String| ConsumerKey { subscription: def.subscription.clone(), client };
        let owners = match (def.mode, a.client_id) {
            (SubMode::LoadBalance, _) => vec![(consumer(String::new()), by)],
            // A client's acks name its offsets; ids naming an SSE stream are that stream's.
            (_, Some(_)) if a.ids.iter().any(|id| id.contains('~')) => {
                return problem(
                    StatusCode::BAD_REQUEST,
                    "ids of an SSE stream opened without a clientId take no clientId",
                )
            }
            (_, Some(c)) if valid_topic(&c) => vec![(consumer(c), by)],
            // SSE streams opened without a clientId: their delivery ids name them.
            (_, None) => match by_stream(&a.ids) {
                Ok(streams) => streams.into_iter().map(|(owner, by)| (consumer(owner.to_owned()), by)).collect(),
                Err(m) => return problem(StatusCode::BAD_REQUEST, m),
            },
            _ => return problem(StatusCode::BAD_REQUEST, "clientId must be [A-Za-z0-9._-]{1,249}"),
        };
        let kind = if a.nack { AckKind::Nack } else { AckKind::Ack };
        let unavailable = |m| storage_problem(&StorageError::Unavailable(m));
        if self.shard.outbox_len() >= OUTBOX_HIGH {
            return unavailable("too many acks waiting for their owners");
        }
        let mut applied = Vec::new();
        for (consumer, by) in owners {
            match self.shard.route_acks(&consumer, &def.topic, by, kind, true) {
                Ok(more) => applied.extend(more),
                Err(m) => return problem(StatusCode::BAD_REQUEST, &m),
            }
        }
        for done in applied {
            match monoio::time::timeout(CROSS_CORE_DEADLINE, done).await {
                Ok(Ok(())) => {}
                _ => return unavailable("an owning shard did not apply the acks in time"),
            }
        }
        Response::json(StatusCode::OK, serde_json::json!({ "acked": a.ids.len() }).to_string())
    }
}

/// The most SSE streams one ack without a `clientId` may name (a browser's stream reconnects
/// by itself: acks gathered across a reconnect name the old stream and the new one).
const MAX_STREAMS_PER_ACK: usize = 8;

/// The delivery ids of an ack without a `clientId` on a BROADCAST or MULTICAST subscription,
/// grouped by the SSE stream opened without one that each names (`delivery::owned_delivery_id`).
/// The ids are well formed (checked by `group_ids` before).
fn by_stream(ids: &[String]) -> Result<BTreeMap<&str, BTreeMap<u32, Vec<u64>>>, &'static str> {
    let mut streams: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for id in ids {
        let Ok(Some(owner)) = crate::delivery::delivery_owner(id) else {
            return Err("acks of a BROADCAST or MULTICAST subscription need a clientId, \
                        or delivery ids of SSE streams opened without one");
        };
        streams.entry(owner).or_default().push(id);
        if streams.len() > MAX_STREAMS_PER_ACK {
            return Err("the delivery ids name more than 8 SSE streams");
        }
    }
    let group = |ids: Vec<&str>| group_ids(ids).expect("checked whole");
    Ok(streams.into_iter().map(|(owner, ids)| (owner, group(ids))).collect())
}
