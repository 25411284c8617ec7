//! A2A 1.0 (a2aproject/A2A `v1.0.0`: `docs/specification.md`, `specification/a2a.proto`), the
//! shapes the gateway reads and writes, sans-io: the JSON-RPC envelope and its methods
//! (PascalCase), `A2A-Version` negotiation, the errors (JSON-RPC codes and REST
//! `google.rpc.Status` bodies, each with a `google.rpc.ErrorInfo`), a client's message, and the
//! task, its states and the stream responses (ProtoJSON: camelCase names, enum names as
//! strings, no `kind` discriminator).
//!
//! Choices where the texts differ (v1.0.1 is what current SDKs follow): HTTP statuses are
//! v1.0.1's (`TaskNotCancelable` 400, `InvalidAgentResponse` 500); a request without
//! `A2A-Version` is 0.3, which this gateway does not serve (`VersionNotSupported`), and any
//! 1.x is served as 1.0 (as a2a-python does).
//!
//! How a task moves (submitted, working, its artifact's parts, then completed, input-required,
//! failed or canceled) is [`task`]'s pure state machine.

pub mod task;

use serde_json::value::RawValue;
use serde_json::{json, Map, Value as Json};

/// The protocol version served.
pub const VERSION: &str = "1.0";
/// The `ErrorInfo` domain of A2A errors.
pub const DOMAIN: &str = "a2a-protocol.org";
/// Parts one message may carry.
pub const MAX_PARTS: usize = 64;

/// What went wrong, as A2A and JSON-RPC name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// No task with that id, or none the caller may see (-32001, 404).
    TaskNotFound,
    /// The task cannot be canceled in its current state (-32002, 400).
    TaskNotCancelable,
    /// Push notifications were asked for; this gateway offers none (-32003).
    PushNotificationNotSupported,
    /// A known operation, or an aspect of one, that is not offered here (-32004).
    UnsupportedOperation,
    /// A media type in the message's parts that the agent does not accept (-32005, 400).
    ContentTypeNotSupported,
    /// The agent answered with something that is not a valid response (-32006, 500).
    InvalidAgentResponse,
    /// The extended agent card was asked for and none is configured (-32007).
    ExtendedAgentCardNotConfigured,
    /// The agent requires an extension the client did not declare (-32008).
    ExtensionSupportRequired,
    /// An `A2A-Version` this gateway does not serve (-32009).
    VersionNotSupported,
    /// JSON-RPC parse error: the body is not valid JSON (-32700, 400).
    Parse,
    /// JSON-RPC invalid request: not a valid request object, or a batch (-32600, 400).
    InvalidRequest,
    /// JSON-RPC method not found (-32601, 404).
    MethodNotFound,
    /// JSON-RPC invalid params: the method's parameters are missing or wrong (-32602, 400).
    InvalidParams,
    /// JSON-RPC internal error (-32603, 500).
    Internal,
    /// The broker's own refusal (401, 403, 429, 503): JSON-RPC's internal error, REST its status.
    Broker(u16),
}

impl ErrorKind {
    /// The JSON-RPC error code.
    pub fn code(self) -> i64 {
        match self {
            ErrorKind::TaskNotFound => -32001,
            ErrorKind::TaskNotCancelable => -32002,
            ErrorKind::PushNotificationNotSupported => -32003,
            ErrorKind::UnsupportedOperation => -32004,
            ErrorKind::ContentTypeNotSupported => -32005,
            ErrorKind::InvalidAgentResponse => -32006,
            ErrorKind::ExtendedAgentCardNotConfigured => -32007,
            ErrorKind::ExtensionSupportRequired => -32008,
            ErrorKind::VersionNotSupported => -32009,
            ErrorKind::Parse => -32700,
            ErrorKind::InvalidRequest => -32600,
            ErrorKind::MethodNotFound => -32601,
            ErrorKind::InvalidParams => -32602,
            ErrorKind::Internal | ErrorKind::Broker(_) => -32603,
        }
    }

    /// The `ErrorInfo` reason: the type name without "Error", UPPER_SNAKE (A2A errors only).
    pub fn reason(self) -> Option<&'static str> {
        Some(match self {
            ErrorKind::TaskNotFound => "TASK_NOT_FOUND",
            ErrorKind::TaskNotCancelable => "TASK_NOT_CANCELABLE",
            ErrorKind::PushNotificationNotSupported => "PUSH_NOTIFICATION_NOT_SUPPORTED",
            ErrorKind::UnsupportedOperation => "UNSUPPORTED_OPERATION",
            ErrorKind::ContentTypeNotSupported => "CONTENT_TYPE_NOT_SUPPORTED",
            ErrorKind::InvalidAgentResponse => "INVALID_AGENT_RESPONSE",
            ErrorKind::ExtendedAgentCardNotConfigured => "EXTENDED_AGENT_CARD_NOT_CONFIGURED",
            ErrorKind::ExtensionSupportRequired => "EXTENSION_SUPPORT_REQUIRED",
            ErrorKind::VersionNotSupported => "VERSION_NOT_SUPPORTED",
            _ => return None,
        })
    }

    /// The REST binding's HTTP status and `google.rpc.Code` name (v1.0.1's mapping).
    pub fn http(self) -> (u16, &'static str) {
        match self {
            ErrorKind::TaskNotFound => (404, "NOT_FOUND"),
            ErrorKind::ContentTypeNotSupported | ErrorKind::InvalidParams | ErrorKind::Parse => {
                (400, "INVALID_ARGUMENT")
            }
            ErrorKind::InvalidRequest => (400, "INVALID_ARGUMENT"),
            ErrorKind::MethodNotFound => (404, "NOT_FOUND"),
            ErrorKind::InvalidAgentResponse | ErrorKind::Internal => (500, "INTERNAL"),
            ErrorKind::Broker(401) => (401, "UNAUTHENTICATED"),
            ErrorKind::Broker(403) => (403, "PERMISSION_DENIED"),
            ErrorKind::Broker(429) => (429, "RESOURCE_EXHAUSTED"),
            ErrorKind::Broker(413) => (413, "INVALID_ARGUMENT"),
            ErrorKind::Broker(s) if s >= 500 => (s, "UNAVAILABLE"),
            ErrorKind::Broker(s) => (s, "FAILED_PRECONDITION"),
            _ => (400, "FAILED_PRECONDITION"),
        }
    }
}

/// An error to answer with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct A2aError {
    /// What went wrong: gives the JSON-RPC code, the `ErrorInfo` reason and the HTTP status.
    pub kind: ErrorKind,
    /// A human-readable explanation: the JSON-RPC `message`, the REST `google.rpc.Status` one.
    pub message: String,
    /// `ErrorInfo.metadata` (string map).
    pub metadata: Vec<(&'static str, String)>,
}

impl A2aError {
    /// An error of `kind` with `message` and no metadata.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> A2aError {
        A2aError { kind, message: message.into(), metadata: Vec::new() }
    }

    /// Adds a `key`: `value` pair to the `ErrorInfo` metadata.
    pub fn with(mut self, key: &'static str, value: impl Into<String>) -> A2aError {
        self.metadata.push((key, value.into()));
        self
    }

    /// `TaskNotFound` for the task `id` (in the metadata as `taskId`).
    pub fn task_not_found(id: &str) -> A2aError {
        A2aError::new(ErrorKind::TaskNotFound, "Task not found").with("taskId", id)
    }

    /// The `details` / `data` array: an `ErrorInfo` for A2A errors, empty for JSON-RPC's own.
    fn details(&self) -> Vec<Json> {
        let Some(reason) = self.kind.reason() else { return Vec::new() };
        let metadata: Map<String, Json> =
            self.metadata.iter().map(|(k, v)| ((*k).to_owned(), Json::String(v.clone()))).collect();
        vec![json!({
            "@type": "type.googleapis.com/google.rpc.ErrorInfo",
            "reason": reason,
            "domain": DOMAIN,
            "metadata": metadata,
        })]
    }

    /// The JSON-RPC error response to request `id` (answered with HTTP 200, as the SDKs do).
    pub fn jsonrpc(&self, id: &Json) -> Vec<u8> {
        let mut error = json!({"code": self.kind.code(), "message": self.message});
        let details = self.details();
        if !details.is_empty() {
            error["data"] = Json::Array(details);
        }
        serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": id, "error": error})).expect("json")
    }

    /// The REST binding's error: its HTTP status and `{"error": google.rpc.Status}` body.
    pub fn rest(&self) -> (u16, Vec<u8>) {
        let (status, name) = self.kind.http();
        let body =
            json!({"error": {"code": status, "status": name, "message": self.message, "details": self.details()}});
        (status, serde_json::to_vec(&body).expect("json"))
    }
}

/// Checks the `A2A-Version` service parameter (header, or `?A2A-Version=`): `Major.Minor`, a
/// patch not considered. Absent or empty means 0.3, which is not served.
pub fn negotiate(version: Option<&str>) -> Result<(), A2aError> {
    let v = version.map(str::trim).unwrap_or("");
    let mut parts = v.split('.');
    let major = parts.next().unwrap_or("");
    if major == "1" && parts.next().is_some_and(|m| !m.is_empty() && m.bytes().all(|b| b.is_ascii_digit())) {
        return Ok(());
    }
    let asked = if v.is_empty() { "0.3 (no A2A-Version)".to_owned() } else { v.chars().take(32).collect() };
    Err(A2aError::new(
        ErrorKind::VersionNotSupported,
        format!("A2A version {asked} is not supported; send A2A-Version: 1.0"),
    )
    .with("supportedVersions", VERSION))
}

/// The JSON-RPC methods served (A2A 1.0's PascalCase names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// Sends a message to the agent: a new task, or the next turn of one waiting for input.
    SendMessage,
    /// As `SendMessage`, answered by a stream of the task and its status and artifact updates
    /// (server-sent events).
    SendStreamingMessage,
    /// The current state of a task, with up to `historyLength` messages of its history.
    GetTask,
    /// The caller's tasks, filtered and paged.
    ListTasks,
    /// Asks for a task to be canceled.
    CancelTask,
    /// Streams an unfinished task's updates, as `SendStreamingMessage` does.
    SubscribeToTask,
    /// Push notification configs and the extended card: known, not offered by evmesh's cards.
    Unsupported(&'static str),
}

impl Method {
    fn named(name: &str) -> Option<Method> {
        Some(match name {
            "SendMessage" => Method::SendMessage,
            "SendStreamingMessage" => Method::SendStreamingMessage,
            "GetTask" => Method::GetTask,
            "ListTasks" => Method::ListTasks,
            "CancelTask" => Method::CancelTask,
            "SubscribeToTask" => Method::SubscribeToTask,
            "CreateTaskPushNotificationConfig" => Method::Unsupported("CreateTaskPushNotificationConfig"),
            "GetTaskPushNotificationConfig" => Method::Unsupported("GetTaskPushNotificationConfig"),
            "ListTaskPushNotificationConfigs" => Method::Unsupported("ListTaskPushNotificationConfigs"),
            "DeleteTaskPushNotificationConfig" => Method::Unsupported("DeleteTaskPushNotificationConfig"),
            "GetExtendedAgentCard" => Method::Unsupported("GetExtendedAgentCard"),
            _ => return None,
        })
    }
}

/// A JSON-RPC request.
#[derive(Debug)]
pub struct RpcRequest<'a> {
    /// A string, a number or null (echoed in the answer).
    pub id: Json,
    /// The method called.
    pub method: Method,
    /// The `params` member as sent, read by the method's parser (`parse_send`, ...).
    pub params: Option<&'a RawValue>,
}

/// Parses a JSON-RPC 2.0 request; an error carries the id to answer with (null when unknown).
pub fn parse_rpc(body: &[u8]) -> Result<RpcRequest<'_>, (Json, A2aError)> {
    #[derive(serde::Deserialize)]
    struct Envelope<'a> {
        #[serde(default)]
        jsonrpc: Option<&'a str>,
        #[serde(default)]
        id: Option<Json>,
        #[serde(default)]
        method: Option<std::borrow::Cow<'a, str>>,
        #[serde(default, borrow)]
        params: Option<&'a RawValue>,
    }
    if body.trim_ascii_start().starts_with(b"[") {
        return Err((Json::Null, A2aError::new(ErrorKind::InvalidRequest, "batch requests are not supported")));
    }
    let e: Envelope<'_> = serde_json::from_slice(body)
        .map_err(|e| (Json::Null, A2aError::new(ErrorKind::Parse, format!("Invalid JSON payload: {e}"))))?;
    let id = e.id.unwrap_or(Json::Null);
    if !matches!(id, Json::Null | Json::String(_) | Json::Number(_)) {
        return Err((Json::Null, A2aError::new(ErrorKind::InvalidRequest, "id must be a string, a number or null")));
    }
    if e.jsonrpc != Some("2.0") {
        return Err((id, A2aError::new(ErrorKind::InvalidRequest, "jsonrpc must be \"2.0\"")));
    }
    let Some(name) = e.method else {
        return Err((id, A2aError::new(ErrorKind::InvalidRequest, "method is missing")));
    };
    let Some(method) = Method::named(&name) else {
        let shown: String = name.chars().take(64).collect();
        let hint = if name.contains('/') { " (a 0.3 method name; A2A 1.0 names are PascalCase)" } else { "" };
        return Err((id, A2aError::new(ErrorKind::MethodNotFound, format!("Method not found: {shown}{hint}"))));
    };
    Ok(RpcRequest { id, method, params: e.params })
}

/// A message's author.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The client (`ROLE_USER`).
    User,
    /// The agent (`ROLE_AGENT`).
    Agent,
}

impl Role {
    /// The ProtoJSON enum name: `ROLE_USER` or `ROLE_AGENT`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::User => "ROLE_USER",
            Role::Agent => "ROLE_AGENT",
        }
    }
}

/// A client's message, checked (its JSON kept to be echoed in the task's history).
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    /// The client's `messageId` (not empty).
    pub message_id: String,
    /// The `contextId` the message continues, if it names one.
    pub context_id: Option<String>,
    /// The `taskId` the message continues (a task waiting for input), if it names one.
    pub task_id: Option<String>,
    /// The message as sent (ProtoJSON), for the task's history.
    pub json: Json,
}

impl Message {
    /// The text of its `text` parts, joined by newlines: what an evmesh agent receives as the
    /// prompt. Other parts go as JSON lines (`{"data":...}`, `{"url":...}`, `{"raw":...}`).
    pub fn prompt(&self) -> String {
        let parts = self.json.get("parts").and_then(Json::as_array).map(Vec::as_slice).unwrap_or_default();
        let lines: Vec<String> = parts
            .iter()
            .map(|p| match p.get("text").and_then(Json::as_str) {
                Some(t) => t.to_owned(),
                None => p.to_string(),
            })
            .collect();
        lines.join("\n")
    }
}

/// Checks a message as a client sends it (`Message`, P L254-277): `messageId`, `role` (a
/// client's is `ROLE_USER`) and 1 to [`MAX_PARTS`] parts, each with exactly one of `text`,
/// `raw`, `url`, `data`.
pub fn check_message(m: &Json) -> Result<Message, A2aError> {
    let bad = |what: &str| A2aError::new(ErrorKind::InvalidParams, format!("message: {what}"));
    let obj = m.as_object().ok_or_else(|| bad("not an object"))?;
    let text = |k: &str| obj.get(k).and_then(Json::as_str).filter(|s| !s.is_empty());
    let message_id = text("messageId").ok_or_else(|| bad("messageId is required"))?.to_owned();
    match obj.get("role").and_then(Json::as_str) {
        Some("ROLE_USER" | "user") => {}
        Some(other) => {
            return Err(bad(&format!("role {:?} is not ROLE_USER", other.chars().take(32).collect::<String>())))
        }
        None => return Err(bad("role is required")),
    }
    let parts = obj.get("parts").and_then(Json::as_array).ok_or_else(|| bad("parts is required"))?;
    if parts.is_empty() || parts.len() > MAX_PARTS {
        return Err(bad(&format!("1 to {MAX_PARTS} parts")));
    }
    for (i, p) in parts.iter().enumerate() {
        let kinds = ["text", "raw", "url", "data"].iter().filter(|k| p.get(**k).is_some()).count();
        if !p.is_object() || kinds != 1 {
            return Err(bad(&format!("parts[{i}] must have exactly one of text, raw, url, data")));
        }
        if p.get("text").is_some_and(|t| !t.is_string()) {
            return Err(bad(&format!("parts[{i}].text must be a string")));
        }
    }
    let (context_id, task_id) = (text("contextId").map(str::to_owned), text("taskId").map(str::to_owned));
    let mut json = m.clone();
    // 0.3's spelling, kept as 1.0's in the task's history.
    json["role"] = Json::String(Role::User.as_str().to_owned());
    Ok(Message { message_id, context_id, task_id, json })
}

/// A `SendMessage` / `SendStreamingMessage` request.
#[derive(Debug, Clone, PartialEq)]
pub struct SendMessage {
    /// The message sent, checked.
    pub message: Message,
    /// `configuration.returnImmediately`: answer with the task at once.
    pub return_immediately: bool,
    /// `configuration.historyLength`: the most history messages the answer's task carries
    /// (`None`: all kept).
    pub history_length: Option<usize>,
}

fn params_of(params: Option<&RawValue>) -> Result<Json, A2aError> {
    let text = params.map_or("{}", RawValue::get);
    let v: Json =
        serde_json::from_str(text).map_err(|e| A2aError::new(ErrorKind::InvalidParams, format!("params: {e}")))?;
    if !v.is_object() {
        return Err(A2aError::new(ErrorKind::InvalidParams, "params must be an object"));
    }
    Ok(v)
}

fn history_length(v: Option<&Json>) -> Result<Option<usize>, A2aError> {
    match v {
        None | Some(Json::Null) => Ok(None),
        Some(n) => match n.as_u64().or_else(|| n.as_str().and_then(|s| s.parse().ok())) {
            Some(n) => Ok(Some(n.min(u64::from(u32::MAX)) as usize)),
            None => Err(A2aError::new(ErrorKind::InvalidParams, "historyLength must be a non-negative integer")),
        },
    }
}

/// Reads `SendMessageRequest` params (also a REST `message:send` body).
pub fn parse_send(params: Option<&RawValue>) -> Result<SendMessage, A2aError> {
    let p = params_of(params)?;
    let message = check_message(p.get("message").unwrap_or(&Json::Null))?;
    let config = p.get("configuration");
    let return_immediately = config.and_then(|c| c.get("returnImmediately")).and_then(Json::as_bool).unwrap_or(false);
    if config.and_then(|c| c.get("taskPushNotificationConfig")).is_some_and(|v| !v.is_null()) {
        return Err(A2aError::new(ErrorKind::PushNotificationNotSupported, "push notifications are not supported"));
    }
    let history_length = history_length(config.and_then(|c| c.get("historyLength")))?;
    Ok(SendMessage { message, return_immediately, history_length })
}

/// `GetTask`, `CancelTask`, `SubscribeToTask` params: the task's `id`, and `historyLength`.
pub fn parse_task_id(params: Option<&RawValue>) -> Result<(String, Option<usize>), A2aError> {
    let p = params_of(params)?;
    let id = p.get("id").and_then(Json::as_str).filter(|s| !s.is_empty() && s.len() <= 256);
    let id = id.ok_or_else(|| A2aError::new(ErrorKind::InvalidParams, "id is required"))?;
    Ok((id.to_owned(), history_length(p.get("historyLength"))?))
}

/// `ListTasks` params (or the REST query's).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ListTasks {
    /// Only the tasks of this `contextId`.
    pub context_id: Option<String>,
    /// Only the tasks in this state (`TASK_STATE_UNSPECIFIED` reads as `None`: any).
    pub status: Option<TaskState>,
    /// Tasks per page, 1 to 100 (50 by default).
    pub page_size: usize,
    /// An offset into the sorted list (the opaque `pageToken` is its decimal form).
    pub offset: usize,
    /// `historyLength`: the most history messages each task carries (`None`: all kept).
    pub history_length: Option<usize>,
    /// `includeArtifacts`: whether each task carries its artifacts (not by default).
    pub include_artifacts: bool,
}

/// Reads `ListTasks` params: `pageSize` 1..=100 (50 by default).
pub fn parse_list(params: Option<&RawValue>) -> Result<ListTasks, A2aError> {
    let p = params_of(params)?;
    let bad = |m: &str| A2aError::new(ErrorKind::InvalidParams, m.to_owned());
    let page_size = match p.get("pageSize") {
        None | Some(Json::Null) => 50,
        Some(n) => match n.as_u64() {
            Some(n @ 1..=100) => n as usize,
            _ => return Err(bad("pageSize must be 1 to 100")),
        },
    };
    let offset = match p.get("pageToken").and_then(Json::as_str).filter(|t| !t.is_empty()) {
        None => 0,
        Some(t) => t.parse().map_err(|_| bad("pageToken is not one this server gave"))?,
    };
    let status = match p.get("status").and_then(Json::as_str) {
        None | Some("TASK_STATE_UNSPECIFIED") => None,
        Some(s) => Some(TaskState::named(s).ok_or_else(|| bad("status is not a TaskState"))?),
    };
    Ok(ListTasks {
        context_id: p.get("contextId").and_then(Json::as_str).map(str::to_owned),
        status,
        page_size,
        offset,
        history_length: history_length(p.get("historyLength"))?,
        include_artifacts: p.get("includeArtifacts").and_then(Json::as_bool).unwrap_or(false),
    })
}

/// A task's state (P L187-208).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskState {
    /// Received, not yet being worked on.
    Submitted,
    /// The agent is working on it.
    Working,
    /// The agent waits for the client's next message (the task goes on with it).
    InputRequired,
    /// The agent waits for the client to authenticate.
    AuthRequired,
    /// Finished successfully (terminal).
    Completed,
    /// Finished with an error (terminal).
    Failed,
    /// Canceled before it finished (terminal).
    Canceled,
    /// The agent declined the task (terminal).
    Rejected,
}

impl TaskState {
    /// The ProtoJSON enum name, `TASK_STATE_SUBMITTED` and so on.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Submitted => "TASK_STATE_SUBMITTED",
            TaskState::Working => "TASK_STATE_WORKING",
            TaskState::InputRequired => "TASK_STATE_INPUT_REQUIRED",
            TaskState::AuthRequired => "TASK_STATE_AUTH_REQUIRED",
            TaskState::Completed => "TASK_STATE_COMPLETED",
            TaskState::Failed => "TASK_STATE_FAILED",
            TaskState::Canceled => "TASK_STATE_CANCELED",
            TaskState::Rejected => "TASK_STATE_REJECTED",
        }
    }

    /// The state a ProtoJSON enum name (as [`TaskState::as_str`] gives) names; `None` for any
    /// other string, `TASK_STATE_UNSPECIFIED` included.
    pub fn named(s: &str) -> Option<TaskState> {
        [
            TaskState::Submitted,
            TaskState::Working,
            TaskState::InputRequired,
            TaskState::AuthRequired,
            TaskState::Completed,
            TaskState::Failed,
            TaskState::Canceled,
            TaskState::Rejected,
        ]
        .into_iter()
        .find(|t| t.as_str() == s)
    }

    /// Completed, failed, canceled or rejected: the task never changes again.
    pub fn terminal(self) -> bool {
        matches!(self, TaskState::Completed | TaskState::Failed | TaskState::Canceled | TaskState::Rejected)
    }

    /// Where a blocking `SendMessage` answers and a stream ends (terminal, or waiting for the
    /// client's input, as both SDKs close streams).
    pub fn settled(self) -> bool {
        self.terminal() || self == TaskState::InputRequired
    }
}

/// A task as the gateway keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    /// The task's `id`, assigned by the gateway: what `GetTask` and `CancelTask` name.
    pub id: String,
    /// The `contextId`: the conversation the task belongs to (the client's, or a new one).
    pub context_id: String,
    /// The current `status.state`.
    pub state: TaskState,
    /// The status message (an agent's message, ProtoJSON), if any.
    pub status_message: Option<Json>,
    /// RFC 3339 UTC with milliseconds.
    pub timestamp: String,
    /// The artifacts the agent produced (ProtoJSON `Artifact`s), in order.
    pub artifacts: Vec<Json>,
    /// The messages of the task, oldest first (ProtoJSON `Message`s, the client's and the
    /// agent's).
    pub history: Vec<Json>,
    /// Bytes of the parts in `artifacts` (not rendered: what bounds them).
    pub artifact_bytes: usize,
}

impl Task {
    fn status(&self) -> Json {
        let mut s = json!({"state": self.state.as_str(), "timestamp": self.timestamp});
        if let Some(m) = &self.status_message {
            s["message"] = m.clone();
        }
        s
    }

    /// The task's ProtoJSON: `history` cut to the last `history_length` messages (none at 0),
    /// artifacts left out unless `artifacts`.
    pub fn to_json(&self, history_length: Option<usize>, artifacts: bool) -> Json {
        let mut t = json!({"id": self.id, "contextId": self.context_id, "status": self.status()});
        let keep = history_length.unwrap_or(usize::MAX).min(self.history.len());
        if keep > 0 {
            t["history"] = Json::Array(self.history[self.history.len() - keep..].to_vec());
        }
        if artifacts && !self.artifacts.is_empty() {
            t["artifacts"] = Json::Array(self.artifacts.clone());
        }
        t
    }

    /// `{"statusUpdate": TaskStatusUpdateEvent}`.
    pub fn status_update(&self) -> Json {
        json!({"statusUpdate": {"taskId": self.id, "contextId": self.context_id, "status": self.status()}})
    }

    /// `{"artifactUpdate": TaskArtifactUpdateEvent}`.
    pub fn artifact_update(&self, artifact: &Json, append: bool, last_chunk: bool) -> Json {
        let mut e = json!({"taskId": self.id, "contextId": self.context_id, "artifact": artifact});
        if append {
            e["append"] = Json::Bool(true);
        }
        if last_chunk {
            e["lastChunk"] = Json::Bool(true);
        }
        json!({ "artifactUpdate": e })
    }
}

/// An agent's message (`ROLE_AGENT`) with one text part.
pub fn agent_text(message_id: &str, context_id: &str, task_id: &str, text: &str) -> Json {
    json!({"messageId": message_id, "contextId": context_id, "taskId": task_id, "role": Role::Agent.as_str(),
           "parts": [{"text": text}]})
}

/// A JSON-RPC success response.
pub fn jsonrpc_result(id: &Json, result: &Json) -> Vec<u8> {
    serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": id, "result": result})).expect("json")
}

/// One server-sent event carrying `json` (JSON has no raw line breaks once serialized).
pub fn sse_event(json: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(b"data: ");
    out.extend_from_slice(json);
    out.extend_from_slice(b"\n\n");
}

/// An agent card (P L356-393) for an agent served at `base` (JSON-RPC there, REST under
/// `base/v1`), streaming offered.
pub fn agent_card(name: &str, description: &str, base: &str, skills: Json) -> Json {
    json!({
        "name": name,
        "description": description,
        "supportedInterfaces": [
            {"url": base, "protocolBinding": "JSONRPC", "protocolVersion": VERSION},
            {"url": format!("{base}/v1"), "protocolBinding": "HTTP+JSON", "protocolVersion": VERSION},
        ],
        "version": "1.0.0",
        "capabilities": {"streaming": true, "pushNotifications": false, "extendedAgentCard": false},
        "defaultInputModes": ["text/plain", "application/json"],
        "defaultOutputModes": ["text/plain", "application/json"],
        "skills": skills,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(s: &str) -> Box<RawValue> {
        RawValue::from_string(s.to_owned()).unwrap()
    }

    #[test]
    fn envelopes_are_checked_and_methods_are_pascal_case() {
        let r = parse_rpc(br#"{"jsonrpc":"2.0","id":7,"method":"SendMessage","params":{"a":1}}"#).unwrap();
        assert_eq!(
            (r.id.clone(), r.method, r.params.map(RawValue::get)),
            (json!(7), Method::SendMessage, Some(r#"{"a":1}"#))
        );
        for (body, code, id) in [
            (&b"{"[..], -32700, Json::Null),
            (br#"[{"jsonrpc":"2.0","id":1,"method":"GetTask"}]"#, -32600, Json::Null),
            (br#"{"jsonrpc":"2.0","id":"x","method":"message/send"}"#, -32601, json!("x")),
            (br#"{"jsonrpc":"1.0","id":1,"method":"GetTask"}"#, -32600, json!(1)),
            (br#"{"jsonrpc":"2.0","id":{},"method":"GetTask"}"#, -32600, Json::Null),
            (br#"{"jsonrpc":"2.0","id":2}"#, -32600, json!(2)),
        ] {
            let (got_id, e) = parse_rpc(body).unwrap_err();
            assert_eq!((e.kind.code(), got_id), (code, id), "{}", String::from_utf8_lossy(body));
        }
        let (_, e) = parse_rpc(br#"{"jsonrpc":"2.0","id":1,"method":"message/send"}"#).unwrap_err();
        assert!(e.message.contains("0.3"), "{e:?}");
    }

    #[test]
    fn errors_carry_error_info_in_both_bindings() {
        let e = A2aError::task_not_found("t-1");
        let rpc: Json = serde_json::from_slice(&e.jsonrpc(&json!(2))).unwrap();
        assert_eq!(
            rpc,
            json!({"jsonrpc": "2.0", "id": 2, "error": {"code": -32001, "message": "Task not found", "data": [
                {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "TASK_NOT_FOUND",
                 "domain": "a2a-protocol.org", "metadata": {"taskId": "t-1"}}]}})
        );
        let (status, body) = e.rest();
        let rest: Json = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            (status, &rest["error"]["status"], &rest["error"]["details"][0]["reason"]),
            (404, &json!("NOT_FOUND"), &json!("TASK_NOT_FOUND"))
        );
        let plain: Json = serde_json::from_slice(&A2aError::new(ErrorKind::Parse, "x").jsonrpc(&Json::Null)).unwrap();
        assert!(plain["error"].get("data").is_none(), "JSON-RPC's own errors carry no ErrorInfo");
        assert_eq!(A2aError::new(ErrorKind::TaskNotCancelable, "").rest().0, 400);
    }

    #[test]
    fn versions_are_major_minor_and_a_missing_one_is_0_3() {
        for ok in ["1.0", "1.0.3", " 1.1 ", "1.10"] {
            assert!(negotiate(Some(ok)).is_ok(), "{ok}");
        }
        for bad in [None, Some(""), Some("0.3"), Some("2.0"), Some("1"), Some("1.x"), Some("v1.0")] {
            let e = negotiate(bad).unwrap_err();
            assert_eq!(e.kind.code(), -32009, "{bad:?}");
        }
        assert!(negotiate(None).unwrap_err().message.contains("0.3"));
    }

    #[test]
    fn messages_are_checked_and_become_prompts() {
        let p = raw(
            r#"{"message":{"messageId":"m1","role":"ROLE_USER","parts":[{"text":"hi"},{"data":{"a":1}}],"contextId":"c"},
                       "configuration":{"returnImmediately":true,"historyLength":2}}"#,
        );
        let s = parse_send(Some(&p)).unwrap();
        assert_eq!((s.message.message_id.as_str(), s.message.context_id.as_deref()), ("m1", Some("c")));
        assert_eq!((s.return_immediately, s.history_length), (true, Some(2)));
        assert_eq!(s.message.prompt(), "hi\n{\"data\":{\"a\":1}}");
        for (m, want) in [
            (r#"{"role":"ROLE_USER","parts":[{"text":"x"}]}"#, "messageId"),
            (r#"{"messageId":"m","role":"ROLE_AGENT","parts":[{"text":"x"}]}"#, "not ROLE_USER"),
            (r#"{"messageId":"m","role":"ROLE_USER","parts":[]}"#, "1 to 64"),
            (r#"{"messageId":"m","role":"ROLE_USER","parts":[{"text":"x","data":1}]}"#, "exactly one"),
            (r#"{"messageId":"m","role":"ROLE_USER","parts":[{"text":5}]}"#, "string"),
            (r#""text""#, "not an object"),
        ] {
            let e = parse_send(Some(&raw(&format!(r#"{{"message":{m}}}"#)))).unwrap_err();
            assert!(e.kind == ErrorKind::InvalidParams && e.message.contains(want), "{want}: {e:?}");
        }
        let push = raw(
            r#"{"message":{"messageId":"m","role":"ROLE_USER","parts":[{"text":"x"}]},"configuration":{"taskPushNotificationConfig":{"url":"http://x"}}}"#,
        );
        assert_eq!(parse_send(Some(&push)).unwrap_err().kind, ErrorKind::PushNotificationNotSupported);
    }

    #[test]
    fn tasks_render_as_proto_json_with_history_cut() {
        let t = Task {
            id: "t".into(),
            context_id: "c".into(),
            state: TaskState::Completed,
            status_message: None,
            timestamp: "2026-12-02T06:00:00.000Z".into(),
            artifacts: vec![json!({"artifactId": "a", "parts": [{"text": "x"}]})],
            history: vec![json!({"messageId": "1"}), json!({"messageId": "2"})],
            artifact_bytes: 0,
        };
        let j = t.to_json(Some(1), true);
        assert_eq!(j["history"], json!([{"messageId": "2"}]));
        assert_eq!(j["status"]["state"], "TASK_STATE_COMPLETED");
        assert!(
            t.to_json(Some(0), false).get("history").is_none() && t.to_json(None, false).get("artifacts").is_none()
        );
        assert_eq!(t.status_update()["statusUpdate"]["contextId"], "c");
        let a = t.artifact_update(&t.artifacts[0], true, false);
        assert_eq!((a["artifactUpdate"]["append"].clone(), a["artifactUpdate"].get("lastChunk")), (json!(true), None));
        assert!(TaskState::InputRequired.settled() && !TaskState::InputRequired.terminal());
        let l = parse_list(Some(&raw(r#"{"pageSize":10,"pageToken":"20","status":"TASK_STATE_WORKING"}"#))).unwrap();
        assert_eq!((l.page_size, l.offset, l.status), (10, 20, Some(TaskState::Working)));
        assert!(parse_list(Some(&raw(r#"{"pageSize":150}"#))).is_err());
    }
}
