//! Names clients choose are bounded: topics, subscriptions, clientIds with stored offsets (and
//! those expire), and a silent WebSocket peer does not hold its session forever.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::json;

use super::super::acked::{publish_to, subscribe};
use super::super::util::{event, wait_for, TestBroker};

fn sub(b: &TestBroker, def: serde_json::Value) -> super::super::util::Resp {
    b.client().post("/events/subscribe", "application/json", def.to_string().as_bytes())
}

#[test]
fn topics_and_subscriptions_are_capped_and_auto_creation_can_be_off() {
    let b = TestBroker::start(&["--max-topics", "3", "--max-subscriptions", "2"]);
    for t in ["t1", "t2", "t3"] {
        assert_eq!(b.publish(t, &event("x")).status, 202);
    }
    b.publish("t4", &event("x")).assert_problem(409);
    assert_eq!(b.publish("t1", &event("again")).status, 202, "existing topics still take events");
    assert_eq!(sub(&b, json!({"subscription": "s1", "topic": "t1"})).status, 201);
    assert_eq!(sub(&b, json!({"subscription": "s2", "topic": "t2"})).status, 201);
    sub(&b, json!({"subscription": "s3", "topic": "t3"})).assert_problem(409);
    let r = b.client().post("/events/unsubscribe", "application/json", br#"{"subscription":"s1"}"#);
    assert_eq!(r.status, 200);
    assert_eq!(sub(&b, json!({"subscription": "s3", "topic": "t3"})).status, 201, "a removed one frees its slot");
    let topics = b.admin().get("/admin/topics").json();
    assert_eq!(topics.as_array().map(Vec::len), Some(3), "{topics}");

    let off = TestBroker::start(&["--auto-create-topics", "false"]);
    off.publish("nope", &event("x")).assert_problem(404);
    sub(&off, json!({"subscription": "s", "topic": "nope"})).assert_problem(404);
    let mut admin = off.admin();
    assert_eq!(admin.request("PUT", "/admin/topics/made", &[], br#"{"partitions":1}"#).status, 201);
    assert_eq!(off.publish("made", &event("x")).status, 202);
}

/// Offsets of each new clientId are stored: at most max_clients_per_subscription of them, and
/// they are forgotten after client_offset_ttl_ms without the client.
#[test]
fn client_ids_are_capped_and_their_offsets_expire() {
    let b = TestBroker::start(&[
        "--default-partitions",
        "1",
        "--max-clients-per-subscription",
        "2",
        "--client-offset-ttl-ms",
        "300",
        "--retention-check-ms",
        "50",
    ]);
    subscribe(&b, json!({"subscription": "b", "topic": "bt", "mode": "BROADCAST", "start": "earliest"}));
    publish_to(&b, "bt", "e0", None);
    let poll = |client: &str| b.client().get(&format!("/events/poll?subscription=b&clientId={client}&waitMs=2000"));
    for c in ["c1", "c2"] {
        assert_eq!(poll(c).status, 200);
    }
    assert_eq!(poll("c1").status, 204, "a known client is not refused");
    // c1 and c2 are still attached (long-poll sessions linger): a third is refused...
    poll("c3").assert_problem(409);
    // ...and once their sessions are gone and the TTL passed, their offsets are forgotten.
    let clients = || {
        let subs = b.admin().get("/admin/subscriptions").json();
        subs[0]["partitions"][0]["consumers"].as_array().map_or(0, Vec::len)
    };
    assert_eq!(clients(), 2);
    wait_for(Duration::from_secs(60), || (clients() == 0).then_some(()));
    assert_eq!(poll("c3").status, 200, "room again; c3 starts from the start");
}

/// A WebSocket peer that vanished without closing (it reads nothing, answers no ping) is pinged,
/// then its session is closed.
#[test]
fn a_silent_websocket_peer_is_closed_after_two_ping_intervals() {
    let b = TestBroker::start(&["--ws-ping-interval-ms", "200"]);
    subscribe(&b, json!({"subscription": "quiet", "topic": "qt", "mode": "BROADCAST"}));
    let mut s = TcpStream::connect(b.traffic).unwrap();
    write!(
        s,
        "GET /events/ws?subscription=quiet&ack=none HTTP/1.1\r\nhost: t\r\nupgrade: websocket\r\nconnection: upgrade\r\n\
         sec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    )
    .unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let start = Instant::now();
    let mut got = Vec::new();
    let mut chunk = [0u8; 256];
    loop {
        match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&chunk[..n]),
            Err(e) => panic!("no close after {:?}: {e}", start.elapsed()),
        }
    }
    let head_end = got.windows(4).position(|w| w == b"\r\n\r\n").expect("a 101 head") + 4;
    let frames = &got[head_end..];
    assert!(frames.starts_with(&[0x89, 0x00]), "pinged first: {frames:?}");
    assert!(frames.windows(4).any(|w| w == [0x88, 0x02, 0x03, 0xe9]), "then closed with 1001: {frames:?}");
}

/// Out of descriptors: connections past the caps fitted under the open-files limit are refused
/// at accept, and storage (RocksDB keeps files open) goes on working for those already in.
#[test]
fn running_out_of_descriptors_refuses_connections_not_storage_writes() {
    // 1,100 descriptors: after RocksDB's 512, a reserve of 256 and the admin listener's 256,
    // about 38 connections per shard fit.
    let b = TestBroker::start_with_nofile(&[], 1100);
    let mut keep = b.client();
    let mut flood = Vec::new();
    for _ in 0..400 {
        match std::net::TcpStream::connect(b.traffic) {
            Ok(s) => flood.push(s),
            Err(_) => break,
        }
    }
    // Those over the cap are closed at accept: a read sees EOF at once.
    let closed = wait_for(Duration::from_secs(10), || {
        let mut n = 0;
        for s in flood.iter_mut() {
            s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
            if matches!(s.read(&mut [0u8; 1]), Ok(0)) {
                n += 1;
            }
        }
        (n > 0).then_some(n)
    });
    assert!(closed >= 300, "only {closed} of {} refused", flood.len());
    // Many writes (and the files RocksDB opens for them) still succeed for a connection that
    // was let in.
    for i in 0..200 {
        let e = event(&format!("fd{i}"));
        let r = keep.post("/events/publish?topic=fd", "application/cloudevents+json", e.to_string().as_bytes());
        assert_eq!(r.status, 202, "{}", r.text());
    }
    let metrics = b.admin().get("/metrics").text();
    assert!(
        metrics.lines().any(|l| l.starts_with("evmesh_connections_rejected_total") && !l.ends_with(" 0")),
        "{metrics}"
    );
}
