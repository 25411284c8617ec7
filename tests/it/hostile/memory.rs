//! Bytes held for clients are bounded: consumers read ahead lazily and by bytes, so many new
//! consumers of a backlog of large events, or sessions that never read, do not pin memory.

use std::time::Duration;

use serde_json::json;

use super::super::acked::{send, subscribe};
use super::super::delivery::attach;
use super::super::util::{event, TestBroker};

/// A backlog of large events on one partition.
fn backlog(b: &TestBroker, topic: &str, n: usize, size: usize) {
    let mut c = b.client();
    for i in 0..n {
        let mut e = event(&format!("big{i}"));
        e["data"] = json!("x".repeat(size));
        let r =
            c.post(&format!("/events/publish?topic={topic}"), "application/cloudevents+json", e.to_string().as_bytes());
        assert_eq!(r.status, 202, "{}", r.text());
    }
}

const MB: u64 = 1 << 20;

/// 30 long-polls, each a new clientId of a BROADCAST subscription with a backlog of 60 events of
/// 200 KB: each poll session may hold one session_window_bytes (1 MiB) of it, not its window of
/// 256 events (the measured bug pinned 1.8 GB for 30 s).
#[test]
fn new_poll_consumers_of_a_large_backlog_hold_a_byte_window_each() {
    let b = TestBroker::start(&["--default-partitions", "1", "--max-body-bytes", "1048576"]);
    subscribe(&b, json!({"subscription": "bb", "topic": "big", "mode": "BROADCAST", "start": "earliest"}));
    backlog(&b, "big", 60, 200_000);
    let before = b.rss_bytes();
    let mut largest = 0;
    for i in 0..30 {
        let r = b.client().get(&format!("/events/poll?subscription=bb&clientId=p{i}&max=1000&waitMs=2000"));
        assert_eq!(r.status, 200);
        largest = largest.max(r.body.len());
    }
    let grown = b.rss_bytes().saturating_sub(before);
    assert!(largest < 2 * MB as usize, "a poll answer holds about one byte window: {largest}");
    assert!(grown < 150 * MB, "30 new consumers pinned {} MB", grown / MB);
}

/// Acked WebSocket sessions that raise their credit to 4096 and never read hold at most their
/// byte window of a 300 x 100 KB backlog each.
#[test]
fn sessions_that_never_read_hold_a_byte_window_each() {
    let b = TestBroker::start(&["--default-partitions", "1"]);
    subscribe(&b, json!({"subscription": "nr", "topic": "nr", "mode": "BROADCAST", "start": "earliest"}));
    backlog(&b, "nr", 300, 100_000);
    let before = b.rss_bytes();
    let mut sessions = Vec::new();
    for i in 0..10 {
        let mut ws = attach(&b, &format!("subscription=nr&clientId=r{i}"));
        send(&mut ws, json!({"type": "credit", "n": 4096}));
        sessions.push(ws);
    }
    // Watch the broker while the owners push what the windows allow: its peak is the bound.
    let mut peak = 0;
    let start = std::time::Instant::now();
    while start.elapsed() < Duration::from_secs(2) {
        peak = peak.max(b.rss_bytes());
        std::thread::sleep(Duration::from_millis(50));
    }
    let grown = peak.saturating_sub(before);
    assert!(grown < 100 * MB, "10 non-reading sessions pinned {} MB", grown / MB);
    drop(sessions);
}

/// Over memory_limit_bytes the broker refuses new work with 503 + Retry-After (it sheds, it
/// does not grow), and says so in /metrics.
#[test]
fn over_the_memory_limit_new_work_is_shed() {
    // A limit below what any process holds: the broker is over it from the start.
    let b = TestBroker::start(&["--memory-limit-bytes", "1048576"]);
    let r = super::super::util::wait_for(Duration::from_secs(10), || {
        let r = b.publish("t", &event("x"));
        (r.status == 503).then_some(r)
    });
    r.assert_problem(503);
    assert_eq!(r.header("retry-after"), Some("1"));
    let poll = b.client().get("/events/poll?subscription=nope");
    poll.assert_problem(503);
    let metrics = b.admin().get("/metrics").text();
    let shed: u64 =
        metrics.lines().find_map(|l| l.strip_prefix("evmesh_memory_shed_total ")).and_then(|v| v.parse().ok()).unwrap();
    assert!(shed >= 2, "{metrics}");
    assert!(metrics.contains("evmesh_memory_limit_bytes 1048576"));
    assert_eq!(b.admin().get("/readyz").status, 200, "shedding is not unreadiness");
}

/// A live (`ack=none`) session that does not read is closed with 1008 once it holds 8 MiB of
/// queued events, long before its 1024-frame queue is full (1024 large events would pin 1 GiB).
#[test]
fn a_live_session_that_does_not_read_is_closed_at_its_byte_bound() {
    let b = TestBroker::start(&["--shards", "1"]);
    subscribe(&b, json!({"subscription": "live", "topic": "lv", "mode": "BROADCAST"}));
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    sock.connect(&b.traffic.into()).unwrap();
    let stream: std::net::TcpStream = sock.into();
    stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let (mut ws, _) =
        tungstenite::client(format!("ws://{}/events/ws?subscription=live&ack=none", b.traffic), stream).unwrap();
    // One shard: the interest is registered before the 101 is answered, so nothing is missed.
    backlog(&b, "lv", 40, 500_000);
    let mut events = 0;
    let code = loop {
        match ws.read() {
            Ok(tungstenite::Message::Text(_)) => events += 1,
            Ok(tungstenite::Message::Close(f)) => break f.map(|f| u16::from(f.code)),
            Ok(_) => {}
            Err(e) => panic!("no close frame after {events} events: {e}"),
        }
    };
    assert_eq!(code, Some(1008));
    assert!(events < 40, "closed before all 20 MB were queued for it, got {events}");
}
