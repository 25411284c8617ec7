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
    pub const NORMAL: CloseCode = CloseCode(1000);
    pub const GOING_AWAY: CloseCode = CloseCode(1001);
    pub const PROTOCOL: CloseCode = CloseCode(1002);
    pub const UNSUPPORTED: CloseCode = CloseCode(1003);
    pub const INVALID_DATA: CloseCode = CloseCode(1007);
    pub const POLICY: CloseCode = CloseCode(1008);
    pub const TOO_BIG: CloseCode = CloseCode(1009);
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
    pub code: CloseCode,
    pub reason: &'static str,
}

impl WsError {
    pub(crate) const fn new(code: CloseCode, reason: &'static str) -> Self {
        WsError { code, reason }
    }
}

#[cfg(test)]
mod tests;
