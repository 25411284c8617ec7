//! A session's turns, [`Calls`]'s other half: a turn starts, is routed and handed to the
//! agent, takes the agent's chunks into its log (or refuses them: [`Refused`]), and ends; a
//! client's [`Reader`] is placed in it.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use frame_codec::Frame;

use super::chunk::{chunk_frame, Chunk, ChunkData, MAX_CHUNK_BYTES, MAX_SEQ};
use super::read::{End, Reader};
use super::registry::Calls;
use super::session::{lock, position, Call, State, BUFFER_BYTES, SINK_CHUNKS, TURN_BYTES};
use crate::shard::watch::Watch;

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

impl Calls {
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

    pub(super) fn end_locked(&self, call: &Call, s: &mut State, why: End, now_ms: u64) -> bool {
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
}
