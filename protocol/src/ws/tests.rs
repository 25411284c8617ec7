//! The codec against the RFC's examples and tungstenite (the reference), every stream split at
//! every byte offset, and a table of protocol violations with the close code each must give.

use tungstenite::protocol::frame::coding::{Control, Data, OpCode as TOp};
use tungstenite::protocol::frame::Frame as TFrame;

use super::*;

fn client_frame(data: &[u8], op: TOp, fin: bool) -> Vec<u8> {
    let mut f = TFrame::message(data.to_vec(), TOp::Data(Data::Binary), fin);
    f.header_mut().opcode = op;
    f.header_mut().mask = Some([0x37, 0xfa, 0x21, 0x3d]);
    let mut out = Vec::new();
    f.format(&mut out).unwrap();
    out
}

/// Feeds `stream` to a reader in two chunks split at `cut`, collecting messages.
fn read_all(stream: &[u8], cut: usize, max: usize) -> Result<Vec<Message>, WsError> {
    let mut reader = MessageReader::new(max);
    let mut buf: Vec<u8> = Vec::new();
    let mut out = Vec::new();
    for chunk in [&stream[..cut], &stream[cut..]] {
        buf.extend_from_slice(chunk);
        loop {
            let (msg, used) = reader.read(&mut buf)?;
            buf.drain(..used);
            match msg {
                Some(m) => out.push(m),
                None => break,
            }
        }
    }
    assert!(buf.is_empty(), "all bytes consumed");
    Ok(out)
}

#[test]
fn accept_key_matches_rfc_6455_example() {
    assert_eq!(accept_key(b"dGhlIHNhbXBsZSBub25jZQ=="), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
}

#[test]
fn messages_from_tungstenite_frames_at_every_split() {
    let big = vec![b'z'; 70_000];
    let mut stream = Vec::new();
    stream.extend(client_frame(b"hello", TOp::Data(Data::Text), true));
    stream.extend(client_frame("caf".as_bytes(), TOp::Data(Data::Text), false));
    stream.extend(client_frame(b"pp", TOp::Control(Control::Ping), true));
    stream.extend(client_frame("é ok".as_bytes(), TOp::Data(Data::Continue), true));
    stream.extend(client_frame(&[0, 1, 2], TOp::Data(Data::Binary), true));
    stream.extend(client_frame(&big, TOp::Data(Data::Binary), true));
    stream.extend(client_frame(&[0x03, 0xe8, b'b', b'y', b'e'], TOp::Control(Control::Close), true));
    let want = vec![
        Message::Text("hello".into()),
        Message::Ping(b"pp".to_vec()),
        Message::Text("café ok".into()),
        Message::Binary(vec![0, 1, 2]),
        Message::Binary(big.clone()),
        Message::Close(Some(1000), "bye".into()),
    ];
    // Every split point of the small frames, and a spread of them inside the large one.
    let cuts = (0..200).chain((200..stream.len()).step_by(997)).chain([stream.len()]);
    for cut in cuts {
        assert_eq!(read_all(&stream, cut, 1 << 20).unwrap(), want, "cut at {cut}");
    }
}

#[test]
fn server_frames_parse_in_tungstenite() {
    for len in [0usize, 5, 125, 126, 65_535, 65_536] {
        let payload = vec![7u8; len];
        let mut out = Vec::new();
        encode_frame(OpCode::Text, true, &payload, &mut out);
        let mut cursor = std::io::Cursor::new(&out);
        let (head, n) = tungstenite::protocol::frame::FrameHeader::parse(&mut cursor).unwrap().unwrap();
        assert!(head.is_final);
        assert_eq!(head.opcode, TOp::Data(Data::Text));
        assert!(head.mask.is_none());
        assert_eq!(n as usize, len);
        assert_eq!(cursor.position() as usize + len, out.len());
    }
}

#[test]
fn violations_close_with_the_right_code() {
    let text = |d: &[u8], fin| client_frame(d, TOp::Data(Data::Text), fin);
    let close = |d: &[u8]| client_frame(d, TOp::Control(Control::Close), true);
    let mut unmasked = Vec::new();
    encode_frame(OpCode::Text, true, b"hi", &mut unmasked);
    let mut rsv = text(b"hi", true);
    rsv[0] |= 0x40;
    let mut bad_op = text(b"hi", true);
    bad_op[0] = (bad_op[0] & 0xf0) | 0x3;
    let cases: Vec<(&str, Vec<u8>, u16)> = vec![
        ("unmasked", unmasked, 1002),
        ("reserved bit", rsv, 1002),
        ("unknown opcode", bad_op, 1002),
        ("fragmented ping", client_frame(b"x", TOp::Control(Control::Ping), false), 1002),
        ("long ping", client_frame(&[0; 126], TOp::Control(Control::Ping), true), 1002),
        ("lone continuation", client_frame(b"x", TOp::Data(Data::Continue), true), 1002),
        ("new message mid-fragment", [text(b"a", false), text(b"b", true)].concat(), 1002),
        ("invalid utf-8", text(&[0xce, 0xba, 0xff], true), 1007),
        ("invalid utf-8 in a first fragment", text(&[b'a', 0xff], false), 1007),
        ("truncated utf-8 at the end", text(&[0xce], true), 1007),
        ("close with one byte", close(&[3]), 1002),
        ("close code 1005", close(&[0x03, 0xed]), 1002),
        ("close code 999", close(&[0x03, 0xe7]), 1002),
        ("close reason not utf-8", close(&[0x03, 0xe8, 0xff]), 1007),
        ("frame too big", text(&[b'a'; 100], true), 1009),
        (
            "message too big",
            [text(&[b'a'; 60], false), client_frame(&[b'a'; 60], TOp::Data(Data::Continue), true)].concat(),
            1009,
        ),
    ];
    for (name, bytes, code) in cases {
        for cut in 0..=bytes.len() {
            match read_all(&bytes, cut, 64) {
                Err(e) => assert_eq!(e.code.0, code, "{name} at {cut}: {e}"),
                Ok(m) => panic!("{name} at {cut}: accepted {m:?}"),
            }
        }
    }
    // A UTF-8 sequence split across fragments is fine.
    let ok = [text(&[b'a', 0xce], false), client_frame(&[0xba], TOp::Data(Data::Continue), true)].concat();
    assert_eq!(read_all(&ok, 3, 64).unwrap(), vec![Message::Text("aκ".into())]);
    // Valid close codes from the registered and private ranges.
    for code in [1000u16, 1011, 3000, 4999] {
        let b = close(&code.to_be_bytes());
        assert_eq!(read_all(&b, 0, 64).unwrap(), vec![Message::Close(Some(code), String::new())]);
    }
}

#[test]
fn upgrade_requests_are_checked() {
    let check = |req: &[u8]| {
        let crate::http::Status::Complete(head) =
            crate::http::parse_head(req, &crate::http::Limits::default()).unwrap()
        else {
            panic!()
        };
        check_upgrade(&head, req)
    };
    let good = b"GET /events/ws?subscription=s HTTP/1.1\r\nHost: x\r\nUpgrade: WebSocket\r\nConnection: keep-alive, Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: chat, cloudevents.json\r\n\r\n";
    assert_eq!(check(good), Ok(("s3pPLMBiTxaQ9kYGzzhZRbK+xOo=".to_string(), true)));
    let v8 = b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 8\r\n\r\n";
    assert_eq!(check(v8), Err(HandshakeError::Version));
    let short_key = b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: c2hvcnQ=\r\nSec-WebSocket-Version: 13\r\n\r\n";
    assert!(matches!(check(short_key), Err(HandshakeError::Bad(_))));
    let no_upgrade = b"GET / HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";
    assert!(matches!(check(no_upgrade), Err(HandshakeError::Bad(_))));
}
