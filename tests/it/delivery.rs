//! Live fan-out to WebSocket sessions (`ack=none`, BROADCAST), against tungstenite clients.

use std::collections::{HashMap, HashSet};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tungstenite::protocol::frame::coding::CloseCode;
use tungstenite::{Message, WebSocket};

use super::request::metric;
use super::util::{event, TestBroker};

pub(super) type Ws = WebSocket<TcpStream>;

pub(super) fn attach(b: &TestBroker, query: &str) -> Ws {
    let stream = TcpStream::connect(b.traffic).unwrap();
    // The upgrade may wait (over Kafka, for a new home's claim to be read back); reads after
    // it time out quickly, so tests can poll.
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let (ws, _) = tungstenite::client(format!("ws://{}/events/ws?{query}", b.traffic), stream).unwrap();
    ws.get_ref().set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    ws
}

/// The next event, or None after a quiet read timeout.
pub(super) fn next_event(ws: &mut Ws) -> Option<Value> {
    match ws.read() {
        Ok(Message::Text(t)) => Some(serde_json::from_str(t.as_str()).unwrap()),
        // Keepalive pings (answered by tungstenite) are not events.
        Ok(Message::Ping(_) | Message::Pong(_)) => None,
        Ok(other) => panic!("unexpected {other:?}"),
        Err(tungstenite::Error::Io(e))
            if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) =>
        {
            None
        }
        Err(e) => panic!("{e}"),
    }
}

/// Reads until the session ends: `Some(code)` for a close frame, `None` for a dropped socket;
/// counts the events read on the way.
pub(super) fn read_until_closed(ws: &mut Ws, limit: Duration) -> (Option<CloseCode>, usize) {
    let start = Instant::now();
    let mut events = 0;
    loop {
        assert!(start.elapsed() < limit, "the session was never closed");
        match ws.read() {
            Ok(Message::Text(_)) => events += 1,
            Ok(Message::Close(f)) => return (f.map(|f| f.code), events),
            Ok(_) => {}
            Err(tungstenite::Error::Io(e))
                if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => return (None, events),
        }
    }
}

/// A key for each of `n` partitions, by Kafka's partitioner.
pub(super) fn keys(n: u32) -> Vec<String> {
    let mut out: Vec<Option<String>> = vec![None; n as usize];
    for i in 0.. {
        let k = format!("key{i}");
        let p = evmesh::model::placement::partition_for_key(k.as_bytes(), n).0 as usize;
        out[p].get_or_insert(k);
        if out.iter().all(Option::is_some) {
            return out.into_iter().map(Option::unwrap).collect();
        }
    }
    unreachable!()
}

fn publish(b: &TestBroker, id: &str, ty: &str, key: &str) {
    let mut e = event(id);
    e["type"] = json!(ty);
    e["partitionkey"] = json!(key);
    assert_eq!(b.publish("news", &e).status, 202);
}

#[test]
fn broadcast_sessions_get_every_matching_event_once_per_shard_fan_out() {
    let b = TestBroker::start(&["--default-partitions", "4"]);
    let def = json!({"subscription": "fan", "topic": "news", "mode": "BROADCAST", "filters": [{"prefix": {"type": "com.news."}}]});
    assert_eq!(b.client().post("/events/subscribe", "application/json", def.to_string().as_bytes()).status, 201);
    let mut clients: Vec<Ws> = (0..3).map(|_| attach(&b, "subscription=fan&ack=none")).collect();
    let keys = keys(4);
    // Interest reaches every partition owner asynchronously: publish markers to every partition
    // until every client has seen one from each.
    let mut seen: Vec<HashSet<u64>> = vec![HashSet::new(); clients.len()];
    let start = Instant::now();
    let mut round = 0;
    while seen.iter().any(|s| s.len() < 4) {
        assert!(start.elapsed() < Duration::from_secs(20), "sessions never attached everywhere: {seen:?}");
        for k in &keys {
            publish(&b, &format!("marker-{round}-{k}"), "com.news.marker", k);
        }
        round += 1;
        for (c, s) in clients.iter_mut().zip(seen.iter_mut()) {
            while let Some(e) = next_event(c) {
                s.insert(e["empartition"].as_u64().unwrap());
            }
        }
    }
    // The real traffic: 20 matching events, 10 filtered out, then an end marker per partition.
    for i in 0..30 {
        let ty = if i % 3 == 2 { "com.other.item" } else { "com.news.item" };
        publish(&b, &format!("item-{i}"), ty, &keys[i % 4]);
    }
    for k in &keys {
        publish(&b, &format!("end-{k}"), "com.news.end", k);
    }
    for c in clients.iter_mut() {
        let mut items = HashMap::new();
        let mut ends = 0;
        let start = Instant::now();
        while ends < 4 {
            assert!(start.elapsed() < Duration::from_secs(20), "missing events: {items:?}, {ends} ends");
            let Some(e) = next_event(c) else { continue };
            let ty = e["type"].as_str().unwrap();
            assert_ne!(ty, "com.other.item", "filtered events are not delivered");
            assert_eq!(e["emattempt"], 1);
            assert!(e["emdeliveryid"].is_string() && e["emoffset"].is_string());
            let p = e["empartition"].as_u64().unwrap();
            assert_eq!(e["partitionkey"], json!(keys[p as usize]), "empartition is the event's partition");
            match ty {
                "com.news.item" => {
                    assert!(items.insert(e["id"].as_str().unwrap().to_string(), p).is_none(), "delivered once")
                }
                "com.news.end" => ends += 1,
                _ => {}
            }
        }
        assert_eq!(items.len(), 20);
    }
    // Every queued delivery is counted where its session lives.
    let metrics = b.admin().get("/metrics").text();
    let delivered: u64 = metrics
        .lines()
        .filter(|l| l.starts_with("evmesh_deliveries_total{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert!(delivered >= 3 * 24, "{delivered} deliveries counted");
    // Removing the subscription closes every attached session cleanly.
    let r = b.client().post("/events/unsubscribe", "application/json", br#"{"subscription":"fan"}"#);
    assert_eq!(r.status, 200);
    for c in clients.iter_mut() {
        assert_eq!(read_until_closed(c, Duration::from_secs(10)).0, Some(CloseCode::Normal));
    }
}

#[test]
fn delivery_requests_are_checked_and_refused_clearly() {
    let b = TestBroker::start(&[]);
    for (name, mode) in [("lb", "LOAD_BALANCE"), ("bc", "BROADCAST"), ("mc", "MULTICAST")] {
        let def = json!({"subscription": name, "topic": "t", "mode": mode});
        assert_eq!(b.client().post("/events/subscribe", "application/json", def.to_string().as_bytes()).status, 201);
    }
    let upgrade = [
        ("upgrade", "websocket"),
        ("connection", "upgrade"),
        ("sec-websocket-version", "13"),
        ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
    ];
    let ws = |q: &str| b.client().request("GET", &format!("/events/ws?{q}"), &upgrade, b"");
    ws("subscription=nope&ack=none").assert_problem(404);
    assert_eq!(ws("subscription=bc").status, 101, "acknowledged BROADCAST sessions exist");
    ws("subscription=lb&ack=none").assert_problem(400);
    ws("subscription=bc&ack=maybe").assert_problem(400);
    ws("subscription=bc&clientId=a%23b").assert_problem(400);
    ws("subscription=lb&sql=type%3D%27x%27").assert_problem(400);
    ws("subscription=mc&sql=type%20%3D").assert_problem(400);
    ws("subscription=mc&filters=%7B%7D").assert_problem(400);
    // The window set with the attach is the credit message's: 0..=4096, acked sessions only.
    ws("subscription=lb&credit=4097").assert_problem(400);
    ws("subscription=lb&credit=-1").assert_problem(400);
    ws("subscription=bc&ack=none&credit=8").assert_problem(400);
    assert_eq!(ws("subscription=lb&credit=4096").status, 101);
    b.client().request("GET", "/events/ws", &upgrade, b"").assert_problem(400);
    b.client().post("/events/ws?subscription=bc", "application/json", b"{}").assert_problem(405);
    b.client().get("/events/sse?subscription=nope").assert_problem(404);
    b.client().get("/events/sse?subscription=bc&ack=none").assert_problem(400);
    b.client().get("/events/poll?subscription=bc").assert_problem(400);
    b.client().get("/events/poll?subscription=lb&max=0").assert_problem(400);
    b.client().get("/events/poll?subscription=lb&waitMs=soon").assert_problem(400);
    let ack = |body: &str| b.client().post("/events/ack", "application/json", body.as_bytes());
    ack(r#"{"subscription":"nope","ids":[]}"#).assert_problem(404);
    ack(r#"{"subscription":"lb","ids":["0:1"],"bogus":1}"#).assert_problem(400);
    ack(r#"{"subscription":"lb","ids":["zero"]}"#).assert_problem(400);
    ack(r#"{"subscription":"bc","ids":["0:1:1"]}"#).assert_problem(400);
    assert_eq!(
        ack(r#"{"subscription":"lb","ids":["0:1:1"]}"#).status,
        200,
        "unknown deliveries are acked idempotently"
    );
}

/// A session that stops reading is cut off (1008, or dropped once its socket stays full) while
/// another session of the same subscription keeps receiving everything.
#[test]
fn a_slow_consumer_is_closed_and_does_not_hold_back_a_fast_one() {
    let b = TestBroker::start(&["--default-partitions", "1", "--shards", "1"]);
    let def = json!({"subscription": "fan", "topic": "news", "mode": "BROADCAST"});
    assert_eq!(b.client().post("/events/subscribe", "application/json", def.to_string().as_bytes()).status, 201);
    let mut slow = attach(&b, "subscription=fan&ack=none");
    let mut fast = attach(&b, "subscription=fan&ack=none");
    // One shard: interest is registered before the upgrade's 101 reaches the client.
    let total = 6000;
    let mut received = 0;
    let payload = "x".repeat(900);
    for batch in 0..total / 100 {
        let events: Vec<Value> = (0..100)
            .map(|i| {
                let mut e = event(&format!("e{}", batch * 100 + i));
                e["data"] = json!(payload);
                e
            })
            .collect();
        let r = b.client().post(
            "/events/publish?topic=news",
            "application/cloudevents-batch+json",
            json!(events).to_string().as_bytes(),
        );
        assert_eq!(r.status, 202);
        while let Some(_e) = next_event(&mut fast) {
            received += 1;
        }
    }
    let start = Instant::now();
    while received < total {
        assert!(start.elapsed() < Duration::from_secs(20), "fast consumer got {received} of {total}");
        if next_event(&mut fast).is_some() {
            received += 1;
        }
    }
    // The slow one was closed: reading it through ends in a close frame or a dropped socket,
    // well before all events.
    let (code, got) = read_until_closed(&mut slow, Duration::from_secs(30));
    assert!(matches!(code, None | Some(CloseCode::Policy)), "{code:?}");
    assert!(got < total, "the slow consumer was cut off ({got} of {total})");
}

/// With `delivery_linger_us`, events gathered into one write still all arrive, in order.
#[test]
fn a_lingering_session_gets_every_event_in_order() {
    let b = TestBroker::start(&["--default-partitions", "1", "--shards", "1", "--delivery-linger-us", "20000"]);
    let def = json!({"subscription": "fan", "topic": "news", "mode": "BROADCAST"});
    assert_eq!(b.client().post("/events/subscribe", "application/json", def.to_string().as_bytes()).status, 201);
    let mut ws = attach(&b, "subscription=fan&ack=none");
    for i in 0..5 {
        assert_eq!(b.publish("news", &event(&format!("l{i}"))).status, 202);
    }
    assert_eq!(read_ids(&mut ws, 5), ["l0", "l1", "l2", "l3", "l4"]);
}

/// An event with a partition key (every event of one key lands in one partition, in order).
pub(super) fn keyed(id: &str, key: &str) -> Value {
    let mut e = event(id);
    e["partitionkey"] = json!(key);
    e
}

/// Subscribes (`POST /events/subscribe`), expecting 201.
pub(super) fn subscribe(b: &TestBroker, def: Value) {
    let r = b.client().post("/events/subscribe", "application/json", def.to_string().as_bytes());
    assert_eq!(r.status, 201, "{}", r.text());
}

/// Publishes event `id` with `key` as its partitionkey, expecting 202.
pub(super) fn publish_keyed(b: &TestBroker, topic: &str, id: &str, key: &str) {
    let r = b.publish(topic, &keyed(id, key));
    assert_eq!(r.status, 202, "{}", r.text());
}

/// Receives (and acks) until `want` ids arrived (30 s at most); returns every id seen.
pub(super) fn receive_acking(
    ws: &mut Ws,
    want: &std::collections::HashSet<String>,
) -> std::collections::HashSet<String> {
    let mut got = std::collections::HashSet::new();
    let start = std::time::Instant::now();
    while !want.is_subset(&got) {
        assert!(start.elapsed() < Duration::from_secs(30), "missing {:?}", want.difference(&got).collect::<Vec<_>>());
        if let Some(e) = next_event(ws) {
            let ids = serde_json::json!([e["emdeliveryid"]]);
            ws.send(tungstenite::Message::text(serde_json::json!({"type": "ack", "ids": ids}).to_string())).unwrap();
            got.insert(e["id"].as_str().unwrap().to_owned());
        }
    }
    got
}

/// The ids of the next `n` events a session gets, in arrival order (markers left by an
/// attach are skipped); fails after 20 s.
pub(super) fn read_ids(ws: &mut Ws, n: usize) -> Vec<String> {
    let mut got = Vec::new();
    let start = Instant::now();
    while got.len() < n {
        assert!(start.elapsed() < Duration::from_secs(20), "got {} of {n}: {got:?}", got.len());
        if let Some(e) = next_event(ws) {
            let id = e["id"].as_str().unwrap().to_owned();
            if !id.starts_with("marker-") {
                got.push(id);
            }
        }
    }
    got
}

/// Events that reach a session in one turn of its shard go out in one write, with no linger
/// timer: a batch of 10 (one append, one delivery) is one write to the session, on both I/O
/// drivers. The bound is on writes counted by the broker, not on what one read happened to see.
#[test]
fn events_of_one_turn_reach_a_session_in_one_write() {
    for driver in ["epoll", "uring"] {
        // No keepalive ping in the window counted.
        let b = TestBroker::start(&["--io-driver", driver, "--ws-ping-interval-ms", "3600000"]);
        let def = json!({"subscription": "gather", "topic": "gather", "mode": "BROADCAST"});
        assert_eq!(b.client().post("/events/subscribe", "application/json", def.to_string().as_bytes()).status, 201);
        let mut ws = attach(&b, "subscription=gather&ack=none");
        // Interest reaches the partition's owner asynchronously: markers until one arrives,
        // then one more read back, so no marker is still on its way when counting starts.
        let start = Instant::now();
        'attached: for round in 0.. {
            assert!(start.elapsed() < Duration::from_secs(20), "the session never attached");
            assert_eq!(b.publish("gather", &keyed(&format!("marker-{round}"), "one")).status, 202);
            while let Some(e) = next_event(&mut ws) {
                if e["id"].as_str().unwrap().starts_with("marker-") {
                    break 'attached;
                }
            }
        }
        assert_eq!(b.publish("gather", &keyed("sync", "one")).status, 202);
        let start = Instant::now();
        while next_event(&mut ws).is_none_or(|e| e["id"] != "sync") {
            assert!(start.elapsed() < Duration::from_secs(20), "the sync marker never arrived");
        }
        let counter = |name| metric(&b, name, "");
        let (writes, deliveries) = (counter("evmesh_ws_writes_total"), counter("evmesh_deliveries_total"));
        let batch: Vec<Value> = (0..10).map(|i| keyed(&format!("b{i}"), "one")).collect();
        let r = b.client().post(
            "/events/publish?topic=gather",
            "application/cloudevents-batch+json",
            serde_json::to_vec(&batch).unwrap().as_slice(),
        );
        assert_eq!(r.status, 202, "{}", r.text());
        assert_eq!(read_ids(&mut ws, 10), (0..10).map(|i| format!("b{i}")).collect::<Vec<_>>(), "{driver}: in order");
        assert_eq!(counter("evmesh_deliveries_total") - deliveries, 10, "{driver}");
        assert_eq!(counter("evmesh_ws_writes_total") - writes, 1, "{driver}: ten events, one write");
    }
}
