//! Agent streaming calls (Mode 1): the open sessions, process-wide, so a turn streamed from any
//! shard, and a chunk arriving on any shard, find the same session with one lookup.
//!
//! A session belongs to one agent for its whole life (its id is `<agentId>:<uuid>`: every turn
//! reaches the same agent). It has at most one turn in progress. A turn's chunks, sent by the
//! agent as `stream-chunk` frames, go into the turn's log: a ring of at most [`SINK_CHUNKS`]
//! chunks and [`TURN_BYTES`] bytes, which the client's stream reads with a cursor. A reader that
//! falls further behind than the ring holds loses the oldest chunks and is told how many
//! (`event: dropped`); the chunk that ends a turn is always kept. The ring also serves a client
//! that resumes the turn after a reconnect (`Last-Event-ID`), and is freed when the next turn
//! starts or the session ends. Every log together holds at most [`BUFFER_BYTES`]: past that a
//! chunk is refused (429) until readers catch up.
//!
//! A mutex per session and one for the table: sessions are opened and closed per conversation,
//! and a chunk takes its session's lock once.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use frame_codec::{AttrValue, Attribute, DataKind, Frame, FrameBody, FrameHeader, FrameKind};

use super::watch::Watch;

/// Chunks a turn's log holds: a reader further behind than this drops the oldest.
pub const SINK_CHUNKS: usize = 1024;
/// Bytes a turn's log holds (its chunk frames); older chunks go first past it.
pub const TURN_BYTES: usize = 4 << 20;
/// Bytes every turn log together holds; a chunk beyond is refused until readers catch up.
pub const BUFFER_BYTES: usize = 256 << 20;
/// The largest chunk's data.
pub const MAX_CHUNK_BYTES: usize = 64 * 1024;
/// The largest `seq` (a chunk's `emseq` is a CloudEvents integer).
pub const MAX_SEQ: u64 = i64::MAX as u64;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Why a turn ended without the agent's last chunk: said in the stream's final `error` event
/// (`EndTurn` ends it with `done`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    EndTurn,
    Cancelled,
    AgentGone,
    Expired,
    Closed,
    Failed,
}

impl End {
    fn error(self) -> Option<&'static str> {
        match self {
            End::EndTurn => None,
            End::Cancelled => Some("cancelled"),
            End::AgentGone => Some("the agent disconnected"),
            End::Expired => Some("the session expired"),
            End::Closed => Some("the session was closed"),
            End::Failed => Some("the turn could not be sent to the agent"),
        }
    }
}

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

/// Why a chunk was not taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// No such session (or it ended).
    Unknown,
    /// The session is another agent's.
    NotYours,
    /// The session has no turn in progress.
    NoTurn,
    /// The chunk answers another turn than the one in progress (an older one, sent before
    /// the agent heard it ended; or one whose request has not reached this connection).
    Stale,
    /// Every turn log together is full, or the broker is over its memory limit (429).
    Busy,
    /// The chunk is malformed.
    Invalid(String),
}

impl Refused {
    pub fn status(&self) -> (u16, String) {
        match self {
            Refused::Unknown => (404, "no such session".into()),
            Refused::NotYours => (403, "the session is another agent's".into()),
            Refused::NoTurn => (409, "the session has no turn in progress".into()),
            Refused::Stale => (409, "the chunk is not for the session's turn in progress".into()),
            Refused::Busy => (429, "streams are too far behind; send again shortly".into()),
            Refused::Invalid(m) => (400, m.clone()),
        }
    }
}

/// What became of a chunk that was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Taken {
    Stored,
    /// Its `seq` was not past the turn's last one: a resent chunk, ignored.
    Duplicate,
}

/// The ring of one turn's chunks and who reads it.
#[derive(Default)]
struct State {
    /// Turns started so far; the log is the last one's.
    turn: u64,
    /// A turn is in progress (its last chunk has not come).
    live: bool,
    closed: bool,
    /// The agent's attachment the turn in progress was routed to (0: not yet known).
    routed: u64,
    /// The last turn whose request was handed to the agent's WebSocket.
    delivered: u64,
    log: VecDeque<Arc<Frame>>,
    /// The place in the turn of `log[0]` (chunks before it were dropped from the ring).
    first: u64,
    /// Bytes of the frames in `log`.
    bytes: usize,
    last_seq: Option<u64>,
    /// The reader's number (a new reader replaces the old one) and its doorbell.
    readers: u64,
    reader: Option<Arc<Watch>>,
}

/// One open session of an agent streaming call.
pub struct Call {
    /// The stored (tenant-scoped) id of its agent.
    pub agent: String,
    /// Who opened it (`None` with `auth = none`): only they stream its turns.
    pub principal: Option<String>,
    /// The session id as its clients name it.
    pub sid: String,
    state: Mutex<State>,
    /// When it was last used, ms since the epoch: an atomic beside the state, so the expiry
    /// scan reads it without taking each session's lock (or copying every key).
    last_ms: AtomicU64,
    /// What every turn log holds (`Calls::held`): what this one still holds goes back when
    /// the session is dropped (its last reader may read its final chunks after it closed).
    held: Arc<AtomicUsize>,
}

impl Drop for Call {
    fn drop(&mut self) {
        let s = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        self.held.fetch_sub(s.bytes, Ordering::Relaxed);
    }
}

impl Call {
    /// Whether a turn is in progress.
    pub fn live(&self) -> bool {
        lock(&self.state).live
    }

    /// The turn in progress (or the last one), numbered from 1.
    pub fn turn(&self) -> u64 {
        lock(&self.state).turn
    }

    /// Frees the log but its last chunk (the turn's end), once a reader has read that.
    fn trim(&self, s: &mut State) {
        while s.log.len() > 1 {
            let old = s.log.pop_front().expect("more than one");
            s.bytes -= old.as_bytes().len();
            self.held.fetch_sub(old.as_bytes().len(), Ordering::Relaxed);
            s.first += 1;
        }
    }
}

/// A client's cursor in one turn of a session.
pub struct Reader {
    call: Arc<Call>,
    gen: u64,
    turn: u64,
    next: u64,
    /// Dropped chunks not yet reported.
    dropped: u64,
    pub watch: Arc<Watch>,
}

/// What a reader found.
pub enum Read {
    /// Chunks in order, after `dropped` lost ones; `end` once the turn's last chunk is among
    /// them (or was read before).
    Chunks { dropped: u64, chunks: Vec<Arc<Frame>>, end: bool },
    /// Nothing new: wait on the doorbell.
    Wait,
    /// Another reader took over, or a new turn started: this stream ends.
    Replaced,
}

impl Reader {
    /// Chunks from the cursor on: at most `max`, and no more once `max_bytes` are taken (at
    /// least one).
    pub fn read(&mut self, max: usize, max_bytes: usize) -> Read {
        let mut s = lock(&self.call.state);
        if s.readers != self.gen || s.turn != self.turn {
            return Read::Replaced;
        }
        if self.next < s.first {
            self.dropped += s.first - self.next;
            self.next = s.first;
        }
        let at = (self.next - s.first) as usize;
        let mut bytes = 0;
        let chunks: Vec<Arc<Frame>> = s
            .log
            .iter()
            .skip(at)
            .take(max)
            .take_while(|f| {
                let more = bytes < max_bytes;
                bytes += f.as_bytes().len();
                more
            })
            .cloned()
            .collect();
        self.next += chunks.len() as u64;
        let end = !s.live && self.next == s.first + s.log.len() as u64;
        if end {
            // The turn is over and read: only a resume could want it again, and one that
            // does is told what it lost.
            self.call.trim(&mut s);
        }
        if chunks.is_empty() && self.dropped == 0 && !end {
            return Read::Wait;
        }
        Read::Chunks { dropped: std::mem::take(&mut self.dropped), chunks, end }
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        let mut s = lock(&self.call.state);
        if s.readers == self.gen {
            s.reader = None;
        }
    }
}

#[derive(Default)]
struct Table {
    map: HashMap<String, Arc<Call>>,
    /// Open sessions per stored agent id (an agent is picked by fewest).
    per_agent: HashMap<String, usize>,
}

/// Every open session, by stored (tenant-scoped) session id.
pub struct Calls {
    table: Mutex<Table>,
    max: usize,
    /// Frame bytes held by every turn log.
    held: Arc<AtomicUsize>,
    pub chunks: AtomicU64,
    pub dropped: AtomicU64,
    pub expired: AtomicU64,
}

/// Why a session was not opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full;

impl Calls {
    pub fn new(max: usize) -> Calls {
        Calls {
            table: Mutex::default(),
            max,
            held: Arc::default(),
            chunks: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            expired: AtomicU64::new(0),
        }
    }

    /// Open sessions.
    pub fn len(&self) -> usize {
        lock(&self.table).map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Open sessions of `agent` (stored id).
    pub fn sessions_of(&self, agent: &str) -> usize {
        lock(&self.table).per_agent.get(agent).copied().unwrap_or(0)
    }

    /// Opens session `sid` of `agent` (stored id) under `key` (its stored id); `Err(Full)` at
    /// `max_sessions`.
    pub fn open(
        &self,
        key: String,
        (agent, sid): (String, String),
        principal: Option<String>,
        now_ms: u64,
    ) -> Result<Arc<Call>, Full> {
        let mut t = lock(&self.table);
        if t.map.len() >= self.max {
            return Err(Full);
        }
        *t.per_agent.entry(agent.clone()).or_default() += 1;
        let state = Mutex::new(State::default());
        let last_ms = AtomicU64::new(now_ms);
        let call = Arc::new(Call { agent, principal, sid, state, last_ms, held: self.held.clone() });
        t.map.insert(key, call.clone());
        Ok(call)
    }

    pub fn get(&self, key: &str) -> Option<Arc<Call>> {
        lock(&self.table).map.get(key).cloned()
    }

    fn remove(&self, key: &str) -> Option<Arc<Call>> {
        let mut t = lock(&self.table);
        let call = t.map.remove(key)?;
        if let Some(n) = t.per_agent.get_mut(&call.agent) {
            *n -= 1;
            if *n == 0 {
                t.per_agent.remove(&call.agent);
            }
        }
        Some(call)
    }

    /// Starts a turn of `call`: its number, or `Err` while one is in progress (or the session
    /// ended). The last turn's chunks are freed, and its reader ends.
    pub fn start_turn(&self, call: &Arc<Call>, now_ms: u64) -> Result<u64, &'static str> {
        let mut s = lock(&call.state);
        if s.closed {
            return Err("the session ended");
        }
        if s.live {
            return Err("a turn is in progress: end or cancel it first");
        }
        self.held.fetch_sub(s.bytes, Ordering::Relaxed);
        s.log.clear();
        s.bytes = 0;
        s.first = 0;
        s.last_seq = None;
        s.turn += 1;
        s.live = true;
        s.routed = 0;
        call.last_ms.store(now_ms, Ordering::Relaxed);
        s.readers += 1;
        if let Some(old) = s.reader.take() {
            old.ring();
        }
        Ok(s.turn)
    }

    /// The turn in progress of `call` (number `turn`) goes to the agent's attachment `gen`.
    pub fn route(&self, call: &Call, turn: u64, gen: u64) {
        let mut s = lock(&call.state);
        if s.turn == turn {
            s.routed = gen;
        }
    }

    /// The request of `key`'s turn `turn` is being handed to its agent's WebSocket; `false`
    /// when that turn is no longer in progress (the request is stale: not sent).
    pub fn delivering(&self, key: &str, turn: u64) -> bool {
        let Some(call) = self.get(key) else { return false };
        let mut s = lock(&call.state);
        if !s.live || s.turn != turn {
            return false;
        }
        s.delivered = turn;
        true
    }

    /// A reader of `call`'s turn `turn` (default: the current or last one), after the chunk
    /// `after` (a `Last-Event-ID`) or from its start; `None` when there is nothing to read (no
    /// such turn, or it ended and the reader has all of it). Replaces any earlier reader.
    pub fn reader(&self, call: &Arc<Call>, after: Option<u64>, turn: Option<u64>) -> Option<Reader> {
        let mut s = lock(&call.state);
        if turn.is_some_and(|t| t != s.turn) {
            return None;
        }
        let (next, dropped) = position(&s, after)?;
        s.readers += 1;
        let watch = Arc::new(Watch::default());
        if let Some(old) = s.reader.replace(watch.clone()) {
            old.ring();
        }
        Some(Reader { call: call.clone(), gen: s.readers, turn: s.turn, next, dropped, watch })
    }

    /// Whether [`Calls::reader`] would find anything to read (without replacing a reader).
    pub fn pending(&self, call: &Call, after: Option<u64>, turn: Option<u64>) -> bool {
        let s = lock(&call.state);
        turn.is_none_or(|t| t == s.turn) && position(&s, after).is_some()
    }

    /// Takes a chunk of `key`'s current turn from `agent` (stored id), over its attachment
    /// `gen` (`None`: over HTTP).
    pub fn chunk(
        &self,
        key: &str,
        (agent, gen): (&str, Option<u64>),
        c: &Chunk<'_>,
        now_ms: u64,
    ) -> Result<Taken, Refused> {
        let call = self.get(key).ok_or(Refused::Unknown)?;
        if call.agent != agent {
            return Err(Refused::NotYours);
        }
        let len = match c.data {
            ChunkData::None => 0,
            ChunkData::Text(t) => t.len(),
            ChunkData::Json(j) => j.len(),
        } + c.error.map_or(0, str::len);
        if len > MAX_CHUNK_BYTES {
            return Err(Refused::Invalid(format!("a chunk carries at most {MAX_CHUNK_BYTES} bytes")));
        }
        if c.seq.is_some_and(|n| n > MAX_SEQ) {
            return Err(Refused::Invalid(format!("seq is at most {MAX_SEQ}")));
        }
        let mut s = lock(&call.state);
        if !s.live {
            return Err(Refused::NoTurn);
        }
        // Only the turn whose request reached the agent (over the connection it was routed
        // to) takes chunks: one sent for an earlier turn arrives before the next one's request.
        let routed_elsewhere = gen.is_some_and(|g| s.routed != 0 && s.routed != g);
        if s.delivered != s.turn || c.turn.is_some_and(|t| t != s.turn) || routed_elsewhere {
            return Err(Refused::Stale);
        }
        let seq = match (c.seq, s.last_seq) {
            (Some(seq), Some(last)) if seq <= last => return Ok(Taken::Duplicate),
            (Some(seq), _) => seq,
            (None, Some(last)) if last >= MAX_SEQ => return Err(Refused::Invalid(format!("seq is at most {MAX_SEQ}"))),
            (None, Some(last)) => last + 1,
            (None, None) => 0,
        };
        let end = c.done || c.error.is_some();
        let frame = chunk_frame(&call.sid, seq, c);
        if !end && self.held.load(Ordering::Relaxed) + frame.as_bytes().len() > BUFFER_BYTES {
            return Err(Refused::Busy);
        }
        self.push(&call, &mut s, frame, end, now_ms);
        Ok(Taken::Stored)
    }

    /// Ends `call`'s turn, if one is in progress, with a last chunk of the broker's; `true` if
    /// it did.
    pub fn end_turn(&self, call: &Call, why: End, now_ms: u64) -> bool {
        let mut s = lock(&call.state);
        self.end_locked(call, &mut s, why, now_ms)
    }

    fn end_locked(&self, call: &Call, s: &mut State, why: End, now_ms: u64) -> bool {
        if !s.live {
            return false;
        }
        let seq = s.last_seq.map_or(0, |l| l.saturating_add(1).min(MAX_SEQ));
        let c = Chunk {
            seq: Some(seq),
            turn: None,
            data: ChunkData::None,
            done: true,
            error: why.error(),
            chunk_type: None,
        };
        self.push(call, s, chunk_frame(&call.sid, seq, &c), true, now_ms);
        true
    }

    fn push(&self, call: &Call, s: &mut State, frame: Frame, end: bool, now_ms: u64) {
        let len = frame.as_bytes().len();
        while !s.log.is_empty() && (s.log.len() >= SINK_CHUNKS || s.bytes + len > TURN_BYTES) {
            let old = s.log.pop_front().expect("not empty");
            s.bytes -= old.as_bytes().len();
            self.held.fetch_sub(old.as_bytes().len(), Ordering::Relaxed);
            s.first += 1;
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
        s.last_seq = Some(frame.header().sequence);
        s.log.push_back(Arc::new(frame));
        s.bytes += len;
        self.held.fetch_add(len, Ordering::Relaxed);
        self.chunks.fetch_add(1, Ordering::Relaxed);
        call.last_ms.store(now_ms, Ordering::Relaxed);
        if end {
            s.live = false;
        }
        if let Some(r) = &s.reader {
            r.ring();
        }
    }

    /// Marks `call` used now (idle sessions expire).
    pub fn touch(&self, call: &Call, now_ms: u64) {
        call.last_ms.store(now_ms, Ordering::Relaxed);
    }

    /// Closes session `key`: ends its turn. The session, if it was open (its log goes with
    /// the last reader).
    pub fn close(&self, key: &str, why: End, now_ms: u64) -> Option<Arc<Call>> {
        let call = self.remove(key)?;
        // Counted before the turn's end is seen (a client that read it reads the count too).
        if why == End::Expired {
            self.expired.fetch_add(1, Ordering::Relaxed);
        }
        let mut s = lock(&call.state);
        self.end_locked(&call, &mut s, why, now_ms);
        s.closed = true;
        drop(s);
        Some(call)
    }

    /// Closes the sessions idle for `ttl_ms` (nothing streamed, sent or asked). Returns them
    /// (stored id, session).
    pub fn expire(&self, now_ms: u64, ttl_ms: u64) -> Vec<(String, Arc<Call>)> {
        // Under the table's lock (every core's chunks and streams take it) only atomic loads,
        // and only the idle sessions' keys copied.
        let idle = |c: &Arc<Call>| now_ms.saturating_sub(c.last_ms.load(Ordering::Relaxed)) > ttl_ms;
        let keys: Vec<String> = lock(&self.table).map.iter().filter(|(_, c)| idle(c)).map(|(k, _)| k.clone()).collect();
        keys.into_iter().filter_map(|k| self.close(&k, End::Expired, now_ms).map(|c| (k, c))).collect()
    }

    /// `agent` (stored id) closed its attachment `gen`: each turn in progress routed to it ends
    /// with an error.
    pub fn agent_gone(&self, agent: &str, gen: u64, now_ms: u64) -> usize {
        let calls: Vec<Arc<Call>> = lock(&self.table).map.values().filter(|c| c.agent == agent).cloned().collect();
        calls
            .iter()
            .filter(|c| {
                let mut s = lock(&c.state);
                s.routed == gen && self.end_locked(c, &mut s, End::AgentGone, now_ms)
            })
            .count()
    }

    /// Bytes every turn log holds now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }
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

/// A session's stored (tenant-scoped) key.
pub fn session_key(tenant: Option<&str>, sid: &str) -> String {
    match tenant {
        Some(t) => format!("{t}/{sid}"),
        None => sid.to_owned(),
    }
}

/// The stored name of the lite topic `agent.<agent>` of `tenant`.
pub fn agent_topic(tenant: Option<&str>, agent: &str) -> String {
    match tenant {
        Some(t) => format!(":{t}.agent.{agent}"),
        None => format!(":agent.{agent}"),
    }
}

/// Where a reader after chunk `after` starts in the turn (and how many chunks it lost already),
/// or `None` when it would have nothing to read.
fn position(s: &State, after: Option<u64>) -> Option<(u64, u64)> {
    if s.turn == 0 {
        return None;
    }
    let end = s.first + s.log.len() as u64;
    let seq = |f: &Arc<Frame>| f.header().sequence;
    let (next, dropped) = match after {
        None => (s.first, s.first),
        Some(after) => match s.log.iter().position(|f| seq(f) > after) {
            // Chunks between `after` and the oldest one kept are gone.
            Some(0) => (s.first, seq(&s.log[0]).saturating_sub(after.saturating_add(1)).min(s.first)),
            Some(i) => (s.first + i as u64, 0),
            None => (end, 0),
        },
    };
    if !s.live && next == end {
        return None;
    }
    Some((next, dropped))
}

/// A `stream-chunk` frame: the chunk's number in the header's `sequence` and in `emseq`.
fn chunk_frame(sid: &str, seq: u64, c: &Chunk<'_>) -> Frame {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn text(seq: u64, t: &str) -> Chunk<'_> {
        Chunk { seq: Some(seq), turn: None, data: ChunkData::Text(t), done: false, error: None, chunk_type: None }
    }

    fn seqs(r: Read) -> (u64, Vec<u64>, bool) {
        match r {
            Read::Chunks { dropped, chunks, end } => {
                (dropped, chunks.iter().map(|f| f.header().sequence).collect(), end)
            }
            Read::Wait => (0, vec![], false),
            Read::Replaced => panic!("replaced"),
        }
    }

    fn open(calls: &Calls, key: &str) -> Arc<Call> {
        calls.open(key.into(), ("a".into(), format!("a:{key}")), None, 0).unwrap()
    }

    /// Starts a turn routed to attachment 1 whose request reached the agent.
    fn turn(calls: &Calls, key: &str, call: &Arc<Call>) -> u64 {
        let t = calls.start_turn(call, 0).unwrap();
        calls.route(call, t, 1);
        assert!(calls.delivering(key, t));
        t
    }

    const A: (&str, Option<u64>) = ("a", Some(1));

    #[test]
    fn a_turn_streams_in_order_and_ends_with_its_last_chunk() {
        let calls = Calls::new(10);
        let call = open(&calls, "s");
        assert!(calls.reader(&call, None, None).is_none(), "no turn yet");
        assert_eq!(calls.chunk("s", A, &text(0, "x"), 1), Err(Refused::NoTurn));
        turn(&calls, "s", &call);
        assert!(calls.start_turn(&call, 1).is_err(), "one turn at a time");
        let mut r = calls.reader(&call, None, None).unwrap();
        assert!(matches!(r.read(10, 1 << 20), Read::Wait));
        assert_eq!(calls.chunk("s", ("b", None), &text(0, "x"), 1), Err(Refused::NotYours));
        assert_eq!(calls.chunk("t", A, &text(0, "x"), 1), Err(Refused::Unknown));
        assert_eq!(calls.chunk("s", ("a", Some(2)), &text(0, "x"), 1), Err(Refused::Stale), "another attachment's");
        assert_eq!(calls.chunk("s", A, &text(1, "x"), 1), Ok(Taken::Stored));
        assert_eq!(calls.chunk("s", ("a", None), &text(1, "again"), 1), Ok(Taken::Duplicate));
        let done =
            Chunk { seq: None, turn: Some(1), data: ChunkData::Json(b"{}"), done: true, error: None, chunk_type: None };
        assert_eq!(calls.chunk("s", A, &done, 1), Ok(Taken::Stored));
        assert_eq!(seqs(r.read(1, 1 << 20)), (0, vec![1], false), "at most max");
        assert_eq!(seqs(r.read(10, 1 << 20)), (0, vec![2], true));
        assert_eq!(calls.chunk("s", A, &text(3, "late"), 1), Err(Refused::NoTurn));
        // Read to its end, the turn keeps only its last chunk: a resume from before is told.
        assert_eq!(seqs(calls.reader(&call, Some(0), None).unwrap().read(10, 1 << 20)), (1, vec![2], true));
        assert!(calls.reader(&call, Some(2), None).is_none());
        let held = calls.held();
        assert!(held > 0 && held < 1024, "{held}");
        // The next turn frees the last one's chunks, and ends its reader.
        let t2 = calls.start_turn(&call, 2).unwrap();
        assert!(matches!(r.read(10, 1 << 20), Read::Replaced));
        assert_eq!(calls.held(), 0);
        assert!(calls.reader(&call, None, Some(t2 - 1)).is_none(), "a stream of an older turn");
    }

    #[test]
    fn chunks_of_an_older_turn_or_before_the_request_reached_the_agent_are_stale() {
        let calls = Calls::new(10);
        let call = open(&calls, "s");
        let t1 = turn(&calls, "s", &call);
        calls.chunk("s", A, &text(5, "x"), 0).unwrap();
        assert!(calls.end_turn(&call, End::Cancelled, 0));
        // Turn 2 is in progress, but its request has not reached the agent: the agent's chunk
        // 6 answers turn 1 (it had not heard of the cancel). Turn 2's own chunks, from 0, count.
        let t2 = calls.start_turn(&call, 0).unwrap();
        calls.route(&call, t2, 1);
        assert_eq!(calls.chunk("s", A, &text(6, "late"), 0), Err(Refused::Stale));
        assert!(!calls.delivering("s", t1), "a request of an ended turn is not sent");
        assert!(calls.delivering("s", t2));
        let stale = Chunk { turn: Some(t1), ..text(7, "late") };
        assert_eq!(calls.chunk("s", A, &stale, 0), Err(Refused::Stale), "it says which turn it answers");
        assert_eq!(calls.chunk("s", A, &text(0, "fresh"), 0), Ok(Taken::Stored));
        // seq is a CloudEvents integer; an agent cannot wrap the ids.
        assert!(matches!(calls.chunk("s", A, &text(u64::MAX, "x"), 0), Err(Refused::Invalid(_))));
        calls.chunk("s", A, &text(MAX_SEQ, "x"), 0).unwrap();
        let next = Chunk { seq: None, ..text(0, "x") };
        assert!(matches!(calls.chunk("s", A, &next, 0), Err(Refused::Invalid(_))));
        // The broker's end still comes after it.
        assert!(calls.end_turn(&call, End::Cancelled, 0));
    }

    #[test]
    fn a_reader_past_the_ring_is_told_what_it_lost_and_the_end_is_kept() {
        let calls = Calls::new(10);
        let call = open(&calls, "s");
        turn(&calls, "s", &call);
        let mut r = calls.reader(&call, None, None).unwrap();
        for seq in 0..(SINK_CHUNKS as u64 + 10) {
            calls.chunk("s", A, &text(seq, "tok"), 0).unwrap();
        }
        assert!(calls.end_turn(&call, End::Cancelled, 0));
        // Resuming from before the ring says what is gone, too.
        let (dropped, got, _) = seqs(calls.reader(&call, Some(3), None).unwrap().read(1, 1 << 20));
        assert_eq!((dropped, got), (7, vec![11]));
        // (That reader replaced the first: a new one from the start.)
        let mut r2 = calls.reader(&call, None, None).unwrap();
        assert!(matches!(r.read(1, 1), Read::Replaced));
        let (dropped, got, end) = seqs(r2.read(SINK_CHUNKS * 2, usize::MAX));
        assert_eq!(dropped, 11);
        assert_eq!(got.len(), SINK_CHUNKS);
        assert_eq!(got.last(), Some(&(SINK_CHUNKS as u64 + 10)));
        assert!(end);
        assert_eq!(calls.dropped.load(Ordering::Relaxed), 11);
    }

    #[test]
    fn every_chunk_counts_against_the_budget_and_a_closed_session_gives_it_back() {
        let calls = Calls::new(10);
        let call = open(&calls, "s");
        turn(&calls, "s", &call);
        let empty = Chunk { seq: None, turn: None, data: ChunkData::None, done: false, error: None, chunk_type: None };
        calls.chunk("s", A, &empty, 0).unwrap();
        let one = calls.held();
        assert!(one > 100, "an empty chunk is a frame all the same: {one}");
        calls.chunk("s", A, &empty, 0).unwrap();
        assert_eq!(calls.held(), 2 * one);
        let reader = calls.reader(&call, None, None).unwrap();
        calls.close("s", End::Closed, 0).unwrap();
        assert!(calls.held() > 2 * one, "the end is kept for the reader");
        drop(call);
        assert!(calls.held() > 0, "while the reader has the session");
        drop(reader);
        assert_eq!(calls.held(), 0);
    }

    #[test]
    fn sessions_expire_close_and_lose_their_agent_attachment() {
        let calls = Calls::new(2);
        let call = open(&calls, "s");
        open(&calls, "t");
        assert_eq!(calls.open("u".into(), ("a".into(), "a:u".into()), None, 0).err(), Some(Full));
        assert_eq!(calls.sessions_of("a"), 2);
        turn(&calls, "s", &call);
        assert_eq!(calls.agent_gone("a", 2, 5), 0, "another attachment of the agent");
        assert_eq!(calls.agent_gone("a", 1, 5), 1);
        let mut r = calls.reader(&call, None, None).unwrap();
        let Read::Chunks { chunks, end: true, .. } = r.read(10, 1 << 20) else { panic!("ended") };
        assert_eq!(chunks[0].body().attr_str("emerror"), Some("the agent disconnected"));
        calls.touch(&call, 100);
        let gone = calls.expire(150, 60);
        assert_eq!(gone.len(), 1, "only the idle one");
        assert_eq!(gone[0].0, "t");
        assert!(calls.close("s", End::Closed, 200).is_some() && calls.is_empty());
        assert_eq!(calls.sessions_of("a"), 0);
        assert!(calls.start_turn(&call, 300).is_err(), "a closed session takes no turn");
    }
}
