//! Request-reply: requests through a subscription to a WebSocket responder, replies by frame and
//! by `POST /events/reply`, the deadline (504, dropped at dispatch, late replies 404), never a
//! redelivery or a dead letter, the requester's disconnect, the bounds, replies across shards.

use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tungstenite::Message;

use super::acked::{quiet, recv, subscribe};
use super::delivery::{attach, Ws};
use super::util::{event, wait_for, Client, Resp, TestBroker};

/// A request sent on its own thread (it blocks until the reply or the deadline).
pub(super) fn request_async(
    b: &TestBroker,
    topic: &str,
    timeout_ms: u64,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
) -> std::thread::JoinHandle<(Option<Resp>, Duration)> {
    let addr = b.traffic;
    let path = format!("/events/request?topic={topic}&timeoutMs={timeout_ms}");
    std::thread::spawn(move || {
        let started = Instant::now();
        let h: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        let mut c = Client::connect(addr);
        c.send_raw(&super::util::request_bytes("POST", &path, &h, &body));
        // None: the broker went away first (the kill -9 test).
        let r = c.read_response();
        (r, started.elapsed())
    })
}

fn structured() -> Vec<(String, String)> {
    vec![("content-type".into(), "application/cloudevents+json".into())]
}

/// A responder's WebSocket reply frame answering `request` with `data`.
fn reply_frame(request: &Value, data: Value) -> Message {
    let reply = json!({
        "specversion": "1.0", "id": format!("re-{}", request["id"].as_str().unwrap()), "source": "/responder",
        "type": "reply", "emcorrelationid": request["emcorrelationid"], "data": data,
    });
    Message::text(json!({"type": "reply", "event": reply}).to_string())
}

fn ack(ws: &mut Ws, e: &Value) {
    ws.send(Message::text(json!({"type": "ack", "ids": [e["emdeliveryid"]]}).to_string())).unwrap();
}

fn responder(b: &TestBroker, topic: &str, sub: &str) -> Ws {
    subscribe(b, json!({"subscription": sub, "topic": topic, "mode": "LOAD_BALANCE", "start": "earliest"}));
    attach(b, &format!("subscription={sub}"))
}

/// A value of the admin listener's metrics (summed over shards and labels matching `labels`).
pub(super) fn metric(b: &TestBroker, name: &str, labels: &str) -> u64 {
    let text = b.admin().get("/metrics").text();
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with('{') && l.contains(labels))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

#[test]
fn round_trip_by_frame_and_by_post_in_every_content_mode() {
    for driver in ["epoll", "uring"] {
        let b = TestBroker::start(&["--io-driver", driver]);
        let mut ws = responder(&b, "rpc", "responders");
        // Structured in, WebSocket reply frame back.
        let ev = json!({"specversion": "1.0", "id": "q1", "source": "/client", "type": "ask",
                        "emcorrelationid": "forged", "data": {"n": 1}});
        let before = evmesh::adaptor::rfc3339_from_micros(evmesh::model::clock::now_micros() + 5_000_000);
        let pending = request_async(&b, "rpc", 5000, structured(), ev.to_string().into_bytes());
        let req = recv(&mut ws, Duration::from_secs(5));
        let after = evmesh::adaptor::rfc3339_from_micros(evmesh::model::clock::now_micros() + 5_000_000);
        let id = req["emcorrelationid"].as_str().unwrap();
        // 1.<instance>.<shard>.<slot>.<gen>.<token>: the instance tag names this instance.
        assert!(id.starts_with("1.") && id.split('.').count() == 6 && id != "forged", "{req}");
        assert_eq!(req["emreplyto"], format!("http://{}/events/reply", b.traffic));
        let expiry = req["emexpiry"].as_str().unwrap();
        assert!(before.as_str() <= expiry && expiry <= after.as_str(), "{before} <= {expiry} <= {after}");
        assert_eq!(req["emattempt"], 1);
        assert_eq!(req["data"], json!({"n": 1}));
        ws.send(reply_frame(&req, json!({"answer": 2}))).unwrap();
        ack(&mut ws, &req);
        let r = pending.join().unwrap().0.expect("a response");
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("content-type"), Some("application/cloudevents+json"));
        let reply = r.json();
        assert_eq!(reply["data"], json!({"answer": 2}));
        assert_eq!(reply["id"], "re-q1");
        assert_eq!(reply["emcorrelationid"], req["emcorrelationid"]);

        // Binary in, POST /events/reply back, reply in binary mode because Accept asked.
        let headers = vec![
            ("ce-specversion".to_string(), "1.0".to_string()),
            ("ce-id".into(), "q2".into()),
            ("ce-source".into(), "/client".into()),
            ("ce-type".into(), "ask".into()),
            ("content-type".into(), "text/plain".into()),
            ("accept".into(), "application/json".into()),
        ];
        let pending = request_async(&b, "rpc", 5000, headers, b"two?".to_vec());
        let req = recv(&mut ws, Duration::from_secs(5));
        assert_eq!(req["data"], "two?");
        let reply = json!({"specversion": "1.0", "id": "re-q2", "source": "/responder", "type": "reply",
                           "emcorrelationid": req["emcorrelationid"], "datacontenttype": "application/json",
                           "data": {"answer": "two"}});
        let r = b.client().post("/events/reply", "application/cloudevents+json", reply.to_string().as_bytes());
        assert_eq!(r.status, 202, "{}", r.text());
        ack(&mut ws, &req);
        let r = pending.join().unwrap().0.expect("a response");
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("ce-id"), Some("re-q2"));
        assert_eq!(r.header("content-type"), Some("application/json"));
        assert_eq!(serde_json::from_str::<Value>(&r.text()).unwrap(), json!({"answer": "two"}));
        // The same reply again: nobody waits for it any more.
        let again = b.client().post("/events/reply", "application/cloudevents+json", reply.to_string().as_bytes());
        again.assert_problem(404);
        assert_eq!(metric(&b, "evmesh_requests_total", "outcome=\"replied\""), 2, "{driver}");
    }
}

#[test]
fn deadline_is_504_late_and_unknown_replies_are_404_bad_ones_400() {
    let b = TestBroker::start(&["--max-request-timeout-ms", "1000"]);
    let ev = event("q1");
    // Nobody answers: 504 at the deadline, capped by max_request_timeout_ms.
    let started = Instant::now();
    let r = b.client().request(
        "POST",
        "/events/request?topic=rpc&timeoutMs=999999",
        &[("content-type", "application/cloudevents+json")],
        ev.to_string().as_bytes(),
    );
    let waited = started.elapsed();
    r.assert_problem(504);
    assert!(waited >= Duration::from_millis(950) && waited < Duration::from_secs(5), "{waited:?}");
    let stored = b.events("rpc", 0).into_iter().chain(b.events("rpc", 1)).next().expect("the request is stored").1;
    let expiry = evmesh::adaptor::rfc3339_micros(stored["emexpiry"].as_str().unwrap()).unwrap();
    assert!(expiry <= evmesh::model::clock::now_micros(), "capped to 1 s: {stored}");
    // Its reply, now late.
    let mut reply = event("re-q1");
    reply["emcorrelationid"] = stored["emcorrelationid"].clone();
    let post = |v: &Value| b.client().post("/events/reply", "application/cloudevents+json", v.to_string().as_bytes());
    post(&reply).assert_problem(404);
    for forged in ["1.0.0.0.1.0", "1.0.1.7.1.123", "1.0.ffff.0.1.0", "nonsense", "", "1.0.0.0.1.0.0"] {
        reply["emcorrelationid"] = json!(forged);
        post(&reply).assert_problem(404);
    }
    assert!(metric(&b, "evmesh_replies_unmatched_total", "") >= 7);
    post(&event("no-id")).assert_problem(400);
    // A reply whose content type would split the requester's response head.
    let mut split = event("split");
    split["emcorrelationid"] = json!("1.0.0.0.1.0");
    split["datacontenttype"] = json!("text/plain\r\nset-cookie: x=1");
    post(&split).assert_problem(400);
    let batch = json!([event("a"), event("b")]).to_string();
    for path in ["/events/request?topic=rpc", "/events/reply"] {
        b.client().post(path, "application/cloudevents-batch+json", batch.as_bytes()).assert_problem(400);
    }
    let body = ev.to_string();
    for bad in ["timeoutMs=0", "timeoutMs=-5", "timeoutMs=soon"] {
        let path = format!("/events/request?topic=rpc&{bad}");
        b.client().post(&path, "application/cloudevents+json", body.as_bytes()).assert_problem(400);
    }
    b.client().post("/events/request", "application/cloudevents+json", body.as_bytes()).assert_problem(400);
    b.client().get("/events/request?topic=rpc").assert_problem(405);
    assert_eq!(metric(&b, "evmesh_requests_total", "outcome=\"timed_out\""), 1);
}

#[test]
fn expired_requests_are_dropped_at_dispatch() {
    let b = TestBroker::start(&[]);
    subscribe(&b, json!({"subscription": "late", "topic": "rpc", "mode": "LOAD_BALANCE", "start": "earliest"}));
    let ev = event("q-expired");
    let r = b.client().request(
        "POST",
        "/events/request?topic=rpc&timeoutMs=100",
        &[("content-type", "application/cloudevents+json")],
        ev.to_string().as_bytes(),
    );
    r.assert_problem(504);
    b.publish("rpc", &event("plain"));
    let mut ws = attach(&b, "subscription=late");
    let got = recv(&mut ws, Duration::from_secs(5));
    assert_eq!(got["id"], "plain");
    quiet(&mut ws, Duration::from_millis(300));
    assert_eq!(metric(&b, "evmesh_requests_expired_total", ""), 1);
}

#[test]
fn requests_are_never_redelivered_nor_dead_lettered() {
    let mut b = TestBroker::start(&["--shards", "1"]);
    let def = json!({"subscription": "once", "topic": "rpc", "mode": "LOAD_BALANCE", "start": "earliest",
                     "ackTimeoutMs": 100, "maxAttempts": 1});
    subscribe(&b, def);
    let ask = |id: &str| {
        let ev = event(id);
        request_async(&b, "rpc", 20_000, structured(), ev.to_string().into_bytes())
    };
    let mut ws = attach(&b, "subscription=once");
    // Not acked within ackTimeoutMs: settled, not redelivered.
    let _t1 = ask("timeout");
    assert_eq!(recv(&mut ws, Duration::from_secs(5))["id"], "timeout");
    quiet(&mut ws, Duration::from_millis(700));
    // Nacked: settled too.
    let _t2 = ask("nacked");
    let e = recv(&mut ws, Duration::from_secs(5));
    assert_eq!(e["id"], "nacked");
    ws.send(Message::text(json!({"type": "nack", "ids": [e["emdeliveryid"]]}).to_string())).unwrap();
    quiet(&mut ws, Duration::from_millis(500));
    // Its session leaves with it in flight: not given to the next session.
    let _t3 = ask("left");
    assert_eq!(recv(&mut ws, Duration::from_secs(5))["id"], "left");
    drop(ws);
    let mut ws = attach(&b, "subscription=once");
    quiet(&mut ws, Duration::from_millis(500));
    // In flight across a kill -9 (its attempt on record, its session still attached): not
    // redelivered, nor dead-lettered, after the restart.
    let _t4 = ask("crash");
    assert_eq!(recv(&mut ws, Duration::from_secs(5))["id"], "crash");
    b.kill9();
    drop(ws);
    b.restart();
    let mut ws = attach(&b, "subscription=once");
    b.publish("rpc", &event("after"));
    let e = recv(&mut ws, Duration::from_secs(5));
    assert_eq!(e["id"], "after", "{e}");
    ack(&mut ws, &e);
    assert_eq!(metric(&b, "evmesh_dead_lettered_total", ""), 0);
    assert_eq!(metric(&b, "evmesh_redeliveries_total", ""), 0);
    let dlq = b.admin().get("/admin/dlq/rpc");
    assert!(dlq.status == 404 || dlq.json().as_array().is_some_and(|a| a.is_empty()), "{}", dlq.text());
    // Every request is settled: the committed offset reaches the end.
    wait_for(Duration::from_secs(5), || {
        let subs = b.admin().get("/admin/subscriptions").json();
        let c = &subs[0]["partitions"][0]["consumers"][0];
        (c["lag"] == 0 && c["committed"] == 5).then_some(())
    });
}

#[test]
fn requester_disconnect_frees_its_slot_and_the_bound_is_429() {
    let b = TestBroker::start(&["--shards", "1", "--max-pending-requests", "2"]);
    let body = event("q").to_string();
    let head = |timeout: u64| {
        super::util::request_bytes(
            "POST",
            &format!("/events/request?topic=rpc&timeoutMs={timeout}"),
            &[("content-type", "application/cloudevents+json")],
            body.as_bytes(),
        )
    };
    // Two requesters wait; a third is refused at once.
    let mut waiting: Vec<TcpStream> = (0..2)
        .map(|_| {
            let mut c = Client::connect(b.traffic);
            c.send_raw(&head(30_000));
            c.stream
        })
        .collect();
    wait_for(Duration::from_secs(5), || (metric(&b, "evmesh_requests_pending", "") == 2).then_some(()));
    let r =
        b.client().post("/events/request?topic=rpc&timeoutMs=30000", "application/cloudevents+json", body.as_bytes());
    r.assert_problem(429);
    assert_eq!(r.header("retry-after"), Some("1"));
    // A bystander publish is unaffected.
    assert_eq!(b.publish("rpc", &event("bystander")).status, 202);
    // The requesters go away: their slots are free within a second, and their replies are 404.
    let stored: Vec<Value> = b.events("rpc", 0).into_iter().map(|(_, e)| e).filter(|e| e["id"] == "q").collect();
    waiting.clear();
    let started = Instant::now();
    wait_for(Duration::from_secs(5), || (metric(&b, "evmesh_requests_pending", "") == 0).then_some(()));
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    assert_eq!(metric(&b, "evmesh_requests_total", "outcome=\"abandoned\""), 2);
    for e in stored {
        let mut reply = event("late");
        reply["emcorrelationid"] = e["emcorrelationid"].clone();
        b.client()
            .post("/events/reply", "application/cloudevents+json", reply.to_string().as_bytes())
            .assert_problem(404);
    }
    let r = b.client().post("/events/request?topic=rpc&timeoutMs=50", "application/cloudevents+json", body.as_bytes());
    r.assert_problem(504);
}

#[test]
fn replies_reach_requesters_on_other_shards_in_one_hop() {
    let b = TestBroker::start(&["--shards", "4"]);
    let mut ws = responder(&b, "rpc", "responders");
    let n = 48; // all on other shards than the responder's: (3/4)^48, about 1e-6
    let pending: Vec<_> = (0..n)
        .map(|i| {
            let ev = event(&format!("q{i}"));
            request_async(&b, "rpc", 10_000, structured(), ev.to_string().into_bytes())
        })
        .collect();
    for _ in 0..n {
        let req = recv(&mut ws, Duration::from_secs(10));
        ws.send(reply_frame(&req, json!({"echo": req["id"]}))).unwrap();
        ack(&mut ws, &req);
    }
    for (i, p) in pending.into_iter().enumerate() {
        let r = p.join().unwrap().0.expect("a response");
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["data"], json!({"echo": format!("q{i}")}));
    }
    let cross = metric(&b, "evmesh_replies_cross_core_total", "");
    assert!(cross > 0 && cross < n as u64, "{cross} of {n} replies crossed cores");
}

#[test]
fn a_failed_websocket_reply_is_answered_and_the_session_goes_on() {
    let b = TestBroker::start(&[]);
    let mut ws = responder(&b, "rpc", "responders");
    let mut bogus = event("r");
    bogus["emcorrelationid"] = json!("1.0.0.0.1.0");
    ws.send(Message::text(json!({"type": "reply", "event": bogus}).to_string())).unwrap();
    let note = recv(&mut ws, Duration::from_secs(5));
    assert_eq!(note, json!({"type": "error", "id": "1.0.0.0.1.0", "status": 404, "detail": note["detail"]}));
    ws.send(Message::text(json!({"type": "reply", "event": {"id": "x"}}).to_string())).unwrap();
    assert_eq!(recv(&mut ws, Duration::from_secs(5))["status"], 400);
    ws.send(Message::text(json!({"type": "reply"}).to_string())).unwrap();
    assert_eq!(recv(&mut ws, Duration::from_secs(5))["status"], 400);
    // Members besides type and event are ignored (it is still a reply, answered as one).
    ws.send(Message::text(json!({"type": "reply", "event": bogus, "trace": 1}).to_string())).unwrap();
    assert_eq!(recv(&mut ws, Duration::from_secs(5))["status"], 404);
    b.publish("rpc", &event("still-here"));
    assert_eq!(recv(&mut ws, Duration::from_secs(5))["id"], "still-here");
}

#[test]
fn a_requester_gone_mid_wait_runs_nothing_it_pipelined_behind() {
    let b = TestBroker::start(&[]);
    let mut c = Client::connect(b.traffic);
    let body = event("q").to_string();
    let ct = [("content-type", "application/cloudevents+json")];
    let mut bytes =
        super::util::request_bytes("POST", "/events/request?topic=rpc&timeoutMs=30000", &ct, body.as_bytes());
    bytes.extend(super::util::request_bytes("POST", "/events/publish?topic=after", &ct, body.as_bytes()));
    c.send_raw(&bytes);
    wait_for(Duration::from_secs(5), || (metric(&b, "evmesh_requests_pending", "") == 1).then_some(()));
    c.stream.shutdown(std::net::Shutdown::Write).unwrap();
    let r = c.read_response().expect("the 499");
    assert_eq!(r.status, 499, "{}", r.text());
    assert!(c.read_response().is_none(), "the connection ends after the 499");
    b.admin().get("/admin/topics/after/partitions/0/events").assert_problem(404);
}

#[test]
fn a_request_with_every_attribute_it_may_carry_and_one_more() {
    let b = TestBroker::start(&[]);
    let with = |n: usize| {
        let mut e = event("q");
        for i in 0..n - 4 {
            e[format!("x{i}")] = json!("v");
        }
        e.to_string()
    };
    let ct = [("content-type", "application/cloudevents+json")];
    let r = b.client().request("POST", "/events/request?topic=rpc&timeoutMs=50", &ct, with(1021).as_bytes());
    r.assert_problem(504);
    let r = b.client().request("POST", "/events/request?topic=rpc&timeoutMs=50", &ct, with(1022).as_bytes());
    r.assert_problem(400);
}

#[test]
fn the_byte_budget_of_waiting_requests_refuses_with_429() {
    // Each request holds over 1 KiB (its buffered request and body): one always fits, a second
    // does not.
    let b = TestBroker::start(&["--shards", "1", "--max-pending-request-bytes", "1024"]);
    let mut e = event("q");
    e["data"] = json!("x".repeat(600));
    let body = e.to_string();
    let mut first = Client::connect(b.traffic);
    let ct = [("content-type", "application/cloudevents+json")];
    first.send_raw(&super::util::request_bytes(
        "POST",
        "/events/request?topic=rpc&timeoutMs=30000",
        &ct,
        body.as_bytes(),
    ));
    wait_for(Duration::from_secs(5), || (metric(&b, "evmesh_requests_pending", "") == 1).then_some(()));
    let r =
        b.client().post("/events/request?topic=rpc&timeoutMs=30000", "application/cloudevents+json", body.as_bytes());
    r.assert_problem(429);
    assert!(r.text().contains("max_pending_request_bytes"), "{}", r.text());
    drop(first);
    wait_for(Duration::from_secs(5), || (metric(&b, "evmesh_requests_pending", "") == 0).then_some(()));
    let r = b.client().post("/events/request?topic=rpc&timeoutMs=50", "application/cloudevents+json", body.as_bytes());
    r.assert_problem(504);
}

/// The same on the Kafka backend: a request read back from Kafka is still a request.
#[cfg(feature = "kafka")]
mod on_kafka {
    use super::super::util::{again_on_kafka, on_kafka};

    again_on_kafka!(
        round_trip_by_frame_and_by_post_in_every_content_mode,
        requests_are_never_redelivered_nor_dead_lettered
    );
}

/// The same on the RocketMQ backend: a request read back from RocketMQ is still a request.
#[cfg(feature = "rocketmq")]
mod on_rocketmq {
    use super::super::util::{again_on_rocketmq, on_rocketmq};

    again_on_rocketmq!(round_trip_by_frame_and_by_post_in_every_content_mode);
}
