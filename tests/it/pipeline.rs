//! The transformer and the router end to end: rules set through the admin API reshape and
//! route published events (structured and binary mode) on every shard at once, survive a
//! restart (kill -9), refuse what would loop or break an event, and stop when removed.

use std::time::Duration;

use serde_json::{json, Value};

use super::util::{event, TestBroker};

fn admin(b: &TestBroker, method: &str, path: &str, body: &Value) -> super::util::Resp {
    b.admin().request(method, path, &[("content-type", "application/json")], body.to_string().as_bytes())
}

fn ids(b: &TestBroker, topic: &str) -> Vec<String> {
    let mut ids: Vec<String> =
        (0..2).flat_map(|p| b.events(topic, p)).map(|(_, e)| e["id"].as_str().unwrap().to_owned()).collect();
    ids.sort();
    ids
}

/// Waits until `topic` holds exactly `want` (ids, sorted).
fn eventually(b: &TestBroker, topic: &str, want: &[&str]) {
    let mut last = Vec::new();
    let got = super::util::wait_for_or(Duration::from_secs(15), || {
        last = ids(b, topic);
        (last == want).then_some(())
    });
    assert!(got.is_some(), "{topic} holds {last:?}, not {want:?}");
}

fn stored(b: &TestBroker, topic: &str, id: &str) -> Value {
    (0..2).flat_map(|p| b.events(topic, p)).map(|(_, e)| e).find(|e| e["id"] == id).expect("stored")
}

#[test]
fn transformers_reshape_events_and_a_broken_result_is_refused() {
    let b = TestBroker::start(&[]);
    let rule = json!({
        "rename": {"subject": "orderref"},
        "remove": ["legacy"],
        "set": {"type": "com.shop.order.v2", "priority": 3},
        "variables": {"id": "$.data.order.id", "who": "$.data.customer"},
        "data": {"orderId": "${id}", "summary": "order ${id} for ${who}"}
    });
    assert_eq!(admin(&b, "PUT", "/admin/transformers/orders", &rule).status, 201);
    assert_eq!(admin(&b, "PUT", "/admin/transformers/orders", &rule).status, 200, "replaced");
    let mut e = event("s1");
    e["subject"] = json!("ref-7");
    e["legacy"] = json!("x");
    e["data"] = json!({"order": {"id": 42}, "customer": "Ada"});
    assert_eq!(b.publish("orders", &e).status, 202);
    // Binary mode goes through the same rules.
    let r = b.client().request(
        "POST",
        "/events/publish?topic=orders",
        &[
            ("ce-specversion", "1.0"),
            ("ce-id", "b1"),
            ("ce-source", "/bin"),
            ("ce-type", "com.shop.order"),
            ("content-type", "application/json"),
        ],
        br#"{"order": {"id": 7}, "customer": "Grace"}"#,
    );
    assert_eq!(r.status, 202, "{}", r.text());
    let s = stored(&b, "orders", "s1");
    assert_eq!(s["orderref"], "ref-7");
    assert!(s.get("subject").is_none() && s.get("legacy").is_none());
    assert_eq!(s["type"], "com.shop.order.v2");
    assert_eq!(s["priority"], 3);
    assert_eq!(s["data"], json!({"orderId": 42, "summary": "order 42 for Ada"}));
    assert_eq!(stored(&b, "orders", "b1")["data"], json!({"orderId": 7, "summary": "order 7 for Grace"}));
    // A rule whose result would not be a valid CloudEvent is refused when it is set.
    let r = admin(&b, "PUT", "/admin/transformers/clock", &json!({"set": {"time": "yesterday"}}));
    r.assert_problem(400);
    assert!(r.json()["detail"].as_str().unwrap().contains("RFC 3339"), "{}", r.text());
    // Rules that could only break events are refused when set.
    admin(&b, "PUT", "/admin/transformers/orders", &json!({"remove": ["id"]})).assert_problem(400);
    admin(&b, "PUT", "/admin/transformers/orders", &json!({"data": "${nope}"})).assert_problem(400);
    admin(&b, "PUT", "/admin/transformers/bad%20name", &json!({"set": {"a": "b"}})).assert_problem(400);
    // Listed, removed, and then events pass as they are.
    let all = b.admin().get("/admin/transformers").json();
    assert_eq!(all.as_array().unwrap().len(), 1);
    assert_eq!(all[0]["topic"], "orders");
    assert_eq!(b.admin().request("DELETE", "/admin/transformers/orders", &[], b"").status, 200);
    b.admin().request("DELETE", "/admin/transformers/orders", &[], b"").assert_problem(404);
    assert_eq!(b.publish("orders", &event("plain")).status, 202);
    assert_eq!(stored(&b, "orders", "plain")["data"], event("plain")["data"]);
}

#[test]
fn routes_copy_and_move_by_condition_refuse_loops_and_survive_a_restart() {
    let mut b = TestBroker::start(&[]);
    let route = |id: &str, body: Value| admin(&b, "PUT", &format!("/admin/routes/{id}"), &body);
    let eu = json!({"topic": "orders", "condition": "region = 'eu'", "targets": ["orders.eu"], "mode": "move"});
    assert_eq!(route("eu", eu).status, 201);
    let audit = json!({"topic": "orders", "condition": "TRUE", "targets": ["audit"], "mode": "copy"});
    assert_eq!(route("audit", audit).status, 201);
    // Routes are followed on: what reaches orders.eu is also archived.
    let archive = json!({"topic": "orders.eu", "condition": "EXISTS region", "targets": ["archive"]});
    assert_eq!(route("archive", archive).status, 201);
    // Loops, self-targets and bad conditions are refused, naming why.
    let r = route("back", json!({"topic": "archive", "condition": "TRUE", "targets": ["orders"]}));
    r.assert_problem(400);
    assert!(
        r.json()["detail"].as_str().unwrap().contains("loop: archive -> orders -> orders.eu -> archive"),
        "{}",
        r.text()
    );
    route("self", json!({"topic": "a", "condition": "TRUE", "targets": ["a"]})).assert_problem(400);
    route("bad", json!({"topic": "a", "condition": "region = ", "targets": ["b"]})).assert_problem(400);
    route("mode", json!({"topic": "a", "condition": "TRUE", "targets": ["b"], "mode": "teleport"})).assert_problem(400);

    let publish = |b: &TestBroker, id: &str, region: &str| {
        let mut e = event(id);
        e["region"] = json!(region);
        let r = b.publish("orders", &e);
        assert_eq!(r.status, 202, "{}", r.text());
        r.json()
    };
    let moved = publish(&b, "e1", "eu");
    assert_eq!(moved["topic"], "orders.eu", "the answer says where a moved event went: {moved}");
    let kept = publish(&b, "u1", "us");
    assert!(kept.get("topic").is_none(), "{kept}");
    assert_eq!(ids(&b, "orders"), ["u1"], "moved events leave their topic");
    assert_eq!(ids(&b, "orders.eu"), ["e1"]);
    assert_eq!(ids(&b, "archive"), ["e1"]);
    assert_eq!(ids(&b, "audit"), ["e1", "u1"], "copies");
    let metrics = b.admin().get("/metrics").text();
    let routed: u64 = metrics
        .lines()
        .filter_map(|l| l.strip_prefix("evmesh_events_routed_total{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(routed, 4, "e1 to orders.eu, archive and audit; u1 to audit");
    // A batch is routed event by event.
    let batch = json!([
        {"specversion": "1.0", "id": "e2", "source": "/it", "type": "t", "region": "eu"},
        {"specversion": "1.0", "id": "u2", "source": "/it", "type": "t", "region": "us"}
    ]);
    let r = b.client().post(
        "/events/publish?topic=orders",
        "application/cloudevents-batch+json",
        batch.to_string().as_bytes(),
    );
    assert_eq!(r.status, 202, "{}", r.text());
    let results = r.json()["results"].clone();
    assert_eq!(results[0]["topic"], "orders.eu");
    assert!(results[1].get("topic").is_none());

    // Stored: after kill -9 the routes are in force again.
    b.restart();
    let listed = b.admin().get("/admin/routes").json();
    let ids_listed: Vec<&str> = listed.as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap()).collect();
    assert_eq!(ids_listed, ["archive", "audit", "eu"]);
    publish(&b, "e3", "eu");
    // (On the Kafka backend the local copy catches up with the log after a restart.)
    eventually(&b, "orders.eu", &["e1", "e2", "e3"]);
    // Removed: events stay where they were published.
    assert_eq!(b.admin().request("DELETE", "/admin/routes/eu", &[], b"").status, 200);
    publish(&b, "e4", "eu");
    eventually(&b, "orders", &["e4", "u1", "u2"]);
    assert_eq!(ids(&b, "orders.eu"), ["e1", "e2", "e3"]);
}

/// What a publisher sends cannot break the pipeline: data that is not what a template expects
/// (lone surrogates, numbers past f64, deep nesting, text) gives null variables, not a crash;
/// what templates build is bounded per request; data a rule does not touch keeps its bytes,
/// through the transformer and through a routed copy.
#[test]
fn hostile_data_and_large_batches_through_the_pipeline() {
    let b = TestBroker::start(&[]);
    let rule = json!({"variables": {"x": "$.data.x"}, "set": {"checked": true}, "data": {"x": "${x}"}});
    assert_eq!(admin(&b, "PUT", "/admin/transformers/hostile", &rule).status, 201);
    let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
    for (i, data) in
        [r#""\ud800""#, "1e400", deep.as_str(), r#"{"x": 123456789012345678901234567890}"#].iter().enumerate()
    {
        let body = format!(r#"{{"specversion":"1.0","id":"h{i}","source":"/h","type":"t","data":{data}}}"#);
        let r = b.client().post("/events/publish?topic=hostile", "application/cloudevents+json", body.as_bytes());
        assert!(r.status == 202 || r.status == 400, "{}: {}", r.status, r.text());
    }
    assert_eq!(b.admin().get("/healthz").status, 200, "the broker is up");
    // A literal template of 2 KiB on a batch of a thousand small events: over max_body_bytes.
    let big = json!({"data": {"blob": "z".repeat(2048)}});
    assert_eq!(admin(&b, "PUT", "/admin/transformers/bulk", &big).status, 201);
    let batch: Vec<Value> = (0..1000).map(|i| event(&format!("b{i}"))).collect();
    let r = b.client().post(
        "/events/publish?topic=bulk",
        "application/cloudevents-batch+json",
        Value::Array(batch.clone()).to_string().as_bytes(),
    );
    r.assert_problem(400);
    let topics = b.admin().get("/admin/topics").json();
    assert!(topics.as_array().unwrap().iter().all(|t| t["topic"] != "bulk"), "nothing of it stored: {topics}");
    // Text data, untouched by a rule that only sets an attribute, and copied by a route.
    assert_eq!(admin(&b, "PUT", "/admin/transformers/notes", &json!({"set": {"seen": true}})).status, 201);
    let copy = json!({"topic": "notes", "condition": "TRUE", "targets": ["notes.copy"]});
    assert_eq!(admin(&b, "PUT", "/admin/routes/copy", &copy).status, 201);
    let r = b.client().request(
        "POST",
        "/events/publish?topic=notes",
        &[
            ("ce-specversion", "1.0"),
            ("ce-id", "n1"),
            ("ce-source", "/n"),
            ("ce-type", "t"),
            ("content-type", "text/plain"),
        ],
        b"hello, world",
    );
    assert_eq!(r.status, 202, "{}", r.text());
    for t in ["notes", "notes.copy"] {
        let e = (0..2).flat_map(|p| b.events(t, p)).map(|(_, e)| e).next().expect("stored");
        assert_eq!((e["data"].as_str(), e["seen"].as_bool()), (Some("hello, world"), Some(true)), "{t}: {e}");
    }
}

/// The same pipeline tests on the Kafka backend: transformed and routed events are what Kafka
/// holds and what evmesh's local copy serves.
#[cfg(feature = "kafka")]
mod on_kafka {
    use super::super::util::{again_on_kafka, on_kafka};

    again_on_kafka!(
        transformers_reshape_events_and_a_broken_result_is_refused,
        routes_copy_and_move_by_condition_refuse_loops_and_survive_a_restart,
        hostile_data_and_large_batches_through_the_pipeline,
    );
}

/// Routes over the RocketMQ backend: a copied event is produced to RocketMQ like a published one.
#[cfg(feature = "rocketmq")]
mod on_rocketmq {
    use super::super::util::{again_on_rocketmq, on_rocketmq};

    again_on_rocketmq!(routes_copy_and_move_by_condition_refuse_loops_and_survive_a_restart);
}
