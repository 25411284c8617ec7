//! The A2A gateway's proxy to remote A2A agents (`POST /agent/register` with `a2aUrl`): their
//! card, fetched from the registered origin and served with evmesh's URL, and each JSON-RPC call
//! forwarded as evmesh's own client, rebuilt from its checked fields, naming only the caller's
//! tasks (streams are relayed by `push::a2a::relay`).

use serde_json::{json, Value as Json};

use super::super::gate::Gate;
use super::super::Traffic;
use super::binding::{now_ms, rpc_of, Binding};
use crate::adaptor::a2a::{self, A2aError, ErrorKind, Method};
use crate::http::StatusCode;
use crate::server::client::{Pool, Url};
use crate::server::{A2aRelaySpec, Request, Response, Upgrade};
use crate::shard::tasks::Remote;

/// Bytes of a remote agent's card at most.
const MAX_CARD: usize = 64 * 1024;

/// The params a call to a remote agent is forwarded with: the checked fields only, in 1.0's
/// camelCase; a task or context named must be the caller's (`owns`), or a context nobody's
/// yet (`free`).
fn remote_params(
    method: Method,
    params: Option<&serde_json::value::RawValue>,
    owns: &dyn Fn(&str) -> bool,
    free: &dyn Fn(&str) -> bool,
) -> Result<Json, A2aError> {
    let p: Json = match params {
        Some(raw) => serde_json::from_str(raw.get())
            .map_err(|e| A2aError::new(ErrorKind::InvalidParams, format!("params: {e}")))?,
        None => json!({}),
    };
    let pick = |from: &Json, keys: &[&str]| -> Json {
        let m: serde_json::Map<String, Json> =
            keys.iter().filter_map(|k| from.get(*k).map(|v| ((*k).to_owned(), v.clone()))).collect();
        Json::Object(m)
    };
    let task = |id: &str| match owns(id) {
        true => Ok(()),
        false => Err(A2aError::task_not_found(id)),
    };
    match method {
        Method::SendMessage | Method::SendStreamingMessage => {
            let s = a2a::parse_send(params)?;
            if let Some(id) = &s.message.task_id {
                task(id)?;
            }
            if let Some(c) = &s.message.context_id {
                if !free(c) {
                    return Err(A2aError::new(ErrorKind::InvalidParams, "message: contextId is another caller's"));
                }
            }
            let refs = p["message"]["referenceTaskIds"].as_array().cloned().unwrap_or_default();
            for r in &refs {
                task(r.as_str().unwrap_or_default())?;
            }
            let mut message =
                pick(&s.message.json, &["messageId", "role", "parts", "contextId", "taskId", "metadata", "extensions"]);
            if !refs.is_empty() {
                message["referenceTaskIds"] = Json::Array(refs);
            }
            let config = pick(&p["configuration"], &["acceptedOutputModes", "historyLength", "returnImmediately"]);
            Ok(
                json!({"message": message, "configuration": config, "metadata": p.get("metadata").cloned().unwrap_or(json!({}))}),
            )
        }
        Method::GetTask | Method::CancelTask | Method::SubscribeToTask => {
            let (id, _) = a2a::parse_task_id(params)?;
            task(&id)?;
            Ok(pick(&p, &["id", "historyLength", "metadata"]))
        }
        Method::ListTasks => {
            a2a::parse_list(params)?;
            Ok(pick(
                &p,
                &[
                    "contextId",
                    "status",
                    "pageSize",
                    "pageToken",
                    "historyLength",
                    "includeArtifacts",
                    "statusTimestampAfter",
                ],
            ))
        }
        Method::Unsupported(_) => Ok(json!({})),
    }
}

impl Traffic {
    /// A remote agent's card as evmesh serves it (its JSON-RPC interface evmesh's own URL; the
    /// rest as the remote says), and the remote's JSON-RPC URL. Fetched at most once a minute.
    pub(super) async fn remote_card(&self, stored: &str, agent: &str, r: &Remote) -> Result<(Json, String), A2aError> {
        let shared = &self.shard.shared;
        let now = now_ms();
        let (card, rpc) = match &r.card {
            Some((card, at, rpc)) if now.saturating_sub(*at) < 60_000 => (card.clone(), rpc.clone()),
            _ => {
                let bad = |m: String| A2aError::new(ErrorKind::InvalidAgentResponse, format!("the remote agent: {m}"));
                let url =
                    Url::parse(&format!("{}/.well-known/agent-card.json", r.url.trim_end_matches('/'))).map_err(bad)?;
                let timeout = shared.config.webhook_timeout;
                let addr = self.remote_addr(stored, r, &url).await?;
                let pool = Pool::new(0, MAX_CARD, Some(shared.client_tls.clone()));
                let headers = [("accept", "application/json"), ("a2a-version", "1.0")];
                let a = pool.send(&url, addr, "GET", &headers, b"", timeout).await.map_err(|e| bad(e.to_string()))?;
                let card: Json = match a.status {
                    200 => serde_json::from_slice(&a.body).map_err(|e| bad(format!("its card is not JSON: {e}")))?,
                    s => return Err(bad(format!("its card answered {s}"))),
                };
                if !card.is_object() {
                    return Err(bad("its card is not an object".into()));
                }
                // Its JSON-RPC interface of A2A 1.x, else its own URL.
                let rpc = card["supportedInterfaces"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|i| {
                        i["protocolBinding"] == "JSONRPC"
                            && i["protocolVersion"].as_str().is_some_and(|v| v.starts_with("1."))
                    })
                    .and_then(|i| i["url"].as_str())
                    .unwrap_or(&r.url)
                    .to_owned();
                // On the registered origin only: a card cannot send evmesh's calls elsewhere.
                let (rpc_url, own) = (Url::parse(&rpc).map_err(|e| bad(format!("its JSON-RPC URL: {e}")))?, &url);
                if (rpc_url.tls, &rpc_url.name, rpc_url.port) != (own.tls, &own.name, own.port) {
                    return Err(bad(format!("its JSON-RPC URL {rpc:?} is not on {}'s origin", r.url)));
                }
                shared.remotes.set_card(stored, &r.url, card.clone(), now, rpc.clone());
                (card, rpc)
            }
        };
        let mut served = card;
        let base = format!("{}/a2a/{agent}", shared.config.advertised_url);
        served["supportedInterfaces"] =
            json!([{"url": base, "protocolBinding": "JSONRPC", "protocolVersion": a2a::VERSION}]);
        Ok((served, rpc))
    }

    /// Where a remote agent is: its name resolved at most once a minute (on a thread of its
    /// own), never one of evmesh's own listeners. Its JSON-RPC URL is on the registered origin,
    /// so one address serves the card and the calls.
    async fn remote_addr(&self, stored: &str, r: &Remote, url: &Url) -> Result<std::net::SocketAddr, A2aError> {
        let shared = &self.shard.shared;
        let bad = |m: String| A2aError::new(ErrorKind::InvalidAgentResponse, format!("the remote agent: {m}"));
        let now = now_ms();
        let addr = match r.addr {
            Some((a, at)) if now.saturating_sub(at) < 60_000 => a,
            _ => {
                let a = url.resolve(shared.config.webhook_timeout).await.map_err(|e| bad(e.to_string()))?;
                shared.remotes.set_addr(stored, &r.url, a, now);
                a
            }
        };
        match crate::push::webhook::is_own(addr, &shared.listeners) {
            true => Err(bad("its URL is evmesh's own".into())),
            false => Ok(addr),
        }
    }

    /// A call to a remote agent (JSON-RPC only), forwarded as the client sent it. Its tasks are
    /// the remote's; evmesh remembers which its callers made, and answers "not found" for the
    /// others (a listing shows the caller's only).
    pub(super) async fn a2a_remote(
        &self,
        gate: &mut Gate<'_>,
        req: &Request<'_>,
        agent: &str,
        r: &Remote,
        rest_binding: bool,
        tail: &str,
    ) -> Response {
        if rest_binding || !tail.is_empty() {
            let e = A2aError::new(ErrorKind::UnsupportedOperation, "a remote agent is served over JSON-RPC only");
            return Binding::Rest.err(&e);
        }
        let (rpc, b) = match rpc_of(req) {
            Ok(x) => x,
            Err(r) => return r,
        };
        let scope = crate::shard::tasks::scope(gate.who.tenant.as_deref(), gate.principal().as_deref(), agent);
        let remotes = &self.shard.shared.remotes;
        // What is forwarded is rebuilt from the checked fields (camelCase, known keys only): a
        // field the remote would read that evmesh did not check cannot name another's task.
        let forwarded = match remote_params(rpc.method, rpc.params, &|task| remotes.owns(task, &scope), &|ctx| {
            remotes.context_free_for(ctx, &scope)
        }) {
            Ok(p) => p,
            Err(e) => return b.err(&e),
        };
        let method = match rpc.method {
            Method::SendMessage => "SendMessage",
            Method::SendStreamingMessage => "SendStreamingMessage",
            Method::GetTask => "GetTask",
            Method::ListTasks => "ListTasks",
            Method::CancelTask => "CancelTask",
            Method::SubscribeToTask => "SubscribeToTask",
            Method::Unsupported(name) => {
                let e = A2aError::new(ErrorKind::UnsupportedOperation, format!("{name} is not offered through evmesh"));
                return b.err(&e);
            }
        };
        let body = serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": rpc.id, "method": method, "params": forwarded}))
            .expect("json");
        let stored = Self::stored_agent(gate, agent);
        let rpc_url = match Box::pin(self.remote_card(&stored, agent, r)).await {
            Ok((_, u)) => u,
            Err(e) => return b.err(&e),
        };
        let shared = &self.shard.shared;
        let bad = |m: String| A2aError::new(ErrorKind::InvalidAgentResponse, format!("the remote agent: {m}"));
        let url = match Url::parse(&rpc_url) {
            Ok(u) => u,
            Err(e) => return b.err(&bad(e)),
        };
        // The registration as it is now (the card fetch may have just resolved its name).
        let current = shared.remotes.get(&stored).unwrap_or_else(|| r.clone());
        let addr = match self.remote_addr(&stored, &current, &url).await {
            Ok(a) => a,
            Err(e) => return b.err(&e),
        };
        if matches!(rpc.method, Method::SendStreamingMessage | Method::SubscribeToTask) {
            let expires_us = gate.who.expires_us;
            let spec = A2aRelaySpec { url: rpc_url, addr, body, rpc_id: rpc.id.clone(), scope, expires_us };
            return Response::streaming(Upgrade::A2aRelay(Box::new(spec)), "text/event-stream");
        }
        let timeout = shared.config.webhook_timeout.max(shared.config.max_request_timeout);
        let pool = Pool::new(0, shared.config.limits.max_body_bytes.max(1 << 20), Some(shared.client_tls.clone()));
        let headers = [("content-type", "application/json"), ("a2a-version", "1.0"), ("accept", "application/json")];
        // Each step within `timeout`, the whole call within twice that.
        let sent = monoio::time::timeout(2 * timeout, pool.send(&url, addr, "POST", &headers, &body, timeout)).await;
        let a = match sent {
            Ok(Ok(a)) => a,
            Ok(Err(e)) => return b.err(&bad(e.to_string())),
            Err(_) => return b.err(&bad(format!("no answer within {:?}", 2 * timeout))),
        };
        // A JSON-RPC response: an object with a result (every A2A result is an object) or an
        // error; nothing else is relayed.
        let mut v: serde_json::Map<String, Json> = match serde_json::from_slice(&a.body) {
            Ok(Json::Object(v)) if v.get("result").is_some_and(Json::is_object) != v.contains_key("error") => v,
            _ => return b.err(&bad(format!("answered {} with no JSON-RPC response", a.status))),
        };
        if let Some(result) = v.get_mut("result").and_then(Json::as_object_mut) {
            match rpc.method {
                Method::SendMessage => {
                    if let Some(task) = result.get("task").and_then(Json::as_object) {
                        remotes.own_task(task, &scope);
                    }
                }
                // The caller's tasks only.
                Method::ListTasks => {
                    if let Some(tasks) = result.get_mut("tasks").and_then(Json::as_array_mut) {
                        tasks.retain(|t| t["id"].as_str().is_some_and(|id| remotes.owns(id, &scope)));
                        let n = tasks.len();
                        result.insert("totalSize".into(), json!(n));
                    }
                }
                _ => {}
            }
        }
        v.insert("jsonrpc".into(), json!("2.0"));
        v.insert("id".into(), rpc.id.clone());
        Response::json(StatusCode::OK, serde_json::to_vec(&v).expect("json"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(v: Json) -> Box<serde_json::value::RawValue> {
        serde_json::value::RawValue::from_string(v.to_string()).unwrap()
    }

    /// Regression (a review): the client's body was forwarded as sent, so a message naming
    /// another caller's task (or spelling it `task_id`, or in `referenceTaskIds`) reached it.
    #[test]
    fn a_remote_call_names_only_the_callers_tasks_and_is_rebuilt_from_checked_fields() {
        let owns = |t: &str| t == "mine";
        let free = |c: &str| c != "theirs";
        let msg = |extra: Json| {
            let mut m = json!({"messageId": "m", "role": "ROLE_USER", "parts": [{"text": "x"}]});
            for (k, v) in extra.as_object().unwrap() {
                m[k] = v.clone();
            }
            raw(json!({"message": m, "configuration": {"returnImmediately": true, "taskPushNotificationConfig": null}}))
        };
        let send = |p: &serde_json::value::RawValue| remote_params(Method::SendMessage, Some(p), &owns, &free);
        assert_eq!(send(&msg(json!({"taskId": "yours"}))).unwrap_err().kind, ErrorKind::TaskNotFound);
        assert_eq!(
            send(&msg(json!({"referenceTaskIds": ["mine", "yours"]}))).unwrap_err().kind,
            ErrorKind::TaskNotFound
        );
        assert_eq!(send(&msg(json!({"contextId": "theirs"}))).unwrap_err().kind, ErrorKind::InvalidParams);
        let ok = send(&msg(json!({"taskId": "mine", "task_id": "yours", "contextId": "new"}))).unwrap();
        assert_eq!(ok["message"]["taskId"], "mine");
        assert!(ok["message"].get("task_id").is_none(), "unknown spellings are not forwarded: {ok}");
        assert_eq!(ok["configuration"], json!({"returnImmediately": true}));
        let get = |id: &str| remote_params(Method::GetTask, Some(&raw(json!({"id": id, "tenant": "x"}))), &owns, &free);
        assert_eq!(get("yours").unwrap_err().kind, ErrorKind::TaskNotFound);
        assert_eq!(get("mine").unwrap(), json!({"id": "mine"}));
    }
}
