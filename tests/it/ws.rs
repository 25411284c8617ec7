//! The WebSocket layer against an independent client (tungstenite), through the echo endpoint.

use std::io::{Read, Write};
use std::net::TcpStream;

use tungstenite::protocol::frame::coding::CloseCode;
use tungstenite::Message;

use super::util::TestBroker;

#[test]
fn echo_endpoint_speaks_rfc_6455_with_tungstenite() {
    let b = TestBroker::start(&["--ws-echo-endpoint", "true", "--ws-max-message-bytes", "1000"]);
    let stream = TcpStream::connect(b.traffic).unwrap();
    let mut req =
        tungstenite::client::IntoClientRequest::into_client_request(format!("ws://{}/ws/echo", b.traffic)).unwrap();
    req.headers_mut().insert("sec-websocket-protocol", "cloudevents.json".parse().unwrap());
    let (mut ws, resp) = tungstenite::client(req, stream).unwrap();
    assert_eq!(resp.headers().get("sec-websocket-protocol").unwrap(), "cloudevents.json");
    ws.send(Message::text("héllo")).unwrap();
    assert_eq!(ws.read().unwrap(), Message::text("héllo"));
    ws.send(Message::binary(vec![0u8, 1, 2])).unwrap();
    assert_eq!(ws.read().unwrap(), Message::binary(vec![0u8, 1, 2]));
    ws.send(Message::Ping(b"p".to_vec().into())).unwrap();
    assert_eq!(ws.read().unwrap(), Message::Pong(b"p".to_vec().into()));
    // Over the message limit: closed with 1009.
    ws.send(Message::text("x".repeat(2000))).unwrap();
    match ws.read() {
        Ok(Message::Close(Some(f))) => assert_eq!(f.code, CloseCode::Size),
        other => panic!("{other:?}"),
    }
}

#[test]
fn protocol_errors_close_with_1002() {
    let b = TestBroker::start(&["--ws-echo-endpoint", "true"]);
    let mut s = TcpStream::connect(b.traffic).unwrap();
    s.write_all(b"GET /ws/echo HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n").unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut byte).unwrap();
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap();
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert!(head.contains("sec-websocket-accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo="), "{head}");
    // An unmasked client frame is a protocol error.
    s.write_all(&[0x81, 0x02, b'h', b'i']).unwrap();
    let mut close = [0u8; 4];
    s.read_exact(&mut close).unwrap();
    assert_eq!(close, [0x88, 0x02, 0x03, 0xea]);
}

#[test]
fn echo_endpoint_is_absent_unless_enabled() {
    let b = TestBroker::start(&[]);
    b.client().get("/ws/echo").assert_problem(404);
    let b = TestBroker::start(&["--ws-echo-endpoint", "true"]);
    let r = b.client().request(
        "GET",
        "/ws/echo",
        &[
            ("upgrade", "websocket"),
            ("connection", "upgrade"),
            ("sec-websocket-version", "8"),
            ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
        ],
        b"",
    );
    r.assert_problem(426);
    assert_eq!(r.header("sec-websocket-version"), Some("13"));
}
