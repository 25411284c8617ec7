//! CloudEvents published over WebSocket (`GET /events/ws?publish=T`), with an independent client
//! (tungstenite): answers in order, stored as `POST /events/publish` stores, and the session's
//! budgets (message size, binary messages, idle time, rate limits) enforced.

use std::net::TcpStream;

use serde_json::{json, Value};
use tungstenite::protocol::frame::coding::CloseCode;
use tungstenite::stream::MaybeTlsStream;
use tungstenite::{Message, WebSocket};

use super::util::{event, TestBroker};

type Ws = WebSocket<MaybeTlsStream<TcpStream>>;

fn publisher(b: &TestBroker, topic: &str) -> Ws {
    let stream = TcpStream::connect(b.traffic).unwrap();
    let url = format!("ws://{}/events/ws?publish={topic}", b.traffic);
    let mut req = tungstenite::client::IntoClientRequest::into_client_request(url).unwrap();
    req.headers_mut().insert("sec-websocket-protocol", "cloudevents.json".parse().unwrap());
    let (ws, resp) = tungstenite::client(req, MaybeTlsStream::Plain(stream)).unwrap();
    assert_eq!(resp.headers().get("sec-websocket-protocol").unwrap(), "cloudevents.json");
    ws
}

fn answer(ws: &mut Ws) -> Value {
    match ws.read().unwrap() {
        Message::Text(t) => serde_json::from_str(&t).unwrap(),
        other => panic!("{other:?}"),
    }
}

fn closed_with(ws: &mut Ws) -> CloseCode {
    loop {
        match ws.read() {
            Ok(Message::Close(Some(f))) => return f.code,
            Ok(Message::Text(_)) => continue,
            other => panic!("{other:?}"),
        }
    }
}

/// Sent without waiting (pipelined), answered in order; a bad event is answered with 400 and
/// its neighbours are stored; what is stored is what `POST /events/publish` would store.
#[test]
fn events_published_over_websocket_are_answered_in_order_and_stored() {
    let b = TestBroker::start(&["--default-partitions", "1"]);
    let mut ws = publisher(&b, "wsp");
    for i in 0..40 {
        let mut e = event(&format!("w{i}"));
        if i == 7 {
            e.as_object_mut().unwrap().remove("source");
        }
        ws.send(Message::text(e.to_string())).unwrap();
    }
    ws.send(Message::text("{not json")).unwrap();
    let mut offset = 0;
    for i in 0..40 {
        let a = answer(&mut ws);
        assert_eq!(a["id"], format!("w{i}"));
        if i == 7 {
            assert_eq!((a["type"].as_str(), a["status"].as_u64()), (Some("error"), Some(400)), "{a}");
            assert!(a["detail"].as_str().unwrap().contains("source"), "{a}");
            continue;
        }
        assert_eq!(a["type"], "published", "{a}");
        assert_eq!(a["partition"], 0);
        assert_eq!(a["offset"], offset.to_string(), "offsets are strings: {a}");
        offset += 1;
    }
    let bad = answer(&mut ws);
    assert_eq!((bad["type"].as_str(), bad["status"].as_u64(), &bad["id"]), (Some("error"), Some(400), &Value::Null));
    let ids: Vec<String> = b.events("wsp", 0).into_iter().map(|(_, e)| e["id"].as_str().unwrap().to_owned()).collect();
    let want: Vec<String> = (0..40).filter(|&i| i != 7).map(|i| format!("w{i}")).collect();
    assert_eq!(ids, want);
    // HTTP publishes to the same topic continue the same offsets.
    assert_eq!(b.publish("wsp", &event("http")).json()["offset"], 39);
    ws.close(None).unwrap();
}

/// More messages than one round takes (256), sent before any answer is read: every one is
/// answered, in order, without waiting for more bytes from the client.
#[test]
fn a_backlog_past_one_round_is_answered_without_more_input() {
    let b = TestBroker::start(&["--default-partitions", "1", "--idle-timeout-ms", "60000"]);
    let mut ws = publisher(&b, "wsr");
    let n = 700;
    for i in 0..n {
        ws.write(Message::text(event(&format!("r{i}")).to_string())).unwrap();
    }
    ws.flush().unwrap();
    for i in 0..n {
        let a = answer(&mut ws);
        assert_eq!((a["type"].as_str(), a["offset"].as_str()), (Some("published"), Some(i.to_string().as_str())));
    }
    assert_eq!(b.events("wsr", 0).len(), n);
}

/// A bad topic is refused before the upgrade, with the status a publish would get.
#[test]
fn a_bad_topic_is_refused_before_the_upgrade() {
    let b = TestBroker::start(&[]);
    let r = b.client().request(
        "GET",
        "/events/ws?publish=bad%20topic",
        &[
            ("upgrade", "websocket"),
            ("connection", "Upgrade"),
            ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
            ("sec-websocket-version", "13"),
        ],
        b"",
    );
    r.assert_problem(400);
}

/// Over the message size: 1009; a binary message: 1003 (the binding sends events as text);
/// silent for idle_timeout: 1001.
#[test]
fn oversized_binary_and_idle_publishers_are_closed_with_their_codes() {
    let b = TestBroker::start(&["--ws-max-message-bytes", "2000", "--idle-timeout-ms", "300"]);
    let mut ws = publisher(&b, "wsb");
    let mut big = event("big");
    big["data"] = json!("x".repeat(3000));
    ws.send(Message::text(big.to_string())).unwrap();
    assert_eq!(closed_with(&mut ws), CloseCode::Size);
    let mut ws = publisher(&b, "wsb");
    ws.send(Message::binary(b"{}".to_vec())).unwrap();
    assert_eq!(closed_with(&mut ws), CloseCode::Unsupported);
    let mut ws = publisher(&b, "wsb");
    ws.send(Message::text(event("one").to_string())).unwrap();
    assert_eq!(answer(&mut ws)["type"], "published");
    let started = std::time::Instant::now();
    assert_eq!(closed_with(&mut ws), CloseCode::Away);
    assert!(started.elapsed() >= std::time::Duration::from_millis(250), "{:?}", started.elapsed());
}

/// A publisher that trickles a frame a byte at a time, each byte within `idle_timeout` of the
/// last, never finishing it: `idle_timeout` after its last whole frame it is closed with 1001,
/// however many bytes still arrive (the timeout once restarted on every read, so it held its
/// connection forever).
#[test]
fn a_publisher_trickling_an_unfinished_frame_is_closed_after_idle_timeout() {
    use std::io::Write;
    use std::time::{Duration, Instant};
    let b = TestBroker::start(&["--idle-timeout-ms", "300"]);
    let mut ws = publisher(&b, "wst");
    let MaybeTlsStream::Plain(s) = ws.get_mut() else { unreachable!() };
    s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let frame = masked_text(event("slow").to_string().as_bytes());
    let started = Instant::now();
    let mut sent = 0;
    let code = loop {
        assert!(started.elapsed() < Duration::from_secs(10), "still open after {sent} bytes");
        if sent < frame.len() - 1 {
            let MaybeTlsStream::Plain(s) = ws.get_mut() else { unreachable!() };
            if s.write_all(&frame[sent..sent + 1]).is_err() {
                panic!("the connection was dropped without a close frame");
            }
            sent += 1;
        }
        match ws.read() {
            Ok(Message::Close(Some(f))) => break f.code,
            Ok(other) => panic!("{other:?}"),
            Err(tungstenite::Error::Io(e))
                if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(code, CloseCode::Away);
    assert!(sent < frame.len() - 1, "closed only once the trickle stopped ({sent} bytes)");
    assert!(started.elapsed() >= Duration::from_millis(250), "{:?}", started.elapsed());
}

/// The topic's rate limit answers 429 for the events over it; the session goes on.
#[test]
fn a_rate_limited_publisher_gets_429_answers_and_goes_on() {
    let b = TestBroker::start(&["--default-partitions", "1"]);
    let body = json!({"scope": "topic:wsl", "eventsPerSecond": 1, "burst": 3}).to_string();
    let r = b.admin().request("PUT", "/admin/limits/wsl", &[("content-type", "application/json")], body.as_bytes());
    assert_eq!(r.status, 201, "{}", r.text());
    let mut ws = publisher(&b, "wsl");
    let mut statuses = Vec::new();
    for i in 0..6 {
        ws.send(Message::text(event(&format!("l{i}")).to_string())).unwrap();
        let a = answer(&mut ws);
        statuses.push(a["status"].as_u64().unwrap_or(202));
    }
    assert_eq!(statuses.iter().filter(|&&s| s == 202).count(), 3, "{statuses:?}");
    assert_eq!(statuses.iter().filter(|&&s| s == 429).count(), 3, "{statuses:?}");
    assert_eq!(b.events("wsl", 0).len(), 3);
}

/// A masked client text frame (RFC 6455: every client frame is masked).
fn masked_text(payload: &[u8]) -> Vec<u8> {
    let mask = [0x11u8, 0x22, 0x33, 0x44];
    let mut f = vec![0x81];
    match payload.len() {
        n @ 0..=125 => f.push(0x80 | n as u8),
        n => {
            f.push(0x80 | 126);
            f.extend_from_slice(&(n as u16).to_be_bytes());
        }
    }
    f.extend_from_slice(&mask);
    f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    f
}

/// A publisher that floods events and never reads its answers: the broker stops reading once
/// its answers cannot be written (the client cannot push without bound, the broker's memory
/// stays flat), drops it after write_timeout, and serves others meanwhile.
#[test]
fn a_publisher_that_never_reads_its_answers_is_bounded_and_dropped() {
    use std::io::{Read, Write};
    use std::time::Duration;
    let b = TestBroker::start(&["--default-partitions", "1", "--write-timeout-ms", "500"]);
    let rss_before = b.rss_bytes();
    let mut s = TcpStream::connect(b.traffic).unwrap();
    s.write_all(super::ws::upgrade_request("/events/ws?publish=flood").as_bytes()).unwrap();
    super::ws::read_101(&mut s);
    let chunk = masked_text(event("f").to_string().as_bytes()).repeat(500);
    s.set_write_timeout(Some(Duration::from_secs(3))).unwrap();
    let mut sent = 0usize;
    while sent < 256 << 20 && s.write_all(&chunk).is_ok() {
        sent += chunk.len();
    }
    assert!(sent < 64 << 20, "the client pushed {sent} bytes: the broker kept reading");
    let grown = b.rss_bytes().saturating_sub(rss_before);
    assert!(grown < 64 << 20, "the broker grew by {grown} bytes");
    assert_eq!(b.publish("bystander", &event("b")).status, 202, "others are served");
    // Dropped: what is left to read ends (answers written before the stall, then the end).
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut sink = vec![0u8; 64 << 10];
    loop {
        match s.read(&mut sink) {
            Ok(0) => break,
            Ok(_) => continue,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                panic!("the broker kept the connection of a publisher that does not read")
            }
            Err(_) => break,
        }
    }
}

/// A route that moves an event: its answer names the topic it went to (as the HTTP answer
/// does), kept events are answered without one, and copies do not shift the placements of the
/// events after them in the same round.
#[test]
fn routed_events_are_answered_where_they_went() {
    let b = TestBroker::start(&["--default-partitions", "1"]);
    let put = |id: &str, body: Value| {
        let body = body.to_string();
        b.admin().request(
            "PUT",
            &format!("/admin/routes/{id}"),
            &[("content-type", "application/json")],
            body.as_bytes(),
        )
    };
    let eu = json!({"topic": "wso", "condition": "region = 'eu'", "targets": ["wso.eu"], "mode": "move"});
    assert_eq!(put("eu", eu).status, 201);
    assert_eq!(put("audit", json!({"topic": "wso", "condition": "TRUE", "targets": ["wso.audit"]})).status, 201);
    let mut ws = publisher(&b, "wso");
    let regions = ["eu", "us", "eu", "us", "us"];
    for (i, r) in regions.iter().enumerate() {
        let mut e = event(&format!("o{i}"));
        e["region"] = json!(r);
        ws.write(Message::text(e.to_string())).unwrap();
    }
    ws.flush().unwrap();
    let (mut eu_at, mut us_at) = (0, 0);
    for (i, r) in regions.iter().enumerate() {
        let a = answer(&mut ws);
        assert_eq!((a["type"].as_str(), &a["id"]), (Some("published"), &json!(format!("o{i}"))), "{a}");
        if *r == "eu" {
            assert_eq!(a["topic"], "wso.eu", "{a}");
            assert_eq!(a["offset"], eu_at.to_string());
            eu_at += 1;
        } else {
            assert!(a.get("topic").is_none(), "{a}");
            assert_eq!(a["offset"], us_at.to_string());
            us_at += 1;
        }
    }
    let ids = |t: &str| -> Vec<String> {
        b.events(t, 0).into_iter().map(|(_, e)| e["id"].as_str().unwrap().to_owned()).collect()
    };
    assert_eq!(ids("wso"), ["o1", "o3", "o4"]);
    assert_eq!(ids("wso.eu"), ["o0", "o2"]);
    assert_eq!(ids("wso.audit").len(), 5, "every event copied");
}

/// SPEC: a `{"type":"publish","topic":T,"event":{...}}` message on any session publishes as
/// `?publish=T` does. On an acknowledged delivery session (whose ack / nack / credit messages
/// are parsed first): the answers come in order, the event published to the session's own
/// topic is delivered to it and acked, refusals are answered without closing the session, and
/// what is stored is the event as sent.
#[test]
fn a_publish_message_on_a_delivery_session_is_published_and_answered() {
    use super::delivery::{attach, next_event};
    use std::time::{Duration, Instant};
    let b = TestBroker::start(&["--default-partitions", "1", "--max-body-bytes", "4096"]);
    let def = json!({"subscription": "loop", "topic": "loop"});
    assert_eq!(b.client().post("/events/subscribe", "application/json", def.to_string().as_bytes()).status, 201);
    let mut ws = attach(&b, "subscription=loop");
    let publish = |topic: Option<&str>, event: Value| {
        let mut m = json!({"type": "publish", "event": event});
        if let Some(t) = topic {
            m["topic"] = json!(t);
        }
        Message::text(m.to_string())
    };
    ws.send(publish(Some("loop"), event("p1"))).unwrap();
    ws.send(publish(Some("elsewhere"), event("p2"))).unwrap();
    ws.send(publish(None, event("p3"))).unwrap();
    ws.send(publish(Some("bad topic!"), event("p4"))).unwrap();
    ws.send(publish(Some("loop"), json!({"id": "p5", "source": "/it"}))).unwrap();
    ws.send(publish(Some("agent.x"), event("p6"))).unwrap();
    let mut big = event("p7");
    big["data"] = json!("x".repeat(5000));
    ws.send(publish(Some("loop"), big)).unwrap();
    // The answers, in order, and the delivery of p1 somewhere among them.
    let (mut answers, mut delivered) = (Vec::new(), None);
    let start = Instant::now();
    while answers.len() < 7 || delivered.is_none() {
        assert!(start.elapsed() < Duration::from_secs(10), "answers {answers:?}, delivered {delivered:?}");
        match next_event(&mut ws) {
            Some(m) if m["specversion"] == "1.0" => delivered = Some(m),
            Some(m) => answers.push(m),
            None => {}
        }
    }
    let got: Vec<(Value, Value, Value)> =
        answers.iter().map(|a| (a["type"].clone(), a["id"].clone(), a["status"].clone())).collect();
    assert_eq!(
        got,
        [
            (json!("published"), json!("p1"), Value::Null),
            (json!("published"), json!("p2"), Value::Null),
            (json!("error"), json!("p3"), json!(400)),
            (json!("error"), json!("p4"), json!(400)),
            (json!("error"), json!("p5"), json!(400)),
            (json!("error"), json!("p6"), json!(403)),
            (json!("error"), Value::Null, json!(413)),
        ],
        "{answers:?}"
    );
    assert_eq!((&answers[0]["partition"], &answers[0]["offset"]), (&json!(0), &json!("0")));
    assert!(answers[4]["detail"].as_str().unwrap().contains("specversion"), "{}", answers[4]);
    let delivered = delivered.unwrap();
    assert_eq!(delivered["id"], "p1");
    assert_eq!(b.events("loop", 0)[0].1, event("p1"));
    assert_eq!(b.events("elsewhere", 0)[0].1, event("p2"));
    // The session still delivers and takes acks: acked, p1 is not redelivered.
    ws.send(Message::text(json!({"type": "ack", "ids": [delivered["emdeliveryid"]]}).to_string())).unwrap();
    super::util::wait_for(Duration::from_secs(10), || {
        let subs = b.admin().get("/admin/subscriptions").json();
        let c = &subs[0]["partitions"][0]["consumers"][0];
        (c["committed"].as_u64() == Some(1)).then_some(())
    });
    // An ack=none session publishes the same way.
    let def = json!({"subscription": "live", "topic": "loop", "mode": "BROADCAST"});
    assert_eq!(b.client().post("/events/subscribe", "application/json", def.to_string().as_bytes()).status, 201);
    let mut live = attach(&b, "subscription=live&ack=none");
    live.send(publish(Some("loop"), event("p8"))).unwrap();
    let a =
        super::util::wait_for(Duration::from_secs(10), || next_event(&mut live).filter(|m| m["type"] == "published"));
    assert_eq!((&a["id"], &a["offset"]), (&json!("p8"), &json!("1")));
}
