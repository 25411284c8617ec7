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
//!
//! The files:
//! * `registry.rs`: [`Calls`], the table of open sessions, and a session's life (open, close,
//!   expiry, its agent gone).
//! * `turn.rs`: a session's turns, the other half of [`Calls`]: start, route, deliver, take a
//!   chunk ([`Taken`], [`Refused`]), end.
//! * `session.rs`: one session ([`Call`]) and its turn's chunk log (the ring, its bounds).
//! * `read.rs`: a client's cursor in the log ([`Reader`], [`Read`]) and how a turn ended
//!   ([`End`]).
//! * `chunk.rs`: a chunk as the agent sends it ([`ChunkBody`], [`Chunk`]) and the frame it is
//!   stored as.
//! * `keys.rs`: the stored names, [`session_key`] and [`agent_topic`].

mod chunk;
mod keys;
mod read;
mod registry;
mod session;
mod turn;

pub use chunk::{Chunk, ChunkBody, ChunkData, MAX_CHUNK_BYTES, MAX_SEQ};
pub use keys::{agent_topic, session_key};
pub use read::{End, Read, Reader};
pub use registry::{Calls, Full};
pub use session::{Call, BUFFER_BYTES, SINK_CHUNKS, TURN_BYTES};
pub use turn::{Refused, Taken};

#[cfg(test)]
mod tests;
