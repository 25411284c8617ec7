//! A client's stream of one turn of an agent streaming call (Mode 1): the turn's chunks as
//! server-sent events, read from the turn's log (`shard::calls`) with a cursor.
//!
//! Each chunk is one event: `id:` its `seq`, `event: chunk` (or `done` for the last one, or
//! `error` for one that carries an error, the agent's or the broker's), and `data:` the chunk's
//! data (a JSON string as its text, any other JSON value as JSON; one `data:` line per line).
//! A stream that fell behind by more than the log holds gets `event: dropped` with
//! `data: {"dropped":N}` where the chunks went missing. The stream ends after the turn's last
//! chunk (or when a newer stream of the session replaces it).

use std::rc::Rc;

use crate::queue;
use frame_codec::{DataKind, Frame};

use super::Outbound;
use crate::server::TurnSpec;
use crate::shard::calls::{Read, Reader};
use crate::shard::core::Shard;

/// Chunks read from the log at once, and their bytes (a chunk of line breaks renders to about
/// seven times its size: a batch stays under a megabyte).
const BATCH: usize = 256;
const BATCH_BYTES: usize = 64 * 1024;
/// Rendered batches waiting for the writer.
const QUEUE: usize = 2;

/// Appends `data` as `data:` lines (a line break of any kind starts a new line).
fn data_lines(data: &[u8], out: &mut Vec<u8>) {
    let text = String::from_utf8_lossy(data);
    let mut lines = text.split("\r\n").flat_map(|l| l.split(['\r', '\n']));
    for line in lines.by_ref() {
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(line.as_bytes());
        out.push(b'\n');
    }
}

/// One chunk as a server-sent event.
pub fn render(f: &Frame, out: &mut Vec<u8>) {
    let body = f.body();
    let error = body.attr_str("emerror");
    let done = matches!(body.attr("emdone"), Some(frame_codec::ArchivedAttrValue::Bool(true)));
    let event = match (error, done) {
        (Some(_), _) => "error",
        (None, true) => "done",
        (None, false) => "chunk",
    };
    out.extend_from_slice(format!("id: {}\nevent: {event}\n", f.header().sequence).as_bytes());
    match error {
        Some(e) => data_lines(e.as_bytes(), out),
        None if f.header().data_kind == DataKind::None => out.extend_from_slice(b"data: \n"),
        None => data_lines(&body.data, out),
    }
    out.push(b'\n');
}

/// Feeds `out` from the reader until the turn ends or the reader is replaced.
async fn feed(mut reader: Reader, mut out: queue::Sender<Outbound>) {
    let watch = reader.watch.clone();
    loop {
        match reader.read(BATCH, BATCH_BYTES) {
            Read::Replaced => return,
            Read::Wait => watch.rung().await,
            Read::Chunks { dropped, chunks, end } => {
                let mut events = Vec::with_capacity(chunks.len() * 64 + 32);
                if dropped > 0 {
                    events.extend_from_slice(format!("event: dropped\ndata: {{\"dropped\":{dropped}}}\n\n").as_bytes());
                }
                for c in &chunks {
                    render(c, &mut events);
                }
                let mut framed = Vec::with_capacity(events.len() + 16);
                crate::shard::sessions::chunk(&events, &mut framed);
                if out.send(Outbound::Frame(Rc::new(framed))).await.is_err() || end {
                    return;
                }
            }
        }
    }
}

/// Streams the turn `spec` names, after the `200` head.
pub async fn sse(shard: Rc<Shard>, stream: crate::server::Stream, buf: Vec<u8>, spec: Box<TurnSpec>) {
    let (tx, events) = queue::channel(QUEUE);
    let calls = &shard.shared.calls;
    let Some(call) = calls.get(&spec.key) else {
        // The session was closed (or expired) since the head was decided: the stream says so.
        let mut event = Vec::new();
        crate::shard::sessions::chunk(b"event: error\ndata: the session was closed\n\n", &mut event);
        let _ = tx.try_send(Outbound::Frame(Rc::new(event)));
        drop(tx);
        return super::sse::serve(stream, buf, events).await;
    };
    let Some(reader) = calls.reader(&call, spec.after, spec.turn) else {
        // The turn was read whole, or a newer one started, since the head was decided.
        drop(tx);
        return super::sse::serve(stream, buf, events).await;
    };
    super::sse::serve_fed(stream, buf, events, feed(reader, tx), spec.expires_us).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_line_of_the_data_is_a_data_line() {
        let mut out = Vec::new();
        data_lines(b"one\ntwo\r\nthree\rfour", &mut out);
        assert_eq!(out, b"data: one\ndata: two\ndata: three\ndata: four\n");
        out.clear();
        data_lines(b"", &mut out);
        assert_eq!(out, b"data: \n");
    }
}
