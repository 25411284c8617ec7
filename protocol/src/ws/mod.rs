//! WebSocket (RFC 6455), sans-io: the opening handshake, the frame codec and message assembly
//! (fragmentation, control frames, close codes, UTF-8 validation of text, size limits).
//!
//! Pure functions and state machines over bytes: no sockets, no async. Protocol violations come
//! back as a [`CloseCode`] to close the connection with. Server side only: client frames must be
//! masked, server frames are not.

mod frame;
mod handshake;
mod message;

pub use frame::{decode_frame, encode_frame, FrameHead, OpCode};
pub use handshake::{accept_key, check_upgrade, HandshakeError};
pub use message::{Message, MessageReader};

/// Close codes we send (RFC 6455 section 7.4.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CloseCode(pub u16);

impl CloseCode {
    /// 1000: normal closure, the purpose of the connection is fulfilled.
    pub const NORMAL: CloseCode = CloseCode(1000);
    /// 1001: the endpoint is going away (shutting down, or ending an idle connection).
    pub const GOING_AWAY: CloseCode = CloseCode(1001);
    /// 1002: the peer broke the protocol (framing, fragment order, close payload).
    pub const PROTOCOL: CloseCode = CloseCode(1002);
    /// 1003: a data type the endpoint does not accept (binary where text is expected, say).
    pub const UNSUPPORTED: CloseCode = CloseCode(1003);
    /// 1007: data inconsistent with its message type, such as text that is not UTF-8.
    pub const INVALID_DATA: CloseCode = CloseCode(1007);
    /// 1008: a message that violates the endpoint's policy (generic, when no other code fits).
    pub const POLICY: CloseCode = CloseCode(1008);
    /// 1009: a frame or message larger than the endpoint accepts.
    pub const TOO_BIG: CloseCode = CloseCode(1009);
    /// 1011: the server hit an unexpected condition.
    pub const INTERNAL: CloseCode = CloseCode(1011);

    /// Whether a peer may send this code in a close frame.
    pub fn valid_on_wire(code: u16) -> bool {
        matches!(code, 1000..=1003 | 1007..=1011 | 3000..=4999)
    }
}

/// A protocol error: the connection must be closed with `code`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("websocket {}: {reason}", code.0)]
pub struct WsError {
    /// The close code to send.
    pub code: CloseCode,
    /// A short, fixed explanation of the violation.
    pub reason: &'static str,
}

impl WsError {
    pub(crate) const fn new(code: CloseCode, reason: &'static str) -> Self {
        WsError { code, reason }
    }
}

#[cfg(test)]
mod tests;
