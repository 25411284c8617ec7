//! Frame header parsing and writing (RFC 6455 section 5.2).

use super::{CloseCode, WsError};
use crate::http::Status;

/// A frame's opcode (RFC 6455 section 5.2). The reserved opcodes are a protocol error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpCode {
    /// 0x0: a further fragment of the message a `Text` or `Binary` frame began.
    Continuation,
    /// 0x1: the first frame of a text message (UTF-8).
    Text,
    /// 0x2: the first frame of a binary message.
    Binary,
    /// 0x8: a close frame: an optional 2-byte code, then an optional UTF-8 reason.
    Close,
    /// 0x9: a ping; the peer answers with a pong carrying the same payload.
    Ping,
    /// 0xA: a pong, the answer to a ping (or an unsolicited heartbeat).
    Pong,
}

impl OpCode {
    fn from_bits(b: u8) -> Option<OpCode> {
        Some(match b {
            0 => OpCode::Continuation,
            1 => OpCode::Text,
            2 => OpCode::Binary,
            8 => OpCode::Close,
            9 => OpCode::Ping,
            10 => OpCode::Pong,
            _ => return None,
        })
    }

    fn bits(self) -> u8 {
        match self {
            OpCode::Continuation => 0,
            OpCode::Text => 1,
            OpCode::Binary => 2,
            OpCode::Close => 8,
            OpCode::Ping => 9,
            OpCode::Pong => 10,
        }
    }

    /// Whether this is a control opcode (close, ping, pong): such frames may arrive between a
    /// message's fragments, must not be fragmented, and carry at most 125 bytes.
    pub fn is_control(self) -> bool {
        matches!(self, OpCode::Close | OpCode::Ping | OpCode::Pong)
    }
}

/// A decoded frame: its header fields and where its (already unmasked) payload sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHead {
    /// The FIN bit: this frame is the last of its message.
    pub fin: bool,
    /// The frame's opcode.
    pub opcode: OpCode,
    /// Payload bytes are `buf[payload.0..payload.1]`.
    pub payload: (usize, usize),
    /// Bytes of `buf` the whole frame takes.
    pub len: usize,
}

/// Decodes one client frame at the start of `buf`, unmasking its payload in place.
/// `max_payload` bounds a single frame (1009 beyond).
pub fn decode_frame(buf: &mut [u8], max_payload: usize) -> Result<Status<FrameHead>, WsError> {
    if buf.len() < 2 {
        return Ok(Status::Partial);
    }
    let (b0, b1) = (buf[0], buf[1]);
    if b0 & 0x70 != 0 {
        return Err(WsError::new(CloseCode::PROTOCOL, "reserved bits set without an extension"));
    }
    let opcode = OpCode::from_bits(b0 & 0x0f).ok_or(WsError::new(CloseCode::PROTOCOL, "unknown opcode"))?;
    let fin = b0 & 0x80 != 0;
    if b1 & 0x80 == 0 {
        return Err(WsError::new(CloseCode::PROTOCOL, "client frames must be masked"));
    }
    let (len, mut at) = match b1 & 0x7f {
        126 => {
            if buf.len() < 4 {
                return Ok(Status::Partial);
            }
            (u64::from(u16::from_be_bytes([buf[2], buf[3]])), 4)
        }
        127 => {
            if buf.len() < 10 {
                return Ok(Status::Partial);
            }
            let mut b = [0u8; 8];
            b.copy_from_slice(&buf[2..10]);
            let n = u64::from_be_bytes(b);
            if n >> 63 != 0 {
                return Err(WsError::new(CloseCode::PROTOCOL, "payload length has its top bit set"));
            }
            (n, 10)
        }
        n => (u64::from(n), 2),
    };
    if opcode.is_control() && (!fin || len > 125) {
        return Err(WsError::new(CloseCode::PROTOCOL, "control frames must be final and at most 125 bytes"));
    }
    if len > max_payload as u64 {
        return Err(WsError::new(CloseCode::TOO_BIG, "frame too big"));
    }
    let len = len as usize;
    if buf.len() < at + 4 + len {
        return Ok(Status::Partial);
    }
    let mask = [buf[at], buf[at + 1], buf[at + 2], buf[at + 3]];
    at += 4;
    unmask(&mut buf[at..at + len], mask);
    Ok(Status::Complete(FrameHead { fin, opcode, payload: (at, at + len), len: at + len }))
}

/// XORs `payload` with the repeated `mask`, eight bytes at a time (each chunk starts at a
/// multiple of 8, so the mask lines up the same way in every one).
fn unmask(payload: &mut [u8], mask: [u8; 4]) {
    let wide = u64::from_ne_bytes([mask[0], mask[1], mask[2], mask[3], mask[0], mask[1], mask[2], mask[3]]);
    let mut chunks = payload.chunks_exact_mut(8);
    for c in &mut chunks {
        let v = u64::from_ne_bytes(c.try_into().expect("8 bytes")) ^ wide;
        c.copy_from_slice(&v.to_ne_bytes());
    }
    for (i, b) in chunks.into_remainder().iter_mut().enumerate() {
        *b ^= mask[i & 3];
    }
}

/// Appends one unmasked server frame to `out`.
pub fn encode_frame(opcode: OpCode, fin: bool, payload: &[u8], out: &mut Vec<u8>) {
    out.push(if fin { 0x80 } else { 0 } | opcode.bits());
    match payload.len() {
        n @ 0..=125 => out.push(n as u8),
        n @ 126..=0xffff => {
            out.push(126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    out.extend_from_slice(payload);
}

#[cfg(test)]
mod tests {
    use super::unmask;

    /// Eight bytes at a time gives what one byte at a time does, at every length and remainder.
    #[test]
    fn wide_unmasking_matches_the_byte_by_byte_rule() {
        let mask = [0x9a, 0x01, 0xff, 0x37];
        for len in 0..70 {
            let data: Vec<u8> = (0..len).map(|i| (i * 31 + 7) as u8).collect();
            let mut wide = data.clone();
            unmask(&mut wide, mask);
            let naive: Vec<u8> = data.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]).collect();
            assert_eq!(wide, naive, "length {len}");
        }
    }
}
