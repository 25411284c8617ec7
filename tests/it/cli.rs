//! `evmesh pub`, the first-tour client.

use std::io::Write;
use std::process::{Command, Stdio};

use super::util::TestBroker;

fn evmesh() -> Command {
    Command::new(env!("CARGO_BIN_EXE_evmesh"))
}

#[test]
fn pub_from_flags_and_from_stdin() {
    let b = TestBroker::start(&["--default-partitions", "1"]);
    let url = format!("http://{}", b.traffic);
    let out = evmesh()
        .args([
            "pub",
            "--url",
            &url,
            "--topic",
            "cli",
            "--type",
            "com.example.cli",
            "--id",
            "c-1",
            "--data",
            r#"{"a":1}"#,
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), r#"{"partition":0,"offset":0}"#);
    let mut child = evmesh()
        .args(["pub", "--url", &url, "--topic", "cli"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(br#"{"specversion":"1.0","id":"c-2","source":"/stdin","type":"t","data":"hi"}"#)
        .unwrap();
    assert!(child.wait_with_output().unwrap().status.success());
    let stored = b.events("cli", 0);
    assert_eq!(stored.len(), 2);
    assert_eq!(stored[0].1["id"], "c-1");
    assert_eq!(stored[0].1["data"], serde_json::json!({"a": 1}));
    assert_eq!(stored[1].1["source"], "/stdin");
    // A refused event is an error exit with the problem on stdout.
    let out = evmesh().args(["pub", "--url", &url, "--topic", "bad/topic", "--type", "t"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("\"status\":400"));
}

#[test]
fn sub_prints_one_json_line_per_event() {
    use std::io::{BufRead, BufReader};
    let b = TestBroker::start(&["--shards", "1"]);
    let url = format!("http://{}", b.traffic);
    let def = r#"{"subscription":"tail","topic":"cli","mode":"BROADCAST"}"#;
    assert_eq!(b.client().post("/events/subscribe", "application/json", def.as_bytes()).status, 201);
    let mut child = evmesh()
        .args(["sub", "--url", &url, "--subscription", "tail", "--max", "3"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            if tx.send(line.unwrap()).is_err() {
                return;
            }
        }
    });
    // The session attaches asynchronously: publish until the first event is printed.
    let mut n = 0;
    let first = loop {
        n += 1;
        assert!(n < 500, "evmesh sub never printed an event");
        let e = serde_json::json!({"specversion": "1.0", "id": format!("warm-{n}"), "source": "/cli", "type": "t"});
        assert_eq!(b.publish("cli", &e).status, 202);
        if let Ok(line) = rx.recv_timeout(std::time::Duration::from_millis(50)) {
            break line;
        }
    };
    let first: serde_json::Value = serde_json::from_str(&first).unwrap_or_else(|e| panic!("{e}: {first}"));
    assert!(first["id"].as_str().is_some_and(|id| id.starts_with("warm-")), "{first}");
    assert_eq!(first["emattempt"], 1);
    for i in 0..2 {
        let e = serde_json::json!({"specversion": "1.0", "id": format!("e{i}"), "source": "/cli", "type": "t"});
        assert_eq!(b.publish("cli", &e).status, 202);
    }
    // Two more lines (a late warm-up event may come first), then --max 3 ends the process.
    let rest: Vec<serde_json::Value> = rx.iter().map(|l| serde_json::from_str(&l).unwrap()).collect();
    assert_eq!(rest.len(), 2, "--max 3 stops after three events: {rest:?}");
    assert!(child.wait().unwrap().success());
    // An unknown subscription is an error exit with the problem printed.
    let out = evmesh().args(["sub", "--url", &url, "--subscription", "nope"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("\"status\":404"));
    // Every client refuses flags it does not know, before connecting anywhere (exit 2, as
    // usage errors do), and every one answers --help.
    for cmd in ["pub", "sub", "request", "stream", "agent"] {
        let out = evmesh().args([cmd, "--url", &url, "--bogus", "1"]).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{cmd}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("unexpected argument '--bogus'"), "{cmd}");
        let help = evmesh().args([cmd, "--help"]).output().unwrap();
        assert!(help.status.success(), "{cmd}");
        let text = String::from_utf8_lossy(&help.stdout);
        assert!(text.contains("--url") && text.contains("Exit codes"), "{cmd}: {text}");
    }
}

/// A URL without a port means the scheme's (80, 443), as it does for any HTTP client.
#[test]
fn a_url_without_a_port_takes_the_schemes() {
    for (url, port) in [("http://127.0.0.1", "127.0.0.1:80"), ("https://127.0.0.1/", "127.0.0.1:443")] {
        let out = evmesh().args(["pub", "--url", url, "--topic", "t", "--data", "{}"]).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        // Nothing listens there on a test machine (or something that is not evmesh): either
        // way the command names the address it used.
        assert!(!out.status.success() || err.is_empty(), "{err}");
        if !out.status.success() {
            assert!(err.contains(port) || err.contains("HTTP"), "{url}: {err}");
        }
    }
}

#[test]
fn request_prints_the_reply_or_fails_with_the_504() {
    use serde_json::{json, Value};
    let b = TestBroker::start(&[]);
    let url = format!("http://{}", b.traffic);
    let sub = json!({"subscription": "responders", "topic": "rpc", "mode": "LOAD_BALANCE", "start": "earliest"});
    assert_eq!(b.client().post("/events/subscribe", "application/json", sub.to_string().as_bytes()).status, 201);
    let mut ws = super::delivery::attach(&b, "subscription=responders");
    let asking = evmesh()
        .args(["request", "--url", &url, "--topic", "rpc", "--type", "com.example.ask", "--data", r#"{"q":1}"#])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let req = super::acked::recv(&mut ws, std::time::Duration::from_secs(10));
    assert_eq!(req["data"], json!({"q": 1}));
    let reply = json!({"specversion": "1.0", "id": "a-1", "source": "/responder", "type": "com.example.answer",
                       "emcorrelationid": req["emcorrelationid"], "data": {"a": 2}});
    let frame = json!({"type": "reply", "event": reply}).to_string();
    ws.send(tungstenite::Message::text(frame)).unwrap();
    let out = asking.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(printed["data"], json!({"a": 2}));
    assert_eq!(printed["type"], "com.example.answer");
    // Nobody answers this one: an error exit, the 504 problem printed.
    let out = evmesh()
        .args(["request", "--url", &url, "--topic", "quiet", "--type", "t", "--timeout-ms", "100"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("\"status\":504"));
    assert!(String::from_utf8_lossy(&out.stderr).contains("HTTP 504"));
}

#[test]
fn stream_prints_a_session_from_its_head_then_live() {
    use std::io::{BufRead, BufReader};
    let b = TestBroker::start(&[]);
    let url = format!("http://{}", b.traffic);
    let post = |id: &str| {
        let body = super::util::event(id).to_string();
        let r = b.client().post("/session/publish/tour", "application/cloudevents+json", body.as_bytes());
        assert_eq!(r.status, 201, "{}", r.text());
    };
    post("s0");
    post("s1");
    let mut child = evmesh()
        .args(["stream", "--url", &url, "--session", "tour", "--max", "3"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let id = |l: String| serde_json::from_str::<serde_json::Value>(&l).unwrap()["id"].as_str().unwrap().to_owned();
    assert_eq!(id(lines.next().unwrap().unwrap()), "s0");
    assert_eq!(id(lines.next().unwrap().unwrap()), "s1");
    post("s2");
    assert_eq!(id(lines.next().unwrap().unwrap()), "s2");
    assert!(child.wait().unwrap().success());
}

#[test]
fn agent_echoes_each_turn_a_word_per_chunk() {
    let b = TestBroker::start(&[]);
    let url = format!("http://{}", b.traffic);
    let mut child = evmesh()
        .args(["agent", "--url", &url, "--agent-id", "cli-echo", "--max-turns", "1"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // Once it has registered and attached, a turn streams its echo.
    let open = br#"{"clientId":"c","agentId":"cli-echo"}"#;
    let mut turn = super::util::wait_for(std::time::Duration::from_secs(10), || {
        let r = b.client().post("/session/open", "application/json", open);
        let sid = (r.status == 201).then(|| r.json()["sessionId"].as_str().unwrap().to_owned())?;
        super::calls::Turn::post(&b, &sid, "hello from the tour").ok()
    });
    let events: Vec<super::calls::Event> = std::iter::from_fn(|| turn.next()).collect();
    let chunk = |id: &str, kind: &str, data: &str| (Some(id.to_owned()), kind.to_owned(), data.to_owned());
    assert_eq!(
        events,
        [
            chunk("0", "chunk", "hello"),
            chunk("1", "chunk", " from"),
            chunk("2", "chunk", " the"),
            chunk("3", "chunk", " tour"),
            chunk("4", "done", "")
        ]
    );
    assert!(child.wait().unwrap().success(), "--max-turns 1: it stops after the turn");
    let mut out = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut out).unwrap();
    let request: serde_json::Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    assert_eq!(request["data"], "hello from the tour");
}

/// Regression: `evmesh sub` exited ("reading: failed to fill whole buffer") when the broker
/// restarted. Now it reconnects by itself and resumes from the committed offsets: every event
/// is printed, and only what was printed but not yet acknowledged at the crash twice.
#[test]
fn sub_keeps_running_across_a_broker_restart() {
    use std::collections::BTreeMap;
    use std::io::{BufRead, BufReader};
    let mut b = TestBroker::start(&["--default-partitions", "2", "--durability", "os"]);
    let url = format!("http://{}", b.traffic);
    let def = r#"{"subscription":"tail","topic":"cli","start":"earliest"}"#;
    assert_eq!(b.client().post("/events/subscribe", "application/json", def.as_bytes()).status, 201);
    let mut child = evmesh()
        .args(["sub", "--url", &url, "--subscription", "tail", "--window", "8"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let v: serde_json::Value = serde_json::from_str(&line.unwrap()).unwrap();
            if tx.send(v["id"].as_str().unwrap().to_owned()).is_err() {
                return;
            }
        }
    });
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let take = |until: usize, seen: &mut BTreeMap<String, usize>| {
        while seen.len() < until {
            let id = rx.recv_timeout(std::time::Duration::from_secs(30)).expect("evmesh sub printed nothing for 30 s");
            *seen.entry(id).or_default() += 1;
        }
    };
    for i in 0..100 {
        assert_eq!(b.publish("cli", &super::util::event(&format!("a{i}"))).status, 202);
    }
    take(100, &mut seen);
    b.restart_on_same_ports();
    for i in 0..100 {
        assert_eq!(b.publish("cli", &super::util::event(&format!("b{i}"))).status, 202);
    }
    take(200, &mut seen);
    assert_eq!(child.try_wait().unwrap(), None, "evmesh sub is still running");
    let twice: usize = seen.values().map(|n| n - 1).sum();
    // At most its window per shard was unacknowledged when the broker died.
    assert!(twice <= 2 * 8, "{twice} printed twice");
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.matches("attached at").count() >= 2, "{err}");
}
