//! One chunk of a turn: the JSON an agent sends ([`ChunkBody`]), the checked chunk it parses
//! into ([`Chunk`]), and the `stream-chunk` frame a turn's log stores it as.

use frame_codec::{AttrValue, Attribute, DataKind, Frame, FrameBody, FrameHeader, FrameKind};

/// The largest chunk's data.
pub const MAX_CHUNK_BYTES: usize = 64 * 1024;
/// The largest `seq` (a chunk's `emseq` is a CloudEvents integer).
pub const MAX_SEQ: u64 = i64::MAX as u64;

/// A chunk as the agent sent it, checked.
pub struct Chunk<'a> {
    pub seq: Option<u64>,
    /// The turn it answers, if the agent said (the request's `emturn`).
    pub turn: Option<u64>,
    pub data: ChunkData<'a>,
    pub done: bool,
    pub error: Option<&'a str>,
    pub chunk_type: Option<&'a str>,
}

/// A chunk's data: a JSON string (text), another JSON value, or none.
pub enum ChunkData<'a> {
    None,
    Text(&'a str),
    Json(&'a [u8]),
}

/// The JSON an agent sends a chunk as (a WebSocket frame has `"type":"chunk"` besides).
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ChunkBody<'a> {
    #[serde(rename = "type", default, borrow)]
    pub kind: Option<std::borrow::Cow<'a, str>>,
    #[serde(default)]
    pub session_id: Option<String>,
    #[serde(default)]
    pub seq: Option<u64>,
    #[serde(default)]
    pub turn: Option<u64>,
    #[serde(default, borrow)]
    pub data: Option<&'a serde_json::value::RawValue>,
    #[serde(default)]
    pub done: bool,
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default)]
    pub chunk_type: Option<String>,
}

impl<'a> ChunkBody<'a> {
    /// Parses a chunk: `Err` says what is wrong with it.
    pub fn parse(json: &'a [u8]) -> Result<ChunkBody<'a>, String> {
        serde_json::from_slice(json).map_err(|e| {
            format!(
                "expected {{\"sessionId\": S, \"seq\": N, \"data\": ... | \"error\": \"...\", \"done\": bool}}: {e}"
            )
        })
    }

    /// The chunk, its text data unescaped into `text`.
    pub fn chunk<'s>(&'s self, text: &'s mut String) -> Result<Chunk<'s>, String> {
        let data = match self.data.map(|d| d.get().trim()) {
            None | Some("null") => ChunkData::None,
            Some(raw) if raw.starts_with('"') => {
                *text = serde_json::from_str(raw).map_err(|e| e.to_string())?;
                ChunkData::Text(text)
            }
            Some(raw) => ChunkData::Json(raw.as_bytes()),
        };
        if self.chunk_type.as_ref().is_some_and(|t| t.len() > 100) {
            return Err("chunkType is at most 100 bytes".into());
        }
        Ok(Chunk {
            seq: self.seq,
            turn: self.turn,
            data,
            done: self.done,
            error: self.error.as_deref(),
            chunk_type: self.chunk_type.as_deref(),
        })
    }
}

/// A `stream-chunk` frame: the chunk's number in the header's `sequence` and in `emseq`.
pub(super) fn chunk_frame(sid: &str, seq: u64, c: &Chunk<'_>) -> Frame {
    let attr = |name: &str, value| Attribute { name: name.to_owned(), value };
    let mut attributes = vec![
        attr("specversion", AttrValue::Str("1.0".into())),
        attr("id", AttrValue::Str(seq.to_string())),
        attr("source", AttrValue::Str("/evmesh/session".into())),
        attr("type", AttrValue::Str("evmesh.stream.chunk".into())),
        attr("emsessionid", AttrValue::Str(sid.to_owned())),
        attr("emseq", AttrValue::Int(seq.min(MAX_SEQ) as i64)),
        attr("emdone", AttrValue::Bool(c.done || c.error.is_some())),
    ];
    if let Some(e) = c.error {
        attributes.push(attr("emerror", AttrValue::Str(e.to_owned())));
    }
    if let Some(t) = c.chunk_type {
        attributes.push(attr("emchunktype", AttrValue::Str(t.to_owned())));
    }
    let (data_kind, data) = match c.data {
        ChunkData::None => (DataKind::None, Vec::new()),
        ChunkData::Text(t) => (DataKind::Text, t.as_bytes().to_vec()),
        ChunkData::Json(j) => (DataKind::Json, j.to_vec()),
    };
    let header = FrameHeader {
        kind: FrameKind::StreamChunk,
        data_kind,
        partition: 0,
        offset: 0,
        timestamp_us: crate::model::clock::now_micros(),
        sequence: seq,
    };
    let body = FrameBody { topic: format!(":session.{sid}"), attributes, data };
    Frame::encode(&header, &body).expect("a chunk of a chunk's size encodes")
}
