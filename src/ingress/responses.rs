//! Answers many endpoints share: a storage failure as the status a client sees, and a
//! WebSocket upgrade's 101 (or its refusal). Nothing here knows the handler: `mod.rs`
//! re-exports [`storage_problem`] for the admin API.

use crate::http::{problem, StatusCode};
use crate::server::{Request, Response, Upgrade};
use crate::storage::StorageError;
use crate::ws::{check_upgrade, HandshakeError};

/// Maps a storage failure to the status a client sees.
pub fn storage_problem(e: &StorageError) -> Response {
    match e {
        StorageError::Conflict { .. } | StorageError::Limit(_) => problem(StatusCode::CONFLICT, &e.to_string()),
        StorageError::NoTopic(_) => problem(StatusCode::NOT_FOUND, &e.to_string()),
        StorageError::Corrupt { .. } => problem(StatusCode::INTERNAL, &e.to_string()),
        StorageError::Engine(_) | StorageError::Unavailable(_) => {
            problem(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()).with_header("retry-after", "1")
        }
    }
}

/// Answers a WebSocket upgrade request: 101 with the handshake headers, or the refusal.
pub(super) fn ws_upgrade(req: &Request<'_>, upgrade: Upgrade) -> Response {
    match check_upgrade(req.head, req.buf) {
        Ok((accept, cloudevents)) => {
            let mut headers = vec![
                ("upgrade", "websocket".to_string()),
                ("connection", "Upgrade".to_string()),
                ("sec-websocket-accept", accept),
            ];
            if cloudevents {
                headers.push(("sec-websocket-protocol", "cloudevents.json".to_string()));
            }
            Response::switching(upgrade, headers)
        }
        Err(HandshakeError::Version) => {
            problem(StatusCode(426), &HandshakeError::Version.to_string()).with_header("sec-websocket-version", "13")
        }
        Err(e) => problem(StatusCode::BAD_REQUEST, &e.to_string()),
    }
}
