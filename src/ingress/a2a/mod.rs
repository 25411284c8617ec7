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
//! chunks and moves the task (`adaptor::a2a::task`, a pure state machine): the first chunk
//! makes it working, each chunk's text (or JSON) becomes a part of the task's one artifact
//! (streamed as `artifactUpdate`), the last one completes it, or with `chunkType`
//! `input-required` sets it waiting for the client's input (its text the status message; the
//! next message naming the task is its next turn); an error fails it, a cancel cancels it.
//!
//! Here the routing: the endpoints, and the calls on local agents' tasks. `binding` is how an
//! answer goes out (JSON-RPC or REST), `driver` a task's turn (its frame, and the driver
//! feeding its chunks to the task machine), `remote` the proxy to remote A2A agents.

mod binding;
mod driver;
mod remote;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use serde_json::{json, Value as Json};

use self::binding::{from_problem, now_ms, rpc_of, unavailable, valid_id, Binding};
use self::driver::{drive, A2aTurn, Now};
use super::adaptor::{FrameAdaptor, Refusal};
use super::call::{control_frame, uuid_v4};
use super::gate::Gate;
use super::Traffic;
use crate::adaptor::a2a::{self, task, A2aError, ErrorKind, Method, SendMessage, TaskState};
use crate::governance::acl::{Action, Kind};
use crate::http::{Method as HttpMethod, StatusCode};
use crate::server::{Request, Response};
use crate::shard::calls::{session_key, End};
use crate::shard::tasks::{Bell, TaskEntry, TaskLog};

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
        e.update(now_ms(), |t| task::cancel(t, &mut Now));
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
        b.stream(e.id.clone(), history, gate.who.expires_us, None)
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
            entry.update(now_ms(), |t| task::not_started(t, continued, &e.message, &mut Now));
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
        // A stream starts from the task as it is before its turn runs: every update of the turn
        // follows, however soon the agent answers.
        let start = streaming.then(|| {
            let log = entry.log();
            (log.end(), log.task.to_json(s.history_length, true))
        });
        monoio::spawn(drive(self.shard.clone(), entry.clone(), call, turn));
        if let Some(start) = start {
            return b.stream(entry.id.clone(), s.history_length, gate.who.expires_us, Some(start));
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
        let user = s.message.json.clone();
        if let Some(id) = &s.message.task_id {
            let e = self.own_task(gate, agent, id)?;
            let mut log = e.log();
            // Working again from here: a blocking send waits for this turn's outcome.
            for update in task::resume(&mut log.task, s.message.context_id.as_deref(), user, &mut Now)? {
                log.emit(update);
            }
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
        let task = task::submitted(id.clone(), context.clone(), user, &mut Now);
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
