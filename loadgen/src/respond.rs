//! Request-reply responders: what the broker's requesters are answered by.
//!
//! Through the broker, the fan-out subscribers (`--subscribe-url`, `--reply`) answer each
//! request they receive with a WebSocket `reply` frame and ack it. Directly (`--serve ADDR`),
//! an HTTP server answers every POST with the same reply event: the round trip the broker's
//! is compared with, done by the same code with the broker taken out.

use std::net::SocketAddr;

use monoio::buf::IoBufMut;
use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use monoio::net::{TcpListener, TcpStream};

/// The reply to the request whose `emcorrelationid` is `id`: a small structured CloudEvent.
pub fn reply_event(id: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(br#"{"specversion":"1.0","id":"r","source":"/loadgen/responder","type":"com.example.reply","emcorrelationid":""#);
    out.extend_from_slice(id);
    out.extend_from_slice(br#"","data":{"ok":true}}"#);
}

/// The `emcorrelationid` of a delivered request, as evmesh writes it.
pub fn correlation_id(payload: &[u8]) -> Option<&[u8]> {
    const KEY: &[u8] = b"\"emcorrelationid\":\"";
    let at = payload.windows(KEY.len()).position(|w| w == KEY)? + KEY.len();
    let len = payload[at..].iter().position(|&b| b == b'"')?;
    Some(&payload[at..at + len])
}

/// The `{"type":"reply","event":...}` text for one request.
pub fn reply_frame(id: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(br#"{"type":"reply","event":"#);
    reply_event(id, out);
    out.push(b'}');
}

async fn serve_conn(mut s: TcpStream) {
    let _ = s.set_nodelay(true);
    let mut buf: Vec<u8> = Vec::with_capacity(16 * 1024);
    let mut out: Vec<u8> = Vec::with_capacity(1024);
    let mut reply = Vec::new();
    reply_event(b"direct", &mut reply);
    loop {
        // Answer every whole request buffered, then read more.
        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4) {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:").map(|v| v.trim().parse().unwrap_or(0)))
                .unwrap_or(0);
            if buf.len() < end + len {
                break;
            }
            buf.drain(..end + len);
            out.extend_from_slice(
                format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/cloudevents+json\r\ncontent-length: {}\r\n\r\n",
                    reply.len()
                )
                .as_bytes(),
            );
            out.extend_from_slice(&reply);
        }
        if !out.is_empty() {
            let (res, back) = s.write_all(std::mem::take(&mut out)).await;
            out = back;
            out.clear();
            if res.is_err() {
                return;
            }
        }
        buf.reserve(16 * 1024);
        let (len, cap) = (buf.len(), buf.capacity());
        let (res, slice) = s.read(std::mem::take(&mut buf).slice_mut(len..cap)).await;
        buf = slice.into_inner();
        if !matches!(res, Ok(n) if n > 0) {
            return;
        }
    }
}

/// `loadgen --serve ADDR`: the direct responder, until killed.
pub fn serve(addr: SocketAddr) -> ! {
    let mut rt = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new().enable_timer().build().expect("runtime");
    rt.block_on(async move {
        let listener = TcpListener::bind(addr).expect("bind --serve address");
        loop {
            if let Ok((s, _)) = listener.accept().await {
                monoio::spawn(serve_conn(s));
            }
        }
    })
}
