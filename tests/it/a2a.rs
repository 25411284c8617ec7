//! The A2A 1.0 gateway over raw HTTP (the official SDK drives it in `interop.rs`): an evmesh
//! agent answers turns; JSON-RPC and REST clients see tasks move, errors in the spec's shapes,
//! and the bounds hold (a message's parts, an agent that never stops answering).

use std::time::Duration;

use serde_json::{json, Value};

use super::calls::Agent;
use super::util::{wait_for, Resp, TestBroker};

fn rpc(b: &TestBroker, agent: &str, version: Option<&str>, method: &str, params: Value) -> Value {
    let body = json!({"jsonrpc": "2.0", "id": "r-1", "method": method, "params": params}).to_string();
    let mut headers = vec![("content-type", "application/json")];
    if let Some(v) = version {
        headers.push(("a2a-version", v));
    }
    let r = b.client().request("POST", &format!("/a2a/{agent}"), &headers, body.as_bytes());
    assert_eq!(r.status, 200, "JSON-RPC answers are HTTP 200: {}", r.text());
    let v = r.json();
    assert_eq!(v["id"], "r-1", "{v}");
    v
}

fn message(text: &str) -> Value {
    json!({"messageId": format!("m-{text}"), "role": "ROLE_USER", "parts": [{"text": text}]})
}

fn code(v: &Value) -> i64 {
    v["error"]["code"].as_i64().unwrap_or_else(|| panic!("an error: {v}"))
}

fn rest(b: &TestBroker, method: &str, path: &str, body: &Value) -> Resp {
    let headers = [("content-type", "application/json"), ("a2a-version", "1.0")];
    b.client().request(method, &format!("/a2a/bot/v1{path}"), &headers, body.to_string().as_bytes())
}

#[test]
fn an_evmesh_agent_answers_a2a_clients_and_the_gateway_holds_its_bounds() {
    let b = TestBroker::start(&[]);
    let mut agent = Agent::attach(&b, "bot");
    let card = b.client().get("/a2a/bot/.well-known/agent-card.json").json();
    assert_eq!(card["supportedInterfaces"][0]["protocolBinding"], "JSONRPC");
    assert_eq!(card["supportedInterfaces"][1]["url"], format!("http://{}/a2a/bot/v1", b.traffic));
    // Refusals before anything runs: no version (0.3), a bad body, a method of 0.3, too many parts.
    let v = rpc(&b, "bot", None, "SendMessage", json!({"message": message("x")}));
    assert_eq!((code(&v), v["error"]["data"][0]["reason"].as_str()), (-32009, Some("VERSION_NOT_SUPPORTED")));
    let r = b.client().request("POST", "/a2a/bot", &[("a2a-version", "1.0")], b"{not json");
    assert_eq!(code(&r.json()), -32700);
    assert_eq!(code(&rpc(&b, "bot", Some("1.0"), "message/send", json!({}))), -32601);
    let parts: Vec<Value> = (0..65).map(|i| json!({"text": i.to_string()})).collect();
    let many = json!({"message": {"messageId": "m", "role": "ROLE_USER", "parts": parts}});
    assert_eq!(code(&rpc(&b, "bot", Some("1.0"), "SendMessage", many)), -32602);
    assert_eq!(code(&rpc(&b, "bot", Some("1.0"), "GetTask", json!({"id": "nope"}))), -32001);

    // A blocking send: the agent's chunks become the artifact's parts, its last one completes.
    let answering = std::thread::spawn(move || {
        let turn = agent.next();
        let sid = turn["emsessionid"].as_str().unwrap().to_owned();
        assert_eq!(turn["data"], "hello");
        for (seq, word) in ["a ", "b "].iter().enumerate() {
            agent.send(json!({"type": "chunk", "sessionId": sid, "seq": seq, "data": word}));
        }
        agent.send(json!({"type": "chunk", "sessionId": sid, "seq": 2, "data": "", "done": true}));
        agent
    });
    let v = rpc(&b, "bot", Some("1.0"), "SendMessage", json!({"message": message("hello")}));
    let task = &v["result"]["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{v}");
    assert_eq!(task["artifacts"][0]["parts"], json!([{"text": "a "}, {"text": "b "}]));
    let id = task["id"].as_str().unwrap().to_owned();
    let mut agent = answering.join().unwrap();
    // The REST binding sees the same task; its errors are google.rpc.Status with ErrorInfo.
    let r = rest(&b, "GET", &format!("/tasks/{id}"), &json!({}));
    assert_eq!((r.status, r.json()["id"].as_str()), (200, Some(id.as_str())));
    let r = rest(&b, "GET", "/tasks/nope", &json!({}));
    assert_eq!((r.status, r.json()["error"]["details"][0]["reason"].as_str()), (404, Some("TASK_NOT_FOUND")));
    let r = rest(&b, "POST", &format!("/tasks/{id}:cancel"), &json!({}));
    assert_eq!((r.status, r.json()["error"]["details"][0]["reason"].as_str()), (400, Some("TASK_NOT_CANCELABLE")));

    // Returned at once, then cancelled while working: the agent is told, the task says so.
    let v = rpc(
        &b,
        "bot",
        Some("1.0"),
        "SendMessage",
        json!({"message": message("slow"), "configuration": {"returnImmediately": true}}),
    );
    let slow = v["result"]["task"]["id"].as_str().unwrap().to_owned();
    assert_eq!(agent.next()["data"], "slow");
    let v = rpc(&b, "bot", Some("1.0"), "CancelTask", json!({"id": slow}));
    assert_eq!(v["result"]["status"]["state"], "TASK_STATE_CANCELED", "{v}");
    assert_eq!(agent.next()["type"], "evmesh.stream.cancel");
    assert_eq!(code(&rpc(&b, "bot", Some("1.0"), "SubscribeToTask", json!({"id": slow}))), -32004);

    // An agent that never stops answering cannot grow a task: past 4,096 parts it fails. (Sent
    // in rounds the gateway keeps up with: one that outruns the turn's log fails it too, with
    // what was lost said.)
    let v = rpc(
        &b,
        "bot",
        Some("1.0"),
        "SendMessage",
        json!({"message": message("flood"), "configuration": {"returnImmediately": true}}),
    );
    let flood = v["result"]["task"]["id"].as_str().unwrap().to_owned();
    let turn = agent.next();
    let sid = turn["emsessionid"].as_str().unwrap().to_owned();
    let get = || rpc(&b, "bot", Some("1.0"), "GetTask", json!({"id": flood, "historyLength": 0}));
    let parts = |v: &Value| v["result"]["artifacts"][0]["parts"].as_array().map_or(0, Vec::len);
    let mut sent = 0;
    while sent < 4200 {
        for _ in 0..300 {
            agent.send(json!({"type": "chunk", "sessionId": sid, "seq": sent, "data": "x"}));
            sent += 1;
        }
        wait_for(Duration::from_secs(20), || {
            let v = get();
            (parts(&v) >= sent.min(4096) || v["result"]["status"]["state"] == "TASK_STATE_FAILED").then_some(())
        });
    }
    let failed = get();
    assert_eq!(failed["result"]["status"]["state"], "TASK_STATE_FAILED", "{failed}");
    assert_eq!(parts(&failed), 4096, "{}", failed["result"]["status"]);
    let why = failed["result"]["status"]["message"]["parts"][0]["text"].as_str().unwrap();
    assert!(why.contains("over 4096 parts"), "{why}");
    assert!(failed["result"].get("history").is_none(), "historyLength 0: no history");
    // Listing: newest first, paged.
    let v = rpc(&b, "bot", Some("1.0"), "ListTasks", json!({"pageSize": 2}));
    let listed: Vec<&str> =
        v["result"]["tasks"].as_array().unwrap().iter().map(|t| t["id"].as_str().unwrap()).collect();
    assert_eq!(listed, [flood.as_str(), slow.as_str()], "{v}");
    assert_eq!((v["result"]["totalSize"].as_u64(), v["result"]["nextPageToken"].as_str()), (Some(3), Some("2")));
}

/// A remote A2A server is untrusted: answers that are not JSON-RPC responses (`[]`, `1`, a
/// result that is not an object) are InvalidAgentResponse, and the broker lives on
/// (regression: writing the id into a non-object answer panicked, and a panic ends the process).
#[test]
fn a_remote_agent_answering_garbage_gets_invalid_agent_response_and_the_broker_lives() {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let card = json!({"name": "junk", "description": "d", "version": "1", "capabilities": {}, "skills": [],
        "defaultInputModes": [], "defaultOutputModes": [],
        "supportedInterfaces": [{"url": format!("http://127.0.0.1:{port}/rpc"), "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}]})
    .to_string();
    std::thread::spawn(move || {
        let answers =
            ["[]", "1", r#"{"jsonrpc":"2.0","id":1,"result":5}"#, r#"{"jsonrpc":"2.0","id":"x","result":{"tasks":7}}"#];
        let mut n = 0;
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let mut got = vec![0u8; 65536];
            let k = conn.read(&mut got).unwrap_or(0);
            let body = if got[..k].starts_with(b"GET") {
                card.clone()
            } else {
                n += 1;
                answers[(n - 1) % answers.len()].to_owned()
            };
            let _ = write!(conn, "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len());
        }
    });
    let b = TestBroker::start(&[]);
    let r = b.client().post(
        "/agent/register",
        "application/json",
        json!({"agentId": "junk", "a2aUrl": format!("http://127.0.0.1:{port}")}).to_string().as_bytes(),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let served = b.client().get("/a2a/junk/.well-known/agent-card.json").json();
    assert_eq!(served["supportedInterfaces"][0]["url"], format!("http://{}/a2a/junk", b.traffic), "{served}");
    for _ in 0..3 {
        let v = rpc(&b, "junk", Some("1.0"), "SendMessage", json!({"message": message("x")}));
        assert_eq!(code(&v), -32006, "{v}");
    }
    // A result of the wrong shape inside is relayed as the remote said it (the caller's SDK
    // judges it); the broker only filters what it knows to be another's.
    let v = rpc(&b, "junk", Some("1.0"), "ListTasks", json!({}));
    assert_eq!(v["result"]["tasks"], 7, "{v}");
    // A stream the remote answers without one ends with an error event (the SDKs' convention).
    let body =
        json!({"jsonrpc": "2.0", "id": "s", "method": "SendStreamingMessage", "params": {"message": message("x")}});
    let headers = [("content-type", "application/json"), ("a2a-version", "1.0")];
    let mut conn = std::net::TcpStream::connect(b.traffic).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    conn.write_all(&super::util::request_bytes("POST", "/a2a/junk", &headers, body.to_string().as_bytes())).unwrap();
    // The whole chunked stream: it ends after the error event.
    let mut got = Vec::new();
    while !got.ends_with(b"0\r\n\r\n") {
        let mut buf = [0u8; 4096];
        let n = conn.read(&mut buf).expect("the stream ends in time");
        assert!(n > 0, "closed before the stream's end: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 200") && text.contains("text/event-stream"), "{text}");
    assert!(text.contains("event: error\n") && text.contains("-32006") && text.contains("\"id\":\"s\""), "{text}");
    // Alive, and serving.
    assert_eq!(b.client().get("/a2a/junk/.well-known/agent-card.json").status, 200);
}

/// An A2A message is a turn through the same ingress path as a native one (the FrameAdaptor
/// SPI): the caller's rate limit refuses it before anything is made for it (no task, no
/// session), in A2A's shape, and refuses a native turn the same way.
#[test]
fn a2a_messages_and_native_turns_share_the_turn_path_and_its_rate_limits() {
    let b = TestBroker::start(&[]);
    let mut agent = Agent::attach(&b, "bot");
    let sid = {
        let r = b.client().post("/session/open", "application/json", br#"{"clientId":"c1","agentId":"bot"}"#);
        assert_eq!(r.status, 201, "{}", r.text());
        r.json()["sessionId"].as_str().unwrap().to_owned()
    };
    let body = json!({"scope": "principal:anonymous", "eventsPerSecond": 1, "burst": 3}).to_string();
    let r = b.admin().request("PUT", "/admin/limits/a2a", &[("content-type", "application/json")], body.as_bytes());
    assert_eq!(r.status, 201, "{}", r.text());
    let mut accepted = Vec::new();
    let mut refused = 0;
    for i in 0..10 {
        let m = json!({"message": message(&format!("n{i}")), "configuration": {"returnImmediately": true}});
        let v = rpc(&b, "bot", Some("1.0"), "SendMessage", m);
        match v["result"]["task"]["id"].as_str() {
            Some(id) => accepted.push(id.to_owned()),
            None => {
                // The broker's own refusal: JSON-RPC's internal error, with the limit said.
                assert_eq!(code(&v), -32603, "{v}");
                assert!(v["error"]["message"].as_str().unwrap().contains("over rate limit a2a"), "{v}");
                refused += 1;
            }
        }
    }
    assert!(refused > 0 && !accepted.is_empty(), "{} accepted, {refused} refused", accepted.len());
    // Only what was admitted became a task, and reached the agent.
    let v = rpc(&b, "bot", Some("1.0"), "ListTasks", json!({"pageSize": 100}));
    assert_eq!(v["result"]["totalSize"].as_u64(), Some(accepted.len() as u64), "{v}");
    for _ in &accepted {
        assert_eq!(agent.next()["type"], "evmesh.stream.request");
    }
    // The native turn meets the same limit, as problem+json (the bucket is empty by now, or
    // nearly: the refill is one a second).
    let statuses: Vec<u16> =
        (0..4).map(|_| b.client().post(&format!("/session/stream/{sid}"), "text/plain", b"hi").status).collect();
    assert!(statuses.contains(&429), "{statuses:?}");
}
