//! WebSocket frames and message assembly on arbitrary client bytes: never panic; a decoded frame
//! lies within its input, every shorter prefix is `Partial` (which unmasks nothing), and what
//! `encode_frame` writes (masked as a client would) decodes to the same frame; the
//! `MessageReader` gives the same messages and the same error however the stream is split, and
//! never a message over its limit.
#![no_main]

use evmesh_protocol::http::Status;
use evmesh_protocol::ws::{decode_frame, encode_frame, Message, MessageReader, WsError};
use libfuzzer_sys::fuzz_target;

const MAX: usize = 4096;

/// Feeds `data` to a fresh reader `step` bytes at a time, as a connection would: appends what
/// arrived, reads messages until the reader asks for more, drops what it consumed.
fn feed(data: &[u8], step: usize) -> (Vec<Message>, Option<WsError>) {
    let mut reader = MessageReader::new(MAX);
    let (mut pending, mut messages) = (Vec::new(), Vec::new());
    for chunk in data.chunks(step.max(1)) {
        pending.extend_from_slice(chunk);
        loop {
            match reader.read(&mut pending) {
                Ok((message, n)) => {
                    assert!(n <= pending.len());
                    pending.drain(..n);
                    match message {
                        Some(m) => messages.push(m),
                        None => break,
                    }
                }
                Err(e) => return (messages, Some(e)),
            }
        }
    }
    (messages, None)
}

fn masked(server_frame: &[u8], payload_len: usize) -> Vec<u8> {
    let head = server_frame.len() - payload_len;
    let mut v = server_frame[..head].to_vec();
    v[1] |= 0x80;
    let mask = [0x37, 0xfa, 0x21, 0x3d];
    v.extend_from_slice(&mask);
    v.extend(server_frame[head..].iter().enumerate().map(|(i, b)| b ^ mask[i & 3]));
    v
}

fuzz_target!(|data: &[u8]| {
    let mut buf = data.to_vec();
    if let Ok(Status::Complete(f)) = decode_frame(&mut buf, MAX) {
        assert!(f.payload.0 <= f.payload.1 && f.payload.1 == f.len && f.len <= data.len());
        assert!(f.payload.1 - f.payload.0 <= MAX);
        assert_eq!(&buf[f.len..], &data[f.len..], "bytes past the frame were touched");
        for k in [0, 1, f.len / 2, f.len - 1] {
            let mut prefix = data[..k.min(f.len - 1)].to_vec();
            assert_eq!(decode_frame(&mut prefix, MAX), Ok(Status::Partial));
            assert_eq!(prefix, &data[..k.min(f.len - 1)], "Partial changed the buffer");
        }
        let payload = buf[f.payload.0..f.payload.1].to_vec();
        let mut out = Vec::new();
        encode_frame(f.opcode, f.fin, &payload, &mut out);
        let mut again = masked(&out, payload.len());
        match decode_frame(&mut again, MAX) {
            Ok(Status::Complete(g)) => {
                assert_eq!((g.fin, g.opcode, g.len), (f.fin, f.opcode, again.len()));
                assert_eq!(&again[g.payload.0..g.payload.1], &payload[..]);
            }
            other => panic!("re-encoded frame decoded as {other:?}"),
        }
    }
    let whole = feed(data, data.len());
    for m in &whole.0 {
        let len = match m {
            Message::Text(s) => s.len(),
            Message::Binary(b) | Message::Ping(b) | Message::Pong(b) => b.len(),
            Message::Close(_, reason) => reason.len(),
        };
        assert!(len <= MAX);
    }
    for step in [1, 3, data.len() / 2 + 1] {
        assert_eq!(feed(data, step), whole, "fed {step} bytes at a time");
    }
});
