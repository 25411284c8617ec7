//! Agents of agent streaming calls: registration, heartbeats, readiness and freshness (what
//! decides whether an agent is routed to), the bound on how many, bad requests.

use std::time::Duration;

use serde_json::{json, Value};

use super::util::{wait_for, TestBroker};

fn post(b: &TestBroker, what: &str, body: Value) -> super::util::Resp {
    b.client().post(&format!("/agent/{what}"), "application/json", body.to_string().as_bytes())
}

fn listed(b: &TestBroker) -> Value {
    b.admin().get("/admin/agents").json()
}

#[test]
fn an_agent_is_routable_only_while_registered_ready_and_heard_from() {
    let b = TestBroker::start(&["--agent-heartbeat-timeout-ms", "300", "--max-agents", "2"]);
    let r = post(&b, "register", json!({"agentId": "a1"}));
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(r.json(), json!({"agentId": "a1", "ready": true, "routable": true}));
    assert_eq!(post(&b, "register", json!({"agentId": "a1"})).status, 200, "registering again");
    assert_eq!(listed(&b)[0]["routable"], true);
    // Silent past the timeout: not routable; a heartbeat brings it back.
    wait_for(Duration::from_secs(5), || (listed(&b)[0]["routable"] == false).then_some(()));
    let r = post(&b, "heartbeat", json!({"agentId": "a1"}));
    assert_eq!(r.json()["routable"], true);
    // Not ready: not routable, however fresh.
    let r = post(&b, "heartbeat", json!({"agentId": "a1", "ready": false}));
    assert_eq!(r.json(), json!({"agentId": "a1", "ready": false, "routable": false}));
    post(&b, "heartbeat", json!({"agentId": "nobody"})).assert_problem(404);
    // At most max_agents at once.
    assert_eq!(post(&b, "register", json!({"agentId": "a2"})).status, 201);
    let full = post(&b, "register", json!({"agentId": "a3"}));
    full.assert_problem(429);
    assert!(full.header("retry-after").is_some());
    assert_eq!(post(&b, "deregister", json!({"agentId": "a2"})).status, 200);
    assert_eq!(post(&b, "register", json!({"agentId": "a3"})).status, 201);
    post(&b, "deregister", json!({"agentId": "a2"})).assert_problem(404);
    let ids: Vec<Value> = listed(&b).as_array().unwrap().iter().map(|a| a["agentId"].clone()).collect();
    assert_eq!(ids, [json!("a1"), json!("a3")]);
}

#[test]
fn bad_agent_requests_are_refused() {
    let b = TestBroker::start(&[]);
    post(&b, "register", json!({"agent": "x"})).assert_problem(400);
    post(&b, "register", json!({"agentId": "a:b"})).assert_problem(400);
    post(&b, "register", json!({"agentId": ""})).assert_problem(400);
    post(&b, "register", json!({"agentId": "x".repeat(101)})).assert_problem(400);
    b.client().post("/agent/register", "application/json", b"{").assert_problem(400);
    b.client().get("/agent/register").assert_problem(405);
    post(&b, "elsewhere", json!({"agentId": "x"})).assert_problem(404);
}
