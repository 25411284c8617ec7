//! HTTP framing attacks: long chunk extensions, endless trailers, framing RFC 9112 forbids, and
//! a client that pipelines but never reads. Each case asserts the answer (a problem, then a
//! close) and the bound that holds: bytes taken in, the broker's memory, the connection's life.

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use crate::it::util::{event, rss_bytes, wait_for, Client, Resp, TestBroker};

const CE: &str = "application/cloudevents+json";

/// A chunked publish request's head.
const CHUNKED_HEAD: &[u8] = b"POST /events/publish?topic=t HTTP/1.1\r\nhost: t\r\n\
content-type: application/cloudevents+json\r\ntransfer-encoding: chunked\r\n\r\n";

/// The most the broker's resident memory may grow while an attacker streams `ATTACK_BYTES`:
/// a few request budgets (1 MiB + 16 KiB by default), far below what the attacker sends.
const RSS_SLACK: u64 = 8 << 20;
const ATTACK_BYTES: usize = 50 << 20;

/// A broker that has already served a publish, so its resident memory reads as settled.
fn warm_broker(extra: &[&str]) -> TestBroker {
    let b = TestBroker::start(extra);
    assert_eq!(b.publish("t", &event("warm")).status, 202);
    b
}

struct Attack {
    response: Option<Resp>,
    /// Whether the connection ended (EOF) after the response.
    closed: bool,
    sent: usize,
    rss_growth: u64,
}

/// Sends `head`, then `piece` over and over until the broker stops taking bytes or
/// `ATTACK_BYTES` are sent, sampling the broker's resident memory meanwhile; reads the answer
/// on this thread.
fn stream_attack(b: &TestBroker, head: &[u8], piece: &[u8]) -> Attack {
    let pid = b.pid();
    let before = b.rss_bytes();
    let mut c = b.client();
    let mut writer = c.stream.try_clone().unwrap();
    // A broker that stopped reading without closing must not hang the test: the write fails.
    writer.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    let piece = piece.to_vec();
    let head = head.to_vec();
    let sender = std::thread::spawn(move || {
        let mut sent = 0;
        let mut peak = rss_bytes(pid);
        if writer.write_all(&head).is_err() {
            return (sent, peak);
        }
        let batch = piece.repeat((64 << 10) / piece.len() + 1);
        while sent < ATTACK_BYTES {
            if writer.write_all(&batch).is_err() {
                break;
            }
            sent += batch.len();
            peak = peak.max(rss_bytes(pid));
        }
        (sent, peak)
    });
    let response = c.read_response();
    let closed = response.is_some() && c.read_response().is_none();
    let (sent, peak) = sender.join().unwrap();
    let peak = peak.max(b.rss_bytes());
    Attack { response, closed, sent, rss_growth: peak.saturating_sub(before) }
}

fn assert_refused(a: &Attack, status: u16) {
    let r = a.response.as_ref().expect("a problem response before the close");
    r.assert_problem(status);
    assert!(a.closed, "the connection is closed after the {status}");
    assert!(a.sent < ATTACK_BYTES, "the broker stopped taking the attacker's bytes ({} sent)", a.sent);
    assert!(a.rss_growth < RSS_SLACK, "broker memory grew by {} bytes during the attack", a.rss_growth);
}

/// The broker is alive and serving others.
fn still_serving(b: &mut TestBroker) {
    assert_eq!(b.exited(), None, "the broker is still running");
    assert_eq!(b.publish("t", &event("after")).status, 202);
}

/// The hostile suite's finding: 1-byte chunks, each with a 1000-byte extension, were buffered
/// (151 MB) and then accepted. Extensions are now bounded in total (max_header_bytes, 413).
#[test]
fn one_byte_chunks_with_long_extensions_are_refused_early() {
    let mut b = warm_broker(&[]);
    let mut piece = b"1;".to_vec();
    piece.extend(std::iter::repeat_n(b'e', 999));
    piece.extend_from_slice(b"\r\nx\r\n");
    let a = stream_attack(&b, CHUNKED_HEAD, &piece);
    assert_refused(&a, 413);
    still_serving(&mut b);
}

/// 1-byte chunks stay under the body limit for long (6 bytes sent per byte of data); the raw
/// budget of a request (max_header_bytes + max_body_bytes, framing included) ends them.
#[test]
fn chunk_framing_counts_against_the_request_budget() {
    let mut b = warm_broker(&[]);
    let a = stream_attack(&b, CHUNKED_HEAD, b"1\r\nx\r\n");
    assert_refused(&a, 413);
    let detail = a.response.as_ref().unwrap().json()["detail"].as_str().unwrap().to_owned();
    assert!(detail.contains("request too large"), "{detail}");
    still_serving(&mut b);
}

/// The hostile suite's finding: a `0` chunk then endless trailer lines, 178 MB buffered before
/// the request deadline. Trailers are bounded in total (max_header_bytes, 431).
#[test]
fn endless_trailers_are_refused_early() {
    let mut b = warm_broker(&[]);
    let mut head = CHUNKED_HEAD.to_vec();
    head.extend_from_slice(b"1\r\nx\r\n0\r\n");
    let a = stream_attack(&b, &head, b"x-trailer: some value\r\n");
    assert_refused(&a, 431);
    still_serving(&mut b);
}

/// `body` as chunks of at most `size` bytes, each with `ext` after its size, then `end`.
fn chunked(body: &[u8], size: usize, ext: &str, end: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for part in body.chunks(size) {
        out.extend_from_slice(format!("{:x}{ext}\r\n", part.len()).as_bytes());
        out.extend_from_slice(part);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(end);
    out
}

/// What RFC 9112 allows still works: extensions (tokens, quoted strings, whitespace around
/// `;` and `=`), trailers, upper-case hex.
#[test]
fn valid_chunked_framing_is_accepted() {
    let b = TestBroker::start(&[]);
    let ev = event("chunked").to_string();
    let mut c = b.client();
    let mut req = CHUNKED_HEAD.to_vec();
    req.extend(chunked(ev.as_bytes(), 10, " ; a = \"q \\\" s\" ;b", b"0;end\r\nx-sum: 1\r\nx-e:\r\n\r\n"));
    c.send_raw(&req);
    assert_eq!(c.read_response().unwrap().status, 202);
    // Upper-case hex with leading zeros.
    let mut req = CHUNKED_HEAD.to_vec();
    req.extend_from_slice(format!("00{:X}\r\n", ev.len()).as_bytes());
    req.extend_from_slice(ev.as_bytes());
    req.extend_from_slice(b"\r\n0\r\n\r\n");
    c.send_raw(&req);
    assert_eq!(c.read_response().unwrap().status, 202, "same connection, kept alive");
}

/// Each framing RFC 9112 forbids is 400 with a problem body, then the connection is closed, even
/// though the event inside is valid.
#[test]
fn forbidden_framing_is_400_then_closed() {
    let mut b = TestBroker::start(&[]);
    let ev = event("framing").to_string();
    let ev = ev.as_bytes();
    let with_head = |body: Vec<u8>| [CHUNKED_HEAD.to_vec(), body].concat();
    let mut cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "transfer-encoding on HTTP/1.0",
            [
                b"POST /events/publish?topic=t HTTP/1.0\r\ncontent-type: application/cloudevents+json\r\n\
                  transfer-encoding: chunked\r\n\r\n"
                    .to_vec(),
                chunked(ev, 64, "", b"0\r\n\r\n"),
            ]
            .concat(),
        ),
        ("bare LF after a chunk size", with_head(b"5\nhello\r\n0\r\n\r\n".to_vec())),
        ("bare LF after chunk data", with_head(bare_lf_after_first_data(chunked(ev, 1000, "", b"0\r\n\r\n")))),
        ("bare LF ending the body", with_head(chunked(ev, 1000, "", b"0\r\n\n"))),
        ("CR inside a chunk extension", with_head(chunked(ev, 1000, ";a\rb", b"0\r\n\r\n"))),
        ("size CR CR LF", with_head(chunked(ev, 1000, "\r", b"0\r\n\r\n"))),
        ("control character in a chunk extension", with_head(chunked(ev, 1000, ";a=\x01", b"0\r\n\r\n"))),
        ("space after the size", with_head(chunked(ev, 1000, " ", b"0\r\n\r\n"))),
        ("garbage trailer line", with_head(chunked(ev, 1000, "", b"0\r\ngarbage\r\n\r\n"))),
        ("folded trailer line", with_head(chunked(ev, 1000, "", b"0\r\nx-a: 1\r\n  2\r\n\r\n"))),
    ];
    // A broken request after a good one on the same connection: the good one is answered.
    let mut pipelined = crate::it::util::request_bytes("POST", "/events/publish?topic=t", &[("content-type", CE)], ev);
    pipelined.extend(with_head(b"5\r\nhello\n0\r\n\r\n".to_vec()));
    cases.push(("pipelined after a valid request", pipelined));
    for (name, bytes) in cases {
        let mut c = b.client();
        c.send_raw(&bytes);
        let mut r = c.read_response().unwrap_or_else(|| panic!("{name}: no response"));
        if name.starts_with("pipelined") {
            assert_eq!(r.status, 202, "{name}");
            r = c.read_response().unwrap_or_else(|| panic!("{name}: no second response"));
        }
        assert_eq!(r.status, 400, "{name}: {}", r.text());
        r.assert_problem(400);
        assert!(c.read_response().is_none(), "{name}: the connection is closed after the 400");
    }
    still_serving(&mut b);
}

/// Turns the CRLF after the first chunk's data into a bare LF.
fn bare_lf_after_first_data(mut body: Vec<u8>) -> Vec<u8> {
    let size_end = body.windows(2).position(|w| w == b"\r\n").unwrap();
    let size = usize::from_str_radix(std::str::from_utf8(&body[..size_end]).unwrap(), 16).unwrap();
    assert_eq!(body.remove(size_end + 2 + size), b'\r');
    body
}

/// A client that pipelines requests and never reads the answers: once the socket buffers are
/// full the broker's write stalls, and after write_timeout_ms it closes the connection instead
/// of holding it (and the responses) forever.
#[test]
fn a_client_that_never_reads_is_disconnected_after_the_write_timeout() {
    let b = TestBroker::start(&["--write-timeout-ms", "300"]);
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    // Small before connecting, so the advertised window stays small.
    sock.set_recv_buffer_size(4096).unwrap();
    sock.connect(&b.traffic.into()).unwrap();
    let mut s = TcpStream::from(sock);
    s.set_write_timeout(Some(Duration::from_millis(200))).unwrap();
    let batch = b"GET /nowhere HTTP/1.1\r\nhost: t\r\n\r\n".repeat(100);
    let mut sent = 0usize;
    let error = wait_for(Duration::from_secs(60), || match s.write(&batch) {
        Ok(n) => {
            sent += n;
            None
        }
        // The broker is not reading: it is stuck writing to us. Keep trying.
        Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => None,
        Err(e) => Some(e),
    });
    assert!(matches!(error.kind(), std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe), "{error}");
    assert!(sent > 0);
    // Others are served meanwhile and afterwards.
    let mut other = Client::connect(b.traffic);
    other.get("/nowhere").assert_problem(404);
}
