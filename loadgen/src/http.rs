//! The request loadgen sends and a minimal response reader.

use std::time::Duration;

use monoio::buf::IoBufMut;
use monoio::io::AsyncReadRent;
use monoio::net::TcpStream;

use crate::args::Args;

/// A structured-mode CloudEvent padded to `body_bytes` (or the `--body-file` contents).
pub fn body(args: &Args) -> Vec<u8> {
    if let Some(f) = &args.body_file {
        return std::fs::read(f).expect("--body-file");
    }
    if args.body == "binary" {
        return vec![b'x'; args.body_bytes];
    }
    // The id is a placeholder the publishers overwrite with their send time (see fanout.rs).
    let head = r#"{"specversion":"1.0","id":"t0000000000000000","source":"/loadgen","type":"com.example.load","datacontenttype":"text/plain","data":""#;
    let pad = args.body_bytes.saturating_sub(head.len() + 2);
    let mut b = head.as_bytes().to_vec();
    b.extend(std::iter::repeat_n(b'x', pad));
    b.extend_from_slice(b"\"}");
    if args.body == "batch" {
        let mut all = b"[".to_vec();
        for i in 0..args.batch {
            if i > 0 {
                all.push(b',');
            }
            all.extend_from_slice(&b);
        }
        all.push(b']');
        return all;
    }
    b
}

pub fn build_request(args: &Args) -> Vec<u8> {
    let body = body(args);
    let mut head = format!("POST {} HTTP/1.1\r\nHost: {}\r\nContent-Length: {}\r\n", args.path, args.host, body.len());
    match args.body.as_str() {
        "structured" => head.push_str("Content-Type: application/cloudevents+json\r\n"),
        "batch" => head.push_str("Content-Type: application/cloudevents-batch+json\r\n"),
        "binary" => head.push_str(
            "Content-Type: application/octet-stream\r\nce-specversion: 1.0\r\nce-id: t0000000000000000\r\nce-source: /loadgen\r\nce-type: com.example.load\r\n",
        ),
        _ => head.push_str("Content-Type: application/json\r\n"),
    }
    for h in &args.headers {
        head.push_str(h);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    let mut r = head.into_bytes();
    r.extend_from_slice(&body);
    r
}

fn find_head_end(b: &[u8]) -> Option<usize> {
    b.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

/// Reads one response from `stream` (bytes of a next one stay in `buf`); returns its status.
pub async fn read_response(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<u16> {
    loop {
        if let Some(end) = find_head_end(buf) {
            let head = std::str::from_utf8(&buf[..end]).ok()?;
            let status: u16 = head.split(' ').nth(1)?.parse().ok()?;
            let len: usize = head
                .lines()
                .find_map(|l| {
                    let (n, v) = l.split_once(':')?;
                    n.eq_ignore_ascii_case("content-length").then(|| v.trim().parse().ok())?
                })
                .unwrap_or(0);
            if buf.len() >= end + len {
                buf.drain(..end + len);
                if status == 100 {
                    continue;
                }
                return Some(status);
            }
        }
        buf.reserve(16 * 1024);
        let (len, cap) = (buf.len(), buf.capacity());
        let owned = std::mem::take(buf);
        let (res, slice) =
            monoio::time::timeout(Duration::from_secs(10), stream.read(owned.slice_mut(len..cap))).await.ok()?;
        *buf = slice.into_inner();
        match res {
            Ok(0) | Err(_) => return None,
            Ok(_) => {}
        }
    }
}
