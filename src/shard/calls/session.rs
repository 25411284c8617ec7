//! One open session ([`Call`]) and its turn's chunk log: the ring of the last turn's chunks,
//! bounded by [`SINK_CHUNKS`] and [`TURN_BYTES`], and where a reader resuming after a chunk
//! starts in it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use frame_codec::Frame;

use crate::shard::watch::Watch;

/// Chunks a turn's log holds: a reader further behind than this drops the oldest.
pub const SINK_CHUNKS: usize = 1024;
/// Bytes a turn's log holds (its chunk frames); older chunks go first past it.
pub const TURN_BYTES: usize = 4 << 20;
/// Bytes every turn log together holds; a chunk beyond is refused until readers catch up.
pub const BUFFER_BYTES: usize = 256 << 20;

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The ring of one turn's chunks and who reads it.
#[derive(Default)]
pub(super) struct State {
    /// Turns started so far; the log is the last one's.
    pub(super) turn: u64,
    /// A turn is in progress (its last chunk has not come).
    pub(super) live: bool,
    pub(super) closed: bool,
    /// The agent's attachment the turn in progress was routed to (0: not yet known).
    pub(super) routed: u64,
    /// The last turn whose request was handed to the agent's WebSocket.
    pub(super) delivered: u64,
    pub(super) log: VecDeque<Arc<Frame>>,
    /// The place in the turn of `log[0]` (chunks before it were dropped from the ring).
    pub(super) first: u64,
    /// Bytes of the frames in `log`.
    pub(super) bytes: usize,
    pub(super) last_seq: Option<u64>,
    /// The reader's number (a new reader replaces the old one) and its doorbell.
    pub(super) readers: u64,
    pub(super) reader: Option<Arc<Watch>>,
}

/// One open session of an agent streaming call.
pub struct Call {
    /// The stored (tenant-scoped) id of its agent.
    pub agent: String,
    /// Who opened it (`None` with `auth = none`): only they stream its turns.
    pub principal: Option<String>,
    /// The session id as its clients name it.
    pub sid: String,
    pub(super) state: Mutex<State>,
    /// When it was last used, ms since the epoch: an atomic beside the state, so the expiry
    /// scan reads it without taking each session's lock (or copying every key).
    pub(super) last_ms: AtomicU64,
    /// What every turn log holds (`Calls::held`): what this one still holds goes back when
    /// the session is dropped (its last reader may read its final chunks after it closed).
    pub(super) held: Arc<AtomicUsize>,
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
    pub(super) fn trim(&self, s: &mut State) {
        while s.log.len() > 1 {
            let old = s.log.pop_front().expect("more than one");
            s.bytes -= old.as_bytes().len();
            self.held.fetch_sub(old.as_bytes().len(), Ordering::Relaxed);
            s.first += 1;
        }
    }
}

/// Where a reader after chunk `after` starts in the turn (and how many chunks it lost already),
/// or `None` when it would have nothing to read.
pub(super) fn position(s: &State, after: Option<u64>) -> Option<(u64, u64)> {
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
