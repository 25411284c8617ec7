//! Hostile consumers: poison pills that disconnect on every delivery (across a restart), acks
//! naming what does not exist or far too much, and a control plane that must not lose a session
//! change while the data rings are full.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tungstenite::protocol::frame::coding::CloseCode;

use super::super::acked::{dlq, id, publish_to, recv, send, subscribe, Sse, LONG};
use super::super::delivery::{attach, keys, read_until_closed, Ws};
use super::super::util::{request_bytes, wait_for, Client, TestBroker};

fn metric(b: &TestBroker, name: &str) -> u64 {
    let text = b.admin().get("/metrics").text();
    text.lines().filter(|l| l.starts_with(name)).filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok()).sum()
}

/// A WebSocket consumer that takes each delivery and disconnects without acking: every
/// delivery counts, across a kill -9 and restart, and after maxAttempts the event is
/// dead-lettered instead of being handed out again forever.
#[test]
fn a_websocket_poison_pill_is_dead_lettered_across_a_restart() {
    let mut b = TestBroker::start(&["--default-partitions", "1", "--redelivery-backoff-ms", "10"]);
    subscribe(&b, json!({"subscription": "pp", "topic": "pill", "ackTimeoutMs": 600000, "maxAttempts": 3}));
    publish_to(&b, "pill", "poison", None);
    for attempt in 1..=3 {
        if attempt == 3 {
            b.restart(); // attempts are on record before a client sees the event
        }
        let mut ws = attach(&b, "subscription=pp");
        let e = recv(&mut ws, LONG);
        assert_eq!((id(&e), &e["emattempt"]), ("poison", &json!(attempt)), "{e}");
        drop(ws); // gone without an ack
    }
    let dead = wait_for(LONG, || dlq(&b, "pill").pop());
    assert_eq!(id(&dead.1), "poison");
    assert_eq!(dead.1["emdlqattempts"], 3);
    // Settled on the source: a new consumer session gets the next event, not the pill again.
    publish_to(&b, "pill", "fine", None);
    let mut ws = attach(&b, "subscription=pp");
    let e = recv(&mut ws, LONG);
    assert_eq!((id(&e), &e["emattempt"]), ("fine", &json!(1)));
    assert_eq!(dlq(&b, "pill").len(), 1, "dead-lettered once");
}

/// The same over SSE, with a restart between two deliveries.
#[test]
fn an_sse_poison_pill_is_dead_lettered_across_a_restart() {
    let mut b = TestBroker::start(&["--default-partitions", "1", "--redelivery-backoff-ms", "10"]);
    subscribe(&b, json!({"subscription": "sp", "topic": "spill", "ackTimeoutMs": 600000, "maxAttempts": 2}));
    publish_to(&b, "spill", "poison", None);
    for attempt in 1..=2 {
        if attempt == 2 {
            b.restart();
        }
        let mut sse = Sse::open(&b, "subscription=sp", None);
        let (_, e) = sse.next();
        assert_eq!((id(&e), &e["emattempt"]), ("poison", &json!(attempt)), "{e}");
    }
    let dead = wait_for(LONG, || dlq(&b, "spill").pop());
    assert_eq!((id(&dead.1), &dead.1["emdlqattempts"]), ("poison", &json!(2)));
}

/// Acks naming a partition the topic does not have are refused where they arrive (400 over
/// HTTP, 1008 on a WebSocket), and one ack may name at most 10,000 ids; a large descending
/// list within that is settled (linear work: sorted once at the edge).
#[test]
fn acks_naming_what_does_not_exist_or_too_much_are_refused_at_the_edge() {
    let b = TestBroker::start(&["--default-partitions", "2"]);
    subscribe(&b, json!({"subscription": "a", "topic": "acks"}));
    let post = |body: Value| b.client().post("/events/ack", "application/json", body.to_string().as_bytes());
    post(json!({"subscription": "a", "ids": ["7:0:1"]})).assert_problem(400);
    post(json!({"subscription": "a", "ids": ["4294967295:0:1"]})).assert_problem(400);
    let too_many: Vec<String> = (0..10_001).map(|i| format!("0:{i}:1")).collect();
    post(json!({"subscription": "a", "ids": too_many})).assert_problem(400);
    assert!(metric(&b, "evmesh_acks_rejected_total") >= 2);
    let descending: Vec<String> = (0..10_000).rev().map(|i| format!("{}:{i}:1", i % 2)).collect();
    let r = post(json!({"subscription": "a", "ids": descending}));
    assert_eq!(r.status, 200, "{}", r.text());
    let mut ws = attach(&b, "subscription=a");
    send(&mut ws, json!({"type": "ack", "ids": ["9:1:1"]}));
    let (code, _) = read_until_closed(&mut ws, LONG);
    assert_eq!(code, Some(CloseCode::Policy));
    // Nothing was kept for them, and the broker serves on.
    assert_eq!(publish_to(&b, "acks", "after", None).1, 0);
}

/// A session attached under load (the 101 may take a while), then read with short timeouts.
fn attach_patiently(b: &TestBroker, query: &str) -> Ws {
    let stream = std::net::TcpStream::connect(b.traffic).unwrap();
    stream.set_read_timeout(Some(LONG)).unwrap();
    let (ws, _) = tungstenite::client(format!("ws://{}/events/ws?{query}", b.traffic), stream).unwrap();
    ws.get_ref().set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    ws
}

/// With the data rings as small as they go and kept full by cross-core publishes, sessions that
/// come and go must not leave a ghost behind: afterwards one session gets every partition's
/// events at once (a ghost holding a partition would keep its events for the ack timeout).
#[test]
fn full_rings_lose_no_session_change() {
    let b = TestBroker::start(&["--default-partitions", "4", "--mailbox-capacity", "2"]);
    subscribe(&b, json!({"subscription": "g", "topic": "ghost", "ackTimeoutMs": 600000}));
    let keys = keys(4);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flooders: Vec<_> = (0..4)
        .map(|t| {
            let (addr, stop, key) = (b.traffic, stop.clone(), keys[t].clone());
            std::thread::spawn(move || {
                let mut c = Client::connect(addr);
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) && n < 200_000 {
                    let e = json!({"specversion": "1.0", "id": format!("f{t}-{n}"), "source": "/f", "type": "flood", "partitionkey": key});
                    let ce = [("content-type", "application/cloudevents+json")];
                    c.send_raw(&request_bytes("POST", "/events/publish?topic=noise", &ce, e.to_string().as_bytes()));
                    if c.read_response().is_none() {
                        c = Client::connect(addr);
                    }
                    n += 1;
                }
            })
        })
        .collect();
    let churn = Instant::now();
    let mut cycles = 0;
    while churn.elapsed() < Duration::from_secs(3) || cycles < 20 {
        let sessions: Vec<_> = (0..4).map(|_| attach_patiently(&b, "subscription=g")).collect();
        drop(sessions);
        cycles += 1;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for f in flooders {
        f.join().unwrap();
    }
    let mut ws = attach_patiently(&b, "subscription=g");
    for k in &keys {
        publish_to(&b, "ghost", &format!("to-{k}"), Some(k));
    }
    let mut got: Vec<String> = Vec::new();
    let start = Instant::now();
    while got.len() < 4 {
        assert!(start.elapsed() < LONG, "a ghost session holds partitions: got only {got:?}");
        if let Some(e) = super::super::delivery::next_event(&mut ws) {
            got.push(id(&e).to_owned());
        }
    }
    got.sort();
    let mut want: Vec<String> = keys.iter().map(|k| format!("to-{k}")).collect();
    want.sort();
    assert_eq!(got, want);
}
