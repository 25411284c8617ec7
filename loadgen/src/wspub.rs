//! `--ws`: publishers over WebSocket (`GET /events/ws?publish=T`), one structured event per text
//! message, `--pipeline K` messages sent before their K answers are read (closed loop per
//! connection; with `--rate`, each group of K is scheduled as one request is).

use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use monoio::buf::IoBufMut;
use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use monoio::net::TcpStream;

use crate::args::Args;
use crate::ThreadResult;

/// Reads more bytes onto `buf`; false when the connection ended.
pub async fn read_more(s: &mut TcpStream, buf: &mut Vec<u8>) -> bool {
    buf.reserve(16 * 1024);
    let (len, cap) = (buf.len(), buf.capacity());
    let owned = std::mem::take(buf);
    let (res, slice) = s.read(owned.slice_mut(len..cap)).await;
    *buf = slice.into_inner();
    matches!(res, Ok(n) if n > 0)
}

/// The length of the whole server frame at the front of `buf`, if it is all there.
fn frame_len(buf: &[u8]) -> Option<(usize, usize)> {
    let b1 = *buf.get(1)? as usize & 0x7f;
    let (head, len) = match b1 {
        126 => (4, u16::from_be_bytes(buf.get(2..4)?.try_into().ok()?) as usize),
        127 => (10, u64::from_be_bytes(buf.get(2..10)?.try_into().ok()?) as usize),
        n => (2, n),
    };
    (buf.len() >= head + len).then_some((head, head + len))
}

pub async fn connection(
    args: Rc<Args>,
    body: Rc<Vec<u8>>,
    interval: Option<Duration>,
    (start, measure_from, end): (Instant, Instant, Instant),
    stop: Arc<AtomicBool>,
) -> ThreadResult {
    let mut r = ThreadResult::new();
    let Ok(mut stream) = TcpStream::connect(args.addr).await else {
        r.connect_errors += 1;
        return r;
    };
    let _ = stream.set_nodelay(true);
    let hello = format!(
        "GET {} HTTP/1.1\r\nHost: {}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: cloudevents.json\r\n\r\n",
        args.path, args.host
    );
    let (res, _) = stream.write_all(hello.into_bytes()).await;
    let mut buf = Vec::with_capacity(16 * 1024);
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if res.is_err() || !read_more(&mut stream, &mut buf).await {
            r.connect_errors += 1;
            return r;
        }
    };
    if !buf.starts_with(b"HTTP/1.1 101") {
        r.connect_errors += 1;
        return r;
    }
    buf.drain(..head_end);
    let k = args.pipeline.max(1);
    let mut one = Vec::new();
    crate::fanout::client_text(&body, &mut one);
    let published = |frame: &[u8]| frame.windows(11).any(|w| w == b"\"published\"");
    let answer = |buf: &[u8]| frame_len(buf).map(|(head, len)| (len, published(&buf[head..len])));
    pipelined(&mut stream, buf, one.repeat(k), k, answer, interval, (start, measure_from, end), &stop, r).await
}

/// Sends `group` (`k` messages) and reads their `k` answers, again and again (closed loop, or
/// each group scheduled at `interval`), counting the answers `answer` says are successes (it
/// gives the length of the whole answer at the front of the buffer, once it is all there).
#[allow(clippy::too_many_arguments)]
pub async fn pipelined(
    stream: &mut TcpStream,
    mut buf: Vec<u8>,
    group: Vec<u8>,
    k: usize,
    answer: impl Fn(&[u8]) -> Option<(usize, bool)>,
    interval: Option<Duration>,
    (start, measure_from, end): (Instant, Instant, Instant),
    stop: &AtomicBool,
    mut r: ThreadResult,
) -> ThreadResult {
    let mut out = Vec::with_capacity(group.len());
    let mut n: u64 = 0;
    loop {
        let scheduled = crate::scheduled(interval, start, n).await;
        if scheduled >= end || stop.load(Ordering::Relaxed) {
            return r;
        }
        n += 1;
        out.clear();
        out.extend_from_slice(&group);
        let (res, back) = stream.write_all(std::mem::take(&mut out)).await;
        out = back;
        if res.is_err() {
            r.errors += 1;
            return r;
        }
        let mut answered = 0;
        while answered < k {
            let Some((len, ok)) = answer(&buf) else {
                if !read_more(stream, &mut buf).await {
                    r.errors += 1;
                    return r;
                }
                continue;
            };
            buf.drain(..len);
            answered += 1;
            if scheduled >= measure_from {
                if ok {
                    r.ok += 1;
                    let us = Instant::now().duration_since(scheduled).as_micros() as u64;
                    let _ = r.hist.record(us.max(1));
                } else {
                    r.errors += 1;
                }
            }
        }
    }
}
