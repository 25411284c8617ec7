//! Session pub/sub (Mode 2): publish to a session (201), one subscriber at a time (409 for a
//! second) over SSE or WebSocket, replaying from the head of the session then following it;
//! `Last-Event-ID` resumes; everything published before a kill -9 is replayed after it.

use std::net::TcpStream;
use std::time::Duration;

use serde_json::{json, Value};

use super::acked::Sse;
use super::util::{event, wait_for, TestBroker};

fn publish(b: &TestBroker, sid: &str, id: &str) -> Value {
    let r = b.client().post(
        &format!("/session/publish/{sid}"),
        "application/cloudevents+json",
        event(id).to_string().as_bytes(),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    r.json()
}

fn websocket(b: &TestBroker, sid: &str) -> tungstenite::WebSocket<TcpStream> {
    let stream = TcpStream::connect(b.traffic).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    tungstenite::client(format!("ws://{}/session/subscribe/{sid}", b.traffic), stream).unwrap().0
}

fn ws_next(ws: &mut tungstenite::WebSocket<TcpStream>) -> Value {
    loop {
        match ws.read().unwrap() {
            tungstenite::Message::Text(t) => return serde_json::from_str(t.as_str()).unwrap(),
            tungstenite::Message::Ping(_) | tungstenite::Message::Pong(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[test]
fn one_subscriber_replays_the_session_from_its_head_then_follows_it() {
    for driver in ["epoll", "uring"] {
        let b = TestBroker::start(&["--io-driver", driver, "--shards", "4"]);
        for i in 0..3 {
            assert_eq!(publish(&b, "s-1", &format!("e{i}")), json!({"partition": 0, "offset": i}));
        }
        let mut sse = Sse::open_path(&b, "/session/subscribe/s-1", None);
        for i in 0..3 {
            let (id, e) = sse.next();
            assert_eq!((id.as_str(), e["id"].as_str()), (i.to_string().as_str(), Some(format!("e{i}").as_str())));
            assert_eq!(e["emoffset"], i.to_string());
        }
        publish(&b, "s-1", "e3");
        assert_eq!(sse.next().1["id"], "e3", "{driver}: live after the replay");
        // A second subscriber of the same session: 409, on either transport.
        b.client().get("/session/subscribe/s-1").assert_problem(409);
        // Other sessions are not mixed in.
        publish(&b, "s-2", "other");
        publish(&b, "s-1", "e4");
        assert_eq!(sse.next().1["id"], "e4");
        drop(sse);
        // The first one gone, a WebSocket subscriber gets the whole session again, then more.
        let mut ws = wait_for(Duration::from_secs(5), || {
            let stream = TcpStream::connect(b.traffic).unwrap();
            stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            tungstenite::client(format!("ws://{}/session/subscribe/s-1", b.traffic), stream).ok().map(|(ws, _)| ws)
        });
        let replayed: Vec<Value> = (0..5).map(|_| ws_next(&mut ws)["id"].clone()).collect();
        assert_eq!(replayed, ["e0", "e1", "e2", "e3", "e4"]);
        publish(&b, "s-1", "e5");
        assert_eq!(ws_next(&mut ws)["id"], "e5");
        // Resuming after the last id seen.
        drop(ws);
        let mut resumed =
            wait_for(Duration::from_secs(5), || Sse::try_open_path(&b, "/session/subscribe/s-1", Some("3")).ok());
        assert_eq!(resumed.next().1["id"], "e4");
        assert_eq!(resumed.next().1["id"], "e5");
    }
}

#[test]
fn a_subscriber_replays_everything_published_before_a_kill_9() {
    let mut b = TestBroker::start(&[]);
    for i in 0..5 {
        publish(&b, "crash", &format!("c{i}"));
    }
    b.kill9();
    b.restart();
    let mut ws = websocket(&b, "crash");
    let got: Vec<Value> = (0..5).map(|_| ws_next(&mut ws)["id"].clone()).collect();
    assert_eq!(got, ["c0", "c1", "c2", "c3", "c4"]);
    publish(&b, "crash", "c5");
    assert_eq!(ws_next(&mut ws)["id"], "c5");
}

#[test]
fn bad_session_requests_are_refused() {
    let b = TestBroker::start(&[]);
    let body = event("x").to_string();
    let post = |path: &str| b.client().post(path, "application/cloudevents+json", body.as_bytes());
    post("/session/publish/a%20b").assert_problem(400);
    post(&format!("/session/publish/{}", "x".repeat(201))).assert_problem(400);
    b.client().get("/session/publish/s").assert_problem(405);
    post("/session/subscribe/s").assert_problem(405);
    post("/session/other/s").assert_problem(404);
    let not_an_offset = [("last-event-id", "yesterday")];
    b.client().request("GET", "/session/subscribe/s", &not_an_offset, b"").assert_problem(400);
    b.client().post("/session/publish/s", "application/cloudevents+json", b"{").assert_problem(400);
    // A Mode 1 session id (agent:uuid) is a valid session.
    let r = post("/session/publish/agent-1:0b7e2c9e-8a8e-4b52-9a4e-2f0c1d3e4a5b");
    assert_eq!(r.status, 201, "{}", r.text());
}

#[test]
fn a_followed_session_is_not_expired_while_an_idle_one_is() {
    let b = TestBroker::start(&["--lite-topic-ttl-ms", "300", "--retention-check-ms", "100"]);
    publish(&b, "kept", "k0");
    publish(&b, "idle", "i0");
    let mut ws = websocket(&b, "kept");
    assert_eq!(ws_next(&mut ws)["id"], "k0");
    let expired = || super::request::metric(&b, "evmesh_lite_topics_expired_total", "");
    wait_for(Duration::from_secs(10), || (expired() >= 1).then_some(()));
    // Well past the TTL: the idle one went, the followed one kept its offsets.
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(expired(), 1);
    assert_eq!(publish(&b, "kept", "k1")["offset"], 1);
    assert_eq!(ws_next(&mut ws)["id"], "k1");
    assert_eq!(publish(&b, "idle", "i1")["offset"], 0, "the idle one started over");
    // Lite topics are neither transformed nor routed.
    b.admin().request("PUT", "/admin/transformers/session.kept", &[], b"{}").assert_problem(400);
}

#[test]
fn a_batch_published_to_a_session_is_answered_in_order() {
    let b = TestBroker::start(&[]);
    let batch = json!([event("a"), event("b")]).to_string();
    let r = b.client().post("/session/publish/batch", "application/cloudevents-batch+json", batch.as_bytes());
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(r.text(), r#"{"results":[{"partition":0,"offset":0},{"partition":0,"offset":1}]}"#);
    let r =
        b.client().post("/session/publish/batch", "application/cloudevents+json", event("c").to_string().as_bytes());
    assert_eq!(r.text(), r#"{"partition":0,"offset":2}"#);
}
