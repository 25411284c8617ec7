//! The fixed 40-byte frame header: plain little-endian fields at fixed positions.
//!
//! | bytes  | field                                   |
//! |--------|-----------------------------------------|
//! | 0..4   | magic `EMFR`                            |
//! | 4      | version (1)                             |
//! | 5      | kind ([`FrameKind`])                    |
//! | 6..8   | flags (bits 0-1: [`DataKind`])          |
//! | 8..12  | partition                               |
//! | 12..16 | body length in bytes                    |
//! | 16..24 | offset                                  |
//! | 24..32 | publish timestamp, µs since Unix epoch  |
//! | 32..40 | sequence (see below)                    |
//!
//! `sequence` by kind: a `Request` (request-reply) holds its deadline, µs since the Unix epoch;
//! a `StreamChunk` its `emseq` (the chunk's place in its session's turn); other kinds 0.
//!
//! The streaming kinds' attributes (besides the CloudEvent's own): a `StreamRequest` carries
//! `emsessionid`, `emreplyto` and optionally `emmodel`, `emconversation`, its data the prompt;
//! a `StreamChunk` carries `emsessionid`, `emseq` (integer), `emdone` (boolean) and optionally
//! `emerror`, `emchunktype`, its data the chunk.

use crate::FrameError;

/// The four bytes every frame starts with: `EMFR`.
pub const MAGIC: [u8; 4] = *b"EMFR";
/// The header version this crate writes and the only one it reads.
pub const VERSION: u8 = 1;
/// The length of the fixed header in bytes; the rkyv body starts here.
pub const HEADER_LEN: usize = 40;

const DATA_KIND_MASK: u16 = 0b11;

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    /// A published CloudEvent.
    Event = 1,
    /// A request-reply request: an event that waits for one reply, its deadline in `sequence`.
    Request = 2,
    /// A reply to a [`FrameKind::Request`].
    Reply = 3,
    /// An agent streaming call's turn: its data is the prompt.
    StreamRequest = 4,
    /// One chunk of the answer to a [`FrameKind::StreamRequest`], its place in the turn in
    /// `sequence`.
    StreamChunk = 5,
}

impl FrameKind {
    fn from_u8(v: u8) -> Result<Self, FrameError> {
        Ok(match v {
            1 => FrameKind::Event,
            2 => FrameKind::Request,
            3 => FrameKind::Reply,
            4 => FrameKind::StreamRequest,
            5 => FrameKind::StreamChunk,
            other => return Err(FrameError::Kind(other)),
        })
    }
}

/// How the body's data bytes are to be rendered in the JSON event format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum DataKind {
    /// The event has no data.
    None = 0,
    /// The bytes are one JSON value, emitted as `data` verbatim.
    Json = 1,
    /// The bytes are UTF-8 text, emitted as a JSON string in `data`.
    Text = 2,
    /// Arbitrary bytes, emitted as `data_base64`.
    Binary = 3,
}

impl DataKind {
    fn from_bits(v: u16) -> Self {
        match v & DATA_KIND_MASK {
            0 => DataKind::None,
            1 => DataKind::Json,
            2 => DataKind::Text,
            _ => DataKind::Binary,
        }
    }
}

/// The decoded fixed header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// What the frame carries.
    pub kind: FrameKind,
    /// How the body's data bytes are rendered (flags bits 0-1).
    pub data_kind: DataKind,
    /// The topic partition the event is stored in; 0 until the router chooses one.
    pub partition: u32,
    /// The event's offset in its partition; 0 until the owning shard assigns one.
    pub offset: u64,
    /// When the event was published, microseconds since the Unix epoch; 0 until stamped.
    pub timestamp_us: i64,
    /// Depends on the kind: a `Request`'s deadline (µs since the Unix epoch), a `StreamChunk`'s
    /// `emseq`, otherwise 0.
    pub sequence: u64,
}

impl FrameHeader {
    /// A header for a new event with no partition, offset or timestamp yet.
    pub fn event(data_kind: DataKind) -> Self {
        FrameHeader { kind: FrameKind::Event, data_kind, partition: 0, offset: 0, timestamp_us: 0, sequence: 0 }
    }

    /// Reads and checks the header of `bytes`, including that the body length matches.
    pub fn read(bytes: &[u8]) -> Result<Self, FrameError> {
        if bytes.len() < HEADER_LEN {
            return Err(FrameError::Short(bytes.len()));
        }
        if bytes[0..4] != MAGIC {
            return Err(FrameError::Magic);
        }
        if bytes[4] != VERSION {
            return Err(FrameError::Version(bytes[4]));
        }
        let kind = FrameKind::from_u8(bytes[5])?;
        let flags = u16::from_le_bytes([bytes[6], bytes[7]]);
        let body_len = u32_at(bytes, 12);
        if body_len as usize != bytes.len() - HEADER_LEN {
            return Err(FrameError::BodyLength { declared: body_len, actual: bytes.len() - HEADER_LEN });
        }
        Ok(FrameHeader {
            kind,
            data_kind: DataKind::from_bits(flags),
            partition: u32_at(bytes, 8),
            offset: u64_at(bytes, 16),
            timestamp_us: u64_at(bytes, 24) as i64,
            sequence: u64_at(bytes, 32),
        })
    }

    pub(crate) fn write(&self, out: &mut [u8], body_len: u32) {
        out[0..4].copy_from_slice(&MAGIC);
        out[4] = VERSION;
        out[5] = self.kind as u8;
        out[6..8].copy_from_slice(&(self.data_kind as u16).to_le_bytes());
        out[8..12].copy_from_slice(&self.partition.to_le_bytes());
        out[12..16].copy_from_slice(&body_len.to_le_bytes());
        out[16..24].copy_from_slice(&self.offset.to_le_bytes());
        out[24..32].copy_from_slice(&self.timestamp_us.to_le_bytes());
        out[32..40].copy_from_slice(&self.sequence.to_le_bytes());
    }
}

pub(crate) fn write_partition(buf: &mut [u8], partition: u32) {
    buf[8..12].copy_from_slice(&partition.to_le_bytes());
}

pub(crate) fn write_offset(buf: &mut [u8], offset: u64) {
    buf[16..24].copy_from_slice(&offset.to_le_bytes());
}

pub(crate) fn write_timestamp(buf: &mut [u8], micros: i64) {
    buf[24..32].copy_from_slice(&micros.to_le_bytes());
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}
