//! Message assembly: frames in, whole messages and control frames out, enforcing the rules of
//! RFC 6455 sections 5.4-5.6 and 7.4 (fragment order, control frames in between, UTF-8 of text
//! checked as fragments arrive, close payloads, the message size limit).

use super::frame::{decode_frame, OpCode};
use super::{CloseCode, WsError};
use crate::http::Status;

/// What the reader produced from the bytes it was given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// A whole text message, its fragments joined (valid UTF-8).
    Text(String),
    /// A whole binary message, its fragments joined.
    Binary(Vec<u8>),
    /// A ping and its payload (at most 125 bytes), to be echoed in a pong.
    Ping(Vec<u8>),
    /// A pong and its payload (at most 125 bytes).
    Pong(Vec<u8>),
    /// The peer's close: its code (None if the frame had no payload) and reason.
    Close(Option<u16>, String),
}

/// Assembles messages from a client's byte stream; one per connection (16 bytes: every idle
/// WebSocket session holds one).
pub struct MessageReader {
    max_message: usize,
    /// The data message being assembled, if a first fragment has arrived (boxed: a message of
    /// one frame, most of them, is never assembled).
    partial: Option<Box<Partial>>,
}

/// A fragmented data message in assembly.
struct Partial {
    kind: OpCode,
    data: Vec<u8>,
    /// How many leading bytes of a text message are known to be valid UTF-8.
    checked: usize,
}

fn utf8_prefix_ok(bytes: &[u8], complete: bool) -> Result<usize, WsError> {
    // The common case, valid text, checked many bytes at a time; std's check says where not.
    if simdutf8::basic::from_utf8(bytes).is_ok() {
        return Ok(bytes.len());
    }
    match std::str::from_utf8(bytes) {
        Ok(_) => Ok(bytes.len()),
        // An error with no length is an incomplete sequence at the end: fine mid-message.
        Err(e) if e.error_len().is_none() && !complete => Ok(e.valid_up_to()),
        Err(_) => Err(WsError::new(CloseCode::INVALID_DATA, "text is not valid UTF-8")),
    }
}

impl MessageReader {
    /// A reader for a new connection. `max_message` bounds both one frame's payload and a whole
    /// message, in bytes (1009 beyond).
    pub fn new(max_message: usize) -> Self {
        MessageReader { max_message, partial: None }
    }

    /// Reads the next message from the start of `buf`, unmasking frames in place: `(Some(message),
    /// consumed)`, or `(None, consumed)` once every whole frame in `buf` has been absorbed into the
    /// message in assembly. Either way the caller drops the first `consumed` bytes before the
    /// next call.
    pub fn read(&mut self, buf: &mut [u8]) -> Result<(Option<Message>, usize), WsError> {
        let mut consumed = 0;
        loop {
            let frame = match decode_frame(&mut buf[consumed..], self.max_message)? {
                Status::Partial => return Ok((None, consumed)),
                Status::Complete(f) => f,
            };
            let start = consumed;
            consumed += frame.len;
            let payload = &buf[start + frame.payload.0..start + frame.payload.1];
            match frame.opcode {
                OpCode::Ping => return Ok((Some(Message::Ping(payload.to_vec())), consumed)),
                OpCode::Pong => return Ok((Some(Message::Pong(payload.to_vec())), consumed)),
                OpCode::Close => return Ok((Some(close_message(payload)?), consumed)),
                OpCode::Text | OpCode::Binary => {
                    if self.partial.is_some() {
                        return Err(WsError::new(CloseCode::PROTOCOL, "new message before the last one finished"));
                    }
                    if frame.fin {
                        // A whole message in one frame (`decode_frame` held it to `max_message`).
                        let msg = match frame.opcode {
                            OpCode::Text => Message::Text(
                                String::from_utf8(payload.to_vec())
                                    .map_err(|_| WsError::new(CloseCode::INVALID_DATA, "text is not valid UTF-8"))?,
                            ),
                            _ => Message::Binary(payload.to_vec()),
                        };
                        return Ok((Some(msg), consumed));
                    }
                    self.partial = Some(Box::new(Partial { kind: frame.opcode, data: Vec::new(), checked: 0 }));
                }
                OpCode::Continuation => {
                    if self.partial.is_none() {
                        return Err(WsError::new(CloseCode::PROTOCOL, "continuation without a message"));
                    }
                }
            }
            let p = self.partial.as_mut().expect("set above");
            if p.data.len() + payload.len() > self.max_message {
                return Err(WsError::new(CloseCode::TOO_BIG, "message too big"));
            }
            p.data.extend_from_slice(payload);
            if p.kind == OpCode::Text {
                p.checked += utf8_prefix_ok(&p.data[p.checked..], frame.fin)?;
            }
            if frame.fin {
                let Partial { kind, data, .. } = *self.partial.take().expect("set above");
                let msg = match kind {
                    OpCode::Text => Message::Text(String::from_utf8(data).expect("validated above")),
                    _ => Message::Binary(data),
                };
                return Ok((Some(msg), consumed));
            }
        }
    }
}

fn close_message(p: &[u8]) -> Result<Message, WsError> {
    match p.len() {
        0 => Ok(Message::Close(None, String::new())),
        1 => Err(WsError::new(CloseCode::PROTOCOL, "close payload of one byte")),
        _ => {
            let code = u16::from_be_bytes([p[0], p[1]]);
            if !CloseCode::valid_on_wire(code) {
                return Err(WsError::new(CloseCode::PROTOCOL, "invalid close code"));
            }
            let reason = std::str::from_utf8(&p[2..])
                .map_err(|_| WsError::new(CloseCode::INVALID_DATA, "close reason is not UTF-8"))?;
            Ok(Message::Close(Some(code), reason.to_owned()))
        }
    }
}
