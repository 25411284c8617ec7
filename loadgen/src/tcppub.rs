//! `--eventmesh-tcp`: publishers over EventMesh's classic TCP protocol (the frames of its Java
//! codec: `EventMesh0000`, the length 13 + header + body, the header length, the header's JSON,
//! the body), one HELLO per connection, then one structured CloudEvent (its `subject` the topic,
//! the URL's path) per ASYNC_MESSAGE_TO_SERVER, `--pipeline K` sent before their K answers are
//! read (closed loop per connection; with `--rate`, each group of K is scheduled as one request).

use std::rc::Rc;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use monoio::io::AsyncWriteRentExt;
use monoio::net::TcpStream;

use crate::args::Args;
use crate::ThreadResult;

fn frame(cmd: &str, seq: u64, properties: &str, body: &[u8]) -> Vec<u8> {
    let h = format!(r#"{{"cmd":"{cmd}","code":0,"seq":"{seq}","properties":{properties}}}"#).into_bytes();
    let mut f = b"EventMesh0000".to_vec();
    f.extend_from_slice(&((13 + h.len() + body.len()) as i32).to_be_bytes());
    f.extend_from_slice(&(h.len() as i32).to_be_bytes());
    f.extend_from_slice(&h);
    f.extend_from_slice(body);
    f
}

/// The whole package at the front of `buf` (its length, and whether its header says code 0).
fn package(buf: &[u8]) -> Option<(usize, bool)> {
    let total = i32::from_be_bytes(buf.get(13..17)?.try_into().ok()?) as usize + 8;
    let hlen = i32::from_be_bytes(buf.get(17..21)?.try_into().ok()?) as usize;
    let header = buf.get(21..21 + hlen)?;
    (buf.len() >= total).then(|| (total, header.windows(8).any(|w| w == b"\"code\":0")))
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
    let ua = r#"{"subsystem":"5023","pid":1,"version":"2.0","group":"loadgen","purpose":"pub","idc":"FT"}"#;
    let (res, _) = stream.write_all(frame("HELLO_REQUEST", 0, "{}", ua.as_bytes())).await;
    let mut buf = Vec::with_capacity(16 * 1024);
    loop {
        if let Some((len, ok)) = package(&buf) {
            buf.drain(..len);
            if !ok {
                r.connect_errors += 1;
                return r;
            }
            break;
        }
        if res.is_err() || !crate::wspub::read_more(&mut stream, &mut buf).await {
            r.connect_errors += 1;
            return r;
        }
    }
    // The event with its topic as `subject`.
    let topic = args.path.trim_start_matches('/');
    let mut event = format!(r#"{{"subject":"{topic}","#).into_bytes();
    event.extend_from_slice(&body[1..]);
    let props = r#"{"protocoltype":"cloudevents","protocolversion":"1.0","protocoldesc":"tcp"}"#;
    let k = args.pipeline.max(1);
    let group: Vec<u8> = (0..k as u64).flat_map(|i| frame("ASYNC_MESSAGE_TO_SERVER", i, props, &event)).collect();
    crate::wspub::pipelined(&mut stream, buf, group, k, package, interval, (start, measure_from, end), &stop, r).await
}
