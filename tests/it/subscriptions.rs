//! Subscription definitions: created, idempotent, conflicting, refused, removed, persisted.

use serde_json::json;

use super::util::TestBroker;

fn subscribe(b: &TestBroker, body: serde_json::Value) -> super::util::Resp {
    b.client().post("/events/subscribe", "application/json", body.to_string().as_bytes())
}

fn unsubscribe(b: &TestBroker, name: &str) -> super::util::Resp {
    b.client().post("/events/unsubscribe", "application/json", json!({"subscription": name}).to_string().as_bytes())
}

#[test]
fn subscribe_is_idempotent_conflicts_are_409_and_definitions_survive_restarts() {
    let mut b = TestBroker::start(&[]);
    let def = json!({"subscription": "billing", "topic": "orders", "mode": "LOAD_BALANCE",
        "filters": [{"prefix": {"type": "com.shop."}}, {"sql": "amount > 100"}],
        "start": "latest", "ackTimeoutMs": 30000, "maxAttempts": 6});
    let r = subscribe(&b, def.clone());
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(r.json()["filters"], def["filters"]);
    assert_eq!(subscribe(&b, def.clone()).status, 200, "the same definition again");
    // Defaults spelled out or left out are the same definition.
    let short = json!({"subscription": "billing", "topic": "orders",
        "filters": [{"prefix": {"type": "com.shop."}}, {"sql": "amount > 100"}]});
    assert_eq!(subscribe(&b, short).status, 200);
    let mut other = def.clone();
    other["mode"] = json!("BROADCAST");
    subscribe(&b, other).assert_problem(409);
    // The topic exists now, so subscribers may come first.
    let topics = b.admin().get("/admin/topics").json();
    assert!(topics.as_array().unwrap().iter().any(|t| t["topic"] == "orders"));
    // Names are spread over shards: many subscriptions, each answered by its owner.
    for i in 0..10 {
        assert_eq!(subscribe(&b, json!({"subscription": format!("s{i}"), "topic": "orders"})).status, 201);
    }
    b.restart();
    assert_eq!(subscribe(&b, def.clone()).status, 200, "persisted across a restart");
    let list = b.admin().get("/admin/subscriptions").json();
    assert_eq!(list.as_array().unwrap().len(), 11);
    assert_eq!(list[0]["subscription"], "billing");
    assert_eq!(list[0]["maxAttempts"], 6);
    assert_eq!(unsubscribe(&b, "billing").status, 200);
    unsubscribe(&b, "billing").assert_problem(404);
    assert_eq!(subscribe(&b, def).status, 201, "a removed name can be reused");
}

#[test]
fn bad_subscriptions_are_400() {
    let b = TestBroker::start(&[]);
    for body in [
        json!({"topic": "t"}),
        json!({"subscription": "s", "topic": "t", "filters": [{"regex": {"type": "x"}}]}),
        json!({"subscription": "s", "topic": "t", "filters": [{"sql": "amount >"}]}),
        json!({"subscription": "s", "topic": "t", "mode": "SOMETIMES"}),
        json!({"subscription": "s", "topic": "t", "start": {"time": "yesterday"}}),
    ] {
        subscribe(&b, body.clone()).assert_problem(400);
    }
    b.client().post("/events/subscribe", "application/json", b"{nope").assert_problem(400);
    b.client().post("/events/unsubscribe", "application/json", b"{}").assert_problem(400);
    b.client().get("/events/subscribe").assert_problem(405);
}
