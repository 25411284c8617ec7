//! The A2A 1.0 gateway (SPEC, "Other protocols"): evmesh agents (Mode 1) served as A2A agents.
//!
//! `GET /a2a/{agentId}/.well-known/agent-card.json` (the card: JSON-RPC at `/a2a/{agentId}`,
//! REST under `/a2a/{agentId}/v1`), JSON-RPC `POST /a2a/{agentId}` (`SendMessage`,
//! `SendStreamingMessage`, `GetTask`, `ListTasks`, `CancelTask`, `SubscribeToTask`) and the same
//! over REST (`POST v1/message:send|message:stream`, `GET v1/tasks`, `GET v1/tasks/{id}`,
//! `POST v1/tasks/{id}:cancel`, `GET|POST v1/tasks/{id}:subscribe`). Every call but the card's
//! needs `A2A-Version: 1.x` (header or query) and REQUEST on `agent:<agentId>`; tasks are their
//! sender's (another principal's are "not found").
//!
//! A context is an agent streaming session (`shard::calls`, its key `<agent>:<contextId>`),
//! each message of it a turn whose prompt is the message's text (`a2a::Message::prompt`). A
//! task lives in `shard::tasks`; a driver (spawned where the message arrived) reads the turn's
//! chunks and moves the task: the first chunk makes it working, each chunk's text (or JSON)
//! becomes a part of the task's one artifact (streamed as `artifactUpdate`), the last one
//! completes it, or with `chunkType` `input-required` sets it waiting for the client's input
//! (its text the status message; the next message naming the task is its next turn); an error
//! fails it, a cancel cancels it.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use frame_codec::{ArchivedAttrValue, DataKind, Frame};
use serde_json::{json, Value as Json};

use super::adaptor::{FrameAdaptor, Refusal, To};
use super::call::{control_frame, text_turn_frame, uuid_v4};
use super::gate::Gate;
use super::Traffic;
use crate::adaptor::a2a::{self, A2aError, ErrorKind, Method, SendMessage, Task, TaskState};
use crate::governance::acl::{Action, Kind};
use crate::http::{Method as HttpMethod, StatusCode};
use crate::server::client::{Pool, Url};
use crate::server::{A2aRelaySpec, A2aStreamSpec, Request, Response, Upgrade};
use crate::shard::calls::{session_key, Call, End, Read};
use crate::shard::tasks::{Bell, Remote, TaskEntry, TaskLog};

/// What one task keeps at most: messages of history (the oldest go), and parts and bytes of its
/// artifact (past them the task fails: an agent streaming without end cannot grow it further).
const MAX_HISTORY: usize = 20;
/// A message kept in a task's history whose JSON is larger than this keeps its ids, not its
/// parts (a part saying how large they were).
const MAX_KEPT_MESSAGE: usize = 16 * 1024;
const MAX_ARTIFACT_PARTS: usize = 4096;
const MAX_ARTIFACT_BYTES: usize = 4 << 20;

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

/// Ids (agents, contexts) as the gateway takes them.
fn valid_id(id: &str) -> bool {
    (1..=100).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn now_ms() -> u64 {
    crate::model::clock::now_ms()
}

/// Now as RFC 3339 UTC with milliseconds.
fn timestamp() -> String {
    let full = crate::adaptor::rfc3339_from_micros(crate::model::clock::now_micros());
    format!("{}Z", &full[..full.len() - 4])
}

/// How an answer goes out: JSON-RPC (HTTP 200, the request's id) or REST (the status).
enum Binding {
    Rpc(Json),
    Rest,
}

impl Binding {
    fn ok(&self, result: &Json) -> Response {
        match self {
            Binding::Rpc(id) => Response::json(StatusCode::OK, a2a::jsonrpc_result(id, result)),
            Binding::Rest => Response::json(StatusCode::OK, serde_json::to_vec(result).expect("json")),
        }
    }

    fn err(&self, e: &A2aError) -> Response {
        match self {
            Binding::Rpc(id) => Response::json(StatusCode::OK, e.jsonrpc(id)),
            Binding::Rest => {
                let (status, body) = e.rest();
                let r = Response::json(StatusCode(status), body);
                match e.metadata.iter().find(|(k, _)| *k == "retryAfter") {
                    Some((_, v)) => r.with_header("retry-after", v.clone()),
                    None => r,
                }
            }
        }
    }

    fn stream(self, task_id: String, history_length: Option<usize>, expires_us: Option<i64>) -> Response {
        let rpc_id = match self {
            Binding::Rpc(id) => Some(id),
            Binding::Rest => None,
        };
        let spec = A2aStreamSpec { task_id, rpc_id, history_length, expires_us };
        Response::streaming(Upgrade::A2aSse(Box::new(spec)), "text/event-stream")
    }
}

/// A2A's `SendMessage` as a turn of the context's agent session (the FrameAdaptor SPI): the
/// message's prompt (`a2a::Message::prompt`) is the turn's text; the ingress's refusals are
/// A2A errors in the request's binding.
struct A2aTurn<'a> {
    prompt: &'a str,
    advertised: &'a str,
    b: &'a Binding,
    /// The task the turn is for, told its turn's number as the frame is made (before it is
    /// stored: a cancel from then on ends this turn).
    entry: Option<&'a Arc<TaskEntry>>,
}

impl FrameAdaptor for A2aTurn<'_> {
    fn frames(&self, to: &To<'_>, _req: &Request<'_>) -> Result<Vec<Frame>, Refusal> {
        let Some((sid, turn)) = to.turn else {
            let e = A2aError::new(ErrorKind::Internal, "an A2A message is a turn of a session");
            return Err(Refusal::Answered(self.b.err(&e)));
        };
        if let Some(entry) = self.entry {
            entry.log().turn = turn;
        }
        Ok(vec![text_turn_frame(self.prompt, (sid, turn), to.topic, self.advertised)])
    }

    fn refused(&self, problem: Response) -> Response {
        self.b.err(&from_problem(&problem))
    }

    fn bytes(&self, _req: &Request<'_>) -> u64 {
        self.prompt.len() as u64
    }
}

/// What a refused request of the broker's own (ACL, limits) becomes: its detail, as A2A's
/// nearest error.
fn from_problem(p: &Response) -> A2aError {
    let (status, detail) = super::ws_publish::refusal(p);
    let kind = match status {
        400 => ErrorKind::InvalidParams,
        s => ErrorKind::Broker(s),
    };
    let e = A2aError::new(kind, detail);
    match p.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case("retry-after")) {
        Some((_, v)) => e.with("retryAfter", v.clone()),
        None => e,
    }
}

/// The broker is shedding (over its memory limit) or out of room: 503, try again.
fn unavailable(detail: impl Into<String>) -> A2aError {
    A2aError::new(ErrorKind::Broker(503), detail).with("retryAfter", "1")
}

/// A JSON-RPC request (a POST), with how to answer it; or the answer to one that is not.
fn rpc_of<'r>(req: &'r Request<'_>) -> Result<(a2a::RpcRequest<'r>, Binding), Response> {
    if req.method() != HttpMethod::Post {
        return Err(Response::empty(StatusCode::METHOD_NOT_ALLOWED).with_header("allow", "POST"));
    }
    match a2a::parse_rpc(req.body) {
        Ok(r) => {
            let b = Binding::Rpc(r.id.clone());
            Ok((r, b))
        }
        Err((id, e)) => Err(Binding::Rpc(id).err(&e)),
    }
}

impl Traffic {
    /// A request under `/a2a/`: `rest` is the path after it.
    pub(super) async fn a2a(&self, gate: &mut Gate<'_>, req: &Request<'_>, rest: &str) -> Response {
        let (agent, tail) = rest.split_once('/').unwrap_or((rest, ""));
        if !valid_id(agent) {
            return Binding::Rest.err(&A2aError::new(ErrorKind::InvalidParams, "agent ids are [A-Za-z0-9._-]{1,100}"));
        }
        let rest_binding = tail == "v1" || tail.starts_with("v1/");
        // Errors before the request is read still answer its id (clients match on it).
        let binding = || match rest_binding {
            true => Binding::Rest,
            false => Binding::Rpc(a2a::parse_rpc(req.body).map(|r| r.id).unwrap_or_else(|(id, _)| id)),
        };
        // With Kafka an agent (its tasks and turns too) is served at its home instance only;
        // who may not call it is not told where that is.
        let card = tail == ".well-known/agent-card.json";
        match gate.allow(Action::Request, Kind::Agent, agent) {
            Err(r) if card => return r,
            Err(r) => return binding().err(&from_problem(&r)),
            Ok(()) => {}
        }
        if let Err(r) = self.at_agent_home(gate, agent, req) {
            return r;
        }
        let remote = self.shard.shared.remotes.get(&Self::stored_agent(gate, agent));
        if card {
            return match (req.method(), remote) {
                (HttpMethod::Get, None) => self.agent_card(gate, agent),
                (HttpMethod::Get, Some(r)) => match gate.allow(Action::Request, Kind::Agent, agent) {
                    Err(r) => r,
                    Ok(()) => match Box::pin(self.remote_card(&Self::stored_agent(gate, agent), agent, &r)).await {
                        Ok((card, _)) => Response::json(StatusCode::OK, serde_json::to_vec(&card).expect("json"))
                            .with_header("cache-control", "max-age=60"),
                        Err(e) => Binding::Rest.err(&e),
                    },
                },
                _ => Response::empty(StatusCode::METHOD_NOT_ALLOWED).with_header("allow", "GET"),
            };
        }
        if let Err(r) = gate.allow(Action::Request, Kind::Agent, agent) {
            return binding().err(&from_problem(&r));
        }
        let version = req.header("a2a-version").and_then(|v| std::str::from_utf8(v).ok()).map(str::to_owned);
        let version = version.or_else(|| req.query("A2A-Version").map(|v| v.into_owned()));
        if let Err(e) = a2a::negotiate(version.as_deref()) {
            return binding().err(&e);
        }
        if let Some(r) = remote {
            return Box::pin(self.a2a_remote(gate, req, agent, &r, rest_binding, tail)).await;
        }
        if rest_binding {
            return Box::pin(self.a2a_rest(gate, req, agent, tail.strip_prefix("v1").unwrap_or(""))).await;
        }
        if !tail.is_empty() {
            let route: String = tail.chars().take(64).collect();
            return Binding::Rest.err(&A2aError::new(ErrorKind::MethodNotFound, format!("no A2A route {route}")));
        }
        let (rpc, b) = match rpc_of(req) {
            Ok(x) => x,
            Err(r) => return r,
        };
        let done = match rpc.method {
            Method::SendMessage | Method::SendStreamingMessage => {
                let streaming = rpc.method == Method::SendStreamingMessage;
                match a2a::parse_send(rpc.params) {
                    Ok(s) => return Box::pin(self.a2a_send(gate, req, agent, s, streaming, b)).await,
                    Err(e) => Err(e),
                }
            }
            Method::GetTask => a2a::parse_task_id(rpc.params).and_then(|(id, h)| self.a2a_get(gate, agent, &id, h)),
            Method::ListTasks => a2a::parse_list(rpc.params).and_then(|l| self.a2a_list(gate, agent, &l)),
            Method::CancelTask => match a2a::parse_task_id(rpc.params) {
                Ok((id, _)) => Box::pin(self.a2a_cancel(gate, agent, &id)).await,
                Err(e) => Err(e),
            },
            Method::SubscribeToTask => match a2a::parse_task_id(rpc.params) {
                Ok((id, h)) => return self.a2a_subscribe(gate, agent, &id, h, b),
                Err(e) => Err(e),
            },
            Method::Unsupported(name) => {
                Err(A2aError::new(ErrorKind::UnsupportedOperation, format!("{name} is not offered by this agent")))
            }
        };
        match done {
            Ok(result) => b.ok(&result),
            Err(e) => b.err(&e),
        }
    }

    /// The REST binding: `path` is what follows `/a2a/{agent}/v1`.
    async fn a2a_rest(&self, gate: &mut Gate<'_>, req: &Request<'_>, agent: &str, path: &str) -> Response {
        let b = Binding::Rest;
        let method = req.method();
        let raw = |body: &[u8]| -> Result<Box<serde_json::value::RawValue>, A2aError> {
            let text = std::str::from_utf8(if body.is_empty() { b"{}" } else { body })
                .map_err(|_| A2aError::new(ErrorKind::Parse, "the body is not UTF-8"))?;
            serde_json::value::RawValue::from_string(text.to_owned())
                .map_err(|e| A2aError::new(ErrorKind::Parse, format!("Invalid JSON payload: {e}")))
        };
        let query_params = || -> Box<serde_json::value::RawValue> {
            let mut m = serde_json::Map::new();
            for (name, number) in [
                ("pageSize", true),
                ("pageToken", false),
                ("contextId", false),
                ("status", false),
                ("historyLength", true),
                ("includeArtifacts", false),
            ] {
                if let Some(q) = req.query(name) {
                    let value = match (number, name) {
                        (true, _) => q.parse::<u64>().map(Json::from).unwrap_or(Json::String(q.into_owned())),
                        (false, "includeArtifacts") => Json::Bool(q == "true"),
                        _ => Json::String(q.into_owned()),
                    };
                    m.insert(name.to_owned(), value);
                }
            }
            serde_json::value::RawValue::from_string(Json::Object(m).to_string()).expect("json")
        };
        let done = match (method, path) {
            (HttpMethod::Post, "/message:send" | "/message:stream") => {
                let streaming = path == "/message:stream";
                match raw(req.body).and_then(|p| a2a::parse_send(Some(&p))) {
                    Ok(s) => return Box::pin(self.a2a_send(gate, req, agent, s, streaming, b)).await,
                    Err(e) => Err(e),
                }
            }
            (HttpMethod::Get, "/tasks") => {
                let q = query_params();
                a2a::parse_list(Some(&q)).and_then(|l| self.a2a_list(gate, agent, &l))
            }
            (m, p) => match p.strip_prefix("/tasks/") {
                Some(id) if id.ends_with(":cancel") && m == HttpMethod::Post => {
                    Box::pin(self.a2a_cancel(gate, agent, id.strip_suffix(":cancel").unwrap_or(id))).await
                }
                Some(id) if id.ends_with(":subscribe") && matches!(m, HttpMethod::Get | HttpMethod::Post) => {
                    let h = req.query("historyLength").and_then(|h| h.parse().ok());
                    return self.a2a_subscribe(gate, agent, id.strip_suffix(":subscribe").unwrap_or(id), h, b);
                }
                Some(id) if !id.contains(':') && !id.contains('/') && m == HttpMethod::Get => {
                    let h = req.query("historyLength").and_then(|h| h.parse().ok());
                    self.a2a_get(gate, agent, id, h)
                }
                _ => {
                    let route: String = p.chars().take(64).collect();
                    Err(A2aError::new(ErrorKind::MethodNotFound, format!("no A2A route {method:?} v1{route}")))
                }
            },
        };
        match done {
            Ok(result) => b.ok(&result),
            Err(e) => b.err(&e),
        }
    }

    /// A remote agent's card as evmesh serves it (its JSON-RPC interface evmesh's own URL; the
    /// rest as the remote says), and the remote's JSON-RPC URL. Fetched at most once a minute.
    async fn remote_card(&self, stored: &str, agent: &str, r: &Remote) -> Result<(Json, String), A2aError> {
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
    async fn a2a_remote(
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

    /// The agent card, with this broker's URLs.
    fn agent_card(&self, gate: &mut Gate<'_>, agent: &str) -> Response {
        if let Err(r) = gate.allow(Action::Request, Kind::Agent, agent) {
            return r;
        }
        let base = format!("{}/a2a/{agent}", self.shard.shared.config.advertised_url);
        let skills = json!([{"id": "chat", "name": "chat", "description": format!("a turn of evmesh agent {agent}"), "tags": ["evmesh"]}]);
        let card =
            a2a::agent_card(agent, &format!("evmesh agent {agent}, through evmesh's A2A gateway"), &base, skills);
        Response::json(StatusCode::OK, serde_json::to_vec(&card).expect("json"))
            .with_header("cache-control", "max-age=60")
    }

    /// A task of the caller's and this agent's, or TaskNotFound (another's is not told apart).
    fn own_task(&self, gate: &Gate<'_>, agent: &str, id: &str) -> Result<Arc<TaskEntry>, A2aError> {
        match self.shard.shared.tasks.get(id) {
            Some(e) if e.owner == gate.principal() && e.tenant == gate.who.tenant && e.agent == agent => Ok(e),
            _ => Err(A2aError::task_not_found(id)),
        }
    }

    fn a2a_get(&self, gate: &Gate<'_>, agent: &str, id: &str, history: Option<usize>) -> Result<Json, A2aError> {
        let e = self.own_task(gate, agent, id)?;
        let log = e.log();
        Ok(log.task.to_json(history, true))
    }

    fn a2a_list(&self, gate: &Gate<'_>, agent: &str, l: &a2a::ListTasks) -> Result<Json, A2aError> {
        let scope = crate::shard::tasks::scope(gate.who.tenant.as_deref(), gate.principal().as_deref(), agent);
        // The caller's tasks only (an index), filtered and sorted by key; only the page rendered.
        let mut tasks: Vec<(u64, Arc<TaskEntry>)> = self
            .shard
            .shared
            .tasks
            .of(&scope)
            .into_iter()
            .filter(|e| {
                let log = e.log();
                l.context_id.as_deref().is_none_or(|c| c == log.task.context_id)
                    && l.status.is_none_or(|s| s == log.task.state)
            })
            .map(|e| (e.updated_ms.load(std::sync::atomic::Ordering::Relaxed), e))
            .collect();
        // Newest status first (ties by id, so pages are stable).
        tasks.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.id.cmp(&b.1.id)));
        let total = tasks.len();
        let page: Vec<Json> = tasks
            .into_iter()
            .skip(l.offset)
            .take(l.page_size)
            .map(|(_, e)| e.log().task.to_json(l.history_length, l.include_artifacts))
            .collect();
        let next = l.offset + page.len();
        let next_token = if next < total { next.to_string() } else { String::new() };
        Ok(json!({"tasks": page, "nextPageToken": next_token, "pageSize": l.page_size, "totalSize": total}))
    }

    async fn a2a_cancel(&self, gate: &Gate<'_>, agent: &str, id: &str) -> Result<Json, A2aError> {
        let e = self.own_task(gate, agent, id)?;
        let state = e.log().task.state;
        if state.terminal() {
            let msg = format!("the task is {}", state.as_str());
            return Err(A2aError::new(ErrorKind::TaskNotCancelable, msg).with("taskId", id));
        }
        let calls = &self.shard.shared.calls;
        let turn = e.log().turn;
        if matches!(state, TaskState::Submitted | TaskState::Working) {
            // Its own turn only (the session may be on another task's by now).
            if let Some(call) = calls.get(&e.call_key).filter(|c| c.turn() == turn && c.live()) {
                if calls.end_turn(&call, End::Cancelled, now_ms()) {
                    let topic = Self::agent_topic(gate, agent);
                    if self.shard.shared.watchers.is_followed(&topic) {
                        let _ = self.store(&topic, vec![control_frame(&call.sid, &topic, "cancel")]).await;
                    }
                }
            }
        }
        e.update(now_ms(), |t| {
            if t.state.terminal() {
                return Vec::new();
            }
            t.state = TaskState::Canceled;
            t.timestamp = timestamp();
            vec![t.status_update()]
        });
        let log = e.log();
        Ok(log.task.to_json(None, true))
    }

    fn a2a_subscribe(&self, gate: &Gate<'_>, agent: &str, id: &str, history: Option<usize>, b: Binding) -> Response {
        let e = match self.own_task(gate, agent, id) {
            Ok(e) => e,
            Err(err) => return b.err(&err),
        };
        if e.log().task.state.terminal() {
            let err =
                A2aError::new(ErrorKind::UnsupportedOperation, "the task is in a terminal state").with("taskId", id);
            return b.err(&err);
        }
        b.stream(e.id.clone(), history, gate.who.expires_us)
    }

    /// `SendMessage` / `SendStreamingMessage`: a new task of the message's context, or the next
    /// turn of the input-required task it names.
    async fn a2a_send(
        &self,
        gate: &mut Gate<'_>,
        req: &Request<'_>,
        agent: &str,
        s: SendMessage,
        streaming: bool,
        b: Binding,
    ) -> Response {
        let shared = &self.shard.shared;
        let prompt = s.message.prompt();
        let mut adaptor = A2aTurn { prompt: &prompt, advertised: &shared.config.advertised_url, b: &b, entry: None };
        // Everything that can refuse the message first, before a task or a session exists.
        let topic = match self.admit_turn(&adaptor, gate, req, agent) {
            Ok(t) => t,
            Err(Refusal::Answered(r)) => return r,
            Err(Refusal::Problem(p) | Refusal::Busy(p)) => return adaptor.refused(p),
        };
        let continued = s.message.task_id.is_some();
        let entry = match self.a2a_task_for(gate, agent, &s) {
            Ok(e) => e,
            Err(e) => return b.err(&e),
        };
        // Past here a task exists: a turn that cannot start fails a new task (nothing would
        // move it), and leaves a continued one waiting for input as it was.
        let failed = |e: A2aError| {
            match continued {
                true => entry.update(now_ms(), |t| settle(t, TaskState::InputRequired, Some(&e.message))),
                false => fail(&entry, &e.message),
            }
            b.err(&e)
        };
        let call = match shared.calls.get(&entry.call_key).filter(|c| c.principal == entry.owner) {
            Some(c) => c,
            None => return failed(A2aError::new(ErrorKind::UnsupportedOperation, "the context's session ended")),
        };
        adaptor.entry = Some(&entry);
        let turn = match self.turn_with(&adaptor, &call, (agent, &topic), req).await {
            Ok(turn) => turn,
            Err(Refusal::Answered(r)) => return r,
            Err(Refusal::Problem(p)) => return failed(from_problem(&p)),
            Err(Refusal::Busy(p)) => {
                let (_, detail) = super::ws_publish::refusal(&p);
                return failed(A2aError::new(
                    ErrorKind::UnsupportedOperation,
                    format!("the context is busy: {detail}"),
                ));
            }
        };
        monoio::spawn(drive(self.shard.clone(), entry.clone(), call, turn));
        if streaming {
            return b.stream(entry.id.clone(), s.history_length, gate.who.expires_us);
        }
        if !s.return_immediately {
            // Blocking: until the task settles, or at most max_request_timeout_ms (then the task
            // as it is, still working: GetTask or SubscribeToTask follow it).
            let until = std::time::Instant::now() + shared.config.max_request_timeout;
            loop {
                let seen = entry.bell.rung();
                if entry.log().task.state.settled() {
                    break;
                }
                let left = until.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    break;
                }
                let wait =
                    futures::future::select(Box::pin(entry.bell.after(seen)), Box::pin(monoio::time::sleep(left)));
                wait.await;
            }
        }
        let log = entry.log();
        b.ok(&json!({"task": log.task.to_json(s.history_length, true)}))
    }

    /// The task a message goes to: the input-required one it names (its next turn), or a new
    /// one in the message's context (the caller's session of the agent by that id, opened if
    /// new; a context id of its own when the message has none).
    fn a2a_task_for(&self, gate: &Gate<'_>, agent: &str, s: &SendMessage) -> Result<Arc<TaskEntry>, A2aError> {
        let shared = &self.shard.shared;
        let bad = |m: &str| A2aError::new(ErrorKind::InvalidParams, m.to_owned());
        let mut user = s.message.json.clone();
        if let Some(id) = &s.message.task_id {
            let e = self.own_task(gate, agent, id)?;
            let mut log = e.log();
            let t = &mut log.task;
            if s.message.context_id.as_ref().is_some_and(|c| *c != t.context_id) {
                return Err(bad("message: contextId is not the task's"));
            }
            if t.state.terminal() {
                return Err(A2aError::new(
                    ErrorKind::UnsupportedOperation,
                    format!("the task is {}", t.state.as_str()),
                )
                .with("taskId", id));
            }
            if !matches!(t.state, TaskState::InputRequired | TaskState::AuthRequired) {
                return Err(
                    A2aError::new(ErrorKind::UnsupportedOperation, "the task is still working").with("taskId", id)
                );
            }
            user["contextId"] = json!(t.context_id);
            remember(t, user);
            // Working again from here: a blocking send waits for this turn's outcome.
            t.state = TaskState::Working;
            t.status_message = None;
            t.timestamp = timestamp();
            let update = t.status_update();
            log.emit(update);
            drop(log);
            e.touch(now_ms());
            e.bell.ring();
            return Ok(e);
        }
        let context = match &s.message.context_id {
            Some(c) if valid_id(c) => c.clone(),
            Some(_) => return Err(bad("message: contextId must be [A-Za-z0-9._-]{1,100}")),
            None => uuid_v4(),
        };
        // The caller's own context (contexts are per principal: another's of the same name is
        // not this one), on its session while that lives, else on a new one.
        let principal = gate.principal();
        let scope = crate::shard::tasks::scope(gate.who.tenant.as_deref(), principal.as_deref(), agent);
        let known = shared.tasks.context(&scope, &context);
        if let Some((_, latest)) = &known {
            if !latest.log().task.state.settled() {
                let e = A2aError::new(ErrorKind::UnsupportedOperation, "a task of this context is still working");
                return Err(e.with("taskId", latest.id.clone()));
            }
        }
        let key = match known.map(|(key, _)| key).filter(|k| shared.calls.get(k).is_some()) {
            Some(key) => key,
            None => {
                let sid = format!("{agent}:{}", uuid_v4());
                let key = session_key(gate.who.tenant.as_deref(), &sid);
                let named = (Self::stored_agent(gate, agent), sid);
                shared.calls.open(key.clone(), named, principal.clone(), now_ms()).map_err(|_| {
                    unavailable(format!("max_sessions ({}) sessions are open", shared.config.max_sessions))
                })?;
                key
            }
        };
        let id = uuid_v4();
        user["contextId"] = json!(context);
        user["taskId"] = json!(id);
        let task = Task {
            id: id.clone(),
            context_id: context.clone(),
            state: TaskState::Submitted,
            status_message: None,
            timestamp: timestamp(),
            artifacts: Vec::new(),
            history: vec![user],
            artifact_bytes: 0,
        };
        let log = TaskLog { task, events: VecDeque::new(), first: 0, turn: 0 };
        let entry = Arc::new(TaskEntry {
            id,
            owner: principal,
            tenant: gate.who.tenant.clone(),
            agent: agent.to_owned(),
            call_key: key.clone(),
            log: Mutex::new(log),
            bell: Bell::default(),
            updated_ms: std::sync::atomic::AtomicU64::new(now_ms()),
        });
        if shared.tasks.insert(entry.clone(), (&key, &context)).is_err() {
            return Err(unavailable("too many tasks are kept; try again later"));
        }
        Ok(entry)
    }
}

/// Reads a turn's chunks and moves its task (see the module's doc).
async fn drive(shard: std::rc::Rc<crate::shard::core::Shard>, entry: Arc<TaskEntry>, call: Arc<Call>, turn: u64) {
    let calls = &shard.shared.calls;
    let Some(mut reader) = calls.reader(&call, None, Some(turn)) else {
        return fail(&entry, "the turn could not be read");
    };
    let watch = reader.watch.clone();
    loop {
        match reader.read(256, 256 * 1024) {
            Read::Replaced => return fail(&entry, "the turn was replaced"),
            Read::Wait => watch.rung().await,
            Read::Chunks { chunks, end, dropped } => {
                if dropped > 0 {
                    // The agent outran the turn's log: the answer has a hole, said so.
                    let why = format!("{dropped} chunks of the answer were lost (the agent outran the gateway)");
                    entry.update(now_ms(), |t| settle(t, TaskState::Failed, Some(&why)));
                }
                for c in &chunks {
                    apply(&entry, c);
                }
                if end {
                    return;
                }
            }
        }
    }
}

fn fail(entry: &TaskEntry, why: &str) {
    entry.update(now_ms(), |t| settle(t, TaskState::Failed, Some(why)));
}

/// Moves a task to `state`, with an agent message saying `text`; the events saying so.
fn settle(t: &mut Task, state: TaskState, text: Option<&str>) -> Vec<Json> {
    if t.state.terminal() {
        return Vec::new();
    }
    t.state = state;
    t.timestamp = timestamp();
    t.status_message = text.map(|m| a2a::agent_text(&uuid_v4(), &t.context_id, &t.id, m));
    if let Some(m) = &t.status_message {
        remember(t, m.clone());
    }
    vec![t.status_update()]
}

/// Adds a message to the task's history, which keeps the last [`MAX_HISTORY`] (a large one
/// without its parts).
fn remember(t: &mut Task, mut message: Json) {
    if t.history.len() == MAX_HISTORY {
        t.history.remove(0);
    }
    let size = message.to_string().len();
    if size > MAX_KEPT_MESSAGE {
        message["parts"] = json!([{"text": format!("({size} bytes, not kept in the history)")}]);
    }
    t.history.push(message);
}

/// One chunk of the task's turn.
fn apply(entry: &TaskEntry, chunk: &Frame) {
    let body = chunk.body();
    let error = body.attr_str("emerror").map(str::to_owned);
    let done = matches!(body.attr("emdone"), Some(ArchivedAttrValue::Bool(true)));
    let input = body.attr_str("emchunktype") == Some("input-required");
    let part = match chunk.header().data_kind {
        DataKind::None => None,
        DataKind::Json => match serde_json::from_slice::<Json>(&body.data) {
            Ok(Json::String(s)) if s.is_empty() => None,
            Ok(Json::String(s)) => Some(json!({"text": s})),
            Ok(v) => Some(json!({"data": v})),
            Err(_) => None,
        },
        _ if body.data.is_empty() => None,
        _ => Some(json!({"text": String::from_utf8_lossy(&body.data)})),
    };
    entry.update(now_ms(), |t| {
        let mut events = Vec::new();
        if t.state.terminal() {
            return events;
        }
        if matches!(t.state, TaskState::Submitted | TaskState::InputRequired | TaskState::AuthRequired) {
            t.state = TaskState::Working;
            t.status_message = None;
            t.timestamp = timestamp();
            events.push(t.status_update());
        }
        if let Some(e) = error {
            let state = if e == "cancelled" { TaskState::Canceled } else { TaskState::Failed };
            events.extend(settle(t, state, Some(&e)));
            return events;
        }
        if input && done {
            let text = part.as_ref().and_then(|p| p["text"].as_str()).unwrap_or("input required").to_owned();
            events.extend(settle(t, TaskState::InputRequired, Some(&text)));
            return events;
        }
        if let Some(p) = part {
            let parts = t.artifacts.first().and_then(|a| a["parts"].as_array()).map_or(0, Vec::len);
            if parts >= MAX_ARTIFACT_PARTS || t.artifact_bytes >= MAX_ARTIFACT_BYTES {
                let why = format!("the answer is over {MAX_ARTIFACT_PARTS} parts or {MAX_ARTIFACT_BYTES} bytes");
                events.extend(settle(t, TaskState::Failed, Some(&why)));
                return events;
            }
            let append = !t.artifacts.is_empty();
            if !append {
                t.artifacts.push(json!({"artifactId": format!("{}-response", t.id), "name": "response", "parts": []}));
            }
            t.artifact_bytes += chunk.as_bytes().len();
            if let Some(parts) = t.artifacts[0]["parts"].as_array_mut() {
                parts.push(p.clone());
            }
            let update = json!({"artifactId": format!("{}-response", t.id), "name": "response", "parts": [p]});
            events.push(t.artifact_update(&update, append, false));
        }
        if done {
            events.extend(settle(t, TaskState::Completed, None));
        }
        events
    });
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
