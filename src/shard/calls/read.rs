//! Reading a turn: a client's cursor in its session's log ([`Reader`]), what it finds
//! ([`Read`]), and why a turn ended without the agent's last chunk ([`End`], said in the
//! stream's final event).

use std::sync::Arc;

use frame_codec::Frame;

use super::session::{lock, Call};
use crate::shard::watch::Watch;

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
    pub(super) fn error(self) -> Option<&'static str> {
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

/// A client's cursor in one turn of a session.
pub struct Reader {
    pub(super) call: Arc<Call>,
    pub(super) gen: u64,
    pub(super) turn: u64,
    pub(super) next: u64,
    /// Dropped chunks not yet reported.
    pub(super) dropped: u64,
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
