//! The opening handshake (RFC 6455 section 4.2): checking the client's upgrade request and
//! computing `Sec-WebSocket-Accept`.

use base64::Engine as _;
use sha1::{Digest, Sha1};

use crate::http::{Head, Method};

const GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// Why an upgrade request is refused (400, or 426 for a version we do not speak).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    /// Not a valid upgrade request (400); holds what is wrong with it.
    #[error("{0}")]
    Bad(&'static str),
    /// A `Sec-WebSocket-Version` other than 13 (426, advertising 13).
    #[error("unsupported Sec-WebSocket-Version (13 is supported)")]
    Version,
}

/// `Sec-WebSocket-Accept` for a client's `Sec-WebSocket-Key`.
pub fn accept_key(key: &[u8]) -> String {
    let mut h = Sha1::new();
    h.update(key);
    h.update(GUID.as_bytes());
    base64::engine::general_purpose::STANDARD.encode(h.finalize())
}

fn has_token(v: &[u8], token: &str) -> bool {
    v.split(|&b| b == b',').any(|t| t.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
}

/// Checks an upgrade request and returns the accept key and whether the client offered the
/// `cloudevents.json` subprotocol.
pub fn check_upgrade(head: &Head, buf: &[u8]) -> Result<(String, bool), HandshakeError> {
    if head.method != Method::Get || head.minor != 1 {
        return Err(HandshakeError::Bad("a WebSocket upgrade is a GET over HTTP/1.1"));
    }
    if !head.header(buf, "upgrade").is_some_and(|v| has_token(v, "websocket")) {
        return Err(HandshakeError::Bad("missing Upgrade: websocket"));
    }
    if !head.header(buf, "connection").is_some_and(|v| has_token(v, "upgrade")) {
        return Err(HandshakeError::Bad("missing Connection: upgrade"));
    }
    if head.header(buf, "sec-websocket-version") != Some(b"13") {
        return Err(HandshakeError::Version);
    }
    let key = head.header(buf, "sec-websocket-key").ok_or(HandshakeError::Bad("missing Sec-WebSocket-Key"))?;
    let decoded = base64::engine::general_purpose::STANDARD.decode(key).ok();
    if decoded.is_none_or(|k| k.len() != 16) {
        return Err(HandshakeError::Bad("Sec-WebSocket-Key is not 16 base64-encoded bytes"));
    }
    let offered = head
        .headers(buf)
        .filter(|(n, _)| n.eq_ignore_ascii_case("sec-websocket-protocol"))
        .any(|(_, v)| has_token(v, "cloudevents.json"));
    Ok((accept_key(key), offered))
}
