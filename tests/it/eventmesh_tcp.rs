//! Classic EventMesh TCP clients (issue 34): a client written here from EventMesh's Java codec
//! (apache/eventmesh 2527428, `Codec.java`: magic `EventMesh`, version `0000`, a big-endian
//! length = 13 + header + body, the header length, the header's JSON, the body), not from
//! evmesh's, against a real broker on both I/O drivers; TCP and WebSocket clients on one topic;
//! the hostile cases, each with its bound.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::acked::subscribe;
use super::delivery::{attach, next_event};
use super::util::{event, wait_for, TestBroker};

/// A package as the Java encoder writes it.
fn frame(header: &Value, body: &[u8]) -> Vec<u8> {
    let h = header.to_string().into_bytes();
    let mut f = b"EventMesh0000".to_vec();
    f.extend_from_slice(&((13 + h.len() + body.len()) as i32).to_be_bytes());
    f.extend_from_slice(&(h.len() as i32).to_be_bytes());
    f.extend_from_slice(&h);
    f.extend_from_slice(body);
    f
}

pub(super) struct Tcp {
    s: TcpStream,
    buf: Vec<u8>,
    seq: u64,
}

impl Tcp {
    pub(super) fn connect(b: &TestBroker) -> Tcp {
        let s = TcpStream::connect(b.tcp.expect("started with --tcp-listen")).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        Tcp { s, buf: Vec::new(), seq: 0 }
    }

    pub(super) fn send(&mut self, cmd: &str, props: Value, body: &[u8]) -> String {
        self.seq += 1;
        let seq = format!("{}", 1_000_000 + self.seq);
        self.send_seq(cmd, &seq, props, body);
        seq
    }

    fn send_seq(&mut self, cmd: &str, seq: &str, props: Value, body: &[u8]) {
        let header = json!({"cmd": cmd, "code": 0, "seq": seq, "properties": props});
        self.s.write_all(&frame(&header, body)).unwrap();
    }

    /// The next package, `None` once the broker closed the connection.
    pub(super) fn read(&mut self) -> Option<(Value, Vec<u8>)> {
        loop {
            if self.buf.len() >= 21 {
                assert_eq!(&self.buf[..13], b"EventMesh0000");
                let total = i32::from_be_bytes(self.buf[13..17].try_into().unwrap()) as usize + 8;
                let hlen = i32::from_be_bytes(self.buf[17..21].try_into().unwrap()) as usize;
                if self.buf.len() >= total {
                    let header: Value = serde_json::from_slice(&self.buf[21..21 + hlen]).unwrap();
                    let body = self.buf[21 + hlen..total].to_vec();
                    self.buf.drain(..total);
                    return Some((header, body));
                }
            }
            let mut chunk = [0u8; 65536];
            match self.s.read(&mut chunk) {
                Ok(0) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return None,
                Err(e) => panic!("read: {e}"),
            }
        }
    }

    /// The next package of `cmd`, skipping others (pushes arriving meanwhile are returned too
    /// by `skipped`).
    pub(super) fn expect(&mut self, cmd: &str) -> (Value, Vec<u8>) {
        loop {
            let (h, b) = self.read().unwrap_or_else(|| panic!("closed while waiting for {cmd}"));
            if h["cmd"] == cmd {
                return (h, b);
            }
        }
    }

    pub(super) fn call(&mut self, cmd: &str, answer: &str, props: Value, body: &[u8]) -> Value {
        let seq = self.send(cmd, props, body);
        let (h, _) = self.expect(answer);
        assert_eq!(h["seq"], seq.as_str(), "{h}");
        h
    }

    pub(super) fn hello(&mut self, group: &str, purpose: &str, token: &str) -> Value {
        let ua = json!({"env": "it", "subsystem": "5023", "path": "/", "pid": 7, "host": "127.0.0.1", "port": 0,
            "version": "2.0", "username": "u", "password": token, "idc": "FT", "group": group, "purpose": purpose});
        self.call("HELLO_REQUEST", "HELLO_RESPONSE", json!({}), ua.to_string().as_bytes())
    }

    pub(super) fn subscribe(&mut self, topic: &str, mode: &str, kind: &str) -> Value {
        let body = json!({"topicList": [{"topic": topic, "mode": mode, "type": kind}]});
        self.call("SUBSCRIBE_REQUEST", "SUBSCRIBE_RESPONSE", json!({}), body.to_string().as_bytes())
    }
}

fn mesh() -> Value {
    json!({"protocoltype": "eventmeshmessage", "protocolversion": "1.0", "protocoldesc": "tcp"})
}

fn ce() -> Value {
    json!({"protocoltype": "cloudevents", "protocolversion": "1.0", "protocoldesc": "tcp"})
}

fn mesh_message(topic: &str, body: &str) -> Vec<u8> {
    json!({"topic": topic, "body": body, "properties": {"shop": "berlin"}}).to_string().into_bytes()
}

/// A TCP publisher, a TCP subscriber and a CloudEvents WebSocket subscriber on one topic, on
/// one shard (every connection on the same core) and on both drivers: each side's events reach
/// the other in its own form, and every answer is the one its request asked for (a regression:
/// on io_uring a publisher's ACK went out as the bytes of a push to another connection, the
/// one-buffer iovec of a vectored write read after its future moved).
#[test]
fn tcp_and_websocket_clients_see_each_others_events_on_both_drivers() {
    for driver in ["uring", "epoll"] {
        let b = TestBroker::start(&["--shards", "1", "--io-driver", driver, "--tcp-listen", "127.0.0.1:0"]);
        subscribe(&b, json!({"subscription": "ws-side", "topic": "orders", "mode": "BROADCAST"}));
        let mut ws = attach(&b, "subscription=ws-side");
        let mut sub = Tcp::connect(&b);
        assert_eq!(sub.hello("shop", "sub", "")["code"], 0);
        assert_eq!(sub.subscribe("orders", "CLUSTERING", "ASYNC")["code"], 0);
        assert_eq!(sub.call("LISTEN_REQUEST", "LISTEN_RESPONSE", json!({}), b"")["code"], 0);
        let mut publisher = Tcp::connect(&b);
        assert_eq!(publisher.hello("shop", "pub", "")["code"], 0);
        for i in 0..20 {
            let h = publisher.call(
                "ASYNC_MESSAGE_TO_SERVER",
                "ASYNC_MESSAGE_TO_SERVER_ACK",
                mesh(),
                &mesh_message("orders", &format!("m{i}")),
            );
            assert_eq!(h["code"], 0, "{driver}: {h}");
        }
        let cloud = json!({"specversion": "1.0", "id": "c1", "source": "/s", "type": "t", "subject": "orders",
            "datacontenttype": "application/json", "data": {"n": 1}});
        let h = publisher.call(
            "ASYNC_MESSAGE_TO_SERVER",
            "ASYNC_MESSAGE_TO_SERVER_ACK",
            ce(),
            cloud.to_string().as_bytes(),
        );
        assert_eq!(h["code"], 0, "{h}");
        assert_eq!(b.publish("orders", &event("h1")).status, 202);
        // The WebSocket subscriber: the TCP messages as CloudEvents.
        let mut seen = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while seen.len() < 22 && Instant::now() < deadline {
            if let Some(e) = next_event(&mut ws) {
                seen.push(e);
            }
        }
        assert_eq!(seen.len(), 22, "{driver}: {seen:?}");
        assert_eq!(seen[0]["type"], "eventmeshmessage");
        assert_eq!(seen[0]["subject"], "orders");
        assert_eq!(seen[0]["data"], "m0");
        assert_eq!(seen[0]["shop"], "berlin");
        assert_eq!(seen[0]["protocoltype"], "eventmeshmessage");
        assert_eq!(seen[20]["id"], "c1");
        assert_eq!(seen[21]["id"], "h1");
        // The TCP subscriber: each in the protocol its publisher used, acked as it comes.
        let mut got = Vec::new();
        while got.len() < 22 {
            let (h, body) = sub.expect("ASYNC_MESSAGE_TO_CLIENT");
            let seq = h["seq"].as_str().unwrap().to_owned();
            let v: Value = serde_json::from_slice(&body).unwrap();
            got.push((h["properties"]["protocoltype"].as_str().unwrap().to_owned(), v));
            sub.send_seq("ASYNC_MESSAGE_TO_CLIENT_ACK", &seq, h["properties"].clone(), &body);
        }
        let bodies: Vec<&str> = got.iter().filter_map(|(_, v)| v["body"].as_str()).collect();
        assert_eq!(bodies, (0..20).map(|i| format!("m{i}")).collect::<Vec<_>>(), "{driver}: in order");
        let (kind, m0) = &got[0];
        assert_eq!(kind, "eventmeshmessage");
        assert_eq!(m0["topic"], "orders");
        assert_eq!(m0["properties"]["shop"], "berlin");
        let ids: Vec<&str> =
            got.iter().filter(|(k, _)| k == "cloudevents").map(|(_, v)| v["id"].as_str().unwrap()).collect();
        assert_eq!(ids, ["c1", "h1"]);
        // Acked: nothing comes again.
        sub.s.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
        let mut chunk = [0u8; 64];
        assert!(sub.s.read(&mut chunk).is_err(), "{driver}: a push came again after its ack");
    }
}

/// A push not acked within the subscription's ack timeout comes again (its attempt in the
/// `seq`), then goes to the dead-letter topic; an acked one never comes again.
#[test]
fn unacked_pushes_are_redelivered_then_dead_lettered() {
    let b = TestBroker::start(&["--tcp-listen", "127.0.0.1:0", "--redelivery-backoff-ms", "50"]);
    // The group's subscription as the TCP side names it, made first with short timeouts.
    subscribe(
        &b,
        json!({"subscription": "cg.4.shop.pay", "topic": "pay", "mode": "LOAD_BALANCE",
        "ackTimeoutMs": 300, "maxAttempts": 2}),
    );
    let mut sub = Tcp::connect(&b);
    sub.hello("shop", "sub", "");
    assert_eq!(sub.subscribe("pay", "CLUSTERING", "ASYNC")["code"], 0);
    sub.call("LISTEN_REQUEST", "LISTEN_RESPONSE", json!({}), b"");
    let keyed = |id: &str| json!({"specversion": "1.0", "id": id, "source": "/t", "type": "t", "partitionkey": "k"});
    assert_eq!(b.publish("pay", &keyed("acked")).status, 202);
    assert_eq!(b.publish("pay", &keyed("dropped")).status, 202);
    let mut attempts: Vec<(String, String)> = Vec::new();
    let until = Instant::now() + Duration::from_secs(5);
    sub.s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    while Instant::now() < until {
        let mut chunk = [0u8; 65536];
        match sub.s.read(&mut chunk) {
            Ok(0) => panic!("closed"),
            Ok(n) => sub.buf.extend_from_slice(&chunk[..n]),
            Err(_) => continue,
        }
        while sub.buf.len() >= 21
            && sub.buf.len() >= i32::from_be_bytes(sub.buf[13..17].try_into().unwrap()) as usize + 8
        {
            let (h, body) = sub.read().unwrap();
            let v: Value = serde_json::from_slice(&body).unwrap();
            let (seq, id) = (h["seq"].as_str().unwrap().to_owned(), v["id"].as_str().unwrap().to_owned());
            if id == "acked" {
                sub.send_seq("ASYNC_MESSAGE_TO_CLIENT_ACK", &seq, json!({}), &body);
            }
            attempts.push((id, seq));
        }
    }
    let of = |id: &str| attempts.iter().filter(|(i, _)| i == id).map(|(_, s)| s.clone()).collect::<Vec<_>>();
    assert_eq!(of("acked").len(), 1, "{attempts:?}");
    let dropped = of("dropped");
    assert_eq!(dropped.len(), 2, "maxAttempts 2: {attempts:?}");
    assert!(dropped[0].ends_with(":1") && dropped[1].ends_with(":2"), "{dropped:?}");
    let dlq = wait_for(Duration::from_secs(5), || {
        let e = b.events("pay.dlq", 0).into_iter().chain(b.events("pay.dlq", 1)).map(|(_, e)| e).collect::<Vec<_>>();
        (!e.is_empty()).then_some(e)
    });
    assert_eq!(dlq[0]["id"], "dropped");
}

/// REQUEST_TO_SERVER reaches a SYNC subscriber as REQUEST_TO_CLIENT; its RESPONSE_TO_SERVER
/// (the request's properties copied back, as the Java SDK's responders do) comes to the
/// requester as RESPONSE_TO_CLIENT with the request's seq; with no responder, a code 1 at the
/// message's ttl.
#[test]
fn request_reply_between_tcp_clients() {
    let b = TestBroker::start(&["--tcp-listen", "127.0.0.1:0"]);
    let mut responder = Tcp::connect(&b);
    responder.hello("svc", "sub", "");
    assert_eq!(responder.subscribe("rr", "CLUSTERING", "SYNC")["code"], 0);
    responder.call("LISTEN_REQUEST", "LISTEN_RESPONSE", json!({}), b"");
    let mut requester = Tcp::connect(&b);
    requester.hello("app", "pub", "");
    let body = json!({"topic": "rr", "body": "ping", "properties": {"ttl": "5000"}}).to_string();
    let seq = requester.send("REQUEST_TO_SERVER", mesh(), body.as_bytes());
    let (h, req) = responder.expect("REQUEST_TO_CLIENT");
    responder.send_seq("REQUEST_TO_CLIENT_ACK", h["seq"].as_str().unwrap(), json!({}), &req);
    let mut reply: Value = serde_json::from_slice(&req).unwrap();
    assert_eq!(reply["body"], "ping");
    assert!(reply["properties"]["emcorrelationid"].is_string(), "{reply}");
    reply["body"] = json!("pong");
    responder.send("RESPONSE_TO_SERVER", mesh(), reply.to_string().as_bytes());
    let (h, answer) = requester.expect("RESPONSE_TO_CLIENT");
    assert_eq!(h["seq"], seq.as_str());
    assert_eq!(h["code"], 0, "{h}");
    let answer: Value = serde_json::from_slice(&answer).unwrap();
    assert_eq!(answer["body"], "pong");
    // Nobody answers this one: a failure at its ttl.
    let body = json!({"topic": "nobody", "body": "ping", "properties": {"ttl": "300"}}).to_string();
    let started = Instant::now();
    let h = requester.call("REQUEST_TO_SERVER", "RESPONSE_TO_CLIENT", mesh(), body.as_bytes());
    assert_eq!(h["code"], 1);
    assert!(h["desc"].as_str().unwrap().starts_with("504"), "{h}");
    assert!(started.elapsed() < Duration::from_secs(5));
}

/// Before HELLO a command is answered with code 1 and the connection stays; a bad credential
/// is code 1 and the close; the ACL decides publishes over TCP as over HTTP.
#[test]
fn hello_authenticates_and_the_acl_applies() {
    let acl = r#"
[[acl]]
id = "alice-publishes-orders"
principal = "alice"
resource = "topic:orders.*"
actions = ["PUBLISH"]
effect = "ALLOW"
"#;
    let (b, _dir) = super::governance::broker_with(
        "tcp-auth",
        &[("alice", None, "alice-secret")],
        acl,
        &["--tcp-listen", "127.0.0.1:0"],
    );
    let mut c = Tcp::connect(&b);
    let h = c.call("HEARTBEAT_REQUEST", "HEARTBEAT_RESPONSE", json!({}), b"");
    assert_eq!(h["code"], 1);
    assert!(h["desc"].as_str().unwrap().contains("no session"), "{h}");
    let h = c.hello("g", "pub", "wrong");
    assert_eq!(h["code"], 1);
    assert!(h["desc"].as_str().unwrap().starts_with("401"), "{h}");
    assert!(c.read().is_none(), "closed after a failed HELLO");
    let mut c = Tcp::connect(&b);
    assert_eq!(c.hello("g", "pub", "alice-secret")["code"], 0);
    let ok = c.call("ASYNC_MESSAGE_TO_SERVER", "ASYNC_MESSAGE_TO_SERVER_ACK", mesh(), &mesh_message("orders.eu", "x"));
    assert_eq!(ok["code"], 0, "{ok}");
    let denied = c.call("ASYNC_MESSAGE_TO_SERVER", "ASYNC_MESSAGE_TO_SERVER_ACK", mesh(), &mesh_message("hr", "x"));
    assert_eq!(denied["code"], 1);
    assert!(denied["desc"].as_str().unwrap().starts_with("403"), "{denied}");
}

/// What the broker says before it closes on bytes that are not a frame it takes.
fn refused_with(b: &TestBroker, bytes: &[u8]) -> Value {
    let mut c = Tcp::connect(b);
    c.s.write_all(bytes).unwrap();
    let (h, _) = c.read().expect("a SERVER_GOODBYE first");
    assert_eq!(h["cmd"], "SERVER_GOODBYE_REQUEST", "{h}");
    assert_eq!(h["code"], 1, "{h}");
    assert!(c.read().is_none(), "then the close");
    h
}

/// Hostile frames get SERVER_GOODBYE saying why, then the close: a length past the cap (before
/// its bytes are read: the bound is the 21 bytes sent), a header that is not JSON, another
/// protocol's bytes; a frame cut short and left so is closed at `header_read_timeout`. The
/// broker serves on.
#[test]
fn hostile_frames_are_refused_with_a_goodbye() {
    let b = TestBroker::start(&["--tcp-listen", "127.0.0.1:0", "--header-read-timeout-ms", "500"]);
    let mut huge = b"EventMesh0000".to_vec();
    huge.extend_from_slice(&i32::MAX.to_be_bytes());
    huge.extend_from_slice(&10i32.to_be_bytes());
    let h = refused_with(&b, &huge);
    assert!(h["desc"].as_str().unwrap().contains("past"), "{h}");
    let mut not_json = b"EventMesh0000".to_vec();
    not_json.extend_from_slice(&(13 + 5i32).to_be_bytes());
    not_json.extend_from_slice(&5i32.to_be_bytes());
    not_json.extend_from_slice(b"{oops");
    let h = refused_with(&b, &not_json);
    assert!(h["desc"].as_str().unwrap().contains("header"), "{h}");
    let h = refused_with(&b, b"GET / HTTP/1.1\r\nhost: x\r\n\r\n");
    assert!(h["desc"].as_str().unwrap().contains("not an EventMesh"), "{h}");
    // Truncated: half a frame, then nothing.
    let hb = frame(&json!({"cmd": "HEARTBEAT_REQUEST", "code": 0, "seq": "1"}), b"");
    let started = Instant::now();
    let h = refused_with(&b, &hb[..hb.len() / 2]);
    assert!(h["desc"].as_str().unwrap().contains("HELLO"), "{h}");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(b.publish("after", &event("1")).status, 202);
}

/// A client flooding heartbeats without reading its answers is held at its socket: the broker
/// stops reading it once its answers wait, a bystander's publish is answered meanwhile, and the
/// broker's memory does not grow with the flood.
#[test]
fn a_heartbeat_flood_from_a_client_that_never_reads_is_held_at_its_socket() {
    let b = TestBroker::start(&["--tcp-listen", "127.0.0.1:0"]);
    let mut flood = Tcp::connect(&b);
    flood.hello("g", "pub", "");
    let before = b.rss_bytes();
    let hb = frame(&json!({"cmd": "HEARTBEAT_REQUEST", "code": 0, "seq": "1"}), b"");
    let burst: Vec<u8> = hb.iter().copied().cycle().take(hb.len() * 20_000).collect();
    let s = flood.s.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        let mut s = s;
        s.set_write_timeout(Some(Duration::from_secs(3))).unwrap();
        let mut sent = 0usize;
        for _ in 0..50 {
            match s.write_all(&burst) {
                Ok(()) => sent += burst.len(),
                Err(_) => break,
            }
        }
        sent
    });
    let started = Instant::now();
    assert_eq!(b.publish("bystander", &event("1")).status, 202);
    let bystander = started.elapsed();
    let sent = writer.join().unwrap();
    // The flood's writes stopped: the broker stopped reading once its answers waited unread.
    assert!(sent < hb.len() * 20_000 * 50, "all {sent} bytes were taken from a client that never reads");
    assert!(bystander < Duration::from_secs(2), "a bystander's publish took {bystander:?}");
    let grown = b.rss_bytes().saturating_sub(before);
    assert!(grown < 64 << 20, "the broker grew by {grown} bytes");
}

/// Regressions of a hostile review: answers are bounded whatever the request carried (a
/// 600 KB `mode` of DEL bytes, each 7 bytes once escaped, once panicked the shard building a
/// 4 MB answer; so did a huge `seq` echoed); a header past 64 KiB is refused before it is
/// parsed; more properties than an event may carry attributes are refused before any work
/// (80,000 of them once cost the shard 9 s); a property naming a CloudEvents attribute (a
/// `datacontenttype` with CR LF that became an HTTP header) is refused. The broker serves on.
#[test]
fn hostile_packages_get_bounded_answers_and_the_broker_serves_on() {
    let b = TestBroker::start(&["--tcp-listen", "127.0.0.1:0"]);
    let mut c = Tcp::connect(&b);
    // Before HELLO: a 60 KB seq is not echoed.
    let long_seq = "7".repeat(60_000);
    c.send_seq("HEARTBEAT_REQUEST", &long_seq, json!({}), b"");
    let (h, _) = c.expect("HEARTBEAT_RESPONSE");
    assert_eq!(h["code"], 1);
    assert!(h.get("seq").is_none(), "a 60 KB seq echoed");
    c.hello("g", "sub", "");
    let body = json!({"topicList": [{"topic": "t", "mode": "\u{7f}".repeat(600_000), "type": "ASYNC"}]});
    let h = c.call("SUBSCRIBE_REQUEST", "SUBSCRIBE_RESPONSE", json!({}), body.to_string().as_bytes());
    assert_eq!(h["code"], 1);
    assert!(h["desc"].as_str().unwrap().len() <= 1024, "an unbounded desc");
    let seq = format!("x/{}", "\u{7f}".repeat(60_000));
    c.send_seq("ASYNC_MESSAGE_TO_CLIENT_ACK", &seq, json!({}), b"");
    let (h, _) = c.expect("ASYNC_MESSAGE_TO_CLIENT_ACK");
    assert_eq!(h["code"], 1);
    let props: serde_json::Map<String, Value> = (0..2000).map(|i| (format!("p{i}"), json!("v"))).collect();
    let h =
        c.call("ASYNC_MESSAGE_TO_SERVER", "ASYNC_MESSAGE_TO_SERVER_ACK", Value::Object(props), &mesh_message("t", "x"));
    assert_eq!(h["code"], 1);
    assert!(h["desc"].as_str().unwrap().contains("at most 1024 properties"), "{h}");
    let mut bad = ce();
    bad["datacontenttype"] = json!("text/plain\r\nset-cookie: x=1");
    let cloud = json!({"specversion": "1.0", "id": "1", "source": "/", "type": "t", "subject": "t"});
    let h = c.call("ASYNC_MESSAGE_TO_SERVER", "ASYNC_MESSAGE_TO_SERVER_ACK", bad, cloud.to_string().as_bytes());
    assert_eq!(h["code"], 1);
    assert!(h["desc"].as_str().unwrap().contains("names a CloudEvents attribute"), "{h}");
    // A header past 64 KiB: the goodbye, then the close.
    let props: serde_json::Map<String, Value> = (0..8000).map(|i| (format!("p{i}"), json!("vvvvvv"))).collect();
    c.send("HEARTBEAT_REQUEST", Value::Object(props), b"");
    let (h, _) = c.expect("SERVER_GOODBYE_REQUEST");
    assert!(h["desc"].as_str().unwrap().contains("header of"), "{h}");
    assert!(c.read().is_none());
    assert_eq!(b.publish("after", &event("1")).status, 202);
}

/// A SUBSCRIBE that fails part-way takes back the topics it added; subscribing and
/// unsubscribing again and again never runs out of room (subscriptions are keyed, not slotted:
/// a review found every cycle took a slot for good, then a false 429).
#[test]
fn subscriptions_come_and_go_without_leaving_anything_behind() {
    let b = TestBroker::start(&["--tcp-listen", "127.0.0.1:0"]);
    let mut c = Tcp::connect(&b);
    c.hello("g", "sub", "");
    c.call("LISTEN_REQUEST", "LISTEN_RESPONSE", json!({}), b"");
    let body =
        json!({"topicList": [{"topic": "kept", "mode": "CLUSTERING"}, {"topic": "bad topic!", "mode": "CLUSTERING"}]});
    let h = c.call("SUBSCRIBE_REQUEST", "SUBSCRIBE_RESPONSE", json!({}), body.to_string().as_bytes());
    assert_eq!(h["code"], 1, "{h}");
    assert_eq!(b.publish("kept", &event("1")).status, 202);
    c.s.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    let mut chunk = [0u8; 64];
    assert!(c.s.read(&mut chunk).is_err(), "a topic of a failed SUBSCRIBE was pushed");
    c.s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    for _ in 0..200 {
        assert_eq!(c.subscribe("cycle", "CLUSTERING", "ASYNC")["code"], 0);
        assert_eq!(c.call("UNSUBSCRIBE_REQUEST", "UNSUBSCRIBE_RESPONSE", json!({}), b"")["code"], 0);
    }
    assert_eq!(c.subscribe("cycle", "CLUSTERING", "ASYNC")["code"], 0);
    assert_eq!(b.publish("cycle", &event("c")).status, 202);
    let (h, body) = c.expect("ASYNC_MESSAGE_TO_CLIENT");
    assert!(h["seq"].as_str().unwrap().starts_with("201/"), "{h}");
    assert_eq!(serde_json::from_slice::<Value>(&body).unwrap()["id"], "c");
}

/// A TCP subscriber whose token is removed from the tokens file is sent SERVER_GOODBYE and
/// closed, however it keeps its connection busy (a review found it kept receiving pushes for
/// as long as it sent anything but heartbeats).
#[test]
fn a_subscriber_whose_token_is_revoked_is_said_goodbye() {
    let (b, dir) = super::governance::broker_with(
        "tcp-revoke",
        &[("alice", None, "alice-secret"), ("bob", None, "bob-secret")],
        r#"
[[acl]]
id = "bob-reads-topics"
principal = "bob"
resource = "topic:*"
actions = ["SUBSCRIBE"]
effect = "ALLOW"

[[acl]]
id = "bob-reads-subscriptions"
principal = "bob"
resource = "subscription:*"
actions = ["SUBSCRIBE"]
effect = "ALLOW"
"#,
        &["--tcp-listen", "127.0.0.1:0"],
    );
    let mut c = Tcp::connect(&b);
    assert_eq!(c.hello("g", "sub", "bob-secret")["code"], 0);
    assert_eq!(c.subscribe("orders", "CLUSTERING", "ASYNC")["code"], 0);
    c.call("LISTEN_REQUEST", "LISTEN_RESPONSE", json!({}), b"");
    let line = json!({"principal": "alice", "sha256": super::governance::sha256_hex("alice-secret")});
    std::fs::write(dir.join("tokens.new"), format!("{line}\n")).unwrap();
    std::fs::rename(dir.join("tokens.new"), dir.join("tokens.jsonl")).unwrap();
    let started = Instant::now();
    let (h, _) = c.expect("SERVER_GOODBYE_REQUEST");
    assert_eq!(h["code"], 1);
    assert!(h["desc"].as_str().unwrap().contains("revoked"), "{h}");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(c.read().is_none(), "closed after the goodbye");
}

/// Publishes that came in the same read as a broken frame are stored and answered before the
/// goodbye (they wait as a round while the reader looks further).
#[test]
fn publishes_before_a_broken_frame_are_answered_before_the_goodbye() {
    let b = TestBroker::start(&["--tcp-listen", "127.0.0.1:0"]);
    let mut c = Tcp::connect(&b);
    c.hello("g", "pub", "");
    let mut burst = Vec::new();
    for (i, seq) in ["p1", "p2"].iter().enumerate() {
        let header = json!({"cmd": "ASYNC_MESSAGE_TO_SERVER", "code": 0, "seq": seq, "properties": mesh()});
        burst.extend(frame(&header, &mesh_message("round", &format!("m{i}"))));
    }
    burst.extend_from_slice(b"EventMesh0000\x00\x00\x00\x12\x00\x00\x00\x05{oops");
    c.s.write_all(&burst).unwrap();
    for seq in ["p1", "p2"] {
        let (h, _) = c.read().expect("an ACK");
        assert_eq!(
            (h["cmd"].as_str(), h["seq"].as_str(), h["code"].as_i64()),
            (Some("ASYNC_MESSAGE_TO_SERVER_ACK"), Some(seq), Some(0))
        );
    }
    let (h, _) = c.read().expect("the goodbye");
    assert_eq!(h["cmd"], "SERVER_GOODBYE_REQUEST");
    assert!(c.read().is_none());
    let stored: Vec<Value> = (0..2).flat_map(|p| b.events("round", p)).map(|(_, e)| e).collect();
    assert_eq!(stored.len(), 2, "{stored:?}");
}
