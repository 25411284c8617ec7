//! Webhook sinks: subscriptions with a `sink` get every event POSTed, driven against a sink
//! written with Python's standard library (`tests/interop/python_sink.py`), which verifies the
//! signature itself and reports every request it got (headers, arrival time, how many were in
//! flight). Failing, deferring (`Retry-After`), slow and hanging sinks; order per partition;
//! restarts and removal.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::acked::{publish_to, subscribe};
use super::delivery::{attach, next_event};
use super::tls::Pki;
use super::util::{event, wait_for, TestBroker};

const LONG: Duration = Duration::from_secs(20);

/// A running Python sink: its URL and the requests it reported, in arrival order.
pub(super) struct Sink {
    child: Child,
    pub port: u16,
    got: Receiver<Value>,
    pub seen: Vec<Value>,
}

impl Sink {
    pub fn start(plan: Value) -> Sink {
        let root =
            std::env::var_os("CARGO_MANIFEST_DIR").map_or(env!("CARGO_MANIFEST_DIR").into(), std::path::PathBuf::from);
        let python = std::env::var("SDK_PYTHON").unwrap_or_else(|_| "python3".into());
        let mut child = Command::new(python)
            .arg(root.join("tests/interop/python_sink.py"))
            .arg(plan.to_string())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 runs the sink");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
        let port = first["port"].as_u64().unwrap() as u16;
        let (tx, got) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                if tx.send(serde_json::from_str::<Value>(&line).unwrap()).is_err() {
                    return;
                }
            }
        });
        Sink { child, port, got, seen: Vec::new() }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// Waits until `n` requests arrived in all; returns them all.
    pub fn wait(&mut self, n: usize) -> &[Value] {
        let deadline = Instant::now() + LONG;
        while self.seen.len() < n {
            match self.got.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(v) => self.seen.push(v),
                Err(RecvTimeoutError::Timeout) => {
                    panic!("{} of {n} requests within {LONG:?}: {:#?}", self.seen.len(), self.seen)
                }
                Err(RecvTimeoutError::Disconnected) => panic!("the sink died"),
            }
        }
        &self.seen
    }

    /// What arrived so far, without waiting.
    pub fn drain(&mut self) -> &[Value] {
        while let Ok(v) = self.got.try_recv() {
            self.seen.push(v);
        }
        &self.seen
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(super) fn h<'a>(r: &'a Value, name: &str) -> &'a str {
    r["headers"][name].as_str().unwrap_or("")
}

/// `(ce-id, emattempt)` of each request.
fn ids(seen: &[Value]) -> Vec<(String, String)> {
    seen.iter().map(|r| (h(r, "ce-id").to_owned(), h(r, "ce-emattempt").to_owned())).collect()
}

/// The dead letters of `topic`, from every partition of its `.dlq` (none before it exists).
pub(super) fn dead_letters(b: &TestBroker, topic: &str) -> Vec<(u64, Value)> {
    let mut out = Vec::new();
    for p in 0..4 {
        let r = b.admin().get(&format!("/admin/topics/{topic}.dlq/partitions/{p}/events?from=0&max=100"));
        if r.status == 200 {
            let page: Vec<Value> = serde_json::from_slice(&r.body).unwrap();
            out.extend(page.into_iter().map(|v| (v["offset"].as_u64().unwrap(), v["event"].clone())));
        }
    }
    out
}

fn topic_with(b: &TestBroker, topic: &str, partitions: u32) {
    let body = json!({ "partitions": partitions }).to_string();
    assert_eq!(b.admin().request("PUT", &format!("/admin/topics/{topic}"), &[], body.as_bytes()).status, 201);
}

#[test]
#[ignore = "needs python3 (the sink is written with its standard library)"]
fn a_sink_gets_every_event_signed_in_binary_mode_in_order_and_acks_it() {
    let b = TestBroker::start(&[]);
    let mut sink = Sink::start(json!({ "secret": "s3cret" }));
    topic_with(&b, "orders", 1);
    let def =
        json!({"subscription": "hook", "topic": "orders", "sink": sink.url("/in/hook?x=1"), "sinkSecret": "s3cret"});
    let r = b.client().post("/events/subscribe", "application/json", def.to_string().as_bytes());
    assert_eq!(r.status, 201, "{}", r.text());
    assert!(!r.text().contains("s3cret") && r.json()["sinkSigned"] == true, "{}", r.text());
    // Sessions of clients cannot attach to a sink's subscription.
    b.client().get("/events/poll?subscription=hook&waitMs=0").assert_problem(409);
    b.client()
        .post("/events/ack", "application/json", br#"{"subscription":"hook","ids":["0:0:1"]}"#)
        .assert_problem(409);
    for i in 0..5 {
        let mut e = event(&format!("e{i}"));
        e["subject"] = json!("s 1 é%");
        // A publisher's own em* extensions do not pass for the delivery's.
        e["emattempt"] = json!(99);
        publish_to_event(&b, "orders", &e);
    }
    let seen = sink.wait(5).to_vec();
    assert_eq!(ids(&seen), (0..5).map(|i| (format!("e{i}"), "1".to_owned())).collect::<Vec<_>>());
    for (i, r) in seen.iter().enumerate() {
        assert_eq!(r["path"], "/in/hook?x=1");
        assert_eq!(r["sig_ok"], true, "the sink verified the signature: {r}");
        assert_eq!(r["repeated"], json!([]), "{r}");
        assert_eq!(h(r, "x-em-delivery-id"), format!("0:{i}:1"));
        assert_eq!(h(r, "ce-emdeliveryid"), format!("0:{i}:1"));
        assert_eq!((h(r, "ce-empartition"), h(r, "ce-emoffset")), ("0", i.to_string().as_str()));
        assert_eq!((h(r, "ce-specversion"), h(r, "ce-source"), h(r, "ce-type")), ("1.0", "/it", "com.example.test"));
        assert_eq!(h(r, "ce-subject"), "s%201%20%C3%A9%25", "binary-mode percent-encoding");
        assert_eq!(h(r, "content-type"), "application/json");
        assert_eq!(serde_json::from_str::<Value>(r["body"].as_str().unwrap()).unwrap(), json!({"n": format!("e{i}")}));
        let ts: u64 = h(r, "x-em-timestamp").parse().unwrap();
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
        assert!(ts.abs_diff(now) < 60, "{ts} vs {now}");
    }
    // Each 2xx was an ack: the committed offset reaches the end.
    wait_for(LONG, || {
        let subs = b.admin().get("/admin/subscriptions").json();
        let text = subs.to_string();
        assert!(!text.contains("s3cret"), "{text}");
        (subs[0]["partitions"][0]["consumers"][0]["committed"] == 5).then_some(())
    });
    let m = b.admin().get("/metrics").text();
    assert!(m.contains(r#"evmesh_webhook_requests_total{shard="#), "{m}");
}

fn publish_to_event(b: &TestBroker, topic: &str, e: &Value) {
    let r = b.publish(topic, e);
    assert_eq!(r.status, 202, "{}", r.text());
}

#[test]
#[ignore = "needs python3 (the sink is written with its standard library)"]
fn a_failing_sink_is_retried_in_partition_order_then_dead_lettered() {
    let b = TestBroker::start(&["--redelivery-backoff-ms", "50"]);
    // e1 fails every time; e2's first answer is a 503 without Retry-After (a plain failure).
    let mut sink = Sink::start(json!({ "answers": { "e1": ["500", "500", "500"], "e2": ["503"] } }));
    topic_with(&b, "jobs", 1);
    subscribe(&b, json!({"subscription": "hook", "topic": "jobs", "sink": sink.url("/"), "maxAttempts": 3}));
    for i in 0..4 {
        publish_to(&b, "jobs", &format!("e{i}"), None);
    }
    let seen = ids(sink.wait(7));
    let want: Vec<(String, String)> =
        [("e0", "1"), ("e1", "1"), ("e1", "2"), ("e1", "3"), ("e2", "1"), ("e2", "2"), ("e3", "1")]
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
    assert_eq!(seen, want, "a partition's events wait behind a failing one");
    let dead = wait_for(LONG, || dead_letters(&b, "jobs").pop());
    assert_eq!((dead.1["id"].as_str(), dead.1["emdlqreason"].as_str()), (Some("e1"), Some("nack")));
    assert_eq!(dead.1["emdlqsubscription"], "hook");
    wait_for(LONG, || {
        let subs = b.admin().get("/admin/subscriptions").json();
        (subs[0]["partitions"][0]["consumers"][0]["committed"] == 4).then_some(())
    });
    assert_eq!(sink.drain().len(), 7, "nothing sent again");
}

#[test]
#[ignore = "needs python3 (the sink is written with its standard library)"]
fn retry_after_holds_every_request_to_the_sink_until_then() {
    let b = TestBroker::start(&["--redelivery-backoff-ms", "50"]);
    let mut sink = Sink::start(json!({ "answers": { "first": ["429:2"] } }));
    topic_with(&b, "t", 2);
    // The hold (2 s) outlasts the ack timeout (1 s): what waits for it must not use attempts.
    let def =
        json!({"subscription": "hook", "topic": "t", "sink": sink.url("/"), "maxAttempts": 2, "ackTimeoutMs": 1000});
    subscribe(&b, def);
    let (p0, _) = publish_to(&b, "t", "first", Some("k0"));
    let t0 = sink.wait(1)[0]["t"].as_f64().unwrap();
    // Once the broker has the 429 (not merely once the sink sent it)...
    wait_for(LONG, || (deferred(&b) == 1).then_some(()));
    // ...events of the other partition wait too (keys until one lands there; those landing on
    // the first one's partition wait behind it anyway).
    let mut others = 0;
    for k in 1..50 {
        others += 1;
        if publish_to(&b, "t", &format!("other{k}"), Some(&format!("k{k}"))).0 != p0 {
            break;
        }
    }
    let seen = sink.wait(2 + others).to_vec();
    assert_eq!(ids(&seen[..1]), [("first".into(), "1".into())]);
    assert!(ids(&seen).contains(&("first".into(), "2".into())), "{seen:#?}");
    assert!(seen.iter().any(|r| h(r, "ce-empartition") != p0.to_string()), "{seen:#?}");
    for r in &seen[1..] {
        let waited = r["t"].as_f64().unwrap() - t0;
        assert!(waited >= 2.0, "a request {waited:.3} s after the 429 with Retry-After: 2: {r}");
        if h(r, "ce-id") != "first" {
            // Held events were handed back unattempted: none used an attempt waiting.
            assert_eq!(h(r, "ce-emattempt"), "1", "{r}");
        }
    }
    assert!(dead_letters(&b, "t").is_empty());
    assert_eq!(deferred(&b), 1);
}

/// Requests to sinks answered with a `Retry-After`, on every shard.
fn deferred(b: &TestBroker) -> u64 {
    b.admin()
        .get("/metrics")
        .text()
        .lines()
        .filter(|l| l.starts_with("evmesh_webhook_requests_total") && l.contains(r#"result="deferred""#))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum()
}

#[test]
#[ignore = "needs python3 (the sink is written with its standard library)"]
fn a_hanging_sink_holds_at_most_webhook_concurrency_requests_and_no_bystander() {
    let b = TestBroker::start(&["--webhook-concurrency", "2", "--webhook-timeout-ms", "30000"]);
    let hold: Vec<String> = (0..8).map(|i| format!("h{i}")).collect();
    let mut sink = Sink::start(json!({ "hold_ids": hold }));
    topic_with(&b, "slow", 4);
    subscribe(&b, json!({"subscription": "hook", "topic": "slow", "sink": sink.url("/")}));
    for (i, id) in hold.iter().enumerate() {
        publish_to(&b, "slow", id, Some(&format!("key{i}")));
    }
    sink.wait(2);
    // Meanwhile the broker serves everyone else: a bystander publishes and a session gets it
    // (an acked client: live fan-out, `ack=none`, is for what comes once every core knows of
    // the session, and the first publish may come before).
    subscribe(&b, json!({"subscription": "by", "topic": "fast", "mode": "BROADCAST", "start": "earliest"}));
    let mut ws = attach(&b, "subscription=by&clientId=bystander");
    let started = Instant::now();
    for i in 0..50 {
        publish_to(&b, "fast", &format!("f{i}"), None);
    }
    let mut got = 0;
    while got < 50 {
        if next_event(&mut ws).is_some() {
            got += 1;
        }
        assert!(started.elapsed() < LONG, "the bystander got {got} of 50 while the sink hung");
    }
    assert_eq!(sink.drain().len(), 2, "no more than webhook_concurrency requests to a hanging sink");
    assert!(sink.seen.iter().all(|r| r["inflight"].as_u64().unwrap() <= 2));
}

#[test]
#[ignore = "needs python3 (the sink is written with its standard library)"]
fn a_sink_is_served_again_after_a_restart_and_not_after_unsubscribe() {
    let mut b = TestBroker::start(&[]);
    let mut sink = Sink::start(json!({}));
    topic_with(&b, "t", 1);
    subscribe(&b, json!({"subscription": "one", "topic": "t", "sink": sink.url("/one")}));
    b.restart();
    publish_to(&b, "t", "after-restart", None);
    assert_eq!(sink.wait(1)[0]["path"], "/one");
    let r = b.client().post("/events/unsubscribe", "application/json", br#"{"subscription":"one"}"#);
    assert_eq!(r.status, 200, "{}", r.text());
    subscribe(&b, json!({"subscription": "two", "topic": "t", "sink": sink.url("/two"), "start": "earliest"}));
    publish_to(&b, "t", "after-removal", None);
    // "two" reads from the start: both events, and only "two" gets the second.
    let seen = sink.wait(3).to_vec();
    let paths: Vec<(&str, &str)> = seen.iter().map(|r| (r["path"].as_str().unwrap(), h(r, "ce-id"))).collect();
    assert_eq!(paths[0], ("/one", "after-restart"));
    let mut rest = paths[1..].to_vec();
    rest.sort();
    assert_eq!(rest, [("/two", "after-removal"), ("/two", "after-restart")]);
}

#[test]
#[ignore = "needs python3 (the sink is written with its standard library)"]
fn https_sinks_are_verified_against_the_roots_and_webhook_ca_file() {
    let dir = std::env::temp_dir().join(format!("evmesh-webhook-tls-{}", std::process::id()));
    let trusted = Pki::new(&dir.join("trusted"), "trusted-ca");
    let (cert, key) = trusted.issue("sink", "sink");
    let stranger = Pki::new(&dir.join("stranger"), "stranger-ca");
    let (scert, skey) = stranger.issue("sink", "sink");
    let ca = dir.join("trusted/trusted-ca.pem");
    let b = TestBroker::start(&["--webhook-ca-file", ca.to_str().unwrap(), "--redelivery-backoff-ms", "50"]);
    let tls = |c: &std::path::Path, k: &std::path::Path| json!({"cert": c, "key": k});
    let mut good = Sink::start(json!({ "tls": tls(&cert, &key), "secret": "k" }));
    let mut bad = Sink::start(json!({ "tls": tls(&scert, &skey) }));
    topic_with(&b, "t", 1);
    let https = |s: &Sink, host: &str| format!("https://{host}:{}/in", s.port);
    subscribe(&b, json!({"subscription": "good", "topic": "t", "sink": https(&good, "localhost"), "sinkSecret": "k"}));
    subscribe(&b, json!({"subscription": "byip", "topic": "t", "sink": https(&good, "127.0.0.1")}));
    subscribe(&b, json!({"subscription": "bad", "topic": "t", "sink": https(&bad, "localhost"), "maxAttempts": 2}));
    publish_to(&b, "t", "secure", None);
    let seen = good.wait(2).to_vec();
    assert!(seen.iter().all(|r| h(r, "ce-id") == "secure"), "{seen:#?}");
    assert!(seen.iter().any(|r| r["sig_ok"] == true), "signed over TLS too: {seen:#?}");
    // The stranger's certificate is refused: both attempts fail, the event is dead-lettered,
    // and the sink never saw a request.
    let dead = wait_for(LONG, || dead_letters(&b, "t").pop());
    assert_eq!((dead.1["emdlqsubscription"].as_str(), dead.1["id"].as_str()), (Some("bad"), Some("secure")));
    assert!(bad.drain().is_empty(), "{:#?}", bad.seen);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A sink pointing at evmesh's own listeners would publish every delivery again (a loop) or
/// reach the admin API from inside: such requests are never made.
#[test]
fn a_sink_may_not_point_at_the_brokers_own_listeners() {
    let b = TestBroker::start(&[]);
    topic_with(&b, "t", 1);
    let own = format!("http://127.0.0.1:{}/events/publish?topic=t", b.traffic.port());
    subscribe(&b, json!({"subscription": "loop", "topic": "t", "sink": own, "maxAttempts": 1}));
    let admin = format!("http://localhost:{}/admin/topics", b.admin.port());
    subscribe(&b, json!({"subscription": "adm", "topic": "t", "sink": admin, "maxAttempts": 1}));
    publish_to(&b, "t", "once", None);
    let dead = wait_for(LONG, || Some(dead_letters(&b, "t")).filter(|d| d.len() == 2));
    assert!(dead.iter().all(|(_, e)| e["id"] == "once"), "{dead:?}");
    assert_eq!(b.events("t", 0).len(), 1, "published once, never again by its own sink");
}
