//! What the A2A gateway's endpoints share: how an answer goes out (JSON-RPC or REST,
//! [`Binding`]), a JSON-RPC request read, the broker's refusals as A2A errors, and the ids it
//! takes.

use serde_json::Value as Json;

use crate::adaptor::a2a::{self, A2aError, ErrorKind};
use crate::http::{Method as HttpMethod, StatusCode};
use crate::server::{A2aStreamSpec, Request, Response, Upgrade};

/// Ids (agents, contexts) as the gateway takes them.
pub(super) fn valid_id(id: &str) -> bool {
    (1..=100).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Now, in ms since the epoch.
pub(super) fn now_ms() -> u64 {
    crate::model::clock::now_ms()
}

/// How an answer goes out: JSON-RPC (HTTP 200, the request's id) or REST (the status).
pub(super) enum Binding {
    Rpc(Json),
    Rest,
}

impl Binding {
    pub(super) fn ok(&self, result: &Json) -> Response {
        match self {
            Binding::Rpc(id) => Response::json(StatusCode::OK, a2a::jsonrpc_result(id, result)),
            Binding::Rest => Response::json(StatusCode::OK, serde_json::to_vec(result).expect("json")),
        }
    }

    pub(super) fn err(&self, e: &A2aError) -> Response {
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

    /// A stream of the task `task_id` (see [`A2aStreamSpec`] for `start`).
    pub(super) fn stream(
        self,
        task_id: String,
        history_length: Option<usize>,
        expires_us: Option<i64>,
        start: Option<(u64, Json)>,
    ) -> Response {
        let rpc_id = match self {
            Binding::Rpc(id) => Some(id),
            Binding::Rest => None,
        };
        let spec = A2aStreamSpec { task_id, rpc_id, history_length, expires_us, start };
        Response::streaming(Upgrade::A2aSse(Box::new(spec)), "text/event-stream")
    }
}

/// What a refused request of the broker's own (ACL, limits) becomes: its detail, as A2A's
/// nearest error.
pub(super) fn from_problem(p: &Response) -> A2aError {
    let (status, detail) = super::super::ws_publish::refusal(p);
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
pub(super) fn unavailable(detail: impl Into<String>) -> A2aError {
    A2aError::new(ErrorKind::Broker(503), detail).with("retryAfter", "1")
}

/// A JSON-RPC request (a POST), with how to answer it; or the answer to one that is not.
pub(super) fn rpc_of<'r>(req: &'r Request<'_>) -> Result<(a2a::RpcRequest<'r>, Binding), Response> {
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
