//! Agent streaming calls (`--turns`): one agent attached over `GET /agent/ws`, `--sessions` N
//! sessions each streaming one long turn (`POST /session/stream/{sid}`, server-sent events), and
//! the agent sending chunks at `--rate` per second in all (open loop, round robin over the
//! sessions). Each chunk's data is `t` + 16 digits of µs since the Unix epoch, taken as it is
//! written; the readers measure chunk latency from it, agent's write to the client's read.

use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use monoio::io::{AsyncReadRent, AsyncWriteRentExt, Splitable};
use monoio::net::TcpStream;

use crate::args::Args;
use crate::fanout::{client_text, now_micros, read_some};

pub struct TurnsResult {
    pub hist: Histogram<u64>,
    pub chunks: u64,
    pub sent: u64,
    pub streams: u64,
}

const AGENT: &str = "loadgen-agent";

/// One HTTP exchange on a connection of its own: (status, body).
async fn post(addr: SocketAddr, host: &str, path: &str, body: &str) -> Result<(u16, String), String> {
    let mut s = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: {host}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.into_bytes()).await.0.map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    let stop = AtomicBool::new(false);
    let started = Instant::now();
    // `connection: close`: the answer is everything until the broker closes.
    while read_some(&mut s, &mut buf, &stop).await && started.elapsed() < Duration::from_secs(10) {}
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text.get(9..12).and_then(|s| s.parse().ok()).ok_or(format!("no answer to {path}"))?;
    let body = text.split_once("\r\n\r\n").map_or(String::new(), |(_, b)| b.to_owned());
    Ok((status, body))
}

/// Sends a request and reads up to the end of the head; what came after it stays in the buffer.
async fn exchange(s: &mut TcpStream, req: String, buf: &mut Vec<u8>, stop: &AtomicBool) -> Option<String> {
    s.write_all(req.into_bytes()).await.0.ok()?;
    loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..i]).into_owned();
            buf.drain(..i + 4);
            return Some(head);
        }
        if !read_some(s, buf, stop).await || buf.len() > 16 * 1024 {
            return None;
        }
    }
}

/// One session's stream: counts the chunks whose stamps it reads after `measure_from`.
async fn reader(
    (addr, host): (SocketAddr, Rc<String>),
    sid: String,
    measure_from: Instant,
    stop: Arc<AtomicBool>,
) -> TurnsResult {
    let mut r =
        TurnsResult { hist: Histogram::new_with_bounds(1, 60_000_000, 3).unwrap(), chunks: 0, sent: 0, streams: 0 };
    let Ok(mut s) = TcpStream::connect(addr).await else { return r };
    let req = format!("POST /session/stream/{sid} HTTP/1.1\r\nHost: {host}\r\ncontent-length: 2\r\n\r\ngo");
    let mut buf = Vec::new();
    match exchange(&mut s, req, &mut buf, &stop).await {
        Some(head) if head.starts_with("HTTP/1.1 200") => r.streams = 1,
        _ => return r,
    }
    const MARK: &[u8] = b"data: t";
    loop {
        // Stamps anywhere in what came (chunked framing and all): each is a whole line.
        let mut used = 0;
        while let Some(at) = buf[used..].windows(MARK.len()).position(|w| w == MARK) {
            let from = used + at + MARK.len();
            let Some(digits) = buf.get(from..from + 16) else { break };
            used = from + 16;
            if Instant::now() >= measure_from {
                r.chunks += 1;
                if let Some(t) = std::str::from_utf8(digits).ok().and_then(|d| d.parse::<u64>().ok()) {
                    let _ = r.hist.record(now_micros().saturating_sub(t).max(1));
                }
            }
        }
        // Keep a tail that may hold the start of the next stamp.
        let keep = buf.len().saturating_sub(used).min(MARK.len() + 16);
        buf.drain(..buf.len() - keep);
        if !read_some(&mut s, &mut buf, &stop).await {
            return r;
        }
    }
}

/// Runs the agent, the sessions and their readers until `stop`.
pub fn run(args: &Args, measure_from: Instant, until: Instant, stop: Arc<AtomicBool>) -> TurnsResult {
    let mut rt = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new().enable_timer().build().expect("runtime");
    let (addr, host, sessions, rate) = (args.addr, Rc::new(args.host.clone()), args.sessions, args.rate);
    rt.block_on(async move {
        let reg = post(addr, &host, "/agent/register", &format!(r#"{{"agentId":"{AGENT}"}}"#)).await;
        assert!(matches!(reg, Ok((200 | 201, _))), "registering the agent: {reg:?}");
        let mut agent = TcpStream::connect(addr).await.expect("connect");
        let _ = agent.set_nodelay(true);
        let ws = format!(
            "GET /agent/ws?agentId={AGENT} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        );
        let mut abuf = Vec::new();
        let head = exchange(&mut agent, ws, &mut abuf, &stop).await.unwrap_or_default();
        assert!(head.starts_with("HTTP/1.1 101"), "attaching the agent: {head}");
        let mut sids = Vec::with_capacity(sessions);
        for _ in 0..sessions {
            let open = post(addr, &host, "/session/open", &format!(r#"{{"clientId":"lg","agentId":"{AGENT}"}}"#)).await;
            let body = match open {
                Ok((201, body)) => body,
                other => panic!("opening a session: {other:?}"),
            };
            let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
            sids.push(v["sessionId"].as_str().expect("sessionId").to_owned());
        }
        let readers: Vec<_> = sids
            .iter()
            .map(|sid| monoio::spawn(reader((addr, host.clone()), sid.clone(), measure_from, stop.clone())))
            .collect();
        // The agent's socket: what the broker sends it (the turns' requests, pings) is read and
        // dropped by a task of its own, so the broker never waits on it.
        let (mut rd, mut wr) = agent.into_split();
        let drain_stop = stop.clone();
        monoio::spawn(async move {
            let mut buf = vec![0u8; 64 * 1024];
            while !drain_stop.load(Ordering::Relaxed) {
                let (res, b) = rd.read(buf).await;
                buf = b;
                if !matches!(res, Ok(n) if n > 0) {
                    return;
                }
            }
        });
        // Open loop: the i-th chunk is due at t0 + i / rate; whatever is due goes in one write.
        let t0 = Instant::now();
        let mut sent: u64 = 0;
        let mut out = Vec::with_capacity(64 * 1024);
        let mut text = Vec::with_capacity(256);
        while Instant::now() < until {
            let due = (t0.elapsed().as_secs_f64() * rate) as u64;
            while sent < due {
                let sid = &sids[(sent % sids.len() as u64) as usize];
                text.clear();
                text.extend_from_slice(
                    format!(r#"{{"type":"chunk","sessionId":"{sid}","data":"t{:016}"}}"#, now_micros()).as_bytes(),
                );
                client_text(&text, &mut out);
                sent += 1;
            }
            if !out.is_empty() {
                let (res, back) = wr.write_all(std::mem::take(&mut out)).await;
                if res.is_err() {
                    break;
                }
                out = back;
                out.clear();
            }
            let next = t0 + Duration::from_secs_f64((sent + 1) as f64 / rate);
            monoio::time::sleep(next.saturating_duration_since(Instant::now())).await;
        }
        // The turns end; the readers' streams with them.
        for sid in &sids {
            client_text(format!(r#"{{"type":"chunk","sessionId":"{sid}","done":true}}"#).as_bytes(), &mut out);
        }
        let _ = wr.write_all(out).await;
        monoio::time::sleep(Duration::from_millis(300)).await;
        stop.store(true, Ordering::Relaxed);
        let mut total =
            TurnsResult { hist: Histogram::new_with_bounds(1, 60_000_000, 3).unwrap(), chunks: 0, sent, streams: 0 };
        for r in readers {
            let r = r.await;
            total.hist.add(&r.hist).expect("same bounds");
            total.chunks += r.chunks;
            total.streams += r.streams;
        }
        total
    })
}
