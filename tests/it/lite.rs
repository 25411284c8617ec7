//! Lite topics: `agent.*`, `client.*`, `session.*` created by their first event, one partition
//! each with dense offsets of its own, no `max_topics` slot, expiring after `lite_topic_ttl_ms`
//! idle, surviving kill -9, and correct past the per-shard cache of their offsets.

use std::io::{BufReader, Write};
use std::time::Duration;

use serde_json::{json, Value};

use super::request::metric;
use super::util::{event, read_response_from, request_bytes, wait_for, TestBroker};

fn publish(b: &TestBroker, topic: &str, id: &str) -> Value {
    let r = b.publish(topic, &event(id));
    assert_eq!(r.status, 202, "{topic}: {}", r.text());
    r.json()
}

fn stored_ids(b: &TestBroker, topic: &str) -> Vec<String> {
    let r = b.admin().get(&format!("/admin/topics/{topic}/partitions/0/events?from=0&max=100"));
    assert_eq!(r.status, 200, "{}", r.text());
    r.json().as_array().unwrap().iter().map(|e| e["event"]["id"].as_str().unwrap().to_owned()).collect()
}

#[test]
fn lite_topics_have_dense_offsets_of_their_own_and_take_no_topic_slot() {
    let b = TestBroker::start(&["--max-topics", "1", "--shards", "4"]);
    publish(&b, "orders", "o-0");
    b.publish("another", &event("x")).assert_problem(409);
    let names = ["session.a", "session.b", "client.x", "client.y", "session.c-1_2"];
    for round in 0..3 {
        for n in names {
            assert_eq!(publish(&b, n, &format!("{n}-{round}")), json!({"partition": 0, "offset": round}), "{n}");
        }
    }
    assert_eq!(stored_ids(&b, "session.a"), ["session.a-0", "session.a-1", "session.a-2"]);
    let topics = b.admin().get("/admin/topics").json();
    let listed: Vec<&str> = topics.as_array().unwrap().iter().map(|t| t["topic"].as_str().unwrap()).collect();
    assert_eq!(listed, ["orders"], "lite topics are not listed as topics");
    // agent.* carries agents' turns: the broker writes it, nobody publishes there.
    let forged = b.publish("agent.x", &event("forged"));
    forged.assert_problem(403);
    assert!(forged.text().contains("written by the broker"), "{}", forged.text());
    // Not a lite name: `session` alone, `sessions.x`.
    b.publish("sessions.x", &event("y")).assert_problem(409);
    // Read through sessions, not subscriptions; not created as regular topics.
    let sub = json!({"subscription": "s", "topic": "session.a"}).to_string();
    b.client().post("/events/subscribe", "application/json", sub.as_bytes()).assert_problem(400);
    b.admin().request("PUT", "/admin/topics/session.z", &[], br#"{"partitions":2}"#).assert_problem(400);
}

#[test]
fn an_idle_lite_topic_expires_and_starts_over_while_a_busy_one_lives() {
    let b = TestBroker::start(&["--lite-topic-ttl-ms", "600", "--retention-check-ms", "100"]);
    publish(&b, "session.idle", "i-0");
    publish(&b, "session.idle", "i-1");
    let mut busy = 0;
    wait_for(Duration::from_secs(10), || {
        assert_eq!(publish(&b, "session.busy", &format!("b-{busy}"))["offset"], busy);
        busy += 1;
        std::thread::sleep(Duration::from_millis(50));
        (metric(&b, "evmesh_lite_topics_expired_total", "") >= 1).then_some(())
    });
    assert!(stored_ids(&b, "session.idle").is_empty());
    assert_eq!(publish(&b, "session.idle", "i-again")["offset"], 0, "an expired lite topic starts over");
    assert_eq!(publish(&b, "session.busy", "b-last")["offset"], busy, "the busy one kept its offsets");
}

#[test]
fn lite_offsets_survive_kill_9_and_the_offset_cache() {
    let mut b = TestBroker::start(&["--shards", "1"]);
    for i in 0..3 {
        publish(&b, "session.keep", &format!("k-{i}"));
    }
    // More lite topics than a shard caches the offsets of (16,384): the first is read back
    // from the log, not started over. Pipelined, 1,000 requests per write.
    let n = 40_000;
    let mut c = b.client();
    let mut reader = BufReader::new(c.stream.try_clone().unwrap());
    for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
        let mut out = Vec::new();
        for i in chunk {
            let body = event(&format!("e{i}")).to_string();
            let path = format!("/events/publish?topic=client.c{i}");
            out.extend(request_bytes(
                "POST",
                &path,
                &[("content-type", "application/cloudevents+json")],
                body.as_bytes(),
            ));
        }
        c.stream.write_all(&out).unwrap();
        for _ in chunk {
            let r = read_response_from(&mut reader).expect("a response");
            assert_eq!(r.status, 202, "{}", r.text());
        }
    }
    assert_eq!(publish(&b, "session.keep", "k-3")["offset"], 3);
    assert_eq!(publish(&b, "client.c0", "again")["offset"], 1);
    b.kill9();
    b.restart();
    assert_eq!(publish(&b, "session.keep", "k-4")["offset"], 4);
    assert_eq!(stored_ids(&b, "session.keep"), ["k-0", "k-1", "k-2", "k-3", "k-4"]);
}
