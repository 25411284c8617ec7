//! Fan-out subscribers: N WebSocket clients that count deliveries and measure end-to-end
//! latency from the publish time stamped in each event's id (`t` + 16 digits of µs since the
//! Unix epoch, written by the publishers into the placeholder of the request body).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use monoio::buf::IoBufMut;
use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use monoio::net::TcpStream;

/// What the publishers stamp: `"id":"t<16 digits>"`.
pub const MARK: &[u8] = b"\"id\":\"t";

pub fn now_micros() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

pub struct SubResult {
    pub hist: Histogram<u64>,
    pub deliveries: u64,
    pub connected: u64,
}

/// The `emdeliveryid` of a delivered event, as evmesh writes it.
fn delivery_id(payload: &[u8]) -> Option<&[u8]> {
    const KEY: &[u8] = b"\"emdeliveryid\":\"";
    let at = payload.windows(KEY.len()).position(|w| w == KEY)? + KEY.len();
    let len = payload[at..].iter().position(|&b| b == b'"')?;
    Some(&payload[at..at + len])
}

/// A masked client text frame (the mask is fixed: this measures the server, not the client).
pub fn client_text(payload: &[u8], out: &mut Vec<u8>) {
    const MASK: [u8; 4] = [0x12, 0x34, 0x56, 0x78];
    out.push(0x81);
    match payload.len() {
        n @ 0..=125 => out.push(0x80 | n as u8),
        n if n <= 0xffff => {
            out.push(0x80 | 126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(0x80 | 127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    out.extend_from_slice(&MASK);
    out.extend(payload.iter().enumerate().map(|(i, b)| b ^ MASK[i % 4]));
}

fn stamp_of(payload: &[u8]) -> Option<u64> {
    let at = payload.windows(MARK.len()).position(|w| w == MARK)? + MARK.len();
    let digits = payload.get(at..at + 16)?;
    std::str::from_utf8(digits).ok()?.parse().ok()
}

pub async fn read_some(s: &mut TcpStream, buf: &mut Vec<u8>, stop: &AtomicBool) -> bool {
    if stop.load(Ordering::Relaxed) {
        return false;
    }
    buf.reserve(64 * 1024);
    let (len, cap) = (buf.len(), buf.capacity());
    let owned = std::mem::take(buf);
    match monoio::time::timeout(Duration::from_millis(200), s.read(owned.slice_mut(len..cap))).await {
        Err(_) => true, // quiet; look at the stop flag again
        Ok((res, slice)) => {
            *buf = slice.into_inner();
            matches!(res, Ok(n) if n > 0)
        }
    }
}

/// SSE streams' delivery ids waiting for their ack, a stream's ids of one read each.
type SseAcks = Rc<RefCell<VecDeque<Vec<String>>>>;

/// The most streams one `POST /events/ack` may name (evmesh's bound).
const STREAMS_PER_ACK: usize = 8;

/// Acks what the thread's SSE streams received: `POST /events/ack` on one keep-alive
/// connection, each naming the ids of up to [`STREAMS_PER_ACK`] streams (no `clientId`: the
/// ids name their streams).
async fn sse_acker(addr: SocketAddr, host: Rc<String>, subscription: String, acks: SseAcks, stop: Arc<AtomicBool>) {
    let Ok(mut s) = TcpStream::connect(addr).await else { return };
    let _ = s.set_nodelay(true);
    let mut buf = Vec::new();
    let mut refused = false;
    while !stop.load(Ordering::Relaxed) {
        let ids: Vec<String> = {
            let mut q = acks.borrow_mut();
            let n = q.len().min(STREAMS_PER_ACK);
            q.drain(..n).flatten().collect()
        };
        if ids.is_empty() {
            monoio::time::sleep(Duration::from_millis(2)).await;
            continue;
        }
        let body = serde_json::json!({ "subscription": subscription, "ids": ids }).to_string();
        let req = format!(
            "POST /events/ack HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        if s.write_all(req.into_bytes()).await.0.is_err() {
            return;
        }
        match crate::http::read_response(&mut s, &mut buf).await {
            Some(200) => {}
            Some(status) if !refused => {
                refused = true;
                eprintln!("loadgen: POST /events/ack answered {status}");
            }
            Some(_) => {}
            None => return,
        }
    }
}

async fn subscriber(
    addr: SocketAddr,
    host: String,
    path: String,
    measure_from: Instant,
    stop: Arc<AtomicBool>,
    (ack, reply, sse): (bool, bool, bool),
    sse_acks: Option<SseAcks>,
) -> SubResult {
    let mut r = SubResult { hist: Histogram::new_with_bounds(1, 60_000_000, 3).unwrap(), deliveries: 0, connected: 0 };
    let Ok(mut s) = TcpStream::connect(addr).await else { return r };
    // Acks and replies are small writes: Nagle would hold each until the broker's next event
    // brought the ACK of the last one.
    let _ = s.set_nodelay(true);
    let req = match sse {
        true => format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nAccept: text/event-stream\r\n\r\n"),
        false => format!(
            "GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        ),
    };
    if s.write_all(req.into_bytes()).await.0.is_err() {
        return r;
    }
    let mut buf: Vec<u8> = Vec::new();
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if !read_some(&mut s, &mut buf, &stop).await || buf.len() > 16 * 1024 {
            return r;
        }
    };
    if !buf.starts_with(if sse { b"HTTP/1.1 200" } else { b"HTTP/1.1 101" }) {
        return r;
    }
    r.connected = 1;
    buf.drain(..head_end);
    if sse {
        return sse_events(s, buf, measure_from, &stop, r, sse_acks).await;
    }
    let mut acks: Vec<u8> = Vec::new();
    // Reply frames (request-reply), written before the acks of what they answer.
    let mut replies: Vec<u8> = Vec::new();
    loop {
        acks.clear();
        // Whole server frames (unmasked) at the front of `buf`.
        loop {
            if buf.len() < 2 {
                break;
            }
            let (op, len7) = (buf[0] & 0x0f, (buf[1] & 0x7f) as usize);
            let (len, at) = match len7 {
                126 if buf.len() >= 4 => (u16::from_be_bytes([buf[2], buf[3]]) as usize, 4),
                127 if buf.len() >= 10 => (u64::from_be_bytes(buf[2..10].try_into().unwrap()) as usize, 10),
                126 | 127 => break,
                n => (n, 2),
            };
            if buf.len() < at + len {
                break;
            }
            if op == 8 {
                return r;
            }
            if op == 1 || op == 2 {
                let now = Instant::now();
                if now >= measure_from {
                    r.deliveries += 1;
                    if let Some(t) = stamp_of(&buf[at..at + len]) {
                        let _ = r.hist.record(now_micros().saturating_sub(t).max(1));
                    }
                }
                if let Some(id) = reply.then(|| crate::respond::correlation_id(&buf[at..at + len])).flatten() {
                    let mut text = Vec::with_capacity(256);
                    crate::respond::reply_frame(id, &mut text);
                    client_text(&text, &mut replies);
                }
                if let Some(id) = ack.then(|| delivery_id(&buf[at..at + len])).flatten() {
                    acks.extend_from_slice(if acks.is_empty() { b"{\"type\":\"ack\",\"ids\":[\"" } else { b",\"" });
                    acks.extend_from_slice(id);
                    acks.push(b'"');
                }
            }
            buf.drain(..at + len);
        }
        if !acks.is_empty() {
            acks.extend_from_slice(b"]}");
            client_text(&acks, &mut replies);
        }
        if !replies.is_empty() {
            let (res, back) = s.write_all(std::mem::take(&mut replies)).await;
            if res.is_err() {
                return r;
            }
            replies = back;
            replies.clear();
        }
        if !read_some(&mut s, &mut buf, &stop).await {
            return r;
        }
    }
}

/// Counts a server-sent event stream's events (one `data:` line each, as evmesh writes them)
/// and their latency, reading whole lines only (the chunked framing's lines are skipped); with
/// `acks`, hands each read's delivery ids (`id:` lines) to the thread's acker.
async fn sse_events(
    mut s: TcpStream,
    mut buf: Vec<u8>,
    measure_from: Instant,
    stop: &AtomicBool,
    mut r: SubResult,
    acks: Option<SseAcks>,
) -> SubResult {
    loop {
        let whole = buf.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        if let Some(acks) = &acks {
            let ids: Vec<String> = buf[..whole]
                .split(|&b| b == b'\n')
                .filter_map(|l| l.strip_prefix(b"id: "))
                .map(|id| String::from_utf8_lossy(id).into_owned())
                .collect();
            if !ids.is_empty() {
                acks.borrow_mut().push_back(ids);
            }
        }
        for line in buf[..whole].split(|&b| b == b'\n').filter(|l| l.starts_with(b"data:")) {
            let now = Instant::now();
            if now >= measure_from {
                r.deliveries += 1;
                if let Some(t) = stamp_of(line) {
                    let _ = r.hist.record(now_micros().saturating_sub(t).max(1));
                }
            }
        }
        buf.drain(..whole);
        if !read_some(&mut s, &mut buf, stop).await {
            return r;
        }
    }
}

/// Runs `n` subscribers on this thread until `stop`; sums their results.
pub fn run(
    addr: SocketAddr,
    host: String,
    path: String,
    n: usize,
    measure_from: Instant,
    stop: Arc<AtomicBool>,
    roles: (bool, bool, bool),
) -> SubResult {
    let mut rt = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new().enable_timer().build().expect("runtime");
    rt.block_on(async move {
        let (host, path) = (Rc::new(host), Rc::new(path));
        // Acked SSE streams ack over HTTP, the thread's streams over one connection.
        let sse_acks = (roles.0 && roles.2).then(SseAcks::default);
        if let Some(acks) = &sse_acks {
            let subscription = query_value(&path, "subscription").unwrap_or_default();
            monoio::spawn(sse_acker(addr, host.clone(), subscription, acks.clone(), stop.clone()));
        }
        // `{i}` in the path: subscriber i's own (a session's, say).
        let tasks: Vec<_> = (0..n)
            .map(|i| {
                let path = path.replace("{i}", &i.to_string());
                let acks = sse_acks.clone();
                monoio::spawn(subscriber(addr, (*host).clone(), path, measure_from, stop.clone(), roles, acks))
            })
            .collect();
        let mut total =
            SubResult { hist: Histogram::new_with_bounds(1, 60_000_000, 3).unwrap(), deliveries: 0, connected: 0 };
        for t in tasks {
            let r = t.await;
            total.hist.add(&r.hist).expect("same bounds");
            total.deliveries += r.deliveries;
            total.connected += r.connected;
        }
        total
    })
}

/// The value of `name` in a path's query (as written: the names loadgen is given need no decoding).
fn query_value(path: &str, name: &str) -> Option<String> {
    let query = path.split_once('?')?.1;
    query.split('&').find_map(|kv| kv.strip_prefix(name)?.strip_prefix('=')).map(str::to_owned)
}
