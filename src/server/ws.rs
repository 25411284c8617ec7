//! Driving an upgraded WebSocket connection with the sans-io codec in `crate::ws`.
//!
//! So far only the echo endpoint (`ws_echo_endpoint = true`), which exists for the Autobahn
//! conformance run: every text or binary message comes back as it was sent.

use std::time::Duration;

use monoio::io::AsyncWriteRent;

use super::conn::{flush, read_more, ConnLimits, ReadOutcome};
use super::Stream;
use crate::ws::{encode_frame, CloseCode, Message, MessageReader, OpCode};

fn close_frame(code: CloseCode, out: &mut Vec<u8>) {
    encode_frame(OpCode::Close, true, &code.0.to_be_bytes(), out);
}

/// Sends our close frame, then waits briefly for the peer's before dropping the socket.
pub(crate) async fn close(mut stream: Stream, out: &mut Vec<u8>, code: CloseCode, write_timeout: Duration) {
    close_frame(code, out);
    if flush(&mut stream, out, write_timeout).await {
        let _ = stream.shutdown().await;
        let mut sink = Vec::new();
        let _ = read_more(&mut stream, &mut sink, Duration::from_secs(1)).await;
    }
}

/// Echoes every message until the peer closes. `buf` holds bytes read past the handshake.
pub async fn echo(mut stream: Stream, mut buf: Vec<u8>, limits: ConnLimits) {
    let mut reader = MessageReader::new(limits.ws_max_message);
    let mut out = Vec::new();
    loop {
        loop {
            let (msg, used) = match reader.read(&mut buf) {
                Ok(r) => r,
                Err(e) => return close(stream, &mut out, e.code, limits.write_timeout).await,
            };
            buf.drain(..used);
            match msg {
                None => break,
                Some(Message::Text(t)) => encode_frame(OpCode::Text, true, t.as_bytes(), &mut out),
                Some(Message::Binary(b)) => encode_frame(OpCode::Binary, true, &b, &mut out),
                Some(Message::Ping(p)) => encode_frame(OpCode::Pong, true, &p, &mut out),
                Some(Message::Pong(_)) => {}
                Some(Message::Close(code, _)) => {
                    let code = code.map_or(CloseCode::NORMAL, CloseCode);
                    return close(stream, &mut out, code, limits.write_timeout).await;
                }
            }
        }
        if !flush(&mut stream, &mut out, limits.write_timeout).await {
            return;
        }
        match read_more(&mut stream, &mut buf, limits.idle_timeout).await {
            ReadOutcome::Data => {}
            ReadOutcome::Closed => return,
            ReadOutcome::TimedOut => return close(stream, &mut out, CloseCode::GOING_AWAY, limits.write_timeout).await,
        }
    }
}
